"""What the processes a test started do: which TCP ports they listen on, and which /dev/shm segments they leave.

``ListenerWatch(marker, env_key)`` samples, every `interval` seconds while its block runs, the listening TCP
sockets of the live processes whose environment has `env_key` = `marker` (a value only the run's processes
inherit, such as the run's ``BFCL_PROJECT_ROOT``). After the block, ``listeners`` holds every
``(address, port, process name)`` seen and ``exposed`` those bound to an address that is not loopback
(``0.0.0.0`` and ``::`` included).

``SegmentWatch`` samples the /dev/shm names that the test's processes map, hold open or name as their creator,
and ``shm_leftovers`` says which of those the test left behind. Ownership is sampled, not inferred from who maps
a segment at the end: the other xdist worker creates segments of its own all the time, and one that nobody maps
for a while (vLLM's queues between a SIGKILL and the cleanup, or a segment Python's resource tracker unlinks only
when its owner's interpreter exits) looks, at the end, exactly like a leak (measured: CI failed a verl launch on a
`psm_` segment that no process of the run had ever held and that was gone by the end of the tier).
"""

from __future__ import annotations

import ipaddress
import os
import time

import psutil

from seal.engines.verl.cleanup import RunSampler, RunSegments, mapped_shm_names, run_processes, shm_segments


def marked_pids(marker: str, env_key: str) -> set[int]:
    """Pids of the live processes whose environment has `env_key` = `marker` (the engine's own reading,
    `seal.engines.verl.cleanup.run_processes`)."""
    return {proc.pid for proc in run_processes(marker, env_key)}


def is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return (mapped or ip).is_loopback


def listeners(pids: set[int]) -> set[tuple[str, int, str]]:
    """``(address, port, process name)`` of the listening TCP sockets of `pids`."""
    out = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            try:
                name = psutil.Process(conn.pid).name()
            except psutil.Error:
                name = "?"
            out.add((conn.laddr.ip, conn.laddr.port, name))
    return out


class ListenerWatch(RunSampler):
    """The run's listening sockets, sampled while the block runs (the engine's `RunSampler`), and the pids of the
    run's processes seen meanwhile."""

    def __init__(self, marker: str, env_key: str, interval: float = 1.0) -> None:
        super().__init__(marker, interval, env_key)
        self.listeners: set[tuple[str, int, str]] = set()
        self.pids: set[int] = set()

    @property
    def exposed(self) -> set[tuple[str, int, str]]:
        return {entry for entry in self.listeners if not is_loopback(entry[0])}

    def sample(self) -> None:
        pids = marked_pids(self.marker, self.env_key)
        self.pids |= pids
        self.listeners |= listeners(pids)


class SegmentWatch(RunSegments):
    """The /dev/shm names of the test's own processes, sampled every `interval` seconds while the block runs
    (the engine's `RunSegments`: mapped, held open, or naming one of them as creator). The test's processes are
    this one and its descendants (an in-process vLLM engine and its engine core, a child script), and, given a
    `marker`, every live process whose environment has `env_key` = `marker` (a launch's Ray processes, which
    outlive their parents). A segment made and abandoned between two samples is missed: the check is weaker
    for it, never wrong."""

    def __init__(self, marker: str | None = None, env_key: str = "BFCL_PROJECT_ROOT", interval: float = 1.0) -> None:
        super().__init__(marker or "", interval, env_key)

    def processes(self) -> list[psutil.Process]:
        me = psutil.Process()
        try:
            procs = {p.pid: p for p in [me, *me.children(recursive=True)]}
        except psutil.Error:
            procs = {me.pid: me}
        if self.marker:
            procs.update((p.pid, p) for p in super().processes())
        return list(procs.values())


def shm_leftovers(before: set[str], owned: set[str], settle_s: float = 30.0) -> set[str]:
    """The /dev/shm segments a test left: of `owned` (its `SegmentWatch.seen`), those new since `before`, mapped
    or held open by no process but this one (its engines' processes are gone by now, and this process must have
    let go too), and still there after up to `settle_s` seconds (an owner may still be exiting). Returns the
    empty set, or what persisted. New segments it does not own are printed, never counted."""

    def unmapped() -> set[str]:
        return (shm_segments() - set(before)) - mapped_shm_names(exclude_pid=os.getpid())

    first = unmapped()
    if first - set(owned):
        print("new /dev/shm segments held by no process and not the test's:", sorted(first - set(owned)))
    first &= set(owned)
    deadline = time.monotonic() + settle_s
    while first and time.monotonic() < deadline:
        time.sleep(1)
        first &= unmapped()
    return first
