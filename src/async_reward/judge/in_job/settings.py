"""The judge verl serves inside the job (``reward.reward_model.*``), read from the verl config.

verl's Reward Loop starts the model named by ``reward.reward_model.model_path`` on replicas of its own
rollout servers (vLLM, SGLang) and puts its router in front of them; every reward manager is handed
the router's address (``reward_router_address``). This module answers, from the config alone, what
our managers need to know about that judge: whether there is one and where it runs
(:func:`in_job_judge`, :func:`colocated_judge`), the model name its replicas answer to
(:func:`served_model_name`), how many requests it takes at once (:func:`judge_capacity`), whether a
user wrote a key at all (:func:`was_set`: defaults follow the judge only where nothing was written),
and whether the model is a discriminative one that cannot write a verdict
(:func:`discriminative_architecture`).

Kept free of Ray, verl's trainers and our managers (only ``verl.utils.fs``, lazily), so the checks, the
managers and the routing hooks can all import it. The module-level routing flag lives here too
(:func:`routed_workers`): the reward worker that hands samples to our managers sets it while it builds
its manager, and ``llm_judge`` refuses to start without it (verl's own worker would send its samples
to the reward model's ``/classify`` endpoint instead).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from async_reward._core.config_rules import select_key

__all__ = [
    "ROUTER_MAX_PER_REPLICA",
    "ROUTER_MAX_TOTAL",
    "JudgeCapacity",
    "colocated_judge",
    "discriminative_architecture",
    "in_job_judge",
    "is_routed",
    "judge_capacity",
    "reward_worker_processes",
    "routed_workers",
    "served_model_config",
    "served_model_name",
    "was_set",
]

#: verl 0.9's router (``naive_router.NaiveRouter``) opens at most ``max_connections // 4`` = 256
#: connections to one replica and 1024 in all (aiohttp ``limit_per_host`` / ``limit``): requests
#: beyond them queue inside the router, where our admission cannot see them.
ROUTER_MAX_PER_REPLICA = 256
ROUTER_MAX_TOTAL = 1024
#: Architectures of discriminative reward models (a score head, no text): verl serves them for its
#: ``/classify`` path; a judge that must write a verdict cannot be one.
_DISCRIMINATIVE_SUFFIXES = ("ForSequenceClassification", "ForTokenClassification", "RewardModel")


def in_job_judge(config: Any) -> bool:
    """``reward.reward_model.enable``: verl serves a reward model inside the job."""
    return bool(select_key(config, "reward.reward_model.enable"))


def colocated_judge(config: Any) -> bool:
    """A judge on the training GPUs (``enable`` without ``enable_resource_pool``): verl wakes it after
    sampling, scores the whole batch and puts it back to sleep, instead of scoring during generation."""
    return in_job_judge(config) and not bool(select_key(config, "reward.reward_model.enable_resource_pool"))


def was_set(config: Any, key: str) -> bool:
    """Whether the user wrote ``key`` (dotted, e.g. ``reward.async_reward.retry.max_attempts``) with a
    value: read on the raw config, before our defaults fill it in."""
    return select_key(config, key) is not None


def served_model_name(config: Any) -> str | None:
    """The model name the judge's replicas answer to, as verl starts them; None without a model path.

    vLLM and SGLang serve ``model_config.local_path`` (verl's ``copy_to_local(model_path)``: the path
    itself, or its local copy for an ``hdfs://`` path), unless ``rollout.prometheus.enable`` with a
    ``served_model_name`` names it (its last path part). A request naming another model is refused by
    the server (404).
    """
    prometheus = select_key(config, "reward.reward_model.rollout.prometheus")
    if prometheus is not None and select_key(prometheus, "enable"):
        name = select_key(prometheus, "served_model_name")
        if name:
            return str(name).split("/")[-1]
    path = select_key(config, "reward.reward_model.model_path")
    if not path:
        return None
    path = str(path)
    from verl.utils.fs import get_local_temp_path, is_non_local

    if is_non_local(path):  # where copy_to_local puts it, without copying
        import tempfile

        return str(get_local_temp_path(path, tempfile.gettempdir()))
    return path


@dataclass(frozen=True)
class JudgeCapacity:
    """How many judge requests the served replicas take at once, and each reward worker's share."""

    replicas: int
    """Replicas verl starts: GPUs // (tensor x data x pipeline parallel size)."""
    per_replica: int
    """``rollout.max_num_seqs`` x ``data_parallel_size`` (vLLM schedules per data-parallel engine),
    capped by the router's connections per replica (:data:`ROUTER_MAX_PER_REPLICA`)."""
    total: int
    """``replicas`` x ``per_replica``, capped by the router's connections in all."""
    workers: int
    """Reward worker processes (``reward.num_workers``)."""

    @property
    def per_worker(self) -> int:
        """One reward worker's share of :attr:`total`, rounded up (at least 1)."""
        return max(1, math.ceil(self.total / self.workers))

    def describe(self) -> str:
        """The derivation, for the start-up log line."""
        return (
            f"{self.replicas} replica(s) x {self.per_replica} requests at once (rollout.max_num_seqs x "
            f"data_parallel_size, at most {ROUTER_MAX_PER_REPLICA} through verl's router) = {self.total}; "
            f"limits.max_concurrency defaults to {self.per_worker} per reward worker "
            f"({self.workers} worker(s))"
        )


def judge_capacity(config: Any) -> JudgeCapacity:
    """The served judge's capacity from verl's settings, as ``RewardModelManager`` lays it out.

    A standalone judge (``enable_resource_pool``) gets ``reward.reward_model.n_gpus_per_node`` x
    ``nnodes`` GPUs; a colocated one the trainer's (verl copies ``trainer.n_gpus_per_node`` / ``nnodes``
    over the reward model's when it builds its pools, so the driver reads them from the trainer).
    """
    rollout = "reward.reward_model.rollout"
    if select_key(config, "reward.reward_model.enable_resource_pool"):
        gpus = _int(config, "reward.reward_model.n_gpus_per_node") * _int(
            config, "reward.reward_model.nnodes"
        )
    else:
        gpus = _int(config, "trainer.n_gpus_per_node") * _int(config, "trainer.nnodes")
    data_parallel = max(1, _int(config, f"{rollout}.data_parallel_size", 1))
    world = (
        max(1, _int(config, f"{rollout}.tensor_model_parallel_size", 1))
        * data_parallel
        * max(1, _int(config, f"{rollout}.pipeline_model_parallel_size", 1))
    )
    replicas = max(1, gpus // world)
    per_replica = min(
        max(1, _int(config, f"{rollout}.max_num_seqs", 1)) * data_parallel, ROUTER_MAX_PER_REPLICA
    )
    return JudgeCapacity(
        replicas=replicas,
        per_replica=per_replica,
        total=min(replicas * per_replica, ROUTER_MAX_TOTAL),
        workers=reward_worker_processes(config),
    )


def reward_worker_processes(config: Any) -> int:
    """The reward worker processes verl starts (``reward.num_workers``; 1 when unset or not an
    integer, which the start-up checks refuse by name)."""
    return max(1, _int(config, "reward.num_workers", 1))


def _int(config: Any, key: str, default: int = 0) -> int:
    value = select_key(config, key)
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return value


def served_model_config(config: Any) -> dict[str, Any] | None:
    """The ``config.json`` of ``reward.reward_model.model_path`` as a mapping; None when the path is
    not a local directory with a readable JSON object there (a hub id or an ``hdfs://`` path is not
    fetched for a check)."""
    path = select_key(config, "reward.reward_model.model_path")
    config_file = os.path.join(str(path), "config.json") if path else ""
    if not config_file or not os.path.isfile(config_file):
        return None
    try:
        with open(config_file, encoding="utf-8") as handle:
            model = json.load(handle)
    except (OSError, ValueError):
        return None
    return model if isinstance(model, dict) else None


def discriminative_architecture(config: Any) -> str | None:
    """The architecture of ``reward.reward_model.model_path`` when it is a discriminative reward model
    (``...ForSequenceClassification``, ``...ForTokenClassification``, ``...RewardModel``); None when it
    is not, or when the path is not a local directory with a ``config.json`` (a hub id or an
    ``hdfs://`` path is not fetched for a check)."""
    architectures = (served_model_config(config) or {}).get("architectures") or []
    if not isinstance(architectures, list):
        return None
    for name in architectures:
        if isinstance(name, str) and name.endswith(_DISCRIMINATIVE_SUFFIXES):
            return name
    return None


# -- routing flag: set by the reward workers that call our managers' run_single themselves ----------

_routing = threading.local()


@contextlib.contextmanager
def routed_workers() -> Iterator[None]:
    """Mark the managers built inside this block as called through ``run_single`` by a worker of
    ours (``JudgeRewardLoopWorker``, the pipelined trainer's ``PipelineRewardWorker``), never through
    verl's ``/classify`` path."""
    depth = getattr(_routing, "depth", 0)
    _routing.depth = depth + 1
    try:
        yield
    finally:
        _routing.depth = depth


def is_routed() -> bool:
    """Whether a manager being built now is inside :func:`routed_workers`."""
    return getattr(_routing, "depth", 0) > 0
