"""Resolving the user's reward function so it can run in a thread or in a process pool, and loading
it on the driver so a wrong path or name is a ConfigError at start-up."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from async_reward._config_rules import bad_value, missing_value

__all__ = [
    "ExternFunction",
    "check_reward_function",
    "load_user_object",
    "resolve_user_function",
    "user_object",
]

_FUNCTION_KEY = "reward.custom_reward_function"


class ExternFunction:
    """A picklable reference to ``custom_reward_function`` (file path + name + kwargs).

    verl loads the function with ``load_extern_object``, which executes the file under a generated
    module name; such a function cannot be pickled by reference into a process pool. This object is
    sent instead and loads the function once inside each pool process.
    """

    def __init__(self, path: str, name: str, reward_kwargs: dict[str, Any]) -> None:
        self.path = path
        self.name = name
        self.reward_kwargs = dict(reward_kwargs)

    def __call__(self, **kwargs: Any) -> Any:
        fn = load_user_object(self.path, self.name)
        return fn(**{**kwargs, **self.reward_kwargs})


@functools.lru_cache(maxsize=16)
def load_user_object(path: str, name: str) -> Any:
    """``name`` from the file (or ``pkg://`` module) at ``path``, loaded once per process (verl's
    ``load_extern_object`` runs the file every time it is called)."""
    from verl.utils.import_utils import load_extern_object

    return load_extern_object(module_path=path, object_name=name)


def user_object(config: Any, *, needed_by: str) -> tuple[str, str, Any] | None:
    """``(path, name, object)`` named by ``reward.custom_reward_function`` (None when no path is set),
    loaded as the reward workers will load it, so a wrong path or name is a ``ConfigError`` at
    start-up instead of a reward worker dying at the first step.

    Raises:
        ConfigError: no ``name``, a file that does not exist, a file that fails to run, or ``name``
            not defined in it.
    """
    fn_config = config.reward.get("custom_reward_function") or {}
    path, name = fn_config.get("path"), fn_config.get("name")
    if not path:
        return None
    if not name:
        raise missing_value(f"{_FUNCTION_KEY}.name", needed_by, f"name the object in {path}")
    path, name = str(path), str(name)
    try:
        return path, name, load_user_object(path, name)
    except FileNotFoundError:
        raise bad_value(
            f"{_FUNCTION_KEY}.path", path, "does not exist", "give the path of your reward file"
        ) from None
    except AttributeError:
        raise bad_value(
            f"{_FUNCTION_KEY}.name",
            name,
            f"is not defined in {path}",
            "name a function or class of that file",
        ) from None
    except Exception as exc:  # the file itself raised while it ran (verl wraps that as RuntimeError)
        cause = exc.__cause__ or exc
        raise bad_value(
            f"{_FUNCTION_KEY}.path",
            path,
            f"cannot be loaded ({type(cause).__name__}: {cause})",
            "fix the error in that file",
        ) from None


def check_reward_function(config: Any) -> None:
    """``custom_reward_function``, when set, must name a callable (for ``async_naive`` and
    ``async_rate_limited``)."""
    found = user_object(config, needed_by="async_naive")
    if found is not None and not callable(found[2]):
        path, name, obj = found
        raise bad_value(
            f"{_FUNCTION_KEY}.name",
            name,
            f"in {path} is a {type(obj).__name__}, not a function",
            "name a function",
        )


def resolve_user_function(
    config: Any, compute_score: Callable[..., Any] | None, executor: str
) -> Callable[..., Any]:
    """The callable a manager should call: verl's resolved function, or a picklable reference.

    With no ``custom_reward_function`` verl passes its default scorer for the data source.
    """
    if compute_score is None:
        from verl.utils.reward_score import default_compute_score

        compute_score = default_compute_score
    if executor != "process":
        return compute_score
    fn_config = config.reward.get("custom_reward_function") or {}
    path = fn_config.get("path")
    if not path:
        return compute_score  # verl's default scorer is a plain module function: picklable
    return ExternFunction(str(path), str(fn_config.get("name")), dict(fn_config.get("reward_kwargs") or {}))
