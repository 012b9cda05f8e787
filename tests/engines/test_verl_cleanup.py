"""The end of a verl run on one node (seal.engines.verl.cleanup): the run's processes are waited for, then killed,
and the /dev/shm segments nobody maps any more are unlinked. Real processes and real segments."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from seal.engines.verl.cleanup import RUN_MARKER_ENV, reap_run_processes, run_processes

REPO = Path(__file__).resolve().parents[2]


def _marked(marker: str, code: str) -> subprocess.Popen:
    env = dict(os.environ, **{RUN_MARKER_ENV: marker})
    return subprocess.Popen([sys.executable, "-c", code], env=env)


def test_the_run_is_reaped_stragglers_killed_and_the_rest_left_alone():
    """A marked process that exits within the wait is waited for (not killed); one that ignores SIGTERM and
    outlives the wait is killed; a process of another run, or none, is never touched."""
    quick = _marked("run-a", "import time; time.sleep(1)")
    stubborn = _marked("run-a", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)")
    other = _marked("run-b", "import time; time.sleep(600)")
    try:
        deadline = time.monotonic() + 30
        while len(run_processes("run-a")) < 2:  # until both have exec'd with the marker in their environ
            assert time.monotonic() < deadline
            time.sleep(0.05)
        killed = reap_run_processes("run-a", wait_s=4)
        # Only the stubborn one was killed: the quick one exited on its own within the wait. (psutil reaps our
        # own children while waiting, so their exit codes are not Popen's to read.)
        assert len(killed) == 1 and "SIG_IGN" in killed[0], killed
        assert not psutil.pid_exists(quick.pid) and not psutil.pid_exists(stubborn.pid)
        assert run_processes("run-a") == []
        assert other.poll() is None and psutil.Process(other.pid).is_running()
    finally:
        for proc in (quick, stubborn, other):
            proc.kill()
            proc.wait(10)


def test_reaping_a_run_with_no_process_left_kills_nothing():
    assert reap_run_processes("no-such-run", wait_s=1) == []


def _hold_segment(name: str, seconds: float) -> None:  # a spawned process: maps a segment, then dies holding it
    import os
    import time
    from multiprocessing import resource_tracker, shared_memory

    seg = shared_memory.SharedMemory(name=name, create=True, size=4096)
    resource_tracker.unregister(seg._name, "shared_memory")  # noqa: SLF001 - like a SIGKILLed owner: no unlink
    time.sleep(seconds)
    os._exit(0)


def test_only_the_runs_orphaned_segments_are_removed_once_their_last_process_is_gone(monkeypatch):
    """The run's processes outlive Ray's shutdown by a few seconds: a segment a process of the run mapped is
    removed when its holder has gone; one still mapped past the wait is left alone, and so is an orphan that
    another program (a process without the run's marker) left during the run."""
    import multiprocessing as mp
    import uuid
    from multiprocessing import shared_memory

    from seal.engines.verl.cleanup import RunSegments, remove_orphaned_shm, shm_segments

    before = shm_segments()
    late, kept, foreign = (f"seal-test-{uuid.uuid4().hex[:8]}" for _ in range(3))
    spawn = mp.get_context("spawn")
    monkeypatch.setenv("SEAL_TEST_RUN", "run-shm")  # the spawned holder inherits the run's marker
    holder = spawn.Process(target=_hold_segment, args=(late, 4.0))
    holder.start()
    monkeypatch.delenv("SEAL_TEST_RUN")
    stranger = spawn.Process(target=_hold_segment, args=(foreign, 0.0))  # another program's orphan
    stranger.start()
    mine = shared_memory.SharedMemory(name=kept, create=True, size=4096)
    try:
        with RunSegments("run-shm", interval_s=0.2, env_key="SEAL_TEST_RUN") as segments:
            while late not in segments.seen:
                assert holder.is_alive()
                time.sleep(0.1)
        stranger.join(10)
        assert foreign in shm_segments() and foreign not in segments.seen
        removed = remove_orphaned_shm((segments.seen | {kept}) - before, settle_s=10)
        assert late in removed and late not in shm_segments()  # removed once its holder exited, within the wait
        assert kept not in removed and kept in shm_segments()  # still mapped here past the wait: never touched
        assert foreign not in removed and foreign in shm_segments()  # not the run's: never touched
        holder.join(10)
    finally:
        mine.close()
        mine.unlink()
        shared_memory.SharedMemory(name=foreign).unlink()


def _named_semaphore(prefix: str, seconds: float) -> None:
    """Create a named POSIX semaphore `<prefix>-<this pid>-x` as loky does, close it without unlinking (nobody maps it
    any more, as with vLLM's EngineCore), stay alive `seconds`, then exit without cleanup (as under Ray's SIGKILL)."""
    import _multiprocessing

    lock = _multiprocessing.SemLock(1, 1, 1, f"/{prefix}-{os.getpid()}-x", False)
    del lock  # sem_close: the name stays in /dev/shm, mapped by nobody
    time.sleep(seconds)
    os._exit(0)


def test_a_semaphore_named_by_a_run_process_is_the_runs_even_unmapped(monkeypatch):
    """loky's semaphores (`sem.loky-<pid>-<random>`) name their creator, and vLLM's EngineCore leaves them mapped by
    nobody: the mapping rule alone never claimed them, so a user's run left one per vLLM engine in /dev/shm. A name
    carrying a run process's pid is the run's; the same name with another program's pid is not."""
    import multiprocessing as mp
    import uuid

    from seal.engines.verl.cleanup import RunSegments, remove_orphaned_shm, shm_segments

    prefix = f"sealtest{uuid.uuid4().hex[:6]}"
    spawn = mp.get_context("spawn")
    monkeypatch.setenv("SEAL_TEST_RUN", "run-sem")
    ours = spawn.Process(target=_named_semaphore, args=(prefix, 3.0))
    ours.start()
    monkeypatch.delenv("SEAL_TEST_RUN")
    theirs = spawn.Process(target=_named_semaphore, args=(prefix, 3.0))
    theirs.start()
    mine, foreign = f"sem.{prefix}-{ours.pid}-x", f"sem.{prefix}-{theirs.pid}-x"
    try:
        with RunSegments("run-sem", interval_s=0.2, env_key="SEAL_TEST_RUN") as segments:
            deadline = time.monotonic() + 60
            while mine not in segments.seen and time.monotonic() < deadline:
                time.sleep(0.1)
        ours.join(10)
        theirs.join(10)
        assert mine in segments.seen and foreign not in segments.seen
        assert mine in shm_segments() and foreign in shm_segments()  # both left behind by their creators
        removed = remove_orphaned_shm(segments.seen, settle_s=5)
        assert removed == [mine] and mine not in shm_segments()
        assert foreign in shm_segments()  # another program's: never touched
    finally:
        for name in (mine, foreign):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{name}")


SIGTERM_DRIVER = """
import sys, time
from pathlib import Path
from seal.engines.verl.launch import import_verl_entry
import_verl_entry()
import ray
ray.init(address="local", num_cpus=1, include_dashboard=False)


@ray.remote
def step():
    time.sleep(300)


try:
    ref = step.remote()
    print("ready", flush=True)
    ray.get(ref)  # where verl's driver waits for its TaskRunner (without the switch, SIGTERM kills it here)
finally:
    ray.shutdown()
    Path(sys.argv[1]).write_text("cleaned up")
"""


@pytest.mark.slow  # starts a Ray cluster (seconds to a minute on a loaded machine)
def test_a_sigterm_to_the_driver_unwinds_through_its_cleanup(tmp_path):
    """Ray's C++ signal handler ends a driver waiting in `ray.get` on SIGTERM without running a `finally` (seen
    with a plain import: no "cleaned up"); the verl entry is imported so that it does not, and the launcher's
    cleanup (env service, Ray, /dev/shm) runs."""
    flag = tmp_path / "flag"
    driver = subprocess.Popen([sys.executable, "-c", SIGTERM_DRIVER, str(flag)], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert driver.stdout.readline().strip() == "ready"
        time.sleep(2)  # into ray.get
        driver.send_signal(signal.SIGTERM)
        driver.wait(120)
    finally:
        driver.kill()
    assert flag.read_text() == "cleaned up"
