"""The service enforces the split and guards its door (docs/env_service.md "The split is enforced", "Access").

* A training episode on an eval-split task is refused (403 ``eval_task_in_training``) unless the service was
  started with ``--allow-train-on-eval``; evaluation episodes on it and training episodes on training tasks
  are served as before.
* The bearer token is compared in constant time and its scheme without regard to case; ids of any length
  are answered with a bounded echo.
* Under the official rules, a call nested deeper than BFCL's own ``eval`` parses fails with BFCL's error.

The service runs in process (``create_app`` behind httpx's ASGI transport, no worker processes) or, for the
token, as the real subprocess on a free loopback port.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from env_service import official
from env_service import protocol as p
from env_service.app import bearer_ok, create_app
from env_service.config import ServiceConfig
from env_service.process import running_service
from env_service.tasks import load_split

SPLIT = load_split()
EVAL_TASK, TRAIN_TASK = SPLIT["eval"][0], SPLIT["train"][0]


def requests(config: ServiceConfig, *calls: tuple[str, str, dict | None]) -> list[httpx.Response]:
    async def go():
        transport = httpx.ASGITransport(app=create_app(config))
        async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
            return [await client.request(method, path, json=body) for method, path, body in calls]

    return asyncio.run(go())


def test_training_episodes_on_eval_tasks_are_refused_unless_the_service_allows_them():
    calls = [("POST", "/episodes", {"task_id": EVAL_TASK, "mode": "train"}),
             ("POST", "/episodes", {"task_id": EVAL_TASK, "mode": "eval"}),
             ("POST", "/episodes", {"task_id": TRAIN_TASK, "mode": "train"})]
    refused, evaluated, trained = requests(ServiceConfig(workers=0), *calls)
    assert refused.status_code == 403, refused.text
    error = p.ErrorReply.model_validate(refused.json()).error
    assert error.code == "eval_task_in_training" and EVAL_TASK in error.message
    assert "--allow-train-on-eval" in error.message
    assert evaluated.status_code == 201 and trained.status_code == 201
    allowed, *_ = requests(ServiceConfig(workers=0, allow_train_on_eval=True), *calls)
    assert allowed.status_code == 201, allowed.text
    assert allowed.json()["info"]["mode"] == "train"


def test_the_command_line_flag_reaches_the_service():
    from env_service.__main__ import parse_args

    assert parse_args([]).allow_train_on_eval is False
    assert parse_args(["--allow-train-on-eval"]).allow_train_on_eval is True


def test_long_ids_are_answered_with_a_bounded_echo():
    long_id = "x" * 20_000
    replay, episode, created = requests(
        ServiceConfig(workers=0),
        ("GET", f"/tasks/{long_id}/replay", None),
        ("POST", f"/episodes/{long_id}/evaluate", None),
        ("POST", "/episodes", {"task_id": TRAIN_TASK, "episode_id": long_id}))
    for reply in (replay, episode, created):
        assert len(reply.content) < 1000, (reply.status_code, len(reply.content))
    assert replay.status_code == 422 and p.ErrorReply.model_validate(replay.json()).error.code == "invalid_request"
    assert episode.status_code == 404 and "(20000 characters)" in episode.json()["error"]["message"]
    assert created.status_code == 422


def test_bearer_check_is_case_insensitive_in_the_scheme_only():
    token = b"s3cret-token"
    assert bearer_ok(b"Bearer s3cret-token", token) and bearer_ok(b"bearer s3cret-token", token)
    assert bearer_ok(b"BEARER s3cret-token", token)
    for header in (None, b"", b"Bearer", b"Bearer S3CRET-TOKEN", b"Basic s3cret-token", b"Bearer s3cret-tokenx",
                   b"Bearers3cret-token"):
        assert not bearer_ok(header, token), header


def test_the_running_service_takes_either_case_of_the_scheme(monkeypatch):
    monkeypatch.delenv(p.TOKEN_ENV, raising=False)
    with running_service(["--token", "tok-123456", "--workers", "0"]) as (url, _proc):
        assert httpx.get(f"{url}/tasks?split=eval").status_code == 401
        assert httpx.get(f"{url}/tasks?split=eval", headers={"Authorization": "Bearer wrong"}).status_code == 401
        for scheme in ("Bearer", "bearer"):
            reply = httpx.get(f"{url}/tasks?split=eval", headers={"Authorization": f"{scheme} tok-123456"})
            assert reply.status_code == 200 and len(reply.json()["task_ids"]) == len(SPLIT["eval"])


def test_the_route_table_names_every_route_the_app_serves():
    app = create_app(ServiceConfig(workers=0)).app
    served = {f"{method} {route.path}" for route in app.routes if hasattr(route, "methods")
              for method in route.methods if method != "HEAD"}
    assert served == set(p.ROUTES)


def _nested(depth: int):
    value: object = "a"
    for _ in range(depth):
        value = [value]
    return value


def test_official_rules_fail_calls_nested_deeper_than_bfcls_eval_parses():
    # BFCL evals `name(arg=[[...]])`: CPython refuses 200 nested brackets with a SyntaxError.
    compile("cd(folder=" + "[" * 199 + "'a'" + "]" * 199 + ")", "<string>", "eval")
    with pytest.raises(SyntaxError, match="too many nested parentheses"):
        compile("cd(folder=" + "[" * 200 + "'a'" + "]" * 200 + ")", "<string>", "eval")
    assert official.failure_text("cd", {"folder": _nested(199)}, known=True) is None
    text = official.failure_text("cd", {"folder": _nested(200)}, known=True)
    assert text == "Error during execution: too many nested parentheses (<string>, line 1)"
    assert official.failure_text("cd", {"folder": _nested(5000)}, known=True).startswith(
        "Error during execution: RecursionError")
