"""``trainer.v1.trainer_mode=pipelined``: our reward schedule as a verl v1 trainer mode.

A ``PPOTrainer`` subclass registered with verl's ``register_trainer`` (importing this module registers
it; the setup hook does so inside verl's task-runner actor, see :mod:`async_reward.wiring.trainer_modes`).
It runs on v1's own machinery (agent loop, TransferQueue, reward workers running our managers,
checkpoint manager, validation, metrics, checkpoints) and keeps what v1 does well: each session is
scored as soon as it is generated. What it changes is the order of a step, the schedules of the
legacy trainer (``trainer.v1.pipelined.mini_batch``, and ``max_staleness`` 1 for its one-step
off-policy schedule, 0 for on-policy; :mod:`async_reward.v1.pipelined.config`):

1. wait until batch k is *generated* (not scored: :mod:`async_reward.v1.pipelined.agent_loop` writes
   each trajectory before its score);
2. one-step off-policy (``max_staleness`` >= 1): submit batch k+1 at once and let it generate with
   the pre-update policy while batch k's rewards are in flight (never gated on the replay buffer's
   state);
3. sleep the replicas, then old and reference log-probs (and values) on all of batch k, with the
   pre-update policy, while its rewards are still arriving;
4. mini-batch: ``train_batch_size // ppo_mini_batch_size`` times, the next chunk of complete scored
   groups in the order they finished, its advantages (group-local estimators only) and one update;
   baseline: all groups scored, then verl's advantage and update on the batch.

A group whose session raised (``on_failure: raise``, or a generation error) is dropped from its
batch (``pipeline/failed_groups``). Under ``on_failure: exclude`` a chunk without a loss token is never
sent to the actor (``reward/skipped_batches``), and of the rows without one only those that fill whole
optimizer updates are, so none of verl's updates trains on nothing. A step left with nothing to
train (every group failed, or no loss token in any chunk) is logged as such
(``pipeline/untrained_step``) and the run goes on, for at most
``trainer.v1.sampler.sampler_kwargs.max_untrained_skips`` such steps in a row (the v1 lines' bound).
``max_staleness`` s >= 2 keeps the batches of the next s steps generating together and trains each
step on the first groups generated across them (:mod:`async_reward.v1.pipelined.pool`; partial
rollout, staleness <= s), each batch chosen ahead or at the end of its own rollout as the judge's
pace says (:mod:`async_reward.v1.pipelined.choice`); ``fill_rollout_tail_at`` delays the batch after
next to the next one's tail. No batch is generated past the step ``fit`` trains last. Every step logs
``reward/*``, ``timing_s/reward_blocked``, ``off_policy/staleness`` and ``pipeline/*``.

Longer than 400 lines: the mode's ``fit`` on verl's v1 trainer, one method per stage of the
step; the parts that need no verl (batches, pool, choice, waits, untrained) are modules of their own.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import transfer_queue as tq
from omegaconf import DictConfig
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import PPOTrainer, register_trainer
from verl.utils.debug import marked_timer

from async_reward.config.v1 import max_untrained_skips
from async_reward.training.exclusion import rows_for_update
from async_reward.training.metrics import extras_metrics
from async_reward.v1.agent_loop import number_dispatches
from async_reward.v1.checks import apply_legacy_and_check
from async_reward.v1.pipelined.agent_loop import use_pipelined_agent_loop
from async_reward.v1.pipelined.batches import GroupState, InFlightBatch, check_prepared, read_groups
from async_reward.v1.pipelined.choice import JudgeCatchUp
from async_reward.v1.pipelined.config import (
    PIPELINED_MODE,
    POLL_INTERVAL_S,
    load_pipelined_mode_config,
)
from async_reward.v1.pipelined.pool import GroupPool
from async_reward.v1.pipelined.untrained import (
    UntrainedSteps,
    is_untrained_step,
    untrained_step_batch,
    untrained_step_markers,
)
from async_reward.v1.pipelined.waits import (
    AgentLoopWatchdog,
    AgentLoopWorkerDied,
    RewardWaitTimeout,
    wait_for_groups,
)
from async_reward.v1.replay_buffer import row_loss_tokens, session_reward_extras

__all__ = [
    "AgentLoopWorkerDied",
    "PPOTrainerPipelined",
    "RewardWaitTimeout",
]

logger = logging.getLogger(__name__)

PARTITION = "train"
#: A prompt's own session count, read by verl's agent loop in place of ``rollout.n``.
ROLLOUT_N_FIELD = "__rollout_n__"
#: The extras counted for a session of a failed group that has no score (it raised): an error.
RAISED_SESSION: dict[str, Any] = {"status": "error", "failure_reason": "the session raised: its group failed"}


@register_trainer(PIPELINED_MODE)
class PPOTrainerPipelined(PPOTrainer):
    """verl v1 trainer mode ``pipelined`` (module docstring). Built by verl's ``TaskRunnerV1``."""

    #: TransferQueue's module (the benchmark hands the trainer its in-memory tag store instead).
    _tq: Any = tq
    #: Print the start line (the benchmark, which builds the trainer for each of its runs, does not:
    #: its report starts with its verdict).
    announce: bool = True

    def __init__(self, config: DictConfig) -> None:
        self.pipeline_config = load_pipelined_mode_config(config)
        # the v1 lines' bound on steps in a row with nothing trained (pipelined_untrained)
        self._untrained = UntrainedSteps(max_untrained_skips(config.trainer.v1.sampler.get("sampler_kwargs")))
        use_pipelined_agent_loop(config, dry_run=self.pipeline_config.dry_run)
        apply_legacy_and_check(config)  # legacy reward keys, every reward setting, before any worker
        super().__init__(config)
        self.poll_interval_s = POLL_INTERVAL_S
        """Seconds between reads of TransferQueue's tags while a wait lasts (internal, not a key; the
        benchmark's harness sets its own, time-scaled)."""
        self._in_flight: deque[InFlightBatch] = deque()
        """Batches submitted and not yet trained on, oldest first (at ``max_staleness`` >= 2: the batch
        chosen for the next step from the pool, if any)."""
        self._pool = GroupPool()
        """At ``max_staleness`` >= 2: groups dispatched and not yet chosen for a step."""
        self._dispatched_through = 0
        """At ``max_staleness`` >= 2: the last step whose batch has been dispatched."""
        self._catch_up = JudgeCatchUp()
        """At ``max_staleness`` >= 2: whether the judge scored what each rollout left unscored by the
        end of the step's prepare stage (:mod:`~async_reward.v1.pipelined.choice`)."""
        self._choose_in_own_rollout = False
        """At ``max_staleness`` >= 2: this step's batch is chosen at the end of its own rollout, not
        in the step before (decided at the end of each rollout)."""
        self._submitted: dict[int, dict[str, int]] = {}
        self._next_dispatch = 0
        """The dispatch number of the next prompt sent to generation (``DISPATCH_ORDER_KEY``)."""
        self._counted_deaths: set[str] = set()
        """Reward workers counted in an earlier step's ``reward/worker_deaths``."""
        self._watchdog: AgentLoopWatchdog | None = None
        if self.announce:  # the one line that says which trainer trains, with which schedule
            print(f"async_reward: {self.start_line()}", flush=True)

    def start_line(self) -> str:
        """``trainer <module.Class> (verl v1 trainer_mode=pipelined), schedule <mode> (...)``, with the
        staleness and how batches are chosen when ``max_staleness`` >= 2."""
        cls, flags = type(self), self.pipeline_config
        staleness = ""
        if flags.staleness_limit >= 2:
            fill = flags.fill_rollout_tail_at
            rule = (
                "each chosen ahead or in its own rollout as the judge keeps up"
                if fill is None
                else f"the batch after next starting at fill_rollout_tail_at={fill}"
            )
            across = "steps take groups across the batches in flight"
            staleness = f": {across}, {rule}"
        return (
            f"trainer {cls.__module__}.{cls.__qualname__} (verl v1 trainer_mode={PIPELINED_MODE}), "
            f"schedule {flags.mode} (mini_batch={flags.mini_batch}, "
            f"max_staleness={flags.staleness_limit}{staleness})"
        )

    @property
    def _lookahead(self) -> bool:
        """``max_staleness`` >= 2: batches beyond the next one generate, steps take groups across them."""
        return self.pipeline_config.staleness_limit >= 2

    # -- dry run: everything up to the workers, then stop ------------------------------------------

    def init(self) -> None:
        if not self.pipeline_config.dry_run:
            super().init()
            return
        self._init_tokenizer()
        self._init_dataloader()

    def get_llm_client(self) -> Any:
        if self.pipeline_config.dry_run:
            return None
        if self._lookahead:
            # sequences still generating are aborted for training and resumed after it (partial
            # rollout), as verl's colocate_async does
            from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

            return self.llm_server_manager.get_client(client_cls=FullyAsyncLLMServerClient)
        return super().get_llm_client()

    def get_teacher_client(self) -> Any:
        return None if self.pipeline_config.dry_run else super().get_teacher_client()

    def get_reward_handles(self) -> Any:
        return None if self.pipeline_config.dry_run else super().get_reward_handles()

    def fit(self, agent_loop_manager: Any) -> None:
        if self.pipeline_config.dry_run:
            cls = type(self)
            print(
                f"async_reward: dry run: built {cls.__module__}.{cls.__qualname__}, schedule "
                f"{self.pipeline_config.mode}, in pid {os.getpid()}; no worker started",
                flush=True,
            )
            return
        super().fit(agent_loop_manager)

    # -- verl's hooks: colocated rollout and training, as verl's sync mode ---------------------------

    def on_init_end(self) -> None:
        self.checkpoint_manager.update_weights(self.global_steps)

    def on_step_end(self) -> None:
        with marked_timer("update_weights", self.timing_raw, color="red"):
            self.checkpoint_manager.update_weights(self.global_steps)
            if self._lookahead:
                self.checkpoint_manager.resume_generation_replicas()

    def on_sample_end(self) -> None:
        if self._lookahead:
            self.checkpoint_manager.abort_replicas()  # groups still generating, resumed after training
        self.checkpoint_manager.sleep_replicas()

    def on_train_begin(self) -> None:
        """A resumed run: the batches that were generating when the checkpoint was saved (restored
        from TransferQueue, their unfinished prompts re-issued by verl's ``fit``) are trained first,
        oldest first, in batches of ``train_batch_size`` prompts, so no prompt is skipped or repeated;
        each group with the sessions its prompt was dispatched with (:meth:`_restored_sizes`).

        Also starts the watchdog on verl's agent-loop workers (:mod:`~async_reward.v1.pipelined.waits`;
        the benchmark, which runs steps without ``fit`` or Ray workers, has none to watch)."""
        manager = getattr(self, "agent_loop_manager", None)
        workers = getattr(manager, "agent_loop_workers", None)
        self._watchdog = AgentLoopWatchdog(workers) if workers else None
        listing = self._listing()
        markers = untrained_step_markers(listing)
        if markers:
            self._tq.kv_clear(keys=markers, partition_id=PARTITION)
        prompts = sorted(
            (
                (int(tag.get("global_steps", self.global_steps)), key)
                for key, tag in listing.items()
                if tag.get("is_prompt", False)
            ),
        )
        if self._lookahead:
            self._dispatched_through = self.global_steps - 1
        if not prompts:
            return
        sizes = self._restored_sizes([key for _, key in prompts])
        size = int(self.config.data.train_batch_size)
        if self._lookahead:  # into the pool, one dispatch per step that dispatched them, oldest first
            for dispatched in sorted({step for step, _ in prompts}):
                keys = [key for step, key in prompts if step == dispatched]
                self._pool.add({key: sizes[key] for key in keys}, version=dispatched - 1)
            self._dispatched_through += -(-len(prompts) // size)
            logger.info("resumed with %d prompt group(s) in flight: trained first", len(prompts))
            return
        for start in range(0, len(prompts), size):
            part = prompts[start : start + size]
            self._in_flight.append(
                InFlightBatch(
                    step=self.global_steps, version=part[0][0] - 1, sizes={key: sizes[key] for _, key in part}
                )
            )
        logger.info("resumed with %d prompt group(s) in flight: trained first", len(prompts))

    def _restored_sizes(self, uids: list[str]) -> dict[str, int]:
        """Sessions each restored group runs: its prompt's persisted ``__rollout_n__``, else
        ``rollout.n``, as :meth:`_submit_batch_to_rollout` counts a fresh dispatch.

        verl persists a prompt's fields with its key (every mode but ``sync``) and re-issues an
        unfinished one from them, ``__rollout_n__`` included, so its sessions run that many again; a
        group counted with ``rollout.n`` instead would be taken as generated before its last sessions
        are written (then ``UnpreparedTrajectory``) or wait for sessions that never come. TransferQueue
        returns no column for a field the prompts do not have."""
        n = int(self.config.actor_rollout_ref.rollout.n)
        sizes = dict.fromkeys(uids, n)
        data = self._tq.kv_batch_get(keys=uids, partition_id=PARTITION, select_fields=[ROLLOUT_N_FIELD])
        if ROLLOUT_N_FIELD in data.keys():  # noqa: SIM118 (TensorDict membership needs keys())
            given = data[ROLLOUT_N_FIELD]
            sizes.update({uid: int(value) for uid, value in zip(uids, given, strict=True)})
        return sizes

    def on_train_end(self) -> None:
        """verl calls it when ``total_epochs`` ends the loop (not after the last of
        ``total_training_steps``). No batch is submitted past :meth:`_last_step`, so none is in flight
        here; one that is (a resumed run restored more than its remaining steps train) is named: its
        generation and judge calls were paid for nothing."""
        if self._in_flight:
            logger.error(
                "training ended with %d batch(es) in flight that no step trains (steps %s)",
                len(self._in_flight),
                [batch.step for batch in self._in_flight],
            )
        if self._pool:
            logger.error("training ended with %d group(s) in flight that no step trains", len(self._pool))

    def _last_step(self) -> int:
        """The step ``fit`` trains last: ``total_training_steps``, or the last step of the last epoch
        when ``trainer.total_epochs`` ends the loop first (verl's ``fit`` stops at either). A batch
        submitted for a later step would be generated and judged for nothing."""
        by_epochs = int(self.config.trainer.total_epochs) * int(self.steps_per_epoch)
        return min(int(self.total_training_steps), by_epochs)

    # -- one step ---------------------------------------------------------------------------------

    def _submit_batch_to_rollout(self, batch: Any) -> int:
        """verl's dispatch, remembering which groups (and how many sessions each) the batch has."""
        default_n = int(self.config.actor_rollout_ref.rollout.n)
        uids = [str(uid) for uid in batch["uid"]]
        given = list(batch[ROLLOUT_N_FIELD]) if ROLLOUT_N_FIELD in batch.keys() else None  # noqa: SIM118
        self._note_submitted(uids, given if given is not None else [default_n] * len(uids))
        # Numbered, so each reward worker admits the earliest-dispatched group first among samples of
        # one policy version: at max_staleness >= 2 the batches of several steps are dispatched by the
        # same step, and the next step's groups must not queue at the judge behind later ones.
        self._next_dispatch = number_dispatches(batch, self._next_dispatch)
        return super()._submit_batch_to_rollout(batch)

    def _note_submitted(self, uids: list[str], sizes: list[int]) -> None:
        """Groups dispatched for this step's batch, with the sessions each will run."""
        self._submitted.setdefault(self.global_steps, {}).update(
            {uid: int(size) for uid, size in zip(uids, sizes, strict=True)}
        )

    def _submit_step_batch(self) -> InFlightBatch:
        self._submitted.pop(self.global_steps, None)
        self._add_batch_to_generate()
        return InFlightBatch(
            step=self.global_steps,
            version=self.global_steps - 1,
            sizes=self._submitted.pop(self.global_steps),
        )

    def step(self, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        self.on_sample_begin()
        if self._lookahead:
            current, groups = self._gather_across_batches(timing_raw)
        else:
            current, groups = self._gather_batch_by_batch(timing_raw)
        self.on_sample_end()
        with marked_timer("prepare", timing_raw, color="blue"):
            prepared = self._prepare(_meta(groups, current.uids), metrics, timing_raw)
        if self._lookahead:
            caught_up = self._catch_up.prepare_ended(self._read_groups(set(self._catch_up.backlog)))
            metrics["pipeline/judge_caught_up"] = float(caught_up)
            metrics["pipeline/judge_backlog_groups"] = float(len(self._catch_up.backlog))
            if self.global_steps < self._last_step():  # the last step has no next batch to choose
                metrics["pipeline/next_batch_chosen_ahead"] = float(bool(self._in_flight))
        trained, counts = self._train(current, prepared, metrics, timing_raw)
        staleness = (self.global_steps - 1) - current.version
        metrics.update(
            {
                "off_policy/staleness": float(staleness),
                "off_policy/policy_version": float(current.version),
                "pipeline/num_updates": float(counts["updates"]),
                "pipeline/failed_groups": float(len(current.failed)),
                "pipeline/untrained_step": float(not trained.keys),
                "reward/untrained": float(counts["untrained"]),
                "reward/skipped_batches": float(counts["skipped"]),
                **extras_metrics(counts["extras"], self._counted_deaths),
            }
        )
        if not trained.keys:  # logged as untrained, boundedly (async_reward.v1.pipelined.untrained)
            self._untrained.untrained(
                self.global_steps, len(current.failed), len(current.sizes), counts["untrained"]
            )
            metrics["pipeline/untrained_steps_in_a_row"] = float(self._untrained.in_a_row)
            return untrained_step_batch(self._tq, PARTITION, self.global_steps)
        self._untrained.trained()
        metrics["pipeline/untrained_steps_in_a_row"] = 0.0
        return trained

    def _gather_batch_by_batch(self, timing_raw: dict) -> tuple[InFlightBatch, dict[str, GroupState]]:
        """Staleness 0 or 1: this step's batch once generated, then (one-step off-policy) the next
        step's batch, dispatched now and waited for until generated, while this one is scored."""
        if not self._in_flight:
            self._in_flight.append(self._submit_step_batch())
        current = self._in_flight.popleft()
        with marked_timer("gen", timing_raw, color="red"):
            groups = self._wait(current, current.generated, "generated")
        if self.pipeline_config.staleness_limit >= 1 and self.global_steps + 1 <= self._last_step():
            # Batch k+1, generated by the pre-update policy while batch k's rewards are in flight.
            if not self._in_flight:
                self._in_flight.append(self._submit_step_batch())
            upcoming = self._in_flight[0]
            with marked_timer("gen_next", timing_raw, color="red"):
                self._wait(upcoming, upcoming.generated, "generated")
        return current, groups

    def _gather_across_batches(self, timing_raw: dict) -> tuple[InFlightBatch, dict[str, GroupState]]:
        """``max_staleness`` s >= 2 (:mod:`~async_reward.v1.pipelined.pool`): this step's batch, chosen
        in the step before, or now (the first step, after a resume, or when the judge caught up in
        the last step: :mod:`~async_reward.v1.pipelined.choice`); then, unless the judge caught up,
        with the batches of the next s steps dispatched, the next step's batch: the first
        ``train_batch_size`` groups generated, oldest dispatch first, those that cannot wait longer
        always among them. Last, the groups this rollout leaves unscored are noted."""
        step, last = self.global_steps, self._last_step()
        limit = self.pipeline_config.staleness_limit
        with marked_timer("gen", timing_raw, color="red"):
            if not self._in_flight:
                # chosen in its own rollout, the batches of the next s steps generating meanwhile
                horizon = min(last, step + limit) if self._choose_in_own_rollout else step
                self._dispatch_through(step)
                self._in_flight.append(self._choose_from_pool(step, lookahead_through=horizon))
            current = self._in_flight.popleft()
            groups = self._wait(current, current.generated, "generated")  # chosen generated: one read
        # fill_rollout_tail_at's rule is about the batch after next starting in the next one's rollout
        self._choose_in_own_rollout = (
            self.pipeline_config.fill_rollout_tail_at is None and self._catch_up.choose_in_own_rollout()
        )
        if step + 1 <= last and not self._choose_in_own_rollout:
            self._dispatch_through(step + 1)
            lookahead = min(last, step + limit)
            with marked_timer("gen_next", timing_raw, color="red"):
                self._in_flight.append(self._choose_from_pool(step + 1, lookahead_through=lookahead))
        sizes = {**self._pool.sizes, **current.sizes}
        for batch in self._in_flight:
            sizes.update(batch.sizes)
        self._catch_up.rollout_ended(self._read_groups(set(sizes)), sizes)
        return current, groups

    def _dispatch_through(self, step: int) -> None:
        """Dispatch the batches of every step up to ``step`` (never past the last step trained)."""
        while self._dispatched_through < min(step, self._last_step()):
            self._dispatch_to_pool()

    def _dispatch_to_pool(self) -> None:
        batch = self._submit_step_batch()
        self._pool.add(batch.sizes, version=batch.version)
        self._dispatched_through += 1

    def _choose_from_pool(self, train_step: int, lookahead_through: int) -> InFlightBatch:
        """Wait until the pool can form the batch trained at ``train_step`` and take it. Meanwhile the
        batches up to step ``lookahead_through`` are dispatched: at once, or with
        ``fill_rollout_tail_at`` once the batch being formed is that share gathered."""
        while True:
            picked = self._wait_on_pool(train_step, self._dispatched_through < lookahead_through)
            if picked is not None:
                return self._pool.take(picked, train_step)
            self._dispatch_to_pool()  # then wait again, its groups watched too

    def _wait_on_pool(self, train_step: int, dispatch_pending: bool) -> list[str] | None:
        """The groups of the batch trained at ``train_step`` once the pool can form it; None once a
        pending dispatch is due instead (at once, or at ``fill_rollout_tail_at``)."""
        flags = self.pipeline_config
        size = int(self.config.data.train_batch_size)
        fill = flags.fill_rollout_tail_at
        picked: list[list[str]] = []

        def ready(groups: dict[str, GroupState]) -> bool:
            if dispatch_pending and (fill is None or self._pool.generated_share(groups, size) >= fill):
                return True
            batch = self._pool.choose(groups, train_step, size, flags.staleness_limit)
            if batch is not None:
                picked.append(batch)
            return batch is not None

        self._wait(self._pool.watched(self.global_steps), ready, "generated")
        return picked[0] if picked else None

    def _compute_metrics(
        self, batch: KVBatchMeta, metrics: dict, timing_raw: dict, global_steps: int, epoch: int
    ) -> None:
        """verl's step metrics; an untrained step (:mod:`~async_reward.v1.pipelined.untrained`) has no
        rows to compute verl's data metrics on, so it logs the step, the epoch and the timings beside ours."""
        if not is_untrained_step(batch):
            super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
            return
        metrics.update({"training/global_step": global_steps, "training/epoch": epoch})
        metrics.update({f"timing_s/{name}": value for name, value in timing_raw.items()})

    def _log_rollout_data(self, batch: KVBatchMeta, timing_raw: dict, rollout_data_dir: str) -> None:
        """verl's dump of the trained rollouts (``trainer.rollout_data_dir``); an untrained step has none."""
        if not is_untrained_step(batch):
            super()._log_rollout_data(batch, timing_raw, rollout_data_dir)

    def _prepare(self, meta: KVBatchMeta, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        """Old and reference log-probs (and values) on the whole generated batch, pre-update policy
        (nothing to do for a batch whose groups all failed before writing a trajectory)."""
        if not meta.keys:
            return meta
        meta = self._balance_batch(meta, metrics=metrics)
        with marked_timer("old_log_prob", timing_raw, color="blue"):
            meta = self._compute_old_log_prob(meta, metrics=metrics)
        if self.use_reference_policy:
            with marked_timer("ref", timing_raw, color="olive"):
                meta = self._compute_ref_log_prob(meta, metrics=metrics)
        if self.use_critic:
            with marked_timer("values", timing_raw, color="cyan"):
                meta = self._compute_values(meta, metrics=metrics)
        return meta

    def _train(
        self, current: InFlightBatch, prepared: KVBatchMeta, metrics: dict, timing_raw: dict
    ) -> tuple[KVBatchMeta, dict[str, Any]]:
        """Advantages and updates of one batch, chunk by chunk as its groups are scored."""
        flags = self.pipeline_config
        mini = int(self.config.actor_rollout_ref.actor.ppo_mini_batch_size)
        updates_wanted = int(self.config.data.train_batch_size) // mini if flags.mini_batch else 1
        per_chunk = len(current.sizes) if not flags.mini_batch else mini
        counts: dict[str, Any] = {"updates": 0, "untrained": 0, "skipped": 0, "extras": []}
        trained_parts: list[KVBatchMeta] = []
        pending: list[str] = []
        prepared_keys = set(prepared.keys)
        for chunk_index in range(updates_wanted):
            last_chunk = chunk_index == updates_wanted - 1

            def ready(groups: dict[str, GroupState], last: bool = last_chunk) -> bool:
                finished, failed = current.take_scored(groups)
                pending.extend(finished)
                counts["extras"].extend(self._drop_failed(failed, groups, current))
                return current.settled or (not last and len(pending) >= per_chunk)

            start = time.perf_counter()
            groups = self._wait(current, ready, "scored")
            self._reward_blocked(start, time.perf_counter(), chunk_index)
            timing_raw["reward_blocked"] = timing_raw.get("reward_blocked", 0.0) + time.perf_counter() - start
            take = list(pending) if last_chunk else pending[:per_chunk]
            del pending[: len(take)]
            if not take:
                continue
            chunk = _meta(groups, set(take))
            check_prepared(chunk.keys, prepared_keys, current.step)
            counts["extras"].extend(self._session_extras(chunk))
            trained_parts.append(self._update_on(chunk, counts, metrics, timing_raw))
        trained_keys = {key for part in trained_parts for key in part.keys}
        # Padding rows of the whole-batch balance and the consumed groups' prompt tags (terminal, so
        # nothing writes them again); fit() clears the trained rows after its metrics.
        unused = [key for key in prepared_keys if key not in trained_keys] + list(current.handed_out)
        if unused:
            self._tq.kv_clear(keys=unused, partition_id=PARTITION)
        keys = [key for part in trained_parts for key in part.keys]
        tags = [tag for part in trained_parts for tag in part.tags]
        return KVBatchMeta(partition_id=PARTITION, keys=keys, tags=tags), counts

    def _update_on(
        self, chunk: KVBatchMeta, counts: dict[str, Any], metrics: dict, timing_raw: dict
    ) -> KVBatchMeta:
        """Advantages of one chunk of scored groups and its update. A chunk with no loss token is never
        sent to verl (its advantage and update would divide by zero tokens), and of the rows without a
        loss token only those that fill the trained ones up to whole optimizer updates are: verl's
        actor splits what it gets into updates of ``ppo_mini_batch_size x rollout.n`` rows (after its
        own shuffle), and one made only of such rows would still step AdamW (momentum, weight decay).
        Fewer of them than one update holds cannot fill an update, whatever the order."""
        tokens = self._loss_tokens(chunk)
        counts["untrained"] += _untrained_sessions(chunk.keys, tokens)
        if sum(tokens) == 0:
            counts["skipped"] += 1
            logger.warning(
                "a chunk of %d rows has no loss token (on_failure: exclude): not trained", len(chunk)
            )
            self._tq.kv_clear(keys=list(chunk.keys), partition_id=PARTITION)
            return KVBatchMeta(partition_id=PARTITION, keys=[], tags=[])
        mini_rows = int(self.config.actor_rollout_ref.actor.ppo_mini_batch_size) * int(
            self.config.actor_rollout_ref.rollout.n
        )
        chunk = self._without_surplus_untrained(chunk, tokens, mini_rows)
        chunk = self._balance_batch(chunk, metrics=metrics)
        with marked_timer("adv", timing_raw, color="brown"):
            chunk = self._compute_advantage(chunk, metrics=metrics)
        if self.use_critic:
            with marked_timer("update_critic", timing_raw, color="pink"):
                chunk = self._update_critic(chunk, metrics=metrics)
        if self.config.trainer.critic_warmup > self.global_steps:
            return chunk
        with marked_timer("update_actor", timing_raw, color="red"):
            chunk = self._update_actor(chunk, metrics=metrics)
        counts["updates"] += max(1, len(chunk) // mini_rows)
        return chunk

    def _without_surplus_untrained(self, chunk: KVBatchMeta, tokens: list[int], unit: int) -> KVBatchMeta:
        """``chunk`` without the untrained rows beyond those that fill its trained ones to whole
        updates of ``unit`` rows (:func:`~async_reward.training.exclusion.rows_for_update`; cleared
        from TransferQueue: they would train on nothing anyway, and group advantages ignore them: an
        excluded row has a ``uid`` of its own, a starved group has no trained row)."""
        kept = rows_for_update(np.asarray(tokens) > 0, unit)
        if kept is None:
            return chunk
        chosen = set(kept.tolist())
        self._tq.kv_clear(
            keys=[key for i, key in enumerate(chunk.keys) if i not in chosen], partition_id=PARTITION
        )
        return KVBatchMeta(
            partition_id=PARTITION,
            keys=[chunk.keys[i] for i in kept],
            tags=[chunk.tags[i] for i in kept],
            extra_info=dict(chunk.extra_info or {}),
        )

    def _loss_tokens(self, meta: KVBatchMeta) -> list[int]:
        """Loss tokens of each row (``loss_mask``, which verl's engines count), padding rows as 0."""
        return row_loss_tokens(meta)

    def _session_extras(self, meta: KVBatchMeta) -> list[dict[str, Any]]:
        """Each session's ``reward_extra_info`` (for the ``reward/*`` metrics)."""
        return session_reward_extras(meta)

    def _reward_blocked(self, start: float, end: float, chunk: int) -> None:
        """Called after each wait for scored groups (the benchmark draws its timeline from it)."""

    def _drop_failed(
        self, failed: list[str], groups: dict[str, GroupState], batch: InFlightBatch
    ) -> list[dict[str, Any]]:
        """Clear groups whose session raised (verl tagged them ``failure``, so none writes again);
        returns the extras of all their sessions, for the step's ``reward/*`` metrics.

        They are read before the clear, or a step whose every group failed would log no session at
        all. A session scored before its sibling raised counts with its own status; one without a
        score (it raised while scored, or while generated, and so wrote nothing) counts as
        :data:`RAISED_SESSION` (``reward/status_error``): our managers give every scored session a
        ``status``, so a session of a failed group without one is a session that raised."""
        if not failed:
            return []
        logger.warning("%d group(s) ended in failure (a session raised): dropped from the batch", len(failed))
        written = _meta(groups, set(failed))
        scored = [info for info in self._session_extras(written) if "status" in info] if written.keys else []
        sessions = sum(batch.sizes[uid] for uid in failed)
        raised = [dict(RAISED_SESSION) for _ in range(max(sessions - len(scored), 0))]
        self._tq.kv_clear(keys=[*failed, *written.keys], partition_id=PARTITION)
        return [*scored, *raised]

    def _wait(
        self,
        batch: InFlightBatch,
        done: Callable[[dict[str, GroupState]], bool],
        what: Literal["generated", "scored"],
    ) -> dict[str, GroupState]:
        """Poll TransferQueue's tags until ``done(groups of batch)``
        (:func:`~async_reward.v1.pipelined.waits.wait_for_groups`): a wait for scores bounded by
        ``chunk_timeout_s``, every wait by the death of an agent-loop worker."""
        return wait_for_groups(
            self._listing,
            batch,
            done,
            what,
            chunk_timeout_s=self.pipeline_config.chunk_timeout_s,
            watchdog=self._watchdog,
            pause=self._pause_between_polls,
            step=self.global_steps,
        )

    def _listing(self) -> dict[str, dict[str, Any]]:
        """TransferQueue's tags of the ``train`` partition, key -> tag, read now."""
        return (self._tq.kv_list(PARTITION) or {}).get(PARTITION, {})

    def _read_groups(self, uids: set[str]) -> dict[str, GroupState]:
        """The state of ``uids`` in one listing of TransferQueue's tags, read now."""
        return read_groups(self._listing(), uids)

    def _pause_between_polls(self) -> None:
        """Sleep :attr:`poll_interval_s` (TransferQueue has no change notification to wait on). The
        benchmark, whose durations are time-scaled but whose poll could not be without starving this
        machine's reward workers, wakes on its tag store's writes instead."""
        time.sleep(self.poll_interval_s)


def _meta(groups: dict[str, GroupState], uids: set[str]) -> KVBatchMeta:
    """The trajectories of ``uids``, in finishing-order-independent key order."""
    keys, tags = [], []
    for uid in sorted(uids):
        state = groups[uid]
        for key, tag in sorted(zip(state.keys, state.tags, strict=True), key=lambda item: item[0]):
            keys.append(key)
            tags.append(tag)
    return KVBatchMeta(partition_id=PARTITION, keys=keys, tags=tags)


def _untrained_sessions(keys: list[str], tokens: list[int]) -> int:
    """Sessions (``{uid}_{session}``) none of whose rows has a loss token."""
    trained: dict[str, bool] = {}
    for key, count in zip(keys, tokens, strict=True):
        session = key.rpartition("_")[0]
        trained[session] = trained.get(session, False) or count > 0
    return sum(not value for value in trained.values())
