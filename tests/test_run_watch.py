"""The tests' own /dev/shm check (tests/run_watch.py): a segment the test's processes held and left is reported;
one that another program left in the same minutes, mapped by nobody as well, is not. Real processes, real
segments."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid

from seal.engines.verl.cleanup import shm_segments
from tests.run_watch import SegmentWatch, shm_leftovers

# Maps a segment, lets it go without unlinking it (as a SIGKILLed owner would), and exits after `hold` seconds.
LEAVE = """
import sys, time
from multiprocessing import resource_tracker, shared_memory
seg = shared_memory.SharedMemory(name=sys.argv[1], create=True, size=4096)
resource_tracker.unregister(seg._name, "shared_memory")
time.sleep(float(sys.argv[2]))
seg.close()
"""
# The same from a process that is not the test's: started through a parent that exits at once, so the holder is
# nobody's descendant here (the other xdist worker's engine, as far as this test can tell).
ORPHAN = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], start_new_session=True)
"""


def _wait_for(name: str) -> None:
    deadline = time.monotonic() + 60
    while name not in shm_segments():
        assert time.monotonic() < deadline, f"{name} never appeared"
        time.sleep(0.05)


def test_only_the_tests_own_abandoned_segments_are_its_leftovers():
    ours, theirs = (f"seal-watch-{uuid.uuid4().hex[:8]}" for _ in range(2))
    before = shm_segments()
    try:
        with SegmentWatch(interval=0.2) as segments:
            subprocess.run([sys.executable, "-c", ORPHAN, LEAVE, theirs, "1.5"], check=True, timeout=60)
            child = subprocess.Popen([sys.executable, "-c", LEAVE, ours, "1.5"])
            _wait_for(theirs)
            _wait_for(ours)
            assert child.wait(60) == 0
        deadline = time.monotonic() + 60
        while theirs not in shm_leftovers(before, {theirs}, settle_s=0):  # until its holder let go of it too
            assert time.monotonic() < deadline
            time.sleep(0.1)
        # Both are left, new and mapped by nobody; only the test's own child held ours.
        assert ours in segments.seen and theirs not in segments.seen
        assert shm_leftovers(before, segments.seen, settle_s=1) == {ours}
    finally:
        for name in (ours, theirs):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/dev/shm/{name}")


def test_a_clean_test_leaves_nothing():
    name = f"seal-watch-{uuid.uuid4().hex[:8]}"
    before = shm_segments()
    with SegmentWatch(interval=0.2) as segments:
        code = LEAVE + "\nimport os; os.unlink('/dev/shm/' + sys.argv[1])\n"
        subprocess.run([sys.executable, "-c", code, name, "1.0"], check=True, timeout=60)
    assert name in segments.seen and name not in shm_segments()
    assert shm_leftovers(before, segments.seen, settle_s=1) == set()
