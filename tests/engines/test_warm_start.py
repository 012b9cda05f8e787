"""The embedded default's learning signal (exp/tiny_cpu.yaml, seal/engines/local/warm_start.py), against a real
env service: the ground-truth episodes as training plays them, a warm start that reaches its target
probability, its cache, and a GRPO step of the default recipe whose groups mix rewards, so that advantages,
the policy loss and the gradient are non-zero and A-Patch scales them.

Same code path, tasks and knobs as `python launcher.py` (the default recipe), with the tiny model, the warm
start and the run inside tmp_path, one training step and no validation (what the test guards is the step)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seal import recipe as C
from seal.engines.data import load_tasks
from seal.engines.local import engine as E
from seal.engines.local import warm_start as W

REPO = Path(__file__).resolve().parents[2]


def _cfg(tmp_path: Path, url: str, *extra: str):
    return C.load_config(REPO / "exp" / "tiny_cpu.yaml", [
        f"model.path={tmp_path / 'base'}", f"model.warm_start.path={tmp_path / 'warm'}", f"env.urls=[{url}]",
        f"run_root={tmp_path / 'runs'}", "trainer.total_training_steps=1", "trainer.val_before_train=false",
        "trainer.test_freq=0", "trainer.save_freq=0", *extra])


@pytest.mark.slow
def test_the_default_recipe_has_a_learning_signal(tmp_path, service_url):
    from transformers import AutoTokenizer

    cfg = _cfg(tmp_path, service_url)
    assert cfg.model.warm_start.enable and cfg.rollout.deterministic_generation  # the default, reproducible
    tasks = load_tasks(cfg.data.train_files, cfg.data.max_train_tasks, cfg.data.train_task_ids)
    base = E.prepare_model_path(cfg)
    tok = AutoTokenizer.from_pretrained(base)

    # The replayed ground truth is a passing training episode; only the model's own tokens are targets.
    gts = W.ground_truth_rollouts(cfg, tok, tasks)
    assert [r.task_id for r in gts] == list(cfg.data.train_task_ids)
    for gt in gts:
        assert gt.accuracy == 1.0 and gt.mode == "train" and not gt.truncated
        assert 0 < sum(gt.response_mask) < len(gt.response_ids)  # observations are context, not targets

    # The warm start reaches its target before its step budget (cosine lr, the prompt's tail with grad).
    warm = W.build_warm_start(cfg, base, tasks)
    info = json.loads((warm / W.INFO_FILE).read_text())
    assert info["tasks"] == list(cfg.data.train_task_ids)
    assert info["steps"] < cfg.model.warm_start.max_steps and info["mean_prob"] >= cfg.model.warm_start.target_prob
    assert all(p > 0.1 for p in info["prob"].values()), info["prob"]  # each task, not only on average
    mtime = (warm / "model.safetensors").stat().st_mtime
    assert W.build_warm_start(cfg, base, tasks) == warm and (warm / "model.safetensors").stat().st_mtime == mtime
    assert W.cache_key(_cfg(tmp_path, service_url, "model.warm_start.lr=0.02"), base, tasks) != info["key"]

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
