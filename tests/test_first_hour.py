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
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from seal.paths import PROJECT_ROOT
from tests.test_entry_points import RUNNER, SCRIPTS

# The tiny recipe cut to one step of two rollouts per task, one validation task, no warm start: enough to write a
# checkpoint; what the run learns is the local engine's tests' business.
SMALL_RUN = ["model.warm_start.enable=false", "trainer.total_training_steps=1", "rollout.n=2",
             "data.max_val_tasks=1", "trainer.val_before_train=false", "trainer.test_freq=1", "trainer.save_freq=1"]
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
    run(work, "seal-train", "--conf", "exp/tiny_cpu.yaml", *SMALL_RUN)
    run_dir = work / "runs" / "tiny_cpu"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model"]["path"] == str(PROJECT_ROOT / "runs" / "_models" / "tiny_qwen2")  # the model cache
    assert config["data"]["train_files"] == str(PROJECT_ROOT / "data" / "bfcl_train.parquet")
    checkpoint = run_dir / "checkpoints" / "step_1"
    assert (checkpoint / "config.json").is_file()

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
