"""verl v1's replay buffer, reporting the ``reward/*`` metrics of every training step.

v1 logs reward extras only for validation, and there only as averages of numbers, so a user cannot
see how many samples of a training step timed out or failed. The replay buffer's ``sample`` is the
one place whose metrics v1 merges into every training step's log (``PPOTrainer._step_once``), and
verl lets a config name a custom sampler there (``trainer.v1.sampler.custom_sampler``).

:class:`RewardReplayBuffer` is verl's own sampler, built by verl's own code as if no custom sampler
were configured (so sync/async choice, DAPO group filtering and failed-group refills behave exactly as
without us), wrapped so that ``sample`` adds the ``reward/*`` metrics of the batch it hands out. With
``parameter_sync_step > 1`` a training step samples several mini-batches; the metrics cover the whole
step and are reported with its last mini-batch (verl would average per-mini-batch counts).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any, cast

import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf, open_dict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from async_reward.reward_metrics import extras_metrics
from async_reward.v1.settings import check_v1_start_up

__all__ = ["RewardReplayBuffer", "StepRewardMetrics", "session_reward_extras", "untrained_sessions"]

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
        check_v1_start_up(_root_config(sampler_kwargs))  # the first of ours that v1's trainer builds
        self._builtin = build_builtin_replay_buffer(trainer_mode, sampler_kwargs, refill_fn)
        sync_steps = (trainer_config or {}).get("parameter_sync_step", 1)
        self._step_metrics = StepRewardMetrics(int(sync_steps))

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        """verl's ``sample``; a training batch also yields the step's ``reward/*`` metrics."""
        batch, metrics = self._builtin.sample(
            global_steps=global_steps, partition_id=partition_id, batch_size=batch_size
        )
        if partition_id != "val":  # validation discards sampler metrics; v1 logs its own
            untrained, sessions = untrained_sessions(batch)
            if sessions and untrained == sessions:
                logger.warning(
                    "step %d: all %d sessions of this mini-batch train on nothing (on_failure: exclude), "
                    "and verl v1 cannot skip it: with rollout correction (verl's default when the rollout "
                    "returns log-probs) it stops with 'response_mask must contain at least one valid "
                    "token'; otherwise it runs the update on a zero gradient (the loss logs NaN, AdamW "
                    "momentum and weight decay move the weights, the LR schedule advances)",
                    global_steps,
                    sessions,
                )
            step = self._step_metrics.add(global_steps, session_reward_extras(batch), untrained)
            metrics = {**metrics, **step}
        return batch, metrics

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

    def add(self, global_steps: int, extras: list[dict[str, Any]], untrained: int = 0) -> dict[str, float]:
        """Record one mini-batch (its sessions' extras, and how many of them train on nothing);
        returns the step's metrics once its last mini-batch is in, else {}."""
        if global_steps != self._step:
            self._step, self._calls, self._extras, self._untrained = global_steps, 0, [], 0
        self._calls += 1
        self._extras.extend(extras)
        self._untrained += untrained
        if self._calls < self.samples_per_step:
            return {}
        return {**extras_metrics(self._extras), "reward/untrained": float(self._untrained)}


def untrained_sessions(batch: KVBatchMeta) -> tuple[int, int]:
    """``(untrained, sessions)``: how many sessions of a sampled batch have no loss token in any of
    their outputs (``on_failure: exclude``: excluded ones and the rest of a starved group), of how many.

    Counted from ``loss_mask``, the field verl's engines count loss tokens from (``batch_num_tokens``).
    """
    real = [key for key, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get("is_padding", False)]
    if not real:
        return 0, 0
    data = tq.kv_batch_get(keys=real, partition_id=batch.partition_id, select_fields=["loss_mask"])
    tokens = data["loss_mask"].to_padded_tensor(0).sum(dim=1).tolist()
    trained: dict[str, bool] = {}
    for key, count in zip(real, tokens, strict=True):
        session = key.rpartition("_")[0]
        trained[session] = trained.get(session, False) or count > 0
    return sum(not value for value in trained.values()), len(trained)


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
    return PPOTrainer._build_replay_buffer(cast(PPOTrainer, factory))
