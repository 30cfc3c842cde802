"""A judge served in the job, on CPU: verl's real ``RewardModelManager`` and router, with a stand-in
replica class that serves our local judge (``async_reward.tools.devserver``) instead of vLLM.

:class:`LocalJudgeReplica` is registered where verl looks up ``reward.reward_model.rollout.name``
(``RolloutReplicaRegistry``, as :data:`REPLICA_NAME`). Each replica is one Ray actor
(:class:`~tests.support.judge_replica_server.JudgeReplicaServer`, in a module without verl, so that the
replica process does not import it) running the dev server on the node's address and a free port, and
mirroring what verl's vLLM server does with it:

* it answers to one model name (``model_config.local_path``, as vLLM serves it) and refuses any other
  with vLLM's 404;
* ``wake_up`` / ``sleep`` act only in verl's ``COLOCATED`` mode, and ``sleep`` only with
  ``rollout.free_cache_engine``, after the requests inside have drained (``STANDALONE``: skipped);
* asleep, it answers 503 to every chat completion and counts them (``requests_while_asleep``): a
  request that reaches a sleeping judge is visible, never a silent success;
* it records when each chat completion entered and left it (as vLLM's engine holds a request from
  its arrival to its last token, whether or not anyone still waits for it), so a test can count what
  the replicas held at once (:func:`peak_in_flight`), and how many were inside at each ``sleep``.

A replica a test killed can be started again on its address (:func:`restart_killed_replica`), as an
orchestrator restarts a crashed vLLM server: verl's router knows replicas by address only.

What it does not do: generate tokens (the dev server judges by rule), use GPUs, or run several
processes per replica.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

import ray
from verl.workers.rollout.replica import RolloutMode, RolloutReplica, RolloutReplicaRegistry

from async_reward.tools.devserver import DevServerConfig
from tests.support.judge_replica_server import JudgeReplicaServer

#: ``reward.reward_model.rollout.name`` of the stand-in.
REPLICA_NAME = "async_reward_local"


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

    async def launch_servers(self, port: int = 0, wait_s: float = 0.0) -> None:
        """Start this replica's server actor on ``port`` (0: a free one; see ``JudgeReplicaServer.start``)."""
        server = JudgeReplicaServer.remote(
            str(self.model_config.local_path),
            self.rollout_mode == RolloutMode.COLOCATED,
            bool(self.config.free_cache_engine),
            dict(type(self).server_config),
        )
        self._server_address = await server.start.remote(port, wait_s)
        self._server_handle = server
        self.servers = [server]


def register_local_judge_replica() -> None:
    """Register :class:`LocalJudgeReplica` as :data:`REPLICA_NAME` in this process (verl's registry is
    per process: the one that builds ``RewardModelManager``)."""
    RolloutReplicaRegistry.register(REPLICA_NAME, lambda: LocalJudgeReplica)


def replica_stats(models: Any) -> list[dict[str, Any]]:
    """Each replica's counters (dev server stats, sleep state, model names asked)."""
    return ray.get([replica._server_handle.stats.remote() for replica in models.rollout_replicas])


def peak_in_flight(stats: list[dict[str, Any]]) -> int:
    """The most chat completions the replicas held at once, all together (``stats``:
    :func:`replica_stats`). The replicas are processes of one node, so their monotonic clocks agree."""
    events: list[tuple[float, int]] = []
    for replica in stats:
        for start, end in replica["spans"]:
            events.append((start, 1))
            events.append((end if end is not None else float("inf"), -1))
    peak = inside = 0
    for _, step in sorted(events):  # at one instant a departure (-1) sorts before an arrival
        inside += step
        peak = max(peak, inside)
    return peak


def reset_replicas(models: Any, **config: Any) -> None:
    """Zero every replica's counters and put its dev server's runtime settings back to their start
    values, then apply ``config`` (a knob one test turns must not leak into the next)."""
    from async_reward.tools.devserver.config import RUNTIME_CONFIG_KEYS

    start = DevServerConfig(**LocalJudgeReplica.server_config)
    changes = {**{key: getattr(start, key) for key in RUNTIME_CONFIG_KEYS}, **config}
    handles = [replica._server_handle for replica in models.rollout_replicas]
    ray.get([handle.reset.remote() for handle in handles])
    ray.get([handle.update_config.remote(changes) for handle in handles])


def restart_killed_replica(models: Any, index: int, timeout_s: float = 30.0) -> None:
    """Start replica ``index`` again on the address it had, once its killed actor is gone: verl's
    router, which knows it by that address only, reaches it again. Raises if it was not killed, or its
    port cannot be taken back, within ``timeout_s``."""
    replica = models.rollout_replicas[index]
    address = replica._server_address
    deadline = time.monotonic() + timeout_s
    while True:  # ``ray.kill`` only sends the request: wait until the actor is dead
        try:
            ray.get(replica._server_handle.__ray_ready__.remote(), timeout=1.0)
        except ray.exceptions.RayActorError:
            break
        except ray.exceptions.GetTimeoutError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"replica {index} at {address} was not killed: nothing to restart")
        time.sleep(0.05)
    port = int(address.rsplit(":", 1)[1])
    asyncio.run(replica.launch_servers(port, wait_s=max(deadline - time.monotonic(), 1.0)))
    if replica._server_address != address:
        raise RuntimeError(f"replica {index} restarted at {replica._server_address}, not {address}")
    models.server_handles[index] = replica._server_handle
