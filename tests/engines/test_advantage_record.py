"""`<run>/advantages.jsonl` (seal.engines.advantage_record) as the verl trainer writes it, from the real advantage
code (`SealTrainer._compute_advantage`: verl's GRPO, then the controller's A-Patch) on a small batch through the
TransferQueue glue (an in-memory TransferQueue: no Ray here), and the checker the verl learning test runs on a
launched run: GRPO × the A-Patch scale of each row's tags, recomputed from the record."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

pytest.importorskip("verl")

from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

import seal.engines.verl.adapter as VA  # noqa: E402
from seal.engines.advantage_record import ADVANTAGES_FILE, check_advantage_record, read_records  # noqa: E402
from tests.engines import test_verl_trainer as TV  # noqa: E402

STATIC, FakeTQ, make_trainer = TV.STATIC, TV.FakeTQ, TV.make_trainer
output_fields, rollout = TV.output_fields, TV.rollout
model_dir = TV.model_dir  # the fixture: a tiny Qwen2 config and the Qwen2.5 tokenizer

ROWS = [("multi_turn_base_1", 1.0, ["pass", "pass"], "A"),
        ("multi_turn_base_1", 0.0, ["pass", "state_mismatch"], "A"),
        ("multi_turn_miss_func_2", 1.0, ["pass"], "B"),
        ("multi_turn_miss_func_2", 0.0, ["empty_turn_model_response"], "B"),
        ("multi_turn_miss_func_2", 0.0, ["response_mismatch", "checker_error"], "B")]


def run_steps(trainer, monkeypatch, steps=(1,)):
    fake = FakeTQ()
    monkeypatch.setattr(VA, "tq", fake)
    for step in steps:
        trainer.global_steps = step
        keys = [f"{uid}{step}_{i}_0" for i, (_, _, _, uid) in enumerate(ROWS)]
        # rows of different lengths, as verl stores them (nested tensors), each with an observation token
        fields = [output_fields(rollout(t, r, tags, 3 + i, [1, 0] + [1] * (1 + i)), f"{uid}{step}")
                  for i, (t, r, tags, uid) in enumerate(ROWS)]
        fake.kv_batch_put(keys, "train", fields=list_of_dict_to_tensordict(fields))
        trainer._compute_advantage(SimpleNamespace(keys=keys, partition_id="train",
                                                   tags=[{"status": "success"}] * len(keys)), {})
    return fake


@pytest.mark.parametrize("overrides", [STATIC, []], ids=["static_weights", "dynamic_weights"])
def test_the_record_of_the_real_advantage_step_passes_the_check(model_dir, tmp_path, monkeypatch, overrides):
    trainer = make_trainer(model_dir, tmp_path, overrides)
    fake = run_steps(trainer, monkeypatch, steps=(1, 2))
    path = tmp_path / ADVANTAGES_FILE
    counts = check_advantage_record(path)
    assert counts == {"steps": 2, "rows": 10, "scaled": counts["scaled"], "no_tokens": 0} and counts["scaled"] >= 4
    rec = read_records(path)[2]
    # the record holds what the update was given: the advantages written back to TransferQueue
    for i, row in enumerate(rec["rows"]):
        stored = fake.rows[f"{ROWS[i][3]}2_{i}_0"]["advantages"]
        assert stored[0].item() == pytest.approx(row["used"], abs=1e-6)
    if not overrides:  # dynamic weights: the weights of step 2 are not the static table
        assert rec["apatch"]["weights"] == trainer.controller.state.dynamic_weights


def test_the_check_catches_an_update_without_apatch(model_dir, tmp_path, monkeypatch):
    """If the update got GRPO's advantages unscaled (A-Patch not applied), the check fails on the scaled rows."""
    trainer = make_trainer(model_dir, tmp_path, STATIC)
    monkeypatch.setattr(trainer.controller, "reweight", lambda data, step: {})
    run_steps(trainer, monkeypatch)
    with pytest.raises(AssertionError, match=r"row\(s\) off"):
        check_advantage_record(tmp_path / ADVANTAGES_FILE)


def test_the_check_catches_a_wrong_number_and_a_missing_step(model_dir, tmp_path, monkeypatch):
    trainer = make_trainer(model_dir, tmp_path, STATIC)
    run_steps(trainer, monkeypatch)
    path = tmp_path / ADVANTAGES_FILE
    rec = read_records(path)[1]
    rec["rows"][1]["used"] *= 1.01  # A-Patch's 1.4 applied as 1.414
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rec) + "\n")
    with pytest.raises(AssertionError, match="row 1"):
        check_advantage_record(bad)
    rec["rows"][1]["used"] /= 1.01
    rec["rows"][1]["grpo"] = -rec["rows"][1]["grpo"]  # GRPO itself wrong
    bad.write_text(json.dumps(rec) + "\n")
    with pytest.raises(AssertionError, match="row 1"):
        check_advantage_record(bad)
    with pytest.raises(AssertionError, match=r"no record of step\(s\) \[2\]"):
        check_advantage_record(path, steps=[1, 2])


def test_hand_computed_values(model_dir, tmp_path, monkeypatch):
    """The record's numbers by hand (group B: rewards 1, 0, 0; rho from STATIC, checker_error dropped)."""
    trainer = make_trainer(model_dir, tmp_path, STATIC)
    run_steps(trainer, monkeypatch)
    rows = read_records(tmp_path / ADVANTAGES_FILE)[1]["rows"]
    s3 = 1 / math.sqrt(3) + 1e-6
    assert [r["grpo"] for r in rows[2:]] == pytest.approx([(2 / 3) / s3, -(1 / 3) / s3, -(1 / 3) / s3], abs=1e-5)
    assert [r["used"] for r in rows[2:]] == pytest.approx([(2 / 3) / s3, -(1 / 3) / s3 * 0.5, -(1 / 3) / s3 * 2.0],
                                                          abs=1e-5)
    assert rows[4]["tags"] == ["response_mismatch", "checker_error"] and rows[0]["reward"] == 1.0
