"""Paper labels from each turn's own evidence (docs/diagnosis.md).

Two kinds of test: (1) whole episodes on real BFCL tasks, played through the service's Episode and graded by the
real BFCL checkers, for every label, inherited state, empty-ground-truth turns, recovery and read-only calls;
(2) the priority rule itself on constructed evidence, for every pair of labels.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from env_service import vocab
from env_service.config import EpisodeConfig, StepLimit
from env_service.diagnosis import ErrorCarry, OwnCheck, TurnEvidence, paper_label
from env_service.parser import format_tool_call
from env_service.tasks import Call, load_tasks
from env_service.trajectory import AcceptedCall, Step, Turn
from tests.helpers import play_turns

TASKS = load_tasks()
WIDE = EpisodeConfig(step_limit=StepLimit("episode", 200))


def call(name: str, **arguments) -> str:
    return format_tool_call(name, arguments)


def gt_turn(task_id: str, index: int) -> list[str]:
    return [call(c.name, **c.arguments) for c in TASKS[task_id].gt_calls[index]]


def grade(task_id: str, turns: list[list[str]], config: EpisodeConfig = WIDE) -> dict:
    """Play ``turns`` (each a list of assistant messages, then a plain reply ends the turn) and evaluate."""
    return play_turns(TASKS[task_id], turns, config, mode="train").evaluate()


# --- every label on a real task (turn 0 of a base task) ----------------------------------------------
# (task, turn-0 messages, progress tag, paper label, what the case shows)
LABEL_CASES = [
    ("multi_turn_base_25", ["<tool_call>{bad json}</tool_call>"], vocab.EMPTY_TURN, vocab.INVALID_TOOL_CALL),
    ("multi_turn_base_25", [call("no_such_tool")], vocab.EMPTY_TURN, vocab.INVALID_TOOL_CALL),
    # argument error (unexpected keyword) on the right function
    ("multi_turn_base_25", [call("cat", filename="summary.txt")], vocab.RESPONSE_MISMATCH, vocab.ARGUMENT_MISMATCH),
    # read-only call with a wrong argument value: the state is right, the response fails -> argument_mismatch
    ("multi_turn_base_100", [call("get_stock_info", symbol="AAPL")], vocab.RESPONSE_MISMATCH,
     vocab.ARGUMENT_MISMATCH),
    # a tool error and no retry on a read-only turn: the right function with a wrong argument value is
    # argument_mismatch (priority 2); recovery_failure is about the *later* turns after the error
    ("multi_turn_base_25", [call("cat", file_name="nope.txt")], vocab.RESPONSE_MISMATCH, vocab.ARGUMENT_MISMATCH),
    # the right functions, a wrong argument of a state-changing call
    ("multi_turn_base_2", [call("cd", folder="documents"), call("touch", file_name="X.txt")], vocab.STATE_MISMATCH,
     vocab.ARGUMENT_MISMATCH),
    # a wrong function executed: wrong state transition
    ("multi_turn_base_2", [call("mkdir", dir_name="elsewhere")], vocab.STATE_MISMATCH, vocab.STATE_MISMATCH),
    # an error the model never repaired (cd into a missing folder), the turn fails
    ("multi_turn_base_25", [call("cd", folder="nope")], vocab.RESPONSE_MISMATCH, vocab.RECOVERY_FAILURE),
    # the right function (the ground truth's cd) with a wrong argument that errors: argument_mismatch, as for cat
    ("multi_turn_base_2", [call("cd", folder="nope")], vocab.STATE_MISMATCH, vocab.ARGUMENT_MISMATCH),
    ("multi_turn_base_25", [], vocab.EMPTY_TURN, vocab.MISSING_TOOL_CALL),
    # a state-changing call skipped after the first right call: the turn's own transition is wrong, so both
    # state_mismatch and missing_tool_call apply, and the paper's priority puts state_mismatch first
    ("multi_turn_base_2", [call("cd", folder="documents")], vocab.STATE_MISMATCH, vocab.STATE_MISMATCH),
    # a needed read skipped, a useless read made
    ("multi_turn_base_25", [call("ls")], vocab.RESPONSE_MISMATCH, vocab.MISSING_TOOL_CALL),
    # the ground truth's calls, in an order that changes the read's result: clean and complete, answer wrong
    ("multi_turn_base_26", [call("ls", a=True), call("cd", folder="tmp")], vocab.RESPONSE_MISMATCH,
     vocab.RESPONSE_MISMATCH),
    ("multi_turn_base_25", [call("cat", file_name="summary.txt")], vocab.PASS, vocab.PASS),
    # an error the model recovered from within the turn is not a failure
    ("multi_turn_base_25", [call("cat", file_name="nope.txt"), call("cat", file_name="summary.txt")], vocab.PASS,
     vocab.PASS),
    # recovered from an error, then skipped the state-changing call: state_mismatch, not recovery_failure
    ("multi_turn_base_2", [call("cd", folder="nope"), call("cd", folder="documents")], vocab.STATE_MISMATCH,
     vocab.STATE_MISMATCH),
]


@pytest.mark.parametrize("task_id, turn0, tag, label", LABEL_CASES)
def test_label_of_turn(task_id, turn0, tag, label):
    result = grade(task_id, [turn0])
    assert (result["failure_tags"][0], result["paper_labels"][0]) == (tag, label)


def test_every_label_is_covered():
    assert {case[3] for case in LABEL_CASES} == set(vocab.PAPER_LABELS)


# --- inherited state -----------------------------------------------------------------------------------
def test_inherited_mismatch_is_not_blamed_on_later_turns():
    task_id = "multi_turn_base_2"
    n = TASKS[task_id].num_turns
    # turn 0 does the wrong thing; every later turn makes exactly the ground truth's calls
    turns = [[call("mkdir", dir_name="elsewhere")]] + [gt_turn(task_id, i) for i in range(1, n)]
    result = grade(task_id, turns)
    assert result["paper_labels"][0] == vocab.STATE_MISMATCH
    # the cumulative check fails on the later turns (the state left by turn 0), their own transitions are right
    assert any(tag != vocab.PASS for tag in result["failure_tags"][1:])
    assert result["paper_labels"][1:] == [vocab.PASS] * (n - 1)


def test_later_turns_that_never_recover_from_error_feedback_are_recovery_failures():
    task_id = "multi_turn_base_2"
    n = TASKS[task_id].num_turns
    # turn 0 gets executable error feedback (cd into a missing folder) and never repairs it; the later turns make
    # exactly the ground truth's own calls, so their own replay passes, but the damage stays
    turns = [[call("cd", folder="nope")]] + [gt_turn(task_id, i) for i in range(1, n)]
    result = grade(task_id, turns)
    assert result["paper_labels"][0] == vocab.ARGUMENT_MISMATCH  # the ground truth's cd, a wrong folder
    failing_later = [i for i in range(1, n) if result["failure_tags"][i] != vocab.PASS]
    assert failing_later
    for i in range(1, n):
        expected = vocab.RECOVERY_FAILURE if i in failing_later else vocab.PASS
        assert result["paper_labels"][i] == expected, (i, result["failure_tags"][i])


def test_error_carry_is_cleared_by_a_passing_turn_and_set_only_by_a_failing_erroring_turn():
    failed = Turn([Step("calls", calls=[AcceptedCall("mv", {"source": "nope"}, PATH_ERROR, True)])])
    repaired = Turn([Step("calls", calls=[AcceptedCall("mv", {"source": "nope"}, PATH_ERROR, True),
                                          AcceptedCall("mv", {"source": "a"}, "ok", False)])])
    def ev(tag: str, turn: Turn | None, own: OwnCheck | None = None) -> TurnEvidence:
        return TurnEvidence(tag, turn, GT, own)

    carry = ErrorCarry()
    carry.update(vocab.PASS, vocab.PASS, ev(vocab.PASS, failed))  # the error did no harm: the turn passed
    assert not carry.pending
    carry.update(vocab.STATE_MISMATCH, vocab.STATE_MISMATCH, ev(vocab.STATE_MISMATCH, repaired))  # repaired
    assert not carry.pending
    # the error was recorded, but the turn's own replay from the reference state ran without it: the error came
    # from an earlier turn's state, and that turn carries it
    inherited_error = OwnCheck(False, False, (AcceptedCall("mv", {"source": "nope"}, "ok", False),))
    carry.update(vocab.STATE_MISMATCH, vocab.MISSING_TOOL_CALL, ev(vocab.STATE_MISMATCH, failed, inherited_error))
    assert not carry.pending
    carry.update(vocab.STATE_MISMATCH, vocab.RECOVERY_FAILURE, ev(vocab.STATE_MISMATCH, failed))
    assert carry.pending
    carry.update(vocab.CORRECT_ABSTENTION, vocab.PASS, ev(vocab.CORRECT_ABSTENTION, None))  # checks no state
    assert carry.pending
    carry.update(vocab.PASS, vocab.PASS, ev(vocab.PASS, None))  # the cumulative check passes again: recovered
    assert not carry.pending
    # on constructed evidence: an inherited failure is pass, or recovery_failure after pending error feedback
    steps, _ = _trigger(vocab.MISSING_TOOL_CALL)
    inherited = TurnEvidence(vocab.STATE_MISMATCH, Turn(steps), GT, OwnCheck(True, True))
    assert paper_label(inherited) == vocab.PASS
    assert paper_label(replace(inherited, earlier_error=True)) == vocab.RECOVERY_FAILURE


def test_later_turn_with_its_own_wrong_argument_is_still_labelled():
    task_id = "multi_turn_base_2"
    turns = [[call("mkdir", dir_name="elsewhere")], [call("echo", content="wrong", file_name="TeamNotes.txt")]]
    result = grade(task_id, turns)
    assert result["paper_labels"][:2] == [vocab.STATE_MISMATCH, vocab.ARGUMENT_MISMATCH]


# --- empty ground truth (miss_func: the turn before the held-out tool is revealed) --------------------
def _miss_func_turns(turn2: list[str]) -> list[list[str]]:
    task_id = "multi_turn_miss_func_0"
    turns = [gt_turn(task_id, i) for i in range(TASKS[task_id].num_turns)]
    turns[2] = turn2
    return turns


HELD_OUT_0 = TASKS["multi_turn_miss_func_0"].held_out[3][0]["name"]


@pytest.mark.parametrize(
    "turn2, tag, label",
    [
        ([], vocab.CORRECT_ABSTENTION, vocab.PASS),
        (["<tool_call>{not json</tool_call>"], vocab.CORRECT_ABSTENTION, vocab.INVALID_TOOL_CALL),
        ([call(HELD_OUT_0)], vocab.CORRECT_ABSTENTION, vocab.INVALID_TOOL_CALL),  # held out: refused before reveal
        ([call("ls")], vocab.SPURIOUS_TOOL_CALL, vocab.INVALID_TOOL_CALL),
    ],
)
def test_empty_ground_truth_turn(turn2, tag, label):
    assert not TASKS["multi_turn_miss_func_0"].gt_calls[2]
    result = grade("multi_turn_miss_func_0", _miss_func_turns(turn2))
    assert (result["failure_tags"][2], result["paper_labels"][2]) == (tag, label)
    assert result["paper_labels"][3] == vocab.PASS  # the reveal turn itself is unaffected


# --- the priority rule on constructed evidence: every pair of labels --------------------------------
GT = (Call("cd", {"folder": "a"}), Call("cat", {"file_name": "f"}))
ARG_ERROR = "Error during execution: cat() got an unexpected keyword argument 'x'"
PATH_ERROR = "Error during execution: mv: nope: No such file or directory"


def _trigger(label: str) -> tuple[list[Step], OwnCheck]:
    """Steps and own-check evidence that satisfy exactly the rule of ``label`` (and no higher one)."""
    ok = AcceptedCall("cd", {"folder": "a"}, "ok", False)
    if label == vocab.INVALID_TOOL_CALL:
        return [Step(vocab.PARSE_ERROR, error="bad json")], OwnCheck(True, True)
    if label == vocab.ARGUMENT_MISMATCH:
        return [Step("calls", calls=[AcceptedCall("cat", {"x": 1}, ARG_ERROR, True)])], OwnCheck(True, True)
    if label == vocab.STATE_MISMATCH:
        return [Step("calls", calls=[AcceptedCall("rm", {"file_name": "f"}, "ok", False)])], OwnCheck(False, True)
    if label == vocab.RECOVERY_FAILURE:
        failed = AcceptedCall("mv", {"source": "nope", "destination": "b"}, PATH_ERROR, True)
        return [Step("calls", calls=[failed])], OwnCheck(True, True)
    if label == vocab.MISSING_TOOL_CALL:
        return [Step("calls", calls=[ok])], OwnCheck(True, False)
    assert label == vocab.RESPONSE_MISMATCH
    return [Step("calls", calls=[ok, AcceptedCall("cat", {"file_name": "f"}, "x", False)])], OwnCheck(True, False)


def _evidence(labels: tuple[str, ...]) -> TurnEvidence:
    """Evidence for several rules at once. The response always fails (the turn failed); response_mismatch is
    the rule for "nothing else": its own trigger (all calls made) is only used alone."""
    steps: list[Step] = []
    state_ok, response_ok = True, False
    if len(labels) > 1:
        labels = tuple(label for label in labels if label != vocab.RESPONSE_MISMATCH)
    for label in labels:
        s, own = _trigger(label)
        steps += s
        state_ok = state_ok and bool(own.state_ok)
    return TurnEvidence(vocab.STATE_MISMATCH, Turn(steps), GT, OwnCheck(state_ok, response_ok))


FAILURES = [label for label in vocab.PAPER_LABELS if label != vocab.PASS]


@pytest.mark.parametrize("label", FAILURES)
def test_each_rule_alone(label):
    assert paper_label(_evidence((label,))) == label


@pytest.mark.parametrize("higher, lower", list(itertools.combinations(FAILURES, 2)))
def test_priority_between_every_pair(higher, lower):
    # FAILURES is in the paper's priority order: the higher rule wins whichever evidence comes first
    assert paper_label(_evidence((higher, lower))) == higher
    assert paper_label(_evidence((lower, higher))) == higher


def test_pass_and_harness_tags():
    steps, _ = _trigger(vocab.ARGUMENT_MISMATCH)
    assert paper_label(TurnEvidence(vocab.PASS, Turn(steps), GT)) == vocab.PASS
    # a failing cumulative tag whose own replay passes: inherited, so pass
    assert paper_label(TurnEvidence(vocab.STATE_MISMATCH, Turn(steps), GT, OwnCheck(True, True))) == vocab.PASS
    for tag in vocab.EXCLUDED_TAGS:
        assert paper_label(TurnEvidence(tag, Turn(steps), GT)) == tag
    assert paper_label(TurnEvidence(vocab.EMPTY_TURN, None, GT)) == vocab.MISSING_TOOL_CALL  # never reached
