"""``llm_judge``: an OpenAI-compatible ``/v1/chat/completions`` endpoint as the reward.

The policy's response is delimited and escaped in the judge prompt (``judge.build_messages``), and
the verdict is read by ``async_reward.verdict``'s rules: the one format the template asks for, at the
end of the reply, conflicting verdicts refused, so text inside the response cannot pose as the
verdict. ``judge.parser: structured`` asks the server for a JSON schema instead. Identical requests in
flight share one call; with ``judge.cache`` their verdicts are kept.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from typing import Any, ClassVar

from async_reward.http import HTTPStatusError, MalformedResponseError, post_json
from async_reward.judge import build_messages, normalize_score, request_key, resolve_parser, resolve_template
from async_reward.limits import TokenReservation
from async_reward.managers.base import AsyncRewardManager
from async_reward.registry import register_manager
from async_reward.result import RewardResult, RewardSample
from async_reward.verdict import VerdictRules, read_verdict, response_format

__all__ = ["LLMJudgeRewardManager", "StructuredOutputUnsupported"]

logger = logging.getLogger(__name__)

# Words a server's 400 uses when it refuses the response_format field itself (vLLM, SGLang, OpenAI,
# llama.cpp and our dev server all name the field or the json_schema type).
_REFUSES_RESPONSE_FORMAT = ("response_format", "json_schema", "structured output")


class StructuredOutputUnsupported(RuntimeError):
    """The judge server refused ``response_format`` json_schema (``judge.parser: structured``).

    Not retried (the server will refuse again); the sample gets status ``error`` with this message.
    """


@register_manager("llm_judge")
class LLMJudgeRewardManager(AsyncRewardManager):
    """Scores each sample by asking an LLM judge, under admission, deadline and retry."""

    required_sections: ClassVar[tuple[str, ...]] = ("judge",)
    extra_defaults: ClassVar[dict[str, Any]] = {
        "judge_verdict": math.nan,
        "judge_tokens": 0,
        "judge_shared": False,
    }

    def __init__(self, config: Any, tokenizer: Any, compute_score: Any = None, **kwargs: Any) -> None:
        super().__init__(config, tokenizer, compute_score, **kwargs)
        self.judge = self.settings.judge
        self.judge.validate()
        # The one format the judge is told to use (``auto`` made concrete) is the only one read.
        parser = resolve_parser(self.judge.template, self.judge.parser)
        self.template = resolve_template(self.judge.template, parser)
        self.rules = VerdictRules(
            parser=parser,
            position=self.judge.verdict_position,
            on_conflict=self.judge.on_conflict,
            think=self.judge.think,
        )
        self.url = self.judge.base_url.rstrip("/") + "/chat/completions"  # type: ignore[union-attr]
        self._headers: dict[str, str] = {}
        if self.judge.api_key_env:
            # The key lives only in this private header dict: never logged, never in a repr.
            self._headers["Authorization"] = f"Bearer {os.environ[self.judge.api_key_env]}"
        self._params: dict[str, Any] = {
            "temperature": self.judge.temperature,
            "max_tokens": self.judge.max_tokens,
            **self.judge.extra_body,
        }
        if parser == "structured":
            self._params["response_format"] = response_format()
        self._warned_unsupported = False
        self._in_flight: dict[str, asyncio.Future[RewardResult]] = {}
        self._cache: dict[str, RewardResult] = {}
        self._waiters: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, model={self.judge.model!r})"

    async def score(self, sample: RewardSample) -> RewardResult:
        ground_truth = None if sample.ground_truth is None else str(sample.ground_truth)
        messages = build_messages(
            self.template,
            prompt=sample.prompt_text,
            response=sample.response,
            ground_truth=ground_truth,
            system_prompt=self.judge.system_prompt,
        )
        key = request_key(self.judge.model, messages, self._params)
        cached = self._cache.get(key)
        if cached is not None:
            return _shared_copy(cached)
        shared = self._in_flight.get(key)
        leader = shared is None
        if shared is None:
            # The call runs as its own task so that a cancelled caller does not cancel the callers
            # sharing it; every caller is bounded by the same deadline and retry budget.
            shared = asyncio.ensure_future(self.guard(self._ask_judge(messages)))
            self._in_flight[key] = shared
            shared.add_done_callback(
                lambda _t: (self._in_flight.pop(key, None), self._waiters.pop(key, None))
            )
        self._waiters[key] = self._waiters.get(key, 0) + 1
        try:
            result = await asyncio.shield(shared)
        except asyncio.CancelledError:
            self._waiters[key] = self._waiters.get(key, 1) - 1
            if self._waiters[key] <= 0:
                shared.cancel()  # nobody waits for it any more: stop paying for its calls and retries
            raise
        if not leader:
            return _shared_copy(result)
        if self.judge.cache and result.ok:
            self._cache[key] = result
        return result

    async def _ask_judge(self, messages: list[dict[str, str]]) -> RewardResult:
        body = {"model": self.judge.model, "messages": messages, **self._params}

        async def attempt(reservation: TokenReservation) -> dict[str, Any]:
            try:
                reply, _headers = await post_json(self.url, body, headers=self._headers)
            except HTTPStatusError as exc:
                unsupported = self._unsupported_structured_output(exc)
                if unsupported is None:
                    raise
                raise unsupported from exc
            usage = reply.get("usage") if isinstance(reply, dict) else None
            if isinstance(usage, dict) and isinstance(usage.get("total_tokens"), int):
                reservation.settle(usage["total_tokens"])
            return reply

        reply, attempts = await self.call_with_policy(attempt, estimated_tokens=None)
        content = _reply_text(reply)
        verdict = read_verdict(content, self.rules)
        score = normalize_score(
            verdict,
            min_score=self.judge.min_score,
            max_score=self.judge.max_score,
            normalize_to=self.judge.normalize_to,
        )
        usage = reply.get("usage") or {}
        return RewardResult(
            score=score,
            attempts=attempts,
            extras={
                "judge_verdict": verdict,
                "judge_tokens": int(usage.get("total_tokens") or 0),
                "judge_shared": False,
            },
        )

    def _unsupported_structured_output(self, exc: HTTPStatusError) -> StructuredOutputUnsupported | None:
        """The clear error for a 400 that refuses ``response_format``; None for any other failure."""
        refused = exc.status == 400 and any(
            word in exc.body_excerpt.lower() for word in _REFUSES_RESPONSE_FORMAT
        )
        if self.rules.parser != "structured" or not refused:
            return None
        # Short, key facts first: the reason lands in a per-sample extra cut at 256 characters.
        error = StructuredOutputUnsupported(
            "the judge server refused response_format json_schema, which judge.parser=structured "
            "needs (use a server with structured output, or a text parser such as brackets): "
            f"HTTP 400 from {exc.url}: {exc.body_excerpt}"
        )
        if not self._warned_unsupported:  # every sample will fail the same way: say it once, loudly
            self._warned_unsupported = True
            logger.error("%s", error)
        return error


def _reply_text(reply: Any) -> str:
    try:
        content = reply["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise MalformedResponseError(f"judge reply is not a chat completion: missing {exc}") from None
    if not isinstance(content, str):
        raise MalformedResponseError("judge reply content is not text")
    return content


def _shared_copy(result: RewardResult) -> RewardResult:
    extras = dict(result.extras)
    extras["judge_shared"] = True
    return RewardResult(
        score=result.score,
        status=result.status,
        extras=extras,
        failure_reason=result.failure_reason,
        attempts=0,
    )
