"""The embedded default's learning signal (exp/tiny_cpu.yaml, seal/engines/warm_start.py), against a real
env service: the ground-truth episodes and their failing twins as training plays them, a warm start that
reaches its target, its cache, and a GRPO step of the default recipe whose groups mix rewards, so that
advantages, the policy loss and the gradient are non-zero, A-Patch scales them, and the update raises the
probability of each task's ground truth.

Same code path, tasks and knobs as `python launcher.py` (the default recipe), with the tiny model, the warm
start and the run inside tmp_path, one training step and no validation (what the test guards is the step)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from env_service.tasks import TURN_END_REPLY, failing_twin_replies, ground_truth_replies, ground_truth_tool_calls
from seal import recipe as C
from seal.core.controller import initial_training_interface
from seal.engines import warm_start as W
from seal.engines.data import load_tasks
from seal.engines.local import engine as E

REPO = Path(__file__).resolve().parents[2]


def _cfg(tmp_path: Path, url: str, *extra: str):
    return C.load_config(REPO / "exp" / "tiny_cpu.yaml", [
        f"model.path={tmp_path / 'base'}", f"model.warm_start.path={tmp_path / 'warm'}", f"env.urls=[{url}]",
        f"run_root={tmp_path / 'runs'}", "trainer.total_training_steps=1", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.save_freq=0", *extra])


def test_the_failing_twin_leaves_out_the_last_calling_turn():
    # multi_turn_miss_param_100: turn 0 must not call a tool; turns 1 and 3 call one each.
    turns = ground_truth_tool_calls("multi_turn_miss_param_100")
    last = max(i for i, t in enumerate(turns) if t)
    gt, twin = ground_truth_replies("multi_turn_miss_param_100"), failing_twin_replies("multi_turn_miss_param_100")
    assert len(twin) == len(gt) - len(turns[last]) and twin.count(TURN_END_REPLY) == len(turns)
    calls = [r for r in gt if r.startswith("<tool_call>")]
    assert [r for r in twin if r.startswith("<tool_call>")] == calls[:-len(turns[last])]
    assert twin[-2:] == [TURN_END_REPLY, TURN_END_REPLY]  # the last turn (it calls) ends at once
    assert failing_twin_replies("multi_turn_base_100") == gt[:0] + ground_truth_replies("multi_turn_base_100",
                                                                                         skip_turn=1)


@pytest.mark.slow
def test_the_default_recipe_has_a_learning_signal(tmp_path, service_url, monkeypatch):
    monkeypatch.setenv("SEAL_MODEL_CACHE", str(tmp_path))  # model.build_tiny builds only inside the model cache
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = _cfg(tmp_path, service_url)
    assert cfg.model.warm_start.enable and cfg.model.warm_start.failing_twin  # the default
    assert cfg.rollout.deterministic_generation  # reproducible
    tasks = load_tasks(cfg.data.train_files, cfg.data.max_train_tasks, cfg.data.train_task_ids)
    base = Path(C.model_dir(cfg))
    tok = AutoTokenizer.from_pretrained(base)

    # Each task's replayed ground truth passes and its twin fails, graded, in the same context: they share the
    # prompt, and only the model's own tokens are targets.
    episodes = W.warm_start_episodes(tok, tasks, initial_training_interface(cfg.seal), cfg.env,
                                     W.full_episode_limits(C.rollout_limits(cfg)), cfg.rollout.concurrency,
                                     cfg.model.warm_start.failing_twin)
    gts = [r for r in episodes if r.accuracy == 1.0]
    twins = [r for r in episodes if r.accuracy == 0.0]
    assert [r.task_id for r in gts] == [r.task_id for r in twins] == list(cfg.data.train_task_ids)
    for gt, twin in zip(gts, twins, strict=True):
        assert gt.mode == twin.mode == "train" and not gt.truncated and not twin.truncated and not twin.excluded
        assert twin.prompt_ids == gt.prompt_ids and sum(twin.response_mask) < sum(gt.response_mask)
        assert 0 < sum(gt.response_mask) < len(gt.response_ids)  # observations are context, not targets
        assert twin.failure_tags[-1] != "pass", twin.failure_tags  # (here the last calling turn is the last turn)

    # The warm start reaches its target before its step budget; the decision is open both ways.
    warm = W.build_warm_start(cfg, base, tasks)
    info = json.loads((warm / W.INFO_FILE).read_text())
    assert info["tasks"] == list(cfg.data.train_task_ids)
    assert info["steps"] < cfg.model.warm_start.max_steps and info["mean_mass"] >= cfg.model.warm_start.target_prob
    for task in cfg.data.train_task_ids:
        assert 0.2 < info["prob"][task] < 0.8 and 0.2 < info["twin_prob"][task] < 0.8, info
    mtime = (warm / "model.safetensors").stat().st_mtime
    assert W.build_warm_start(cfg, base, tasks) == warm and (warm / "model.safetensors").stat().st_mtime == mtime
    for change in ("model.warm_start.lr=0.02", "model.warm_start.failing_twin=false"):
        other = _cfg(tmp_path, service_url, change)
        key = W.cache_key(base, tasks, other.model, other.seal.interface, C.rollout_limits(other), other.seed)
        assert key != info["key"], change
    assert W.cache_key(base, tasks, cfg.model, cfg.seal.interface, C.rollout_limits(cfg), cfg.seed) == info["key"]
    model = AutoModelForCausalLM.from_pretrained(warm)
    before = W.episode_probs(model, gts)
    assert before == pytest.approx(list(info["prob"].values()), rel=1e-4)

    # One GRPO step of the default recipe from the (cached) warm start.
    out = E.train(cfg, tmp_path / "run")
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["train/num_rollouts"] == 2 * 8 and row["train/excluded"] == 0
    assert row["train/mixed_group_frac"] > 0, row  # a group with a success and a failure
    assert 0 < row["train/accuracy_mean"] < 1
    assert row["train/advantage_abs_mean"] > 0 and row["actor/grad_norm"] > 0 and row["actor/pg_loss"] != 0
    assert row["apatch/scaled_count"] > 0
    assert row["apatch/min_scale"] != 1.0 or row["apatch/max_scale"] != 1.0, row  # A-Patch scaled advantages
    assert out["last_step"] == 1

    # The update learnt: each task's ground truth is more likely afterwards (measured: +0.15 to +0.20).
    after = W.episode_probs(AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoints" / "step_1"), gts)
    assert all(a > b + 0.05 for a, b in zip(after, before, strict=True)), (before, after)


def test_a_directory_that_is_not_a_warm_start_is_never_replaced(tmp_path):
    """The build replaces model.warm_start.path whole (atomically); a directory holding anything but a warm start
    is the user's, and the build stops before it starts, touching nothing."""
    cfg = _cfg(tmp_path, "http://127.0.0.1:9")  # never reached: the refusal comes first
    (tmp_path / "warm").mkdir()
    (tmp_path / "warm" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a warm start"):
        W.build_warm_start(cfg, tmp_path / "base", [])
    assert (tmp_path / "warm" / "notes.txt").read_text() == "mine"
