"""What the speed-up benchmark runs: the strategies it compares and the regimes it runs them in.

Cheap to import (no torch, verl or Ray): the command line lists these names.

Our own strategies (:data:`OUR_STRATEGIES`) run on the deprecated legacy trainer's reward manager
(``async_reward.legacy``): every name stays known (settings and the pure models take them), but they
are offered, by default and by ``--quick``, only where that package can be imported
(:data:`LEGACY_TRAINER`), so the benchmark's v1 strategies keep working once it is deleted.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from dataclasses import dataclass

from async_reward_bench.calibration import RECIPE_SERVICE, StageMedians
from async_reward_bench.gpu_split import SEPARATE_MODES

__all__ = [
    "DEFAULT_REGIMES",
    "DEFAULT_STRATEGIES",
    "LEGACY_TRAINER",
    "OFFERED_STRATEGIES",
    "OUR_STRATEGIES",
    "REGIMES",
    "SEPARATE_STRATEGIES",
    "STRATEGIES",
    "V1_PIPELINED_SCHEDULES",
    "V1_STRATEGIES",
    "V1_VERL_OVERRIDES",
    "Regime",
    "legacy_trainer_importable",
    "not_offered",
    "regime_latency",
    "regime_stages",
]

#: Our strategies -> ``StepSchedule`` mode, on the legacy trainer's ``PipelinedRewardLoopManager``
#: (offered only with :data:`LEGACY_TRAINER`). ``recipe_style`` is "both" with the recipe's admission:
#: batch k+1's rewards start only when all of batch k's are in (instead of taking the slots batch k
#: leaves free).
OUR_STRATEGIES: dict[str, str] = {
    "baseline": "baseline",
    "mini_batch": "mini_batch",
    "one_step_off": "one_step_off",
    "both": "both",
    "recipe_style": "both",
}
#: Our verl v1 trainer mode (``trainer.v1.trainer_mode=pipelined``) per schedule -> its
#: ``trainer.v1.pipelined`` settings. ``_stale2`` / ``_stale3``: the batches of the next 2 / 3 steps
#: generate together and steps take groups across them (``max_staleness=2`` / ``3``); ``_fill``: the same, the
#: batch after next starting once the next is half gathered (``fill_rollout_tail_at=0.5``).
V1_PIPELINED_SCHEDULES: dict[str, dict[str, bool | int | float]] = {
    "v1_pipelined_baseline": {"mini_batch": False, "max_staleness": 0},
    "v1_pipelined_mini_batch": {"mini_batch": True, "max_staleness": 0},
    "v1_pipelined_one_step_off": {"mini_batch": False, "max_staleness": 1},
    "v1_pipelined_both": {"mini_batch": True, "max_staleness": 1},
    "v1_pipelined_both_stale2": {"mini_batch": True, "max_staleness": 2},
    "v1_pipelined_both_stale3": {"mini_batch": True, "max_staleness": 3},
    "v1_pipelined_both_fill": {"mini_batch": True, "fill_rollout_tail_at": 0.5},
}
#: verl's v1 trainer -> its ``trainer.v1.trainer_mode`` (``benchmark.v1_trainer`` runs them): verl's own
#: modes, and ours in each schedule. ``v1_separate_async`` (verl's) and ``v1_decoupled`` (ours, the
#: same with scoring decoupled from generation) run on standalone rollout GPUs and trainer GPUs
#: (``gpu_split``).
V1_STRATEGIES: dict[str, str] = {
    "v1_sync": "sync",
    "v1_colocate_async": "colocate_async",
    "v1_colocate_async_stale2": "colocate_async",
    **dict.fromkeys(V1_PIPELINED_SCHEDULES, "pipelined"),
    "v1_separate_async": "separate_async",
    "v1_decoupled": "decoupled",
}
#: verl's own settings per v1 strategy, beyond its mode. ``v1_colocate_async_stale2``: verl's
#: ``colocate_async`` held to staleness 2 as our ``max_staleness=2`` is (a trajectory spans at most 3
#: model versions) with verl's dropless rule (``wait``: sampling blocks while a prompt in flight has
#: reached the limit, so it finishes and trains). verl's default (8 versions) lets it run further
#: ahead; ``drop`` would train only the groups that finish in time, so fewer of the longest responses
#: than the other strategies train, which is not the same work.
V1_VERL_OVERRIDES: dict[str, tuple[str, ...]] = {
    "v1_colocate_async_stale2": (
        "trainer.v1.sampler.max_off_policy_threshold=3",
        "trainer.v1.sampler.max_off_policy_strategy=wait",
    ),
}


def legacy_trainer_importable() -> bool:
    """Whether ``async_reward.legacy`` can be imported, asked the way Python's import system would find
    it but without importing it (nor ``async_reward``, whose import loads verl): ``--help`` lists the
    strategies before anything heavy is loaded. A finder that refuses the package counts as absent."""
    if sys.modules.get("async_reward.legacy") is not None:
        return True
    try:
        package = importlib.util.find_spec("async_reward")
        if package is None or package.submodule_search_locations is None:
            return False
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is not None and find_spec("async_reward.legacy", package.submodule_search_locations):
                return True
    except ImportError:
        return False
    return False


#: Whether the deprecated legacy trainer is installed, which :data:`OUR_STRATEGIES` run on.
LEGACY_TRAINER: bool = legacy_trainer_importable()
#: Every strategy the benchmark knows: settings and the pure models (bounds, plans) take any of them.
STRATEGIES: dict[str, str] = {**OUR_STRATEGIES, **V1_STRATEGIES}
#: The strategies this installation can run: ours only with the legacy trainer, verl v1's always.
OFFERED_STRATEGIES: tuple[str, ...] = tuple(
    s for s in STRATEGIES if LEGACY_TRAINER or s not in OUR_STRATEGIES
)


def not_offered(strategies: tuple[str, ...] | list[str]) -> str:
    """Why ``strategies`` cannot run here (``""`` when they can): ours need the legacy trainer."""
    missing = [s for s in strategies if s in STRATEGIES and s not in OFFERED_STRATEGIES]
    if not missing:
        return ""
    return (
        f"{', '.join(missing)} run on the deprecated legacy trainer (async_reward.legacy), which is not "
        f"installed here: choose among {', '.join(OFFERED_STRATEGIES)}"
    )


#: The strategies on standalone rollout GPUs and trainer GPUs (``gpu_split.SEPARATE_MODES``).
SEPARATE_STRATEGIES: tuple[str, ...] = tuple(s for s, mode in V1_STRATEGIES.items() if mode in SEPARATE_MODES)


@dataclass(frozen=True)
class Regime:
    """How loaded the reward service is relative to the GPU, and how the rollout's samples finish."""

    name: str
    reward_to_gpu: float | None
    """Target (reward work / capacity) / GPU work, reached by scaling the judge latency; None keeps
    the recipe's uniform 1-40 s."""
    description: str
    gen_factor: float = 1.0
    """Rollout makespan as a multiple of the recipe's ``gen`` median (39.8 s)."""
    gen_sigma: float = 0.45
    """Log-normal shape of the response lengths, which only the v1 schedules see (they score each
    sample when it finishes; ours score a batch when its rollout returns). 0.45 puts the median
    response at about a quarter of the longest, like GSM8K answers of a few hundred tokens under a
    1024-token cap."""


REGIMES: dict[str, Regime] = {
    "recipe": Regime("recipe", None, "the recipe's judge latency, reward-bound"),
    "balanced": Regime("balanced", 1.0, "latency scaled so reward work / capacity = GPU work"),
    "gpu_bound": Regime("gpu_bound", 0.5, "latency scaled so reward work / capacity = 0.5 x GPU work"),
    "long_tail": Regime(
        "long_tail",
        1.0,
        "long-tailed generation: rollout 4x the recipe's, median response 1/15 of the longest; "
        "reward work / capacity = GPU work",
        gen_factor=4.0,
        gen_sigma=0.9,
    ),
    "long_tail_fast": Regime(
        "long_tail_fast",
        0.1,
        "long-tailed generation as in long_tail, with a fast reward (reward work / capacity = 0.1 x GPU "
        "work, like a rule-based or small-model reward)",
        gen_factor=4.0,
        gen_sigma=0.9,
    ),
}
#: The regimes a default run goes through: every one, the columns of the README's performance table.
DEFAULT_REGIMES: tuple[str, ...] = ("recipe", "balanced", "gpu_bound", "long_tail", "long_tail_fast")
#: The strategies a default run compares: the rows of the README's performance table, in its order
#: (our v1 mode at its default staleness and at ``max_staleness=2``, verl's ``colocate_async``), so
#: that ``async-reward bench`` with no options reproduces that table in about 11 minutes on 2 cores.
#: Every other strategy runs on request (``--strategies ...``); all of them at once take about an hour.
DEFAULT_STRATEGIES: tuple[str, ...] = ("v1_pipelined_both", "v1_pipelined_both_stale2", "v1_colocate_async")


def regime_stages(regime: Regime, stages: StageMedians) -> StageMedians:
    """The calibrated stages with the regime's rollout makespan."""
    return dataclasses.replace(stages, gen_s=stages.gen_s * regime.gen_factor)


def regime_latency(regime: Regime, samples: int, capacity: int, gpu_work_s: float) -> tuple[float, float]:
    """The judge's latency range (recipe seconds) that puts the service at the regime's load."""
    lo, hi = RECIPE_SERVICE.latency_s
    if regime.reward_to_gpu is None:
        return lo, hi
    work = samples * (lo + hi) / 2 / capacity
    factor = regime.reward_to_gpu * gpu_work_s / work
    return lo * factor, hi * factor
