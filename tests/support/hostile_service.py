"""A reward service that misbehaves on purpose, served on loopback by aiohttp: it redirects elsewhere,
echoes the request's secrets back in a 200 reply, or sends a gzip bomb. Shared by the tests of the
HTTP client (tests/_core/test_http.py) and of the managers that use it
(tests/managers/test_remote_service.py).
"""

from __future__ import annotations

import contextlib
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

__all__ = ["Handler", "Origin", "collect", "echo_headers", "gzip_bomb", "redirect", "serve"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Origin:
    """One served origin: its URL, what it received (by name), where its ``/redirect`` points."""

    url: str = ""
    hits: Counter[str] = field(default_factory=Counter)
    redirect_to: str = ""


async def echo_headers(request: web.Request) -> web.Response:
    """A careless or hostile service: the request's headers and URL come back in a 200 reply, nested,
    as a list and as a key."""
    sent = dict(request.headers)
    return web.json_response(
        {
            "score": 1.0,
            "debug": {"headers": sent, "url": str(request.url)},
            "seen": list(sent.values()),
            sent.get("X-Api-Key", "none"): "a secret as a key",
        }
    )


async def gzip_bomb(request: web.Request) -> web.Response:
    """A JSON reply of ``?bytes=`` bytes once inflated (``{"score": 0.5, "pad": "000..."}``), sent
    gzip-compressed in about a thousandth of that."""
    pad = int(request.query["bytes"]) - len(b'{"score": 0.5, "pad": ""}')
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip framing
    parts = [deflate.compress(b'{"score": 0.5, "pad": "')]
    chunk = b"0" * (1 << 20)
    while pad > 0:
        parts.append(deflate.compress(chunk[: min(pad, len(chunk))]))
        pad -= len(chunk)
    parts += [deflate.compress(b'"}'), deflate.flush()]
    return web.Response(
        body=b"".join(parts), headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
    )


def redirect(origin: Origin) -> Handler:
    """``/redirect?code=307`` answers that status with ``Location: origin.redirect_to``."""

    async def handler(request: web.Request) -> web.Response:
        origin.hits["redirect"] += 1
        return web.Response(
            status=int(request.query.get("code", "307")), headers={"Location": origin.redirect_to}
        )

    return handler


def collect(origin: Origin, secrets: tuple[str, ...]) -> Handler:
    """Scores whatever reaches it 1.0, counting requests by method and the secrets they carried."""

    async def handler(request: web.Request) -> web.Response:
        origin.hits[request.method] += 1
        body = await request.text()
        origin.hits["secrets"] += sum(
            secret in text for secret in secrets for text in [*request.headers.values(), body]
        )
        return web.json_response({"score": 1.0, "from": "the other origin"})

    return handler


@contextlib.asynccontextmanager
async def serve(origin: Origin, routes: list[tuple[str, Handler]]) -> AsyncIterator[Origin]:
    """Serve ``routes`` (any method; ``"*"`` as the path: every path) on a free loopback port,
    setting ``origin.url``."""
    app = web.Application()
    for path, handler in routes:
        app.router.add_route("*", "/{tail:.*}" if path == "*" else path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    origin.url = f"http://{host}:{port}"
    try:
        yield origin
    finally:
        await runner.cleanup()
