"""The GPU run's weight-sync rule (`seal.engines.verl.sync_check`) on recorded metric values of both patterns.

The values are verl's `training/rollout_probs_diff_mean` as `scripts/calibrate_sync_check.py` measured them
(SmolLM2-135M-Instruct, CPU, the ground-truth episode of multi_turn_base_100; the three token sets of the
measurement play three steps): healthy = a bf16 rollout against an fp32 actor of the same weights; stale = the
bf16 rollout of the weights one AdamW update before the actor's. Re-measure with the script.
"""

from __future__ import annotations

import math

import pytest

from seal.engines.verl import sync_check as sc

HEALTHY = sc.HEALTHY_BF16_VS_FP32_MEAN
STALE_1E4 = sc.STALE_LR_1E4_MEAN
STALE_1E6 = sc.STALE_LR_1E6_MEAN


def run(means, valid=1):
    """metrics.jsonl's rows by step for a run whose steps 1, 2, ... logged these means."""
    return {step: {sc.VALID_KEY: valid, sc.MEAN_KEY: mean, "training/rollout_probs_diff_max": 0.07}
            for step, mean in enumerate(means, start=1)}


def test_healthy_runs_pass():
    for means in (HEALTHY, HEALTHY[::-1], (min(HEALTHY),) * 3 + (max(HEALTHY),)):
        assert sc.sync_problems(run(means), range(1, len(means) + 1)) == []
    # the ranges the constants claim: healthy under the limit with margin, lr-1e-4 stale above it
    assert max(HEALTHY) * 3 < sc.MEAN_LIMIT < min(STALE_1E4)


@pytest.mark.parametrize("stale", STALE_1E4)
def test_a_stale_sync_at_lr_1e4_fails_by_level_and_by_jump(stale):
    # step 1 cannot be stale (both sides load the same checkpoint); the missed sync shows from step 2 on
    problems = sc.sync_problems(run([HEALTHY[0], stale]), [1, 2])
    assert problems and all(p.startswith("step 2") for p in problems)
    assert any("jumped" in p for p in problems)


def test_a_jump_below_the_level_is_caught():
    # a model whose healthy level is low (bf16 on both sides on GPU): a stale step under MEAN_LIMIT still jumps
    problems = sc.sync_problems(run([0.002, 0.02]), [1, 2])
    assert len(problems) == 1 and "jumped from 0.002" in problems[0]
    assert sc.sync_problems(run([0.002, 0.006]), [1, 2]) == []  # within factor x prior + floor


def test_a_stale_sync_at_lr_1e6_is_not_separable():
    """The honest limit of the rule (docs/verl_engine.md, "The sync check"): at the paper's lr 1e-6 one missed
    sync moves the mean less than bf16 rounding does, so these metrics cannot tell it from a healthy step."""
    assert min(HEALTHY) <= max(STALE_1E6) <= max(HEALTHY) or max(STALE_1E6) < min(HEALTHY)
    assert sc.sync_problems(run([HEALTHY[0], *STALE_1E6]), [1, 2, 3, 4]) == []


def test_a_missing_or_broken_comparison_fails():
    rows = run(HEALTHY)
    del rows[2][sc.MEAN_KEY]
    rows[3][sc.MEAN_KEY] = math.nan
    problems = sc.sync_problems(rows, [1, 2, 3, 4])
    assert [p.split(":")[0] for p in problems] == ["step 2", "step 3", "step 4"]  # step 4: not logged at all
    assert sc.sync_problems(run(HEALTHY, valid=0), [1]) != []  # verl found no valid token
    assert sc.sync_problems(run([1.0]), [1]) != []  # a mean at the bound of a probability difference
