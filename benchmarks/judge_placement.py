"""Which placement for a judge served in the job: colocated on the 8 training GPUs, or standalone on
k = 1, 2 of them, under verl's v1 trainers, our v1 ``pipelined`` mode and legacy ``both``.

A thin script over ``async_reward_bench.placement_bench``::

    python benchmarks/judge_placement.py                       # judges 1x and 4x, ~22 min on 2 cores
    python benchmarks/judge_placement.py --judge-tokens 1 --judge-gpus 1 --strategies v1_sync both

Writes ``bench_out/judge_placement.json``; the model and the numbers: ``docs/judge-in-job.md``.
"""

from __future__ import annotations

from async_reward_bench.placement_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
