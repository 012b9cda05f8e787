"""Parsing and error-feedback hardening: linear time on adversarial text, deep nesting is a parse error."""

from __future__ import annotations

import json
import time

import pytest

from env_service import interface as iface
from env_service.parser import MAX_NESTING, nesting_depth, parse_tool_calls
from env_service.tool_errors import classify_tool_error


def _timed(fn, *args):
    started = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - started


def test_close_tag_inside_a_json_string_is_accepted():
    # The release's parser accepts this (its non-greedy pattern backtracks to the closing tag after the JSON).
    text = '<tool_call>{"name": "echo", "arguments": {"content": "a</tool_call>b"}}</tool_call> done'
    parsed = parse_tool_calls(text)
    assert parsed.error is None
    assert parsed.calls == [{"name": "echo", "arguments": {"content": "a</tool_call>b"}}]
    assert parsed.content == "done"


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>" * 8_000,  # 88 KB of unclosed tags: 18 s before the fix
        "<tool_call>{" * 8_000,
        "</tool_call>" * 8_000,
        '<tool_call>{"a": "' * 5_000,
        "<tool_call>" + "[" * 100_000 + "</tool_call>",
        "x" * 500_000 + "<tool_call>",
    ],
)
def test_adversarial_messages_parse_in_linear_time(text):
    parsed, seconds = _timed(parse_tool_calls, text)
    assert parsed.error and not parsed.calls
    assert seconds < 0.5, seconds  # quadratic was 18 s for the first one


def test_many_valid_blocks_scale_linearly():
    block = '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'
    small, t_small = _timed(parse_tool_calls, block * 500)
    large, t_large = _timed(parse_tool_calls, block * 5_000)
    assert len(small.calls) == 500 and len(large.calls) == 5_000
    assert t_large < max(1.0, 30 * t_small)


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 5_000, 200_000])
def test_deep_nesting_is_a_parse_error(depth):
    arguments = "[" * depth + "]" * depth
    text = f'<tool_call>{{"name": "ls", "arguments": {{"a": {arguments}}}}}</tool_call>'
    parsed = parse_tool_calls(text)
    assert not parsed.calls and "nested deeper" in parsed.error
    # double-encoded arguments get the same bound
    inner = json.dumps({"a": json.loads("[" * 40 + "]" * 40)})
    parsed = parse_tool_calls(json.dumps({"name": "ls", "arguments": inner}).join(["<tool_call>", "</tool_call>"]))
    assert not parsed.calls and parsed.error


def test_nesting_at_the_bound_is_accepted():
    value = json.loads("[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1))
    assert nesting_depth({"a": value}) == MAX_NESTING
    parsed = parse_tool_calls(f'<tool_call>{json.dumps({"name": "ls", "arguments": {"a": value}})}</tool_call>')
    assert parsed.error is None and len(parsed.calls) == 1


def test_long_model_names_are_cut_in_error_messages():
    name = "arguments " * 10_000
    parsed = parse_tool_calls(json.dumps({"name": name, "arguments": [1]}).join(["<tool_call>", "</tool_call>"]))
    assert parsed.error and len(parsed.error) < 200


@pytest.mark.parametrize(
    "kind,message",
    [
        ("parse_error", "arguments " * 8_000),  # 26 s before the bound (a lazy pattern backtracks per word)
        ("parse_error", "'name'" * 8_000),
        ("tool_error", "Error during execution: " + "arguments " * 8_000),
        ("unavailable_tool", "'" + "a (" * 20_000 + "' is not an available tool"),
    ],
)
def test_error_feedback_is_cheap_on_long_text(kind, message):
    hint, seconds = _timed(iface.error_feedback, kind, message, "a" * 50_000, ["ls", "cd"])
    assert hint and seconds < 0.5, seconds  # quadratic: 26 s for the first one
    _, seconds = _timed(classify_tool_error, message)
    assert seconds < 0.5, seconds
