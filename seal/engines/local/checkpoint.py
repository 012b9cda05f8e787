"""The local engine's checkpoints: `checkpoints/step_<N>/` written atomically, the resume point, and the
trainer state (optimizer, step, best record, RNG states) read back without unpickling code."""

from __future__ import annotations

import logging
import os
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seal.core.controller import SealController
from seal.engines.checkpoint_policy import check_local_resume
from seal.run_dir import TRAINER_STATE_FILE, RunDir

log = logging.getLogger("seal.engines.local.checkpoint")


def trainer_state(step: int, steps_per_epoch: int, total_steps: int, best: dict[str, Any] | None,
                  run_id: str) -> dict[str, Any]:
    """What `trainer_state.pt` holds besides the optimizer and the RNG states."""
    epoch, index = divmod(step, steps_per_epoch)
    return {"step": step, "epoch": epoch, "batch_in_epoch": index, "best": best, "run_id": run_id,
            "total_steps": total_steps}


def save_checkpoint(run: RunDir, step: int, model: Any, tokenizer: Any, optimizer: torch.optim.Optimizer,
                    controller: SealController, state: dict[str, Any]) -> Path:
    """`checkpoints/step_<N>/`: HF model + tokenizer, `seal_state.json`, optimizer + trainer state.

    Assembled in a staging folder and renamed into place, then `latest.json` points at it: an
    interrupted save never leaves a half-written checkpoint that resume would pick.
    """
    ckpts = run.checkpoints
    final, tmp = ckpts.step_dir(step), ckpts.staging_dir(step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    controller.save(tmp)
    torch.save({"optimizer": optimizer.state_dict(), **state, "rng": rng_state()}, tmp / TRAINER_STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    ckpts.write_latest(step)
    return final


def resume_point(mode: str, run: RunDir) -> Path | None:
    """The checkpoint to resume from by `trainer.resume` (`mode`): auto (latest.json), disable, or a directory."""
    if mode == "disable":
        return None
    if mode == "auto":
        return run.latest_checkpoint()
    path = Path(mode)
    if not path.is_dir():
        raise FileNotFoundError(f"trainer.resume: checkpoint directory {path} does not exist")
    check_local_resume(path)  # a pruned checkpoint (no optimizer) is refused, naming the nearest usable one
    return path


def rng_state() -> dict[str, Any]:
    """The three generators' states in types `torch.load(weights_only=True)` reads back: tensors, numbers,
    strings, lists and tuples (numpy's key array goes in as a list)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy": [str(name), keys.tolist(), int(pos), int(has_gauss),
                                                      float(cached)], "python": random.getstate()}


def set_rng_state(rng: dict[str, Any]) -> None:
    name, keys, pos, has_gauss, cached = rng["numpy"]
    torch.set_rng_state(rng["torch"])
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    random.setstate(rng["python"])


def load_trainer_state(path: Path) -> dict[str, Any]:
    """`trainer_state.pt` read with `weights_only=True`: tensors and plain Python values only, so a crafted
    file (a checkpoint from elsewhere) cannot run code. A file that needs more is refused, named."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ValueError(f"{path}: refused, it holds objects beyond tensors and plain values (a checkpoint "
                         f"written by another program or an older version of this one): {str(exc)[:300]}") from None


def restore_checkpoint(folder: Path, optimizer: torch.optim.Optimizer, controller: SealController,
                       force: bool) -> tuple[int, dict[str, Any] | None]:
    """Optimizer, controller and RNG states from a checkpoint; returns (step, best record)."""
    state = load_trainer_state(folder / TRAINER_STATE_FILE)
    optimizer.load_state_dict(state["optimizer"])
    controller.load(folder, force=force)
    set_rng_state(state["rng"])
    log.info("resumed from %s (step %d, run %s)", folder, int(state["step"]), controller.run_id)
    return int(state["step"]), state.get("best")
