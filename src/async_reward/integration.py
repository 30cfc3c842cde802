"""Making our managers resolvable everywhere verl looks them up.

verl resolves ``reward.reward_manager.name`` in the driver (``RewardLoopManager.__init__``) *and*
inside every ``RewardLoopWorker`` Ray process (``load_reward_manager``). Registration happens on
import, so ``async_reward`` must be imported in those worker processes too. Ray's
``worker_process_setup_hook`` does exactly that; it is the one line a user adds::

    ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=async_reward.integration.setup_worker

(verl's ``main_ppo`` merges ``ray_kwargs.ray_init.runtime_env`` into its ``ray.init``).

verl's own ``main_ppo`` never calls ``migrate_legacy_reward_impl``, so the legacy
``reward_model.reward_manager=llm_judge`` key is silently ignored there. ``prepare_verl_config``
applies verl's migration and adds the hook; our entry point calls it.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

__all__ = ["SETUP_HOOK", "init_local_ray", "prepare_verl_config", "ray_runtime_env", "setup_worker"]

#: Import path of the Ray worker setup hook.
SETUP_HOOK = "async_reward.integration.setup_worker"


def setup_worker() -> None:
    """Ray ``worker_process_setup_hook``: importing the package registers our managers."""
    import async_reward  # noqa: F401


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


def prepare_verl_config(config: DictConfig) -> DictConfig:
    """Honour the legacy ``reward_model.*`` reward keys and register our managers in Ray workers.

    Runs verl's own ``migrate_legacy_reward_impl`` (when the legacy section is present) and adds our
    setup hook to ``ray_kwargs.ray_init.runtime_env``. Returns the same (mutated) config.
    """
    if _has_legacy_reward_keys(config):
        from verl.experimental.reward_loop.reward_loop import migrate_legacy_reward_impl

        config = migrate_legacy_reward_impl(config)
    with open_dict(config):
        if config.get("ray_kwargs") is None:
            config.ray_kwargs = {}
        if config.ray_kwargs.get("ray_init") is None:
            config.ray_kwargs.ray_init = {}
        current = config.ray_kwargs.ray_init.get("runtime_env")
        current_dict = (
            OmegaConf.to_container(current, resolve=True) if isinstance(current, DictConfig) else current
        )
        config.ray_kwargs.ray_init.runtime_env = ray_runtime_env(current_dict)  # type: ignore[arg-type]
    return config
