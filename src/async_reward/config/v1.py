"""What a verl v1 user adds (the names of our classes in verl's config), and whether it is there.

Kept free of verl's v1 modules (which import TransferQueue) so the CLI, the reward workers and the
driver-side checks can import it cheaply. The overrides a user adds are
``async_reward.wiring.integration.V1_OVERRIDES`` (also ``async_reward.v1.V1_OVERRIDES``); what v1 cannot
honour is refused by ``async_reward.v1.checks.check_v1``.

verl's v1 trainer scores each session inside the agent loop and hands out finished groups through
its replay buffer. Two verl seams carry our integration, both named in verl's own config:

* ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (read by ``TaskRunnerV1``): our
  :class:`~async_reward.v1.agent_loop.RewardAgentLoopManager` runs group post-processing and
  ``on_failure: exclude`` before a group becomes sampleable;
* ``trainer.v1.sampler.custom_sampler`` (read by ``PPOTrainer._build_replay_buffer``): our
  :class:`~async_reward.v1.replay_buffer.RewardReplayBuffer` is verl's own replay buffer plus the
  ``reward/*`` metrics of every training step (the sampler's metrics are the only per-step metrics
  a configuration can add to v1's log).

Under verl's own v1 modes (``sync``, ``colocate_async``, ``separate_async``) with one of our managers,
:func:`async_reward.wiring.implied_seams.imply_v1_seams` names both where the user named none (the
plugin and the setup hook call it where verl builds its trainer); a user's own class there is kept,
and refused by the start-up checks where it cannot honour what is configured (``on_failure: exclude``).
Our own modes (``pipelined``, ``decoupled``) name their own classes.
"""

from __future__ import annotations

import sys
from typing import Any

from omegaconf import DictConfig

from async_reward._core.config_rules import bad_value, select_key
from async_reward._core.errors import ConfigError

__all__ = [
    "AGENT_LOOP_MANAGER",
    "DECOUPLED_MODE",
    "DECOUPLED_MODE_PATH",
    "DEFAULT_MAX_UNTRAINED_SKIPS",
    "MAX_UNTRAINED_SKIPS_KEY",
    "PIPELINED_MODE",
    "PIPELINED_MODE_PATH",
    "PIPELINED_TRAINER_KEY",
    "REPLAY_BUFFER_NAME",
    "REPLAY_BUFFER_PATH",
    "check_our_sampler_kwargs",
    "is_decoupled_mode",
    "is_pipelined_mode",
    "max_untrained_skips",
    "uses_reward_replay_buffer",
    "v1_integration_problem",
]

#: The config node our legacy pipelined trainer reads (``python -m async_reward.legacy.main_ppo``). Its
#: presence declares that trainer (which honours ``on_failure: exclude``) as the one training: our entry
#: point and ``PipelinedRayPPOTrainer`` add it, and the entry point refuses to let any other trainer run a
#: config that has it.
PIPELINED_TRAINER_KEY = "async_reward.pipeline"
#: ``trainer.v1.trainer_mode`` of our pipelined mode, and where its settings live in the verl config.
PIPELINED_MODE = "pipelined"
PIPELINED_MODE_PATH = "trainer.v1.pipelined"
#: ``trainer.v1.trainer_mode`` of our decoupled mode, and where its settings live in the verl config.
DECOUPLED_MODE = "decoupled"
DECOUPLED_MODE_PATH = "trainer.v1.decoupled"
#: ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` for our v1 agent loop.
AGENT_LOOP_MANAGER = "async_reward.v1.RewardAgentLoopManager"
#: The module that defines it.
_AGENT_LOOP_MODULE = "async_reward.v1.agent_loop"
#: ``trainer.v1.sampler.custom_sampler.path`` / ``.name`` for verl's replay buffer with our metrics.
REPLAY_BUFFER_PATH = "pkg://async_reward.v1.replay_buffer"
REPLAY_BUFFER_NAME = "RewardReplayBuffer"

#: ``trainer.v1.sampler.sampler_kwargs`` key: mini-batches with nothing to train on skipped in a row
#: before the run stops (see :meth:`RewardReplayBuffer._skip_untrained`); the pipelined mode bounds
#: steps with nothing trained with it (``UntrainedSteps``), the decoupled mode batches' worth of failed
#: groups evicted with nothing sampled (``DecoupledReplayBufferAsync._count_failed``).
MAX_UNTRAINED_SKIPS_KEY = "max_untrained_skips"
#: Its default: a short outage of the reward service is ridden out, a lasting one stops the run.
DEFAULT_MAX_UNTRAINED_SKIPS = 8


def max_untrained_skips(sampler_kwargs: Any) -> int:
    """``trainer.v1.sampler.sampler_kwargs.max_untrained_skips``, checked (an integer >= 0)."""
    value = sampler_kwargs.get(MAX_UNTRAINED_SKIPS_KEY, None) if hasattr(sampler_kwargs, "get") else None
    if value is None:
        return DEFAULT_MAX_UNTRAINED_SKIPS
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_value(
            f"trainer.v1.sampler.sampler_kwargs.{MAX_UNTRAINED_SKIPS_KEY}",
            value,
            "must be an integer >= 0 (mini-batches with nothing to train on skipped in a row before "
            "the run stops)",
            f"write +trainer.v1.sampler.sampler_kwargs.{MAX_UNTRAINED_SKIPS_KEY}="
            f"{DEFAULT_MAX_UNTRAINED_SKIPS} (0 stops at the first)",
        )
    return value


def check_our_sampler_kwargs(sampler_kwargs: Any) -> None:
    """Refuse a key of ``trainer.v1.sampler.sampler_kwargs`` other than ``max_untrained_skips`` where
    our replay buffer or one of our modes is the sampler: verl hands those keys to the custom sampler
    only, and ours reads that one, so a misspelt ``max_untrained_skip=0`` would leave the default 8."""
    keys = sorted(str(key) for key in sampler_kwargs) if hasattr(sampler_kwargs, "keys") else []
    unknown = [key for key in keys if key != MAX_UNTRAINED_SKIPS_KEY]
    if unknown:
        raise ConfigError(
            f"trainer.v1.sampler.sampler_kwargs.{unknown[0]} is not read: the sampler is async-reward's "
            f"replay buffer (or one of its trainer modes), whose only key there is {MAX_UNTRAINED_SKIPS_KEY}",
            key=f"trainer.v1.sampler.sampler_kwargs.{unknown[0]}",
            fix=f"remove it, or write trainer.v1.sampler.sampler_kwargs.{MAX_UNTRAINED_SKIPS_KEY}",
        )


def v1_integration_problem(verl_config: DictConfig) -> str | None:
    """Why verl's v1 trainer would not run our agent loop with this config; None when it does.

    When it does, group post-processing runs once per ``uid`` group and ``on_failure: exclude`` is
    honoured (zero loss mask, advantages from the group's scored members). The driver-side failure
    policy check (``async_reward.config.checks.check_on_failure``) calls this for the v1 trainer.
    """
    trainer = verl_config.get("trainer") or {}
    if not trainer.get("use_v1", False):
        return "trainer.use_v1 is false: this is verl's legacy trainer, not v1"
    # A judge on the training GPUs (reward.reward_model.enable without enable_resource_pool): verl v1
    # scores each sampled mini-batch after generation, where the setup hook's step
    # (async_reward.v1.colocated_judge) post-processes groups and honours exclude.
    agent = ((verl_config.get("actor_rollout_ref") or {}).get("rollout") or {}).get("agent") or {}
    manager = agent.get("agent_loop_manager_class")
    if not manager:
        return (
            "verl's v1 agent loop runs without async-reward's: add "
            f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={AGENT_LOOP_MANAGER}"
        )
    if manager != AGENT_LOOP_MANAGER and not _is_our_manager(str(manager)):
        return (
            f"actor_rollout_ref.rollout.agent.agent_loop_manager_class={manager} is not "
            f"{AGENT_LOOP_MANAGER} or a subclass of it"
        )
    return None


def uses_reward_replay_buffer(verl_config: DictConfig) -> bool:
    """Whether ``trainer.v1.sampler.custom_sampler`` names our replay buffer (per-step metrics)."""
    sampler = select_key(verl_config, "trainer.v1.sampler.custom_sampler")
    if not hasattr(sampler, "get"):  # unset, or not a mapping (verl refuses that itself)
        return False
    return sampler.get("path") == REPLAY_BUFFER_PATH and sampler.get("name") == REPLAY_BUFFER_NAME


def _is_our_manager(fqn: str) -> bool:
    """Whether ``fqn`` names a subclass of our manager (imports it, as verl's TaskRunnerV1 would).

    A subclass of ``RewardAgentLoopManager`` imports ``async_reward.v1.agent_loop`` itself, so the
    class is taken from the loaded modules rather than imported here: that module runs
    ``async_reward.v1.checks.check_v1``, which reads this one (no import circle)."""
    from verl.utils.import_utils import load_class_from_fqn

    try:
        cls = load_class_from_fqn(fqn, "AgentLoopManager")
    except (ImportError, AttributeError, ValueError):
        return False
    agent_loop = sys.modules.get(_AGENT_LOOP_MODULE)
    ours = getattr(agent_loop, "RewardAgentLoopManager", None)
    return isinstance(cls, type) and isinstance(ours, type) and issubclass(cls, ours)


def is_pipelined_mode(verl_config: Any) -> bool:
    """Whether ``verl_config`` trains with verl v1's ``pipelined`` trainer mode (ours)."""
    return bool(select_key(verl_config, "trainer.use_v1")) and (
        select_key(verl_config, "trainer.v1.trainer_mode") == PIPELINED_MODE
    )


def is_decoupled_mode(verl_config: Any) -> bool:
    """Whether ``verl_config`` trains with verl v1's ``decoupled`` trainer mode (ours)."""
    return bool(select_key(verl_config, "trainer.use_v1")) and (
        select_key(verl_config, "trainer.v1.trainer_mode") == DECOUPLED_MODE
    )
