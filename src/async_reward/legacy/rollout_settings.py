"""Refusing, before any worker starts, the verl settings the pipelined trainer cannot train with.

The pipelined trainer is verl's legacy ``RayPPOTrainer`` (``trainer.use_v1=false``), whose rollout must
come back unscored (:class:`~async_reward.legacy.agent_loop.ScoreLaterAgentLoopManager`). A user who
copies the README's verl-v1 lines into a pipelined run would otherwise only learn it from an error in
``init_workers``, after the actor, rollout workers and LLM servers started (and ``dry_run``, which
stops before ``init_workers``, would report success). So the entry point and
``PipelinedRayPPOTrainer.__init__`` check the configured classes here, by loading them.
"""

from __future__ import annotations

import sys
from typing import Any

from omegaconf import OmegaConf

from async_reward._core.config_rules import names_config_errors
from async_reward.config import ConfigError
from async_reward.config.v1 import REPLAY_BUFFER_NAME, REPLAY_BUFFER_PATH, uses_reward_replay_buffer
from async_reward.legacy.agent_loop import SCORE_LATER, ScoreLaterAgentLoopManager

__all__ = ["check_pipelined_rollout_settings"]

_AGENT_LOOP_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
_V1_AGENT_LOOP_MODULE = "verl.trainer.ppo.v1.agent_loop_tq"


@names_config_errors("actor_rollout_ref")
def check_pipelined_rollout_settings(config: Any) -> None:
    """Refuse an agent-loop manager or sampler the pipelined trainer cannot run.

    * ``actor_rollout_ref.rollout.agent.agent_loop_manager_class``: unset (the trainer fills in
      :data:`~async_reward.legacy.agent_loop.SCORE_LATER`) or a subclass of it. verl v1's
      ``AgentLoopManagerTQ`` (our ``RewardAgentLoopManager`` among its subclasses) runs under the v1
      trainer only; any other manager scores inside the rollout, where the pipeline cannot.
    * ``trainer.v1.sampler.custom_sampler`` naming our ``RewardReplayBuffer``: a v1 sampler that the
      legacy trainer never builds (the pipelined trainer logs ``reward/*`` itself).

    Raises:
        ConfigError: naming the key, why, and the fix.
    """
    fqn = OmegaConf.select(config, _AGENT_LOOP_KEY, default=None)
    if fqn:
        manager = _load_manager_class(str(fqn))
        if _is_v1_agent_loop_manager(manager):
            raise ConfigError(
                f"{_AGENT_LOOP_KEY}={fqn} is verl v1's TransferQueue agent-loop manager (the README's "
                "verl-v1 line), but the pipelined trainer is verl's legacy trainer (it trains with "
                "trainer.use_v1=false) and cannot run it. Drop that line (the pipeline does group "
                "post-processing and on_failure: exclude itself), or train under verl v1 with python -m "
                "verl.trainer.main_ppo and without the async_reward.pipeline keys"
            )
        if not issubclass(manager, ScoreLaterAgentLoopManager):
            raise ConfigError(
                f"{_AGENT_LOOP_KEY}={fqn} scores inside the rollout; subclass {SCORE_LATER} so the "
                "pipeline can score instead (or drop the line)"
            )
    if uses_reward_replay_buffer(config):
        raise ConfigError(
            f"trainer.v1.sampler.custom_sampler={REPLAY_BUFFER_PATH}:{REPLAY_BUFFER_NAME} is async-reward's "
            "verl-v1 replay buffer, which the pipelined trainer (verl's legacy trainer) never builds. "
            "Drop the two custom_sampler lines: the pipelined trainer logs the reward/* metrics itself"
        )


def _load_manager_class(fqn: str) -> type:
    """The class ``init_workers`` would load (verl's own loader), or a ``ConfigError`` now."""
    from verl.utils.import_utils import load_class_from_fqn

    try:
        manager = load_class_from_fqn(fqn, "AgentLoopManager")
    except Exception as exc:  # verl raises ImportError / AttributeError / ValueError for a bad path
        raise ConfigError(f"{_AGENT_LOOP_KEY}={fqn} cannot be loaded ({type(exc).__name__}: {exc})") from exc
    if not isinstance(manager, type):
        raise ConfigError(f"{_AGENT_LOOP_KEY}={fqn} is not a class")
    return manager


def _is_v1_agent_loop_manager(manager: type) -> bool:
    """Whether ``manager`` subclasses verl v1's ``AgentLoopManagerTQ``. Its module (which imports
    TransferQueue) is loaded only if ``manager``'s own import loaded it: otherwise it cannot be one."""
    module = sys.modules.get(_V1_AGENT_LOOP_MODULE)
    base = getattr(module, "AgentLoopManagerTQ", None)
    return isinstance(base, type) and issubclass(manager, base)
