"""Our two verl v1 seams implied where a job leaves them unset: under verl's own v1 modes (``sync``,
``colocate_async``, ``separate_async``) with one of our reward managers, our agent-loop manager and
replay buffer (:mod:`async_reward.config.v1`) are named unless the user named a class there. Kept
apart from ``settings`` because it loads our managers to tell ours from verl's, and ``settings`` is read
by modules the managers import (an import circle otherwise).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, open_dict

from async_reward._core.config_rules import select_key
from async_reward.config.v1 import AGENT_LOOP_MANAGER, REPLAY_BUFFER_NAME, REPLAY_BUFFER_PATH

__all__ = ["imply_v1_seams"]


def imply_v1_seams(verl_config: DictConfig) -> list[str]:
    """Name our agent-loop manager and replay buffer in ``verl_config`` where it leaves them unset, for
    verl's own v1 modes with one of our reward managers; returns the keys set (and says so once in the
    job's log). Nothing is set under the legacy trainer, our own modes (which name their own classes),
    verl's own managers, or where the user named a class.
    """
    from async_reward.wiring.trainer_modes import OUR_TRAINER_MODULES

    if not select_key(verl_config, "trainer.use_v1"):
        return []
    if (select_key(verl_config, "trainer.v1.trainer_mode") or "sync") in OUR_TRAINER_MODULES:
        return []
    if not _our_reward_manager(verl_config):
        return []
    implied = []
    agent = select_key(verl_config, "actor_rollout_ref.rollout.agent")
    if isinstance(agent, DictConfig) and not agent.get("agent_loop_manager_class"):
        with open_dict(agent):
            agent.agent_loop_manager_class = AGENT_LOOP_MANAGER
        implied.append(f"actor_rollout_ref.rollout.agent.agent_loop_manager_class={AGENT_LOOP_MANAGER}")
    sampler = select_key(verl_config, "trainer.v1.sampler")
    custom: Any = sampler.get("custom_sampler") if isinstance(sampler, DictConfig) else None
    if isinstance(sampler, DictConfig) and not (hasattr(custom, "get") and custom.get("path")):
        with open_dict(sampler):
            sampler.custom_sampler = {"path": REPLAY_BUFFER_PATH, "name": REPLAY_BUFFER_NAME}
        implied.append(f"trainer.v1.sampler.custom_sampler={REPLAY_BUFFER_PATH}:{REPLAY_BUFFER_NAME}")
    if implied:
        from async_reward._core.start_lines import say_once

        say_once(
            "verl v1 with an async-reward manager: using " + " and ".join(implied) + " (group "
            "post-processing, on_failure: exclude, reward/* metrics); set either key to choose your own"
        )
    return implied


def _our_reward_manager(verl_config: DictConfig) -> bool:
    """Whether verl resolves ``reward.reward_manager`` to one of our managers (or a subclass). An
    unresolvable one is not: the start-up checks refuse it by name."""
    from verl.trainer.ppo.reward import resolve_reward_manager_cls

    from async_reward.managers import AsyncRewardManager

    try:
        manager_cls = resolve_reward_manager_cls(verl_config)
    except Exception:  # refused by async_reward.config.checks.check_reward, with verl's message
        return False
    return isinstance(manager_cls, type) and issubclass(manager_cls, AsyncRewardManager)
