"""Run ``python -m env_service`` as a child process and wait until it answers.

The one definition used by the launcher, ``seal.evaluate``, the benchmarks and the integration tests.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BFCL_ROOT_ENV = "BFCL_PROJECT_ROOT"


def bfcl_project_root() -> Path:
    """Where ``bfcl_eval`` writes its ``result/``, ``score/`` and ``.file_locks/`` folders (at import): the
    user's ``$BFCL_PROJECT_ROOT`` when set, else a folder private to this user,
    ``$XDG_CACHE_HOME/seal/bfcl_root`` (default ``~/.cache``), made owner-only. Not a fixed name under the
    shared temp directory, where another user could create it first and own what BFCL writes and reads there.
    Exported to the environment, so every child process uses the same folder. The one place that sets it."""
    chosen = os.environ.get(BFCL_ROOT_ENV)
    if chosen:
        return Path(chosen)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = Path(cache) / "seal" / "bfcl_root"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    root.chmod(0o700)
    os.environ[BFCL_ROOT_ENV] = str(root)
    return root


class ServiceStartError(RuntimeError):
    """The service died during start-up or never answered."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str, timeout: float = 2.0) -> bool:
    """True when ``GET <url>/healthz`` answers 200."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/healthz", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@contextlib.contextmanager
def running_service(
    args: Sequence[str] = (),
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    log_path: Path | None = None,
    timeout: float = 120.0,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Yield ``(base_url, process)`` of a service started with extra CLI ``args``; always stopped on exit.

    ``port`` None picks a free loopback port. Output goes to ``log_path`` (appended) or a temporary file whose
    tail is shown if the service dies or never answers (``ServiceStartError``).
    """
    port = port or free_port()
    url = f"http://{host}:{port}"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "env_service", "--host", host, "--port", str(port), *args]
    with contextlib.ExitStack() as stack:
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log = stack.enter_context(open(log_path, "ab"))
        else:
            log = stack.enter_context(tempfile.TemporaryFile())
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

        def tail() -> str:
            log.flush()
            if log_path is not None:
                return log_path.read_text(errors="replace")[-2000:]
            log.seek(0)
            return log.read().decode(errors="replace")[-2000:]

        try:
            deadline = time.monotonic() + timeout
            while not healthy(url, timeout=1.0):
                if proc.poll() is not None:
                    raise ServiceStartError(f"env service exited with code {proc.returncode}:\n{tail()}")
                if time.monotonic() > deadline:
                    raise ServiceStartError(f"env service did not answer at {url} within {timeout:.0f} s:\n{tail()}")
                time.sleep(0.1)
            yield url, proc
        finally:
            stop_process(proc, 15)


def stop_process(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within `grace_s` seconds; always reaped."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
