"""The bounds every request is held to, below the routes: its body's size and how long its head
and body may take to arrive, and the one shape of every error: ``{"error": "<one line>"}``.

* :class:`RequestLimits` (ASGI middleware): a request head (line and headers) over ``max_head_bytes``
  is answered 431; a ``Content-Length`` over ``max_body_bytes`` is answered
  413 before a byte of the body is read; a body that grows past it while read (chunked), 413; a
  body whose next part does not come within ``body_timeout_s``, 408.
* :class:`BoundedH11Protocol` (uvicorn's h11 protocol): a connection that has not sent a whole
  request head within ``header_timeout_s`` of opening (or of its previous response) is answered
  408 and closed, so slow clients (slowloris) hold no connection for long; a request h11 cannot
  parse (a NUL byte in the request line, an oversized head) is answered 400 in the same JSON
  shape, not uvicorn's plain text. Its answers are bounded in time too: while part of an answer
  waits in the server's buffer, the client must take at least :data:`MIN_DRAIN_BYTES` of it (or
  all of it) every ``write_timeout_s``, or the connection is dropped (a client that sends a large
  ``POST /search`` and never reads holds neither its buffer nor its socket for long), and a closed
  connection whose client reads nothing is dropped the same way rather than left to flush forever.
"""

from __future__ import annotations

import asyncio
import json
import logging
from http import HTTPStatus
from urllib.parse import unquote_to_bytes

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class ApiError(Exception):
    """A request the server refuses: ``status`` (a 4xx) and one line for the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = " ".join(message.split())


def error_json(message: str) -> bytes:
    """The body of every error response: one line of JSON."""
    return json.dumps({"error": " ".join(message.split())}, ensure_ascii=False).encode("utf-8")


def raw_response(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 error response that closes the connection (for the protocol level)."""
    from lexgraph.serve.security import security_headers

    body = error_json(message)
    extra = "".join(f"{k.decode()}: {v.decode()}\r\n" for k, v in security_headers())
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
    )
    return head.encode("ascii") + body


class BodyTooLarge(ApiError):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over {limit} bytes; expected a smaller request")


class BodyTimeout(ApiError):
    def __init__(self, seconds: float) -> None:
        super().__init__(408, f"the request body did not arrive within {seconds:g} s")


class RequestLimits:
    """ASGI middleware: the size and time bounds of requests (see the module docstring)."""

    def __init__(self, app, max_bytes: int, timeout_s: float, max_head_bytes: int) -> None:
        self.app, self.max_bytes, self.timeout_s, self.max_head_bytes = app, max_bytes, timeout_s, max_head_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        head = (
            len(scope["raw_path"]) + len(scope["query_string"]) + sum(len(k) + len(v) + 4 for k, v in scope["headers"])
        )
        if head > self.max_head_bytes:
            return await _send_error(send, 431, f"the request head is over {self.max_head_bytes} bytes")
        try:  # the path and query, once percent-decoded, are UTF-8 text (no silent U+FFFD)
            for raw in (scope["raw_path"], scope["query_string"]):
                unquote_to_bytes(raw.replace(b"+", b" ")).decode("utf-8")
        except UnicodeDecodeError:
            return await _send_error(send, 400, "the path or query is not valid UTF-8 once percent-decoded")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            status, message = (
                (413, BodyTooLarge(self.max_bytes).message) if length.isdigit() else (400, "bad Content-Length")
            )
            return await _send_error(send, status, message)
        seen, deadline = 0, asyncio.get_running_loop().time() + self.timeout_s

        async def bounded_receive():  # the whole body within timeout_s, however slowly it trickles
            nonlocal seen
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except TimeoutError:
                raise BodyTimeout(self.timeout_s) from None
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, bounded_receive, send)


async def _send_error(send, status: int, message: str) -> None:
    from lexgraph.serve.security import send_error

    await send_error(send, status, message)


#: what a client must take of an answer waiting in the server's buffer every ``write_timeout_s`` (or
#: all of it): asyncio's high-water mark of a transport's buffer, one buffer's worth
MIN_DRAIN_BYTES = 64 * 1024


class _CountingTransport:
    """A transport that counts the bytes written to it (the rest is the transport's own), so that the
    protocol knows how much of what it wrote the client has taken."""

    def __init__(self, transport, protocol: BoundedH11Protocol) -> None:
        self._transport, self._protocol = transport, protocol
        self.written = 0

    def write(self, data) -> None:
        self.written += len(data)
        self._transport.write(data)
        self._protocol._watch_writes()

    def taken(self) -> int:
        """The bytes written that have left the server's buffer."""
        return self.written - self._transport.get_write_buffer_size()

    def __getattr__(self, name):
        return getattr(self._transport, name)


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head, a bound on how long a client may
    leave its answer unread, and JSON protocol errors."""

    header_timeout_s: float = 10.0  # set by lexgraph.serve.server from serve.header_timeout_s
    write_timeout_s: float = 10.0  # ... and serve.write_timeout_s
    _head_deadline: asyncio.TimerHandle | None = None
    _write_deadline: asyncio.TimerHandle | None = None
    _taken_at_check = 0
    _answered = False  # a response was sent on this connection, and nothing of another request came since

    def connection_made(self, transport) -> None:
        super().connection_made(_CountingTransport(transport, self))
        self._arm_head_deadline()

    def _watch_writes(self) -> None:
        """After a write: while some of it waits in the buffer, check the client takes it."""
        if self._write_deadline is None and self.transport.get_write_buffer_size() > 0:
            self._taken_at_check = self.transport.taken()
            self._write_deadline = self.loop.call_later(self.write_timeout_s, self._check_reader)

    def _check_reader(self) -> None:
        self._write_deadline = None
        waiting = self.transport.get_write_buffer_size()
        if waiting == 0:
            return
        taken = self.transport.taken() - self._taken_at_check
        if taken >= min(MIN_DRAIN_BYTES, waiting + taken) and taken > 0:
            self._watch_writes()  # the client reads: watch the next interval
            return
        from lexgraph.serve.security import LIMITER

        LIMITER.log(
            logging.INFO,
            "slow-reader",
            "dropped a connection whose client took %d bytes of its answer in %g s (%d waiting)",
            taken,
            self.write_timeout_s,
            waiting,
        )
        self.transport.abort()

    def _arm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        self._head_deadline = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        busy = self.cycle is not None and not self.cycle.response_complete
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE or busy:
            return
        if not self._answered:  # an idle keep-alive connection is closed without a word
            self.transport.write(raw_response(408, f"no whole request head within {self.header_timeout_s:g} s"))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        self._answered = False
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE and self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def on_response_complete(self) -> None:
        self._answered = True
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_deadline()

    def connection_lost(self, exc) -> None:
        for deadline in (self._head_deadline, self._write_deadline):
            if deadline is not None:
                deadline.cancel()
        self._head_deadline = self._write_deadline = None
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self.transport.write(raw_response(400, "not a valid HTTP/1.1 request"))
        self.transport.close()
