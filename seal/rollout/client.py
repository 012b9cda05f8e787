"""Async HTTP client for the BFCL environment service (wire protocol: env_service/protocol.py, docs/protocol.md).

Requests are built from the protocol's request models and every reply is parsed into its reply model: callers
get typed replies (`CreateReply`, `StepReply`, `EvaluateReply`, ...), and a reply that does not follow the
protocol raises `EnvProtocolError` (one that is not JSON at all counts as a failed service: `EnvUnavailable`).

One `EnvClient` serves any number of concurrent episodes over a pooled `httpx.AsyncClient` and can
spread episodes over several service replicas:

- A new episode goes to the replica with the fewest live episodes created by this client (ties broken
  round-robin). Every later call for that episode goes to the replica that created it (the episode
  exists only in that process).
- Failures are retried a bounded number of times with exponential backoff, only when retrying is
  safe (see `_Safety`), never on 4xx. Exhausted retries raise `EnvUnavailable`; a 4xx raises
  `EnvClientError` carrying the service's `{"error": {"code", "message"}}`.

Retry safety per route (why the rules differ):
- `GET /healthz`, `GET /tasks`, `POST .../evaluate`, `DELETE` are idempotent: retried on every
  transport error and every 5xx. A retried DELETE that answers 404 after an attempt whose outcome is
  unknown counts as success (the earlier attempt deleted it).
- `POST .../step` is NOT idempotent: a step whose reply was lost may already have executed the tool
  calls, and sending it again would apply the assistant message twice. It is retried only when the
  request provably never reached the service (connection refused / connect timeout / no pool slot)
  or the service answered 503. Anything else raises `EnvUnavailable` at once; the agent loop then
  restarts the whole episode, which is always correct.
- `POST /episodes` sends a client-generated `episode_id` (uuid4 hex). After an attempt whose outcome
  is unknown (reply lost, 5xx), the retry goes to the SAME replica with the SAME id, so an episode the
  lost attempt did create is detected: the service answers 409. That episode is ours, but a 409 does
  not carry the initial messages we need, so the client deletes it (best effort) and creates a fresh
  episode under a new id. An attempt that provably never arrived may move to another replica. A 409 on
  a first attempt is a real conflict and raises `EnvClientError`; so does a 409 after a lost attempt
  when the caller chose the id (the client cannot prove the earlier episode was its own).
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import os
import random
import ssl
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from env_service import protocol as p
from seal.rollout.transport import AiohttpTransport

log = logging.getLogger(__name__)

# Transport errors raised before the request was handed to the server: resending cannot duplicate.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def export_token(variable: str) -> None:
    """Make the token held in ``$variable`` (the recipe's ``env.token_env``) the one every client and the started
    service read (``$SEAL_ENV_TOKEN``); processes started later (Ray workers, the service) inherit it."""
    if variable != p.TOKEN_ENV and os.environ.get(variable):
        os.environ[p.TOKEN_ENV] = os.environ[variable]


def loopback_url(url: str) -> bool:
    """Whether `url`'s host is this machine's loopback (``localhost`` or a loopback address)."""
    import ipaddress
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_route_refusal(urls: list[str], token_env: str, *, token_env_from_command_line: bool,
                        urls_from_command_line: bool, allow_http: bool) -> str | None:
    """Why the env token must not go to `urls`, or None (docs/env_service.md "Who may have the token").

    A shared recipe file must not be able to route a secret: a `token_env` other than ``SEAL_ENV_TOKEN``, and
    a token sent to an env URL off this machine, are accepted from the command line only (a list of secret
    variable names would never be complete). Over plain ``http://`` off this machine the token travels in
    clear: that also needs `allow_http` (``--allow-token-over-http``)."""
    if token_env != p.TOKEN_ENV and not token_env_from_command_line:
        return (f"env.token_env={token_env} comes from a recipe file: a recipe may only use {p.TOKEN_ENV}, as a "
                f"variable named there would be sent as the env token; name it on the command line "
                f"(env.token_env={token_env}) if you mean it")
    token = os.environ.get(token_env) or os.environ.get(p.TOKEN_ENV)
    remote = [u for u in urls if not loopback_url(u)]
    if not token or not remote:
        return None
    if not urls_from_command_line:
        return (f"env.urls from a recipe file would send the env token (${token_env}) to {remote[0]}, off this "
                "machine: give env.urls on the command line if that service may have it")
    clear = [u for u in remote if not u.lower().startswith("https://")]
    if clear and not allow_http:
        return (f"the env token (${token_env}) would travel in clear over plain http to {clear[0]}: use https://, "
                "or pass --allow-token-over-http if the network path is yours")
    return None


class EnvClientError(Exception):
    """The service refused a request (4xx). Never retried: the same request would fail again."""

    def __init__(self, status: int, code: str, message: str, method: str = "", url: str = ""):
        self.status = status
        self.code = code
        self.message = message
        self.method = method
        self.url = url
        super().__init__(status, code, message)

    def __str__(self) -> str:
        return f"{self.method} {self.url} -> {self.status} {self.code}: {self.message}"


class EnvUnavailable(Exception):
    """The service could not be reached or kept failing (5xx / transport errors) after retries."""

    def __init__(self, message: str, url: str = "", attempts: int = 0, last_error: str = ""):
        self.url = url
        self.attempts = attempts
        self.last_error = last_error
        super().__init__(message)


class EnvProtocolError(RuntimeError):
    """The env service answered with a payload that does not follow the wire protocol."""


@dataclass(frozen=True)
class ServiceHealth:
    """`EnvClient.health`: "ok" only if every replica says so (else "degraded"); the first replica's task count."""

    status: str
    tasks: int
    replicas: list[p.HealthReply]


class _Safety(enum.Enum):
    IDEMPOTENT = "idempotent"  # retry on any transport error or 5xx
    NOT_IDEMPOTENT = "not_idempotent"  # retry only if the request never arrived (or 503)


class _Attempt:
    """Outcome of one HTTP attempt: a response, or the transport error that replaced it."""

    __slots__ = ("error", "response")

    def __init__(self, response: httpx.Response | None = None, error: Exception | None = None):
        self.response = response
        self.error = error

    @property
    def delivered_unknown(self) -> bool:
        """True when the server may have processed the request although we got no usable reply."""
        if self.error is not None:
            return not isinstance(self.error, _NOT_SENT)
        return self.response is not None and self.response.status_code >= 500

    def describe(self) -> str:
        if self.error is not None:
            return f"{type(self.error).__name__}: {self.error}"
        assert self.response is not None
        return f"HTTP {self.response.status_code}: {self.response.text[:200]}"


def _error_from(response: httpx.Response) -> EnvClientError:
    code, message = f"http_{response.status_code}", response.text[:500]
    try:
        body = response.json()
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            code = str(err.get("code", code))
            message = str(err.get("message", message))
        elif isinstance(body, dict) and "detail" in body:  # FastAPI's default validation reply
            message = str(body["detail"])[:500]
    except ValueError:
        pass
    return EnvClientError(response.status_code, code, message, response.request.method, str(response.request.url))


R = TypeVar("R", bound=BaseModel)


def _reply(model: type[R], response: httpx.Response) -> R:
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        where = f"{response.request.method} {response.request.url}"
        if any(e["type"] == "json_invalid" for e in errors):
            raise EnvUnavailable(f"{where}: reply is not JSON: {response.text[:200]!r}", url=str(response.request.url)
                                 ) from None
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in errors[:5])
        raise EnvProtocolError(f"{where}: reply is not a {model.__name__}: {detail}") from None


_TLS: ssl.SSLContext | None = None


def _tls_context() -> ssl.SSLContext:
    global _TLS
    if _TLS is None:
        _TLS = ssl.create_default_context()
    return _TLS


class EnvClient:
    """Async client for one or more env-service replicas.

    Args:
        base_urls: one URL or a list (e.g. ``["http://127.0.0.1:8082", "http://127.0.0.1:8083"]``).
        timeout: seconds per request (connect timeout is min(timeout, 10)).
        max_retries: retries after the first attempt (so at most ``max_retries + 1`` attempts).
        backoff: base delay in seconds; attempt k waits ``backoff * 2**k`` times a jitter in [0.5, 1].
        token: bearer token sent as ``Authorization: Bearer <token>``; None = ``$SEAL_ENV_TOKEN`` if set.
        max_connections: connections in total, shared by all replicas (one per concurrent request).
        pool_size: connections per httpx pool when an httpx transport is given. httpcore's pool
            bookkeeping on each request grows with the square of the pool size (one 256-connection
            pool made the 256-episode benchmark CPU-bound), so requests are spread over
            ceil(max_connections / pool_size) pools, each request going to the pool with the fewest
            requests in flight.
        transport: optional httpx transport (tests pass ``httpx.MockTransport``); default: aiohttp
            underneath httpx (``seal.rollout.transport``), one pool of ``max_connections``.
    """

    def __init__(
        self,
        base_urls: str | list[str],
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.2,
        token: str | None = None,
        max_connections: int = 256,
        pool_size: int = 8,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("EnvClient needs at least one base URL")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"base URL must start with http:// or https://, got {url!r}")
        if max_retries < 0 or backoff < 0 or timeout <= 0 or max_connections <= 0 or pool_size <= 0:
            raise ValueError("need max_retries >= 0, backoff >= 0, timeout > 0, max_connections > 0, pool_size > 0")
        self.base_urls = [u.rstrip("/") for u in urls]
        self.max_retries = max_retries
        self.backoff = backoff
        if token is None:  # every client of the project authenticates the same way (docs/env_service.md)
            token = os.environ.get(p.TOKEN_ENV) or None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if transport is None:
            # aiohttp carries the bytes (seal/rollout/transport.py: half the CPU per request); one pool.
            transport = AiohttpTransport(max_connections)
            pool_size = max_connections
        n_pools = -(-max_connections // pool_size)
        per_pool = -(-max_connections // n_pools)
        # One TLS context for all pools: building one costs ~17 ms (certificate store), even for http.
        tls = _tls_context()
        self._pools = [
            httpx.AsyncClient(
                verify=tls,
                headers=headers,
                timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
                limits=httpx.Limits(max_connections=per_pool, max_keepalive_connections=per_pool),
                transport=transport,
            )
            for _ in range(n_pools)
        ]
        self._in_flight = [0] * n_pools
        self._owner: dict[str, str] = {}  # episode id -> replica URL that created it
        self._live = {u: 0 for u in self.base_urls}  # live episodes per replica (created, not deleted)
        self._rr = itertools.count()

    # ----------------------------------------------------------------------------- plumbing
    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.aclose()

    def replica_of(self, episode_id: str) -> str:
        """The replica URL serving `episode_id` (the creating one; the only one with one replica)."""
        owner = self._owner.get(episode_id)
        if owner is not None:
            return owner
        if len(self.base_urls) == 1:
            return self.base_urls[0]
        raise ValueError(
            f"unknown episode {episode_id!r}: with several replicas, episodes must be created through this client"
        )

    def live_episodes(self) -> dict[str, int]:
        """Live episodes per replica, as tracked by this client."""
        return dict(self._live)

    def _pick_replica(self, avoid: set[str] | frozenset[str] = frozenset()) -> str:
        candidates = [u for u in self.base_urls if u not in avoid] or self.base_urls
        fewest = min(self._live[u] for u in candidates)
        tied = [u for u in candidates if self._live[u] == fewest]
        return tied[next(self._rr) % len(tied)]

    def _delay(self, attempt: int) -> float:
        return self.backoff * (2**attempt) * random.uniform(0.5, 1.0)

    async def _send(self, method: str, url: str, body: Any = None) -> _Attempt:
        k = min(range(len(self._pools)), key=self._in_flight.__getitem__)
        self._in_flight[k] += 1
        try:
            return _Attempt(response=await self._pools[k].request(method, url, json=body))
        except httpx.TransportError as exc:
            return _Attempt(error=exc)
        finally:
            self._in_flight[k] -= 1

    @staticmethod
    def _retryable(attempt: _Attempt, safety: _Safety) -> bool:
        if attempt.error is not None:
            return safety is _Safety.IDEMPOTENT or isinstance(attempt.error, _NOT_SENT)
        status = attempt.response.status_code  # type: ignore[union-attr]
        if status < 500:
            return False
        return safety is _Safety.IDEMPOTENT or status == 503

    async def _call(self, method: str, base: str, path: str, body: Any, safety: _Safety) -> httpx.Response:
        """Send with bounded retries; return a <400 response or raise EnvClientError/EnvUnavailable.

        The first 4xx response is raised as `EnvClientError`, except a DELETE answering 404 after an
        earlier attempt with unknown outcome, which is returned (the episode is gone either way).
        """
        url = base + path
        unknown_before = False
        for attempt_no in range(self.max_retries + 1):
            attempt = await self._send(method, url, body)
            resp = attempt.response
            if resp is not None and resp.status_code < 400:
                return resp
            if resp is not None and resp.status_code < 500:
                if method == "DELETE" and resp.status_code == 404 and unknown_before:
                    return resp
                raise _error_from(resp)
            unknown_before = unknown_before or attempt.delivered_unknown
            if not self._retryable(attempt, safety) or attempt_no == self.max_retries:
                raise EnvUnavailable(
                    f"{method} {url} failed after {attempt_no + 1} attempt(s): {attempt.describe()}",
                    url=url,
                    attempts=attempt_no + 1,
                    last_error=attempt.describe(),
                )
            log.warning("env %s %s: %s; retrying", method, url, attempt.describe())
            await asyncio.sleep(self._delay(attempt_no))
        raise AssertionError("unreachable")

    # ----------------------------------------------------------------------------- routes
    async def health(self) -> ServiceHealth:
        """`GET /healthz` on every replica. Raises EnvUnavailable if a replica cannot be reached."""
        replies = await asyncio.gather(
            *(self._call("GET", u, "/healthz", None, _Safety.IDEMPOTENT) for u in self.base_urls)
        )
        payloads = [_reply(p.HealthReply, r) for r in replies]
        ok = all(h.status == "ok" for h in payloads)
        return ServiceHealth("ok" if ok else "degraded", payloads[0].tasks, payloads)

    async def tasks(self, split: str = "all") -> list[str]:
        """`GET /tasks?split=...` -> task ids (all replicas serve the same task set)."""
        if split not in ("train", "eval", "all"):
            raise ValueError(f"split must be train, eval or all, got {split!r}")
        resp = await self._call("GET", self._pick_replica(), f"/tasks?split={split}", None, _Safety.IDEMPOTENT)
        return _reply(p.TasksReply, resp).task_ids

    async def replay(self, task_id: str) -> p.ReplayReply:
        """`GET /tasks/{task_id}/replay` -> a training task's ground-truth replay and its failing twin."""
        path = f"/tasks/{quote(task_id, safe='')}/replay"
        resp = await self._call("GET", self._pick_replica(), path, None, _Safety.IDEMPOTENT)
        return _reply(p.ReplayReply, resp)

    async def create(
        self,
        task_id: str,
        mode: str = "train",
        interface: Mapping[str, Any] | p.Interface | None = None,
        episode_id: str | None = None,
        rules: str | None = None,
    ) -> p.CreateReply:
        """`POST /episodes` -> the episode's id, first messages, tools and info (retry rules: module doc).

        A 201 reply that is not a `CreateReply` raises `EnvProtocolError` after a best-effort delete of the
        episode it created."""
        if mode not in ("train", "eval"):
            raise ValueError(f"mode must be train or eval, got {mode!r}")
        if isinstance(interface, p.Interface):
            interface = interface.to_dict()
        request = p.CreateRequest(task_id=task_id, mode=mode, interface=interface, rules=rules)
        ours = episode_id is None
        eid = episode_id or uuid.uuid4().hex
        base = self._pick_replica()
        lost_on: str | None = None  # replica that got an attempt with unknown outcome for `eid`
        failed: set[str] = set()
        last = ""
        for attempt_no in range(self.max_retries + 1):
            body = request.model_copy(update={"episode_id": eid}).model_dump(exclude_none=True)
            attempt = await self._send("POST", base + "/episodes", body)
            resp = attempt.response
            if resp is not None and resp.status_code < 400:
                try:
                    created = _reply(p.CreateReply, resp)
                except EnvProtocolError:
                    await self._best_effort_delete(base, eid)
                    raise
                if created.episode_id != eid:
                    raise EnvUnavailable(
                        f"service answered episode {created.episode_id!r} for requested id {eid!r}", url=base
                    )
                self._owner[eid] = base
                self._live[base] += 1
                return created
            if resp is not None and resp.status_code == 409 and lost_on == base and ours:
                # Our own lost attempt created `eid` here; its reply (the initial messages) is gone.
                log.warning("env create %s: lost attempt created %s; deleting it and starting afresh", base, eid)
                await self._best_effort_delete(base, eid)
                eid, lost_on, last = uuid.uuid4().hex, None, "409 after a lost create"
            elif resp is not None and resp.status_code < 500:
                err = _error_from(resp)
                if resp.status_code == 409 and lost_on == base:
                    err.message += " (a previous attempt of this create may have created it)"
                raise err
            else:
                last = attempt.describe()
                if attempt.delivered_unknown:
                    lost_on = base  # retry here with the same id so a 409 can reveal it
                else:
                    failed.add(base)
                    if lost_on is None:
                        base = self._pick_replica(avoid=failed)
            if attempt_no < self.max_retries:
                log.warning("env create of %s: %s; retrying", task_id, last)
                await asyncio.sleep(self._delay(attempt_no))
        raise EnvUnavailable(
            f"POST /episodes for task {task_id!r} failed after {self.max_retries + 1} attempts: {last}",
            url=base,
            attempts=self.max_retries + 1,
            last_error=last,
        )

    async def step(self, episode_id: str, content: str) -> p.StepReply:
        """`POST /episodes/{id}/step` with the raw assistant text -> the observation, done, turn and info."""
        if not isinstance(content, str):
            raise TypeError(f"content must be str, got {type(content).__name__}")
        base = self.replica_of(episode_id)
        body = p.StepRequest(content=content).model_dump()
        resp = await self._call("POST", base, f"/episodes/{episode_id}/step", body, _Safety.NOT_IDEMPOTENT)
        return _reply(p.StepReply, resp)

    async def evaluate(self, episode_id: str) -> p.EvaluateReply:
        """`POST /episodes/{id}/evaluate` -> grading + per-turn diagnosis."""
        base = self.replica_of(episode_id)
        resp = await self._call("POST", base, f"/episodes/{episode_id}/evaluate", None, _Safety.IDEMPOTENT)
        return _reply(p.EvaluateReply, resp)

    async def delete(self, episode_id: str) -> None:
        """`DELETE /episodes/{id}`; the client forgets the episode whatever the outcome."""
        base = self.replica_of(episode_id)
        try:
            await self._call("DELETE", base, f"/episodes/{episode_id}", None, _Safety.IDEMPOTENT)
        finally:
            self._forget(episode_id)

    def _forget(self, episode_id: str) -> None:
        base = self._owner.pop(episode_id, None)
        if base is not None:
            self._live[base] -= 1

    async def _best_effort_delete(self, base: str, episode_id: str) -> None:
        try:
            await self._call("DELETE", base, f"/episodes/{episode_id}", None, _Safety.IDEMPOTENT)
        except (EnvClientError, EnvUnavailable) as exc:
            log.warning("env: could not delete orphan episode %s on %s (%s); it will expire", episode_id, base, exc)
