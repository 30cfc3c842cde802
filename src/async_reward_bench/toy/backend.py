"""``ToyBackend``: the schedule's GPU stages done for real by a tiny torch policy on CPU.

:class:`~async_reward.training.schedule.StepSchedule` calls ``rollout`` (sample ``group_size``
responses per prompt and keep their log-probs as behaviour log-probs), ``prepare`` (old log-probs
under the current, pre-update policy), ``compute_advantage`` (verl's own
``compute_grpo_outcome_advantage`` on the chunk's ``rm_scores`` grouped by ``uid``) and ``update``
(one PPO step with verl's registered policy loss). No reference policy: the toy uses neither a KL
loss nor a KL reward penalty (verl's defaults ``use_kl_loss=False``, ``use_kl_in_reward=False``), so
``ref_log_prob`` is never computed. No critic: GRPO needs none.

:class:`LocalRewards` is a ``RewardSource`` that scores in-process with the dev server judge's rule,
for runs (and tests) without Ray or HTTP.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from async_reward_bench.toy.policy import TinyPolicy, compute_log_probs, ppo_update, response_mask_of
from async_reward_bench.toy.task import (
    ArithmeticTask,
    PromptSampler,
    decode_responses,
    encode_prompts,
    exact_match,
)

if TYPE_CHECKING:
    from verl import DataProto

__all__ = ["LocalRewards", "ToyBackend", "evaluate_accuracy", "expected_score"]


class ToyBackend:
    """``ScheduleBackend`` over a :class:`TinyPolicy`; deterministic given ``seed``.

    Args:
        policy: the policy, trained in place.
        optimizer: its optimizer.
        sampler: the prompt batches (``sampler.make(step)``).
        tokenizer: the task's tokenizer (pad and eos ids).
        max_new_tokens: response length (default: the task's longest answer plus eos).
        temperature: sampling temperature of rollouts, also used for every log-prob (as verl does).
        clip_ratio: PPO clip range.
        ppo_epochs: optimizer steps on each (mini-)batch given to ``update``.
        entropy_coeff: weight of the entropy bonus (verl's ``actor.entropy_coeff``).
        rollout_is_threshold: when set, ``prepare`` computes verl's truncated token-level importance
            weights (``compute_rollout_correction_weights``, old over behaviour log-probs, capped at
            this value) and the loss applies them: the correction for one-step-off batches, whose
            ``prepare`` runs after the previous step's updates, so ``old_log_probs`` (the proximal
            policy) is one version newer than the sampling policy. None (default) trains on
            ``old_log_probs`` alone, as plain PPO does; for on-policy batches the weights are 1.
        seed: seeds the sampling of step ``k`` with ``(seed, k)``, so a rollout depends only on the
            policy's weights and the step.
    """

    def __init__(
        self,
        policy: TinyPolicy,
        optimizer: torch.optim.Optimizer,
        sampler: PromptSampler,
        tokenizer: Any,
        *,
        max_new_tokens: int | None = None,
        temperature: float = 1.0,
        clip_ratio: float = 0.2,
        ppo_epochs: int = 1,
        entropy_coeff: float = 0.0,
        rollout_is_threshold: float | None = None,
        seed: int = 0,
    ) -> None:
        if temperature <= 0:
            raise ValueError(f"rollouts sample: temperature must be > 0, got {temperature}")
        self.policy = policy
        self.optimizer = optimizer
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens or sampler.task.max_response_tokens
        self.temperature = temperature
        self.clip_ratio = clip_ratio
        self.ppo_epochs = ppo_epochs
        self.entropy_coeff = entropy_coeff
        self.rollout_is_threshold = rollout_is_threshold
        self.seed = seed
        self.optimizer_steps = 0
        """Optimizer steps taken so far."""
        self.policy_version = 0
        """Training steps completed: the version of the policy a rollout now would use."""

    def rollout(self, step: int) -> DataProto:
        """Sample ``group_size`` responses per prompt of ``step`` with the current policy."""
        batch = self.sampler.make(step)
        prompts, prompt_mask = batch.batch["input_ids"], batch.batch["attention_mask"]
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        self.policy.eval()
        responses, response_mask = self.policy.generate(
            prompts,
            prompt_mask,
            self.max_new_tokens,
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
            temperature=self.temperature,
            generator=generator,
        )
        batch.batch["prompts"] = prompts
        batch.batch["responses"] = responses
        batch.batch["response_mask"] = response_mask
        batch.batch["input_ids"] = torch.cat([prompts, responses], dim=1)
        batch.batch["attention_mask"] = torch.cat([prompt_mask, response_mask], dim=1)
        batch.meta_info["temperature"] = self.temperature
        batch.meta_info["policy_version"] = self.policy_version
        # Behaviour log-probs, under verl's name, for rollout correction of off-policy batches.
        batch.batch["rollout_log_probs"] = compute_log_probs(self.policy, batch)
        return batch

    def prepare(self, batch: DataProto) -> DataProto:
        """``old_log_probs`` under the current (pre-update) policy; no reference, no values."""
        self.policy.eval()
        batch.batch["old_log_probs"] = compute_log_probs(self.policy, batch)
        if self.rollout_is_threshold is not None:
            from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

            weights, _ = compute_rollout_correction_weights(
                log_ratio=batch.batch["old_log_probs"] - batch.batch["rollout_log_probs"],
                response_mask=response_mask_of(batch),
                rollout_is="token",
                rollout_is_threshold=self.rollout_is_threshold,
            )
            batch.batch["rollout_is_weights"] = weights
        return batch

    def compute_advantage(self, batch: DataProto) -> DataProto:
        """verl's GRPO advantages on the (mini-)batch, grouped by ``uid``."""
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        advantages, returns = compute_grpo_outcome_advantage(
            token_level_rewards=batch.batch["rm_scores"],
            response_mask=response_mask_of(batch),
            index=batch.non_tensor_batch["uid"],
        )
        batch.batch["advantages"], batch.batch["returns"] = advantages, returns
        return batch

    def update(self, batch: DataProto, step: int) -> dict[str, float]:
        """``ppo_epochs`` PPO steps on the (mini-)batch; metrics averaged over the epochs."""
        runs = [
            ppo_update(
                self.policy,
                self.optimizer,
                batch,
                clip_ratio=self.clip_ratio,
                entropy_coeff=self.entropy_coeff,
            )
            for _ in range(self.ppo_epochs)
        ]
        self.optimizer_steps += len(runs)
        self.policy_version = step + 1
        metrics = {key: float(np.mean([run[key] for run in runs])) for key in runs[0]}
        metrics["critic/score/mean"] = float(batch.batch["rm_scores"].sum(dim=-1).mean())
        return metrics


@torch.no_grad()
def evaluate_accuracy(
    policy: TinyPolicy,
    task: ArithmeticTask,
    tokenizer: Any,
    problems: Sequence[tuple[int, int]] | None = None,
    *,
    max_new_tokens: int | None = None,
) -> float:
    """Fraction of ``problems`` (default: all of the task's) the policy answers right, greedily,
    judged by the dev server's rule on the decoded response."""
    problems = list(problems) if problems is not None else task.problems
    batch = encode_prompts(task, tokenizer, problems)
    was_training = policy.training
    policy.eval()
    responses, mask = policy.generate(
        batch.batch["input_ids"],
        batch.batch["attention_mask"],
        max_new_tokens or task.max_response_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        temperature=0.0,
    )
    policy.train(was_training)
    texts = decode_responses(tokenizer, responses, mask)
    truths = [item["ground_truth"] for item in batch.non_tensor_batch["reward_model"]]
    return float(np.mean([exact_match(t, g) for t, g in zip(texts, truths, strict=True)]))


def expected_score(
    policy: TinyPolicy,
    task: ArithmeticTask,
    tokenizer: Any,
    problems: Sequence[tuple[int, int]] | None = None,
    *,
    temperature: float = 1.0,
    accept: Callable[[str, str], bool] = exact_match,
) -> float:
    """:func:`expected_scores` for one rule, ``accept`` (the dev server's unless given)."""
    (score,) = expected_scores(policy, task, tokenizer, problems, temperature=temperature, accepts=(accept,))
    return score


@torch.no_grad()
def expected_scores(
    policy: TinyPolicy,
    task: ArithmeticTask,
    tokenizer: Any,
    problems: Sequence[tuple[int, int]] | None = None,
    *,
    temperature: float = 1.0,
    accepts: Sequence[Callable[[str, str], bool]] = (exact_match,),
) -> list[float]:
    """For each rule of ``accepts``, the probability that a response sampled at ``temperature`` is
    judged right by it, averaged over ``problems`` (default: all of the task's): exact, by enumerating
    every response the sampler can produce (up to ``task.max_response_tokens`` tokens, ending at
    ``<eos>`` or cut there) once, each judged by ``accept(decoded text, reference)`` (the composite
    comparison asks for right, and for right *and* bare, ``task.is_bare``, from one enumeration).

    Why: a training run's sampled score (32 draws a step) and greedy accuracy (steps of 0.25 on 4
    problems) are too coarse to tell learning from luck in a short run; this moves smoothly with the
    weights and has no sampling noise. Enumeration costs ``vocab ** (tokens - 1)`` policy calls' worth
    of rows per problem, so it is refused beyond 3 response tokens (single-digit operands need 3).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (a sampled response), got {temperature}")
    length = task.max_response_tokens
    if length > 3:
        raise ValueError(f"expected_score enumerates every response; {length} tokens is too many (at most 3)")
    problems = list(problems) if problems is not None else task.problems
    batch = encode_prompts(task, tokenizer, problems)
    prompts, prompt_mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    truths = [item["ground_truth"] for item in batch.non_tensor_batch["reward_model"]]
    eos, vocab = int(tokenizer.eos_token_id), policy.vocab_size
    # live prefixes: (problem index, tokens so far, log-probability of those tokens)
    live: list[tuple[int, list[int], float]] = [(i, [], 0.0) for i in range(len(problems))]
    right = np.zeros((len(accepts), len(problems)))
    was_training = policy.training
    policy.eval()
    try:
        for position in range(length):
            rows = [i for i, _, _ in live]
            tails = torch.tensor([[*tokens, 0] for _, tokens, _ in live], dtype=torch.long)
            ids = torch.cat([prompts[rows], tails], dim=1)
            mask = torch.cat([prompt_mask[rows], torch.ones_like(tails)], dim=1)
            logits = policy.response_logits(ids, mask, position + 1, temperature)[:, -1]
            log_probs = torch.log_softmax(logits.double(), dim=-1).tolist()
            grown: list[tuple[int, list[int], float]] = []
            for (i, tokens, logp), next_log_probs in zip(live, log_probs, strict=True):
                for token in range(vocab):
                    sequence, total = [*tokens, token], logp + next_log_probs[token]
                    if token == eos or position == length - 1:
                        text = tokenizer.decode(sequence, skip_special_tokens=True)
                        probability = float(np.exp(total))
                        for k, accept in enumerate(accepts):
                            right[k, i] += probability * accept(text, truths[i])
                    else:
                        grown.append((i, sequence, total))
            live = grown
    finally:
        policy.train(was_training)
    return [float(row.mean()) for row in right]


@dataclass
class _LocalTicket:
    batch: DataProto
    scores: np.ndarray
    groups: list[np.ndarray]
    next_group: int = 0


class LocalRewards:
    """A ``RewardSource`` scoring in-process, at submit, with the dev server judge's rule.

    Scores are 1.0 for a correct final answer and 0.0 otherwise (the judge's ``[[10]]``/``[[0]]``
    normalised to [0, 1]). Chunks hold complete groups in order of their first member, laid out by
    the same ``assemble_rm_scores`` as the pipelined manager's.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._tickets: dict[int, _LocalTicket] = {}
        self._next = 0

    def submit(self, batch: DataProto, group_key: str = "uid") -> int:
        texts = decode_responses(self.tokenizer, batch.batch["responses"], response_mask_of(batch))
        truths = [item["ground_truth"] for item in batch.non_tensor_batch["reward_model"]]
        scores = np.array([float(exact_match(t, g)) for t, g in zip(texts, truths, strict=True)])
        keys = batch.non_tensor_batch.get(group_key)
        keys = keys if keys is not None else np.arange(len(batch))
        first: dict[Any, list[int]] = {}
        for i, key in enumerate(keys):
            first.setdefault(key, []).append(i)
        ticket = self._next
        self._next += 1
        groups = [np.array(members, dtype=np.int64) for members in first.values()]
        self._tickets[ticket] = _LocalTicket(batch, scores, groups)
        return ticket

    def get_chunk(self, ticket: int, n_samples: int, timeout: float | None = None) -> Any:
        state = self._tickets[ticket]
        taken: list[np.ndarray] = []
        count = 0
        while state.next_group < len(state.groups) and count < n_samples:
            taken.append(state.groups[state.next_group])
            count += len(taken[-1])
            state.next_group += 1
        if not taken:
            raise ValueError(f"ticket {ticket} has no samples left")
        indices = np.sort(np.concatenate(taken))
        if state.next_group == len(state.groups):
            del self._tickets[ticket]
        scores = state.scores[indices]
        return _Chunk(
            indices=indices,
            rm_scores=_rm_scores(state.batch, indices, scores.tolist()),
            reward_extra_info={"acc": scores.astype(np.float32)},
        )

    def ticket_metrics(self, ticket: int) -> dict[str, float]:
        return {}

    def cancel(self, ticket: int) -> None:
        self._tickets.pop(ticket, None)


def _rm_scores(batch: DataProto, indices: np.ndarray, scores: list[float]) -> torch.Tensor:
    """``rm_scores`` of ``batch[indices]`` as verl lays them out (``RewardManagerBase.assemble_rm_scores``:
    each score on the sample's last response token), from the three fields that layout reads."""
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

    index = torch.from_numpy(np.asarray(indices, dtype=np.int64))
    fields = {key: batch.batch[key][index] for key in ("prompts", "responses", "attention_mask")}
    return RewardManagerBase.assemble_rm_scores(DataProto.from_dict(fields), scores)


@dataclass
class _Chunk:
    indices: np.ndarray
    rm_scores: torch.Tensor
    reward_extra_info: dict[str, np.ndarray]
