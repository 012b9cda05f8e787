"""A run's end on one node: every process the run started is gone, and so is every /dev/shm segment it left.

Why this exists: `ray.shutdown()` returns before Ray's workers have exited (it signals them and leaves), and
vLLM's engine process notices its parent's death on its own, seconds later. A launcher that returned then
would leave processes of the run alive behind it (a test that looked at once saw a `ray::TaskRunnerV1`).
And Ray ends its workers with SIGKILL, so vLLM's shared-memory queues and verl's weight buckets, unlinked by
their owners on a clean exit only, stay in /dev/shm.

So the run carries a marker: `mark_run()` puts a unique value in this process's environment before Ray
starts, and every process Ray starts (its services, workers, the vLLM servers and their engine processes)
inherits it. During the run, `RunSegments` notes every /dev/shm name a process of the run maps or holds open
(sampled every few seconds). At the end, `reap_run_processes()` waits a bounded time for those processes to
exit, then kills what is left and logs it; `remove_orphaned_shm()` unlinks the run's segments that nobody maps
any more. Only the run's: a segment another program made during the run is never touched, even when nobody
maps it at that moment (measured: without the ownership rule a run's cleanup unlinked the loky semaphores of
another program's vLLM server that was shutting down). Everything is read through psutil.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Self

import psutil

log = logging.getLogger(__name__)

RUN_MARKER_ENV = "SEAL_RUN_MARKER"
REAP_WAIT_S = 60.0  # how long the run's processes get to exit on their own after Ray's shutdown
SHM_DIR = Path("/dev/shm")
SHM_SETTLE_S = 30.0  # how long the cleanup waits for the run's last processes to let go of their segments
SHM_SAMPLE_S = 5.0  # how often the run's processes' segments are noted (vLLM's and verl's live for minutes)


def mark_run() -> str:
    """Give this process (and so every process it starts from now on) a marker unique to this run."""
    marker = f"{os.getpid()}-{uuid.uuid4().hex}"
    os.environ[RUN_MARKER_ENV] = marker
    return marker


def run_processes(marker: str, env_key: str = RUN_MARKER_ENV) -> list[psutil.Process]:
    """Live processes whose environment has `env_key` = `marker` (this process excepted: the environment psutil
    reads for it is the one it started with, but it is excluded anyway). Processes we may not read are not
    ours."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(env_key) == marker and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def reap_run_processes(marker: str, wait_s: float = REAP_WAIT_S, env_key: str = RUN_MARKER_ENV) -> list[str]:
    """Wait up to `wait_s` for the run's processes to exit, then SIGKILL those left and wait for them to go.
    Returns the command lines of the processes that had to be killed (logged as a warning)."""
    deadline = time.monotonic() + wait_s
    left = run_processes(marker, env_key)
    while left and time.monotonic() < deadline:
        psutil.wait_procs(left, timeout=min(1.0, max(0.0, deadline - time.monotonic())))
        left = run_processes(marker, env_key)
    killed = []
    for proc in left:
        try:
            killed.append(" ".join(proc.cmdline())[:200] or proc.name())
            proc.kill()
        except (psutil.Error, OSError):
            continue
    if left:
        psutil.wait_procs(left, timeout=10)
        log.warning("killed %d process(es) of the run still alive %.0f s after its end: %s",
                    len(killed), wait_s, killed)
    stubborn = run_processes(marker, env_key)
    if stubborn:  # SIGKILL did not end them within 10 s (uninterruptible I/O): say so, never pretend
        log.error("processes of the run survived SIGKILL: %s", [p.pid for p in stubborn])
    return killed


def shm_segments() -> set[str]:
    """Names in /dev/shm now (empty where there is none)."""
    try:
        return set(os.listdir(SHM_DIR))
    except OSError:
        return set()


def _shm_names_of(proc: psutil.Process) -> set[str]:
    """/dev/shm names `proc` maps or holds open (empty if it ended or is not ours to read).

    The mappings come from /proc/<pid>/maps, not psutil's `memory_maps`: that reads smaps, where the kernel walks
    the page tables of every mapping; over a verl run's ~20 processes (vLLM workers and FSDP ranks at GBs each) one
    sample took 1.0 s of CPU (measured on 2 cores), a sample every 5 s took a fifth of a core for the whole run, and
    the walk holds each process's memory-map lock while it runs. maps is the list alone: 0.04 s for the same sample."""
    prefix = str(SHM_DIR) + "/"
    try:
        with open(f"/proc/{proc.pid}/maps", encoding="utf-8", errors="replace") as maps:
            # a line: address perms offset dev inode path, the path maybe followed by " (deleted)"
            paths = [line[line.index(prefix):] for line in maps if prefix in line]
        paths += [f.path for f in proc.open_files()]
    except (psutil.Error, OSError):
        return set()
    return {p[len(prefix):].split()[0] for p in paths if p.startswith(prefix)}


def mapped_shm_names(exclude_pid: int | None = None) -> set[str]:
    """/dev/shm names some live process (other than `exclude_pid`) maps or holds open."""
    names: set[str] = set()
    for proc in psutil.process_iter():
        if proc.pid != exclude_pid:
            names |= _shm_names_of(proc)
    return names


class RunSampler:
    """Calls `sample()` every `interval_s` seconds on a daemon thread while the context is open, and once more
    at its end: a reading of the run's processes (those whose environment has `env_key` = `marker`) that must
    cover the whole run, not only its end. Subclasses define `sample`."""

    def __init__(self, marker: str, interval_s: float, env_key: str = RUN_MARKER_ENV) -> None:
        self.marker, self.interval_s, self.env_key = marker, interval_s, env_key
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def processes(self) -> list[psutil.Process]:
        return run_processes(self.marker, env_key=self.env_key)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def named_by(pids: set[int]) -> set[str]:
    """/dev/shm names that carry one of `pids` as a `-<pid>-` field: the named semaphores of loky (joblib's process
    pool), `sem.loky-<pid>-<random>`, name their creator. Such a semaphore need not stay mapped by anyone: vLLM's
    `EngineCore` processes made them and none of the run's processes mapped them (measured), so the mapping rule
    alone never claims them, and Ray's SIGKILL leaves them behind."""
    found = set()
    for name in shm_segments():
        if any(int(field) in pids for field in _PID_FIELD.findall(name)):
            found.add(name)
    return found


_PID_FIELD = re.compile(r"(?<=-)(\d+)(?=-)")


class RunSegments(RunSampler):
    """The /dev/shm names the run's processes have mapped or held open, or that name one of them as their creator
    (`named_by`), sampled while the context is open (`RunSampler`). A segment created and orphaned between two
    samples is missed (left in /dev/shm, never wrongly removed)."""

    def __init__(self, marker: str, interval_s: float = SHM_SAMPLE_S, env_key: str = RUN_MARKER_ENV) -> None:
        super().__init__(marker, interval_s, env_key)
        self.seen: set[str] = set()

    def sample(self) -> None:
        procs = self.processes()
        for proc in procs:
            self.seen |= _shm_names_of(proc)
        self.seen |= named_by({proc.pid for proc in procs})


def remove_orphaned_shm(owned: set[str], settle_s: float = SHM_SETTLE_S) -> list[str]:
    """Unlink the segments of `owned` (the run's: `RunSegments.seen` less what existed before the run) that are
    still in /dev/shm and that no live process maps or holds open; returns their names. Segments still mapped
    are looked at again, once a second, for up to `settle_s` (the run's last processes may still be exiting).
    A segment in use past that is never touched, nor one outside `owned`."""
    deadline = time.monotonic() + settle_s
    removed: list[str] = []
    while True:
        candidates = shm_segments() & set(owned)
        in_use = mapped_shm_names() & candidates
        for name in sorted(candidates - in_use):
            try:
                (SHM_DIR / name).unlink()
                removed.append(name)
            except OSError:
                continue
        if not in_use or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    if removed:
        log.info("removed %d shared-memory segments left by the run's killed processes: %s", len(removed), removed)
    return removed
