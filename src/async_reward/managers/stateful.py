"""``async_stateful``: a user class (the recipe's ``RewardAgent`` shape), one instance per worker.

``custom_reward_function.path`` + ``name`` name a class with
``compute_score(data_source, solution_str, ground_truth, extra_info)`` (sync or async) returning a
number, a dict with ``score``, or ``(score, query, explanation)``; and optionally
``post_process_scores(scores) -> scores``, run once per complete ``uid`` group with failed scores as
NaN (on the driver in verl's plain path, in the pipeline for the pipelined path, in the agent loop
under verl's v1 trainer with ``async_reward.v1.RewardAgentLoopManager``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, ClassVar

from async_reward._core.config_rules import bad_value, missing_value
from async_reward._core.postprocess import load_user_instance, make_postprocess_spec
from async_reward._core.result import RewardResult, RewardSample
from async_reward._core.user_class import check_init_kwargs
from async_reward._core.user_code import user_object
from async_reward.config import CONFIG_PATH, AsyncRewardConfig
from async_reward.config.v1 import AGENT_LOOP_MANAGER, v1_integration_problem
from async_reward.managers.base import AsyncRewardManager
from async_reward.managers.registry import register_manager

__all__ = ["AsyncStatefulRewardManager"]

logger = logging.getLogger(__name__)


@register_manager("async_stateful")
class AsyncStatefulRewardManager(AsyncRewardManager):
    """Holds one instance of the user's class per worker process and scores with its methods."""

    _warned_postprocess_path: ClassVar[bool] = False
    runs_custom_function: ClassVar[bool | None] = True
    _reads_sections: ClassVar[frozenset[str] | None] = frozenset({"stateful"})

    def __init__(self, config: Any, tokenizer: Any, compute_score: Any = None, **kwargs: Any) -> None:
        super().__init__(config, tokenizer, compute_score, **kwargs)
        path, name, _cls = self._user_class(config, self.settings)
        self._spec = make_postprocess_spec(path, name, self.settings.stateful.init_kwargs)
        # One instance per process, shared by every manager built in it (load_user_instance caches).
        self.instance = load_user_instance(self._spec)
        # verl's custom_reward_function.reward_kwargs: extra keyword arguments of every compute_score
        # call, taking precedence over the sample's (as verl's get_custom_reward_fn merges them).
        fn_config = config.reward.get("custom_reward_function") or {}
        self._reward_kwargs: dict[str, Any] = dict(fn_config.get("reward_kwargs") or {})
        self._has_postprocess = callable(getattr(self.instance, "post_process_scores", None))
        in_v1_agent_loop = v1_integration_problem(config) is None
        if self._has_postprocess and not in_v1_agent_loop and not type(self)._warned_postprocess_path:
            type(self)._warned_postprocess_path = True
            logger.warning(
                "%s.post_process_scores runs where a whole group is assembled: verl's "
                "RewardLoopManager.compute_rm_score, async-reward's pipeline, and verl's v1 agent loop "
                "with +actor_rollout_ref.rollout.agent.agent_loop_manager_class=%s. verl's agent loop "
                "without it scores samples one by one, where it cannot run.",
                name,
                AGENT_LOOP_MANAGER,
            )

    @classmethod
    def check_user_code(cls, config: Any, settings: AsyncRewardConfig) -> None:
        """The class loads, has ``compute_score`` and takes ``stateful.init_kwargs``; ``executor`` is not
        ``process``."""
        cls._user_class(config, settings)

    @staticmethod
    def _user_class(config: Any, settings: AsyncRewardConfig) -> tuple[str, str, type]:
        """``(path, name, class)`` of the user's class, loaded once per process.

        Raises:
            ConfigError: naming the key: no path, no class, a class without ``compute_score``,
                ``executor: process`` (the instance lives in this process), or ``stateful.init_kwargs``
                that its constructor cannot take (:func:`~async_reward._core.user_class.check_init_kwargs`:
                a key that is not a parameter, a required parameter not set).
        """
        if settings.executor == "process":
            raise bad_value(
                f"{CONFIG_PATH}.executor",
                "process",
                "cannot run async_stateful, which keeps one instance of your class per worker process",
                "use executor=thread (the default)",
            )
        key = "reward.custom_reward_function"
        found = user_object(config, needed_by="async_stateful")
        if found is None:
            raise missing_value(f"{key}.path", "async_stateful", f"set {key}.path and .name to your class")
        path, name, cls = found
        if not isinstance(cls, type):
            raise bad_value(
                f"{key}.name",
                name,
                f"in {path} is a {type(cls).__name__}, not a class (async_stateful makes one instance of it)",
                "name a class with a compute_score method, or use async_naive for a function",
            )
        if not callable(getattr(cls, "compute_score", None)):
            raise bad_value(
                f"{key}.name",
                name,
                f"in {path} has no compute_score method",
                "define compute_score(data_source, solution_str, ground_truth, extra_info) on the class",
            )
        # Here, not only where the instance is made: a misspelled argument otherwise passed the
        # driver's check and failed in every reward worker with a TypeError that named no key.
        check_init_kwargs(
            cls, name, path, settings.stateful.init_kwargs, f"{CONFIG_PATH}.stateful.init_kwargs"
        )
        return path, name, cls

    def postprocess_spec(self) -> tuple[str, ...] | None:
        return self._spec if self._has_postprocess else None

    async def score(self, sample: RewardSample) -> RewardResult:
        compute_score = self.instance.compute_score
        if self._reward_kwargs:
            compute_score = _with_reward_kwargs(compute_score, self._reward_kwargs)
        return await self.score_with_function(compute_score, sample)


def _with_reward_kwargs(fn: Callable[..., Any], reward_kwargs: dict[str, Any]) -> Callable[..., Any]:
    """``fn`` called with ``reward_kwargs`` merged over the call's own keyword arguments (verl's
    ``_call_with_kwargs``), keeping it sync or async."""
    if inspect.iscoroutinefunction(fn):

        async def call_async(**kwargs: Any) -> Any:
            return await fn(**{**kwargs, **reward_kwargs})

        return call_async

    def call(**kwargs: Any) -> Any:
        return fn(**{**kwargs, **reward_kwargs})

    return call
