"""Child servers: start one with its log, wait until it answers, stop it on exit; and ``python -m env_service``.

The one child-server starter and poller, used for the env service (the launcher, ``seal.evaluate``, the
benchmarks and the integration tests), for vLLM's OpenAI server (τ²'s ``vllm:`` policy and the vLLM tests),
through :func:`running_child` or :func:`start_child`. It lives here, in the lowest layer, because the env
service may import nothing of ``seal`` while every ``seal`` layer may import the env service (docs/layout.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TAIL_CHARS = 2000  # how much of a child's log a start-up error shows


class ServiceStartError(RuntimeError):
    """A child server died during start-up or never answered (the message ends with its log's tail)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The readiness polls reach the child servers this process started, on loopback, and may carry a key (τ²'s
# vLLM server's): never through a proxy from the environment, which would receive the key in clear. Every read of a
# loopback server this project started goes through it (the verl trainer's read of vLLM's counters too).
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def answers(url: str, headers: Mapping[str, str] | None = None, timeout: float = 2.0) -> bool:
    """True when ``GET <url>`` answers 200 (asked directly, never through a proxy)."""
    try:
        with DIRECT.open(urllib.request.Request(url, headers=dict(headers or {})), timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def healthy(url: str, timeout: float = 2.0) -> bool:
    """True when the env service at ``url`` answers ``GET /healthz`` with 200."""
    return answers(f"{url.rstrip('/')}/healthz", timeout=timeout)


class Child:
    """A child process started by :func:`start_child`: its ``proc``, its log, readiness and stopping."""

    def __init__(self, cmd: Sequence[str], *, name: str, log_path: Path | None = None,
                 env: Mapping[str, str] | None = None, cwd: Path | None = None, new_session: bool = False):
        self.name = name
        self.log_path = log_path
        self.new_session = new_session
        if log_path is not None:  # appended: an earlier run's lines stay, and the tail shows only this child's
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(log_path, "ab")  # noqa: SIM115 (open for the child's life: closed by stop())
        else:
            # append mode: the child shares this file's offset, so reading its tail must not move where it writes
            self._log = tempfile.TemporaryFile(mode="a+b")  # noqa: SIM115 (the same)
        self._log_start = self._log.tell()
        try:
            self.proc = subprocess.Popen(list(cmd), cwd=cwd, env=None if env is None else dict(env),
                                         stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                         start_new_session=new_session)
        except BaseException:
            self._log.close()
            raise

    def tail(self, chars: int = TAIL_CHARS) -> str:
        """The end of what this child wrote to its log."""
        self._log.flush()
        if self.log_path is not None:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                text = f.read()
        else:
            self._log.seek(self._log_start)
            text = self._log.read()
        return text.decode(errors="replace")[-chars:]

    def wait_ready(self, url: str, timeout: float, *, headers: Mapping[str, str] | None = None,
                   poll_s: float = 0.1) -> None:
        """Poll ``GET url`` until it answers 200; :class:`ServiceStartError` with the log's tail when the child
        exits first or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while not answers(url, headers, timeout=5.0):
            if self.proc.poll() is not None:
                raise ServiceStartError(f"{self.name} exited with code {self.proc.returncode} before it answered "
                                        f"at {url}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise ServiceStartError(f"{self.name} did not answer at {url} within {timeout:.0f} s:\n{self.tail()}")
            time.sleep(poll_s)

    def stop(self, grace_s: float) -> None:
        """Stop the child (its whole process group when started in a session of its own); close the log. A second
        call does nothing."""
        if self._log.closed:
            return
        try:
            stop_process(self.proc, grace_s, group=self.new_session)
        finally:
            self._log.close()


def start_child(cmd: Sequence[str], *, name: str, log_path: Path | None = None, env: Mapping[str, str] | None = None,
                cwd: Path | None = None, new_session: bool = False) -> Child:
    """Start ``cmd`` with stdout and stderr in ``log_path`` (appended; None: a temporary file). ``new_session``:
    in a process group of its own, stopped as a group (a server that starts workers of its own, like vLLM).
    The caller waits with :meth:`Child.wait_ready` and must :meth:`Child.stop` it; :func:`running_child` does
    both."""
    return Child(cmd, name=name, log_path=log_path, env=env, cwd=cwd, new_session=new_session)


@contextlib.contextmanager
def running_child(cmd: Sequence[str], ready_url: str, *, name: str, timeout: float, log_path: Path | None = None,
                  env: Mapping[str, str] | None = None, cwd: Path | None = None,
                  headers: Mapping[str, str] | None = None, new_session: bool = False, poll_s: float = 0.1,
                  grace_s: float = 15.0) -> Iterator[Child]:
    """Yield a started child once ``GET ready_url`` answers 200; always stopped on exit (SIGTERM, SIGKILL after
    ``grace_s``). A child that exits first, or does not answer within ``timeout`` s: :class:`ServiceStartError`
    with its log's tail."""
    child = start_child(cmd, name=name, log_path=log_path, env=env, cwd=cwd, new_session=new_session)
    try:
        child.wait_ready(ready_url, timeout, headers=headers, poll_s=poll_s)
        yield child
    finally:
        child.stop(grace_s)


@contextlib.contextmanager
def running_service(
    args: Sequence[str] = (),
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    log_path: Path | None = None,
    timeout: float = 120.0,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Yield ``(base_url, process)`` of an env service started with extra CLI ``args``; always stopped on exit.

    ``port`` None picks a free loopback port. Output goes to ``log_path`` (appended) or a temporary file whose
    tail is shown if the service dies or never answers (``ServiceStartError``).
    """
    port = port or free_port()
    url = f"http://{host}:{port}"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "env_service", "--host", host, "--port", str(port), *args]
    with running_child(cmd, f"{url}/healthz", name="env service", timeout=timeout, log_path=log_path, env=env,
                       cwd=REPO) as child:
        yield url, child.proc


def stop_process(proc: subprocess.Popen, grace_s: float, *, group: bool = False) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within `grace_s` seconds; always reaped. ``group``:
    signal its whole process group (a child started with ``start_new_session``), so its own children stop too."""

    def send(sig: int) -> None:
        try:
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except ProcessLookupError:
            pass  # already gone

    if proc.poll() is None or group:
        send(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait()
