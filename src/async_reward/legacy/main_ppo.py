"""``python -m async_reward.legacy.main_ppo``: verl's ``main_ppo`` with the pipelined trainer.

Deprecated: it warns once (:data:`DEPRECATION`) and names the v1 line, our v1 trainer mode
(``trainer.v1.trainer_mode=pipelined``, :mod:`async_reward.v1.pipelined.trainer`), which runs the same
schedules on verl's default trainer. It stays, tested, while verl ships its legacy trainer.

Takes verl's own configs (``ppo_trainer`` by default, ``--config-name ppo_megatron_trainer`` for
Megatron) and the same overrides, plus ``+async_reward.pipeline.*`` (see
:mod:`async_reward.training.config`)::

    python -m async_reward.legacy.main_ppo \\
        reward_model.reward_manager=llm_judge \\
        +reward.async_reward.judge.base_url=http://judge:8000/v1 \\
        +async_reward.pipeline.mini_batch=true +async_reward.pipeline.one_step_off_policy=true

What it adds to verl's ``main``: the legacy ``reward_model.*`` reward keys are honoured
(:func:`~async_reward.wiring.integration.prepare_verl_config`), our managers are registered in every Ray
worker process (setup hook), the pipeline settings are checked before Ray starts, and verl's
``run_ppo`` (Ray start-up) starts :class:`~async_reward.legacy.task_runner.PipelinedTaskRunner`,
which builds :class:`~async_reward.legacy.trainer.PipelinedRayPPOTrainer` explicitly. Nothing here
depends on how Ray ships classes to the task-runner actor (this module is ``__main__`` under
``python -m``): the runner class lives in its own module.

Nothing it or verl prints shows a key: verl's ``run_ppo`` prints the Ray ``runtime_env`` (with
``env_vars``) and its task runner the config, so ``run`` writes through
:func:`~async_reward._core.redaction.redacted_output`.

``+async_reward.pipeline.dry_run=true`` builds the trainer inside the task-runner actor, prints what
was built (class, mode, actor) and exits 0 without starting workers.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import hydra
from omegaconf import DictConfig
from verl.trainer.main_ppo import run_ppo

from async_reward._core.config_rules import names_config_errors
from async_reward._core.redaction import redacted_output
from async_reward.config import ConfigError
from async_reward.legacy import task_runner as _task_runner
from async_reward.legacy.rollout_settings import check_pipelined_rollout_settings
from async_reward.legacy.task_runner import DryRunComplete, PipelinedTaskRunnerActor, TrainerReport
from async_reward.training.config import load_pipeline_config
from async_reward.wiring.integration import declare_pipelined_trainer, prepare_verl_config

__all__ = ["DEPRECATION", "PipelinedTaskRunner", "main", "prepare_config", "run"]

logger = logging.getLogger(__name__)

PipelinedTaskRunner = PipelinedTaskRunnerActor
"""The Ray actor class ``run_ppo`` starts, under its 0.1.0 name (``run_ppo(config,
task_runner_class=PipelinedTaskRunner)`` keeps working). To subclass, use the plain class
:class:`async_reward.legacy.task_runner.PipelinedTaskRunner`."""


@names_config_errors("async_reward")
def prepare_config(config: DictConfig) -> DictConfig:
    """What ``main`` does to verl's composed config before Ray starts; raises ``ConfigError`` early."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    check_pipelined_rollout_settings(config)  # the README's verl-v1 lines, refused before any worker
    if config.trainer.get("use_v1", False):
        logger.warning(
            "async_reward: trainer.use_v1=true (verl's default, or yours) is overridden to false: "
            "PipelinedRayPPOTrainer extends verl's legacy trainer, so trainer.v1.* settings are ignored"
        )
    declare_pipelined_trainer(config)  # legacy trainer (use_v1=false), which honours on_failure: exclude
    config = prepare_verl_config(config)
    load_pipeline_config(config)
    validate_config(
        config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    return config


def run(config: DictConfig, task_runner_class: Any = PipelinedTaskRunnerActor) -> TrainerReport | None:
    """Train with ``config`` (verl's, composed): :func:`prepare_config`, then verl's ``run_ppo`` with
    our task runner (``task_runner_class``: a :class:`PipelinedTaskRunner` subclass, plain or
    ``ray.remote``-wrapped).

    Returns None after training; with ``async_reward.pipeline.dry_run=true``, the report of what the
    task runner built, once it is printed.

    Raises:
        ConfigError: a bad setting, or a task runner that is not a ``PipelinedTaskRunner`` (it would
            not build our trainer).
    """
    plain = getattr(task_runner_class, "__ray_actor_class__", task_runner_class)
    if not (isinstance(plain, type) and issubclass(plain, _task_runner.PipelinedTaskRunner)):
        raise ConfigError(
            f"task_runner_class={task_runner_class!r} is not a PipelinedTaskRunner: it would not build "
            "PipelinedRayPPOTrainer, and async_reward.pipeline would be ignored"
        )
    if plain is task_runner_class:
        import ray

        task_runner_class = ray.remote(plain)
    # verl's run_ppo prints the Ray runtime_env, every env_vars value included, before ray.init: a
    # key passed to the workers there would be on the console. All we and verl print is redacted.
    with redacted_output(config):
        config = prepare_config(config)
        try:
            run_ppo(config, task_runner_class=task_runner_class)
        except DryRunComplete as stop:  # from the actor; Ray's wrapper of it passes ``report`` through
            print(
                f"async_reward: dry run: built {stop.report}; no workers started, nothing trained", flush=True
            )
            return stop.report
    return None


#: What ``python -m async_reward.legacy.main_ppo`` warns, once per process (a ``FutureWarning``,
#: which Python shows by default): the same schedules run as a mode of verl's v1 trainer, measured at
#: parity or better in every regime of the benchmark (README, "Performance").
DEPRECATION = (
    "async_reward: python -m async_reward.legacy.main_ppo (our schedules on verl's legacy trainer, "
    "which verl has frozen) is deprecated. The same schedules run on verl's default v1 trainer, as "
    "fast in every regime measured: python -m verl.trainer.main_ppo trainer.use_v1=true "
    "trainer.v1.trainer_mode=pipelined (mini-batch updates and one-step off-policy are its defaults; "
    "+trainer.v1.pipelined.max_staleness=0 is on-policy) plus the README's quick-start lines "
    "(docs/v1-pipelined-mode.md). This entry point keeps working, and tested, while verl ships its "
    "legacy trainer."
)


@hydra.main(config_path="pkg://verl.trainer.config", config_name="ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    warnings.warn(DEPRECATION, FutureWarning, stacklevel=1)  # once: the default filter, per location
    run(config)


if __name__ == "__main__":
    main()
