"""The warm start of the local engine (seal/engines/local/warm_start.py), against a real env service:
ground-truth episodes as training plays them, a supervised phase that makes the model far likelier to
reproduce them, and the cache. Not checked here (not reached yet, docs/engines.md): a warm start good
enough for mixed GRPO groups."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from seal import recipe as C
from seal.engines.data import load_tasks
from seal.engines.local import engine as E
from seal.engines.local import warm_start as W

REPO = Path(__file__).resolve().parents[2]
TASK = "multi_turn_base_100"  # two short turns: a small supervised phase is enough to reproduce it


def _cfg(tmp_path: Path, url: str, *extra: str):
    row = {"data_source": "multi_turn_base", "extra_info": {"task_id": TASK, "category": "multi_turn_base"}}
    pd.DataFrame([row]).to_parquet(tmp_path / "tasks.parquet")
    return C.load_config(REPO / "exp" / "tiny_cpu.yaml", [
        f"model.path={tmp_path / 'base'}", f"model.warm_start.path={tmp_path / 'warm'}", f"env.urls=[{url}]",
        f"run_root={tmp_path / 'runs'}", f"data.train_files={tmp_path / 'tasks.parquet'}",
        f"data.val_files={tmp_path / 'tasks.parquet'}", "data.max_train_tasks=null", "data.max_val_tasks=null",
        "data.train_batch_size=1", "actor.ppo_mini_batch_size=1", "rollout.n=4",
        "model.warm_start.enable=true", "model.warm_start.max_steps=25", "model.warm_start.lr=0.01",
        "model.warm_start.target_prob=0.3",
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=0",
        "trainer.save_freq=0", *extra])


@pytest.mark.slow
def test_warm_start_learns_the_ground_truth_replies(tmp_path, service_url):
    from transformers import AutoTokenizer

    cfg = _cfg(tmp_path, service_url)
    tasks = load_tasks(cfg.data.train_files)
    base = E.prepare_model_path(cfg)
    tok = AutoTokenizer.from_pretrained(base)

    # The replayed ground truth is a passing training episode; only the model's own tokens are targets.
    (gt,) = W.ground_truth_rollouts(cfg, tok, tasks)
    assert gt.task_id == TASK and gt.accuracy == 1.0 and gt.mode == "train" and not gt.truncated
    assert 0 < sum(gt.response_mask) < len(gt.response_ids)  # observations are context, not targets

    warm = W.build_warm_start(cfg, base, tasks)
    info = json.loads((warm / W.INFO_FILE).read_text())
    assert info["tasks"] == [TASK] and info["steps"] == 25  # the step budget ended it (target not reached)
    # A random model: ~11.9 nats per reply token (uniform over 151,936 ids); 25 steps reach well under 3.
    assert info["loss"] < 3.0, info["loss"]
    mtime = (warm / "model.safetensors").stat().st_mtime
    assert W.build_warm_start(cfg, base, tasks) == warm and (warm / "model.safetensors").stat().st_mtime == mtime
    other = _cfg(tmp_path, service_url, "model.warm_start.lr=0.02")
    assert W.cache_key(other, base, tasks) != info["key"]  # other inputs: rebuilt, not reused
