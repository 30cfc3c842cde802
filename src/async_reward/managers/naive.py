"""``async_naive``: the user's ``custom_reward_function`` with deadlines and failure isolation."""

from __future__ import annotations

from typing import Any, ClassVar

from async_reward._core.result import RewardResult, RewardSample
from async_reward._core.user_code import check_reward_function, resolve_user_function
from async_reward.config import AsyncRewardConfig
from async_reward.managers.base import AsyncRewardManager
from async_reward.managers.registry import register_manager

__all__ = ["AsyncNaiveRewardManager"]


@register_manager("async_naive")
class AsyncNaiveRewardManager(AsyncRewardManager):
    """Scores with the user's function (sync or async), or verl's default scorer for the data source.

    Only the concurrency cap applies (no RPM/TPM budgets): use ``async_rate_limited`` for a function
    that calls a rate-limited service.
    """

    uses_rate_budgets: ClassVar[bool] = False
    runs_custom_function: ClassVar[bool | None] = True
    _reads_sections: ClassVar[frozenset[str] | None] = frozenset()
    uses_default_scorer: ClassVar[bool] = True

    def __init__(self, config: Any, tokenizer: Any, compute_score: Any = None, **kwargs: Any) -> None:
        super().__init__(config, tokenizer, compute_score, **kwargs)
        self.score_fn = resolve_user_function(config, compute_score, self.settings.executor)

    @classmethod
    def check_user_code(cls, config: Any, settings: AsyncRewardConfig) -> None:
        """``custom_reward_function``, when set, names a function of a file that loads (a sync one
        under ``executor: process``)."""
        check_reward_function(config, settings.executor)

    async def score(self, sample: RewardSample) -> RewardResult:
        return await self.score_with_function(self.score_fn, sample)
