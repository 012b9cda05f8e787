"""In-process tests of the env service's pieces: parser, executor parity with BFCL, grading, diagnosis."""

from __future__ import annotations

import json
import random
import re

import pytest

from env_service import vocab
from env_service.bfcl import execute_multi_turn_func_call, multi_turn_checker, multi_turn_utils
from env_service.budget import BudgetExceeded
from env_service.config import EpisodeConfig, StepLimit
from env_service.episode import Episode, EpisodeStateError
from env_service.executor import ToolExecutor
from env_service.interface import parse_interface
from env_service.parser import format_tool_call, parse_tool_calls
from env_service.tasks import load_split, load_tasks
from tests.helpers import play_turns

TASKS = load_tasks()
WIDE = EpisodeConfig(step_limit=StepLimit("episode", 200))
OFFICIAL = EpisodeConfig(step_limit=StepLimit("episode", 200), strict_availability=False)


def play(task_id: str, turns: list[list[str]], config: EpisodeConfig = WIDE) -> Episode:
    """Play raw assistant messages turn by turn (eval mode); each turn is closed with a plain reply."""
    return play_turns(TASKS[task_id], turns, config)


# --- data and split --------------------------------------------------------------------------------
def test_tasks_and_split():
    assert len(TASKS) == 800
    split = load_split()
    for name in ("train", "eval"):
        ids = split[name]
        assert len(ids) == len(set(ids)) == 400
        for category in vocab.CATEGORIES:
            assert sum(vocab.category_of(i) == category for i in ids) == 100
    scenarios = [{i.rsplit("_", 1)[1] for i in split[s]} for s in ("train", "eval")]
    assert not scenarios[0] & scenarios[1]
    miss = TASKS["multi_turn_miss_func_0"]
    assert miss.questions[3] == "" and [d["name"] for d in miss.held_out[3]] == ["sort"]
    assert "sort" not in {d["name"] for d in miss.tools}


# --- parser ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, n_calls, error",
    [
        ("plain answer", 0, None),
        ("", 0, None),
        ('<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>', 1, None),
        (
            '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "pwd", "arguments": {}}</tool_call>',
            2,
            None,
        ),
        ('<tool_call>{"name": "ls", "arguments": "{\\"a\\": true}"}</tool_call>', 1, None),
        ('<tool_call>{"name": "ls"}</tool_call>', 0, "both 'name' and 'arguments'"),
        ("<tool_call>[1, 2]</tool_call>", 0, "JSON object"),
        ("<tool_call>{'name': 'ls'}</tool_call>", 0, "not valid JSON"),
        ('<tool_call>{"name": "ls", "arguments": {}}', 0, "tag without"),
        ('<tool_call>{"name": "ls", "arguments": {"x": NaN}}</tool_call>', 0, "not valid JSON"),
        ('<tool_call>{"name": "ls", "arguments": [1]}</tool_call>', 0, "must be a JSON object"),
        ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', 0, "non-empty string"),
        # one malformed block rejects the whole message, valid siblings included (strict, as the release)
        (
            '<tool_call>{"name": "ls", "arguments": {}}</tool_call><tool_call>oops</tool_call>',
            0,
            "not valid JSON",
        ),
    ],
)
def test_parser(text, n_calls, error):
    parsed = parse_tool_calls(text)
    assert len(parsed.calls) == n_calls
    if error is None:
        assert parsed.error is None
    else:
        assert error in parsed.error


def test_parser_keeps_text_outside_blocks():
    parsed = parse_tool_calls('Let me look.\n\n\n<tool_call>{"name": "ls", "arguments": {}}</tool_call>\nok')
    assert parsed.content == "Let me look.\n\nok"
    assert parsed.calls == [{"name": "ls", "arguments": {}}]


# --- executor: results identical to BFCL's own executor --------------------------------------------
def test_executor_results_match_bfcl_on_ground_truth():
    checked = 0
    for task in TASKS.values():
        ours = ToolExecutor(task.involved_classes, task.initial_config, task.long_context)
        name = f"parity_{checked}"
        try:
            for calls, strings in zip(task.gt_calls, task.ground_truth, strict=True):
                expected, _ = execute_multi_turn_func_call(
                    strings,
                    task.initial_config,
                    task.involved_classes,
                    name,
                    task.id,
                    long_context=task.long_context,
                )
                assert [ours.call(c.name, c.arguments) for c in calls] == expected, task.id
                checked += len(calls)
        finally:
            for key in [k for k in vars(multi_turn_utils) if k.startswith(name + "_")]:
                del vars(multi_turn_utils)[key]
    assert checked == 4625


def test_executor_error_text_matches_bfcl():
    task = TASKS["multi_turn_base_25"]
    ours = ToolExecutor(task.involved_classes, task.initial_config, False)
    expected, _ = execute_multi_turn_func_call(
        ["cat(filename='x')", "cat(file_name='nope.txt')", "mean(numbers=[])"]
        if "MathAPI" in task.involved_classes
        else ["cat(filename='x')", "cat(file_name='nope.txt')"],
        task.initial_config,
        task.involved_classes,
        "errtext",
        task.id,
    )
    got = [ours.call("cat", {"filename": "x"}), ours.call("cat", {"file_name": "nope.txt"})]
    assert got == expected[:2]
    assert got[0].startswith("Error during execution: ") and "unexpected keyword argument" in got[0]
    for key in [k for k in vars(multi_turn_utils) if k.startswith("errtext_")]:
        del vars(multi_turn_utils)[key]


def test_executor_resource_guard():
    task = next(t for t in TASKS.values() if "MathAPI" in t.involved_classes)
    ex = ToolExecutor(task.involved_classes, task.initial_config, False)
    # a known-expensive call is over the action's cost budget (the episode ends; tests/env_service/test_budget.py)
    with pytest.raises(BudgetExceeded) as info:
        ex.call("power", {"base": 10, "exponent": 10**9})
    assert info.value.limit == "guard"
    with pytest.raises(BudgetExceeded):
        ex.call("power", {"base": 7**5000, "exponent": 9_000})  # a huge base passed the old guard
    assert json.loads(ex.call("power", {"base": 2, "exponent": 10}))["result"] == 1024


# --- episode state machine -------------------------------------------------------------------------
def test_reveal_turn_and_availability():
    task = TASKS["multi_turn_miss_func_0"]
    ep = Episode("e", task, "train", parse_interface(None), WIDE)
    for _ in range(3):  # turns 0..2: answer in plain text
        reply = ep.step("ok")
    assert ep.turn == 3
    observation = reply["observation"]["content"]
    assert "sort" in observation and observation.endswith("What about now?")
    assert "Python 3 syntax" not in observation
    assert ep.step(format_tool_call("sort", {"file_name": "x"}))["info"]["error_type"] == "tool_error"


def test_held_out_tool_refused_before_reveal_only_when_strict():
    task = TASKS["multi_turn_miss_func_0"]
    strict = Episode("s", task, "train", parse_interface(None), WIDE)
    assert strict.step(format_tool_call("sort", {"file_name": "x"}))["info"]["error_type"] == "unavailable_tool"
    official = Episode("o", task, "train", parse_interface(None), OFFICIAL)
    assert official.step(format_tool_call("sort", {"file_name": "x"}))["info"]["error_type"] == "tool_error"


def test_release_reveal_note_switch():
    cfg = EpisodeConfig(step_limit=StepLimit("episode", 200), release_reveal_note=True)
    ep = Episode("n", TASKS["multi_turn_miss_func_0"], "train", parse_interface(None), cfg)
    for _ in range(3):
        reply = ep.step("ok")
    assert "Note that the provided function is in Python 3 syntax." in reply["observation"]["content"]


@pytest.mark.parametrize("scope, expected_steps", [("episode", 5), ("turn", 5)])
def test_step_limit(scope, expected_steps):
    ep = Episode(
        "l",
        TASKS["multi_turn_base_0"],
        "train",
        parse_interface(None),
        EpisodeConfig(step_limit=StepLimit(scope, 5)),
    )
    replies = [ep.step(format_tool_call("pwd", {})) for _ in range(expected_steps)]
    assert replies[-1]["done"] and replies[-1]["info"]["end_reason"] == "step_limit"
    assert replies[-1]["observation"] is None and not any(r["done"] for r in replies[:-1])
    with pytest.raises(EpisodeStateError):
        ep.step("more")
    assert ep.evaluate()["accuracy"] == 0.0


def test_turn_scope_resets_each_turn():
    ep = Episode(
        "l",
        TASKS["multi_turn_base_0"],
        "train",
        parse_interface(None),
        EpisodeConfig(step_limit=StepLimit("turn", 3)),
    )
    for _ in range(3):  # 2 calls + a plain reply per turn never hits 3 steps in one turn
        ep.step(format_tool_call("pwd", {}))
        ep.step(format_tool_call("pwd", {}))
        assert not ep.step("ok")["done"]


def test_evaluate_once_then_frozen():
    ep = play("multi_turn_base_0", [[]])
    first = ep.evaluate()
    assert ep.evaluate() is first
    with pytest.raises(EpisodeStateError):
        ep.step("x")


# --- diagnosis: every paper label is reachable ------------------------------------------------------
@pytest.mark.parametrize(
    "task_id, turn0, label, tag",
    [
        (
            "multi_turn_base_25",
            ["<tool_call>{bad json}</tool_call>"],
            "invalid_tool_call",
            "empty_turn_model_response",
        ),
        (
            "multi_turn_base_25",
            [format_tool_call("no_such_tool", {})],
            "invalid_tool_call",
            "empty_turn_model_response",
        ),
        (
            "multi_turn_base_25",
            [format_tool_call("cat", {"filename": "summary.txt"})],
            "argument_mismatch",
            "response_mismatch",
        ),
        (
            "multi_turn_base_2",
            [format_tool_call("cd", {"folder": "documents"}), format_tool_call("touch", {"file_name": "X.txt"})],
            "argument_mismatch",
            "state_mismatch",
        ),
        (
            "multi_turn_base_2",
            [format_tool_call("mkdir", {"dir_name": "elsewhere"})],
            "state_mismatch",
            "state_mismatch",
        ),
        (
            "multi_turn_base_25",
            [format_tool_call("cat", {"file_name": "nope.txt"})],
            "argument_mismatch",  # the right function with a wrong argument (tests/env_service/test_diagnosis.py)
            "response_mismatch",
        ),
        ("multi_turn_base_25", [], "missing_tool_call", "empty_turn_model_response"),
        (
            "multi_turn_base_100",
            [format_tool_call("get_stock_info", {"symbol": "AAPL"})],
            "argument_mismatch",  # a read-only call with a wrong argument (docs/diagnosis.md)
            "response_mismatch",
        ),
        ("multi_turn_base_25", [format_tool_call("cat", {"file_name": "summary.txt"})], "pass", "pass"),
    ],
)
def test_paper_labels_reachable(task_id, turn0, label, tag):
    result = play(task_id, [turn0]).evaluate()
    assert result["failure_tags"][0] == tag
    assert result["paper_labels"][0] == label
    assert result["accuracy"] == 0.0


def test_spurious_call_on_abstention_turn():
    gt = TASKS["multi_turn_miss_func_0"].gt_calls
    turns = [[format_tool_call(c.name, c.arguments) for c in turn] for turn in gt]
    turns[2] = [format_tool_call("ls", {})]  # turn 2 has an empty ground truth: the model should abstain
    result = play("multi_turn_miss_func_0", turns).evaluate()
    assert result["failure_tags"][2] == "spurious_tool_call"
    assert result["paper_labels"][2] == "invalid_tool_call"
    # BFCL's checker does not run its irrelevance check in multi-turn: the verdict still passes
    assert result["accuracy"] == 1.0
    assert result["counts"] == {"passed": 4, "scorable": 4, "passed_irrelevance": 0, "irrelevance": 1}


def test_progress_and_unreached_turns():
    gt = TASKS["multi_turn_base_0"].gt_calls
    ep = Episode("p", TASKS["multi_turn_base_0"], "train", parse_interface(None), WIDE)
    for call in gt[0]:
        ep.step(format_tool_call(call.name, call.arguments))
    ep.step("done")
    result = ep.evaluate()  # evaluated after turn 0 of 4: force-terminated by BFCL's rule
    assert result["accuracy"] == 0.0 and result["official"]["error_type"] == "multi_turn:force_terminated"
    assert result["failure_tags"] == ["pass"] + ["empty_turn_model_response"] * (len(gt) - 1)
    assert result["progress"] == pytest.approx(1 / len(gt))
    assert result["turns"][1]["reached"] is True and result["turns"][2]["reached"] is False


# --- verdict parity with BFCL's checker on perturbed trajectories -----------------------------------
def _call_string(name: str, arguments: dict) -> str:
    # The test's own oracle formatting, independent of the service's format_call.
    return name + "(" + ", ".join(f"{k}={v!r}" for k, v in arguments.items()) + ")"


def _perturb(rng: random.Random, turns: list[list[dict]], pool: list[dict]) -> list[list[dict]]:
    turns = [list(t) for t in turns]
    for _ in range(rng.randint(1, 3)):
        t = rng.randrange(len(turns))
        op = rng.choice(["drop", "dup", "swap", "arg", "extra", "move", "clear"])
        calls = turns[t]
        if op == "drop" and calls:
            calls.pop(rng.randrange(len(calls)))
        elif op == "dup" and calls:
            calls.insert(rng.randrange(len(calls) + 1), rng.choice(calls))
        elif op == "swap" and len(calls) > 1:
            i, j = rng.sample(range(len(calls)), 2)
            calls[i], calls[j] = calls[j], calls[i]
        elif op == "arg" and calls:
            i = rng.randrange(len(calls))
            args = dict(calls[i]["arguments"])
            if args:
                key = rng.choice(sorted(args))
                value = args[key]
                if isinstance(value, bool):
                    args[key] = not value
                elif isinstance(value, (int, float)):
                    args[key] = value + rng.choice([1, -1, 10])
                elif isinstance(value, str):
                    args[key] = value + rng.choice(["x", "_2", ""]) if value else "x"
                else:
                    args[key] = rng.choice([[], "x", 0])
            else:
                args["unexpected"] = 1
            calls[i] = {"name": calls[i]["name"], "arguments": args}
        elif op == "extra":
            calls.insert(rng.randrange(len(calls) + 1), rng.choice(pool))
        elif op == "move" and calls and len(turns) > 1:
            call = calls.pop(rng.randrange(len(calls)))
            turns[rng.randrange(len(turns))].append(call)
        elif op == "clear":
            turns[t] = []
    return turns


@pytest.mark.slow  # 2,000 trajectories graded twice (ours and BFCL's checker)
def test_verdict_parity_with_bfcl_checker_on_perturbed_trajectories():
    rng = random.Random(1234)
    ids = sorted(TASKS)
    agree = positives = 0
    n = 2000
    for k in range(n):
        task = TASKS[rng.choice(ids)]
        gt = [[{"name": c.name, "arguments": c.arguments} for c in turn] for turn in task.gt_calls]
        pool = [c for turn in gt for c in turn] or [{"name": "ls", "arguments": {}}]
        turns = _perturb(rng, gt, pool)
        # one call per step, or all of a turn's calls in one parallel message
        parallel = rng.random() < 0.3
        messages = [
            ([("".join(format_tool_call(c["name"], c["arguments"]) for c in t))] if t else [])
            if parallel
            else [format_tool_call(c["name"], c["arguments"]) for c in t]
            for t in turns
        ]
        result = play(task.id, messages, OFFICIAL).evaluate()
        steps = [
            ([[_call_string(c["name"], c["arguments"]) for c in t]] if t else [])
            if parallel
            else [[_call_string(c["name"], c["arguments"])] for c in t]
            for t in turns
        ]
        name = f"oracle_{k}"
        try:
            expected = multi_turn_checker(steps, task.ground_truth, task.test_entry, task.category, name)["valid"]
        finally:
            for key in [key for key in vars(multi_turn_utils) if key.startswith(name + "_")]:
                del vars(multi_turn_utils)[key]
        agree += result["accuracy"] == float(expected)
        positives += bool(expected)
        assert result["official"]["consistent_with_turns"], task.id
    assert agree == n
    assert 50 < positives < n - 50  # both verdicts are well represented


def test_checker_namespace_is_cleaned():
    before = {k for k in vars(multi_turn_utils) if re.match(r"seal_[0-9a-f]{32}", k)}
    play("multi_turn_base_0", [[]]).evaluate()
    after = {k for k in vars(multi_turn_utils) if re.match(r"seal_[0-9a-f]{32}", k)}
    assert before == after == set()
