"""Beyond the paper: utility weights ρ learned from the run, and the slime-style per-task weight baseline.

The paper fixes the diagnostic utility weights ρ across tasks and backbones and names learning them as future
work (docs/paper.md §5). Two mechanisms here, both off by default (docs/seal_core.md, "Beyond the paper"):

* **Repairability** (``RepairStats``, one definition shared with the curriculum sampler, ``seal.core.curriculum``):
  per failure type z, how often a visit of a task whose previous visit failed with z ends in success. A
  *visit* is one task's rollouts in one step (its GRPO group). The previous visit's failure mix m(z) — the share
  of z among the failure-tag occurrences of its failing rollouts — is credited with the new visit's success rate s:
  ``visits[z] += m(z)``, ``repaired[z] += m(z)·s``. Both decay by ``repair_decay`` once per step, so the figure
  follows the current policy. ``r(z) = (repaired[z] + prior·r̄) / (visits[z] + prior)`` shrinks a rarely seen
  type towards the mean ``r̄`` (0.5 before any evidence).
* **Adaptive ρ** (``seal.adaptive.rho: adaptive``): ``ρ_t(z) = clip(ρ_0(z) · exp(η · (r(z) − r̄)), w_min, w_max)``
  for every failure type z; ``pass`` and the other success / harness tags keep ρ_0. The hypothesis: advantages of
  failure types that the policy demonstrably learns to repair carry learnable signal, those of types it never
  repairs mostly noise. ρ_t replaces the static table as the capability state's base, so the dynamic weights (if
  on) still add their prevalence term; A-Patch then clips each trajectory's mean to [w_min, w_max] as always.
  Every weight stays in [w_min, w_max] with w_min > 0, so no advantage changes sign.
* **Per-task weights** (``seal.adaptive.task_weights: slime``), the peer baseline from slime's τ² recipe: each
  rollout's advantage is multiplied by its task's weight, ×0.1 when the task was solved in more than 75 % of its
  attempts, ×0.5 when in fewer than 25 %, once it has at least 5 attempts (the capability state's per-task totals,
  the current step included); 1 otherwise. It looks at outcomes only, never at the failure labels.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import model_validator

from env_service.vocab import EXCLUDED_TAGS, SUCCESS_TAGS
from seal.core.profile import BucketStat
from seal.core.section import Section, setting
from seal.core.weights import UNKNOWN_TAG

if TYPE_CHECKING:
    from verl import DataProto

    from seal.core.record import EpisodeRecord

RHO_MODES = ("fixed", "adaptive")
TASK_WEIGHT_MODES = ("off", "slime")
METRIC_PREFIX = "adaptive/"
STATE_FORMAT = 1
NEUTRAL_REPAIRABILITY = 0.5  # r̄ before any evidence


class AdaptiveConfig(Section):
    """``seal.adaptive``: learned utility weights and the per-task weight baseline (all ours, all off)."""

    rho: Literal[RHO_MODES] = setting("fixed", source="ours",
                                      help="utility weights: fixed (the paper's table) | adaptive (from repairability)")
    rho_rate: float = setting(1.0, source="ours", ge=0, le=10,
                              help="eta: how strongly a type's repairability above the mean raises its rho")
    repair_prior: float = setting(4.0, source="ours", ge=0,
                                  help="pseudo-visits shrinking a failure type's repairability towards the mean")
    repair_decay: float = setting(0.9, source="ours", gt=0, le=1,
                                  help="per-step decay of the repairability statistics (1 = the whole run counts)")
    task_weights: Literal[TASK_WEIGHT_MODES] = setting(
        "off", source="ours",
        help="per-task advantage weights: off | slime (the peer baseline, outcome-only)")
    task_min_attempts: int = setting(5, source="ours", ge=1, help="slime: attempts of a task before it is weighted")
    task_solved_rate: float = setting(0.75, source="ours", ge=0, le=1,
                                      help="slime: success rate above which a task counts as solved")
    task_unsolved_rate: float = setting(0.25, source="ours", ge=0, le=1,
                                        help="slime: success rate below which a task counts as unsolved")
    task_solved_scale: float = setting(0.1, source="ours", gt=0, le=1, help="slime: advantage factor of a solved task")
    task_unsolved_scale: float = setting(0.5, source="ours", gt=0, le=1,
                                         help="slime: advantage factor of an unsolved task")

    @model_validator(mode="after")
    def _check(self) -> AdaptiveConfig:
        if self.task_unsolved_rate > self.task_solved_rate:
            raise ValueError("task_unsolved_rate must be <= task_solved_rate")
        return self


def is_failure_type(tag: str) -> bool:
    """A tag that names a failure of the policy (not pass / correct_abstention, not a harness error, not unknown)."""
    return tag not in SUCCESS_TAGS and tag not in EXCLUDED_TAGS and tag != UNKNOWN_TAG


def failure_mix(records: Iterable[EpisodeRecord], vocabulary: str) -> dict[str, float]:
    """Share of each failure type among the failure-tag occurrences of the failing records (empty: none failed)."""
    counts: dict[str, float] = defaultdict(float)
    for r in records:
        if not r.success:
            for tag in r.tags(vocabulary):
                if is_failure_type(tag):
                    counts[tag] += 1.0
    total = sum(counts.values())
    return {tag: counts[tag] / total for tag in sorted(counts)} if total else {}


class RepairStats:
    """Repairability per failure type, and each task's last visit (module docstring). JSON state; pure Python."""

    def __init__(self, vocabulary: str = "progress", prior: float = 4.0, decay: float = 0.9) -> None:
        self.vocabulary = vocabulary  # whose tags are the failure types
        self.prior = float(prior)
        self.decay = float(decay)
        self.visits: dict[str, float] = {}
        self.repaired: dict[str, float] = {}
        # task_id -> {"mix": failure mix of its last visit, "rate": its success rate, "visits": count}
        self.tasks: dict[str, dict[str, Any]] = {}
        self.step: int | None = None

    def observe(self, records: Iterable[EpisodeRecord], step: int) -> None:
        """One step's non-excluded records: decay, credit each revisited task's previous mix, store the new visit.
        A second call for the same step adds to that step's visits (no second decay)."""
        by_task: dict[str, list[EpisodeRecord]] = defaultdict(list)
        for r in records:
            by_task[r.task_id].append(r)
        if step != self.step:
            for table in (self.visits, self.repaired):
                for tag in table:
                    table[tag] *= self.decay
            self.step = step
        for task_id in sorted(by_task):
            visit = by_task[task_id]
            rate = sum(1.0 for r in visit if r.success) / len(visit)
            previous = self.tasks.get(task_id)
            if previous is not None:
                for tag, share in previous["mix"].items():
                    self.visits[tag] = self.visits.get(tag, 0.0) + share
                    self.repaired[tag] = self.repaired.get(tag, 0.0) + share * rate
            self.tasks[task_id] = {"mix": failure_mix(visit, self.vocabulary), "rate": rate,
                                   "visits": (previous["visits"] if previous else 0) + 1}

    def mean(self) -> float:
        """r̄: repairs over visits of every failure type (0.5 before any evidence)."""
        visits = sum(self.visits.values())
        return sum(self.repaired.values()) / visits if visits > 0 else NEUTRAL_REPAIRABILITY

    def repairability(self, tag: str) -> float:
        """r(z), shrunk towards r̄ by ``prior`` pseudo-visits."""
        mean = self.mean()
        visits = self.visits.get(tag, 0.0)
        if visits + self.prior <= 0:
            return mean
        return (self.repaired.get(tag, 0.0) + self.prior * mean) / (visits + self.prior)

    def state_dict(self) -> dict[str, Any]:
        return {"format": STATE_FORMAT, "visits": dict(self.visits), "repaired": dict(self.repaired),
                "tasks": {k: {**v, "mix": dict(v["mix"])} for k, v in self.tasks.items()}, "step": self.step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"repair statistics format {state.get('format')!r}, expected {STATE_FORMAT}")
        visits = {str(k): float(v) for k, v in state["visits"].items()}
        repaired = {str(k): float(v) for k, v in state["repaired"].items()}
        if not all(math.isfinite(v) and v >= 0 for v in (*visits.values(), *repaired.values())):
            raise ValueError("repair statistics must be finite and >= 0")
        self.visits, self.repaired = visits, repaired
        self.tasks = {str(k): {"mix": {str(t): float(s) for t, s in v["mix"].items()}, "rate": float(v["rate"]),
                               "visits": int(v["visits"])} for k, v in state["tasks"].items()}
        self.step = state.get("step")


def adaptive_rho(base: Mapping[str, float], stats: RepairStats, rate: float, w_min: float,
                 w_max: float) -> dict[str, float]:
    """ρ_t from the base table ρ_0 and the repair statistics (module docstring); every value in [w_min, w_max]."""
    if not 0 < w_min <= w_max < math.inf:
        raise ValueError(f"need 0 < w_min <= w_max < inf, got [{w_min}, {w_max}]")
    mean = stats.mean()
    out = {}
    for tag in sorted(set(base) | {t for t in stats.visits if is_failure_type(t)}):
        rho0 = base.get(tag, 1.0)
        if is_failure_type(tag):
            rho0 = rho0 * math.exp(rate * (stats.repairability(tag) - mean))
        out[tag] = min(max(rho0, w_min), w_max)
    return out


def task_weight(stat: BucketStat | None, cfg: AdaptiveConfig) -> float:
    """The slime-style weight of one task from its attempts and successes (1 before ``task_min_attempts``)."""
    if stat is None or stat.count < cfg.task_min_attempts:
        return 1.0
    if stat.success_rate > cfg.task_solved_rate:
        return cfg.task_solved_scale
    if stat.success_rate < cfg.task_unsolved_rate:
        return cfg.task_unsolved_scale
    return 1.0


def apply_task_weights(data: DataProto, tasks: Mapping[str, BucketStat], cfg: AdaptiveConfig) -> dict[str, float]:
    """Multiply each row's advantages by its task's weight (``data.non_tensor_batch["task_id"]``); metrics."""
    import torch  # not at module level: the controller imports this module, and configuration needs no torch

    from seal.core.apatch import apply_scales  # the one tensor operation that scales rows without flipping a sign

    column = data.non_tensor_batch.get("task_id")
    if column is None:
        raise KeyError("per-task weights need data.non_tensor_batch['task_id']")
    scales = [1.0 if tid is None else task_weight(tasks.get(str(tid)), cfg) for tid in column]
    advantages = data.batch["advantages"]
    data.batch["advantages"] = apply_scales(advantages, data.batch["response_mask"],
                                            torch.tensor(scales, dtype=torch.float32))
    n = len(scales)
    return {
        f"{METRIC_PREFIX}task_weight_mean": sum(scales) / n if n else 1.0,
        f"{METRIC_PREFIX}task_weight_solved_frac": sum(s == cfg.task_solved_scale != 1.0 for s in scales) / n
        if n else 0.0,
        f"{METRIC_PREFIX}task_weight_unsolved_frac": sum(s == cfg.task_unsolved_scale != 1.0 for s in scales) / n
        if n else 0.0,
    }


def repair_metrics(stats: RepairStats, rho: Mapping[str, float] | None) -> dict[str, float]:
    """``adaptive/repairability/<tag>``, ``adaptive/repair_mean`` and, when adaptive, ``adaptive/rho/<tag>``."""
    out = {f"{METRIC_PREFIX}repair_mean": stats.mean()}
    for tag in sorted(stats.visits):
        out[f"{METRIC_PREFIX}repairability/{tag}"] = stats.repairability(tag)
    for tag, weight in sorted((rho or {}).items()):
        out[f"{METRIC_PREFIX}rho/{tag}"] = weight
    return out
