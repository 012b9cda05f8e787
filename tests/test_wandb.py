"""wandb follows wandb's own conventions: WANDB_MODE as set, a logged-in user not forced offline, a resumed
run logging into the same wandb run (real wandb, offline or disabled: no network)."""

from __future__ import annotations

import pytest

from seal.logging_utils import MetricsLogger, wandb_env, wandb_logged_in

pytest.importorskip("wandb")


@pytest.fixture
def no_credentials(tmp_path, monkeypatch):
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # no such file: not logged in
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    return tmp_path


def test_the_users_mode_and_login_are_respected(no_credentials, monkeypatch):
    run = no_credentials / "run"
    assert not wandb_logged_in() and wandb_env(run, resume=False)["WANDB_MODE"] == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert "WANDB_MODE" not in wandb_env(run, resume=False)  # the user's setting stands
    monkeypatch.delenv("WANDB_MODE")
    # `wandb login` writes a netrc entry and no WANDB_API_KEY: that user is not forced offline
    (no_credentials / "netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "0" * 40 + "\n")
    (no_credentials / "netrc").chmod(0o600)
    assert wandb_logged_in() and "WANDB_MODE" not in wandb_env(run, resume=False)


def test_disabled_mode_makes_no_wandb_run(no_credentials, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    logger = MetricsLogger(no_credentials / "run", ["jsonl", "wandb"], wandb_project="p", experiment_name="e")
    try:
        assert logger._wandb is not None and logger._wandb.disabled
    finally:
        logger.close()
    assert not (no_credentials / "run" / "wandb").exists()  # nothing written offline


def test_a_resumed_run_logs_into_the_same_wandb_run(no_credentials):
    run = no_credentials / "run"
    first = MetricsLogger(run, ["jsonl", "wandb"], wandb_project="p", experiment_name="e")
    run_id = first._wandb.id
    first.log({"reward/mean": 0.5}, step=1)
    first.close()
    resumed = MetricsLogger(run, ["jsonl", "wandb"], resume_step=1, wandb_project="p", experiment_name="e")
    assert resumed._wandb.id == run_id
    resumed.close()
    fresh = MetricsLogger(no_credentials / "other", ["jsonl", "wandb"], wandb_project="p", experiment_name="e")
    assert fresh._wandb.id != run_id
    fresh.close()
    assert wandb_env(run, resume=True)["WANDB_RUN_ID"] == run_id and wandb_env(run, resume=True)["WANDB_RESUME"]
