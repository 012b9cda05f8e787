"""SealController: observe -> dynamic weights + A-Patch -> evolve, validation metrics, persistence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seal import recipe as C
from seal.core.apatch import APatchSettings, trajectory_scale
from seal.core.capability import RunMismatchError
from seal.core.config import DiagnosisConfig, InterfaceConfig, SealConfig
from seal.core.controller import STATE_FILE, SealController
from seal.engines.batching import compute_grpo_advantages, rollouts_to_dataproto
from seal.rollout.types import Rollout

EXP = Path(__file__).resolve().parents[2] / "exp"


def cfg(*overrides: str, recipe: str = "SEAL") -> SealConfig:
    return C.load_config(EXP / f"{recipe}.yaml", list(overrides)).seal


def ro(task: str, accuracy: float, tags: list[str], labels: list[str] | None = None, excluded: bool = False,
       response: int = 3) -> Rollout:
    return Rollout(task_id=task, mode="train", prompt_ids=[1, 2], response_ids=list(range(10, 10 + response)),
                   response_mask=[1] * response, reward=accuracy, accuracy=accuracy,
                   category=task.rsplit("_", 1)[0], failure_tags=tags, paper_labels=labels or ["pass"] * len(tags),
                   excluded=excluded)


def recs(rollouts: list[Rollout]) -> list:
    """What the engines hand the controller: each episode's record."""
    return [r.record() for r in rollouts]


def failing_batch(step_offset: int = 0) -> list[Rollout]:
    """Spurious calls and empty turns with reward 0 (pressure for cues and weights) plus successes.

    Window profile: 48 tag occurrences; spurious_tool_call and empty_turn_model_response 8 each
    (prevalence 1/6, reward mean 0), pass 24, correct_abstention 8 (reward mean 1).
    """
    out = []
    for i in range(8):
        out.append(ro(f"multi_turn_miss_func_{i}", 0.0, ["spurious_tool_call", "empty_turn_model_response", "pass"]))
        out.append(ro(f"multi_turn_miss_func_{i}", 1.0, ["pass", "correct_abstention", "pass"]))
    out.append(ro("multi_turn_base_1", 0.0, [], excluded=True))
    return out


def test_observe_metrics_skip_excluded_and_use_the_vocabulary():
    c = SealController(cfg())
    m = c.observe(recs(failing_batch()), step=1)
    assert m["train/num_rollouts"] == 17 and m["train/excluded"] == 1
    assert m["train/reward_mean"] == 0.5 and m["train/accuracy_mean"] == 0.5
    assert m["train/tag_frac/spurious_tool_call"] == pytest.approx(8 / 48)
    assert m["train/tag_frac/correct_abstention"] == pytest.approx(8 / 48)
    assert m["train/tag_frac/pass"] == pytest.approx(24 / 48)
    assert c.state.observe_count == 16  # the excluded rollout never reaches the state
    paper = SealController(cfg("seal.diagnosis.vocabulary=paper"))
    pm = paper.observe(recs([ro("multi_turn_base_1", 0.0, ["state_mismatch"], ["argument_mismatch"])]), step=1)
    assert pm["train/tag_frac/argument_mismatch"] == 1.0 and "train/tag_frac/state_mismatch" not in pm
    # The core takes the typed record only: neither a Rollout nor a mapping (the verl engine's extras rows).
    strict = SealController(cfg())
    for wrong in (failing_batch()[:1], [{"task_id": "multi_turn_base_3", "failure_tags": ["pass"], "reward": 1.0}]):
        with pytest.raises(TypeError, match="EpisodeRecord"):
            strict.observe(wrong, 1)
        with pytest.raises(TypeError, match="EpisodeRecord"):
            SealController.validation_metrics(wrong)
    assert strict.state.observe_count == 0


def _data(rollouts):
    data = rollouts_to_dataproto(rollouts, 0)
    compute_grpo_advantages(data)
    return data


def test_reweight_uses_dynamic_weights_updated_once_per_step():
    c = SealController(cfg())
    batch = [r for r in failing_batch() if not r.excluded]
    c.observe(recs(batch), step=1)
    data = _data(batch)
    before = data.batch["advantages"].clone()
    m = c.reweight(data, step=1)
    weights = c.state.dynamic_weights
    # target = 1.5 * (1 + 1 * (1/6) * (1 - 0) * (8/32)) = 1.5625; w = 0.75 * 1.5 + 0.25 * 1.5625
    assert weights["empty_turn_model_response"] == pytest.approx(1.515625)
    assert weights["spurious_tool_call"] == 2.0 and weights["correct_abstention"] == 1.8  # clamp / no pressure
    for i, r in enumerate(batch):
        scale = trajectory_scale(r.failure_tags, weights, 0.5, 2.0)
        assert data.batch["advantages"][i].tolist() == pytest.approx((before[i] * scale).tolist())
    assert m["apatch/enabled"] == 1.0 and m["apatch/dynamic_enabled"] == 1.0
    # A second call in the same step does not move the weights again.
    c.reweight(_data(batch), step=1)
    assert c.state.dynamic_weights == weights
    c.observe(recs(batch), step=2)
    c.reweight(_data(batch), step=2)
    assert c.state.dynamic_weights["empty_turn_model_response"] > weights["empty_turn_model_response"]


def test_reweight_static_and_disabled():
    static = SealController(cfg(recipe="wo_closed_loop"))
    batch = [r for r in failing_batch() if not r.excluded]
    static.observe(recs(batch), step=1)
    static.reweight(_data(batch), step=1)
    assert static.state.dynamic_weights == static.apatch_cfg.static_weights()
    off = SealController(cfg(recipe="vanilla_rl"))
    off.observe(recs(batch), step=1)
    data = _data(batch)
    before = data.batch["advantages"].clone()
    assert off.reweight(data, step=1) == {"apatch/enabled": 0.0}
    assert data.batch["advantages"].equal(before)


def test_evolve_closed_loop_open_loop_and_raw():
    batch = failing_batch()
    seal = SealController(cfg())
    seal.observe(recs(batch), 1)
    m = seal.evolve(1)
    omega = seal.interface("train")
    cues = [c["tag"] for c in omega["cues"]]
    assert omega["version"] == 1 and cues == ["spurious_tool_call", "empty_turn_model_response"]
    assert omega["error_feedback"] is True  # the two error-feedback tags: 1/3 prevalence, 16 occurrences
    assert m["interface/num_cues"] == 2 and m["interface/cue/spurious_tool_call"] == 1.0
    assert m["capability/observe_count"] == 16
    assert seal.interface("val") is None
    fixed = SealController(cfg(recipe="wo_closed_loop"))
    fixed.observe(recs(batch), 1)
    fixed.evolve(1)
    assert fixed.interface("train")["version"] == 0 and fixed.interface("train")["cues"] == []
    raw = SealController(cfg(recipe="vanilla_rl"))
    raw.observe(recs(batch), 1)
    assert raw.evolve(1)["interface/enabled"] == 0.0 and raw.interface("train") is None
    with pytest.raises(ValueError):
        seal.interface("test-time")


def test_end_epoch_resets_the_window_only():
    c = SealController(cfg())
    c.observe(recs(failing_batch()), 1)
    c.end_epoch()
    assert c.state.bucket("tags", window=True) == {}
    assert c.state.bucket("tags", window=False)["spurious_tool_call"].count == 8


def test_validation_metrics_average_of_category_means():
    rows = ([ro("multi_turn_base_1", 1.0, [])] * 3 + [ro("multi_turn_base_2", 0.0, [])]
            + [ro("multi_turn_miss_param_1", 0.0, [])] * 2
            + [ro("multi_turn_long_context_1", 1.0, []), ro("multi_turn_long_context_2", 1.0, [], excluded=True)])
    m = SealController.validation_metrics(recs(rows))
    assert m["val/accuracy/multi_turn_base"] == 0.75 and m["val/count/multi_turn_base"] == 4
    assert m["val/accuracy/multi_turn_miss_param"] == 0.0
    assert m["val/accuracy/multi_turn_long_context"] == 0.5 and m["val/excluded"] == 1  # excluded = failure
    assert m["val/accuracy/average"] == pytest.approx((0.75 + 0.0 + 0.5) / 3)  # not the pooled 4/8


def test_reward_modes_and_training_progress():
    c = SealController(cfg("seal.reward.mode=capped", "seal.reward.cap_decay=true", "seal.reward.cap=0.8"))
    reply = {"accuracy": 0.0, "progress": 0.9}
    c.set_training_progress(0, 10)
    assert c.reward_fn(reply) == pytest.approx(0.8)
    c.set_training_progress(5, 10)
    assert c.reward_fn(reply) == pytest.approx(0.4)
    assert SealController(cfg()).reward_fn(reply) == 0.0


def test_save_load_round_trip_and_run_identity(tmp_path):
    c = SealController(cfg(), run_id="run-a")
    c.observe(recs(failing_batch()), 1)
    c.reweight(_data([r for r in failing_batch() if not r.excluded]), 1)
    c.evolve(1)
    c.save(tmp_path)
    saved = json.loads((tmp_path / STATE_FILE).read_text())
    assert saved["run_id"] == "run-a" and saved["omega"] == c.omega
    resumed = SealController(cfg())  # no id yet: adopts the checkpoint's
    resumed.load(tmp_path)
    assert resumed.run_id == "run-a" and resumed.state_dict() == c.state_dict()
    other = SealController(cfg(), run_id="run-b")
    with pytest.raises(RunMismatchError):
        other.load(tmp_path)
    other.load(tmp_path, force=True)
    assert other.omega == c.omega
    with pytest.raises(ValueError, match="vocabulary"):
        SealController(cfg("seal.diagnosis.vocabulary=paper")).load(tmp_path)
    with pytest.raises(FileNotFoundError):
        SealController(cfg()).load(tmp_path / "nowhere")


def test_the_controller_needs_only_the_core_config():
    # No recipe file: the seal.* block built directly is all the controller reads.
    plain = SealController(SealConfig())
    assert plain.vocabulary == "progress" and plain.apatch_cfg.tags_column == "failure_tags"
    assert plain.interface("train") == SealController(cfg()).interface("train")
    paper = SealConfig(diagnosis=DiagnosisConfig(vocabulary="paper"),
                       apatch=APatchSettings(tag_weights={"argument_mismatch": 1.4}),
                       interface=InterfaceConfig(enable=False))
    c = SealController(paper)
    assert c.apatch_cfg.vocabulary == c.evolve_cfg.vocabulary == "paper" and c.interface("train") is None
    assert c.state.base_weights["argument_mismatch"] == 1.4
    # The vocabulary-dependent knobs are checked when the block is built, naming the section.
    with pytest.raises(ValueError, match="apatch: .*argument_mismatch"):
        SealConfig(apatch=APatchSettings(tag_weights={"argument_mismatch": 1.4}))
    with pytest.raises(ValueError, match="interface: .*not tags of the 'paper' vocabulary"):
        SealConfig(diagnosis=DiagnosisConfig(vocabulary="paper"),
                   interface=InterfaceConfig(error_tags=("empty_turn_model_response",)))


def test_decay_clock_epoch_reads_the_epoch_index():
    c = SealController(cfg("seal.reward.mode=capped", "seal.reward.cap_decay=true", "seal.reward.cap=0.6",
                           "seal.reward.decay_clock=epoch", "seal.reward.min_cap=0"))
    reply = {"accuracy": 0.0, "progress": 1.0}
    c.set_training_progress(11, 72, steps_per_epoch=12)  # step 12 of epoch 0: no decay yet
    assert c.reward_fn(reply) == pytest.approx(0.6)
    c.set_training_progress(12, 72, steps_per_epoch=12)  # epoch 1 of 6
    assert c.reward_fn(reply) == pytest.approx(0.5)
    step_clock = SealController(cfg("seal.reward.mode=capped", "seal.reward.cap_decay=true", "seal.reward.cap=0.6"))
    step_clock.set_training_progress(11, 72, steps_per_epoch=12)
    assert step_clock.reward_fn(reply) == pytest.approx(0.6 * (1 - 11 / 72))


def test_frozen_interface_keeps_non_adaptive_phi_err():
    ablation = SealController(cfg(recipe="wo_closed_loop"))
    omega = ablation.interface("train")
    assert omega["error_feedback"] is True and omega["cues"] == [] and omega["schema"]["required"]
    assert not ablation.dynamic_cfg.enable and ablation.apatch_cfg.enable
    ablation.observe(recs(failing_batch()), 1)
    ablation.evolve(1)
    assert ablation.interface("train") == omega  # Ω_0 for the whole run
    with pytest.raises(Exception, match="adaptive needs interface.closed_loop"):
        cfg("seal.interface.error_feedback=adaptive", recipe="wo_closed_loop")
