"""HTTP hardening on a real service: read deadlines, the connection bound with the health check answering,
quiet logs on client disconnects, and authentication that works (docs/env_service.md, "Safety and robustness")."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import httpx
import pytest

from env_service.process import REPO, running_service
from seal.rollout.client import EnvClient

TOKEN = "s3cret"


def _connect(url: str) -> socket.socket:
    host, port = url.rsplit("/", 1)[-1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


# Only a guard against a hang: every claim below is about what the server did (closed, answered), not how fast.
HANG_GUARD_S = 120.0


def _closed_by_server(sock: socket.socket) -> bool:
    """Read until the server closes the connection (True); False if it is still open after the hang guard."""
    sock.settimeout(HANG_GUARD_S)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except TimeoutError:
        return False
    except OSError:  # reset
        return True


def _still_served(sock: socket.socket) -> bool:
    """Ask a kept-alive connection for /healthz again: answered (True), or closed by the server (False)."""
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(HANG_GUARD_S)
        return b"200 OK" in sock.recv(65536)
    except OSError:  # reset, or the send hit the closed connection
        return False


@pytest.mark.slow
def test_deadlines_connection_bound_quiet_log_and_token(tmp_path, monkeypatch):
    log = tmp_path / "service.log"
    args = ["--header-timeout", "1.5", "--max-connections", "10", "--token", TOKEN]
    with running_service(args, log_path=log) as (url, _):
        auth = {"authorization": f"Bearer {TOKEN}"}
        # half-open request line, and a body slower than it promised: both closed at the deadline
        stalled = _connect(url)
        stalled.sendall(b"POST /episodes HTTP/1.1\r\nHost: x\r\n")
        slow_body = _connect(url)
        slow_body.sendall(b"POST /episodes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
                          b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"task")
        silent = _connect(url)  # connects and never sends a byte
        # (without the deadline the server would wait on them for ever)
        assert _closed_by_server(stalled) and _closed_by_server(slow_body) and _closed_by_server(silent)
        # a client that disconnects mid-body: no 500, no traceback
        for _ in range(5):
            gone = _connect(url)
            gone.sendall(b"POST /episodes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"task_id\": ")
            gone.close()
        # 40 idle keep-alive connections (each answered once): above the bound of 10 the idle ones are shed
        idle = []
        for _ in range(40):
            sock = _connect(url)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b"200 OK" in sock.recv(65536)
            idle.append(sock)
        # answered at the bound (the latency target is the soak's figure; this 2-core box is shared)
        assert httpx.get(f"{url}/healthz", timeout=HANG_GUARD_S).status_code == 200
        shed = sum(not _still_served(sock) for sock in idle)
        assert shed >= 25, shed
        for sock in idle:
            sock.close()
        # the project's client reads the token from the environment
        monkeypatch.setenv("SEAL_ENV_TOKEN", TOKEN)

        async def play() -> dict:
            async with EnvClient(url) as client:
                created = await client.create("multi_turn_base_0", mode="eval")
                await client.delete(created.episode_id)
                return created.info.model_dump()

        assert asyncio.run(play())["num_turns"] >= 1
        assert httpx.get(f"{url}/tasks").status_code == 401
        assert httpx.get(f"{url}/tasks", headers=auth).status_code == 200
    text = log.read_text()
    assert "Traceback" not in text and "500" not in text and "Exception" not in text, text[-2000:]


def test_off_loopback_without_a_token_refuses_to_start():
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "SEAL_ENV_TOKEN": ""}
    proc = subprocess.run([sys.executable, "-m", "env_service", "--host", "0.0.0.0", "--port", "1"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "without a bearer token" in proc.stderr
