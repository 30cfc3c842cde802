"""The Ray actor behind one stand-in judge replica (tests/support/judge_replica_standins.py), in a module that
imports nothing of verl.

Ray imports an actor's class by its module in the worker process: the replicas' module registers with
verl (``RolloutReplica``, which imports torch and verl), and a replica process that imported it paid
about 5 CPU-seconds for code it never runs. This module holds only what the replica process runs: our
dev server behind a replica's name and sleep state.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from typing import Any

import ray
from aiohttp import web

from async_reward.tools.devserver import DevServer, DevServerConfig

__all__ = ["JudgeReplicaServer", "SleepyDevServer"]


class SleepyDevServer(DevServer):
    """The dev server behind a replica's name and sleep state (see
    tests/support/judge_replica_standins.py)."""

    def __init__(self, config: DevServerConfig, host: str, served_name: str, port: int = 0) -> None:
        super().__init__(config, host=host, port=port)
        self.served_name = served_name
        self.asleep = False
        self.requests_while_asleep = 0
        self.models: Counter[str] = Counter()
        #: Chat completions inside the replica now (being generated), as vLLM's engine holds them.
        self.in_flight = 0
        #: Each such request's ``[start, end]`` on the node's monotonic clock (``end`` None: inside
        #: now), so a test can count what several replicas held at once (:func:`peak_in_flight`).
        self.spans: list[list[float | None]] = []
        #: ``in_flight`` at each ``sleep`` that acts: requests still inside when the judge is put to sleep.
        self.in_flight_at_sleep: list[int] = []

    def build_app(self) -> web.Application:
        app = super().build_app()

        @web.middleware
        async def replica(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.path != "/v1/chat/completions":
                return await handler(request)
            if self.asleep:
                self.requests_while_asleep += 1
                return web.json_response({"error": {"message": "the engine is asleep"}}, status=503)
            try:
                model = json.loads(await request.read()).get("model")
            except (ValueError, AttributeError):
                model = None
            self.models[str(model)] += 1
            if model != self.served_name:  # vLLM's answer to a model it does not serve
                message = f"The model `{model}` does not exist."
                return web.json_response({"error": {"message": message, "type": "NotFoundError"}}, status=404)
            self.in_flight += 1
            span: list[float | None] = [time.monotonic(), None]
            self.spans.append(span)
            try:
                return await handler(request)
            finally:
                self.in_flight -= 1
                span[1] = time.monotonic()

        app.middlewares.append(replica)
        return app


@ray.remote(num_cpus=0)
class JudgeReplicaServer:
    """One replica: the dev server in this actor's event loop. ``colocated``: verl's ``COLOCATED``
    rollout mode, the only one whose ``wake_up`` / ``sleep`` act (as vLLM's server)."""

    def __init__(self, served_name: str, colocated: bool, free_cache_engine: bool, config: dict) -> None:
        self.served_name = served_name
        self.colocated = colocated
        self.free_cache_engine = free_cache_engine
        self.config = DevServerConfig(**config)
        self.server: SleepyDevServer | None = None

    async def start(self, port: int = 0, wait_s: float = 0.0) -> str:
        """Listen on the node's address and ``port`` (0: a free one), trying again for ``wait_s`` while
        the port is taken (a killed replica's, until its process has closed it); returns ``ip:port``
        (no scheme, as verl's replicas do)."""
        host = ray.util.get_node_ip_address()
        deadline = time.monotonic() + wait_s
        while True:
            self.server = SleepyDevServer(self.config, host, self.served_name, port)
            try:
                url = await self.server.start()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
                continue
            return url.removeprefix("http://")

    async def wake_up(self) -> None:
        if self.colocated:
            self._server().asleep = False

    async def sleep(self) -> None:
        if not self.colocated or not self.free_cache_engine:
            return
        server = self._server()
        server.in_flight_at_sleep.append(server.in_flight)
        while server.in_flight:  # vLLM waits for the requests inside to drain first
            await asyncio.sleep(0.01)
        server.asleep = True

    async def update_config(self, changes: dict) -> None:
        self._server().update_config(**changes)

    async def stats(self) -> dict[str, Any]:
        server = self._server()
        return {
            **server.stats,
            "asleep": server.asleep,
            "requests_while_asleep": server.requests_while_asleep,
            "models": dict(server.models),
            "in_flight": server.in_flight,
            "spans": [list(span) for span in server.spans],
            "in_flight_at_sleep": list(server.in_flight_at_sleep),
        }

    async def reset(self) -> None:
        server = self._server()
        server.reset()
        server.models.clear()
        server.requests_while_asleep = 0
        server.spans = [span for span in server.spans if span[1] is None]  # still inside: still counted
        server.in_flight_at_sleep.clear()

    def _server(self) -> SleepyDevServer:
        if self.server is None:
            raise RuntimeError("replica not started")
        return self.server
