"""Beyond the paper (docs/seal_core.md): repair statistics, adaptive rho, the slime-style per-task weights and the
failure-profile curriculum; each against hand-computed values, their range and sign guarantees, and exact resume."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch
from verl import DataProto

from env_service import vocab
from seal.core.adaptive import AdaptiveConfig, RepairStats, adaptive_rho, task_weight
from seal.core.apatch import APatchSettings
from seal.core.config import DiagnosisConfig, SealConfig
from seal.core.controller import SealController
from seal.core.curriculum import draw_batch, task_probabilities, task_score
from seal.core.profile import BucketStat
from seal.core.record import EpisodeRecord
from seal.core.weights import PAPER_WEIGHTS, PROGRESS_WEIGHTS

ARG, STATE, MISS = vocab.ARGUMENT_MISMATCH, vocab.STATE_MISMATCH, vocab.MISSING_TOOL_CALL


def rec(task: str, tags: tuple[str, ...], success: bool) -> EpisodeRecord:
    return EpisodeRecord(task, failure_tags=tags, reward=float(success), accuracy=float(success))


def test_repairability_by_hand():
    stats = RepairStats(prior=0.0, decay=0.5)
    # step 1: task a fails 2 of 2 with (ARG, ARG, STATE) + (ARG): mix ARG 3/4, STATE 1/4; task b all pass
    stats.observe([rec("a", (ARG, ARG, STATE), False), rec("a", (ARG,), False), rec("b", ("pass",), True)], 1)
    assert stats.tasks["a"]["mix"] == {ARG: 0.75, STATE: 0.25} and stats.tasks["b"]["mix"] == {}
    assert stats.visits == {} and stats.mean() == 0.5  # no revisit yet: neutral
    # step 2: a passes 1 of 2 -> credit its previous mix with 0.5
    stats.observe([rec("a", ("pass",), True), rec("a", (MISS,), False)], 2)
    assert stats.visits == {ARG: 0.75, STATE: 0.25}
    assert stats.repaired == {ARG: 0.375, STATE: 0.125}
    # step 3: decay 0.5 first, then a passes 2 of 2 -> credit mix {MISS: 1} with 1.0
    stats.observe([rec("a", ("pass",), True), rec("a", ("pass",), True)], 3)
    assert stats.visits == {ARG: 0.375, STATE: 0.125, MISS: 1.0}
    assert stats.repaired == {ARG: 0.1875, STATE: 0.0625, MISS: 1.0}
    assert stats.repairability(MISS) == 1.0 and stats.repairability(ARG) == 0.5
    assert stats.mean() == pytest.approx(1.25 / 1.5)
    shrunk = RepairStats(prior=2.0)
    shrunk.load_state_dict(stats.state_dict())
    assert shrunk.repairability(MISS) == pytest.approx((1.0 + 2.0 * 1.25 / 1.5) / 3.0)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("table", [PROGRESS_WEIGHTS, PAPER_WEIGHTS])
def test_adaptive_rho_stays_in_range_and_positive(seed, table):
    rng = random.Random(seed)
    stats = RepairStats(prior=rng.choice([0.0, 1.0, 8.0]), decay=rng.uniform(0.1, 1.0))
    tags = [t for t in table if t != vocab.PASS] + [vocab.CHECKER_ERROR]
    for step in range(1, 8):
        stats.observe([rec(f"t{rng.randrange(5)}", tuple(rng.choices(tags, k=rng.randint(1, 4))),
                           rng.random() < 0.4) for _ in range(12)], step)
    w_min, w_max = rng.choice([(0.5, 2.0), (0.9, 1.1), (0.1, 10.0)])
    rho = adaptive_rho(table, stats, rate=rng.choice([0.0, 1.0, 10.0]), w_min=w_min, w_max=w_max)
    assert all(w_min <= w <= w_max and w > 0 for w in rho.values())
    assert rho[vocab.PASS] == min(max(table[vocab.PASS], w_min), w_max)  # pass is not a failure type
    assert vocab.CHECKER_ERROR not in rho  # harness errors are never weighed
    # rate 0 (and a clip that never binds) gives back the base table exactly
    assert adaptive_rho(table, stats, 0.0, 1e-6, 1e6) == {t: table.get(t, 1.0) for t in rho}


def test_adaptive_rho_follows_repairability():
    stats = RepairStats(prior=0.0)
    stats.visits, stats.repaired = {ARG: 10.0, STATE: 10.0}, {ARG: 9.0, STATE: 1.0}
    rho = adaptive_rho(PAPER_WEIGHTS, stats, rate=1.0, w_min=0.5, w_max=2.0)
    assert rho[ARG] == pytest.approx(PAPER_WEIGHTS[ARG] * math.exp(0.4))
    assert rho[STATE] == pytest.approx(max(PAPER_WEIGHTS[STATE] * math.exp(-0.4), 0.5))


def test_slime_task_weights():
    cfg = AdaptiveConfig(task_weights="slime")
    assert task_weight(None, cfg) == 1.0
    assert task_weight(BucketStat(4, 4, 4, 0), cfg) == 1.0  # fewer than 5 attempts
    assert task_weight(BucketStat(5, 4, 4, 0), cfg) == 0.1  # 80 % solved
    assert task_weight(BucketStat(8, 6, 6, 0), cfg) == 1.0  # exactly 75 %: not above
    assert task_weight(BucketStat(5, 1, 1, 0), cfg) == 0.5  # 20 %
    assert task_weight(BucketStat(8, 2, 2, 0), cfg) == 1.0  # exactly 25 %: not below


def _batch(task_ids: list[str], advantages: list[float], tags: list[list[str]] | None = None,
           column: str = "failure_tags") -> DataProto:
    adv = torch.tensor(advantages).unsqueeze(-1).repeat(1, 3)
    cells = np.empty(len(task_ids), dtype=object)
    for k, t in enumerate(tags or [["state_mismatch"]] * len(task_ids)):
        cells[k] = list(t)
    return DataProto.from_dict(tensors={"advantages": adv, "response_mask": torch.ones_like(adv)},
                               non_tensors={"task_id": np.array(task_ids, dtype=object), column: cells})


def test_task_weights_scale_advantages_without_flipping_signs():
    cfg = SealConfig(apatch=APatchSettings(enable=False), adaptive=AdaptiveConfig(task_weights="slime"))
    controller = SealController(cfg)
    controller.observe([rec("solved", ("pass",), True)] * 8 + [rec("hard", (STATE,), False)] * 8
                       + [rec("new", (STATE,), False)] * 2, step=1)
    data = _batch(["solved", "hard", "new", "solved"], [1.0, -1.0, 0.5, -0.5])
    metrics = controller.reweight(data, 1)
    assert data.batch["advantages"][:, 0].tolist() == pytest.approx([0.1, -0.5, 0.5, -0.05])
    assert metrics["apatch/enabled"] == 0.0 and metrics["adaptive/task_weight_mean"] == pytest.approx(1.7 / 4)


def test_curriculum_floor_and_determinism():
    stats = RepairStats(prior=0.0)
    ids = [f"t{i}" for i in range(10)]
    stats.visits, stats.repaired = {ARG: 4.0, STATE: 4.0}, {ARG: 3.0, STATE: 1.0}
    stats.tasks = {"t0": {"mix": {}, "rate": 1.0, "visits": 3},  # solved: floor only
                   "t1": {"mix": {ARG: 1.0}, "rate": 0.0, "visits": 3},
                   "t2": {"mix": {STATE: 0.6, ARG: 0.4}, "rate": 0.5, "visits": 3}}
    assert task_score("t0", stats) == 0.0
    assert task_score("t1", stats) == 0.75
    assert task_score("t2", stats) == 0.5 * 0.25
    assert task_score("t9", stats) == 0.5  # never visited: the mean
    floor = 0.2
    probs = task_probabilities(ids, stats, floor)
    assert sum(probs) == pytest.approx(1.0)
    assert min(probs) == pytest.approx(floor / len(ids))  # the solved task keeps exactly the floor
    assert probs[1] > probs[9] > probs[2] > probs[0]
    assert task_probabilities(ids, stats, 1.0) == [0.1] * 10
    a = draw_batch(ids, stats, floor, 4, seed=7, step=3)
    assert a == draw_batch(ids, stats, floor, 4, seed=7, step=3) and len(set(a)) == 4
    # every task is drawn sometimes (the floor), the solved one least
    counts = [0] * 10
    for step in range(400):
        for i in draw_batch(ids, stats, floor, 2, seed=1, step=step):
            counts[i] += 1
    assert min(counts) > 0 and counts[0] == min(counts)
    with pytest.raises(ValueError, match="floor"):
        task_probabilities(ids, stats, 0.0)


def test_curriculum_draws_follow_the_probabilities_without_replacement():
    # a pick of one task follows p(t); a batch of k is successive sampling: each pick renormalises p over the
    # tasks not yet picked, so the second pick given the first is p(t) / (1 - p(first))
    stats = RepairStats(prior=0.0)
    stats.visits, stats.repaired = {ARG: 4.0}, {ARG: 3.0}
    stats.tasks = {"a": {"mix": {}, "rate": 1.0, "visits": 1}, "b": {"mix": {ARG: 1.0}, "rate": 0.0, "visits": 1}}
    ids = ["a", "b", "c"]  # scores 0, 0.75, 0.75 (never visited: the mean)
    probs = task_probabilities(ids, stats, 0.4)
    assert probs == pytest.approx([0.4 / 3, 0.4 / 3 + 0.3, 0.4 / 3 + 0.3])
    draws = 20_000
    firsts = [draw_batch(ids, stats, 0.4, 1, seed=3, step=s)[0] for s in range(draws)]
    for i, p in enumerate(probs):  # 5 standard deviations of a binomial share: a wrong sampler lands far outside
        assert abs(firsts.count(i) / draws - p) < 5 * (p * (1 - p) / draws) ** 0.5
    pairs = [draw_batch(ids, stats, 0.4, 2, seed=4, step=s) for s in range(draws)]
    assert all(len(set(pair)) == 2 for pair in pairs)
    after_b = [second for first, second in pairs if first == 1]
    want = probs[0] / (1 - probs[1])  # task a second, given b first
    assert abs(after_b.count(0) / len(after_b) - want) < 5 * (want * (1 - want) / len(after_b)) ** 0.5
    assert sorted(draw_batch(ids, stats, 0.4, 3, seed=0, step=0)) == [0, 1, 2]  # a full batch: every task once


def _step(controller: SealController, step: int, rng: random.Random) -> tuple[dict, list[float], list[int]]:
    ids = [f"multi_turn_base_{i}" for i in range(6)]
    batch = draw_batch(ids, controller.repair, 0.2, 3, seed=5, step=step)
    records = []
    for i in batch:
        for _ in range(4):
            ok = rng.random() < 0.3 + 0.1 * i
            records.append(EpisodeRecord(ids[i], paper_labels=["pass"] if ok else rng.choice([[ARG], [STATE, MISS]]),
                                         reward=float(ok), accuracy=float(ok)))
    controller.observe(records, step)
    data = _batch([r.task_id for r in records], [1.0 if r.reward else -1.0 for r in records],
                  [list(r.paper_labels) for r in records], column="paper_labels")
    metrics = controller.reweight(data, step)
    metrics |= controller.evolve(step)
    return metrics, data.batch["advantages"][:, 0].tolist(), batch


def test_exact_resume_of_adaptive_rho_curriculum_and_task_weights(tmp_path):
    cfg = SealConfig(diagnosis=DiagnosisConfig(vocabulary="paper"),
                     adaptive=AdaptiveConfig(rho="adaptive", task_weights="slime"))
    whole = SealController(cfg, run_id="r")
    rng = random.Random(0)
    for step in range(1, 6):
        _step(whole, step, rng)
    whole.save(tmp_path)
    rng_state = rng.getstate()
    expected = [_step(whole, step, rng) for step in range(6, 9)]

    resumed = SealController(cfg)  # a new process: fresh id, state from the checkpoint
    resumed.load(tmp_path)
    rng.setstate(rng_state)
    got = [_step(resumed, step, rng) for step in range(6, 9)]
    assert got == expected
    assert any(k.startswith("adaptive/rho/") for k in got[0][0])
    assert json.loads(json.dumps(resumed.state_dict())) == resumed.state_dict()


def test_defaults_change_nothing():
    plain = SealController(SealConfig(), run_id="r")
    assert plain.adaptive_cfg.rho == "fixed" and plain.adaptive_cfg.task_weights == "off"
    plain.observe([rec("multi_turn_base_0", (STATE,), False)] * 4, 1)
    plain.observe([rec("multi_turn_base_0", ("pass",), True)] * 4, 2)
    assert plain.state.base_weights == plain.apatch_cfg.static_weights()
