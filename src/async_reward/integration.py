"""Making our managers resolvable everywhere verl looks them up, and refusing bad settings early.

verl resolves ``reward.reward_manager.name`` in the driver (``RewardLoopManager.__init__``) *and*
inside every ``RewardLoopWorker`` Ray process (``load_reward_manager``). Registration happens on
import, so ``async_reward`` must be imported in those worker processes too. Ray's
``worker_process_setup_hook`` does exactly that; it is the one line a user adds::

    ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=async_reward.integration.setup_worker

(verl's ``main_ppo`` merges ``ray_kwargs.ray_init.runtime_env`` into its ``ray.init``).

verl's own ``main_ppo`` never calls ``migrate_legacy_reward_impl``, so without our hook the legacy
``reward_model.reward_manager=llm_judge`` key is silently ignored there. The setup hook applies it
where verl builds its trainer (before any GPU worker) and its ``RewardLoopManager``; a legacy key
that verl reads earlier (the reward model's resources) is refused there, naming the new key.
``prepare_verl_config`` applies verl's whole migration and adds the hook; our entry point calls it.

Start-up checks: :func:`check_reward_config` refuses, before any reward worker starts, every setting a
worker would refuse (so a missing ``judge.base_url`` is one clear ``ConfigError``, not a Ray
``ActorDiedError`` at the first step), and :func:`check_failure_policy` refuses
``on_failure: exclude`` where the trainer cannot honour it. They run in ``prepare_verl_config``, in
``PipelinedRewardLoopManager``, in every manager's constructor, and, through the setup hook, where
verl's own trainer builds its ``RewardLoopManager``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from async_reward._config_rules import bad_value, names_config_errors, plain_container, unresolvable

__all__ = [
    "EXCLUDE_LOSS_AGG_MODES",
    "EXCLUDE_POLICY_LOSSES",
    "PIPELINED_TRAINER_KEY",
    "SETUP_HOOK",
    "VERL_TRAINERS",
    "apply_legacy_and_check",
    "check_failure_policy",
    "check_reward_config",
    "declare_pipelined_trainer",
    "init_local_ray",
    "prepare_verl_config",
    "ray_runtime_env",
    "setup_worker",
]

#: Import path of the Ray worker setup hook.
SETUP_HOOK = "async_reward.integration.setup_worker"
#: The config node our pipelined trainer reads. Its presence declares that trainer (which honours
#: ``on_failure: exclude``) as the one training: our entry point and ``PipelinedRayPPOTrainer`` add
#: it, and the entry point refuses to let any other trainer run a config that has it.
PIPELINED_TRAINER_KEY = "async_reward.pipeline"
#: verl loss aggregations under which a sample with an all-zero loss mask changes nothing: verl 0.9's
#: actor divides by the mini-batch's valid tokens (token-mean) or not at all (token-sum). The
#: seq-mean modes divide by ``global_batch_size`` (ppo_mini_batch_size x rollout.n sequences, excluded
#: ones included), so an excluded sample would shrink the update instead of being absent.
EXCLUDE_LOSS_AGG_MODES = ("token-mean", "token-sum")
#: verl policy losses (``actor.policy_loss.loss_mode``) verified to ignore zero-mask rows exactly under
#: those aggregations, and to give a zero loss and gradient on a micro-batch with no loss token at all
#: (tests/test_exclude.py checks every registered loss). ``geo_mean`` and ``sapo`` normalise per
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


#: verl's trainer classes whose ``__init__`` the setup hook wraps (module, class): built in the task
#: runner before any GPU worker starts, so the legacy reward keys are migrated and the reward settings
#: checked there, where verl's own entry point never calls ``migrate_legacy_reward_impl``.
VERL_TRAINERS = (
    ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer"),
)


def setup_worker() -> None:
    """Ray ``worker_process_setup_hook``: registers our managers in this process (on import), our
    ``pipelined`` verl v1 trainer mode once verl's v1 trainer is imported here (verl's task-runner
    actor), applies the legacy ``reward_model.*`` reward keys and checks the reward settings where
    verl's own trainer is built (before its GPU workers) and where it builds its ``RewardLoopManager``."""
    import wrapt

    import async_reward  # noqa: F401
    from async_reward.v1.registration import register_pipelined_mode_on_verl_import

    register_pipelined_mode_on_verl_import()
    _check_before_verl_reward_loop()
    for module, name in VERL_TRAINERS:
        # Wrapped when verl imports the module (most worker processes never do; importing it here
        # would cost every one of them a second of start-up).
        wrapt.register_post_import_hook(functools.partial(_wrap_trainer_init, name=name), module)


def _wrap_trainer_init(module: Any, name: str) -> None:
    """Make ``module.<name>.__init__`` run :func:`apply_legacy_and_check` on its config first."""
    trainer_cls = getattr(module, name, None)
    original = getattr(trainer_cls, "__init__", None)
    if original is None or getattr(original, "_async_reward_checked", False):
        return

    @functools.wraps(original)
    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        config = kwargs.get("config", args[0] if args else None)
        if config is not None:
            apply_legacy_and_check(config)
        original(self, *args, **kwargs)

    checked_init._async_reward_checked = True  # type: ignore[attr-defined]
    trainer_cls.__init__ = checked_init  # type: ignore[misc]


def apply_legacy_and_check(config: Any) -> None:
    """What the setup hook does where verl builds its trainer or ``RewardLoopManager``: the legacy
    ``reward_model.reward_manager`` / ``reward_loop_*`` / ``num_workers``, ``custom_reward_function.*``
    and ``sandbox_fusion.*`` keys applied as verl's ``migrate_legacy_reward_impl`` would (a conflict
    with the new key, or a legacy key verl has already read, is a ``ConfigError``), then
    :func:`check_reward_config` and, under verl's v1 trainer, its start-up checks.

    Raises:
        ConfigError: naming the key and the fix.
    """
    from async_reward.verl_settings import apply_legacy_reward_keys

    if isinstance(config, DictConfig):
        apply_legacy_reward_keys(config, late=True)
    check_reward_config(config)
    if _select(config, "trainer.use_v1"):  # verl's v1 trainer: what it cannot honour, refused
        from async_reward.v1.settings import check_v1_start_up

        check_v1_start_up(config)


def _check_before_verl_reward_loop() -> None:
    """Run :func:`check_reward_config` at the top of verl's ``RewardLoopManager.__init__``.

    verl builds that manager in its task runner (a Ray actor, so this hook ran there) and starts its
    ``RewardLoopWorker`` actors without waiting for them: a worker whose manager refuses the config
    only surfaces as an ``ActorDiedError`` at the first scoring call, after every GPU worker started.
    Checking first makes the same ``ConfigError`` the task runner's own error, at start-up. Only this
    process's class is wrapped, once; verl's behaviour is otherwise unchanged.
    """
    from verl.experimental.reward_loop import reward_loop

    manager_cls = reward_loop.RewardLoopManager
    original = manager_cls.__init__
    if getattr(original, "_async_reward_checked", False):
        return

    @functools.wraps(original)
    def checked_init(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        apply_legacy_and_check(config)
        original(self, config, *args, **kwargs)

    checked_init._async_reward_checked = True  # type: ignore[attr-defined]
    manager_cls.__init__ = checked_init  # type: ignore[method-assign]


def ray_runtime_env(base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Ray ``runtime_env`` that registers our managers in every worker process.

    Refuses to override a different setup hook the user already set (Ray takes only one).
    """
    env = dict(base or {})
    existing = env.get("worker_process_setup_hook")
    if existing not in (None, SETUP_HOOK):
        raise ValueError(
            f"runtime_env already has worker_process_setup_hook={existing!r}; call "
            f"{SETUP_HOOK} from it (Ray accepts one hook)"
        )
    env["worker_process_setup_hook"] = SETUP_HOOK
    return env


def init_local_ray(num_cpus: int) -> bool:
    """Start a local Ray cluster whose workers register our managers, unless Ray is already up.

    Returns True when this call started it (the caller then owns ``ray.shutdown``). Used by the
    benchmarks; a training job's Ray is started by verl's ``main_ppo``.
    """
    import ray

    if ray.is_initialized():
        return False
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=ray_runtime_env({"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}),
    )
    return True


def _has_legacy_reward_keys(config: DictConfig) -> bool:
    legacy = config.get("reward_model")
    return legacy is not None and "reward_manager" in legacy


@names_config_errors("reward")
def prepare_verl_config(config: DictConfig) -> DictConfig:
    """Honour the legacy ``reward_model.*`` reward keys, register our managers in Ray workers, and
    refuse bad reward settings before anything starts.

    Runs verl's own ``migrate_legacy_reward_impl`` (when the legacy section is present; a legacy key
    and its new key set to different values is a ``ConfigError``), adds our
    setup hook to ``ray_kwargs.ray_init.runtime_env``, then :func:`check_reward_config`. Returns the
    same (mutated) config.

    Raises:
        ConfigError: a reward setting a worker would refuse, or ``on_failure: exclude`` for a trainer
            that cannot honour it (call :func:`declare_pipelined_trainer` first when ours trains).
    """
    if _has_legacy_reward_keys(config):
        from async_reward.verl_settings import apply_legacy_reward_keys

        apply_legacy_reward_keys(config, late=False)  # verl's migration, a conflict refused
    with open_dict(config):
        if config.get("ray_kwargs") is None:
            config.ray_kwargs = {}
        if config.ray_kwargs.get("ray_init") is None:
            config.ray_kwargs.ray_init = {}
        current = config.ray_kwargs.ray_init.get("runtime_env")
        current_dict = plain_container(current, "ray_kwargs.ray_init.runtime_env")
        config.ray_kwargs.ray_init.runtime_env = ray_runtime_env(current_dict)
    check_reward_config(config)
    return config


@names_config_errors("async_reward")
def declare_pipelined_trainer(config: DictConfig) -> DictConfig:
    """Mark ``config`` as trained by ``PipelinedRayPPOTrainer`` (adds an empty ``async_reward.pipeline``
    node when absent), so :func:`check_failure_policy` admits ``on_failure: exclude``, and set
    ``trainer.use_v1=false`` (ours is verl's legacy trainer). Our entry point and the trainer call it;
    returns the same config."""
    top = config.get("async_reward")
    if top is not None and not isinstance(top, (DictConfig, Mapping)):
        raise bad_value(
            "async_reward",
            top,
            "is not a mapping",
            "write the pipelined trainer's settings under it, e.g. +async_reward.pipeline.mini_batch=true",
        )
    if _select(config, PIPELINED_TRAINER_KEY) is None:
        with open_dict(config):
            if config.get("async_reward") is None:
                config.async_reward = {}
            config.async_reward.pipeline = {}
    if _select(config, "trainer.use_v1"):  # ours extends verl's legacy trainer; v1 refuses the pipeline
        with open_dict(config):
            config.trainer.use_v1 = False
    return config


@names_config_errors("reward")
def check_reward_config(verl_config: Any) -> None:
    """Refuse, before any reward worker starts, every reward setting a worker would refuse.

    For our managers (and users' subclasses of ``AsyncRewardManager``): every ``reward.async_reward``
    value, what the chosen manager requires (``judge.base_url``, ``remote.url``, API key variables set
    in the workers' environment: this process's plus ``ray_kwargs.ray_init.runtime_env.env_vars``),
    and :func:`check_failure_policy`. Also ``reward.num_workers`` >= 1. Other managers are verl's to
    check.

    Raises:
        ConfigError: naming the key, the bad value and the fix (never a secret's value).
    """
    from verl.trainer.ppo.reward import resolve_reward_manager_cls

    from async_reward.managers.base import AsyncRewardManager

    workers = _select(verl_config, "reward.num_workers")
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
        name = _select(verl_config, "reward.reward_manager.name")
        raise bad_value(
            "reward.reward_manager.name",
            name,
            f"cannot be resolved ({type(exc).__name__}: {exc})",
            "name a registered manager (async_naive, async_rate_limited, async_remote, llm_judge, "
            "async_stateful, or verl's own), or fix reward.reward_manager.source / module.path",
        ) from exc
    if not (isinstance(manager_cls, type) and issubclass(manager_cls, AsyncRewardManager)):
        return
    manager_cls.check_config(verl_config, env=_worker_environment(verl_config))


def _v1_problem(verl_config: Any) -> str | None:
    """Why verl's v1 trainer as configured cannot honour ``exclude`` (None: our v1 integration runs).

    Both our v1 lines are needed: the agent loop masks excluded sessions, and the replay buffer keeps
    from verl a mini-batch in which every session is excluded (verl cannot skip one)."""
    from async_reward.v1.pipelined_config import is_pipelined_mode
    from async_reward.v1.settings import (
        REPLAY_BUFFER_NAME,
        REPLAY_BUFFER_PATH,
        uses_reward_replay_buffer,
        v1_integration_problem,
    )

    problem = v1_integration_problem(verl_config)
    # Our pipelined mode skips a chunk with nothing to train itself; it samples no training batch.
    if problem is None and not uses_reward_replay_buffer(verl_config) and not is_pipelined_mode(verl_config):
        return (
            "verl's v1 replay buffer runs without async-reward's, which keeps a mini-batch whose every "
            "session is excluded away from verl (it cannot skip one); add "
            f"trainer.v1.sampler.custom_sampler.path={REPLAY_BUFFER_PATH} and .name={REPLAY_BUFFER_NAME}"
        )
    return problem


def check_failure_policy(verl_config: Any) -> None:
    """Refuse ``reward.async_reward.on_failure: exclude`` where it cannot be honoured.

    ``exclude`` keeps a failed sample out of the gradient: zero loss mask, and its group's advantages
    from the members that were scored. Only a trainer that reads the samples' ``excluded`` flag can
    do that. Where it works:

    * async-reward's pipelined trainer (``python -m async_reward.pipeline.main_ppo`` in any mode,
      baseline included, or ``PipelinedRayPPOTrainer``): configs marked by
      :func:`declare_pipelined_trainer`;
    * verl's v1 trainer with async-reward's v1 integration (``async_reward.v1.V1_OVERRIDES``: our
      agent-loop manager masks excluded sessions and gives them groups of their own);
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
    policy = _select(verl_config, "reward.async_reward.on_failure")
    if policy != "exclude" or _select(verl_config, "actor_rollout_ref") is None:
        return
    if _select(verl_config, PIPELINED_TRAINER_KEY) is None and _v1_problem(verl_config) is not None:
        raise bad_value(
            "reward.async_reward.on_failure",
            policy,
            "is not honoured by verl's own trainers as configured (RayPPOTrainer; the v1 trainer without "
            f"async-reward's v1 integration: {_v1_problem(verl_config)}): they would train on "
            "fallback_score for every failed sample",
            "train with async-reward's pipelined trainer (python -m async_reward.pipeline.main_ppo, any "
            "mode, or PipelinedRayPPOTrainer; a StepSchedule loop of your own: call "
            "async_reward.integration.declare_pipelined_trainer(config) first), or with verl's v1 trainer "
            "plus async_reward.v1.V1_OVERRIDES (README, 'verl v1'), both of which give excluded samples "
            "no gradient; or use on_failure=fallback (explicit status, fallback_score) or raise",
        )
    actor = "actor_rollout_ref.actor"
    _check_exclude_setting(f"{actor}.loss_agg_mode", _select(verl_config, f"{actor}.loss_agg_mode"))
    loss_mode = _select(verl_config, f"{actor}.policy_loss.loss_mode") or "vanilla"
    if loss_mode not in EXCLUDE_POLICY_LOSSES:
        raise bad_value(
            f"{actor}.policy_loss.loss_mode",
            loss_mode,
            "does not ignore excluded samples exactly (it normalises per sequence by the global batch "
            "size, raises on a micro-batch whose every sample is excluded, or is not verified)",
            f"with on_failure=exclude use one of {list(EXCLUDE_POLICY_LOSSES)}, or on_failure=fallback",
        )
    legacy_trainer = _select(verl_config, PIPELINED_TRAINER_KEY) is not None or not _select(
        verl_config, "trainer.use_v1"
    )
    if legacy_trainer and _select(verl_config, "algorithm.rollout_correction.bypass_mode"):
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
    if _trains_critic(verl_config):
        _check_exclude_setting("critic.loss_agg_mode", _select(verl_config, "critic.loss_agg_mode"))
        actor_mini = _select(verl_config, f"{actor}.ppo_mini_batch_size")
        critic_mini = _select(verl_config, "critic.ppo_mini_batch_size")
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
    kl_controller = _select(verl_config, "algorithm.kl_ctrl.type")
    if _select(verl_config, "algorithm.use_kl_in_reward") and kl_controller == "adaptive":
        raise bad_value(
            "algorithm.kl_ctrl.type",
            "adaptive",
            "would move on the KL of samples that train on nothing (a mini-batch made only of "
            "excluded samples still reports its zero KL to the controller)",
            "use kl_ctrl.type=fixed, or use_kl_loss instead of the reward KL, with on_failure=exclude",
        )
    if _select(verl_config, "algorithm.use_pf_ppo"):
        raise bad_value(
            "algorithm.use_pf_ppo",
            True,
            "resamples the batch by reward, so rows no longer line up with their exclusion",
            "set it to false with on_failure=exclude",
        )
    if _select(verl_config, "algorithm.rollout_correction.rollout_is_batch_normalize"):
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


def _trains_critic(verl_config: Any) -> bool:
    """verl's ``need_critic`` rule, without its warning."""
    enabled = _select(verl_config, "critic.enable")
    if enabled is not None:
        return bool(enabled)
    estimator = _select(verl_config, "algorithm.adv_estimator")
    return str(getattr(estimator, "value", estimator)) == "gae"


def _worker_environment(verl_config: Any) -> Mapping[str, str]:
    """The environment reward workers will see: this process's plus the job's runtime_env env_vars."""
    env_vars: Any = _select(verl_config, "ray_kwargs.ray_init.runtime_env.env_vars") or {}
    env_vars = plain_container(env_vars, "ray_kwargs.ray_init.runtime_env.env_vars")
    extra = {str(k): str(v) for k, v in env_vars.items()} if isinstance(env_vars, Mapping) else {}
    return {**os.environ, **extra}


def _select(config: Any, key: str) -> Any:
    """``OmegaConf.select`` that also walks plain mappings; None when a part is missing."""
    if isinstance(config, DictConfig):
        from omegaconf.errors import OmegaConfBaseException

        try:
            return OmegaConf.select(config, key, default=None)
        except OmegaConfBaseException as exc:  # ${oc.env:NOPE} and the like: our error, naming the key
            raise unresolvable(exc, key) from None
    node = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node
