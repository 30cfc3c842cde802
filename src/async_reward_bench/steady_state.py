"""Which steps of a benchmark run measure the steady state, per the staleness of the strategy.

A schedule that lets batches run ``s`` versions ahead fills its pipeline first (the judge's backlog
grows step by step until ``s`` batches are in flight) and drains it last (the last ``s`` steps roll
out fewer batches than they train). Steps in either phase time something other than the steady
schedule: a fill-up step can borrow nothing from a backlog and a drain step can lean on one built
before it, which is how an 8-step run put a staleness-2 strategy at 0.960x its bound (issue 28).

Cheap to import (the command line refuses short runs before anything heavy is loaded).
"""

from __future__ import annotations

from async_reward_bench.scenarios import OUR_STRATEGIES, V1_PIPELINED_SCHEDULES, V1_STRATEGIES

__all__ = [
    "STEADY_STATE_RULE",
    "min_steady_steps",
    "scheduled_staleness",
    "steady_window",
    "too_short_for",
]

STEADY_STATE_RULE = (
    "mean over steps max(2, s+1)..N-1-max(1, s) for a strategy at staleness s (the most its schedule "
    "allows, or the most its run reached if more): steps 0..s fill the pipeline (batch 0 is scored "
    "alone; each later fill-up step adds a batch to the judge's backlog, which reaches its steady "
    "depth during step s), and the last max(1, s) steps drain it (they roll out fewer batches than "
    "they train); so a run needs 4 steps at staleness 0 or 1, 2s+2 at s >= 2 (refused otherwise). "
    "Runs of 1-3 steps at staleness 0-1 (tests) keep steps 1..N-1, marked steady_state false"
)

#: verl's ``colocate_async`` and ``separate_async`` (and our ``decoupled``, which reads the same
#: setting) start with ``num_warmup_batches: 1`` batch ahead; the separate ones may then run further
#: ahead (up to verl's ``max_off_policy_threshold``, 8) as their rollout outpaces the trainer.
_V1_WARMUP_STALENESS = 1


def scheduled_staleness(strategy: str) -> int:
    """The staleness ``strategy``'s schedule is set up to reach: 0 on-policy, 1 one step off, s for
    ``max_staleness=s``, 2 for ``fill_rollout_tail_at`` (the batch after next generates with the next
    one). A run can reach more (verl's separate mode); ``report.summarize`` then follows what it reached."""
    if strategy in OUR_STRATEGIES:
        return 1 if OUR_STRATEGIES[strategy] in ("one_step_off", "both") else 0
    flags = V1_PIPELINED_SCHEDULES.get(strategy)
    if flags is not None:
        if "max_staleness" in flags:
            return int(flags["max_staleness"])
        return 2 if "fill_rollout_tail_at" in flags else 1  # the mode's default, 2 with the fill
    return 0 if V1_STRATEGIES.get(strategy) == "sync" else _V1_WARMUP_STALENESS


def steady_window(steps: int, staleness: int) -> tuple[int, int] | None:
    """The steady steps ``[first, stop)`` of a run of ``steps`` at ``staleness``; None when it has none."""
    first, stop = max(2, staleness + 1), steps - max(1, staleness)
    return (first, stop) if stop > first else None


def min_steady_steps(staleness: int) -> int:
    """The fewest steps with one steady step at ``staleness``: 4 at 0 or 1, 2s + 2 from 2 on."""
    return max(2, staleness + 1) + max(1, staleness) + 1


def too_short_for(strategies: tuple[str, ...], steps: int) -> str | None:
    """Why ``steps`` leaves some strategy at staleness 2 or more without a steady step (None: none).

    Staleness 0 and 1 keep their short-run fallback (steps 1..N-1, marked ``steady_state: false``),
    which the tiny test runs rely on; a staleness-2 run that short has no step outside its fill-up
    and drain at all."""
    short = {s: scheduled_staleness(s) for s in strategies}
    short = {s: st for s, st in short.items() if st >= 2 and steps < min_steady_steps(st)}
    if not short:
        return None
    needed = max(min_steady_steps(st) for st in short.values())
    named = ", ".join(f"{s} (staleness {st})" for s, st in short.items())
    return (
        f"--steps {steps} leaves no steady-state step for {named}: steps 0..s fill its pipeline and "
        f"the last s drain it; give --steps {needed} or more"
    )
