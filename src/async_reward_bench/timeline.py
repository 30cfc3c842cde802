"""Timeline pictures of a benchmark run: what the GPU did, when it waited, what the service held.

One PNG per (regime, strategy): the top panel has a lane of GPU stages (rollout, prepare, update)
whose gaps are GPU idle time, a lane of the time the trainer was blocked on rewards, and dotted step
boundaries; the bottom panel is the number of reward requests inside the service over time (being
served, and served or queued), sampled from the dev server's counters, against its capacity.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from async_reward.training.schedule import StepRecord

__all__ = ["InFlightSampler", "plot_timeline"]

_COLORS = {
    "rollout": "#d62728",
    "prepare": "#1f77b4",
    "update": "#2ca02c",
    "advantage": "#9467bd",
    "reward_wait": "#ff7f0e",
    "weight_sync": "#7f7f7f",
}


class InFlightSampler:
    """Samples ``stats()["in_flight"]`` / ``["in_flight_total"]`` of a dev server in a thread.

    ``samples`` holds ``(clock time, in service, in service + queued)`` tuples.
    """

    def __init__(
        self,
        stats: Callable[[], dict[str, Any]],
        interval_s: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.stats, self.interval_s, self.clock = stats, interval_s, clock
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> InFlightSampler:
        self._thread = threading.Thread(target=self._run, name="in-flight-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, int, int]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return self.samples

    def _run(self) -> None:
        while not self._stop.is_set():
            stats = self.stats()
            self.samples.append((self.clock(), int(stats["in_flight"]), int(stats["in_flight_total"])))
            self._stop.wait(self.interval_s)


def plot_timeline(
    path: Path,
    records: Sequence[StepRecord],
    samples: Sequence[tuple[float, int, int]],
    *,
    title: str,
    capacity: int,
    time_scale: float,
    origin: float | None = None,
    separate_rollout: bool = False,
) -> Path:
    """Draw one run's timeline to ``path`` (PNG); times are shown in recipe seconds (/ ``time_scale``).

    ``separate_rollout``: generation runs on GPUs of its own (a lane of its own), beside training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0 = origin if origin is not None else (records[0].start if records else 0.0)

    def x(t: float) -> float:
        return (t - t0) / time_scale

    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(13, 5.2),
        sharex=True,
        gridspec_kw={"height_ratios": [1.2, 1.0]},
        constrained_layout=True,
    )
    lanes = {"GPU": 2.0, "blocked on rewards": 1.0, "advantage (driver)": 0.0}
    named = {"reward_wait": "blocked on rewards", "advantage": "advantage (driver)"}
    if separate_rollout:
        lanes = {"rollout GPUs": 3.0, "trainer GPUs": 2.0, **{k: v for k, v in lanes.items() if k != "GPU"}}
        named |= {"rollout": "rollout GPUs", "weight_sync": "rollout GPUs"}
    for record in records:
        for event in record.events:
            if event.name == "submit":
                continue
            lane = named.get(event.name, "trainer GPUs" if separate_rollout else "GPU")
            top.broken_barh(
                [(x(event.start), max(event.duration / time_scale, 1e-3))],
                (lanes[lane] - 0.35, 0.7),
                facecolors=_COLORS[event.name],
                edgecolors="white" if lane.endswith("GPU") or lane.endswith("GPUs") else "none",
                linewidth=0.4,
            )
        for axis in (top, bottom):
            axis.axvline(x(record.end), color="grey", linestyle=":", linewidth=0.8)
    top.set_yticks(list(lanes.values()), list(lanes))
    top.set_ylim(-0.6, max(lanes.values()) + 0.6)
    top.set_title(title, fontsize=10)
    top.legend(
        handles=[Patch(color=c, label=n) for n, c in _COLORS.items()],
        loc="upper right",
        fontsize=7,
        ncol=5,
        framealpha=0.9,
    )
    if samples:
        times = [x(t) for t, _, _ in samples]
        bottom.step(times, [s for _, s, _ in samples], where="post", color="#1f77b4", label="being served")
        bottom.step(
            times,
            [q for _, _, q in samples],
            where="post",
            color="#ff7f0e",
            alpha=0.7,
            label="served + queued",
        )
    bottom.axhline(capacity, color="black", linestyle="--", linewidth=0.8, label=f"capacity {capacity}")
    bottom.set_ylabel("reward requests\nin the service")
    bottom.set_xlabel("time (recipe seconds; dotted lines: step ends)")
    bottom.set_ylim(bottom=0)
    bottom.legend(loc="upper right", fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
