"""``AsyncRewardManager``: the one ``run_single`` every async-reward manager shares.

A manager subclass only implements ``score(sample) -> RewardResult``. Everything that must be right
for every manager lives here once: the start-up checks of its settings (:meth:`check_config`, also
run on the driver), decoding a verl ``DataProto`` item into a ``RewardSample``, admission
(concurrency, job-wide RPM/TPM), per-attempt deadlines, retries of transient failures, the failure
policy (``fallback`` with an explicit status, ``raise``, or ``exclude``: flagged for the trainer),
consistent extras keys, and conversion to verl's ``{"reward_score", "reward_extra_info"}`` dict.

Fixes over verl's own managers, on purpose: a failed call is never a silent 0.0 (status says what
happened), nothing waits without a deadline, and rate budgets are per job, not per worker process.

Longer than 400 lines on purpose: it is the one path every sample takes (decode, admission,
deadline, retry, status, extras, verl's return shape) and the subclass contract; split, the order of
those steps would be spread over files that mean nothing alone. The primitives it calls are in
:mod:`async_reward._core`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from omegaconf import DictConfig
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase

from async_reward._core.config_rules import bad_value, names_config_errors, node_key
from async_reward._core.deadline import (
    AdmissionTimeout,
    DeadlineAbandoned,
    DeadlineExceeded,
    LeftRunningCalls,
    UserCodeError,
    as_user_code_error,
    being_cancelled,
    describe_error,
    run_with_deadline,
)
from async_reward._core.errors import ConfigError
from async_reward._core.http import HTTPStatusError, MalformedResponseError
from async_reward._core.job_admission import JobAdmission, broker_name, job_admission_line
from async_reward._core.limits import Admission, Priority, TokenReservation
from async_reward._core.postprocess import apply_group_postprocessing
from async_reward._core.result import (
    DISPATCH_ORDER_KEY,
    RewardResult,
    RewardSample,
    ScoredFloat,
    Status,
    extras_key_for,
    fill_missing_extras,
    neutral_value,
    normalize_user_result,
)
from async_reward._core.retry import AttemptsExhausted, default_is_transient, retry_async
from async_reward._core.start_lines import say_once
from async_reward._core.user_code import FunctionPool, default_pool_size
from async_reward.config import CONFIG_PATH, AsyncRewardConfig, LimitsConfig, load_config
from async_reward.config.checks import check_on_failure
from async_reward.config.composite import SECTION_READERS
from async_reward.config.verl_keys import check_verl_settings
from async_reward.judge.verdict import VerdictError

__all__ = ["AdmissionTimeout", "AsyncRewardManager", "RewardScoringError"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class RewardScoringError(RuntimeError):
    """Raised by a manager with ``on_failure: raise`` when a sample cannot be scored."""


class _Admitted:
    """An admitted attempt (``AsyncRewardManager._admitted``): its reservation, and the task of its
    call that ``run_with_deadline`` left running, if any (told through :meth:`left_running`)."""

    __slots__ = ("reservation", "stuck", "task")

    def __init__(self, reservation: TokenReservation) -> None:
        self.reservation = reservation
        self.task: asyncio.Future[Any] | None = None
        self.stuck = False

    def left_running(self, task: asyncio.Future[Any], stuck: bool) -> None:
        self.task, self.stuck = task, stuck

    def kept_by(self, calls: LeftRunningCalls, context: contextlib.AbstractAsyncContextManager[Any]) -> bool:
        """Whether the call still runs; if so ``calls`` keeps its admission ``context`` until it ends."""
        if self.task is None or self.task.done():
            return False
        calls.keep(self.task, lambda: context.__aexit__(None, None, None), stuck=self.stuck)
        return True


class AsyncRewardManager(RewardManagerBase):
    """Base class of all async-reward managers; subclass it and implement :meth:`score`.

    Users may subclass it in their own file and load it with
    ``reward.reward_manager.source=importlib``; they get the same admission, deadlines, retries and
    status reporting as the built-in managers.
    """

    #: Extras keys this manager always emits besides the standard ones (filled when a sample fails),
    #: with the neutral value used for a sample that has none.
    extra_defaults: ClassVar[dict[str, Any]] = {}
    #: Whether outbound calls are subject to RPM/TPM budgets (concurrency always applies).
    uses_rate_budgets: ClassVar[bool] = True
    #: Set by the pipeline's reward worker on the manager it drives (``PipelineRewardWorker``).
    driven_by_pipeline: bool = False
    #: Whether this manager calls ``reward.custom_reward_function`` (None: not known, e.g. a user's
    #: subclass; False refuses a function, a reward model or sandbox_fusion that would go unused).
    runs_custom_function: ClassVar[bool | None] = None
    #: Whether, without a custom function, it scores with verl's default scorer (``sandbox_fusion``'s).
    uses_default_scorer: ClassVar[bool] = False
    #: Sections of ``reward.async_reward`` this manager cannot run without (e.g. ``("judge",)``): their
    #: ``require`` runs at start-up, on the driver and in every worker.
    required_sections: ClassVar[tuple[str, ...]] = ()
    #: Whether it scores with the reward model verl serves in the job (``reward.reward_model.enable``)
    #: itself, through ``reward_router_address`` (``llm_judge``); False refuses that model unless the
    #: manager runs a function that may call it.
    scores_with_reward_model: ClassVar[bool] = False
    #: Whether it reads ``reward.async_reward.composite`` (``async_composite``); any other manager
    #: refuses that section at start-up rather than ignore its components, weights and gates. Private:
    #: not part of the subclass contract (docs/extending.md), only ``async_composite`` sets it.
    _reads_composite: ClassVar[bool] = False
    #: Which of the sections ``judge``, ``remote`` and ``stateful`` of ``reward.async_reward`` it reads:
    #: one set and not read is refused at start-up rather than ignored. Read from the class that sets
    #: it only, never inherited: a subclass that does not set it (a manager of your own, also one
    #: extending a built-in) may read any of them, so none is refused for it. Private: not part of the
    #: subclass contract (docs/extending.md); each built-in manager sets it.
    _reads_sections: ClassVar[frozenset[str] | None] = None

    def __init__(
        self,
        config: DictConfig,
        tokenizer: Any,
        compute_score: Callable[..., Any] | None = None,
        reward_router_address: str | None = None,
        reward_model_tokenizer: Any = None,
        **_: Any,
    ) -> None:
        super().__init__(config, tokenizer, compute_score)
        # The settings checks the driver ran (checks.check_reward, through check_config); repeated
        # here because a worker may be started by code that never ran them (verl's own trainer, a
        # user's loop). The user's code is not loaded a second time (check_user_code): verl loaded the
        # function already, and a subclass that loads more (async_stateful) checks what it loads.
        self.settings: AsyncRewardConfig = type(self).check_settings(config)
        limits = self.settings.limits
        if not self.uses_rate_budgets:
            # Its budgets and token estimate were refused at start-up if set (check_verl_settings):
            # what is dropped here is defaults only.
            limits = type(limits)(max_concurrency=limits.max_concurrency, admission=limits.admission)
        self.admission: Admission | JobAdmission = self._make_admission(limits, reward_router_address)
        self.reward_router_address = reward_router_address
        self.reward_model_tokenizer = reward_model_tokenizer
        # Keys seen in user extras, with a neutral value per key, so a failed sample carries the same
        # keys as its batch mates (verl stacks extras per key and fails on a missing one).
        self._extra_defaults: dict[str, Any] = {**self.extra_defaults, **self.settings.extra_defaults}
        self._results_returned = 0
        self._pool: FunctionPool | None = None
        self._renamed_keys: set[str] = set()  # user extras keys already reported as renamed
        # The pipelined trainer's settings in a job whose samples reach this manager through verl's
        # own reward loop: verl's trainer is training and ignoring them (issue 8). Refuse to score.
        trainer_node: Any = (config.get("async_reward") if hasattr(config, "get") else None) or {}
        self._pipeline_configured = hasattr(trainer_node, "get") and trainer_node.get("pipeline") is not None

    def _make_admission(self, limits: LimitsConfig, router_address: str | None) -> Admission | JobAdmission:
        """This worker's admission: its own (``limits.admission: worker``), or the job's queue.

        Outside Ray (the ``score`` command, a script) this process is the whole job, so its own
        admission over the whole budgets is the job's."""
        if not limits.job_wide:
            return Admission(limits, worker_count=self.settings.worker_count)
        import ray

        if not ray.is_initialized():
            return Admission(limits, worker_count=1)
        # What is called: one queue per service, and per user function for a manager that runs one
        # (two async_composite components calling different functions with the same limits had shared
        # one queue, halving each one's budget); the same function, so the same service, shares it.
        function = (
            node_key(self.config, "reward.custom_reward_function") if self.runs_custom_function else None
        )
        endpoint = "|".join(
            [
                type(self).__name__,
                router_address or "",
                self.settings.judge.base_url or "",
                self.settings.remote.url or "",
                f"{node_key(function, 'path') or ''}:{node_key(function, 'name') or ''}" if function else "",
            ]
        )
        job = ray.get_runtime_context().get_job_id()
        return JobAdmission(limits, broker_name(limits, endpoint, job))

    @classmethod
    @names_config_errors("reward")
    def check_config(cls, config: Any, env: Mapping[str, str] | None = None) -> AsyncRewardConfig:
        """Every start-up check of this manager, without building it: :meth:`check_settings`, then
        the user's code it runs (:meth:`check_user_code`). Run on the driver before any worker starts
        (``async_reward.config.checks.check_reward``).

        Raises:
            ConfigError: naming the key, the bad value and the fix.
        """
        settings = cls.check_settings(config, env)
        cls.check_user_code(config, settings)
        return settings

    @classmethod
    @names_config_errors("reward")
    def check_settings(cls, config: Any, env: Mapping[str, str] | None = None) -> AsyncRewardConfig:
        """The checks of this manager's settings: the values of ``reward.async_reward``, the verl
        reward settings it honours, what :attr:`required_sections` need (``env``: the workers'
        environment, default this process's), and the failure policy against the trainer
        (``async_reward.config.checks.check_on_failure``). Run by :meth:`check_config` on the driver and by
        the constructor in every worker (which loads the user's code itself). Override it to add a
        check of the settings (and call ``super()``).

        Raises:
            ConfigError: naming the key, the bad value and the fix.
        """
        settings = load_config(config)
        _refuse_what_it_does_not_read(config, cls)
        check_verl_settings(
            config,
            _manager_name(config, cls),
            uses_rate_budgets=cls.uses_rate_budgets,
            runs_custom_function=cls.runs_custom_function,
            uses_default_scorer=cls.uses_default_scorer,
            scores_with_reward_model=cls.scores_with_reward_model,
        )
        for section in cls.sections_required(config):
            getattr(settings, section).require(env)
        check_on_failure(config)
        return settings

    @classmethod
    def sections_required(cls, config: Any) -> tuple[str, ...]:
        """The sections whose ``require`` runs for ``config``: :attr:`required_sections` unless a
        manager needs other ones in some set-ups (``llm_judge`` with the judge verl serves needs no
        ``judge.base_url``)."""
        return cls.required_sections

    @classmethod
    def announce_settings(cls, config: Any, settings: AsyncRewardConfig) -> None:
        """Print, once per process, what ``settings`` turn on that a user must see in the job's log
        (``limits.admission: job``). Run on the driver by the start-up checks, after
        :meth:`check_config`; a manager that turns on more says so here."""
        if settings.limits.job_wide:
            say_once(job_admission_line(settings.limits, settings.worker_count))

    @classmethod
    def check_user_code(cls, config: Any, settings: AsyncRewardConfig) -> None:
        """Load the user's code this manager runs (``custom_reward_function``) and check it fits, so a
        wrong path or name stops the job on the driver, before any worker starts. None by default."""

    # ----------------------------------------------------------------- subclass API
    async def score(self, sample: RewardSample) -> RewardResult:
        """Score one decoded sample. Raise on failure; the base class turns errors into statuses."""
        raise NotImplementedError

    def postprocess_spec(self) -> tuple[str, ...] | None:
        """Identifies a group post-processor for ``assemble_rm_scores`` on the driver (None: none)."""
        return None

    # ----------------------------------------------------------------- verl entry points
    async def run_single(self, data: DataProto) -> dict[str, Any]:
        if self._pipeline_configured and not self.driven_by_pipeline:
            raise RuntimeError(
                "async_reward.pipeline is set, but this sample came from verl's own reward loop, not "
                "the pipeline: verl's trainer is training and ignores the pipeline settings. Start "
                "with python -m async_reward.legacy.main_ppo (or async_reward.legacy.main_ppo.run), "
                "or remove async_reward.pipeline"
            )
        batch_keys = _batch_keys(data)
        try:
            sample = self.decode(data)
        except Exception as exc:  # a malformed item must not take the batch down
            return self._finish(
                RewardResult.failure(Status.INVALID, f"cannot decode sample: {exc!r}"), batch_keys
            )
        return self._finish(await self._score_safely(sample), batch_keys)

    async def score_decoded(self, sample: RewardSample) -> dict[str, Any]:
        """``run_single`` for a sample that is already text (offline scoring, other front-ends).

        Returns verl's ``{"reward_score", "reward_extra_info"}`` dict; raises
        :class:`RewardScoringError` on failure when ``on_failure`` is ``raise``.
        """
        return self._finish(await self._score_safely(sample))

    def _finish(self, result: RewardResult, batch_keys: frozenset[str] = frozenset()) -> dict[str, Any]:
        if not result.ok and self.settings.on_failure == "raise":
            raise RewardScoringError(
                f"sample scoring failed with status {result.status.value}: {result.failure_reason}"
            )
        try:
            return self._to_verl(result, batch_keys)
        except Exception as exc:  # extras that cannot be converted: the sample still gets its status
            attempts = result.attempts if _is_count(result.attempts) else 1  # converts, so no second failure
            failed = RewardResult.failure(
                Status.INVALID, f"result cannot be converted: {describe_error(exc)}", attempts=attempts
            )
            failed.latency_s = result.latency_s
            return self._finish(failed, batch_keys)

    @classmethod
    def assemble_rm_scores(cls, data: DataProto, scores: list[float]) -> torch.Tensor:
        """verl calls this on the driver with the whole batch: every sample gets every extras key, then
        group post-processing runs.

        verl's ``RewardLoopManager.compute_rm_score`` stacks extras right after this call, by the first
        sample's keys: a sample scored by another worker process, or one that failed before its worker
        learnt a key from a success, would lack it (a bare ``KeyError``) and keys first seen later
        would be dropped. Each score holds its sample's extras dict (:class:`ScoredFloat`), so the
        missing keys are filled here, in the dicts verl then reads.
        """
        fill_missing_extras([s.extras for s in scores if isinstance(s, ScoredFloat) and s.extras is not None])
        uids = data.non_tensor_batch.get("uid") if data.non_tensor_batch else None
        processed = apply_group_postprocessing(list(uids) if uids is not None else None, scores)
        return super().assemble_rm_scores(data, processed)

    # ----------------------------------------------------------------- helpers for subclasses
    async def call_with_policy(
        self,
        attempt: Callable[[TokenReservation], Awaitable[_T]],
        *,
        estimated_tokens: int | None = None,
        retry_timeouts: bool = True,
        own_deadline: bool = False,
        priority: Priority = 0.0,
    ) -> tuple[_T, int]:
        """Run ``attempt`` under admission, a per-attempt deadline and the retry policy.

        Admission comes first so the deadline measures the service, not our own queue. The deadline
        (``timeout_s``) cannot be ignored: the attempt runs as its own task and is abandoned, not
        awaited, if it does not stop when cancelled (``async_reward._core.deadline``); an abandoned
        attempt keeps its admission (its concurrency slot) until its task really ends. ``own_deadline=True``
        for an attempt that applies ``timeout_s`` itself, after taking what it must wait for first
        (a free thread). ``retry_timeouts=False`` for work that cannot be stopped (a sync function in a
        thread keeps running after its deadline; starting it again would pile up copies).
        ``priority``: admission order, lower first (``RewardSample.admission_priority``: a sample of
        an earlier training step goes before a later one's).
        Returns ``(value, attempts)``; raises the last error (with ``attempts`` attached).
        """

        async def admitted_attempt() -> _T:
            async with self._admitted(estimated_tokens, priority) as admitted:
                try:
                    if own_deadline:
                        return await attempt(admitted.reservation)
                    return await run_with_deadline(
                        attempt(admitted.reservation),
                        self.settings.timeout_s,
                        what=f"the attempt against the service ({type(self).__name__})",
                        left_running=admitted.left_running,
                    )
                except DeadlineExceeded as exc:  # the sample's reason names the limit and its key
                    raise DeadlineExceeded(f"{exc} (timeout_s)", exc.timeout_s) from None

        def is_transient(exc: BaseException) -> bool:
            if isinstance(exc, (AdmissionTimeout, DeadlineAbandoned)):
                return False
            if isinstance(exc, TimeoutError) and not retry_timeouts:
                return False
            return default_is_transient(exc)

        return await retry_async(admitted_attempt, self.settings.retry, is_transient=is_transient)

    @contextlib.asynccontextmanager
    async def _admitted(
        self, estimated_tokens: int | None, priority: Priority = 0.0
    ) -> AsyncIterator[_Admitted]:
        """``admission.admit`` bounded by ``admission_timeout_s`` (the queue only, not the call) and,
        while calls that ignored their cancellation hold slots, by ``timeout_s``: checked every
        ``timeout_s`` of waiting, as the function pool does for its threads, so slots held by calls
        that may never end fail their waiters instead of queueing them for ever.

        The body hands a call's task it leaves running to ``left_running``: the admission is then
        given back when that task ends, not when the body does (``LeftRunningCalls``)."""
        settings = self.settings
        limit, round_s = settings.admission_timeout_s, settings.timeout_s
        admission = self.admission
        context = admission.admit(estimated_tokens, priority)
        loop = asyncio.get_running_loop()
        began = loop.time()
        stuck_at_give_up = 0
        watch: asyncio.TimerHandle | None = None

        def at_round_end(bound: asyncio.Timeout) -> None:
            nonlocal watch, stuck_at_give_up
            if admission.left_running.holding:
                stuck_at_give_up = admission.left_running.holding
                bound.reschedule(loop.time())  # give up now
            else:
                watch = loop.call_later(round_s, at_round_end, bound)

        try:
            async with asyncio.timeout(limit) as bound:
                watch = loop.call_later(round_s, at_round_end, bound)
                try:
                    reservation = await context.__aenter__()
                finally:
                    watch.cancel()
        except TimeoutError:
            if stuck_at_give_up:
                raise AdmissionTimeout(
                    f"no free concurrency slot within {loop.time() - began:.3g} s: {stuck_at_give_up} "
                    f"call(s) that ignored their cancellation still run and hold slots "
                    f"(limits.max_concurrency={settings.limits.max_concurrency}); limit: timeout_s="
                    f"{round_s:g} s while such calls hold slots"
                ) from None
            raise AdmissionTimeout(
                f"queued for admission (a concurrency slot, the RPM / TPM budget) longer than "
                f"admission_timeout_s={limit:g} s"
            ) from None
        admitted = _Admitted(reservation)
        try:
            yield admitted
        except BaseException as exc:
            if admitted.kept_by(admission.left_running, context):
                raise
            if not await context.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            if not admitted.kept_by(admission.left_running, context):
                await context.__aexit__(None, None, None)

    async def score_with_function(self, fn: Callable[..., Any], sample: RewardSample) -> RewardResult:
        """Score ``sample`` with a user reward function called as verl calls ``compute_score``
        (``data_source, solution_str, ground_truth, extra_info``), under the manager's policy."""

        # As verl's managers do: with a reward model (reward.reward_model.enable), the function gets
        # its router address and tokenizer.
        router: dict[str, Any] = (
            {
                "reward_router_address": self.reward_router_address,
                "reward_model_tokenizer": self.reward_model_tokenizer,
            }
            if self.reward_router_address is not None
            else {}
        )

        async def attempt(_reservation: TokenReservation) -> Any:
            return await self.run_user_function(
                fn,
                data_source=sample.data_source,
                solution_str=sample.response,
                ground_truth=sample.ground_truth,
                extra_info=sample.extra_info,
                **router,
            )

        is_async = _is_async(fn)
        value, attempts = await self.call_with_policy(
            attempt,
            retry_timeouts=is_async,
            own_deadline=not is_async,
            priority=sample.admission_priority,
        )
        result = normalize_user_result(value)
        result.attempts = attempts
        return result

    async def run_user_function(self, fn: Callable[..., Any], /, **kwargs: Any) -> Any:
        """Call a user function, sync or async; sync ones run off the event loop, in the manager's
        :class:`~async_reward._core.user_code.FunctionPool`, bounded by ``timeout_s`` from the
        moment a thread (or process) takes the call."""
        if _is_async(fn):
            return await fn(**kwargs)
        settings = self.settings
        return await self.function_pool.call(
            fn,
            kwargs,
            timeout_s=settings.timeout_s,
            # Waiting for a worker is queueing, like admission (admission_timeout_s); the pool also
            # fails waiters while calls stuck past their deadline hold its workers.
            wait_s=settings.admission_timeout_s,
        )

    @property
    def function_pool(self) -> FunctionPool:
        """Where sync user functions run (built on first use): ``executor`` kind, ``executor_workers``
        workers, by default one thread per concurrent call (``limits.max_concurrency``)."""
        if self._pool is None:
            settings = self.settings
            size = default_pool_size(
                settings.executor, settings.executor_workers, settings.limits.max_concurrency
            )
            self._pool = FunctionPool(settings.executor, size)
        return self._pool

    # ----------------------------------------------------------------- internals
    def decode(self, data: DataProto) -> RewardSample:
        """Decode the last item of ``data`` (verl scores multi-sequence outputs on the last one)."""
        item = data[len(data) - 1]
        response_ids = item.batch["responses"]
        response_length = response_ids.shape[-1]
        valid_length = int(item.batch["attention_mask"][-response_length:].sum())
        # Decoding inline: fast tokenizers decode a response in microseconds, far less than the
        # thread-pool hop verl's managers pay for it.
        tokenizer: Any = self.tokenizer  # verl annotates it as AutoTokenizer, a factory without decode()
        response = tokenizer.decode(response_ids[:valid_length].tolist(), skip_special_tokens=True)
        non_tensor = item.non_tensor_batch
        prompt: str | list[dict[str, Any]] | None = None
        raw_prompt = non_tensor.get("raw_prompt")
        if raw_prompt is not None:
            prompt = [dict(message) for message in raw_prompt]
        elif "prompts" in item.batch.keys():  # noqa: SIM118 (TensorDict membership needs keys())
            prompt_ids = item.batch["prompts"]
            prompt_mask = item.batch["attention_mask"][: prompt_ids.shape[-1]].bool()
            prompt = tokenizer.decode(prompt_ids[prompt_mask].tolist(), skip_special_tokens=True)
        reward_model = non_tensor.get("reward_model") or {}
        extra_info = non_tensor.get("extra_info")
        uid = non_tensor.get("uid")
        extra = dict(extra_info) if isinstance(extra_info, dict) else {}
        if self.runs_custom_function:
            # What verl's naive / rate_limited managers add to a function's extra_info (multi-turn
            # rollouts): the tool fields, the turn count and the rollout's own reward scores.
            tool_fields = non_tensor.get("tool_extra_fields")
            if hasattr(tool_fields, "items"):
                extra.update(tool_fields.items())
            extra["num_turns"] = non_tensor.get("__num_turns__")
            extra["rollout_reward_scores"] = non_tensor.get("reward_scores", {})
        return RewardSample(
            index=_as_index(extra_info.get("index") if isinstance(extra_info, dict) else None),
            uid=None if uid is None else str(uid),
            data_source=str(non_tensor.get("data_source", "unknown")),
            prompt=prompt,
            response=response,
            ground_truth=reward_model.get("ground_truth") if hasattr(reward_model, "get") else None,
            extra_info=extra,
            training_step=_as_step(non_tensor.get("global_steps")),
            generation_step=_generation_step(non_tensor.get("tool_extra_fields")),
            dispatch_order=_as_step(non_tensor.get(DISPATCH_ORDER_KEY)),
            session_id=_as_step(non_tensor.get("session_id")),
        )

    async def _score_safely(self, sample: RewardSample) -> RewardResult:
        started = time.monotonic()
        result = await self.guard(self._checked_score(sample))
        result.latency_s = time.monotonic() - started
        return result

    async def _checked_score(self, sample: RewardSample) -> RewardResult:
        return _checked(await self.score(sample))

    @staticmethod
    async def guard(scoring: Awaitable[RewardResult]) -> RewardResult:
        """Await ``scoring`` and turn anything it raises into a failed ``RewardResult``, except a real
        cancellation of this task: a ``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit`` or
        ``CancelledError`` raised by user code fails the sample (status ``error``), it does not stop
        the event loop or pass for a cancellation of the batch."""
        try:
            return await scoring
        except Exception as exc:
            if being_cancelled():  # code that turned our cancellation into an error: still cancelled
                raise asyncio.CancelledError() from exc
            return _failure_from_exception(exc)
        except BaseException as exc:
            replacement = as_user_code_error(exc)
            if replacement is None:
                raise
            return _failure_from_exception(replacement)

    def _to_verl(self, result: RewardResult, batch_keys: frozenset[str] = frozenset()) -> dict[str, Any]:
        result.extras = self._own_keys(result.extras, batch_keys)
        for key, value in result.extras.items():
            if key not in self._extra_defaults:
                self._extra_defaults[key] = neutral_value(value)
                if self._results_returned:
                    # verl's compute_rm_score path is fixed up on the driver (assemble_rm_scores), but
                    # verl's agent-loop scoring stacks extras of samples from several workers directly.
                    logger.warning(
                        "extras key %r first appeared after %d samples were returned without it; declare "
                        "it in reward.async_reward.extra_defaults (e.g. {%r: <value of a failed sample>}) "
                        "so every sample carries it from the start",
                        key,
                        self._results_returned,
                        key,
                    )
        for key, default in self._extra_defaults.items():
            result.extras.setdefault(key, default)
        self._results_returned += 1
        return result.to_verl(
            self.settings.fallback_score,
            self.postprocess_spec(),
            exclude_failures=self.settings.on_failure == "exclude",
        )

    def _own_keys(self, extras: Mapping[str, Any], batch_keys: frozenset[str]) -> dict[str, Any]:
        """``extras`` with every key that would replace one of ours (``status``, ``excluded``, ...) or a
        batch field (``uid``, ``data_source``, ``extra_info``, this sample's own fields, ...) renamed
        ``user_<key>``, reported once per key. verl's trainers write extras into the batch by name:
        an extras ``uid`` would merge GRPO groups without a word."""
        if not isinstance(extras, Mapping):
            raise TypeError(f"extras must be a mapping, not {type(extras).__name__}")
        owned: dict[str, Any] = {}
        for key, value in extras.items():
            name = extras_key_for(str(key), batch_keys, taken=extras)
            if name != key and key not in self._renamed_keys:
                self._renamed_keys.add(key)
                logger.warning(
                    "extras key %r returned by the scorer names a batch field or a key the library sets; "
                    "kept as %r so it cannot replace it",
                    key,
                    name,
                )
            owned[name] = value
        return owned


def _as_index(value: Any) -> int:
    """``extra_info["index"]`` is only for logs and services: anything not an integer is -1 (an
    infinite float too: ``int(inf)`` raises ``OverflowError``, which must not make the sample invalid)."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return -1


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "func", None))


def _checked(result: Any) -> RewardResult:
    """A subclass's or user's result, refused unless it is a ``RewardResult`` with a usable score:
    an ok result without a finite score would otherwise become a silent fallback or a NaN reward. Its
    bookkeeping is checked too: a status that is not a :class:`Status` or an ``attempts`` that is not
    a count is ``invalid`` (``attempts=None`` once made the sample's conversion fail, and its
    fallback too, without end), and a failure without a reason gets one, so that every failed sample
    says why."""
    if not isinstance(result, RewardResult):
        return RewardResult.failure(
            Status.INVALID, f"score() returned {type(result).__name__}, not a RewardResult"
        )
    if not isinstance(result.status, Status):
        return RewardResult.failure(
            Status.INVALID, f"score() returned a RewardResult whose status {result.status!r} is not a Status"
        )
    if not _is_count(result.attempts):
        return RewardResult.failure(
            Status.INVALID,
            f"score() returned a RewardResult whose attempts {result.attempts!r} is not a count",
        )
    if not result.ok and not (isinstance(result.failure_reason, str) and result.failure_reason.strip()):
        result.failure_reason = f"score() gave status {result.status.value} without a reason"
    elif result.ok and not isinstance(result.failure_reason, str):
        result.failure_reason = ""
    if result.ok:
        checked = normalize_user_result(result.score)
        if not checked.ok:
            reason = "an ok result without a score" if result.score is None else checked.failure_reason
            return RewardResult.failure(Status.INVALID, reason, attempts=result.attempts)
        result.score = checked.score
    return result


def _is_count(value: Any) -> bool:
    """A number of calls: a non-negative integer (numpy's too), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and bool(value >= 0)


def _batch_keys(data: DataProto) -> frozenset[str]:
    """The fields of ``data`` (tensor and non-tensor) an extras key must not replace."""
    try:
        tensors = set(data.batch.keys()) if data.batch is not None else set()
        return frozenset(tensors | set(data.non_tensor_batch or {}))
    except Exception:  # a malformed item: the static list still applies
        return frozenset()


def _failure_from_exception(exc: BaseException) -> RewardResult:
    """Map an exception to the status contract: timeout / invalid / error."""
    attempts = int(getattr(exc, "attempts", 1) or 1)
    root = exc
    stopped = ""
    if isinstance(exc, AttemptsExhausted):
        attempts = exc.attempts
        root = exc.last_error
        if exc.stopped_by:  # retrying ran out of time, not of attempts: say so
            stopped = f"; retrying stopped after {attempts} attempt(s): {exc.stopped_by}"
    if isinstance(root, (AdmissionTimeout, DeadlineAbandoned)):
        return RewardResult.failure(Status.TIMEOUT, str(root) + stopped, attempts=attempts)
    if isinstance(root, (TimeoutError, asyncio.TimeoutError)):
        # What timed out and its limit: the attempt (timeout_s), the HTTP exchange, the scoring code's
        # own timeout; never a bare "deadline exceeded".
        reason = str(root) or f"{type(root).__name__} raised by the scoring code (no message)"
        return RewardResult.failure(Status.TIMEOUT, reason + stopped, attempts=attempts)
    if isinstance(root, (MalformedResponseError, VerdictError)):
        return RewardResult.failure(Status.INVALID, str(root) + stopped, attempts=attempts)
    if isinstance(root, HTTPStatusError):
        return RewardResult.failure(
            Status.ERROR, f"HTTP {root.status}: {root.body_excerpt}{stopped}", attempts=attempts
        )
    if isinstance(root, UserCodeError):
        return RewardResult.failure(Status.ERROR, str(root) + stopped, attempts=attempts)
    return RewardResult.failure(Status.ERROR, describe_error(root) + stopped, attempts=attempts)


def _refuse_what_it_does_not_read(config: Any, cls: type[AsyncRewardManager]) -> None:
    """Refuse ``reward.async_reward.composite`` under a manager that is not the composite, a
    ``judge``, ``remote`` or ``stateful`` section under a built-in manager that does not read it (a
    rubric under ``async_naive`` would be left out of every reward), and an executor for a manager
    that runs no function of the user's: nothing a user sets may be silently ignored. A section's
    value is not echoed: it may hold a header's secret (``remote.headers``, a component's settings)."""
    name = _manager_name(config, cls)
    read = vars(cls).get("_reads_sections")  # the class's own: a subclass may read more
    for section, reader in SECTION_READERS.items():
        if read is None or section in read or node_key(config, f"{CONFIG_PATH}.{section}") is None:
            continue
        fix = (
            f"set reward.reward_manager.name={reader} (or async_composite with an {reader} component), "
            f"or remove {CONFIG_PATH}.{section}"
        )
        raise ConfigError(
            f"{CONFIG_PATH}.{section} is set, and is read by {reader} only, and the manager is {name}: "
            f"it would be ignored; {fix}",
            key=f"{CONFIG_PATH}.{section}",
            fix=fix,
        )
    if node_key(config, f"{CONFIG_PATH}.composite") is not None and not cls._reads_composite:
        fix = f"set reward.reward_manager.name=async_composite, or remove {CONFIG_PATH}.composite"
        raise ConfigError(
            f"{CONFIG_PATH}.composite is set, and is read by async_composite only, and the manager is "
            f"{name}: its components, weights and gates would be ignored; {fix}",
            key=f"{CONFIG_PATH}.composite",
            fix=fix,
        )
    if cls.runs_custom_function is False:
        for key in ("executor", "executor_workers"):
            value = node_key(config, f"{CONFIG_PATH}.{key}")
            if value is not None:
                raise bad_value(
                    f"{CONFIG_PATH}.{key}",
                    value,
                    f"sets the pool that runs your reward function, and {name} runs none",
                    f"remove {CONFIG_PATH}.{key}",
                )


def _manager_name(config: Any, cls: type) -> str:
    """The manager's name as configured (``reward.reward_manager.name``), else its class name."""
    reward: Any = config.get("reward") if hasattr(config, "get") else None
    manager: Any = reward.get("reward_manager") if hasattr(reward, "get") else None
    name = manager.get("name") if hasattr(manager, "get") else None
    return str(name) if name else cls.__name__


def _generation_step(extra_fields: Any) -> int | None:
    """The step a sample was generated for, from its agent-loop output's ``extra_fields`` (verl's
    agent loop passes them as ``tool_extra_fields``): the weight version its first token came from
    (``min_global_steps``, set by verl's ``LLMServerClient``) plus one, so it counts in the same
    steps as ``global_steps``; None when absent."""
    version = _as_step(extra_fields.get("min_global_steps")) if hasattr(extra_fields, "get") else None
    return None if version is None else version + 1


def _as_step(value: Any) -> int | None:
    """A sample's ``global_steps`` (a scalar, or a one-element array as verl stores it), else None."""
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(-1)[0]
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        return None
    return int(value)
