"""Every sample for our managers goes to our manager, and the served judge is awake to take it.

verl 0.9's ``RewardLoopWorker.compute_score`` sends a sample to the reward manager only when a
``custom_reward_function.path`` is set; with ``reward.reward_model.enable`` and no path it posts the
sample to the reward model's ``/classify`` endpoint (a discriminative model's score) and never calls
the manager named in ``reward.reward_manager.name``. :class:`JudgeRewardLoopWorker` calls our
manager's ``run_single`` instead, always; :func:`install_reward_loop_hooks` makes verl's
``RewardLoopManager`` start it in place of verl's worker when a reward model is enabled and the manager
is one of ours (the setup hook installs it where verl builds that manager: its task runner).

The same hook wakes a judge on GPUs of its own. verl's trainers always hand ``RewardModelManager`` a
resource pool (a ``reward_pool`` of its own with ``enable_resource_pool=true``), so the replicas start
in verl's ``COLOCATED`` mode, and with ``rollout.free_cache_engine`` (verl's default)
``RewardModelManager.__init__`` puts them to sleep; only ``compute_rm_score`` (the colocated judge's
score-the-batch step) ever wakes them. A standalone judge is never put to sleep again, so it is woken
once here, before any reward worker exists. (Read from verl's code; to be confirmed on a GPU.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from typing import Any

import ray
from verl import DataProto
from verl.experimental.reward_loop import reward_loop as verl_reward_loop

from async_reward._core.start_lines import say_once
from async_reward.judge.in_job.settings import (
    colocated_judge,
    in_job_judge,
    judge_capacity,
    routed_workers,
)
from async_reward.managers.base import AsyncRewardManager

__all__ = ["JudgeRewardLoopWorker", "install_reward_loop_hooks", "wake_standalone_judge"]

_RewardLoopWorker: Any = verl_reward_loop.RewardLoopWorker


class JudgeRewardLoopWorker(_RewardLoopWorker):
    """verl's ``RewardLoopWorker`` that hands every sample to an async-reward manager's ``run_single``.

    verl's own ``compute_score`` would send a sample to ``/classify`` when a reward model is enabled
    and no custom function is set; our managers score with the served model themselves (``llm_judge``
    through ``reward_router_address``) or call a function that does. Any other manager keeps verl's
    behaviour. Built exactly as verl builds its worker (same arguments, same names and handles).
    """

    def __init__(self, config: Any, reward_router_address: str | None = None) -> None:
        with routed_workers():  # the manager built inside knows it is called through run_single
            super().__init__(config, reward_router_address)

    async def compute_score(self, data: DataProto) -> dict[str, Any]:
        if isinstance(self.reward_manager, AsyncRewardManager):
            return await self.reward_manager.run_single(data)
        return dict(await super().compute_score(data))


def _uses_our_manager(manager: Any) -> bool:
    cls = getattr(manager, "reward_manager_cls", None)
    return isinstance(cls, type) and issubclass(cls, AsyncRewardManager)


def install_reward_loop_hooks() -> None:
    """Wrap verl's ``RewardLoopManager._init_reward_loop_workers`` in this process (once): with a
    reward model enabled, start :class:`JudgeRewardLoopWorker` for our managers, log the served judge's
    capacity, and wake a standalone judge (:func:`wake_standalone_judge`). Called by the setup hook;
    a launcher of its own (or a test driver) calls it where it builds ``RewardLoopManager``."""
    manager_cls = verl_reward_loop.RewardLoopManager
    original = manager_cls._init_reward_loop_workers
    if getattr(original, "_async_reward_routed", False):
        return

    @functools.wraps(original)
    def init_reward_loop_workers(self: Any) -> None:
        if in_job_judge(self.config):
            if _uses_our_manager(self):
                self.reward_loop_workers_class = ray.remote(JudgeRewardLoopWorker)
                _log_capacity(self)
            wake_standalone_judge(self)
        original(self)

    init_reward_loop_workers._async_reward_routed = True  # type: ignore[attr-defined]
    manager_cls._init_reward_loop_workers = init_reward_loop_workers  # type: ignore[method-assign]


def wake_standalone_judge(reward_loop_manager: Any) -> bool:
    """Wake the replicas of a judge on GPUs of its own that verl put to sleep at start-up; True when
    it did. A colocated judge is left asleep (verl wakes it around each scoring step)."""
    models = getattr(reward_loop_manager, "reward_model_manager", None)
    config = reward_loop_manager.config
    if models is None or colocated_judge(config):
        return False
    if not config.reward.reward_model.rollout.get("free_cache_engine", False):
        return False  # RewardModelManager did not put it to sleep
    _outside_event_loop(models.wake_up)
    say_once(
        "woke the standalone reward model (reward.reward_model.enable_resource_pool=true): "
        "verl starts its replicas asleep (rollout.free_cache_engine) and only its colocated scoring step "
        "wakes them, so without this every request would reach a sleeping server"
    )
    return True


def _outside_event_loop(call: Any) -> None:
    """Run ``call`` (verl's ``wake_up``, which uses ``asyncio.run``) where no event loop runs."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        call()
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(call).result()


def _log_capacity(reward_loop_manager: Any) -> None:
    config = reward_loop_manager.config
    capacity = judge_capacity(config)
    models = getattr(reward_loop_manager, "reward_model_manager", None)
    started = len(getattr(models, "rollout_replicas", []) or [])
    mismatch = (
        f" (verl started {started} replica(s): the per-worker default follows the settings, so set "
        "reward.async_reward.limits.max_concurrency yourself)"
        if started and started != capacity.replicas
        else ""
    )
    if config.reward.reward_model.rollout.get("full_determinism", False):
        mismatch += (
            "; rollout.full_determinism=true: verl serves the reward model one request at a time "
            "(max_num_seqs=1, meant for its /classify path)"
        )
    say_once(f"in-job judge capacity: {capacity.describe()}{mismatch}")
