"""Learning parity on CPU: does the faster schedule learn as well as verl's order, step for step?

A :class:`~async_reward_bench.toy.policy.TinyPolicy` learns single-digit addition with GRPO through the
very :class:`~async_reward.training.schedule.StepSchedule` the verl trainer uses, once per (mode,
seed). Rewards take the real path: :class:`~async_reward.legacy.PipelinedRewardLoopManager` built
from verl's composed ``ppo_trainer`` config, its Ray workers running our ``llm_judge`` manager, HTTP
to the dev server (in a child process, with per-request latency so that the schedule matters), whose
judge compares the decoded response's final number with the reference. Accuracy is measured every
``eval_every`` steps on every problem of the task, greedily, with the judge's rule applied locally.
It needs the legacy trainer installed (``async_reward.legacy``, imported when a run starts);
``async_reward_bench.toy.v1_parity`` is the same task on verl v1.

Ray, the server and the reward workers start once; every run starts from a fresh policy seeded by
its seed, and draws the same prompts in every mode. Outputs: ``<out>/toy_grpo.json`` (curves with
step and wall time, final accuracy, total time per mode and seed), ``<out>/toy_grpo.png`` (accuracy
against step and against wall time, mean and spread per mode) and a summary table on stdout; the
statistics, the within-noise rule, the table and the plot are ``async_reward_bench.toy.parity_report``'s.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from async_reward.config import dataclass_from_flags
from async_reward_bench.toy.parity_report import format_summary, plot_parity, summarize_parity

__all__ = ["QUICK", "ParityConfig", "format_summary", "main", "run_parity", "summarize_parity"]


@dataclass
class ParityConfig:
    """One parity run: every mode x every seed."""

    modes: tuple[str, ...] = ("baseline", "both")
    """Schedule modes to compare; the first is the reference."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds of the policy initialisation, the prompts and the sampling."""
    steps: int = 60
    """Training steps per run."""
    max_operand: int = 5
    """Problems ``a+b=`` with ``a, b`` in ``0..max_operand``: 36 problems, answers 0..10. (With 9, the
    full table up to 18, a 64-wide GRU needs ~4x more samples than this benchmark's budget.)"""
    prompts: int = 16
    """Prompts per step."""
    group_size: int = 16
    """Responses per prompt (GRPO group)."""
    mini_batches: int = 4
    """Optimizer updates per step (``train_batch_size // ppo_mini_batch_size``)."""
    lr: float = 1e-2
    """Adam learning rate."""
    entropy_coeff: float = 0.1
    """Entropy bonus (verl's ``actor.entropy_coeff``); without it GRPO collapses onto wrong answers
    whose groups then give no signal."""
    rollout_is_threshold: float | None = None
    """Truncated importance weights for off-policy batches (see ``ToyBackend``); None: plain PPO in
    every mode, so "both" runs one-step-stale batches uncorrected."""
    hidden_size: int = 64
    """TinyPolicy width."""
    eval_every: int = 5
    """Steps between accuracy measurements (also measured before the first step)."""
    latency_ms: tuple[float, float] = (50.0, 400.0)
    """Judge latency per request, uniform in this range."""
    capacity: int | None = None
    """Requests the judge serves at once (None: unlimited)."""
    num_workers: int = 2
    """Ray reward workers (``reward.num_workers``)."""
    worker_concurrency: int = 256
    """Samples each worker scores at once (``limits.max_concurrency``)."""
    tolerance: float = 0.05
    """Smallest accuracy difference called a difference, whatever the seed spread."""
    server_url: str | None = None
    """A running judge server (``http://host:port``); None starts one in a child process."""
    out_dir: Path = field(default_factory=lambda: Path("bench_out"))
    plots: bool = True
    progress: bool = True

    def validate(self) -> None:
        from async_reward.training.schedule import MODES
        from async_reward_bench.scenarios import LEGACY_TRAINER

        if not LEGACY_TRAINER:
            raise ValueError(
                "this benchmark scores with the deprecated legacy trainer's manager (async_reward.legacy), "
                "which is not installed: benchmarks/toy_grpo_v1.py runs the same task on verl v1"
            )
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise ValueError(f"modes must be among {list(MODES)}, got {list(self.modes)}")
        if not self.seeds:
            raise ValueError("need at least one seed")
        if min(self.steps, self.prompts, self.group_size, self.mini_batches, self.eval_every) < 1:
            raise ValueError("steps, prompts, group size, mini-batches and eval_every must be >= 1")
        if self.prompts % self.mini_batches:
            raise ValueError(f"{self.prompts} prompts cannot be split into {self.mini_batches} mini-batches")


#: ``--quick``: one seed, few steps, the small problem set, one reward worker (about 55 s on 2 busy
#: cores, half of it Ray and worker start-up).
QUICK: dict[str, Any] = {"seeds": (0,), "steps": 10, "max_operand": 4, "eval_every": 5, "num_workers": 1}


# -- environment: tokenizer, judge server, Ray, pipelined reward manager ------------------------------


def _verl_config(cfg: ParityConfig, model_dir: Path, server_url: str) -> Any:
    """verl's ``ppo_trainer`` config composed by hydra (as ``main_ppo`` does), set up for ``llm_judge``."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    config_dir = str(Path(str(verl.__file__)).parent / "trainer" / "config")
    GlobalHydra.instance().clear()
    overrides = [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_batch_size={cfg.prompts}",
        f"actor_rollout_ref.rollout.n={cfg.group_size}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={cfg.prompts // cfg.mini_batches}",
        f"actor_rollout_ref.actor.optim.lr={cfg.lr}",
        f"actor_rollout_ref.actor.entropy_coeff={cfg.entropy_coeff}",
        "algorithm.adv_estimator=grpo",
    ]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    GlobalHydra.instance().clear()
    with open_dict(config):
        config.reward.reward_manager.name = "llm_judge"
        config.reward.num_workers = cfg.num_workers
        config.reward.async_reward = {
            "judge": {"base_url": server_url.rstrip("/") + "/v1"},
            "limits": {"max_concurrency": cfg.worker_concurrency},
            "timeout_s": 60.0,
        }
    return config


@contextlib.contextmanager
def _environment(cfg: ParityConfig) -> Iterator[dict[str, Any]]:
    import ray

    from async_reward.legacy import PipelinedRewardLoopManager
    from async_reward.tools.devserver import ServerProcess
    from async_reward.wiring.integration import init_local_ray
    from async_reward_bench.toy.task import build_char_tokenizer

    for key, value in (("TOKENIZERS_PARALLELISM", "false"), ("RAY_USAGE_STATS_ENABLED", "0")):
        os.environ.setdefault(key, value)
    with contextlib.ExitStack() as stack:
        directory = Path(tempfile.mkdtemp(prefix="async-reward-toy-"))
        stack.callback(shutil.rmtree, directory, ignore_errors=True)
        tokenizer = build_char_tokenizer(directory)
        url = cfg.server_url
        if url is None:
            args = ["--latency-ms", str(cfg.latency_ms[0]), str(cfg.latency_ms[1])]
            if cfg.capacity is not None:
                args += ["--capacity", str(cfg.capacity)]
            server = stack.enter_context(ServerProcess(*args))
            url = server.url
        if init_local_ray(num_cpus=max(4, cfg.num_workers + 2)):
            stack.callback(ray.shutdown)
        manager = PipelinedRewardLoopManager(_verl_config(cfg, directory, url))
        stack.callback(manager.close)
        yield {"tokenizer": tokenizer, "manager": manager, "url": url}


# -- one run ------------------------------------------------------------------------------------------


def _run_one(cfg: ParityConfig, env: dict[str, Any], mode: str, seed: int, bar: Any) -> dict[str, Any]:
    import torch

    from async_reward.training.schedule import StepSchedule
    from async_reward_bench.toy.backend import ToyBackend, evaluate_accuracy
    from async_reward_bench.toy.policy import TinyPolicy
    from async_reward_bench.toy.task import ArithmeticTask, PromptSampler

    tokenizer = env["tokenizer"]
    task = ArithmeticTask(max_operand=cfg.max_operand)
    policy = TinyPolicy(len(tokenizer), cfg.hidden_size, seed=seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    sampler = PromptSampler(task, tokenizer, cfg.prompts, cfg.group_size, seed=seed)
    backend = ToyBackend(
        policy,
        optimizer,
        sampler,
        tokenizer,
        entropy_coeff=cfg.entropy_coeff,
        rollout_is_threshold=cfg.rollout_is_threshold,
        seed=seed,
    )
    schedule = StepSchedule(backend, env["manager"], mode, cfg.mini_batches, 120.0, keep_batches=False)
    curve = [{"step": 0, "wall_s": 0.0, "accuracy": evaluate_accuracy(policy, task, tokenizer)}]
    scores, blocked, eval_s = [], 0.0, 0.0
    start = time.perf_counter()
    for record in schedule.steps(cfg.steps):
        scores.append(record.metrics.get("critic/score/mean", float("nan")))
        blocked += record.reward_blocked_s
        done = record.step + 1
        if done % cfg.eval_every == 0 or done == cfg.steps:
            # Evaluation (a few ms) is not training time: it is taken off the wall clock.
            t0 = time.perf_counter()
            wall = t0 - start - eval_s
            accuracy = evaluate_accuracy(policy, task, tokenizer)
            eval_s += time.perf_counter() - t0
            curve.append({"step": done, "wall_s": wall, "accuracy": accuracy})
        bar.update(1)
    total = time.perf_counter() - start - eval_s
    return {
        "mode": mode,
        "seed": seed,
        "curve": curve,
        "final_accuracy": curve[-1]["accuracy"],
        "mean_accuracy": float(np.mean([point["accuracy"] for point in curve[1:]])),
        "train_score": scores,
        "total_time_s": total,
        "step_time_s": total / cfg.steps,
        "reward_blocked_s": blocked,
        "optimizer_steps": backend.optimizer_steps,
    }


# -- driver -------------------------------------------------------------------------------------------


def run_parity(cfg: ParityConfig) -> dict[str, Any]:
    """Run every (seed, mode); write ``toy_grpo.json`` (and ``toy_grpo.png``) to ``cfg.out_dir``."""
    import torch

    from async_reward._core.progress import progress_bar

    cfg.validate()
    started = time.perf_counter()
    threads = torch.get_num_threads()
    # One thread: the model is tiny, and the Ray reward workers share the machine's cores.
    torch.set_num_threads(1)
    runs: list[dict[str, Any]] = []
    bar = progress_bar(len(cfg.seeds) * len(cfg.modes) * cfg.steps, unit="step", enabled=cfg.progress)
    try:
        with bar, _environment(cfg) as env:
            setup_s = time.perf_counter() - started
            _warm_up(env)
            for seed in cfg.seeds:  # modes interleaved per seed, so machine drift hits both alike
                for mode in cfg.modes:
                    bar.set_description(f"seed {seed} {mode}")
                    runs.append(_run_one(cfg, env, mode, seed, bar))
    finally:
        torch.set_num_threads(threads)
    summary = summarize_parity(runs, cfg.modes, cfg.tolerance)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()}
    results = {
        "config": config,
        "task": f"a+b= with a, b in 0..{cfg.max_operand}, greedy exact match on all problems",
        "within_noise_rule": "|mean difference| <= max(2 x larger seed std, tolerance)",
        "runs": runs,
        "summary": summary,
        "setup_s": setup_s,
        "wall_time_s": time.perf_counter() - started,
    }
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    (cfg.out_dir / "toy_grpo.json").write_text(json.dumps(results, indent=2, allow_nan=True) + "\n")
    if cfg.plots:
        title = (
            f"TinyPolicy GRPO on a+b (0..{cfg.max_operand}): {cfg.prompts}x{cfg.group_size} samples/step, "
            f"{cfg.mini_batches} mini-batches, judge latency {cfg.latency_ms[0]:g}-{cfg.latency_ms[1]:g} ms"
        )
        plot_parity(cfg.out_dir / "toy_grpo.png", runs, cfg.modes, title)
    return results


def _warm_up(env: dict[str, Any]) -> None:
    """One batch through the reward path first: worker imports and connections are not a mode's cost."""
    import torch

    from async_reward_bench.toy.backend import ToyBackend
    from async_reward_bench.toy.policy import TinyPolicy
    from async_reward_bench.toy.task import ArithmeticTask, PromptSampler

    tokenizer = env["tokenizer"]
    policy = TinyPolicy(len(tokenizer))
    sampler = PromptSampler(ArithmeticTask(), tokenizer, 8, 4, seed=-1)
    backend = ToyBackend(policy, torch.optim.Adam(policy.parameters()), sampler, tokenizer)
    batch = backend.rollout(0)
    manager = env["manager"]
    manager.get_chunk(manager.submit(batch), len(batch), timeout=120)


def add_task_arguments(parser: argparse.ArgumentParser, defaults: Any) -> None:
    """The toy task's flags, shared by both parity benchmarks (``defaults``: their config dataclass)."""
    parser.add_argument("--seeds", nargs="+", type=int, help=f"seeds (default {defaults.seeds})")
    parser.add_argument("--steps", type=int, help=f"steps per run (default {defaults.steps})")
    parser.add_argument("--max-operand", type=int, help=f"largest operand (default {defaults.max_operand})")
    parser.add_argument("--prompts", type=int, help=f"prompts per step (default {defaults.prompts})")
    parser.add_argument(
        "--group-size", type=int, help=f"responses per prompt (default {defaults.group_size})"
    )
    parser.add_argument(
        "--mini-batches", type=int, help=f"updates per step (default {defaults.mini_batches})"
    )
    parser.add_argument("--lr", type=float, help=f"learning rate (default {defaults.lr})")
    parser.add_argument(
        "--entropy-coeff", type=float, help=f"entropy bonus (default {defaults.entropy_coeff})"
    )


def configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    defaults = ParityConfig()
    parser.description = __doc__.split("\n\n")[0] if __doc__ else None
    parser.add_argument("--quick", action="store_true", help=f"one seed, few steps (under 90 s): {QUICK}")
    parser.add_argument("--modes", nargs="+", help=f"schedule modes (default {' '.join(defaults.modes)})")
    add_task_arguments(parser, defaults)
    parser.add_argument(
        "--rollout-is-threshold", type=float, help="truncated IS weights for stale batches (default off)"
    )
    parser.add_argument(
        "--eval-every", type=int, help=f"steps between evaluations (default {defaults.eval_every})"
    )
    parser.add_argument(
        "--latency-ms", nargs=2, type=float, metavar=("LO", "HI"), help="judge latency (default 50 400)"
    )
    parser.add_argument("--capacity", type=int, help="judge's concurrent requests (default unlimited)")
    parser.add_argument(
        "--num-workers", type=int, help=f"Ray reward workers (default {defaults.num_workers})"
    )
    parser.add_argument("--tolerance", type=float, help=f"accuracy tolerance (default {defaults.tolerance})")
    parser.add_argument("--server-url", help="use this running judge server instead of starting one")
    parser.add_argument("--out", dest="out_dir", type=Path, help="output directory (default bench_out)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None)
    parser.add_argument("--no-plots", dest="plots", action="store_false", default=None)
    return parser


def config_from_args(args: argparse.Namespace) -> ParityConfig:
    return dataclass_from_flags(ParityConfig, args, QUICK if args.quick else None)


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/toy_grpo.py [options]``; prints the summary, returns the exit code."""
    args = configure_parser(argparse.ArgumentParser(prog="toy_grpo")).parse_args(argv)
    cfg = config_from_args(args)
    try:
        cfg.validate()
    except ValueError as exc:
        print(f"toy_grpo: {exc}", file=sys.stderr)
        return 2
    results = run_parity(cfg)
    print(f"\n{results['task']}; {cfg.steps} steps, seeds {list(cfg.seeds)}")
    print(format_summary(results["summary"]))
    print(
        f"\nwall time {results['wall_time_s']:.1f} s (setup {results['setup_s']:.1f} s); "
        f"results in {cfg.out_dir / 'toy_grpo.json'}"
    )
    return 0
