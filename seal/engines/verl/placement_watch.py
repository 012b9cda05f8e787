"""A bound on the run's Ray placement-group waits: an error naming the pending bundles, instead of a silent hang.

verl 0.9.1 reserves its resource pool (`RayResourcePool.get_placement_groups`: one bundle {CPU, GPU} per rank)
and TransferQueue 0.1.11 its storage units (`transfer_queue.utils.common.get_placement_group`: one {CPU: 1}
bundle per unit) with `ray.get(pg.ready())` and no timeout, inside the TaskRunner actor; the launcher waits on
that actor with `ray.get` and no timeout either. When Ray has fewer CPUs or GPUs than the bundles ask for, the
run waits forever and prints nothing (measured: a {CPU: 3} + {CPU: 1} group on a local Ray cluster of 2 CPUs was
still pending, silently, when the test's 90 s guard ended it).

`PlacementWatch` is a thread in the launcher's process, around verl's entry (`seal.engines.verl.launch.train`).
Once Ray is up in this process it reads Ray's placement-group table every `POLL_S` seconds (only Ray's public
API: `ray.util.placement_group_table`, `ray.cluster_resources`, `ray.available_resources`). A group of this run's
Ray job that stays pending (not yet placed) past the bound stops the run: the watch interrupts the launcher's
main thread (what Ctrl-C does: Ray's `ray.get` gives way to it) and raises `PlacementTimeout` in its place,
naming each pending group, its bundles and Ray's scheduling verdict, and what the cluster has in total and free.
The launcher's usual cleanup then runs (Ray's shutdown, the run's processes, /dev/shm).

The bound: `PLACEMENT_TIMEOUT_S`, or `SEAL_PLACEMENT_TIMEOUT_S` (seconds). On a cluster of the run's own a group
is placed within seconds or never (Ray places it as soon as the resources exist; nothing else runs there); on a
shared or autoscaling cluster the resources may come free or be provisioned later, so the default is a few
minutes and the knob is there to raise it.
"""

from __future__ import annotations

import _thread
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, Self

from seal.io_utils import seconds_from_env

log = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 300.0
PLACEMENT_TIMEOUT_ENV = "SEAL_PLACEMENT_TIMEOUT_S"
POLL_S = 2.0  # how often Ray's placement-group table is read (one GCS query)
# Ray's states of a group not placed yet, on which `pg.ready()` waits. Not RESCHEDULING: a placed group whose node
# died; nothing waits on its `ready()` any more, and the run fails on its dead actors (named by the launcher).
WAITING_STATES = ("PENDING", "PREPARED")
# The knobs that set what the run reserves and what Ray has, as the launcher's overrides spell them.
RESERVATION_KNOBS = ("verl.ray_kwargs.ray_init.num_cpus (Ray's logical CPUs on a cluster of the run's own)",
                     "trainer.n_gpus_per_node / trainer.nnodes (verl's resource pool: one bundle per GPU)",
                     "verl.transfer_queue.backend.SimpleStorage.num_data_storage_units (one CPU each)")


class PlacementTimeout(RuntimeError):
    """A placement group of the run stayed pending past the bound: Ray cannot (yet) give what the run reserves."""


def placement_timeout_s() -> float:
    """The bound in seconds: `SEAL_PLACEMENT_TIMEOUT_S` when set (a positive number), `PLACEMENT_TIMEOUT_S`
    otherwise."""
    return seconds_from_env(PLACEMENT_TIMEOUT_ENV, PLACEMENT_TIMEOUT_S, "placement")


def _job_groups(table: dict[str, dict], job_hex: str) -> dict[str, dict]:
    """The groups of Ray job `job_hex`. A placement group's ID is 14 unique bytes followed by the 4 bytes of the
    creating job's ID (Ray's `PlacementGroupID::Of`), also for groups an actor of the job creates (verl's and
    TransferQueue's, in the TaskRunner); on a shared cluster the other jobs' pending groups are not this run's."""
    return {pg_id: entry for pg_id, entry in table.items() if pg_id.endswith(job_hex)}


def _amount(value: float) -> str:
    return f"{value:g}"


def describe_group(entry: dict, waited_s: float) -> str:
    """One pending group: `name (strategy, Ray: state): N bundle(s) {CPU: 3, GPU: 1} x N, pending N s`."""
    bundles = [dict(b) for _, b in sorted((entry.get("bundles") or {}).items())]
    kinds: dict[str, int] = {}
    for bundle in bundles:
        text = "{" + ", ".join(f"{k}: {_amount(v)}" for k, v in sorted(bundle.items())) + "}"
        kinds[text] = kinds.get(text, 0) + 1
    shapes = " + ".join(f"{n} x {text}" for text, n in kinds.items())
    state = (entry.get("stats") or {}).get("scheduling_state") or entry.get("state")
    name = entry.get("name") or f"unnamed group {entry.get('placement_group_id', '?')[:12]}"
    return (f"{name} ({entry.get('strategy')}, Ray: {state}): {len(bundles)} bundle(s) {shapes}, "
            f"pending {waited_s:.0f} s")


def _needed(entries: list[dict]) -> dict[str, float]:
    total: dict[str, float] = {}
    for entry in entries:
        for bundle in (entry.get("bundles") or {}).values():
            for key, value in bundle.items():
                total[key] = total.get(key, 0.0) + float(value)
    return total


def describe_resources(entries: list[dict], cluster: dict[str, float], available: dict[str, float]) -> str:
    """What the pending groups ask for in total against what Ray has (total and free), CPU and GPU always
    named, and any other resource a bundle asks for."""
    needed = _needed(entries)
    keys = ["CPU", "GPU", *sorted(k for k in needed if k not in ("CPU", "GPU"))]
    return "; ".join(f"{key}: the pending groups ask {_amount(needed.get(key, 0.0))}, Ray has "
                     f"{_amount(cluster.get(key, 0.0))} ({_amount(available.get(key, 0.0))} free)" for key in keys)


def placement_error(pending: list[tuple[dict, float]], cluster: dict[str, float], available: dict[str, float],
                    bound_s: float) -> PlacementTimeout:
    """The error for groups pending past `bound_s`: each group, the resources against Ray's, the knobs."""
    groups = "; ".join(describe_group(entry, waited) for entry, waited in pending)
    return PlacementTimeout(
        f"Ray placed none of these placement groups within {bound_s:.0f} s (the bound, set by "
        f"{PLACEMENT_TIMEOUT_ENV}): {groups}. {describe_resources([e for e, _ in pending], cluster, available)}. "
        f"Give Ray more, or reserve less: {'; '.join(RESERVATION_KNOBS)}")


# The signal the interrupt simulates when SIGINT is not Python's to handle (see `PlacementWatch.__enter__`).
FALLBACK_SIGNAL = signal.SIGUSR2


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


class PlacementWatch:
    """The watch, as a context manager around verl's entry; see the module's docstring. `bound_s` (default: the
    knob) and `poll_s` are for the tests; `interrupt` is how the main thread is stopped (default: Ctrl-C's way).

    Ctrl-C's way is `_thread.interrupt_main()`, which runs Python's SIGINT handler in the main thread, and does
    nothing when SIGINT is not handled by Python. That is the case in every process started in the background by a
    shell without job control (`python launcher.py ... &` in a script, `nohup ... &`: the shell sets SIGINT to
    ignored, and Python keeps it so): measured, a watch in such a process logged its error and the run went on
    waiting in `ray.get` until killed. So where SIGINT is not Python's, the watch installs a handler of its own
    for `FALLBACK_SIGNAL` for the time of the block and interrupts the main thread with that (never sent by
    anyone: `interrupt_main` simulates it); SIGINT itself stays as the user's shell left it."""

    def __init__(self, bound_s: float | None = None, poll_s: float = POLL_S,
                 interrupt: Callable[[], None] | None = None) -> None:
        self.bound_s = placement_timeout_s() if bound_s is None else bound_s
        self.poll_s = poll_s
        self.interrupt = interrupt or self._interrupt_main
        self._signum = signal.SIGINT
        self._replaced: Any = None  # the fallback signal's handler before the block, when the watch set its own
        self.error: PlacementTimeout | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # no interrupt once `__exit__` has begun: the run has left verl's entry
        self._thread = threading.Thread(target=self._run, name="seal-placement-watch", daemon=True)
        self._pending_since: dict[str, float] = {}
        self._table_failed = False

    def _interrupt_main(self) -> None:
        _thread.interrupt_main(self._signum)

    def __enter__(self) -> Self:
        if self.interrupt == self._interrupt_main:
            if threading.current_thread() is not threading.main_thread():
                # The interrupt reaches the main thread only: from another one the wait past the bound would go on.
                raise RuntimeError("PlacementWatch stops the main thread's wait: enter it in the main thread")
            if not callable(signal.getsignal(signal.SIGINT)):  # ignored, or the OS default: not Python's
                self._signum = FALLBACK_SIGNAL
                self._replaced = signal.signal(FALLBACK_SIGNAL, _raise_keyboard_interrupt)
        self._thread.start()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        with self._lock:
            self._stop.set()
        self._thread.join(timeout=self.poll_s + 30)  # one GCS query at most is in flight
        if self._replaced is not None:
            signal.signal(FALLBACK_SIGNAL, self._replaced)
            self._replaced = None
        if self.error is not None:
            # The KeyboardInterrupt the watch caused (or whatever verl raised as it was stopped) is its effect.
            raise self.error from (None if isinstance(exc, KeyboardInterrupt) else exc)

    def _run(self) -> None:
        import ray

        while not self._stop.wait(self.poll_s):
            if not ray.is_initialized():
                continue  # verl's entry starts Ray in this process; until then nothing waits on a group
            try:
                error = self.check(time.monotonic())
            except Exception as exc:  # noqa: BLE001 - the watch only adds a bound; the run goes on without it
                if not self._table_failed:
                    log.warning("placement watch: cannot read Ray's placement-group table (%r); the run's "
                                "placement waits are unbounded", exc)
                self._table_failed = True
                continue
            if error is not None:
                with self._lock:
                    if self._stop.is_set():
                        return
                    self.error = error
                    log.error("%s", error)
                    self.interrupt()
                return

    def check(self, now: float) -> PlacementTimeout | None:
        """One look at Ray's table: the error when a group of this job has been pending past the bound."""
        import ray
        from ray.util import placement_group_table

        groups = _job_groups(placement_group_table(), ray.get_runtime_context().get_job_id())
        pending = {pg_id: entry for pg_id, entry in groups.items() if entry.get("state") in WAITING_STATES}
        self._pending_since = {pg_id: self._pending_since.get(pg_id, now) for pg_id in pending}
        late = [(pending[pg_id], now - since) for pg_id, since in self._pending_since.items()
                if now - since > self.bound_s]
        if not late:
            return None
        return placement_error(late, ray.cluster_resources(), ray.available_resources(), self.bound_s)
