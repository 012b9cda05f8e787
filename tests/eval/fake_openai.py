"""A local OpenAI-compatible chat-completions server for tests (a harness: it plays a misbehaving endpoint).

The reply is chosen by the request's ``model``: ``done`` answers ``"Done."``; the others send one broken or
hostile reply each (wrong types, empty, not JSON, huge, slow, trickling one byte every 2 s). ``hang_after``
makes the server stop answering (hold the request) after that many answered requests, until released.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _chat(message: Any) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}).encode()


BODIES: dict[str, bytes] = {
    "done": _chat({"role": "assistant", "content": "Done."}),
    "tool_calls_int": _chat({"role": "assistant", "content": None, "tool_calls": 5}),
    "tool_calls_junk": _chat({"role": "assistant", "content": None, "tool_calls": [{"function": 7}]}),
    "content_list": _chat({"role": "assistant", "content": ["a", "b"]}),
    "no_choices": json.dumps({"choices": []}).encode(),
    "choices_int": json.dumps({"choices": 3}).encode(),
    "not_json": b"<html>bad gateway</html>",
    "empty": b"",
    "null": b"null",
}
HUGE_BYTES = 2 << 20


class FakeOpenAI:
    def __init__(self) -> None:
        self.answered = 0
        self.hang_after: int | None = None
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                model = body.get("model", "done")
                with fake.lock:
                    hang = fake.hang_after is not None and fake.answered >= fake.hang_after
                    if not hang:
                        fake.answered += 1
                if hang:
                    fake.release.wait(120)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up (deadline)
                    self._answer(model)

            def _answer(self, model: str) -> None:
                if model == "slow":
                    time.sleep(30)
                    model = "done"
                if model in ("trickle", "huge"):
                    payload = BODIES["done"] if model == "trickle" else b" " * HUGE_BYTES
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    for i in range(len(payload)):
                        if model == "trickle":
                            self.wfile.write(payload[i:i + 1])
                            self.wfile.flush()
                            time.sleep(2)
                        else:
                            self.wfile.write(payload)
                            return
                    return
                payload = BODIES.get(model, BODIES["done"])
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler


@contextmanager
def fake_openai() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI()
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    server.daemon_threads = True
    fake.server = server
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.release.set()
        server.shutdown()
        server.server_close()
