"""Capability state: turn-weighted failure statistics of the policy and the dynamic tag weights.

docs/release_behaviour.md §10 describes the release's ``TOCFCapabilityState``; this is a re-implementation of its
behaviour with the persistence fixed (docs/release_behaviour.md §10.4):

* Statistics, each kept for the whole run (``total``) and for the current window (``window``, reset by
  the trainer at epoch end with ``reset_window()``), in five buckets:
  ``categories`` (one count per trajectory), ``tags``, ``category_tags`` (key ``"<category>::<tag>"``),
  ``position_tags`` (key ``"<position>::<tag>"``) and ``tasks`` (one count per trajectory).
  Tag buckets are turn-weighted: every turn-tag occurrence counts once, carrying the trajectory's
  reward and success. A trajectory without tags counts as one ``unknown`` turn.
  Turn position: ``only`` for a one-turn trajectory, else by ``(idx+1)/len``: ≤1/3 ``early``,
  ≤2/3 ``middle``, else ``late``.
* Dynamic tag weights, once per step after ``observe`` (``update_dynamic_weights``), from the failure
  profile C_t (``seal.core.profile.failure_profile``)::

      target = clamp(base · (1 + α · prevalence · (1 − reward_mean) · min(1, count / confidence)), lo, hi)
      w      = (1 − β) · w + β · target

  ``pass`` stays at its base weight, the excluded harness tags at 1.0; a tag absent from the profile
  moves towards its base weight. A profile without any non-harness occurrence keeps the weights. The
  release (``reset_on_empty``) returns the base table for that one step and does not store it: the next
  step's moving average resumes from the weights before (docs/release_behaviour.md §10.2).
* Persistence: ``state_dict`` / ``load_state_dict`` and ``save`` / ``load`` (JSON). The state is saved
  with every checkpoint, windows included, and loading is explicit: a file written by another run
  (different ``run_id``) is refused unless ``force=True``.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from pydantic import model_validator

from env_service.vocab import EXCLUDED_TAGS, PASS
from seal.core.profile import BucketStat, FailureProfile, failure_profile
from seal.core.record import EpisodeRecord, check_records
from seal.core.section import Section, setting
from seal.core.weights import UNKNOWN_TAG, check_vocabulary
from seal.core.weights import base_weights as base_weight_table
from seal.io_utils import write_json_atomic

STATE_FORMAT = 1
BUCKETS = ("categories", "tags", "category_tags", "position_tags", "tasks")
METRIC_PREFIX = "capability/"


class RunMismatchError(ValueError):
    """A saved capability state belongs to another run (its ``run_id`` differs)."""


class DynamicWeightConfig(Section):
    """Dynamic tag-weight knobs (docs/release_behaviour.md §10.2). Source of each default in brackets."""

    enable: bool = setting(True, source="release",
                           help="dynamic tag weights from C_t (release dynamic.enable); false = the static rho table")
    ema_beta: float = setting(0.25, source="release", ge=0, le=1,
                               help="beta: EMA step of the weights toward their target; 0 = fixed")
    prevalence_alpha: float = setting(1.0, source="release", ge=0,
                                      help="alpha: how strongly tag prevalence moves the target; 0 = base weight")
    confidence_samples: float = setting(32.0, source="release", ge=0,
                                        help="occurrences of a tag for full confidence in its statistics; 0 = at once")
    min_weight: float = setting(0.5, source="release", gt=0, help="lower clamp of a tag's target weight")
    max_weight: float = setting(2.0, source="release", gt=0, help="upper clamp of a tag's target weight")
    release_zero_fallback: bool = setting(
        False, source="ours",
        help="true = the release's `value or default` parsing: 0 for ema_beta / alpha / samples means the default")
    reset_on_empty: bool = setting(
        False, source="ours",
        help="a profile with no non-harness tag (e.g. a window of checker_error only): false keeps the previous "
             "weights; true = the release, the base table for that step only (the moving average is kept)")

    RELEASE_OR_DEFAULT_FIELDS: ClassVar[tuple[str, ...]] = ("ema_beta", "prevalence_alpha", "confidence_samples")

    @model_validator(mode="after")
    def _check(self) -> DynamicWeightConfig:
        if self.min_weight > self.max_weight:
            raise ValueError(f"min_weight must be <= max_weight, got {self.min_weight} > {self.max_weight}")
        return self


def _observed(record: EpisodeRecord, vocabulary: str) -> tuple[str, str, tuple[str, ...], float, float]:
    """(task_id, category, tags, reward, success 0/1) of one record; no tag = one ``unknown`` turn."""
    return (record.task_id, record.category, record.tags(vocabulary) or (UNKNOWN_TAG,), record.reward,
            1.0 if record.success else 0.0)


@lru_cache(maxsize=256)
def turn_positions(num_turns: int) -> tuple[str, ...]:
    """Position label of each turn of a ``num_turns``-turn trajectory (integer arithmetic, no rounding)."""
    if num_turns == 1:
        return ("only",)
    out = []
    for idx in range(num_turns):
        # (idx+1)/n <= 1/3  <=>  3(idx+1) <= n
        if 3 * (idx + 1) <= num_turns:
            out.append("early")
        elif 3 * (idx + 1) <= 2 * num_turns:
            out.append("middle")
        else:
            out.append("late")
    return tuple(out)


def dominant_tag(tags: Iterable[str]) -> str:
    """Most common non-``pass`` tag (ties: first seen), else ``pass``, else ``unknown``."""
    tags = list(tags)
    failures = Counter(t for t in tags if t != PASS)
    if failures:
        return failures.most_common(1)[0][0]
    return PASS if tags else UNKNOWN_TAG


def next_dynamic_weights(
    previous: Mapping[str, float],
    base: Mapping[str, float],
    profile: FailureProfile,
    cfg: DynamicWeightConfig,
) -> dict[str, float]:
    """One EMA step of the stored dynamic tag weights (module docstring). Pure.

    With an empty profile (no non-excluded occurrence) the stored weights stay where they are, whatever
    ``cfg.reset_on_empty`` says: that switch changes only the weights one step uses
    (``CapabilityState.update_dynamic_weights``), never the moving average.
    """
    if profile.total_count == 0:
        return dict(previous)
    out: dict[str, float] = {}
    for tag in sorted(set(base) | set(previous) | set(profile.tags) | EXCLUDED_TAGS):
        b = base.get(tag, 1.0)
        if tag in EXCLUDED_TAGS:
            out[tag] = 1.0
            continue
        if tag == PASS:
            out[tag] = b
            continue
        stat = profile.tags.get(tag)
        if stat is None:
            target = b
        else:
            confidence = 1.0 if cfg.confidence_samples == 0 else min(1.0, stat.count / cfg.confidence_samples)
            target = b * (1.0 + cfg.prevalence_alpha * stat.prevalence * (1.0 - stat.reward_mean) * confidence)
        target = min(max(target, cfg.min_weight), cfg.max_weight)
        out[tag] = (1.0 - cfg.ema_beta) * previous.get(tag, b) + cfg.ema_beta * target
    return out


def _add(bucket: dict[str, list[float]], key: str, n: float, s: float, r: float, p: float) -> None:
    stat = bucket.get(key)
    if stat is None:
        bucket[key] = [n, s, r, p]
    else:
        stat[0] += n
        stat[1] += s
        stat[2] += r
        stat[3] += p


def _empty_buckets() -> dict[str, dict[str, list[float]]]:
    return {name: {} for name in BUCKETS}


class CapabilityState:
    """Turn-weighted failure statistics (total + window) and the dynamic tag weights.

    Args:
        vocabulary: ``"progress"`` or ``"paper"`` — which tags the records carry.
        base_weights: base table rho (default: ``seal.core.weights.base_weights(vocabulary)``; pass
            ``APatchConfig.static_weights()`` so ``tag_weights`` overrides apply).
        config: dynamic-weight knobs.
        run_id: identity of the training run; ``load`` refuses a file from another run.
    """

    def __init__(
        self,
        vocabulary: str = "progress",
        base_weights: Mapping[str, float] | None = None,
        config: DynamicWeightConfig | None = None,
        run_id: str | None = None,
    ) -> None:
        self.vocabulary = check_vocabulary(vocabulary)
        self.base_weights = dict(base_weights) if base_weights is not None else base_weight_table(vocabulary)
        self.config = config if config is not None else DynamicWeightConfig()
        self.run_id = run_id
        self._total = _empty_buckets()
        self._window = _empty_buckets()
        self._weights = dict(self.base_weights)  # the moving average (stored, persisted)
        self._step_weights: dict[str, float] | None = None  # this step's weights where they differ from it
        self._task_info: dict[str, dict[str, Any]] = {}
        self.observe_count = 0  # trajectories observed
        self.last_step: int | None = None

    # ------------------------------------------------------------------ observing
    def observe(self, records: Iterable[EpisodeRecord], step: int | None = None) -> None:
        """Add finished trajectories (their tags of this state's vocabulary) to the total and window statistics.

        Excluded records are the caller's to drop (`SealController.observe` does): every record counts."""
        records = list(records)
        check_records(records, "CapabilityState.observe")
        # Trajectories with the same (category, reward, success) contribute identically per occurrence,
        # so their tags are counted together with C-level Counter updates, then merged once.
        groups: dict[tuple[str, float, float], list[Any]] = {}
        total_tasks, window_tasks = self._total["tasks"], self._window["tasks"]
        total_tags, window_tags = self._total["tags"], self._window["tags"]
        for record in records:
            task_id, category, tags, reward, success = _observed(record, self.vocabulary)
            partial = 1.0 if 0.0 < reward < 1.0 else 0.0
            for tag in tags:  # tag keys in first-seen order (the release's φ_cap tie-break reads it)
                if tag not in window_tags:
                    window_tags[tag] = [0.0, 0.0, 0.0, 0.0]
                    if tag not in total_tags:
                        total_tags[tag] = [0.0, 0.0, 0.0, 0.0]
            group = groups.get((category, reward, success))
            if group is None:
                group = groups[(category, reward, success)] = [Counter(), Counter(), 0]
            group[0].update(tags)
            group[1].update(zip(turn_positions(len(tags)), tags, strict=True))
            group[2] += 1
            _add(total_tasks, task_id, 1.0, success, reward, partial)
            _add(window_tasks, task_id, 1.0, success, reward, partial)
            info = self._task_info.get(task_id)
            if info is None:
                info = self._task_info[task_id] = {"category": category, "dominant_tags": {}}
            dominant = dominant_tag(tags)
            info["dominant_tags"][dominant] = info["dominant_tags"].get(dominant, 0) + 1
            info.update(last_reward=reward, last_success=bool(success), last_tag=dominant, last_step=step)
            self.observe_count += 1

        for (category, reward, success), (tag_counts, position_counts, n) in groups.items():
            partial = 1.0 if 0.0 < reward < 1.0 else 0.0
            for buckets in (self._total, self._window):
                _add(buckets["categories"], category, n, n * success, n * reward, n * partial)
                tags_b, cat_tags_b, pos_b = buckets["tags"], buckets["category_tags"], buckets["position_tags"]
                for tag, m in tag_counts.items():
                    _add(tags_b, tag, m, m * success, m * reward, m * partial)
                    _add(cat_tags_b, f"{category}::{tag}", m, m * success, m * reward, m * partial)
                for (position, tag), m in position_counts.items():
                    _add(pos_b, f"{position}::{tag}", m, m * success, m * reward, m * partial)
        if step is not None:
            self.last_step = step

    def reset_window(self) -> None:
        """Start a new window (the trainer calls this at epoch end)."""
        self._window = _empty_buckets()

    def bucket(self, name: str, window: bool) -> dict[str, BucketStat]:
        """Statistics of one bucket (``BUCKETS``), from the window or from the run totals."""
        if name not in BUCKETS:
            raise ValueError(f"unknown bucket {name!r}; expected one of {BUCKETS}")
        source = self._window if window else self._total
        return {key: BucketStat(*values) for key, values in source[name].items()}

    def task_info(self, task_id: str) -> dict[str, Any] | None:
        """Per-task record: category, last reward/success/dominant tag/step, dominant-tag counts."""
        info = self._task_info.get(task_id)
        return None if info is None else {**info, "dominant_tags": dict(info["dominant_tags"])}

    # ------------------------------------------------------------------ weights
    @property
    def dynamic_weights(self) -> dict[str, float]:
        """The tag weights of the current step, those A-Patch uses (the base table until the first update, or
        when dynamics are off)."""
        return dict(self._weights if self._step_weights is None else self._step_weights)

    def profile(self, source: str = "window") -> FailureProfile:
        """C_t (``seal.core.profile.failure_profile``)."""
        return failure_profile(self, source)

    def set_base_weights(self, weights: Mapping[str, float]) -> None:
        """Replace the base table rho (adaptive rho, ``seal.core.adaptive``); without dynamics it is also the
        current weights."""
        self.base_weights = dict(weights)
        if not self.config.enable:
            self._weights = dict(weights)
            self._step_weights = None

    def update_dynamic_weights(self) -> dict[str, float]:
        """One EMA step from the window profile (total when the window is empty); returns this step's weights.

        ``reset_on_empty`` (the release): a profile without non-harness evidence makes this step use the base
        table, while the stored moving average stays as it was for the next step."""
        if self.config.enable:
            profile = self.profile("window")
            self._weights = next_dynamic_weights(self._weights, self.base_weights, profile, self.config)
            reset = self.config.reset_on_empty and profile.total_count == 0
            self._step_weights = dict(self.base_weights) if reset else None
        return self.dynamic_weights

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: statistics (total + window), weights, per-task records."""

        def dump(buckets: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
            fields = ("count", "success", "reward_sum", "partial_count")
            return {name: {k: dict(zip(fields, v, strict=True)) for k, v in b.items()} for name, b in buckets.items()}

        return {
            "format": STATE_FORMAT,
            "run_id": self.run_id,
            "vocabulary": self.vocabulary,
            "base_weights": dict(self.base_weights),
            "config": self.config.model_dump(),
            "observe_count": self.observe_count,
            "last_step": self.last_step,
            "dynamic_weights": dict(self._weights),
            "total": dump(self._total),
            "window": dump(self._window),
            "tasks": {k: {**v, "dominant_tags": dict(v["dominant_tags"])} for k, v in self._task_info.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any], force: bool = False) -> None:
        """Restore from ``state_dict()``. Refuses a state of another run (``run_id``) unless ``force``,
        and always refuses another vocabulary or format. Config and base weights stay this object's."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"capability state format {state.get('format')!r}, expected {STATE_FORMAT}")
        if state.get("vocabulary") != self.vocabulary:
            raise ValueError(
                f"capability state is for vocabulary {state.get('vocabulary')!r}, this run uses {self.vocabulary!r}"
            )
        stored = state.get("run_id")
        if not force and (stored is None or stored != self.run_id):
            raise RunMismatchError(
                f"capability state belongs to run {stored!r}, this run is {self.run_id!r}; "
                "pass force=True to load it anyway"
            )

        def parse(buckets: Mapping[str, Any]) -> dict[str, dict[str, list[float]]]:
            out = _empty_buckets()
            for name in BUCKETS:
                for key, s in buckets.get(name, {}).items():
                    out[name][key] = [float(s["count"]), float(s["success"]), float(s["reward_sum"]),
                                      float(s["partial_count"])]
            return out

        weights = {str(k): float(v) for k, v in state["dynamic_weights"].items()}
        bad = {k: v for k, v in weights.items() if not (math.isfinite(v) and v > 0)}
        if bad:  # a NaN or negative weight would silently flip or erase advantages (A-Patch keeps the sign)
            raise ValueError(f"capability state has invalid dynamic weights (not finite and positive): {bad}")
        total, window = parse(state["total"]), parse(state["window"])
        stats = [x for buckets in (total, window) for table in buckets.values() for row in table.values() for x in row]
        if not all(math.isfinite(x) for x in stats):
            raise ValueError("capability state has non-finite statistics")
        self._total, self._window = total, window
        self._weights = weights
        self._step_weights = None
        self._task_info = {k: {**v, "dominant_tags": dict(v["dominant_tags"])} for k, v in state["tasks"].items()}
        self.observe_count = int(state["observe_count"])
        self.last_step = state.get("last_step")

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write ``state_dict()`` as JSON, atomically (a crash never leaves half a file)."""
        return write_json_atomic(path, self.state_dict())

    def load(self, path: str | os.PathLike[str], force: bool = False) -> None:
        """Restore from a file written by ``save`` (same run unless ``force``)."""
        with open(path, encoding="utf-8") as fh:
            self.load_state_dict(json.load(fh), force=force)

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> dict[str, float]:
        """``capability/*``: counts, window outcome per category, window tag shares, current weights."""
        p = METRIC_PREFIX
        out: dict[str, float] = {
            f"{p}observe_count": float(self.observe_count),
            f"{p}num_tasks": float(len(self._total["tasks"])),
            f"{p}num_tags": float(len(self._total["tags"])),
        }
        for category, s in sorted(self.bucket("categories", window=True).items()):
            out[f"{p}window/{category}/count"] = s.count
            out[f"{p}window/{category}/success_rate"] = s.success_rate
            out[f"{p}window/{category}/reward_mean"] = s.reward_mean
        window_tags = self._window["tags"]
        n = sum(v[0] for v in window_tags.values())
        for tag, v in sorted(window_tags.items()):
            out[f"{p}window/tag_frac/{tag}"] = v[0] / n
        for tag, w in sorted(self.dynamic_weights.items()):
            out[f"{p}weight/{tag}"] = w
        return out
