"""The evaluation-directory schema module: records from episodes, summaries, writing and reading back."""

from __future__ import annotations

import json
import math

import pytest

from env_service.vocab import CATEGORIES
from seal.eval import results
from seal.rollout.types import Rollout


def test_records_from_episodes():
    graded = Rollout(task_id="multi_turn_base_3", mode="eval", accuracy=1.0, progress=1.0, failure_tags=["pass"],
                     paper_labels=["pass"], num_model_calls=2, num_turns=1,
                     eval_result={"accuracy": 1.0, "end_reason": "completed", "turns": [{"turn": 0}]},
                     messages=[{"role": "system", "content": "s"}])
    record = results.record_from_rollout(graded)
    assert record["category"] == "multi_turn_base"  # derived from the id when the service gave none
    assert (record["accuracy"], record["error"], record["end_reason"], record["turns"]) == (
        1, None, "completed", [{"turn": 0}])
    # An error always fails the task, whatever the verdict said.
    assert results.record_from_rollout(graded, error="boom")["accuracy"] == 0
    excluded = Rollout(task_id="multi_turn_miss_func_1", mode="eval", excluded=True, exclude_reason="env_protocol",
                       stop_reason="excluded", messages=[{"role": "error", "content": "no verdict"}])
    assert results.record_from_rollout(excluded)["error"] == "excluded (env_protocol): no verdict"
    failed = results.error_record("multi_turn_long_context_2", "PolicyError: server exploded")
    assert (failed["accuracy"], failed["stop_reason"], failed["category"]) == (0, "error", "multi_turn_long_context")


def test_summary_write_and_read_back(tmp_path):
    records = [{"task_id": f"{c}_{i}", "category": c, "accuracy": int(i < k), "failure_tags": ["pass"],
                "paper_labels": ["pass"]}
               for c, k in zip(CATEGORIES, (1, 2, 3, 4), strict=True) for i in range(4)]
    summary = results.build_summary(records, "p", "eval", 1.23456, ["a note"])
    assert summary["accuracy"]["multi_turn_base"] == 0.25 and summary["count"]["multi_turn_base"] == 4
    assert summary["accuracy"]["average"] == pytest.approx((0.25 + 0.5 + 0.75 + 1.0) / 4)
    se = [math.sqrt(p * (1 - p) / 4) for p in (0.25, 0.5, 0.75, 1.0)]
    assert summary["stderr"]["average"] == pytest.approx(math.sqrt(sum(e * e for e in se)) / 4)
    assert summary["wall_s"] == 1.235 and summary["tag_counts"]["multi_turn_base"] == {"pass": 4}

    out = tmp_path / "run" / "eval" / "last"
    results.write_eval_dir(out, records, summary, {"prereq_conversations.jsonl": [{"id": "x"}]})
    assert results.read_jsonl(out / "prereq_conversations.jsonl") == [{"id": "x"}]
    assert json.loads((out / "summary.json").read_text()) == summary
    assert results.read_summary(tmp_path / "run") == summary  # a run directory resolves to eval/last
    assert results.read_records(out) == records
    (out / "summary.json").unlink()
    rebuilt = results.read_summary(out)  # aggregated from results.jsonl when there is no summary
    assert rebuilt["accuracy"] == summary["accuracy"] and rebuilt["count"] == summary["count"]


def test_bad_files_are_clear_errors(tmp_path):
    (tmp_path / "results.jsonl").write_text('{"task_id": "multi_turn_base_1", "accuracy": 1}\n[1, 2]\n')
    with pytest.raises(results.EvalDataError, match="results.jsonl:2: expected a JSON object"):
        results.read_records(tmp_path)
    (tmp_path / "results.jsonl").write_text('{"task_id": "multi_turn_base_1", "accuracy": 0.5}\n')
    with pytest.raises(ValueError, match="accuracy must be 0 or 1"):
        results.read_summary(tmp_path)
    (tmp_path / "summary.json").write_text("{oops")
    with pytest.raises(ValueError, match="summary.json: not JSON"):
        results.read_summary(tmp_path)
    (tmp_path / "results.jsonl").unlink()  # a summary alone: no per-task records to read
    with pytest.raises(ValueError, match="no results.jsonl"):
        results.read_records(tmp_path)
    with pytest.raises(ValueError, match="not an evaluation directory"):
        results.read_summary(tmp_path / "nowhere")


def test_ood_summary_averages_sub_categories():
    records = [{"category": "memory", "bfcl_category": "memory_kv", "accuracy": a} for a in (1, 1, 0, 0)]
    records += [{"category": "memory", "bfcl_category": "memory_rec_sum", "accuracy": a} for a in (1, 1, 1, 1)]
    summary = results.ood_summary(records, "bfcl_v4", "p", 0.0, [])
    assert summary["accuracy"]["memory"] == 0.75 and summary["count"]["memory"] == 8
    assert summary["stderr"]["memory"] == pytest.approx(math.sqrt(0.5 * 0.5 / 4) / 2)
    assert summary["breakdown"]["memory_rec_sum"] == {"accuracy": 1.0, "stderr": 0.0, "count": 4}


def test_default_eval_name_tells_subsets_and_rules_apart():
    assert results.default_eval_name("empty", "eval") == "empty_eval"
    assert results.default_eval_name("hf:runs/x/step_4", "eval", rules="official") == "hf_runs_x_step_4_eval_official"
    one = results.default_eval_name("empty", "eval", ["multi_turn_base_3"])
    two = results.default_eval_name("empty", "eval", ["multi_turn_base_3", "multi_turn_base_4"])
    assert one == "empty_multi_turn_base_3" and two.startswith("empty_2tasks-") and two != "empty_eval"
    # The same subset in another order is the same evaluation; another subset of the same size is not.
    assert results.default_eval_name("empty", "eval", ["multi_turn_base_4", "multi_turn_base_3"]) == two
    assert results.default_eval_name("empty", "eval", ["multi_turn_base_3", "multi_turn_base_5"]) != two
    assert results.default_eval_name("empty", "eval", benchmark="bfcl_v4_memory") == "empty_bfcl_v4_memory"


def test_a_non_empty_output_directory_is_refused_unless_resume_or_overwrite(tmp_path):
    out = tmp_path / "eval"
    results.claim_output_dir(out)  # absent: fine
    out.mkdir()
    results.claim_output_dir(out)  # empty: fine
    (out / results.RESULTS_FILE).write_text('{"task_id": "multi_turn_base_1"}\n')
    (out / results.SUMMARY_FILE).write_text("{}")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="refusing to overwrite.*--resume.*--overwrite"):
        results.claim_output_dir(out)
    assert (out / results.RESULTS_FILE).read_text() == '{"task_id": "multi_turn_base_1"}\n'
    results.claim_output_dir(out, resume=True)  # resume keeps everything
    assert (out / results.RESULTS_FILE).is_file()
    with pytest.raises(ValueError, match="give one"):
        results.claim_output_dir(out, resume=True, overwrite=True)
    results.claim_output_dir(out, overwrite=True)  # replaces the evaluation's own files only
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    with pytest.raises(ValueError, match="is a file"):
        results.claim_output_dir(out / "notes.txt")
