"""The start-up checks of verl's v1 trainer: what it cannot honour, and our modes' own settings.

Run where v1 builds things on the driver (:func:`apply_legacy_and_check` from the setup hook and the
verl plugin, our agent-loop manager, replay buffer and trainers). The checks every reward manager runs
(``reward.*``, ``on_failure: exclude`` against the trainer) are :mod:`async_reward.config.checks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from async_reward._core.config_rules import plain_container, select_key
from async_reward._core.errors import ConfigError
from async_reward.config.checks import check_reward
from async_reward.config.v1 import (
    DECOUPLED_MODE,
    DECOUPLED_MODE_PATH,
    PIPELINED_MODE,
    PIPELINED_MODE_PATH,
    PIPELINED_TRAINER_KEY,
    check_our_sampler_kwargs,
    is_decoupled_mode,
    is_pipelined_mode,
    max_untrained_skips,
    uses_reward_replay_buffer,
)
from async_reward.config.verl_keys import apply_legacy_reward_keys
from async_reward.v1.decoupled.config import load_decoupled_mode_config
from async_reward.v1.pipelined.config import load_pipelined_mode_config

__all__ = ["apply_legacy_and_check", "check_trainer_mode_settings", "check_v1"]


def apply_legacy_and_check(config: Any) -> None:
    """What the setup hook does where verl builds its trainer or ``RewardLoopManager``: the legacy
    ``reward_model.reward_manager`` / ``reward_loop_*`` / ``num_workers``, ``custom_reward_function.*``
    and ``sandbox_fusion.*`` keys applied as verl's ``migrate_legacy_reward_impl`` would (a conflict
    with the new key, or a legacy key verl has already read, is a ``ConfigError``), then
    :func:`check_reward` and, under verl's v1 trainer, its start-up checks.

    Raises:
        ConfigError: naming the key and the fix.
    """
    if isinstance(config, DictConfig):
        apply_legacy_reward_keys(config, late=True)
    check_trainer_mode_settings(config)
    check_reward(config)
    if select_key(config, "trainer.use_v1"):  # verl's v1 trainer: what it cannot honour, refused
        check_v1(config)


def check_v1(verl_config: Any) -> None:
    """Refuse, where verl's v1 trainer builds things on the driver, the settings v1 cannot honour.

    Run by :func:`async_reward.wiring.integration.prepare_v1_config`,
    :class:`~async_reward.v1.agent_loop.RewardAgentLoopManager`,
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
    if select_key(verl_config, PIPELINED_TRAINER_KEY) is not None:
        raise ConfigError(
            f"{PIPELINED_TRAINER_KEY} is set, but verl's v1 trainer (trainer.use_v1=true) is training: it "
            "ignores the pipeline settings, and async-reward's managers refuse samples from verl's own "
            "reward loop while they are set, so every group would fail. Train with the pipelined trainer "
            "(python -m async_reward.legacy.main_ppo, which runs verl's legacy trainer), or under v1 "
            "with trainer.v1.trainer_mode=pipelined and the same flags under trainer.v1.pipelined.* "
            f"(e.g. +trainer.v1.pipelined.mini_batch=true), or drop the {PIPELINED_TRAINER_KEY}.* keys"
        )
    check_trainer_mode_settings(verl_config)
    if is_pipelined_mode(verl_config):  # our trainer mode: its schedule and what it cannot honour
        load_pipelined_mode_config(verl_config)
    if is_decoupled_mode(verl_config):  # our other mode: its windows and what it cannot honour
        load_decoupled_mode_config(verl_config)
    sampler_kwargs = select_key(verl_config, "trainer.v1.sampler.sampler_kwargs")
    max_untrained_skips(sampler_kwargs)
    if (
        uses_reward_replay_buffer(verl_config)
        or is_pipelined_mode(verl_config)
        or is_decoupled_mode(verl_config)
    ):
        check_our_sampler_kwargs(sampler_kwargs)
    _check_untrained_batches_can_be_regenerated(verl_config)
    filtering = select_key(verl_config, "algorithm.filter_groups.enable")
    if filtering and select_key(verl_config, "reward.async_reward.on_failure") == "exclude":
        raise ConfigError(
            "algorithm.filter_groups.enable=true with reward.async_reward.on_failure=exclude under verl "
            "v1: verl's DAPO group filter reads every member's score, an excluded member's fallback_score "
            "(and NaN extras) included, so it would keep or drop groups on scores that are not rewards. "
            "Set one of them differently (e.g. on_failure=fallback, or filter_groups.enable=false)"
        )


#: Our trainer modes: ``trainer.v1.trainer_mode`` value, the node of its settings, and the test of a
#: config for that mode.
_OUR_TRAINER_MODES = (
    (PIPELINED_MODE, PIPELINED_MODE_PATH, is_pipelined_mode),
    (DECOUPLED_MODE, DECOUPLED_MODE_PATH, is_decoupled_mode),
)


def check_trainer_mode_settings(verl_config: Any) -> None:
    """Refuse ``trainer.v1.pipelined.*`` / ``trainer.v1.decoupled.*`` while another trainer trains.

    Each node is read only by its own mode (``trainer.use_v1=true trainer.v1.trainer_mode=<mode>``):
    under verl's other v1 modes (``sync``, ``colocate_async``, ``separate_async``), a forgotten
    ``trainer_mode`` line or the legacy trainer, ``mini_batch``, ``one_step_off_policy``,
    ``reward_backlog``, ``staleness_from``, ... would be accepted and do nothing. An empty node is
    not a setting.

    ``trainer.v1.trainer_mode`` naming one of our modes under ``trainer.use_v1=false`` is refused too:
    verl's legacy trainer never reads ``trainer.v1.*``, so the job would train unpipelined without
    a word.

    Raises:
        ConfigError: naming the first key set, the trainer that would ignore it, and the fix.
    """
    _check_our_mode_has_its_trainer(verl_config)
    for mode, path, is_mode in _OUR_TRAINER_MODES:
        node = plain_container(select_key(verl_config, path), path)
        if not isinstance(node, Mapping) or not node or is_mode(verl_config):
            continue
        keys = sorted(str(key) for key in node)
        if select_key(verl_config, "trainer.use_v1"):
            mode_set = select_key(verl_config, "trainer.v1.trainer_mode") or "sync"
            trainer = f"trainer.v1.trainer_mode={mode_set}"
        else:
            trainer = "verl's legacy trainer (trainer.use_v1=false)"
        fix = f"train with trainer.use_v1=true trainer.v1.trainer_mode={mode}, or remove the {path}.* keys"
        raise ConfigError(
            f"{path}.{keys[0]} is set ({', '.join(f'{path}.{key}' for key in keys)}), but {trainer} is "
            f"training, which never reads {path}.*, so the setting would be silently ignored; {fix}",
            key=f"{path}.{keys[0]}",
            fix=fix,
        )


def _check_our_mode_has_its_trainer(verl_config: Any) -> None:
    """Refuse ``trainer.v1.trainer_mode=pipelined`` (or ``decoupled``) with ``trainer.use_v1=false``:
    our modes are modes of verl's v1 trainer, and verl's legacy trainer ignores the line."""
    mode = select_key(verl_config, "trainer.v1.trainer_mode")
    if select_key(verl_config, "trainer.use_v1") or mode not in {m for m, _, _ in _OUR_TRAINER_MODES}:
        return
    fix = (
        f"set trainer.use_v1=true to train with async-reward's {mode} mode (a mode of verl's v1 "
        f"trainer), or remove trainer.v1.trainer_mode={mode} to train with the legacy trainer"
    )
    raise ConfigError(
        f"trainer.use_v1=false with trainer.v1.trainer_mode={mode}: verl's legacy trainer is training, "
        f"which never reads trainer.v1.*, so the {mode} mode would be silently ignored; {fix}",
        key="trainer.use_v1",
        fix=fix,
    )


def _check_untrained_batches_can_be_regenerated(verl_config: Any) -> None:
    """With ``exclude``, a mini-batch that trains on nothing is dropped and its prompts generated again,
    which verl does in whole ``data.gen_batch_size`` fetches, on the rollout replicas as they are.
    Async modes fetch one prompt at a time and keep the replicas generating while they sample.
    ``sync`` puts the replicas to sleep after each mini-batch it samples (``on_sample_end``), so with
    ``parameter_sync_step > 1`` the prompts of a later mini-batch would be sent to sleeping replicas;
    and it fetches a whole train batch unless told otherwise. Refused here rather than in the middle
    of an outage."""
    if select_key(verl_config, "reward.async_reward.on_failure") != "exclude":
        return
    if (select_key(verl_config, "trainer.v1.trainer_mode") or "sync") != "sync":
        return
    steps = select_key(verl_config, "trainer.v1.sync.parameter_sync_step") or 1
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
    if select_key(verl_config, "trainer.v1.sampler.sync_refill_failed_groups"):
        return  # verl then fetches one prompt at a time
    train_batch = select_key(verl_config, "data.train_batch_size")
    fetch = select_key(verl_config, "data.gen_batch_size") or train_batch
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
