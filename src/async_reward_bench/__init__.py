"""The benchmark simulator and the toy task of async-reward: tools, not the library.

``async-reward bench`` (``async_reward_bench.speedup``) measures the pipelined trainer's schedules
against a slow, bounded local judge (the verl v1 bench trainer and agent loop included);
``async_reward_bench.toy`` is a tiny torch policy learning single-digit addition with GRPO, for
end-to-end learning-parity checks (``benchmarks/toy_grpo.py``).

A top-level package of its own, beside ``async_reward`` in the same wheel, so the library never
imports it (``tests/project/test_package_structure.py`` checks both): ``async-reward bench`` and the scripts
under ``benchmarks/`` import it, the CLI only when the command runs. Importing this package is cheap:
torch, verl and Ray are imported by the functions that need them.
"""

from __future__ import annotations

__all__: list[str] = []
