"""A scripted OpenAI-compatible chat server on a loopback port, for driving τ²-bench end to end in tests.

A real user-simulator model (the paper's gpt-4.1, or even a small local one) cannot run in this CPU sandbox in
test time, so the tests stand this server in for both τ² endpoints; τ² itself (its orchestrator, environments,
tools, user-simulator and agent classes, LiteLLM calls over HTTP, evaluator and metrics) is the real package.

``/v1/chat/completions`` answers by model name:

- ``scripted-user`` (the user simulator): first turn, a request for help; afterwards τ²'s stop token, so every
  conversation ends after one exchange.
- ``scripted-policy`` (the agent): if its request offers tools and no tool result has come back since the last
  user message, it calls the first tool with placeholder arguments (exercising τ²'s tool path and its error
  handling); otherwise it answers in plain text.

Every request is kept in ``requests`` (model, roles, tool names) so tests can check what τ² sent.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

USER_MODEL = "scripted-user"
POLICY_MODEL = "scripted-policy"
USER_OPENING = "Hi, I need help with my account, please."
USER_STOP = "###STOP###"
POLICY_TEXT = "I am sorry, I cannot help with that."


def _placeholder(schema: dict) -> object:
    kind = schema.get("type")
    return {"integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}.get(kind, "unknown")


def _policy_reply(body: dict) -> dict:
    messages = body.get("messages", [])
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    answered = any(m.get("role") == "tool" for m in messages[last_user + 1:])
    tools = body.get("tools") or []
    if tools and not answered:
        function = tools[0]["function"]
        params = function.get("parameters", {})
        args = {name: _placeholder(params.get("properties", {}).get(name, {})) for name in params.get("required", [])}
        call = {"id": f"call_{len(messages)}", "type": "function",
                "function": {"name": function["name"], "arguments": json.dumps(args)}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"role": "assistant", "content": POLICY_TEXT}


def _user_reply(body: dict) -> dict:
    spoken = sum(m.get("role") == "assistant" for m in body.get("messages", []))
    return {"role": "assistant", "content": USER_OPENING if spoken == 0 else USER_STOP}


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedOpenAI

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {"object": "list", "data": [{"id": m, "object": "model"}
                                                        for m in (USER_MODEL, POLICY_MODEL)]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        model = body.get("model", "")
        if model == USER_MODEL:
            message = _user_reply(body)
        elif model == POLICY_MODEL:
            message = _policy_reply(body)
        else:
            self._send(404, {"error": {"message": f"unknown model {model!r}", "type": "invalid_request_error"}})
            return
        self.server.requests.append({"model": model, "roles": [m.get("role") for m in body.get("messages", [])],
                                     "tools": [t["function"]["name"] for t in body.get("tools") or []],
                                     "temperature": body.get("temperature")})
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        self._send(200, {"id": f"chatcmpl-{len(self.server.requests)}", "object": "chat.completion",
                         "created": int(time.time()), "model": model,
                         "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                         "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})


class ScriptedOpenAI(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int):
        super().__init__(("127.0.0.1", port), _Handler)
        self.requests: list[dict] = []
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def __enter__(self) -> ScriptedOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)
