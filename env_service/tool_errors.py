"""What a BFCL tool result says about failure: the one definition of "tool error" and its families.

BFCL's executor turns a Python exception into ``"Error during execution: <msg>"`` and returns a dict result
as its ``json.dumps`` (any other value as ``str``). Its classes report domain failures as ``{"error": ...}``
dicts, or lists holding one (``get_user_tickets`` when logged out, rendered in Python literal syntax). The
executor (step ``error_type``), the φ_err renderer (hints) and the paper-label diagnosis (argument errors) all
read results through this module.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from typing import Any

ERROR_PREFIX = "Error during execution: "
MAX_LITERAL_PARSE_CHARS = 20_000  # tool results longer than this are not literal-parsed for errors
MAX_CLASSIFIED_CHARS = 4_000  # head of an error message matched against the family rules


def _error_in(value: Any) -> str | None:
    if isinstance(value, Mapping):
        err = value.get("error")
        if err not in (None, False, "", 0):
            return err if isinstance(err, str) else json.dumps(err, ensure_ascii=False, default=str)
        return None
    if isinstance(value, list):
        for item in value:
            if isinstance(item, Mapping) and (err := _error_in(item)) is not None:
                return err
    return None


def tool_error_message(result: Any) -> str | None:
    """The error a BFCL tool result reports, else None.

    ``result`` is what BFCL's executor produces: a Python exception as
    ``"Error during execution: <msg>"``; a dict result as its ``json.dumps``; any other value (e.g. a
    list of dicts, as ``get_user_tickets`` returns when logged out) as its ``str``. A non-string
    ``result`` (dict / list) is inspected directly. An error is a Python exception or a dict (or a
    list's first dict) with a truthy ``"error"`` value. Failure flags without an ``error`` key (e.g.
    ``{"authentication_status": false}``) are not errors, as in BFCL.
    """
    if not isinstance(result, str):
        return _error_in(result)
    text = result.strip()
    if text.startswith(ERROR_PREFIX):
        return text[len(ERROR_PREFIX) :].strip() or text
    if not text or text[0] not in "[{" or len(text) > MAX_LITERAL_PARSE_CHARS:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        # Lists are str()-ed by BFCL, i.e. Python literal syntax. literal_eval parses literals only
        # (it executes nothing), and the length bound above keeps it cheap.
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    return _error_in(value)


# Families of BFCL tool-error texts, most specific first (first match wins). The matchers were
# written against every error literal in the eight multi-turn classes (docs/interface.md lists them).
TOOL_ERROR_FAMILIES: tuple[str, ...] = (
    "missing_argument",
    "unexpected_argument",
    "invalid_token",
    "auth_required",
    "path_not_allowed",
    "invalid_name",
    "missing_path",
    "wrong_type",
    "already_done",
    "unknown_identifier",
    "invalid_value",
    "precondition",
    "generic",
)

_FAMILY_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("missing_argument", re.compile(r"missing \d+ required (?:positional|keyword-only) argument")),
    ("unexpected_argument", re.compile(r"got an unexpected keyword argument")),
    ("invalid_token", re.compile(r"invalid access token|token expired|token not initialized")),
    (
        "auth_required",
        re.compile(
            r"not authenticated|not logged in|no user is currently logged in|please log ?in"
            r"|authentication required|login required"
        ),
    ),
    ("path_not_allowed", re.compile(r"unsupported path|path not allowed|one folder level")),
    ("invalid_name", re.compile(r"invalid character")),
    (
        "missing_path",
        re.compile(r"no such file|no such directory|not a directory|is a directory|not a file or directory"),
    ),
    (
        "wrong_type",
        re.compile(
            r"not supported between instances|unsupported operand type|can only concatenate"
            r"|can't multiply sequence|could not convert|object has no attribute|object is not iterable"
            r"|object is not subscriptable|cannot be interpreted as an integer|must be real number"
            r"|cannot create mpf|must be (?:a )?numbers?\b|must be an integer|must be a string"
            r"|has no len\(\)"
        ),
    ),
    (
        "already_done",
        re.compile(
            r"already exists|file exists|already closed|already resolved|already registered"
            r"|already completed|already the root|directory not empty"
        ),
    ),
    (
        "unknown_identifier",
        re.compile(r"not found|not registered|invalid stock symbol|^'[^']*'$"),
    ),
    (
        "invalid_value",
        re.compile(
            r"invalid|must be between|must be positive|positive values|cannot be negative|cannot be zero"
            r"|divide by zero|negative number|empty list|not supported|no available|must be one of"
            r"|options are|too large|use yyyy"
        ),
    ),
    (
        "precondition",
        re.compile(
            r"before|must be locked|needs to be pressed|must press|market is closed|insufficient"
            r"|exceeded|less than|tank is empty|tank capacity|not allowed"
        ),
    ),
)


def classify_tool_error(error_text: str) -> str:
    """The family (one of ``TOOL_ERROR_FAMILIES``) of a tool error message (not the whole result)."""
    # The head of the message carries the family's keywords; bounding it keeps matching cheap on any text.
    low = error_text[:MAX_CLASSIFIED_CHARS].strip().lower()
    for family, rule in _FAMILY_RULES:
        if rule.search(low):
            return family
    return "generic"


# Families that mean "the arguments were wrong" (missing/unexpected argument, wrong type, invalid value): the
# evidence for the paper's ``argument_mismatch`` label.
ARGUMENT_FAMILIES: frozenset[str] = frozenset(
    {"missing_argument", "unexpected_argument", "wrong_type", "invalid_value"}
)


def is_error_result(result: Any) -> bool:
    return tool_error_message(result) is not None


def is_argument_error(result: Any) -> bool:
    message = tool_error_message(result)
    return message is not None and classify_tool_error(message) in ARGUMENT_FAMILIES
