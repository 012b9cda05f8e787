"""HTTP hardening around uvicorn's h11 protocol: read deadlines, a bound on open connections, quiet logs.

uvicorn times out idle keep-alive connections only: a client that sends half a request line, or a body slower
than it promised, holds its connection (and a file descriptor) forever, and once the process runs out of
descriptors the health check stops answering and asyncio logs an ``accept()`` traceback every second.

* **Read deadline**: a request's headers and body must arrive within ``header_timeout_s`` of the connection
  opening or of the request's first byte; otherwise the connection is closed (a stalled upload reads as a
  disconnect). Idle keep-alive connections close after ``KEEP_ALIVE_S``.
* **Connection bound**: above ``max_connections`` open connections, idle ones (no request in progress) are
  closed, oldest first; if none is idle, the new connection may only ask for ``/healthz`` (others get a 503).
  The bound sits below the descriptor limit, so accepting never fails and the health check keeps answering.
* **Logs**: a client that disconnects mid-body is not an error; the service's own unexpected errors and
  asyncio's errors are logged as one line each, at most one per second (with a count of the ones skipped).
"""

from __future__ import annotations

import asyncio
import logging
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("env_service")
HEALTH_PATH = "/healthz"
# Idle keep-alive connections are closed after this (uvicorn's timeout_keep_alive): longer than the clients' own
# pool expiry (httpx 5 s, aiohttp 15 s), so a client never sends on a connection the server is closing.
KEEP_ALIVE_S = 75.0


class QuietLog:
    """One line per event, at most one per ``interval_s``; the skipped ones are counted in the next line."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s, self.last, self.skipped = interval_s, 0.0, 0

    def __call__(self, message: str) -> None:
        now = time.monotonic()
        if now - self.last < self.interval_s:
            self.skipped += 1
            return
        more = f" (+{self.skipped} similar since the last line)" if self.skipped else ""
        self.last, self.skipped = now, 0
        log.warning("%s%s", message[:500], more)


quiet = QuietLog()


def loop_exception_handler(_loop: asyncio.AbstractEventLoop, context: dict) -> None:
    exc = context.get("exception")
    quiet(f"env_service: {context.get('message', 'event loop error')}: {type(exc).__name__ if exc else ''} {exc or ''}")


async def _unavailable(scope, receive, send) -> None:
    body = b'{"error": {"code": "too_many_connections", "message": "too many open connections; retry"}}'
    headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def guarded_protocol(max_connections: int, header_timeout_s: float) -> type[H11Protocol]:
    """An ``H11Protocol`` subclass with the read deadline and the connection bound (pass as uvicorn's ``http``)."""

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.overflow = False
            self._deadline: asyncio.TimerHandle | None = None
            self._arm()
            if len(self.connections) > max_connections:
                self._shed()

        def _busy(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _shed(self) -> None:
            idle = [c for c in self.connections if c is not self and not c._busy()]
            for conn in idle[: len(self.connections) - max_connections]:
                conn.transport.close()
            if len(self.connections) - len(idle) > max_connections:
                self.overflow = True  # only a health check is served on this connection
                real = self.app

                async def health_only(scope, receive, send):
                    if scope.get("type") == "http" and scope.get("path") == HEALTH_PATH:
                        return await real(scope, receive, send)
                    return await _unavailable(scope, receive, send)

                self.app = health_only

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(header_timeout_s, self._expire)

        def _expire(self) -> None:
            self._deadline = None
            # IDLE: no complete request line and headers yet; SEND_BODY: the body is still on its way.
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
                if self.conn.their_state is h11.SEND_BODY and self.cycle is not None:
                    self.cycle.disconnected = True
                    self.cycle.message_event.set()
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            # The first bytes of a request start its deadline; idle keep-alive time is uvicorn's (KEEP_ALIVE_S).
            if self._deadline is None and not self._busy():
                self._arm()
            super().data_received(data)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            super().connection_lost(exc)

    return GuardedH11Protocol
