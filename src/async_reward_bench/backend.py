"""The benchmark's GPU side: calibrated waits around real verl batches.

The GPU stages cannot run here, so each one sleeps its (time-scaled) median from the recipe's logs;
on a real machine they do not use the host CPU either. Everything a reward path touches is real: the
batches are verl ``DataProto``s of the recipe's shape whose responses are token ids of a tokenizer
built locally, answering arithmetic questions right or wrong so the judge has something to judge;
advantages are verl's own GRPO on each (mini-)batch. The tokenizer is
``async_reward.testing``'s, trained locally (no hub access needed).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from async_reward_bench.calibration import StageMedians

__all__ = ["BatchFactory", "CalibratedBackend"]


@dataclass
class BatchFactory:
    """Builds one step's rollout: ``prompts`` arithmetic questions x ``group_size`` responses.

    Each response is right with probability ``p_correct``; every prompt and response text is unique
    within a run (``tag`` and the step are in the prompt, the sample number in the response), so the
    judge client never merges identical requests and each sample costs the service one request.
    """

    tokenizer: Any
    prompts: int
    group_size: int
    prompt_length: int = 48
    response_length: int = 48
    p_correct: float = 0.5
    seed: int = 0
    tag: int = 0
    """Changed per benchmark run, so two runs never send identical requests."""

    @property
    def size(self) -> int:
        return self.prompts * self.group_size

    def texts(self, step: int) -> tuple[list[str], list[str], list[str]]:
        """Prompt, response and ground truth of every sample of ``step``, in batch order."""
        rng = random.Random(f"{self.seed}:{self.tag}:{step}")
        prompts, responses, truths = [], [], []
        for p in range(self.prompts):
            a, b = rng.randint(10, 999), rng.randint(10, 999)
            question = f"Run {self.tag} step {step} problem {p}: what is {a} + {b}? Think step by step."
            for j in range(self.group_size):
                answer = a + b if rng.random() < self.p_correct else a + b + rng.randint(1, 9)
                prompts.append(question)
                responses.append(f"Sample {j}: {a} + {b} = {answer}. The answer is \\boxed{{{answer}}}.")
                truths.append(str(a + b))
        return prompts, responses, truths

    def make(self, step: int) -> Any:
        """A verl ``DataProto`` shaped like a rollout: left-padded prompts, right-padded responses."""
        from async_reward.testing import rollout_batch

        prompts, responses, truths = self.texts(step)
        n = len(prompts)
        return rollout_batch(
            self.tokenizer,
            prompts,
            responses,
            truths,
            uids=[f"{self.tag}-{step}-{i // self.group_size}" for i in range(n)],
            data_source="gsm8k_sim",
            extra_infos=[{"index": i, "step": step} for i in range(n)],
            prompt_length=self.prompt_length,
            response_length=self.response_length,
        )


class CalibratedBackend:
    """``ScheduleBackend`` whose GPU stages take the calibrated (scaled) median times.

    Each stage sleeps until its start plus its median, so the CPU work of building a batch is hidden
    inside the stage time rather than added to it. ``update`` takes a share of ``update_actor_s``
    proportional to the samples it is given (a quarter for each of four equal mini-batches).
    """

    def __init__(
        self,
        stages: StageMedians,
        factory: BatchFactory,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.stages = stages
        """Scaled medians; swap them between regimes."""
        self.factory = factory
        self.clock, self.sleep = clock, sleep

    def _until(self, deadline: float) -> None:
        left = deadline - self.clock()
        if left > 0:
            self.sleep(left)

    def rollout(self, step: int) -> Any:
        deadline = self.clock() + self.stages.gen_s
        batch = self.factory.make(step)
        self._until(deadline)
        return batch

    def prepare(self, batch: Any) -> Any:
        deadline = self.clock() + self.stages.prepare_s
        zeros = torch.zeros(batch.batch["responses"].shape, dtype=torch.float32)
        batch.batch["old_log_probs"] = zeros
        batch.batch["ref_log_prob"] = zeros.clone()
        self._until(deadline)
        return batch

    def compute_advantage(self, batch: Any) -> Any:
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        width = batch.batch["responses"].shape[1]
        response_mask = batch.batch["attention_mask"][:, -width:]
        advantages, returns = compute_grpo_outcome_advantage(
            token_level_rewards=batch.batch["rm_scores"],
            response_mask=response_mask,
            index=batch.non_tensor_batch["uid"],
        )
        batch.batch["advantages"], batch.batch["returns"] = advantages, returns
        return batch

    def update(self, batch: Any, step: int) -> dict[str, float]:
        deadline = self.clock() + self.stages.update_actor_s * len(batch) / self.factory.size
        scores = batch.batch["rm_scores"].sum(dim=1)
        self._until(deadline)
        return {"actor/score_mean": float(scores.mean()), "actor/samples": float(len(batch))}
