"""A judge request through verl's router is waited for past ``timeout_s``, never abandoned or repeated.

verl 0.9.1's router (``verl.experimental.reward_loop.router.naive_router.NaiveRouter``: one FastAPI
route under uvicorn) forwards each request to the least-loaded replica with an ``aiohttp`` session
without a timeout, and reads nothing from its own client meanwhile. When the client closes its
connection, the handler runs on and the replica generates the request to its last token. Nothing on
our side can stop it: the router has no abort endpoint (its one route forwards any path, ``/abort``
included, to whichever replica is least loaded, not to the one holding the request), and verl's
vLLM server offers no abort by request id over HTTP.

Abandoning an attempt at ``timeout_s`` therefore only frees our admission slot: measured with
capacity 2, ``timeout_s=1``, 3 s a verdict and 4 samples (``docs/judge-in-job.md``), the replicas
held 6 of our requests at once, received 8, and held 4 when scoring returned, the moment verl puts a
colocated judge to sleep. So :func:`post_through_router` keeps an attempt that passed ``timeout_s``
waiting for the router's answer, its admission slot held, and ends it as a timeout that is not sent
again (:data:`ROUTED_ATTEMPT_POLICY`): the replicas never hold more of our requests than admission
allows, and none is inside when a sample's scoring returns. What it costs: a timed-out sample
returns when its replica has finished the request, time the replica spends either way (the 4
samples there returned after 6.1 s, two rounds of 3 s at capacity 2, instead of 4.5 s). The wait is
bounded by :func:`router_wait_limit_s` for a replica that never answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from async_reward._core.deadline import describe_error
from async_reward._core.http import post_json
from async_reward.config import AsyncRewardConfig

__all__ = [
    "ROUTED_ATTEMPT_POLICY",
    "RoutedRequestTimeout",
    "post_through_router",
    "router_wait_limit_s",
]

logger = logging.getLogger(__name__)

#: ``call_with_policy``'s options for an attempt through verl's router: the attempt applies
#: ``timeout_s`` itself (:func:`post_through_router` waits past it, holding the slot), and a timeout
#: is not retried (another copy would join the one the replica is still generating).
ROUTED_ATTEMPT_POLICY: Mapping[str, bool] = MappingProxyType({"own_deadline": True, "retry_timeouts": False})

_WHY = "verl's router cannot cancel a request, so it was waited for with its admission slot held"


class RoutedRequestTimeout(TimeoutError):
    """A request through verl's router passed ``timeout_s`` (status ``timeout``, not retried); the
    message says what became of it: answered late, failed late, or given up at the wait limit."""


def router_wait_limit_s(settings: AsyncRewardConfig) -> float:
    """The longest one request through the router is waited for, from when it is sent:
    ``retry.max_total_s`` (the longest a sample's attempts may span), and never less than
    ``timeout_s``. Only a replica that never answers reaches it: one that generates answers within
    ``judge.max_tokens``."""
    return max(settings.timeout_s, settings.retry.max_total_s)


async def post_through_router(
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    settings: AsyncRewardConfig,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """POST ``body`` to verl's router and return the reply's JSON, as ``post_json`` does within
    ``settings.timeout_s``. Past it the request is waited for (up to :func:`router_wait_limit_s`),
    then :class:`RoutedRequestTimeout` is raised whatever came back. A cancellation of the caller
    closes the connection at once (the router still completes the request on the replica).

    Raises:
        RoutedRequestTimeout: no reply within ``timeout_s``.
        HTTPStatusError, MalformedResponseError, aiohttp.ClientError: as ``post_json``, within
            ``timeout_s``.
    """
    deadline_s = settings.timeout_s
    limit_s = router_wait_limit_s(settings)
    started = clock()
    request = asyncio.ensure_future(post_json(url, body, headers=headers, timeout_s=limit_s))
    try:
        done, _ = await asyncio.wait((request,), timeout=deadline_s)
        if not done:
            await asyncio.wait((request,))  # the slot stays held until the replica is done with it
    except asyncio.CancelledError:
        request.cancel()
        raise
    elapsed = clock() - started
    error = request.exception()
    if done and not isinstance(error, TimeoutError):
        if error is not None:
            raise error
        reply, _headers = request.result()
        return reply
    if isinstance(error, TimeoutError):
        logger.warning(
            "a judge request through verl's router got no answer within %g s (timeout_s=%g, "
            "retry.max_total_s=%g): its connection is closed, and the request may still run on a replica",
            limit_s,
            deadline_s,
            settings.retry.max_total_s,
        )
        raise RoutedRequestTimeout(
            f"the served judge did not answer within timeout_s={deadline_s:g} s, nor within "
            f"{limit_s:g} s of waiting (retry.max_total_s) for the request to leave its replica: "
            "connection closed, the request may still run there (verl's router cannot cancel it)"
        )
    outcome = "answered" if error is None else f"failed ({describe_error(error)})"
    raise RoutedRequestTimeout(
        f"the served judge {outcome} after {elapsed:.1f} s, past timeout_s={deadline_s:g} s: a timeout, "
        f"not sent again ({_WHY})"
    )
