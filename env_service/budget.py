"""The cost budget of one model action (a step or an evaluate of one episode), and what exceeding it means.

Tool code is BFCL's, not ours, and nobody audited it for cost: a policy sampling at temperature 1 will find
calls that run for minutes, allocate gigabytes or answer with hundreds of megabytes. The budget is enforced in
two layers (docs/env_service.md, "Cost limits"):

* known-expensive calls (``GUARDS`` in ``env_service.executor``) and oversized replies are refused before or
  right after they run, here, in whatever process executes BFCL code — at step and at grading;
* everything else is caught by the worker pool (``env_service.workers``): each action runs in a worker process
  under a deadline and a memory limit, and a worker that breaks either is killed and rebuilt.

An action over budget ends its episode: the model sees ``budget_message``, the episode is graded as a failure
and its turn carries the ``budget_exceeded`` tag (the model's fault, trained on like any failure).
"""

from __future__ import annotations

from dataclasses import dataclass

LIMITS = ("time", "memory", "reply", "calls", "guard")


@dataclass(frozen=True)
class Budget:
    wall_s: float = 5.0  # wall time of one action (a step's calls, or a grading) in a worker
    memory_mb: int = 256  # memory one action may add, and an episode may hold, in its worker
    reply_bytes: int = 2 << 20  # tool-result text of one action (2 MiB; BFCL's largest is ~0.1 MiB)
    max_calls: int = 64  # tool calls in one assistant message (BFCL's data has at most a handful)

    def __post_init__(self) -> None:
        if not (self.wall_s > 0 and self.memory_mb > 0 and self.reply_bytes > 0 and self.max_calls > 0):
            raise ValueError(f"every budget limit must be positive: {self}")

    def check_calls(self, count: int) -> None:
        """BudgetExceeded when one message makes more than ``max_calls`` calls (checked before any runs)."""
        if count > self.max_calls:
            raise BudgetExceeded("calls", f"the message makes more than {self.max_calls} calls.")


class BudgetExceeded(Exception):
    """An action went over one limit of the budget (``limit`` in ``LIMITS``)."""

    def __init__(self, limit: str, detail: str) -> None:
        assert limit in LIMITS, limit
        super().__init__(detail)
        self.limit, self.detail = limit, detail


def budget_message(exc: BudgetExceeded) -> str:
    """The observation an over-budget action gets (the episode is over)."""
    return (
        f"[ERROR] Action refused: {exc.detail} It exceeded the environment's cost budget ({exc.limit}); "
        "the episode has ended."
    )
