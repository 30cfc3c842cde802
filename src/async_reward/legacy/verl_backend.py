"""``VerlScheduleBackend``: the schedule's stages cut out of a ``RayPPOTrainer``'s own methods.

verl's ``fit`` is one long loop; :class:`~async_reward.training.schedule.StepSchedule` needs its
stages as separate calls (rollout, prepare, advantages, update). This backend makes them from verl's
methods (``_get_gen_batch``, ``_balance_batch``, ``_compute_old_log_prob``, ``_compute_ref_log_prob``,
``_compute_values``, ``compute_advantage``, ``_update_critic``, ``_update_actor``), which only call
worker-group methods the FSDP2 and Megatron engine workers share, so both strategies run unchanged.
It also owns the rollout replicas' sleep / wake state and the per-step stage metrics.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from verl import DataProto
from verl.trainer.ppo import ray_trainer as verl_trainer
from verl.trainer.ppo.core_algos import agg_loss
from verl.utils.debug import marked_timer
from verl.utils.metric import reduce_metrics
from verl.utils.skip.skip_manager import SkipManager

from async_reward.legacy.agent_loop import SCORE_LATER

if TYPE_CHECKING:
    from async_reward.legacy.trainer import PipelinedRayPPOTrainer

__all__ = ["STEP_KEY", "VerlScheduleBackend"]

#: ``meta_info`` key: the schedule step a batch belongs to.
STEP_KEY = "async_reward_step"


class VerlScheduleBackend:
    """:class:`~async_reward.training.schedule.ScheduleBackend` made of a ``RayPPOTrainer``'s own steps.

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
                f"with {SCORE_LATER} (init_workers does) so the pipeline scores it"
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
        batch.meta_info[STEP_KEY] = step
        timing.update(sync)
        self._add(step, {**metrics, **{f"timing_s/{k}": v for k, v in timing.items()}})
        return batch

    def prepare(self, batch: DataProto) -> DataProto:
        """verl's old log-prob / reference / values block, then rollout correction (IS weights and
        rejection need no reward, so they are computed once per batch, on the whole batch)."""
        t, config = self.trainer, self.trainer.config
        step = int(batch.meta_info[STEP_KEY])
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
            self._add(int(batch.meta_info[STEP_KEY]), kl_metrics)
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
