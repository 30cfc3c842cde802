"""async-reward under verl's v1 trainer (``trainer.use_v1=true``, verl's default).

Installed, the package is a verl plugin (:mod:`async_reward.wiring.verl_plugin`): with one of our managers
under verl's own v1 modes, it names these two classes in verl's config where you name none; our modes
(``trainer.v1.trainer_mode=pipelined`` / ``decoupled``) name their own. Without the plugin, add
:data:`V1_OVERRIDES` to verl's command line (or call :func:`prepare_v1_config` in a launcher):

* :class:`RewardAgentLoopManager` (``actor_rollout_ref.rollout.agent.agent_loop_manager_class``) runs
  group post-processing once per ``uid`` group and honours ``on_failure: exclude``;
* :class:`RewardReplayBuffer` (``trainer.v1.sampler.custom_sampler``) is verl's replay buffer that
  also logs the ``reward/*`` metrics of every training step.

:class:`RewardWorkersLost` is what stops a run whose reward workers are all dead.

The classes import verl's v1 modules (and TransferQueue), so they load on first use; so do
:data:`V1_OVERRIDES` and :func:`prepare_v1_config`, whose home is ``async_reward.wiring.integration``.
"""

from __future__ import annotations

from typing import Any

from async_reward.config.v1 import (
    AGENT_LOOP_MANAGER,
    REPLAY_BUFFER_NAME,
    REPLAY_BUFFER_PATH,
    uses_reward_replay_buffer,
    v1_integration_problem,
)

__all__ = [
    "AGENT_LOOP_MANAGER",
    "REPLAY_BUFFER_NAME",
    "REPLAY_BUFFER_PATH",
    "V1_OVERRIDES",
    "RewardAgentLoopManager",
    "RewardAgentLoopWorker",
    "RewardReplayBuffer",
    "RewardWorkersLost",
    "prepare_v1_config",
    "uses_reward_replay_buffer",
    "v1_integration_problem",
]

_LAZY = {
    "RewardAgentLoopManager": "async_reward.v1.agent_loop",
    "RewardAgentLoopWorker": "async_reward.v1.agent_loop",
    "RewardReplayBuffer": "async_reward.v1.replay_buffer",
    "RewardWorkersLost": "async_reward.v1.reward_failover",
    # Wiring (the Ray setup hook in the overrides), whose home imports this package's settings.
    "V1_OVERRIDES": "async_reward.wiring.integration",
    "prepare_v1_config": "async_reward.wiring.integration",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'async_reward.v1' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
