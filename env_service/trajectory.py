"""What an episode records, turn by turn: the executable evidence that grading and diagnosis read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from env_service.calls import format_call


@dataclass
class AcceptedCall:
    name: str
    arguments: dict[str, Any]
    result: str
    is_error: bool

    @property
    def call_string(self) -> str:
        return format_call(self.name, self.arguments)


@dataclass
class Step:
    """One assistant message. ``kind``: ``calls`` (accepted and executed), ``text`` (no calls: ends the
    turn), ``parse_error`` or ``unavailable_tool`` (rejected: nothing executed)."""

    kind: str
    calls: list[AcceptedCall] = field(default_factory=list)
    attempted: list[str] = field(default_factory=list)  # tool names the message tried to call
    error: str | None = None
    # official rules: the step's call strings for BFCL's checker, calls that could only fail included
    # (env_service.official.checker_call); None: the accepted calls'
    checker_calls: list[str] | None = None
    # official rules: one kind per call of the message that could not run (BFCL's executor answered it with an
    # error text): ``unavailable_tool`` for a name that does not exist, ``parse_error`` for a call string Python
    # cannot evaluate. The release rules reject such a message whole; here the rest of the message ran, so the
    # rejection is recorded per call and diagnosis sees it (it never reaches BFCL's checker).
    rejected: list[str] = field(default_factory=list)


@dataclass
class Turn:
    steps: list[Step] = field(default_factory=list)

    def accepted_calls(self) -> list[AcceptedCall]:
        return [c for s in self.steps for c in s.calls]

    def call_steps(self) -> list[list[str]]:
        """Call strings per step with accepted calls — BFCL's ``model_result[turn][step]``."""
        steps = [s.checker_calls if s.checker_calls is not None else [c.call_string for c in s.calls]
                 for s in self.steps]
        return [calls for calls in steps if calls]

    def count(self, kind: str) -> int:
        """Steps of ``kind``, plus the calls of ``kind`` rejected inside a step that ran (official rules)."""
        return sum((s.kind == kind) + s.rejected.count(kind) for s in self.steps)
