"""The generic half of configuration checking: per-field value rules and reading keys of a config.

A setting that could corrupt the reward (a NaN deadline, an inverted range, a negative worker count)
must stop the job at start-up with a message a user can act on, so every error names the key, the
bad value and the fix. Range rules are declared on the dataclass field (``field(metadata=...)``) and
checked by one walker, so a field added later gets its rule checked without a new ``if``; every float
is checked to be finite by the parser and the walker whatever its rule.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from async_reward._core.errors import ConfigError
from async_reward._core.redaction import HIDDEN, hide_url_secrets, holds_secret_value, secrets_of

__all__ = [
    "Rule",
    "at_least",
    "bad_value",
    "check_finite",
    "dataclass_from_flags",
    "greater_than",
    "in_range",
    "missing_value",
    "names_config_errors",
    "node_key",
    "parse_config",
    "plain_container",
    "rule",
    "select_key",
    "validate_fields",
]


def bad_value(key: str, value: Any, problem: str, fix: str, *, hide: bool = False) -> ConfigError:
    """``<key>=<value> <problem>; <fix>``; ``hide`` prints :data:`HIDDEN` instead of the value."""
    return ConfigError(f"{key}={HIDDEN if hide else _show(value)} {problem}; {fix}", key=key, fix=fix)


def missing_value(key: str, needed_by: str, fix: str) -> ConfigError:
    """``<key> is required by <needed_by> (not set); <fix>``."""
    return ConfigError(f"{key} is required by {needed_by} (not set); {fix}", key=key, fix=fix)


def _show(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<unprintable {type(value).__name__}>"
    if holds_secret_value(text):
        # e.g. timeout_s: ${oc.env:JUDGE_API_KEY}: the value is a secret of this environment.
        return HIDDEN
    text = hide_url_secrets(text)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class Rule:
    """What one field's value must satisfy (None always passes: null means "not set")."""

    holds: Callable[[Any], bool]
    """True when the value is acceptable."""
    problem: str
    """What is wrong when it does not hold, e.g. ``must be > 0``."""
    fix: str
    """What to write instead."""
    hide: bool = False
    """Never print the value (it may be a secret)."""


def rule(holds: Callable[[Any], bool], problem: str, fix: str, *, hide: bool = False) -> dict[str, Rule]:
    """``field(metadata=rule(...))``: attach a :class:`Rule` to a dataclass field."""
    return {"rule": Rule(holds, problem, fix, hide)}


def greater_than(low: float, fix: str) -> dict[str, Rule]:
    return rule(lambda v: v > low, f"must be > {low:g}", fix)


def at_least(low: float, fix: str) -> dict[str, Rule]:
    return rule(lambda v: v >= low, f"must be >= {low:g}", fix)


def in_range(low: float, high: float, fix: str) -> dict[str, Rule]:
    return rule(lambda v: low <= v <= high, f"must be in [{low:g}, {high:g}]", fix)


def check_finite(key: str, value: Any, *, allow_nan: bool = False) -> None:
    """Refuse NaN and infinities in a number, or anywhere inside a tuple, list or mapping of values
    (``judge.extra_body: {top_p: .nan}`` would be sent as invalid JSON). The error names the nested
    key, e.g. ``judge.extra_body.top_p``. ``allow_nan`` for values where NaN means "no value"."""
    if isinstance(value, Mapping):
        for name, item in value.items():
            check_finite(f"{key}.{name}", item, allow_nan=allow_nan)
        return
    if isinstance(value, (tuple, list)):
        for item in value:
            _check_finite_number(key, item, value, allow_nan)
            if isinstance(item, (Mapping, tuple, list)):
                check_finite(key, item, allow_nan=allow_nan)
        return
    _check_finite_number(key, value, value, allow_nan)


def _check_finite_number(key: str, item: Any, shown: Any, allow_nan: bool) -> None:
    if isinstance(item, bool) or not isinstance(item, float) or math.isfinite(item):
        return
    if allow_nan and math.isnan(item):
        return
    raise bad_value(
        key,
        shown,
        "is not a finite number",
        "write a finite number (null where 'no limit' is allowed)",
    )


def validate_fields(obj: Any, path: str, *, recurse: bool = True) -> None:
    """Check every field of dataclass ``obj``: finite numbers, then the field's :class:`Rule`.

    Nested dataclasses are checked too (``recurse``). Raises :class:`ConfigError` for the first bad
    value, naming ``path.field``.
    """
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{path}.{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            if recurse:
                validate_fields(value, key)
            continue
        if value is None:
            continue
        check_finite(key, value, allow_nan=bool(f.metadata.get("nan_allowed")))
        field_rule: Rule | None = f.metadata.get("rule")
        if field_rule is not None and not field_rule.holds(value):
            raise bad_value(key, value, field_rule.problem, field_rule.fix, hide=field_rule.hide)


_T = TypeVar("_T")


def parse_config(cls: type[_T], raw: Mapping[str, Any] | None, path: str = "reward.async_reward") -> _T:
    """Build dataclass ``cls`` from a mapping, recursing into nested dataclasses.

    Raises:
        ConfigError: on an unknown key (naming the valid ones), a value of the wrong type, or ``raw``
            not a mapping (``+async_reward.pipeline=true``).
    """
    if raw is not None and not isinstance(raw, Mapping):
        raise bad_value(
            path, raw, "is not a mapping", f"write its settings as key: value pairs (+{path}.<key>=<value>)"
        )
    raw = dict(raw or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {unknown} in {path}; valid keys: {sorted(fields)}",
            key=f"{path}.{unknown[0]}",
            fix=f"use one of {sorted(fields)}",
        )
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        # A field kept out of reprs (headers), or whose rule hides its value (API key variable names,
        # where the key itself gets pasted), is kept out of errors too, type errors included.
        field_rule = fields[name].metadata.get("rule")
        hide = not fields[name].repr or (field_rule is not None and field_rule.hide)
        kwargs[name] = _coerce(hints[name], value, f"{path}.{name}", hide=hide)
    config = cls(**kwargs)
    validate_fields(config, path, recurse=False)  # nested sections were checked by their own parse
    return config


def _coerce(hint: Any, value: Any, path: str, hide: bool = False) -> Any:
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, Mapping):
            raise bad_value(path, value, "is not a mapping", "write key: value pairs under it", hide=hide)
        return parse_config(hint, value, path)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise bad_value(
                path, value, "must not be null", "write a value (this key has no 'not set')", hide=hide
            )
        non_null = [a for a in args if a is not type(None)]
        errors: list[ConfigError] = []
        for arg in non_null:
            try:
                return _coerce(arg, value, path, hide)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if origin is Literal:
        if value not in args:
            raise bad_value(path, value, "is not allowed", f"use one of {list(args)}", hide=hide)
        return value
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:  # a list of any length
        if not isinstance(value, (list, tuple)):
            raise bad_value(path, value, "is not a list", "write a list: [item, ...]", hide=hide)
        return tuple(_coerce(args[0], item, f"{path}[{index}]", hide) for index, item in enumerate(value))
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise bad_value(
                path,
                value,
                f"is not a list of {len(args)} values",
                f"write [{', '.join('x' * len(args))}]",
                hide=hide,
            )
        try:
            return tuple(_coerce(a, v, path) for a, v in zip(args, value, strict=True))
        except ConfigError as exc:
            fix = exc.fix or "fix that element"
            raise bad_value(path, value, f"has a bad element ({exc})", fix) from None
    if origin is dict:
        if not isinstance(value, Mapping):
            raise bad_value(path, value, "is not a mapping", "write key: value pairs under it", hide=hide)
        if args and args[0] is str and any(not isinstance(k, str) for k in value):
            raise bad_value(path, sorted(map(str, value)), "has keys that are not strings", "quote the keys")
        return dict(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad_value(path, value, "is not a number", "write a number", hide=hide)
        try:
            number = float(value)
        except OverflowError:  # a 400-digit integer
            digits, fix = len(str(abs(value))), "write a finite number"
            shown = HIDDEN if hide else f"<{digits}-digit number>"
            raise ConfigError(f"{path}={shown} is too large for a number; {fix}", key=path, fix=fix) from None
        # Every float field, present or future: NaN compares false with every bound, so a range
        # check alone would let it through (timeout_s: .nan times out every sample).
        check_finite(path, number)
        return number
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_value(path, value, "is not an integer", "write a whole number", hide=hide)
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise bad_value(path, value, "is not a boolean", "write true or false", hide=hide)
        return value
    if hint is str:
        if not isinstance(value, str):
            raise bad_value(path, value, "is not a string", "write text (quote it)", hide=hide)
        return value
    return value


def plain_container(node: Any, path: str) -> Any:
    """``node`` as plain Python (an OmegaConf node resolved; anything else as it is).

    Raises:
        ConfigError: an interpolation that cannot be resolved (``${oc.env:NOPE}``: a variable that is
            not set, a missing node), naming the key that holds it.
    """

    if not isinstance(node, (DictConfig, ListConfig)):
        return node
    try:
        return OmegaConf.to_container(node, resolve=True)
    except OmegaConfBaseException as exc:
        raise unresolvable(exc, path) from None


def unresolvable(exc: Exception, path: str) -> ConfigError:
    """The ``ConfigError`` for an OmegaConf interpolation or access error under ``path``."""
    full_key = getattr(exc, "full_key", None) or ""
    key = full_key if full_key.startswith(path.split(".")[0]) else f"{path}.{full_key}".rstrip(".")
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    reason = HIDDEN if holds_secret_value(reason) else reason
    fix = "set the environment variable it reads, or fix the interpolation (${...}) in that key"
    return ConfigError(f"{key} cannot be resolved ({reason}); {fix}", key=key, fix=fix)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def names_config_errors(path: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorate a start-up check so that an OmegaConf error it meets (an unresolvable ``${...}``, a
    node of the wrong shape) comes out as a :class:`ConfigError` naming the key, not as a raw
    OmegaConf traceback (the CLI exits 2 on ``ConfigError``), and so that no error it raises echoes a
    secret the checked config passes to its workers (``runtime_env.env_vars``)."""

    def decorate(check: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(check)
        def checked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            config = next((arg for arg in args if isinstance(arg, DictConfig)), None)
            with secrets_of(config):  # its workers' keys are never echoed in an error either
                try:
                    return check(*args, **kwargs)
                except OmegaConfBaseException as exc:
                    if not getattr(exc, "full_key", None) and config is not None:
                        exc.full_key = _locate_unresolvable(config, path)
                    raise unresolvable(exc, path) from None

        return checked

    return decorate


def _locate_unresolvable(config: DictConfig, path: str) -> str:
    """Which key under top-level ``path`` of ``config`` cannot be resolved ("" when none is found)."""

    try:
        node = config.get(path)
    except OmegaConfBaseException:
        return path
    return _unresolvable_key(node, path)


def _unresolvable_key(node: Any, prefix: str) -> str:
    """The shallowest key under ``node`` (named ``prefix``) whose value cannot be resolved, or "".
    Shallowest first: a value interpolating a broken one elsewhere fails too, deeper down."""
    level: list[tuple[Any, str]] = [(node, prefix)]
    while level:
        deeper: list[tuple[Any, str]] = []
        for container, name in level:
            if not isinstance(container, (DictConfig, ListConfig)):
                continue
            keys: Any = container.keys() if isinstance(container, DictConfig) else range(len(container))
            for key in keys:
                try:
                    deeper.append((container[key], f"{name}.{key}"))
                except OmegaConfBaseException:
                    return f"{name}.{key}"
        level = deeper
    return ""


def dataclass_from_flags(cls: type[_T], flags: Any, preset: Mapping[str, Any] | None = None) -> _T:
    """Build dataclass ``cls`` from argparse flags named like its fields (the benchmarks' CLIs).

    A flag left unset (None) keeps the ``preset`` value (e.g. ``--quick``), else the field's default;
    list values become tuples.
    """
    values: dict[str, Any] = dict(preset or {})
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        given = getattr(flags, f.name, None)
        if given is not None:
            values[f.name] = tuple(given) if isinstance(given, list) else given
    return cls(**values)


def node_key(node: Any, dotted: str) -> Any:
    """The value at ``dotted`` under a node of the config (``reward``, a component's settings); None
    when a part is missing. Unlike :func:`select_key` it raises what the node raises for a value it
    cannot resolve, so that the caller's error names the whole key, not the part under the node."""
    for part in dotted.split("."):
        if not hasattr(node, "get"):
            return None
        node = node.get(part)
    return node


def select_key(config: Any, key: str, default: Any = None) -> Any:
    """The value at dotted ``key`` of a verl config (an OmegaConf node or plain mappings); ``default``
    when a part is missing or the value is None. The one reader of dotted keys: every module reads
    the verl config through it (the verl plugin's entry module excepted, which must stay this light).

    Raises:
        ConfigError: the value is an interpolation that cannot be resolved (``${oc.env:NOPE}``),
            naming the key.
    """
    if isinstance(config, DictConfig):
        try:
            value = OmegaConf.select(config, key, default=None)
        except OmegaConfBaseException as exc:  # ${oc.env:NOPE} and the like: our error, naming the key
            raise unresolvable(exc, key) from None
        return default if value is None else value
    node = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return default if node is None else node
