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

from async_reward._config_rules import bad_value, names_config_errors
from async_reward.config import ConfigError
from async_reward.integration import PIPELINED_TRAINER_KEY, SETUP_HOOK, _select, prepare_verl_config

__all__ = [
    "AGENT_LOOP_MANAGER",
    "DEFAULT_MAX_UNTRAINED_SKIPS",
    "MAX_UNTRAINED_SKIPS_KEY",
    "REPLAY_BUFFER_NAME",
    "REPLAY_BUFFER_PATH",
    "V1_OVERRIDES",
    "check_v1_start_up",
    "max_untrained_skips",
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


#: ``trainer.v1.sampler.sampler_kwargs`` key: mini-batches with nothing to train on skipped in a row
#: before the run stops (see :meth:`RewardReplayBuffer._skip_untrained`).
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


def check_v1_start_up(verl_config: Any) -> None:
    """Refuse, where verl's v1 trainer builds things on the driver, the settings v1 cannot honour.

    Run by :func:`prepare_v1_config`, :class:`~async_reward.v1.agent_loop.RewardAgentLoopManager`,
    :class:`~async_reward.v1.replay_buffer.RewardReplayBuffer` (built first, in the trainer's
    ``__init__``) and, through the setup hook, verl's ``RewardLoopManager`` when ``trainer.use_v1``:

    * ``async_reward.pipeline``: the pipelined trainer's settings. v1 ignores them, and our managers
      refuse every sample sent by verl's own reward loop while they are set, so every group would fail
      (async modes refill forever; ``sync`` ends with verl's misleading "no materializable
      trajectories"). The pipelined trainer itself always trains with ``trainer.use_v1=false``.
    * ``algorithm.filter_groups.enable`` with ``on_failure: exclude``: verl's DAPO filter reads every
      member's score, excluded ones' ``fallback_score`` (and NaN extras) included, so it would keep or
      drop groups on scores that are not rewards.
    * ``trainer.v1.sampler.sampler_kwargs.max_untrained_skips`` that is not an integer >= 0, and
      ``exclude`` in ``sync`` with ``parameter_sync_step > 1`` (a later mini-batch would be generated
      again on sleeping replicas) or with mini-batches that verl cannot generate again in whole
      ``data.gen_batch_size`` fetches.

    Raises:
        ConfigError: naming the keys and the fix.
    """
    if _select(verl_config, PIPELINED_TRAINER_KEY) is not None:
        raise ConfigError(
            f"{PIPELINED_TRAINER_KEY} is set, but verl's v1 trainer (trainer.use_v1=true) is training: it "
            "ignores the pipeline settings, and async-reward's managers refuse samples from verl's own "
            "reward loop while they are set, so every group would fail. Train with the pipelined trainer "
            "(python -m async_reward.pipeline.main_ppo, which runs verl's legacy trainer), or under v1 "
            "with trainer.v1.trainer_mode=pipelined and the same flags under trainer.v1.pipelined.* "
            f"(e.g. +trainer.v1.pipelined.mini_batch=true), or drop the {PIPELINED_TRAINER_KEY}.* keys"
        )
    from async_reward.v1.pipelined_config import is_pipelined_mode, load_pipelined_mode_config

    if is_pipelined_mode(verl_config):  # our trainer mode: its schedule and what it cannot honour
        load_pipelined_mode_config(verl_config)
    max_untrained_skips(_select(verl_config, "trainer.v1.sampler.sampler_kwargs"))
    _check_untrained_batches_can_be_regenerated(verl_config)
    filtering = _select(verl_config, "algorithm.filter_groups.enable")
    if filtering and _select(verl_config, "reward.async_reward.on_failure") == "exclude":
        raise ConfigError(
            "algorithm.filter_groups.enable=true with reward.async_reward.on_failure=exclude under verl "
            "v1: verl's DAPO group filter reads every member's score, an excluded member's fallback_score "
            "(and NaN extras) included, so it would keep or drop groups on scores that are not rewards. "
            "Set one of them differently (e.g. on_failure=fallback, or filter_groups.enable=false)"
        )


def _check_untrained_batches_can_be_regenerated(verl_config: Any) -> None:
    """With ``exclude``, a mini-batch that trains on nothing is dropped and its prompts generated again,
    which verl does in whole ``data.gen_batch_size`` fetches, on the rollout replicas as they are.
    Async modes fetch one prompt at a time and keep the replicas generating while they sample.
    ``sync`` puts the replicas to sleep after each mini-batch it samples (``on_sample_end``), so with
    ``parameter_sync_step > 1`` the prompts of a later mini-batch would be sent to sleeping replicas;
    and it fetches a whole train batch unless told otherwise. Refused here rather than in the middle
    of an outage."""
    if _select(verl_config, "reward.async_reward.on_failure") != "exclude":
        return
    if (_select(verl_config, "trainer.v1.trainer_mode") or "sync") != "sync":
        return
    steps = _select(verl_config, "trainer.v1.sync.parameter_sync_step") or 1
    if isinstance(steps, int) and steps > 1:
        raise ConfigError(
            f"reward.async_reward.on_failure=exclude under verl v1 sync with "
            f"trainer.v1.sync.parameter_sync_step={steps}: sync puts the rollout replicas to sleep after "
            "sampling each mini-batch, so a later mini-batch whose every session is excluded could only "
            "be generated again on sleeping replicas. Use parameter_sync_step=1 (one mini-batch per "
            "step; ppo_mini_batch_size still splits the update), an async trainer_mode, or "
            "on_failure=fallback",
            key="trainer.v1.sync.parameter_sync_step",
            fix="set trainer.v1.sync.parameter_sync_step=1",
        )
    if _select(verl_config, "trainer.v1.sampler.sync_refill_failed_groups"):
        return  # verl then fetches one prompt at a time
    train_batch = _select(verl_config, "data.train_batch_size")
    fetch = _select(verl_config, "data.gen_batch_size") or train_batch
    if not all(isinstance(value, int) and value > 0 for value in (train_batch, fetch)):
        return  # verl refuses these itself
    if train_batch % fetch:
        raise ConfigError(
            f"reward.async_reward.on_failure=exclude under verl v1 sync with data.train_batch_size="
            f"{train_batch} and data.gen_batch_size={fetch}: a mini-batch whose every session is excluded "
            "could not be generated again (verl fetches whole gen_batch_size chunks). Set "
            "data.gen_batch_size=1",
            key="data.gen_batch_size",
            fix="set data.gen_batch_size=1",
        )


def uses_reward_replay_buffer(verl_config: DictConfig) -> bool:
    """Whether ``trainer.v1.sampler.custom_sampler`` names our replay buffer (per-step metrics)."""
    sampler = _select(verl_config, "trainer.v1.sampler.custom_sampler")
    if not hasattr(sampler, "get"):  # unset, or not a mapping (verl refuses that itself)
        return False
    return sampler.get("path") == REPLAY_BUFFER_PATH and sampler.get("name") == REPLAY_BUFFER_NAME


@names_config_errors("trainer")
def prepare_v1_config(config: DictConfig) -> DictConfig:
    """Everything :data:`V1_OVERRIDES` sets, for a launcher that builds verl's config in code.

    Names our agent-loop manager and replay buffer, then runs :func:`async_reward.prepare_verl_config`
    (legacy reward keys, worker setup hook, every start-up check). Refuses to replace a different
    agent-loop manager or custom sampler the user configured: Ray-side behaviour must not change
    silently.
    Returns the same (mutated) config.

    Raises:
        ConfigError: see :func:`check_v1_start_up`, and the replacements above.
    """
    check_v1_start_up(config)
    from async_reward.v1.pipelined_config import is_pipelined_mode

    if is_pipelined_mode(config):  # registers trainer_mode=pipelined in this (the launcher's) process
        import async_reward.v1.pipelined_trainer  # noqa: F401
    with open_dict(config):
        agent = config.actor_rollout_ref.rollout.agent
        current = agent.get("agent_loop_manager_class")
        if current not in (None, AGENT_LOOP_MANAGER):
            raise ConfigError(
                f"actor_rollout_ref.rollout.agent.agent_loop_manager_class is already {current}; "
                f"async-reward's v1 integration needs {AGENT_LOOP_MANAGER} (subclass it to combine both)"
            )
        agent.agent_loop_manager_class = AGENT_LOOP_MANAGER
        sampler = _select(config, "trainer.v1.sampler")
        if not isinstance(sampler, DictConfig):
            raise ConfigError(
                "trainer.v1.sampler is not a mapping in this config; compose it from verl's "
                "ppo_trainer config (trainer.v1 is verl's own section)",
                key="trainer.v1.sampler",
                fix="compose the config from verl's ppo_trainer.yaml",
            )
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
