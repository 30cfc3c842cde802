"""``python -m async_reward.pipeline.main_ppo``: verl's ``main_ppo`` with the pipelined trainer.

Takes verl's own configs (``ppo_trainer`` by default, ``--config-name ppo_megatron_trainer`` for
Megatron) and the same overrides, plus ``+async_reward.pipeline.*`` (see
:mod:`async_reward.pipeline.trainer_config`)::

    python -m async_reward.pipeline.main_ppo \\
        reward_model.reward_manager=llm_judge \\
        +reward.async_reward.judge.base_url=http://judge:8000/v1 \\
        +async_reward.pipeline.mini_batch=true +async_reward.pipeline.one_step_off_policy=true

What it adds to verl's ``main``: the legacy ``reward_model.*`` reward keys are honoured
(:func:`~async_reward.integration.prepare_verl_config`), our managers are registered in every Ray
worker process (setup hook), the pipeline settings are checked before Ray starts, and the legacy
trainer runs (``trainer.use_v1=false``, the trainer the pipeline subclasses) with
:class:`~async_reward.pipeline.trainer.PipelinedRayPPOTrainer` in place of ``RayPPOTrainer``.
Everything else is verl's: ``run_ppo`` (Ray start-up) and its ``TaskRunner`` (workers, datasets).
"""

from __future__ import annotations

from typing import Any

import hydra
import ray
from omegaconf import DictConfig, open_dict
from verl.trainer.main_ppo import run_ppo
from verl.trainer.main_ppo_v0 import TaskRunner as _VerlTaskRunner

from async_reward.integration import declare_pipelined_trainer, prepare_verl_config
from async_reward.pipeline.trainer_config import load_pipeline_config

__all__ = ["PipelinedTaskRunner", "main", "prepare_config", "run"]


class _PipelinedTaskRunner(_VerlTaskRunner.__ray_actor_class__):  # type: ignore[name-defined]
    """verl's legacy ``TaskRunner`` building our trainer instead of ``RayPPOTrainer``."""

    def run(self, config: DictConfig) -> Any:
        import verl.trainer.main_ppo_v0 as task_module

        from async_reward.pipeline.trainer import PipelinedRayPPOTrainer

        # verl's run() builds ``RayPPOTrainer`` by module-global name. This runs in the task runner's
        # own Ray actor process, so rebinding the name there changes nothing anywhere else; the
        # alternative is a copy of verl's 80-line run().
        original = task_module.RayPPOTrainer
        setattr(task_module, "RayPPOTrainer", PipelinedRayPPOTrainer)  # noqa: B010
        try:
            return super().run(config)
        finally:
            setattr(task_module, "RayPPOTrainer", original)  # noqa: B010


PipelinedTaskRunner = ray.remote(_PipelinedTaskRunner)
"""The Ray actor class ``run_ppo`` starts."""


def prepare_config(config: DictConfig) -> DictConfig:
    """What ``main`` does to verl's composed config before Ray starts; raises ``ConfigError`` early."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    declare_pipelined_trainer(config)  # our trainer honours on_failure: exclude (checked next)
    config = prepare_verl_config(config)
    with open_dict(config):
        config.trainer.use_v1 = False
    load_pipeline_config(config)
    validate_config(
        config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    return config


def run(config: DictConfig) -> None:
    """Train with ``config`` (verl's, composed): ``prepare_config`` then verl's ``run_ppo``."""
    run_ppo(prepare_config(config), task_runner_class=PipelinedTaskRunner)


@hydra.main(config_path="pkg://verl.trainer.config", config_name="ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run(config)


if __name__ == "__main__":
    main()
