"""A judge served in the job, on CPU: verl's real ``RewardModelManager`` and router, with a stand-in
replica class that serves our local judge (``async_reward.devserver``) instead of vLLM.

:class:`LocalJudgeReplica` is registered where verl looks up ``reward.reward_model.rollout.name``
(``RolloutReplicaRegistry``, as :data:`REPLICA_NAME`). Each replica is one Ray actor
(:class:`JudgeReplicaServer`) running the dev server on the node's address and a free port, and
mirroring what verl's vLLM server does with it:

* it answers to one model name (``model_config.local_path``, as vLLM serves it) and refuses any other
  with vLLM's 404;
* ``wake_up`` / ``sleep`` act only in verl's ``COLOCATED`` mode, and ``sleep`` only with
  ``rollout.free_cache_engine``, after the requests inside have drained (``STANDALONE``: skipped);
* asleep, it answers 503 to every chat completion and counts them (``requests_while_asleep``): a
  request that reaches a sleeping judge is visible, never a silent success.

What it does not do: generate tokens (the dev server judges by rule), use GPUs, or run several
processes per replica.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any, ClassVar

import ray
from aiohttp import web
from verl.workers.rollout.replica import RolloutMode, RolloutReplica, RolloutReplicaRegistry

from async_reward.devserver import DevServer, DevServerConfig

#: ``reward.reward_model.rollout.name`` of the stand-in.
REPLICA_NAME = "async_reward_local"


class SleepyDevServer(DevServer):
    """The dev server behind a replica's name and sleep state (see the module docstring)."""

    def __init__(self, config: DevServerConfig, host: str, served_name: str) -> None:
        super().__init__(config, host=host, port=0)
        self.served_name = served_name
        self.asleep = False
        self.requests_while_asleep = 0
        self.models: Counter[str] = Counter()
        self.in_flight = 0

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
            try:
                return await handler(request)
            finally:
                self.in_flight -= 1

        app.middlewares.append(replica)
        return app


@ray.remote(num_cpus=0)
class JudgeReplicaServer:
    """One replica: the dev server in this actor's event loop."""

    def __init__(self, served_name: str, rollout_mode: str, free_cache_engine: bool, config: dict) -> None:
        self.served_name = served_name
        self.rollout_mode = rollout_mode
        self.free_cache_engine = free_cache_engine
        self.config = DevServerConfig(**config)
        self.server: SleepyDevServer | None = None

    async def start(self) -> str:
        """Listen on the node's address; returns ``ip:port`` (no scheme, as verl's replicas do)."""
        host = ray.util.get_node_ip_address()
        self.server = SleepyDevServer(self.config, host, self.served_name)
        url = await self.server.start()
        return url.removeprefix("http://")

    async def wake_up(self) -> None:
        if self.rollout_mode == RolloutMode.COLOCATED.value:
            self._server().asleep = False

    async def sleep(self) -> None:
        if self.rollout_mode != RolloutMode.COLOCATED.value or not self.free_cache_engine:
            return
        server = self._server()
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
        }

    async def reset(self) -> None:
        server = self._server()
        server.reset()
        server.models.clear()
        server.requests_while_asleep = 0

    def _server(self) -> SleepyDevServer:
        if self.server is None:
            raise RuntimeError("replica not started")
        return self.server


class LocalJudgeReplica(RolloutReplica):
    """verl's ``RolloutReplica`` serving the dev server on CPU (no worker group, no GPU)."""

    #: The dev server's settings for every replica started from now on (a test may change them).
    server_config: ClassVar[dict[str, Any]] = {"seed": 0}

    async def init_colocated(self, resource_pool: Any) -> None:
        self.rollout_mode = RolloutMode.COLOCATED
        self.resource_pool = resource_pool
        await self.launch_servers()

    async def init_standalone(self) -> None:
        self.rollout_mode = RolloutMode.STANDALONE
        await self.launch_servers()

    async def launch_servers(self) -> None:
        server = JudgeReplicaServer.remote(
            str(self.model_config.local_path),
            self.rollout_mode.value,
            bool(self.config.free_cache_engine),
            dict(type(self).server_config),
        )
        self._server_address = await server.start.remote()
        self._server_handle = server
        self.servers = [server]


def register_local_judge_replica() -> None:
    """Register :class:`LocalJudgeReplica` as :data:`REPLICA_NAME` in this process (verl's registry is
    per process: the one that builds ``RewardModelManager``)."""
    RolloutReplicaRegistry.register(REPLICA_NAME, lambda: LocalJudgeReplica)


def replica_stats(models: Any) -> list[dict[str, Any]]:
    """Each replica's counters (dev server stats, sleep state, model names asked)."""
    return ray.get([replica._server_handle.stats.remote() for replica in models.rollout_replicas])


def reset_replicas(models: Any, **config: Any) -> None:
    """Zero every replica's counters and put its dev server's runtime settings back to their start
    values, then apply ``config`` (a knob one test turns must not leak into the next)."""
    from async_reward.devserver.config import RUNTIME_CONFIG_KEYS

    start = DevServerConfig(**LocalJudgeReplica.server_config)
    changes = {**{key: getattr(start, key) for key in RUNTIME_CONFIG_KEYS}, **config}
    handles = [replica._server_handle for replica in models.rollout_replicas]
    ray.get([handle.reset.remote() for handle in handles])
    ray.get([handle.update_config.remote(changes) for handle in handles])
