"""post_json and the per-loop session against a real aiohttp server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from async_reward._core.http import (
    HTTPStatusError,
    MalformedResponseError,
    close_sessions,
    get_session,
    post_json,
)
from async_reward._core.retry import AttemptsExhausted, default_is_transient, retry_async
from async_reward.config import RetryConfig

SECRET = "sk-test-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {SECRET}"}


@dataclass
class Server:
    url: str
    hits: Counter[str]


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    hits: Counter[str] = Counter()
    release = asyncio.Event()

    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"echo": await request.json()}, headers={"X-Trace": "abc"})

    async def too_many(request: web.Request) -> web.Response:
        return web.json_response({"error": "slow down"}, status=429, headers={"Retry-After": "2"})

    async def unavailable(request: web.Request) -> web.Response:
        return web.Response(status=503, text="down for maintenance " + "x" * 500)

    async def bad_request(request: web.Request) -> web.Response:
        # Echoes the key back, as some APIs do in "invalid key" errors.
        return web.Response(status=400, text=f"invalid key: {request.headers.get('Authorization')}")

    async def not_json(request: web.Request) -> web.Response:
        return web.Response(text="<html>oops</html>", content_type="text/html")

    async def slow(request: web.Request) -> web.Response:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(release.wait(), 60)  # released at teardown, so shutdown is quick
        return web.json_response({})

    async def drop(request: web.Request) -> web.Response:
        await request.read()
        assert request.transport is not None
        request.transport.close()
        raise ConnectionResetError  # nothing more to send on a closed connection

    async def flaky(request: web.Request) -> web.Response:
        hits["flaky"] += 1
        if hits["flaky"] <= 2:
            return web.Response(status=503, text="busy")
        return web.json_response({"score": 1.0, "hits": hits["flaky"]})

    async def redirect_loop(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(location=request.path)

    app = web.Application()
    for path, handler in [
        ("/echo", echo),
        ("/429", too_many),
        ("/503", unavailable),
        ("/400", bad_request),
        ("/html", not_json),
        ("/slow", slow),
        ("/drop", drop),
        ("/flaky", flaky),
        ("/loop", redirect_loop),
    ]:
        app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield Server(f"http://{host}:{port}", hits)
    finally:
        release.set()
        await close_sessions()
        await runner.cleanup()


def assert_no_secret(exc: BaseException) -> None:
    for text in (str(exc), repr(exc)):
        assert SECRET not in text


async def test_json_round_trip(server: Server) -> None:
    body, headers = await post_json(f"{server.url}/echo", {"a": [1, 2.5, "ü"]}, headers=AUTH, timeout_s=5)
    assert body == {"echo": {"a": [1, 2.5, "ü"]}}
    assert headers["x-trace"] == "abc"  # case-insensitive, as HTTP headers are


async def test_429_carries_retry_after(server: Server) -> None:
    with pytest.raises(HTTPStatusError) as info:
        await post_json(f"{server.url}/429?api_key={SECRET}", {}, headers=AUTH)
    error = info.value
    assert (error.status, error.retry_after_s, error.transient) == (429, 2.0, True)
    assert "slow down" in error.body_excerpt and default_is_transient(error)
    assert error.url == f"{server.url}/429"  # the query string (which may hold a key) is dropped
    assert_no_secret(error)


async def test_503_is_transient_and_excerpt_is_short(server: Server) -> None:
    with pytest.raises(HTTPStatusError) as info:
        await post_json(f"{server.url}/503", {})
    error = info.value
    assert (error.status, error.retry_after_s, error.transient) == (503, None, True)
    assert error.body_excerpt.startswith("down for maintenance") and len(error.body_excerpt) == 200


async def test_400_is_not_transient_and_echoed_key_is_redacted(server: Server) -> None:
    with pytest.raises(HTTPStatusError) as info:
        await post_json(f"{server.url}/400", {}, headers=AUTH)
    error = info.value
    assert (error.status, error.transient) == (400, False) and not default_is_transient(error)
    assert "invalid key" in error.body_excerpt and "[redacted]" in error.body_excerpt
    assert_no_secret(error)


async def test_non_json_2xx_is_malformed(server: Server) -> None:
    with pytest.raises(MalformedResponseError, match="oops") as info:
        await post_json(f"{server.url}/html", {}, headers=AUTH)
    assert isinstance(info.value, ValueError) and not default_is_transient(info.value)
    assert_no_secret(info.value)


async def test_timeout_surfaces_as_timeout_error(server: Server) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        await post_json(f"{server.url}/slow", {}, headers=AUTH, timeout_s=0.2)
    assert time.monotonic() - started < 30  # the handler answers only at teardown (or after 60 s)
    assert default_is_transient(info.value)
    assert "timed out after 0.2 s" in str(info.value)
    assert_no_secret(info.value)


async def test_dropped_connection_is_a_transient_connection_error(server: Server) -> None:
    with pytest.raises(aiohttp.ClientConnectionError) as info:
        await post_json(f"{server.url}/drop", {}, headers=AUTH, timeout_s=5)
    assert default_is_transient(info.value)
    assert_no_secret(info.value)


async def test_redirect_loop_error_does_not_carry_request_headers(server: Server) -> None:
    # aiohttp's own TooManyRedirects keeps our request headers in request_info, which repr() shows.
    with pytest.raises(HTTPStatusError) as info:
        await post_json(f"{server.url}/loop", {}, headers=AUTH, timeout_s=5)
    assert "TooManyRedirects" in info.value.body_excerpt
    assert_no_secret(info.value)


async def test_retry_and_post_json_end_to_end(server: Server) -> None:
    waits: list[float] = []

    async def no_sleep(seconds: float) -> None:
        waits.append(seconds)

    config = RetryConfig(max_attempts=4, initial_backoff_s=0.001, max_backoff_s=0.004, jitter_s=0.0)
    (body, _), attempts = await retry_async(
        lambda: post_json(f"{server.url}/flaky", {"x": 1}, headers=AUTH, timeout_s=5), config, sleep=no_sleep
    )
    assert (body, attempts, waits) == ({"score": 1.0, "hits": 3}, 3, [0.001, 0.002])


async def test_end_to_end_gives_up_on_persistent_503(server: Server) -> None:
    config = RetryConfig(max_attempts=2, initial_backoff_s=0.0, jitter_s=0.0)

    async def no_sleep(seconds: float) -> None:
        pass

    with pytest.raises(AttemptsExhausted) as info:
        await retry_async(lambda: post_json(f"{server.url}/503", {}), config, sleep=no_sleep)
    assert info.value.attempts == 2 and isinstance(info.value.last_error, HTTPStatusError)


async def test_session_is_shared_within_a_loop_and_replaced_after_close() -> None:
    session = get_session()
    assert get_session() is session and not session.closed
    await close_sessions()
    assert session.closed
    fresh = get_session()
    assert fresh is not session
    await close_sessions()
    await close_sessions()  # closing twice is harmless


def test_session_is_per_loop() -> None:
    async def probe() -> aiohttp.ClientSession:
        session = get_session()
        assert get_session() is session
        await close_sessions()
        return session

    first = asyncio.run(probe())
    second = asyncio.run(probe())
    assert first is not second


def test_get_session_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        get_session()
