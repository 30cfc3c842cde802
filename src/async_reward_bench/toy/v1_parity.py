"""Learning parity through verl's v1 trainer: v1 ``sync`` against ``trainer_mode=pipelined``, paired by seed.

The toy GRPO task of :mod:`async_reward_bench.toy.parity` (a
:class:`~async_reward_bench.toy.policy.TinyPolicy` learning ``a+b=``), trained by verl's real v1
``PPOTrainer.fit``: its agent loop, TransferQueue,
replay buffer, ``RewardLoopManager`` with our ``llm_judge`` manager in its Ray workers (HTTP to the
dev judge server in a child process, with per-request latency), verl's advantage and rollout
correction code. Only the GPU parts are stand-ins, and they do the real thing for the toy
(:mod:`async_reward_bench.toy.v1_policy`): the token server samples from the weights of the version the
trainer last synced, the actor trains the policy with verl's policy loss.

Modes (:data:`MODES`): ``sync`` (verl's v1 ``sync`` trainer with our agent loop and replay buffer:
the reference), ``both`` (``trainer_mode=pipelined``, mini-batch + one-step off-policy) and
``both_is`` (``both`` with verl's rollout correction: token-level truncated importance weights,
``algorithm.rollout_correction.rollout_is=token``, capped at ``rollout_is_threshold``,
:attr:`V1ParityConfig.is_threshold`), ``both_stale2`` (``both`` at ``max_staleness=2``) and
``both_fill`` (the same with ``fill_rollout_tail_at=0.5``; neither in the default modes, ask for them
with ``--modes``), and
``sync_group`` / ``both_group`` (``sync`` / ``both`` with the judge grading each GRPO group in one
call, ``judge.mode=group``: issue 29's learning with group judging against pointwise; ask for them),
and ``rule`` / ``rule_judge`` (issue 45, on ``sync``: the toy's rule alone as ``async_naive``, against
``async_composite`` of that rule and a judge asked only where the rule scored 1, grading what the rule
does not see; ask for them: ``--modes rule rule_judge``).
Every mode of a seed starts from the same policy and trains on the same prompts in the same order.

Accuracy (greedy, every problem, the judge's rule applied locally) is measured before the first step
and after every ``eval_every`` steps, when the trainer syncs weights; its time is taken off the wall
clock. The summary is :func:`~async_reward_bench.toy.parity_report.summarize_parity`'s (within-noise rule)
plus paired-by-seed t statistics (:func:`paired_comparisons`), per step and at equal wall time.

Longer than 400 lines: one experiment end to end (its settings, verl's overrides, the Ray
environment it starts and tears down, one run, the paired comparison and its report), read in one
place; the stand-ins for the GPU parts are :mod:`async_reward_bench.toy.v1_policy`.
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
from async_reward_bench.toy.parity import add_task_arguments
from async_reward_bench.toy.parity_report import format_summary, plot_parity, summarize_parity

__all__ = ["MODES", "QUICK", "V1ParityConfig", "main", "paired_comparisons", "run_v1_parity"]

#: Mode name -> the verl overrides that select it (reward and size settings are common to all).
MODES: dict[str, tuple[str, ...]] = {
    "sync": ("trainer.v1.trainer_mode=sync",),
    "both": (
        "trainer.v1.trainer_mode=pipelined",
        "+trainer.v1.pipelined.mini_batch=true",
        "+trainer.v1.pipelined.max_staleness=1",
    ),
    "both_is": (
        "trainer.v1.trainer_mode=pipelined",
        "+trainer.v1.pipelined.mini_batch=true",
        "+trainer.v1.pipelined.max_staleness=1",
        "algorithm.rollout_correction.rollout_is=token",
    ),
    # Staleness 2 (issue 28, item 6): the batches of the next two steps generate together and each
    # step trains the first groups generated across them, at most two policy versions behind.
    "both_stale2": (
        "trainer.v1.trainer_mode=pipelined",
        "+trainer.v1.pipelined.mini_batch=true",
        "+trainer.v1.pipelined.max_staleness=2",
    ),
    # The same, the batch after next starting once the next one is half gathered.
    "both_fill": (
        "trainer.v1.trainer_mode=pipelined",
        "+trainer.v1.pipelined.mini_batch=true",
        "+trainer.v1.pipelined.fill_rollout_tail_at=0.5",
    ),
}
#: Group judging (issue 29): the judge grades each GRPO group in one call; ``sync`` and ``both``
#: otherwise. Our agent loop routes a group's sessions to one reward worker by ``uid``.
GROUP_JUDGING = ("+reward.async_reward.judge.mode=group", "+reward.async_reward.judge.group_wait_s=120")
MODES["sync_group"] = (*MODES["sync"], *GROUP_JUDGING)
MODES["both_group"] = (*MODES["both"], *GROUP_JUDGING)
#: Issue 45's rewards, on ``sync``. The toy's rule as a verl reward function in ``async_naive``, no
#: judge call (``rule``); and ``async_composite``: that rule plus half a judge's verdict, the judge
#: (``llm_judge``, the dev server over HTTP) asked only where the rule scored 1 (``rule_judge``). The
#: judge grades what the rule does not see: a right answer that also writes a stray ``+`` or ``=``
#: (``"7="``, ``"+7"``: final number 7, right for the rule; ``task.STRAY_SYMBOLS``). Two negative
#: ``must_have`` criteria the dev server grades by the quoted symbol, so a right bare answer scores
#: 1.5, a right one with a stray symbol 1.0, a wrong one 0 with its judge ``skipped``.
RULE_FUNCTION = (
    "reward.custom_reward_function.path=pkg://async_reward_bench.toy.task",
    "reward.custom_reward_function.name=compute_score",
)
GATED_JUDGE = (
    "+reward.async_reward.composite.components=[{name:rule,manager:async_naive},"
    "{name:judge,manager:llm_judge,weight:0.5,only_if:{component:rule,score_at_least:1},"
    "async_reward:{judge:{criteria:["
    "{name:writes_plus,description:\"The response writes the symbol '+'\",polarity:negative,must_have:true},"
    "{name:writes_equals,description:\"The response writes the symbol '='\",polarity:negative,must_have:true}"
    "]}}}]"
)
MODES["rule"] = (*MODES["sync"], "reward.reward_manager.name=async_naive", *RULE_FUNCTION)
MODES["rule_judge"] = (
    *MODES["sync"],
    "reward.reward_manager.name=async_composite",
    *RULE_FUNCTION,
    GATED_JUDGE,
)
#: Modes on verl's own ``sync`` trainer (with our v1 lines), the others on our pipelined mode.
SYNC_MODES = ("sync", "sync_group", "rule", "rule_judge")
#: Modes whose reward manager reads no ``judge`` section (``async_naive``, which refuses one): their
#: overrides leave out the judge's URL the other modes share.
UNJUDGED_MODES = ("rule",)


@dataclass
class V1ParityConfig:
    """One v1 parity run: every mode x every seed."""

    modes: tuple[str, ...] = ("sync", "both", "both_is")
    """Modes to compare (:data:`MODES`); the first is the reference."""
    seeds: tuple[int, ...] = tuple(range(8))
    """Seeds of the policy initialisation, the prompts and the sampling."""
    steps: int = 30
    """Training steps per run."""
    max_operand: int = 4
    """Problems ``a+b=`` with ``a, b`` in ``0..max_operand`` (25 problems with 4, one-digit answers:
    smaller than the legacy benchmark's 5, to learn within this benchmark's budget of steps)."""
    prompts: int = 16
    """Prompts per step (``data.train_batch_size``)."""
    group_size: int = 8
    """Responses per prompt (``actor_rollout_ref.rollout.n``, the GRPO group)."""
    mini_batches: int = 4
    """Optimizer updates per step (``train_batch_size // ppo_mini_batch_size``)."""
    lr: float = 1e-2
    """Adam learning rate."""
    entropy_coeff: float = 0.1
    """Entropy bonus (``actor.entropy_coeff``), as in the legacy parity benchmark."""
    is_threshold: float = 2.0
    """``algorithm.rollout_correction.rollout_is_threshold`` of the ``both_is`` mode (verl's default)."""
    hidden_size: int = 64
    """TinyPolicy width."""
    eval_every: int = 5
    """Steps between accuracy measurements (also measured before the first step)."""
    latency_ms: tuple[float, float] = (50.0, 400.0)
    """Judge latency per request, uniform in this range."""
    num_workers: int = 2
    """Ray reward workers (``reward.num_workers``)."""
    worker_concurrency: int = 256
    """Samples each worker scores at once (``limits.max_concurrency``)."""
    tolerance: float = 0.05
    """Smallest accuracy difference called a difference, whatever the seed spread."""
    out_dir: Path = field(default_factory=lambda: Path("bench_out"))
    """Where ``toy_grpo_v1.json`` (and ``.png``) go."""
    plots: bool = True
    """Write the accuracy plot."""
    progress: bool = True
    """Show a progress bar."""

    def validate(self) -> None:
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes:
            raise ValueError(f"modes must be among {list(MODES)}, got {list(self.modes)}")
        if not self.seeds:
            raise ValueError("need at least one seed")
        if min(self.steps, self.prompts, self.group_size, self.mini_batches, self.eval_every) < 1:
            raise ValueError("steps, prompts, group size, mini-batches and eval_every must be >= 1")
        if self.prompts % self.mini_batches:
            raise ValueError(f"{self.prompts} prompts cannot be split into {self.mini_batches} mini-batches")


#: ``--quick``: one seed, few steps, the small problem set, one reward worker.
QUICK: dict[str, Any] = {"seeds": (0,), "steps": 6, "eval_every": 3, "num_workers": 1}


def _overrides(cfg: V1ParityConfig, mode: str, model_dir: Path, dataset: str, url: str) -> list[str]:
    from async_reward.v1 import V1_OVERRIDES
    from async_reward.wiring.integration import SETUP_HOOK
    from async_reward_bench.toy.task import ArithmeticTask

    response_length = ArithmeticTask(max_operand=cfg.max_operand).max_response_tokens
    common = [
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.n={cfg.group_size}",
        "actor_rollout_ref.rollout.prompt_length=8",
        f"actor_rollout_ref.rollout.response_length={response_length}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={cfg.prompts // cfg.mini_batches}",
        f"actor_rollout_ref.actor.optim.lr={cfg.lr}",
        f"actor_rollout_ref.actor.entropy_coeff={cfg.entropy_coeff}",
        "algorithm.adv_estimator=grpo",
        f"algorithm.rollout_correction.rollout_is_threshold={cfg.is_threshold}",
        f"data.train_files={dataset}",
        f"data.val_files={dataset}",
        f"data.train_batch_size={cfg.prompts}",
        "data.max_prompt_length=8",
        f"data.max_response_length={response_length}",
        "data.dataloader_num_workers=0",
        "data.shuffle=false",
        "reward.reward_manager.name=llm_judge",
        f"reward.num_workers={cfg.num_workers}",
        *(() if mode in UNJUDGED_MODES else (f"+reward.async_reward.judge.base_url={url.rstrip('/')}/v1",)),
        f"+reward.async_reward.limits.max_concurrency={cfg.worker_concurrency}",
        "+reward.async_reward.timeout_s=60",
        f"trainer.total_training_steps={cfg.steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.n_gpus_per_node=1",
        "trainer.logger=[file]",
    ]
    if mode in SYNC_MODES:
        return [*common, *V1_OVERRIDES, *MODES[mode]]
    return [
        *common,
        f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}",
        *MODES[mode],
    ]


def compose(overrides: list[str]) -> Any:
    """verl's ``ppo_trainer`` config composed by hydra from command-line overrides, as ``main_ppo``."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = str(Path(str(verl.__file__)).parent / "trainer" / "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = hydra_compose(config_name="ppo_trainer", overrides=overrides)
    GlobalHydra.instance().clear()
    return config


# -- environment: Ray, TransferQueue, judge server, token server, reward workers ----------------------


@contextlib.contextmanager
def environment(cfg: V1ParityConfig) -> Iterator[dict[str, Any]]:
    """Everything the runs share: started once, torn down at the end."""
    import ray
    import transfer_queue as tq
    from verl.workers.rollout.router import get_router_handle

    import async_reward.v1.pipelined.trainer  # noqa: F401  (registers the mode in this process)
    from async_reward.tools.devserver import ServerProcess
    from async_reward.wiring.integration import init_local_ray
    from async_reward_bench.toy.task import ArithmeticTask
    from async_reward_bench.toy.v1_policy import PolicyServer, build_toy_model_dir

    for key, value in (("TOKENIZERS_PARALLELISM", "false"), ("RAY_USAGE_STATS_ENABLED", "0")):
        os.environ.setdefault(key, value)
    with contextlib.ExitStack() as stack:
        directory = Path(tempfile.mkdtemp(prefix="async-reward-toy-v1-"))
        stack.callback(shutil.rmtree, directory, ignore_errors=True)
        model_dir = directory / "model"
        tokenizer = build_toy_model_dir(model_dir)
        server = stack.enter_context(
            ServerProcess("--latency-ms", str(cfg.latency_ms[0]), str(cfg.latency_ms[1]))
        )
        if init_local_ray(num_cpus=8):
            stack.callback(ray.shutdown)
        if _open_transfer_queue():
            stack.callback(tq.close)
        server_cls: Any = PolicyServer  # a Ray actor class
        policy_server = server_cls.remote(
            len(tokenizer),
            cfg.hidden_size,
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
            ArithmeticTask(max_operand=cfg.max_operand).max_response_tokens,
        )
        stack.callback(ray.kill, policy_server, no_restart=True)
        load_balancer = get_router_handle(servers={"toy-0": policy_server})
        stack.callback(ray.kill, load_balancer, no_restart=True)
        yield {
            "tokenizer": tokenizer,
            "model_dir": model_dir,
            "directory": directory,
            "url": server.url,
            "judge": server,
            "server": policy_server,
            "load_balancer": load_balancer,
        }


# -- one run ------------------------------------------------------------------------------------------


def run_one(
    cfg: V1ParityConfig, env: dict[str, Any], mode: str, seed: int, bar: Any = None
) -> dict[str, Any]:
    """Train one (mode, seed) through verl's v1 ``fit``; returns its curve, times and counts."""
    import ray
    import torch
    from omegaconf import OmegaConf, open_dict
    from verl.experimental.reward_loop import RewardLoopManager
    from verl.trainer.main_ppo import TaskRunnerV1
    from verl.trainer.ppo.v1 import get_trainer_cls

    from async_reward_bench.toy.backend import evaluate_accuracy, expected_scores
    from async_reward_bench.toy.policy import TinyPolicy
    from async_reward_bench.toy.task import ArithmeticTask, exact_match, is_bare
    from async_reward_bench.toy.v1_policy import (
        PolicyActor,
        PolicyServerManager,
        PolicyWeightSync,
        write_toy_dataset,
    )

    task = ArithmeticTask(max_operand=cfg.max_operand)
    tokenizer = env["tokenizer"]
    run_dir = Path(tempfile.mkdtemp(prefix=f"{mode}-{seed}-", dir=env["directory"]))
    dataset = write_toy_dataset(run_dir / "train.parquet", task, (cfg.steps + 2) * cfg.prompts, seed)
    config = compose(_overrides(cfg, mode, env["model_dir"], dataset, env["url"]))
    with open_dict(config):
        config.transfer_queue.enable = True
    OmegaConf.resolve(config)

    policy = TinyPolicy(len(tokenizer), cfg.hidden_size, seed=seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    rollout_is = mode == "both_is"
    actor = PolicyActor(policy, optimizer, config.actor_rollout_ref.actor, rollout_is=rollout_is)
    curve: list[dict[str, float]] = []
    clock = {"start": 0.0, "eval_s": 0.0, "shown": 0}
    temperature = float(config.actor_rollout_ref.rollout.temperature)  # what the token server samples at

    def on_sync(version: int) -> None:
        # version 0: the initial sync (on_init_end), before fit; the clock starts when fit does
        now = time.perf_counter()
        if version % cfg.eval_every and version != cfg.steps:
            return
        accuracy = evaluate_accuracy(policy, task, tokenizer)
        # right, and right and bare (what rule_judge's reward asks for beyond the rule, task.is_bare),
        # from one enumeration of the responses
        score, bare = expected_scores(
            policy,
            task,
            tokenizer,
            temperature=temperature,
            accepts=(exact_match, lambda text, truth: exact_match(text, truth) and is_bare(text)),
        )
        wall = now - clock["start"] - clock["eval_s"] if version else 0.0
        curve.append(
            {
                "step": version,
                "wall_s": wall,
                "accuracy": accuracy,
                "expected_score": score,
                "expected_bare_score": bare,
            }
        )
        if version:
            clock["eval_s"] += time.perf_counter() - now
        if bar is not None:
            bar.update(version - clock["shown"])
            clock["shown"] = version

    ray.get(env["server"].load.remote(policy.state_dict(), 0, seed=seed * 1_000_003))
    sync = PolicyWeightSync(env["server"], actor, on_sync)
    log_path = run_dir / "metrics.jsonl"
    previous_log_path = os.environ.get("VERL_FILE_LOGGER_PATH")
    os.environ["VERL_FILE_LOGGER_PATH"] = str(log_path)
    runner: Any = type("Runner", (), {})()
    runner.config, runner.trainer, runner.agent_loop_manager = config, None, None
    reward_loop = None
    try:
        trainer: Any = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
        replay_buffer = getattr(trainer.replay_buffer, "_builtin", trainer.replay_buffer)
        replay_buffer.poll_interval = 0.05  # verl's sampler polls TransferQueue every 2 s by default
        trainer._init_tokenizer()
        trainer._init_dataloader()
        trainer._init_dump_executor()
        trainer._init_resource_pool_mgr()
        trainer.actor_rollout_wg = actor
        trainer.ref_in_actor = False
        reward_loop = trainer.reward_loop_manager = RewardLoopManager(config=config)
        trainer.teacher_model_manager = None
        trainer.distillation_config = None
        trainer.llm_server_manager = PolicyServerManager(config, env["load_balancer"])
        trainer.checkpoint_manager = sync
        trainer._load_checkpoint()
        _warm_up(reward_loop, env)
        trainer.on_init_end()
        runner.trainer = trainer
        task_runner: Any = TaskRunnerV1  # verl's Ray actor class; its method runs on our runner
        task_runner.__ray_actor_class__.init_agent_loop_manager(runner)
        if env.get("judge") is not None:
            env["judge"].reset()  # the judge's own counts of this run's calls and tokens
        clock["start"], clock["eval_s"] = time.perf_counter(), 0.0
        trainer.fit(runner.agent_loop_manager)
        total = time.perf_counter() - clock["start"] - clock["eval_s"]
        trainer.logger.finish()
    finally:
        if previous_log_path is None:
            os.environ.pop("VERL_FILE_LOGGER_PATH", None)
        else:
            os.environ["VERL_FILE_LOGGER_PATH"] = previous_log_path
        _kill_and_wait(getattr(runner.agent_loop_manager, "agent_loop_workers", []))
        if reward_loop is not None:
            _kill_and_wait(list(reward_loop.reward_loop_workers))
            _wait_for_names_free(len(reward_loop.reward_loop_workers))
        _clear_partition("train")
    logged = [json.loads(line)["data"] for line in log_path.read_text().splitlines() if line.strip()]
    steps = [m for m in logged if "training/global_step" in m]
    served = ray.get(env["server"].served_by_version.remote())
    judge_stats = env["judge"].stats() if env.get("judge") is not None else {}
    return {
        "mode": mode,
        "seed": seed,
        "curve": curve,
        "final_accuracy": curve[-1]["accuracy"],
        "mean_accuracy": float(np.mean([point["accuracy"] for point in curve[1:]])),
        "expected_score": [point["expected_score"] for point in curve],
        "expected_bare_score": [point["expected_bare_score"] for point in curve],
        "train_score": [m.get("critic/score/mean", float("nan")) for m in steps],
        "staleness": [m.get("off_policy/staleness", 0.0) for m in steps],
        "reward_blocked_s": float(sum(m.get("timing_s/reward_blocked", 0.0) for m in steps)),
        # at max_staleness >= 2: 1 where the next batch was chosen ahead, 0 in its own rollout
        # (async_reward.v1.pipelined.choice); NaN in the modes that do not choose and on the last step
        "next_batch_chosen_ahead": [m.get("pipeline/next_batch_chosen_ahead", float("nan")) for m in steps],
        "is_weights_mean": [m.get("rollout_corr/rollout_is_mean", float("nan")) for m in steps],
        # members listed per judge call (group judging: the group size; 0 when not logged: pointwise)
        "judge_group_size": [m.get("reward/extra/judge_group_size/mean", 0.0) for m in steps],
        # the judge server's own counts over the run (every mode but rule calls it)
        "judge_requests": int(judge_stats.get("requests_by_path", {}).get("/v1/chat/completions", 0)),
        "judge_server_tokens": int(judge_stats.get("tokens_total", 0)),
        # per step, as the run logged them: the tokens its judge calls spent (reward/cost/tokens), and
        # rule_judge's share of samples whose judge the gate skipped and the judge's mean score where asked
        "cost_tokens": [m.get("reward/cost/tokens", 0.0) for m in steps],
        "judge_skipped": [m.get("reward/extra/composite_judge_skipped/mean", float("nan")) for m in steps],
        "judge_score": [m.get("reward/extra/composite_judge_score/mean", float("nan")) for m in steps],
        "total_time_s": total,
        "step_time_s": total / cfg.steps,
        "actor_s": actor.update_s,
        "optimizer_steps": actor.optimizer_steps,
        "trained_rows": len(actor.trained_keys),
        "distinct_trained_rows": len(set(actor.trained_keys)),
        "sampled_by_version": {str(k): v for k, v in sorted(served.items())},
        "synced_versions": sync.versions,
    }


def _open_transfer_queue() -> bool:
    """Attach to the cluster's TransferQueue, starting one only if none runs; True when this call
    started it (and so must close it). A caller that already runs one (a test session, a job) keeps
    it: closing a TransferQueue this run only attached to would kill the caller's controller and
    leave its client pointing at nothing."""
    import ray
    import transfer_queue as tq

    try:
        ray.get_actor("TransferQueueController", namespace="transfer_queue")
    except ValueError:
        tq.init({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}})
        return True
    tq.init()
    return False


def _warm_up(reward_loop: Any, env: dict[str, Any]) -> None:
    """Wait until every reward worker answers: their start-up is not a mode's cost."""
    import ray

    ray.get([worker.__ray_ready__.remote() for worker in reward_loop.reward_loop_workers])


def _kill_and_wait(actors: list[Any], timeout_s: float = 30.0) -> None:
    """Kill actors and return once each is gone (``ray.kill`` only sends the request)."""
    import ray

    for handle in actors:
        ray.kill(handle, no_restart=True)
    deadline = time.monotonic() + timeout_s
    for handle in actors:
        while time.monotonic() < deadline:
            try:
                ray.get(handle.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                break
            time.sleep(0.05)


def _wait_for_names_free(workers: int, timeout_s: float = 30.0) -> None:
    """Wait until verl's named reward workers are gone, so the next run can create them again."""
    import ray

    deadline = time.monotonic() + timeout_s
    for i in range(workers):
        while time.monotonic() < deadline:
            try:
                ray.get_actor(f"reward_loop_worker_{i}")
            except ValueError:
                break
            time.sleep(0.1)


def _clear_partition(partition_id: str) -> None:
    """Drop every key of a TransferQueue partition (what an async run left in flight)."""
    import transfer_queue as tq

    listing = tq.kv_list(partition_id) or {}
    keys = list(listing.get(partition_id, {}))
    if keys:
        tq.kv_clear(keys=keys, partition_id=partition_id)


# -- statistics ---------------------------------------------------------------------------------------


def _accuracy_at(curve: list[dict[str, float]], wall_s: float) -> float:
    """The accuracy last measured at or before ``wall_s`` seconds of training."""
    reached = [point["accuracy"] for point in curve if point["wall_s"] <= wall_s + 1e-9]
    return reached[-1] if reached else curve[0]["accuracy"]


def _paired(differences: list[float]) -> dict[str, float]:
    d = np.asarray(differences, dtype=float)
    n = len(d)
    std = float(d.std(ddof=1)) if n > 1 else 0.0
    t = float(d.mean() / (std / np.sqrt(n))) if n > 1 and std > 0 else float("nan")
    return {"mean_difference": float(d.mean()), "std": std, "t": t, "n": n}


def paired_comparisons(runs: list[dict[str, Any]], modes: tuple[str, ...]) -> dict[str, Any]:
    """Each mode against the first, paired by seed: the per-seed difference of final and mean
    accuracy (per step), of the final expected score and expected right-and-bare score (exact, at
    the sampling temperature), and of accuracy at equal wall time (the slower run's accuracy when the
    faster of the two finished, each seed's pair on its own clock), with the paired t statistic
    ``mean / (std / sqrt(n))`` of each (NaN with one seed)."""
    by = {(run["mode"], run["seed"]): run for run in runs}
    reference = modes[0]
    out: dict[str, Any] = {}
    for mode in modes[1:]:
        seeds = sorted(seed for m, seed in by if m == mode and (reference, seed) in by)
        pairs = [(by[(reference, s)], by[(mode, s)]) for s in seeds]
        at_equal_time = []
        for ref, other in pairs:
            horizon = min(ref["total_time_s"], other["total_time_s"])
            at_equal_time.append(_accuracy_at(other["curve"], horizon) - _accuracy_at(ref["curve"], horizon))
        out[mode] = {
            "seeds": seeds,
            "final_accuracy": _paired([o["final_accuracy"] - r["final_accuracy"] for r, o in pairs]),
            "mean_accuracy": _paired([o["mean_accuracy"] - r["mean_accuracy"] for r, o in pairs]),
            "final_expected_score": _paired(
                [o["expected_score"][-1] - r["expected_score"][-1] for r, o in pairs]
            ),
            "final_expected_bare_score": _paired(
                [o["expected_bare_score"][-1] - r["expected_bare_score"][-1] for r, o in pairs]
            ),
            "accuracy_at_equal_wall_time": _paired(at_equal_time),
            "step_time_ratio": _paired([o["step_time_s"] / r["step_time_s"] for r, o in pairs]),
        }
    return out


def format_judging(runs: list[dict[str, Any]], modes: tuple[str, ...], steps: int) -> str:
    """Per mode, mean over seeds: judge calls and tokens a step (the judge server's counts), and the
    final expected score and expected right-and-bare score."""
    lines = [
        f"{'mode':<12} {'judge calls/step':>16} {'judge tokens/step':>17} {'expected score':>14} "
        f"{'right and bare':>14}"
    ]
    for mode in modes:
        mine = [run for run in runs if run["mode"] == mode]
        if not mine:
            continue
        calls = np.mean([run.get("judge_requests", 0) / steps for run in mine])
        tokens = np.mean([run.get("judge_server_tokens", 0) / steps for run in mine])
        score = np.mean([run["expected_score"][-1] for run in mine])
        bare = np.mean([run["expected_bare_score"][-1] for run in mine])
        lines.append(f"{mode:<12} {calls:>16.1f} {tokens:>17.1f} {score:>14.3f} {bare:>14.3f}")
    return "\n".join(lines)


def format_paired(paired: dict[str, Any], reference: str) -> str:
    """The paired-by-seed lines of the summary."""
    lines = []
    for mode, c in paired.items():
        keys = ("final_accuracy", "mean_accuracy", "final_expected_score", "final_expected_bare_score")
        for key in (*keys, "accuracy_at_equal_wall_time"):
            v = c[key]
            lines.append(
                f"{mode} - {reference}, {key} paired by seed: {v['mean_difference']:+.3f} "
                f"(sd {v['std']:.3f}, t = {v['t']:+.2f}, n = {v['n']})"
            )
        ratio = c["step_time_ratio"]["mean_difference"]
        lines.append(f"{mode} / {reference} step time: {ratio:.2f}x")
    return "\n".join(lines)


# -- driver -------------------------------------------------------------------------------------------


def run_v1_parity(cfg: V1ParityConfig) -> dict[str, Any]:
    """Run every (seed, mode); write ``toy_grpo_v1.json`` (and ``.png``) to ``cfg.out_dir``."""
    import torch

    from async_reward._core.progress import progress_bar

    cfg.validate()
    started = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the model is tiny; Ray workers share the machine's cores
    runs: list[dict[str, Any]] = []
    bar = progress_bar(len(cfg.seeds) * len(cfg.modes) * cfg.steps, unit="step", enabled=cfg.progress)
    try:
        with bar, environment(cfg) as env:
            setup_s = time.perf_counter() - started
            for seed in cfg.seeds:  # modes interleaved per seed, so machine drift hits all alike
                for mode in cfg.modes:
                    bar.set_description(f"seed {seed} {mode}")
                    runs.append(run_one(cfg, env, mode, seed, bar))
                    _write(cfg, runs, setup_s, started)  # a partial file survives an interrupted run
    finally:
        torch.set_num_threads(threads)
    results = _write(cfg, runs, setup_s, started)
    if cfg.plots:
        title = (
            f"TinyPolicy GRPO on a+b (0..{cfg.max_operand}) through verl v1 fit: "
            f"{cfg.prompts}x{cfg.group_size} samples/step, {cfg.mini_batches} mini-batches, "
            f"judge latency {cfg.latency_ms[0]:g}-{cfg.latency_ms[1]:g} ms"
        )
        plot_parity(cfg.out_dir / "toy_grpo_v1.png", runs, cfg.modes, title)
    return results


def _write(cfg: V1ParityConfig, runs: list[dict[str, Any]], setup_s: float, started: float) -> dict[str, Any]:
    modes = tuple(m for m in cfg.modes if any(run["mode"] == m for run in runs))
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(cfg).items()}
    results = {
        "config": config,
        "modes": {mode: list(MODES[mode]) for mode in cfg.modes},
        "task": f"a+b= with a, b in 0..{cfg.max_operand}, greedy exact match on all problems",
        "within_noise_rule": "|mean difference| <= max(2 x larger seed std, tolerance)",
        "runs": runs,
        "summary": summarize_parity(runs, modes, cfg.tolerance),
        "paired": paired_comparisons(runs, modes),
        "setup_s": setup_s,
        "wall_time_s": time.perf_counter() - started,
    }
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    (cfg.out_dir / "toy_grpo_v1.json").write_text(json.dumps(results, indent=2, allow_nan=True) + "\n")
    return results


def configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    defaults = V1ParityConfig()
    parser.description = __doc__.split("\n\n")[0] if __doc__ else None
    parser.add_argument("--quick", action="store_true", help=f"one seed, few steps: {QUICK}")
    parser.add_argument("--modes", nargs="+", help=f"modes among {list(MODES)} (default {defaults.modes})")
    add_task_arguments(parser, defaults)
    parser.add_argument(
        "--is-threshold", type=float, help=f"both_is's IS cap (default {defaults.is_threshold})"
    )
    parser.add_argument(
        "--eval-every", type=int, help=f"steps between evaluations (default {defaults.eval_every})"
    )
    parser.add_argument(
        "--latency-ms", nargs=2, type=float, metavar=("LO", "HI"), help="judge latency (default 50 400)"
    )
    parser.add_argument(
        "--num-workers", type=int, help=f"Ray reward workers (default {defaults.num_workers})"
    )
    parser.add_argument("--tolerance", type=float, help=f"accuracy tolerance (default {defaults.tolerance})")
    parser.add_argument("--out", dest="out_dir", type=Path, help="output directory (default bench_out)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None)
    parser.add_argument("--no-plots", dest="plots", action="store_false", default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/toy_grpo_v1.py [options]``; prints the summary, returns the exit code."""
    args = configure_parser(argparse.ArgumentParser(prog="toy_grpo_v1")).parse_args(argv)
    cfg = dataclass_from_flags(V1ParityConfig, args, QUICK if args.quick else None)
    try:
        cfg.validate()
    except ValueError as exc:
        print(f"toy_grpo_v1: {exc}", file=sys.stderr)
        return 2
    results = run_v1_parity(cfg)
    print(f"\n{results['task']}; {cfg.steps} steps, seeds {list(cfg.seeds)}, through verl v1 fit")
    print(format_summary(results["summary"]))
    print(format_paired(results["paired"], cfg.modes[0]))
    print(format_judging(results["runs"], cfg.modes, cfg.steps))
    print(
        f"\nwall time {results['wall_time_s']:.1f} s (setup {results['setup_s']:.1f} s); "
        f"results in {cfg.out_dir / 'toy_grpo_v1.json'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
