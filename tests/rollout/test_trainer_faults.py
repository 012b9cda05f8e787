"""Trainer faults are loud: lost env services stop the run, damaged or foreign state is refused naming the file,
a damaged metrics line never blocks a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seal import recipe as C
from seal.core.capability import RunMismatchError
from seal.core.controller import STATE_FILE, SealController
from seal.core.record import EpisodeRecord
from seal.logging_utils import read_metrics, trim_metrics
from seal.rollout.episode import EnvServiceLost, check_infra_loss
from seal.rollout.types import Rollout

EXP = Path(__file__).resolve().parents[2] / "exp"


def _rollout(reason: str | None) -> EpisodeRecord:
    return Rollout(task_id="multi_turn_base_0", mode="train", excluded=reason is not None,
                   exclude_reason=reason).record()


def test_infra_loss_above_the_share_stops_the_run():
    step = [_rollout("infrastructure")] * 5 + [_rollout(None)] * 3
    with pytest.raises(EnvServiceLost, match=r"5 of 8 episodes .* env service at http://127.0.0.1:8082"):
        check_infra_loss(step, 0.5, "http://127.0.0.1:8082")
    check_infra_loss(step, 0.7, "x")  # under the share: training goes on
    # policy-side exclusions (prompt too long, empty response) are not infrastructure losses
    check_infra_loss([_rollout("prompt_too_long")] * 8, 0.5, "x")
    # the verl engine reads the records back from the agent loop's extras
    wire = [EpisodeRecord.from_dict(r.to_dict()) for r in [_rollout("env_protocol")] * 2 + [_rollout(None)]]
    with pytest.raises(EnvServiceLost):
        check_infra_loss(wire, 0.5, "x")
    assert C.Recipe().env.max_infra_loss == 0.5


def test_the_lost_service_error_names_the_log_that_exists(tmp_path):
    step = [_rollout("infrastructure")] * 2
    log = tmp_path / "env_service.log"
    # The run attached to a service it did not start: there is no log of its own to point at.
    with pytest.raises(EnvServiceLost, match="did not start that service") as lost:
        check_infra_loss(step, 0.5, "http://127.0.0.1:1", log)
    assert str(log) not in str(lost.value)
    log.write_text("service output\n")
    with pytest.raises(EnvServiceLost, match=f"log: {log}"):
        check_infra_loss(step, 0.5, "http://127.0.0.1:1", log)


def _saved_state(tmp_path: Path) -> Path:
    seal_cfg = C.load_config(EXP / "SEAL.yaml", []).seal
    controller = SealController(seal_cfg)
    controller.save(tmp_path)
    return tmp_path / STATE_FILE


@pytest.mark.parametrize("weight", [float("nan"), -1.0, 0.0, float("inf")])
def test_nan_or_negative_weights_are_refused_at_load_naming_the_file(tmp_path, weight):
    path = _saved_state(tmp_path)
    state = json.loads(path.read_text())
    state["capability"]["dynamic_weights"]["pass"] = weight
    path.write_text(json.dumps(state))
    fresh = SealController(C.load_config(EXP / "SEAL.yaml", []).seal)
    with pytest.raises(ValueError, match=f"{STATE_FILE}.*invalid dynamic weights"):
        fresh.load(tmp_path)


def test_another_runs_state_and_damaged_files_are_refused_naming_the_file(tmp_path):
    path = _saved_state(tmp_path)
    other = SealController(C.load_config(EXP / "SEAL.yaml", []).seal, run_id="another-run")
    with pytest.raises(RunMismatchError, match=str(path)):
        other.load(tmp_path)
    path.write_text(path.read_text()[:40])
    with pytest.raises(ValueError, match=f"{STATE_FILE}: damaged"):
        SealController(C.load_config(EXP / "SEAL.yaml", []).seal).load(tmp_path)


def test_a_damaged_metrics_line_does_not_block_resume(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "lo\n{"step": 3, "loss": 0.25}\n')
    assert [r["step"] for r in read_metrics(metrics)] == [1, 3]
    trim_metrics(metrics, 1)
    assert read_metrics(metrics) == [{"step": 1, "loss": 0.5}]
