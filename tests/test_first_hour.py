"""The README's "Your first hour" as a new user runs it: the real commands, from an empty directory.

A small tiny run (`seal-train --conf exp/tiny_cpu.yaml`, one step, no warm start), `seal-eval` on its checkpoint,
`seal-eval --run` on the run, and `seal-tables` on the result. Every input path on these command lines
(`exp/tiny_cpu.yaml`, the recipe's `runs/_models/tiny_qwen2` and data files) is the project's, found by the
input-path rule; every output lands in the working directory. Each command runs the way its console script
does (`tests/test_entry_points.py`), with this checkout's code.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from seal.io_utils import PROJECT_ROOT
from tests.test_entry_points import RUNNER, SCRIPTS

# The tiny recipe cut to one step of two rollouts per task, two validation tasks (one per category) before and
# after it, no warm start: the launcher's whole loop once; what the run learns is the local engine's tests' business.
SMALL_RUN = ["model.warm_start.enable=false", "trainer.total_training_steps=1", "rollout.n=2",
             "data.max_val_tasks=2", "actor.ppo_mini_batch_size=1", "trainer.test_freq=1", "trainer.save_freq=1"]
TASK = "multi_turn_base_50"  # an eval-split task with one user turn
MODEL_FLAGS = ["--device", "cpu", "--max-tokens-per-call", "8", "--no-progress"]


def run(cwd: Path, name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "BFCL_PROJECT_ROOT": str(cwd.parent / "bfcl_root"),
           "SEAL_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", RUNNER, SCRIPTS[name], *args], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{name} {' '.join(args)}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.mark.slow
def test_the_first_hour_from_an_empty_directory(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    # 2. the tiny run
    trained = run(work, "seal-train", "--conf", "exp/tiny_cpu.yaml", *SMALL_RUN)
    run_dir = work / "runs" / "tiny_cpu"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["engine"] == "local"
    assert config["model"]["path"] == str(PROJECT_ROOT / "runs" / "_models" / "tiny_qwen2")  # the model cache
    assert config["data"]["train_files"] == str(PROJECT_ROOT / "data" / "bfcl_train.parquet")
    _check_the_tiny_run(run_dir, trained.stdout + trained.stderr)
    checkpoint = run_dir / "checkpoints" / "step_1"

    # 3. evaluate the checkpoint (a path relative to the cwd), then the run's last and best checkpoints
    run(work, "seal-eval", "--policy", "hf:runs/tiny_cpu/checkpoints/step_1", "--tasks", TASK, *MODEL_FLAGS)
    one = json.loads((work / "evals" / f"hf_runs_tiny_cpu_checkpoints_step_1_{TASK}" / "summary.json").read_text())
    assert one["status"] == "complete" and one["n"] == 1
    assert any(str(checkpoint) in note for note in one["notes"])  # the cwd's checkpoint, not another
    run(work, "seal-eval", "--run", "runs/tiny_cpu", "--tasks", TASK, *MODEL_FLAGS)
    last = json.loads((run_dir / "eval" / f"last_{TASK}" / "summary.json").read_text())
    assert last["checkpoint"]["step"] == 1 and last["n"] == 1

    # 4. the table (a one-task row: labelled as mismatched)
    table = run(work, "seal-tables", "--row", f"qwen7b+seal=runs/tiny_cpu/eval/last_{TASK}", "--allow-mismatched")
    assert "SEAL" in table.stdout and "|" in table.stdout
    assert sorted(p.name for p in work.iterdir()) == ["evals", "runs"]  # outputs only where the user is


def _check_the_tiny_run(run: Path, output: str) -> None:
    """One step through the launcher, which started and stopped its own env service: rollouts, grading, A-Patch,
    the capability update, the interface's evolution, the PPO update, validation before and after, checkpoint."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    before, step = rows
    assert before["val/count/multi_turn_base"] == 1 and before["val/count/multi_turn_miss_func"] == 1
    assert 0.0 <= before["val/accuracy/average"] <= 1.0
    for key in ("train/reward_mean", "train/accuracy_mean", "train/excluded", "apatch/enabled",
                "apatch/mean_scale", "capability/observe_count", "interface/version", "actor/pg_loss",
                "actor/grad_norm", "timing/rollout", "timing/update", "val/accuracy/average"):
        assert key in step, key
    assert step["train/num_rollouts"] == 4 and step["capability/observe_count"] == 4 - step["train/excluded"]
    assert any(k.startswith("train/tag_frac/") for k in step)
    latest = json.loads((run / "checkpoints" / "latest.json").read_text())
    assert latest == {"step": 1, "path": "checkpoints/step_1"}
    ckpt = run / latest["path"]
    state = json.loads((ckpt / "seal_state.json").read_text())
    assert state["last_step"] == 1 and state["capability"]["observe_count"] == step["capability/observe_count"]
    assert state["omega"]["version"] == step["interface/version"]
    assert (ckpt / "config.json").is_file() and (ckpt / "model.safetensors").is_file()
    assert (ckpt / "tokenizer.json").is_file() and (ckpt / "trainer_state.pt").is_file()
    assert json.loads((run / "checkpoints" / "best.json").read_text())["metric"] == "val/accuracy/average"
    assert (run / "env_service.log").is_file()
    [url] = re.findall(r"env service ready at (http://\S+)", output)
    with pytest.raises(httpx.HTTPError):  # the launcher stopped the service it started
        httpx.get(f"{url}/healthz", timeout=2.0)
