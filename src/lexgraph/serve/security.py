"""What the server trusts, below the routes: the ``Host`` a request names, the ``Origin`` of a request
that changes something, the admin token, and the headers every response carries.

* :class:`Guard` (ASGI middleware, the outermost): a ``Host`` that is not one of ``serve.allowed_hosts``
  (or the address of ``--host``) is refused 421 (a DNS-rebinding page, whose name resolves to
  127.0.0.1, reaches nothing), and a request with an ``Origin`` other than its own, or a
  ``Sec-Fetch-Site`` of another site, that is not ``GET``/``HEAD`` is refused 403 (no page of another
  site can post to the server); each refusal is one line of JSON and one log line. Every response gets
  :func:`security_headers` (a ``Content-Security-Policy`` that names no source outside the server,
  ``nosniff``, no framing, no referrer), and a redirect's ``Location`` is made relative, so the
  request's ``Host`` is never written back.
* :func:`admin_token`: the token ``POST /admin/reload`` needs (``Authorization: Bearer <token>``), read
  from ``serve.admin_token_file``, generated there at first start with mode 0600, compared in constant
  time (:func:`token_matches`).
* :class:`LogLimiter`: one log line per kind of fault per interval (a flood of refused requests, or
  ``accept()`` out of file descriptors, is not a flood of log lines); :func:`quiet_loop_errors` routes
  the event loop's own errors through it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
import time
from pathlib import Path
from urllib.parse import urlsplit

from lexgraph.core.errors import LexgraphError
from lexgraph.serve.settings import host_name

log = logging.getLogger("lexgraph.serve")

#: the methods that only read (every other method needs a request of the server's own origin)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

#: the policy of JSON answers and of anything else that is not a page: nothing may load or frame it
API_POLICY = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"


def inline_hashes(html: str, tag: str) -> list[str]:
    """The CSP source (``'sha256-…'``) of each inline ``<tag>…</tag>`` of ``html`` (one without a ``src``)."""
    found = re.findall(rf"<{tag}(?![^>]*\ssrc=)[^>]*>(.*?)</{tag}>", html, flags=re.S | re.I)
    return [f"'sha256-{base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()}'" for body in found]


def page_policy(style_hashes: list[str]) -> str:
    """The policy of the web page: its one inline style sheet (by hash), images of its own, forms
    posted to itself, no script at all, no framing."""
    styles = " ".join(style_hashes) or "'none'"
    return (
        f"default-src 'none'; style-src {styles}; img-src 'self' data:; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    )


def docs_policy(script_hashes: list[str]) -> str:
    """The policy of ``/docs`` (Swagger UI from the server's own ``/static/swagger``): its scripts from
    the server and its one inline script (by hash), its description fetched from the server."""
    scripts = " ".join(["'self'", *script_hashes])
    return (
        f"default-src 'none'; script-src {scripts}; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    )


def security_headers(policy: str = API_POLICY) -> list[tuple[bytes, bytes]]:
    """The headers of every response."""
    return [
        (b"content-security-policy", policy.encode("ascii")),
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", b"DENY"),
        (b"referrer-policy", b"no-referrer"),
        (b"cross-origin-resource-policy", b"same-origin"),
    ]


class LogLimiter:
    """At most one log line per ``key`` every ``interval_s`` seconds; the next line says how many
    were left out since."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def log(self, level: int, key: str, message: str, *args) -> bool:
        """Log ``message % args`` unless a line of ``key`` was logged within the interval (then count
        it); True when logged."""
        now = time.monotonic()
        if now - self._last.get(key, -1e18) < self.interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        self._last[key] = now
        held = self._held.pop(key, 0)
        suffix = f" ({held} more like it in the last {self.interval_s:g} s not logged)" if held else ""
        log.log(level, message + suffix, *args)
        return True


#: the one limiter of the server process (refused hosts and origins, slow readers, accept() errors)
LIMITER = LogLimiter()


def quiet_loop_errors(loop) -> None:
    """Route the event loop's own errors (``accept()`` out of file descriptors: asyncio reports each
    failed accept, up to the listen backlog at every wake-up, with a traceback) through
    :data:`LIMITER`: one line per kind of error per interval, no traceback for a resource error."""
    default = loop.get_exception_handler()

    def handler(loop, context) -> None:
        exc = context.get("exception")
        message = context.get("message", "")
        if isinstance(exc, OSError) and exc.errno is not None and "out of system resource" in message:
            LIMITER.log(
                logging.ERROR,
                f"resource:{exc.errno}",
                "cannot accept connections: %s (%s); new connections wait until some close",
                os.strerror(exc.errno),
                type(exc).__name__,
            )
            return
        if default is not None:
            default(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def parse_host(value: str) -> str | None:
    """The host name of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), or None if malformed."""
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        if end < 0 or (value[end + 1 :] and not re.fullmatch(r":\d{1,5}", value[end + 1 :])):
            return None
        return host_name(value[: end + 1])
    name, _, port = value.partition(":")
    if port and not port.isdigit():
        return None
    return host_name(name)


def allowed_host_names(hosts: list[str], bound: str | None) -> frozenset[str]:
    """``serve.allowed_hosts`` plus the address of ``--host`` (not a wildcard address: a request names
    the machine, never 0.0.0.0)."""
    names = {host_name(h) for h in hosts}
    if bound and bound not in ("0.0.0.0", "::", ""):
        names.add(host_name(bound))
    return frozenset(n for n in names if n)


class Guard:
    """ASGI middleware: the Host and Origin checks, the security headers and relative redirects
    (see the module docstring). ``hosts()`` gives the allowed names now (they follow a reload);
    ``policy(path)`` the Content-Security-Policy of a path."""

    def __init__(self, app, hosts, policy) -> None:
        self.app, self.hosts, self.policy = app, hosts, policy

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = _headers(scope)
        extra = security_headers(self.policy(scope["path"]))
        refusal = self.refusal(scope, headers)
        if refusal is not None:
            status, message = refusal
            return await send_error(send, status, message, extra)

        async def guarded_send(message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"location"]
                location = [relative_location(v) for k, v in message.get("headers", []) if k.lower() == b"location"]
                message = {
                    **message,
                    "headers": kept + [(b"location", v) for v in location] + [h for h in extra if h[0] not in names],
                }
            await send(message)

        await self.app(scope, receive, guarded_send)

    def refusal(self, scope, headers: dict[bytes, bytes]) -> tuple[int, str] | None:
        """``(status, message)`` of a request refused here, or None (and one log line per refusal)."""
        raw = headers.get(b"host", b"").decode("latin-1")
        name = parse_host(raw)
        if name is None or name not in self.hosts():
            shown = raw[:80] or "(none)"
            LIMITER.log(logging.WARNING, "host", "refused a request for host %r: not in serve.allowed_hosts", shown)
            expected = ", ".join(sorted(self.hosts()))
            return 421, f"this server does not answer for host {shown!r}; expected one of {expected} (allowed_hosts)"
        if scope["method"] in SAFE_METHODS:
            return None
        origin = headers.get(b"origin")
        site = headers.get(b"sec-fetch-site", b"").decode("latin-1").lower()
        refused = f"a {scope['method']} from another site is refused; expected a request of this server's own pages"
        if origin is not None:
            parts = urlsplit(origin.decode("latin-1"))
            if parts.scheme not in ("http", "https") or parts.netloc.lower() != raw.strip().lower():
                LIMITER.log(logging.WARNING, "origin", "refused a %s from origin %r", scope["method"], origin[:80])
                return 403, refused
        if site in ("cross-site", "same-site"):
            LIMITER.log(logging.WARNING, "origin", "refused a %s from another site (%s)", scope["method"], site)
            return 403, refused
        return None


def relative_location(value: bytes) -> bytes:
    """A redirect's target without its scheme and host (``/path?query``), never a ``//host`` one."""
    parts = urlsplit(value.decode("latin-1"))
    path = "/" + parts.path.lstrip("/\\")
    return (path + (f"?{parts.query}" if parts.query else "")).encode("latin-1")


def _headers(scope) -> dict[bytes, bytes]:
    found: dict[bytes, bytes] = {}
    for key, value in scope["headers"]:
        found.setdefault(key.lower(), value)
    return found


async def send_error(send, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """A whole JSON error response (``{"error": "<one line>"}``) on the ASGI ``send``; the connection closes."""
    from lexgraph.serve.limits import error_json

    body = error_json(message)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *(extra if extra is not None else security_headers()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --------------------------------------------------------------------------- the admin token

#: the shortest token accepted from a file the user wrote
MIN_TOKEN_CHARS = 24


def token_path(workspace: Path, setting: str) -> Path:
    """``serve.admin_token_file`` as a path: ``~`` the user's home, a relative path under ``workspace``."""
    path = Path(setting).expanduser()
    return path if path.is_absolute() else workspace / path


def admin_token(path: Path) -> str:
    """The admin token in ``path``, written there first (a fresh random token, mode 0600, its
    directory made with mode 0700) when there is none. A token file that other users may read, or one
    holding too short a token, is one line naming it."""
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w", encoding="ascii") as fh:
                fh.write(secrets.token_urlsafe(32) + "\n")
            log.info("admin token written to %s (mode 0600): POST /admin/reload needs it", path)
        except FileExistsError:
            pass  # another server wrote it meanwhile: read theirs
        except OSError as exc:
            raise LexgraphError(
                f"serve.admin_token_file: cannot write the admin token to {path} ({exc.strerror or exc})"
            ) from None
    try:
        mode = path.stat().st_mode
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise LexgraphError(f"serve.admin_token_file: cannot read {path} ({reason})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise LexgraphError(
            f"serve.admin_token_file: {path} may be read by other users (mode {stat.S_IMODE(mode):04o}); "
            f"expected mode 0600 (chmod 600 {path})"
        )
    if len(token) < MIN_TOKEN_CHARS or not token.isprintable() or " " in token:
        raise LexgraphError(
            f"serve.admin_token_file: {path} holds no usable token; expected one line of at least "
            f"{MIN_TOKEN_CHARS} characters without spaces (delete the file to have a new one made)"
        )
    return token


def token_matches(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <token>`` (compared in constant time)."""
    if not header:
        return False
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("utf-8", "replace"), token.encode("utf-8"))
