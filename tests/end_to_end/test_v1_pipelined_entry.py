"""verl v1 trainer modes ``pipelined`` and ``decoupled`` started the way a user starts them: ``python
-m verl.trainer.main_ppo`` in a subprocess on the session's Ray cluster.

Kept apart from tests/v1/pipelined/test_pipelined.py: verl's task runner starts and closes TransferQueue's
named actors on the cluster, which would pull them from under a module that holds TransferQueue
open for its own training runs.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from async_reward.wiring.integration import SETUP_HOOK
from tests.config.test_legacy_keys import ANSI, FORWARDED, LOG_JOB_RETURN, TASK_RUNNER_PID
from tests.conftest import cluster_env
from tests.end_to_end.test_entry_point import assets, overrides  # noqa: F401  (the module-scoped fixture)
from tests.v1.pipelined.test_pipelined import SCHEDULES

START_LINE = re.compile(
    r"async_reward: trainer (?P<cls>\S+) \(verl v1 trainer_mode=pipelined\), schedule (?P<schedule>\w+)"
)
DRY_RUN_LINE = re.compile(
    r"async_reward: dry run: built (?P<cls>\S+), schedule (?P<schedule>\w+), in pid (?P<pid>\d+)"
)
OURS = "async_reward.v1.pipelined.trainer.PPOTrainerPipelined"
DECOUPLED_START_LINE = re.compile(
    r"async_reward: trainer (?P<cls>\S+) \(verl v1 trainer_mode=decoupled\), "
    r"generation_window=(?P<window>\d+) groups"
)
DECOUPLED_DRY_RUN_LINE = re.compile(
    r"async_reward: dry run: built (?P<cls>\S+) \(trainer_mode=decoupled\), in pid (?P<pid>\d+)"
)
DECOUPLED = "async_reward.v1.decoupled.trainer.PPOTrainerDecoupled"
#: What the decoupled job of the sweep needs beyond the pipelined ones: verl's separate_async asserts
#: train_batch_size = parameter_sync_step x ppo_mini_batch_size (4 = 2 x 2); a generation window of 3
#: that the start line must show.
DECOUPLED_JOB = {
    "trainer_mode": "decoupled",
    "separate_async": {"parameter_sync_step": 2},
    "decoupled": {"dry_run": True, "generation_window": 3},
}
#: verl's separate_async also asserts a standalone rollout pool (nnodes, GPUs, a non-naive weight
#: sync backend) at construction; these keys are on the sweep's command line, so all jobs get them:
#: verl reads them only in its separate-async code, and the pipelined dry runs start no worker.
STANDALONE_ROLLOUT = [
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
]
#: The schedules the entry-point run sweeps: the two whose keys are set opposite ways.
SWEPT = [name for name, (mini_batch, one_step_off) in SCHEDULES.items() if mini_batch != one_step_off]


#: What ``llm_judge`` prints in verl's task runner when it scores through the judge verl serves.
IN_JOB_LINE = re.compile(
    r"async_reward: llm_judge scores through the judge verl serves in the job \(reward\.reward_model\."
    r"enable=true\), behind verl's router, as model '(?P<model>[^']+)'; standalone on GPUs of its own "
    r".*; (?P<replicas>\d+) replica\(s\) x (?P<per_replica>\d+) requests at once"
)


def served_judge_lines(root: Path) -> list[str]:
    """The judge inside the job (issue 27), on GPUs of its own: verl's GenRM keys and the manager's
    name (``reward.reward_manager.name=llm_judge`` in :func:`overrides`), plus a ``judge.max_tokens``
    that fits the tiny model's 128-token context (the default 512 is refused at start-up: no prompt
    could fit beside it)."""
    return [
        "+reward.async_reward.judge.max_tokens=32",
        "reward.reward_model.enable=true",
        f"reward.reward_model.model_path={root / 'model'}",
        "reward.reward_model.enable_resource_pool=true",
        "reward.reward_model.n_gpus_per_node=4",  # verl's reward rollout.tensor_model_parallel_size=2
        "reward.reward_model.nnodes=1",
    ]


def verl_main_ppo(
    root: Path,
    tmp_path: Path,
    extra: list[str],
    timeout: int = 840,
    common: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[int, str, int]:
    """``python -m verl.trainer.main_ppo`` (v1, the default) on the session's Ray cluster, with
    ``common`` (default: the tiny GRPO run of tests/end_to_end/test_entry_point.py, an external judge) and
    ``extra``, and ``env`` added to the driver's environment. No setup-hook line: the package is
    installed, so verl loads it as a plugin in every process (issue 43)."""

    env = {**cluster_env(), **(env or {})}
    # One TransferQueue storage unit: verl's default of 8 (a CPU each) does not fit the test cluster.
    tq_units = "transfer_queue.backend.SimpleStorage.num_data_storage_units=1"
    lines = overrides(root) if common is None else common
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *extra, *lines, tq_units]
    process = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        process.kill()
    return process.returncode, output, process.pid


#: A job of the sweep: our mode's keys with verl's own ``sync`` mode, which would ignore them.
REFUSED_JOB = {"trainer_mode": "sync", "pipelined": {"mini_batch": True, "max_staleness": 1}}
REFUSAL = re.compile(
    r"ConfigError: trainer\.v1\.pipelined\.max_staleness is set .*but trainer\.v1\.trainer_mode=sync is "
    r"training, which never reads trainer\.v1\.pipelined\.\*"
)


#: The judge server :func:`tests.end_to_end.test_entry_point.overrides` names (nothing listens there):
#: beside the judge verl serves, a second judge.
SECOND_JUDGE_URL = "http://127.0.0.1:9/v1"
#: The jobs of the served-judge sweep, in the order hydra runs them: each an option of a config group
#: of the sweep's own (``+sweep_job=...``, a file ``# @package _global_`` merged into verl's config),
#: so that one swept value can set keys in two nodes (hydra sweeps keys as a product). The first four
#: set only ``trainer.v1``; the last adds a judge server to the served judge.
SWEEP_JOBS: dict[str, dict[str, Any]] = {
    "mini_batch": {
        "trainer": {
            "v1": {
                "trainer_mode": "pipelined",
                "pipelined": {"mini_batch": True, "max_staleness": 0, "dry_run": True},
            }
        }
    },
    "one_step_off": {
        "trainer": {
            "v1": {
                "trainer_mode": "pipelined",
                "pipelined": {"mini_batch": False, "max_staleness": 2, "dry_run": True},
            }
        }
    },
    "decoupled": {"trainer": {"v1": DECOUPLED_JOB}},
    "sync_refused": {"trainer": {"v1": REFUSED_JOB}},
    "second_judge": {
        "trainer": {"v1": {"trainer_mode": "pipelined", "pipelined": {"dry_run": True}}},
        "reward": {"async_reward": {"judge": {"base_url": SECOND_JUDGE_URL}}},
    },
}


@dataclass
class Sweep:
    """One ``main_ppo --multirun``: its exit status, everything it printed (the driver's lines and
    those Ray forwards from each job's task runner), the driver's pid, and each job's hydra log (for a
    failed job, its error with the task runner's traceback), by job name."""

    code: int
    output: str
    driver_pid: int
    logs: dict[str, str]

    def task_runner_pid(self, job: str) -> str | None:
        """The pid of a failed job's task-runner actor, read off the traceback in its log."""
        match = TASK_RUNNER_PID.search(self.logs[job])
        return match["pid"] if match else None

    def forwarded_from(self, pid: str) -> str:
        """The lines Ray forwarded from the actor with ``pid``."""
        return "\n".join(
            line for line in self.output.splitlines() if (m := FORWARDED.match(line)) and m["pid"] == pid
        )

    def output_without(self, pid: str) -> str:
        """Everything printed but the lines Ray forwarded from the actor with ``pid``."""
        return "\n".join(
            line
            for line in self.output.splitlines()
            if not ((m := FORWARDED.match(line)) and m["pid"] == pid)
        )


@pytest.fixture(scope="module")
def served_judge_sweep(
    assets: Path,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
    ray_cluster: None,
) -> Sweep:
    """``python -m verl.trainer.main_ppo --multirun`` with the jobs of :data:`SWEEP_JOBS`, the judge
    served in the job (:func:`served_judge_lines`, no ``judge.base_url`` on the command line) and
    verl's separate-async keys: one interpreter (hydra, verl, Ray's connection) for the five runs,
    each its own task-runner actor and TransferQueue, as five runs of the command would start. Hydra
    runs every job before it raises the first failure; each job's error is in its own log file."""
    tmp_path = tmp_path_factory.mktemp("served_judge_sweep")
    for name, job in SWEEP_JOBS.items():
        option = tmp_path / "conf" / "sweep_job" / f"{name}.yaml"
        option.parent.mkdir(parents=True, exist_ok=True)
        option.write_text("# @package _global_\n" + OmegaConf.to_yaml(OmegaConf.create(job)))
    sweep = tmp_path / "sweep"
    judge_in_job = [line for line in overrides(assets) if "judge.base_url" not in line]
    code, output, driver_pid = verl_main_ppo(
        assets,
        tmp_path,
        [
            "--multirun",
            "trainer.use_v1=true",
            f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
            "+sweep_job=" + ",".join(SWEEP_JOBS),
            *STANDALONE_ROLLOUT,
            *served_judge_lines(assets),
            LOG_JOB_RETURN,
            f"hydra.sweep.dir={sweep}",
        ],
        timeout=1020,
        common=judge_in_job,
    )
    output = ANSI.sub("", output)
    logs: dict[str, str] = {}
    for job_dir in sorted(path for path in sweep.iterdir() if path.is_dir()):
        chosen = (job_dir / ".hydra" / "overrides.yaml").read_text()  # the job's overrides, a YAML list
        name = re.search(r"^- \+sweep_job=(\w+)$", chosen, re.MULTILINE)[1]  # type: ignore[index]
        (log,) = job_dir.glob("*.log")
        logs[name] = ANSI.sub("", log.read_text())
    assert list(logs) == list(SWEEP_JOBS), (list(logs), output[-6000:])  # every job ran, in this order
    return Sweep(code=code, output=output, driver_pid=driver_pid, logs=logs)


@pytest.mark.timeout(1100)
def test_verls_main_ppo_builds_our_trainer_in_its_task_runner_for_every_schedule(
    assets,  # noqa: F811
    served_judge_sweep,
):
    """verl's own entry point and ``trainer.v1.trainer_mode=pipelined``, nothing else of ours (no
    setup-hook line, no agent-loop or sampler line: verl loads the installed package as a plugin):
    inside verl's ``TaskRunnerV1`` actor (not the driver) our trainer is built with the schedule set; and
    with ``trainer_mode=decoupled``, our decoupled trainer with the generation window set; and our
    mode's keys under verl's ``sync`` are refused there (issue 25.4), before anything trains.

    The first four runs of :func:`served_judge_sweep` (each run starts a task-runner actor and
    TransferQueue: the cost of this test); the fifth, a second judge beside the served one, is read by
    its own test below, and its task runner's lines are left out here. The two pipelined runs set the
    two schedule keys opposite ways (``mini_batch`` true with ``max_staleness=0``, false with
    ``max_staleness=2``), so each key takes an off and an on value and a key that were ignored, swapped
    or read from the other would name the wrong schedule in one run; the one-step-off run's
    ``max_staleness=2`` its start line must show. Every schedule's training is tested in-process
    in tests/v1/pipelined/test_pipelined.py, the decoupled mode's in tests/v1/decoupled/test_decoupled.py.

    ``llm_judge`` judges with the model verl serves in the job (issue 27: verl's GenRM keys, no
    ``judge.base_url``, the judge on GPUs of its own): each built trainer's task runner says so at
    start-up. The dry runs stop before verl starts the judge's replicas (nothing can start on CPU):
    the scoring through verl's router is tested in-process in tests/judge/in_job/test_in_job.py."""
    sweep = served_judge_sweep
    second_judge = sweep.task_runner_pid("second_judge")
    assert second_judge, sweep.logs["second_judge"][-6000:]
    output = sweep.output_without(second_judge)
    # the sync job failed with the refusal (hydra logged its error), and so the command
    assert sweep.code != 0 and REFUSAL.search(sweep.logs["sync_refused"]), sweep.logs["sync_refused"][-6000:]
    assert REFUSAL.search(output), output[-6000:]
    # one line per built trainer's task runner (the refused job stops before the reward checks)
    in_job = [m.groupdict() for m in IN_JOB_LINE.finditer(output)]
    assert len(in_job) == 3, output[-6000:]
    assert all(line["model"] == str(assets / "model") and line["replicas"] == "2" for line in in_job)
    started = [m.groupdict() for m in START_LINE.finditer(output)]
    built = [m.groupdict() for m in DRY_RUN_LINE.finditer(output)]
    assert sorted(s["schedule"] for s in started) == sorted(SWEPT), output[-6000:]
    assert sorted(b["schedule"] for b in built) == sorted(SWEPT), output[-6000:]
    assert {s["cls"] for s in started} == {b["cls"] for b in built} == {OURS}
    assert output.count("max_staleness=2: steps take groups across the batches in flight, each chosen") == 1
    assert all(int(b["pid"]) != sweep.driver_pid for b in built)  # in the task-runner actor's process
    decoupled_started = [m.groupdict() for m in DECOUPLED_START_LINE.finditer(output)]
    decoupled_built = [m.groupdict() for m in DECOUPLED_DRY_RUN_LINE.finditer(output)]
    assert decoupled_started == [{"cls": DECOUPLED, "window": "3"}], output[-6000:]
    assert [b["cls"] for b in decoupled_built] == [DECOUPLED], output[-6000:]
    assert int(decoupled_built[0]["pid"]) != sweep.driver_pid
    assert output.count("TaskRunnerV1 pid=") >= 4  # verl's own runner printed them
    assert SETUP_HOOK not in sweep.output  # (verl prints its ray.init kwargs): the plugin did it all


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(600)
def test_with_the_plugin_turned_off_verl_refuses_the_mode_naming_why_and_the_fix(assets, tmp_path):  # noqa: F811
    """``ASYNC_REWARD_VERL_PLUGIN=0`` in the driver and (through verl's runtime env) in every worker:
    verl's task runner refuses ``trainer_mode=pipelined`` saying it is ours, turned off there, and how
    to turn it on or use the setup-hook line instead; never verl's bare ``Unknown trainer``. (Before
    issue 43 this run was the one without the hook line, and verl's bare error was all it said.)"""
    code, output, _ = verl_main_ppo(
        assets,
        tmp_path,
        [
            "trainer.use_v1=true",
            "trainer.v1.trainer_mode=pipelined",
            "+trainer.v1.pipelined.dry_run=true",
            "+ray_kwargs.ray_init.runtime_env.env_vars.ASYNC_REWARD_VERL_PLUGIN='0'",  # a string, for Ray
        ],
        env={"ASYNC_REWARD_VERL_PLUGIN": "0"},
    )
    assert code != 0
    assert PLUGIN_OFF.search(output), output[-6000:]
    assert f"or add +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}" in output
    assert "Unknown trainer" not in output
    assert "async_reward: trainer" not in output and "dry run" not in output


PLUGIN_OFF = re.compile(
    r"NotRegistered: trainer\.v1\.trainer_mode=pipelined names async-reward's trainer mode, which is "
    r"not registered in this process: async-reward's verl plugin is turned off in this process "
    r"\(ASYNC_REWARD_VERL_PLUGIN=0\)\. Fix: unset ASYNC_REWARD_VERL_PLUGIN where verl runs"
)


IN_JOB_REFUSAL = re.compile(
    r"ConfigError: reward\.async_reward\.judge\.base_url='http://127\.0\.0\.1:9/v1' names a judge "
    r"server while reward\.reward_model\.enable=true serves one in the job: llm_judge would have two "
    r"judges; remove reward\.async_reward\.judge\.base_url"
)


@pytest.mark.timeout(1100)
def test_a_second_judge_beside_the_served_one_is_refused_in_verls_task_runner(served_judge_sweep):
    """verl's GenRM keys with a ``judge.base_url`` too (the last job of :func:`served_judge_sweep`):
    refused where verl's task runner builds the trainer, naming the key and the fix, before any trainer
    is built and before the start-up line that would say the served judge is used."""
    sweep = served_judge_sweep
    log = sweep.logs["second_judge"]  # the job's own error, as hydra logged it
    assert sweep.code != 0 and IN_JOB_REFUSAL.search(log), log[-6000:]
    pid = sweep.task_runner_pid("second_judge")  # refused in verl's task runner, not before it
    assert pid, log[-6000:]
    lines = sweep.forwarded_from(pid)
    assert f"(TaskRunnerV1 pid={pid}" in lines, sweep.output[-6000:]
    job_output = f"{log}\n{lines}"
    assert not IN_JOB_LINE.search(job_output) and not DRY_RUN_LINE.search(job_output), job_output[-6000:]
