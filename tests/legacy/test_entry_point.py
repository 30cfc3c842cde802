"""The legacy entry point builds ``PipelinedRayPPOTrainer`` inside Ray's task-runner actor, as users start it.

Issue 8: under ``python -m async_reward.legacy.main_ppo`` Ray shipped the task runner by value, verl's
``run()`` read a private copy of its globals and built verl's own trainer; every pipeline option was
silently ignored, and an in-process test of the runner could not see it. These tests start the real
path: a ``python -m`` subprocess (hydra, verl's ``run_ppo``, the task-runner actor on the session's Ray
cluster) and the in-process ``run(config)``, with a tiny local model config, tokenizer and parquet
data. ``+async_reward.pipeline.dry_run=true`` (a documented user feature) stops each run once the
trainer is built, before it would need GPUs, and reports what was built and in which process.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from omegaconf import open_dict

from async_reward.config import ConfigError
from tests.conftest import cluster_env, compose_verl_config
from tests.end_to_end.test_entry_point import overrides

pytestmark = pytest.mark.usefixtures("ray_cluster")

OURS = "async_reward.legacy.trainer.PipelinedRayPPOTrainer"
MODES = {
    "baseline": (False, False),
    "mini_batch": (True, False),
    "one_step_off": (False, True),
    "both": (True, True),
}
DRY_RUN_LINE = re.compile(
    r"^async_reward: dry run: built (?P<cls>\S+), pipeline mode (?P<mode>\w+), "
    r"in Ray actor (?P<actor>[0-9a-f]+) \(pid (?P<pid>\d+)\)",
    re.MULTILINE,
)


def mode_flags(mode: str) -> list[str]:
    mini_batch, one_step_off = MODES[mode]
    return [
        f"+async_reward.pipeline.mini_batch={str(mini_batch).lower()}",
        f"+async_reward.pipeline.one_step_off_policy={str(one_step_off).lower()}",
    ]


#: Keys in the three places a config holds them: ``runtime_env.env_vars`` (one named by
#: ``api_key_env``, one with a secret-looking name) and a header.
KEYS = {
    "SERVICE_TOKEN": "tok-secret-in-runtime-env",
    "HF_TOKEN": "hf-secret-in-runtime-env",
    "X-Api-Key": "hdr-secret-in-config",
}
#: Hydra's launcher echoes each job's overrides, the command line the user typed, keys included:
#: ``[<time>][HYDRA] \t#0 : <overrides>`` (a sweep only; one run echoes nothing).
HYDRA_ECHO = re.compile(r"^\[[^]]+\]\[HYDRA\] \t#\d+ : ")


def remote_overrides(assets: Path) -> list[str]:
    """:func:`overrides` with ``async_remote`` (at a port nothing listens on: no run scores) in place
    of ``llm_judge`` and its judge section."""
    judge = ("reward.reward_manager.name=", "+reward.async_reward.judge.")
    return [
        *(line for line in overrides(assets) if not line.startswith(judge)),
        "reward.reward_manager.name=async_remote",
        "+reward.async_reward.remote.url=http://127.0.0.1:9/score",
    ]


@dataclass
class Sweep:
    returncode: int
    pid: int
    stdout: str
    """stdout and stderr, in the order written."""


@pytest.fixture(scope="module")
def python_m_sweep(assets: Path, tmp_path_factory: pytest.TempPathFactory, ray_cluster: None) -> Sweep:
    """``python -m async_reward.legacy.main_ppo --multirun`` in all four modes, as a user starts it
    (hydra, verl's ``run_ppo``, one task-runner actor per run on the session's Ray cluster), with
    :data:`KEYS` set: one interpreter for the four runs, read by the two tests below. The manager is
    ``async_remote``, which reads ``remote.api_key_env`` and ``remote.headers`` (another manager
    refuses a ``remote`` section at start-up)."""
    tmp_path = tmp_path_factory.mktemp("python_m")
    command = [
        sys.executable,
        "-m",
        "async_reward.legacy.main_ppo",
        "--multirun",
        *remote_overrides(assets),
        "+async_reward.pipeline.mini_batch=false,true",
        "+async_reward.pipeline.one_step_off_policy=false,true",
        "+async_reward.pipeline.dry_run=true",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "+reward.async_reward.remote.api_key_env=SERVICE_TOKEN",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.SERVICE_TOKEN={KEYS['SERVICE_TOKEN']}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN={KEYS['HF_TOKEN']}",
        f"+reward.async_reward.remote.headers.X-Api-Key={KEYS['X-Api-Key']}",
    ]
    process = subprocess.Popen(
        command, env=cluster_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output, _ = process.communicate(timeout=840)
    finally:
        process.kill()  # only if it is still running
    return Sweep(returncode=process.returncode, pid=process.pid, stdout=output)


@pytest.mark.timeout(900)
def test_python_m_builds_our_trainer_in_the_task_runner_actor_in_every_mode(python_m_sweep):
    """``python -m async_reward.legacy.main_ppo`` in all four modes (one hydra ``--multirun``: the
    same ``main`` per mode, one Python start-up), joined to the session's Ray cluster."""
    output = python_m_sweep.stdout
    assert python_m_sweep.returncode == 0, output[-6000:]

    built = [match.groupdict() for match in DRY_RUN_LINE.finditer(output)]
    assert sorted(b["mode"] for b in built) == sorted(MODES), output[-6000:]
    for report in built:
        assert report["cls"] == OURS  # verl's RayPPOTrainer before the fix
        assert int(report["pid"]) != python_m_sweep.pid  # built in the actor's process, not the driver's
    assert len({b["actor"] for b in built}) == 4  # one task-runner actor per run
    from async_reward.legacy.main_ppo import DEPRECATION

    assert output.count(DEPRECATION) == 1  # deprecated, said once for the four runs of the process
    assert "trainer.v1.trainer_mode=pipelined" in DEPRECATION  # and the line to use instead
    # What the task-runner actors printed (hydra itself echoes the command line it was given).
    printed = "\n".join(line for line in output.splitlines() if "(PipelinedTaskRunner pid=" in line)
    assert "'SERVICE_TOKEN': '<hidden>'" in printed  # the config was printed, redacted
    assert "'X-Api-Key': '<hidden>'" in printed  # the header reached the printed config, redacted
    assert not any(key in printed for key in KEYS.values())


@pytest.mark.timeout(900)
def test_no_key_is_printed_by_the_entry_point_verls_prints_included(python_m_sweep):
    """The sweep's output, every line of it but hydra's echo of the command line: verl's ``run_ppo``
    prints the Ray init kwargs, ``env_vars`` values included, before ``ray.init``, and its task
    runner the config; nothing the process writes to stdout or stderr may hold a key."""
    output = python_m_sweep.stdout
    assert python_m_sweep.returncode == 0, output[-6000:]
    assert DRY_RUN_LINE.search(output), output[-6000:]
    (init_line,) = [line for line in output.splitlines() if line.startswith("ray init kwargs:")]
    assert "'SERVICE_TOKEN': '<hidden>'" in init_line and "'HF_TOKEN': '<hidden>'" in init_line  # verl's
    echoed = [line for line in output.splitlines() if HYDRA_ECHO.match(line)]
    assert len(echoed) == len(MODES), output[-6000:]  # the filter below takes hydra's four lines, no more
    written = "\n".join(line for line in output.splitlines() if not HYDRA_ECHO.match(line))
    for key in KEYS.values():
        assert key not in written, key


def test_run_in_process_builds_our_trainer_in_the_actor(assets):
    """``async_reward.legacy.main_ppo.run(config)`` from a Python program with Ray already up."""
    from async_reward.legacy.main_ppo import run

    config = compose_verl_config(
        [*overrides(assets), *mode_flags("both"), "+async_reward.pipeline.dry_run=true"]
    )
    report = run(config)
    assert report is not None
    assert (report.trainer_class, report.mode) == (OURS, "both")
    assert report.actor_id and report.pid != os.getpid()


def test_own_launcher_with_verls_run_ppo_and_a_trainer_subclass(assets):
    """A user's launcher: verl's ``run_ppo`` with a task-runner subclass defined in the launcher (a
    local class: Ray ships it by value) building the user's own trainer subclass."""
    import ray
    from verl.trainer.main_ppo import run_ppo

    from async_reward.legacy.main_ppo import prepare_config
    from async_reward.legacy.task_runner import DryRunComplete, PipelinedTaskRunner
    from async_reward.legacy.trainer import PipelinedRayPPOTrainer

    class MyTrainer(PipelinedRayPPOTrainer):
        pass

    class MyRunner(PipelinedTaskRunner):
        trainer_class = MyTrainer

    flags = [*mode_flags("one_step_off"), "+async_reward.pipeline.dry_run=true"]
    config = prepare_config(compose_verl_config([*overrides(assets), *flags]))
    with pytest.raises(DryRunComplete) as stop:
        run_ppo(config, task_runner_class=ray.remote(MyRunner))
    report = stop.value.report
    assert report.trainer_class.endswith(".MyTrainer") and report.mode == "one_step_off"
    assert report.actor_id and report.pid != os.getpid()


def test_a_task_runner_building_another_trainer_fails_loudly(assets):
    from verl.trainer.main_ppo_v0 import TaskRunner as VerlTaskRunner
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from async_reward.legacy.main_ppo import run
    from async_reward.legacy.task_runner import PipelinedTaskRunner

    config = lambda: compose_verl_config([*overrides(assets), *mode_flags("mini_batch")])  # noqa: E731
    # Refused before Ray is asked for anything: verl's own runner would build verl's trainer.
    with pytest.raises(ConfigError, match="not a PipelinedTaskRunner"):
        run(config(), task_runner_class=VerlTaskRunner)

    class WrongRunner(PipelinedTaskRunner):
        trainer_class = RayPPOTrainer

    # A real run (no dry run): it stops in the actor, right after building, before any worker.
    with pytest.raises(
        TypeError, match=r"built verl\.trainer\.ppo\.ray_trainer\.RayPPOTrainer.*mode mini_batch"
    ):
        run(config(), task_runner_class=WrongRunner)


async def test_the_pipelines_reward_worker_scores_with_the_pipeline_configured(
    server, verl_config_factory, batch_factory
):
    from async_reward.legacy.worker import PipelineRewardWorker

    config = verl_config_factory("llm_judge", {"judge": {"base_url": server.url + "/v1"}})
    with open_dict(config):
        config.async_reward = {"pipeline": {"mini_batch": True}}
    from async_reward._core.http import close_sessions

    worker = PipelineRewardWorker(config)
    await worker.enqueue(
        1, [0], batch_factory([{"prompt": "What is 2+3?", "response": "5", "ground_truth": "5"}])
    )
    results: list[Any] = []
    try:
        while not results:
            results = (await worker.collect(5.0))["results"]
    finally:
        await close_sessions()
    (_, _, payload), *_ = results
    assert payload["reward_extra_info"]["status"] == "ok" and payload["reward_score"] == 1.0


V1_AGENT_LOOP = "+actor_rollout_ref.rollout.agent.agent_loop_manager_class="


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        ([f"{V1_AGENT_LOOP}async_reward.v1.RewardAgentLoopManager"], "verl v1's TransferQueue agent-loop"),
        ([f"{V1_AGENT_LOOP}verl.trainer.ppo.v1.agent_loop_tq.AgentLoopManagerTQ"], "verl v1's TransferQueue"),
        (
            [
                "trainer.v1.sampler.custom_sampler.path=pkg://async_reward.v1.replay_buffer",
                "trainer.v1.sampler.custom_sampler.name=RewardReplayBuffer",
            ],
            "never builds",
        ),
        ([f"{V1_AGENT_LOOP}verl.experimental.agent_loop.AgentLoopManager"], "scores inside the rollout"),
    ],
    ids=["our_v1_manager", "verls_v1_manager", "our_v1_sampler", "a_scoring_manager"],
)
def test_the_entry_point_refuses_verl_v1_lines_before_ray_even_in_a_dry_run(assets, lines, reason):
    """The README's verl-v1 lines copied into a pipelined run: refused by ``run`` before Ray is asked
    for anything (a real run would otherwise fail in ``init_workers``, after GPU workers started)."""
    from async_reward.legacy.main_ppo import run

    config = compose_verl_config(
        [*overrides(assets), *mode_flags("mini_batch"), *lines, "+async_reward.pipeline.dry_run=true"]
    )
    with pytest.raises(ConfigError, match=re.escape(reason)):
        run(config)


def test_our_trainer_refuses_a_v1_agent_loop_when_built_so_a_dry_run_says_it(assets):
    """A launcher of one's own (verl's ``run_ppo``, no ``prepare_config`` check of the line): the trainer's
    constructor, in the task-runner actor, refuses before ``dry_run`` could report success."""
    from verl.trainer.main_ppo import run_ppo

    from async_reward.legacy.main_ppo import PipelinedTaskRunner, prepare_config

    config = prepare_config(
        compose_verl_config(
            [*overrides(assets), *mode_flags("baseline"), "+async_reward.pipeline.dry_run=true"]
        )
    )
    with open_dict(config):
        config.actor_rollout_ref.rollout.agent.agent_loop_manager_class = (
            "async_reward.v1.RewardAgentLoopManager"
        )
    with pytest.raises(ConfigError, match="verl v1's TransferQueue agent-loop manager"):
        run_ppo(config, task_runner_class=PipelinedTaskRunner)


def test_the_entry_point_says_when_it_overrides_use_v1(assets, caplog):
    from async_reward.legacy.main_ppo import prepare_config

    caplog.set_level(logging.WARNING, logger="async_reward.legacy.main_ppo")
    config = prepare_config(compose_verl_config([*overrides(assets), "trainer.use_v1=true"]))
    assert config.trainer.use_v1 is False
    (line,) = [r.getMessage() for r in caplog.records if "use_v1" in r.getMessage()]
    assert "overridden to false" in line and "trainer.v1.* settings are ignored" in line
    caplog.clear()
    prepare_config(compose_verl_config([*overrides(assets), "trainer.use_v1=false"]))
    assert not [r for r in caplog.records if "use_v1" in r.getMessage()]
