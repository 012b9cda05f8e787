"""Which TCP ports a run's processes listen on, and whether any is open beyond loopback.

``ListenerWatch(marker, env_key)`` samples, every `interval` seconds while its block runs, the listening TCP
sockets of the live processes whose environment has `env_key` = `marker` (a value only the run's processes
inherit, such as the run's ``BFCL_PROJECT_ROOT``). After the block, ``listeners`` holds every
``(address, port, process name)`` seen and ``exposed`` those bound to an address that is not loopback
(``0.0.0.0`` and ``::`` included).
"""

from __future__ import annotations

import ipaddress

import psutil

from seal.engines.verl.cleanup import RunSampler, run_processes


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
