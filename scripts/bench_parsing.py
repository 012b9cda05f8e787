"""Time the service's text handling on adversarial and long inputs: the tool-call parser and the error feedback.

The tests (tests/env_service/test_parsing_hardening.py) check that the work is linear by counting the characters
read; this prints how long the same inputs take (the best of `--repeats` runs), at one and ten times the size:
a linear function keeps the time per character flat, a bounded one (the hint rules and the error families read
a bounded head of the message) keeps the time itself flat. For scale: the quadratic parser this replaced took
18 s on the first input, the unbounded hint rules 26 s on the first error message.

    python scripts/bench_parsing.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from env_service import interface as iface
from env_service.parser import parse_tool_calls
from env_service.tool_errors import classify_tool_error

NAME = "a" * 50_000  # a long called-tool name, cleaned for the hint
BLOCK = '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'

PARSER_INPUTS: dict[str, str] = {
    "unclosed tags": "<tool_call>" * 8_000,
    "unclosed tags with a brace": "<tool_call>{" * 8_000,
    "stray closing tags": "</tool_call>" * 8_000,
    "open strings": '<tool_call>{"a": "' * 5_000,
    "deep nesting": "<tool_call>" + "[" * 100_000 + "</tool_call>",
    "long text, then a tag": "x" * 500_000 + "<tool_call>",
    "500 valid blocks": BLOCK * 500,
}

FEEDBACK_INPUTS: dict[str, tuple[str, str]] = {
    "parse error, repeated word": ("parse_error", "arguments " * 8_000),
    "parse error, repeated quote": ("parse_error", "'name'" * 8_000),
    "tool error, repeated word": ("tool_error", "Error during execution: " + "arguments " * 8_000),
    "unavailable tool, parentheses": ("unavailable_tool", "'" + "a (" * 20_000 + "' is not an available tool"),
}


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per input; the best is shown")
    args = parser.parse_args()
    rows = []
    for name, text in PARSER_INPUTS.items():
        for scale in (1, 10):
            big = text * scale
            seconds = best_of(args.repeats, lambda b=big: parse_tool_calls(b))
            rows.append(("parse_tool_calls", name, scale, len(big), seconds))
    for name, (kind, message) in FEEDBACK_INPUTS.items():
        for scale in (1, 10):
            big = message * scale
            seconds = best_of(args.repeats, lambda k=kind, b=big: iface.error_feedback(k, b, NAME, ["ls", "cd"]))
            rows.append(("error_feedback", name, scale, len(big), seconds))
            rows.append(("classify_tool_error", name, scale, len(big),
                         best_of(args.repeats, lambda b=big: classify_tool_error(b))))
    print("| function | input | × | characters | ms | ns per character |")
    print("|---|---|---:|---:|---:|---:|")
    for function, name, scale, chars, seconds in rows:
        print(f"| {function} | {name} | {scale} | {chars:,} | {1e3 * seconds:.2f} | {1e9 * seconds / chars:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
