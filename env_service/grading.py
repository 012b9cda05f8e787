"""Grading an episode: BFCL's official 0/1 verdict plus per-turn progress tags and paper labels.

* Verdict: BFCL's ``multi_turn_checker``, fed the call strings the service built from accepted, validated
  calls, under a fresh unique model name whose global instances are deleted afterwards. A trajectory whose
  number of turns differs from the ground truth's is force-terminated (0), as BFCL's runner decides.
* Progress tags (release vocabulary, docs/release_behaviour.md §5.2): the trajectory is re-executed turn by turn on
  fresh instances of our own executor (a fresh namespace: the release reused the official run's mutated
  instances, docs/release_behaviour.md §5.3) next to the ground truth, and each turn is checked with
  BFCL's ``state_checker`` and ``response_checker``. State is cumulative across turns, as in BFCL.
* Paper labels: ``env_service.diagnosis.turn_evidence`` / ``paper_label`` from each turn's own evidence
  (docs/diagnosis.md).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from env_service import vocab
from env_service.bfcl import multi_turn_checker, multi_turn_utils, response_checker, state_checker
from env_service.diagnosis import ErrorCarry, paper_label, turn_evidence
from env_service.executor import ToolExecutor, tool_class
from env_service.tasks import Task
from env_service.trajectory import Turn

FORCE_TERMINATED = "multi_turn:force_terminated"


def official_verdict(task: Task, model_turns: list[list[list[str]]]) -> dict[str, Any]:
    """BFCL's verdict for ``model_turns[turn][step] = [call strings]`` (built by the service, never raw text)."""
    if len(model_turns) != len(task.ground_truth):
        return {
            "valid": False,
            "error_type": FORCE_TERMINATED,
            "error_message": f"{len(model_turns)} model turns for {len(task.ground_truth)} ground-truth turns",
        }
    # BFCL keeps instances in its module globals under keys derived from the model name; a fresh name keeps
    # this grading independent of every other one, and the keys are removed afterwards.
    model_name = f"seal_{uuid.uuid4().hex}"
    for class_name in task.involved_classes:
        tool_class(class_name)  # isolated before BFCL's checker builds its own instances
    try:
        result = multi_turn_checker(
            model_turns, task.ground_truth, task.test_entry, task.category, model_name
        )
    except Exception as exc:  # an exception inside BFCL's checker is a harness failure, not a policy verdict
        result = {"valid": False, "error_type": vocab.CHECKER_EXCEPTION, "error_message": repr(exc)}
    finally:
        namespace = multi_turn_utils.__dict__
        prefix = re.sub(r"[-./:]", "_", model_name)
        for key in [k for k in namespace if k.startswith(prefix)]:
            del namespace[key]
    return {
        "valid": bool(result.get("valid")),
        "error_type": result.get("error_type"),
        "error_message": result.get("error_message"),
    }


def _turn_tag(
    gt_empty: bool, model_calls: int, model_ex: ToolExecutor, gt_ex: ToolExecutor, all_results, gt_results, t
) -> tuple[str, bool | None, bool | None]:
    """Release order: abstention turns, empty turn, instance set, state, response (docs/release_behaviour.md §5.2)."""
    if gt_empty:
        return (vocab.SPURIOUS_TOOL_CALL if model_calls else vocab.CORRECT_ABSTENTION), None, None
    if model_calls == 0:
        return vocab.EMPTY_TURN, None, None
    if not gt_ex.instances or set(model_ex.instances) != set(gt_ex.instances):
        return vocab.INSTANCE_MISMATCH, None, None
    try:
        state_ok = bool(state_checker(model_ex.instances, gt_ex.instances)["valid"])
    except Exception:
        return vocab.CHECKER_ERROR, None, None
    if not state_ok:
        return vocab.STATE_MISMATCH, False, None
    try:
        response_ok = bool(response_checker(all_results, gt_results, t)["valid"])
    except Exception:
        return vocab.CHECKER_ERROR, True, None
    return (vocab.PASS if response_ok else vocab.RESPONSE_MISMATCH), True, response_ok


def per_turn_diagnosis(task: Task, turns: list[Turn]) -> dict[str, Any]:
    model_ex = ToolExecutor(task.involved_classes, task.initial_config, task.long_context)
    gt_ex = ToolExecutor(task.involved_classes, task.initial_config, task.long_context)
    all_model_results: list[str] = []
    details, tags, labels = [], [], []
    carry = ErrorCarry()
    for t, gt_calls in enumerate(task.gt_calls):
        turn = turns[t] if t < len(turns) else None
        calls = turn.accepted_calls() if turn else []
        for call in calls:
            all_model_results.append(model_ex.call(call.name, call.arguments))
        try:
            gt_results = [gt_ex.call(c.name, c.arguments) for c in gt_calls]
        except Exception:
            tag, state_ok, response_ok = vocab.GT_ERROR, None, None
        else:
            tag, state_ok, response_ok = _turn_tag(
                not gt_calls, len(calls), model_ex, gt_ex, all_model_results, gt_results, t
            )
        evidence = turn_evidence(task, t, tag, turn, carry.pending)
        label = paper_label(evidence)
        carry.update(tag, label, evidence)
        if turn is not None and turn.count(vocab.BUDGET_EXCEEDED):
            # The turn's last action went over the cost budget: a refused action, the model's failure.
            tag, label = vocab.BUDGET_EXCEEDED, vocab.INVALID_TOOL_CALL
        tags.append(tag)
        labels.append(label)
        details.append(
            {
                "index": t,
                "reached": turn is not None,
                "tag": tag,
                "label": label,
                "gt_calls": len(gt_calls),
                "model_calls": len(calls),
                "parse_errors": turn.count(vocab.PARSE_ERROR) if turn else 0,
                "unavailable_calls": turn.count(vocab.UNAVAILABLE_TOOL) if turn else 0,
                "tool_errors": sum(c.is_error for c in calls),
                "state_ok": state_ok,
                "response_ok": response_ok,
            }
        )
    scorable = [d for d in details if d["gt_calls"] > 0 and d["tag"] not in vocab.EXCLUDED_TAGS]
    irrelevance = [d for d in details if d["gt_calls"] == 0]
    passed = sum(d["tag"] == vocab.PASS for d in scorable)
    passed_irr = sum(d["tag"] == vocab.CORRECT_ABSTENTION for d in irrelevance)
    counts = {
        "passed": passed,
        "scorable": len(scorable),
        "passed_irrelevance": passed_irr,
        "irrelevance": len(irrelevance),
    }
    denominator = len(scorable) + len(irrelevance)
    return {
        "failure_tags": tags,
        "paper_labels": labels,
        "turns": details,
        "counts": counts,
        "progress": passed / len(scorable) if scorable else 0.0,
        "progress_with_irrelevance": (passed + passed_irr) / denominator if denominator else 0.0,
    }


OVER_BUDGET = "multi_turn:budget_exceeded"


def grade(task: Task, turns: list[Turn], completed: bool, over_budget: bool = False) -> dict[str, Any]:
    """The ``evaluate`` reply for an episode whose recorded turns are ``turns``.

    ``over_budget``: an action of the episode exceeded the cost budget and ended it; the verdict is a failure
    without running BFCL's checker (which would replay the calls unguarded)."""
    model_turns = [turn.call_steps() for turn in turns]
    if over_budget:
        official = {
            "valid": False,
            "error_type": OVER_BUDGET,
            "error_message": "an action exceeded the service's cost budget and ended the episode",
        }
    else:
        official = official_verdict(task, model_turns)
    diagnosis = per_turn_diagnosis(task, turns)
    # Cross-check: BFCL's verdict and our per-turn pass replay the same calls, so a valid verdict must have no
    # failing scorable turn and vice versa (for a full-length trajectory). Disagreement flags a harness issue.
    failing = any(d["gt_calls"] > 0 and d["tag"] != vocab.PASS for d in diagnosis["turns"])
    consistent = (
        official["valid"] == (not failing)
        if len(model_turns) == len(task.ground_truth)
        else (not official["valid"])
    )
    official["consistent_with_turns"] = consistent or over_budget
    return {
        "task_id": task.id,
        "category": task.category,
        "accuracy": 1.0 if official["valid"] else 0.0,
        "completed": completed,
        "num_turns": task.num_turns,
        "turns_reached": len(turns),
        **diagnosis,
        "official": official,
    }


def over_budget_result(task: Task, turns: list[Turn], completed: bool, detail: str) -> dict[str, Any]:
    """The ``evaluate`` reply when grading itself went over the cost budget: a failure, every turn tagged
    ``budget_exceeded`` (grading replays the model's calls, so the cost is the trajectory's)."""
    n = task.num_turns
    details = [
        {
            "index": t,
            "reached": t < len(turns),
            "tag": vocab.BUDGET_EXCEEDED,
            "label": vocab.INVALID_TOOL_CALL,
            "gt_calls": len(task.gt_calls[t]),
            "model_calls": len(turns[t].accepted_calls()) if t < len(turns) else 0,
            "parse_errors": turns[t].count(vocab.PARSE_ERROR) if t < len(turns) else 0,
            "unavailable_calls": turns[t].count(vocab.UNAVAILABLE_TOOL) if t < len(turns) else 0,
            "tool_errors": sum(c.is_error for c in turns[t].accepted_calls()) if t < len(turns) else 0,
            "state_ok": None,
            "response_ok": None,
        }
        for t in range(n)
    ]
    scorable = sum(d["gt_calls"] > 0 for d in details)
    return {
        "task_id": task.id,
        "category": task.category,
        "accuracy": 0.0,
        "completed": completed,
        "num_turns": n,
        "turns_reached": len(turns),
        "failure_tags": [d["tag"] for d in details],
        "paper_labels": [d["label"] for d in details],
        "turns": details,
        "counts": {"passed": 0, "scorable": scorable, "passed_irrelevance": 0, "irrelevance": n - scorable},
        "progress": 0.0,
        "progress_with_irrelevance": 0.0,
        "official": {
            "valid": False,
            "error_type": OVER_BUDGET,
            "error_message": f"grading exceeded the service's cost budget: {detail}",
            "consistent_with_turns": True,
        },
    }
