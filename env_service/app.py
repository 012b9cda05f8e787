"""The HTTP service (FastAPI): the wire protocol (docs/protocol.md) over an ``EpisodeStore``.

Every handler runs on the event loop without awaiting in the middle of an episode operation, so a step is
atomic with respect to other requests; tool execution and grading are pure CPU work of a few milliseconds.
Every error is JSON ``{"error": {"code", "message"}}`` with a 4xx status; an unexpected exception inside one
request becomes a 500 with a short message (no traceback) and the service keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import re
import uuid
from typing import Any, Literal

import psutil
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from env_service import interface as iface
from env_service.config import ServiceConfig, StepLimit
from env_service.episode import Episode, EpisodeStateError
from env_service.tasks import load_split, load_tasks, split_ids

log = logging.getLogger("env_service")
EPISODE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class StepLimitBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    scope: Literal["episode", "turn"] = "episode"
    max_steps: int = Field(20, ge=1, le=1000)


class CreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task_id: str = Field(max_length=200)
    mode: Literal["train", "eval"] = "train"
    interface: dict[str, Any] | None = None
    episode_id: str | None = None
    step_limit: StepLimitBody | None = None


class StepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    content: str


def _json(payload: Any, status: int = 200) -> Response:
    return Response(json.dumps(payload), status_code=status, media_type="application/json")


def _error(status: int, code: str, message: str) -> Response:
    return _json({"error": {"code": code, "message": message}}, status)


def _parse(model: type[BaseModel], body: bytes) -> Any:
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        if any(e["type"] == "json_invalid" for e in errors):
            raise ApiError(400, "malformed_json", "request body is not valid JSON") from None
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in errors[:5])
        raise ApiError(422, "invalid_request", detail) from None


class Gate:
    """Pure ASGI middleware (cheap, unlike Starlette's ``BaseHTTPMiddleware``): the optional bearer token
    (401) and the body size limit (413, refused before the handler reads the whole body)."""

    def __init__(self, app, limit: int, token: str | None) -> None:
        self.app, self.limit = app, limit
        self.authorization = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.authorization and scope["path"] != "/healthz" and headers.get(b"authorization") != self.authorization:
            return await _error(401, "unauthorized", "missing or wrong bearer token")(scope, receive, send)
        length = headers.get(b"content-length")
        too_big = _error(413, "body_too_large", f"request body exceeds {self.limit} bytes")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await too_big(scope, receive, send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise ApiError(413, "body_too_large", f"request body exceeds {self.limit} bytes")
            return message

        return await self.app(scope, limited_receive, send)


def create_app(config: ServiceConfig | None = None) -> FastAPI:
    config = config or ServiceConfig()
    tasks = load_tasks()
    split = load_split(config.split_file)
    from env_service.store import EpisodeStore

    store = EpisodeStore(config.ttl_s, config.max_episodes)
    # The task tables and imported modules are hundreds of thousands of long-lived objects; freezing them
    # keeps full garbage collections (which would stall every open request) short.
    gc.collect()
    gc.freeze()
    counters = {"created": 0, "evaluated": 0, "deleted": 0}
    process = psutil.Process(os.getpid())

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        async def sweep() -> None:
            while True:
                await asyncio.sleep(config.sweep_interval_s)
                store.expire()

        sweeper = asyncio.create_task(sweep())
        try:
            yield
        finally:
            sweeper.cancel()

    app = FastAPI(title="SEAL BFCL environment service", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.store, app.state.config = store, config

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> Response:
        return _error(exc.status, exc.code, exc.message)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> Response:
        log.exception("unexpected error")
        return _error(500, "internal_error", f"{type(exc).__name__}: {str(exc)[:200]}")

    def episode_or_404(episode_id: str) -> Episode:
        episode = store.get(episode_id)
        if episode is None:
            raise ApiError(404, "unknown_episode", f"no open episode {episode_id!r} (finished, deleted or expired)")
        return episode

    @app.get("/healthz")
    async def healthz() -> Response:
        return _json({"status": "ok", "tasks": len(tasks)})

    @app.get("/tasks")
    async def list_tasks(request: Request) -> Response:
        name = request.query_params.get("split", "all")
        try:
            ids = split_ids(name, config.split_file) if name != "all" else list(tasks)
        except ValueError as exc:
            raise ApiError(400, "unknown_split", str(exc)) from None
        return _json({"task_ids": ids})

    @app.get("/stats")
    async def stats() -> Response:
        return _json(
            {
                "open_episodes": len(store),
                "expired_total": store.expired_total,
                **{f"{k}_total": v for k, v in counters.items()},
                "rss_bytes": process.memory_info().rss,
                "split_sizes": {k: len(v) for k, v in split.items()},
            }
        )

    @app.post("/episodes")
    async def create_episode(request: Request) -> Response:
        req: CreateRequest = _parse(CreateRequest, await request.body())
        task = tasks.get(req.task_id)
        if task is None:
            raise ApiError(404, "unknown_task", f"no task {req.task_id!r}")
        if req.mode == "eval" and req.interface:
            raise ApiError(400, "interface_in_eval", "evaluation episodes always use the raw interface")
        try:
            interface = iface.parse_interface(req.interface)
        except iface.InterfaceError as exc:
            raise ApiError(422, "invalid_interface", str(exc)) from None
        episode_id = req.episode_id or uuid.uuid4().hex
        if not EPISODE_ID.match(episode_id):
            raise ApiError(422, "invalid_episode_id", "episode_id must match [A-Za-z0-9_.-]{1,128}")
        if episode_id in store:
            raise ApiError(409, "episode_exists", f"episode {episode_id!r} already exists")
        if store.full():
            store.expire()
            if store.full():
                raise ApiError(503, "too_many_episodes", f"{len(store)} episodes open; delete finished ones")
        limit = StepLimit(**req.step_limit.model_dump()) if req.step_limit else None
        episode = Episode(episode_id, task, req.mode, interface, config.episode, limit)
        store.add(episode)
        counters["created"] += 1
        return _json(
            {
                "episode_id": episode_id,
                "messages": episode.initial_messages(),
                "tools": episode.presented_tools(),
                "info": {
                    "category": task.category,
                    "num_turns": task.num_turns,
                    "mode": req.mode,
                    "interface_version": interface.version,
                    "step_limit": {
                        "scope": episode.step_limit.scope,
                        "max_steps": episode.step_limit.max_steps,
                    },
                },
            },
            201,
        )

    @app.post("/episodes/{episode_id}/step")
    async def step_episode(episode_id: str, request: Request) -> Response:
        req: StepRequest = _parse(StepRequest, await request.body())
        episode = episode_or_404(episode_id)
        try:
            return _json(episode.step(req.content))
        except EpisodeStateError as exc:
            raise ApiError(409, "episode_finished", str(exc)) from None

    @app.post("/episodes/{episode_id}/evaluate")
    async def evaluate_episode(episode_id: str) -> Response:
        episode = episode_or_404(episode_id)
        first = episode.result is None
        result = episode.evaluate()
        counters["evaluated"] += first
        return _json(result)

    @app.delete("/episodes/{episode_id}")
    async def delete_episode(episode_id: str) -> Response:
        if not store.remove(episode_id):
            raise ApiError(404, "unknown_episode", f"no open episode {episode_id!r}")
        counters["deleted"] += 1
        return Response(status_code=204)

    return Gate(app, config.max_body_bytes, config.token)
