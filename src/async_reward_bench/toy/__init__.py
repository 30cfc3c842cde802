"""A toy task a tiny torch policy learns on CPU with GRPO, for end-to-end learning-parity checks.

``TinyPolicy`` with ``ppo_update`` / ``compute_log_probs`` (``policy``), the single-digit arithmetic
task, its character tokenizer and prompt batches (``task``), ``ToyBackend``, the
:class:`~async_reward.training.schedule.StepSchedule` backend that rolls out, prepares and updates
the policy for real, and ``LocalRewards``, an in-process reward source (``backend``). The parity
benchmark is ``async_reward_bench.toy.parity`` (its verdict: ``async_reward_bench.toy.parity_report``).
"""

from __future__ import annotations

from async_reward_bench.toy.backend import LocalRewards, ToyBackend, evaluate_accuracy, expected_score
from async_reward_bench.toy.policy import TinyPolicy, compute_log_probs, ppo_update
from async_reward_bench.toy.task import ArithmeticTask, PromptSampler, build_char_tokenizer, exact_match

__all__ = [
    "ArithmeticTask",
    "LocalRewards",
    "PromptSampler",
    "TinyPolicy",
    "ToyBackend",
    "build_char_tokenizer",
    "compute_log_probs",
    "evaluate_accuracy",
    "exact_match",
    "expected_score",
    "ppo_update",
]
