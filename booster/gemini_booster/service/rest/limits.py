"""Limits applied before a request costs anything: the body size, and who may send a body.

``RequestLimits`` is a pure ASGI middleware in front of the routes. FastAPI reads and parses a
body before it resolves any dependency, so without it an unauthenticated client could make the
server take in (and JSON-parse) any amount of data before the 401. Here:

1. A ``Content-Length`` above ``max_body_bytes`` is a 413 at once, before any of the body is read.
2. A request with a body to ``/v1`` is authenticated from its headers first (401/403 with the
   same messages, metrics and challenge as the route's own dependency): safe methods need
   ``read``, the others ``write``.
3. The body is then read, counted as it streams (chunked bodies have no length up front) and
   cut off with a 413 as soon as it passes the limit; the route gets it replayed whole.

Refusals close the connection: the unread rest of the body must not be parsed as a next
request. ``uvicorn_limits`` holds the HTTP server's own limits (header size, idle keep-alive,
concurrent connections), for ``uvicorn.Config``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...config import Settings
from ..auth import AuthError
from .deps import AUTH_STATUS, CHALLENGE
from .errors import DATABASE_ERRORS, DATABASE_UNAVAILABLE

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Raises AuthError when the credential (the authorization header, or None) may not do the
# permission; anything it returns is ignored.
Guard = Callable[[str | None, str], object]

# The HTTP server's limits. An operator API serves a handful of people, a dashboard and a
# metrics scraper: a few hundred connections are plenty, and past them a 503 is better than
# running out of memory or file descriptors. Headers are bounded (h11, whose limit uvicorn
# exposes: pinned so that installing another parser cannot drop the limit silently), and idle
# keep-alive connections are closed after a few seconds.
HTTP_MAX_CONNECTIONS = 256
HTTP_MAX_HEADER_BYTES = 16 * 1024
HTTP_KEEP_ALIVE_S = 5


def uvicorn_limits(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.Config``: the HTTP server's own limits. The body limit
    (``settings.max_request_body_bytes``) is enforced by ``RequestLimits`` in the app."""
    return {
        "http": "h11",
        "h11_max_incomplete_event_size": HTTP_MAX_HEADER_BYTES,
        "limit_concurrency": HTTP_MAX_CONNECTIONS,
        "timeout_keep_alive": HTTP_KEEP_ALIVE_S,
    }


class RequestLimits:
    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        guard: Guard | None = None,
        guarded_prefix: str = "/v1",
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.guard = guard
        self.guarded_prefix = guarded_prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = None if chunked else headers.get("content-length")
        if not chunked and (length is None or length.strip() == "0"):
            await self.app(scope, receive, send)  # no body: nothing to limit
            return
        if length is not None:
            if not length.strip().isdigit():
                await refuse(send, 400, "malformed content-length")
                return
            if int(length) > self.max_body_bytes:
                await refuse(send, 413, self.too_large)
                return
        if self.guard is not None and self._guarded(scope["path"]):
            permission = "read" if scope["method"] in SAFE_METHODS else "write"
            if not await self._authorized(headers.get("authorization"), permission, send):
                return
        body = await self._read(receive, send)
        if body is not None:
            await self.app(scope, _replay(body, receive), send)

    @property
    def too_large(self) -> str:
        return f"request body above {self.max_body_bytes} bytes"

    def _guarded(self, path: str) -> bool:
        p = self.guarded_prefix
        return path == p or path.startswith(p + "/")

    async def _authorized(self, authorization: str | None, permission: str, send: Send) -> bool:
        assert self.guard is not None
        try:
            await run_in_threadpool(self.guard, authorization, permission)
        except AuthError as e:
            await refuse(send, AUTH_STATUS[e.reason], str(e), CHALLENGE)
            return False
        except DATABASE_ERRORS as e:
            log.error("credential check before the body: database unavailable: %s", e)
            await refuse(send, 503, DATABASE_UNAVAILABLE)
            return False
        return True

    async def _read(self, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None when it passed the limit (refused) or the client left."""
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body_bytes:
                await refuse(send, 413, self.too_large)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body already read, as one message; then the server's own (e.g. a disconnect)."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def refuse(
    send: Send, status: int, detail: str, headers: dict[str, str] | None = None
) -> None:
    """``{"detail": …}`` with ``status``, closing the connection (the body is left unread)."""
    content = json.dumps({"detail": detail}).encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(content)).encode()),
        (b"connection", b"close"),
        *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})
