"""The ``reward/*`` metrics every trainer path logs: counts per status, latency percentiles, retries,
what judging cost.

One definition shared by the pipelined manager (per ticket) and verl's v1 trainer (per training step),
so a dashboard reads the same names whichever path trained the model. verl averages numbers and
drops strings from extras; here the ``status`` string becomes a count per status instead.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from async_reward._core.result import LOST_WORKERS_KEY, Status
from async_reward.judge.cost import cost_metrics, whole_count

__all__ = ["STANDARD_EXTRA_KEYS", "extras_metrics", "lost_worker_names", "sample_retries", "status_metrics"]

#: Extras keys every async-reward sample carries (plus ``excluded`` where a policy excludes it, and
#: ``lost_reward_workers`` on a session re-scored after its reward worker died); they are summarised
#: by :func:`status_metrics` and :func:`extras_metrics`, not averaged as user extras.
STANDARD_EXTRA_KEYS = frozenset(
    {"status", "latency_s", "attempts", "failure_reason", "excluded", LOST_WORKERS_KEY}
)


def status_metrics(
    status_counts: Mapping[str, int],
    latencies_s: Sequence[float] | np.ndarray,
    retries: int,
    excluded: int | None = None,
) -> dict[str, float]:
    """``reward/status_<x>`` for every status, ``reward/latency_{p50,p95,max}`` (seconds, over the finite
    latencies; 0 when none is known), ``reward/retries`` (attempts beyond the first of each call:
    :func:`sample_retries`) and, when given, ``reward/excluded``.

    Every value is finite: a NaN (no latency known, e.g. a step whose every session raised) would poison
    a tracker's step averages, and a missing key would leave gaps in the same dashboard. 0 with the
    status counts beside it reads unambiguously, as the decoupled mode's ``timing_s/reward_compute/*``
    do for a step in which no session finished scoring."""
    latencies = np.asarray(latencies_s, dtype=float)
    latencies = latencies[np.isfinite(latencies)]
    if latencies.size:
        p50, p95 = (float(v) for v in np.percentile(latencies, [50, 95]))
        latency_max = float(latencies.max())
    else:
        p50 = p95 = latency_max = 0.0
    metrics = {"reward/latency_p50": p50, "reward/latency_p95": p95, "reward/latency_max": latency_max}
    for status in Status:
        metrics[f"reward/status_{status.value}"] = float(status_counts.get(status.value, 0))
    metrics["reward/retries"] = float(retries)
    if excluded is not None:
        metrics["reward/excluded"] = float(excluded)
    return metrics


def extras_metrics(
    extra_infos: Iterable[Mapping[str, Any]], counted_deaths: set[str] | None = None
) -> dict[str, float]:
    """Metrics of a batch of samples' ``reward_extra_info``: :func:`status_metrics`, what judging
    cost (``reward/cost/*``: calls, shared calls, tokens, cache hits, money; see
    ``async_reward.judge.cost.cost_metrics``), the mean of
    each numeric user extra as ``reward/extra/<key>/mean`` (NaN values, i.e. failed samples, ignored),
    and the reward-worker failover of verl v1's agent loop: ``reward/rescored_sessions`` (samples
    re-scored because their reward worker died) and ``reward/worker_deaths`` (reward workers first
    named dead by these samples).

    A sample without ``status`` comes from a manager that reports none and counts as ``ok``.
    ``counted_deaths``: the workers already counted in earlier batches of the run, updated in place, so
    a death whose sessions are trained in two steps counts once (None: count within this batch only).
    """
    extra_infos = list(extra_infos)
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    retries = excluded = rescored = 0
    numeric: dict[str, list[float]] = {}
    lost: set[str] = set()
    for info in extra_infos:
        names = lost_worker_names(info)
        rescored += bool(names)
        lost |= names
        statuses[str(info.get("status", Status.OK.value))] += 1
        latency = _number(info.get("latency_s"))
        latencies.append(math.nan if latency is None else latency)
        retries += sample_retries(info)
        excluded += bool(info.get("excluded", False))
        for key, value in info.items():
            number = _number(value, allow_bool=True)
            if key not in STANDARD_EXTRA_KEYS and number is not None:
                numeric.setdefault(key, []).append(number)
    metrics = status_metrics(statuses, latencies, retries, excluded)
    metrics["reward/rescored_sessions"] = float(rescored)
    if counted_deaths is not None:
        lost -= counted_deaths
        counted_deaths |= lost
    metrics["reward/worker_deaths"] = float(len(lost))
    metrics.update(cost_metrics(extra_infos))
    for key, values in sorted(numeric.items()):
        finite = [v for v in values if math.isfinite(v)]
        if finite:
            metrics[f"reward/extra/{key}/mean"] = float(np.mean(finite))
    return metrics


def sample_retries(info: Mapping[str, Any]) -> int:
    """The retries in one sample's ``attempts`` (every request sent): its attempts beyond the first of
    each call. A sample made one call unless it says otherwise: ``judge_calls`` (a rubric graded in
    ``judge.criteria_per_call`` calls, each counted once), so six calls answered the first time are
    no retry. Counts are read by ``cost.whole_count``; an unreadable one counts no retry."""
    attempts = whole_count(info.get("attempts"))
    if not attempts:
        return 0
    calls = whole_count(info.get("judge_calls"))
    return max(attempts - (min(attempts, 1) if calls is None else calls), 0)


def lost_worker_names(info: Mapping[str, Any]) -> set[str]:
    """The reward workers a sample's ``reward_extra_info`` names dead (``lost_reward_workers``, set by
    our v1 agent loop on a session it re-scored); empty for every other sample."""
    value = info.get(LOST_WORKERS_KEY)
    if not isinstance(value, str):
        return set()
    return {name for name in value.split(",") if name}


def _number(value: Any, *, allow_bool: bool = False) -> float | None:
    """``value`` as a float when it is a real number (numpy scalars included), else None."""
    if isinstance(value, bool | np.bool_):
        return float(value) if allow_bool else None
    if isinstance(value, int | float | np.integer | np.floating):
        return float(value)
    return None
