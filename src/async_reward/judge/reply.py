"""The part of a chat completion a judge's verdict is read from: a complete reply's content, and
whether the server returned the judge's thinking apart (shared by single verdicts and rubrics)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from async_reward._core.http import MalformedResponseError
from async_reward.judge.verdict import VerdictError

__all__ = ["JudgeReply", "judge_reply", "unread_reply"]

# finish_reason of a reply that ended normally: "stop"; text-generation-inference before 2.2.1
# (huggingface/text-generation-inference#2344) named the same end "eos_token" or "stop_sequence".
_NORMAL_FINISH = frozenset({"stop", "eos_token", "stop_sequence"})
# Where servers with a reasoning parser put the judge's thinking (vLLM, SGLang: reasoning_content;
# newer vLLM and OpenRouter: reasoning).
_REASONING_FIELDS = ("reasoning_content", "reasoning")


@dataclass(frozen=True)
class JudgeReply:
    """The part of a chat completion the verdict is read from."""

    content: str
    """The message content: the judge's answer, with its thinking unless returned apart."""
    reasoning_apart: bool
    """The server returned the judge's thinking in its own field (``reasoning_content`` or
    ``reasoning``), so no ``</think>`` in ``content`` is the judge's: it is read as ``think: none``."""


def judge_reply(reply: Any) -> JudgeReply:
    """The first choice of a chat completion, if it is a complete reply.

    A reply the server cut short is never read: ``finish_reason: length`` is a reply cut at
    ``max_tokens``, and what it ends with may be the response's own verdict, quoted (a response
    padded so that the cut falls right after its ``[[10]]``); ``content_filter`` and any other
    reason but a normal stop are refused too. A missing ``finish_reason`` is accepted: servers
    differ, and some omit it.

    Raises:
        VerdictError: the reply did not finish normally (status ``invalid``, with the reason).
        MalformedResponseError: not a chat completion, or content that is not text.
    """
    try:
        choice = reply["choices"][0]
        message = choice["message"]
        content = message["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise MalformedResponseError(f"judge reply is not a chat completion: missing {exc}") from None
    finish_reason = choice.get("finish_reason")
    if finish_reason is not None and not (isinstance(finish_reason, str) and finish_reason in _NORMAL_FINISH):
        shown = repr(str(finish_reason)[:40])
        if finish_reason == "length":
            raise VerdictError(
                f"judge reply cut off at max_tokens (finish_reason={shown}): not read; raise judge.max_tokens"
            )
        raise VerdictError(
            f"judge reply did not finish normally (finish_reason={shown}, not 'stop'): not read"
        )
    if not isinstance(content, str):
        raise MalformedResponseError("judge reply content is not text")
    apart = any(isinstance(message.get(key), str) for key in _REASONING_FIELDS)
    return JudgeReply(content=content, reasoning_apart=apart)


def unread_reply(exc: Exception) -> str:
    """The ``error`` reason for a reply that broke reading in a way no rule foresaw (a bug here, or a
    server's value past what Python reads): named with the exception, never a silent score; the caller
    keeps the reply's tokens in the sample's cost, since the call was paid whatever it said."""
    return f"the judge's reply could not be read: {type(exc).__name__}: {exc}"[:500]
