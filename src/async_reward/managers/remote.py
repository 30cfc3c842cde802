"""``async_remote``: a user's HTTP reward service. Each sample is POSTed as JSON; the reply's
``score`` is the reward and its other keys become extras. Redirects are not followed and a reply is
read up to a cap (``async_reward._core.http``).

A reply's ``score`` must be a JSON number: ``true`` is refused, though a user function may return a
bool (``normalize_user_result``). A Python function's ``True`` is its author's choice; a service's
``true`` is what any JSON writer makes of a flag or a pass/fail field sent in the wrong place, and a
wrong key or type must show as ``invalid``, not train as a perfect score."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from async_reward._core.http import post_json
from async_reward._core.http_secrets import shown_url
from async_reward._core.result import RewardResult, RewardSample, Status, normalize_user_result
from async_reward.managers.base import AsyncRewardManager
from async_reward.managers.registry import register_manager

__all__ = ["AsyncRemoteRewardManager", "sample_payload"]


def _jsonable(value: Any) -> Any:
    """numpy scalars/arrays and other non-JSON values from a dataset, made JSON-safe."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    return str(value)


def sample_payload(sample: RewardSample) -> dict[str, Any]:
    """The JSON body sent to the reward service for one sample."""
    return _jsonable(
        {
            "index": sample.index,
            "uid": sample.uid,
            "data_source": sample.data_source,
            "prompt": sample.prompt,
            "response": sample.response,
            "ground_truth": sample.ground_truth,
            "extra_info": sample.extra_info,
        }
    )


@register_manager("async_remote")
class AsyncRemoteRewardManager(AsyncRewardManager):
    """POSTs each sample to ``reward.async_reward.remote.url`` under admission, deadline and retry."""

    required_sections: ClassVar[tuple[str, ...]] = ("remote",)
    runs_custom_function: ClassVar[bool | None] = False
    _reads_sections: ClassVar[frozenset[str] | None] = frozenset({"remote"})

    def __init__(self, config: Any, tokenizer: Any, compute_score: Any = None, **kwargs: Any) -> None:
        super().__init__(config, tokenizer, compute_score, **kwargs)
        self.remote = self.settings.remote
        self.remote.validate()
        self.remote.require()
        self._headers = dict(self.remote.headers)
        if self.remote.api_key_env:
            # The key lives only in this private header dict: never logged, never in a repr.
            self._headers["Authorization"] = f"Bearer {os.environ[self.remote.api_key_env]}"

    def __repr__(self) -> str:
        # The URL's user:password@ and query (?api_key=...) are credentials: shown as <hidden>.
        return f"{type(self).__name__}(url={shown_url(self.remote.url)!r})"

    async def score(self, sample: RewardSample) -> RewardResult:
        payload = sample_payload(sample)
        url = self.remote.url
        assert url is not None

        async def attempt(_reservation: Any) -> Any:
            body, _headers = await post_json(url, payload, headers=self._headers, url_key="remote.url")
            return body

        body, attempts = await self.call_with_policy(attempt, priority=sample.admission_priority)
        # Failures returned, not raised, from here on: raised, they would count one attempt, not
        # the `attempts` the policy made.
        if not isinstance(body, dict):
            reason = f"reward service replied with {type(body).__name__}, not an object"
            return RewardResult.failure(Status.INVALID, reason, attempts=attempts)
        if isinstance(body.get("score"), bool):
            reason = "score is a JSON boolean, not a number"
            return RewardResult.failure(Status.INVALID, reason, attempts=attempts)
        result = normalize_user_result(body)
        if result.status is Status.OK:
            # Safe to keep: post_json redacted any secret of the request (the bearer key, a header,
            # the URL's password or query) the service echoed back, in keys and nested values too.
            result.extras = {k: v for k, v in body.items() if k != "score"}
        result.attempts = attempts
        return result
