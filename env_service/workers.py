"""Worker processes that run BFCL code under the cost budget: deadlines and memory limits for unaudited tools.

The service process only speaks HTTP. Every episode lives in one worker process (pinned at create, round robin),
and every operation on it (create, step, evaluate, delete) is one request to that worker over a socket pair.
While a worker computes, the service keeps answering (health checks included) and watches it:

* **time**: an action that has not answered within ``Budget.wall_s`` gets its worker killed;
* **memory**: the service polls the worker's RSS while an action runs longer than ``POLL_S``, and kills the
  worker once the action has added more than ``Budget.memory_mb``; the worker checks the growth of each action
  and the total held by each episode after the action; an address-space limit (``RLIMIT_AS``) turns a single
  huge allocation into a ``MemoryError`` inside the worker.

A killed worker is replaced by a fresh fork, and every other episode that lived in it is rebuilt by replaying
its recorded messages (BFCL's tools are deterministic given the task's seeds), so no other episode loses
anything but a few milliseconds. The episode at fault is rebuilt up to the action before the breach and ended
with ``budget_exceeded`` (``Episode.end_over_budget``); its evaluation is a failure.

Requests to one worker are serialized (a lock per worker), which keeps each step atomic, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import resource
import signal
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from env_service.budget import BudgetExceeded
from env_service.config import EpisodeConfig, StepLimit
from env_service.episode import Episode, EpisodeStateError
from env_service.grading import over_budget_result
from env_service.rules import DEFAULT_RULES
from env_service.tasks import Task

log = logging.getLogger("env_service")
_HEADER = struct.Struct("!Q")
POLL_S = 0.05  # how often a running action's worker is checked for memory growth
MB = 1 << 20


def rss_of(pid: int) -> int:
    """Resident set size of a process in bytes (0 if it is gone: a worker that died is restarted, not measured)."""
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


@dataclass
class Handle:
    """The service's record of one episode: enough to rebuild it in a fresh worker."""

    id: str
    worker: int
    task_id: str
    mode: str
    interface: Any
    step_limit: StepLimit | None
    rules: str = DEFAULT_RULES  # its rules profile (env_service.rules)
    contents: list[str] = field(default_factory=list)  # the messages it accepted, in order
    over_budget: tuple[str, str] | None = None  # (limit, detail) of the action that ended it
    last_access: float = field(default_factory=time.monotonic)
    evaluated: bool = False

    def build(self, tasks: dict[str, Task], config: EpisodeConfig) -> Episode:
        """A fresh episode as this handle describes it (at creation, and when a worker is rebuilt)."""
        return Episode(self.id, tasks[self.task_id], self.mode, self.interface, config, self.step_limit, self.rules)


class WorkerLost(Exception):
    """The worker broke the budget (or died) while running an action."""

    def __init__(self, limit: str, detail: str) -> None:
        super().__init__(detail)
        self.limit, self.detail = limit, detail


# --- the worker side -------------------------------------------------------------------------------


def _send(sock: socket.socket, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv(sock: socket.socket) -> Any:
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    data = _recv_exact(sock, _HEADER.unpack(header)[0])
    return None if data is None else pickle.loads(data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class _WorkerState:
    def __init__(self, tasks: dict[str, Task], config: EpisodeConfig) -> None:
        self.tasks, self.config = tasks, config
        self.episodes: dict[str, Episode] = {}
        self.held: dict[str, int] = {}  # bytes of RSS growth attributed to each episode's actions
        self.pid = os.getpid()

    def build(self, h: Handle) -> Episode:
        episode = h.build(self.tasks, self.config)
        self.episodes[h.id] = episode
        self.held[h.id] = 0
        return episode

    def handle(self, op: str, payload: Any) -> Any:
        if op == "create":
            episode = self.build(payload)
            return episode.initial_messages(), episode.presented_tools()
        if op == "replay":  # rebuild after a worker restart: same messages, same state
            h: Handle = payload
            episode = self.build(h)
            for content in h.contents:
                episode.step(content)
            if h.over_budget is not None:
                episode.end_over_budget(BudgetExceeded(*h.over_budget))
            return None
        if op == "drop":
            self.episodes.pop(payload, None)
            self.held.pop(payload, None)
            return None
        episode_id, arg = payload
        episode = self.episodes[episode_id]
        if op in ("step", "evaluate"):
            return self.metered(episode, op, arg)
        if op == "end":  # an action of this episode broke the budget in a worker that was then killed
            return episode.end_over_budget(BudgetExceeded(*arg))
        if op == "grade_failed":  # grading broke the budget in a worker that was then killed
            return self.grade_failed(episode, arg[1])
        raise ValueError(f"unknown worker op {op!r}")

    def grade_failed(self, episode: Episode, detail: str) -> dict[str, Any]:
        episode.done = True
        if episode.result is None:
            episode.result = {
                **over_budget_result(episode.task, episode.turns, episode.completed, detail),
                "grade_ms": 0.0,
                "end_reason": episode.end_reason or "evaluated_early",
                "steps": episode.steps_total,
            }
            episode.executor = None
        return episode.result

    def metered(self, episode: Episode, op: str, arg: Any) -> tuple[str, Any]:
        """Run one action; a step's RSS growth counts against the action's and the episode's memory budget.
        Returns ("ok", reply) or ("over", (reply, (limit, detail))) when the step ended the episode."""
        budget = self.config.budget
        detail = f"the action needed more than the {budget.memory_mb} MB of memory allowed to an episode."
        before = rss_of(self.pid)
        try:
            reply = episode.step(arg) if op == "step" else episode.evaluate()
        except MemoryError:  # RLIMIT_AS: a single allocation too large for this worker
            if op == "evaluate":
                return ("ok", self.grade_failed(episode, detail))
            return ("over", (episode.end_over_budget(BudgetExceeded("memory", detail)), ("memory", detail)))
        if op == "evaluate":
            return ("ok", reply)
        grown = max(0, rss_of(self.pid) - before)
        self.held[episode.id] = self.held.get(episode.id, 0) + grown
        if max(grown, self.held[episode.id]) > budget.memory_mb * MB and episode.over_budget is None:
            return ("over", (episode.end_over_budget(BudgetExceeded("memory", detail)), ("memory", detail)))
        if episode.over_budget is not None:  # refused inside the episode (guard, reply size, calls)
            return ("over", (reply, episode.over_budget))
        return ("ok", reply)


def _serve(sock: socket.socket, tasks: dict[str, Task], config: EpisodeConfig) -> None:
    state = _WorkerState(tasks, config)
    while True:
        message = _recv(sock)
        if message is None:  # the service closed its end: exit with it
            return
        op, payload = message
        try:
            reply = ("ok", state.handle(op, payload))
        except EpisodeStateError as exc:
            reply = ("state", str(exc))
        except BudgetExceeded as exc:
            reply = ("budget", (exc.limit, exc.detail))
        except MemoryError:
            reply = ("budget", ("memory", "the action ran out of the memory allowed to one action."))
        except Exception as exc:  # a bug of ours: the request fails with a 500, the worker keeps serving
            reply = ("error", f"{type(exc).__name__}: {str(exc)[:300]}")
        _send(sock, (reply, rss_of(state.pid)))


def _child(sock: socket.socket, tasks: dict[str, Task], config: EpisodeConfig, address_space: int) -> None:
    # Forked from the service (maybe while it serves): drop its signal handlers and every inherited descriptor
    # (listening socket, client connections) so that the worker can never hold a connection open.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)
    keep = sock.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)
    if address_space:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    code = 0
    try:
        _serve(sock, tasks, config)
    except BaseException:
        code = 1
    os._exit(code)


# --- the service side ------------------------------------------------------------------------------


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


class _Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.pid = 0
        self.sock: socket.socket | None = None
        self.lock = asyncio.Lock()
        self.rss = 0  # as last reported


class WorkerPool:
    """Episodes pinned to worker processes; every call is ``await``-ed under the budget."""

    def __init__(self, size: int, tasks: dict[str, Task], config: EpisodeConfig) -> None:
        self.tasks, self.config, self.budget = tasks, config, config.budget
        self.workers = [_Worker(i) for i in range(size)]
        self.handles: dict[str, Handle] = {}
        self._next = itertools.cycle(range(size))
        self.restarts = 0
        self.refused = 0  # actions over budget
        for worker in self.workers:
            self._spawn(worker)

    # -- processes
    def _address_space(self) -> int:
        # The service's own address space plus room for the episodes of one worker and one action's budget.
        vms = psutil.Process().memory_info().vms
        return vms + 4 * self.budget.memory_mb * MB + (1 << 30)

    def _spawn(self, worker: _Worker) -> None:
        parent, child = socket.socketpair()
        limit = self._address_space()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            parent.close()
            _child(child, self.tasks, self.config, limit)
        child.close()
        parent.setblocking(False)
        worker.pid, worker.sock = pid, parent
        worker.rss = rss_of(pid)

    def _kill(self, worker: _Worker) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGKILL)
        # Reaped on a thread: the kernel may take a second to free a worker that grabbed gigabytes, and the
        # event loop (health checks) must not wait for it.
        threading.Thread(target=_reap, args=(worker.pid,), daemon=True).start()
        if worker.sock is not None:
            worker.sock.close()
            worker.sock = None

    def close(self) -> None:
        for worker in self.workers:
            self._kill(worker)

    def rss_total(self) -> int:
        return sum(rss_of(w.pid) for w in self.workers)

    # -- one request
    async def _io(self, worker: _Worker, op: str, payload: Any) -> Any:
        loop = asyncio.get_running_loop()
        data = pickle.dumps((op, payload), protocol=pickle.HIGHEST_PROTOCOL)
        await loop.sock_sendall(worker.sock, _HEADER.pack(len(data)) + data)
        header = await self._read(loop, worker, _HEADER.size)
        reply, rss = pickle.loads(await self._read(loop, worker, _HEADER.unpack(header)[0]))
        worker.rss = rss
        return reply

    @staticmethod
    async def _read(loop, worker: _Worker, n: int) -> bytes:
        buffer = bytearray(n)
        view, got = memoryview(buffer), 0
        while got < n:
            k = await loop.sock_recv_into(worker.sock, view[got:])
            if not k:
                raise WorkerLost("time", "the worker died")
            got += k
        return bytes(buffer)

    async def _guarded(self, worker: _Worker, op: str, payload: Any) -> Any:
        """One request under the deadline and the memory watch; ``WorkerLost`` if the worker broke either."""
        started, base = time.monotonic(), worker.rss
        task = asyncio.ensure_future(self._io(worker, op, payload))
        limit = self.budget.memory_mb * MB
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=POLL_S)
                if done:
                    return task.result()
                if time.monotonic() - started > self.budget.wall_s:
                    raise WorkerLost("time", f"the action ran longer than {self.budget.wall_s:g} s.")
                if rss_of(worker.pid) - base > limit:
                    raise WorkerLost("memory", f"the action needed more than {self.budget.memory_mb} MB of memory.")
        except WorkerLost:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise

    async def _request(self, handle: Handle, op: str, payload: Any) -> tuple[str, Any]:
        worker = self.workers[handle.worker]
        async with worker.lock:
            try:
                return await self._guarded(worker, op, payload)
            except (WorkerLost, OSError, EOFError, pickle.UnpicklingError) as exc:
                lost = exc if isinstance(exc, WorkerLost) else WorkerLost("time", f"the worker died ({exc}).")
                await self._restart(worker, culprit=handle, breach=(lost.limit, lost.detail))
                return ("lost", (lost.limit, lost.detail))

    async def _restart(self, worker: _Worker, culprit: Handle, breach: tuple[str, str]) -> None:
        """Replace a broken worker; rebuild every episode that lived in it (the culprit ends over budget)."""
        self.restarts += 1
        log.warning("env_service: worker %d restarted (%s: %s)", worker.index, *breach)
        self._kill(worker)
        self._spawn(worker)
        culprit.over_budget = breach
        for h in [h for h in self.handles.values() if h.worker == worker.index]:
            try:
                reply = await self._guarded(worker, "replay", h)
            except WorkerLost as exc:  # a replay over budget: that episode ends too (rare: it passed before)
                self._kill(worker)
                self._spawn(worker)
                h.over_budget = (exc.limit, exc.detail)
                reply = await self._guarded(worker, "replay", Handle(**{**h.__dict__, "contents": []}))
            if reply[0] != "ok":
                log.error("env_service: replay of episode %s failed: %s", h.id, reply)

    # -- the episode operations of the HTTP routes
    async def create(self, handle: Handle) -> tuple[list[dict], list[dict]]:
        handle.worker = next(self._next)
        self.handles[handle.id] = handle
        status, value = await self._request(handle, "create", handle)
        if status != "ok":
            self.handles.pop(handle.id, None)
            raise RuntimeError(f"episode creation failed in its worker: {value}")
        return value

    async def step(self, handle: Handle, content: str) -> dict[str, Any]:
        status, value = await self._request(handle, "step", (handle.id, content))
        if status == "ok":
            kind, reply = value
            if kind == "ok":
                handle.contents.append(content)
                return reply
            self.refused += 1  # ended inside the worker: a guard, the reply size, the call count or memory
            reply, handle.over_budget = reply
            return reply
        if status in ("lost", "budget"):  # "lost": killed and rebuilt; the replay ended the episode already
            self.refused += 1
            handle.over_budget = value
            status, reply = await self._request(handle, "end", (handle.id, value))
            if status == "ok":
                return reply
        if status == "state":
            raise EpisodeStateError(value)
        raise RuntimeError(f"step failed in its worker: {value}")

    async def evaluate(self, handle: Handle) -> dict[str, Any]:
        status, value = await self._request(handle, "evaluate", (handle.id, None))
        if status == "ok":
            return value[1]
        if status in ("lost", "budget"):  # grading broke the budget: a failure, the calls are not replayed again
            self.refused += 1
            status, value = await self._request(handle, "grade_failed", (handle.id, value))
            if status == "ok":
                return value
        raise RuntimeError(f"evaluate failed in its worker: {value}")

    async def drop(self, handle: Handle) -> None:
        self.handles.pop(handle.id, None)
        await self._request(handle, "drop", handle.id)


class InProcessPool:
    """``--workers 0``: episodes in the service's own process (debugging). Only the guards, the reply size and
    the call count hold; a slow or huge tool call stalls the service."""

    def __init__(self, tasks: dict[str, Task], config: EpisodeConfig) -> None:
        self.tasks, self.config = tasks, config
        self.handles: dict[str, Handle] = {}
        self.episodes: dict[str, Episode] = {}
        self.restarts = 0
        self.refused = 0

    def close(self) -> None:
        self.episodes.clear()

    def rss_total(self) -> int:
        return 0

    async def create(self, handle: Handle) -> tuple[list[dict], list[dict]]:
        episode = handle.build(self.tasks, self.config)
        self.handles[handle.id], self.episodes[handle.id] = handle, episode
        return episode.initial_messages(), episode.presented_tools()

    async def step(self, handle: Handle, content: str) -> dict[str, Any]:
        episode = self.episodes[handle.id]
        reply = episode.step(content)
        if episode.over_budget is not None and handle.over_budget is None:
            self.refused += 1
            handle.over_budget = episode.over_budget
        return reply

    async def evaluate(self, handle: Handle) -> dict[str, Any]:
        return self.episodes[handle.id].evaluate()

    async def drop(self, handle: Handle) -> None:
        self.handles.pop(handle.id, None)
        self.episodes.pop(handle.id, None)
