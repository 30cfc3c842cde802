"""``PipelinedRayPPOTrainer``: verl 0.9.x's ``RayPPOTrainer`` whose ``fit`` runs :class:`StepSchedule`.

The stages come from :class:`~async_reward.legacy.verl_backend.VerlScheduleBackend` (verl's own
methods, cut apart) and rewards from a ``PipelinedRewardLoopManager`` instead of verl's agent reward
loop: ``init_workers`` builds the rollout with
:class:`~async_reward.legacy.agent_loop.ScoreLaterAgentLoopManager`, so ``generate_sequences``
returns as soon as the last sample is generated and the schedule submits the batch for scoring. This
module is the trainer itself: worker set-up, ``fit`` (checkpoints, validation, logging) and the
start-up line naming the trainer and its mode.

Checkpoints: in the off-policy modes the next batch is already drawn when a step is saved, so
``data.pt`` holds the dataloader state from before that draw; a resumed run draws the batch again and
generates it with the resumed policy (one on-policy warm-up step), so no batch is skipped or repeated.
"""

from __future__ import annotations

from pprint import pprint
from types import SimpleNamespace
from typing import Any

import ray
from omegaconf import open_dict
from verl.trainer.ppo import ray_trainer as verl_trainer
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    compute_variance_proxy_metrics,
)
from verl.utils.checkpoint.checkpoint_manager import should_save_ckpt_esi
from verl.utils.debug import marked_timer
from verl.utils.skip.skip_manager import SkipManager

from async_reward._core.progress import progress_bar
from async_reward._core.redaction import redact_config
from async_reward.config.checks import check_reward
from async_reward.legacy.agent_loop import SCORE_LATER, ScoreLaterAgentLoopManager, ScoreValidation
from async_reward.legacy.rollout_settings import check_pipelined_rollout_settings
from async_reward.legacy.verl_backend import VerlScheduleBackend
from async_reward.training.config import load_pipeline_config
from async_reward.training.schedule import RewardSource, StepRecord, StepSchedule
from async_reward.wiring.integration import declare_pipelined_trainer

__all__ = ["PipelinedRayPPOTrainer", "ScoreLaterAgentLoopManager", "VerlScheduleBackend"]


class PipelinedRayPPOTrainer(verl_trainer.RayPPOTrainer):
    """verl's legacy ``RayPPOTrainer`` (``trainer.use_v1=False``) with pipelined rewards.

    Same constructor as verl's, plus ``reward_source`` (anything with ``submit`` / ``get_chunk`` /
    ``ticket_metrics``; default: a ``PipelinedRewardLoopManager`` built by ``init_workers``). The mode
    comes from ``async_reward.pipeline`` (:mod:`async_reward.training.config`), checked here,
    before datasets or workers are built.
    """

    def __init__(self, *args: Any, reward_source: RewardSource | None = None, **kwargs: Any) -> None:
        config = declare_pipelined_trainer(kwargs["config"] if "config" in kwargs else args[0])
        self.pipeline_config = load_pipeline_config(config)
        check_reward(config)  # bad reward settings and on_failure checks, before any worker
        check_pipelined_rollout_settings(config)  # an agent loop that scores, a v1 one: before workers
        super().__init__(*args, **kwargs)
        self.reward_source = reward_source
        self._owns_reward_source = False
        self._backend: VerlScheduleBackend | None = None
        # The one line that says which trainer trains, in which mode: a run whose log lacks it is
        # not running this trainer, whatever its pipeline settings say.
        print(f"async_reward: {self.start_line()}", flush=True)

    def start_line(self) -> str:
        """``trainer <module.Class>, pipeline mode <mode> (mini_batch=..., one_step_off_policy=...)``."""
        cls, pipeline = type(self), self.pipeline_config
        return (
            f"trainer {cls.__module__}.{cls.__qualname__}, pipeline mode {pipeline.mode} "
            f"(mini_batch={pipeline.mini_batch}, one_step_off_policy={pipeline.one_step_off_policy})"
        )

    def init_workers(self) -> None:
        """verl's workers, with the rollout built by :class:`ScoreLaterAgentLoopManager` (unless a
        custom ``agent_loop_manager_class`` is set, which must then not score either)."""
        agent = self.config.actor_rollout_ref.rollout.agent
        with open_dict(self.config):
            agent.agent_loop_manager_class = agent.get("agent_loop_manager_class") or SCORE_LATER
        super().init_workers()  # the manager class was checked in __init__
        # verl started RewardLoopWorkers for its agent reward loop; nothing uses them now.
        for handle in self.reward_loop_manager.reward_loop_workers:
            ray.kill(handle, no_restart=True)
        self.reward_loop_manager.reward_loop_workers = []
        if self.reward_source is None:
            from async_reward.legacy.manager import PipelinedRewardLoopManager

            # A judge served in the job (standalone): verl's RewardLoopManager started it and its
            # router; our workers score through that router.
            self.reward_source = PipelinedRewardLoopManager(
                self.config, reward_router_address=self.reward_loop_manager.reward_router_address
            )
            self._owns_reward_source = True

    def _validate(self, merged: bool = False) -> Any:
        rollout = self.async_rollout_manager
        if self._backend is not None:
            self._backend.sync_rollout()
        self.async_rollout_manager = ScoreValidation(rollout, self._rewards())
        try:
            return super()._validate(merged)
        finally:
            self.async_rollout_manager = rollout

    def _save_checkpoint(self) -> None:
        state = self._backend.loader_state_before(self.global_steps) if self._backend else None
        if state is None:  # the next batch is not drawn yet: the live state is the right one
            super()._save_checkpoint()
            return
        # verl's _save_checkpoint reads only train_dataloader.state_dict(): show it the earlier state.
        loader, self.train_dataloader = self.train_dataloader, SimpleNamespace(state_dict=lambda: state)
        try:
            super()._save_checkpoint()
        finally:
            self.train_dataloader = loader

    def fit(self) -> None:
        """verl's training loop over :class:`StepSchedule`: same checkpoint, validation, logging and
        metric conventions (``global_steps`` from 1, ``timing_s/*``), plus ``off_policy/*``,
        ``pipeline/*`` and the reward tickets' ``reward/*`` metrics."""
        from verl.utils.tracking import Tracking

        if self._dump_executor._shutdown:
            self._init_dump_executor()
        config = self.config
        logger = Tracking(
            project_name=config.trainer.project_name,
            experiment_name=config.trainer.experiment_name,
            default_backend=config.trainer.logger,
            config=redact_config(config),  # what wandb / mlflow store: no keys, no header values
        )
        self.global_steps = 0
        self._load_checkpoint()
        first = self.global_steps
        pipelined = self.pipeline_config.mini_batch
        backend = VerlScheduleBackend(
            self, first, per_chunk_balance=pipelined and config.trainer.balance_batch
        )
        self._backend = backend
        SkipManager.init(config)
        try:
            if config.trainer.get("val_before_train", True):
                val_metrics = self._validate()
                pprint(f"Initial validation metrics: {val_metrics}")
                logger.log(data=val_metrics, step=self.global_steps)
                if config.trainer.get("val_only", False):
                    return
            last = min(self.total_training_steps, len(self.train_dataloader) * config.trainer.total_epochs)
            actor = config.actor_rollout_ref.actor
            schedule = StepSchedule(
                backend,
                self._rewards(),
                self.pipeline_config.mode,
                mini_batches=config.data.train_batch_size // actor.ppo_mini_batch_size if pipelined else 1,
                chunk_timeout_s=self.pipeline_config.chunk_timeout_s,
                adv_estimator=str(config.algorithm.adv_estimator),
                assume_group_local=self.pipeline_config.assume_group_local,
                # verl's actor splits each update call into these; exclude must leave none empty
                optimizer_rows=actor.ppo_mini_batch_size * config.actor_rollout_ref.rollout.n,
            )
            progress = progress_bar(self.total_training_steps, initial=first, desc="Training Progress")
            self.global_steps, self.max_steps_duration = first + 1, 0
            for record in schedule.steps(max(0, last - first), first_step=first):
                # The actor is updated: validation's weight sync inside _finish_step carries this version.
                backend.version = record.step + 1
                self._finish_step(record, backend, logger, is_last=self.global_steps >= last)
                progress.update(1)
                self.global_steps += 1
                if hasattr(self.train_dataset, "on_batch_end"):
                    self.train_dataset.on_batch_end(batch=record.batch)
            progress.close()
        finally:
            self._backend = None
            self._shutdown_dump_executor()
            if self._owns_reward_source:
                self.reward_source.close()  # type: ignore[union-attr]
                self.reward_source, self._owns_reward_source = None, False

    def _finish_step(
        self, record: StepRecord, backend: VerlScheduleBackend, logger: Any, is_last: bool
    ) -> None:
        """Checkpoint, validate and log one finished step, as verl's ``fit`` does after its update."""
        config, timing = self.config, dict[str, float]()
        finalize = getattr(self.actor_rollout_wg, "async_calls_finalize_fn_exec", None)  # async saves
        if finalize is not None:
            finalize(blocking=False)
        self.max_steps_duration = max(self.max_steps_duration, record.duration)
        esi_expiring = should_save_ckpt_esi(
            max_steps_duration=self.max_steps_duration, redundant_time=config.trainer.esi_redundant_time
        )
        if config.trainer.save_freq > 0 and (
            is_last or self.global_steps % config.trainer.save_freq == 0 or esi_expiring
        ):
            with marked_timer("save_checkpoint", timing):
                self._save_checkpoint()
            if is_last and finalize is not None:
                finalize(blocking=True)  # as verl's fit: the last save is finished before fit returns
        metrics = backend.pop_metrics(record.step)
        if config.trainer.test_freq > 0 and (is_last or self.global_steps % config.trainer.test_freq == 0):
            with marked_timer("testing", timing):
                metrics.update(self._validate())
        batch = record.batch
        assert batch is not None
        raw = {
            k.removeprefix("timing_s/"): v
            for k, v in {**metrics, **record.metrics}.items()
            if k.startswith("timing_s/")
        }
        raw.update(timing)
        metrics.update(compute_timing_metrics(batch=batch, timing_raw=raw))
        metrics.update(record.metrics)
        epoch = backend.epochs.pop(record.step)
        metrics.update({"training/global_step": self.global_steps, "training/epoch": epoch})
        metrics.update(compute_data_metrics(batch=batch, use_critic=self.use_critic))
        n_gpus = self.resource_pool_manager.get_n_gpus()
        metrics.update(compute_throughout_metrics(batch=batch, timing_raw=raw, n_gpus=n_gpus))
        metrics.update(
            compute_variance_proxy_metrics(batch=batch, gradient_norm=metrics.get("actor/grad_norm"))  # type: ignore[arg-type]
        )
        spec = ("spec_num_draft_tokens", "spec_num_accepted_tokens", "spec_num_verify_steps")
        metrics.update(
            verl_trainer.compute_spec_decode_metrics(*(batch.non_tensor_batch.get(k) for k in spec))
        )
        if config.trainer.get("rollout_data_dir", None):
            extras = {k: batch.non_tensor_batch[k] for k in batch.meta_info.get("reward_extra_keys", [])}
            self._log_rollout_data(batch, extras, timing, config.trainer.rollout_data_dir)
        logger.log(data=metrics, step=self.global_steps)

    def _rewards(self) -> RewardSource:
        if self.reward_source is None:
            raise RuntimeError("no reward source: call init_workers() or pass reward_source=")
        return self.reward_source
