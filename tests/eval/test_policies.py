"""Policy backends: spec parsing, self-check scripts, an OpenAI-compatible server (in-process fake), hf on a
tiny offline Qwen2."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from env_service.parser import parse_tool_calls
from env_service.tasks import TURN_END_REPLY, ground_truth_replies, ground_truth_tool_calls, load_tasks
from seal.eval import evaluate as ev
from seal.eval import held_in
from seal.eval.policies import ContextLimitReached, OpenAIChat, PolicyError, PolicyOptions, parse_policy

# --- specs and self-check scripts ----------------------------------------------------------------------


@pytest.mark.parametrize("spec, message", [
    ("nonsense", "unknown policy"),
    ("tgi:somewhere", "unknown policy kind"),
    ("openai:http://127.0.0.1:1/v1", "openai:<base_url>#<model>"),
    ("openai:ftp://x#m", "must start with http"),
    ("openai:http://127.0.0.1:1/v1#", "model name"),
    ("hf:/no/such/model/dir", "no model directory"),
])
def test_bad_specs_are_clear_errors(spec, message):
    with pytest.raises(PolicyError, match=message):
        parse_policy(spec)


def test_vllm_policy_explains_a_missing_vllm(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, as without vLLM (CI has it)
    with pytest.raises(PolicyError, match="needs vLLM"):
        parse_policy(f"vllm:{tmp_path}")


def test_ground_truth_script_replays_calls_one_per_step():
    task_id = "multi_turn_long_context_38"
    script = ground_truth_replies(task_id)
    gt = ground_truth_tool_calls(task_id)
    assert len(script) == sum(len(turn) + 1 for turn in gt) == 37
    replayed, turn = [[]], 0
    for text in script:
        parsed = parse_tool_calls(text)
        assert parsed.error is None and len(parsed.calls) <= 1
        if parsed.calls:
            replayed[turn].append(parsed.calls[0])
        else:
            assert text == TURN_END_REPLY
            replayed.append([])
            turn += 1
    assert replayed[:-1] == gt and len(gt) == len(load_tasks()[task_id].questions)


def test_self_check_agents():
    async def go():
        gt = parse_policy("ground_truth").agent("multi_turn_base_100")
        empty = parse_policy("empty").agent("multi_turn_base_100")
        first = await gt([])
        assert parse_tool_calls(first).calls
        replies = [await empty([]) for _ in range(3)]
        assert all(not parse_tool_calls(r).calls and r for r in replies)

    asyncio.run(go())


# --- OpenAI-compatible server ---------------------------------------------------------------------------

MALFORMED_BODY = object()
CONTEXT_ERROR = object()
STRUCTURED = "structured:"  # reply carried as a structured tool call (content null) instead of text


class FakeOpenAI:
    """A chat-completions server answering from per-conversation scripts (keyed by the first user message)."""

    def __init__(self, scripts: dict[str, list]):
        import uvicorn

        self.scripts = scripts
        self.requests: list[dict] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request):
            body = await request.json()
            self.requests.append(body)
            messages = body["messages"]
            script = self.scripts[messages[1]["content"]]
            index = sum(m["role"] == "assistant" for m in messages)
            reply = script[index] if index < len(script) else TURN_END_REPLY
            if reply is MALFORMED_BODY:
                return JSONResponse({"unexpected": "shape"})
            if reply is CONTEXT_ERROR:
                return JSONResponse({"error": {"message": "This model's maximum context length is 16384 tokens."}},
                                    status_code=400)
            message: dict = {"role": "assistant", "content": reply}
            if reply.startswith(STRUCTURED):
                call = json.loads(reply.removeprefix(STRUCTURED))
                message = {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_0", "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]}
            return {"id": "x", "object": "chat.completion", "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}

        # The socket listens before the server runs: connections made while it starts wait in the backlog, so
        # nothing has to wait for (or time) the start.
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def test_openai_policy_drives_tasks_with_tool_calls_and_malformed_replies(service_url, tmp_path):
    tasks = load_tasks()
    a, b, c, d = ("multi_turn_base_100", "multi_turn_long_context_144", "multi_turn_miss_param_131",
                  "multi_turn_miss_func_102")
    first_call = ground_truth_tool_calls(b)[0][0]
    scripts = {
        # A malformed tool call first (the service rejects it, the turn goes on), then the ground truth.
        tasks[a].questions[0]: ['<tool_call>\n{"name": "ls", "arguments": oops}\n</tool_call>',
                                *ground_truth_replies(a)],
        # The first call comes back as a structured tool call (servers with a tool parser), the rest as text.
        tasks[b].questions[0]: [STRUCTURED + json.dumps(first_call), *ground_truth_replies(b)[1:]],
        # A reply that is not a chat completion: the task is recorded as an error.
        tasks[c].questions[0]: [MALFORMED_BODY],
        # The server refuses the conversation as too long: the episode stops and is graded.
        tasks[d].questions[0]: ["Let me think.", CONTEXT_ERROR],
    }
    assert len(scripts) == 4  # the server tells conversations apart by their first user message
    with FakeOpenAI(scripts) as server:
        code = ev.main(["--policy", f"openai:{server.url}#fake-model", "--tasks", f"{a},{b},{c},{d}",
                        "--env-url", service_url, "--out", str(tmp_path), "--no-progress", "--concurrency", "4"])
    assert code == 1  # a task errored: flagged in the exit status
    records = {r["task_id"]: r for r in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines())}

    assert records[a]["accuracy"] == 1 and records[a]["error"] is None
    assert records[a]["num_model_calls"] == len(ground_truth_replies(a)) + 1
    assert records[a]["messages"][3]["content"].startswith("[ERROR] Tool call rejected")

    assert records[b]["accuracy"] == 1 and records[b]["error"] is None
    assert parse_tool_calls(records[b]["messages"][2]["content"]).calls == [first_call]

    assert records[c]["accuracy"] == 0 and "malformed chat-completions reply" in records[c]["error"]

    assert records[d]["accuracy"] == 0 and records[d]["error"] is None
    assert records[d]["stop_reason"] == "context_limit" and records[d]["num_model_calls"] == 1
    assert records[d]["end_reason"] == "evaluated_early"

    # What the server saw: greedy requests for the named model with the service's own messages.
    assert all(r["model"] == "fake-model" and r["temperature"] == 0.0 and r["max_tokens"] == 4096
               for r in server.requests)
    first = next(r for r in server.requests if r["messages"][1]["content"] == tasks[a].questions[0])
    assert first["messages"] == records[a]["messages"][:2]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["n"] == 4 and any("1 task(s) errored" in n for n in summary["notes"])


def test_openai_chat_retries_server_errors_only():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            return httpx.Response(503, text="busy")
        if len(calls) == 2:
            return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": "hi"}}]})
        return httpx.Response(404, text="no such model")

    async def go():
        chat = OpenAIChat("http://fake/v1", "m", backoff=0.0, transport=httpx.MockTransport(handler))
        assert await chat.complete([{"role": "user", "content": "x"}]) == "hi"
        with pytest.raises(PolicyError, match="404"):
            await chat.complete([{"role": "user", "content": "x"}])
        assert len(calls) == 3  # the 404 was not retried
        await chat.aclose()

    asyncio.run(go())


def test_context_error_is_recognised():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"object": "error", "message": "maximum context length is 32768 tokens"})

    async def go():
        chat = OpenAIChat("http://fake/v1", "m", transport=httpx.MockTransport(handler))
        with pytest.raises(ContextLimitReached):
            await chat.complete([{"role": "user", "content": "x"}])
        await chat.aclose()

    asyncio.run(go())


# --- hf on a tiny random Qwen2 --------------------------------------------------------------------------


def test_hf_policy_runs_on_a_tiny_qwen2(service_url, tmp_path):
    from seal.models.tiny import build_tiny_qwen2

    model_dir = build_tiny_qwen2(tmp_path / "tiny")
    tasks = ["multi_turn_base_100", "multi_turn_miss_param_100"]
    out = tmp_path / "eval"
    summary = held_in.evaluate(held_in.EvalRequest(policy=f"hf:{model_dir}", out=out, tasks=tasks, env_url=service_url,
                                                   concurrency=2, progress=False,
                                                   options=PolicyOptions(max_tokens_per_call=8, device="cpu")))
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in records] == tasks and summary["n"] == 2
    for record in records:
        assert record["error"] is None and record["accuracy"] in (0, 1)
        assistant = [m for m in record["messages"] if m["role"] == "assistant"]
        assert record["num_model_calls"] == len(assistant) >= 1
        assert all(isinstance(m["content"], str) for m in assistant)
        assert record["stop_reason"] in ("done", "max_model_calls")
    assert any(n.startswith("hf: ") and "greedy Hugging Face generation" in n for n in summary["notes"])
