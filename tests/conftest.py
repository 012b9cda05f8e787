
import pytest

# bfcl_eval writes folders under BFCL_PROJECT_ROOT at import time: the user's private default
# (env_service.process.bfcl_project_root) unless the environment names one.
from env_service.process import running_service


@pytest.fixture(scope="session")
def service_url():
    """A real env service (release defaults) on a free loopback port, shared by the session's tests. It opens
    training episodes on eval-split tasks too (`--allow-train-on-eval`): the tests play whichever task shows
    the behaviour they test; the refusal itself is tested in tests/env_service/test_split_enforcement.py."""
    with running_service(["--allow-train-on-eval"]) as (url, _proc):
        yield url
