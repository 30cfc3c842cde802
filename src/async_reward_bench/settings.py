"""Settings of one speed-up benchmark run (``async-reward bench``), and the ``--quick`` preset.

Cheap to import: the command line builds them before anything heavy is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from async_reward_bench.scenarios import (
    DEFAULT_REGIMES,
    DEFAULT_STRATEGIES,
    OFFERED_STRATEGIES,
    OUR_STRATEGIES,
    REGIMES,
    SEPARATE_STRATEGIES,
    STRATEGIES,
)
from async_reward_bench.steady_state import too_short_for

__all__ = ["QUICK", "BenchConfig"]


@dataclass
class BenchConfig:
    """One benchmark run. Times are recipe seconds unless named ``*_real``."""

    prompts: int = 128
    """Prompts per step (the recipe: 1024)."""
    group_size: int = 5
    """Responses per prompt (the recipe: 5)."""
    mini_batches: int = 4
    """Optimizer updates per step (the recipe: 4)."""
    capacity: int = 32
    """Requests the judge serves at once (the recipe: 256 for 1024 prompts)."""
    steps: int = 12
    """Steps per (regime, strategy); see ``report.STEADY_STATE_RULE`` for which are averaged. 12: the
    README table's runs. At staleness 2 the mean is then over steps 3..9 (seven steps); verl's
    ``colocate_async``, which reaches staleness 3-4 with the fast reward, keeps steps 4..8 or 5..7. 10
    steps would leave that one a single step (5..5), and a figure of one step does not reproduce."""
    time_scale: float = 0.02
    """Real seconds per recipe second: 0.02 runs a 585.7 s step in 11.7 s. 0.02, not the faster 0.01:
    the harness's own CPU (verl's trainer code, the reward workers, HTTP) sits on the trainer's path
    and weighs 1/time-scale recipe seconds per second, so at 0.01 a host running 30 % slower moved the
    default mode's figures by up to 6 % between runs; at 0.02 it weighs half as much (issue 46), and a
    default run takes about 20 minutes on 2 cores instead of 11."""
    regimes: tuple[str, ...] = DEFAULT_REGIMES
    """Default: all five, the README performance table's columns."""
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    """Default: the README performance table's rows (``scenarios.DEFAULT_STRATEGIES``, all verl v1
    strategies, so offered without the legacy trainer too); any of ``OFFERED_STRATEGIES`` on request."""
    calibration_run: str = "gsm8k_qwen2_7b_base"
    """CSV row whose stage medians the GPU stages sleep."""
    calibration_csv: str | None = None
    """Calibration CSV (default: the copy shipped with the package)."""
    num_workers: int = 2
    """Ray reward workers (``reward.num_workers``)."""
    server: str = "thread"
    """Where the judge runs: ``thread`` (a thread of this process) or ``process`` (a child process,
    which keeps it off this process's GIL; measured no different here, and slower to start)."""
    worker_concurrency: int | None = None
    """Samples each worker scores at once (``limits.max_concurrency``). None: ``capacity``, so that
    the service, not our admission, is the bottleneck even when one worker holds all the work."""
    rollout_slots: int | None = None
    """Sequences the simulated rollout engine of the v1 strategies decodes at full speed; more
    share its throughput (``generation.GenerationState``). None: one batch (``prompts x group_size``)."""
    total_gpus: int = 8
    """GPUs every strategy runs on (equal total): colocated strategies generate and train on all of
    them, ``v1_separate_async`` splits them into standalone rollout GPUs and trainer GPUs
    (``gpu_split``). The calibration ran on 8; other totals scale every GPU stage linearly, and the
    regimes defined by their reward-to-GPU ratio keep it (their judge latency scales too; the recipe
    regime keeps the recipe's latency)."""
    rollout_gpus: int | None = None
    """Standalone rollout GPUs of the separate strategies (the rest train). None: per regime, the
    integer split minimising their GPU bound (``gpu_split.best_rollout_gpus``). Set without a
    separate strategy, it is refused."""
    weight_sync_s: float = 0.0
    """Recipe seconds one weight push costs a separate strategy, once per step: the trainer waits and
    generation pauses (``on_step_end``'s ``update_weights``). 0: free, as the colocated ``gen``
    median already includes one; 5 is about a 7B NCCL broadcast with abort and resume. Colocated
    strategies have none of their own (theirs is inside the calibrated rollout); set without a
    separate strategy, it is refused."""
    judge_faults: tuple[str, ...] = ()
    """Faults the judge injects, ``KIND=RATE`` as ``async-reward serve --fault`` takes them (e.g.
    ``400=1`` answers every request with an error, which the verdict must then fail)."""
    pipeline: bool = True
    """False (``--disable-pipeline``) runs every one of our strategies with the baseline schedule
    (verl's order) under its own name, through the same reward path: a pipeline that does nothing,
    which the verdict must FAIL at any machine load. For seeing the checks work; v1 strategies are
    unaffected."""
    checks: str = "full"
    """Tolerances of the verdict: ``full`` or ``quick`` (``verdict.FULL_TOLERANCES`` /
    ``QUICK_TOLERANCES``)."""
    seed: int = 0
    """Seed of the judge's latency draws, the batch texts and the v1 response lengths (repeat r: seed + r)."""
    repeats: int = 1
    """Runs of each (regime, strategy), repeat ``r`` with seed ``seed + r``: the table and JSON give
    the mean figure with each run's and the spread ((max - min) / mean) beside it
    (``repeats.combine_repeats``). 2 shows whether each figure reproduces within 2 %."""
    sample_interval_real: float = 0.05
    """Real seconds between samples of the service's in-flight counters (for the timelines)."""
    out_dir: Path = field(default_factory=lambda: Path("bench_out"))
    progress: bool = True
    plots: bool = True

    @property
    def per_worker_concurrency(self) -> int:
        return self.worker_concurrency or self.capacity

    def validate(self) -> None:
        unknown = [r for r in self.regimes if r not in REGIMES] + [
            s for s in self.strategies if s not in STRATEGIES
        ]
        if unknown:
            raise ValueError(f"unknown regime(s)/strategy(ies) {unknown}")
        if min(self.prompts, self.group_size, self.mini_batches, self.capacity, self.steps) < 1:
            raise ValueError("prompts, group size, mini-batches, capacity and steps must be >= 1")
        if self.prompts % self.mini_batches:
            raise ValueError(f"{self.prompts} prompts cannot be split into {self.mini_batches} mini-batches")
        if self.server not in ("process", "thread"):
            raise ValueError(f"server must be 'process' or 'thread', got {self.server!r}")
        if not 0 < self.time_scale <= 1:
            raise ValueError(f"time scale must be in (0, 1], got {self.time_scale}")
        if self.rollout_slots is not None and self.rollout_slots < 1:
            raise ValueError(f"rollout slots must be >= 1, got {self.rollout_slots}")
        if self.total_gpus < 1:
            raise ValueError(f"total GPUs must be >= 1, got {self.total_gpus}")
        separate = [s for s in self.strategies if s in SEPARATE_STRATEGIES]
        if separate and self.total_gpus < 2:
            raise ValueError(f"{separate} need at least 2 GPUs (one rollout, one trainer): set --total-gpus")
        if self.rollout_gpus is not None and not 1 <= self.rollout_gpus < self.total_gpus:
            raise ValueError(
                f"rollout GPUs must be between 1 and total GPUs - 1 ({self.total_gpus - 1}), "
                f"got {self.rollout_gpus}"
            )
        if not self.weight_sync_s >= 0:
            raise ValueError(f"weight sync must be >= 0 s, got {self.weight_sync_s}")
        if not separate and (self.rollout_gpus is not None or self.weight_sync_s > 0):
            raise ValueError(
                "rollout GPUs and weight sync apply to strategies on standalone rollout GPUs "
                f"({', '.join(SEPARATE_STRATEGIES)}); none is selected"
            )
        if self.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {self.repeats}")
        if self.repeats > 1 and self.server != "thread":
            raise ValueError(
                "--repeats above 1 reseeds the judge for each repeat, which a judge in a child process "
                "(--server process) cannot do: use --server thread (the default)"
            )
        short = too_short_for(self.strategies, self.steps)
        if short:
            raise ValueError(short)
        if self.checks not in ("full", "quick"):
            raise ValueError(f"checks must be 'full' or 'quick', got {self.checks!r}")
        from async_reward.tools.devserver import DevServerConfig

        DevServerConfig(fault_rates=self.fault_rates).validate()  # the judge's own rules

    @property
    def fault_rates(self) -> dict[str, float]:
        """``judge_faults`` as the judge's ``fault_rates``."""
        rates: dict[str, float] = {}
        for item in self.judge_faults:
            kind, sep, rate = item.partition("=")
            try:
                rates[kind.strip()] = float(rate)
            except ValueError:
                sep = ""
            if not sep:
                raise ValueError(f"a judge fault is KIND=RATE (e.g. 429=0.01), got {item!r}")
        return rates


#: ``--quick`` (what ``make bench`` runs): the recipe regime, our legacy strategies and our v1 mode's
#: "both" (the headline: the schedule to use, against legacy "both" in the same run; the verdict stays
#: on the legacy strategies, whose structure it checks), half the samples with half the capacity (the
#: same service share), 6 steps (3 measured), a faster clock and the quick verdict's tolerances.
#: 68-84 s on 2 cores at load averages of 3-8 before the v1 mode was added (start-up included),
#: 90-145 s at 10-15. Without the legacy trainer installed: the v1 mode alone, and no verdict.
QUICK: dict[str, Any] = {
    "prompts": 64,
    "capacity": 16,
    "steps": 6,
    "time_scale": 1 / 300,
    "regimes": ("recipe",),
    "strategies": (*(s for s in OUR_STRATEGIES if s in OFFERED_STRATEGIES), "v1_pipelined_both"),
    "checks": "quick",
}
