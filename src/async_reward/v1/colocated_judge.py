"""verl v1's score-the-batch step for a judge on the training GPUs, with what our managers read.

With ``reward.reward_model.enable=true`` and no ``enable_resource_pool`` the judge shares the training
GPUs: verl's v1 trainer samples a mini-batch, puts the policy to sleep, and calls
``PPOTrainer._compute_reward_colocate``, which wakes the judge, scores the whole mini-batch through
``RewardLoopManager.compute_rm_score`` and puts it back to sleep. verl 0.9.1's step hands the reward
workers only ``prompts``, ``responses``, ``attention_mask`` and ``raw_prompt``: no ground truth, no
``uid`` (so no group post-processing), no ``data_source`` or ``extra_info``, so ``llm_judge``'s
``correctness`` template fails every sample ("needs a ground truth").

:func:`compute_reward_colocate` is that step for our managers (the setup hook installs it on
``PPOTrainer``; verl's own step still runs for verl's managers). It also reads ``uid``,
``data_source``, ``reward_model``, ``extra_info``, ``global_steps``, the agent loop's ``extra_fields``
(our managers' ``tool_extra_fields``) and ``num_turns`` from TransferQueue, so the samples decode as
they do in the agent loop; ``compute_rm_score``'s ``assemble_rm_scores`` post-processes each ``uid``
group; and it writes back what the streaming path writes:

* ``rm_scores`` and each extras key (as verl's step does), and the session's ``reward_extra_info``
  in ``extra_fields``, where the replay buffer and the rest of our v1 integration read it;
* ``on_failure: exclude``, exactly as :class:`~async_reward.v1.agent_loop.RewardAgentLoopWorker`
  writes it: an excluded session, and every member of a group left with fewer than two scored ones,
  gets a zero ``response_mask`` / ``loss_mask`` and a ``uid`` of its own; the rows that could make one
  of verl's optimizer updates train on nothing are dropped (``RewardReplayBuffer``'s rule). A
  mini-batch in which no session trains cannot be generated again here (the policy is asleep; the
  streaming path skips it and generates its prompts again), so the step stops with that cause instead
  of an optimizer step on nothing;
* the scored mini-batch's extras into the step's ``reward/*`` count
  (:meth:`~async_reward.v1.replay_buffer.RewardReplayBuffer.record_scored`: the replay buffer saw the
  mini-batch before it was scored), so that with ``parameter_sync_step > 1`` the step is reported
  once, with its last mini-batch, rather than per mini-batch (verl's aggregator would average the
  counts).

If scoring raises (``on_failure: raise``), the judge is put back to sleep before the error goes on:
verl's ``compute_rm_score`` has no ``finally``, and an awake judge would hold the GPUs the policy
needs next.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl import DataProto
from verl.utils import tensordict_utils as tu

from async_reward.managers.base import AsyncRewardManager
from async_reward.training.exclusion import trainable_rows
from async_reward.v1.replay_buffer import StepRewardMetrics

__all__ = ["compute_reward_colocate", "install_colocate_step"]

logger = logging.getLogger(__name__)

#: What verl's own step reads; always written by verl's agent loop.
_REQUIRED_FIELDS = ("prompts", "responses", "raw_prompt")
#: What our managers read besides: dataset fields (``uid`` always; the others when the dataset has
#: them) and the agent loop's per-output fields.
_OPTIONAL_FIELDS = (
    "uid",
    "data_source",
    "reward_model",
    "extra_info",
    "global_steps",
    "extra_fields",
    "num_turns",
)
#: The masks verl's loss reads (engines ``loss_mask``, losses ``response_mask``); zeroed together.
_MASK_FIELDS = ("response_mask", "loss_mask")


def install_colocate_step(trainer_module: Any) -> None:
    """Make ``trainer_module.PPOTrainer._compute_reward_colocate`` run :func:`compute_reward_colocate`
    when the configured reward manager is one of ours (verl's step otherwise). Idempotent; called on
    ``verl.trainer.ppo.v1.trainer_base`` when it is imported (the setup hook)."""
    trainer_cls = getattr(trainer_module, "PPOTrainer", None)
    original = getattr(trainer_cls, "_compute_reward_colocate", None)
    if original is None or getattr(original, "_async_reward_colocate", False):
        return

    @functools.wraps(original)
    def compute_reward(self: Any, batch: KVBatchMeta, metrics: dict[str, Any] | None = None) -> KVBatchMeta:
        manager_cls = getattr(self.reward_loop_manager, "reward_manager_cls", None)
        if isinstance(manager_cls, type) and issubclass(manager_cls, AsyncRewardManager):
            return compute_reward_colocate(self, batch, metrics)
        return original(self, batch, metrics=metrics)

    compute_reward._async_reward_colocate = True  # type: ignore[attr-defined]
    trainer_cls._compute_reward_colocate = compute_reward  # type: ignore[union-attr]


def compute_reward_colocate(
    trainer: Any, batch: KVBatchMeta, metrics: dict[str, Any] | None = None
) -> KVBatchMeta:
    """Score a sampled mini-batch with the colocated judge (see the module docstring); returns the
    batch verl trains on (the same, or without rows that would leave an optimizer update empty).

    Raises:
        RuntimeError: no session of a training mini-batch has anything to train on.
    """
    manager = trainer.reward_loop_manager
    keys, partition = list(batch.keys), batch.partition_id
    data = _read_fields(keys, partition)
    pad = trainer.tokenizer.pad_token_id
    prompts = data["prompts"].to_padded_tensor(padding=pad)
    responses = data["responses"].to_padded_tensor(padding=pad)
    response_lengths = data["responses"].offsets().diff()
    attention_mask = torch.cat(
        [
            _mask(data["prompts"].offsets().diff(), prompts.size(1)),
            _mask(response_lengths, responses.size(1)),
        ],
        dim=1,
    )
    non_tensor = _non_tensor_fields(data, len(keys))
    rm_input = DataProto(
        batch=TensorDict(
            {"prompts": prompts, "responses": responses, "attention_mask": attention_mask},
            batch_size=len(keys),
        ),
        non_tensor_batch=non_tensor,
    )
    try:
        rm_output = manager.compute_rm_score(rm_input)  # wakes the judge, scores, puts it to sleep
    except BaseException:
        models = getattr(manager, "reward_model_manager", None)
        if models is not None:
            models.sleep()  # verl's compute_rm_score has no finally: do not leave it on the GPUs
        raise
    extra_keys = list(rm_output.meta_info.get("reward_extra_keys", []))
    extras = [
        {key: _plain(rm_output.non_tensor_batch[key][i]) for key in extra_keys} for i in range(len(keys))
    ]
    padded = rm_output.batch["rm_scores"]
    write: dict[str, Any] = {
        "rm_scores": torch.nested.as_nested_tensor(
            [padded[i, : response_lengths[i]] for i in range(len(keys))], layout=torch.jagged
        ),
        **{key: rm_output.non_tensor_batch[key] for key in extra_keys},
    }
    if "extra_fields" in data.keys():  # noqa: SIM118 (TensorDict membership needs keys())
        fields = [dict(item) if isinstance(item, dict) else {} for item in list(data["extra_fields"])]
        for field, info in zip(fields, extras, strict=True):
            field["reward_extra_info"] = info
        write["extra_fields"] = fields
    validate = partition == "val"
    untrained = np.zeros(len(keys), dtype=bool)
    if not validate:
        untrained = ~trainable_rows(
            np.array([_excluded(info) for info in extras], dtype=bool),
            np.asarray(non_tensor["uid"], dtype=object),
        )
    if untrained.any():
        _write_excluded(write, keys, partition, untrained, non_tensor["uid"])
    tq.kv_batch_put(keys=keys, partition_id=partition, fields=tu.get_tensordict(write))
    if validate:
        return batch
    untrained_sessions = len({keys[i].rpartition("_")[0] for i in np.flatnonzero(untrained)})
    step = _record_scored(trainer, _session_extras(keys, extras), untrained_sessions)
    if metrics is not None:
        metrics.update(step)
    if not untrained.any():
        return batch
    if untrained.all():
        raise RuntimeError(
            f"step {trainer.global_steps}: every session of this mini-batch has nothing to train on "
            "(on_failure: exclude, the colocated judge failed them all: see their failure_reason and "
            "reward/status_*). With a judge on the training GPUs (reward.reward_model.enable_resource_pool"
            "=false) the policy is asleep while it scores, so the mini-batch cannot be generated again; "
            "fix the judge, give it GPUs of its own (enable_resource_pool=true, where such a mini-batch is "
            "skipped and generated again), or use on_failure: fallback"
        )
    drop = getattr(trainer.replay_buffer, "_drop_surplus_untrained", None)
    return drop(batch, trainer.global_steps) if callable(drop) else batch


def _record_scored(trainer: Any, extras: list[dict[str, Any]], untrained: int) -> dict[str, float]:
    """Count a scored training mini-batch in its step's ``reward/*`` metrics; the step's metrics once
    its last mini-batch (of verl's ``parameter_sync_step``) is in, else {}. Our replay buffer keeps
    the count; with verl's own one the trainer keeps one of its own."""
    record = getattr(trainer.replay_buffer, "record_scored", None)
    if callable(record):
        return dict(record(trainer.global_steps, extras, untrained))
    counter = trainer.__dict__.get("_async_reward_step_metrics")
    if counter is None:
        counter = StepRewardMetrics(int(getattr(trainer, "parameter_sync_step", 1) or 1))
        trainer._async_reward_step_metrics = counter
    return counter.add(trainer.global_steps, extras, untrained)


def _read_fields(keys: list[str], partition: str) -> TensorDict:
    """The required fields, plus each optional one the batch has (a dataset may lack some): one read
    when all are there, else one per optional field."""
    try:
        return tq.kv_batch_get(
            keys=keys, partition_id=partition, select_fields=[*_REQUIRED_FIELDS, *_OPTIONAL_FIELDS]
        )
    except (ValueError, KeyError, RuntimeError):
        pass  # some optional field was never written for these keys
    data = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=list(_REQUIRED_FIELDS))
    for name in _OPTIONAL_FIELDS:
        try:
            more = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=[name])
        except (ValueError, KeyError, RuntimeError):
            continue
        if name in more.keys():  # noqa: SIM118 (TensorDict membership needs keys())
            data[name] = more[name]
    return data


def _non_tensor_fields(data: TensorDict, size: int) -> dict[str, np.ndarray]:
    """What our managers decode, under the names verl's agent loop gives them when it scores."""
    present = set(data.keys())
    renamed = {"extra_fields": "tool_extra_fields", "num_turns": "__num_turns__"}
    fields: dict[str, np.ndarray] = {}
    for name in ("raw_prompt", *_OPTIONAL_FIELDS):
        if name in present:
            fields[renamed.get(name, name)] = _object_array(list(data[name]), size)
    if "uid" not in fields:  # every row its own group (verl's agent loop always writes uid)
        fields["uid"] = _object_array([f"row-{i}" for i in range(size)], size)
    fields["uid"] = _object_array([str(uid) for uid in fields["uid"]], size)
    return fields


def _object_array(values: list[Any], size: int) -> np.ndarray:
    array = np.empty(size, dtype=object)
    array[:] = [_plain(value) for value in values]
    return array


def _plain(value: Any) -> Any:
    """A scalar tensor / numpy scalar as a Python value; anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """A right-padded mask of ``width`` columns from per-row lengths (verl's ``_lengths_to_mask``)."""
    return (torch.arange(width, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)


def _excluded(info: dict[str, Any]) -> bool:
    value = info.get("excluded")
    return isinstance(value, bool | np.bool_) and bool(value)


def _write_excluded(
    write: dict[str, Any], keys: list[str], partition: str, untrained: np.ndarray, uids: np.ndarray
) -> None:
    """Zero loss and response masks and a ``uid`` of its own for each untrained row, as our agent loop
    writes an excluded session (:func:`async_reward.v1.agent_loop.excluded_uid`)."""
    from async_reward.v1.agent_loop import excluded_uid

    masks = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=list(_MASK_FIELDS))
    for name in _MASK_FIELDS:
        rows = [row * 0 if untrained[i] else row for i, row in enumerate(masks[name].unbind())]
        write[name] = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    own = []
    for i, key in enumerate(keys):
        session = int(key.rsplit("_", 2)[1])  # keys are {uid}_{session_id}_{index}
        own.append(excluded_uid(str(uids[i]), session) if untrained[i] else uids[i])
    write["uid"] = _object_array(own, len(keys))


def _session_extras(keys: list[str], extras: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each session's extras once, by its last output (``{uid}_{session}_{index}`` keys)."""
    last: dict[str, tuple[int, int]] = {}
    for position, key in enumerate(keys):
        session, _, index = key.rpartition("_")
        order = int(index) if index.isdigit() else 0
        if session not in last or last[session][0] < order:
            last[session] = (order, position)
    return [extras[position] for _, position in sorted(last.values(), key=lambda item: item[1])]
