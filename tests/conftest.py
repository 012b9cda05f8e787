import os

import pytest

# bfcl_eval writes folders under BFCL_PROJECT_ROOT at import time: the user's private default
# (env_service.bfcl.bfcl_project_root) unless the environment names one.
from env_service.process import running_service


@pytest.fixture(scope="session")
def service_url():
    """A real env service (release defaults) on a free loopback port, shared by the session's tests. It opens
    training episodes on eval-split tasks too (`--allow-train-on-eval`): the tests play whichever task shows
    the behaviour they test; the refusal itself is tested in tests/env_service/test_split_enforcement.py."""
    with running_service(["--allow-train-on-eval"]) as (url, _proc):
        yield url


# In CI (.ci/run sets SEAL_CI_STRICT_SKIPS=1) a skipped test fails the run: a test that skips because verl, vLLM,
# Ray or the τ² venv is missing has not run, and a green CI must mean the tests ran. The skips that are meant to
# happen on CI's CPU machine are listed here by test id, each with its reason.
# A test CI may skip, with the reason; empty: every test CI collects runs there.
INTENDED_SKIPS: dict[str, str] = {}
STRICT_SKIPS_ENV = "SEAL_CI_STRICT_SKIPS"


def _unintended_skip(report) -> bool:
    return (os.environ.get(STRICT_SKIPS_ENV) == "1" and report.skipped
            and report.nodeid.split("@")[0].split("[")[0] not in INTENDED_SKIPS)  # xdist adds "@<group>"


def _fail_skip(report) -> None:
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"skipped in CI ({STRICT_SKIPS_ENV}=1), which counts as a failure: {reason}. Install what "
                       "it needs, or list the test in tests/conftest.py INTENDED_SKIPS with its reason")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _unintended_skip(report):
        _fail_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if _unintended_skip(report):  # a module-level importorskip
        _fail_skip(report)


# CI runs each tier on two pytest-xdist workers (`.ci/run`: `-n 2 --dist loadgroup`). A test marked
# `xdist_group(ENGINES)` starts a whole verl run (a Ray cluster with vLLM servers and ~9-13 processes, sized for
# the whole machine) or a vLLM engine: those run one after another on one worker, for memory (two verl runs at once
# would not fit beside the other worker's tests in 24 GB) and for vLLM's shutdown: in one CI run with the
# evaluation's engines on the other worker, beside a verl run and another engine, a test left a `psm_` segment that
# its own engine's processes had held (a reading, not verified: under that load vLLM's workers overran its 5 s
# shutdown grace and were killed before unlinking their queue; the same tests passed in every CI run in this group).
# Every /dev/shm check counts only segments the test's own processes were seen holding
# (tests/run_watch.py, `SegmentWatch`), so the other worker's are never mistaken for a test's. The group goes
# first, so the longest unit of work starts at once.
ENGINES = "engines"


def pytest_collection_modifyitems(config, items):
    def in_engines_group(item) -> bool:
        return any(m.args and m.args[0] == ENGINES for m in item.iter_markers("xdist_group"))

    items.sort(key=lambda item: not in_engines_group(item))  # stable: the order within each part is kept
