"""Keep the garbage collector's full collections out of the timed runs.

A full (generation-2) collection scans every object the process tracks, and the benchmark's process
holds torch, verl, Ray and transformers: measured on the v1 mode's balanced run (one run, 12 steps,
``gc.callbacks``), 11 full collections of which 9 took over 50 ms, the longest 331 ms. Each stops
every thread of the process, the v1 agent loop's included (it hands finished samples to the reward
workers and writes their tags), and at the default time scale (0.01) 331 ms is 33 recipe seconds:
single steps 15-35 s slower, in the v1 strategies more than in ours (their agent loop and trainer
share this process). In a real run the same pause is 0.3 s against a step of minutes, so it is an
artifact of scaling time, like the harness's CPU (:mod:`~async_reward_bench.cpu_use`).

:func:`no_full_collections` collects everything before a run and holds the automatic full
collections off during it (generation-2 threshold out of reach); the young generations still collect
(under 5 ms each, measured), so short-lived cycles are freed as usual, and what the run leaves is
collected after it. Freezing the heap before the run (``gc.freeze``) was tried first and is not
enough: the run's own objects (about 100 000 in generation 2 after a few steps) still took 120-140 ms
a collection.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["no_full_collections"]

#: Generation-2 threshold while a run is timed: more generation-1 collections than a run makes.
_OUT_OF_REACH = 1 << 30


def _hold_off(_actor: Any = None) -> tuple[int, int, int]:
    """Collect, then put the full collections out of reach; returns the thresholds to restore."""
    gc.collect()
    young, middle, full = gc.get_threshold()
    gc.set_threshold(young, middle, _OUT_OF_REACH)
    return young, middle, full


def _restore(_actor: Any, thresholds: tuple[int, int, int]) -> None:
    gc.set_threshold(*thresholds)
    gc.collect()


@contextlib.contextmanager
def no_full_collections(actors: Sequence[Any] = ()) -> Iterator[None]:
    """In this process and in each Ray actor of ``actors`` (the reward workers: the same libraries,
    the same pauses, each delaying the samples it scores): collect now, no automatic full collection
    in the body, collect again after (module docstring)."""
    saved = _on_actors([actor.__ray_call__.remote(_hold_off) for actor in actors])
    own = _hold_off()
    try:
        yield
    finally:
        _restore(None, own)
        _on_actors([actor.__ray_call__.remote(_restore, t) for actor, t in zip(actors, saved, strict=True)])


def _on_actors(calls: list[Any]) -> list[Any]:
    """The calls' results; no Ray call at all without actors (``ray.get`` would start a cluster)."""
    if not calls:
        return []
    import ray

    return list(ray.get(calls, timeout=120))
