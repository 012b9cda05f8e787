"""Call strings: the one definition of how a validated tool call is written for BFCL's checker.

BFCL's multi-turn checker consumes Python call strings (``cd(folder='document')``) and ``eval``s them. The
service never passes model text to it: it builds these strings itself from calls that already passed
validation (a known, currently available tool name and identifier argument keys; values are JSON data, whose
``repr`` is a Python literal). Ground-truth call strings come from BFCL's own data and are parsed with ``ast``
(never evaluated) to replay them on our executor.
"""

from __future__ import annotations

import ast
import inspect
import keyword
from typing import Any


def format_call(name: str, arguments: dict[str, Any]) -> str:
    """``name(k1=repr(v1), k2=repr(v2))`` — the release's and BFCL's call-string layout."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


def is_valid_argument_name(key: object) -> bool:
    """An argument key that can appear in a call string: a Python identifier that is not a keyword."""
    return isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key)


def parse_call_string(call: str) -> tuple[str, list[Any], dict[str, Any]]:
    """Parse a trusted BFCL ground-truth call string into (name, positional args, keyword args).

    Only literal arguments are accepted (``ast.literal_eval``); anything else raises ``ValueError``.
    """
    node = ast.parse(call.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a simple call: {call!r}")
    positional = [ast.literal_eval(a) for a in node.args]
    keywords = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError(f"**kwargs are not supported: {call!r}")
        keywords[kw.arg] = ast.literal_eval(kw.value)
    return node.func.id, positional, keywords


def bind_arguments(method: Any, positional: list[Any], keywords: dict[str, Any]) -> dict[str, Any]:
    """Name positional arguments from the method's signature (about 150 BFCL ground-truth calls use them)."""
    if not positional:
        return dict(keywords)
    bound = inspect.signature(method).bind_partial(*positional, **keywords)
    return dict(bound.arguments)
