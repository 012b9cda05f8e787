"""Strict Hermes/Qwen ``<tool_call>`` parser: raw assistant text -> tool calls, or one clear error.

The model answers with zero or more blocks ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
Strict, all-or-nothing per message (as the release's ``xml_json`` parser, docs/release_behaviour.md §3): if any block is
malformed, the whole message is rejected with an error for the model and nothing executes. Model text is only
ever ``json.loads``-ed, never evaluated.

A block's JSON is decoded where it starts (``JSONDecoder.raw_decode``), so a string value may contain
``</tool_call>`` (as the release accepts), and the scan is one pass: every character is looked at a bounded
number of times, whatever the input (unclosed tags, huge messages). The first malformed block ends the scan.

Differences from the release (documented in docs/env_service.md): every tag must belong to a well-formed block
(the release silently skipped blocks holding a JSON non-object when another valid block existed), JSON's
non-standard ``NaN``/``Infinity`` constants are refused (their Python ``repr`` is not a literal), and values
nested deeper than ``MAX_NESTING`` are refused (BFCL's checker re-parses every call as Python source).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLANK_RUNS = re.compile(r"\n\s*\n+")
_SPACE = re.compile(r"\s*")
# Deeper JSON than this is refused as a parse error (no BFCL tool takes more than a few levels); the bound also
# keeps every later recursive step (deep copies, repr, BFCL's parse of call strings) far from Python's limits.
MAX_NESTING = 32
MAX_ECHOED_CHARS = 80  # model text quoted back in an error message is cut to this length


@dataclass
class ParsedMessage:
    calls: list[dict[str, Any]] = field(default_factory=list)  # [{"name": str, "arguments": dict}]
    content: str = ""  # text outside the tool-call blocks
    error: str | None = None  # set => the whole message is rejected


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def echo(text: str) -> str:
    """Model text as quoted back in an error message: at most MAX_ECHOED_CHARS characters."""
    return text if len(text) <= MAX_ECHOED_CHARS else text[:MAX_ECHOED_CHARS] + "..."


def nesting_depth(value: Any, limit: int = MAX_NESTING) -> int:
    """Levels of nested lists/dicts in a decoded JSON value, counted iteratively (stops above ``limit``)."""
    depth, level = 0, [value]
    while depth <= limit:
        containers = [item for item in level if isinstance(item, (dict, list))]
        if not containers:
            break
        depth += 1
        level = [child for c in containers for child in (c.values() if isinstance(c, dict) else c)]
    return depth


def _loads(text: str) -> Any:
    """``json.loads`` with the parser's rules; ValueError for anything unparsable (deep nesting included)."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_NESTING} levels") from None
    return value


def _check_call(obj: Any) -> tuple[dict[str, Any] | None, str | None]:
    if not isinstance(obj, dict):
        return None, "a tool call must be a JSON object with 'name' and 'arguments'"
    if "name" not in obj or "arguments" not in obj:
        return None, "a tool call JSON object needs both 'name' and 'arguments'"
    name, arguments = obj["name"], obj["arguments"]
    if not isinstance(name, str) or not name:
        return None, "'name' must be a non-empty string"
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = _loads(arguments)
        except ValueError:
            return None, f"the arguments of '{echo(name)}' are a string that is not a JSON object"
    if not isinstance(arguments, dict):
        return None, f"the arguments of '{echo(name)}' must be a JSON object"
    if nesting_depth(arguments) > MAX_NESTING:
        return None, f"the tool call is not valid JSON (arguments nested deeper than {MAX_NESTING} levels)"
    return {"name": name, "arguments": arguments}, None


def _decode_block(text: str, start: int) -> tuple[Any, int]:
    """Decode the JSON value at ``text[start:]``; returns it and the index after it, else ValueError."""
    try:
        value, end = _DECODER.raw_decode(text, start)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_NESTING} levels") from None
    except json.JSONDecodeError as exc:
        # Report the position within the block, worded as json.loads words it on the block alone.
        rel = exc.pos - start
        before = text[start : exc.pos]
        line, col = before.count("\n") + 1, rel - before.rfind("\n")
        raise ValueError(f"{exc.msg}: line {line} column {col} (char {rel})") from None
    return value, end


def _block_error(text: str, body: int) -> str:
    """The error of a malformed block starting at ``body``: an unclosed tag, or what ``json.loads`` says about the
    text up to the next closing tag (the wording of the strict parser before the single pass; one more linear
    pass, on the error path only)."""
    close = text.find(CLOSE, body)
    if close < 0:
        return "found a <tool_call> tag without a matching, well-formed block"
    try:
        _loads(text[body:close].strip())
    except ValueError as exc:
        return f"the tool call is not valid JSON ({exc})"
    return "found a <tool_call> tag without a matching, well-formed block"


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """One call in the layout this parser reads (Qwen/Hermes ``<tool_call>`` JSON)."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"


def _content(parts: list[str]) -> str:
    return _BLANK_RUNS.sub("\n\n", "".join(parts)).strip()


def parse_tool_calls(text: str) -> ParsedMessage:
    """Parse one raw assistant message. Never raises on any input string; linear time."""
    if not isinstance(text, str):
        return ParsedMessage(error="the assistant message must be text")
    calls: list[dict[str, Any]] = []
    outside: list[str] = []
    pos = 0
    while True:
        start = text.find(OPEN, pos)
        stray = text.find(CLOSE, pos, len(text) if start < 0 else start)
        if stray >= 0:
            outside.append(text[pos:])
            error = "found a </tool_call> tag without a matching <tool_call>"
            return ParsedMessage(content=_content(outside), error=error)
        if start < 0:
            outside.append(text[pos:])
            break
        outside.append(text[pos:start])
        body = _SPACE.match(text, start + len(OPEN)).end()
        try:
            value, end = _decode_block(text, body)
            end = _SPACE.match(text, end).end()
            well_formed = text.startswith(CLOSE, end)
        except ValueError:
            well_formed = False
        if not well_formed:
            outside.append(text[start:])
            return ParsedMessage(content=_content(outside), error=_block_error(text, body))
        call, error = _check_call(value)
        if error:
            outside.append(text[end + len(CLOSE) :])
            return ParsedMessage(content=_content(outside), error=error)
        calls.append(call)
        pos = end + len(CLOSE)
    return ParsedMessage(calls=calls, content=_content(outside))
