"""Step time of our schedules (baseline / mini-batch / one-step-off / both / recipe-style) and verl
v1's (``sync``, ``colocate_async``) against a slow reward service, with a verdict on ours.

A thin script over ``async_reward_bench.speedup`` (also ``async-reward bench``)::

    python benchmarks/pipeline_speedup.py --quick     # ours, recipe regime: ~70 s on a quiet machine
    python benchmarks/pipeline_speedup.py             # the README's table: 5 regimes x 3 strategies, ~11 min
    python benchmarks/pipeline_speedup.py --regimes long_tail --strategies both v1_colocate_async
    python benchmarks/pipeline_speedup.py --quick --disable-pipeline   # must FAIL: nothing overlaps

Writes ``bench_out/pipeline_speedup.json`` and ``bench_out/timeline_<regime>_<strategy>.png``.
"""

from __future__ import annotations

from async_reward_bench.speedup import main

if __name__ == "__main__":
    raise SystemExit(main())
