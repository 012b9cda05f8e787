"""Diagnosis vocabularies: the single definition of every per-turn tag and label.

Two vocabularies describe a turn of a BFCL multi-turn episode:

* ``PROGRESS_TAGS`` — the release's per-turn progress tags (docs/release_behaviour.md §5.2). They come from
  re-executing the trajectory turn by turn against the ground truth with BFCL's own
  ``state_checker`` / ``response_checker``.
* ``PAPER_LABELS`` — the paper's six failure labels plus ``pass`` (docs/paper.md §2),
  assigned by the deterministic priority rule in ``env_service/diagnosis.py`` (documented in
  ``docs/diagnosis.md``).

Both the service (which computes them) and the trainer (A-Patch, capability state, interface
evolution) import them from here.
"""

from __future__ import annotations

# --- release progress tags (docs/release_behaviour.md §5.2), in the release's de-facto priority order
PASS = "pass"
CORRECT_ABSTENTION = "correct_abstention"
SPURIOUS_TOOL_CALL = "spurious_tool_call"
EMPTY_TURN = "empty_turn_model_response"
INSTANCE_MISMATCH = "instance_mismatch"
STATE_MISMATCH = "state_mismatch"
RESPONSE_MISMATCH = "response_mismatch"
CHECKER_ERROR = "checker_error"
GT_ERROR = "gt_error"
# ours: an action went over the service's cost budget (env_service/budget.py); the model's fault, a failure
BUDGET_EXCEEDED = "budget_exceeded"

PROGRESS_TAGS: tuple[str, ...] = (
    PASS,
    CORRECT_ABSTENTION,
    SPURIOUS_TOOL_CALL,
    EMPTY_TURN,
    INSTANCE_MISMATCH,
    STATE_MISMATCH,
    RESPONSE_MISMATCH,
    CHECKER_ERROR,
    GT_ERROR,
    BUDGET_EXCEEDED,
)

# Tags that describe the harness, not the policy: A-Patch and the capability state ignore them.
EXCLUDED_TAGS: frozenset[str] = frozenset({CHECKER_ERROR, GT_ERROR})

# The official verdict's error type when BFCL's checker itself raised (env_service/grading.py): the 0 is the
# harness's, not the policy's. Training excludes such an episode, evaluation counts it as errored.
CHECKER_EXCEPTION = "checker_exception"

# Turns that count as succeeded in the progress vocabulary.
SUCCESS_TAGS: frozenset[str] = frozenset({PASS, CORRECT_ABSTENTION})

# --- paper labels (docs/paper.md §2, priority 1 = highest) ------------------------------------------
INVALID_TOOL_CALL = "invalid_tool_call"
ARGUMENT_MISMATCH = "argument_mismatch"
RECOVERY_FAILURE = "recovery_failure"
MISSING_TOOL_CALL = "missing_tool_call"

PAPER_LABELS: tuple[str, ...] = (
    INVALID_TOOL_CALL,
    ARGUMENT_MISMATCH,
    STATE_MISMATCH,
    RECOVERY_FAILURE,
    MISSING_TOOL_CALL,
    RESPONSE_MISMATCH,
    PASS,
)

VOCABULARIES: dict[str, tuple[str, ...]] = {
    "progress": PROGRESS_TAGS,
    "paper": PAPER_LABELS,
}

# --- step-level error types reported in ``step`` replies (docs/protocol.md) -------------------
PARSE_ERROR = "parse_error"
UNAVAILABLE_TOOL = "unavailable_tool"
TOOL_ERROR = "tool_error"
STEP_ERROR_TYPES: tuple[str, ...] = (PARSE_ERROR, UNAVAILABLE_TOOL, TOOL_ERROR, BUDGET_EXCEEDED)

CATEGORIES: tuple[str, ...] = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)


def category_of(task_id: str) -> str:
    """BFCL category of a task id (``multi_turn_miss_func_12`` -> ``multi_turn_miss_func``)."""
    return task_id.rsplit("_", 1)[0]
