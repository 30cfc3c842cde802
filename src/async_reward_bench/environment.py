"""The benchmark's environment: tokenizer, judge server, Ray and the reward workers.

Built once per benchmark run (Ray and worker start-up are the slow part) and shared by every
(regime, strategy): between runs only the judge's latency and counters are reset. The legacy
trainer's pipelined reward manager is built (and ``async_reward.legacy`` imported) only when one of
our strategies is selected, so the v1 strategies run without that package.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from async_reward_bench.scenarios import OUR_STRATEGIES, V1_STRATEGIES

if TYPE_CHECKING:
    from async_reward_bench.gpu_split import GpuSplit
    from async_reward_bench.settings import BenchConfig

__all__ = ["bench_environment"]


@contextlib.contextmanager
def bench_environment(cfg: BenchConfig) -> Iterator[dict[str, Any]]:
    """Yield ``{"server", "manager", "factory"}``: the judge (latency 0 until a regime sets it), a
    ``PipelinedRewardLoopManager`` running ``llm_judge`` on ``cfg.num_workers`` Ray workers (only with
    one of our strategies selected: it is the legacy trainer's), and the batch factory. Starts Ray
    unless it is running (and then shuts it down again).

    With a v1 strategy selected it also holds ``"v1_rewards"`` (``cfg.num_workers`` of verl's
    ``RewardLoopWorker`` actors running ``llm_judge``, as verl's v1 trainer creates them) and
    ``"v1_config"``, a function of the v1 strategy (and, for a separate one, its GPU split) giving
    the trainer's verl config."""
    import ray

    from async_reward.testing import build_tiny_tokenizer
    from async_reward.wiring.integration import init_local_ray
    from async_reward_bench.backend import BatchFactory

    for key, value in (
        ("RAY_DEDUP_LOGS", "0"),
        ("TOKENIZERS_PARALLELISM", "false"),
        ("RAY_USAGE_STATS_ENABLED", "0"),
    ):
        os.environ.setdefault(key, value)
    with contextlib.ExitStack() as stack:
        directory = Path(tempfile.mkdtemp(prefix="async-reward-bench-"))
        stack.callback(shutil.rmtree, directory, ignore_errors=True)
        tokenizer = build_tiny_tokenizer(directory)
        server = _start_server(cfg)
        stack.callback(server.stop)
        if init_local_ray(num_cpus=max(4, cfg.num_workers + 2)):
            stack.callback(ray.shutdown)
        factory = BatchFactory(tokenizer, cfg.prompts, cfg.group_size, seed=cfg.seed, tag=-1)
        # Warm-up at zero latency: worker imports, HTTP connections, first-call costs are paid here.
        warm = factory.make(0)
        env: dict[str, Any] = {"server": server, "factory": factory}
        if any(s in OUR_STRATEGIES for s in cfg.strategies):
            from async_reward.legacy import PipelinedRewardLoopManager

            manager = PipelinedRewardLoopManager(
                _verl_config(cfg, directory, server.url), max_concurrency=cfg.per_worker_concurrency
            )
            stack.callback(manager.close)
            manager.get_chunk(manager.submit(warm), len(warm), timeout=120)
            env["manager"] = manager
        if any(s in V1_STRATEGIES for s in cfg.strategies):
            env["v1_rewards"] = _v1_reward_workers(cfg, directory, server.url, warm, stack)
            env["v1_config"] = lambda strategy, split=None: _v1_trainer_config(
                cfg, directory, server.url, strategy, split
            )
        env["actors"] = _reward_actors(env)
        env["pids"] = _harness_pids(env)
        yield env


def _reward_actors(env: dict[str, Any]) -> dict[str, Any]:
    """Every reward worker actor of the environment, by name: ours, and verl's for the v1 strategies."""
    ours = env["manager"].worker_handles if "manager" in env else []
    actors = {f"reward worker {i}": h for i, h in enumerate(ours)}
    if "v1_rewards" in env:
        v1 = env["v1_rewards"].reward_loop_worker_handles
        actors |= {f"v1 reward worker {i}": h for i, h in enumerate(v1)}
    return actors


def _harness_pids(env: dict[str, Any]) -> dict[str, int]:
    """The processes whose CPU the benchmark reports (``cpu_use``): this one (trainer, v1 agent loop,
    a threaded judge), the judge server's when it has its own, and every reward worker."""
    import ray

    pids = {"benchmark": os.getpid()}
    server_pid = getattr(env["server"], "pid", None)
    if server_pid is not None:
        pids["judge server"] = int(server_pid)
    handles = env["actors"]
    names = list(handles)
    found = ray.get([handles[n].__ray_call__.remote(lambda _self: os.getpid()) for n in names], timeout=60)
    return pids | {name: int(pid) for name, pid in zip(names, found, strict=True)}


def _v1_reward_workers(
    cfg: BenchConfig, model_dir: Path, server_url: str, warm: Any, stack: contextlib.ExitStack
) -> Any:
    """verl's reward workers for the v1 strategies (``v1_reward_worker``), warmed up like ours."""
    import ray

    from async_reward_bench.v1_reward_worker import start_reward_workers

    rewards = start_reward_workers(_verl_config(cfg, model_dir, server_url), cfg.num_workers, warm)
    for worker in rewards.reward_loop_worker_handles:
        stack.callback(ray.kill, worker)
    return rewards


def _v1_trainer_config(
    cfg: BenchConfig, model_dir: Path, server_url: str, strategy: str, split: GpuSplit | None = None
) -> Any:
    """verl's config for its v1 trainer as ``strategy`` runs it, shaped like the benchmark's step: GRPO
    with a reference policy (the recipe's KL loss), ``prompts`` x ``group_size`` samples,
    ``mini_batches`` actor updates; our ``pipelined`` mode with the strategy's schedule flags; a
    separate mode (verl's ``separate_async``, our ``decoupled``, which reads the same settings) on
    ``split``: standalone rollout GPUs only (``hybrid_engine=false``), a non-naive
    weight-sync backend (which ``separate_async`` requires; the harness replaces it),
    ``parameter_sync_step`` = mini-batches (one weight push per step, as ``train_batch_size =
    parameter_sync_step x ppo_mini_batch_size`` demands) and ``gen_batch_size=1`` (what verl's
    ``_setup`` forces in async modes, so refills fetch exact prompt counts)."""
    from async_reward_bench.gpu_split import SEPARATE_MODES
    from async_reward_bench.scenarios import V1_PIPELINED_SCHEDULES, V1_VERL_OVERRIDES

    mode = V1_STRATEGIES[strategy]
    flags: list[str] = list(V1_VERL_OVERRIDES.get(strategy, ()))
    for key, value in V1_PIPELINED_SCHEDULES.get(strategy, {}).items():
        flags.append(f"+trainer.v1.pipelined.{key}={str(value).lower()}")
    if mode in SEPARATE_MODES:
        if split is None:
            raise ValueError(f"{strategy} runs on standalone rollout GPUs: give its GPU split")
        flags += [
            "actor_rollout_ref.hybrid_engine=false",
            "actor_rollout_ref.rollout.nnodes=1",
            f"actor_rollout_ref.rollout.n_gpus_per_node={split.rollout}",
            "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
            "trainer.nnodes=1",
            f"trainer.n_gpus_per_node={split.trainer}",
            f"trainer.v1.separate_async.parameter_sync_step={cfg.mini_batches}",
            "data.gen_batch_size=1",
        ]
    return _verl_config(
        cfg,
        model_dir,
        server_url,
        [
            f"trainer.v1.trainer_mode={mode}",
            f"data.train_batch_size={cfg.prompts}",
            f"actor_rollout_ref.rollout.n={cfg.group_size}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={cfg.prompts // cfg.mini_batches}",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "algorithm.adv_estimator=grpo",
            *flags,
        ],
    )


def _start_server(cfg: BenchConfig) -> Any:
    """The judge, in a thread of this process or in a child process (``cfg.server``)."""
    if cfg.server == "thread":
        from async_reward.tools.devserver import DevServerConfig, ThreadedDevServer

        threaded = ThreadedDevServer(DevServerConfig(capacity=cfg.capacity, overflow="queue", seed=cfg.seed))
        threaded.start()
        return threaded
    from async_reward.tools.devserver import ServerProcess

    process = ServerProcess("--capacity", str(cfg.capacity), "--overflow", "queue", "--seed", str(cfg.seed))
    process.start()
    return process


def _verl_config(
    cfg: BenchConfig, model_dir: Path, server_url: str, overrides: list[str] | None = None
) -> Any:
    """verl's ``ppo_trainer`` config composed by hydra (as ``main_ppo`` does), set up for ``llm_judge``."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    config_dir = str(Path(str(verl.__file__)).parent / "trainer" / "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(
            config_name="ppo_trainer",
            overrides=[f"actor_rollout_ref.model.path={model_dir}", *(overrides or [])],
        )
    GlobalHydra.instance().clear()
    with open_dict(config):
        config.reward.reward_manager.name = "llm_judge"
        config.reward.num_workers = cfg.num_workers
        # Our side admits as many calls as the service can hold, so the service is the bottleneck.
        config.reward.async_reward = {
            "judge": {"base_url": server_url + "/v1"},
            "limits": {"max_concurrency": cfg.per_worker_concurrency},
            "timeout_s": 600.0,
        }
    return config
