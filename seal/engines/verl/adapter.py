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
`_val_metrics_update`      called by `PPOTrainer._validate` with per-sample `reward_extra_info` lists and
                           the expected counts  -> per-category validation accuracy, a failed session
                           counted as a failure (`validation_records`)
`_save_checkpoint`         `PPOTrainer.fit` (save_freq) writes `global_step_N/`  -> `seal_state.json` beside
                           it, the `step_N` link and `latest.json` (`checkpoint_saved`)
`_load_checkpoint`         `PPOTrainer.init` (resume_mode auto / resume_path)  -> the controller restored
                           from the same folder (`checkpoint_loaded`)
`_agent_loop_registry`     `verl.experimental.agent_loop.agent_loop`, read by `registered()`  -> verl has no
                           public lookup of registered agent loops

The CPU path (`trainer.device: cpu`, `install_cpu_patches`, its docstring has the details):

`PlatformRegistry` +       `verl.plugin.platform`: cuda/npu/rocm only, resolved once per process  -> a `cpu`
`set_platform`             platform (gloo, `torch.cpu` + the memory/RNG calls verl makes, device "cpu")
`init_process_group`       torch's, called by verl with `cpu:gloo,<device>:<backend>`  -> on CPU that names
                           the cpu device twice, which torch refuses: the duplicate is dropped
`transformer_impl.`        the FSDP2 reference is built with `CPUOffloadPolicy(pin_memory=True)`  -> unpinned
`CPUOffloadPolicy`         (pinning needs a CUDA driver)
`VERL_ENGINE_DEVICE=cuda`  verl's FSDP engines are registered for cuda/npu only  -> the CUDA ones, which are
                           device-agnostic torch code, are looked up on CPU too (an env var verl reads)
`_ROLLOUT_REGISTRY`        `verl.workers.rollout.base`, read by `get_rollout_class`  -> the `hf` rollout's
                           in-worker class (`RolloutReplicaRegistry.register`, public, takes the replica)
`_server_handle` /         `RolloutReplica` attributes `LLMServerManager` reads  -> set by the `hf` replica's
`_server_address`          `launch_servers` (`set_replica_server`)

The post-import hook that registers our agent loop and trainer mode in every verl process is not
here: it must run inside `verl/__init__` without importing verl's packages, so it lives in the cheap
`seal/engines/verl/plugin.py` (it touches no verl name, only Python's import system).

`SEAL_ALLOW_VERL_VERSION=1` lets another verl version import this module (with a warning), for trying
an upgrade; every row above is then unverified.
"""

from __future__ import annotations

import logging
import os
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
from verl.workers.utils.padding import response_to_nested  # noqa: E402

from seal.core.record import EpisodeRecord, object_array  # noqa: E402
from seal.engines.verl.agent_loop import FEED_KEY  # noqa: E402
from seal.logging_utils import append_metrics, metrics_row, trim_metrics  # noqa: E402
from seal.run_dir import Checkpoints  # noqa: E402

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
    def checkpoint_loaded(self, step: int, folder: Path) -> None:
        """verl has resumed from `folder` (a `global_step_N` folder) at `step` > 0."""

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

    def _load_checkpoint(self) -> None:
        super()._load_checkpoint()
        if self.global_steps <= 0:
            return
        if self.config.trainer.resume_mode == "resume_path":
            folder = Path(os.path.realpath(str(self.config.trainer.resume_from_path)))
        else:
            folder = self.checkpoints.verl_step_dir(int(self.global_steps))
        self.checkpoint_loaded(int(self.global_steps), folder)


# --------------------------------------------------------------------------- the CPU path (exp/tiny_verl_cpu.yaml)
CPU_PLATFORM = "cpu"  # `CpuPlatform`'s name in verl's PlatformRegistry
CPU_ENV_VARS = {
    # verl registers its FSDP engines for devices "cuda"/"npu" only; the CUDA ones are device-agnostic
    # torch code and run on CPU tensors, so the engine lookup is pointed at them.
    "VERL_ENGINE_DEVICE": "cuda",
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
    """Let verl 0.9.1's GPU workers (FSDP2 actor/reference, process groups, Ray placement) run on CPU.

    Idempotent; called in every verl process of a CPU run by the plugin (`SEAL_VERL_DEVICE=cpu`), and by
    the CPU tests. Each patch and why:

    1. `verl.plugin.platform.PlatformRegistry`: a `cpu` platform (verl has cuda/npu/rocm only), set as the
       process's platform with `set_platform` (not through `VERL_PLATFORM`: verl resolves the platform
       while importing its packages, before a plugin could register one): device name "cpu", gloo, `torch.cpu` as
       the device module (+ the memory and RNG calls verl makes on it), current device "cpu" (verl
       passes the "device id" straight to `.to()`), Ray resource "GPU" (the run declares CPU-backed GPU
       slots to Ray, one per FSDP rank: verl's resource pools place workers by GPU bundles).
    2. `torch.distributed.init_process_group`: verl builds the backend string
       `cpu:gloo,<device>:<backend>`, which on CPU is `cpu:gloo,cpu:gloo` and torch refuses a device
       named twice; the duplicate is dropped.
    3. `verl.workers.engine.fsdp.transformer_impl.CPUOffloadPolicy`: the forward-only reference is
       built with `CPUOffloadPolicy(pin_memory=True)`; pinning needs a CUDA driver, so it is built unpinned.
    4. the `hf` rollout backend (`register_hf_rollout`).
    """
    global _cpu_patched
    if _cpu_patched:
        return
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy
    from verl.plugin.platform import PlatformBase, PlatformRegistry, set_platform
    from verl.workers.engine.fsdp import transformer_impl

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
            import contextlib

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
            return False

        def cudart(self) -> Any:
            return None

    real_init = dist.init_process_group
    if not getattr(real_init, "_seal_cpu", False):
        def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
            if isinstance(backend, str) and "," in backend:
                parts = list(dict.fromkeys(p.strip() for p in backend.split(",")))
                backend = ",".join(parts)
            return real_init(backend, *args, **kwargs)

        init_process_group._seal_cpu = True  # type: ignore[attr-defined]
        dist.init_process_group = init_process_group

    class UnpinnedCPUOffloadPolicy(CPUOffloadPolicy):
        def __init__(self, pin_memory: bool = False, **kwargs: Any):
            super().__init__(pin_memory=False, **kwargs)

    transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy
    for key, value in CPU_ENV_VARS.items():
        os.environ[key] = value
    # The platform is resolved once per process, possibly already (as CUDA) while verl was imported.
    set_platform(CpuPlatform())
    register_hf_rollout()
    _cpu_patched = True


def set_replica_server(replica: Any, handle: Any, address: str) -> None:
    """The server a `RolloutReplica` launched: verl's replica exposes it through read-only properties over
    `_server_handle` / `_server_address`, and `LLMServerManager` reads those private attributes directly;
    a new backend's `launch_servers` has to set them."""
    replica._server_handle = handle
    replica._server_address = address


def register_hf_rollout() -> None:
    """`actor_rollout_ref.rollout.name=hf` (seal.engines.verl.hf_rollout) in verl's two rollout registries:
    the replica through `RolloutReplicaRegistry.register` (public); the in-worker rollout class through
    `verl.workers.rollout.base._ROLLOUT_REGISTRY`, a module dict `get_rollout_class` reads, with no
    registration function in verl 0.9.1. Both are looked up by name when used: this may run while
    hf_rollout itself is being imported (a Ray actor of that module importing verl, hence our plugin)."""
    import importlib

    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from seal.engines.verl.config import CPU_ROLLOUT_ENGINE

    module = "seal.engines.verl.hf_rollout"
    RolloutReplicaRegistry.register(CPU_ROLLOUT_ENGINE, lambda: importlib.import_module(module).HFReplica)
    rollout_base._ROLLOUT_REGISTRY[(CPU_ROLLOUT_ENGINE, "async")] = f"{module}.HFServerAdapter"
