"""How busy the machine's CPUs were while a strategy ran: the harness's own cost, made visible.

The benchmark runs time-scaled (``--time-scale``, 0.01: a recipe second lasts 10 ms), and scales
only the waits: every bit of CPU the harness spends (verl's one-sample ``compute_score`` per sample,
tag writes, the trainer's polls, Ray calls, the judge server) counts 1/time-scale times heavier in
recipe seconds than it would in a real run. Where the CPUs are saturated, samples wait for a core
and a schedule that spends more CPU per sample (verl's v1 path scores each sample by itself) loses
steps to the harness, not to its schedule. (The v1 mode's 2-4 % gap to legacy ``both`` that first
raised this was not saturation, which these readings ruled out at 45-55 % busy, but the garbage
collector's pauses: :mod:`~async_reward_bench.gc_pauses`, ``docs/benchmarks.md``.)

Two readings, from ``/proc`` (None where there is none): the whole machine's busy share
(``/proc/stat``), and the busiest single process of the harness (``/proc/<pid>/stat``: the benchmark's
own process, which runs the trainer and the v1 agent loop in threads under one GIL, each reward worker
and the judge server). The machine can be half idle while one process is at 100 % of its core: that
process is then what samples wait for, so the flag is on either.

And one reading before anything starts (:func:`busy_before_start`): how busy other work keeps the
machine. The harness itself uses up to about half of a 2-core machine at the default time scale, so
other work that already takes a quarter of it pushes the runs towards saturation; the benchmark
says so loudly at the start and again under its results, beside the figures flagged saturated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BEFORE_START_PROBE_S",
    "BUSY_BEFORE_START_SHARE",
    "CPU_SATURATED_SHARE",
    "PROCESS_SATURATED_SHARE",
    "CpuTimes",
    "ProcessCpu",
    "busy_before_start",
    "busy_share",
    "process_ticks",
]

#: Share of the machine's CPU time busy during a run above which its figures are flagged: a figure
#: measured with the CPUs this busy may include the harness's own cost (module docstring).
CPU_SATURATED_SHARE = 0.8

#: Share of one core a single process of the harness used during a run above which its figures are
#: flagged (a Python process is held to one core by its GIL, whatever the machine has left).
PROCESS_SATURATED_SHARE = 0.9

#: Share of the machine's CPU time other work used just before a run started above which the run
#: warns that the machine is too busy for its figures: the harness alone takes up to about half of a
#: 2-core machine at the default time scale (``docs/benchmarks.md``), so a quarter more brings the
#: runs close to :data:`CPU_SATURATED_SHARE`.
BUSY_BEFORE_START_SHARE = 0.25

#: Seconds the machine is watched before a run starts (a sleep: it costs no CPU itself).
BEFORE_START_PROBE_S = 0.5

_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class CpuTimes:
    """The machine's cumulative CPU time, in clock ticks: busy and idle (idle + iowait)."""

    busy: int
    idle: int

    @classmethod
    def now(cls, stat: Path = _STAT) -> CpuTimes | None:
        """The aggregate ``cpu`` line of ``stat``; None if it cannot be read."""
        try:
            first = stat.read_text().splitlines()[0].split()
            # user nice system idle iowait [irq softirq steal; guest, guest_nice already in user / nice]
            ticks = [int(x) for x in first[1:9]] if first and first[0] == "cpu" else []
        except (OSError, IndexError, ValueError):
            return None
        if len(ticks) < 5:  # not the aggregate line, or too short to hold idle and iowait
            return None
        idle = ticks[3] + ticks[4]
        return cls(busy=sum(ticks) - idle, idle=idle)


def busy_share(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """Busy share of all CPUs between two readings; None if either is missing or no time passed."""
    if before is None or after is None:
        return None
    busy, idle = after.busy - before.busy, after.idle - before.idle
    total = busy + idle
    return busy / total if total > 0 else None


def process_ticks(pid: int, proc: Path = Path("/proc")) -> int | None:
    """User + system CPU time of process ``pid`` so far, in clock ticks; None if it cannot be read."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; utime and stime are fields 14
    # and 15, the 12th and 13th after the last ")".
    fields = text.rsplit(")", 1)[-1].split()
    try:
        return int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class ProcessCpu:
    """CPU ticks of named processes at one moment, and the wall clock then."""

    ticks: dict[str, int]
    at: float

    @classmethod
    def now(cls, pids: dict[str, int], clock: float, proc: Path = Path("/proc")) -> ProcessCpu:
        """``pids``: a name for each process (those that cannot be read are left out)."""
        read = {name: process_ticks(pid, proc) for name, pid in pids.items()}
        return cls({name: t for name, t in read.items() if t is not None}, clock)

    def cpu_seconds(self, after: ProcessCpu, ticks_per_s: float) -> dict[str, float]:
        """CPU seconds each process read both times spent between ``self`` and ``after``: where the
        harness's own cost goes (per process, whatever else the machine runs)."""
        return {
            name: (after.ticks[name] - start) / ticks_per_s
            for name, start in self.ticks.items()
            if name in after.ticks
        }

    def busiest(self, after: ProcessCpu, ticks_per_s: float) -> tuple[str, float] | None:
        """The process that used the largest share of one core between ``self`` and ``after``, and
        that share; None if none was read both times or no time passed."""
        elapsed = after.at - self.at
        shares = {
            name: (after.ticks[name] - start) / ticks_per_s / elapsed
            for name, start in self.ticks.items()
            if name in after.ticks and elapsed > 0
        }
        if not shares:
            return None
        name = max(shares, key=lambda n: shares[n])
        return name, shares[name]


def busy_before_start(seconds: float = BEFORE_START_PROBE_S, stat: Path = _STAT) -> float | None:
    """The machine's busy share over ``seconds`` of sleep now: other work's, before the benchmark's own
    processes start (None where ``stat`` cannot be read)."""
    before = CpuTimes.now(stat)
    time.sleep(seconds)
    return busy_share(before, CpuTimes.now(stat))
