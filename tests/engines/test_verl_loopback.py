"""A one-node run's Ray cluster, and with it verl's vLLM servers, listen on loopback only
(docs/verl_engine.md, "Network exposure of the vLLM servers").

verl binds each vLLM server's HTTP port (no API key) to ``ray.util.get_node_ip_address()`` inside the server's
Ray actor. A real local Ray cluster is started in a child process after
``seal.engines.verl.launch.loopback_ray_node``; an actor reports the address verl would bind, and every
listening TCP socket of the cluster's processes is collected (``tests/run_watch.py``). Ray's processes
are real; no verl run is started (the verl end-to-end test can watch a real run with ``ListenerWatch``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from seal.engines.verl.cleanup import reap_run_processes
from tests.run_watch import is_loopback, listeners, marked_pids

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import json, os
import ray
from seal.engines.verl.launch import loopback_ray_node
from tests.run_watch import listeners, marked_pids

@ray.remote
class Server:
    def address(self):
        return ray.util.get_node_ip_address()  # what verl's vLLMHttpServer binds its HTTP port to

loopback_ray_node()
ray.init(address="local", num_cpus=1, include_dashboard=False)
address = ray.get(Server.remote().address.remote())
found = sorted(listeners(marked_pids(os.environ["SEAL_TEST_MARKER"], "SEAL_TEST_MARKER")))
ray.shutdown()
print(json.dumps({"address": address, "listeners": found}))
"""


def _cluster() -> dict:
    marker = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=str(REPO), SEAL_TEST_MARKER=marker, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    try:
        done = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=240)
    finally:
        reap_run_processes(marker, wait_s=30, env_key="SEAL_TEST_MARKER")  # Ray's outlive ray.shutdown()
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_one_node_ray_cluster_listens_on_loopback_only():
    pytest.importorskip("ray")
    loopback = _cluster()
    # As Ray starts it, the actor sees the node's network address and Ray's GCS listens on 0.0.0.0 / ::
    # (measured: docs/verl_engine.md). After the switch: the address verl binds is 127.0.0.1 and every
    # listening socket of the cluster is on loopback.
    assert loopback["address"] == "127.0.0.1"
    assert loopback["listeners"] and all(is_loopback(ip) for ip, _, _ in loopback["listeners"]), loopback


def test_listener_helpers():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("192.0.2.2")
    assert listeners(set()) == set()
    assert os.getpid() not in marked_pids(uuid.uuid4().hex, "SEAL_TEST_MARKER")
