"""``async_composite``: one reward from several of our managers, weighted, with gates between them.

Each component is a real manager of ours (``llm_judge``, ``async_remote``, ``async_naive`` with a
rule function, ...) built from the job's config with the component's own settings merged over
``reward.async_reward``; the composite decodes a sample once and scores it with each component's own
guarded path (``AsyncRewardManager._score_safely``: admission, deadline, retries, verdict rules,
statuses), so every guarantee of a manager holds inside the composite because it is that manager's
code that runs. Components whose gates do not depend on each other run at once; a gated component
waits for its gate component and, where the gate does not hold, is ``skipped`` (no call).

How a sample's outcome is made (``docs/composite.md``):

* **reward**: the weighted sum of the components' scores, a skipped one counting its
  ``score_if_skipped`` (default 0);
* **status**: ``ok`` when every component that ran is ``ok``; otherwise the sample fails with the
  worst failed component's status, ``error`` before ``timeout`` before ``invalid`` (a service fault
  outranks a slow service, which outranks a reply that could not be read), and its reason, named;
* **on_failure**: the sample's, applied to the whole sample (``fallback``, ``raise``, ``exclude``):
  a weighted sum with a missing term is not the reward the user defined, and a fallback value in
  place of one term would be a made-up score that reads ``ok``. Since a response can make a judge
  fail at will, ``fallback_score`` may not exceed the lowest sum where a judge runs (start-up);
* **extras**: per component ``composite_<name>_{score,status,reason,attempts,latency_s,skipped}``
  and its own extras as ``composite_<name>_<key>`` (``composite_judge_judge_tokens``); the sample's
  ``attempts`` is the sum over its components and the ``judge_*`` cost keys the sums over its judge
  components, so ``reward/cost/*`` and ``reward/retries`` count what the sample's components spent.

Two components calling one service (one judge URL, one reward-service URL) share its admission:
one concurrency cap and one RPM / TPM budget, as one manager would have.

Longer than 400 lines: building the components (their merged settings, shared admission, the
start-up refusals that only a composite has), the gated schedule and the outcome rules above, which
run in one order per sample that reads best in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf, open_dict

from async_reward._core.config_rules import bad_value, names_config_errors, node_key, plain_container
from async_reward._core.errors import ConfigError
from async_reward._core.limits import Admission
from async_reward._core.result import MAX_ABS_SCORE, RewardResult, RewardSample, Status, extras_key_for
from async_reward.config import CONFIG_PATH, AsyncRewardConfig, LimitsConfig, load_config
from async_reward.config.checks import check_on_failure
from async_reward.config.composite import FUNCTION_MANAGERS, SAMPLE_KEYS, SECTION_READERS, ComponentConfig
from async_reward.judge.cost import whole_count
from async_reward.managers.base import AsyncRewardManager
from async_reward.managers.llm_judge import LLMJudgeRewardManager
from async_reward.managers.naive import AsyncNaiveRewardManager
from async_reward.managers.rate_limited import AsyncRateLimitedRewardManager
from async_reward.managers.registry import register_manager
from async_reward.managers.remote import AsyncRemoteRewardManager
from async_reward.managers.stateful import AsyncStatefulRewardManager

__all__ = ["STATUS_ORDER", "AsyncCompositeRewardManager", "component_config"]

COMPOSITE_PATH = f"{CONFIG_PATH}.composite"
#: The failed statuses, worst first: a failed sample takes the first one any of its components has.
STATUS_ORDER = (Status.ERROR, Status.TIMEOUT, Status.INVALID)
#: A component's status when its gate kept it from running.
SKIPPED = "skipped"
#: The suffixes the composite writes per component; a component's own extras key equal to one of
#: them is kept as ``user_<key>``.
_OWN_SUFFIXES = frozenset({"score", "status", "reason", "attempts", "latency_s", "skipped"})
#: Cost extras summed over the components into the sample's own key (``cost.cost_metrics`` reads them).
_SUMMED_COUNTS = ("judge_prompt_tokens", "judge_completion_tokens", "judge_tokens")
_CLASSES: dict[str, type[AsyncRewardManager]] = {
    "async_naive": AsyncNaiveRewardManager,
    "async_rate_limited": AsyncRateLimitedRewardManager,
    "async_remote": AsyncRemoteRewardManager,
    "llm_judge": LLMJudgeRewardManager,
    "async_stateful": AsyncStatefulRewardManager,
}


def component_config(config: Any, component: ComponentConfig) -> DictConfig:
    """The verl config a component's manager is built from: ``config`` with the component's manager
    name, its ``async_reward`` merged over ``reward.async_reward`` (without ``composite``), and its
    ``function`` as ``reward.custom_reward_function`` (cleared for a component that calls none)."""
    derived = copy.deepcopy(config) if isinstance(config, DictConfig) else OmegaConf.create(config)
    base = plain_container(derived.reward.get("async_reward"), CONFIG_PATH) or {}
    shared = {k: v for k, v in dict(base).items() if k != "composite" and _reads(component, k)}
    merged = _merged(shared, component.async_reward)
    with open_dict(derived):
        derived.reward.async_reward = merged
        derived.reward.reward_manager.name = component.manager
        derived.reward.reward_manager.source = "register"
        function = derived.reward.get("custom_reward_function")
        if function is None:
            derived.reward.custom_reward_function = {"path": None, "name": "compute_score"}
            function = derived.reward.custom_reward_function
        if component.function is not None:
            function.path = component.function.path
            function.name = component.function.name
            function.reward_kwargs = dict(component.function.reward_kwargs)
        elif component.manager not in FUNCTION_MANAGERS:
            function.path = None
    return derived


def _reads(component: ComponentConfig, key: str) -> bool:
    """Whether a shared ``reward.async_reward`` key reaches this component's manager: a section one
    other manager reads (``judge`` for the ``llm_judge`` components) and the function pool of a manager
    that runs no function stay with the components that read them; the managers refuse them."""
    if key in SECTION_READERS:
        return SECTION_READERS[key] == component.manager
    if key in ("executor", "executor_workers"):
        return component.manager in FUNCTION_MANAGERS
    return True


def _merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` deep-merged over ``base`` (mappings merged key by key, anything else replaced)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@dataclass
class _Part:
    """A component and the manager that scores it."""

    index: int
    config: ComponentConfig
    manager: AsyncRewardManager

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def prefix(self) -> str:
        return f"composite_{self.config.name}_"


@dataclass
class _Outcome:
    """What one component did for one sample: its result, or why it was skipped."""

    result: RewardResult | None
    skip_reason: str = ""


@dataclass
class _Decoded(RewardSample):
    """A sample as the composite decodes it, with the view a component that runs a user function gets
    (verl's multi-turn tool fields added to ``extra_info``, as ``async_naive`` decodes it)."""

    for_functions: RewardSample | None = None
    """The sample decoded by a function component's manager; None when no component runs one."""


@register_manager("async_composite")
class AsyncCompositeRewardManager(AsyncRewardManager):
    """Scores each sample with its components (``reward.async_reward.composite.components``) and
    combines them: a weighted sum, gates, statuses composed by :data:`STATUS_ORDER`."""

    #: The composite calls nothing itself; each component is admitted under its own limits.
    uses_rate_budgets: ClassVar[bool] = False
    _reads_composite: ClassVar[bool] = True
    #: Every shared section, as its components' defaults (check_settings refuses one that none reads).
    _reads_sections: ClassVar[frozenset[str] | None] = frozenset(SECTION_READERS)

    def __init__(
        self,
        config: DictConfig,
        tokenizer: Any,
        compute_score: Any = None,
        reward_router_address: str | None = None,
        reward_model_tokenizer: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            config,
            tokenizer,
            compute_score,
            reward_router_address=reward_router_address,
            reward_model_tokenizer=reward_model_tokenizer,
            **kwargs,
        )
        self.parts: list[_Part] = []
        services: dict[tuple[str, str], AsyncRewardManager] = {}
        for index, component in enumerate(self.settings.composite.components):
            derived = component_config(config, component)
            with _naming_the_component(index, component):
                # The job's function as verl loaded it, or the component's own, loaded the way verl does.
                function = compute_score if component.function is None else _load_function(derived, component)
                manager = _CLASSES[component.manager](
                    derived,
                    tokenizer,
                    function,
                    reward_router_address=reward_router_address,
                    reward_model_tokenizer=reward_model_tokenizer,
                )
                # In every worker, not only on the driver: a worker may be built by code that never ran
                # check_user_code, and the group step would then silently never run.
                if manager.postprocess_spec() is not None:
                    raise _group_step_refused(derived.reward.custom_reward_function.name)
            service = _service(component, manager.settings)
            if service is not None:
                # One service, one admission: its concurrency cap and budgets, whichever component calls.
                manager.admission = services.setdefault(service, manager).admission
            self.parts.append(_Part(index, component, manager))
        self._function_part = next((p for p in self.parts if p.manager.runs_custom_function), None)
        self._extra_defaults = self._composite_defaults()

    def _make_admission(self, limits: LimitsConfig, router_address: str | None) -> Admission:
        """Never used: the composite makes no call of its own (its components hold the admissions)."""
        return Admission(LimitsConfig(max_concurrency=limits.max_concurrency), worker_count=1)

    # ----------------------------------------------------------------- start-up checks
    @classmethod
    @names_config_errors("reward")
    def check_settings(cls, config: Any, env: Mapping[str, str] | None = None) -> AsyncRewardConfig:
        """``reward.async_reward`` (the composite's section included), the failure policy, then each
        component's own manager checks on the config it is built from, errors naming the
        component's keys; two components of one service must give it the same limits.

        Raises:
            ConfigError: naming the key and the fix.
        """
        settings = load_config(config)
        composite = settings.composite
        composite.require(COMPOSITE_PATH)
        check_on_failure(config)
        reward: Any = config.get("reward") if hasattr(config, "get") else None
        if settings.extra_defaults:
            raise bad_value(
                f"{CONFIG_PATH}.extra_defaults",
                settings.extra_defaults,
                "declares extras of the composite itself, whose keys are its components'",
                "declare them in the component that returns them: "
                f"{COMPOSITE_PATH}.components[i].async_reward.extra_defaults",
            )
        for section, reader in SECTION_READERS.items():
            value = node_key(config, f"{CONFIG_PATH}.{section}")
            if value is not None and all(component.manager != reader for component in composite.components):
                # Shared with the reader's components only; not echoed (a header's secret may be there).
                fix = f"remove it, or add a component with manager: {reader}"
                raise ConfigError(
                    f"{CONFIG_PATH}.{section} is set, and is read by {reader} components only, and "
                    f"async_composite has none: it would be ignored; {fix}",
                    key=f"{CONFIG_PATH}.{section}",
                    fix=fix,
                )
        if reward is not None and _enabled(reward, "reward_model.enable"):
            raise bad_value(
                "reward.reward_model.enable",
                True,
                "starts a reward model for verl's own reward worker, which then bypasses async_composite "
                "(and a judge served in the job is not supported inside a composite)",
                "set it to false and give the llm_judge component a judge.base_url",
            )
        function_path = node_key(reward, "custom_reward_function.path")
        if function_path and not any(
            c.manager in FUNCTION_MANAGERS and c.function is None for c in composite.components
        ):
            raise bad_value(
                "reward.custom_reward_function.path",
                function_path,
                "names a reward function, and no component calls it (each function component has its "
                "own function, or there is none)",
                "remove it, or add a component such as {name: rule, manager: async_naive} without function",
            )
        loaded = []
        for index, component in enumerate(composite.components):
            with _naming_the_component(index, component):
                _check_component_keys(index, component)
                derived = component_config(config, component)
                loaded.append(load_config(derived))
                _check_component_fits(component, loaded[index], derived)
        # Before the components' own checks: a judge's own fallback check knows its range only, not
        # its weight or the rest of the sum, and this one's refusal names the composite's bound.
        _check_fallback(settings, loaded)
        services: dict[tuple[str, str], tuple[int, LimitsConfig]] = {}
        for index, component in enumerate(composite.components):
            derived = component_config(config, component)
            with _naming_the_component(index, component):
                part_settings = _CLASSES[component.manager].check_settings(derived, env)
            service = _service(component, part_settings)
            if service is None:
                continue
            first, limits = services.setdefault(service, (index, part_settings.limits))
            if limits != part_settings.limits:
                raise bad_value(
                    f"{COMPOSITE_PATH}.components[{index}].async_reward.limits",
                    _limits_shown(part_settings.limits),
                    f"differ from those of components[{first}] ({composite.components[first].name!r}), "
                    f"which calls the same {service[0]}: one service has one admission (its concurrency "
                    f"cap and budgets), shared by every component that calls it",
                    "give both components the same limits (in each one's async_reward.limits, or once at "
                    "reward.async_reward.limits when every component may have them)",
                )
        return settings

    @classmethod
    def check_user_code(cls, config: Any, settings: AsyncRewardConfig) -> None:
        """Each component's user code loads and fits (its manager's own check); a class with
        ``post_process_scores`` is refused: a composite has no group step for one component."""
        for index, component in enumerate(settings.composite.components):
            derived = component_config(config, component)
            manager_cls = _CLASSES[component.manager]
            with _naming_the_component(index, component):
                manager_cls.check_user_code(derived, load_config(derived))
                if manager_cls is AsyncStatefulRewardManager:
                    _path, name, user_cls = AsyncStatefulRewardManager._user_class(
                        derived, load_config(derived)
                    )
                    if callable(getattr(user_cls, "post_process_scores", None)):
                        raise _group_step_refused(name)

    # ----------------------------------------------------------------- scoring
    def decode(self, data: Any) -> RewardSample:
        """The sample, decoded once; a component that runs a user function gets it as its own manager
        decodes it (verl's tool fields in ``extra_info``)."""
        sample = super().decode(data)
        if self._function_part is None:
            return sample
        values = {f.name: getattr(sample, f.name) for f in fields(RewardSample)}
        return _Decoded(**values, for_functions=self._function_part.manager.decode(data))

    async def score(self, sample: RewardSample) -> RewardResult:
        tasks: dict[str, asyncio.Task[_Outcome]] = {}
        async with asyncio.TaskGroup() as group:  # cancelled together: no component outlives its sample
            for part in self.parts:
                gate = part.config.only_if
                waits_for = tasks[gate.component] if gate is not None else None
                tasks[part.name] = group.create_task(self._run(part, sample, waits_for))
        return self._combine({name: task.result() for name, task in tasks.items()})

    async def _run(
        self, part: _Part, sample: RewardSample, gate_task: asyncio.Task[_Outcome] | None
    ) -> _Outcome:
        """One component for one sample: after its gate component, if it has one; skipped (no call)
        where the gate does not hold."""
        gate = part.config.only_if
        if gate is not None:
            assert gate_task is not None  # listed before: its task exists (CompositeConfig.validate)
            before = await gate_task
            reason = _closed_gate(gate.component, gate.describe(), before)
            if reason is None and before.result is not None:
                assert before.result.score is not None  # ok, so scored (_checked)
                if not gate.holds(before.result.score):
                    reason = f"gate: {gate.component} scored {before.result.score:g}, needs {gate.describe()}"
            if reason is not None:
                return _Outcome(None, reason)
        view = sample
        if part.manager.runs_custom_function and isinstance(sample, _Decoded) and sample.for_functions:
            view = sample.for_functions
        return _Outcome(_in_range(part.config, await part.manager._score_safely(view)))

    def _combine(self, outcomes: Mapping[str, _Outcome]) -> RewardResult:
        """The sample's result from its components' (the rules in the module's docstring)."""
        extras: dict[str, Any] = {}
        total = 0.0
        attempts = calls = 0
        failed: list[tuple[_Part, RewardResult]] = []
        spent: list[Mapping[str, Any]] = []
        for part in self.parts:
            outcome = outcomes[part.name]
            prefix = part.prefix
            result = outcome.result
            if result is None:
                total += part.config.weight * part.config.score_if_skipped
                extras.update(
                    {
                        f"{prefix}score": math.nan,
                        f"{prefix}status": SKIPPED,
                        f"{prefix}reason": outcome.skip_reason,
                        f"{prefix}attempts": 0,
                        f"{prefix}latency_s": 0.0,
                        f"{prefix}skipped": True,
                    }
                )
                continue
            if result.ok:
                assert result.score is not None
                total += part.config.weight * result.score
            else:
                failed.append((part, result))
            for key, value in result.extras.items():
                extras[prefix + _component_key(str(key), result.extras)] = value
            extras.update(
                {
                    f"{prefix}score": result.score if result.ok else math.nan,
                    f"{prefix}status": result.status.value,
                    f"{prefix}reason": result.failure_reason,
                    f"{prefix}attempts": result.attempts,
                    f"{prefix}latency_s": round(float(result.latency_s), 6),
                    f"{prefix}skipped": False,
                }
            )
            attempts += result.attempts
            # A judge's own count of its calls (a rubric's chunks); any other component's judge_* keys
            # are its user's extras, not what the sample spent at a judge.
            judged = part.config.manager == "llm_judge"
            own_calls = whole_count(result.extras.get("judge_calls")) if judged else None
            calls += own_calls if own_calls is not None else min(result.attempts, 1)
            if judged:
                spent.append(result.extras)
        extras.update(self._spent(spent))
        extras["judge_calls"] = calls
        if not failed and not (math.isfinite(total) and abs(total) <= MAX_ABS_SCORE):
            return RewardResult.failure(
                Status.INVALID, self._overflow_reason(outcomes), attempts=attempts, extras=extras
            )
        if not failed:
            return RewardResult(score=total, attempts=attempts, extras=extras)
        worst = min(failed, key=lambda pair: STATUS_ORDER.index(pair[1].status))
        part, result = worst
        reason = f"{part.name}: {result.failure_reason}"
        others = [f"{p.name} ({r.status.value})" for p, r in failed if p is not part]
        if others:
            reason = f"{reason} (also failed: {', '.join(others)})"
        return RewardResult.failure(result.status, reason, attempts=attempts, extras=extras)

    def _overflow_reason(self, outcomes: Mapping[str, _Outcome]) -> str:
        """Why a sum of finite terms is no score (not finite, or past ``MAX_ABS_SCORE``, which verl's
        float32 training cannot hold): the terms, each weight x score, named."""
        terms = []
        for part in self.parts:
            result = outcomes[part.name].result
            score = part.config.score_if_skipped if result is None else result.score
            terms.append(f"{part.name} {part.config.weight:g} x {score:g}")
        return f"weighted sum overflows floating point or passes {MAX_ABS_SCORE:g} ({', '.join(terms)})"

    def _spent(self, spent: list[Mapping[str, Any]]) -> dict[str, Any]:
        """The sample's cost keys: the sums over its judge components that ran (``cost.cost_metrics``)."""
        if "judge_tokens" not in self._extra_defaults:
            return {}
        totals: dict[str, Any] = {key: 0 for key in _SUMMED_COUNTS}
        totals.update(judge_cache_hit=False, judge_shared=False, judge_usage_error="")
        errors = []
        for extras in spent:
            for key in _SUMMED_COUNTS:
                totals[key] += whole_count(extras.get(key)) or 0
            totals["judge_cache_hit"] |= bool(extras.get("judge_cache_hit", False))
            totals["judge_shared"] |= bool(extras.get("judge_shared", False))
            if isinstance(extras.get("judge_usage_error"), str) and extras["judge_usage_error"]:
                errors.append(extras["judge_usage_error"])
        totals["judge_usage_error"] = "; ".join(errors)
        if "judge_cost" in self._extra_defaults:
            costs = [e.get("judge_cost") for e in spent]
            totals["judge_cost"] = float(
                sum(c for c in costs if isinstance(c, (int, float)) and math.isfinite(c))
            )
        return totals

    def _composite_defaults(self) -> dict[str, Any]:
        """Every key a composite sample carries, with the value of a sample whose components never ran
        (one that failed to decode)."""
        defaults: dict[str, Any] = {}
        judged = priced = False
        for part in self.parts:
            component = part.manager._extra_defaults
            for key, value in component.items():
                defaults[part.prefix + _component_key(key, component)] = value
            defaults.update(
                {
                    f"{part.prefix}score": math.nan,
                    f"{part.prefix}status": "",
                    f"{part.prefix}reason": "",
                    f"{part.prefix}attempts": 0,
                    f"{part.prefix}latency_s": 0.0,
                    f"{part.prefix}skipped": False,
                }
            )
            if part.config.manager == "llm_judge":
                judged |= "judge_tokens" in component
                priced |= "judge_cost" in component
        if judged:
            defaults.update({key: 0 for key in _SUMMED_COUNTS})
            defaults.update(judge_cache_hit=False, judge_shared=False, judge_usage_error="")
        if priced:
            defaults["judge_cost"] = 0.0
        # NaN: unknown, so reward/retries counts a sample that failed before any call as one call.
        defaults["judge_calls"] = math.nan
        return defaults

    def __repr__(self) -> str:
        parts = ", ".join(f"{p.name}={p.config.manager}" for p in self.parts)
        return f"{type(self).__name__}({parts})"


def _closed_gate(component: str, needs: str, before: _Outcome) -> str | None:
    """Why a gate on ``component`` is closed by that component's outcome alone (None: its score decides)."""
    if before.result is None:
        return f"gate: {component} was skipped"
    if not before.result.ok:
        return f"gate: {component} failed ({before.result.status.value}), needs a score {needs}"
    return None


def _component_key(key: str, taken: Mapping[str, Any]) -> str:
    """A component's extras key as kept under its prefix: one of ours (``status``, ...) or one of the
    composite's per-component suffixes becomes ``user_<key>``."""
    name = extras_key_for(key, taken=taken)
    while name in _OWN_SUFFIXES:
        name = "user_" + name
    return name


def _service(component: ComponentConfig, settings: AsyncRewardConfig) -> tuple[str, str] | None:
    """The outside service a component calls, for sharing its admission: ``("judge", url)``,
    ``("reward service", url)``; None for a user's function (its own admission)."""
    if component.manager == "llm_judge" and settings.judge.base_url:
        return ("judge", settings.judge.base_url.rstrip("/"))
    if component.manager == "async_remote" and settings.remote.url:
        return ("reward service", settings.remote.url)
    return None


def _load_function(derived: DictConfig, component: ComponentConfig) -> Any:
    """A component's own function, loaded as verl loads ``custom_reward_function``. Where it does not
    load, the error names the component's key, as the driver's check does (a worker may be built by
    code that never ran that check: the ``score`` command, verl's ``load_reward_manager``)."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    try:
        return get_custom_reward_fn(derived)
    except Exception as error:
        # The manager's own check of the code says which key is wrong (the file, or the name in it).
        _CLASSES[component.manager].check_user_code(derived, load_config(derived))
        raise ConfigError(
            f"reward.custom_reward_function does not load: {error!r}",
            key="reward.custom_reward_function.path",
            fix="give the path of a file that defines the function, and its name",
        ) from error


def _group_step_refused(name: str) -> ConfigError:
    """The refusal of an ``async_stateful`` class with ``post_process_scores`` in a component."""
    return bad_value(
        "reward.custom_reward_function.name",
        name,
        "has post_process_scores, which works on a group's scores of one manager; "
        "inside async_composite it would run on no group",
        "use the class as the whole reward (async_stateful), or drop post_process_scores",
    )


def _in_range(component: ComponentConfig, result: RewardResult) -> RewardResult:
    """``result``, or ``invalid`` where its score is outside the component's declared ``score_range``:
    the start-up fallback check trusted that range, so a score outside it may not count."""
    bounds = component.score_range
    if bounds is None or not result.ok or result.score is None or bounds[0] <= result.score <= bounds[1]:
        return result
    return RewardResult.failure(
        Status.INVALID,
        f"score {result.score:g} is outside its score_range [{bounds[0]:g}, {bounds[1]:g}]",
        attempts=result.attempts,
        latency_s=result.latency_s,
        extras=result.extras,
    )


def _check_component_keys(index: int, component: ComponentConfig) -> None:
    """Refuse an unknown key in a component's ``async_reward``, listing the keys a component may set
    (the merged config's own error would name ``reward.async_reward`` and the sample's keys)."""
    path = f"{COMPOSITE_PATH}.components[{index}].async_reward"
    allowed = sorted({f.name for f in fields(AsyncRewardConfig)} - set(SAMPLE_KEYS))
    unknown = sorted(set(component.async_reward) - set(allowed) - set(SAMPLE_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {unknown} in {path}; valid keys: {allowed}",
            key=f"{path}.{unknown[0]}",
            fix=f"use one of {allowed}",
        )


def _check_fallback(settings: AsyncRewardConfig, loaded: list[AsyncRewardConfig]) -> None:
    """Refuse a ``fallback_score`` that a response could earn by making a judge component fail.

    Under ``on_failure: fallback`` a failed sample scores ``fallback_score`` in place of the whole
    weighted sum, and a response can make a judge fail whenever it likes (a planted verdict). For each
    judge component, the lowest sum of a sample where that judge runs is bounded from each
    component's known range (a judge's settings, a declared ``score_range``, a gate that held for the
    judge to run) and weight; the fallback may not exceed the lowest of those bounds. A component
    whose range is unknown leaves the bound unknown, and is refused. A function component's own
    failure is not bounded here, as ``async_naive`` alone does not bound it.
    """
    components = settings.composite.components
    if settings.on_failure != "fallback":
        return
    for index, component in enumerate(components):
        if component.manager != "llm_judge":
            continue
        lowest, terms = _lowest_sum_where_it_runs(index, components, loaded)
        if settings.fallback_score > lowest:
            raise bad_value(
                f"{CONFIG_PATH}.fallback_score",
                settings.fallback_score,
                f"is above the lowest reward of a sample where judge component {component.name!r} runs "
                f"({lowest:g} = {' + '.join(terms)}), so a response could raise its reward by making "
                "that judge fail (planting a conflicting verdict): on_failure: fallback replaces the "
                "whole weighted sum",
                f"set reward.async_reward.fallback_score to {lowest:g} or lower, or use on_failure: "
                "exclude or raise",
            )


def _lowest_sum_where_it_runs(
    judge: int, components: tuple[ComponentConfig, ...], loaded: list[AsyncRewardConfig]
) -> tuple[float, list[str]]:
    """The lowest weighted sum of a sample in which component ``judge`` runs, and its terms.

    Raises:
        ConfigError: a component that counts has no known range (``score_range``).
    """
    index_of = {c.name: i for i, c in enumerate(components)}
    held: dict[int, tuple[float | None, float | None]] = {}  # gates that held for the judge to run
    gate = components[judge].only_if
    while gate is not None and index_of[gate.component] not in held:
        held[index_of[gate.component]] = (gate.score_at_least, gate.score_at_most)
        gate = components[index_of[gate.component]].only_if
    total, terms = 0.0, []
    for index, component in enumerate(components):
        low, high = _known_range(component, loaded[index])
        if index in held:
            low, high = _tighter(low, held[index][0], max), _tighter(high, held[index][1], min)
        may_skip = index != judge and index not in held and component.only_if is not None
        term = _lowest_term(component, low, high, may_skip)
        if term is None:
            raise ConfigError(
                f"{COMPOSITE_PATH}.components[{index}] ({component.name!r}) has no known score range, so "
                "the lowest reward of the composite is unknown: under on_failure: fallback a response "
                f"that makes judge component {components[judge].name!r} fail gets fallback_score in "
                "place of the whole sum, which could be more than it would have scored; declare "
                "score_range: [low, high] (a score outside it is then invalid), e.g. [0, 1] for a 0/1 "
                "rule, or gate the judge on it, or set reward.async_reward.on_failure to exclude or raise",
                key=f"{COMPOSITE_PATH}.components[{index}].score_range",
                fix="declare score_range: [low, high], or set reward.async_reward.on_failure to exclude "
                "or raise",
            )
        total += term
        terms.append(f"{component.name} {term:g}")
    return total, terms


def _known_range(
    component: ComponentConfig, settings: AsyncRewardConfig
) -> tuple[float | None, float | None]:
    """A component's own score range: its judge's, its declared ``score_range``, or unknown."""
    if component.manager == "llm_judge":
        judge = settings.judge
        return judge.reward_floor, judge.max_score if judge.normalize_to is None else judge.normalize_to[1]
    if component.score_range is not None:
        return component.score_range
    return None, None


def _tighter(bound: float | None, other: float | None, pick: Any) -> float | None:
    if bound is None or other is None:
        return other if bound is None else bound
    return float(pick(bound, other))


def _lowest_term(
    component: ComponentConfig, low: float | None, high: float | None, may_skip: bool
) -> float | None:
    """The lowest ``weight x score`` a component adds (None: unknown); a gated one may be skipped."""
    weight = component.weight
    if weight == 0:
        return 0.0
    bound = low if weight > 0 else high
    if bound is None:
        return None
    term = weight * bound
    return min(term, weight * component.score_if_skipped) if may_skip else term


def _check_component_fits(component: ComponentConfig, settings: AsyncRewardConfig, derived: Any) -> None:
    """Refuse what a component's manager supports alone but not inside a composite (before its own
    checks, which would refuse it for a reason that does not matter here, or give a fix that is
    wrong inside a composite). ``derived``: the config the component's manager is built from, which
    tells a key set from its default."""
    if not _CLASSES[component.manager].uses_rate_budgets:
        estimate = node_key(derived, f"{CONFIG_PATH}.limits.estimated_tokens_per_request")
        if estimate is not None:
            raise bad_value(
                f"{CONFIG_PATH}.limits.estimated_tokens_per_request",
                estimate,
                f"is what a call is charged against limits.tokens_per_minute, and {component.manager} "
                "has no token budget (only a concurrency cap): it would be ignored",
                "remove it here: set it only in the async_reward.limits of the components that have a "
                "tokens_per_minute budget (llm_judge, async_remote, async_rate_limited), not at "
                "reward.async_reward.limits, which every component inherits",
            )
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(settings.limits, name)
            if value is not None:
                raise bad_value(
                    f"{CONFIG_PATH}.limits.{name}",
                    value,
                    f"is a request/token budget, and {component.manager} has none (only a concurrency cap)",
                    "set the budget in the async_reward.limits of the components that call the service "
                    "(llm_judge, async_remote), not at reward.async_reward.limits, which every component "
                    "inherits; or make this component manager: async_rate_limited",
                )
    if component.manager == "llm_judge" and settings.judge.mode == "group":
        raise bad_value(
            f"{CONFIG_PATH}.judge.mode",
            "group",
            "needs every member of a GRPO group at the judge together, which a gate breaks and a "
            "composite does not route for",
            "use judge.mode=pointwise in a composite (or llm_judge alone for group judging)",
        )


@contextlib.contextmanager
def _naming_the_component(index: int, component: ComponentConfig) -> Iterator[None]:
    """A component manager's ``ConfigError`` said for the component: prefixed with its name, and its
    key moved to the component's own settings where the component sets that key."""
    try:
        yield
    except ConfigError as error:
        key = error.key or ""
        moved = _component_key_path(key, index, component)
        message = str(error)
        if moved != key and key in message:
            message = message.replace(key, moved, 1)
        elif moved != key and key:  # "unknown key(s) [...] in <the section>": the section moved too
            section, moved_section = key.rpartition(".")[0], moved.rpartition(".")[0]
            message = message.replace(f" in {section};", f" in {moved_section};", 1)
        raise ConfigError(
            f"component {component.name!r} ({component.manager}) of async_composite: {message}",
            key=moved or None,
            fix=error.fix,
        ) from None


def _component_key_path(key: str, index: int, component: ComponentConfig) -> str:
    """Where ``key`` (of the config a component's manager was built from) is set: in the component
    (its ``async_reward`` or ``function``), or where it is, shared by every component."""
    here = f"{COMPOSITE_PATH}.components[{index}]"
    own = f"{CONFIG_PATH}."
    if key.startswith(own) and _sets(component.async_reward, _path_parts(key.removeprefix(own))):
        return f"{here}.async_reward.{key.removeprefix(own)}"
    function_key = "reward.custom_reward_function"
    if component.function is not None and key.startswith(function_key):
        return f"{here}.function{key.removeprefix(function_key)}"
    return key


def _path_parts(dotted: str) -> list[str | int]:
    """``judge.criteria[0].polarity`` as ``["judge", "criteria", 0, "polarity"]``."""
    parts: list[str | int] = []
    for name in dotted.split("."):
        head, *indices = name.split("[")
        parts.append(head)
        parts.extend(int(index.rstrip("]")) for index in indices if index.rstrip("]").isdigit())
    return parts


def _sets(node: Any, parts: list[str | int]) -> bool:
    """Whether ``node`` (mappings and lists) holds the path ``parts`` (or a value above it)."""
    for part in parts:
        in_list = isinstance(part, int) and isinstance(node, list) and 0 <= part < len(node)
        if not in_list and not (isinstance(part, str) and isinstance(node, Mapping) and part in node):
            return False
        node = node[part]
        if not isinstance(node, (Mapping, list)):
            return True
    return True


def _limits_shown(limits: LimitsConfig) -> dict[str, Any]:
    return {f.name: getattr(limits, f.name) for f in fields(limits)}


def _enabled(reward: Any, dotted: str) -> bool:
    return bool(node_key(reward, dotted))
