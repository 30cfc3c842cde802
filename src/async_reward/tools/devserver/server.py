"""A local OpenAI-compatible judge and reward service with fault injection.

One server plays three parts: the peer our tests talk to over real HTTP, the reward service our
benchmarks load, and an offline playground for users. It judges by rule (final answer against the
reference), so verdicts are known in advance, and it can be slow, saturated or faulty on demand:

* ``latency_ms``, ``capacity`` and ``overflow`` model a slow, bounded service;
* ``fault_rates`` inject seeded random faults (reproducible runs);
* ``hold`` keeps answers back until it goes off (all, or all but the next n): a test's gate;
* rubric and group requests (``devserver.criteria``, ``devserver.group``) get one verdict line
  per criterion or response; ``group_position_bonus`` gives the judge a bias for the first response;
* ``judge_style``, ``fixed_verdict`` and ``structured_output`` make it an adversary's judge (one
  that quotes the response after its verdict) and a server with or without ``response_format``;
  ``unescaped_json`` a judge that pastes the response unescaped into its JSON verdict;
  ``think_style`` returns thinking inline, prefilled or apart (``reasoning_content``);
* replies are cut at the request's ``max_tokens`` (in words) with ``finish_reason: length``;
* a ``@@fault:KIND@@`` or ``@@fault:KIND:N@@`` marker in a request body injects a fault into that
  request only (``:N``: into the first N identical bodies), so a test can count retry attempts.

Only the service endpoints (``/v1/chat/completions``, ``/score``) get latency, capacity, faults and
counters; ``/health`` and ``/admin/*`` always answer at once, so a test can watch a saturated server.

Longer than 400 lines: one aiohttp application, a handler per endpoint with its fault
injection; the judging rules, replies and log-probabilities are modules of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import itertools
import json
import math
import random
import re
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import Any

from aiohttp import web

from async_reward.tools.devserver.config import (
    FAULT_KINDS,
    RUNTIME_CONFIG_KEYS,
    DevServerConfig,
    ServerStats,
    coerce_runtime_value,
)
from async_reward.tools.devserver.criteria import criteria_reply, requested_criteria
from async_reward.tools.devserver.group import group_reply, requested_members
from async_reward.tools.devserver.judge import (
    Judgement,
    answers_match,
    cut_at_max_tokens,
    extract_final_answer,
    judge_messages,
    message_text,
    render_reply,
    render_structured,
    word_count,
)
from async_reward.tools.devserver.logprobs import Emulation, reply_logprobs

__all__ = ["DevServer"]

# A fault marker inside a request body: @@fault:KIND@@ or @@fault:KIND:N@@ (first N identical bodies).
_MARKER = re.compile(rb"@@fault:([A-Za-z0-9_]+)(?::(\d+))?@@")
# How often a hanging request checks whether its client gave up.
_HANG_POLL_S = 0.05
# The stats epoch a request arrived in (set by its handler, read where its outcome is counted).
_ARRIVAL_EPOCH: ContextVar[int] = ContextVar("arrival_epoch", default=-1)


def _error(status: int, message: str, kind: str, **headers: str) -> web.Response:
    """An error in OpenAI's shape, so the official client raises its typed errors."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return web.json_response(body, status=status, headers=headers)


class _BadRequest(Exception):
    """A request the server refuses with 400; the message names what is wrong."""


class DevServer:
    """The dev server on the running event loop. Use ``async with DevServer(cfg) as srv: srv.url``."""

    def __init__(self, config: DevServerConfig | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config if config is not None else DevServerConfig()
        self.config.validate()
        self.host, self.port = host, port
        self._rng = random.Random(self.config.seed)
        self._slots = self._make_slots(self.config.capacity)
        # ``hold``: None lets every answer through; n lets n more through, then holds the rest, each
        # held request waiting on its future in this queue (oldest first).
        self._passes: int | None = self._passes_for(self.config.hold)
        self._held: deque[asyncio.Future[None]] = deque()
        self._stats = ServerStats()
        self._marker_counts: Counter[str] = Counter()
        self._completion_ids = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    @staticmethod
    def _make_slots(capacity: int | None) -> asyncio.Semaphore | None:
        # asyncio.Semaphore wakes waiters in FIFO order, which is the fairness a queue should have.
        return None if capacity is None else asyncio.Semaphore(capacity)

    # -- lifecycle ---------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        """The aiohttp application, for embedding in another app or runner."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._service(self._chat_completion))
        app.router.add_post("/score", self._service(self._score))
        app.router.add_get("/admin/stats", self._admin(self._get_stats))
        app.router.add_post("/admin/reset", self._admin(self._post_reset))
        app.router.add_post("/admin/config", self._admin(self._post_config))
        app.router.add_get("/health", self._health)
        return app

    async def start(self) -> str:
        """Listen and return the base URL, e.g. ``http://127.0.0.1:54321`` (port 0 picks a free port)."""
        if self._runner is not None:
            raise RuntimeError("DevServer already started")
        # The shutdown timeout only backs up stop(), which cancels every request itself.
        runner = web.AppRunner(self.build_app(), shutdown_timeout=2.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._url = f"http://{host}:{self.port}"
        return self._url

    async def stop(self) -> None:
        """Stop at once: requests still inside (hanging, queued, sleeping) are cancelled, their
        connections closed. Abrupt on purpose: a test peer must never make a suite wait."""
        if self._runner is None:
            return
        tasks = [task for task in self._tasks if not task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def __aenter__(self) -> DevServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        """Base URL (no ``/v1``); raises if the server is not started."""
        if self._url is None:
            raise RuntimeError("DevServer is not started")
        return self._url

    @property
    def stats(self) -> dict[str, Any]:
        """A snapshot of the counters, as ``GET /admin/stats`` returns them."""
        return self._stats.snapshot()

    def reset(self) -> None:
        """Zero counters and marker counts, and reseed the RNG, so a run can be replayed exactly."""
        self._stats.reset()
        self._marker_counts.clear()
        self._rng.seed(self.config.seed)

    def update_config(self, /, **changes: Any) -> DevServerConfig:
        """Change runtime fields (``RUNTIME_CONFIG_KEYS``); ValueError on an unknown key or bad value.

        A new capacity applies to requests arriving from now on; those already queued or served keep
        the old slots, so ``max_in_flight`` may briefly reflect the old capacity.
        """
        unknown = sorted(set(changes) - set(RUNTIME_CONFIG_KEYS))
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; valid keys: {list(RUNTIME_CONFIG_KEYS)}")
        new = dataclasses.replace(self.config, **{k: coerce_runtime_value(k, v) for k, v in changes.items()})
        new.validate()
        if new.capacity != self.config.capacity:
            self._slots = self._make_slots(new.capacity)
        self.config = new
        if "hold" in changes:
            self._passes = self._passes_for(new.hold)
            self._let_held_through()
        return new

    @staticmethod
    def _passes_for(hold: bool | int) -> int | None:
        if isinstance(hold, bool):
            return 0 if hold else None
        return hold

    def _let_held_through(self) -> None:
        """Answer the held requests that ``hold`` now lets through, oldest first."""
        while self._held and (self._passes is None or self._passes > 0):
            waiter = self._held.popleft()
            if waiter.done():  # its client gave up
                continue
            waiter.set_result(None)
            if self._passes is not None:
                self._passes -= 1

    # -- service pipeline: auth, fault choice, capacity, latency, then the answer --------------------

    def _authorized(self, request: web.Request) -> bool:
        if self.config.api_key is None:
            return True
        expected = f"Bearer {self.config.api_key}".encode()
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        return hmac.compare_digest(given, expected)  # constant time: no key guessing by timing

    def _choose_fault(self, body: bytes) -> tuple[str | None, float]:
        """The fault for this request (marker first, else ``fault_rates``) and its latency in seconds.

        Both random draws are made for every request, marker or not, so the seeded sequence of
        faults does not depend on which requests carried markers or on the latency setting.
        """
        draw = self._rng.random()
        delay_s = self._rng.uniform(*self.config.latency_ms) / 1000.0
        marker = _MARKER.search(body)
        if marker is not None:
            kind = marker.group(1).decode().lower()
            if kind not in FAULT_KINDS:
                raise _BadRequest(f"unknown fault marker kind {kind!r}; valid kinds: {list(FAULT_KINDS)}")
            if marker.group(2) is None:
                return kind, delay_s
            key = hashlib.sha256(body).hexdigest()
            self._marker_counts[key] += 1
            return (kind if self._marker_counts[key] <= int(marker.group(2)) else None), delay_s
        cumulative = 0.0
        for kind, rate in self.config.fault_rates.items():
            cumulative += rate
            if draw < cumulative:
                return kind, delay_s
        return None, delay_s

    def _service(
        self, answer: Callable[[bytes], Awaitable[web.Response]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            task = asyncio.current_task()
            assert task is not None
            self._tasks.add(task)
            stats = self._stats
            _ARRIVAL_EPOCH.set(stats.epoch)
            stats.requests_by_path[request.path] += 1
            stats.request_times.append(time.time())
            stats.in_flight_total += 1
            stats.max_in_flight_total = max(stats.max_in_flight_total, stats.in_flight_total)
            try:
                response = await self._serve(request, answer)
            finally:
                stats.in_flight_total -= 1
                self._tasks.discard(task)
            if response is None:
                # Dropped or abandoned: the connection is gone, and aiohttp quietly fails to write this.
                return web.Response(status=499)
            if self._arrived_since_reset():
                stats.responses_by_status[str(response.status)] += 1
            return response

        return handle

    async def _serve(
        self, request: web.Request, answer: Callable[[bytes], Awaitable[web.Response]]
    ) -> web.Response | None:
        """The response, or None when the connection was dropped or abandoned."""
        if not self._authorized(request):
            return _error(401, "missing or wrong API key", "authentication_error")
        body = await request.read()
        try:
            fault, delay_s = self._choose_fault(body)
        except _BadRequest as exc:
            return _error(400, str(exc), "invalid_request_error")
        if fault == "hang":
            # Hanging without a capacity slot: a hang test must not starve the requests around it.
            self._stats.faults_injected[fault] += 1  # at once: no reset can come in between
            await self._hang(request)
            return None
        slots = self._slots
        if slots is not None and self.config.overflow == "reject" and slots.locked():
            self._stats.overflow_rejected += 1  # at once, as the hang above
            return self._too_many("over capacity")
        async with slots if slots is not None else contextlib.nullcontext():
            with self._holding_slot():
                await asyncio.sleep(delay_s)
                if not await self._wait_for_release(request):
                    return None
                if fault is not None:
                    # Faults are served like any request (slot and latency), as a failing backend is.
                    if self._arrived_since_reset():
                        self._stats.faults_injected[fault] += 1
                    return self._fault(fault, request)
                try:
                    return await answer(body)
                except _BadRequest as exc:
                    return _error(400, str(exc), "invalid_request_error")

    def _arrived_since_reset(self) -> bool:
        """Whether the request being served arrived after the last ``reset``, so its outcome counts."""
        return _ARRIVAL_EPOCH.get() == self._stats.epoch

    @contextlib.contextmanager
    def _holding_slot(self) -> Iterator[None]:
        stats = self._stats
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        try:
            yield
        finally:
            stats.in_flight -= 1

    async def _wait_for_release(self, request: web.Request) -> bool:
        """Wait while ``hold`` keeps this request back; False when its client gave up meanwhile.

        Polling the transport, as ``_hang`` does, lets an abandoned request leave ``in_flight_total``
        instead of being counted as held until the release."""
        if self._passes is None:
            return True
        if self._passes > 0:
            self._passes -= 1
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._held.append(waiter)
        stats = self._stats
        stats.held += 1
        try:
            while not waiter.done():
                if request.transport is None or request.transport.is_closing():
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(waiter), _HANG_POLL_S)
            return True
        finally:
            stats.held -= 1
            if not waiter.done():
                waiter.cancel()  # skipped by _let_held_through, so it takes no pass

    def _too_many(self, why: str) -> web.Response:
        retry_after = self.config.retry_after_s
        # Retry-After must be whole seconds (RFC 9110); retry-after-ms (OpenAI's) carries the exact value.
        headers = {
            "Retry-After": str(math.ceil(retry_after)),
            "retry-after-ms": str(round(retry_after * 1000)),
        }
        return _error(429, why, "rate_limit_error", **headers)

    @staticmethod
    async def _hang(request: web.Request) -> None:
        """Answer nothing until the client gives up (closes the connection) or stop() cancels us.

        Polling the transport is what lets a hang end when its client times out, so ``in_flight_total``
        does not keep counting requests nobody waits for (aiohttp does not cancel handlers then).
        """
        while request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(_HANG_POLL_S)

    def _fault(self, kind: str, request: web.Request) -> web.Response | None:
        headers = {"x-devserver-fault": kind}
        if kind == "429":
            response = self._too_many("injected fault: rate limited")
        elif kind == "drop":
            # Closing the transport before any status line: the client reads EOF
            # (aiohttp: ServerDisconnectedError; httpx: RemoteProtocolError).
            if request.transport is not None:
                request.transport.close()
            return None
        elif kind == "malformed":
            # Claims JSON, is not: a client that trusts Content-Type must still fail cleanly.
            body = '{"id": "chatcmpl-malformed", "object": "chat.completion", "choices": [{"message": '
            response = web.Response(status=200, text=body, content_type="application/json")
        else:
            status = int(kind)
            kinds = {400: "invalid_request_error", 500: "server_error", 503: "service_unavailable"}
            response = _error(status, f"injected fault: {kind}", kinds[status])
        response.headers.update(headers)
        return response

    # -- answers -----------------------------------------------------------------------------------

    @staticmethod
    def _json_object(body: bytes) -> dict[str, Any]:
        try:
            payload = json.loads(body)
        except ValueError as exc:
            raise _BadRequest(f"request body is not JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise _BadRequest("request body must be a JSON object")
        return payload

    async def _chat_completion(self, body: bytes) -> web.Response:
        payload = self._json_object(body)
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("'messages' must be a non-empty list")
        if payload.get("stream"):
            raise _BadRequest("stream=true is not supported by the dev server")
        n = payload.get("n") or 1
        if not isinstance(n, int) or n < 1:
            raise _BadRequest("'n' must be a positive integer")
        cfg = self.config
        schema_properties = self._structured_schema(payload.get("response_format"))
        judgement = judge_messages(messages, cfg.fixed_verdict)
        criteria = requested_criteria(messages)
        members = requested_members(messages) if criteria is None else None
        if members is not None:
            reply = group_reply(
                messages,
                members,
                fixed_verdict=cfg.fixed_verdict,
                echo_response=cfg.echo_response,
                position_bonus=cfg.group_position_bonus,
                style=cfg.judge_style,
            )
        elif criteria is not None:
            reply = criteria_reply(
                messages, criteria, fixed_verdict=cfg.fixed_verdict, echo_response=cfg.echo_response
            )
        elif schema_properties is None:
            reply = render_reply(
                judgement,
                cfg.verdict_format,
                think=cfg.think,
                think_style=cfg.think_style,
                echo_response=cfg.echo_response,
                style=cfg.judge_style,
                unescaped_json=cfg.unescaped_json,
            )
        else:
            reply = render_structured(
                judgement,
                schema_properties,
                think=cfg.think,
                think_style=cfg.think_style,
                echo_response=cfg.echo_response,
                style=cfg.judge_style,
            )
        finish_reason = "stop"
        max_tokens = payload.get("max_tokens")
        if cfg.honour_max_tokens and max_tokens is not None:
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                raise _BadRequest("'max_tokens' must be a positive integer")
            reply, cut = cut_at_max_tokens(reply, max_tokens)
            finish_reason = "length" if cut else "stop"
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.reasoning is not None:
            message["reasoning_content"] = reply.reasoning
        prompt_tokens = sum(word_count(message_text(m)) for m in messages)
        completion_tokens = (word_count(reply.content) + word_count(reply.reasoning or "")) * n
        if self._arrived_since_reset():
            self._stats.tokens_total += prompt_tokens + completion_tokens
        choice: dict[str, Any] = {"message": message, "finish_reason": finish_reason}
        if self._wants_logprobs(payload) and cfg.logprobs == "honour":
            top = payload.get("top_logprobs") or 0
            verdicts = list(reply.criterion_verdicts)
            if reply.verdict_at is not None and judgement.verdict is not None:
                verdicts.append((reply.verdict_at, judgement.verdict))
            choice["logprobs"] = reply_logprobs(
                reply.content,
                verdicts,
                self._verdict_probability(judgement),
                top,
                cfg.logprobs_end_token,
                Emulation.of(cfg, payload),
            )
        return web.json_response(
            {
                "id": f"chatcmpl-{next(self._completion_ids)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": payload.get("model") or "devserver-judge",
                "choices": [{"index": i, **choice} for i in range(n)],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )

    def _verdict_probability(self, judgement: Judgement) -> float:
        """``verdict_probability``, or with ``verdict_probability_low`` a draw in between that is the
        same for the same response (a judge more sure of some responses than of others)."""
        high, low = self.config.verdict_probability, self.config.verdict_probability_low
        if low is None:
            return high
        digest = hashlib.sha256((judgement.response or "").encode("utf-8")).digest()
        return low + (high - low) * int.from_bytes(digest[:8], "big") / 2**64

    @staticmethod
    def _wants_logprobs(payload: dict[str, Any]) -> bool:
        """``logprobs`` asked for, with a valid ``top_logprobs`` (0 to 20, as OpenAI's API takes).

        Raises:
            _BadRequest: a ``logprobs`` that is not a boolean or a ``top_logprobs`` out of range.
        """
        wanted, top = payload.get("logprobs", False), payload.get("top_logprobs")
        if not isinstance(wanted, bool):
            raise _BadRequest("'logprobs' must be a boolean")
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
            raise _BadRequest("'top_logprobs' must be an integer from 0 to 20")
        if top is not None and not wanted:
            raise _BadRequest("'top_logprobs' needs 'logprobs': true")
        return wanted

    def _structured_schema(self, response_format: Any) -> dict[str, Any] | None:
        """The ``properties`` of a json_schema ``response_format`` to fill; None for a text reply.

        Raises:
            _BadRequest: ``structured_output`` is ``reject`` (worded as servers without structured
                output word it), or a ``response_format`` this server cannot honour.
        """
        if response_format is None:
            return None
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        if kind == "text":
            return None
        mode = self.config.structured_output
        if mode == "ignore":
            return None
        if kind != "json_schema" or mode == "reject":
            raise _BadRequest(f"response_format type {kind!r} is not supported by this server")
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(properties, dict) or "score" not in properties:
            raise _BadRequest(
                "response_format json_schema must have a schema whose properties include 'score'"
            )
        return properties

    async def _score(self, body: bytes) -> web.Response:
        payload = self._json_object(body)
        if "response" not in payload:
            raise _BadRequest("missing required key 'response'")
        pred = extract_final_answer(str(payload["response"] or ""))
        truth = payload.get("ground_truth")
        score = 1.0 if truth is not None and answers_match(pred, str(truth)) else 0.0
        return web.json_response({"score": score, "acc": score, "pred": pred or ""})

    # -- admin -------------------------------------------------------------------------------------

    def _admin(
        self, handler: Callable[[web.Request], Awaitable[web.Response]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            if not self._authorized(request):
                return _error(401, "missing or wrong API key", "authentication_error")
            return await handler(request)

        return handle

    async def _get_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats)

    async def _post_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"status": "reset"})

    async def _post_config(self, request: web.Request) -> web.Response:
        try:
            new = self.update_config(**self._json_object(await request.read()))
        except (_BadRequest, ValueError, TypeError) as exc:
            return _error(400, str(exc), "invalid_request_error")
        shown = {key: getattr(new, key) for key in RUNTIME_CONFIG_KEYS if key != "api_key"}
        return web.json_response({**shown, "api_key_set": new.api_key is not None})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})
