"""The rollout side of the pipelined trainer: verl's agent loop with its reward loop off, and
validation batches scored by the pipeline instead.

verl's agent loop scores each sample inside the rollout (its "agent reward loop") and
``generate_sequences`` returns only when every score is in. The pipelined trainer scores through a
``PipelinedRewardLoopManager`` instead, so the rollout must come back unscored:
:class:`ScoreLaterAgentLoopManager` is verl's manager built without reward handles, and
:class:`ScoreValidation` fills in the rewards that verl's ``_validate`` reads from the rollout.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from verl import DataProto
from verl.experimental.agent_loop import AgentLoopManager

from async_reward.training.schedule import RewardSource

__all__ = ["SCORE_LATER", "ScoreLaterAgentLoopManager", "ScoreValidation"]


class ScoreLaterAgentLoopManager(AgentLoopManager):
    """verl's ``AgentLoopManager`` with the agent reward loop off: its workers get no reward handles,
    so ``generate_sequences`` does not wait for scores and returns the input's non-tensor fields
    (``uid``, ``reward_model``, ...) for the pipeline to score with."""

    def __init__(
        self, config: Any, llm_client: Any, teacher_client: Any = None, reward_loop_worker_handles: Any = None
    ) -> None:
        super().__init__(config, llm_client, teacher_client, reward_loop_worker_handles=None)  # type: ignore[arg-type]


#: The class path ``init_workers`` puts in ``actor_rollout_ref.rollout.agent.agent_loop_manager_class``.
SCORE_LATER = f"{ScoreLaterAgentLoopManager.__module__}.{ScoreLaterAgentLoopManager.__qualname__}"


class ScoreValidation:
    """The rollout manager, plus rewards for validation batches: verl's ``_validate`` reads
    ``rm_scores`` from the rollout's output, which the agent reward loop no longer fills."""

    def __init__(self, inner: Any, rewards: RewardSource) -> None:
        self._inner, self._rewards = inner, rewards

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        output = self._inner.generate_sequences(prompts)
        if prompts.meta_info.get("validate") and "rm_scores" not in output.batch:
            chunk = self._rewards.get_chunk(self._rewards.submit(output), len(output))
            output.batch["rm_scores"] = chunk.rm_scores  # indices are all of them, sorted
            output.non_tensor_batch.update({k: np.asarray(v) for k, v in chunk.reward_extra_info.items()})
            output.meta_info["reward_extra_keys"] = list(chunk.reward_extra_info)
        return output

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
