"""Step time of baseline / mini-batch / one-step-off / both schedules against a slow reward service.

A thin script over ``async_reward.benchmark.speedup`` (also ``async-reward bench``)::

    python benchmarks/pipeline_speedup.py --quick     # recipe regime, under 2 minutes
    python benchmarks/pipeline_speedup.py             # all regimes, ~10 minutes

Writes ``bench_out/pipeline_speedup.json`` and ``bench_out/timeline_<regime>_<strategy>.png``.
"""

from __future__ import annotations

from async_reward.benchmark.speedup import main

if __name__ == "__main__":
    raise SystemExit(main())
