"""The cost budget per model action, on a real service with worker processes (env_service/budget.py, workers.py).

One episode builds a directory DAG that doubles with every copy (BFCL's ``cp`` shares the copied contents) and
then walks it with ``find``: exponential time and memory. Its worker is killed, the episode ends with
``budget_exceeded`` and grades as a failure; an episode pinned to the same worker is rebuilt and goes on as if
nothing happened; the health check answers within 1 s throughout.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from env_service.budget import BudgetExceeded
from env_service.executor import MESSAGE_ID_SPACE, ToolExecutor
from env_service.parser import format_tool_call
from env_service.process import running_service
from env_service.tasks import load_tasks

TASKS = load_tasks()
FS_TASK = next(t.id for t in TASKS.values() if t.involved_classes == ["GorillaFileSystem"] and not t.long_context)
MATH_TASK = next(t.id for t in TASKS.values() if "MathAPI" in t.involved_classes and not t.long_context)


def calls(*pairs: tuple[str, dict]) -> str:
    return "\n".join(format_tool_call(name, args) for name, args in pairs)


DOUBLINGS = calls(
    ("mkdir", {"dir_name": "d"}),
    *[c for i in range(26) for c in (("cp", {"source": "d", "destination": f"c{i}"}),
                                     ("mv", {"source": f"c{i}", "destination": "d"}))],
)


class HealthWatch(threading.Thread):
    """Asks /healthz over and over, counting the answers that came while `action_open` was set: a health check
    sent and answered inside the action shows the event loop kept serving while BFCL code ran."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.failures, self.stop = url, 0, threading.Event()
        self.action_open = threading.Event()
        self.answered_during_action = 0

    def run(self) -> None:
        with httpx.Client(timeout=30.0) as client:
            while not self.stop.is_set():
                sent_inside = self.action_open.is_set()
                try:
                    ok = client.get(f"{self.url}/healthz").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.failures += not ok
                self.answered_during_action += ok and sent_inside and self.action_open.is_set()
                time.sleep(0.05)


def _create(client: httpx.Client, task_id: str) -> str:
    reply = client.post("/episodes", json={"task_id": task_id, "step_limit": {"scope": "episode", "max_steps": 50}})
    assert reply.status_code == 201, reply.text
    return reply.json()["episode_id"]


def _step(client: httpx.Client, eid: str, content: str) -> dict:
    reply = client.post(f"/episodes/{eid}/step", json={"content": content})
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.slow
def test_an_action_over_budget_ends_only_its_episode():
    # --allow-train-on-eval: FS_TASK is an eval-split task, opened in the default (training) mode
    args = ["--workers", "2", "--budget-wall-s", "2", "--budget-memory-mb", "128", "--allow-train-on-eval"]
    with running_service(args) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        culprit = _create(client, FS_TASK)  # worker 0
        other_worker = _create(client, FS_TASK)  # worker 1
        neighbour = _create(client, FS_TASK)  # worker 0, with the culprit
        for eid in (neighbour, other_worker):
            _step(client, eid, calls(("mkdir", {"dir_name": "kept"}), ("cd", {"folder": "kept"})))
        assert _step(client, culprit, DOUBLINGS)["done"] is False
        watch = HealthWatch(url)
        watch.start()
        try:
            watch.action_open.set()
            reply = _step(client, culprit, calls(("find", {"path": "."})))
            watch.action_open.clear()
        finally:
            watch.stop.set()
            watch.join()
        # Cut off by the budget (the worker killed and restarted), not run to its end.
        assert reply["done"] and reply["info"]["error_type"] == "budget_exceeded"
        assert reply["info"]["end_reason"] == "budget_exceeded"
        assert "cost budget" in reply["observation"]["content"]
        # The service kept answering health checks while the action ran (at least two sent and answered inside
        # it: the action takes the 2 s wall budget, the checks come every 50 ms).
        print(f"\nhealth checks answered during the action: {watch.answered_during_action}")
        assert watch.failures == 0 and watch.answered_during_action >= 2, (watch.failures, watch.answered_during_action)
        stats = client.get("/stats").json()
        assert stats["worker_restarts_total"] == 1 and stats["budget_refusals_total"] == 1
        # graded as a failure with its own tag, without BFCL's checker
        result = client.post(f"/episodes/{culprit}/evaluate").json()
        assert result["accuracy"] == 0.0 and "budget_exceeded" in result["failure_tags"]
        assert result["official"]["error_type"] == "multi_turn:budget_exceeded"
        assert result["end_reason"] == "budget_exceeded"
        assert client.post(f"/episodes/{culprit}/step", json={"content": "hi"}).status_code == 409
        # the neighbour was rebuilt in the fresh worker: its state is intact
        for eid in (neighbour, other_worker):
            pwd = _step(client, eid, calls(("pwd", {})))
            assert "kept" in pwd["observation"]["content"] and pwd["info"]["error_type"] is None
            assert client.post(f"/episodes/{eid}/evaluate").status_code == 200
        # a known-expensive call is refused before it runs: no worker restart
        math = _create(client, MATH_TASK)
        reply = _step(client, math, calls(("power", {"base": 3, "exponent": 10**9})))
        assert reply["done"] and reply["info"]["error_type"] == "budget_exceeded"
        assert client.post(f"/episodes/{math}/evaluate").json()["failure_tags"][0] == "budget_exceeded"
        # deep nesting is a parse error for the model, never a 500, and the episode goes on
        deep = "[" * 100_000 + "]" * 100_000
        fresh = _create(client, FS_TASK)
        reply = _step(client, fresh, '<tool_call>{"name": "ls", "arguments": {"a": ' + deep + "}}</tool_call>")
        assert reply["info"]["error_type"] == "parse_error" and not reply["done"]
        stats = client.get("/stats").json()
        assert stats["worker_restarts_total"] == 1 and stats["budget_refusals_total"] == 2


def test_message_id_space_exhaustion_is_refused_not_an_endless_loop():
    task = next(t for t in TASKS.values() if "MessageAPI" in t.involved_classes)
    ex = ToolExecutor(task.involved_classes, task.initial_config, False)
    api = ex.instances["MessageAPI"]
    api.generated_ids = set(range(10_000, 10_000 + MESSAGE_ID_SPACE - 1))  # one id left: BFCL would loop forever
    with pytest.raises(BudgetExceeded, match="id space"):
        ex.call("send_message", {"receiver_id": "USR002", "message": "hi"})


def test_too_many_calls_and_oversized_replies_end_the_episode():
    from env_service.budget import Budget
    from env_service.config import EpisodeConfig, StepLimit
    from env_service.episode import Episode
    from env_service.interface import parse_interface

    config = EpisodeConfig(step_limit=StepLimit("episode", 50), budget=Budget(reply_bytes=5_000, max_calls=4))
    episode = Episode("e", TASKS[FS_TASK], "train", parse_interface(None), config)
    reply = episode.step(calls(*[("ls", {})] * 5))
    assert reply["done"] and reply["info"]["error_type"] == "budget_exceeded"
    assert "calls" in reply["observation"]["content"]
    episode = Episode("e", TASKS[FS_TASK], "train", parse_interface(None), config)
    episode.step(calls(("touch", {"file_name": "big.txt"}), ("echo", {"content": "x" * 4_000, "file_name": "big.txt"})))
    reply = episode.step(calls(("cat", {"file_name": "big.txt"}), ("cat", {"file_name": "big.txt"})))
    assert reply["done"] and "reply" in reply["observation"]["content"]
    result = episode.evaluate()
    assert result["accuracy"] == 0.0 and result["official"]["error_type"] == "multi_turn:budget_exceeded"
    assert json.dumps(result)  # a plain, serializable reply
