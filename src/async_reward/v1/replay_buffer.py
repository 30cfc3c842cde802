"""verl v1's replay buffer, reporting the ``reward/*`` metrics of every training step.

v1 logs reward extras only for validation, and there only as averages of numbers, so a user cannot
see how many samples of a training step timed out or failed. The replay buffer's ``sample`` is the
one place whose metrics v1 merges into every training step's log (``PPOTrainer._step_once``), and
verl lets a config name a custom sampler there (``trainer.v1.sampler.custom_sampler``).

:class:`RewardReplayBuffer` is verl's own sampler, built by verl's own code as if no custom sampler
were configured (so sync/async choice, DAPO group filtering and failed-group refills behave exactly as
without us), wrapped so that ``sample`` adds the ``reward/*`` metrics of the batch it hands out. With
``parameter_sync_step > 1`` a training step samples several mini-batches; the metrics cover the whole
step and are reported with its last mini-batch (verl would average per-mini-batch counts). With a judge
on the training GPUs verl scores each mini-batch only after ``sample`` (its sessions have no extras
yet), so the colocated step (:mod:`async_reward.v1.colocated_judge`) hands the scored extras in through
:meth:`RewardReplayBuffer.record_scored` instead, into the same per-step count.

It also keeps from verl what verl cannot train on (``on_failure: exclude``): a mini-batch in which no
session has a loss token is dropped and its prompts are generated again
(:meth:`RewardReplayBuffer._skip_untrained`); from one that trains, the rows without a loss token that
could leave one of verl's optimizer updates (``ppo_mini_batch_size x rollout.n`` rows, after verl's
re-ordering, shuffle and padding) without any are dropped, so verl receives fewer rows than sampled
(:meth:`RewardReplayBuffer._drop_surplus_untrained`). The sampler metrics of a skip's two ``sample``
calls are merged by meaning (:func:`merge_sampler_metrics`).

Longer than 400 lines: the replay buffer and the per-step ``reward/*`` metrics it reads from
TransferQueue's rows, which only it has at hand.
"""

from __future__ import annotations

import copy
import logging
import math
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeGuard, cast

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf, open_dict
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from async_reward.config.checks import trains_critic
from async_reward.config.v1 import MAX_UNTRAINED_SKIPS_KEY, max_untrained_skips
from async_reward.judge.in_job.settings import colocated_judge
from async_reward.training.exclusion import MIN_SCORED_PER_GROUP, rows_for_update
from async_reward.training.metrics import extras_metrics
from async_reward.v1.checks import check_v1

__all__ = [
    "RewardReplayBuffer",
    "StepRewardMetrics",
    "merge_sampler_metrics",
    "row_loss_tokens",
    "session_reward_extras",
    "starve_lone_scored",
    "untrained_sessions",
]

logger = logging.getLogger(__name__)


class RewardReplayBuffer:
    """verl's replay buffer for the trainer mode, plus per-step ``reward/*`` metrics.

    Built by verl's ``PPOTrainer._build_replay_buffer`` from
    ``trainer.v1.sampler.custom_sampler.path=pkg://async_reward.v1.replay_buffer`` and
    ``.name=RewardReplayBuffer``, with the keyword arguments verl gives a custom sampler. Every other
    attribute (``wait_for_sampleable``, ``get_sampleable_count``, ``poll_interval``, ...) is verl's.
    """

    def __init__(
        self,
        *,
        trainer_mode: str,
        trainer_config: Any,
        sampler_kwargs: Any,
        refill_fn: Callable[[int], int] | None = None,
        **_verl_kwargs: Any,
    ) -> None:
        self._config = _root_config(sampler_kwargs)
        check_v1(self._config)  # the first of ours that v1's trainer builds
        self.max_untrained_skips = max_untrained_skips(sampler_kwargs)
        self._builtin = build_builtin_replay_buffer(trainer_mode, sampler_kwargs, refill_fn)
        self._refill = refill_fn
        self._excluding = OmegaConf.select(self._config, "reward.async_reward.on_failure") == "exclude"
        sync_steps = (trainer_config or {}).get("parameter_sync_step", 1)
        self._step_metrics = StepRewardMetrics(int(sync_steps))
        self._scored_after_sampling = colocated_judge(self._config)
        """A judge on the training GPUs scores each mini-batch after ``sample`` (verl's
        ``_compute_reward_colocate``): what ``sample`` reads is unscored, so it counts none of it and
        :meth:`record_scored` counts the scored mini-batch instead."""

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        """verl's ``sample``; a training batch also yields the step's ``reward/*`` metrics, and a
        training batch with nothing to train on is skipped (see :meth:`_skip_untrained`)."""
        batch, metrics = self._builtin.sample(
            global_steps=global_steps, partition_id=partition_id, batch_size=batch_size
        )
        if partition_id == "val":  # validation discards sampler metrics; v1 logs its own
            return batch, metrics
        skipped = 0
        while True:
            if self._excluding:
                starve_lone_scored(batch)
            untrained, sessions = untrained_sessions(batch)
            # unscored sessions (a colocated judge scores after sampling) are not counted as ok
            extras = [] if self._scored_after_sampling else session_reward_extras(batch)
            if not sessions or untrained < sessions:
                break
            self._step_metrics.skipped(extras, untrained)
            skipped += 1
            self._skip_untrained(batch, batch_size, global_steps, sessions, skipped)
            batch, more = self._builtin.sample(
                global_steps=global_steps, partition_id=partition_id, batch_size=batch_size
            )
            metrics = merge_sampler_metrics(metrics, more)
        step = {} if self._scored_after_sampling else self._step_metrics.add(global_steps, extras, untrained)
        if untrained:
            batch = self._drop_surplus_untrained(batch, global_steps)
        return batch, {**metrics, **step}

    def record_scored(
        self, global_steps: int, extras: list[dict[str, Any]], untrained: int = 0
    ) -> dict[str, float]:
        """Count one training mini-batch scored after sampling by a judge on the training GPUs (its
        sessions' extras, and how many train on nothing); returns the step's ``reward/*`` metrics
        once its last mini-batch is in, else {}. Called by the colocated step, so that the step is
        reported once, with its last mini-batch, as without a colocated judge (verl's aggregator
        would average per-mini-batch counts)."""
        return self._step_metrics.add(global_steps, extras, untrained)

    def _drop_surplus_untrained(self, batch: KVBatchMeta, global_steps: int) -> KVBatchMeta:
        """The batch without the rows (sessions' outputs without a loss token) that could make one of
        verl's optimizer updates train on nothing.

        verl's actor splits what it gets into updates of ``ppo_mini_batch_size x rollout.n`` rows (per
        epoch, after its own re-ordering and optional shuffle, across data-parallel ranks), and pads
        the batch to a multiple of that (and of the critic's) with rows that have no loss token
        either. An update made only of such rows still steps AdamW: momentum and weight decay move the
        weights on a zero gradient. Whatever the order, no update is without a loss token when fewer
        such rows than one update holds are in the padded batch, so only the untrained rows that fill
        the trained ones up to a whole number of updates are handed out (in batch order); the others
        are cleared from TransferQueue. They trained on nothing, so nothing is lost; the step's
        ``reward/*`` metrics counted them already.
        """
        tokens = row_loss_tokens(batch)
        trained = sum(count > 0 for count in tokens)
        unit = _update_rows(self._config)
        rows = rows_for_update(np.asarray(tokens) > 0, unit)  # verl pads the last update the same way
        if rows is None:
            return batch
        kept = rows.tolist()
        chosen = set(kept)
        dropped = [key for position, key in enumerate(batch.keys) if position not in chosen]
        logger.info(
            "step %d: %d of %d rows handed to verl have no loss token; %d of them dropped so that none of "
            "verl's optimizer updates (%d rows each) trains on nothing",
            global_steps,
            len(tokens) - trained,
            len(tokens),
            len(dropped),
            unit,
        )
        tq.kv_clear(keys=dropped, partition_id=batch.partition_id)
        return KVBatchMeta(
            partition_id=batch.partition_id,
            keys=[batch.keys[i] for i in kept],
            tags=[batch.tags[i] for i in kept],
            fields=batch.fields,
            extra_info=batch.extra_info,
        )

    def _skip_untrained(
        self, batch: KVBatchMeta, prompts: int, global_steps: int, sessions: int, skipped: int
    ) -> None:
        """Drop a mini-batch (of ``prompts`` groups) in which no session has a loss token, and generate
        as many prompts again.

        verl v1 cannot skip such an update: with rollout correction (its default when the rollout
        returns log-probs) it stops with "response_mask must contain at least one valid token", and
        otherwise it steps on a zero gradient (AdamW momentum and weight decay still move the weights,
        the LR schedule advances). So the batch never reaches it: its groups are cleared from
        TransferQueue and as many fresh prompts are dispatched through verl's own refill (the path
        verl uses for failed and DAPO-filtered groups). After ``max_untrained_skips`` skips in a row
        the reward service is failing for real, and the run stops saying so.
        """
        if skipped > self.max_untrained_skips:
            raise RuntimeError(
                f"step {global_steps}: {skipped} mini-batches in a row had nothing to train on (every "
                "session excluded by on_failure: exclude, or without response tokens); the reward "
                "service is failing, see the reward/status_* and reward/excluded metrics and the "
                "failure_reason of the samples. Fix the service, raise "
                f"trainer.v1.sampler.sampler_kwargs.{MAX_UNTRAINED_SKIPS_KEY} (now "
                f"{self.max_untrained_skips}) to wait longer, or use on_failure: fallback"
            )
        unit = _gen_batch_size(self._config)
        if self._refill is None or prompts % unit:
            raise RuntimeError(
                f"step {global_steps}: all {sessions} sessions of this mini-batch train on nothing "
                "(on_failure: exclude) and it cannot be replaced: verl refills prompts in whole "
                f"data.gen_batch_size fetches ({unit}), not {prompts}. Set data.gen_batch_size=1"
            )
        logger.warning(
            "step %d: all %d sessions of this mini-batch train on nothing (on_failure: exclude); "
            "skipped, and %d prompt(s) generated again (skip %d of at most %d in a row)",
            global_steps,
            sessions,
            prompts,
            skipped,
            self.max_untrained_skips,
        )
        tq.kv_clear(keys=list(batch.keys), partition_id=batch.partition_id)
        self._refill(prompts)

    def __getattr__(self, name: str) -> Any:
        if name == "_builtin":  # not yet set (e.g. during unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._builtin, name)


class StepRewardMetrics:
    """Collects the extras of one training step's mini-batches; reports them with the last one.

    Args:
        samples_per_step: ``sample`` calls per training step (verl's ``parameter_sync_step``).
    """

    def __init__(self, samples_per_step: int) -> None:
        if samples_per_step < 1:
            raise ValueError(f"parameter_sync_step must be >= 1, got {samples_per_step}")
        self.samples_per_step = samples_per_step
        self._step: int | None = None
        self._calls = 0
        self._extras: list[dict[str, Any]] = []
        self._untrained = 0
        self._skipped = 0
        self._pending_extras: list[dict[str, Any]] = []
        self._pending_untrained = 0
        self._pending_skipped = 0
        self._counted_deaths: set[str] = set()  # reward workers already in an earlier step's count

    def add(self, global_steps: int, extras: list[dict[str, Any]], untrained: int = 0) -> dict[str, float]:
        """Record one mini-batch (its sessions' extras, and how many of them train on nothing);
        returns the step's metrics once its last mini-batch is in, else {}."""
        self._start(global_steps)
        self._calls += 1
        self._extras.extend(extras)
        self._untrained += untrained
        if self._calls < self.samples_per_step:
            return {}
        return {
            **extras_metrics(self._extras, self._counted_deaths),
            "reward/untrained": float(self._untrained),
            "reward/skipped_batches": float(self._skipped),
        }

    def skipped(self, extras: list[dict[str, Any]], untrained: int) -> None:
        """Record a mini-batch dropped before training (nothing to train on): its sessions count in
        the step's metrics, the step still waits for its ``samples_per_step`` trained ones. Belongs
        to the step of the next :meth:`add`."""
        self._pending_extras.extend(extras)
        self._pending_untrained += untrained
        self._pending_skipped += 1

    def _start(self, global_steps: int) -> None:
        if global_steps != self._step:
            self._step, self._calls, self._extras, self._untrained, self._skipped = global_steps, 0, [], 0, 0
        self._extras.extend(self._pending_extras)
        self._untrained += self._pending_untrained
        self._skipped += self._pending_skipped
        self._pending_extras, self._pending_untrained, self._pending_skipped = [], 0, 0


def _update_rows(config: DictConfig) -> int:
    """Rows of one of verl's optimizer updates, and the multiple verl pads a batch to: the actor's
    ``ppo_mini_batch_size x rollout.n``, and its least common multiple with the critic's when a critic
    trains (``PPOTrainer._get_required_batch_multiple``; data-parallel sizes divide both)."""
    n = int(config.actor_rollout_ref.rollout.n)
    rows = int(config.actor_rollout_ref.actor.ppo_mini_batch_size) * n
    if trains_critic(config):
        rows = math.lcm(rows, int(config.critic.ppo_mini_batch_size) * n)
    return rows


def _gen_batch_size(config: DictConfig) -> int:
    """Prompts per dataloader fetch, read when needed: verl's trainer sets it after building us."""
    data = config.get("data") or {}
    return int(data.get("gen_batch_size") or data.get("train_batch_size") or 1)


def merge_sampler_metrics(first: dict, second: dict) -> dict:
    """The sampler metrics of two ``sample`` calls that make one mini-batch (after a skip), merged by
    what each means, as verl merges its own across poll iterations: counts add up, a mean is
    re-weighted by the count of what it averages (``.../evicted_samples_staleness/mean`` by
    ``.../evicted_samples``; equal weights when that count is missing), ``/max`` takes the larger,
    ``/min`` the smaller, and a dict of counts (DAPO's filtered reward counts) adds per entry.
    Anything else (not a number) keeps the later value."""
    merged = dict(first)
    for key, value in second.items():
        if key not in merged:
            merged[key] = value
            continue
        before = merged[key]
        if isinstance(before, dict) and isinstance(value, dict):
            counts = Counter(before)
            counts.update(value)
            merged[key] = dict(counts)
        elif not (_is_number(before) and _is_number(value)):
            merged[key] = value
        elif key.endswith("/max"):
            merged[key] = max(before, value)
        elif key.endswith("/min"):
            merged[key] = min(before, value)
        elif key.endswith("/mean"):
            count_key = _averaged_count_key(key)
            w1, w2 = first.get(count_key), second.get(count_key)
            if _is_number(w1) and _is_number(w2) and w1 + w2 > 0:
                merged[key] = (before * w1 + value * w2) / (w1 + w2)
            else:
                merged[key] = (before + value) / 2
        else:
            merged[key] = before + value
    return merged


def _averaged_count_key(mean_key: str) -> str:
    """``<prefix>/<group>/<what>/mean`` -> ``<prefix>/<group>/evicted_samples``: the count of samples
    verl's mean metrics average over (``ReplayBuffer._evict_terminal_groups``)."""
    return mean_key.rsplit("/", 2)[0] + "/evicted_samples"


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def untrained_sessions(batch: KVBatchMeta) -> tuple[int, int]:
    """``(untrained, sessions)``: how many sessions of a sampled batch have no loss token in any of
    their outputs (``on_failure: exclude``: excluded ones and the rest of a starved group), of how many.

    Counted from ``loss_mask``, the field verl's engines count loss tokens from (``batch_num_tokens``).
    """
    trained: dict[str, bool] = {}
    for key, tag, count in zip(batch.keys, batch.tags, row_loss_tokens(batch), strict=True):
        if not tag.get("is_padding", False):
            session = key.rpartition("_")[0]
            trained[session] = trained.get(session, False) or count > 0
    return sum(not value for value in trained.values()), len(trained)


def starve_lone_scored(batch: KVBatchMeta) -> list[str]:
    """Give no loss token to a group's only trained session when the group has untrained ones
    (``on_failure: exclude``); returns the keys masked.

    Our agent loop already does this when the group is complete (:class:`~async_reward.v1.groups.
    GroupGate`), but a session can still fail after its gate opened (its write, verl's teacher
    log-probs): verl tags the group ``failure`` and, in ``sync`` without
    ``sync_refill_failed_groups``, still hands out what was written. Its lone scored member would then
    train with verl's GRPO advantage of a group of one, its raw score. As in the pipelined trainer,
    a group left with fewer than two trained sessions trains on nothing.
    """
    tokens = row_loss_tokens(batch)
    groups: dict[str, dict[str, list[int]]] = {}
    for position, (key, tag) in enumerate(zip(batch.keys, batch.tags, strict=True)):
        if not tag.get("is_padding", False):
            session = key.rpartition("_")[0]
            groups.setdefault(session.rpartition("_")[0], {}).setdefault(session, []).append(position)
    lone: list[str] = []
    for members in groups.values():
        trained = [rows for rows in members.values() if any(tokens[row] > 0 for row in rows)]
        if 0 < len(trained) < min(MIN_SCORED_PER_GROUP, len(members)):
            lone.extend(batch.keys[row] for rows in trained for row in rows)
    if lone:
        logger.warning(
            "%d output(s) of groups left with one trained session beside excluded ones get no loss "
            "token (a session failed after its group was scored)",
            len(lone),
        )
        data = tq.kv_batch_get(keys=lone, partition_id=batch.partition_id, select_fields=["loss_mask"])
        zeros = [torch.zeros_like(row) for row in data["loss_mask"].unbind()]
        fields = {name: torch.nested.as_nested_tensor(zeros, layout=torch.jagged) for name in MASK_FIELDS}
        tq.kv_batch_put(
            keys=lone, partition_id=batch.partition_id, fields=TensorDict(fields, batch_size=len(lone))
        )
    return lone


#: The fields verl's loss reads a sample's loss tokens from (engines ``loss_mask``, losses
#: ``response_mask``); our agent loop writes both equal.
MASK_FIELDS = ("loss_mask", "response_mask")


def row_loss_tokens(batch: KVBatchMeta) -> list[int]:
    """Loss tokens (``loss_mask``) of each row of a sampled batch, in batch order; 0 for padding."""
    real = [key for key, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get("is_padding", False)]
    counts: dict[str, int] = {}
    if real:
        data = tq.kv_batch_get(keys=real, partition_id=batch.partition_id, select_fields=["loss_mask"])
        tokens = data["loss_mask"].to_padded_tensor(0).sum(dim=1).tolist()
        counts = {key: int(count) for key, count in zip(real, tokens, strict=True)}
    return [counts.get(key, 0) for key in batch.keys]


def session_reward_extras(batch: KVBatchMeta) -> list[dict[str, Any]]:
    """The ``reward_extra_info`` of each session in a sampled batch, read from TransferQueue.

    A multi-output agent loop writes several trajectories per session, all carrying the session's
    reward (keys ``{uid}_{session}_{index}``); each session counts once, by its last output.
    """
    last: dict[str, tuple[int, int]] = {}
    for position, key in enumerate(batch.keys):
        session, _, index = key.rpartition("_")
        order = int(index) if index.isdigit() else 0
        if session not in last or last[session][0] < order:
            last[session] = (order, position)
    if not last:
        return []
    keys = [batch.keys[position] for _, position in sorted(last.values(), key=lambda item: item[1])]
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
    if "extra_fields" not in data.keys():  # noqa: SIM118 (TensorDict membership needs keys())
        return [{} for _ in keys]
    extras = []
    for fields in list(data["extra_fields"]):
        info = fields.get("reward_extra_info") if isinstance(fields, dict) else None
        extras.append(dict(info) if isinstance(info, dict) else {})
    return extras


def _root_config(sampler_kwargs: Any) -> DictConfig:
    """The whole verl config that ``sampler_kwargs`` (verl passes a node of it) belongs to."""
    root = sampler_kwargs._get_root() if isinstance(sampler_kwargs, DictConfig) else None
    if not isinstance(root, DictConfig) or OmegaConf.select(root, "trainer.v1.sampler") is None:
        raise TypeError(
            "RewardReplayBuffer is built by verl's v1 trainer from its config "
            "(trainer.v1.sampler.custom_sampler); sampler_kwargs must be that config's node"
        )
    return root


class _VerlSamplerFactory:
    """The three things verl's ``PPOTrainer._build_replay_buffer`` reads from its trainer.

    Running verl's own method (rather than repeating its logic) builds exactly the sampler verl
    would build without a custom sampler: verl passes a custom sampler none of the DAPO and
    failed-group refill settings, so without this they would silently stop working.
    """

    _resolve_filter_groups_metric = PPOTrainer._resolve_filter_groups_metric

    def __init__(self, config: DictConfig, trainer_mode: str, refill_fn: Callable[[int], int] | None) -> None:
        self.config = config
        self.trainer_mode = trainer_mode
        self._add_prompts_to_generate = refill_fn


def build_builtin_replay_buffer(
    trainer_mode: str, sampler_kwargs: Any, refill_fn: Callable[[int], int] | None
) -> Any:
    """verl's built-in replay buffer for the config that ``sampler_kwargs`` (a node of it) belongs to."""
    config = copy.deepcopy(_root_config(sampler_kwargs))
    with open_dict(config):
        config.trainer.v1.sampler.custom_sampler = None
    factory = _VerlSamplerFactory(config, trainer_mode, refill_fn)
    builtin = PPOTrainer._build_replay_buffer(cast(PPOTrainer, factory))
    if trainer_mode == "decoupled":
        # verl builds its ReplayBufferAsync for any async mode (with the kwargs it gives its own);
        # our subclass adds methods only, so the instance takes its class rather than a copy of
        # verl's constructor arguments.
        from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

        from async_reward.v1.decoupled.replay_buffer import DecoupledReplayBufferAsync

        if type(builtin) is not ReplayBufferAsync:
            raise TypeError(
                f"verl built {type(builtin).__name__} for trainer_mode=decoupled, not ReplayBufferAsync"
            )
        builtin.__class__ = DecoupledReplayBufferAsync
        # the v1 lines' bound, here on failed groups evicted with nothing sampled (verl has none)
        cast(DecoupledReplayBufferAsync, builtin).max_untrained_skips = max_untrained_skips(sampler_kwargs)
    return builtin
