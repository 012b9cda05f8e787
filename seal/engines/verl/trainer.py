"""verl trainer mode `seal` (`trainer.v1.trainer_mode=seal`): verl's synchronous v1 PPO trainer plus SEAL.

`SealTrainer` is `PPOTrainerSync` (colocated FSDP actor + vLLM rollout, weights synced every step)
with the SEAL step of `seal.core.controller.SealController` woven in (docs/seal_core.md, docs/verl_engine.md):

    submit batch      every batch sent to the agent loops carries `seal_feed` (EpisodeFeed): training
                      batches mode "train" + Ω_t + training progress; validation batches (verl marks
                      them `validate`) mode "eval" and no interface
    _compute_advantage  read the step's rows and extras from TransferQueue ->
                      controller.observe (capability state C_t over non-excluded rollouts) ->
                      verl's GRPO (excluded rows isolated in their own groups) ->
                      controller.reweight (A-Patch on the advantages, dynamic weights) -> write back
    step (after the actor update)   controller.evolve -> Ω_{t+1}; at an epoch end controller.end_epoch
    validation        greedy, n = val_n (verl's val_kwargs) at step 0, every test_freq and the last
                      step; `val/accuracy/<category>`, `val/count/<category>`, `val/accuracy/average`
    checkpoints       verl's `global_step_N/` + `seal_state.json`, `checkpoints/step_N` -> global_step_N,
                      `checkpoints/latest.json`, `checkpoints/best.json`; resume restores the controller
    metrics           verl's loggers + `<run_dir>/metrics.jsonl` (one flat JSON object per step)

The mode runs synchronously (`trainer_mode` reads "sync" for verl's own checks): SEAL's closed loop needs
Ω_{t+1} in place before step t+1's episodes start.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import DictConfig
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import response_to_nested

from seal import recipe as C
from seal.core.controller import STATE_FILE, SealController
from seal.engines.verl.agent_loop import FEED_KEY, EpisodeFeed
from seal.engines.verl.config import TRAINER_MODE
from seal.io_utils import write_json_atomic
from seal.logging_utils import append_metrics, metrics_row, trim_metrics

log = logging.getLogger(__name__)

EXCLUDED_UID_PREFIX = "seal-excluded:"


# --------------------------------------------------------------------------- the advantage step
def _object_column(values: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _as_list(values: Any) -> list[Any]:
    """A non-tensor column from TransferQueue as a list: depending on the backend it arrives as a
    NonTensorStack, a numpy array or tensordict's LinkedList (a list subclass without `tolist`)."""
    return list(values) if isinstance(values, list) or not hasattr(values, "tolist") else values.tolist()


def extras_columns(extras: Sequence[Mapping[str, Any] | None], tags_fields: Sequence[str]) -> dict[str, np.ndarray]:
    """non_tensor_batch columns A-Patch reads: each tag field, `excluded`, `task_id`, `category`.

    A row whose extras are None (verl's batch padding) or that is excluded gets no tags (A-Patch
    leaves it at scale 1; its response mask is 0 anyway).
    """
    cols: dict[str, list[Any]] = {name: [] for name in (*tags_fields, "excluded", "task_id", "category")}
    for ex in extras:
        skip = ex is None or bool(ex.get("excluded"))
        for name in tags_fields:
            cols[name].append(None if skip else list(ex.get(name) or ()))
        cols["excluded"].append(True if ex is None else bool(ex.get("excluded")))
        cols["task_id"].append(None if ex is None else ex.get("task_id"))
        cols["category"].append(None if ex is None else ex.get("category"))
    return {k: _object_column(v) for k, v in cols.items()}


def seal_advantages(
    data: DataProto,
    extras: Sequence[Mapping[str, Any] | None],
    controller: SealController,
    step: int,
    *,
    algorithm: Any,
    num_repeat: int,
    batch_keys: Sequence[str] | None = None,
) -> dict[str, float]:
    """GRPO through verl, then A-Patch through the controller; `data.batch["advantages"]` is replaced.

    Args:
        data: `batch["token_level_rewards"]`, `batch["response_mask"]` ([B, R]) and
            `non_tensor_batch["uid"]` (one GRPO group per prompt), as verl builds them.
        extras: per row, the agent loop's `extra_fields` (None for verl's padding rows).
        controller: the run's `SealController` (`observe` must already have run for `step`).
        step: the global step (A-Patch warm-up, once-per-step dynamic-weight update).
        algorithm: verl's `algorithm` config (adv_estimator, norm_adv_by_std_in_grpo, gamma, lam).
        num_repeat: rollouts per prompt (`actor_rollout_ref.rollout.n`).
        batch_keys: TransferQueue keys `{uid}_{session}_{index}` (v1 path: verl's multi-trajectory
            GRPO); None = verl's plain `compute_advantage`.

    Excluded rows (and padding rows) get a uid of their own, so they do not enter the mean/std of the
    real groups (a lone member gets mean 0, std 1 in verl), and their advantages are zeroed.
    Returns the A-Patch metrics plus `seal/excluded_rows`.
    """
    if len(extras) != len(data):
        raise ValueError(f"{len(extras)} extras for {len(data)} rows")
    columns = extras_columns(extras, sorted({controller.apatch_cfg.tags_column, "failure_tags", "paper_labels"}))
    excluded = columns["excluded"].astype(bool)
    uids = np.array(data.non_tensor_batch["uid"], dtype=object)
    for i in np.flatnonzero(excluded):
        uids[i] = f"{EXCLUDED_UID_PREFIX}{i}:{uids[i]}"
    data.non_tensor_batch["uid"] = uids
    for name, column in columns.items():
        data.non_tensor_batch[name] = column

    kwargs = dict(adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma, lam=algorithm.lam,
                  num_repeat=num_repeat,
                  norm_adv_by_std_in_grpo=bool(algorithm.get("norm_adv_by_std_in_grpo", True)), config=algorithm)
    if batch_keys is None:
        out = compute_advantage(data, **kwargs)
    else:
        out = compute_advantage_for_multi_trajectories(data, batch_keys=list(batch_keys), **kwargs)
    if out is not data:  # verl returns the same object today; keep ours authoritative either way
        data.batch["advantages"], data.batch["returns"] = out.batch["advantages"], out.batch["returns"]
    keep = torch.as_tensor(~excluded, dtype=data.batch["advantages"].dtype).unsqueeze(-1)
    data.batch["advantages"] = data.batch["advantages"] * keep
    data.batch["returns"] = data.batch["returns"] * keep

    metrics = controller.reweight(data, step)
    metrics["seal/excluded_rows"] = float(excluded.sum())
    return metrics


# --------------------------------------------------------------------------- plumbing
class FeedingManager:
    """Wraps verl's agent-loop manager: stamps every submitted batch with its `EpisodeFeed`.

    All of verl's submissions (training batches, refills, validation) go through
    `generate_sequences(batch)`; verl marks validation batches with a `validate` entry.
    """

    def __init__(self, manager: Any, trainer: SealTrainer):
        self._manager = manager
        self._trainer = trainer

    def generate_sequences(self, batch: TensorDict) -> Any:
        validate = bool(batch["validate"]) if "validate" in batch else False
        tu.assign_non_tensor_data(batch, FEED_KEY, self._trainer.episode_feed(validate).to_json())
        return self._manager.generate_sequences(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)


class MetricsLog:
    """verl's `Tracking` plus `<run_dir>/metrics.jsonl` (one flat `{"step": N, key: value}` per call)."""

    def __init__(self, tracking: Any, jsonl_path: Path | None):
        self.tracking = tracking
        self.jsonl_path = jsonl_path
        if jsonl_path is not None:
            jsonl_path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, data: Mapping[str, Any], step: int, backend: Any = None) -> None:
        if self.tracking is not None:
            self.tracking.log(data=data, step=step, backend=backend)
        if self.jsonl_path is not None:
            append_metrics(self.jsonl_path, metrics_row(data, step))

    def finish(self, exit_code: int = 0) -> None:
        if self.tracking is not None:
            self.tracking.finish(exit_code=exit_code)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tracking, name)


# --------------------------------------------------------------------------- the trainer mode
@register_trainer(TRAINER_MODE)
class SealTrainer(PPOTrainerSync):
    """verl's synchronous v1 trainer with the SEAL step (module docstring)."""

    def __init__(self, config: DictConfig):
        seal = config.get("seal")
        if seal is None or seal.get("recipe") is None:
            raise ValueError("trainer mode 'seal' needs the recipe under `seal.recipe` "
                             "(build the config with seal.engines.verl.config.to_verl_config)")
        if config.algorithm.adv_estimator != "grpo":
            raise ValueError("A-Patch rescales GRPO advantages: algorithm.adv_estimator must be grpo")
        super().__init__(config)
        self.recipe = C.from_container(seal.recipe)
        self.run_dir = Path(str(seal.run_dir))
        self.controller = SealController(self.recipe.seal)
        self.best: dict[str, Any] | None = None
        self._last_val: dict[str, float] = {}

    # verl consults `trainer_mode` for its replay buffer, data loader and checkpoint behaviour; ours is
    # the synchronous one, whatever name the mode is registered under.
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        self.registered_mode = value

    # Tracking is created inside verl's fit(); wrap it so metrics also land in metrics.jsonl.
    @property
    def logger(self) -> Any:
        return self.__dict__.get("_metrics_log")

    @logger.setter
    def logger(self, tracking: Any) -> None:
        path = self.run_dir / "metrics.jsonl" if "jsonl" in list(self.recipe.trainer.logger) else None
        if path is not None:
            # verl creates the logger after loading a checkpoint: a fresh run starts a new file, a resumed
            # one drops what the interrupted run logged after its checkpoint (as the local engine does).
            trim_metrics(path, keep_through=int(getattr(self, "global_steps", 0) or 0) or None)
        self.__dict__["_metrics_log"] = MetricsLog(tracking, path)

    # ------------------------------------------------------------------ episodes
    def episode_feed(self, validate: bool) -> EpisodeFeed:
        """How the agent loops run the episodes of the batch being submitted."""
        if validate:
            return EpisodeFeed(mode="eval", interface=None, training_progress=self.controller.training_progress)
        return EpisodeFeed(mode="train", interface=self.controller.interface("train"),
                           training_progress=self.controller.training_progress)

    def fit(self, agent_loop_manager: Any) -> None:
        super().fit(FeedingManager(agent_loop_manager, self))

    def on_step_begin(self) -> None:
        super().on_step_begin()
        # Fraction of training done before this step (reward modes with a decaying cap).
        self.controller.set_training_progress(self.global_steps - 1, self.total_training_steps)

    # ------------------------------------------------------------------ advantage step
    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        keys, partition = list(batch.keys), batch.partition_id
        padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
        fields = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob",
                  "values"]
        td = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=fields)
        raw_extras = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=["extra_fields"])
        extras = [None if pad else dict(ex) for ex, pad in
                  zip(_as_list(raw_extras["extra_fields"]), padding, strict=True)]

        nested_mask = td["response_mask"]
        data = DataProto(batch=td.to_padded_tensor())
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        data.non_tensor_batch["uid"] = _object_column(_as_list(data.batch.pop("uid")))
        algorithm = self.config.algorithm
        if algorithm.use_kl_in_reward:
            data, kl_metrics = apply_kl_penalty(data, kl_ctrl=self.kl_ctrl_in_reward,
                                                kl_penalty=algorithm.kl_penalty)
            metrics.update(kl_metrics)
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        corr = algorithm.get("rollout_correction", None)
        bypass = bool(corr and corr.get("bypass_mode", False))
        correct = corr is not None and "rollout_log_probs" in data.batch and not bypass
        if correct:
            data, corr_metrics = compute_rollout_correction_and_add_to_batch(data, corr)
            metrics.update(corr_metrics)

        metrics.update(self.controller.observe([ex for ex in extras if ex is not None], self.global_steps))
        metrics.update(seal_advantages(data, extras, self.controller, self.global_steps, algorithm=algorithm,
                                       num_repeat=int(self.config.actor_rollout_ref.rollout.n),
                                       batch_keys=keys))

        out_fields = ["advantages", "returns"]
        if algorithm.use_kl_in_reward:
            out_fields.append("token_level_rewards")
        if correct:
            out_fields.append("response_mask")
            if "rollout_is_weights" in data.batch:
                out_fields.append("rollout_is_weights")
        output = TensorDict({f: response_to_nested(data.batch[f], nested_mask) for f in out_fields},
                            batch_size=len(keys))
        return tq.kv_batch_put(keys=keys, partition_id=partition, fields=output)

    # ------------------------------------------------------------------ after the update
    def step(self, metrics: dict, timing_raw: dict) -> Any:
        batch = super().step(metrics, timing_raw)
        # Ω_{t+1} from C_t, before verl saves this step's checkpoint (so a resume continues with it).
        metrics.update(self.controller.evolve(self.global_steps))
        if self.steps_per_epoch > 0 and self.global_steps % self.steps_per_epoch == 0:
            self.controller.end_epoch()
        return batch

    def on_step_end(self) -> None:
        super().on_step_end()
        # docs/config.md: the last step is always saved; verl saves only when save_freq > 0.
        if self.config.trainer.save_freq <= 0 and self.global_steps >= self.total_training_steps:
            self._save_checkpoint()

    # ------------------------------------------------------------------ validation
    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                            expected_acc_counts=None) -> dict[str, float]:
        metrics = super()._val_metrics_update(data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                                              expected_acc_counts=expected_acc_counts)
        records = validation_records(data_sources, sample_uids, reward_extra_infos_dict, expected_acc_counts)
        ours = self.controller.validation_metrics(records)
        self._last_val = ours
        metrics.update(ours)
        return metrics

    def on_validate_end(self) -> None:
        super().on_validate_end()
        self._update_best(self._last_val)

    def _update_best(self, val: Mapping[str, float]) -> None:
        key = str(self.recipe.trainer.best_metric)
        if key not in val:
            log.warning("best checkpoint: validation has no %s", key)
            return
        value = float(val[key])
        if self.best is not None and value <= float(self.best["value"]):
            return
        step = int(self.global_steps)
        if step == 0:
            path = str(self.recipe.model.path)  # the base model, before any update
        else:
            if not self._step_dir(step).is_dir():
                self._save_checkpoint()
            path = f"checkpoints/step_{step}"
        self.best = {"step": step, "path": path, "metric": key, "value": value}
        ckpt = self._ckpt_root()
        ckpt.mkdir(parents=True, exist_ok=True)
        write_json_atomic(ckpt / "best.json", self.best)

    # ------------------------------------------------------------------ checkpoints
    def _ckpt_root(self) -> Path:
        return Path(str(self.config.trainer.default_local_dir))

    def _step_dir(self, step: int) -> Path:
        return self._ckpt_root() / f"global_step_{step}"

    def _save_checkpoint(self) -> None:
        super()._save_checkpoint()
        step = int(self.global_steps)
        folder = self._step_dir(step)
        self.controller.save(folder)
        link = self._ckpt_root() / f"step_{step}"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(folder.name, target_is_directory=True)
        write_json_atomic(self._ckpt_root() / "latest.json", {"step": step, "path": f"checkpoints/step_{step}"})

    def _load_checkpoint(self) -> None:
        super()._load_checkpoint()
        if self.global_steps <= 0:
            return
        if self.config.trainer.resume_mode == "resume_path":
            folder = Path(os.path.realpath(str(self.config.trainer.resume_from_path)))
        else:
            folder = self._step_dir(int(self.global_steps))
        if not (folder / STATE_FILE).is_file():
            raise FileNotFoundError(
                f"resuming from {folder}: no {STATE_FILE} (the capability state, Ω and A-Patch weights). "
                "Set trainer.resume=disable to start afresh.")
        self.controller.load(folder)
        best = self._ckpt_root() / "best.json"
        if best.is_file():
            self.best = json.loads(best.read_text(encoding="utf-8"))
        log.info("resumed SEAL state from %s (step %d)", folder, self.global_steps)


def validation_records(data_sources: Sequence[str], sample_uids: Sequence[str],
                       infos: Mapping[str, Sequence[Any]],
                       expected_counts: Mapping[tuple[str, str], int] | None) -> list[dict[str, Any]]:
    """One record per validation episode for `SealController.validation_metrics`.

    `infos` are verl's per-sample `reward_extra_info` lists (our agent loop sets `acc`, `category`,
    `task_id`, `excluded`); `data_sources` is the category column of our parquet. Sessions verl
    expected but never got (a failed agent loop) are added as excluded failures, so every category
    keeps its full denominator.
    """
    n = len(data_sources)
    accs = list(infos.get("acc", [None] * n))
    cats = list(infos.get("category", [None] * n))
    tids = list(infos.get("task_id", [None] * n))
    excl = list(infos.get("excluded", [None] * n))
    records = []
    seen: Counter[tuple[str, str]] = Counter()
    for i in range(n):
        seen[(str(data_sources[i]), str(sample_uids[i]))] += 1
        records.append({
            "task_id": tids[i] or "",
            "category": cats[i] or str(data_sources[i]),
            "accuracy": accs[i],
            "excluded": bool(excl[i]) if excl[i] is not None else accs[i] is None,
        })
    for (source, uid), expected in (expected_counts or {}).items():
        for _ in range(max(int(expected) - seen[(str(source), str(uid))], 0)):
            records.append({"task_id": "", "category": str(source), "accuracy": 0.0, "excluded": True})
    return records

