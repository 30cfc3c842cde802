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
* **eviction reasons** go to the trainer's prompt ledger (failure with the worker's
  ``failure_reason`` > DAPO > stale, when verl's reason sets overlap);
* **first in, first trained** among groups of one policy version (verl's tie-break is a set's
  iteration order);
* **each poll tops up the generation window** before sleeping, so the rollout is refilled while
  the trainer waits for scored groups, not only once per step.
"""

from __future__ import annotations

from typing import Any

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

__all__ = ["DecoupledReplayBufferAsync"]

PARTITION = "train"


class DecoupledReplayBufferAsync(ReplayBufferAsync):
    """verl's ``ReplayBufferAsync`` with the three changes of the module docstring.

    Built by :func:`async_reward.v1.replay_buffer.build_builtin_replay_buffer` for the mode; works
    as verl's own until :meth:`attach` gives it the trainer (its ledger and top-up).
    """

    _trainer: Any = None
    _from_generation: bool = True
    _failure_reasons: dict[str, str]

    def attach(self, trainer: Any, *, staleness_from: str, poll_interval_s: float) -> None:
        """Report to ``trainer`` (``ledger``, ``_top_up``) and count staleness as configured."""
        self._trainer = trainer
        self._from_generation = staleness_from == "generation"
        self.poll_interval = poll_interval_s

    def _sync_metadata_from_transfer_queue(self) -> None:
        super()._sync_metadata_from_transfer_queue()
        # A second listing, of the prompt tags verl's sync reads only status and step from. A group
        # terminal in verl's listing has its final tag in ours (the worker writes before verl's
        # terminal write); only terminal groups are evicted or sampled, so the two always agree on them.
        tags = (tq.kv_list(PARTITION) or {}).get(PARTITION, {})
        self._failure_reasons = {}
        steps = self.prompt_global_steps[PARTITION]
        for uid, tag in tags.items():
            if not tag.get("is_prompt", False) or uid not in steps:
                continue
            if tag.get("failure_reason"):
                self._failure_reasons[uid] = str(tag["failure_reason"])
            version = tag.get("gen_version")
            if self._from_generation and version is not None:
                steps[uid] = int(version) + 1

    def _evict_terminal_groups(
        self,
        global_steps: int,
        partition_id: str,
        eviction_reasons: tuple[set[str], set[str], set[str], Any],
    ) -> tuple[set[str], int, int, dict]:
        _stale, dapo, failed, _ = eviction_reasons
        result = super()._evict_terminal_groups(global_steps, partition_id, eviction_reasons)
        ledger = getattr(self._trainer, "ledger", None)
        if partition_id == PARTITION and ledger is not None:
            reasons = getattr(self, "_failure_reasons", {})
            for uid in result[0]:
                if uid in failed:
                    ledger.evicted(uid, reasons.get(uid, "failure"))
                else:
                    ledger.evicted(uid, "dapo" if uid in dapo else "stale")
        return result

    def _materialize_batch(
        self, partition_id: str, selected_prompt_uids: list[str], partition_snapshot: dict[str, dict]
    ) -> KVBatchMeta:
        batch = super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)
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
