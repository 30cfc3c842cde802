"""The rollout engine's timing, for schedules that see samples finish one by one (verl's v1 trainer).

Our own strategies only need a rollout's makespan (the recipe's ``gen`` median: the rollout returns
when its longest response is done). verl's v1 agent loop scores each sample as soon as *its*
generation finishes, so its schedule depends on when each sample finishes. Two pieces model that:

* :func:`rollout_durations`: each response's decoding time, from a log-normal length distribution
  scaled so that the longest response of the batch takes the calibrated makespan (a lone batch
  therefore takes exactly as long as our strategies' rollout).
* :class:`GenerationState`: the sequences inside the engine, decoded concurrently. Up to
  ``full_speed_slots`` sequences (one batch's worth, the concurrency the makespan was measured at)
  each advance at full speed; beyond that the engine's throughput is shared (each advances at
  ``slots / active``), so a second batch in flight does not come for free. A paused engine (the
  colocated GPU is training) advances nothing, and an interrupted sequence keeps its progress
  (verl's partial rollout resumes from the tokens already generated).

Pure bookkeeping without clocks or threads, so it is tested exactly; ``v1_agent_loop`` drives it in
(time-scaled) real time.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable

import numpy as np

__all__ = ["GenerationState", "rollout_durations", "rollout_work"]

_DONE = 1e-12


def rollout_durations(n: int, makespan_s: float, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Decoding time of each of ``n`` responses: log-normal lengths with shape ``sigma``, scaled so
    that the longest takes ``makespan_s``. ``sigma = 0`` makes every response equally long."""
    if n < 1 or makespan_s < 0 or sigma < 0:
        raise ValueError(f"need n >= 1, makespan_s >= 0 and sigma >= 0, got {n}, {makespan_s}, {sigma}")
    lengths = rng.lognormal(mean=0.0, sigma=sigma, size=n)
    return np.asarray(makespan_s * lengths / lengths.max(), dtype=float)


def rollout_work(makespan_s: float, sigma: float, samples: int, slots: int, draws: int = 64) -> float:
    """Seconds a continuously fed engine needs per batch: the batch's decoding time summed over its
    ``samples`` responses, shared by the ``slots`` sequences it decodes at full speed (the expected
    value over ``draws`` seeded batches of :func:`rollout_durations`). A lower bound on the rollout's
    time per batch in steady state, and below the makespan: while a batch's longest responses finish,
    the engine can decode the next batch's bulk (what verl's separate and async modes do)."""
    if samples < 1 or slots < 1 or draws < 1:
        raise ValueError(f"need samples, slots and draws >= 1, got {samples}, {slots}, {draws}")
    means = [
        rollout_durations(samples, makespan_s, sigma, np.random.default_rng([7, i])).mean()
        for i in range(draws)
    ]
    return float(np.mean(means)) * samples / slots


class GenerationState:
    """Sequences being decoded: each needs ``work`` seconds of decoding at full speed.

    Every active sequence advances at the same rate, so the state is one running total of the
    decoding each has had since the engine started (``_decoded``) and, per sequence, the total at
    which it is done, in a heap: the next to finish is the heap's first, and a completion costs
    O(log n) instead of a pass over every sequence. Decoding 640 completions among 2560 active
    sequences (a decoupled window four batches deep) took about 0.3 s of CPU with a pass per
    completion, which the time scale multiplies by 100 into the benchmark's figures.

    Args:
        full_speed_slots: sequences the engine decodes at full speed at once; more share its
            throughput.
    """

    def __init__(self, full_speed_slots: int) -> None:
        if full_speed_slots < 1:
            raise ValueError(f"full_speed_slots must be >= 1, got {full_speed_slots}")
        self.full_speed_slots = full_speed_slots
        self._decoded = 0.0
        """Decoding seconds each active sequence has had since the engine started (all alike)."""
        self._done_at: dict[Hashable, float] = {}
        """Per active sequence, in order of arrival: the ``_decoded`` total at which it is done."""
        self._heap: list[tuple[float, int, Hashable]] = []
        """``(done at, arrival number, key)`` of every active sequence: the first is the next done."""
        self._arrivals = 0

    def __len__(self) -> int:
        return len(self._done_at)

    def add(self, key: Hashable, work_s: float) -> None:
        """Start decoding ``key``, which needs ``work_s`` seconds at full speed."""
        if key in self._done_at:
            raise KeyError(f"sequence {key!r} is already being decoded")
        if not work_s >= 0:
            raise ValueError(f"work must be >= 0, got {work_s}")
        done_at = self._decoded + float(work_s)
        self._done_at[key] = done_at
        heapq.heappush(self._heap, (done_at, self._arrivals, key))
        self._arrivals += 1

    def rate(self) -> float:
        """Seconds of decoding each active sequence gets per second (1.0 up to ``full_speed_slots``)."""
        return min(1.0, self.full_speed_slots / len(self._done_at)) if self._done_at else 0.0

    def time_to_next(self) -> float | None:
        """Seconds until the next sequence finishes at the current rate (None when idle)."""
        if not self._heap:
            return None
        return max(0.0, self._heap[0][0] - self._decoded) / self.rate()

    def advance(self, elapsed_s: float) -> list[Hashable]:
        """Decode for ``elapsed_s`` seconds and return the sequences that finished, in finishing order
        (ties in order of arrival).

        The rate is recomputed after every completion, so one long step equals many short ones.
        """
        finished: list[Hashable] = []
        left_s = max(0.0, elapsed_s)
        while self._heap:
            # done within rounding of the running total (a relative margin: it grows through a run)
            margin = _DONE * max(1.0, abs(self._decoded))
            while self._heap and self._heap[0][0] - self._decoded <= margin:
                key = heapq.heappop(self._heap)[2]
                del self._done_at[key]
                finished.append(key)
            if not self._heap or left_s <= 0:
                break
            step = min(left_s, self.time_to_next() or 0.0)
            self._decoded += step * self.rate()
            left_s -= step
        return finished

    def clear(self) -> list[Hashable]:
        """Stop decoding everything; returns what was still being decoded (in order of arrival)."""
        dropped = list(self._done_at)
        self._done_at.clear()
        self._heap.clear()
        return dropped
