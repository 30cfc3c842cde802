"""Building the user's ``async_stateful`` class from ``reward.async_reward.stateful.init_kwargs``.

A misspelled or missing constructor argument used to pass the driver's start-up check and fail in
every reward worker with a bare ``TypeError`` naming no key. :func:`check_init_kwargs` binds the
keyword arguments to the class's signature at start-up (on the driver and again in each worker), so
the error names the key, the signature and the fix; :func:`construct` wraps what the constructor
itself raises with the same key, where no start-up check could see it (a signature that cannot be
read, or a value the class refuses).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from typing import Any

from async_reward._core.config_rules import bad_value, missing_value
from async_reward._core.errors import ConfigError
from async_reward._core.redaction import HIDDEN, hide_url_secrets, holds_secret_value

__all__ = ["INIT_KWARGS_KEY", "check_init_kwargs", "construct"]

#: The setting whose values become the constructor's keyword arguments. Spelled out here, not built from
#: ``async_reward.config.CONFIG_PATH``: the config package imports ``_core``, not the other way round.
INIT_KWARGS_KEY = "reward.async_reward.stateful.init_kwargs"


def _signature(cls: type) -> inspect.Signature | None:
    """The constructor's signature, or None where Python cannot read one (a class implemented in C,
    a metaclass hiding it): then no start-up check is possible and :func:`construct` names the key."""
    try:
        return inspect.signature(cls)
    except (TypeError, ValueError):
        return None


def check_init_kwargs(cls: type, name: str, path: str, init_kwargs: Mapping[str, Any], key: str) -> None:
    """Refuse ``init_kwargs`` that ``cls(**init_kwargs)`` cannot take: a key that is not a parameter
    (``scal`` for ``scale``), a required parameter not set, or a parameter the class takes only by
    position. ``key`` is where ``init_kwargs`` is set (``reward.async_reward.stateful.init_kwargs``,
    or a composite component's). A class whose signature cannot be read is not checked here (its
    constructor's own error is named by :func:`construct`).

    Raises:
        ConfigError: naming ``<key>.<parameter>``, the class's signature and the fix.
    """
    signature = _signature(cls)
    if signature is None:
        return
    shown = f"{name}{signature} in {path}"
    parameters = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    by_keyword = [
        p.name
        for p in parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    for given, value in init_kwargs.items():
        parameter = parameters.get(given)
        if parameter is not None and parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise bad_value(
                f"{key}.{given}",
                value,
                f"is a positional-only parameter of {shown}, which a keyword cannot set",
                f"make it a keyword parameter of {name}.__init__ (drop the '/')",
            )
        if parameter is None and not takes_any:
            close = difflib.get_close_matches(given, by_keyword, n=1)
            hint = f"rename it to {close[0]!r}" if close else "remove it"
            known = ", ".join(by_keyword) or "none"
            raise bad_value(
                f"{key}.{given}",
                value,
                f"is not a parameter of {shown} (its keyword parameters: {known})",
                f"{hint}, or add the parameter to {name}.__init__",
            )
    for parameter in parameters.values():
        if parameter.default is not inspect.Parameter.empty or parameter.name in init_kwargs:
            continue
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ConfigError(
                f"{shown} requires the positional-only parameter {parameter.name!r}, which {key} cannot "
                f"pass (it passes keywords); give it a default or make it a keyword parameter",
                key=key,
                fix="give it a default or make it a keyword parameter",
            )
        fix = f"set {key}.{parameter.name}, or give it a default in {name}.__init__"
        raise missing_value(f"{key}.{parameter.name}", shown, fix)


def construct(cls: type, name: str, path: str, init_kwargs: Mapping[str, Any], key: str) -> Any:
    """``cls(**init_kwargs)``, with what the constructor raises named for ``key``: it runs in each
    reward worker, where a bare ``TypeError`` or ``ValueError`` would not say which setting to mend.
    The values are not repeated (one may be a secret), the keys are; the constructor's message is, with
    URL credentials hidden, or hidden whole if it holds a secret of the environment.

    Raises:
        ConfigError: the constructor raised; the original error is its ``__cause__``.
    """
    try:
        return cls(**init_kwargs)
    except Exception as exc:
        signature = _signature(cls)
        shown = f"{name}{'' if signature is None else signature}"
        fix = f"mend {key} or {name}.__init__ in {path}"
        said = hide_url_secrets(str(exc))
        raise ConfigError(
            f"{key}: constructing {shown} from {path} with keyword arguments {sorted(init_kwargs)} raised "
            f"{type(exc).__name__}: {HIDDEN if holds_secret_value(said) else said}; {fix}",
            key=key,
            fix=fix,
        ) from exc
