"""The weight-sync check of a verl run on GPU, from the metrics verl logs every step (no GPU needed to test it).

verl compares, every training step, the log-probs vLLM sampled with (`rollout_log_probs`) with the actor's
recomputed old log-probs: `training/rollout_probs_diff_{max,mean,std}` are the max / mean / std over every sampled
response token of the batch of |exp(actor logp) - exp(rollout logp)| (verl.utils.debug.metrics), a difference of
probabilities, bounded by 1. On GPU vLLM computes in bf16 while the actor runs FSDP mixed precision, so the
difference is never zero; a sync that did not happen makes vLLM sample from the weights before the last update.

Why not the max: it is the extreme of ~0.5M tokens per step and grows with the number of tokens; bf16 rounding
alone moved single tokens' probabilities by up to 0.07 over 291 tokens (measured below). The mean is an average
over the same tokens: stable from step to step, and it moves with every token a stale sync moves.

The rule (`sync_problems`), with the figures `scripts/calibrate_sync_check.py` measured (SmolLM2-135M-Instruct on
a real BFCL episode, CPU; docs/verl_engine.md, "The sync check"):

1. every training step has verl's comparison (`training/rollout_probs_diff_valid` 1, a finite mean);
2. level: `training/rollout_probs_diff_mean` <= `MEAN_LIMIT`;
3. step over step: from the second step on, the mean at most `JUMP_FACTOR` times the step before's (plus
   `JUMP_FLOOR`, so that noise on a tiny mean is not a jump). Step 1's rollouts use the weights both sides loaded
   from the same checkpoint, so step 1 cannot be stale: it is the run's own healthy level, and a sync that fails
   after the first update shows at step 2.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

MEAN_KEY = "training/rollout_probs_diff_mean"
VALID_KEY = "training/rollout_probs_diff_valid"

# Measured by scripts/calibrate_sync_check.py (SmolLM2-135M-Instruct, CPU, the ground-truth episode of
# multi_turn_base_100 as training renders it: 3,679 tokens, 291 response tokens of which 75 sampled): verl's
# `training/rollout_probs_diff_mean` for three token sets (the episode's sampled tokens / tokens drawn from the
# model at those positions / drawn tokens at all 291 response positions).
HEALTHY_BF16_VS_FP32_MEAN = (0.00943, 0.00761, 0.00737)  # bf16 vs fp32 forward of the same weights
STALE_LR_1E6_MEAN = (0.00843, 0.00673, 0.00708)  # bf16 before vs fp32 after one AdamW update at lr 1e-6
STALE_LR_1E4_MEAN = (0.278, 0.142, 0.0802)  # the same at lr 1e-4

# The level: 3.2x the highest healthy mean, 2.7x below the lowest stale mean at lr 1e-4. A one-step-stale sync
# at the paper's lr 1e-6 is NOT separable by these metrics: its means fall inside the healthy range (one update
# changed the bf16 value of 4.4% of the weights; its own effect, fp32 on both sides, is a mean |Δp| of
# 0.0012-0.0044, under the bf16 rounding's 0.0074-0.0094). The check catches a sync that is off by more than that
# (an lr-1e-4-sized change, about 100 consistent lr-1e-6 steps, or wrong weights); the weight probe's exact
# before/after comparison is what sees a missed sync at lr 1e-6 (docs/verl_engine.md, "The sync check").
MEAN_LIMIT = 0.03
# The jump: healthy token sets differ by up to 1.28x; a stale lr-1e-4 step is at least 8.5x the healthy level.
JUMP_FACTOR = 2.0
JUMP_FLOOR = 0.005


def _mean(row: Mapping[str, Any]) -> float | None:
    value = row.get(MEAN_KEY)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def sync_problems(by_step: Mapping[int, Mapping[str, Any]], steps: Iterable[int]) -> list[str]:
    """What the rule finds wrong with the training steps `steps` of a run (`by_step`: step -> its merged metrics
    row, as metrics.jsonl holds them); the empty list when the sync looks healthy."""
    problems: list[str] = []
    previous: tuple[int, float] | None = None
    for step in sorted(steps):
        row = by_step.get(step, {})
        mean = _mean(row)
        if row.get(VALID_KEY) != 1 or mean is None or not math.isfinite(mean):
            problems.append(f"step {step}: no rollout/actor comparison ({VALID_KEY}={row.get(VALID_KEY)!r}, "
                            f"{MEAN_KEY}={row.get(MEAN_KEY)!r})")
            previous = None
            continue
        if mean > MEAN_LIMIT:
            problems.append(f"step {step}: {MEAN_KEY}={mean:.3g} above {MEAN_LIMIT:g} (healthy bf16 level "
                            f"{max(HEALTHY_BF16_VS_FP32_MEAN):.2g}; weights not synced, or not the actor's?)")
        if previous is not None and mean > JUMP_FACTOR * previous[1] + JUMP_FLOOR:
            problems.append(f"step {step}: {MEAN_KEY}={mean:.3g} jumped from {previous[1]:.3g} at step "
                            f"{previous[0]} (more than {JUMP_FACTOR:g}x + {JUMP_FLOOR:g}: a stale sync?)")
        previous = (step, mean)
    return problems
