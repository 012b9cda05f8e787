"""Strict Hermes/Qwen ``<tool_call>`` parser: raw assistant text -> tool calls, or one clear error.

The model answers with zero or more blocks ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
Strict, all-or-nothing per message (as the release's ``xml_json`` parser, docs/release_behaviour.md §3): if any block is
malformed, the whole message is rejected with an error for the model and nothing executes. Model text is only
ever ``json.loads``-ed, never evaluated.

Differences from the release (documented in docs/env_service.md): every tag must belong to a well-formed block
(the release silently skipped blocks holding a JSON non-object when another valid block existed), and JSON's
non-standard ``NaN``/``Infinity`` constants are refused (their Python ``repr`` is not a literal).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_BLANK_RUNS = re.compile(r"\n\s*\n+")


@dataclass
class ParsedMessage:
    calls: list[dict[str, Any]] = field(default_factory=list)  # [{"name": str, "arguments": dict}]
    content: str = ""  # text outside the tool-call blocks
    error: str | None = None  # set => the whole message is rejected


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _parse_block(body: str) -> tuple[dict[str, Any] | None, str | None]:
    try:
        obj = json.loads(body, parse_constant=_refuse_constant)
    except ValueError as exc:
        return None, f"the tool call is not valid JSON ({exc})"
    if not isinstance(obj, dict):
        return None, "a tool call must be a JSON object with 'name' and 'arguments'"
    if "name" not in obj or "arguments" not in obj:
        return None, "a tool call JSON object needs both 'name' and 'arguments'"
    name, arguments = obj["name"], obj["arguments"]
    if not isinstance(name, str) or not name:
        return None, "'name' must be a non-empty string"
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = json.loads(arguments, parse_constant=_refuse_constant)
        except ValueError:
            return None, f"the arguments of '{name}' are a string that is not a JSON object"
    if not isinstance(arguments, dict):
        return None, f"the arguments of '{name}' must be a JSON object"
    return {"name": name, "arguments": arguments}, None


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """One call in the layout this parser reads (Qwen/Hermes ``<tool_call>`` JSON)."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"


def parse_tool_calls(text: str) -> ParsedMessage:
    """Parse one raw assistant message. Never raises on any input string."""
    if not isinstance(text, str):
        return ParsedMessage(error="the assistant message must be text")
    bodies = _BLOCK.findall(text)
    outside = _BLOCK.sub("", text)
    content = _BLANK_RUNS.sub("\n\n", outside).strip()
    if OPEN in outside or CLOSE in outside:
        return ParsedMessage(
            content=content, error="found a <tool_call> tag without a matching, well-formed block"
        )
    calls, errors = [], []
    for body in bodies:
        call, error = _parse_block(body.strip())
        if error:
            errors.append(error)
        else:
            calls.append(call)
    if errors:
        return ParsedMessage(content=content, error="; ".join(errors))
    return ParsedMessage(calls=calls, content=content)
