"""Trajectory reward from the env service's ``evaluate`` reply (docs/release_behaviour.md §7).

* ``binary`` (default; the paper): the official 0/1 BFCL verdict, unchanged.
* ``capped``: partial credit for failed trajectories, ``min(cap, weight · progress)``, where
  ``progress`` = passed / scorable turns; the cap may decay linearly with training progress down to
  ``min_cap``, progress read per step (``decay_clock: step``, ours: no jump at epoch ends) or as epoch index ÷
  total epochs (``epoch``, the release). A success is always 1.0. ``count_harness_errors`` puts turns whose
  grading failed (``checker_error`` / ``gt_error``) back into the scorable count, as failures, as the release's
  scorer did; ours leaves them out (a harness failure says nothing about the policy). (The release's SEAL
  recipe runs this mode with ``cap = 0``, which is exactly ``binary``.)
* ``t3rl``: ``(passed + w · passed_irrelevance) / (scorable + w · irrelevance)`` for failed
  trajectories, optionally 0 when no scorable turn passed (``scorable_floor``).

Unlike the release, explicit zeros stay zeros (``irrelevance_weight: 0`` means "ignore irrelevance
turns", not 0.5), and an unknown mode is an error instead of silently meaning ``capped``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from env_service.vocab import EXCLUDED_TAGS
from seal.core.section import Section, setting

REWARD_MODES = ("binary", "capped", "t3rl")
DECAY_CLOCKS = ("step", "epoch")


class RewardConfig(Section):
    """Reward-mode knobs. Source of each default in brackets."""

    mode: Literal[REWARD_MODES] = setting(
        "binary", source="paper",
        help="binary = the 0/1 verifier verdict; capped / t3rl = partial credit for failures")
    cap: float = setting(0.7, source="release", ge=0,
                         help="capped: partial_credit_cap, the most a failed trajectory gets")
    cap_decay: bool = setting(False, source="release", help="capped: cap x (1 - training progress), floored at min_cap")
    decay_clock: Literal[DECAY_CLOCKS] = setting("step", source="ours",
                                                 help="training progress of cap_decay: step = (step-1)/total steps | "
                                                      "epoch = epoch index/total epochs (release)")
    count_harness_errors: bool = setting(
        False, source="ours",
        help="capped/t3rl: checker_error/gt_error turns count as failed scorable turns (release: true)")
    min_cap: float = setting(0.1, source="release", ge=0, help="capped: floor of the decaying cap")
    weight: float = setting(1.0, source="release", ge=0,
                            help="capped: partial_credit_weight, applied to progress before the cap")
    irrelevance_weight: float = setting(0.5, source="release", ge=0, help="t3rl: weight of irrelevance turns")
    scorable_floor: bool = setting(False, source="ours", help="t3rl: reward 0 when no scorable turn passed")
    release_zero_fallback: bool = setting(
        False, source="ours", help="true = the release's `value or default` parsing: irrelevance_weight 0 means 0.5")

    RELEASE_OR_DEFAULT_FIELDS: ClassVar[tuple[str, ...]] = ("irrelevance_weight",)


def _clip01(x: float) -> float:
    return min(max(float(x), 0.0), 1.0)


def _field(result: Mapping[str, Any], key: str) -> Any:
    if key not in result:
        raise KeyError(f"evaluate reply lacks {key!r} (keys: {sorted(result)})")
    return result[key]


def harness_error_turns(result: Mapping[str, Any]) -> int:
    """Turns with ground-truth calls whose tag is a harness error (``checker_error`` / ``gt_error``): the env
    service leaves them out of ``scorable``; the release counted them as failed scorable turns."""
    return sum(1 for t in _field(result, "turns") if t["gt_calls"] > 0 and t["tag"] in EXCLUDED_TAGS)


def compute_reward(result: Mapping[str, Any], cfg: RewardConfig, training_progress: float = 0.0) -> float:
    """Scalar reward of one trajectory from its ``evaluate`` reply.

    Args:
        result: the reply: ``accuracy`` (0.0/1.0), ``progress``, ``progress_with_irrelevance`` and
            ``counts`` {passed, scorable, passed_irrelevance, irrelevance} (the last two fields are
            needed by ``t3rl`` only); ``turns`` (each with ``gt_calls`` and ``tag``) when
            ``count_harness_errors`` is on.
        cfg: reward mode and knobs.
        training_progress: fraction of training done, in [0, 1] (clipped); used by ``cap_decay``. The caller
            computes it on the clock ``decay_clock`` names (``SealController.set_training_progress``).
    """
    accuracy = float(_field(result, "accuracy"))
    if accuracy not in (0.0, 1.0):
        raise ValueError(f"evaluate accuracy must be 0.0 or 1.0, got {accuracy}")
    if cfg.mode == "binary" or accuracy >= 1.0:
        return accuracy

    harness = harness_error_turns(result) if cfg.count_harness_errors else 0
    if cfg.mode == "capped":
        cap = cfg.cap
        if cfg.cap_decay:
            cap = max(cfg.min_cap, cap * (1.0 - _clip01(training_progress)))
        progress = _field(result, "progress")
        if harness:
            counts = _field(result, "counts")
            progress = counts["passed"] / (counts["scorable"] + harness)
        return min(_clip01(cap), cfg.weight * _clip01(progress))

    # t3rl
    counts = _field(result, "counts")
    passed, scorable = float(counts["passed"]), float(counts["scorable"]) + harness
    passed_irr, irr = float(counts["passed_irrelevance"]), float(counts["irrelevance"])
    if cfg.scorable_floor and scorable > 0 and passed == 0:
        return 0.0
    w = cfg.irrelevance_weight
    denominator = scorable + w * irr
    if denominator > 0:
        return _clip01((passed + w * passed_irr) / denominator)
    return _clip01(result.get("progress_with_irrelevance", _field(result, "progress")))
