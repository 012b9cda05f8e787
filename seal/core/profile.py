"""Failure profile C_t: the one place where the capability state's statistics become prevalences.

``failure_profile(state, source)`` is used by both consumers of C_t:

* the capability state's dynamic tag weights (``CapabilityState.update_dynamic_weights``), and
* interface evolution (``seal.core.evolve.evolve``),

so "prevalence", "reward mean" and "pressure" have a single definition:

* counts are turn-weighted: every turn-tag occurrence counts once, carrying its trajectory's reward
  and success (docs/release_behaviour.md §10.1);
* ``prevalence(tag) = count(tag) / total``, where ``total`` counts every occurrence except the
  excluded harness tags (``checker_error``, ``gt_error``) — ``pass``, ``correct_abstention`` and
  ``unknown`` are in the denominator. This is the release's denominator for the dynamic tag weights; the
  release's (disabled) cue rule used failure tags only, which φ_cap reproduces behind
  ``seal.interface.cue_prevalence: failures`` (``seal.core.evolve``);
* ``reward_mean(tag)`` = mean reward over the tag's occurrences;
* ``pressure(tag) = prevalence · (1 − reward_mean)`` (the ranking of the release's cue rule,
  docs/release_behaviour.md §6.3).

Per category the same quantities are computed within the category (denominator: that category's
non-excluded occurrences).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from env_service.vocab import EXCLUDED_TAGS


@dataclass(frozen=True)
class BucketStat:
    """Accumulated statistics of one bucket key."""

    count: float
    success: float
    reward_sum: float
    partial_count: float  # occurrences with 0 < reward < 1 (dense reward modes)

    @property
    def reward_mean(self) -> float:
        return self.reward_sum / self.count if self.count else 0.0

    @property
    def success_rate(self) -> float:
        return self.success / self.count if self.count else 0.0


class BucketSource(Protocol):
    """What C_t is computed from: the capability state's buckets (``CapabilityState`` is one).

    A protocol rather than an import keeps this module free of a cycle with ``seal.core.capability``.
    """

    def bucket(self, name: str, window: bool) -> Mapping[str, BucketStat]: ...


SOURCES = ("window", "total")


@dataclass(frozen=True)
class TagProfile:
    """One tag's share of the failure profile."""

    count: int  # turn-tag occurrences
    prevalence: float  # count / non-excluded occurrences
    reward_mean: float  # mean trajectory reward over the occurrences
    success_rate: float  # share of occurrences in successful trajectories
    pressure: float  # prevalence * (1 - reward_mean)


@dataclass(frozen=True)
class CategoryProfile:
    """One BFCL category: trajectory-level outcome plus the category's own tag profile."""

    trajectories: int
    success_rate: float
    reward_mean: float
    total_count: int  # non-excluded turn-tag occurrences in the category
    tags: dict[str, TagProfile] = field(default_factory=dict)


@dataclass(frozen=True)
class FailureProfile:
    """C_t. ``source`` says which statistics it was built from: ``window``, ``total`` or ``empty``."""

    source: str
    total_count: int  # non-excluded turn-tag occurrences
    excluded_count: int  # checker_error / gt_error occurrences (reported, never weighed)
    tags: dict[str, TagProfile] = field(default_factory=dict)
    categories: dict[str, CategoryProfile] = field(default_factory=dict)
    # the keys of ``tags`` in the order the statistics first saw them (``tags`` itself is sorted by name)
    first_seen: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """JSON-friendly form (for traces and logs)."""
        return {
            "source": self.source,
            "total_count": self.total_count,
            "excluded_count": self.excluded_count,
            "tags": {t: vars(p) for t, p in self.tags.items()},
            "categories": {
                c: {
                    **{k: v for k, v in vars(p).items() if k != "tags"},
                    "tags": {t: vars(q) for t, q in p.tags.items()},
                }
                for c, p in self.categories.items()
            },
        }


def tag_profiles(stats: Mapping[str, BucketStat]) -> tuple[dict[str, TagProfile], int, int]:
    """Per-tag profile from turn-weighted tag statistics; also (non-excluded total, excluded total)."""
    total = sum(s.count for t, s in stats.items() if t not in EXCLUDED_TAGS)
    excluded = sum(s.count for t, s in stats.items() if t in EXCLUDED_TAGS)
    tags: dict[str, TagProfile] = {}
    if total > 0:
        for tag, s in sorted(stats.items()):
            if tag in EXCLUDED_TAGS or s.count <= 0:
                continue
            prevalence = s.count / total
            reward_mean = s.reward_sum / s.count
            tags[tag] = TagProfile(
                count=int(s.count),
                prevalence=prevalence,
                reward_mean=reward_mean,
                success_rate=s.success / s.count,
                pressure=prevalence * (1.0 - reward_mean),
            )
    return tags, int(total), int(excluded)


def failure_profile(state: BucketSource, source: str = "window") -> FailureProfile:
    """C_t from ``state``. ``source="window"`` uses the current window and falls back to the run totals
    when the window holds no tag yet (release behaviour, docs/release_behaviour.md §10.2); ``"total"`` uses the
    totals."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    window = source == "window" and bool(state.bucket("tags", window=True))
    used = "window" if window else "total"
    tag_stats = state.bucket("tags", window=window)
    if not tag_stats:
        return FailureProfile(source="empty", total_count=0, excluded_count=0)
    tags, total, excluded = tag_profiles(tag_stats)

    per_category: dict[str, dict[str, BucketStat]] = {}
    for key, s in state.bucket("category_tags", window=window).items():
        category, tag = key.split("::", 1)
        per_category.setdefault(category, {})[tag] = s
    categories: dict[str, CategoryProfile] = {}
    for category, s in sorted(state.bucket("categories", window=window).items()):
        cat_tags, cat_total, _ = tag_profiles(per_category.get(category, {}))
        categories[category] = CategoryProfile(
            trajectories=int(s.count),
            success_rate=s.success / s.count if s.count else 0.0,
            reward_mean=s.reward_sum / s.count if s.count else 0.0,
            total_count=cat_total,
            tags=cat_tags,
        )
    first_seen = tuple(t for t in tag_stats if t in tags)
    return FailureProfile(source=used, total_count=total, excluded_count=excluded, tags=tags, categories=categories,
                          first_seen=first_seen)
