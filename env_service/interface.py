"""Renderer of the train-only observation interface Ω_t (docs/paper.md §4).

The trainer decides Ω_t from the capability state and sends it, as JSON, with every training
episode; its model, rules and limits are ``env_service.protocol.Interface`` (docs/protocol.md)::

    {"version": int,
     "schema": {"required": bool, "enum": bool, "types": bool, "hide_optional": bool},
     "error_feedback": bool,
     "cues": [{"tag": str, "text": str}, ...]}

Every key is optional; a missing key (or ``null``) means "off", and ``{}`` / ``None`` is the raw
interface. This module only *renders* what it is sent; it holds no state and imports nothing from
the web layer, so the episode code can call it directly:

* ``parse_interface`` — the create request's ``interface`` field through the protocol's Ω model
  (``InterfaceError`` -> HTTP 422).
* φ_schema — ``annotate_tools`` (tool-doc annotations) and ``schema_instruction`` (one system-prompt
  line).
* φ_err — ``error_feedback`` (a recovery hint appended to a parse / availability / tool error
  observation), with ``tool_error_message`` and ``classify_tool_error`` for BFCL result texts.
* φ_cap — ``cue_block`` (capability cue lines appended to the system prompt).
* ``render_system_suffix`` — everything Ω_t appends to the system prompt.

Leak rules (paper: the interface never reveals the correct tool, hidden parameters or reference
trajectories): annotations are computed only from the tool docs the caller passes (never from held-out
docs or ground truth); error hints are computed only from the error text, the name the model itself
called and the list of currently available tool names the caller passes.

The wording of every marker, instruction and hint is ours; the release's φ_schema markers and instruction line
are reproduced only behind ``schema.release_wording`` (a fact of the prompt the release trained on, needed to
reproduce it). Differences from the release: docs/interface.md, docs/release_differences.md.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from env_service.protocol import (  # noqa: F401  (re-exported: Ω's model and limits, defined once in protocol)
    CUE_KEYS,
    INTERFACE_KEYS,
    MAX_CUE_TAG_CHARS,
    MAX_CUE_TEXT_CHARS,
    MAX_CUES,
    RAW_INTERFACE,
    SCHEMA_KEYS,
    Cue,
    Interface,
    InterfaceError,
    InterfaceTypeError,
    SchemaSwitches,
    parse_cue,
    parse_omega,
    parse_schema,
)
from env_service.tool_errors import (  # noqa: F401  (re-exported: the renderer's public API)
    MAX_LITERAL_PARSE_CHARS,
    TOOL_ERROR_FAMILIES,
    classify_tool_error,
    tool_error_message,
)
from env_service.vocab import PARSE_ERROR, STEP_ERROR_TYPES, TOOL_ERROR, UNAVAILABLE_TOOL

# --- limits (ours: keep the system prompt bounded whatever the trainer sends; Ω's own are in protocol) --
MAX_LISTED_TOOLS = 12  # tool names listed in an unavailable-tool hint (release: max_tool_names=12)
MAX_ECHOED_NAME_CHARS = 64  # a model-chosen name echoed back in a hint is cut to this length

# --- markers appended to parameter descriptions by φ_schema (our wording) ---------------------------
REQUIRED_MARKER = "(required)"
TYPE_MARKER_PREFIX = "(type:"
ENUM_MARKER_PREFIX = "(accepted values:"
ITEM_ENUM_MARKER_PREFIX = "(each item one of:"

# The release's φ_schema wording (observation_lite), used only under ``schema.release_wording`` so that the
# release's training system prompt can be reproduced exactly (docs/release_differences.md). Its enum hint reads
# structured ``enum`` lists only, which BFCL's multi-turn docs never have.
RELEASE_REQUIRED_MARKER = "[required]"
RELEASE_TYPE_MARKER_PREFIX = "[type:"
RELEASE_ENUM_PREFIX = "Allowed values:"
RELEASE_SCHEMA_INSTRUCTION = (
    "Observation note: parameters marked [required] must be provided exactly when calling a tool; "
    "do not invent tools outside the current schema."
)

# Header of the φ_cap block (ours).
CUE_HEADER = "# Points to keep in mind while using the tools:"

HINT_PREFIX = "Hint:"


def parse_interface(obj: Any) -> Interface:
    """Validate the ``interface`` field of a create request into an ``Interface``.

    ``None`` (no interface sent) is the raw interface; anything else must be Ω and goes through the protocol's
    one rule set (``env_service.protocol.parse_omega``, which the trainer's ``validate_interface`` uses too).
    Raises ``InterfaceError`` naming the offending field.
    """
    return RAW_INTERFACE if obj is None else parse_omega(obj)


# =====================================================================================================
# φ_schema: enum extraction from BFCL description text
# =====================================================================================================

# Enum-like patterns, found by reading every parameter description of the eight BFCL multi-turn
# classes (counts in docs/interface.md). Each returns the list of values or None.
ENUM_PATTERNS: tuple[str, ...] = (
    "enum_json_list",  # [Enum]: ["engage", "release"]
    "enum_bare_list",  # [Enum]: USD, RMB, EUR
    "options_lead_in",  # Here are the options: a, b, c / Options are: a, b, c. / Possible values: ...
    "quoted_code_map",  # ('l' for lines, 'w' for words, 'c' for characters)
    "slash_choice",  # (Buy/Sell)
)

_ENUM_JSON_RE = re.compile(r"\[Enum\]\s*:\s*(\[[^\[\]]*\])")
_ENUM_BARE_RE = re.compile(r"\[Enum\]\s*:\s*(?!\[)([^\n\[\]]+)")
# Lead-in phrases that introduce a closed list of values. "one of" needs a colon, so that plain
# prose ("one of the files") is not read as an enum.
_LEAD_IN_RE = re.compile(
    r"(?:here\s+are\s+the\s+options|options\s+are|possible\s+values(?:\s+are)?|allowed\s+values(?:\s+are)?"
    r"|valid\s+values(?:\s+are)?|accepted\s+values(?:\s+are)?|one\s+of)\s*:\s*([^\n]+)",
    re.IGNORECASE,
)
_CODE_MAP_RE = re.compile(
    r"\(\s*((?:'[^']+'|\"[^\"]+\")\s+for\s+[^,()]+(?:,\s*(?:'[^']+'|\"[^\"]+\")\s+for\s+[^,()]+)+)\)"
)
_CODE_MAP_ITEM_RE = re.compile(r"(?:'([^']+)'|\"([^\"]+)\")\s+for\s+")
_SLASH_RE = re.compile(r"\(\s*([A-Za-z][A-Za-z_]*(?:\s*/\s*[A-Za-z][A-Za-z_]*)+)\s*\)")
# Date/time format tokens are not choices: "(MM/YYYY)" is a format, "(Buy/Sell)" is an enum.
_FORMAT_TOKENS = frozenset({"YYYY", "YY", "MM", "DD", "HH", "SS"})


def _split_value_list(text: str) -> list[str]:
    """Split ``a, b, or c`` / ``'a', 'b'`` (up to the end of the sentence) into values."""
    # End of the list: the first sentence break (". " or a final ".") outside quotes.
    out: list[str] = []
    for raw in re.split(r",", _cut_sentence(text)):
        item = raw.strip()
        item = re.sub(r"^(?:or|and)\s+", "", item, flags=re.IGNORECASE).strip()
        if len(item) >= 2 and item[0] == item[-1] and item[0] in "'\"`":
            item = item[1:-1]
        if item:
            out.append(item)
    return out


def _cut_sentence(text: str) -> str:
    quote: str | None = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "." and (i + 1 == len(text) or text[i + 1].isspace()):
            return text[:i]
    return text


def extract_enum(description: str) -> tuple[str, list[Any]] | None:
    """The enum a parameter description states in text, as ``(pattern, values)``, else None.

    Patterns are tried in ``ENUM_PATTERNS`` order; a pattern counts only if it yields at least two
    distinct values. Values keep their written form (strings, except JSON lists, which keep JSON types).
    """
    if not isinstance(description, str) or not description:
        return None
    candidates: list[tuple[str, list[Any]]] = []

    m = _ENUM_JSON_RE.search(description)
    if m:
        try:
            values = json.loads(m.group(1))
        except json.JSONDecodeError:
            values = None
        if isinstance(values, list):
            candidates.append(("enum_json_list", values))
    m = _ENUM_BARE_RE.search(description)
    if m:
        candidates.append(("enum_bare_list", _split_value_list(m.group(1))))
    m = _LEAD_IN_RE.search(description)
    if m:
        candidates.append(("options_lead_in", _split_value_list(m.group(1))))
    m = _CODE_MAP_RE.search(description)
    if m:
        candidates.append(("quoted_code_map", [a or b for a, b in _CODE_MAP_ITEM_RE.findall(m.group(1))]))
    m = _SLASH_RE.search(description)
    if m:
        parts = [p.strip() for p in m.group(1).split("/")]
        if not _FORMAT_TOKENS.intersection(p.upper() for p in parts):
            candidates.append(("slash_choice", parts))

    for pattern, values in candidates:
        unique = _dedupe(values)
        if len(unique) >= 2:
            return pattern, unique
    return None


def _dedupe(values: Iterable[Any]) -> list[Any]:
    seen: list[Any] = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def parameter_enum(spec: Mapping[str, Any]) -> tuple[str, list[Any], bool] | None:
    """Accepted values of one parameter spec as ``(source, values, per_item)``, else None.

    Structured ``enum`` lists win (source ``"structured"``); otherwise the description text is parsed
    (source = the pattern name). ``per_item`` is True for arrays, whose values constrain each item.
    """
    per_item = spec.get("type") == "array"
    items = spec.get("items")
    if isinstance(spec.get("enum"), list) and spec["enum"]:
        return "structured", _dedupe(spec["enum"]), False
    if per_item and isinstance(items, Mapping) and isinstance(items.get("enum"), list) and items["enum"]:
        return "structured", _dedupe(items["enum"]), True
    found = extract_enum(spec.get("description", ""))
    if found is None:
        return None
    return found[0], found[1], per_item


# =====================================================================================================
# φ_schema: tool-doc annotation
# =====================================================================================================


def _type_label(spec: Mapping[str, Any]) -> str | None:
    typ = spec.get("type")
    if not isinstance(typ, str) or not typ:
        return None
    items = spec.get("items")
    if typ == "array" and isinstance(items, Mapping) and isinstance(items.get("type"), str):
        return f"array of {items['type']}"
    return typ


def _format_values(values: Sequence[Any]) -> str:
    # JSON spelling shows the exact literal to send ("START", not START).
    return ", ".join(json.dumps(v, ensure_ascii=False) for v in values)


def _doc_body(tool: Any, index: int) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise TypeError(f"tools[{index}] must be a tool doc object, got {type(tool).__name__}")
    # Also accept the OpenAI wrapper {"type": "function", "function": {...}}.
    body = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    if not isinstance(body.get("name"), str):
        raise TypeError(f"tools[{index}] has no string 'name'")
    return body


def annotate_tools(tools: Sequence[Mapping[str, Any]], schema: Any) -> list[dict[str, Any]]:
    """φ_schema: a deep copy of ``tools`` (BFCL Gorilla docs) with schema hints added.

    Only top-level ``parameters.properties`` are touched (as in the release): in the BFCL multi-turn
    docs the only nested schemas are array ``items`` (a bare type, shown by the type hint) and
    ``edit_ticket.updates`` (four optional fields, no enum, no required list).

    ``schema`` is a ``SchemaSwitches`` or its JSON form. For each property (a dict), the description
    gets, in order: ``(required)`` if it is in ``required``; ``(type: T)``; the accepted values, from a
    structured ``enum`` or from the description text (see ``extract_enum``). A marker already present
    is not added twice, so annotating twice changes nothing. ``hide_optional`` deletes non-required
    properties (``required`` is left as is). The input is never mutated; no tool is added or removed.
    """
    switches = parse_schema(schema)
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise TypeError(f"tools must be a list of tool docs, got {type(tools).__name__}")
    out = copy.deepcopy(list(tools))
    if not switches.any_on:
        return out
    for index, tool in enumerate(out):
        params = _doc_body(tool, index).get("parameters")
        if not isinstance(params, dict) or not isinstance(params.get("properties"), dict):
            continue
        props: dict[str, Any] = params["properties"]
        required = params.get("required") or []
        required = set(required) if isinstance(required, list) else set()
        if switches.hide_optional:
            for name in [n for n in props if n not in required]:
                del props[name]
        annotate = _annotate_property_release if switches.release_wording else _annotate_property
        for name, spec in props.items():
            if isinstance(spec, dict):
                annotate(spec, name in required, switches)
    return out


def _annotate_property_release(spec: dict[str, Any], is_required: bool, switches: SchemaSwitches) -> None:
    """The release's annotation: its markers, its order, its joining (trailing whitespace kept), enum from a
    structured ``enum`` list only."""
    desc = str(spec.get("description", "") or "")
    additions: list[str] = []
    if switches.required and is_required and RELEASE_REQUIRED_MARKER not in desc:
        additions.append(RELEASE_REQUIRED_MARKER)
    if switches.types and spec.get("type") and RELEASE_TYPE_MARKER_PREFIX not in desc:
        additions.append(f"{RELEASE_TYPE_MARKER_PREFIX} {spec.get('type')}]")
    values = spec.get("enum")
    if switches.enum and values and RELEASE_ENUM_PREFIX not in desc:
        additions.append(f"{RELEASE_ENUM_PREFIX} " + ", ".join(str(v) for v in values))
    if additions:
        spec["description"] = f"{desc} {' '.join(additions)}".strip()


def _annotate_property(spec: dict[str, Any], is_required: bool, switches: SchemaSwitches) -> None:
    desc = spec.get("description")
    desc = desc if isinstance(desc, str) else ""
    additions: list[str] = []
    if switches.required and is_required and REQUIRED_MARKER not in desc:
        additions.append(REQUIRED_MARKER)
    if switches.types and TYPE_MARKER_PREFIX not in desc:
        label = _type_label(spec)
        if label:
            additions.append(f"{TYPE_MARKER_PREFIX} {label})")
    if switches.enum and ENUM_MARKER_PREFIX not in desc and ITEM_ENUM_MARKER_PREFIX not in desc:
        found = parameter_enum(spec)
        if found is not None:
            _, values, per_item = found
            prefix = ITEM_ENUM_MARKER_PREFIX if per_item else ENUM_MARKER_PREFIX
            additions.append(f"{prefix} {_format_values(values)})")
    if additions:
        spec["description"] = " ".join([desc.rstrip(), *additions]).strip()


def schema_instruction(schema: Any) -> str | None:
    """The one system-prompt line that explains the φ_schema markers; None when no switch is on."""
    switches = parse_schema(schema)
    if not switches.any_on:
        return None
    if switches.release_wording:
        return RELEASE_SCHEMA_INSTRUCTION
    parts: list[str] = ["Schema notes:"]
    if switches.required:
        parts.append(f"A parameter tagged {REQUIRED_MARKER} has to be present in every call of its tool.")
    if switches.types:
        parts.append(f"Send each argument as the JSON type given in its {TYPE_MARKER_PREFIX} ...) tag.")
    if switches.enum:
        parts.append(
            "Where a parameter lists its accepted values, pass one of them spelled exactly as listed."
        )
    if switches.hide_optional:
        parts.append("Optional parameters are left out of the tool descriptions.")
    parts.append("Call only tools you have been given, by their exact names.")
    return " ".join(parts)


# =====================================================================================================
# φ_err: error feedback
# =====================================================================================================

_METHOD_IN_TYPEERROR_RE = re.compile(r"\b[A-Za-z_]\w*\.([A-Za-z_]\w*)\(\)")
_QUOTED_RE = re.compile(r"'([^']{1,80})'")


def _clean_name(name: str | None) -> str | None:
    if not isinstance(name, str):
        return None
    name = re.sub(r"\s+", " ", name.replace("`", "")).strip()
    if not name:
        return None
    return name if len(name) <= MAX_ECHOED_NAME_CHARS else name[:MAX_ECHOED_NAME_CHARS] + "..."


def _quoted_names(text: str) -> str:
    names = _dedupe(_QUOTED_RE.findall(text))
    return ", ".join(f"'{n}'" for n in names) if names else "(see the message)"


def _tool_hint(family: str, tool: str, error_text: str) -> str:
    # Hints explain the kind of failure and a way to recover; they never say which value or call
    # would be correct.
    if family == "missing_argument":
        return (
            f"{tool} was called without its required argument(s) {_quoted_names(error_text)}. "
            'Put every required parameter into "arguments" and call it again.'
        )
    if family == "unexpected_argument":
        return (
            f"{tool} has no parameter {_quoted_names(error_text)}. Use only parameter names from "
            "its schema, spelled exactly as there."
        )
    if family == "invalid_token":
        return (
            f"{tool} refused the access token. Pass the token issued by a successful "
            "authentication in this session, copied exactly; never make one up."
        )
    if family == "auth_required":
        return (
            f"{tool} needs a logged-in / authenticated session, which is not active. Complete the "
            "service's login or authentication step with the credentials you were given, then retry."
        )
    if family == "path_not_allowed":
        return (
            f"{tool} accepts a single name in the current directory, not a path. Move one directory "
            "level at a time and then use the bare name."
        )
    if family == "invalid_name":
        return (
            f'{tool} got a name with a forbidden character (such as / \\ : * ? " < > |). Use a '
            "plain name relative to the current directory."
        )
    if family == "missing_path":
        return (
            f"{tool} found no such file or directory where it looked. Check what the current "
            "directory contains before retrying; names are exact and relative to the current directory."
        )
    if family == "wrong_type":
        return (
            f"{tool} received an argument of the wrong type. Send each value with the JSON type its "
            "schema declares: numbers unquoted, true/false for booleans, lists as JSON arrays."
        )
    if family == "already_done":
        return (
            f"{tool} found the target already in that state or already existing. Check the current "
            "state before repeating the action; it may not be needed."
        )
    if family == "unknown_identifier":
        return (
            f"{tool} does not know an identifier you passed. Use only IDs, names or symbols that "
            "appeared in the conversation or in earlier tool results, or look them up with a tool."
        )
    if family == "invalid_value":
        return (
            f"{tool} rejected an argument value. Re-read that parameter's description for allowed "
            "values, ranges and formats, and take values from the user's request."
        )
    if family == "precondition":
        return (
            f"{tool} cannot run in the current state; the message says which condition is unmet. "
            "Bring the state in line first (with other tools, or by asking the user), then retry."
        )
    return (
        f"{tool} reported an error. Read the message, fix the arguments or state it points to, and "
        "do not repeat the identical call."
    )


MAX_MATCHED_CHARS = 2_000  # error text matched against the hint rules (ours: bounds the regex work)

# Parse-error causes (our parser's messages and the release's are both matched by keywords).
_PARSE_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"argument name|valid identifier", re.IGNORECASE),
        'Parameter names inside "arguments" must be plain identifiers spelled exactly as in the schema.',
    ),
    (
        re.compile(
            r"'name'.*'arguments'|name.{0,20}arguments.{0,20}(?:key|field|missing|contain)", re.IGNORECASE
        ),
        'Each call object needs exactly the two keys "name" and "arguments".',
    ),
    (
        re.compile(r"'name' must|\bname must be", re.IGNORECASE),
        '"name" must be the exact name of a listed tool, given as a non-empty string.',
    ),
    (
        re.compile(
            r"arguments\b[^;]*?(?:json object|an object|must be a dict|not a dict)|non-json string arg",
            re.IGNORECASE,
        ),
        '"arguments" has to be a JSON object mapping parameter names to values, not a string or list.',
    ),
    (
        re.compile(r"json|expecting|delimiter|unterminated|decode", re.IGNORECASE),
        (
            "The text between the tags was not valid JSON: use double quotes, true/false/null, and no "
            "trailing commas or comments."
        ),
    ),
    (
        re.compile(r"tag|block|<tool_call", re.IGNORECASE),
        "Every <tool_call> tag needs a closing </tool_call> with exactly one JSON object between them.",
    ),
)
_PARSE_FORMAT_LINE = (
    'Write each call as <tool_call>{"name": "<tool name>", "arguments": {"<parameter>": <value>}}'
    "</tool_call>, one block per call. A message with one malformed block runs none of its calls, so "
    "resend all of them."
)


def error_feedback(
    kind: str,
    message: str,
    function_name: str | None = None,
    available: Iterable[str] = (),
) -> str | None:
    """φ_err: a recovery hint to append to an error observation, or None if there is nothing to add.

    kind: ``parse_error`` (``message`` = the parser's error text), ``unavailable_tool`` (the model
        called ``function_name``, which is not currently available), or ``tool_error`` (``message`` =
        the tool's result text as BFCL's executor formats it).
    function_name: the real function the model called (``cd``, never a call id such as ``cd_1``).
        For tool errors, when it is None, the method named in a Python TypeError is used.
    available: names of the tools available *now* (the caller must not include held-out tools that
        have not been revealed). Listed, up to ``MAX_LISTED_TOOLS``, for ``unavailable_tool`` only.

    Returns lines starting with ``Hint:``. For ``tool_error``, None when ``message`` holds no error
    (see ``tool_error_message``). Raises ValueError for an unknown ``kind``.
    """
    if kind not in STEP_ERROR_TYPES:
        raise ValueError(f"unknown error kind {kind!r}; expected one of {list(STEP_ERROR_TYPES)}")
    if not isinstance(message, str):
        raise TypeError(f"message must be a string, got {type(message).__name__}")
    name = _clean_name(function_name)

    if kind == PARSE_ERROR:
        # Some rules backtrack (quadratic on adversarial text); a bounded head of the message keeps them cheap.
        head = message[:MAX_MATCHED_CHARS]
        lines = [f"{HINT_PREFIX} {text}" for rule, text in _PARSE_RULES if rule.search(head)][:1]
        lines.append(f"{HINT_PREFIX} {_PARSE_FORMAT_LINE}")
        return "\n".join(lines)

    if kind == UNAVAILABLE_TOOL:
        names = _dedupe(n for n in available if isinstance(n, str) and n)
        called = f"`{name}`" if name else "That tool"
        listed = ", ".join(names[:MAX_LISTED_TOOLS])
        more = f" (+{len(names) - MAX_LISTED_TOOLS} more)" if len(names) > MAX_LISTED_TOOLS else ""
        lines = [f"{HINT_PREFIX} {called} is not one of the tools you can call right now."]
        if names:
            lines.append(
                f"{HINT_PREFIX} Tools available now: {listed}{more}. Call a tool by its exact "
                "name, or answer in plain text if none of them fits the request."
            )
        else:
            lines.append(f"{HINT_PREFIX} Answer in plain text if no listed tool fits the request.")
        return "\n".join(lines)

    assert kind == TOOL_ERROR
    error_text = tool_error_message(message)
    if error_text is None:
        return None
    if name is None:
        m = _METHOD_IN_TYPEERROR_RE.search(error_text)
        name = m.group(1) if m else None
    tool = f"`{name}`" if name else "The tool"
    return f"{HINT_PREFIX} {_tool_hint(classify_tool_error(error_text), tool, error_text)}"


# =====================================================================================================
# φ_cap and the system-prompt suffix
# =====================================================================================================


def cue_block(cues: Iterable[Cue | Mapping[str, Any]]) -> str:
    """φ_cap: the header line plus one ``- <text>`` line per cue; "" when there are no cues."""
    parsed = [parse_cue(c, i) for i, c in enumerate(cues)]
    if not parsed:
        return ""
    return "\n".join([CUE_HEADER, *(f"- {c.text}" for c in parsed)])


def render_system_suffix(interface: Any) -> str:
    """Everything Ω_t appends to the system prompt (schema instruction, cue block), blank-line
    separated; "" for the raw interface. The caller joins it to the base prompt (e.g. with "\\n\\n")."""
    iface = parse_interface(interface)
    parts = [schema_instruction(iface.schema) or "", cue_block(iface.cues)]
    return "\n\n".join(p for p in parts if p)
