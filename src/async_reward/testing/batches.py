"""The one builder of rollout-shaped verl ``DataProto`` batches for tests and benchmarks.

A reward manager reads a batch the way verl's rollout leaves it: ``prompts`` left-padded,
``responses`` right-padded, ``input_ids`` their concatenation, ``attention_mask`` marking the real
tokens, and the non-tensors ``data_source``, ``reward_model`` (``{"ground_truth", "style"}``),
``uid`` (the group) and ``extra_info``. Tests, benchmarks and the speed-up benchmark's calibrated
backend all build their batches here, so they exercise the same shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from verl import DataProto

__all__ = ["rollout_batch"]

#: A text to tokenize, or token ids taken as they are (e.g. bytes that are not valid UTF-8).
TextOrIds = str | Sequence[int]


def _token_ids(tokenizer: Any, items: Sequence[TextOrIds]) -> list[list[int]]:
    """Each item's token ids; every distinct text is tokenized once, all in one call (a group's
    prompt repeats ``group_size`` times)."""
    texts = list(dict.fromkeys(item for item in items if isinstance(item, str)))
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    by_text = dict(zip(texts, encoded, strict=True))
    return [list(by_text[item]) if isinstance(item, str) else list(item) for item in items]


def rollout_batch(
    tokenizer: Any,
    prompts: Sequence[TextOrIds],
    responses: Sequence[TextOrIds],
    ground_truths: Sequence[str | None],
    *,
    uids: Sequence[str] | None = None,
    data_source: str | Sequence[str] = "test",
    extra_infos: Sequence[Mapping[str, Any]] | None = None,
    prompt_length: int = 48,
    response_length: int = 64,
    truncate: bool = False,
) -> DataProto:
    """A verl ``DataProto`` shaped like a rollout of ``len(prompts)`` samples.

    Args:
        tokenizer: a Hugging Face tokenizer (its ``pad_token_id`` pads).
        prompts, responses: per sample, a text (tokenized without special tokens) or token ids.
        ground_truths: per sample, ``reward_model["ground_truth"]``.
        uids: per sample, its group id; None: every sample is its own group (``"0"``, ``"1"``, ...).
        data_source: one for all samples, or one per sample.
        extra_infos: per sample, ``extra_info`` (copied); None: ``{"index": i}``.
        prompt_length, response_length: padded widths of ``prompts`` and ``responses``.
        truncate: cut a longer prompt to its last and a longer response to its first tokens, as a
            rollout's length limits do; False: a sample that does not fit is a ValueError (a
            benchmark whose answers sit at the end of the response must not lose them silently).
    """
    import torch
    from verl import DataProto

    n = len(prompts)
    if not len(responses) == len(ground_truths) == n:
        raise ValueError(
            f"need one response and one ground truth per prompt, got {n} prompts, "
            f"{len(responses)} responses, {len(ground_truths)} ground truths"
        )
    prompt_ids, response_ids = _token_ids(tokenizer, prompts), _token_ids(tokenizer, responses)
    if truncate:
        prompt_ids = [ids[max(0, len(ids) - prompt_length) :] for ids in prompt_ids]
        response_ids = [ids[:response_length] for ids in response_ids]
    longest = (max(map(len, prompt_ids), default=0), max(map(len, response_ids), default=0))
    if longest[0] > prompt_length or longest[1] > response_length:
        raise ValueError(
            f"a sample of {longest} (prompt, response) tokens does not fit prompt/response lengths "
            f"{prompt_length}/{response_length}; pass larger lengths or truncate=True"
        )
    pad = tokenizer.pad_token_id
    prompt_a = np.full((n, prompt_length), pad, dtype=np.int64)
    response_a = np.full((n, response_length), pad, dtype=np.int64)
    mask = np.zeros((n, prompt_length + response_length), dtype=np.int64)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        prompt_a[i, prompt_length - len(p) :] = p
        response_a[i, : len(r)] = r
        mask[i, prompt_length - len(p) : prompt_length + len(r)] = 1
    sources = [data_source] * n if isinstance(data_source, str) else list(data_source)
    group_ids = [str(i) for i in range(n)] if uids is None else list(uids)
    extras = [{"index": i} for i in range(n)] if extra_infos is None else [dict(e) for e in extra_infos]
    if not len(sources) == len(group_ids) == len(extras) == n:
        raise ValueError("data_source, uids and extra_infos need one entry per sample")
    prompt_t, response_t = torch.from_numpy(prompt_a), torch.from_numpy(response_a)
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_t,
            "responses": response_t,
            "input_ids": torch.cat([prompt_t, response_t], dim=1),
            "attention_mask": torch.from_numpy(mask),
        },
        non_tensors={
            "data_source": np.array(sources, dtype=object),
            "reward_model": np.array(
                [{"ground_truth": t, "style": "rule"} for t in ground_truths], dtype=object
            ),
            "uid": np.array(group_ids, dtype=object),
            "extra_info": np.array(extras, dtype=object),
        },
    )
