"""Learning parity on CPU: a tiny policy learns single-digit addition with GRPO, baseline vs "both".

A thin script over ``async_reward_bench.toy.parity``::

    python benchmarks/toy_grpo.py --quick     # one seed, 10 steps per mode, about 1 minute
    python benchmarks/toy_grpo.py             # baseline and both, 3 seeds x 60 steps, about 4 minutes

Writes ``bench_out/toy_grpo.json`` and ``bench_out/toy_grpo.png``.
"""

from __future__ import annotations

from async_reward_bench.toy.parity import main

if __name__ == "__main__":
    raise SystemExit(main())
