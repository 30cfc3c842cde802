"""The agent loop of the ``pipelined`` v1 trainer mode: each session written when generated, scored after.

verl's ``AgentLoopWorkerTQ`` scores a session and then writes it to TransferQueue, so a trainer can do
nothing with a batch's trajectories until their rewards are in. The pipelined mode computes old and
reference log-probs while the rewards are still in flight, so its worker splits that write in two:

1. as soon as a session is generated, verl's own write puts its trajectory in TransferQueue, without
   ``rm_scores`` (verl's scoring is skipped for that one call);
2. the session is then scored through the reward workers (our managers), waits at its group's
   :class:`~async_reward.v1.groups.GroupGate` (group post-processing, ``on_failure: exclude``) exactly
   as under :class:`~async_reward.v1.agent_loop.RewardAgentLoopWorker`, and only then its
   ``rm_scores`` and reward extras are written (an excluded session also gets zero
   ``response_mask`` / ``loss_mask`` and a ``uid`` of its own).

verl tags the prompt ``finished`` (or ``failure``) once every session has settled, i.e. after step 2,
so a terminal prompt tag means "every session scored": the trainer reads a group's state from the
tags alone. Validation sessions take verl's path unchanged (score, then write).

:func:`use_pipelined_agent_loop` names this manager (or, for a dry run, :class:`DryRunAgentLoopManager`,
which starts nothing) in the config verl's task runner reads, refusing one that would score first.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

import ray
import torch
import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from async_reward.config import ConfigError
from async_reward.config.v1 import AGENT_LOOP_MANAGER
from async_reward.v1.agent_loop import (
    DRY_RUN_AGENT_LOOP_MANAGER,
    RewardAgentLoopManager,
    RewardAgentLoopWorker,
    _VerlWorker,
    excluded_uid,
    is_excluded,
)
from async_reward.v1.pipelined.config import PIPELINED_MODE, is_pipelined_mode

__all__ = [
    "PIPELINED_AGENT_LOOP_MANAGER",
    "PipelinedAgentLoopManager",
    "PipelinedAgentLoopWorker",
    "use_pipelined_agent_loop",
]

logger = logging.getLogger(__name__)

#: ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` of the pipelined mode (the trainer sets it).
PIPELINED_AGENT_LOOP_MANAGER = "async_reward.v1.pipelined.agent_loop.PipelinedAgentLoopManager"

#: Set only inside the task of a session whose trajectory is being written before its score: verl's
#: write calls ``_compute_score`` first, and every session of the worker shares the worker object,
#: so a per-task flag (a context variable) is what skips scoring for that one call.
_WRITING_UNSCORED: ContextVar[bool] = ContextVar("async_reward_writing_unscored", default=False)


class PipelinedAgentLoopWorker(RewardAgentLoopWorker):
    """``RewardAgentLoopWorker`` that writes each training session before scoring it."""

    async def _compute_score(self, outputs: list[Any], kwargs: dict[str, Any]) -> None:
        if _WRITING_UNSCORED.get():
            return
        await super()._compute_score(outputs, kwargs)

    async def _agent_loop_postprocess(self, output: Any, validate: bool, **kwargs: Any) -> None:
        outputs = output if isinstance(output, list) else [output]
        uid, session_id = str(kwargs["uid"]), int(kwargs["session_id"])
        gate = self._gates.get(uid)
        if validate or gate is None or not outputs:
            await super()._agent_loop_postprocess(output, validate, **kwargs)
            return
        flag = _WRITING_UNSCORED.set(True)
        try:  # verl's own write of the trajectory, its scoring skipped: the trainer may read it now
            await _VerlWorker._agent_loop_postprocess(self, output, validate, **kwargs)
        finally:
            _WRITING_UNSCORED.reset(flag)
        await self._compute_score(outputs, kwargs)  # raises under on_failure: raise -> group "failure"
        final = outputs[-1]
        flagged = is_excluded(final.extra_fields.get("reward_extra_info"))
        final.reward_score = await gate.arrive(session_id, final.reward_score, excluded=flagged)
        exclude = flagged or gate.starved
        await tq.async_kv_batch_put(
            keys=[f"{uid}_{session_id}_{index}" for index in range(len(outputs))],
            partition_id="train",
            fields=list_of_dict_to_tensordict(
                [_score_fields(item, final, uid, session_id, exclude) for item in outputs]
            ),
        )


def _score_fields(item: Any, final: Any, uid: str, session_id: int, exclude: bool) -> dict[str, Any]:
    """What step 2 writes for one output of a session: its ``rm_scores`` laid out as verl's
    ``AgentLoopOutput.as_dict`` does (the score on the last response token), the session's reward
    extras, and for an excluded session the masks and ``uid`` verl gives its padding samples."""
    length = len(item.response_mask)
    rm_scores = torch.zeros(length, dtype=torch.float32)
    if length and final.reward_score is not None:
        rm_scores[-1] = float(final.reward_score)
    extra_fields = dict(item.extra_fields)
    extra_fields["reward_extra_info"] = final.extra_fields.get("reward_extra_info")
    fields: dict[str, Any] = {"rm_scores": rm_scores, "extra_fields": extra_fields}
    if exclude:
        zeros = torch.zeros(length, dtype=torch.int64)
        fields.update(response_mask=zeros, loss_mask=zeros.clone(), uid=excluded_uid(uid, session_id))
    return fields


PipelinedAgentLoopWorkerActor: Any = ray.remote(PipelinedAgentLoopWorker)


class PipelinedAgentLoopManager(RewardAgentLoopManager):
    """verl v1's agent-loop manager running :class:`PipelinedAgentLoopWorker` actors; only under
    ``trainer.v1.trainer_mode=pipelined`` (another mode would read tags that mean something else)."""

    def __init__(
        self,
        config: DictConfig,
        llm_client: Any,
        teacher_client: Any = None,
        reward_loop_worker_handles: list[Any] | None = None,
    ) -> None:
        if not is_pipelined_mode(config):
            raise ConfigError(
                f"{PIPELINED_AGENT_LOOP_MANAGER} runs under trainer.use_v1=true "
                f"trainer.v1.trainer_mode={PIPELINED_MODE} only",
                key="actor_rollout_ref.rollout.agent.agent_loop_manager_class",
                fix="unset it: the pipelined mode sets it itself",
            )
        super().__init__(config, llm_client, teacher_client, reward_loop_worker_handles)
        self.agent_loop_workers_class = PipelinedAgentLoopWorkerActor


def use_pipelined_agent_loop(config: DictConfig, dry_run: bool) -> None:
    """Name the mode's agent-loop manager (verl's task runner reads it after building the trainer).

    Ours from the README's v1 lines (``RewardAgentLoopManager``) is replaced by its pipelined
    subclass, logged; any other manager is refused: it would score before writing, and the step
    would wait for rewards before its log-probs."""
    agent = config.actor_rollout_ref.rollout.agent
    current = agent.get("agent_loop_manager_class")
    if dry_run:
        wanted = DRY_RUN_AGENT_LOOP_MANAGER
    else:
        wanted = PIPELINED_AGENT_LOOP_MANAGER
        if current not in (
            None,
            "",
            AGENT_LOOP_MANAGER,
            PIPELINED_AGENT_LOOP_MANAGER,
        ) and not _is_pipelined_manager(str(current)):
            raise ConfigError(
                f"actor_rollout_ref.rollout.agent.agent_loop_manager_class={current} cannot run "
                f"trainer.v1.trainer_mode={PIPELINED_MODE}: the mode needs each session written to "
                f"TransferQueue before it is scored ({PIPELINED_AGENT_LOOP_MANAGER}, or a subclass)",
                key="actor_rollout_ref.rollout.agent.agent_loop_manager_class",
                fix=f"unset it, or subclass {PIPELINED_AGENT_LOOP_MANAGER}",
            )
        if current not in (None, "") and _is_pipelined_manager(str(current)):
            wanted = str(current)
        elif current == AGENT_LOOP_MANAGER:
            logger.info("trainer_mode=pipelined: %s replaced by its subclass %s", current, wanted)
    with open_dict(config):
        agent.agent_loop_manager_class = wanted


def _is_pipelined_manager(fqn: str) -> bool:
    from verl.utils.import_utils import load_class_from_fqn

    try:
        cls = load_class_from_fqn(fqn, "AgentLoopManager")
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, PipelinedAgentLoopManager)
