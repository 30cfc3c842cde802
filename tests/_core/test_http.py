"""post_json and the per-loop session against a real aiohttp server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web

from async_reward._core.http import (
    MAX_REPLY_BYTES,
    HTTPStatusError,
    MalformedResponseError,
    close_sessions,
    get_session,
    post_json,
)
from async_reward._core.http_secrets import secrets_of
from async_reward._core.retry import AttemptsExhausted, default_is_transient, retry_async
from async_reward.config import RetryConfig
from tests.support.hostile_service import Origin, collect, echo_headers, gzip_bomb, redirect, serve

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

    async def raw(request: web.Request) -> web.Response:
        # Sends back the request's "reply" as the body, byte for byte, with its "status".
        sent = await request.json()
        return web.Response(
            status=sent.get("status", 200), text=sent["reply"], content_type="application/json"
        )

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
        ("/raw", raw),
        ("/echo_headers", echo_headers),
        ("/gzip_bomb", gzip_bomb),
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


async def test_a_redirect_to_itself_is_refused_once_without_request_headers(server: Server) -> None:
    # Followed, it was aiohttp's own TooManyRedirects, whose request_info (shown by repr()) holds our
    # request headers; now the first 307 is the answer.
    with pytest.raises(HTTPStatusError) as info:
        await post_json(f"{server.url}/loop", {}, headers=AUTH, timeout_s=5)
    assert info.value.status == 307 and "not followed" in info.value.body_excerpt
    assert_no_secret(info.value)


HEADER_SECRET = "hdr-secret-abcdefghijk"
QUERY_SECRET = "qtoken-secret-0123456"


@pytest.fixture
async def redirecting() -> AsyncIterator[Origin]:
    origin = Origin()
    async with serve(origin, [("/redirect", redirect(origin))]):
        yield origin


@pytest.fixture
async def other_origin() -> AsyncIterator[Origin]:
    """Another origin (its own port), which scores whatever reaches it 1.0."""
    origin = Origin()
    async with serve(origin, [("*", collect(origin, (SECRET, HEADER_SECRET)))]):
        yield origin


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
async def test_a_redirect_is_not_followed_and_sends_nothing_elsewhere(
    redirecting: Origin, other_origin: Origin, code: int
) -> None:
    # The Location names another origin, with a user:password and a token in its query: none of it
    # may reach the reason, and the other origin must get neither the headers nor the sample.
    host = other_origin.url.removeprefix("http://")
    redirecting.redirect_to = f"http://user:{SECRET}@{host}/collect?token={QUERY_SECRET}"
    headers = {**AUTH, "X-Api-Key": HEADER_SECRET}
    url = f"{redirecting.url}/redirect?code={code}"
    with pytest.raises(HTTPStatusError) as info:
        await post_json(url, {"ground_truth": "42"}, headers=headers, timeout_s=5, url_key="remote.url")
    error = info.value
    assert (error.status, error.transient) == (code, False)
    assert error.body_excerpt == (
        f"redirect to http://{host}/collect not followed (set remote.url to the final URL)"
    )
    assert other_origin.hits == Counter() and redirecting.hits["redirect"] == 1
    for text in (str(error), repr(error)):
        assert SECRET not in text and HEADER_SECRET not in text and QUERY_SECRET not in text


@pytest.mark.parametrize("credentials", ["bearer", "url"])
async def test_a_2xx_reply_echoing_secrets_comes_back_redacted(server: Server, credentials: str) -> None:
    # A bearer key in a header, or a user:password in the URL (aiohttp sends it as "Basic <base64>",
    # which comes back too); beside them a secret header and a token in the query.
    headers = {"X-Api-Key": HEADER_SECRET, "Content-Type": "application/json"}
    host = server.url.removeprefix("http://")
    if credentials == "bearer":
        headers.update(AUTH)
        url = f"http://{host}/echo_headers?token={QUERY_SECRET}"
    else:
        url = f"http://user:{SECRET}@{host}/echo_headers?token={QUERY_SECRET}"
    body, _ = await post_json(url, {}, headers=headers, timeout_s=5)
    text = json.dumps(body)
    assert body["score"] == 1.0 and "[redacted]" in text and "[redacted]" in body
    assert body["debug"]["headers"]["Content-Type"] == "application/json"  # a plain header is kept
    for secret in (SECRET, HEADER_SECRET, QUERY_SECRET):
        assert secret not in text
    assert body["debug"]["headers"]["Authorization"].endswith("[redacted]")


@pytest.mark.parametrize(
    ("reply", "key"),
    [
        ('{"score": 0.0, "feedback": "", "score": 1.0}', "score"),  # text spliced into the JSON
        ('{"score": 0.5, "debug": {"a": 1, "a": 2}}', "a"),
        ('{"choices": [{"message": {"content": "[[1]]", "content": "[[9]]"}}]}', "content"),
    ],
)
async def test_a_key_repeated_in_one_object_at_any_depth_is_malformed_naming_it(
    server: Server, reply: str, key: str
) -> None:
    # json.loads keeps the last of the values: the injected score would have counted.
    with pytest.raises(MalformedResponseError) as info:
        await post_json(f"{server.url}/raw", {"reply": reply}, headers=AUTH, timeout_s=5)
    assert f"repeats the key {key!r} in one object" in str(info.value)
    assert not default_is_transient(info.value)


async def test_a_repeated_key_is_named_without_the_secret_it_holds(server: Server) -> None:
    reply = json.dumps({SECRET: 1}).replace("}", f", {json.dumps(SECRET)}: 2}}")
    with pytest.raises(MalformedResponseError, match=r"repeats the key '\[redacted\]'") as info:
        await post_json(f"{server.url}/raw", {"reply": reply}, headers=AUTH, timeout_s=5)
    assert_no_secret(info.value)


async def test_the_same_key_in_different_objects_and_non_finite_constants_are_read(server: Server) -> None:
    reply = '{"score": 0.5, "a": {"score": 1}, "b": [{"score": 2}], "nan": NaN, "inf": -Infinity}'
    body, _ = await post_json(f"{server.url}/raw", {"reply": reply}, timeout_s=5)
    assert body["a"] == {"score": 1} and body["b"] == [{"score": 2}]
    assert math.isnan(body["nan"]) and body["inf"] == -math.inf  # each reader refuses them where it must


KEY_WITH_SLASHES = "sk-live/SECRETKEY+0123456789/abc"


def _spellings_of_bearer() -> dict[str, str]:
    """An error body echoing ``Authorization: Bearer <KEY_WITH_SLASHES>`` as servers spell it."""
    bearer = f"Bearer {KEY_WITH_SLASHES}"
    partly_escaped = "\\u0042earer \\u0073" + KEY_WITH_SLASHES[1:]  # \u escapes of some characters
    return {
        "json, / as \\/": json.dumps({"error": f"invalid token: {bearer}"}).replace("/", "\\/"),
        "json, \\u escapes": '{"error": "invalid token: ' + partly_escaped + '"}',
        "json, all \\u": '{"error": "invalid token: ' + "".join(f"\\u{ord(c):04x}" for c in bearer) + '"}',
        "text, / as \\/": "invalid token: " + bearer.replace("/", "\\/"),
        "text, \\u escapes": "invalid token: " + partly_escaped,
        "text cut short, \\/": "invalid token: " + bearer.replace("/", "\\/") + " " + "x" * 20000,
        "url-encoded": "invalid token: " + quote(KEY_WITH_SLASHES, safe=""),
        "url-encoded, / kept": "invalid token: " + quote(KEY_WITH_SLASHES),
    }


@pytest.mark.parametrize("spelling", list(_spellings_of_bearer()))
async def test_a_key_echoed_escaped_in_an_error_body_is_redacted(server: Server, spelling: str) -> None:
    reply = _spellings_of_bearer()[spelling]
    headers = {"Authorization": f"Bearer {KEY_WITH_SLASHES}"}
    with pytest.raises(HTTPStatusError) as info:
        await post_json(f"{server.url}/raw", {"reply": reply, "status": 401}, headers=headers, timeout_s=5)
    error = info.value
    assert "invalid token: [redacted]" in error.body_excerpt and "[redacted]" in error.body_head
    for text in (str(error), repr(error), error.body_head):
        assert "SECRETKEY" not in text and b"SECRETKEY".hex() not in text


async def test_short_secrets_are_redacted_and_plain_short_values_kept(server: Server) -> None:
    # A URL password whatever its length, a header or query value under a secret's name (X-Api-Key,
    # token) too; a plain short value (X-Region: eu, mode=fast) is a setting and stays readable, so the
    # reply's "neutral" is not garbled into "n[redacted]tral".
    host = server.url.removeprefix("http://")
    url = f"http://user:pw7@{host}/echo_headers?token=Tk5&mode=fast"
    body, _ = await post_json(url, {}, headers={"X-Api-Key": "Zq7#k2P", "X-Region": "eu"}, timeout_s=5)
    text = json.dumps(body)
    assert body["debug"]["headers"]["X-Api-Key"] == "[redacted]"
    assert body["debug"]["headers"]["X-Region"] == "eu"
    # One or two characters are never searched for: "7" would garble a judge's "[[7]]" everywhere.
    assert secrets_of("http://127.0.0.1/v1?token=7", {"X-Api-Key": "k9"}) == []
    assert body["debug"]["headers"]["Authorization"] == "[redacted]"  # Basic base64(user:pw7)
    assert body["debug"]["url"].endswith("/echo_headers?token=[redacted]&mode=fast")
    for secret in ("Zq7#k2P", "pw7", "Tk5"):
        assert secret not in text


async def test_a_reply_that_inflates_past_the_cap_is_refused_naming_it(server: Server) -> None:
    with pytest.raises(MalformedResponseError) as info:
        await post_json(f"{server.url}/gzip_bomb?bytes={MAX_REPLY_BYTES + 1}", {}, timeout_s=60)
    message = str(info.value)
    assert f"{MAX_REPLY_BYTES // (1 << 20)} MiB" in message and "MAX_REPLY_BYTES" in message
    assert not default_is_transient(info.value)


async def test_a_large_reply_within_the_cap_is_read_whole(server: Server) -> None:
    # A judge's reply with logprobs runs to megabytes: the cap is far above it.
    size = 8 << 20
    body, _ = await post_json(f"{server.url}/gzip_bomb?bytes={size}", {}, timeout_s=60)
    assert body["score"] == 0.5 and len(body["pad"]) == size - len(b'{"score": 0.5, "pad": ""}')


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
