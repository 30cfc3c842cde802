"""Resolving the user's reward function so it can run in a thread or in a process pool."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = ["ExternFunction", "resolve_user_function"]


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
        fn = _load(self.path, self.name)
        return fn(**{**kwargs, **self.reward_kwargs})


@functools.lru_cache(maxsize=16)
def _load(path: str, name: str) -> Callable[..., Any]:
    from verl.utils.import_utils import load_extern_object

    return load_extern_object(module_path=path, object_name=name)  # type: ignore[return-value]


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
