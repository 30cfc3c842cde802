"""What a verl v1 user adds, and the checks that say whether it is there.

Kept free of verl's v1 modules (which import TransferQueue) so the CLI, the reward workers and the
driver-side checks can import it cheaply.

verl's v1 trainer scores each session inside the agent loop and hands out finished groups through
its replay buffer. Two verl seams carry our integration, both named in verl's own config:

* ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (read by ``TaskRunnerV1``): our
  :class:`~async_reward.v1.agent_loop.RewardAgentLoopManager` runs group post-processing and
  ``on_failure: exclude`` before a group becomes sampleable;
* ``trainer.v1.sampler.custom_sampler`` (read by ``PPOTrainer._build_replay_buffer``): our
  :class:`~async_reward.v1.replay_buffer.RewardReplayBuffer` is verl's own replay buffer plus the
  ``reward/*`` metrics of every training step (the sampler's metrics are the only per-step metrics
  a configuration can add to v1's log).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, open_dict

from async_reward.config import ConfigError
from async_reward.integration import SETUP_HOOK, prepare_verl_config

__all__ = [
    "AGENT_LOOP_MANAGER",
    "REPLAY_BUFFER_NAME",
    "REPLAY_BUFFER_PATH",
    "V1_OVERRIDES",
    "prepare_v1_config",
    "uses_reward_replay_buffer",
    "v1_integration_problem",
]

#: ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` for our v1 agent loop.
AGENT_LOOP_MANAGER = "async_reward.v1.RewardAgentLoopManager"
#: ``trainer.v1.sampler.custom_sampler.path`` / ``.name`` for verl's replay buffer with our metrics.
REPLAY_BUFFER_PATH = "pkg://async_reward.v1.replay_buffer"
REPLAY_BUFFER_NAME = "RewardReplayBuffer"

#: The command-line overrides a user adds to ``python -m verl.trainer.main_ppo`` (v1 trainer), besides
#: choosing a manager. The README quotes them; the tests compose verl's config with exactly these.
V1_OVERRIDES: tuple[str, ...] = (
    f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}",
    f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={AGENT_LOOP_MANAGER}",
    f"trainer.v1.sampler.custom_sampler.path={REPLAY_BUFFER_PATH}",
    f"trainer.v1.sampler.custom_sampler.name={REPLAY_BUFFER_NAME}",
)


def v1_integration_problem(verl_config: DictConfig) -> str | None:
    """Why verl's v1 trainer would not run our agent loop with this config; None when it does.

    When it does, group post-processing runs once per ``uid`` group and ``on_failure: exclude`` is
    honoured (zero loss mask, advantages from the group's scored members). The driver-side failure
    policy check (``async_reward.integration.check_failure_policy``) calls this for the v1 trainer.
    """
    trainer = verl_config.get("trainer") or {}
    if not trainer.get("use_v1", False):
        return "trainer.use_v1 is false: this is verl's legacy trainer, not v1"
    reward_model = (verl_config.get("reward") or {}).get("reward_model") or {}
    if reward_model.get("enable", False) and not reward_model.get("enable_resource_pool", False):
        return (
            "reward.reward_model.enable without enable_resource_pool: verl v1 scores after sampling "
            "(colocated reward model), not in the agent loop, so groups cannot be post-processed there"
        )
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
    sampler = (((verl_config.get("trainer") or {}).get("v1") or {}).get("sampler") or {}).get(
        "custom_sampler"
    ) or {}
    return sampler.get("path") == REPLAY_BUFFER_PATH and sampler.get("name") == REPLAY_BUFFER_NAME


def prepare_v1_config(config: DictConfig) -> DictConfig:
    """Everything :data:`V1_OVERRIDES` sets, for a launcher that builds verl's config in code.

    Names our agent-loop manager and replay buffer, then runs :func:`async_reward.prepare_verl_config`
    (legacy reward keys, worker setup hook, every start-up check). Refuses to replace a different
    agent-loop manager or custom sampler the user configured: Ray-side behaviour must not change
    silently.
    Returns the same (mutated) config.
    """
    with open_dict(config):
        agent = config.actor_rollout_ref.rollout.agent
        current = agent.get("agent_loop_manager_class")
        if current not in (None, AGENT_LOOP_MANAGER):
            raise ConfigError(
                f"actor_rollout_ref.rollout.agent.agent_loop_manager_class is already {current}; "
                f"async-reward's v1 integration needs {AGENT_LOOP_MANAGER} (subclass it to combine both)"
            )
        agent.agent_loop_manager_class = AGENT_LOOP_MANAGER
        sampler = config.trainer.v1.sampler
        custom: Any = sampler.get("custom_sampler") or {}
        if custom.get("path") and not uses_reward_replay_buffer(config):
            raise ConfigError(
                f"trainer.v1.sampler.custom_sampler is already {custom.get('path')}:{custom.get('name')}; "
                "async-reward's per-step reward metrics need its RewardReplayBuffer there"
            )
        sampler.custom_sampler = {"path": REPLAY_BUFFER_PATH, "name": REPLAY_BUFFER_NAME}
    # Last: its checks (on_failure: exclude among them) must see our v1 integration in place.
    return prepare_verl_config(config)


def _is_our_manager(fqn: str) -> bool:
    """Whether ``fqn`` names a subclass of our manager (imports it, as verl's TaskRunnerV1 would)."""
    from verl.utils.import_utils import load_class_from_fqn

    from async_reward.v1.agent_loop import RewardAgentLoopManager

    try:
        cls = load_class_from_fqn(fqn, "AgentLoopManager")
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, RewardAgentLoopManager)
