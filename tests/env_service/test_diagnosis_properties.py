"""The paper-label decision on generated evidence, against the table of docs/diagnosis.md ("Signals", "Decision").

The expected label comes from ``DOC_TABLE`` below, written from the docs' table (conditions over the raw evidence,
in the docs' priority order), not from ``env_service.diagnosis``. Error texts are chosen by the generator with their
family known (``ARG_ERRORS`` are argument-family messages, ``OTHER_ERRORS`` are not), so the oracle does not call
the code's classifier either. Plus the contradictions of the earlier rules (the repair rule that depended on the
error's family, the tool errors read from the cumulative run), each on real BFCL tasks or on constructed evidence,
and the docs' marking of each judgment.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from env_service import vocab
from env_service.diagnosis import OwnCheck, TurnEvidence, paper_label
from env_service.parser import format_tool_call
from env_service.tasks import Call, load_tasks
from env_service.trajectory import AcceptedCall, Step, Turn
from seal.core.weights import PAPER_WEIGHTS
from tests.env_service.test_diagnosis import grade

ROOT = Path(__file__).resolve().parents[2]

# --- generated evidence ---------------------------------------------------------------------------------------
GT_POOL = (Call("cd", {"folder": "a"}), Call("cat", {"file_name": "f"}),
           Call("mv", {"source": "x", "destination": "y"}))
WRONG_ARGS = {"cd": {"folder": "zz"}, "cat": {"file_name": "nope"}, "mv": {"source": "q", "destination": "y"},
              "ls": {"a": True}}
RIGHT_ARGS = {c.name: c.arguments for c in GT_POOL} | {"ls": {}}
ARG_ERRORS = ("Error during execution: cat() got an unexpected keyword argument 'x'",
              "Error during execution: cd() missing 1 required positional argument: 'folder'")
OTHER_ERRORS = ("Error during execution: mv: nope: No such file or directory",)
# a read-only ground-truth call of a function the generated model never calls
UNRELATED = Call("wc", {"file_name": "f", "mode": "l"})


@dataclass(frozen=True)
class Gen:
    """One generated turn: the evidence and, per call, whether its error is argument-family: ``arg_error`` for the
    recorded calls, ``own_arg_error`` for the calls of the own replay (``None``: no replay results given)."""

    evidence: TurnEvidence
    arg_error: tuple[bool, ...]
    own_arg_error: tuple[bool, ...] | None = None


def _outcome(draw, name: str, args: dict) -> tuple[AcceptedCall, bool]:
    outcome = draw(st.sampled_from(["ok", "arg", "other"]))
    if outcome == "ok":
        return AcceptedCall(name, dict(args), "ok", False), False
    text = draw(st.sampled_from(ARG_ERRORS if outcome == "arg" else OTHER_ERRORS))
    return AcceptedCall(name, dict(args), text, True), outcome == "arg"


@st.composite
def call_strategy(draw) -> tuple[AcceptedCall, bool]:
    name = draw(st.sampled_from(["cd", "cat", "mv", "ls"]))
    args = draw(st.sampled_from([RIGHT_ARGS[name], WRONG_ARGS[name]]))
    return _outcome(draw, name, args)


@st.composite
def evidence_strategy(draw, gt_nonempty: bool = False) -> Gen:
    gt = draw(st.lists(st.sampled_from(GT_POOL), min_size=1 if gt_nonempty else 0, max_size=3))
    drawn = draw(st.lists(call_strategy(), max_size=4))
    calls = [c for c, _ in drawn]
    steps = [Step("calls", calls=[c]) for c in calls]
    for _ in range(draw(st.integers(0, 1))):
        steps.insert(draw(st.integers(0, len(steps))), Step(draw(st.sampled_from([vocab.PARSE_ERROR,
                                                                                   vocab.UNAVAILABLE_TOOL]))))
    reached = draw(st.booleans()) or bool(steps)
    own = draw(st.one_of(st.none(), st.builds(OwnCheck, st.sampled_from([True, False, None]),
                                              st.sampled_from([True, False, None]))))
    own_arg_error = None
    if own is not None and draw(st.booleans()):
        # the own replay's results: the same calls, each with an outcome of its own (from the reference state a
        # call may fail that succeeded in the episode, or the other way round)
        replayed = [_outcome(draw, c.name, c.arguments) for c in calls]
        own = OwnCheck(own.state_ok, own.response_ok, tuple(c for c, _ in replayed))
        own_arg_error = tuple(a for _, a in replayed)
    tag = draw(st.sampled_from([vocab.PASS, vocab.STATE_MISMATCH, vocab.RESPONSE_MISMATCH, vocab.EMPTY_TURN,
                                vocab.INSTANCE_MISMATCH, vocab.CHECKER_ERROR, vocab.GT_ERROR]
                               if gt else [vocab.CORRECT_ABSTENTION, vocab.SPURIOUS_TOOL_CALL]))
    ev = TurnEvidence(tag, Turn(steps) if reached else None, tuple(gt), own, draw(st.booleans()))
    return Gen(ev, tuple(a for _, a in drawn), own_arg_error)


# --- the docs' table, over the raw evidence ------------------------------------------------------------------
def _is_gt(call: AcceptedCall, gt: tuple[Call, ...]) -> bool:
    return any(g.name == call.name and g.arguments == call.arguments for g in gt)


def _calls_and_rejected(ev: TurnEvidence) -> tuple[list[AcceptedCall], int]:
    steps = ev.turn.steps if ev.turn else []
    rejected = sum(s.kind in (vocab.PARSE_ERROR, vocab.UNAVAILABLE_TOOL) for s in steps)
    return [c for s in steps for c in s.calls], rejected


def _conditions(g: Gen) -> dict[str, bool]:
    ev = g.evidence
    calls, rejected = _calls_and_rejected(ev)
    own_failure = not (ev.own is not None and ev.own.state_ok is True and ev.own.response_ok is True)
    gt_names = {c.name for c in ev.gt_calls}
    wrong = any(c.name in gt_names and not _is_gt(c, ev.gt_calls)
                and not any(later.name == c.name and _is_gt(later, ev.gt_calls) for later in calls[i + 1:])
                for i, c in enumerate(calls))
    # a turn's tool errors: those of its own replay where it has replay results, else the recorded ones
    own_calls = ev.own is not None and ev.own.calls is not None
    err_calls = list(ev.own.calls) if own_calls else calls
    arg_flags = g.own_arg_error if own_calls else g.arg_error
    state_wrong = any(not c.is_error for c in err_calls) and (
        (ev.own is not None and ev.own.state_ok is False) or ev.tag == vocab.INSTANCE_MISMATCH)
    # one repair rule for every error family: a later successful call of the same function in the turn
    unrepaired = [c.is_error and not any(later.name == c.name and not later.is_error for later in err_calls[i + 1:])
                  for i, c in enumerate(err_calls)]
    missing = not calls or bool(Counter(c.name for c in ev.gt_calls) - Counter(c.name for c in calls))
    return {  # the docs' Decision table, row by row, in priority order
        vocab.INVALID_TOOL_CALL: own_failure and rejected > 0,
        vocab.ARGUMENT_MISMATCH: own_failure and (any(map(bool.__and__, arg_flags, unrepaired)) or wrong),
        vocab.STATE_MISMATCH: own_failure and state_wrong,
        vocab.RECOVERY_FAILURE: (own_failure and any(unrepaired)) or ev.earlier_error,
        vocab.MISSING_TOOL_CALL: own_failure and missing,
        vocab.RESPONSE_MISMATCH: own_failure,
    }


def doc_label(g: Gen) -> str:
    ev = g.evidence
    if ev.tag in (vocab.CHECKER_ERROR, vocab.GT_ERROR):
        return ev.tag
    calls, rejected = _calls_and_rejected(ev)
    attempted = bool(calls) or rejected > 0
    if not ev.gt_calls:
        return vocab.INVALID_TOOL_CALL if attempted else vocab.PASS
    if ev.tag in (vocab.PASS, vocab.CORRECT_ABSTENTION):
        return vocab.PASS
    holding = [label for label, holds in _conditions(g).items() if holds]
    return holding[0] if holding else vocab.PASS


@settings(max_examples=600, deadline=None)
@given(evidence_strategy())
def test_label_is_the_highest_priority_row_that_holds(g):
    assert paper_label(g.evidence) == doc_label(g)


@settings(max_examples=600, deadline=None)
@given(evidence_strategy(gt_nonempty=True))
def test_a_failing_action_gets_the_same_label_whatever_unattempted_ground_truth_calls_the_turn_has(g):
    ev = g.evidence
    own_failure = not (ev.own is not None and ev.own.passed)
    if ev.tag in vocab.SUCCESS_TAGS or ev.tag in vocab.EXCLUDED_TAGS or not own_failure:
        return  # the property is about failing turns; passing ones are covered by the table test
    # the same action, with a read-only ground-truth call it never attempted: its results are missing from the
    # own replay's (response fails), the state is unchanged
    own = ev.own if ev.own is None or ev.own.response_ok is None else replace(ev.own, response_ok=False)
    wider = TurnEvidence(ev.tag, ev.turn, ev.gt_calls + (UNRELATED,), own, ev.earlier_error)
    before, after = paper_label(ev), paper_label(wider)
    assert after == (vocab.MISSING_TOOL_CALL if before == vocab.RESPONSE_MISMATCH else before)


# --- the three contradictions of the earlier rules -------------------------------------------------------------
TASKS = load_tasks()


def call(name: str, **arguments) -> str:
    return format_tool_call(name, arguments)


def test_a_tool_error_on_the_right_function_does_not_depend_on_the_turns_other_ground_truth_calls():
    # turn 0 of base_25 reads one file (cat only); turn 0 of base_32 reads a file and counts it (cat, wc)
    assert [c.name for c in TASKS["multi_turn_base_25"].gt_calls[0]] == ["cat"]
    assert [c.name for c in TASKS["multi_turn_base_32"].gt_calls[0]] == ["cat", "wc"]
    for task_id in ("multi_turn_base_25", "multi_turn_base_32"):
        result = grade(task_id, [[call("cat", file_name="nope.txt")]])
        assert result["paper_labels"][0] == vocab.ARGUMENT_MISMATCH, task_id


def test_a_later_turn_without_a_call_after_unrepaired_error_feedback_is_a_recovery_failure():
    # turn 0: cd into a missing folder, never repaired (error feedback); turn 1: no call at all
    result = grade("multi_turn_base_2", [[call("cd", folder="nope")], []])
    assert result["turns"][0]["tool_errors"] == 1
    assert result["paper_labels"][:2] == [vocab.ARGUMENT_MISMATCH, vocab.RECOVERY_FAILURE]
    # the same turn 1 after a turn 0 whose mistake came without error feedback: missing_tool_call
    silent = grade("multi_turn_base_2", [[call("mkdir", dir_name="elsewhere")], []])
    assert silent["paper_labels"][:2] == [vocab.STATE_MISMATCH, vocab.MISSING_TOOL_CALL]


def test_a_later_turn_with_exact_calls_and_a_wrong_response_after_error_feedback_is_a_recovery_failure():
    gt = (Call("cd", {"folder": "a"}), Call("cat", {"file_name": "f"}))
    exact = Turn([Step("calls", calls=[AcceptedCall(c.name, dict(c.arguments), "ok", False) for c in gt])])
    ev = TurnEvidence(vocab.RESPONSE_MISMATCH, exact, gt, OwnCheck(True, False), earlier_error=True)
    assert paper_label(ev) == vocab.RECOVERY_FAILURE
    assert paper_label(TurnEvidence(vocab.RESPONSE_MISMATCH, exact, gt, OwnCheck(True, False))) == \
        vocab.RESPONSE_MISMATCH


def test_a_repaired_error_labels_nothing_whatever_its_family():
    # multi_turn_base_2, turn 0, touch skipped. Before the one rule: the missing folder (missing_path, repaired) gave
    # state_mismatch, the unexpected keyword (an argument error, repaired) gave argument_mismatch
    for first in (call("cd", folder="nope"), call("cd", dir="documents")):
        result = grade("multi_turn_base_2", [[first, call("cd", folder="documents")]])
        assert result["turns"][0]["tool_errors"] == 1
        assert result["paper_labels"][0] == vocab.STATE_MISMATCH, first


def test_a_turns_tool_errors_are_read_from_its_own_replay():
    # multi_turn_base_0: turn 0 makes only cd (a silent mistake: temp is never made), turn 1 cd("temp") fails in the
    # episode because of it and skips grep, turn 2 is exact. Before: state_mismatch, recovery_failure,
    # recovery_failure (turn 1's recorded error read as its own, then carried)
    silent = grade("multi_turn_base_0", [[call("cd", folder="document")], [call("cd", folder="temp")],
                                         [call("sort", file_name="final_report.pdf")]])
    assert silent["turns"][1]["tool_errors"] == 1  # the model did see the error
    assert silent["paper_labels"][:3] == [vocab.STATE_MISMATCH, vocab.MISSING_TOOL_CALL, vocab.PASS]
    # the same turn 1 after a correct turn 0
    gt0 = [call(c.name, **c.arguments) for c in TASKS["multi_turn_base_0"].gt_calls[0]]
    correct = grade("multi_turn_base_0", [gt0, [call("cd", folder="temp")]])
    assert correct["turns"][1]["tool_errors"] == 0
    assert correct["paper_labels"][:2] == [vocab.PASS, vocab.MISSING_TOOL_CALL]


def test_every_judgment_is_marked_with_the_other_reading_and_its_apatch_consequence():
    text = (ROOT / "docs" / "diagnosis.md").read_text()
    judgments = re.findall(r"\*\*Judgment: (.+?)\*\*(.+?)(?=\n  \d\. \*\*Judgment|\n\* \*\*)", text, re.S)
    assert len(judgments) >= 6
    for title, body in judgments:
        assert "*Other reading:*" in body and "*Consequence:*" in body, title
    titles = " ".join(title for title, _ in judgments)
    for judgment in ("a repaired error labels nothing, whatever its family",
                     "a turn's tool errors are those of its own replay from the reference state",
                     "an unrepaired tool error on a function the ground truth does not call is `recovery_failure`"):
        assert judgment in titles, judgment
    skipped = next(body for title, body in judgments if "skips a state-changing call" in title)
    # the A-Patch weights the judgment moves between, as the weight table has them
    assert f"weigh {PAPER_WEIGHTS[vocab.STATE_MISMATCH]} in A-Patch instead of " \
           f"{PAPER_WEIGHTS[vocab.MISSING_TOOL_CALL]}" in " ".join(skipped.split())
