"""Parsing and error-feedback hardening: linear work on adversarial text, deep nesting is a parse error.

Linear time is checked by counting the characters the text primitives read (tests/env_service/work.py), not by a
clock; `scripts/bench_parsing.py` prints how long the same inputs take.
"""

from __future__ import annotations

import json

import pytest

from env_service import interface as iface
from env_service import parser, tool_errors
from env_service.parser import MAX_NESTING, nesting_depth, parse_tool_calls
from env_service.tool_errors import MAX_CLASSIFIED_CHARS, classify_tool_error
from tests.env_service.work import count_work, counted_text

# Characters read per input character: the single pass reads each a bounded number of times (6 on the deepest
# case below: the scan, the error path's second look, the copies kept as content); the quadratic parser this
# replaced read every character once per unclosed tag, thousands of times on these inputs.
READS_PER_CHAR = 8


def _parse_counted(monkeypatch, text):
    work = count_work(monkeypatch, parser)
    parsed = parse_tool_calls(counted_text(text, work))
    monkeypatch.undo()
    return parsed, work


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
def test_adversarial_messages_parse_in_linear_work(text, monkeypatch):
    parsed, work = _parse_counted(monkeypatch, text)
    assert parsed.error and not parsed.calls
    assert parsed == parse_tool_calls(text)  # counting changes nothing
    assert work.chars <= READS_PER_CHAR * len(text), (work.chars, len(text))  # one find per tag: ~4,000 per char


def test_many_valid_blocks_scale_linearly(monkeypatch):
    block = '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'
    small, small_work = _parse_counted(monkeypatch, block * 500)
    large, large_work = _parse_counted(monkeypatch, block * 5_000)
    assert len(small.calls) == 500 and len(large.calls) == 5_000
    # ten times the blocks, ten times the work: characters read and primitive calls alike
    assert large_work.chars <= 10 * small_work.chars and large_work.calls <= 10 * small_work.calls
    assert small_work.chars <= READS_PER_CHAR * len(block * 500)


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
def test_error_feedback_is_cheap_on_long_text(kind, message, monkeypatch):
    hint_rules = [rule.pattern for rule, _ in iface._PARSE_RULES]
    family_rules = [rule.pattern for _, rule in tool_errors._FAMILY_RULES]
    reads = {}
    for scale in (1, 10):
        long_message = message * scale
        work = count_work(monkeypatch, iface, tool_errors)
        hint = iface.error_feedback(kind, counted_text(long_message, work), "a" * 50_000, ["ls", "cd"])
        feedback = work.chars
        classify_tool_error(counted_text(long_message, work))
        monkeypatch.undo()
        assert hint == iface.error_feedback(kind, long_message, "a" * 50_000, ["ls", "cd"])
        # The rules that can backtrack (a lazy pattern backtracked per word: 26 s before the bound) only ever see
        # a bounded head of the text, however long it is.
        assert all(work.by_pattern.get(p, 0) <= iface.MAX_MATCHED_CHARS for p in hint_rules), work.by_pattern
        assert all(work.by_pattern.get(p, 0) <= MAX_CLASSIFIED_CHARS for p in family_rules), work.by_pattern
        reads[scale] = (feedback, work.chars - feedback)
    # ten times the text: at most ten times the work for the hint, the same work for the family
    assert reads[10][0] <= 10 * reads[1][0], reads
    assert reads[10][1] == reads[1][1], reads
