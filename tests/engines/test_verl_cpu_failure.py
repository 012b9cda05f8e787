"""A vLLM server dying mid-run stops verl's CPU run with a clear nonzero exit, never a hang.

`python launcher.py --conf exp/tiny_verl_cpu.yaml` (verl's vLLM rollout on SmolLM2) runs until verl's first
weight sync into vLLM is done; then the vLLM server's processes (verl's `vLLMHttpServer` Ray actor and vLLM's
engine process under it) are killed. The launcher must exit nonzero on its own, naming the dead server, within
the hang guard below (a timeout, not a speed assertion), its last line naming the dead actor (`launcher:
error: ActorDied: Ray actor died during the run: vLLMHttpServer (...)`), leaving no process and no /dev/shm
segment behind. The weight sender's own bound (`SEAL_WEIGHT_SYNC_TIMEOUT_S`) is lowered so a sync towards the
dead server gives up quickly if verl reaches one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from env_service.process import free_port
from seal.engines.verl.cleanup import run_processes, shm_segments
from tests.helpers import RAY_AT_TEST_PRIORITY, shm_leftovers

pytest.importorskip("verl")
pytest.importorskip("vllm")

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 1800  # until the first weight sync (Ray, the model build, the vLLM server): a hang guard
EXIT_TIMEOUT_S = 600  # from the kill to the launcher's exit: the bound the failure must stay within


def _pids_with(marker: str, name: str = "") -> list[int]:
    """Live processes of the run (their environment has BFCL_PROJECT_ROOT = `marker`) whose command line
    contains `name`."""
    found = []
    for proc in run_processes(marker, env_key="BFCL_PROJECT_ROOT"):
        try:
            if name in " ".join(proc.cmdline()):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.mark.slow
@pytest.mark.xdist_group("engines")  # one engine at a time (tests/conftest.py)
def test_a_killed_vllm_server_fails_the_run_loudly(tmp_path):
    from seal.engines.verl.sync_bound import WEIGHT_SYNC_TIMEOUT_ENV

    marker = str(tmp_path / "bfcl_root")
    env = dict(os.environ, PYTHONPATH=str(REPO), BFCL_PROJECT_ROOT=marker, **{WEIGHT_SYNC_TIMEOUT_ENV: "60"},
               **RAY_AT_TEST_PRIORITY)
    log_path = tmp_path / "launcher.log"
    shm_before = shm_segments()
    cmd = [sys.executable, "launcher.py", "--conf", "exp/tiny_verl_cpu.yaml", f"run_root={tmp_path}",
           f"env.urls=[http://127.0.0.1:{free_port()}]"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "update_weights done" not in log_path.read_text(errors="replace"):
            assert proc.poll() is None, log_path.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, "the run never reached its first weight sync"
            time.sleep(2)
        servers = _pids_with(marker, "vLLMHttpServer") + _pids_with(marker, "EngineCore")
        assert servers, "no vLLM server process found"
        for pid in servers:
            os.kill(pid, signal.SIGKILL)
        code = proc.wait(timeout=EXIT_TIMEOUT_S)
    finally:
        if proc.poll() is None:  # the hang this test exists to catch: end it, then fail below
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
    text = log_path.read_text(errors="replace")
    assert code != 0, text[-4000:]
    # The cause is named: Ray's dead-actor error for the server, or our weight-sync bound.
    assert any(s in text for s in ("ActorDiedError", "ActorUnavailableError", "WeightSyncError", "EngineDeadError")), \
        text[-4000:]
    # ... and the last line says which actor died (not only verl's last error, which follows from it), in one line.
    last = text.strip().splitlines()[-1]
    assert last.startswith("launcher: error:") and "vLLMHttpServer" in last and "died" in last, text[-4000:]
    # The launcher returns only once the run's processes are gone (seal.engines.verl.cleanup): one look suffices.
    assert not _pids_with(marker), [psutil.Process(p).cmdline() for p in _pids_with(marker)]
    assert not shm_leftovers(shm_before)
