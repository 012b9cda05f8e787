"""Beyond the paper: a failure-profile curriculum (``data.sampler: failure_profile``; docs/seal_core.md).

Each step draws its ``train_batch_size`` tasks without replacement, task t with probability

    p(t) = floor / N + (1 − floor) · score(t) / Σ score,      score(t) = (1 − s(t)) · r(z*(t)),

where s(t) is the success rate of t's last visit, z*(t) its dominant failure type then (the largest share of its
failure mix) and r the repairability of that type (``seal.core.adaptive.RepairStats``): tasks that still fail, with
failures the policy is currently repairing, come more often; solved tasks (s = 1) only by the floor. A task never
visited scores (1 − 0) · r̄, the mean, so the first epoch explores. ``floor`` ∈ (0, 1] guarantees every task at least
floor / N of the probability of each draw: no task starves; ``floor = 1`` is uniform sampling.

The draw is successive sampling without replacement: each pick takes task t with probability p(t) renormalised
over the tasks not yet picked (what ``torch.multinomial(..., replacement=False)`` did before; the standard
library's ``random.Random`` draws it now, so the sampler needs no torch).

Deterministic: the draw uses a generator seeded by (seed, step) alone, and the scores depend only on the repair
statistics, which are checkpointed with the capability state, so a resumed run draws exactly the batches the
uninterrupted run would have drawn.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from seal.core.adaptive import RepairStats


def dominant_failure(mix: dict[str, float]) -> str | None:
    """The largest share of a failure mix (ties: the tag name), None for an empty mix."""
    return min(mix, key=lambda tag: (-mix[tag], tag)) if mix else None


def task_score(task_id: str, stats: RepairStats) -> float:
    """score(t) of the module docstring."""
    visit = stats.tasks.get(task_id)
    if visit is None:
        return stats.mean()
    tag = dominant_failure(visit["mix"])
    if tag is None:
        return 0.0  # no failing rollout on its last visit
    return (1.0 - visit["rate"]) * stats.repairability(tag)


def task_probabilities(task_ids: Sequence[str], stats: RepairStats, floor: float) -> list[float]:
    """p(t) for every task (sums to 1); uniform when every score is 0."""
    if not 0.0 < floor <= 1.0:
        raise ValueError(f"the curriculum floor must lie in (0, 1], got {floor}")
    n = len(task_ids)
    if n == 0:
        raise ValueError("the curriculum needs at least one task")
    scores = [task_score(t, stats) for t in task_ids]
    total = sum(scores)
    if total <= 0:
        return [1.0 / n] * n
    return [floor / n + (1.0 - floor) * s / total for s in scores]


def draw_batch(task_ids: Sequence[str], stats: RepairStats, floor: float, size: int, seed: int,
               step: int) -> list[int]:
    """Indices of ``size`` distinct tasks drawn with ``task_probabilities``; a function of (seed, step, stats)."""
    if not 0 < size <= len(task_ids):
        raise ValueError(f"a batch of {size} tasks needs 1..{len(task_ids)}")
    weights = task_probabilities(task_ids, stats, floor)  # every one > 0 (the floor), so `size` picks exist
    rng = random.Random(int(seed) * 1_000_003 + int(step))
    indices = range(len(weights))
    picked = []
    for _ in range(size):
        [i] = rng.choices(indices, weights=weights)
        picked.append(i)
        weights[i] = 0.0  # without replacement: the rest renormalise in the next pick
    return picked
