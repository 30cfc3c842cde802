"""The ``reward/*`` metrics every trainer path logs: counts per status, latency percentiles, retries.

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

from async_reward.result import Status

__all__ = ["STANDARD_EXTRA_KEYS", "extras_metrics", "status_metrics"]

#: Extras keys every async-reward sample carries (plus ``excluded`` where a policy excludes it);
#: they are summarised by :func:`status_metrics`, not averaged as user extras.
STANDARD_EXTRA_KEYS = frozenset({"status", "latency_s", "attempts", "failure_reason", "excluded"})


def status_metrics(
    status_counts: Mapping[str, int],
    latencies_s: Sequence[float] | np.ndarray,
    retries: int,
    excluded: int | None = None,
) -> dict[str, float]:
    """``reward/status_<x>`` for every status, ``reward/latency_{p50,p95,max}`` (seconds, NaN when no
    latency is known), ``reward/retries`` and, when given, ``reward/excluded``."""
    latencies = np.asarray(latencies_s, dtype=float)
    latencies = latencies[~np.isnan(latencies)]
    if latencies.size:
        p50, p95 = (float(v) for v in np.percentile(latencies, [50, 95]))
        latency_max = float(latencies.max())
    else:
        p50 = p95 = latency_max = math.nan
    metrics = {"reward/latency_p50": p50, "reward/latency_p95": p95, "reward/latency_max": latency_max}
    for status in Status:
        metrics[f"reward/status_{status.value}"] = float(status_counts.get(status.value, 0))
    metrics["reward/retries"] = float(retries)
    if excluded is not None:
        metrics["reward/excluded"] = float(excluded)
    return metrics


def extras_metrics(extra_infos: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Metrics of a batch of samples' ``reward_extra_info``: :func:`status_metrics` plus the mean of
    each numeric user extra as ``reward/extra/<key>/mean`` (NaN values, i.e. failed samples, ignored).

    A sample without ``status`` comes from a manager that reports none and counts as ``ok``.
    """
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    retries = excluded = 0
    numeric: dict[str, list[float]] = {}
    for info in extra_infos:
        statuses[str(info.get("status", Status.OK.value))] += 1
        latency = _number(info.get("latency_s"))
        latencies.append(math.nan if latency is None else latency)
        attempts = _number(info.get("attempts"))
        if attempts is not None and attempts > 1:
            retries += int(attempts) - 1
        excluded += bool(info.get("excluded", False))
        for key, value in info.items():
            number = _number(value, allow_bool=True)
            if key not in STANDARD_EXTRA_KEYS and number is not None:
                numeric.setdefault(key, []).append(number)
    metrics = status_metrics(statuses, latencies, retries, excluded)
    for key, values in sorted(numeric.items()):
        finite = [v for v in values if math.isfinite(v)]
        if finite:
            metrics[f"reward/extra/{key}/mean"] = float(np.mean(finite))
    return metrics


def _number(value: Any, *, allow_bool: bool = False) -> float | None:
    """``value`` as a float when it is a real number (numpy scalars included), else None."""
    if isinstance(value, bool | np.bool_):
        return float(value) if allow_bool else None
    if isinstance(value, int | float | np.integer | np.floating):
        return float(value)
    return None
