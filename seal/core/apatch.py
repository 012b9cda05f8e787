"""A-Patch: diagnosis-guided advantage reweighting (docs/paper.md §5).

For trajectory j with per-turn tags z_1..z_T (``checker_error`` / ``gt_error`` dropped),

    w_j = clip(mean_i rho(z_i), min_scale, max_scale),    Â_j = w_j · A_j,

applied after GRPO computes A_j and before the actor update. ``w_j > 0``, so an advantage's sign —
and therefore the verifier-induced ranking inside a GRPO group with 0/1 rewards — never changes.

Three layers, from pure to verl-specific:

* ``trajectory_scale(tags, weights, ...)`` — the scalar w_j of one trajectory;
* ``apply_scales(advantages, mask, scales, apply_to)`` — the tensor operation;
* ``apply_apatch(data, weights, cfg, global_step)`` — reads the tags from a verl ``DataProto``'s
  ``non_tensor_batch``, replaces ``batch["advantages"]`` and returns ``apatch/*`` metrics.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from env_service.vocab import EXCLUDED_TAGS
from seal.core.section import Section, setting
from seal.core.weights import DEFAULT_WEIGHT, base_weights, check_vocabulary, known_tags, reply_field

if TYPE_CHECKING:
    import torch
    from verl import DataProto

APPLY_TO = ("all", "positive", "negative")
METRIC_PREFIX = "apatch/"


class APatchSettings(Section):
    """The A-Patch knobs a recipe sets (``seal.apatch``): all but the vocabulary.

    The vocabulary is chosen once for every SEAL component (``seal.diagnosis.vocabulary``), so it is
    not a knob here; ``APatchConfig`` adds it (``seal.core.config.SealConfig.apatch_config``).
    """

    enable: bool = setting(True, source="release", help="A-Patch on (tocf.advantage.apatch.enable; SEAL recipe: on)")
    apply_to: Literal[APPLY_TO] = setting(
        "all", source="release",
        help="which advantage tokens are scaled: all, or only positive / negative ones")
    warmup_steps: int = setting(0, source="release", ge=0,
                                help="A-Patch is skipped while global_step < warmup_steps (steps count from 1)")
    # Scales stay positive (a non-positive one would flip an advantage's sign) and 1.0, the scale of an
    # untagged trajectory, lies between the bounds.
    min_scale: float = setting(0.5, source="paper", gt=0, le=1,
                               help="w_min: lower clip of a trajectory's mean tag weight")
    max_scale: float = setting(2.0, source="paper", ge=1, help="w_max: upper clip of a trajectory's mean tag weight")
    tag_weights: dict[str, Annotated[float, Field(ge=0)]] = setting(
        {}, source="release",
        help="per-tag overrides of the vocabulary's rho table (also the capability state's base weights)")
    tags_key: str | None = setting(None, source="ours",
                                   help="non_tensor_batch column with each sample's tags; null = by vocabulary")


class APatchConfig(APatchSettings):
    """A-Patch knobs bound to a diagnosis vocabulary (what ``apply_apatch`` reads)."""

    vocabulary: str = setting("progress", source="ours", help="progress (release tags) or paper (paper labels)")

    @model_validator(mode="after")
    def _check(self) -> APatchConfig:
        check_vocabulary(self.vocabulary)
        allowed = known_tags(self.vocabulary)
        bad = sorted(k for k in self.tag_weights if k not in allowed)
        if bad:
            raise ValueError(f"apatch.tag_weights: invalid entries {bad} (tags of the {self.vocabulary!r} vocabulary)")
        return self

    @classmethod
    def bind(cls, settings: APatchSettings, vocabulary: str) -> APatchConfig:
        """The recipe's ``seal.apatch`` knobs with the run's vocabulary."""
        return cls.model_validate({**dict(settings), "vocabulary": vocabulary})

    @property
    def tags_column(self) -> str:
        """The ``non_tensor_batch`` key the tags are read from."""
        return self.tags_key if self.tags_key is not None else reply_field(self.vocabulary)

    def static_weights(self) -> dict[str, float]:
        """Base table of the vocabulary with ``tag_weights`` overrides (the weights without dynamics)."""
        return base_weights(self.vocabulary) | self.tag_weights


def check_scale_range(min_scale: float, max_scale: float) -> None:
    """Scales must stay positive (sign preservation) and 1.0 (the untagged scale) must lie inside."""
    if not (0.0 < min_scale <= 1.0 <= max_scale) or not math.isfinite(max_scale):
        raise ValueError(f"need 0 < min_scale <= 1 <= max_scale < inf, got [{min_scale}, {max_scale}]")


def trajectory_scale(
    tags: Iterable[str],
    weights: Mapping[str, float],
    min_scale: float = 0.5,
    max_scale: float = 2.0,
) -> float:
    """Scale w_j of one trajectory: the clipped mean weight of its tags.

    Tags in ``EXCLUDED_TAGS`` are dropped; tags absent from ``weights`` weigh 1.0. With no tag left
    the scale is 1.0 (the trajectory is left as GRPO made it).
    """
    check_scale_range(min_scale, max_scale)
    total = 0.0
    kept = 0
    for tag in tags:
        if tag in EXCLUDED_TAGS:
            continue
        total += weights.get(tag, DEFAULT_WEIGHT)
        kept += 1
    if kept == 0:
        return 1.0
    mean = total / kept
    if math.isnan(mean):
        raise ValueError("tag weights gave a NaN mean weight")
    return min(max(mean, min_scale), max_scale)


def apply_scales(
    advantages: torch.Tensor,
    mask: torch.Tensor,
    scales: torch.Tensor,
    apply_to: str = "all",
) -> torch.Tensor:
    """Multiply each row's advantages by its scale, on masked tokens only. Pure: returns a new tensor.

    Args:
        advantages: ``[batch, response_len]`` float — GRPO advantages (already zero off the mask).
        mask: ``[batch, response_len]`` bool or 0/1 — ``response_mask``; tokens off it are untouched.
        scales: ``[batch]`` float, every entry > 0 — the per-trajectory w_j.
        apply_to: ``"all"`` tokens, or only tokens whose advantage is ``"positive"`` / ``"negative"``.

    Returns:
        ``[batch, response_len]`` tensor of ``advantages``'s dtype.
    """
    import torch  # not at module level: the recipe schema imports this module; configuration needs no torch

    if apply_to not in APPLY_TO:
        raise ValueError(f"apply_to must be one of {APPLY_TO}, got {apply_to!r}")
    if advantages.dim() != 2 or mask.shape != advantages.shape:
        raise ValueError(
            f"advantages and mask must both be [batch, response_len]; got {tuple(advantages.shape)} "
            f"and {tuple(mask.shape)}"
        )
    if scales.shape != advantages.shape[:1]:
        raise ValueError(f"scales must be [batch]={advantages.shape[0]}, got {tuple(scales.shape)}")
    if scales.numel() and not bool(torch.all(torch.isfinite(scales) & (scales > 0))):
        raise ValueError("every scale must be finite and > 0 (a non-positive scale would flip signs)")
    selected = mask.bool()
    if apply_to == "positive":
        selected = selected & (advantages > 0)
    elif apply_to == "negative":
        selected = selected & (advantages < 0)
    factor = scales.to(device=advantages.device, dtype=advantages.dtype).unsqueeze(-1)  # [batch, 1]
    return torch.where(selected, advantages * factor, advantages)


def sample_tags(value: Any, index: int) -> list[str] | None:
    """One sample's tag list from a ``non_tensor_batch`` cell; ``None`` when the sample has no tags.

    Accepts a list / tuple / 1-D array of strings (numpy turns equal-length lists into a 2-D array,
    whose rows arrive here as arrays) or ``None``. A bare string is refused: it is almost always a
    tag list that was serialised by mistake.
    """
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        raise TypeError(f"sample {index}: tags must be a list of strings, got a string {value!r}")
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"sample {index}: tags must be a list of strings, got {type(value).__name__}")
    if not all(isinstance(tag, str) for tag in value):
        raise TypeError(f"sample {index}: every tag must be a string, got {value!r}")
    return list(value) if value else None


def apply_apatch(
    data: DataProto,
    weights: Mapping[str, float],
    cfg: APatchConfig,
    global_step: int,
) -> dict[str, float]:
    """Rescale ``data.batch["advantages"]`` in place (the entry is replaced) and return metrics.

    ``weights`` are the active tag weights: ``cfg.static_weights()``, or the capability state's dynamic
    weights. ``data.batch`` needs ``advantages`` and ``response_mask`` ([batch, response_len]);
    ``data.non_tensor_batch[cfg.tags_column]`` holds each sample's tags (missing column = no tags).
    Samples without tags keep scale 1. ``returns`` is left alone (GRPO's actor reads advantages only).
    Metrics: ``apatch/{enabled, warmup_skipped, scaled_count, missing_tag_count, mean_scale,
    min_scale, max_scale, tag_frac/<tag>, tag_weight/<tag>}``.
    """
    if not cfg.enable:
        return {f"{METRIC_PREFIX}enabled": 0.0}
    if global_step < cfg.warmup_steps:
        return {f"{METRIC_PREFIX}enabled": 1.0, f"{METRIC_PREFIX}warmup_skipped": 1.0}
    for key in ("advantages", "response_mask"):
        if key not in data.batch:
            raise KeyError(f"A-Patch needs data.batch[{key!r}] (GRPO advantages and the response mask)")
    advantages = data.batch["advantages"]
    batch_size = advantages.shape[0]
    column = data.non_tensor_batch.get(cfg.tags_column)
    if column is not None and len(column) != batch_size:
        raise ValueError(f"non_tensor_batch[{cfg.tags_column!r}] has {len(column)} rows, batch has {batch_size}")

    scales = [1.0] * batch_size
    tag_counts: Counter[str] = Counter()
    missing = 0
    for i in range(batch_size):
        tags = None if column is None else sample_tags(column[i], i)
        if tags is None:
            missing += 1
            continue
        tag_counts.update(tags)
        scales[i] = trajectory_scale(tags, weights, cfg.min_scale, cfg.max_scale)

    import torch

    scale_tensor = torch.tensor(scales, dtype=torch.float32)
    data.batch["advantages"] = apply_scales(advantages, data.batch["response_mask"], scale_tensor, cfg.apply_to)
    return apatch_metrics(scales, missing, tag_counts, weights)


def apatch_metrics(
    scales: Sequence[float],
    missing: int,
    tag_counts: Mapping[str, int],
    weights: Mapping[str, float],
) -> dict[str, float]:
    """``apatch/*`` metrics of one application (see ``apply_apatch``)."""
    p = METRIC_PREFIX
    n = len(scales)
    metrics = {
        f"{p}enabled": 1.0,
        f"{p}warmup_skipped": 0.0,
        f"{p}scaled_count": float(n - missing),
        f"{p}missing_tag_count": float(missing),
        f"{p}mean_scale": float(sum(scales) / n) if n else 1.0,
        f"{p}min_scale": float(min(scales)) if n else 1.0,
        f"{p}max_scale": float(max(scales)) if n else 1.0,
    }
    total = sum(tag_counts.values())
    for tag, count in sorted(tag_counts.items()):
        metrics[f"{p}tag_frac/{tag}"] = count / total
    for tag, weight in sorted(weights.items()):
        metrics[f"{p}tag_weight/{tag}"] = float(weight)
    return metrics

