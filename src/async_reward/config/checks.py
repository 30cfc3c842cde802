"""Every start-up check of a verl config, one ``check_<section>`` per concern, before any worker.

A setting a worker would refuse, or one the trainer cannot honour, must stop the job on the driver
with one clear ``ConfigError`` naming the key and the fix, not as a Ray ``ActorDiedError`` at the
first step. The checks:

* :func:`check_reward`: ``reward.*`` (``num_workers``, the manager's name) and the chosen manager's
  own checks (its ``check_config``: every ``reward.async_reward`` value, what it requires, the user's
  code it runs), which include :func:`check_on_failure`;
* :func:`check_on_failure`: ``reward.async_reward.on_failure: exclude`` against the trainer and the
  verl settings that would let an excluded sample still move the weights;
* :func:`check_v1`: what verl's v1 trainer (``trainer.use_v1``) cannot honour;
* :func:`apply_legacy_and_check`: what runs where verl builds its trainer or ``RewardLoopManager``:
  the legacy ``reward_model.*`` keys applied (the checks must read the keys verl will read), then
  :func:`check_reward` and, under v1, :func:`check_v1`.

They run in ``async_reward.wiring.integration.prepare_verl_config`` / ``prepare_v1_config`` (launchers), in
our trainers and agent-loop classes, in every manager's constructor (its ``check_settings``) and,
through the Ray setup hook, where verl's own trainer builds its ``RewardLoopManager``. The value rules
of one section (ranges, relations between fields) live with its dataclass in ``async_reward.config``
and run from here through the manager's checks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from async_reward._core.config_rules import bad_value, names_config_errors, plain_container, select_key
from async_reward.config.v1 import (
    PIPELINED_TRAINER_KEY,
    REPLAY_BUFFER_NAME,
    REPLAY_BUFFER_PATH,
    is_pipelined_mode,
    uses_reward_replay_buffer,
    v1_integration_problem,
)
from async_reward.config.verl_keys import check_function_needs_its_path

__all__ = [
    "EXCLUDE_LOSS_AGG_MODES",
    "EXCLUDE_POLICY_LOSSES",
    "check_on_failure",
    "check_reward",
    "trains_critic",
]

#: verl loss aggregations under which a sample with an all-zero loss mask changes nothing: verl 0.9's
#: actor divides by the mini-batch's valid tokens (token-mean) or not at all (token-sum). The
#: seq-mean modes divide by ``global_batch_size`` (ppo_mini_batch_size x rollout.n sequences, excluded
#: ones included), so an excluded sample would shrink the update instead of being absent.
EXCLUDE_LOSS_AGG_MODES = ("token-mean", "token-sum")
#: verl policy losses (``actor.policy_loss.loss_mode``) verified to ignore zero-mask rows exactly under
#: those aggregations, and to give a zero loss and gradient on a micro-batch with no loss token at all
#: (tests/training/test_exclusion.py checks every registered loss). ``geo_mean`` and ``sapo`` normalise per
#: sequence by the global batch size, so they do not ignore the rows; ``bypass_mode`` raises on an
#: empty micro-batch (its rollout correction demands a valid token), which one excluded session makes
#: with ``ppo_micro_batch_size_per_gpu=1``. Losses registered later are refused until verified.
EXCLUDE_POLICY_LOSSES = (
    "vanilla",
    "cispo",
    "clip_cov",
    "dppo_kl",
    "dppo_tv",
    "dro",
    "gpg",
    "gspo",
    "kl_cov",
)


@names_config_errors("reward")
def check_reward(verl_config: Any) -> None:
    """Refuse, before any reward worker starts, every reward setting a worker would refuse.

    For a manager class that declares its start-up checks as a ``check_config(config, env)``
    classmethod (``AsyncRewardManager`` and so every manager of ours, users' subclasses included):
    every ``reward.async_reward`` value, what the chosen manager requires (``judge.base_url``,
    ``remote.url``, API key variables set in the workers' environment: this process's plus
    ``ray_kwargs.ray_init.runtime_env.env_vars``), and :func:`check_on_failure`. Also
    ``reward.num_workers`` >= 1. Other managers are verl's to check.

    verl resolves the manager's name in its registry, which holds our managers because importing any
    module of ``async_reward`` imports the package, and the package registers them.

    Raises:
        ConfigError: naming the key, the bad value and the fix (never a secret's value).
    """
    from verl.trainer.ppo.reward import resolve_reward_manager_cls

    workers = select_key(verl_config, "reward.num_workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise bad_value(
            "reward.num_workers",
            workers,
            "must be an integer >= 1 (verl starts that many reward worker processes)",
            "write reward.num_workers=1 or more",
        )
    try:
        manager_cls = resolve_reward_manager_cls(verl_config)
    except Exception as exc:  # unknown name, bad importlib path: verl's own message, our error type
        name = select_key(verl_config, "reward.reward_manager.name")
        raise bad_value(
            "reward.reward_manager.name",
            name,
            f"cannot be resolved ({type(exc).__name__}: {exc})",
            "name a registered manager (async_naive, async_rate_limited, async_remote, llm_judge, "
            "async_stateful, async_composite, or verl's own), or fix reward.reward_manager.source / "
            "module.path",
        ) from exc
    # Asked of the class, not checked against AsyncRewardManager: that class runs these checks in its
    # own constructor, so importing it here would close an import circle.
    check_config = getattr(manager_cls, "check_config", None) if isinstance(manager_cls, type) else None
    if callable(check_config):
        settings = check_config(verl_config, env=_worker_environment(verl_config))
        # The job's own function keys, here and not in check_config: async_composite checks each
        # component's derived config with it, where the path of a non-function component is cleared.
        check_function_needs_its_path(
            verl_config,
            str(select_key(verl_config, "reward.reward_manager.name") or manager_cls.__name__),
            runs_custom_function=_runs_custom_function(manager_cls),
        )
        # What the settings turn on, in the job's log at start-up (job-wide admission, the served judge).
        announce = getattr(manager_cls, "announce_settings", None)
        if callable(announce):
            announce(verl_config, settings)


def _runs_custom_function(manager_cls: type) -> bool | None:
    """Whether ``manager_cls`` calls ``reward.custom_reward_function`` (None: unknown, a user's own
    manager). ``async_composite`` (which reads ``composite``) passes it to its function components."""
    if getattr(manager_cls, "_reads_composite", False):
        return True
    runs = getattr(manager_cls, "runs_custom_function", None)
    return runs if isinstance(runs, bool) else None


def _v1_problem(verl_config: Any) -> str | None:
    """Why verl's v1 trainer as configured cannot honour ``exclude`` (None: our v1 integration runs).

    Both our v1 lines are needed: the agent loop masks excluded sessions, and the replay buffer keeps
    from verl a mini-batch in which every session is excluded (verl cannot skip one)."""
    problem = v1_integration_problem(verl_config)
    # Our pipelined mode skips a chunk with nothing to train itself; it samples no training batch.
    if problem is None and not uses_reward_replay_buffer(verl_config) and not is_pipelined_mode(verl_config):
        return (
            "verl's v1 replay buffer runs without async-reward's, which keeps a mini-batch whose every "
            "session is excluded away from verl (it cannot skip one); add "
            f"trainer.v1.sampler.custom_sampler.path={REPLAY_BUFFER_PATH} and .name={REPLAY_BUFFER_NAME}"
        )
    return problem


def check_on_failure(verl_config: Any) -> None:
    """Refuse ``reward.async_reward.on_failure: exclude`` where it cannot be honoured.

    ``exclude`` keeps a failed sample out of the gradient: zero loss mask, and its group's advantages
    from the members that were scored. Only a trainer that reads the samples' ``excluded`` flag can
    do that. Where it works:

    * async-reward's pipelined trainer (``python -m async_reward.legacy.main_ppo`` in any mode,
      baseline included, or ``PipelinedRayPPOTrainer``): configs marked by
      :func:`async_reward.wiring.integration.declare_pipelined_trainer`;
    * verl's v1 trainer with async-reward's v1 integration (our agent-loop manager masks excluded
      sessions and gives them groups of their own; the verl plugin names it where the user named no
      other, ``async_reward.v1.V1_OVERRIDES`` without the plugin);
    * offline scoring (a config without ``actor_rollout_ref`` trains nothing): rows report
      ``excluded``.

    verl's own trainers (``RayPPOTrainer``, the v1 trainer without our integration) would train on
    ``fallback_score`` instead,
    so they are refused. Under our trainer, so are the verl settings that would let an excluded sample
    still move the weights: a loss aggregation or policy loss outside :data:`EXCLUDE_LOSS_AGG_MODES` /
    :data:`EXCLUDE_POLICY_LOSSES` (actor, and critic when one trains), rollout-correction weights
    normalised over the whole batch (``rollout_is_batch_normalize``: computed before rewards exist),
    ``rollout_correction.bypass_mode`` on the legacy trainer (it switches the loss to ``bypass_mode``
    at run time, which stops on a micro-batch without a loss token), a critic whose
    ``ppo_mini_batch_size`` differs from the actor's, PF-PPO's reward-weighted resampling
    (``use_pf_ppo``), and an adaptive in-reward KL controller.

    Raises:
        ConfigError: naming the setting, why, and where ``exclude`` works.
    """
    policy = select_key(verl_config, "reward.async_reward.on_failure")
    if policy != "exclude" or select_key(verl_config, "actor_rollout_ref") is None:
        return
    if select_key(verl_config, PIPELINED_TRAINER_KEY) is None and _v1_problem(verl_config) is not None:
        raise bad_value(
            "reward.async_reward.on_failure",
            policy,
            "is not honoured by verl's own trainers as configured (RayPPOTrainer; the v1 trainer without "
            f"async-reward's v1 integration: {_v1_problem(verl_config)}): they would train on "
            "fallback_score for every failed sample",
            "train with async-reward's pipelined trainer (python -m async_reward.legacy.main_ppo, any "
            "mode, or PipelinedRayPPOTrainer; a StepSchedule loop of your own: call "
            "async_reward.wiring.integration.declare_pipelined_trainer(config) first), or with verl's v1 "
            "trainer "
            "and async-reward's agent-loop manager and replay buffer (named by the verl plugin where you "
            "name none; async_reward.v1.V1_OVERRIDES without it, docs: verl v1), both of which give "
            "excluded samples no gradient; or use on_failure=fallback (explicit status, fallback_score) "
            "or raise",
        )
    actor = "actor_rollout_ref.actor"
    _check_exclude_setting(f"{actor}.loss_agg_mode", select_key(verl_config, f"{actor}.loss_agg_mode"))
    loss_mode = select_key(verl_config, f"{actor}.policy_loss.loss_mode") or "vanilla"
    if loss_mode not in EXCLUDE_POLICY_LOSSES:
        raise bad_value(
            f"{actor}.policy_loss.loss_mode",
            loss_mode,
            "does not ignore excluded samples exactly (it normalises per sequence by the global batch "
            "size, raises on a micro-batch whose every sample is excluded, or is not verified)",
            f"with on_failure=exclude use one of {list(EXCLUDE_POLICY_LOSSES)}, or on_failure=fallback",
        )
    legacy_trainer = select_key(verl_config, PIPELINED_TRAINER_KEY) is not None or not select_key(
        verl_config, "trainer.use_v1"
    )
    if legacy_trainer and select_key(verl_config, "algorithm.rollout_correction.bypass_mode"):
        # verl's legacy trainer (ours builds on it) switches the policy loss to bypass_mode at run time
        # (rollout_corr_helper.apply_bypass_mode), whatever policy_loss.loss_mode says. v1 only takes
        # old_log_probs from the rollout and keeps the configured loss, checked above.
        raise bad_value(
            "algorithm.rollout_correction.bypass_mode",
            True,
            "makes verl's legacy trainer (the pipelined trainer's base) train with the bypass_mode "
            "policy loss whatever policy_loss.loss_mode says, and that loss stops the run on a "
            "micro-batch without a loss token, which excluded samples make during an outage",
            "set it to false (verl then recomputes old_log_probs) with on_failure=exclude, train under "
            "verl v1 (where bypass_mode=true keeps the configured loss), or use on_failure=fallback",
        )
    if trains_critic(verl_config):
        _check_exclude_setting("critic.loss_agg_mode", select_key(verl_config, "critic.loss_agg_mode"))
        actor_mini = select_key(verl_config, f"{actor}.ppo_mini_batch_size")
        critic_mini = select_key(verl_config, "critic.ppo_mini_batch_size")
        if critic_mini is not None and actor_mini is not None and critic_mini != actor_mini:
            # The trainers hand verl whole updates' worth of rows that are not excluded (fewer excluded
            # rows than one update holds); with two update sizes that holds only for the smaller.
            raise bad_value(
                "critic.ppo_mini_batch_size",
                critic_mini,
                f"differs from {actor}.ppo_mini_batch_size ({actor_mini}): with on_failure=exclude one "
                "of the two optimizers could get an update made only of excluded samples, and AdamW "
                "moves weights on it (momentum, weight decay)",
                f"set critic.ppo_mini_batch_size={actor_mini} with on_failure=exclude",
            )
    kl_controller = select_key(verl_config, "algorithm.kl_ctrl.type")
    if select_key(verl_config, "algorithm.use_kl_in_reward") and kl_controller == "adaptive":
        raise bad_value(
            "algorithm.kl_ctrl.type",
            "adaptive",
            "would move on the KL of samples that train on nothing (a mini-batch made only of "
            "excluded samples still reports its zero KL to the controller)",
            "use kl_ctrl.type=fixed, or use_kl_loss instead of the reward KL, with on_failure=exclude",
        )
    if select_key(verl_config, "algorithm.use_pf_ppo"):
        raise bad_value(
            "algorithm.use_pf_ppo",
            True,
            "resamples the batch by reward, so rows no longer line up with their exclusion",
            "set it to false with on_failure=exclude",
        )
    if select_key(verl_config, "algorithm.rollout_correction.rollout_is_batch_normalize"):
        raise bad_value(
            "algorithm.rollout_correction.rollout_is_batch_normalize",
            True,
            "normalises importance weights over the whole batch before rewards exist, so excluded "
            "samples would still shape the others' weights",
            "set it to false with on_failure=exclude",
        )


def _check_exclude_setting(key: str, mode: Any) -> None:
    if mode is not None and mode not in EXCLUDE_LOSS_AGG_MODES:
        raise bad_value(
            key,
            mode,
            "cannot honour on_failure=exclude: verl divides the loss by the mini-batch's sequence count "
            "(ppo_mini_batch_size x rollout.n), excluded samples included, so each would shrink the "
            "update instead of being absent",
            f"use one of {list(EXCLUDE_LOSS_AGG_MODES)}, or on_failure=fallback",
        )


def trains_critic(verl_config: Any) -> bool:
    """verl's ``need_critic`` rule, without its warning."""
    enabled = select_key(verl_config, "critic.enable")
    if enabled is not None:
        return bool(enabled)
    estimator = select_key(verl_config, "algorithm.adv_estimator")
    return str(getattr(estimator, "value", estimator)) == "gae"


def _worker_environment(verl_config: Any) -> Mapping[str, str]:
    """The environment reward workers will see: this process's plus the job's runtime_env env_vars."""
    env_vars: Any = select_key(verl_config, "ray_kwargs.ray_init.runtime_env.env_vars") or {}
    env_vars = plain_container(env_vars, "ray_kwargs.ray_init.runtime_env.env_vars")
    extra = {str(k): str(v) for k, v in env_vars.items()} if isinstance(env_vars, Mapping) else {}
    return {**os.environ, **extra}
