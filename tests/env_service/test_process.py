"""The one child-server starter and poller (`env_service.process`), on real child processes: a child that
answers is yielded and stopped afterwards; one that exits early, one that never answers and one that ignores
SIGTERM each end with a clear error or a kill, and leave no process behind."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest

from env_service.process import ServiceStartError, free_port, running_child, start_child

# An HTTP server answering 200 on every GET; it prints its pid first, so the test can find it afterwards.
SERVER = """
import http.server, os, sys
print("pid", os.getpid(), flush=True)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _pid(text: str) -> int:
    return int(next(line for line in text.splitlines() if line.startswith("pid ")).split()[1])


def _gone(pid: int) -> bool:
    """The process has exited (a zombie counts: its parent is gone or has not reaped it yet). A killed process
    takes a moment to die, so this waits up to 30 s for it."""
    deadline = time.monotonic() + 30
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_a_child_that_answers_is_yielded_then_stopped(tmp_path):
    port = free_port()
    log = tmp_path / "logs" / "server.log"
    log.parent.mkdir()
    log.write_text("an earlier run's line\n")
    with running_child([sys.executable, "-c", SERVER, str(port)], f"http://127.0.0.1:{port}/ready",
                       name="test server", timeout=60, log_path=log) as child:
        assert child.proc.poll() is None
        pid = _pid(child.tail())
        assert "earlier run" not in child.tail()  # the tail is this child's own output
    assert child.proc.returncode is not None and _gone(pid)
    assert log.read_text().startswith("an earlier run's line\npid ")  # appended, nothing lost


def test_a_child_that_exits_early_fails_with_its_log(tmp_path):
    code = "import sys; print('cannot bind: port taken', flush=True); sys.exit(3)"
    with pytest.raises(ServiceStartError) as error, running_child(
            [sys.executable, "-c", code], f"http://127.0.0.1:{free_port()}/", name="test server", timeout=60):
        pytest.fail("a child that exited must not be yielded")
    message = str(error.value)
    assert message.startswith("test server exited with code 3 before it answered")
    assert "cannot bind: port taken" in message


def test_a_child_that_never_answers_fails_at_the_deadline_and_is_stopped(tmp_path):
    code = "import os, time; print('pid', os.getpid(), flush=True); time.sleep(600)"
    log = tmp_path / "never.log"
    expected = r"test server did not answer at http://127\.0\.0\.1:\d+/ within 1 s"
    with pytest.raises(ServiceStartError, match=expected), running_child(
            [sys.executable, "-c", code], f"http://127.0.0.1:{free_port()}/", name="test server", timeout=1,
            log_path=log):
        pytest.fail("a child that never answered must not be yielded")
    assert _gone(_pid(log.read_text()))


def test_a_child_that_ignores_sigterm_is_killed_with_its_group(tmp_path):
    # it starts a grandchild in its own process group, then ignores SIGTERM: stopping the group reaches both
    code = ("import os, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
            "print('pid', os.getpid(), flush=True); print('grandchild', g.pid, flush=True); time.sleep(600)")
    child = start_child([sys.executable, "-c", code], name="stubborn", log_path=tmp_path / "c.log", new_session=True)
    try:
        while "grandchild" not in (tmp_path / "c.log").read_text():
            assert child.proc.poll() is None, child.tail()
            time.sleep(0.05)
    finally:
        child.stop(grace_s=0.5)
    text = (tmp_path / "c.log").read_text()
    grandchild = int(next(line for line in text.splitlines() if line.startswith("grandchild ")).split()[1])
    assert child.proc.returncode == -9  # SIGTERM ignored: killed after the grace period
    assert _gone(grandchild)


def test_only_the_services_own_process_freezes_the_garbage_collector():
    """`gc.freeze` keeps the service's full collections short, in its own process. In a process that only hosts
    the app it would hold every object of the host's libraries past exit: with torch's triton imported, triton's
    bindings then print "nanobind: leaked ..." at exit (the fast tier's last screen, before the fix)."""
    import gc
    import subprocess
    import sys

    from env_service.app import create_app
    from env_service.config import ServiceConfig

    frozen = gc.get_freeze_count()
    create_app(ServiceConfig(workers=0))
    assert gc.get_freeze_count() == frozen  # the host process's heap is left as it was
    # A host that imported torch's compiler stack (triton where installed), then the app: a quiet exit.
    code = ("import torch._dynamo\nfrom env_service.app import create_app\n"
            "from env_service.config import ServiceConfig\ncreate_app(ServiceConfig(workers=0))\n")
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=repo)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "leaked" not in out.stderr, out.stderr[-2000:]
    # The service's own process does freeze.
    own = ("import gc\nfrom env_service.app import create_app\nfrom env_service.config import ServiceConfig\n"
           "create_app(ServiceConfig(workers=0), own_process=True)\nprint(gc.get_freeze_count())\n")
    out = subprocess.run([sys.executable, "-c", own], capture_output=True, text=True, timeout=300, cwd=repo)
    assert out.returncode == 0 and int(out.stdout.split()[-1]) > 0, (out.stdout, out.stderr[-2000:])
