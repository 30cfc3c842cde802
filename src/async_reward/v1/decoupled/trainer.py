"""``trainer.v1.trainer_mode=decoupled``: verl's ``separate_async`` with scoring decoupled from generation.

A subclass of verl's ``PPOTrainerSeparateAsync`` registered with verl's ``register_trainer``
(importing this module registers it; the setup hook does so in verl's task-runner actor, see
:mod:`async_reward.wiring.trainer_modes`). Everything verl's fully-async mode does stays: standalone
rollout replicas, NCCL weight sync once per step with partial rollout, decoupled PPO's pi_old on the
CPU across ``parameter_sync_step`` mini-batches, validation, checkpoints. What changes is *when
prompts are dispatched*.

verl keeps ``num_warmup_batches`` batches in flight and dispatches one more batch of B prompts at
each step's start; a group counts as in flight until it is sampled, so a group whose sessions are
generated but still being scored holds a place the rollout cannot use, and under a slow judge the
standalone rollout runs dry. Here the window counts only groups still *generating*
(:mod:`async_reward.v1.decoupled.window`, from the progress our agent-loop worker writes on each
prompt tag, :mod:`async_reward.v1.decoupled.agent_loop`) and is topped up continuously: at each
step's start, at every poll of the sampler while the trainer waits, after each sample and before
each GPU stage. Above its bound the reward backlog paces dispatch: a group goes out as the judge
finishes a group's worth of sessions (backpressure, never a drop); dispatch also pauses while the
groups outstanding are at their cap (the staleness bound). Windows: :mod:`async_reward.v1.
decoupled_config`.

Every dispatched prompt is accounted for by a :class:`~async_reward.v1.decoupled.window.PromptLedger`
(trained, evicted with a reason, in flight), reconciled with the prompt keys TransferQueue lists at
each step's end. Each step logs the reward queue metrics of verl-recipe's ``reward_queue`` (same
names), ``decoupled/*`` and ``ledger/*``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from typing import Any

import numpy as np
import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf, open_dict
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync

from async_reward.config import ConfigError
from async_reward.config.v1 import AGENT_LOOP_MANAGER, REPLAY_BUFFER_NAME, REPLAY_BUFFER_PATH
from async_reward.v1.agent_loop import DRY_RUN_AGENT_LOOP_MANAGER
from async_reward.v1.checks import apply_legacy_and_check
from async_reward.v1.decoupled.agent_loop import DECOUPLED_AGENT_LOOP_MANAGER, DecoupledAgentLoopManager
from async_reward.v1.decoupled.config import (
    DECOUPLED_MODE,
    DECOUPLED_MODE_PATH,
    POLL_INTERVAL_S,
    SEPARATE_ASYNC_PATH,
    derive_windows,
    load_decoupled_mode_config,
    stale_wait_limit_s,
)
from async_reward.v1.decoupled.replay_buffer import DecoupledReplayBufferAsync
from async_reward.v1.decoupled.window import (
    PromptLedger,
    WindowState,
    dispatch_blocker,
    top_up_count,
)

__all__ = ["PPOTrainerDecoupled"]

logger = logging.getLogger(__name__)

PARTITION = "train"
#: Cumulative session counts of the agent-loop workers (``DecoupledAgentLoopWorker.decoupled_stats``).
REWARD_COUNTS = ("produced", "consumed", "skipped", "abandoned")


@register_trainer(DECOUPLED_MODE)
class PPOTrainerDecoupled(PPOTrainerSeparateAsync):
    """verl v1 trainer mode ``decoupled`` (module docstring). Built by verl's ``TaskRunnerV1``."""

    #: Print the start line (the benchmark, which builds trainers per run, may turn it off).
    announce: bool = True

    def __init__(self, config: DictConfig) -> None:
        self.mode_config = load_decoupled_mode_config(config)
        _prepare_config(config, dry_run=self.mode_config.dry_run)
        apply_legacy_and_check(config)  # legacy reward keys, every reward setting, before any worker
        super().__init__(config)
        self.windows = derive_windows(self.mode_config, config)
        self.ledger = PromptLedger()
        builtin = getattr(self.replay_buffer, "_builtin", None)
        if not isinstance(builtin, DecoupledReplayBufferAsync):  # _prepare_config names ours
            raise TypeError(f"trainer_mode=decoupled needs its replay buffer, got {type(self.replay_buffer)}")
        builtin.attach(
            self,
            staleness_from=self.mode_config.staleness_from,
            poll_interval_s=POLL_INTERVAL_S,
            stale_wait_limit_s=stale_wait_limit_s(self.mode_config, config),
        )
        self._sampler = builtin
        self._state = WindowState(0, 0, 0, 0, frozenset())
        self._checked_at: float | None = None
        self._timers = dict.fromkeys(
            ("backpressure_s", "rollout_idle_s", "window_full_s", "sampleable_full_s", "outstanding_full_s"),
            0.0,
        )
        self._backlog_max = 0
        self._step_dispatched = 0
        self._step_refilled = 0
        self._reward_totals = dict.fromkeys(REWARD_COUNTS, 0)
        if self.announce:
            print(f"async_reward: {self.start_line()}", flush=True)

    def start_line(self) -> str:
        """``trainer <module.Class> (verl v1 trainer_mode=decoupled), windows G=.., R=.., S=..``."""
        cls, w = type(self), self.windows
        return (
            f"trainer {cls.__module__}.{cls.__qualname__} (verl v1 trainer_mode={DECOUPLED_MODE}), "
            f"generation_window={w.generation_window} groups, reward_backlog={w.reward_backlog} sessions, "
            f"sampleable_buffer={w.sampleable_buffer} groups, staleness bound {w.staleness_bound} "
            f"(from {self.mode_config.staleness_from})"
        )

    # -- dry run: everything up to the workers, then stop ------------------------------------------

    def init(self) -> None:
        if not self.mode_config.dry_run:
            super().init()
            return
        self._init_tokenizer()
        self._init_dataloader()

    def get_llm_client(self) -> Any:
        return None if self.mode_config.dry_run else super().get_llm_client()

    def get_teacher_client(self) -> Any:
        return None if self.mode_config.dry_run else super().get_teacher_client()

    def get_reward_handles(self) -> Any:
        return None if self.mode_config.dry_run else super().get_reward_handles()

    def fit(self, agent_loop_manager: Any) -> None:
        if self.mode_config.dry_run:
            cls = type(self)
            print(
                f"async_reward: dry run: built {cls.__module__}.{cls.__qualname__} "
                f"(trainer_mode={DECOUPLED_MODE}), in pid {os.getpid()}; no worker started",
                flush=True,
            )
            return
        super().fit(agent_loop_manager)

    # -- the window ----------------------------------------------------------------------------------

    def _top_up(self) -> WindowState:
        """Read the pipeline from the prompt tags, account the time since the last look, and dispatch
        what the windows allow. Runs on the trainer's thread only (verl's dataloader iterator)."""
        listing = (tq.kv_list(PARTITION) or {}).get(PARTITION, {})
        state = WindowState.from_tags(listing)
        count = top_up_count(state, self.windows)
        if count > 0:
            uids = self._dispatch(count)
            state = replace(state, generating=state.generating + count, in_flight=state.in_flight | set(uids))
        self._account_time(state)
        self._backlog_max = max(self._backlog_max, state.backlog)
        return state

    def _dispatch(self, count: int) -> list[str]:
        """``count`` prompts from verl's dataloader, sent to generation; their uids."""
        batch = self._next_train_batch(count)
        self._submit_batch_to_rollout(batch)
        return [str(uid) for uid in batch["uid"]]

    def _account_time(self, state: WindowState) -> None:
        """Charge the time since the last look to what the pipeline was doing then: no group
        generating (``rollout_idle_s``); and why dispatch stopped (:func:`dispatch_blocker`): the
        window full (``window_full_s``), the reward pipeline at its bound while the window had room
        (``backpressure_s``), the sampleable buffer full (``sampleable_full_s``), or the groups
        outstanding at their cap (``outstanding_full_s``: the trainer is the bottleneck)."""
        now = time.monotonic()
        if self._checked_at is not None:
            elapsed, before = now - self._checked_at, self._state
            if before.generating == 0:
                self._timers["rollout_idle_s"] += elapsed
            blocker = dispatch_blocker(before, self.windows)
            if blocker is not None:
                self._timers[f"{blocker}_s"] += elapsed
        self._checked_at, self._state = now, state

    # -- verl's dispatch points, through the window ---------------------------------------------------

    def on_train_begin(self) -> None:
        # verl's warm-up dispatches num_warmup_batches batches; the window (whose default is sized
        # from num_warmup_batches) dispatches instead, counting what a resumed run re-issued.
        self._top_up()

    def _add_batch_to_generate(self) -> None:
        """verl's ``prepare_step`` dispatches one batch per step here; the window tops up instead."""
        self._top_up()

    def _add_prompts_to_generate(self, num_prompts: int) -> int:
        """verl's refill (evicted groups, our untrained skips): the evicted groups left the window, so
        the top-up replaces them as the bounds allow; the ledger counts that many as refills."""
        self.ledger.refill_credit += num_prompts
        before = self.ledger.counts["dispatched"]
        self._top_up()
        return self.ledger.counts["dispatched"] - before

    def _submit_batch_to_rollout(self, batch: TensorDict) -> int:
        uids = [str(uid) for uid in batch["uid"]]
        refills = self.ledger.take_refills(len(uids))
        self.ledger.dispatched(uids[:refills], "refill")
        self.ledger.dispatched(uids[refills:], "window")
        self._step_dispatched += len(uids)
        self._step_refilled += refills
        return super()._submit_batch_to_rollout(batch)

    def _reissue_inflight_prompts(self, partition_id: str = PARTITION) -> int:
        """verl re-issues a resumed run's pending/running prompts; their progress tags from the crashed
        run are reset first (tags merge), and every prompt found in flight is carried over."""
        listing = (tq.kv_list(partition_id) or {}).get(partition_id, {})
        inflight = [key for key, tag in listing.items() if tag.get("is_prompt", False)]
        restart = [key for key in inflight if listing[key].get("status") in ("pending", "running")]
        if restart:
            reset = {"gen_done": 0, "unscored": 0, "gen_version": None, "failure_reason": None}
            tq.kv_batch_put(keys=restart, partition_id=partition_id, tags=[dict(reset) for _ in restart])
        reissued = super()._reissue_inflight_prompts(partition_id)
        if partition_id == PARTITION:
            self.ledger.carried_over(inflight)
        return reissued

    def on_sample_end(self) -> None:
        self._top_up()
        super().on_sample_end()

    def _compute_old_log_prob(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        self._top_up()
        return super()._compute_old_log_prob(batch, metrics=metrics)

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        self._top_up()
        return super()._update_actor(batch, metrics=metrics)

    # -- the step and its accounting ------------------------------------------------------------------

    def step(self, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        batch = super().step(metrics, timing_raw)
        trained = {
            key.split("_")[0]
            for key, tag in zip(batch.keys, batch.tags, strict=True)
            if not tag.get("is_padding", False)
        }
        self.ledger.step_trained(trained)
        return batch

    def on_step_end(self) -> None:
        super().on_step_end()  # weight sync; assigns _pending_sync_metrics
        state = self._top_up()
        report = self.ledger.check(state.in_flight)
        metrics = {**self._queue_metrics(state), **self.ledger.metrics(report)}
        self._pending_sync_metrics = {**(getattr(self, "_pending_sync_metrics", None) or {}), **metrics}
        if not report.ok:
            logger.warning(
                "step %d: prompt ledger out of balance: %s (counted in ledger/unaccounted)",
                self.global_steps,
                report.describe(),
            )

    def _queue_metrics(self, state: WindowState) -> dict[str, float]:
        """The step's window and reward-queue metrics (verl-recipe's ``reward_queue`` names kept)."""
        stats = self._reward_stats()
        step = {key: stats[key] - self._reward_totals[key] for key in REWARD_COUNTS}
        self._reward_totals = {key: stats[key] for key in REWARD_COUNTS}
        sampler = self._sampler
        waited, sampler.staleness_wait_s = sampler.staleness_wait_s, 0.0
        seconds = np.asarray(stats["score_seconds"], dtype=float)
        windows = self.windows
        metrics = {
            "monitor/queue/reward_queue_size": float(state.backlog),
            "reward_queue/backlog_max": float(self._backlog_max),
            "static/max_reward_queue_size": float(windows.reward_backlog),
            "reward_queue/total_produced": float(stats["produced"]),
            "reward_queue/total_consumed": float(stats["consumed"]),
            "reward_queue/produced": float(step["produced"]),
            "reward_queue/consumed": float(step["consumed"]),
            # Sessions that entered the reward backlog and left it without a score: siblings of a
            # failed group not sent to the judge, and sessions abandoned unscored. Backpressure
            # pauses dispatch instead of dropping, so nothing else is.
            "reward_queue/dropped_samples": float(step["skipped"] + step["abandoned"]),
            "aggregator/pending_groups_count": float(state.pending_groups),
            "aggregator/total_pending": float(state.backlog),
            "timing_s/reward_compute/mean": float(seconds.mean()) if seconds.size else 0.0,
            "timing_s/reward_compute/max": float(seconds.max()) if seconds.size else 0.0,
            "timing_s/reward_compute/tp95": float(np.percentile(seconds, 95)) if seconds.size else 0.0,
            "decoupled/window/generating": float(state.generating),
            "decoupled/window/limit": float(windows.generation_window),
            "decoupled/outstanding": float(state.outstanding),
            "decoupled/outstanding_limit": float(windows.outstanding_cap),
            "decoupled/sampleable": float(state.sampleable),
            "decoupled/dispatched": float(self._step_dispatched),
            "decoupled/refilled": float(self._step_refilled),
            "decoupled/skipped_scoring": float(step["skipped"]),
            "decoupled/staleness_wait_s": float(waited),
            "decoupled/stale_overflow": float(sampler.stale_overflow),
            **{f"decoupled/{name}": value for name, value in self._timers.items()},
        }
        self._backlog_max = state.backlog
        self._step_dispatched = self._step_refilled = 0
        self._timers = dict.fromkeys(self._timers, 0.0)
        return metrics

    def _reward_stats(self) -> dict[str, Any]:
        manager = getattr(self, "agent_loop_manager", None)
        if isinstance(manager, DecoupledAgentLoopManager):
            return manager.decoupled_stats()
        return {**self._reward_totals, "score_seconds": []}


def _prepare_config(config: DictConfig, dry_run: bool = False) -> None:
    """Copy verl's ``separate_async`` settings into the mode's node (verl's base trainer reads
    ``trainer.v1.<mode>.parameter_sync_step``, its separate-async code ``trainer.v1.separate_async``),
    and name the mode's agent-loop manager (a dry run's starts nothing) and replay buffer."""
    separate = OmegaConf.to_container(OmegaConf.select(config, SEPARATE_ASYNC_PATH) or {}, resolve=True)
    agent = config.actor_rollout_ref.rollout.agent
    current = agent.get("agent_loop_manager_class")
    if dry_run:
        current = None
    elif current not in (
        None,
        "",
        AGENT_LOOP_MANAGER,
        DECOUPLED_AGENT_LOOP_MANAGER,
    ) and not _is_decoupled_manager(str(current)):
        raise ConfigError(
            f"actor_rollout_ref.rollout.agent.agent_loop_manager_class={current} cannot run "
            f"trainer.v1.trainer_mode={DECOUPLED_MODE}: the mode needs each group's generation progress "
            f"on its prompt tag ({DECOUPLED_AGENT_LOOP_MANAGER}, or a subclass)",
            key="actor_rollout_ref.rollout.agent.agent_loop_manager_class",
            fix=f"unset it, or subclass {DECOUPLED_AGENT_LOOP_MANAGER}",
        )
    with open_dict(config):
        node = OmegaConf.select(config, DECOUPLED_MODE_PATH)
        if node is None:
            config.trainer.v1[DECOUPLED_MODE] = {}
        for key, value in (separate or {}).items():  # type: ignore[union-attr]
            config.trainer.v1[DECOUPLED_MODE][key] = value
        if dry_run:
            agent.agent_loop_manager_class = DRY_RUN_AGENT_LOOP_MANAGER
        elif current in (None, "", AGENT_LOOP_MANAGER):
            agent.agent_loop_manager_class = DECOUPLED_AGENT_LOOP_MANAGER
        sampler = config.trainer.v1.sampler
        if not (sampler.get("custom_sampler") or {}).get("path"):
            sampler.custom_sampler = {"path": REPLAY_BUFFER_PATH, "name": REPLAY_BUFFER_NAME}


def _is_decoupled_manager(fqn: str) -> bool:
    from verl.utils.import_utils import load_class_from_fqn

    try:
        cls = load_class_from_fqn(fqn, "AgentLoopManager")
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, DecoupledAgentLoopManager)
