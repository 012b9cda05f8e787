"""What the pre-flight reads from the node: one small function per probe, so that a test on a CPU machine
replaces exactly one of them (monkeypatch) and feeds the value it wants to check.

Every probe returns what it found or None when the thing does not exist here (no NVIDIA driver, no cgroup
limit, no config.json); a probe never invents a number. Byte counts are ints, CPU counts ints or floats.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

NVIDIA_SMI_TIMEOUT_S = 20.0  # a wedged driver can make nvidia-smi hang; the pre-flight then says so
HUB_TIMEOUT_S = 5.0
WRITE_PROBE_BYTES = 64 << 20  # written once, fsynced, deleted: enough to get past the page cache's first burst


def torch_cuda_build() -> str | None:
    """The CUDA version this torch was built for (`torch.version.cuda`, e.g. "13.0"); None for a CPU build."""
    import torch

    return torch.version.cuda


def _nvidia_smi(*args: str) -> str | None:
    """stdout of `nvidia-smi <args>`, or None when there is no nvidia-smi or it fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def driver_versions() -> tuple[str, str] | None:
    """(driver version, the newest CUDA version that driver supports), e.g. ("550.54.15", "12.4"); None without
    an NVIDIA driver. From NVML via nvidia-smi: its header line "CUDA Version: X.Y" is NVML's
    `nvmlSystemGetCudaDriverVersion`."""
    out = _nvidia_smi()
    driver = _nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader")
    if out is None or driver is None:
        return None
    cuda = next((line.split("CUDA Version:")[1].split()[0] for line in out.splitlines() if "CUDA Version:" in line),
                None)
    version = driver.strip().splitlines()[0].strip() if driver.strip() else None
    return (version, cuda) if version and cuda else None


def gpu_memory() -> list[tuple[int, int]] | None:
    """(total bytes, used bytes) of each GPU visible to this process (CUDA_VISIBLE_DEVICES applies), from
    nvidia-smi; None without an NVIDIA driver. Used memory is every process's, this one's included."""
    out = _nvidia_smi("--query-gpu=index,memory.total,memory.used", "--format=csv,noheader,nounits")
    if out is None:
        return None
    rows = {}
    for line in out.strip().splitlines():
        index, total, used = (field.strip() for field in line.split(","))
        rows[index] = (int(total) << 20, int(used) << 20)  # MiB
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(rows.values())
    return [rows[i.strip()] for i in visible.split(",") if i.strip() in rows]


def ray_node_cpus() -> int:
    """The logical CPUs Ray gives this node when `ray.init` is not told (Ray's own count: the container's cgroup
    quota and cpuset where there is one, else the machine's CPUs; not the process's affinity)."""
    from ray._private.utils import get_num_cpus

    return int(get_num_cpus())


def affinity_cpus() -> int:
    """The cores this process may run on (`os.sched_getaffinity`: taskset, a SLURM slice)."""
    return len(os.sched_getaffinity(0))


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """The CPU quota of this container in cores (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us / cpu.cfs_period_us`);
    None when unlimited or not in a cgroup."""
    v2 = Path(root) / "cpu.max"
    if v2.is_file():
        quota, _, period = v2.read_text().strip().partition(" ")
        return None if quota == "max" else int(quota) / int(period or 100000)
    v1 = Path(root) / "cpu" / "cpu.cfs_quota_us"
    if v1.is_file():
        quota_us = int(v1.read_text().strip())
        period_us = int((v1.parent / "cpu.cfs_period_us").read_text().strip())
        return None if quota_us <= 0 else quota_us / period_us
    return None


def existing_parent(path: str | os.PathLike[str]) -> Path:
    """`path`, or its nearest ancestor that exists (where a run directory not created yet will live)."""
    p = Path(path).absolute()
    while not p.exists():
        p = p.parent
    return p


def disk_free(path: str | os.PathLike[str]) -> int:
    """Free bytes (for an unprivileged user) on the filesystem that holds `path` or would hold it."""
    return shutil.disk_usage(existing_parent(path)).free


def disk_write_speed(path: str | os.PathLike[str]) -> float:
    """Sequential write speed in bytes/s where `path` would live: `WRITE_PROBE_BYTES` written in 8 MiB blocks,
    fsynced, timed, then deleted (the only file the pre-flight writes, and it does not outlive the probe)."""
    import tempfile

    block = os.urandom(8 << 20)
    fd, name = tempfile.mkstemp(prefix=".seal_preflight_", dir=existing_parent(path))
    try:
        start = time.perf_counter()
        for _ in range(WRITE_PROBE_BYTES // len(block)):
            os.write(fd, block)
        os.fsync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(name)
    return WRITE_PROBE_BYTES / max(elapsed, 1e-9)


def host_memory(root: str = "/sys/fs/cgroup") -> tuple[int, int]:
    """(bytes available now, the memory limit): MemAvailable and MemTotal of /proc/meminfo, each capped by the
    cgroup's limit (v2 `memory.max`, v1 `memory.limit_in_bytes`) and, for what is available, its usage."""
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        info[key] = int(rest.split()[0]) * 1024
    total, available = info["MemTotal"], info["MemAvailable"]
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        limit_path = Path(root) / limit_file
        if limit_path.is_file():
            text = limit_path.read_text().strip()
            if text != "max" and int(text) < total:
                usage = int((Path(root) / usage_file).read_text().strip())
                total, available = int(text), min(available, int(text) - usage)
            break
    return available, total


def shm_size(path: str = "/dev/shm") -> tuple[int, int] | None:
    """(size, free) of /dev/shm in bytes; None when it is not mounted."""
    if not os.path.isdir(path):
        return None
    usage = shutil.disk_usage(path)
    return usage.total, usage.free


def model_config(path: str) -> dict[str, Any] | None:
    """The model's config.json as a dict, read offline: from `path` when it is a local folder, else from the
    Hugging Face cache (`huggingface_hub.try_to_load_from_cache`); None when neither has it."""
    local = Path(path) / "config.json"
    if local.is_file():
        return json.loads(local.read_text(encoding="utf-8"))
    if Path(path).exists():
        return None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id=path, filename="config.json")
    if isinstance(cached, str) and os.path.isfile(cached):
        return json.loads(Path(cached).read_text(encoding="utf-8"))
    return None


def model_weights_cached(path: str) -> bool:
    """Whether the model's weights are on this machine: a local folder with *.safetensors / *.bin files, or a hub
    id whose cache snapshot holds them (`huggingface_hub.scan_cache_dir` is slow on big caches; the snapshot
    folder next to config.json is read instead)."""
    folder = Path(path)
    if not folder.exists():
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(repo_id=path, filename="config.json")
        if not isinstance(cached, str):
            return False
        folder = Path(cached).parent
    return any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))


def hub_reachable(endpoint: str | None = None) -> bool:
    """Whether the Hugging Face hub answers (HEAD of its API, `HUB_TIMEOUT_S`); False with HF_HUB_OFFLINE set."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        return False
    import httpx

    url = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/") + "/api/models"
    try:
        return httpx.head(url, timeout=HUB_TIMEOUT_S).status_code < 500
    except httpx.HTTPError:
        return False
