"""Learning parity through verl's v1 trainer: v1 sync vs ``trainer_mode=pipelined`` (``both``, and
``both`` with verl's rollout correction), paired by seed. A thin script over
``async_reward_bench.toy.v1_parity``::

    python benchmarks/toy_grpo_v1.py --quick     # one seed, 6 steps per mode
    python benchmarks/toy_grpo_v1.py             # sync, both, both_is; 8 seeds x 30 steps
    python benchmarks/toy_grpo_v1.py --modes rule rule_judge --steps 15  # rule vs rule + gated judge

Writes ``bench_out/toy_grpo_v1.json`` and ``bench_out/toy_grpo_v1.png``.
"""

from __future__ import annotations

from async_reward_bench.toy.v1_parity import main

if __name__ == "__main__":
    raise SystemExit(main())
