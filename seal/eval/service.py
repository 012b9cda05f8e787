"""The env service a held-in evaluation starts: its settings (the release's step limit and tool availability, or
the official ones) and starting it on a free loopback port (``seal-eval`` without ``--env-url``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from env_service.process import running_service

RELEASE_MAX_STEPS = 20  # the release's per-episode step limit (docs/release_differences.md, row 4)


@dataclass(frozen=True)
class ServiceSettings:
    """Settings of an env service this command starts (ignored with --env-url, whose own settings apply)."""

    strict_availability: bool = True  # release: held-out tools callable only after their reveal
    step_limit_scope: str = "episode"  # release: per episode; "turn": official BFCL
    max_steps: int = RELEASE_MAX_STEPS

    def cli_args(self) -> list[str]:
        args = ["--step-limit-scope", self.step_limit_scope, "--max-steps", str(self.max_steps)]
        return args if self.strict_availability else [*args, "--no-strict-availability"]

    def describe(self) -> str:
        availability = "strict (release)" if self.strict_availability else "official (--official-availability)"
        return (f"env service started here: step limit {self.max_steps} per {self.step_limit_scope}, "
                f"tool availability {availability}")


@contextlib.contextmanager
def local_env_service(settings: ServiceSettings, timeout: float = 180.0) -> Iterator[str]:
    """Start ``python -m env_service`` on a free loopback port, yield its URL, stop it afterwards."""
    with running_service(settings.cli_args(), timeout=timeout) as (url, _proc):
        yield url


def release_settings(needed: int, notes: list[str]) -> ServiceSettings:
    """The release's service settings, its step limit raised when a ground-truth replay needs `needed` calls."""
    if needed > RELEASE_MAX_STEPS:
        notes.append(f"ground_truth: per-episode step limit raised from the release's {RELEASE_MAX_STEPS} "
                     f"to {needed}, the model calls of the longest ground-truth replay among these tasks "
                     "(some train tasks need 34 calls in one turn)")
        return ServiceSettings(max_steps=needed)
    if needed:
        notes.append(f"ground_truth: the release's per-episode step limit {RELEASE_MAX_STEPS} covers the "
                     f"longest ground-truth replay among these tasks ({needed} model calls); it is raised "
                     "automatically when a replay needs more (train tasks need up to 37, 34 in one turn)")
    return ServiceSettings()
