"""verl's async replay buffer for the decoupled mode: staleness from generation, and the ledger's
sampling and eviction records.

It is the built-in sampler :class:`~async_reward.v1.replay_buffer.RewardReplayBuffer` wraps for
``trainer_mode=decoupled`` (so the ``reward/*`` metrics, ``exclude`` handling and untrained skips
apply unchanged). Changes to verl's ``ReplayBufferAsync``, each an override of one method:

* **staleness counted from generation** (``staleness_from: generation``): verl keys every staleness
  rule (the ``drop`` eviction, oldest-first selection, the eviction metrics and ``sample``'s own
  assertion) on ``prompt_global_steps``, the step a prompt was dispatched in. Here a generated
  group's entry is ``gen_version + 1`` instead: the step whose weights generated its oldest token
  (prompts dispatched in step s are generated with weights s - 1, so a prompt generated at once has
  the same value either way). Time queued in the window or waiting for the judge no longer counts;
  groups not yet generated keep the dispatch step (conservative).
* **a sample waits for a generated group at its staleness limit** (``staleness_from: generation``
  with verl's ``drop``): while a group whose sessions are all generated only waits for the judge and
  this step is its last (``span == max_off_policy_threshold``), a sample that would leave the step
  without a place for it waits until it is scored (:func:`~async_reward.v1.decoupled.window.
  groups_to_wait_for`); oldest-first selection then trains it. This is verl's dropless ``wait`` rule
  (``ReplayBufferAsync._has_enough_samples``), narrowed to groups that only wait for the judge, and
  what makes waiting for the judge not count against the threshold. The wait is bounded by the
  scoring deadline (every attempt has one) and by ``trainer.v1.decoupled.stale_wait_timeout_s``;
  ``decoupled/staleness_wait_s`` is its cost, ``decoupled/stale_overflow`` counts groups evicted
  ``stale`` although generated in time (the limit: more groups at their last step than it trains,
  or the wait given up);
* **eviction reasons** go to the trainer's prompt ledger (failure with the worker's
  ``failure_reason`` > DAPO > stale, when verl's reason sets overlap);
* **first in, first trained** among groups of one policy version (verl's tie-break is a set's
  iteration order);
* **each poll tops up the generation window** before sleeping, so the rollout is refilled while
  the trainer waits for scored groups, not only once per step;
* **groups that keep failing stop the run**: verl evicts a failed group and dispatches another in
  its place, with no bound, so when every group fails (``on_failure: raise`` through a judge outage,
  or a ``generation_error`` the policy's own output can cause) the sampler would evict and regenerate
  for ever and train nothing. Failed groups evicted since the last sample are counted, in batches'
  worth of the sample's size; after ``trainer.v1.sampler.sampler_kwargs.max_untrained_skips`` such
  batches' worth (the v1 lines' bound on mini-batches with nothing to train, same key and default;
  0 stops at the first) the next one stops the run naming the failure reasons, their counts and the
  key. A sample starts the count again.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

from async_reward.config.v1 import DEFAULT_MAX_UNTRAINED_SKIPS, MAX_UNTRAINED_SKIPS_KEY
from async_reward.v1.decoupled.window import groups_to_wait_for

__all__ = ["DecoupledReplayBufferAsync"]

logger = logging.getLogger(__name__)

PARTITION = "train"
#: The key that bounds a sample's wait for a group at its staleness limit.
STALE_WAIT_KEY = "trainer.v1.decoupled.stale_wait_timeout_s"
#: The key that bounds the failed groups evicted with nothing sampled (the v1 lines' bound).
MAX_UNTRAINED_SKIPS_PATH = f"trainer.v1.sampler.sampler_kwargs.{MAX_UNTRAINED_SKIPS_KEY}"


class DecoupledReplayBufferAsync(ReplayBufferAsync):
    """verl's ``ReplayBufferAsync`` with the changes of the module docstring.

    Built by :func:`async_reward.v1.replay_buffer.build_builtin_replay_buffer` for the mode; works
    as verl's own until :meth:`attach` gives it the trainer (its ledger, top-up and mini-batch index).
    """

    _trainer: Any = None
    _from_generation: bool = True
    _stale_wait_limit_s: float = float("inf")
    _failure_reasons: dict[str, str]
    _awaiting_judge: set[str]
    _in_time: set[str]
    _hold_since: float | None = None
    _given_up: set[str]
    staleness_wait_s: float = 0.0
    """Seconds samples waited for groups at their staleness limit since the trainer last read it."""
    stale_overflow: int = 0
    """Groups evicted ``stale`` although generated within the threshold (cumulative)."""
    max_untrained_skips: int = DEFAULT_MAX_UNTRAINED_SKIPS
    """``trainer.v1.sampler.sampler_kwargs.max_untrained_skips``: batches' worth of failed groups
    evicted with nothing sampled that the run rides out (:meth:`_count_failed`)."""
    _sample_size: int = 1
    _failed_since_sample: Counter | None = None

    def attach(
        self,
        trainer: Any,
        *,
        staleness_from: str,
        poll_interval_s: float,
        stale_wait_limit_s: float = float("inf"),
        max_untrained_skips: int | None = None,
    ) -> None:
        """Report to ``trainer`` (``ledger``, ``_top_up``), count staleness as configured, wait at
        most ``stale_wait_limit_s`` for groups at their staleness limit, and stop once more than
        ``max_untrained_skips`` batches' worth of groups failed with nothing sampled (None: as
        :func:`~async_reward.v1.replay_buffer.build_builtin_replay_buffer` set it from
        ``sampler_kwargs``)."""
        self._trainer = trainer
        self._from_generation = staleness_from == "generation"
        self.poll_interval = poll_interval_s
        self._stale_wait_limit_s = stale_wait_limit_s
        if max_untrained_skips is not None:
            self.max_untrained_skips = max_untrained_skips

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        """verl's ``sample``; the batch size it asks for is the unit of the bound on failed groups."""
        if partition_id == PARTITION:
            self._sample_size = max(1, int(batch_size))
        return super().sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)

    def _sync_metadata_from_transfer_queue(self) -> None:
        super()._sync_metadata_from_transfer_queue()
        # A second listing, of the prompt tags verl's sync reads only status and step from. A group
        # terminal in verl's listing has its final tag in ours (the worker writes before verl's
        # terminal write); only terminal groups are evicted or sampled, so the two always agree on them.
        tags = (tq.kv_list(PARTITION) or {}).get(PARTITION, {})
        self._failure_reasons = {}
        self._awaiting_judge = set()
        steps = self.prompt_global_steps[PARTITION]
        in_flight = self.pending_keys[PARTITION] | self.running_keys[PARTITION]
        for uid, tag in tags.items():
            if not tag.get("is_prompt", False) or uid not in steps:
                continue
            if tag.get("failure_reason"):
                self._failure_reasons[uid] = str(tag["failure_reason"])
            version = tag.get("gen_version")
            if self._from_generation and version is not None:
                steps[uid] = int(version) + 1
            size = tag.get("gen_n")
            generated = size is not None and int(tag.get("gen_done") or 0) >= int(size)
            if uid in in_flight and generated and not tag.get("failure_reason"):
                self._awaiting_judge.add(uid)
        self._in_time = getattr(self, "_in_time", set()) & set(steps)
        self._given_up = getattr(self, "_given_up", set()) & set(steps)

    def _terminal_eviction_reasons(
        self, global_steps: int, partition_id: str
    ) -> tuple[set[str], set[str], set[str], Counter]:
        if partition_id == PARTITION and self.max_off_policy_threshold is not None:
            # Groups generated (awaiting the judge or scored) within the threshold: if one is evicted
            # stale later, the wait could not save it (stale_overflow), rather than generation
            # itself having taken too long.
            steps = self.prompt_global_steps[partition_id]
            for uid in self._awaiting_judge | self.finished_keys[partition_id]:
                if global_steps - steps.get(uid, global_steps) + 1 <= self.max_off_policy_threshold:
                    self._in_time.add(uid)
        return super()._terminal_eviction_reasons(global_steps, partition_id)

    def _has_enough_samples(
        self, global_steps: int, partition_id: str, batch_size: int, sampleable_keys: set[str]
    ) -> bool:
        waiting = self._groups_to_wait_for(global_steps, partition_id, batch_size, sampleable_keys)
        now = time.monotonic()
        if waiting:
            if self._hold_since is None:
                self._hold_since = now
                logger.info(
                    "step %d: sample waits for %d group(s) at the staleness limit to be scored (e.g. %s)",
                    global_steps,
                    len(waiting),
                    waiting[:3],
                )
                return False
            if now - self._hold_since <= self._stale_wait_limit_s:
                return False
            self._given_up.update(waiting)
            logger.warning(
                "step %d: %d group(s) at the staleness limit still not scored after %.0f s (%s); sampling "
                "without them: they will be evicted stale (decoupled/stale_overflow). Raise %s, or look "
                "at the reward service (reward/status_*, timing_s/reward_compute/*)",
                global_steps,
                len(waiting),
                now - self._hold_since,
                waiting[:3],
                STALE_WAIT_KEY,
            )
        if self._hold_since is not None:
            self.staleness_wait_s += now - self._hold_since
            self._hold_since = None
        return super()._has_enough_samples(global_steps, partition_id, batch_size, sampleable_keys)

    def _groups_to_wait_for(
        self, global_steps: int, partition_id: str, batch_size: int, sampleable_keys: set[str]
    ) -> list[str]:
        """The groups at their staleness limit this sample waits for (none: sample now)."""
        threshold = self.max_off_policy_threshold
        if (
            partition_id != PARTITION
            or self._trainer is None
            or not self._from_generation
            or threshold is None
            or self.max_off_policy_strategy != "drop"
        ):
            return []
        steps = self.prompt_global_steps[partition_id]
        spans = {uid: global_steps - step + 1 for uid, step in steps.items()}
        sync_steps = int(getattr(self._trainer, "parameter_sync_step", 1) or 1)
        index = int(getattr(self._trainer, "local_trigger_step", 0) or 0)
        return groups_to_wait_for(
            self._awaiting_judge - self._given_up,
            sampleable_keys,
            spans,
            int(threshold),
            batch_size,
            slots_left=max(1, sync_steps - index) * batch_size,
        )

    def _evict_terminal_groups(
        self,
        global_steps: int,
        partition_id: str,
        eviction_reasons: tuple[set[str], set[str], set[str], Any],
    ) -> tuple[set[str], int, int, dict]:
        stale, dapo, failed, _ = eviction_reasons
        result = super()._evict_terminal_groups(global_steps, partition_id, eviction_reasons)
        ledger = getattr(self._trainer, "ledger", None)
        if partition_id == PARTITION and ledger is not None:
            reasons = getattr(self, "_failure_reasons", {})
            for uid in result[0]:
                if uid in failed:
                    ledger.evicted(uid, reasons.get(uid, "failure"))
                else:
                    ledger.evicted(uid, "dapo" if uid in dapo else "stale")
            overflow = {uid for uid in stale - failed - dapo if uid in self._in_time}
            if overflow:
                self.stale_overflow += len(overflow)
                logger.warning(
                    "step %d: %d group(s) generated within max_off_policy_threshold evicted stale (e.g. %s): "
                    "more groups reached their last step than it trains, or the wait for their scores was "
                    "given up (%s)",
                    global_steps,
                    len(overflow),
                    sorted(overflow)[:3],
                    STALE_WAIT_KEY,
                )
        if partition_id == PARTITION:
            reasons = getattr(self, "_failure_reasons", {})
            self._count_failed(
                global_steps, [reasons.get(uid, "failure") for uid in result[0] if uid in failed]
            )
        return result

    def _count_failed(self, global_steps: int, reasons: list[str]) -> None:
        """Count failed groups just evicted (their ``failure_reason``) since the last sample; stop the
        run once ``max_untrained_skips + 1`` batches' worth of them failed with nothing sampled.

        verl's ``wait_for_sampleable`` replaces every evicted group and polls again, without a bound:
        while every group fails, it would regenerate for ever and train nothing (the bound the v1
        lines put on mini-batches with nothing to train, and the pipelined mode on steps, applied to
        the groups this mode evicts in their place).

        Raises:
            RuntimeError: naming the failure reasons with their counts, and the key that bounds them.
        """
        if not reasons:
            return
        counts = self._failed_since_sample
        if counts is None:
            counts = self._failed_since_sample = Counter()
        before = sum(counts.values())
        counts.update(reasons)
        failed, size, bound = before + len(reasons), self._sample_size, self.max_untrained_skips
        if failed >= (bound + 1) * size:
            raise RuntimeError(
                f"step {global_steps}: {failed} group(s) failed and were evicted with nothing sampled, "
                f"{failed // size} batches' worth of {size} (failure_reason {_describe(counts)}; the "
                f"last {len(reasons)}: {_describe(Counter(reasons))}); each would be replaced by another "
                "for ever. reward_error: the reward "
                "service fails under on_failure: raise; generation_error: a session raised in "
                "generation. See the reward/status_* metrics and the failure_reason of the samples. Fix "
                f"the cause, raise {MAX_UNTRAINED_SKIPS_PATH} (now {bound}) to wait longer, or use "
                "on_failure: fallback"
            )
        if failed // size > before // size:
            logger.warning(
                "step %d: %d group(s) failed with nothing sampled (%s), %d batches' worth of at most %d "
                "before the run stops (%s)",
                global_steps,
                failed,
                _describe(counts),
                failed // size,
                bound,
                MAX_UNTRAINED_SKIPS_PATH,
            )

    def _materialize_batch(
        self, partition_id: str, selected_prompt_uids: list[str], partition_snapshot: dict[str, dict]
    ) -> KVBatchMeta:
        batch = super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)
        if partition_id == PARTITION:
            self._failed_since_sample = None  # a sample: the count of failed groups starts again
        ledger = getattr(self._trainer, "ledger", None)
        if partition_id == PARTITION and ledger is not None:
            ledger.sampled(selected_prompt_uids)
        return batch

    def _select_prompt_uids(
        self, partition_id: str, sampleable_keys: set[str], batch_size: int
    ) -> tuple[list[str], dict[str, dict], dict[str, int]]:
        """verl's oldest-first selection, ties (groups of one policy version) broken by dispatch
        order rather than by set iteration order: first in, first trained."""
        ledger = getattr(self._trainer, "ledger", None)
        if partition_id != PARTITION or ledger is None:
            return super()._select_prompt_uids(partition_id, sampleable_keys, batch_size)
        steps = dict(self.prompt_global_steps[partition_id])
        ordered = sorted(sampleable_keys, key=lambda key: (steps.get(key, 0), ledger.dispatch_order(key)))
        return ordered[:batch_size], dict(self.partitions[partition_id]), steps

    def _wait_for_next_poll(self, partition_id: str, last_debug_time: float) -> float:
        if partition_id == PARTITION and self._trainer is not None:
            self._trainer._top_up()
        return super()._wait_for_next_poll(partition_id, last_debug_time)


def _describe(counts: Counter) -> str:
    """``reward_error: 36, generation_error: 2``, most frequent first."""
    return ", ".join(f"{reason}: {count}" for reason, count in counts.most_common())
