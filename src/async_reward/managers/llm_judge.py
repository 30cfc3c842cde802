"""``llm_judge``: an OpenAI-compatible ``/v1/chat/completions`` endpoint as the reward.

The policy's response is delimited and escaped in the judge prompt (``judge.build_messages``), and
the verdict is read by ``async_reward.judge.verdict``'s rules: the one format the template asks for, at the
end of the reply, conflicting verdicts refused, so text inside the response cannot pose as the
verdict. ``judge.parser: structured`` asks the server for a JSON schema instead. A reply the server
did not finish (``finish_reason`` other than ``stop``, e.g. cut at ``max_tokens``) is never read, and
when the server returns the judge's thinking apart from the content, no ``</think>`` in the content
is taken for the judge's. Identical requests in flight share one call; with ``judge.cache`` their
verdicts are kept.

``judge.mode: group`` judges the members of a GRPO group in one call (``managers.group_scoring``,
``async_reward.judge.group.judging``). Two ways to read more from the judge: ``judge.criteria`` grades a
rubric of weighted criteria in one call (``managers.criteria_scoring``,
``async_reward.judge.rubric.criteria``), and ``judge.expected_verdict`` scores the expected verdict under the
judge's own token probabilities (``async_reward.judge.expected``).
With a judge served in the job, a prompt too long for its context is refused before it is sent
(``judge_in_job.context``).

Longer than 400 lines: the request and reply path of one judge call, with the settings checks
that belong to it; rubrics, group judging, weighting and the served judge live in
:mod:`async_reward.judge`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from async_reward._core.config_rules import select_key
from async_reward._core.errors import ConfigError
from async_reward._core.http import HTTPStatusError, MalformedResponseError, post_json
from async_reward._core.http_secrets import shown_url
from async_reward._core.limits import Priority, TokenReservation
from async_reward._core.result import RewardResult, RewardSample, Status
from async_reward.config import AsyncRewardConfig
from async_reward.judge.cost import (
    PaidOnce,
    call_token_bound,
    paid_once,
    reported_total_tokens,
    spent_extras,
    unspent_extras,
)
from async_reward.judge.expected import (
    ExpectedVerdict,
    distribution_params,
    reply_tokens,
    say_unweighted,
    weighted_extras,
)
from async_reward.judge.group.placement import group_size
from async_reward.judge.group.scoring import GroupRendezvous, group_extra_defaults
from async_reward.judge.in_job.checks import announce_in_job_judge, apply_in_job_judge
from async_reward.judge.in_job.context import PromptBudget, judge_context
from async_reward.judge.in_job.router_calls import ROUTED_ATTEMPT_POLICY, post_through_router
from async_reward.judge.in_job.settings import in_job_judge, is_routed
from async_reward.judge.prompts import (
    build_messages,
    normalize_score,
    request_key,
    resolve_parser,
    resolve_template,
)
from async_reward.judge.reply import JudgeReply, judge_reply, unread_reply
from async_reward.judge.rubric.scoring import criteria_extra_defaults, score_criteria
from async_reward.judge.span_weighting import refuse_too_many, weigh_places
from async_reward.judge.verdict import (
    VerdictError,
    VerdictRules,
    read_verdict,
    response_format,
    verdict_spans,
)
from async_reward.managers.base import AsyncRewardManager
from async_reward.managers.registry import register_manager

__all__ = [
    "JudgeReply",
    "LLMJudgeRewardManager",
    "StructuredOutputUnsupported",
    "chat_completions_url",
    "judge_reply",
    "read_reply_verdict",
    "weigh_reply_verdict",
]

logger = logging.getLogger(__name__)

# Words a server's error uses when it refuses the response_format field itself (vLLM, SGLang, OpenAI,
# llama.cpp and our dev server all name the field or the json_schema type).
_REFUSES_RESPONSE_FORMAT = ("response_format", "json_schema", "structured output")
# What a 500 / 501 must say besides, to be a refusal rather than a fault while serving the field:
# llama-cpp-python answers a request its schema refuses with 500 and FastAPI's "1 validation error:
# ... 'loc': ('body', 'response_format', 'type'), 'msg': "Input should be 'text' or 'json_object'"".
_REFUSAL_WORDS = (
    "validation error",
    "input should be",
    "not supported",
    "unsupported",
    "does not support",
    "not implemented",
    "invalid",
    "unknown",
    "not permitted",
    "not allowed",
)


class StructuredOutputUnsupported(RuntimeError):
    """The judge server refused ``response_format`` json_schema (``judge.parser: structured``): a 4xx
    naming the field, or a 500 / 501 naming it with a refusal (llama-cpp-python's validation error).

    Not retried (the server will refuse again); the sample gets status ``error`` and the reason
    "server refuses structured output: ...", logged once per manager.
    """


def _refuses_structured_output(exc: HTTPStatusError) -> bool:
    """Whether a failed request's reply refuses the ``response_format`` field: it names the field, and
    is a client error that is not transient (400, 404, 422, ...), or a 500 / 501 that also says it
    refuses (``_REFUSAL_WORDS``)."""
    text = exc.body_head.lower()
    if not any(word in text for word in _REFUSES_RESPONSE_FORMAT):
        return False
    if 400 <= exc.status < 500:
        return not exc.transient  # a 408, 409 or 429 is about timing, not the field
    return exc.status in (500, 501) and any(word in text for word in _REFUSAL_WORDS)


@register_manager("llm_judge")
class LLMJudgeRewardManager(AsyncRewardManager):
    """Scores each sample by asking an LLM judge, under admission, deadline and retry."""

    required_sections: ClassVar[tuple[str, ...]] = ("judge",)
    runs_custom_function: ClassVar[bool | None] = False
    _reads_sections: ClassVar[frozenset[str] | None] = frozenset({"judge"})
    scores_with_reward_model: ClassVar[bool] = True
    extra_defaults: ClassVar[dict[str, Any]] = {
        "judge_verdict": math.nan,
        "judge_shared": False,
        **unspent_extras(None),
    }

    def __init__(self, config: Any, tokenizer: Any, compute_score: Any = None, **kwargs: Any) -> None:
        super().__init__(config, tokenizer, compute_score, **kwargs)
        self.judge = self.settings.judge
        self.judge.validate()
        #: Prices per million tokens (``judge.*_price_per_million``); None: no ``judge_cost``.
        self.pricing = self.judge.pricing()
        if self.pricing is not None:  # every sample carries it, a failed one 0.0 (nothing spent)
            self._extra_defaults.setdefault("judge_cost", 0.0)
        if self.judge.criteria:  # each criterion's verdict and reason, on every sample
            self._extra_defaults.update(
                criteria_extra_defaults(self.judge.criteria, expected=self.judge.expected_verdict)
            )
        if self.judge.expected_verdict:  # every sample says whether its score was weighted, and why not
            self._extra_defaults.update(
                {
                    "judge_expected_verdict": math.nan,
                    "judge_verdict_mass": math.nan,
                    "judge_verdict_assumed": math.nan,
                    "judge_verdict_not_favourite": math.nan,
                    "judge_weighted": math.nan,
                    "judge_weighting": "",
                }
            )
        #: With ``judge.mode: group``: where a group's members wait for each other (``group_scoring``).
        self.group: GroupRendezvous | None = None
        if self.judge.mode == "group":
            self.group = GroupRendezvous(self, group_size(config))
            self._extra_defaults.update(group_extra_defaults())
        #: Judging with the model verl serves in the job, through its router (``judge_in_job``).
        self.in_job = in_job_judge(config)
        #: With a served judge: the longest prompt its replicas accept (judge_in_job.context), counted
        #: with its own tokenizer. None: an external judge, whose server's 400 says it itself.
        self.prompt_budget: PromptBudget | None = None
        if self.in_job:
            self.url = self._router_url()
            context = judge_context(config)
            if context is not None and self.reward_model_tokenizer is not None:
                self.prompt_budget = PromptBudget(context, self.judge.max_tokens)
        else:
            self.judge.require()
            self.url = chat_completions_url(self.judge.base_url)  # type: ignore[arg-type]
        # The one format the judge is told to use (``auto`` made concrete) is the only one read.
        parser = resolve_parser(self.judge.template, self.judge.parser)
        self.template = resolve_template(self.judge.template, parser)
        self.rules = VerdictRules(
            parser=parser,
            position=self.judge.verdict_position,
            on_conflict=self.judge.on_conflict,
            think=self.judge.think,
        )
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
        if self.judge.expected_verdict:
            self._params.update(logprobs=True, top_logprobs=self.judge.requested_top_logprobs)
            # The sampler left as the model's distribution (top_p 1, no penalty), so the verdict is
            # drawn from what the reply lists; a value the user set in extra_body wins.
            for key, value in distribution_params(served=self.in_job).items():
                self._params.setdefault(key, value)
        self._warned_unsupported = False
        self._in_flight: dict[str, asyncio.Future[PaidOnce[RewardResult]]] = {}
        self._cache: dict[str, PaidOnce[RewardResult]] = {}
        self._waiters: dict[str, int] = {}

    @classmethod
    def check_settings(cls, config: Any, env: Mapping[str, str] | None = None) -> AsyncRewardConfig:
        """The shared settings checks, plus ``fallback_score`` no higher than the lowest verdict's
        reward (:meth:`AsyncRewardConfig.validate_judge_fallback`), on the driver and in each worker."""
        settings = super().check_settings(config, env)
        settings.validate_judge_fallback()
        if settings.judge.mode == "group":  # the group size verl generates, and where groups stay whole
            group_size(config)
        if in_job_judge(config):  # the served judge's name, conflicts refused, its defaults
            settings = apply_in_job_judge(config, settings)
        return settings

    @classmethod
    def announce_settings(cls, config: Any, settings: AsyncRewardConfig) -> None:
        """On the judge verl serves in the job: what this manager will do with it (capacity,
        admission, routing), in the job's log; else what the base class says."""
        if select_key(config, "reward.reward_model.enable"):
            announce_in_job_judge(config, settings)
        else:
            super().announce_settings(config, settings)

    @classmethod
    def sections_required(cls, config: Any) -> tuple[str, ...]:
        """``judge`` (its ``base_url``), unless verl serves the judge in the job."""
        return () if in_job_judge(config) else cls.required_sections

    def _router_url(self) -> str:
        """The chat-completions URL behind verl's router, refusing a manager that verl would bypass.

        Raises:
            ConfigError: no router address reached this manager, or it was built by verl's own
                reward worker (which would send its samples to ``/classify``).
        """
        if self.reward_router_address is None:
            raise ConfigError(
                "llm_judge with reward.reward_model.enable=true got no reward_router_address: it was built "
                "outside verl's Reward Loop (offline scoring, a loop of your own), where no served judge "
                "exists; set reward.reward_model.enable=false and judge.base_url to a judge server",
                key="reward.reward_model.enable",
                fix="set reward.reward_model.enable=false and judge.base_url=<server>/v1",
            )
        if not is_routed():
            raise ConfigError(
                "llm_judge with reward.reward_model.enable=true was built by verl's own RewardLoopWorker, "
                "which sends every sample to the reward model's /classify endpoint and never calls "
                "llm_judge; our verl plugin installs async-reward's worker where verl builds it: check "
                "that async-reward is installed where verl runs and that neither VERL_USE_EXTERNAL_PLUGINS "
                "nor ASYNC_REWARD_VERL_PLUGIN turns it off, or add the setup hook "
                "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook="
                "async_reward.wiring.integration.setup_worker, or call "
                "async_reward.judge.in_job.install_reward_loop_hooks() where you build RewardLoopManager",
                key="ray_kwargs.ray_init.runtime_env.worker_process_setup_hook",
                fix="set it to async_reward.wiring.integration.setup_worker",
            )
        return f"http://{self.reward_router_address}/v1/chat/completions"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={shown_url(self.url)!r}, model={self.judge.model!r})"

    async def score(self, sample: RewardSample) -> RewardResult:
        if self.group is not None:
            return await self.group.score(sample)
        if self.judge.criteria:
            return await score_criteria(self, sample)
        ground_truth = None if sample.ground_truth is None else str(sample.ground_truth)
        messages = build_messages(
            self.template,
            prompt=sample.prompt_text,
            response=sample.response,
            ground_truth=ground_truth,
            system_prompt=self.judge.system_prompt,
        )
        too_long = self.prompt_refusal(messages)
        if too_long is not None:  # the replica would refuse it, behind a router that hides why
            extras = {**unspent_extras(self.pricing), "judge_shared": False}
            return RewardResult.failure(Status.INVALID, too_long, attempts=0, extras=extras)
        key = request_key(self.judge.model, messages, self._params)
        cached = self._cache.get(key)
        if cached is not None:
            return self._copy_of(cached, cache_hit=True)
        shared = self._in_flight.get(key)
        if shared is None:
            # The call runs as its own task so that a cancelled caller does not cancel the callers
            # sharing it; every caller is bounded by the same deadline and retry budget.
            call = self.guard(self._ask_judge(messages, sample.admission_priority))
            shared = asyncio.ensure_future(paid_once(call))
            self._in_flight[key] = shared
            shared.add_done_callback(lambda done: self._forget_call(key, done))
        self._waiters[key] = self._waiters.get(key, 0) + 1
        try:
            outcome = await asyncio.shield(shared)
        except asyncio.CancelledError:
            # Counted against this call only while it is in flight under its key: once done, a newer
            # call may hold the key, and its waiters are its own.
            if self._in_flight.get(key) is shared:
                self._waiters[key] -= 1
                if self._waiters[key] <= 0:
                    # Nobody waits for it any more: stop paying for its calls and retries. Forget it
                    # first, so an identical request arriving while it stops starts a call of its own
                    # instead of joining one that is being cancelled.
                    self._forget_call(key, shared)
                    shared.cancel()
            raise
        return self._copy_of(outcome, cache_hit=False)

    def prompt_refusal(self, messages: list[dict[str, str]]) -> str | None:
        """Why the served judge would refuse ``messages`` as too long for its context, or None (they
        fit, or nothing can be counted: an external judge, no tokenizer, no known window)."""
        if self.prompt_budget is None:
            return None
        return self.prompt_budget.refusal(self.reward_model_tokenizer, messages)

    def _forget_call(self, key: str, call: asyncio.Future[PaidOnce[RewardResult]]) -> None:
        """Drop ``call`` from the shared calls, unless ``key`` already names a newer one; with
        ``judge.cache``, keep its ok verdict as soon as it is done, with its cost still to be taken
        (the sample that started it may have been cancelled: see :meth:`_copy_of`)."""
        if self._in_flight.get(key) is call:
            del self._in_flight[key]
            self._waiters.pop(key, None)
        if self.judge.cache and call.done() and not call.cancelled() and call.exception() is None:
            outcome = call.result()
            if outcome.value.ok:
                self._cache[key] = outcome

    async def post_reply(self, messages: list[dict[str, str]], priority: Priority = 0.0) -> tuple[Any, int]:
        """One chat completion under admission, deadline and retries: (the reply, attempts made).

        The tokens its ``usage`` reports are charged to ``limits.tokens_per_minute`` (read as the cost
        extras are, ``cost.reported_total_tokens``), but never more than the call can use
        (``cost.call_token_bound``): a reply claiming 10**12 tokens must not stall the job's budget.
        A refusal of ``response_format`` (``judge.parser: structured``) is not retried."""
        body = {"model": self.judge.model, "messages": messages, **self._params}
        most_tokens = call_token_bound(body)

        async def attempt(reservation: TokenReservation) -> dict[str, Any]:
            try:
                if self.in_job:  # waited for past timeout_s: verl's router cannot cancel it
                    reply = await post_through_router(self.url, body, self._headers, self.settings)
                else:
                    reply, _headers = await post_json(
                        self.url, body, headers=self._headers, url_key="judge.base_url"
                    )
            except HTTPStatusError as exc:
                unsupported = self._unsupported_structured_output(exc)
                if unsupported is not None:  # refused for good, whatever the status: not retried
                    raise unsupported from exc
                if self.in_job and exc.status == 500:
                    # verl's router turns every replica error (a refused request, an overloaded,
                    # sleeping or dead replica) into a plain 500 after its own attempts. Still
                    # retried (transient), but the sample's reason says what the 500 hides.
                    raise HTTPStatusError(
                        500,
                        exc.url,
                        exc.retry_after_s,
                        "from verl's router, which hides the replica's own status (a refused request, "
                        f"an overloaded, asleep or dead replica): {exc.body_excerpt}",
                    ) from exc
                raise
            reported = reported_total_tokens(reply.get("usage") if isinstance(reply, dict) else None)
            if reported is not None:  # charged up to what the call can use: see call_token_bound
                reservation.settle(min(reported, most_tokens))
            return reply

        policy = ROUTED_ATTEMPT_POLICY if self.in_job else {}
        return await self.call_with_policy(attempt, estimated_tokens=None, priority=priority, **policy)

    async def _ask_judge(self, messages: list[dict[str, str]], priority: Priority = 0.0) -> RewardResult:
        """One judge call (shared by identical requests in flight), admitted at ``priority``: the
        first caller's training step."""
        reply, attempts = await self.post_reply(messages, priority)
        # What the reply cost is spent whatever it says: a refused verdict keeps its tokens.
        spent = spent_extras(reply.get("usage") if isinstance(reply, dict) else None, self.pricing)
        try:
            verdict = read_reply_verdict(reply, self.rules)
            weighted: float = verdict
            weighting: dict[str, Any] = {}
            if self.judge.expected_verdict:
                weighted, weighting = self._weigh(reply, verdict)
            score = normalize_score(
                weighted,
                min_score=self.judge.min_score,
                max_score=self.judge.max_score,
                normalize_to=self.judge.normalize_to,
            )
        except (MalformedResponseError, VerdictError) as exc:
            return RewardResult.failure(
                Status.INVALID, str(exc), attempts=attempts, extras={**spent, "judge_shared": False}
            )
        except Exception as exc:  # a reply no rule foresaw: still error with its reason, its tokens kept
            return RewardResult.failure(
                Status.ERROR, unread_reply(exc), attempts=attempts, extras={**spent, "judge_shared": False}
            )
        return RewardResult(
            score=score,
            attempts=attempts,
            extras={"judge_verdict": verdict, **weighting, **spent, "judge_shared": False},
        )

    def _weigh(self, reply: Any, verdict: float) -> tuple[float, dict[str, Any]]:
        """The expected verdict and its extras; the plain verdict, with the reason, where the reply
        cannot give one (said once, loudly, when the server sent no probabilities at all).

        Raises:
            VerdictError: the written verdict is off the scale (``invalid``, as it is unweighted:
                a weighted value on the scale must not hide a ``[[90]]`` on 0-10), or the reply
                writes too many verdicts to weigh (``managers.span_weighting``).
        """
        outcome = weigh_reply_verdict(
            reply, self.rules, verdict, min_score=self.judge.min_score, max_score=self.judge.max_score
        )
        if isinstance(outcome, ExpectedVerdict):
            extras = weighted_extras(outcome, temperature=self.judge.temperature)
            return outcome.value, {**extras, "judge_weighted": 1.0, "judge_weighting": "expected"}
        say_unweighted(outcome)
        return verdict, {"judge_weighted": 0.0, "judge_weighting": f"plain: {outcome}"}

    def _copy_of(self, outcome: PaidOnce[RewardResult], *, cache_hit: bool) -> RewardResult:
        """A call's result for one of the samples that take it: an identical request's call in flight
        (``judge_shared``) or a cached verdict (``judge_cache_hit``). The first to take it carries
        what the call cost (its tokens and attempts), whichever sample started the call: that one may
        have been cancelled. Every other spent nothing, so a sum of the cost extras over the samples
        returned is what the job paid."""
        result = outcome.value
        if outcome.take():
            extras = {**result.extras, "judge_cache_hit": False, "judge_shared": False}
            attempts = result.attempts
        else:
            extras = {**result.extras, **unspent_extras(self.pricing, cache_hit=cache_hit)}
            extras["judge_shared"] = not cache_hit
            attempts = 0
        return RewardResult(
            score=result.score,
            status=result.status,
            extras=extras,
            failure_reason=result.failure_reason,
            attempts=attempts,
        )

    def _unsupported_structured_output(self, exc: HTTPStatusError) -> StructuredOutputUnsupported | None:
        """The clear error for a reply that refuses ``response_format`` (see
        :class:`StructuredOutputUnsupported`); None for any other failure, which keeps its status and
        retries: a 502 / 503 / 504 (a gateway, an overloaded server) is never taken for a refusal."""
        if self.rules.parser != "structured" or not _refuses_structured_output(exc):
            return None
        # Short, key facts first: the reason lands in a per-sample extra cut at 256 characters.
        error = StructuredOutputUnsupported(
            f"server refuses structured output: HTTP {exc.status} from {exc.url} refused response_format "
            "json_schema, which judge.parser=structured needs (not retried; use a server with structured "
            f"output, or a text parser such as brackets): {exc.body_excerpt}"
        )
        if not self._warned_unsupported:  # every sample will fail the same way: say it once, loudly
            self._warned_unsupported = True
            logger.error("%s", error)
        return error


def read_reply_verdict(reply: Any, rules: VerdictRules) -> float:
    """The judge's verdict in a chat completion: :func:`judge_reply`, then ``read_verdict``.

    When the server returned the judge's thinking apart, the content is all answer and is read with
    ``think: none``: a ``</think>`` in it is quoted text, and cutting there (``prefilled`` would)
    could hide the judge's verdict behind the quote.

    Raises:
        VerdictError, MalformedResponseError: see :func:`judge_reply` and ``read_verdict``.
    """
    answer = judge_reply(reply)
    return read_verdict(answer.content, replace(rules, think="none") if answer.reasoning_apart else rules)


def weigh_reply_verdict(
    reply: Any, rules: VerdictRules, verdict: float, *, min_score: float, max_score: float
) -> ExpectedVerdict | str:
    """The expected verdict of a chat completion whose ``verdict`` :func:`read_reply_verdict` read,
    or why the plain ``verdict`` stands (a short reason).

    Every verdict the reply writes in the rules' format is weighed, not only the one the rules read
    (which may be a quote: a reply can end with one), and the lowest value counts: each place's
    expected verdict, or its written number where its tokens cannot be weighed
    (``managers.span_weighting``). Where that lowest value is a written number, the plain verdict
    stands (with ``on_conflict: min`` it is the lowest written one, so never above that number):
    a planted verdict can lower the score, never raise it.

    Raises:
        VerdictError: ``verdict`` is off ``[min_score, max_score]`` (checked as the plain verdict is:
            ``invalid``); the reply writes too many verdicts to weigh; see :func:`judge_reply`.
        MalformedResponseError: see :func:`judge_reply`.
    """
    answer = judge_reply(reply)
    normalize_score(verdict, min_score=min_score, max_score=max_score, normalize_to=None)
    tokens = reply_tokens(reply["choices"][0])
    if isinstance(tokens, str):  # none sent, or malformed: the reason says which
        return tokens
    places = verdict_spans(answer.content, replace(rules, think="none") if answer.reasoning_apart else rules)
    if isinstance(places, str):
        return places
    refuse_too_many(len(places) - 1)
    weighing = weigh_places(answer.content, tokens, places, min_score=min_score, max_score=max_score)
    if weighing.lowest is None or weighing.written_wins():
        return weighing.reason
    return weighing.lowest


def chat_completions_url(base_url: str) -> str:
    """The chat-completions endpoint under ``base_url`` (``.../v1``): the path gets
    ``/chat/completions``, a query stays after it (``...?api-version=...``, as Azure OpenAI's URLs
    carry one), so it is not appended past the query, where the request would go to a broken URL."""
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/chat/completions"))
