"""``PipelinedRayPPOTrainer``: verl 0.9.x's ``RayPPOTrainer`` whose ``fit`` runs :class:`StepSchedule`.

verl's ``fit`` is one long loop; the schedule needs its stages as separate calls. ``VerlScheduleBackend``
cuts them out of verl's own methods (``_get_gen_batch``, ``_balance_batch``,
``_compute_old_log_prob``, ``_compute_ref_log_prob``, ``_compute_values``, ``compute_advantage``,
``_update_critic``, ``_update_actor``), which only call worker-group methods the FSDP2 and Megatron
engine workers share, so both strategies run unchanged. Rewards come from a
``PipelinedRewardLoopManager`` instead of verl's agent reward loop: ``init_workers`` builds the rollout
with :class:`ScoreLaterAgentLoopManager`, so ``generate_sequences`` returns as soon as the last sample
is generated and the schedule submits the batch for scoring.

Checkpoints: in the off-policy modes the next batch is already drawn when a step is saved, so
``data.pt`` holds the dataloader state from before that draw; a resumed run draws the batch again and
generates it with the resumed policy (one on-policy warm-up step), so no batch is skipped or repeated.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from pprint import pprint
from types import SimpleNamespace
from typing import Any

import numpy as np
import ray
import torch
from omegaconf import OmegaConf, open_dict
from tqdm import tqdm
from verl import DataProto
from verl.experimental.agent_loop import AgentLoopManager
from verl.trainer.ppo import ray_trainer as verl_trainer
from verl.trainer.ppo.core_algos import agg_loss
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    compute_variance_proxy_metrics,
)
from verl.utils.checkpoint.checkpoint_manager import should_save_ckpt_esi
from verl.utils.debug import marked_timer
from verl.utils.metric import reduce_metrics
from verl.utils.skip.skip_manager import SkipManager

from async_reward.config import ConfigError
from async_reward.integration import check_reward_config, declare_pipelined_trainer
from async_reward.pipeline.schedule import RewardSource, StepRecord, StepSchedule
from async_reward.pipeline.trainer_config import load_pipeline_config

__all__ = ["PipelinedRayPPOTrainer", "ScoreLaterAgentLoopManager", "VerlScheduleBackend"]

_STEP_KEY = "async_reward_step"  # meta_info: the schedule step a batch belongs to
_SCORE_LATER = f"{__name__}.ScoreLaterAgentLoopManager"


class ScoreLaterAgentLoopManager(AgentLoopManager):
    """verl's ``AgentLoopManager`` with the agent reward loop off: its workers get no reward handles,
    so ``generate_sequences`` does not wait for scores and returns the input's non-tensor fields
    (``uid``, ``reward_model``, ...) for the pipeline to score with."""

    def __init__(
        self, config: Any, llm_client: Any, teacher_client: Any = None, reward_loop_worker_handles: Any = None
    ) -> None:
        super().__init__(config, llm_client, teacher_client, reward_loop_worker_handles=None)  # type: ignore[arg-type]


class _ScoreValidation:
    """The rollout manager, plus rewards for validation batches: verl's ``_validate`` reads
    ``rm_scores`` from the rollout's output, which the agent reward loop no longer fills."""

    def __init__(self, inner: Any, rewards: RewardSource) -> None:
        self._inner, self._rewards = inner, rewards

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        output = self._inner.generate_sequences(prompts)
        if prompts.meta_info.get("validate") and "rm_scores" not in output.batch:
            chunk = self._rewards.get_chunk(self._rewards.submit(output), len(output))
            output.batch["rm_scores"] = chunk.rm_scores  # indices are all of them, sorted
            output.non_tensor_batch.update({k: np.asarray(v) for k, v in chunk.reward_extra_info.items()})
            output.meta_info["reward_extra_keys"] = list(chunk.reward_extra_info)
        return output

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class VerlScheduleBackend:
    """:class:`~async_reward.pipeline.schedule.ScheduleBackend` made of a ``RayPPOTrainer``'s own steps.

    It also keeps the rollout replicas' state (verl's colocated engine: ``update_weights`` wakes them
    with the actor's weights, ``sleep_replicas`` frees their memory for training) so each generation
    sees the weights of ``version`` (completed steps) and training never runs beside awake replicas.
    Weights are pushed lazily, just before a generation, so the off-policy modes sync once per step
    like verl. Stage metrics are kept per step until the trainer logs them.
    """

    def __init__(self, trainer: PipelinedRayPPOTrainer, first_step: int, per_chunk_balance: bool) -> None:
        self.trainer = trainer
        self.version = first_step
        """Completed steps: the policy version the actor holds (the trainer advances it)."""
        self.per_chunk_balance = per_chunk_balance
        self.epochs: dict[int, int] = {}
        self._replicas: int | None = None  # version the awake replicas hold; None: asleep
        self._loader_states: dict[int, Any] = {}
        self._metrics: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        self._batches = self._iterate(first_step // len(trainer.train_dataloader))

    # -- ScheduleBackend --------------------------------------------------------------------------

    def rollout(self, step: int) -> DataProto:
        t, config = self.trainer, self.trainer.config
        self._loader_states[step] = t.train_dataloader.state_dict()
        try:
            self.epochs[step], batch_dict = next(self._batches)
        except StopIteration:
            raise RuntimeError(f"the train dataloader ran out of batches before step {step + 1}") from None
        batch = DataProto.from_single_dict(batch_dict)
        batch.meta_info["temperature"] = config.actor_rollout_ref.rollout.temperature
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        n = config.actor_rollout_ref.rollout.n
        gen_batch = t._get_gen_batch(batch)
        gen_batch.meta_info["global_steps"] = step + 1
        gen_batch = gen_batch.repeat(repeat_times=n, interleave=True)
        SkipManager.set_step(step + 1)
        sync: dict[str, float] = {}
        with marked_timer("update_weights", sync):
            self.sync_rollout()
        output = t.async_rollout_manager.generate_sequences(gen_batch)
        self._sleep_rollout()
        if "rm_scores" in output.batch:
            raise RuntimeError(
                "the rollout scored the batch itself (verl's agent reward loop is on): build the rollout "
                f"with {_SCORE_LATER} (init_workers does) so the pipeline scores it"
            )
        timing = output.meta_info.pop("timing", {})
        batch = batch.repeat(repeat_times=n, interleave=True).union(output)
        if "response_mask" not in batch.batch:
            batch.batch["response_mask"] = verl_trainer.compute_response_mask(batch)
        metrics: dict[str, float] = {}
        if config.trainer.balance_batch:
            t._balance_batch(batch, metrics=metrics)
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        batch.meta_info["images_seqlens"] = [
            n_img
            for mm in batch.non_tensor_batch.get("multi_modal_inputs", [])
            if "image_grid_thw" in mm
            for n_img in mm["images_seqlens"].tolist()
        ]
        batch.meta_info[_STEP_KEY] = step
        timing.update(sync)
        self._add(step, {**metrics, **{f"timing_s/{k}": v for k, v in timing.items()}})
        return batch

    def prepare(self, batch: DataProto) -> DataProto:
        """verl's old log-prob / reference / values block, then rollout correction (IS weights and
        rejection need no reward, so they are computed once per batch, on the whole batch)."""
        t, config = self.trainer, self.trainer.config
        step = int(batch.meta_info[_STEP_KEY])
        timing: dict[str, float] = {}
        metrics: dict[str, Any] = {}
        self._sleep_rollout()
        correction = config.algorithm.get("rollout_correction", None)
        bypass = bool(correction and correction.get("bypass_mode", False))
        if bypass:
            from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

            apply_bypass_mode(batch, correction, config.actor_rollout_ref.actor.policy_loss)
        else:
            with marked_timer("old_log_prob", timing):
                old_log_prob, mfu = t._compute_old_log_prob(batch)
            actor = config.actor_rollout_ref.actor
            entropy = agg_loss(
                loss_mat=old_log_prob.batch.pop("entropys"),
                loss_mask=batch.batch["response_mask"],
                loss_agg_mode=actor.loss_agg_mode,
                loss_scale_factor=actor.loss_scale_factor,
            )
            metrics.update({"actor/entropy": entropy.detach().item(), "perf/mfu/actor_infer": mfu})
            batch = batch.union(old_log_prob)
            if "rollout_log_probs" in batch.batch:
                from verl.utils.debug.metrics import calculate_debug_metrics

                metrics.update(calculate_debug_metrics(batch))
        if t.use_reference_policy:
            with marked_timer("ref", timing):
                batch = batch.union(t._compute_ref_log_prob(batch))
        if t.use_critic:
            with marked_timer("values", timing):
                batch = batch.union(t._compute_values(batch))
        if correction is not None and "rollout_log_probs" in batch.batch and not bypass:
            from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

            batch, correction_metrics = compute_rollout_correction_and_add_to_batch(batch, correction)
            metrics.update(correction_metrics)
        self._add(step, {**metrics, **{f"timing_s/{k}": v for k, v in timing.items()}})
        return batch

    def compute_advantage(self, batch: DataProto) -> DataProto:
        t, algorithm = self.trainer, self.trainer.config.algorithm
        batch.batch["token_level_scores"] = batch.batch["rm_scores"]
        if algorithm.use_kl_in_reward:
            # Per chunk in the mini-batch modes: an adaptive controller then updates once per chunk.
            batch, kl_metrics = verl_trainer.apply_kl_penalty(
                batch, kl_ctrl=t.kl_ctrl_in_reward, kl_penalty=algorithm.kl_penalty
            )
            self._add(int(batch.meta_info[_STEP_KEY]), kl_metrics)
        else:
            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
        return verl_trainer.compute_advantage(
            batch,
            adv_estimator=algorithm.adv_estimator,
            gamma=algorithm.gamma,
            lam=algorithm.lam,
            num_repeat=t.config.actor_rollout_ref.rollout.n,
            norm_adv_by_std_in_grpo=algorithm.get("norm_adv_by_std_in_grpo", True),
            config=algorithm,
        )

    def update(self, batch: DataProto, step: int) -> dict[str, float]:
        t, metrics = self.trainer, dict[str, float]()
        if self.per_chunk_balance:  # a chunk is one mini-batch: balance its DP shards, order is free
            balance: dict[str, float] = {}
            t._balance_batch(batch, metrics=balance, logging_prefix="chunk_seqlen")
            self._add(step, balance)
        if t.use_critic:
            metrics.update(reduce_metrics(t._update_critic(batch).meta_info["metrics"]))
        if t.config.trainer.critic_warmup <= t.global_steps:
            metrics.update(reduce_metrics(t._update_actor(batch).meta_info["metrics"]))
        return metrics

    # -- trainer side -----------------------------------------------------------------------------

    def sync_rollout(self) -> None:
        """Wake the replicas with the actor's current weights, unless they already hold them."""
        if self._replicas != self.version:
            self._sleep_rollout()
            self._weights.update_weights(self.version)
            self._replicas = self.version

    def pop_metrics(self, step: int) -> dict[str, float]:
        """The stage metrics of ``step`` (means over its chunks); forgets what the step needed."""
        for old in [s for s in self._loader_states if s <= step]:
            del self._loader_states[old]
        return {key: float(np.mean(values)) for key, values in self._metrics.pop(step, {}).items()}

    def loader_state_before(self, step: int) -> dict[str, Any] | None:
        """The dataloader state from before ``step``'s batch was drawn, if it already was."""
        return self._loader_states.get(step)

    @property
    def _weights(self) -> Any:
        """verl's ``CheckpointEngineManager``: actor -> rollout weight sync, replica sleep / wake."""
        return self.trainer.checkpoint_manager

    def _sleep_rollout(self) -> None:
        if self._replicas is not None:
            self._weights.sleep_replicas()
            self._replicas = None

    def _iterate(self, first_epoch: int) -> Iterator[tuple[int, dict[str, Any]]]:
        for epoch in range(first_epoch, self.trainer.config.trainer.total_epochs):
            for batch_dict in self.trainer.train_dataloader:
                yield epoch, batch_dict

    def _add(self, step: int, metrics: dict[str, Any]) -> None:
        for key, value in metrics.items():
            self._metrics[step][key].append(float(value))


class PipelinedRayPPOTrainer(verl_trainer.RayPPOTrainer):
    """verl's legacy ``RayPPOTrainer`` (``trainer.use_v1=False``) with pipelined rewards.

    Same constructor as verl's, plus ``reward_source`` (anything with ``submit`` / ``get_chunk`` /
    ``ticket_metrics``; default: a ``PipelinedRewardLoopManager`` built by ``init_workers``). The mode
    comes from ``async_reward.pipeline`` (:mod:`async_reward.pipeline.trainer_config`), checked here,
    before datasets or workers are built.
    """

    def __init__(self, *args: Any, reward_source: RewardSource | None = None, **kwargs: Any) -> None:
        config = declare_pipelined_trainer(kwargs["config"] if "config" in kwargs else args[0])
        self.pipeline_config = load_pipeline_config(config)
        check_reward_config(config)  # bad reward settings and on_failure checks, before any worker
        super().__init__(*args, **kwargs)
        self.reward_source = reward_source
        self._owns_reward_source = False
        self._backend: VerlScheduleBackend | None = None

    def init_workers(self) -> None:
        """verl's workers, with the rollout built by :class:`ScoreLaterAgentLoopManager` (unless a
        custom ``agent_loop_manager_class`` is set, which must then not score either)."""
        agent = self.config.actor_rollout_ref.rollout.agent
        with open_dict(self.config):
            agent.agent_loop_manager_class = agent.get("agent_loop_manager_class") or _SCORE_LATER
        super().init_workers()
        if getattr(self.async_rollout_manager, "reward_loop_worker_handles", None) is not None:
            raise ConfigError(
                f"actor_rollout_ref.rollout.agent.agent_loop_manager_class={agent.agent_loop_manager_class} "
                f"scores inside the rollout; subclass {_SCORE_LATER} so the pipeline can score instead"
            )
        # verl started RewardLoopWorkers for its agent reward loop; nothing uses them now.
        for handle in self.reward_loop_manager.reward_loop_workers:
            ray.kill(handle, no_restart=True)
        self.reward_loop_manager.reward_loop_workers = []
        if self.reward_source is None:
            from async_reward.pipeline.manager import PipelinedRewardLoopManager

            self.reward_source = PipelinedRewardLoopManager(self.config)
            self._owns_reward_source = True

    def _validate(self, merged: bool = False) -> Any:
        rollout = self.async_rollout_manager
        if self._backend is not None:
            self._backend.sync_rollout()
        self.async_rollout_manager = _ScoreValidation(rollout, self._rewards())
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
            config=OmegaConf.to_container(config, resolve=True),
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
            )
            progress = tqdm(total=self.total_training_steps, initial=first, desc="Training Progress")
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
