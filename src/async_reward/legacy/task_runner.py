"""``PipelinedTaskRunner``: the Ray task runner that builds and trains ``PipelinedRayPPOTrainer``.

verl's ``run_ppo(config, task_runner_class)`` starts the task runner as a Ray actor and calls its
``run(config)``. verl's own ``TaskRunner.run`` builds ``RayPPOTrainer`` by its module-global name and
trains in the same call, so the only way to get another trainer out of it is to rebind that name,
and that does not survive Ray (issue 8): a class that cannot be found again by module and name (one
in ``__main__`` under ``python -m``, or verl's ``TaskRunner`` itself, whose module name is bound to
Ray's ActorClass wrapper) is shipped to the actor by value, and a function shipped by value reads a
private copy of its globals, so verl's trainer trained and every pipeline option was ignored.

Here the trainer class is an attribute of the runner class (:attr:`PipelinedTaskRunner.trainer_class`)
and ``run`` constructs it directly, whatever way the class reaches the actor (by reference, by value,
as a subclass in a user's launcher). The steps around it are verl's own ``BaseTaskRunner`` methods and
dataset helpers, called in the order of verl's ``TaskRunner.run``; that order is mirrored (about 30
lines) because verl offers no call that builds its trainer's arguments without also training.

Loud, not silent: the runner refuses to train with anything but a ``PipelinedRayPPOTrainer``, and the
trainer prints one line naming its class and mode when it is built. With
``async_reward.pipeline.dry_run=true`` the runner stops after building the trainer (no workers, no
GPUs) and reports what it built by raising :class:`DryRunComplete`, the one way back to the driver
through verl's ``run_ppo``, which drops ``run``'s return value.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pprint import pprint
from typing import Any, ClassVar

import ray
from omegaconf import DictConfig, OmegaConf
from verl.trainer.main_ppo_v0 import BaseTaskRunner

from async_reward._core.redaction import redact_config
from async_reward.legacy.trainer import PipelinedRayPPOTrainer
from async_reward.training.config import load_pipeline_config

__all__ = [
    "DryRunComplete",
    "PipelinedTaskRunner",
    "PipelinedTaskRunnerActor",
    "TrainerReport",
    "check_trainer",
]


@dataclass(frozen=True)
class TrainerReport:
    """What a task runner built: the trainer's class, its pipeline mode, and where it lives."""

    trainer_class: str
    """``module.QualifiedName`` of the trainer object's class."""
    mode: str
    """``baseline``, ``mini_batch``, ``one_step_off`` or ``both``."""
    actor_id: str | None
    """The Ray actor the trainer was built in (None outside a Ray actor)."""
    pid: int
    """That process."""

    def __str__(self) -> str:
        where = f"Ray actor {self.actor_id}" if self.actor_id else "no Ray actor"
        return f"{self.trainer_class}, pipeline mode {self.mode}, in {where} (pid {self.pid})"


class DryRunComplete(Exception):  # a stop signal, like StopIteration, not an error
    """Raised by :meth:`PipelinedTaskRunner.run` when ``async_reward.pipeline.dry_run=true``: the
    trainer was built and checked, nothing was trained. ``report`` says what was built."""

    def __init__(self, report: TrainerReport) -> None:
        super().__init__(
            f"dry run (async_reward.pipeline.dry_run=true): built {report}; stopped before init_workers"
        )
        self.report = report

    def __reduce__(self) -> tuple[Any, ...]:  # Ray ships it back to the driver by pickling
        return (type(self), (self.report,))


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def check_trainer(trainer: object, config: DictConfig | None = None) -> None:
    """Refuse to train with anything but a :class:`PipelinedRayPPOTrainer`.

    Any other ``RayPPOTrainer`` trains in verl's order and ignores ``async_reward.pipeline`` without a
    word; this is the error that says so instead.

    Raises:
        TypeError: naming the class that was built and the mode that would have been ignored.
    """
    if isinstance(trainer, PipelinedRayPPOTrainer):
        return
    mode = load_pipeline_config(config).mode if config is not None else "unknown"
    raise TypeError(
        f"the task runner built {_class_path(type(trainer))}, not a PipelinedRayPPOTrainer: it would "
        f"ignore async_reward.pipeline (mode {mode}) and train in verl's own order. Set "
        "PipelinedTaskRunner.trainer_class to PipelinedRayPPOTrainer or a subclass of it"
    )


class PipelinedTaskRunner(BaseTaskRunner):
    """verl's task runner pieces, building :attr:`trainer_class` (our trainer) explicitly.

    Start it as verl starts its own, ``run_ppo(config, task_runner_class=PipelinedTaskRunnerActor)``
    (what ``async_reward.legacy.main_ppo.run`` does), or ``ray.remote`` a subclass of it. For your
    own trainer, subclass both::

        class MyRunner(PipelinedTaskRunner):
            trainer_class = MyPipelinedTrainer      # a PipelinedRayPPOTrainer subclass
    """

    trainer_class: ClassVar[type[Any]] = PipelinedRayPPOTrainer
    """The trainer ``run`` builds; it must be a :class:`PipelinedRayPPOTrainer` (checked)."""

    def run(self, config: DictConfig) -> None:
        """Build the trainer as verl's ``TaskRunner.run`` does, check it, then train.

        Raises:
            DryRunComplete: with ``async_reward.pipeline.dry_run=true``, once the trainer is built.
            TypeError: when :attr:`trainer_class` built something else (:func:`check_trainer`).
        """
        print(f"TaskRunner hostname: {socket.gethostname()}, PID: {os.getpid()}")
        pprint(redact_config(config))  # verl's runner prints every value; ours hides keys and headers
        OmegaConf.resolve(config)
        trainer = self.build_trainer(config)
        check_trainer(trainer, config)
        if trainer.pipeline_config.dry_run:
            raise DryRunComplete(self.report(trainer))
        trainer.init_workers()
        trainer.fit()

    def build_trainer(self, config: DictConfig) -> Any:
        """Workers, resource pools, tokenizer and datasets as verl's ``TaskRunner.run`` makes them,
        then :attr:`trainer_class` (nothing is started: ``init_workers`` does that)."""
        from verl.trainer.ppo.utils import (
            create_rl_dataset,
            create_rl_sampler,
            need_critic,
            need_reference_policy,
        )
        from verl.utils.config import omega_conf_to_dataclass, validate_config
        from verl.utils.dataset.rl_dataset import collate_fn

        actor_rollout_cls, ray_worker_group_cls = self.add_actor_rollout_worker(config)
        self.add_critic_worker(config)
        self.add_reward_model_resource_pool(config)
        self.add_teacher_model_resource_pool(config)
        self.add_ref_policy_worker(config, actor_rollout_cls)
        validate_config(
            config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
        )
        model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        tokenizer, processor = model_config.tokenizer, model_config.processor
        resource_pool_manager = self.init_resource_pool_mgr(config)
        train_dataset = create_rl_dataset(
            config.data.train_files,
            config.data,
            tokenizer,
            processor,
            is_train=True,
            max_samples=config.data.get("train_max_samples", -1),
        )
        val_dataset = create_rl_dataset(
            config.data.val_files,
            config.data,
            tokenizer,
            processor,
            is_train=False,
            max_samples=config.data.get("val_max_samples", -1),
        )
        return self.trainer_class(
            config=config,
            tokenizer=tokenizer,
            processor=processor,
            role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=resource_pool_manager,
            ray_worker_group_cls=ray_worker_group_cls,
            train_dataset=train_dataset,
            val_dataset=val_dataset,
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train_dataset),
        )

    @staticmethod
    def report(trainer: PipelinedRayPPOTrainer) -> TrainerReport:
        """What was built, and where (the Ray actor this runs in, if any)."""
        actor_id = ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None
        return TrainerReport(_class_path(type(trainer)), trainer.pipeline_config.mode, actor_id, os.getpid())


PipelinedTaskRunnerActor = ray.remote(PipelinedTaskRunner)
"""The Ray actor class ``run_ppo`` starts."""
