"""Wiring async-reward into verl: the Ray setup hook, the runtime env and the config preparers.

verl resolves ``reward.reward_manager.name`` in its task runner (``RewardLoopManager.__init__``) *and*
inside every ``RewardLoopWorker`` Ray process (``load_reward_manager``), and looks the trainer mode up
in its task runner. Installed, the package is a verl plugin (:mod:`async_reward.wiring.verl_plugin`): every
process that imports verl registers our managers and modes, and nothing needs adding to verl's
command line. Where verl's plugins are off (``VERL_USE_EXTERNAL_PLUGINS=none``), Ray's
``worker_process_setup_hook`` installs the same in every worker process::

    +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=async_reward.wiring.integration.setup_worker

verl's own ``main_ppo`` never calls ``migrate_legacy_reward_impl``, so the legacy
``reward_model.reward_manager=llm_judge`` key would be ignored there. The plugin (or the hook) applies
it where verl builds its trainer (before any GPU worker) and its ``RewardLoopManager``, then runs the
start-up checks (``async_reward.v1.checks.apply_legacy_and_check``); a legacy key that verl reads
earlier (the reward model's resources) is refused there, naming the new key.
:func:`prepare_verl_config` applies verl's whole migration, adds the hook and runs every check; our
deprecated entry point calls it. :func:`prepare_v1_config` does the same for verl's v1 trainer, with
:data:`V1_OVERRIDES`. What is refused, and why, is ``async_reward.config.checks``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, open_dict

from async_reward._core.config_rules import bad_value, names_config_errors, plain_container, select_key
from async_reward._core.errors import ConfigError
from async_reward.config.checks import check_reward
from async_reward.config.v1 import (
    AGENT_LOOP_MANAGER,
    PIPELINED_TRAINER_KEY,
    REPLAY_BUFFER_NAME,
    REPLAY_BUFFER_PATH,
    uses_reward_replay_buffer,
)
from async_reward.config.verl_keys import apply_legacy_reward_keys
from async_reward.v1.checks import check_v1
from async_reward.v1.decoupled.config import is_decoupled_mode
from async_reward.v1.pipelined.config import is_pipelined_mode
from async_reward.wiring.verl_plugin import VERL_TRAINERS, VERL_V1_TRAINER_MODULE, install

__all__ = [
    "SETUP_HOOK",
    "V1_OVERRIDES",
    "VERL_TRAINERS",
    "VERL_V1_TRAINER_MODULE",
    "declare_pipelined_trainer",
    "init_local_ray",
    "install_judge_in_job_hooks",
    "prepare_v1_config",
    "prepare_verl_config",
    "ray_runtime_env",
    "setup_worker",
]

#: Import path of the Ray worker setup hook.
SETUP_HOOK = "async_reward.wiring.integration.setup_worker"
#: What :func:`prepare_v1_config` sets, as command-line overrides: the setup hook and verl v1's two
#: seams that the plugin implies for our managers under verl's own modes (a job without the plugin
#: adds them; the tests compose verl's config with exactly these).
V1_OVERRIDES: tuple[str, ...] = (
    f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}",
    f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={AGENT_LOOP_MANAGER}",
    f"trainer.v1.sampler.custom_sampler.path={REPLAY_BUFFER_PATH}",
    f"trainer.v1.sampler.custom_sampler.name={REPLAY_BUFFER_NAME}",
)


def setup_worker() -> None:
    """Ray ``worker_process_setup_hook``: what our verl plugin installs
    (:func:`async_reward.wiring.verl_plugin. install`), for a process where verl's plugins are off
    (``VERL_USE_EXTERNAL_PLUGINS``) or a launcher that wants the line explicit. Idempotent beside the plugin:
    both install the same hooks, once.

    Registers our managers in verl's registry once verl loads it in this process, and our ``pipelined``
    and ``decoupled`` verl v1 trainer modes where verl looks a mode up; where verl builds its trainer
    (before its GPU workers) and its ``RewardLoopManager``, a config that asks for async-reward gets
    the legacy ``reward_model.*`` reward keys applied, the v1 seams implied and the reward settings
    checked. Nothing of verl is imported here: a worker that never loads verl starts as fast as
    without the hook (:mod:`async_reward.wiring.worker_imports`)."""
    install()


def install_judge_in_job_hooks() -> None:
    """What the setup hook installs for a judge served in the job, for a process that builds verl's
    ``RewardLoopManager`` or v1 trainer without it (a launcher of your own, a test driver): our reward
    worker and the standalone judge's wake-up (:func:`async_reward.judge.in_job.routing.
    install_reward_loop_hooks`) and verl v1's colocated scoring step for our managers."""
    import importlib

    from async_reward.judge.in_job.routing import install_reward_loop_hooks
    from async_reward.v1.colocated_judge import install_colocate_step

    install_reward_loop_hooks()
    install_colocate_step(importlib.import_module(VERL_V1_TRAINER_MODULE))


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
    and its new key set to different values is a ``ConfigError``), adds our setup hook to
    ``ray_kwargs.ray_init.runtime_env``, then :func:`~async_reward.config.checks.check_reward`. Returns the
    same (mutated) config.

    Raises:
        ConfigError: a reward setting a worker would refuse, or ``on_failure: exclude`` for a trainer
            that cannot honour it (call :func:`declare_pipelined_trainer` first when ours trains).
    """
    if _has_legacy_reward_keys(config):
        apply_legacy_reward_keys(config, late=False)  # verl's migration, a conflict refused
    with open_dict(config):
        if config.get("ray_kwargs") is None:
            config.ray_kwargs = {}
        if config.ray_kwargs.get("ray_init") is None:
            config.ray_kwargs.ray_init = {}
        current = config.ray_kwargs.ray_init.get("runtime_env")
        current_dict = plain_container(current, "ray_kwargs.ray_init.runtime_env")
        config.ray_kwargs.ray_init.runtime_env = ray_runtime_env(current_dict)
    check_reward(config)
    return config


@names_config_errors("async_reward")
def declare_pipelined_trainer(config: DictConfig) -> DictConfig:
    """Mark ``config`` as trained by ``PipelinedRayPPOTrainer`` (adds an empty ``async_reward.pipeline``
    node when absent), so :func:`~async_reward.config.checks.check_on_failure` admits ``on_failure:
    exclude``, and set ``trainer.use_v1=false`` (ours is verl's legacy trainer). Our entry point and the
    trainer
    call it; returns the same config."""
    top = config.get("async_reward")
    if top is not None and not isinstance(top, (DictConfig, Mapping)):
        raise bad_value(
            "async_reward",
            top,
            "is not a mapping",
            "write the pipelined trainer's settings under it, e.g. +async_reward.pipeline.mini_batch=true",
        )
    if select_key(config, PIPELINED_TRAINER_KEY) is None:
        with open_dict(config):
            if config.get("async_reward") is None:
                config.async_reward = {}
            config.async_reward.pipeline = {}
    if select_key(config, "trainer.use_v1"):  # ours extends verl's legacy trainer; v1 refuses the pipeline
        with open_dict(config):
            config.trainer.use_v1 = False
    return config


@names_config_errors("trainer")
def prepare_v1_config(config: DictConfig) -> DictConfig:
    """Everything :data:`V1_OVERRIDES` sets, for a launcher that builds verl's config in code.

    Names our agent-loop manager and replay buffer, then runs :func:`async_reward.prepare_verl_config`
    (legacy reward keys, worker setup hook, every start-up check). Refuses to replace a different
    agent-loop manager or custom sampler the user configured: Ray-side behaviour must not change
    silently.
    Returns the same (mutated) config.

    Raises:
        ConfigError: see :func:`~async_reward.v1.checks.check_v1`, and the replacements above.
    """
    check_v1(config)
    if is_pipelined_mode(config):  # registers trainer_mode=pipelined in this (the launcher's) process
        import async_reward.v1.pipelined.trainer
    if is_decoupled_mode(config):  # the same for trainer_mode=decoupled
        import async_reward.v1.decoupled.trainer  # noqa: F401
    with open_dict(config):
        agent = config.actor_rollout_ref.rollout.agent
        current = agent.get("agent_loop_manager_class")
        if current not in (None, AGENT_LOOP_MANAGER):
            raise ConfigError(
                f"actor_rollout_ref.rollout.agent.agent_loop_manager_class is already {current}; "
                f"async-reward's v1 integration needs {AGENT_LOOP_MANAGER} (subclass it to combine both)"
            )
        agent.agent_loop_manager_class = AGENT_LOOP_MANAGER
        sampler = select_key(config, "trainer.v1.sampler")
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
