"""An evaluation never loses its results: hostile policy replies are task errors, each model call has an overall
deadline, SIGTERM keeps the finished tasks and deletes the open episodes, and --resume finishes the run.

A real env service (the session's, on a loopback port) and a local OpenAI-compatible server that misbehaves
on purpose (tests/eval/fake_openai.py)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from env_service.tasks import split_ids
from seal.eval import held_in
from seal.eval.policies import OpenAIChat, Policy, PolicyError, completion_text
from seal.rollout.client import EnvClient
from tests.eval.fake_openai import BODIES, fake_openai

REPO = Path(__file__).resolve().parents[2]
HOSTILE = ["tool_calls_int", "tool_calls_junk", "content_list", "no_choices", "choices_int", "not_json", "empty",
           "null", "huge", "trickle", "slow"]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def open_episodes(url: str) -> int:
    return httpx.get(f"{url}/stats", timeout=10).json()["open_episodes"]


@pytest.mark.parametrize("model", [m for m in BODIES if m != "done"])
def test_every_malformed_reply_shape_is_a_policy_error(model):
    with pytest.raises(PolicyError, match="malformed chat-completions reply"):
        completion_text(BODIES[model])


def test_structured_tool_calls_become_the_text_protocol():
    body = json.dumps({"choices": [{"message": {"content": None, "tool_calls": [
        {"function": {"name": "cd", "arguments": '{"folder": "a"}'}}]}}]}).encode()
    assert completion_text(body) == '<tool_call>\n{"name": "cd", "arguments": {"folder": "a"}}\n</tool_call>'


def test_any_reply_from_any_endpoint_is_that_tasks_error_and_the_run_goes_on(service_url):
    models = [*HOSTILE, "done"]
    tasks = split_ids("eval")[: len(models)]
    with fake_openai() as fake:
        chats = {t: OpenAIChat(fake.url, m, max_retries=0, call_deadline=3.0, max_reply_bytes=1 << 20)
                 for t, m in zip(tasks, models, strict=True)}
        policy = Policy("openai:fake", "text", lambda task_id: chats[task_id].complete,
                        closers=[c.aclose for c in chats.values()])

        async def play():
            async with EnvClient(service_url) as client:
                try:
                    return await held_in.evaluate_tasks(policy, client, tasks, concurrency=len(tasks), progress=False)
                finally:
                    await policy.aclose()

        records = asyncio.run(play())
    by_model = {m: r for m, r in zip(models, records, strict=True)}
    for model in HOSTILE:
        record = by_model[model]
        assert record["accuracy"] == 0 and record["error"] and "PolicyError" in record["error"], (model, record)
    # The trickling and the slow server are cut by the 3 s call deadline (the only source of this error), not by
    # the 600 s socket timeout.
    assert "call deadline" in by_model["trickle"]["error"] and "call deadline" in by_model["slow"]["error"]
    assert "bytes" in by_model["huge"]["error"]
    assert by_model["done"]["error"] is None


def _evaluate_cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "seal.evaluate", "--no-progress", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_sigterm_keeps_finished_tasks_deletes_open_episodes_and_resume_finishes(service_url, tmp_path):
    tasks = split_ids("eval")[:5]
    out = tmp_path / "eval"
    baseline = open_episodes(service_url)
    with fake_openai() as fake:
        fake.hang_after = 7  # a few tasks finish, then the model server stops answering mid-episode
        spec = f"openai:{fake.url}#done"
        common = ["--policy", spec, "--env-url", service_url, "--tasks", ",".join(tasks), "--out", str(out),
                  "--concurrency", "1", "--rules", "official"]
        proc = _evaluate_cli(*common)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (fake.answered >= 7 and open_episodes(service_url) > baseline):
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.3)
        time.sleep(0.5)  # the held request is in flight, its episode open on the service
        kept = read_jsonl(out / "results.jsonl")
        assert 1 <= len(kept) < len(tasks)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, output
        assert open_episodes(service_url) == baseline  # the interrupted episode was deleted
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["n"] == len(kept) and summary["rules"] == "official"
        assert read_jsonl(out / "results.jsonl") == kept

        fake.hang_after = None
        fake.release.set()
        # resuming with another profile is refused; with the same settings it plays only the rest
        request = held_in.EvalRequest(policy=spec, out=out, tasks=tasks, env_url=service_url, concurrency=1,
                                      progress=False, rules="release", resume=True)
        with pytest.raises(ValueError, match="--resume"):
            held_in.evaluate(request)
        before = fake.answered
        held_in.evaluate(held_in.EvalRequest(**{**request.__dict__, "rules": "official"}))
    records = read_jsonl(out / "results.jsonl")
    assert [r["task_id"] for r in records] == tasks
    assert [r for r in records if r["task_id"] in {k["task_id"] for k in kept}] == kept
    assert fake.answered - before == sum(r["num_model_calls"] for r in records if r not in kept)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["n"] == len(tasks)
    assert any(n.startswith(f"resumed: {len(kept)} task(s) kept") for n in summary["notes"])
    assert all(r["rules"] == "official" for r in records)
