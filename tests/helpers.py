"""Small helpers shared by the tests."""

from __future__ import annotations

from typing import Any


def sampled_spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of ``ids`` where ``mask`` is 1: the model's sampled spans of a token-exact response."""
    out, cur = [], []
    for value, keep in zip(ids, mask, strict=True):
        if keep:
            cur.append(value)
        elif cur:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def play_turns(task: Any, turns: list[list[str]], config: Any, mode: str = "eval") -> Any:
    """An ``env_service`` episode of ``task`` (raw interface) played with raw assistant messages turn by turn;
    each turn is closed with a plain reply. Returns the episode (call ``evaluate()`` for its verdict)."""
    from env_service.episode import Episode
    from env_service.interface import parse_interface

    episode = Episode("t", task, mode, parse_interface(None), config)
    for messages in turns:
        for content in messages:
            episode.step(content)
        if not episode.done:
            episode.step("Done.")
    return episode


class BackgroundHTTPServer:
    """A `ThreadingHTTPServer` with `handler` on a free loopback port, served from a thread for the time of a
    `with` block; `address` is its `http://127.0.0.1:<port>`."""

    def __init__(self, handler: type) -> None:
        import threading
        from http.server import ThreadingHTTPServer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.address = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


# Ray starts its worker processes at nice 15 (`RAY_worker_niceness`), and a verl run on CPU computes only in them
# (the FSDP ranks, the vLLM servers and their engine processes inherit it). In CI the other pytest-xdist worker's
# tests run at nice 0, so they took the cores first and the launches, CI's longest path, waited: the SmolLM2 launch
# took 220 s alone and 664 s in a CI run. The launches' tests give Ray's workers the tests' own priority.
RAY_AT_TEST_PRIORITY = {"RAY_worker_niceness": "0"}
