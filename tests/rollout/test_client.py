"""EnvClient: retries, retry safety per route, replica affinity, errors (in-process fake service)."""

from __future__ import annotations

import asyncio
import json
import re
import socket

import httpx
import pytest

from env_service.protocol import CreateReply, EvaluateReply, HealthReply, Interface, StepReply
from seal.rollout.client import EnvClient, EnvClientError, EnvProtocolError, EnvUnavailable

A, B = "http://replica-a:1", "http://replica-b:2"

# Replies as the real service sends them (tests/env_service/test_protocol.py checks the models against it).
CREATED_INFO = {"category": "base", "num_turns": 1, "mode": "train", "interface_version": 0,
                "step_limit": {"scope": "episode", "max_steps": 20}}
STEPPED = {"observation": None, "done": True, "turn": 0, "info": {"error_type": None, "end_reason": "completed",
                                                                    "steps": 1}}
EVALUATED = {
    "task_id": "t", "category": "base", "accuracy": 1.0, "completed": True, "num_turns": 1, "turns_reached": 1,
    "failure_tags": ["pass"], "paper_labels": ["pass"], "progress": 1.0, "progress_with_irrelevance": 1.0,
    "turns": [{"index": 0, "reached": True, "tag": "pass", "label": "pass", "gt_calls": 1, "model_calls": 1,
               "parse_errors": 0, "unavailable_calls": 0, "tool_errors": 0, "state_ok": True, "response_ok": True}],
    "counts": {"passed": 1, "scorable": 1, "passed_irrelevance": 0, "irrelevance": 0},
    "official": {"valid": True, "error_type": None, "error_message": None, "consistent_with_turns": True},
    "grade_ms": 1.5, "end_reason": "completed", "steps": 1,
}


class FakeService:
    """A minimal stateful env service per host, plus injectable faults.

    `faults` maps (method, route) -> list of actions consumed one per matching request, where an action
    is an int status (answered without touching state), "connect" (ConnectError, request not sent),
    "lost" (the request IS processed, then a ReadTimeout replaces the reply), or "read" (ReadTimeout
    without processing). route is one of create/step/evaluate/delete/tasks/healthz.
    """

    def __init__(self, hosts=(A, B)):
        self.episodes: dict[str, dict[str, dict]] = {h: {} for h in hosts}
        self.faults: dict[tuple[str, str], list] = {}
        self.log: list[tuple[str, str, str]] = []  # (host, method, path)
        self.headers: list[httpx.Headers] = []

    def fault(self, method: str, route: str, *actions) -> None:
        self.faults.setdefault((method, route), []).extend(actions)

    @staticmethod
    def route_of(method: str, path: str) -> str:
        if path == "/episodes":
            return "create"
        if m := re.fullmatch(r"/episodes/[^/]+/(step|evaluate)", path):
            return m.group(1)
        if re.fullmatch(r"/episodes/[^/]+", path) and method == "DELETE":
            return "delete"
        return path.strip("/")

    def handler(self, request: httpx.Request) -> httpx.Response:
        host = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        path = request.url.path
        self.log.append((host, request.method, path))
        self.headers.append(request.headers)
        queue = self.faults.get((request.method, self.route_of(request.method, path)))
        action = queue.pop(0) if queue else None
        if action == "connect":
            raise httpx.ConnectError("connection refused", request=request)
        if action == "read":
            raise httpx.ReadTimeout("timed out", request=request)
        if isinstance(action, int):
            return httpx.Response(action, json={"error": {"code": f"fault_{action}", "message": "injected"}})
        response = self.serve(host, request)
        if action == "lost":
            raise httpx.ReadTimeout("reply lost", request=request)
        return response

    def serve(self, host: str, request: httpx.Request) -> httpx.Response:
        eps = self.episodes[host]
        path, method = request.url.path, request.method
        if path == "/healthz":
            return httpx.Response(200, json={"status": "ok", "tasks": 800})
        if path == "/tasks":
            return httpx.Response(200, json={"task_ids": [f"{request.url.params['split']}_{i}" for i in range(3)]})
        if path == "/episodes" and method == "POST":
            body = json.loads(request.content)
            if body["task_id"] == "nope":
                return httpx.Response(404, json={"error": {"code": "unknown_task", "message": "no such task"}})
            eid = body["episode_id"]
            if eid in eps:
                return httpx.Response(409, json={"error": {"code": "exists", "message": "episode exists"}})
            eps[eid] = {"task_id": body["task_id"], "steps": []}
            return httpx.Response(201, json={
                "episode_id": eid, "tools": [], "info": CREATED_INFO,
                "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]})
        m = re.fullmatch(r"/episodes/([^/]+)(?:/(step|evaluate))?", path)
        if m is None:
            return httpx.Response(404, json={"error": {"code": "not_found", "message": path}})
        eid, action = m.groups()
        if eid not in eps:
            return httpx.Response(404, json={"error": {"code": "unknown_episode", "message": eid}})
        if method == "DELETE":
            del eps[eid]
            return httpx.Response(204)
        if action == "step":
            eps[eid]["steps"].append(json.loads(request.content)["content"])
            return httpx.Response(200, json=STEPPED)
        return httpx.Response(200, json=EVALUATED)


def make_client(service: FakeService, urls=(A, B), **kw) -> EnvClient:
    kw.setdefault("backoff", 0.0)
    return EnvClient(list(urls), transport=httpx.MockTransport(service.handler), **kw)


def run(coro):
    return asyncio.run(coro)


def test_new_episodes_spread_and_later_calls_stick_to_their_replica():
    svc = FakeService()

    async def go():
        async with make_client(svc) as client:
            ids = [(await client.create(f"t{i}")).episode_id for i in range(4)]
            assert client.live_episodes() == {A: 2, B: 2}
            svc.log.clear()
            for eid in ids:
                await client.step(eid, "hello")
                await client.evaluate(eid)
            for host, _, path in svc.log:
                eid = path.split("/")[2]
                assert eid in svc.episodes[host], "call went to a replica that does not hold the episode"
            # Least-loaded: free two episodes on B, the next two creates both land on B.
            on_b = [e for e in ids if e in svc.episodes[B]]
            for eid in on_b:
                await client.delete(eid)
            assert client.live_episodes() == {A: 2, B: 0}
            new = [(await client.create("t")).episode_id for _ in range(2)]
            assert all(e in svc.episodes[B] for e in new)

    run(go())


def test_idempotent_routes_retry_on_5xx_and_transport_errors():
    svc = FakeService()

    async def go():
        async with make_client(svc, urls=[A], max_retries=3) as client:
            eid = (await client.create("t")).episode_id
            svc.fault("POST", "evaluate", 500, "read", 502)
            svc.log.clear()
            assert (await client.evaluate(eid)).accuracy == 1.0
            assert len(svc.log) == 4
            svc.fault("GET", "tasks", "connect", 503)
            assert await client.tasks("eval") == ["eval_0", "eval_1", "eval_2"]

    run(go())


def test_retries_are_bounded():
    svc = FakeService()

    async def go():
        async with make_client(svc, urls=[A], max_retries=2) as client:
            svc.fault("GET", "tasks", 500, 500, 500, 500)
            svc.log.clear()
            with pytest.raises(EnvUnavailable) as info:
                await client.tasks("all")
            assert info.value.attempts == 3 and len(svc.log) == 3
            assert "500" in info.value.last_error

    run(go())


def test_4xx_is_never_retried_and_carries_the_service_error():
    svc = FakeService()

    async def go():
        async with make_client(svc, urls=[A], max_retries=3) as client:
            eid = (await client.create("t")).episode_id
            svc.fault("POST", "step", 422, 500)
            svc.log.clear()
            with pytest.raises(EnvClientError) as info:
                await client.step(eid, "x")
            assert (info.value.status, info.value.code, info.value.message) == (422, "fault_422", "injected")
            assert len(svc.log) == 1
            with pytest.raises(EnvClientError) as info:
                await client.create("nope")
            assert info.value.status == 404 and info.value.code == "unknown_task"

    run(go())


def test_non_json_error_body_still_gives_a_clear_error():
    def handler(request):
        return httpx.Response(400, text="plain bad request")

    async def go():
        async with EnvClient(A, transport=httpx.MockTransport(handler), backoff=0) as client:
            with pytest.raises(EnvClientError) as info:
                await client.tasks()
            assert info.value.code == "http_400" and "plain bad request" in info.value.message

    run(go())


def test_step_is_retried_only_when_the_request_cannot_have_been_processed():
    svc = FakeService()

    async def go():
        async with make_client(svc, urls=[A], max_retries=3) as client:
            eid = (await client.create("t")).episode_id
            # Never delivered, or refused with 503: safe to resend; the step is applied once.
            svc.fault("POST", "step", "connect", 503)
            await client.step(eid, "first")
            assert svc.episodes[A][eid]["steps"] == ["first"]
            # Processed but the reply was lost: resending would apply it twice -> no retry.
            svc.fault("POST", "step", "lost")
            with pytest.raises(EnvUnavailable) as info:
                await client.step(eid, "second")
            assert info.value.attempts == 1
            assert svc.episodes[A][eid]["steps"] == ["first", "second"]
            svc.fault("POST", "step", 500)
            with pytest.raises(EnvUnavailable):
                await client.step(eid, "third")
            assert svc.episodes[A][eid]["steps"] == ["first", "second"]

    run(go())


def test_create_after_a_lost_reply_removes_the_orphan_and_starts_afresh():
    svc = FakeService()

    async def go():
        async with make_client(svc, max_retries=3) as client:
            svc.fault("POST", "create", "lost")
            created = await client.create("t")
            posts = [(h, p) for h, m, p in svc.log if m == "POST"]
            deletes = [(h, p) for h, m, p in svc.log if m == "DELETE"]
            # Attempt 1 created an episode whose reply was lost; attempt 2 (same replica, same id) got
            # 409; the orphan was deleted; attempt 3 created a new episode under a fresh id.
            assert len(posts) == 3 and posts[0][0] == posts[1][0] == posts[2][0]
            assert len(deletes) == 1 and deletes[0][0] == posts[0][0]
            orphan = deletes[0][1].rsplit("/", 1)[1]
            assert created.episode_id != orphan
            host = posts[0][0]
            assert list(svc.episodes[host]) == [created.episode_id]
            assert client.live_episodes()[host] == 1

    run(go())


def test_create_with_caller_id_reports_an_ambiguous_conflict():
    svc = FakeService()

    async def go():
        async with make_client(svc, urls=[A], max_retries=3) as client:
            await client.create("t", episode_id="mine")
            with pytest.raises(EnvClientError) as info:
                await client.create("t", episode_id="mine")
            assert info.value.status == 409
            svc.fault("POST", "create", "lost")
            with pytest.raises(EnvClientError, match="may have created it"):
                await client.create("t", episode_id="other")

    run(go())


def test_create_moves_to_another_replica_when_one_is_unreachable():
    svc = FakeService()

    async def go():
        async with make_client(svc, max_retries=1) as client:
            # Whichever replica is tried first refuses the connection.
            svc.fault("POST", "create", "connect")
            created = await client.create("t")
            hosts = [h for h, m, _ in svc.log if m == "POST"]
            assert len(hosts) == 2 and hosts[0] != hosts[1]
            assert created.episode_id in svc.episodes[hosts[1]]

    run(go())


def test_delete_is_idempotent_after_a_lost_reply_but_404_otherwise_raises():
    svc = FakeService()

    async def go():
        async with make_client(svc, urls=[A]) as client:
            eid = (await client.create("t")).episode_id
            svc.fault("DELETE", "delete", "lost")
            await client.delete(eid)  # attempt 1 deleted it, attempt 2 got 404: success
            assert eid not in svc.episodes[A] and client.live_episodes() == {A: 0}
            with pytest.raises(EnvClientError) as info:
                await client.delete(eid)
            assert info.value.status == 404

    run(go())


def test_health_checks_every_replica_and_sends_the_token():
    svc = FakeService()

    async def go():
        async with make_client(svc, token="s3cret") as client:
            health = await client.health()
            assert health.status == "ok" and health.tasks == 800 and len(health.replicas) == 2
            assert all(isinstance(h, HealthReply) for h in health.replicas)
            assert {h for h, _, _ in svc.log} == {A, B}
            assert all(h["authorization"] == "Bearer s3cret" for h in svc.headers)

    run(go())


def test_unknown_episode_with_several_replicas_is_an_error():
    async def go():
        async with make_client(FakeService()) as client:
            with pytest.raises(ValueError, match="unknown episode"):
                await client.step("never-created", "x")

    run(go())


def test_bad_arguments():
    with pytest.raises(ValueError):
        EnvClient([])
    with pytest.raises(ValueError):
        EnvClient("localhost:8082")

    async def go():
        async with make_client(FakeService(), urls=[A]) as client:
            with pytest.raises(ValueError):
                await client.create("t", mode="test")
            with pytest.raises(ValueError):
                await client.tasks("val")

    run(go())


def test_unreachable_real_socket_raises_env_unavailable():
    with socket.socket() as s:  # a port nobody listens on (bound then released)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go():
        async with EnvClient(f"http://127.0.0.1:{port}", max_retries=2, backoff=0.0, timeout=5) as client:
            with pytest.raises(EnvUnavailable) as info:
                await client.health()
            assert info.value.attempts == 3 and "ConnectError" in info.value.last_error

    run(go())


def _raw_server(handler) -> tuple[int, callable]:
    """A one-thread TCP server on a free port whose `handler(conn, request_bytes)` decides what to send."""
    import threading

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    hits: list[bytes] = []

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                data = conn.recv(65536)
                hits.append(data)
                handler(conn, data)

    threading.Thread(target=serve, daemon=True).start()

    def stop():
        srv.close()

    return srv.getsockname()[1], hits, stop


def test_default_transport_does_not_resend_a_step_whose_reply_was_lost():
    # The server reads the request and hangs up without answering: the step may have run, so the client
    # must not send it again (one hit), and reports EnvUnavailable at once.
    port, hits, stop = _raw_server(lambda conn, data: None)

    async def go():
        async with EnvClient(f"http://127.0.0.1:{port}", max_retries=3, backoff=0.0, timeout=5) as client:
            with pytest.raises(EnvUnavailable) as info:
                await client.step("e1", "hello")
            assert "ReadError" in info.value.last_error or "RemoteProtocolError" in info.value.last_error

    try:
        run(go())
    finally:
        stop()
    assert len(hits) == 1 and hits[0].startswith(b"POST /episodes/e1/step")


def test_default_transport_retries_idempotent_routes_after_a_lost_reply():
    port, hits, stop = _raw_server(lambda conn, data: None)

    async def go():
        async with EnvClient(f"http://127.0.0.1:{port}", max_retries=2, backoff=0.0, timeout=5) as client:
            with pytest.raises(EnvUnavailable):
                await client.evaluate("e1")

    try:
        run(go())
    finally:
        stop()
    assert len(hits) == 3


def test_default_transport_reads_real_replies():
    body = b'{"status": "ok", "tasks": 800}'

    def reply(conn, data):
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                     + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)

    port, hits, stop = _raw_server(reply)

    async def go():
        async with EnvClient(f"http://127.0.0.1:{port}", token="t0k", timeout=5) as client:
            health = await client.health()
            assert health.status == "ok" and health.tasks == 800

    try:
        run(go())
    finally:
        stop()
    assert b"authorization: bearer t0k" in hits[0].lower()


def test_client_survives_being_used_from_a_second_event_loop():
    body = b'{"task_ids": ["a"]}'

    def reply(conn, data):
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                     + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)

    port, hits, stop = _raw_server(reply)
    client = EnvClient(f"http://127.0.0.1:{port}", timeout=5)
    try:
        assert run(client.tasks("eval")) == ["a"]  # one asyncio.run ...
        assert run(client.tasks("eval")) == ["a"]  # ... and another: a new loop, a new session
        run(client.aclose())
    finally:
        stop()
    assert len(hits) == 2


def test_requests_come_from_the_models_and_replies_are_typed():
    svc = FakeService()
    bodies: list[dict] = []
    serve = svc.serve

    def recording(host, request):
        if request.content:
            bodies.append(json.loads(request.content))
        return serve(host, request)

    svc.serve = recording

    async def go():
        async with make_client(svc, urls=[A]) as client:
            created = await client.create("t")
            assert isinstance(created, CreateReply) and created.info.step_limit.max_steps == 20
            assert [m.role for m in created.messages] == ["system", "user"]
            step = await client.step(created.episode_id, "hi")
            assert isinstance(step, StepReply) and step.done and step.info.end_reason == "completed"
            result = await client.evaluate(created.episode_id)
            assert isinstance(result, EvaluateReply) and result.turns[0].tag == "pass"
            assert result.model_dump() == EVALUATED
            await client.create("t", interface={"cues": None, "error_feedback": True})
            await client.create("t", interface=Interface(version=2))
        assert bodies[0] == {"task_id": "t", "mode": "train", "episode_id": created.episode_id}
        assert bodies[1] == {"content": "hi"}
        assert bodies[2]["interface"] == {"cues": None, "error_feedback": True}  # sent as given
        assert bodies[3]["interface"] == Interface(version=2).to_dict()

    run(go())


class Breaking(FakeService):
    """Answers one route with a 2xx reply that breaks the protocol."""

    def __init__(self, route: str, reply: httpx.Response):
        super().__init__()
        self.route, self.reply = route, reply

    def serve(self, host, request):
        answer = super().serve(host, request)
        return self.reply if self.route_of(request.method, request.url.path) == self.route else answer


def test_a_reply_that_breaks_the_protocol_raises_env_protocol_error():
    not_done = httpx.Response(200, json={**STEPPED, "done": False})  # no observation, yet not done

    async def step_case():
        svc = Breaking("step", not_done)
        async with make_client(svc, urls=[A], max_retries=3) as client:
            eid = (await client.create("t")).episode_id
            svc.log.clear()
            with pytest.raises(EnvProtocolError, match="observation is null but the episode is not done"):
                await client.step(eid, "x")
            assert len(svc.log) == 1  # never resent

    async def create_case():
        svc = Breaking("create", httpx.Response(201, json={"episode_id": "whatever", "messages": []}))
        async with make_client(svc, urls=[A], max_retries=3) as client:
            with pytest.raises(EnvProtocolError, match="CreateReply"):
                await client.create("t", episode_id="e7")
            # the episode the service did create is deleted, and the client holds nothing for it
            assert svc.episodes[A] == {} and client.live_episodes() == {A: 0}
            assert [m for _, m, _ in svc.log] == ["POST", "DELETE"]

    async def evaluate_case():
        svc = Breaking("evaluate", httpx.Response(200, json={"accuracy": "high"}))
        async with make_client(svc, urls=[A]) as client:
            eid = (await client.create("t")).episode_id
            with pytest.raises(EnvProtocolError, match="EvaluateReply"):
                await client.evaluate(eid)

    async def not_json_case():
        svc = Breaking("evaluate", httpx.Response(200, text="<html>proxy error</html>"))
        async with make_client(svc, urls=[A]) as client:
            eid = (await client.create("t")).episode_id
            with pytest.raises(EnvUnavailable, match="not JSON"):
                await client.evaluate(eid)

    for case in (step_case, create_case, evaluate_case, not_json_case):
        run(case())
