"""`python -m seal.evaluate` on the held-in tasks: self-checks, the output contract, step limits, checkpoints."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from env_service.vocab import CATEGORIES
from seal.eval import evaluate as ev
from seal.eval import held_in, run_checkpoints, service
from seal.eval import notes as summary_notes
from seal.eval.policies import Policy, PolicyError, constant_agent
from seal.eval.results import read_summary
from seal.report.tables import held_in_estimates
from seal.rollout.client import EnvClient
from seal.run_dir import select_checkpoints

RESULT_KEYS = {"task_id", "category", "accuracy", "progress", "failure_tags", "paper_labels", "num_model_calls",
               "messages", "error"}
SUMMARY_KEYS = {"policy", "split", "n", "accuracy", "stderr", "count", "tag_counts", "label_counts", "wall_s",
                "notes"}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def ground_truth_eval(tmp_path_factory):
    out = tmp_path_factory.mktemp("gt")
    summary = held_in.evaluate(held_in.EvalRequest(policy="ground_truth", out=out, progress=False))
    return out, summary


@pytest.mark.slow  # a full 400-task evaluation (the module fixture)
def test_ground_truth_scores_100_except_the_known_anomaly(ground_truth_eval, capsys):
    out, summary = ground_truth_eval
    acc = summary["accuracy"]
    assert summary["n"] == 400 and summary["count"] == {c: 100 for c in CATEGORIES}
    assert acc["multi_turn_base"] == acc["multi_turn_miss_param"] == acc["multi_turn_long_context"] == 1.0
    assert acc["multi_turn_miss_func"] == 0.99  # strict availability (release default)
    assert acc["average"] == pytest.approx(0.9975)
    failed = [r["task_id"] for r in read_jsonl(out / "results.jsonl") if r["accuracy"] != 1]
    assert failed == ["multi_turn_miss_func_49"]
    anomaly = [n for n in summary["notes"] if "multi_turn_miss_func_49" in n]
    assert anomaly and "ground-truth anomaly" in anomaly[0]
    assert any("step limit" in n and "covers the longest" in n for n in summary["notes"])
    # How long it took is in the summary's notes and printed here; no bar on it (a shared machine's speed varies).
    print(f"\nground-truth evaluation of 400 tasks: {summary['wall_s']:.1f} s")
    summary_notes.print_summary(summary, out)
    printed = capsys.readouterr().out
    assert "| Average | Base | Miss Func | Miss Param | Long Context |" in printed
    assert "| 99.75 ± 0.25 | 100.00 ± 0.00 | 99.00 ± 0.99 | 100.00 ± 0.00 | 100.00 ± 0.00 |" in printed


@pytest.mark.slow  # a full 400-task evaluation (the module fixture)
def test_output_follows_the_run_directory_contract(ground_truth_eval):
    out, summary = ground_truth_eval
    records = read_jsonl(out / "results.jsonl")
    assert len(records) == 400 and len({r["task_id"] for r in records}) == 400
    for record in records:
        assert set(record) >= RESULT_KEYS
        assert record["accuracy"] in (0, 1) and record["error"] is None
        assert record["messages"][0]["role"] == "system" and record["messages"][1]["role"] == "user"
        assert record["num_model_calls"] == sum(m["role"] == "assistant" for m in record["messages"])
        assert len(record["failure_tags"]) == len(record["paper_labels"]) == record["num_turns"]
    written = json.loads((out / "summary.json").read_text())
    assert set(written) >= SUMMARY_KEYS and written["policy"] == "ground_truth" and written["split"] == "eval"
    # The average's error is the category errors combined: sqrt(sum se_c^2) / 4.
    se = written["stderr"]
    assert se["average"] == pytest.approx(math.sqrt(sum(se[c] ** 2 for c in CATEGORIES)) / 4)
    assert se["multi_turn_miss_func"] == pytest.approx(math.sqrt(0.99 * 0.01 / 100))
    # The report code reads it as a held-in row.
    estimates = held_in_estimates(read_summary(out))
    assert estimates["average"].value == pytest.approx(0.9975)


@pytest.mark.slow  # a full 400-task evaluation
def test_empty_policy_scores_zero(tmp_path):
    summary = held_in.evaluate(held_in.EvalRequest(policy="empty", out=tmp_path, progress=False))
    assert summary["n"] == 400
    assert all(value == 0.0 for value in summary["accuracy"].values())
    records = read_jsonl(tmp_path / "results.jsonl")
    # One plain reply per turn: every turn is reached and tagged, none passes unless it expected no call.
    assert all(r["num_model_calls"] == r["num_turns"] for r in records)
    assert all(set(r["failure_tags"]) <= {"empty_turn_model_response", "correct_abstention"} for r in records)
    assert any("every task scored 0 as expected" in n for n in summary["notes"])


def test_a_spot_check_never_replaces_an_earlier_result(service_url, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    common = ["--policy", "empty", "--env-url", service_url, "--no-progress"]
    assert ev.main([*common, "--tasks", "multi_turn_base_1,multi_turn_base_2"]) == 0
    (first,) = (tmp_path / "evals").iterdir()
    before = (first / "results.jsonl").read_text()
    # A one-task spot check goes to its own default directory, not into the two-task result.
    assert ev.main([*common, "--tasks", "multi_turn_base_1"]) == 0
    assert sorted(p.name for p in (tmp_path / "evals").iterdir()) == sorted([first.name, "empty_multi_turn_base_1"])
    # Another evaluation written into a non-empty --out is refused and leaves it untouched ...
    assert ev.main([*common, "--tasks", "multi_turn_base_3", "--out", str(first)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert (first / "results.jsonl").read_text() == before
    # ... unless asked to replace it.
    assert ev.main([*common, "--tasks", "multi_turn_base_3", "--out", str(first), "--overwrite"]) == 0
    assert [r["task_id"] for r in read_jsonl(first / "results.jsonl")] == ["multi_turn_base_3"]


def test_official_availability_passes_the_anomaly(tmp_path, capsys):
    code = ev.main(["--policy", "ground_truth", "--tasks", "multi_turn_miss_func_49", "--official-availability",
                    "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["accuracy"]["multi_turn_miss_func"] == 1.0 and summary["split"] == "tasks"
    assert any("official (--official-availability)" in n for n in summary["notes"])
    printed = capsys.readouterr().out
    assert "| – | – | 100.00 ± 0.00 | – | – |" in printed  # only Miss Func has data; no average


def test_ground_truth_step_budget_is_raised_for_long_replays(tmp_path):
    tasks = ["multi_turn_long_context_38", "multi_turn_long_context_46"]  # train tasks: 37 and 35 model calls
    raised = held_in.evaluate(held_in.EvalRequest(policy="ground_truth", out=tmp_path / "raised", tasks=tasks,
                                                  progress=False))
    assert raised["accuracy"]["multi_turn_long_context"] == 1.0
    assert any("raised from the release's 20 to 37" in n for n in raised["notes"])
    # Under the release's 20-step episode limit the same replays are cut off and fail: the budget matters.
    release = held_in.evaluate(held_in.EvalRequest(policy="ground_truth", out=tmp_path / "release", tasks=tasks,
                                                   service=service.ServiceSettings(max_steps=20), progress=False))
    assert release["accuracy"]["multi_turn_long_context"] == 0.0
    assert all(r["end_reason"] == "step_limit" for r in read_jsonl(tmp_path / "release" / "results.jsonl"))


def test_policy_errors_are_recorded_per_task_and_flagged(service_url):
    """A failing policy call fails its task (accuracy 0, error set) without stopping the other tasks."""
    tasks = ["multi_turn_base_100", "multi_turn_base_101"]

    async def broken(messages):
        raise PolicyError("server exploded")

    policy = Policy("test:mixed", "text",
                    lambda task_id: broken if task_id == tasks[0] else constant_agent("plain answer"))

    async def go():
        async with EnvClient(service_url) as client:
            return await held_in.evaluate_tasks(policy, client, tasks, concurrency=2, progress=False)

    records = asyncio.run(go())
    assert [r["task_id"] for r in records] == tasks
    assert records[0]["accuracy"] == 0 and "server exploded" in records[0]["error"]
    assert records[1]["error"] is None and records[1]["num_model_calls"] == records[1]["num_turns"]
    assert summary_notes.error_notes(records) == ["1 task(s) errored and count as failures: multi_turn_base_100"]


def test_unknown_task_is_a_clear_cli_error(tmp_path, capsys):
    code = ev.main(["--policy", "empty", "--tasks", "multi_turn_base_9999", "--out", str(tmp_path)])
    assert code == 2 and "unknown task ids" in capsys.readouterr().err


def test_policy_and_run_are_exclusive(capsys):
    with pytest.raises(SystemExit):
        ev.parse_args(["--policy", "empty", "--run", "runs/x"])
    with pytest.raises(SystemExit):
        ev.parse_args([])


def test_hf_batch_size_flag():
    assert ev.parse_args(["--policy", "empty", "--hf-batch-size", "1"]).hf_batch_size == 1
    assert ev.parse_args(["--policy", "empty"]).hf_batch_size == 32
    with pytest.raises(SystemExit):
        ev.parse_args(["--policy", "empty", "--hf-batch-size", "0"])


# --- checkpoint selection ------------------------------------------------------------------------------


def make_run(root: Path, steps: list[int], averages: dict[int, float], best: dict | None) -> Path:
    ckpts = root / "checkpoints"
    for step in steps:
        (ckpts / f"step_{step}").mkdir(parents=True)
    (ckpts / "latest.json").write_text(json.dumps({"step": max(steps), "path": f"checkpoints/step_{max(steps)}"}))
    if best is not None:
        (ckpts / "best.json").write_text(json.dumps(best))
    lines = [{"step": s, "val/accuracy/average": a, "val/accuracy/multi_turn_base": 1 - a} for s, a in averages.items()]
    lines.insert(1, {"step": 3, "train/reward_mean": 0.5})  # training lines carry no validation metric
    (root / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return root


def test_select_checkpoints_uses_latest_and_best_json(tmp_path):
    run = make_run(tmp_path, [10, 20, 30], {0: 0.1, 10: 0.4, 20: 0.3, 30: 0.35},
                   {"step": 10, "path": "checkpoints/step_10", "metric": "val/accuracy/average", "value": 0.4})
    last, best = select_checkpoints(run)
    assert (last.name, last.step, last.path) == ("last", 30, run / "checkpoints/step_30")
    assert (best.name, best.step, best.path) == ("best", 10, run / "checkpoints/step_10")
    assert "best.json" in best.selection


def test_best_is_reselected_on_the_overall_average_when_best_json_used_one_category(tmp_path):
    # The release picked "best" on the base category only; the contract is the overall average.
    run = make_run(tmp_path, [10, 20, 30], {0: 0.1, 10: 0.4, 20: 0.45, 30: 0.45},
                   {"step": 0, "path": "checkpoints/step_0", "metric": "val/accuracy/multi_turn_base", "value": 0.9})
    _, best = select_checkpoints(run)
    assert best.step == 20  # highest average among saved checkpoints, earliest on a tie (strict >)
    assert "re-selected" in best.selection and "multi_turn_base" in best.selection


def test_best_without_best_json_and_without_metrics(tmp_path):
    run = make_run(tmp_path, [5, 7], {0: 0.2, 5: 0.1, 7: 0.3}, None)
    assert [(c.name, c.step) for c in select_checkpoints(run)] == [("last", 7), ("best", 7)]
    (run / "metrics.jsonl").unlink()
    assert [c.name for c in select_checkpoints(run)] == ["last"]
    with pytest.raises(ValueError, match="no checkpoints"):
        select_checkpoints(tmp_path / "missing")


def test_hf_model_dir_explains_verl_checkpoints(tmp_path):
    (tmp_path / "actor").mkdir()
    with pytest.raises(PolicyError, match="verl.model_merger"):
        run_checkpoints.hf_model_dir(tmp_path)
    hf = tmp_path / "huggingface"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    assert run_checkpoints.hf_model_dir(tmp_path) == hf


def test_run_evaluates_last_and_best_checkpoints(service_url, tmp_path, capsys):
    import shutil

    from seal.models.tiny import build_tiny_qwen2

    run = make_run(tmp_path / "run", [2, 4], {0: 0.0, 2: 0.5, 4: 0.25},
                   {"step": 2, "path": "checkpoints/step_2", "metric": "val/accuracy/average", "value": 0.5})
    build_tiny_qwen2(run / "checkpoints" / "step_2")
    shutil.rmtree(run / "checkpoints" / "step_4")
    shutil.copytree(run / "checkpoints" / "step_2", run / "checkpoints" / "step_4")
    args = ["--run", str(run), "--tasks", "multi_turn_base_100", "--env-url", service_url,
            "--max-tokens-per-call", "4", "--device", "cpu", "--no-progress"]
    assert ev.main(args) == 0
    # A task subset has its own directories (never the paper's eval/last and eval/best).
    last_dir, best_dir = (run / "eval" / f"{name}_multi_turn_base_100" for name in ("last", "best"))
    last = json.loads((last_dir / "summary.json").read_text())
    best = json.loads((best_dir / "summary.json").read_text())
    assert last["checkpoint"]["step"] == 4 and best["checkpoint"]["step"] == 2
    assert last["policy"] == f"hf:{run / 'checkpoints' / 'step_4'}"
    assert any("honest number" in n for n in last["notes"]) and any("optimistic" in n for n in best["notes"])
    assert any("evaluated here: 1 given by --tasks" in n for n in best["notes"])
    assert not any("400" in n for n in best["notes"] if "optimistic" in n)  # says what was evaluated
    assert len(read_jsonl(best_dir / "results.jsonl")) == 1
    assert read_summary(last_dir)["checkpoint"]["name"] == "last"

    # Best = last: evaluated once, the results copied.
    (run / "checkpoints" / "best.json").write_text(json.dumps(
        {"step": 4, "path": "checkpoints/step_4", "metric": "val/accuracy/average", "value": 0.6}))
    assert ev.main(args) == 2  # the directories hold results: replaced only when asked
    err = capsys.readouterr().err
    assert "--resume" in err and "--overwrite" in err and "--out" not in err  # only advice that --run takes
    assert ev.main([*args, "--overwrite"]) == 0
    best = json.loads((best_dir / "summary.json").read_text())
    assert best["checkpoint"]["step"] == 4 and any("results copied" in n for n in best["notes"])
    assert any("optimistic" in n for n in best["notes"])
    assert not any(n.startswith("last checkpoint") for n in best["notes"])
    assert (best_dir / "results.jsonl").read_text() == (last_dir / "results.jsonl").read_text()
    # --resume follows --policy's rule: the finished tasks are kept, none is played again.
    assert ev.main([*args, "--resume"]) == 0
    last = json.loads((last_dir / "summary.json").read_text())
    assert any("resumed: 1 task(s) kept" in n for n in last["notes"]) and last["n"] == 1


def test_run_names_and_refuses_out(tmp_path):
    base = held_in.EvalRequest(policy="", out=tmp_path)
    assert run_checkpoints.run_eval_name("last", base) == "last"  # the paper's evaluation: what seal-tables reads
    official = held_in.EvalRequest(policy="", out=tmp_path, rules="official")
    assert run_checkpoints.run_eval_name("best", official) == "best_eval_official"
    two = held_in.EvalRequest(policy="", out=tmp_path, tasks=["multi_turn_base_50", "multi_turn_base_132"])
    assert run_checkpoints.run_eval_name("last", two).startswith("last_2tasks-")
    with pytest.raises(SystemExit):  # --run writes into the run; an --out it would ignore is refused
        ev.parse_args(["--run", "runs/x", "--out", str(tmp_path)])
    assert ev.parse_args(["--run", "runs/x", "--resume"]).resume


def test_a_failed_start_claims_nothing(service_url, tmp_path, capsys):
    """A policy that cannot be built writes nothing: the rerun after the fix is not refused, and an earlier
    result survives a bad --overwrite."""
    out = tmp_path / "evals" / "x"
    common = ["--tasks", "multi_turn_base_50", "--env-url", service_url, "--no-progress", "--out", str(out)]
    assert ev.main(["--policy", f"hf:{tmp_path / 'nonexistent_dir'}", *common]) == 2
    assert "no model directory" in capsys.readouterr().err
    assert not out.exists()
    assert ev.main(["--policy", "vllm:builtin:nonexistent", *common]) == 2
    assert "unknown built-in model" in capsys.readouterr().err and not out.exists()
    assert ev.main(["--policy", "empty", *common]) == 0  # the rerun after the fix
    before = (out / "results.jsonl").read_text()
    assert ev.main(["--policy", "hf:nonexistent_dir", *common, "--overwrite"]) == 2
    assert (out / "results.jsonl").read_text() == before
    assert json.loads((out / "summary.json").read_text())["status"] == "complete"


def test_notes_say_which_tasks_were_evaluated(service_url, tmp_path):
    summary = held_in.evaluate(held_in.EvalRequest(policy="empty", out=tmp_path, tasks=["multi_turn_base_50",
                                                   "multi_turn_base_0"], env_url=service_url, progress=False))
    (note,) = [n for n in summary["notes"] if n.startswith("tasks:")]
    assert "2 given by --tasks, 1 of them from the eval split" in note
    assert note.endswith("from the train split (trained on, not held-in): multi_turn_base_0")
    assert held_in.task_set_note("eval", None).startswith("tasks: the eval split, the 400 held-in tasks")


def test_policy_paths_follow_the_input_path_rule(tmp_path, monkeypatch):
    """`hf:<dir>` from the cwd when it exists there, else from the project (like every input path)."""
    from seal.eval.policies import local_model
    from seal.io_utils import PROJECT_ROOT

    monkeypatch.chdir(tmp_path)
    assert local_model("hf", "exp") == str(PROJECT_ROOT / "exp")  # not in the cwd: the project's
    (tmp_path / "exp").mkdir()
    assert local_model("hf", "exp") == str(tmp_path / "exp")  # the cwd's first
    assert local_model("vllm", "Org/hub-model") == "Org/hub-model"  # vllm: a hub id is left to vLLM
    with pytest.raises(PolicyError, match="looked in the cwd, then the project"):
        local_model("hf", "no/such/dir")

