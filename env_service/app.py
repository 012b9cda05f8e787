"""The HTTP service (FastAPI): the wire protocol of ``env_service.protocol`` (docs/protocol.md) over an
``EpisodeStore``.

Request bodies are validated with the protocol's request models and every reply goes out through its reply
model, so what the service answers is what the client's models parse. Bodies are read and parsed here rather
than by FastAPI's dependency machinery, which costs more per request than the whole model validation.

The routes come in one ``APIRouter`` per resource: ``service_router`` (``/healthz``, ``/tasks``,
``/tasks/{task_id}/replay``, ``/stats``) and
``episode_router`` (``/episodes``: create, step, evaluate, delete). What they share (configuration, tasks, the
episode store, the worker pool, the counters) is one :class:`Service` on the app's state; ``create_app`` builds
it and wires the routers, the error handlers and the lifespan (the expiry sweeper).

Episodes live in worker processes (``env_service.workers``): a handler awaits its episode's worker, whose
requests are serialized, so a step is atomic with respect to other requests, and the event loop (health checks
included) keeps answering while BFCL code runs under the cost budget.
Every error is JSON ``{"error": {"code", "message"}}`` with the status of its code (``protocol.ERROR_STATUS``);
an unexpected exception inside one request becomes a 500 with a short message (no traceback) and the service
keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import os
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psutil
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from env_service import interface as iface
from env_service import protocol as p
from env_service.config import ServiceConfig, StepLimit
from env_service.episode import EpisodeStateError
from env_service.http import loop_exception_handler, quiet
from env_service.rules import DEFAULT_RULES, OFFICIAL
from env_service.store import EpisodeStore
from env_service.tasks import Task, failing_twin_replies, ground_truth_replies, load_split, load_tasks, split_ids
from env_service.workers import Handle, InProcessPool, WorkerPool

log = logging.getLogger("env_service")
EPISODE_ID = re.compile(p.EPISODE_ID_PATTERN)
_STARLETTE_CODES = {404: "not_found", 405: "method_not_allowed"}

M = TypeVar("M", bound=BaseModel)


class ApiError(Exception):
    """An error reply; its status comes from the code (``protocol.ERROR_STATUS``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = p.ERROR_STATUS[code], code, message


def _reply(model: type[M], payload: Any, status: int = 200) -> Response:
    # Validating the service's own payload is the contract check of the protocol (a drifted field is a 500
    # here, not a confused client); it costs microseconds per reply.
    body = model.model_validate(payload).model_dump_json()
    return Response(body, status_code=status, media_type="application/json")


def _error(status: int, code: str, message: str) -> Response:
    body = p.ErrorReply(error=p.ErrorBody(code=code, message=message)).model_dump_json()
    return Response(body, status_code=status, media_type="application/json")


def _parse(model: type[M], body: bytes) -> M:
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        if any(e["type"] == "json_invalid" for e in errors):
            raise ApiError("malformed_json", "request body is not valid JSON") from None
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in errors[:5])
        raise ApiError("invalid_request", detail) from None


def bearer_ok(header: bytes | None, token: bytes) -> bool:
    """Whether an ``Authorization`` header carries `token`: the scheme matched without regard to case (RFC 7235),
    the credentials compared in constant time (no timing tells how much of a guess was right)."""
    scheme, _, credentials = (header or b"").partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), token)


class Gate:
    """Pure ASGI middleware (cheap, unlike Starlette's ``BaseHTTPMiddleware``): the optional bearer token
    (401) and the body size limit (413, refused before the handler reads the whole body)."""

    def __init__(self, app, limit: int, token: str | None) -> None:
        self.app, self.limit = app, limit
        self.token = token.encode() if token else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.token and scope["path"] != "/healthz" and not bearer_ok(headers.get(b"authorization"), self.token):
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
                    raise ApiError("body_too_large", f"request body exceeds {self.limit} bytes")
            return message

        return await self.app(scope, limited_receive, send)


@dataclass
class Service:
    """What the handlers share: the configuration, the task tables, the episode store, the worker pool and
    the counters ``/stats`` reports. One per app, at ``app.state.service``."""

    config: ServiceConfig
    tasks: dict[str, Task]
    split: dict[str, list[str]]
    store: EpisodeStore
    pool: WorkerPool | InProcessPool
    counters: dict[str, int] = field(default_factory=lambda: {"created": 0, "evaluated": 0, "deleted": 0})
    eval_ids: frozenset[str] = frozenset()  # the eval split: training episodes on these are refused
    process: psutil.Process = field(default_factory=lambda: psutil.Process(os.getpid()))

    def episode(self, episode_id: str) -> Handle:
        episode = self.store.get(episode_id)
        if episode is None:
            raise ApiError("unknown_episode", f"no open episode {echo(episode_id)} (finished, deleted or expired)")
        return episode

    async def make_room(self) -> None:
        """Expire idle episodes if the store is full; ``too_many_episodes`` if it still is."""
        if not self.store.full():
            return
        for handle in self.store.expire():
            await self.pool.drop(handle)
        if self.store.full():
            raise ApiError("too_many_episodes", f"{len(self.store)} episodes open; delete finished ones")


def echo(value: str) -> str:
    """A client-sent id as an error message quotes it: cut to ``protocol.ECHO_CHARS`` (an id of any length
    may arrive in a path; the reply never grows with it)."""
    text = repr(value)
    return text if len(value) <= p.ECHO_CHARS else f"{repr(value[:p.ECHO_CHARS])}... ({len(value)} characters)"


def _service(request: Request) -> Service:
    # Read from the app's state rather than through FastAPI's dependency injection, which costs more per
    # request than the work of the cheap endpoints.
    return request.app.state.service


# --- the service itself: health, task lists, counters ---------------------------------------------

service_router = APIRouter()


@service_router.get("/healthz")
async def healthz(request: Request) -> Response:
    return _reply(p.HealthReply, {"status": "ok", "tasks": len(_service(request).tasks)})


@service_router.get("/tasks")
async def list_tasks(request: Request) -> Response:
    service = _service(request)
    name = request.query_params.get("split", "all")
    try:
        ids = split_ids(name, service.config.split_file) if name != "all" else list(service.tasks)
    except ValueError as exc:
        raise ApiError("unknown_split", str(exc)) from None
    return _reply(p.TasksReply, {"task_ids": ids})


@service_router.get("/tasks/{task_id}/replay")
async def replay(task_id: str, request: Request) -> Response:
    # Training tasks only: a held-out task's ground truth never leaves the service (the evaluation harness's
    # own ground-truth self-check reads it in its own process).
    service = _service(request)
    if len(task_id) > p.MAX_TASK_ID_CHARS:
        raise ApiError("invalid_request", f"task_id: longer than {p.MAX_TASK_ID_CHARS} characters")
    if task_id not in service.tasks:
        raise ApiError("unknown_task", f"no task {echo(task_id)}")
    if task_id not in service.split["train"]:
        raise ApiError("held_out_task", f"{task_id} is not a training task; its ground truth is not served")
    return _reply(p.ReplayReply, {"task_id": task_id, "ground_truth": ground_truth_replies(task_id),
                                  "failing_twin": failing_twin_replies(task_id)})


@service_router.get("/stats")
async def stats(request: Request) -> Response:
    service = _service(request)
    store, pool = service.store, service.pool
    return _reply(
        p.StatsReply,
        {
            "open_episodes": len(store),
            "expired_total": store.expired_total,
            **{f"{k}_total": v for k, v in service.counters.items()},
            "rss_bytes": service.process.memory_info().rss + pool.rss_total(),
            "budget_refusals_total": pool.refused,
            "worker_restarts_total": pool.restarts,
            "split_sizes": {k: len(v) for k, v in service.split.items()},
        }
    )


# --- episodes ---------------------------------------------------------------------------------------

episode_router = APIRouter(prefix="/episodes")


def _episode_rules(req: p.CreateRequest, config: ServiceConfig) -> str:
    """The rules profile a new episode runs under, after the checks that tie it to the mode and interface."""
    if req.mode == "eval" and req.interface:
        raise ApiError("interface_in_eval", "evaluation episodes always use the raw interface")
    rules = req.rules or (config.eval_rules if req.mode == "eval" else DEFAULT_RULES)
    if rules == OFFICIAL and req.interface:
        raise ApiError("invalid_interface", "official rules use the raw interface (BFCL's prompt)")
    return rules


def _new_episode_id(req: p.CreateRequest, store: EpisodeStore) -> str:
    episode_id = req.episode_id or uuid.uuid4().hex
    if not EPISODE_ID.fullmatch(episode_id):
        raise ApiError("invalid_episode_id", "episode_id must match [A-Za-z0-9_.-]{1,128}")
    if episode_id in store:
        raise ApiError("episode_exists", f"episode {echo(episode_id)} already exists")
    return episode_id


def _new_handle(req: p.CreateRequest, service: Service) -> Handle:
    """Validate a create request against the service (the checks in the protocol's order) into a handle."""
    task = service.tasks.get(req.task_id)
    if task is None:
        raise ApiError("unknown_task", f"no task {echo(req.task_id)}")
    if req.mode == "train" and task.id in service.eval_ids and not service.config.allow_train_on_eval:
        # Training on a held-out task would let the trainer read its per-turn verdicts and ground-truth call
        # counts (/evaluate) and learn it: held-in accuracy would then measure memorized tasks.
        raise ApiError("eval_task_in_training", f"{task.id} is in the eval split; training episodes on it are "
                       "refused (the service's --allow-train-on-eval allows them, for research)")
    rules = _episode_rules(req, service.config)
    try:
        interface = iface.parse_interface(req.interface)
    except iface.InterfaceError as exc:
        raise ApiError("invalid_interface", str(exc)) from None
    episode_id = _new_episode_id(req, service.store)
    limit = StepLimit(**req.step_limit.model_dump()) if req.step_limit else None
    return Handle(episode_id, -1, task.id, req.mode, interface, limit, rules=rules)


@episode_router.post("")
async def create_episode(request: Request) -> Response:
    service = _service(request)
    req = _parse(p.CreateRequest, await request.body())
    handle = _new_handle(req, service)
    await service.make_room()
    service.store.add(handle)
    try:
        messages, tools = await service.pool.create(handle)
    except BaseException:
        service.store.remove(handle.id)
        raise
    service.counters["created"] += 1
    task = service.tasks[handle.task_id]
    step_limit = handle.step_limit or service.config.episode.step_limit
    info = {
        "category": task.category,
        "num_turns": task.num_turns,
        "mode": req.mode,
        "interface_version": handle.interface.version,
        "step_limit": {"scope": step_limit.scope, "max_steps": step_limit.max_steps},
        "rules": handle.rules,
    }
    return _reply(p.CreateReply, {"episode_id": handle.id, "messages": messages, "tools": tools,
                                  "info": info}, 201)


@episode_router.post("/{episode_id}/step")
async def step_episode(episode_id: str, request: Request) -> Response:
    service = _service(request)
    req = _parse(p.StepRequest, await request.body())
    handle = service.episode(episode_id)
    try:
        return _reply(p.StepReply, await service.pool.step(handle, req.content))
    except EpisodeStateError as exc:
        raise ApiError("episode_finished", str(exc)) from None


@episode_router.post("/{episode_id}/evaluate")
async def evaluate_episode(episode_id: str, request: Request) -> Response:
    service = _service(request)
    handle = service.episode(episode_id)
    first = not handle.evaluated
    result = await service.pool.evaluate(handle)
    handle.evaluated = True
    service.counters["evaluated"] += first
    return _reply(p.EvaluateReply, result)


@episode_router.delete("/{episode_id}")
async def delete_episode(episode_id: str, request: Request) -> Response:
    service = _service(request)
    handle = service.store.get(episode_id)
    if handle is None or not service.store.remove(episode_id):
        raise ApiError("unknown_episode", f"no open episode {echo(episode_id)}")
    await service.pool.drop(handle)
    service.counters["deleted"] += 1
    return Response(status_code=204)


# --- the app ----------------------------------------------------------------------------------------


def _add_error_handlers(app: FastAPI) -> None:
    """Every error leaves as ``{"error": {"code", "message"}}`` with the status of its code."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> Response:
        return _error(exc.status, exc.code, exc.message)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> Response:
        code = _STARLETTE_CODES.get(exc.status_code, p.HTTP_ERROR)
        return _error(exc.status_code, code, str(exc.detail))

    @app.exception_handler(ClientDisconnect)
    async def _disconnected(_request: Request, _exc: ClientDisconnect) -> Response:
        return Response(status_code=400)  # nobody reads it: the client is gone (not an error of ours)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        quiet(f"env_service: unexpected error in {request.method} {request.url.path}: {type(exc).__name__}: {exc}")
        return _error(500, "internal_error", f"{type(exc).__name__}: {str(exc)[:200]}")


def _lifespan(service: Service):
    """The app's lifetime: a sweeper expires idle episodes every ``sweep_interval_s``; the pool closes at the end."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        async def sweep() -> None:
            while True:
                await asyncio.sleep(service.config.sweep_interval_s)
                for handle in service.store.expire():
                    await service.pool.drop(handle)

        asyncio.get_running_loop().set_exception_handler(loop_exception_handler)
        sweeper = asyncio.create_task(sweep())
        try:
            yield
        finally:
            sweeper.cancel()
            service.pool.close()

    return lifespan


def _start_service(config: ServiceConfig, own_process: bool) -> Service:
    tasks = load_tasks()
    split = load_split(config.split_file)
    store = EpisodeStore(config.ttl_s, config.max_episodes)
    if own_process:
        # The task tables and imported modules are hundreds of thousands of long-lived objects; freezing them
        # keeps full garbage collections (which would stall every open request) short, and keeps the pages the
        # forked workers share with the service from being copied. Only in the service's own process: frozen
        # objects are never collected, not even at interpreter exit, and in a process that merely hosts the app
        # (the tests) that held every object of the host's libraries too: triton's bindings (brought in by
        # torch) then reported their objects as leaked at exit, 30 lines after pytest's summary.
        gc.collect()
        gc.freeze()
    pool = WorkerPool(config.workers, tasks, config.episode) if config.workers else InProcessPool(tasks, config.episode)
    return Service(config, tasks, split, store, pool, eval_ids=frozenset(split["eval"]))


def create_app(config: ServiceConfig | None = None, own_process: bool = False) -> Gate:
    """The service's ASGI app. `own_process`: the process is the service's own (`python -m env_service`), whose
    long-lived objects may be frozen out of the garbage collector (`_start_service`)."""
    config = config or ServiceConfig()
    service = _start_service(config, own_process)
    # Only the routes of the protocol table (ROUTES): no generated schema or docs pages.
    app = FastAPI(title="SEAL BFCL environment service", lifespan=_lifespan(service), docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.service = service
    _add_error_handlers(app)
    app.include_router(service_router)
    app.include_router(episode_router)
    return Gate(app, config.max_body_bytes, config.token)
