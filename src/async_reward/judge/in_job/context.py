"""The served judge's context window: a judge prompt that cannot fit is refused before any call.

vLLM (and SGLang) refuse a chat completion whose prompt tokens plus ``max_tokens`` exceed the
served model's ``max_model_len`` with a 400 that names the lengths. Through verl's router that 400
arrives as a bare 500 (the router drops the replica's status and message), which our retry policy
must treat as transient: on the GPU run of 2026-11-27 (a 1024-token judge, judge prompts of about
900-1000 tokens) 28 to 31 of 32 samples a step came back ``error`` after two attempts each, with a
reason that could not say why. The served judge's tokenizer is at hand in every reward worker (verl
passes it as ``reward_model_tokenizer``), so the prompt is counted here with the same chat template
the replica applies, and a prompt that cannot fit becomes ``invalid`` with the lengths and the fix,
at no call, no retry and no cost.

The window is ``reward.reward_model.rollout.max_model_len`` when set, else the model's
``max_position_embeddings`` (``config.json``, or its ``text_config``), which is what verl's rollout
server hands vLLM when the key is unset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from async_reward._core.config_rules import select_key
from async_reward._core.start_lines import say_once
from async_reward.judge.in_job.settings import served_model_config

__all__ = ["JudgeContext", "PromptBudget", "judge_context"]

_MAX_MODEL_LEN = "reward.reward_model.rollout.max_model_len"


@dataclass(frozen=True)
class JudgeContext:
    """The served judge's context window, in tokens, and where the number came from."""

    tokens: int
    """Prompt plus completion tokens the replicas accept for one request."""
    source: str
    """Where the number was read (``rollout.max_model_len`` or the model's
    ``max_position_embeddings``), short enough for a sample's reason."""


def judge_context(config: Any) -> JudgeContext | None:
    """The served judge's context window from verl's config; None when it cannot be known here (no
    ``max_model_len`` and the model path is not a local directory with a ``config.json``)."""
    max_model_len = select_key(config, _MAX_MODEL_LEN)
    if _positive_int(max_model_len):
        return JudgeContext(max_model_len, "rollout.max_model_len")
    model = served_model_config(config) or {}
    length = model.get("max_position_embeddings")
    if length is None and isinstance(model.get("text_config"), dict):  # as verl reads it
        length = model["text_config"].get("max_position_embeddings")
    if _positive_int(length):
        return JudgeContext(length, "the model's max_position_embeddings")
    return None


def _positive_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class PromptBudget:
    """What a judge prompt may take: the window less the completion the request asks room for."""

    context: JudgeContext
    """The served judge's window."""
    max_tokens: int
    """``judge.max_tokens``: the completion every request reserves."""

    @property
    def prompt_tokens(self) -> int:
        """The longest prompt, in tokens, that the replicas accept with ``max_tokens``."""
        return self.context.tokens - self.max_tokens

    def refusal(self, tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> str | None:
        """Why the replicas would refuse ``messages``, or None when they fit (or cannot be counted:
        a tokenizer without a chat template is left to the server, which refuses such a request
        itself; said once in the job's log)."""
        try:
            encoded = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        except Exception as exc:  # no chat template (ValueError), a broken one (jinja), another kind
            say_once(
                "judge prompts are not counted against the served judge's context: its tokenizer could "
                f"not apply a chat template ({type(exc).__name__}); the replica refuses one too long"
            )
            return None
        ids = encoded.get("input_ids") if isinstance(encoded, Mapping) else encoded
        if not isinstance(ids, Sequence):
            return None
        count = len(ids)
        if count <= self.prompt_tokens:
            return None
        # At most EXTRA_STRING_MAX_CHARS (256): a sample's reason is cut beyond it.
        return (
            f"judge prompt {count} tokens + judge.max_tokens {self.max_tokens} > the served judge's "
            f"context {self.context.tokens} ({self.context.source}); not sent. Lower judge.max_tokens, "
            "shorten judge.template or the response, or raise rollout.max_model_len"
        )
