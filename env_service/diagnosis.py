"""Paper labels: one label per turn from that turn's own evidence, by the paper's priority (docs/diagnosis.md).

The paper defines the label of turn i as z_i = Ψ(a_i, ξ_i, s_{i-1}, s_i, F): a function of the turn's action,
its parser / schema / execution / verifier evidence and its *own* state transition. The progress tag alone
cannot say whose fault a failing turn is, because BFCL's checks compare the cumulative state: once an earlier
turn left a wrong state, every later turn fails ``state_checker`` however right its own calls are. So a
failing turn is re-checked in isolation: its accepted calls are replayed from the *reference* state before
the turn (the ground truth of turns 0..i-1 replayed on fresh instances) and compared with the reference
state and results after it (``own_turn_check``). Evidence per turn (``TurnEvidence``):

* the release progress tag (cumulative re-execution with BFCL's ``state_checker`` / ``response_checker``);
* rejected messages (unparsable, or a call to a tool that is not available now — a held-out tool before its
  reveal, or a name that does not exist);
* tool errors of the turn's calls as replayed from the reference state (its own errors, not those an earlier
  turn's wrong state caused), their family (``env_service.tool_errors``) and whether a later call of the same
  function in the turn succeeded (the model recovered: a repaired error labels nothing, whatever its family);
* the turn's own state transition and results (replayed from the reference state);
* the called functions and arguments against the ground truth's.

Decision (docs/diagnosis.md has the signals, the table and the judgments): the evidence is reduced to
``TurnSignals`` and the label is the highest-priority one whose condition holds (``label_from_signals``):

* harness errors (``checker_error``, ``gt_error``) keep their tag;
* ground truth empty (the model should not call anything): ``pass`` when nothing was attempted, else
  ``invalid_tool_call``;
* ``pass`` when the cumulative check passes;
* otherwise the turn fails *by its own evidence* unless its own replay passes (an inherited mismatch); by the
  paper's priority:
  1. invalid_tool_call  — own failure, and a message of the turn was rejected;
  2. argument_mismatch  — own failure, and a call failed with an argument error, or a call of a function the
                          ground truth makes has arguments no ground-truth call of it has (either one not
                          repaired later in the turn);
  3. state_mismatch     — own failure, some call executed and the own transition leaves a wrong state;
  4. recovery_failure   — own failure with a tool error nothing repaired, or any failing turn while an earlier
                          turn's error feedback is still unrepaired;
  5. missing_tool_call  — own failure, and no accepted call, or a ground-truth function not called;
  6. response_mismatch  — own failure, nothing above;
  and ``pass`` (an inherited mismatch) when nothing holds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from env_service import vocab
from env_service.bfcl import response_checker, state_checker
from env_service.executor import ToolExecutor
from env_service.tasks import Call, Task
from env_service.tool_errors import is_argument_error, is_error_result
from env_service.trajectory import AcceptedCall, Turn


@dataclass(frozen=True)
class OwnCheck:
    """The turn replayed alone from the reference state before it: is its transition / are its results right?

    ``None`` where BFCL's checker raised (no evidence either way). ``calls``: the turn's calls with the results
    (and errors) of that replay, from which the turn's tool-error signals are read (docs/diagnosis.md, judgment
    "a turn's tool errors are those of its own replay"); ``None`` only in constructed evidence that gives no
    replay results, where the recorded calls are read instead."""

    state_ok: bool | None
    response_ok: bool | None
    calls: tuple[AcceptedCall, ...] | None = None

    @property
    def passed(self) -> bool:
        return bool(self.state_ok) and bool(self.response_ok)


def own_turn_check(task: Task, index: int, calls: list[AcceptedCall]) -> OwnCheck:
    """Replay ``calls`` (turn ``index``'s accepted calls) from the reference state s*_{index-1} and check the
    result against the reference s*_index with BFCL's own checkers. Fresh instances; nothing is shared."""
    model = ToolExecutor(task.involved_classes, task.initial_config, task.long_context)
    reference = ToolExecutor(task.involved_classes, task.initial_config, task.long_context)
    for earlier in task.gt_calls[:index]:
        for c in earlier:
            model.call(c.name, c.arguments)
            reference.call(c.name, c.arguments)
    results = [model.call(c.name, c.arguments) for c in calls]
    replayed = tuple(
        AcceptedCall(c.name, c.arguments, r, is_error_result(r)) for c, r in zip(calls, results, strict=True)
    )
    gt_results = [reference.call(c.name, c.arguments) for c in task.gt_calls[index]]
    try:
        state_ok: bool | None = bool(state_checker(model.instances, reference.instances)["valid"])
    except Exception:
        state_ok = None
    try:
        response_ok: bool | None = bool(response_checker(results, gt_results, index)["valid"])
    except Exception:
        response_ok = None
    return OwnCheck(state_ok, response_ok, replayed)


def unrecovered_errors(calls: list[AcceptedCall]) -> list[AcceptedCall]:
    """Failed calls that no later successful call of the same function in the turn repaired."""
    out = []
    for i, call in enumerate(calls):
        if call.is_error and not any(c.name == call.name and not c.is_error for c in calls[i + 1 :]):
            out.append(call)
    return out


def wrong_arguments(calls: list[AcceptedCall], gt_calls: list[Call]) -> bool:
    """Some call names a function the ground truth calls in this turn, with arguments none of the ground truth's
    calls of that function has, and no later call of the same function in the turn made a ground-truth call.

    Read from the model's calls only: a ground-truth call of a function the model never attempted cannot make
    it true (the same action gets the same label whatever else the ground truth holds)."""

    def is_gt(call: AcceptedCall) -> bool:
        return any(g.name == call.name and g.arguments == call.arguments for g in gt_calls)

    gt_names = {g.name for g in gt_calls}
    return any(
        call.name in gt_names and not is_gt(call)
        and not any(c.name == call.name and is_gt(c) for c in calls[i + 1 :])
        for i, call in enumerate(calls)
    )


@dataclass(frozen=True)
class TurnEvidence:
    """Everything the label of one turn is computed from (``turn`` is None for a turn never reached)."""

    tag: str
    turn: Turn | None
    gt_calls: tuple[Call, ...]
    own: OwnCheck | None = None  # None: not needed (the cumulative check passed, or no accepted call)
    # An earlier turn failed with a tool error that nothing repaired, and no turn since passed the cumulative check.
    earlier_error: bool = False

    @property
    def calls(self) -> list[AcceptedCall]:
        return self.turn.accepted_calls() if self.turn else []

    @property
    def error_calls(self) -> list[AcceptedCall]:
        """The calls whose tool errors are the turn's own: as replayed from the reference state where the turn
        was replayed, else as recorded (a passing turn, or constructed evidence without replay results)."""
        if self.own is not None and self.own.calls is not None:
            return list(self.own.calls)
        return self.calls

    @property
    def rejected(self) -> int:
        if self.turn is None:
            return 0
        return self.turn.count(vocab.PARSE_ERROR) + self.turn.count(vocab.UNAVAILABLE_TOOL)


def needs_own_check(tag: str, turn: Turn | None, gt_calls: list[Call]) -> bool:
    """The isolated replay is needed only for a failing turn with ground-truth calls and accepted calls."""
    failing = tag not in vocab.SUCCESS_TAGS and tag not in vocab.EXCLUDED_TAGS
    return failing and bool(gt_calls) and turn is not None and bool(turn.accepted_calls())


@dataclass(frozen=True)
class TurnSignals:
    """The signals a label is decided from (docs/diagnosis.md, "Signals"), computed once from the evidence."""

    harness_error: bool  # the progress tag is checker_error / gt_error
    gt_has_calls: bool
    attempted: bool  # an accepted call or a rejected message
    cumulative_pass: bool  # the progress tag is a success
    own_pass: bool  # the turn's own replay from the reference state passes both checks
    rejected: bool  # a message (or, official rules, a call) was rejected
    argument_error: bool  # an argument-family tool error no later successful call of the same function repaired
    wrong_arguments: bool  # ``wrong_arguments``
    state_wrong: bool  # a call executed and the own replay (or the instance set) leaves a wrong state
    unrepaired_error: bool  # a tool error no later successful call of the same function repaired
    earlier_error: bool  # an earlier turn's unrepaired error feedback is still pending
    missing: bool  # no accepted call, or a ground-truth function (as a multiset) not called


def turn_signals(ev: TurnEvidence) -> TurnSignals:
    """The signals of the turn alone: its tool errors come from its own replay from the reference state
    (``TurnEvidence.error_calls``), as its own pass does; one repair rule (``unrecovered_errors``) for every error
    family."""
    calls = ev.calls
    missing = Counter(g.name for g in ev.gt_calls) - Counter(c.name for c in calls)
    own_state_ok = ev.own.state_ok if ev.own is not None else None
    unrepaired = unrecovered_errors(ev.error_calls)
    executed = any(not c.is_error for c in ev.error_calls)
    return TurnSignals(
        harness_error=ev.tag in vocab.EXCLUDED_TAGS,
        gt_has_calls=bool(ev.gt_calls),
        attempted=bool(calls) or bool(ev.rejected),
        cumulative_pass=ev.tag in vocab.SUCCESS_TAGS,
        own_pass=ev.own is not None and ev.own.passed,
        rejected=bool(ev.rejected),
        argument_error=any(is_argument_error(c.result) for c in unrepaired),
        wrong_arguments=wrong_arguments(calls, list(ev.gt_calls)),
        state_wrong=executed and (own_state_ok is False or ev.tag == vocab.INSTANCE_MISMATCH),
        unrepaired_error=bool(unrepaired),
        earlier_error=ev.earlier_error,
        missing=not calls or bool(missing),
    )


def label_from_signals(s: TurnSignals) -> str:
    """The paper label: the highest-priority label whose condition holds (docs/diagnosis.md, "Decision").

    A turn fails *by its own evidence* when the cumulative check fails and its own replay does not pass (a
    mismatch inherited from an earlier turn is that turn's failure). Labels 1-3, 5 and 6 need the turn to fail by
    its own evidence; ``recovery_failure`` (4) also holds for any cumulatively failing turn while an earlier
    turn's error feedback is still unrepaired ("after executable error feedback, later turns do not recover")."""
    if s.harness_error:
        raise ValueError("a harness error has no paper label: it keeps its progress tag")
    if not s.gt_has_calls:
        return vocab.INVALID_TOOL_CALL if s.attempted else vocab.PASS
    if s.cumulative_pass:
        return vocab.PASS
    own_failure = not s.own_pass
    if own_failure and s.rejected:
        return vocab.INVALID_TOOL_CALL
    if own_failure and (s.argument_error or s.wrong_arguments):
        return vocab.ARGUMENT_MISMATCH
    if own_failure and s.state_wrong:
        return vocab.STATE_MISMATCH
    if (own_failure and s.unrepaired_error) or s.earlier_error:
        return vocab.RECOVERY_FAILURE
    if own_failure and s.missing:
        return vocab.MISSING_TOOL_CALL
    if own_failure:
        return vocab.RESPONSE_MISMATCH
    return vocab.PASS


def paper_label(ev: TurnEvidence) -> str:
    """The paper label of one turn (module docstring)."""
    if ev.tag in vocab.EXCLUDED_TAGS:
        return ev.tag
    return label_from_signals(turn_signals(ev))


def turn_evidence(task: Task, index: int, tag: str, turn: Turn | None, earlier_error: bool = False) -> TurnEvidence:
    """Gather the evidence of turn ``index``, replaying it alone when it failed.
    ``earlier_error``: ``ErrorCarry.pending`` before this turn."""
    gt_calls = task.gt_calls[index]
    own = own_turn_check(task, index, turn.accepted_calls()) if needs_own_check(tag, turn, gt_calls) else None
    return TurnEvidence(tag, turn, tuple(gt_calls), own, earlier_error)


def label_turn(task: Task, index: int, tag: str, turn: Turn | None, earlier_error: bool = False) -> str:
    """The paper label of turn ``index`` (``turn_evidence``, then ``paper_label``)."""
    return paper_label(turn_evidence(task, index, tag, turn, earlier_error))


class ErrorCarry:
    """Whether unrepaired executable error feedback is still pending when a turn starts (cross-turn recovery).

    Set by a turn that failed (its label is a failure) with a tool error of its own (in its replay from the
    reference state, ``TurnEvidence.error_calls``) that no later call of the turn repaired: an error caused only by
    an earlier turn's wrong state is that turn's failure, not feedback on this turn's action. Cleared by a turn
    whose cumulative check passes (the state and results are right again: recovered)."""

    def __init__(self) -> None:
        self.pending = False

    def update(self, tag: str, label: str, ev: TurnEvidence) -> None:
        if tag == vocab.PASS:  # an empty-ground-truth turn checks no state: it clears nothing
            self.pending = False
        elif label in vocab.PAPER_LABELS and label != vocab.PASS and unrecovered_errors(ev.error_calls):
            self.pending = True
