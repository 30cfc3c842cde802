"""How fast the machine's CPUs ran while each figure was measured: the host's speed, made visible.

At the default time scale (0.01) a millisecond of the harness's CPU weighs 0.1 recipe seconds, so a
figure moves with how fast the CPUs run, not only with how busy they are (:mod:`cpu_use`). On a
shared virtual machine that speed is not constant. Two default runs of 2026-11-29, ten minutes
apart on a quiet 2-core machine, did the same GPU-bound work (the same samples, steps and seed):
one spent 30 % more CPU seconds on it, in the benchmark's process and in each reward worker alike,
at 69 % busy (under the saturation flag), and its figure came out 6 % higher. The busy share cannot
see a slower CPU. This probe can.

A child process (the standard library's ``time`` only) times a fixed piece of pure-Python work on
its own thread's CPU clock, the fastest of three tries, every half second. It reads CPU time, not
wall time: waiting for a core (the harness's own load) does not count, a slower CPU (another guest
on the host, a lower clock) does. It costs about half a percent of one core. Each figure records
the median cost of that work during its run (``cpu_unit_ms``); at the end of the benchmark, each
figure's slowdown against the run's median figure (``host_slowdown``; negative: faster), flagged
over :data:`HOST_SLOWED_SHARE`. ``cpu_unit_ms`` also compares two runs: the same machine at the same
speed reads the same.

Written here rather than taken from a library: what is needed is one number per time window from a
process that must not load the machine, which is a dozen lines.
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "HOST_SLOWED_SHARE",
    "MIN_SAMPLES",
    "HostSpeedProbe",
    "add_host_slowdown",
    "host_speed_probe",
    "slowed_figures",
    "window_median_ms",
]

#: Slowdown against the run's median figure above which a figure is flagged. On an idle machine the
#: probe's medians over 50-second windows (a figure's length) stayed within 7 % of their mean
#: (1.34-1.54 ms, 2026-11-29), so a figure 20 % slower ran on a slower host, not on the probe's noise.
HOST_SLOWED_SHARE = 0.2

#: Samples a figure needs for its median (about ten seconds of the probe): fewer say nothing.
MIN_SAMPLES = 20

#: Seconds between the probe's samples.
_INTERVAL_S = 0.5

#: The probe: a fixed loop timed on the thread's CPU clock, the fastest of three, printed with the
#: system-wide monotonic clock (shared by every process on Linux); it ends when its parent does.
_PROBE = f"""
import os, time
parent = os.getppid()
def unit():
    start = time.thread_time()
    total = 0
    for i in range(20000):
        total += i * i
    return time.thread_time() - start
while os.getppid() == parent:
    cost = min(unit() for _ in range(3))
    try:
        print(time.monotonic(), cost, flush=True)
    except BrokenPipeError:
        break
    time.sleep({_INTERVAL_S})
"""


class HostSpeedProbe:
    """The probe's samples, ``(monotonic time, seconds the fixed work took)``, read by a thread."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._process = process
        self._samples: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="host-speed-probe", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            parts = line.split()
            if len(parts) == 2:
                with self._lock:
                    self._samples.append((float(parts[0]), float(parts[1])))

    def unit_ms(self, start: float, end: float) -> float | None:
        """:func:`window_median_ms` of the samples so far."""
        with self._lock:
            samples = list(self._samples)
        return window_median_ms(samples, start, end)

    def close(self) -> None:
        self._process.kill()
        self._process.wait(timeout=30)
        self._reader.join(timeout=5)


def window_median_ms(samples: Sequence[tuple[float, float]], start: float, end: float) -> float | None:
    """Median cost of the fixed work, in milliseconds, over the ``(time, seconds)`` samples taken
    between the monotonic times ``start`` and ``end``; None with fewer than :data:`MIN_SAMPLES`."""
    costs = [cost for at, cost in samples if start <= at <= end]
    return statistics.median(costs) * 1000 if len(costs) >= MIN_SAMPLES else None


@contextlib.contextmanager
def host_speed_probe() -> Iterator[HostSpeedProbe]:
    """The probe, running in a child process until the block ends."""
    process = subprocess.Popen(
        [sys.executable, "-c", _PROBE], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    probe = HostSpeedProbe(process)
    try:
        yield probe
    finally:
        probe.close()


def add_host_slowdown(regimes: Mapping[str, Any]) -> None:
    """Set each figure's ``host_slowdown``: its ``cpu_unit_ms`` over the median of the run's figures,
    less 1 (0.3: the same work took 30 % more CPU time). Figures without a reading get none.

    The median, not the fastest: the fastest is the one reading most likely to sit at the probe's
    noise floor, and against it a quiet run would flag itself."""
    units = [
        float(summary["cpu_unit_ms"])
        for regime in regimes.values()
        for summary in regime.get("strategies", {}).values()
        if summary.get("cpu_unit_ms") is not None
    ]
    if not units:
        return
    typical = statistics.median(units)
    for regime in regimes.values():
        for summary in regime.get("strategies", {}).values():
            if summary.get("cpu_unit_ms") is not None:
                summary["host_slowdown"] = float(summary["cpu_unit_ms"]) / typical - 1.0


def slowed_figures(regimes: Mapping[str, Any]) -> dict[str, float]:
    """``regime/strategy`` -> slowdown, for every figure over :data:`HOST_SLOWED_SHARE`."""
    return {
        f"{regime_name}/{name}": float(summary["host_slowdown"])
        for regime_name, regime in regimes.items()
        for name, summary in regime.get("strategies", {}).items()
        if float(summary.get("host_slowdown") or 0.0) > HOST_SLOWED_SHARE
    }
