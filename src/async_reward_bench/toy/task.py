"""Single-digit arithmetic: the toy's verifiable task, its character tokenizer and its prompt batches.

A prompt is ``"a+b="`` with ``a, b`` in ``0..max_operand``; the answer is ``a + b`` (mod ``modulus``
when set), written in digits and ended by ``<eos>``. Responses are judged by the dev server's rule
(the final number of the decoded response equals the reference), which :func:`exact_match` applies
locally for cheap evaluation.

The tokenizer is one token per character, saved as a Hugging Face ``PreTrainedTokenizerFast``
directory so verl's reward workers load it from ``actor_rollout_ref.model.path`` like a model's. Its
decoder concatenates tokens without spaces and ``skip_special_tokens=True`` drops ``<pad>``/``<eos>``,
so the answer tokens of ``12<eos><pad>`` decode to exactly ``"12"``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from async_reward.tools.devserver.judge import answers_match, extract_final_answer

if TYPE_CHECKING:
    from verl import DataProto

__all__ = [
    "SPECIAL_TOKENS",
    "STRAY_SYMBOLS",
    "ArithmeticTask",
    "PromptSampler",
    "build_char_tokenizer",
    "compute_score",
    "exact_match",
    "is_bare",
]

#: Special tokens, first in the vocabulary: ``<pad>`` is id 0, ``<eos>`` id 1.
SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<eos>")
_CHARS = "0123456789+="


def build_char_tokenizer(directory: str | Path | None = None) -> Any:
    """The character-level tokenizer (``<pad>``, ``<eos>``, digits, ``+``, ``=``): 14 tokens.

    Saved to ``directory`` with ``save_pretrained`` when given. Returns a ``PreTrainedTokenizerFast``
    whose ``decode(ids, skip_special_tokens=True)`` gives back the characters exactly.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *_CHARS])}
    core = Tokenizer(models.WordLevel(vocab=vocab))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    # Fuse joins the tokens into one string: no spaces between characters.
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
    if directory is not None:
        tokenizer.save_pretrained(str(directory))
    return tokenizer


def exact_match(response: str, ground_truth: str) -> bool:
    """The dev server judge's rule: the response's final answer (last ``\\boxed{}`` or number) matches."""
    return answers_match(extract_final_answer(response), ground_truth)


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None, **_: Any
) -> float:
    """The toy's rule as a verl reward function (``reward.custom_reward_function``, path
    ``pkg://async_reward_bench.toy.task``): 1.0 when :func:`exact_match`, else 0.0. The rule of the
    benchmark's ``rule`` arms, scored in the reward worker without a judge call."""
    return float(exact_match(solution_str, ground_truth))


#: Characters of the toy's vocabulary that are not part of an answer. The rule does not see them (the
#: final number of ``"7="`` or ``"+7"`` is 7, right for ``3+4=``); the gated judge of the ``rule_judge``
#: arm grades them (``async_reward_bench.toy.v1_parity``).
STRAY_SYMBOLS: tuple[str, ...] = ("+", "=")


def is_bare(response: str) -> bool:
    """Whether a decoded response writes no :data:`STRAY_SYMBOLS`: the answer and nothing else,
    the property the ``rule_judge`` arm's judge grades and the rule does not."""
    return not any(symbol in response for symbol in STRAY_SYMBOLS)


@dataclass(frozen=True)
class ArithmeticTask:
    """Which problems exist and what their answers are."""

    max_operand: int = 9
    """Operands are drawn from ``0..max_operand`` (at most 9: single digits)."""
    modulus: int | None = None
    """When set, the answer is ``(a + b) % modulus`` (10 keeps every answer one digit)."""
    data_source: str = "toy_arithmetic"

    def __post_init__(self) -> None:
        if not 0 <= self.max_operand <= 9:
            raise ValueError(f"max_operand must be a single digit, got {self.max_operand}")
        if self.modulus is not None and self.modulus < 1:
            raise ValueError(f"modulus must be >= 1, got {self.modulus}")

    def answer(self, a: int, b: int) -> int:
        total = a + b
        return total % self.modulus if self.modulus else total

    @property
    def problems(self) -> list[tuple[int, int]]:
        """Every ``(a, b)``, in a fixed order."""
        values = range(self.max_operand + 1)
        return [(a, b) for a in values for b in values]

    @property
    def prompt_length(self) -> int:
        return len("a+b=")

    @property
    def max_response_tokens(self) -> int:
        """Digits of the longest answer plus ``<eos>``."""
        longest = max(self.answer(a, b) for a, b in self.problems)
        return len(str(longest)) + 1

    @staticmethod
    def prompt(a: int, b: int) -> str:
        return f"{a}+{b}="


@dataclass
class PromptSampler:
    """Prompt batches shaped like verl's after ``repeat(rollout.n, interleave=True)``.

    Each step draws ``prompts`` problems (seeded by ``seed`` and the step, so a run is reproducible
    and the same for every schedule mode) and repeats each ``group_size`` times. Tensors:
    ``input_ids``/``attention_mask`` (prompts, left-padded, ``[B, prompt_length]``); non-tensors:
    ``data_source``, ``reward_model`` (``{"ground_truth": str(answer), "style": "rule"}``), ``uid``
    (one per prompt, shared by its group), ``extra_info`` (``index``, ``step``, ``a``, ``b``).
    """

    task: ArithmeticTask
    tokenizer: Any
    prompts: int
    group_size: int
    seed: int = 0

    def problems(self, step: int) -> list[tuple[int, int]]:
        rng = random.Random(f"toy-prompts:{self.seed}:{step}")
        return [rng.choice(self.task.problems) for _ in range(self.prompts)]

    def make(self, step: int) -> DataProto:
        """The prompt batch of ``step`` (``prompts * group_size`` rows)."""
        problems = [p for p in self.problems(step) for _ in range(self.group_size)]
        uids = [f"{self.seed}-{step}-{i // self.group_size}" for i in range(len(problems))]
        batch = encode_prompts(self.task, self.tokenizer, problems, uids)
        for i, extra in enumerate(batch.non_tensor_batch["extra_info"]):
            extra.update({"index": i // self.group_size, "step": step})
        return batch


def encode_prompts(
    task: ArithmeticTask, tokenizer: Any, problems: list[tuple[int, int]], uids: list[str] | None = None
) -> DataProto:
    """A prompt-only verl ``DataProto`` for ``problems`` (each sample its own group unless ``uids``)."""
    from verl import DataProto

    texts = [task.prompt(a, b) for a, b in problems]
    encoded = tokenizer(
        texts,
        add_special_tokens=False,
        padding="max_length",
        max_length=task.prompt_length,
        truncation=False,
        return_tensors="pt",
    )
    n = len(problems)
    uids = uids if uids is not None else [str(i) for i in range(n)]
    return DataProto.from_dict(
        tensors={
            "input_ids": encoded["input_ids"].long(),
            "attention_mask": encoded["attention_mask"].long(),
        },
        non_tensors={
            "data_source": np.array([task.data_source] * n, dtype=object),
            "reward_model": np.array(
                [{"ground_truth": str(task.answer(a, b)), "style": "rule"} for a, b in problems], dtype=object
            ),
            "uid": np.array(uids, dtype=object),
            "extra_info": np.array([{"a": a, "b": b} for a, b in problems], dtype=object),
        },
    )


def decode_responses(tokenizer: Any, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """Each response's valid tokens decoded with special tokens skipped, as our reward managers do."""
    return [
        tokenizer.decode(row[: int(m.sum())].tolist(), skip_special_tokens=True)
        for row, m in zip(responses, mask, strict=True)
    ]
