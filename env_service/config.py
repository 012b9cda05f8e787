"""Service and episode settings. Defaults reproduce the authors' release unless marked (ours)."""

from __future__ import annotations

from dataclasses import dataclass, field

from env_service.budget import Budget


@dataclass(frozen=True)
class StepLimit:
    """When an episode is cut off. The release counts model calls over the whole episode (``max_steps: 20``,
    docs/release_behaviour.md §8.2); official BFCL allows 20 steps per user turn. Either way a cut-off episode ends
    (done) and is graded as BFCL grades a force-terminated one."""

    scope: str = "episode"  # "episode" (release) | "turn" (official BFCL)
    max_steps: int = 20

    def __post_init__(self) -> None:
        if self.scope not in ("episode", "turn"):
            raise ValueError(f"step limit scope must be 'episode' or 'turn', got {self.scope!r}")
        if not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ValueError(f"max_steps must be a positive integer, got {self.max_steps!r}")


@dataclass(frozen=True)
class EpisodeConfig:
    step_limit: StepLimit = field(default_factory=StepLimit)
    # Held-out miss_func tools are callable only after their reveal turn (release: enforce_available_tools
    # True). Off = the official harness, which executes a call to any tool of the involved classes; the one
    # task where this matters is multi_turn_miss_func_49 (its ground truth calls `tail` two turns early).
    strict_availability: bool = True
    # The release's revealed docs carried " Note that the provided function is in Python 3 syntax." because a
    # BFCL helper mutated them in place (docs/release_behaviour.md §4.4). Off = the bug fixed; on = the release's text.
    release_reveal_note: bool = False
    # The cost budget of one action (ours; env_service/budget.py, docs/env_service.md "Cost limits").
    budget: Budget = field(default_factory=Budget)


@dataclass(frozen=True)
class ServiceConfig:
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    ttl_s: float = 3600.0  # idle episodes expire (release: max_idle_time 3600 s, swept every 300 s)
    sweep_interval_s: float = 60.0
    max_body_bytes: int = 1 << 20  # 1 MiB (ours)
    max_episodes: int = 20_000  # open episodes before new ones are refused with 503 (ours)
    token: str | None = None  # bearer token, required when set (recommended when not on loopback)
    split_file: str | None = None  # default: data/bfcl_split.json
    # Worker processes that run BFCL code under the budget's deadline and memory limit (0: in the service's own
    # process, where only the guards and the reply limit hold — for debugging). (ours)
    workers: int = 4
    # Open connections beyond this are refused at accept (the health check keeps answering). (ours)
    max_connections: int = 512
    header_timeout_s: float = 10.0  # a request's headers and body must arrive within this (ours)
    eval_rules: str = "release"  # rules of eval-mode episodes that name none (env_service.rules)
    # Training episodes on eval-split tasks: refused (403 eval_task_in_training) unless this is set, for research
    # that trains on held-out tasks on purpose (the recipe's data.allow_eval_overlap sets it). (ours)
    allow_train_on_eval: bool = False
