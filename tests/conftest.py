import os
import tempfile

import pytest

# bfcl_eval writes folders under BFCL_PROJECT_ROOT at import time; keep them out of the checkout.
os.environ.setdefault("BFCL_PROJECT_ROOT", os.path.join(tempfile.gettempdir(), "seal_bfcl_root"))

from env_service.process import running_service  # noqa: E402


@pytest.fixture(scope="session")
def service_url():
    """A real env service (release defaults) on a free loopback port, shared by the session's tests. It opens
    training episodes on eval-split tasks too (`--allow-train-on-eval`): the tests play whichever task shows
    the behaviour they test; the refusal itself is tested in tests/env_service/test_split_enforcement.py."""
    with running_service(["--allow-train-on-eval"]) as (url, _proc):
        yield url
