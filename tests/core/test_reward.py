"""Reward modes on hand-made evaluate replies (numbers worked out in the comments)."""

from __future__ import annotations

import pytest

from seal.core.reward import RewardConfig, compute_reward
from seal.recipe import ConfigError, load_config


def reply(accuracy=0.0, progress=0.0, passed=0, scorable=0, passed_irr=0, irr=0, pwi=0.0):
    return {
        "accuracy": accuracy,
        "progress": progress,
        "progress_with_irrelevance": pwi,
        "counts": {"passed": passed, "scorable": scorable, "passed_irrelevance": passed_irr, "irrelevance": irr},
        "failure_tags": [],
        "paper_labels": [],
        "completed": True,
    }


@pytest.mark.parametrize(
    ("result", "expected"),
    [(reply(1.0, 1.0), 1.0), (reply(0.0, 0.9), 0.0), (reply(0.0, 0.0), 0.0)],
)
def test_binary_is_the_verdict(result, expected):
    assert compute_reward(result, RewardConfig()) == expected


@pytest.mark.parametrize(
    ("cfg", "result", "progress_done", "expected"),
    [
        (RewardConfig(mode="capped"), reply(0.0, 0.5), 0.0, 0.5),  # min(0.7, 0.5)
        (RewardConfig(mode="capped"), reply(0.0, 0.9), 0.0, 0.7),  # min(0.7, 0.9)
        (RewardConfig(mode="capped"), reply(1.0, 0.2), 0.0, 1.0),  # success is always 1
        (RewardConfig(mode="capped", weight=0.5), reply(0.0, 0.8), 0.0, 0.4),  # min(0.7, 0.5*0.8)
        (RewardConfig(mode="capped", cap=0.0), reply(0.0, 0.8), 0.0, 0.0),  # the SEAL recipe = binary
        (RewardConfig(mode="capped", cap_decay=True), reply(0.0, 0.5), 0.5, 0.35),  # cap .7*(1-.5)
        (RewardConfig(mode="capped", cap_decay=True), reply(0.0, 0.5), 1.0, 0.1),  # floored at min_cap
        (RewardConfig(mode="capped", cap_decay=True), reply(0.0, 0.5), 3.0, 0.1),  # progress clipped to 1
        (RewardConfig(mode="capped", cap_decay=True, min_cap=0.0), reply(0.0, 0.5), 1.0, 0.0),  # explicit 0
        (RewardConfig(mode="capped", cap=1.5), reply(0.0, 0.9), 0.0, 0.9),  # cap clipped to 1
    ],
)
def test_capped(cfg, result, progress_done, expected):
    assert compute_reward(result, cfg, training_progress=progress_done) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("cfg", "result", "expected"),
    [
        (RewardConfig(mode="t3rl"), reply(0.0, passed=1, scorable=4, passed_irr=2, irr=2), 0.4),  # (1+1)/(4+1)
        (RewardConfig(mode="t3rl", irrelevance_weight=1.0), reply(0.0, passed=1, scorable=4, passed_irr=2, irr=2),
         0.5),  # 3/6
        (RewardConfig(mode="t3rl", irrelevance_weight=0.0), reply(0.0, passed=1, scorable=4, passed_irr=2, irr=2),
         0.25),  # explicit 0: irrelevance turns ignored, 1/4
        (RewardConfig(mode="t3rl"), reply(0.0, passed=0, scorable=3, passed_irr=2, irr=2), 0.25),  # (0+1)/(3+1)
        (RewardConfig(mode="t3rl", scorable_floor=True), reply(0.0, passed=0, scorable=3, passed_irr=2, irr=2), 0.0),
        (RewardConfig(mode="t3rl"), reply(0.0, pwi=0.3), 0.3),  # no turn to count: fallback
        (RewardConfig(mode="t3rl", irrelevance_weight=0.0), reply(0.0, passed_irr=1, irr=2, pwi=0.5), 0.5),
        (RewardConfig(mode="t3rl"), reply(1.0, passed=0, scorable=3), 1.0),
    ],
)
def test_t3rl(cfg, result, expected):
    assert compute_reward(result, cfg) == pytest.approx(expected)


def test_release_zero_fallback_switch():
    assert RewardConfig(irrelevance_weight=0).irrelevance_weight == 0
    release = RewardConfig(mode="t3rl", irrelevance_weight=0, release_zero_fallback=True)
    assert release.irrelevance_weight == 0.5
    assert compute_reward(reply(0.0, passed=1, scorable=4, passed_irr=2, irr=2), release) == pytest.approx(0.4)


def test_bad_input_is_refused():
    with pytest.raises(KeyError, match="accuracy"):
        compute_reward({"progress": 0.5}, RewardConfig())
    with pytest.raises(ValueError):
        compute_reward(reply(0.5), RewardConfig())
    with pytest.raises(KeyError, match="counts"):
        compute_reward({"accuracy": 0.0, "progress": 0.1}, RewardConfig(mode="t3rl"))
    # The knobs' declared ranges and value sets are checked where a run's config is built: the recipe.
    for override, message in (("seal.reward.mode=dense", "seal.reward.mode: must be one of"),
                              ("seal.reward.cap=-0.1", "seal.reward.cap: must be >= 0"),
                              ("seal.reward.decay_clock=minute", "seal.reward.decay_clock: must be one of"),
                              ("seal.reward.partial_credit_cap=0.5", "seal.reward.partial_credit_cap: unknown key")):
        with pytest.raises(ConfigError, match=message):
            load_config(None, [override])


def test_harness_error_turns_count_as_failures_only_when_asked():
    # 2 of 3 scorable turns passed; a 4th turn with ground-truth calls hit a checker error (left out of scorable)
    result = {**reply(0.0, 2 / 3, passed=2, scorable=3),
              "turns": [{"gt_calls": 1, "tag": t} for t in ("pass", "pass", "state_mismatch", "checker_error")]
              + [{"gt_calls": 0, "tag": "gt_error"}]}  # an empty-ground-truth turn is never scorable
    capped = RewardConfig(mode="capped", cap=1.0)
    assert compute_reward(result, capped) == pytest.approx(2 / 3)
    assert compute_reward(result, RewardConfig(mode="capped", cap=1.0, count_harness_errors=True)) == pytest.approx(0.5)
    assert compute_reward(result, RewardConfig(mode="t3rl", count_harness_errors=True)) == pytest.approx(0.5)
