"""``PipelinedRewardLoopManager``: submit a batch, take its rewards back in chunks of complete groups.

A drop-in companion of verl's ``RewardLoopManager`` (same config, same ``compute_rm_score``) whose
real interface is asynchronous: ``submit`` returns a :class:`Ticket` in milliseconds and scoring
starts at once on our own Ray workers (:mod:`async_reward.legacy.worker`); ``get_chunk`` blocks
until enough *complete groups* are scored, so a trainer can update on the first mini-batch while the
rest is still being judged. Several tickets may be in flight; workers give free slots to the oldest.

Threads: the caller's thread runs ``submit`` / ``get_chunk``; one background thread runs the
:class:`~async_reward.legacy.dispatch.Dispatcher`'s asyncio loop, which ships batches to workers
and long-polls each worker's ``collect``. Both sides meet in the ticket states under one lock, and
``get_chunk`` waits on a condition notified when results arrive (no sleep-polling).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
import time
import uuid
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np
import ray
from omegaconf import DictConfig, OmegaConf, open_dict
from verl import DataProto

from async_reward.config import ConfigError, load_config
from async_reward.config.checks import check_reward
from async_reward.judge.group.placement import whole_groups
from async_reward.judge.in_job.settings import in_job_judge
from async_reward.legacy.chunks import (
    GroupLayout,
    RewardChunk,
    assemble_rm_scores,
    postprocess_groups,
    stack_extras,
)
from async_reward.legacy.dispatch import Dispatcher
from async_reward.legacy.pool import start_workers
from async_reward.legacy.state import RewardChunkTimeout, Ticket, TicketError, TicketState
from async_reward.managers.base import RewardScoringError
from async_reward.training.config import check_judge_placement

__all__ = ["PipelinedRewardLoopManager", "RewardChunkTimeout", "TicketError"]

#: Tensors a reward manager reads; nothing else of the batch is shipped to workers.
SHIPPED_TENSORS = ("responses", "attention_mask", "prompts")
REQUIRED_TENSORS = ("responses", "attention_mask")
_FINISHED_KEPT = 256


class PipelinedRewardLoopManager:
    """Scores batches on Ray reward workers and hands rewards back in chunks of complete groups.

    Args:
        config: the full verl config, as for verl's ``RewardLoopManager`` (``reward.reward_manager``,
            ``reward.num_workers``, ``reward.async_reward``, ``actor_rollout_ref.model``).
        num_workers: worker actors to start (default ``reward.num_workers``).
        max_concurrency: samples scored at once per worker (default
            ``reward.async_reward.limits.max_concurrency``). Size the total to the service's capacity.
        collect_wait_s: longest a worker's long-poll waits with nothing to report (results come back
            as soon as they exist; this only bounds an idle poll).
        worker_options: extra Ray actor options (e.g. ``num_cpus``, ``scheduling_strategy``).
        ready_timeout_s: longest wait for the workers to build their reward managers.
        reward_router_address: verl's router in front of the reward model it serves in the job
            (``reward.reward_model.enable``, on GPUs of its own): verl's ``RewardLoopManager``
            starts the model and its router (``.reward_router_address``); required with ``enable``.

    Ray must be initialised (with ``async_reward.wiring.integration.ray_runtime_env()`` when other Ray
    processes must resolve our manager names). ``reward.reward_model`` servers are not started here.
    Every reward setting a worker would refuse raises ``ConfigError`` here, before any worker starts
    (``async_reward.config.checks.check_reward``). Chunks carry each sample's ``excluded`` flag
    (``on_failure: exclude``); ``StepSchedule`` honours it, a loop of your own must too.
    """

    def __init__(
        self,
        config: DictConfig,
        *,
        num_workers: int | None = None,
        max_concurrency: int | None = None,
        collect_wait_s: float = 1.0,
        worker_options: dict[str, Any] | None = None,
        ready_timeout_s: float = 300.0,
        reward_router_address: str | None = None,
    ) -> None:
        if not ray.is_initialized():
            raise RuntimeError("PipelinedRewardLoopManager needs Ray: call ray.init(...) first")
        check_judge_placement(config, "async_reward.pipeline")
        if in_job_judge(config) and reward_router_address is None:
            raise ConfigError(
                "reward.reward_model.enable=true, but PipelinedRewardLoopManager got no "
                "reward_router_address: pass the router of verl's RewardLoopManager "
                "(reward_loop_manager.reward_router_address), which starts the served model",
                key="reward.reward_model.enable",
                fix="pass reward_router_address=<verl RewardLoopManager>.reward_router_address",
            )
        from verl.trainer.ppo.reward import resolve_reward_manager_cls

        count = int(num_workers or config.reward.get("num_workers") or 1)
        # The workers split the job-wide RPM/TPM budgets by reward.num_workers: tell them how many
        # there really are (num_workers= may differ), or each would take a larger share than its own.
        config = _with_worker_count(config, count)
        # Every setting a worker would refuse, refused here before any worker starts (groups are
        # dealt whole to the workers: judge.mode=group is placed right however many they are).
        with whole_groups():
            check_reward(config)
        self.config = config
        self.reward_manager_cls = resolve_reward_manager_cls(config)
        settings = load_config(config)
        self._fallback_score = settings.fallback_score
        self._exclude_failures = settings.on_failure == "exclude"
        self._id = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._seq = itertools.count(1)
        self._tickets: dict[int, TicketState] = {}
        self._retired: OrderedDict[int, tuple[str, TicketState]] = OrderedDict()
        workers = start_workers(
            config,
            count,
            name_prefix=f"async_reward_pipeline_{self._id}",
            max_concurrency=max_concurrency,
            options=worker_options,
            ready_timeout_s=ready_timeout_s,
            reward_router_address=reward_router_address,
        )
        self._dispatch = Dispatcher(workers, self._cond, self._tickets, collect_wait_s)

    # ------------------------------------------------------------------ public API
    def submit(self, batch: DataProto, group_key: str = "uid") -> Ticket:
        """Start scoring ``batch``; returns at once. Samples are grouped by ``non_tensor_batch[group_key]``.

        Groups may differ in size. Without the key every sample is its own group (with a warning).
        The batch's tensors must not be modified in place until its ticket finishes.

        Raises:
            RuntimeError: the manager is closed or has no live worker.
            ValueError: the batch is empty or lacks ``responses`` / ``attention_mask``.
        """
        self._check_open()
        if not isinstance(batch, DataProto):
            raise TypeError(f"submit expects a verl DataProto, got {type(batch).__name__}")
        tensor_keys = set(batch.batch.keys()) if batch.batch is not None else set()
        missing = [key for key in REQUIRED_TENSORS if key not in tensor_keys]
        if missing:
            raise ValueError(
                f"batch is missing tensor(s) {missing} needed for scoring (has {sorted(tensor_keys)})"
            )
        num_samples = len(batch)
        if num_samples == 0:
            raise ValueError("cannot submit an empty batch")
        keys = batch.non_tensor_batch.get(group_key)
        if keys is None:
            warnings.warn(
                f"batch has no non_tensor_batch[{group_key!r}]: every sample is scored as its own group",
                UserWarning,
                stacklevel=2,
            )
        layout = GroupLayout.from_keys(keys, num_samples)
        shipped = DataProto(
            batch=batch.batch.select(*[k for k in SHIPPED_TENSORS if k in tensor_keys]),
            non_tensor_batch=dict(batch.non_tensor_batch),
            meta_info=dict(batch.meta_info),
        )
        order = np.concatenate(layout.members)
        ranks = np.empty(num_samples, dtype=np.int64)
        ranks[order] = np.arange(num_samples, dtype=np.int64)
        with self._lock:
            self._check_open()
            ticket = Ticket(seq=next(self._seq), num_samples=num_samples, manager_id=self._id)
            state = TicketState(ticket, layout, shipped, ranks, self._fallback_score, self._exclude_failures)
            self._dispatch.assign(state)  # raises when no worker is alive
            self._tickets[ticket.seq] = state
        return ticket

    def get_chunk(self, ticket: Ticket, n_samples: int, timeout: float | None = None) -> RewardChunk:
        """Block until at least ``n_samples`` samples of complete groups are scored, and return them.

        Takes the fewest complete groups reaching ``n_samples``, in index order of each group's first
        member; a group is never split. ``n_samples`` larger than what is left means "the rest": the
        call returns once every remaining sample is scored. The call that empties the ticket finishes
        it (later calls raise :class:`TicketError`).

        Raises:
            ValueError: ``n_samples`` is not positive.
            RewardChunkTimeout: ``timeout`` seconds passed first (the ticket stays valid).
            RewardScoringError: a sample's ``run_single`` raised (e.g. ``on_failure: raise``).
            TicketError / RuntimeError: unknown, finished or cancelled ticket / closed manager.
        """
        if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)) or n_samples <= 0:
            raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
        if timeout is not None and not timeout >= 0:  # also refuses NaN, which would spin
            raise ValueError(f"timeout must be >= 0 or None, got {timeout}")
        if timeout is not None and math.isinf(timeout):
            timeout = None
        called = time.monotonic()
        deadline = None if timeout is None else called + timeout
        with self._cond:
            state = self._state_of(ticket)
            try:
                while True:
                    self._check_waiting(state)
                    if state.book.ready_for(n_samples):
                        break
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise RewardChunkTimeout(
                            ticket, n_samples, timeout or 0.0, state.book.num_pending, state.book.num_ready
                        )
                    self._cond.wait(None if remaining is None else min(remaining, threading.TIMEOUT_MAX))
                groups = state.book.take(n_samples)
            finally:
                state.blocked_s += time.monotonic() - called
            indices = np.sort(np.concatenate([state.layout.members[g] for g in groups]))
            raw_scores, infos = state.scores, [state.extras[i] for i in indices]
            known, layout_batch = dict(state.known_extras), state.data.batch  # type: ignore[union-attr]
        # Built outside the lock (post-processing runs user code); a failure gives the groups back.
        assembling = time.monotonic()
        try:
            final = postprocess_groups(state.layout, groups, raw_scores)
            extras = stack_extras(infos, known)
            chunk = RewardChunk(
                indices=indices.astype(np.int64),
                rm_scores=assemble_rm_scores(layout_batch, indices, [final[i] for i in indices.tolist()]),
                reward_extra_info=extras,
                statuses=extras["status"] if "status" in extras else np.full(len(indices), "ok"),
            )
        except BaseException:
            with self._cond:
                state.book.restore(groups)
                self._cond.notify_all()
            raise
        finally:
            with self._cond:
                state.blocked_s += time.monotonic() - assembling
        with self._cond:
            chunk.remaining = state.book.num_left
            if state.book.finished and self._tickets.get(ticket.seq) is state:
                self._retire(state, "finished: every sample was delivered")
        return chunk

    def compute_rm_score(self, data: DataProto) -> DataProto:
        """Blocking drop-in for verl's ``RewardLoopManager.compute_rm_score``: ``rm_scores`` in
        ``batch``, extras in ``non_tensor_batch``, their names in ``meta_info["reward_extra_keys"]``."""
        ticket = self.submit(data)
        try:
            return self.get_chunk(ticket, len(data)).to_data_proto()
        except BaseException:
            self._forget(ticket)
            raise

    def cancel(self, ticket: Ticket) -> None:
        """Stop scoring a ticket and forget it; a ``get_chunk`` waiting on it raises ``TicketError``."""
        with self._lock:
            state = self._state_of(ticket)
            self._retire(state, "cancelled")
            self._dispatch.cancel(ticket.seq)

    def ticket_metrics(self, ticket: Ticket) -> dict[str, float]:
        """verl-style metrics of a ticket, live or finished.

        ``timing_s/reward_submit_to_done`` (elapsed so far while samples are pending),
        ``timing_s/reward_blocked`` (time callers spent in ``get_chunk``: the trainer's idle time),
        ``reward/latency_p50|p95|max`` (seconds per sample in a worker, 0 before any result),
        ``reward/status_ok|timeout|error|invalid`` (counts), ``reward/excluded`` (samples flagged for no
        gradient under ``on_failure: exclude``), ``reward/retries`` (attempts beyond the first of each call),
        ``reward/in_flight`` and ``reward/queued`` (samples running / waiting, as of the workers' last
        report).
        """
        if not isinstance(ticket, Ticket):
            raise TicketError(f"not a Ticket: {ticket!r}")
        with self._lock:
            state = self._tickets.get(ticket.seq) if ticket.manager_id == self._id else None
            if state is None:
                retired = self._retired.get(ticket.seq) if ticket.manager_id == self._id else None
                if retired is None:
                    raise TicketError(
                        f"unknown ticket {ticket!r}: not issued by this manager (or long retired)"
                    )
                state = retired[1]
            return state.metrics(self._dispatch.in_flight(ticket.seq))

    @property
    def worker_handles(self) -> list[Any]:
        """Ray handles of the live worker actors this manager owns."""
        with self._lock:
            return [w.handle for w in self._dispatch.live()]

    def close(self) -> None:
        """Cancel all in-flight work and kill the worker actors. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            for state in list(self._tickets.values()):
                self._retire(state, "cancelled: the manager was closed")
            self._cond.notify_all()
        self._dispatch.close()

    def __enter__(self) -> PipelinedRewardLoopManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ caller-side helpers
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this PipelinedRewardLoopManager is closed")

    def _state_of(self, ticket: Ticket) -> TicketState:
        """The live state of ``ticket`` (lock held)."""
        self._check_open()
        if not isinstance(ticket, Ticket) or ticket.manager_id != self._id:
            raise TicketError(f"unknown ticket {ticket!r}: not issued by this manager")
        state = self._tickets.get(ticket.seq)
        if state is None:
            why = self._retired.get(ticket.seq, ("unknown",))[0]
            raise TicketError(f"ticket {ticket.seq} cannot be used: {why}")
        return state

    def _check_waiting(self, state: TicketState) -> None:
        self._check_open()
        if self._tickets.get(state.ticket.seq) is not state:
            why = self._retired.get(state.ticket.seq, ("retired",))[0]
            raise TicketError(f"ticket {state.ticket.seq} cannot be used: {why}")
        if state.error is not None:
            error = state.error
            # It can never return another chunk: stop its scoring and free its priority and memory.
            self._retire(state, f"failed: {error}")
            self._dispatch.cancel(state.ticket.seq)
            raise RewardScoringError(f"ticket {state.ticket.seq}: {error}")

    def _retire(self, state: TicketState, why: str) -> None:
        """Move a ticket out of the live set (lock held): finished, cancelled or closed."""
        self._tickets.pop(state.ticket.seq, None)
        state.done_at = state.done_at or time.monotonic()
        state.release()
        self._retired[state.ticket.seq] = (why, state)
        while len(self._retired) > _FINISHED_KEPT:
            self._retired.popitem(last=False)
        self._cond.notify_all()

    def _forget(self, ticket: Ticket) -> None:
        with contextlib.suppress(TicketError, RuntimeError):
            self.cancel(ticket)


def _with_worker_count(config: DictConfig, count: int) -> DictConfig:
    """``config`` with ``reward.num_workers`` = ``count``, the worker actors this manager starts (a
    copy when it differs). ``reward.async_reward.num_workers``, when set, is checked against it."""
    if config.reward.get("num_workers") == count:
        return config
    copy = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    assert isinstance(copy, DictConfig)
    with open_dict(copy):
        copy.reward.num_workers = count
    return copy
