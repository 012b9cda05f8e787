"""Dynamic A-Patch weights under exp/SEAL_release.yaml against the release's documented behaviour, step by step.

``ReleaseWeights`` is written from docs/release_behaviour.md §10.2 (the windows: docs/release_behaviour.md §10.3;
the weight of a tag missing from the table: docs/release_behaviour.md §11.1), not from ``seal.core``: per step,
the window's tag counts if it has any, else the totals; the total leaves ``checker_error`` / ``gt_error`` out; a
total of 0 returns the base weights for that step without storing them; otherwise every tag of base ∪ source ∪
previous moves one EMA step toward its target and the result is stored. The run under test is the recipe's own
``SealController``.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from seal import recipe as C
from seal.core.controller import SealController
from seal.core.record import EpisodeRecord

EXP = Path(__file__).resolve().parents[2] / "exp"
HARNESS = ("checker_error", "gt_error")
POLICY_TAGS = ("pass", "correct_abstention", "spurious_tool_call", "empty_turn_model_response", "state_mismatch",
               "response_mismatch", "instance_mismatch")


class ReleaseWeights:
    """The release's capability weights as docs/release_behaviour.md §10.2 describes them."""

    def __init__(self, base: dict[str, float], beta: float, alpha: float, confidence: float, lo: float, hi: float):
        self.base, self.beta, self.alpha, self.confidence, self.lo, self.hi = base, beta, alpha, confidence, lo, hi
        self.window: dict[str, list[float]] = {}  # tag -> [turn occurrences, reward sum]
        self.total: dict[str, list[float]] = {}
        self.previous: dict[str, float] = {}  # empty: "previous defaults to base"

    def observe(self, trajectories: list[tuple[list[str], float]]) -> None:
        for tags, reward in trajectories:
            for tag in tags:  # every turn-tag occurrence counts, with its trajectory's reward
                for bucket in (self.window, self.total):
                    bucket.setdefault(tag, [0.0, 0.0])
                    bucket[tag][0] += 1
                    bucket[tag][1] += reward

    def end_epoch(self) -> None:
        self.window = {}

    def step(self) -> dict[str, float]:
        source = self.window if self.window else self.total
        total = sum(n for tag, (n, _) in source.items() if tag not in HARNESS)
        if total == 0:
            return dict(self.base)  # returned for this step; nothing is stored
        out = {}
        for tag in set(self.base) | set(source) | set(self.previous):
            base = self.base.get(tag, 1.0)
            if tag in HARNESS:
                target = 1.0
            elif tag == "pass":
                target = base
            else:
                n, reward_sum = source.get(tag, (0.0, 0.0))
                prevalence = n / total
                reward_mean = reward_sum / n if n else 0.0
                target = base * (1 + self.alpha * prevalence * (1 - reward_mean) * min(1.0, n / self.confidence))
                target = min(max(target, self.lo), self.hi)
            out[tag] = (1 - self.beta) * self.previous.get(tag, base) + self.beta * target
        self.previous = out
        return dict(out)


def _effective(weights: dict[str, float], tags) -> dict[str, float]:
    """The weight A-Patch gives each tag (a tag missing from the dict weighs 1.0, docs/release_behaviour.md §11.1)."""
    return {tag: weights.get(tag, 1.0) for tag in tags}


def _step_records(rng: random.Random, harness_only: bool) -> list[tuple[list[str], float]]:
    out = []
    for _ in range(rng.randint(1, 8)):
        turns = rng.randint(1, 4)
        if harness_only:
            tags = [rng.choice(HARNESS) for _ in range(turns)]
        else:
            tags = [rng.choice(POLICY_TAGS + HARNESS[:1]) for _ in range(turns)]
        out.append((tags, rng.choice([0.0, 1.0])))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_dynamic_weights_equal_the_releases_at_every_step(seed):
    cfg = C.load_config(EXP / "SEAL_release.yaml", [])
    controller = SealController(cfg.seal, run_id="parity")
    dyn = cfg.seal.capability
    assert dyn.enable and dyn.reset_on_empty and controller.vocabulary == "progress"
    release = ReleaseWeights(controller.apatch_cfg.static_weights(), dyn.ema_beta, dyn.prevalence_alpha,
                             dyn.confidence_samples, dyn.min_weight, dyn.max_weight)
    rng = random.Random(seed)
    steps_per_epoch = rng.randint(1, 4)
    harness_steps = 0
    for step in range(24):
        # a step of harness errors only, often at an epoch's first step (its window then holds nothing else)
        harness_only = rng.random() < (0.6 if step % steps_per_epoch == 0 else 0.15)
        harness_steps += harness_only
        trajectories = _step_records(rng, harness_only)
        records = [EpisodeRecord(f"multi_turn_base_{i}", failure_tags=tags, paper_labels=tags, reward=reward,
                                 accuracy=reward) for i, (tags, reward) in enumerate(trajectories)]
        controller.observe(records, step)
        release.observe(trajectories)
        ours, theirs = controller.update_weights(step), release.step()
        tags = set(ours) | set(theirs)
        assert _effective(ours, tags) == pytest.approx(_effective(theirs, tags), abs=1e-12), (seed, step)
        if step % steps_per_epoch == steps_per_epoch - 1:
            controller.end_epoch()
            release.end_epoch()
    assert harness_steps  # every sequence has harness-only steps (seeds chosen so; the steps after them count)


def test_a_harness_only_window_uses_the_base_table_for_that_step_and_the_next_step_resumes_the_average():
    cfg = C.load_config(EXP / "SEAL_release.yaml", [])
    controller = SealController(cfg.seal, run_id="x")
    base = controller.apatch_cfg.static_weights()
    empty = "empty_turn_model_response"
    rec = EpisodeRecord("multi_turn_base_0", failure_tags=[empty, empty], paper_labels=[empty, empty], reward=0.0)
    controller.observe([rec] * 40, 0)
    moved = controller.update_weights(0)[empty]
    controller.end_epoch()
    harness = EpisodeRecord("multi_turn_base_0", failure_tags=["checker_error"], paper_labels=["checker_error"])
    controller.observe([harness] * 5, 1)
    assert controller.update_weights(1) == base  # the step after the harness-only window: the base table
    assert controller.state.metrics()["capability/weight/" + empty] == base[empty]  # and its metrics say so
    controller.end_epoch()
    controller.observe([rec] * 40, 2)
    # the release's EMA resumes from the weights before the reset (docs/release_behaviour.md §10.2); target
    # clamped to 2.0
    beta = cfg.seal.capability.ema_beta
    assert controller.update_weights(2)[empty] == pytest.approx((1 - beta) * moved + beta * 2.0)
