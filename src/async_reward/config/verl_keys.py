"""verl's own reward settings, read with the meaning verl gives them, or refused by name.

A user coming from verl's managers keeps the keys verl documents for them. Each one either takes
effect here with the same meaning, or stops the job at start-up with a ``ConfigError`` naming the
key and our equivalent: none is ignored (the audit is in ``docs/verl_settings.md``).

* verl's ``rate_limited`` keys (``reward.max_concurrent``, ``max_rpm``, ``max_tpm``,
  ``estimated_tokens_per_request``, ``timeout``) are mapped onto ``reward.async_reward`` by
  :func:`apply_verl_reward_keys` (one log line per process says so). Both set with different values
  is an error.
* :func:`check_verl_settings` refuses, per manager, the verl settings that manager cannot honour
  (a request budget for ``async_naive``, a ``custom_reward_function`` for ``llm_judge``, DAPO's
  ``reward.reward_kwargs``, ...); :func:`check_function_needs_its_path`, a function's ``name`` or
  ``reward_kwargs`` without its ``path`` (which verl would ignore).
* :func:`apply_legacy_reward_keys` is verl's ``migrate_legacy_reward_impl`` for the legacy
  ``reward_model.*`` / ``custom_reward_function.*`` / ``sandbox_fusion.*`` keys, with conflicts
  refused (a legacy key and its new key set to different values; a key under a section the migration
  replaces whole, which it would drop); the setup hook runs it where verl's own entry point never does.

Longer than 400 lines: this module is the code of one audit (``docs/verl_settings.md``), every verl
reward key read with verl's meaning, refused, or migrated as verl migrates it, each against verl's own
defaults; split, a key's three fates would be read in three places.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from async_reward._core.config_rules import bad_value, node_key, plain_container
from async_reward._core.errors import ConfigError
from async_reward._core.start_lines import say_once

__all__ = [
    "LEGACY_LATE_KEYS",
    "VERL_LIMIT_KEYS",
    "VERL_TPM_ESTIMATE_DEFAULT",
    "apply_legacy_reward_keys",
    "apply_verl_reward_keys",
    "check_function_needs_its_path",
    "check_verl_settings",
]


#: verl ``rate_limited`` key under ``reward`` -> our key under ``reward.async_reward`` (same meaning:
#: per-process concurrency, per-attempt deadline; the budgets become the whole job's, see the log line).
VERL_LIMIT_KEYS: dict[str, str] = {
    "max_concurrent": "limits.max_concurrency",
    "max_rpm": "limits.requests_per_minute",
    "max_tpm": "limits.tokens_per_minute",
    "estimated_tokens_per_request": "limits.estimated_tokens_per_request",
    "timeout": "timeout_s",
}
#: verl's ``rate_limited`` reserves this many tokens per request when ``max_tpm`` is set without an
#: estimate; a TPM budget given through ``reward.max_tpm`` keeps that meaning.
VERL_TPM_ESTIMATE_DEFAULT = 2000
#: The budgets among :data:`VERL_LIMIT_KEYS`: managers without rate budgets refuse them.
_BUDGET_KEYS = ("max_rpm", "max_tpm", "estimated_tokens_per_request")
_OURS = "reward.async_reward"
#: Legacy ``reward_model.*`` keys that verl reads before any reward worker exists (resource pools, the
#: reward model's servers): a hook that runs when the trainer is built is too late to apply them.
LEGACY_LATE_KEYS = ("enable", "enable_resource_pool", "n_gpus_per_node", "nnodes")
#: verl's defaults of the keys the legacy ones migrate to: a new key still at its default is not a
#: conflict (it was not set, or set to what the legacy key replaces).
_NEW_DEFAULTS: dict[str, Any] = {
    "reward.num_workers": 8,
    "reward.reward_manager.name": "naive",
    "reward.reward_manager.source": "register",
    "reward.reward_manager.module.path": None,
    "reward.reward_manager.module.name": "custom_reward_manager",
    "reward.custom_reward_function.path": None,
    "reward.custom_reward_function.name": "compute_score",
}
#: The sections verl's migration assigns whole (legacy section -> the new one it replaces), each only
#: when the legacy one holds a value: every key set under the new section that the legacy one does not
#: hold with the same value would be lost (``reward.sandbox_fusion.url`` beside the legacy
#: ``sandbox_fusion.max_concurrent``), so it is refused (:func:`_check_replaced_sections`).
_REPLACED_SECTIONS = (
    ("custom_reward_function", "reward.custom_reward_function"),
    ("sandbox_fusion", "reward.sandbox_fusion"),
    ("reward_model.reward_kwargs", "reward.reward_kwargs"),
)
#: Legacy ``reward_model.*`` keys verl's migration copies one by one onto the reward model's new keys
#: (besides :data:`LEGACY_LATE_KEYS`): the same conflict rule as the paired keys, applied where the
#: migration runs early (our entry point); where it runs late they are refused anyway.
_REWARD_MODEL_PAIRS = (
    *((f"reward_model.{key}", f"reward.reward_model.{key}") for key in LEGACY_LATE_KEYS),
    ("reward_model.model.path", "reward.reward_model.model_path"),
)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def apply_verl_reward_keys(reward_node: Any, raw: Any) -> dict[str, Any]:
    """``raw`` (the ``reward.async_reward`` mapping) with verl's ``rate_limited`` keys of
    ``reward_node`` applied (a new dict; ``raw`` is not changed).

    Raises:
        ConfigError: a verl key that is not a number, or set together with our key to another value.
    """
    merged: dict[str, Any] = _deep_copy(raw) if isinstance(raw, Mapping) else {}
    if not hasattr(reward_node, "get"):
        return merged
    workers = reward_node.get("num_workers") or 1
    applied: list[str] = []
    for verl_key, ours in VERL_LIMIT_KEYS.items():
        value = reward_node.get(verl_key)
        if value is None:
            continue
        if not _is_number(value) or not math.isfinite(value):
            raise bad_value(
                f"reward.{verl_key}",
                value,
                "is not a finite number",
                f"write a number (or use {_OURS}.{ours})",
            )
        current = node_key(merged, ours)
        if current is not None:
            if not _is_number(current) or float(current) != float(value):
                raise bad_value(
                    f"reward.{verl_key}",
                    value,
                    f"conflicts with {_OURS}.{ours}={current!r} (verl's rate_limited key and ours set the "
                    "same limit)",
                    f"keep one of them: {_OURS}.{ours} (preferred) or reward.{verl_key}",
                )
            continue
        _set(merged, ours, value)
        applied.append(f"reward.{verl_key}={value} as {_OURS}.{ours}")
    tpm_from_verl = reward_node.get("max_tpm") is not None
    if (
        tpm_from_verl
        and reward_node.get("estimated_tokens_per_request") is None
        and node_key(raw if isinstance(raw, Mapping) else {}, "limits.estimated_tokens_per_request") is None
    ):
        _set(merged, "limits.estimated_tokens_per_request", VERL_TPM_ESTIMATE_DEFAULT)
        applied.append(
            f"{_OURS}.limits.estimated_tokens_per_request={VERL_TPM_ESTIMATE_DEFAULT} "
            "(verl's default with max_tpm)"
        )
    if applied:
        budgets = ""
        if any(key in applied_key for applied_key in applied for key in ("max_rpm", "max_tpm")):
            budgets = (
                f"; max_rpm / max_tpm are budgets of the whole job here, split over the {workers} reward "
                "worker processes (verl's rate_limited gave each process the whole budget)"
            )
        say_once(f"verl's rate_limited settings applied: {', '.join(applied)}{budgets}")
    return merged


def _deep_copy(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in raw.items()}


def _set(node: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            if child is not None:  # a section of the wrong shape: parse_config names it
                return
            child = node[part] = {}
        node = child
    node[last] = value


def check_verl_settings(
    config: Any,
    manager: str,
    *,
    uses_rate_budgets: bool,
    runs_custom_function: bool | None,
    uses_default_scorer: bool,
    scores_with_reward_model: bool = False,
) -> None:
    """Refuse the verl reward settings that manager ``manager`` cannot honour.

    ``runs_custom_function``: the manager calls ``custom_reward_function`` (None: unknown, a user's
    subclass, not checked). ``uses_default_scorer``: without one it scores with verl's default scorer
    for the data source (the one ``sandbox_fusion`` configures). ``scores_with_reward_model``: it calls
    the reward model verl serves (``reward.reward_model.enable``) itself, through the router
    (``llm_judge``); its own checks of that model are its own (``async_reward.judge.in_job``).

    Raises:
        ConfigError: naming the key, why it cannot apply, and our equivalent.
    """
    reward: Any = config.get("reward") if hasattr(config, "get") else None
    if not hasattr(reward, "get"):
        return
    if not uses_rate_budgets:
        for verl_key in _BUDGET_KEYS:
            if reward.get(verl_key) is not None:
                raise bad_value(
                    f"reward.{verl_key}",
                    reward.get(verl_key),
                    f"is a request/token budget, and {manager} has none (only a concurrency cap)",
                    "use reward.reward_manager.name=async_rate_limited, which honours it",
                )
        ours = node_key(reward, "async_reward.limits")
        for key in ("requests_per_minute", "tokens_per_minute"):
            if node_key(ours, key) is not None:
                raise bad_value(
                    f"{_OURS}.limits.{key}",
                    node_key(ours, key),
                    f"is a budget, and {manager} has none (only a concurrency cap)",
                    "use reward.reward_manager.name=async_rate_limited, which honours it",
                )
    _check_token_estimate(reward, manager, uses_rate_budgets)
    _check_reward_kwargs(reward.get("reward_kwargs"))
    function = reward.get("custom_reward_function")
    path = node_key(function, "path")
    if runs_custom_function is False:
        if path:
            raise bad_value(
                "reward.custom_reward_function.path",
                path,
                f"names a reward function, and {manager} does not call one",
                "remove it, or use async_naive / async_rate_limited to score with your function",
            )
        if node_key(reward, "reward_model.enable") and not scores_with_reward_model:
            raise bad_value(
                "reward.reward_model.enable",
                True,
                f"starts a reward model that {manager} never calls (it scores with its own service)",
                "set it to false, or use llm_judge (which judges with the served model through verl's "
                "router), or async_naive / async_rate_limited with a function that calls "
                "reward_router_address",
            )
    if runs_custom_function and not path and node_key(reward, "reward_model.enable"):
        # verl's RewardLoopWorker sends a sample to /classify (a discriminative model's score) whenever
        # a reward model is enabled and no function path is set: the manager would never run.
        raise bad_value(
            "reward.reward_model.enable",
            True,
            f"starts a reward model, but without reward.custom_reward_function.path nothing calls it: "
            f"verl's reward worker would send every sample to the model's /classify endpoint and "
            f"{manager} would never run",
            "set reward.custom_reward_function.path to a function that calls reward_router_address "
            "(it receives reward_router_address and reward_model_tokenizer), use "
            "reward.reward_manager.name=llm_judge to judge with the served model, or set it to false",
        )
    sandbox_url = node_key(reward, "sandbox_fusion.url")
    if sandbox_url and (not uses_default_scorer or path):
        why = (
            "configures verl's default scorer, which a custom_reward_function replaces"
            if uses_default_scorer
            else f"configures verl's default scorer, which {manager} does not use"
        )
        raise bad_value(
            "reward.sandbox_fusion.url",
            sandbox_url,
            why,
            "remove it, or use async_naive / async_rate_limited without custom_reward_function",
        )


def check_function_needs_its_path(config: Any, manager: str, *, runs_custom_function: bool | None) -> None:
    """Refuse ``reward.custom_reward_function.name`` away from verl's default (``compute_score``), and
    a non-empty ``reward.custom_reward_function.reward_kwargs``, where no ``path`` is set: verl loads
    no function without a path (``get_custom_reward_fn``), so both would be ignored (the function
    managers then score with verl's default scorer, which takes neither; ``llm_judge`` and
    ``async_remote`` call no function at all). ``runs_custom_function`` None: a user's manager, which
    may read the keys itself: not checked.

    Run on the job's own config (``async_reward.config.checks.check_reward``), not from
    :func:`check_verl_settings`: ``async_composite`` hands each component that calls no function a
    config with the path cleared and the job's name and ``reward_kwargs`` left, for its function
    components.

    Raises:
        ConfigError: naming the key and the fix.
    """
    if runs_custom_function is None:
        return
    reward: Any = config.get("reward") if hasattr(config, "get") else None
    function: Any = reward.get("custom_reward_function") if hasattr(reward, "get") else None
    if not hasattr(function, "get") or function.get("path"):
        return
    name = function.get("name")
    kwargs = plain_container(function.get("reward_kwargs"), "reward.custom_reward_function.reward_kwargs")
    key = None
    if name is not None and name != _NEW_DEFAULTS["reward.custom_reward_function.name"]:
        key = "reward.custom_reward_function.name"
    elif kwargs:  # a mapping with a key (or any other non-empty value): arguments for no function
        key = "reward.custom_reward_function.reward_kwargs"
    if key is None:
        return
    if runs_custom_function:
        why = (
            "is set without reward.custom_reward_function.path: verl loads no function without a path, "
            f"so {manager} scores with verl's default scorer for the data source and it would be ignored"
        )
        fix = f"set reward.custom_reward_function.path to the file that defines the function, or remove {key}"
    else:
        why = f"is set, and {manager} calls no reward function: it would be ignored"
        fix = f"remove {key}, or use async_naive / async_rate_limited with a function path"
    # Not the value: reward_kwargs may hold a key for the service a function would have called.
    raise ConfigError(f"{key} {why}; {fix}", key=key, fix=fix)


def _check_token_estimate(reward: Any, manager: str, uses_rate_budgets: bool) -> None:
    """Refuse ``limits.estimated_tokens_per_request`` (ours, or verl's
    ``reward.estimated_tokens_per_request``) where no token budget is used: it is what a call is
    charged against ``tokens_per_minute`` and means nothing else, so without that budget (a manager
    with no budgets, or ``async_rate_limited`` with ``tokens_per_minute`` unset) it was silently
    ignored. verl's ``max_tpm`` counts as the budget (:func:`apply_verl_reward_keys` maps it onto
    ``tokens_per_minute``); verl's own key is named as the user wrote it (for a manager without
    budgets it is refused already, with the other :data:`_BUDGET_KEYS`)."""
    ours = node_key(reward, "async_reward.limits.estimated_tokens_per_request")
    verls = reward.get("estimated_tokens_per_request")
    if ours is None and verls is None:
        return
    if ours is not None:
        key, value = f"{_OURS}.limits.estimated_tokens_per_request", ours
    else:
        key, value = "reward.estimated_tokens_per_request", verls
    if not uses_rate_budgets:
        raise bad_value(
            key,
            value,
            f"is what a call is charged against limits.tokens_per_minute, and {manager} has no token "
            "budget (only a concurrency cap): it would be ignored",
            "remove it, or use reward.reward_manager.name=async_rate_limited with "
            f"{_OURS}.limits.tokens_per_minute set",
        )
    budget = node_key(reward, "async_reward.limits.tokens_per_minute")
    if budget is None and reward.get("max_tpm") is None:
        raise bad_value(
            key,
            value,
            f"is what a call is charged against limits.tokens_per_minute, which is not set, so {manager} "
            "has no token budget to estimate against: it would be ignored",
            f"remove it, or set {_OURS}.limits.tokens_per_minute",
        )


def _check_reward_kwargs(kwargs: Any) -> None:
    """``reward.reward_kwargs`` is DAPO's (``overlong_buffer_cfg``, ``max_resp_len``): refused unless
    it asks for nothing (the overlong buffer absent or disabled)."""
    if kwargs is None:
        return
    plain = plain_container(kwargs, "reward.reward_kwargs")
    if not isinstance(plain, Mapping):
        raise bad_value("reward.reward_kwargs", plain, "is not a mapping", "remove it")
    for key, value in plain.items():
        if key == "max_resp_len":
            continue  # read by dapo only together with an enabled overlong buffer
        if key == "overlong_buffer_cfg" and (
            value is None or (isinstance(value, Mapping) and not value.get("enable"))
        ):
            continue
        raise bad_value(
            f"reward.reward_kwargs.{key}",
            value,
            "is read only by verl's dapo manager (its overlong-length penalty); async-reward managers "
            "do not apply it",
            "keep reward.reward_manager.name=dapo for the penalty, or remove it (a per-sample penalty "
            "can go in your reward function; extra arguments for it belong in "
            "reward.custom_reward_function.reward_kwargs)",
        )


def _legacy_value(config: Any, key: str) -> Any:
    value = node_key(config, key)
    return plain_container(value, key) if value is not None else None


def apply_legacy_reward_keys(config: Any, *, late: bool) -> list[str]:
    """Apply the legacy reward keys as verl's ``migrate_legacy_reward_impl`` does, refusing conflicts.

    ``late``: called where verl's trainer is being built (the setup hook), after verl has read the
    reward model's resource settings; the legacy keys it read there are refused instead of applied.
    Returns the ``legacy=value -> new key`` lines applied (also logged). A config without the legacy
    sections is left alone.

    Raises:
        ConfigError: a legacy key and its new key both set to different values (the new one away from
            verl's default); a key set under a section the migration replaces whole
            (``reward.custom_reward_function``, ``reward.sandbox_fusion``, ``reward.reward_kwargs``)
            that the legacy section does not carry over; or, when ``late``, a legacy key verl already
            read.
    """
    if not hasattr(config, "get") or config.get("reward_model") is None or config.get("reward") is None:
        return []
    pairs = [
        ("reward_model.num_workers", "reward.num_workers"),
        ("reward_model.reward_manager", "reward.reward_manager.name"),
        ("reward_model.reward_loop_source", "reward.reward_manager.source"),
        ("reward_model.reward_loop_module_path", "reward.reward_manager.module.path"),
        ("reward_model.reward_loop_class_name", "reward.reward_manager.module.name"),
        ("custom_reward_function.path", "reward.custom_reward_function.path"),
        ("custom_reward_function.name", "reward.custom_reward_function.name"),
    ]
    applied: list[str] = []
    for legacy, new in pairs:
        value = _legacy_value(config, legacy)
        if value is None:
            continue
        current = _legacy_value(config, new)
        if current != value and current != _NEW_DEFAULTS.get(new):
            raise bad_value(
                legacy,
                value,
                f"conflicts with {new}={current!r} (the legacy key and its replacement set the same setting)",
                f"keep only {new} (the legacy reward_model.* keys are deprecated in verl 0.9)",
            )
        applied.append(f"{legacy}={value!r} -> {new}")
    if not late:
        _check_reward_model_pairs(config)
    _check_replaced_sections(config)
    if late:
        for key in LEGACY_LATE_KEYS:
            if _legacy_value(config, f"reward_model.{key}") is not None:
                raise _too_late(f"reward_model.{key}", f"reward.reward_model.{key}")
        if _legacy_value(config, "reward_model.model.path") is not None:
            raise _too_late("reward_model.model.path", "reward.reward_model.model_path")
        rollout = node_key(config, "reward_model.rollout")
        for key in list(rollout.keys()) if hasattr(rollout, "keys") else []:
            if rollout.get(key) is not None:
                raise _too_late(f"reward_model.rollout.{key}", f"reward.reward_model.rollout.{key}")
    if late and not applied and not _has_other_legacy_values(config):
        return []  # verl's trainer runs with the legacy sections in place: nothing to change
    from verl.experimental.reward_loop.reward_loop import migrate_legacy_reward_impl

    try:
        migrate_legacy_reward_impl(config)
    except Exception as exc:  # a legacy section of an unexpected shape
        raise ConfigError(
            f"the legacy reward keys (reward_model.*, custom_reward_function.*, sandbox_fusion.*) cannot "
            f"be migrated ({type(exc).__name__}: {exc}); write them under reward.* instead",
            key="reward_model",
            fix="write them under reward.*",
        ) from None
    for line in applied:
        say_once(f"legacy {line} (verl's migrate_legacy_reward_impl)")
    return applied


#: verl 0.9.1's defaults of the sections its migration replaces whole, for a process where verl's
#: ``reward.yaml`` cannot be found (a verl module stubbed or vendored): without them every key at its
#: default would read as set. ``tests/config/test_legacy_keys.py`` checks them against the file.
_REPLACED_SECTION_DEFAULTS: dict[str, Any] = {
    "custom_reward_function": {"path": None, "name": "compute_score"},
    "sandbox_fusion": {"url": None, "max_concurrent": 64, "memory_limit_mb": 1024},
}


@functools.cache
def _verl_reward_defaults() -> dict[str, Any]:
    """verl's own defaults of the ``reward`` node (its ``reward/reward.yaml``, without ``_target_``
    keys), read from the installed verl without importing it: a new key at its default was not set
    (or set to what the legacy key replaces), so the legacy one taking its place loses nothing.
    :data:`_REPLACED_SECTION_DEFAULTS` where the file cannot be found."""
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):  # ValueError: a verl module in sys.modules without a spec
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location, "trainer", "config", "reward", "reward.yaml")
        if path.is_file():
            from omegaconf import OmegaConf

            defaults = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
            if isinstance(defaults, dict):
                return _without_targets(defaults)
    return _REPLACED_SECTION_DEFAULTS


def _without_targets(node: dict[Any, Any]) -> dict[str, Any]:
    return {
        str(k): _without_targets(v) if isinstance(v, dict) else v for k, v in node.items() if k != "_target_"
    }


def _leaves(node: Any, prefix: str) -> dict[str, Any]:
    """``{dotted key: value}`` of every value under ``node`` (an empty mapping is no value)."""
    if not isinstance(node, Mapping):
        return {prefix: node}
    leaves: dict[str, Any] = {}
    for key, value in node.items():
        if key != "_target_":
            leaves.update(_leaves(value, f"{prefix}.{key}"))
    return leaves


def _verl_default(new_key: str) -> Any:
    """verl's default of ``reward.<...>`` (None where verl has none: the key is one a user added)."""
    return node_key(_verl_reward_defaults(), new_key.removeprefix("reward."))


def _check_replaced_sections(config: Any) -> None:
    """Refuse a key set under a section verl's migration replaces whole (:data:`_REPLACED_SECTIONS`)
    that the legacy section does not carry over with the same value: verl's
    ``migrate_legacy_reward_impl`` assigns the legacy section in its place, so the key would be
    dropped without a word (``reward.sandbox_fusion.url`` becoming None; the function's
    ``reward_kwargs`` gone). A key at verl's default is not a setting.

    Raises:
        ConfigError: naming the new key, the legacy key that replaces its section, and the fix.
    """
    for legacy_path, new_path in _REPLACED_SECTIONS:
        legacy = _legacy_value(config, legacy_path)
        legacy_leaves = _leaves(legacy, legacy_path) if legacy is not None else {}
        set_legacy = [key for key, value in legacy_leaves.items() if value is not None]
        if not set_legacy:
            continue  # verl leaves the new section as it is
        new = _legacy_value(config, new_path)
        for key, value in _leaves(new, new_path).items() if new is not None else ():
            if value is None or value == _verl_default(key):
                continue
            if legacy_leaves.get(legacy_path + key.removeprefix(new_path)) == value:
                continue  # the legacy section carries the same value over
            fix = (
                f"write every {legacy_path}.* key under {new_path} instead (e.g. {set_legacy[0]} as "
                f"{new_path}{set_legacy[0].removeprefix(legacy_path)}) and remove the legacy ones"
            )
            raise ConfigError(
                f"{key} is set, and so is the legacy {set_legacy[0]}: verl's migrate_legacy_reward_impl "
                f"replaces the whole {new_path} section with the legacy {legacy_path} section, so {key} "
                f"would be dropped; {fix}",
                key=key,
                fix=fix,
            )


def _check_reward_model_pairs(config: Any) -> None:
    """The legacy reward-model keys verl's migration copies one by one (:data:`_REWARD_MODEL_PAIRS`,
    ``reward_model.rollout.*``): set with their new key away from verl's default, to another value,
    the new one would be overwritten; refused as the paired keys are."""
    rollout = _legacy_value(config, "reward_model.rollout")
    pairs = [
        *_REWARD_MODEL_PAIRS,
        *(
            (f"reward_model.rollout.{key}", f"reward.reward_model.rollout.{key}")
            for key in (rollout if isinstance(rollout, Mapping) else {})
        ),
    ]
    for legacy, new in pairs:
        value = _legacy_value(config, legacy)
        if value is None:
            continue
        current = _resolved_or_missing(config, new)
        if current is _MISSING or current is None or current == value or current == _verl_default(new):
            continue
        raise bad_value(
            legacy,
            value,
            f"conflicts with {new}={current!r} (the legacy key and its replacement set the same setting)",
            f"keep only {new} (the legacy reward_model.* keys are deprecated in verl 0.9)",
        )


#: A key verl leaves mandatory (``???``, e.g. ``reward.reward_model.rollout.name``) and nobody set.
_MISSING = object()


def _resolved_or_missing(config: Any, key: str) -> Any:
    """The value at ``key`` as :func:`_legacy_value` reads it, or :data:`_MISSING` for a mandatory
    value left unset (``???``), which is no setting."""
    from omegaconf import OmegaConf

    parent, _, last = key.rpartition(".")
    node = node_key(config, parent)
    if isinstance(node, DictConfig) and OmegaConf.is_missing(node, last):
        return _MISSING
    return _legacy_value(config, key)


def _has_other_legacy_values(config: Any) -> bool:
    """Legacy values besides the paired keys (reward model, reward_kwargs, sandbox): verl migrates them."""
    legacy = plain_container(config.get("reward_model"), "reward_model")
    extra = (
        {k: v for k, v in legacy.items() if k not in ("model", "rollout")} if isinstance(legacy, dict) else {}
    )
    nested = [legacy.get("model"), legacy.get("rollout")] if isinstance(legacy, dict) else []
    sandbox = plain_container(config.get("sandbox_fusion"), "sandbox_fusion")
    values = [*extra.values(), *(v for n in nested if isinstance(n, dict) for v in n.values())]
    if isinstance(sandbox, dict):
        values += list(sandbox.values())
    return any(v is not None for v in values)


def _too_late(legacy: str, new: str) -> ConfigError:
    fix = f"write {new} instead (verl's own entry point never migrates the legacy key)"
    return ConfigError(
        f"{legacy} is a legacy key that verl's entry point reads before async-reward's setup hook can "
        f"migrate it (it sets up the reward model's resources); {fix}, or start with "
        "python -m async_reward.legacy.main_ppo, which migrates every legacy key first",
        key=legacy,
        fix=fix,
    )
