"""The legacy ``reward_model.*`` reward keys under verl's own entry point (issue 17, item 2), with
nothing of ours on the command line but the legacy line (issue 43: the installed package is a verl
plugin).

verl 0.9's ``python -m verl.trainer.main_ppo`` never calls ``migrate_legacy_reward_impl``: on its own,
``reward_model.reward_manager=llm_judge`` is silently dropped and verl builds ``naive``. Our plugin
(or the setup hook) applies the legacy keys where verl builds its trainer, in the task-runner actor,
before any GPU worker. The subprocess tests start verl's entry point as a user does (hydra,
``run_ppo``, the task runner on the session's Ray cluster) with the tiny local model of
``test_entry_point``; this machine has no GPU, so a run that passes our checks stops at verl's own
resource check, which is where the output is read. Their three runs are one ``--multirun`` of the
command (one interpreter start-up, each run its own task-runner actor and TransferQueue), each test
reading its own run's error and lines.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from async_reward.config import ConfigError
from async_reward.v1.checks import apply_legacy_and_check
from async_reward.wiring.integration import prepare_verl_config
from tests.conftest import cluster_env, compose_verl_config
from tests.end_to_end.test_entry_point import assets, overrides  # noqa: F401 (assets is a fixture)

JUDGE = "+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1"
#: What verl prints when the GPU layout cannot be had: the run got past every reward check.
NO_GPU = "Total available GPUs 0 is less than total desired GPUs"


def legacy_overrides(assets_dir: Path, *extra: str) -> list[str]:
    """``test_entry_point``'s GRPO run, with the reward manager left to the line under test, and no
    setup-hook line: the legacy line alone selects our manager (issue 43, item 5)."""
    base = [o for o in overrides(assets_dir) if not o.startswith(("reward.reward_manager.name=", JUDGE))]
    # One TransferQueue storage actor (verl's default starts 8, more than the test cluster's CPUs hold).
    return [*base, "transfer_queue.backend.SimpleStorage.num_data_storage_units=1", *extra]


#: The three runs of verl's entry point, one swept value of verl's ``reward`` node each (merged into it
#: with ``++``; ``{}`` leaves it as composed), in the order hydra runs them: the legacy manager line
#: alone, with its judge, and against a new key set otherwise.
LEGACY_JOBS = {
    "alone": "{}",
    "with_judge": "{async_reward:{judge:{base_url:'http://127.0.0.1:9/v1'}}}",
    "conflict": "{reward_manager:{name:async_remote}}",
}
#: Hydra's own callback that logs each job's return or error into the job's log file: a sweep raises
#: only its first failure, and every one of these jobs fails by design.
LOG_JOB_RETURN = "+hydra.callbacks.log_job_return._target_=hydra.experimental.callbacks.LogJobReturnCallback"
TASK_RUNNER_PID = re.compile(r"ray::TaskRunnerV1\.run\(\) \(pid=(?P<pid>\d+)")
#: A line Ray forwards from an actor's process: ``(TaskRunnerV1 pid=123) ...``.
FORWARDED = re.compile(r"^\((?P<cls>\S+) pid=(?P<pid>\d+)(?:, ip=[^)]*)?\) ", re.MULTILINE)
#: Ray colours the actor's name in tracebacks and forwarded lines.
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Job:
    """One run of the sweep: hydra's log of it (its error, with the task runner's traceback) and what
    its task-runner actor printed (found by the pid in that traceback)."""

    log: str
    actor_lines: str

    @property
    def output(self) -> str:
        return f"{self.log}\n{self.actor_lines}"


@pytest.fixture(scope="module")
def legacy_runs(
    assets: Path,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
    ray_cluster: None,
) -> dict[str, Job]:
    """``python -m verl.trainer.main_ppo --multirun`` with the three runs of :data:`LEGACY_JOBS`: one
    interpreter (hydra, verl, Ray's connection) for all three, each run its own task-runner actor and
    TransferQueue, as three runs of the command would start. Hydra runs every job before it raises the
    first failure; each job's error is in its own log file, and its task runner's printed lines are
    told apart by the actor's pid."""
    tmp_path = tmp_path_factory.mktemp("legacy_sweep")
    sweep = tmp_path / "sweep"
    command = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        "--multirun",
        *legacy_overrides(assets, "reward_model.reward_manager=llm_judge"),
        "++reward=" + ",".join(LEGACY_JOBS.values()),
        LOG_JOB_RETURN,
        f"hydra.sweep.dir={sweep}",
    ]
    process = subprocess.Popen(
        command, env=cluster_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output, _ = process.communicate(timeout=800)
    finally:
        process.kill()  # only if it is still running
    output = ANSI.sub("", output)
    assert process.returncode != 0, output[-6000:]  # every job fails by design
    runs: dict[str, Job] = {}
    for number, name in enumerate(LEGACY_JOBS):
        logs = list((sweep / str(number)).glob("*.log"))
        assert len(logs) == 1, (name, logs, output[-6000:])
        log = ANSI.sub("", logs[0].read_text())
        pid = TASK_RUNNER_PID.search(log)
        assert pid, (name, log[-4000:], output[-6000:])  # the job failed in its task-runner actor
        lines = [
            line
            for line in output.splitlines()
            if (match := FORWARDED.match(line)) and match["pid"] == pid["pid"]
        ]
        runs[name] = Job(log=log, actor_lines="\n".join(lines))
    return runs


# ------------------------------------------------------------------ verl's entry point, in a subprocess
@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(900)
def test_legacy_manager_line_takes_effect_under_verls_main_ppo(legacy_runs):
    """``reward_model.reward_manager=llm_judge`` is applied: llm_judge's own start-up check runs (and
    refuses the missing judge URL by name), where verl would have built ``naive`` and gone on."""
    output = legacy_runs["alone"].output
    assert "legacy reward_model.reward_manager='llm_judge' -> reward.reward_manager.name" in output, output[
        -4000:
    ]
    assert "reward.async_reward.judge.base_url is required by the llm_judge manager" in output, output[-4000:]
    assert NO_GPU not in output  # stopped by the reward check, before verl laid out any GPU


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(900)
def test_legacy_manager_line_with_its_settings_reaches_verls_gpu_layout(legacy_runs):
    output = legacy_runs["with_judge"].output
    assert "legacy reward_model.reward_manager='llm_judge' -> reward.reward_manager.name" in output, output[
        -4000:
    ]
    assert "ConfigError" not in output, output[-4000:]
    assert NO_GPU in output, output[-4000:]  # every reward check passed


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(900)
def test_legacy_and_new_manager_keys_in_conflict_stop_verls_main_ppo(legacy_runs):
    output = legacy_runs["conflict"].output
    assert (
        "reward_model.reward_manager='llm_judge' conflicts with reward.reward_manager.name='async_remote'"
        in output
    ), output[-4000:]
    assert NO_GPU not in output


# ------------------------------------------------------------------ the same rules, on verl's composed config
def test_legacy_keys_applied_as_verls_migration_would():
    config = compose_verl_config(
        [
            "reward_model.reward_manager=llm_judge",
            "reward_model.num_workers=2",
            "reward_model.reward_loop_source=register",
            JUDGE,
        ]
    )
    apply_legacy_and_check(config)
    assert config.reward.reward_manager.name == "llm_judge"
    assert config.reward.num_workers == 2
    assert "reward_model" not in config  # as migrate_legacy_reward_impl leaves it


@pytest.mark.parametrize(
    ("legacy", "new", "key"),
    [
        (
            "reward_model.reward_manager=llm_judge",
            "reward.reward_manager.name=async_remote",
            "reward_model.reward_manager",
        ),
        ("reward_model.num_workers=2", "reward.num_workers=4", "reward_model.num_workers"),
        (
            "custom_reward_function.path=/tmp/a.py",
            "reward.custom_reward_function.path=/tmp/b.py",
            "custom_reward_function.path",
        ),
    ],
)
@pytest.mark.parametrize("where", ["setup hook", "prepare_verl_config"])
def test_legacy_key_conflicting_with_its_new_key_is_refused(legacy, new, key, where):
    config = compose_verl_config([legacy, new, JUDGE])
    with pytest.raises(ConfigError) as error:
        apply_legacy_and_check(config) if where == "setup hook" else prepare_verl_config(config)
    assert error.value.key == key


@pytest.mark.parametrize(
    ("legacy", "new_key"),
    [
        ("reward_model.enable=true", "reward.reward_model.enable"),
        ("reward_model.model.path=/models/rm", "reward.reward_model.model_path"),
        ("reward_model.rollout.name=vllm", "reward.reward_model.rollout.name"),
    ],
)
def test_legacy_reward_model_keys_verl_read_already_are_refused_by_the_hook(legacy, new_key):
    config = compose_verl_config(["reward_model.reward_manager=llm_judge", legacy, JUDGE])
    with pytest.raises(ConfigError) as error:
        apply_legacy_and_check(config)
    assert new_key in str(error.value) and error.value.key == legacy.split("=")[0]


#: A key under a section verl's migration replaces whole, beside any value of the legacy section:
#: (the lines, the new key refused, the legacy key named with it, the section to write it under).
DROPPED_BY_THE_MIGRATION = [
    (  # the URL would become None: verl assigns the legacy sandbox_fusion section in its place
        ["sandbox_fusion.max_concurrent=32", "reward.sandbox_fusion.url=http://sandbox:8080/run"],
        "reward.sandbox_fusion.url",
        "sandbox_fusion.max_concurrent",
        "reward.sandbox_fusion",
    ),
    (  # the function's arguments would disappear with reward.custom_reward_function
        ["custom_reward_function.path=/tmp/f.py", "+reward.custom_reward_function.reward_kwargs.alpha=0.5"],
        "reward.custom_reward_function.reward_kwargs.alpha",
        "custom_reward_function.path",
        "reward.custom_reward_function",
    ),
    (  # the legacy section's name is null: the new name would become null, not kept
        ["custom_reward_function.path=/tmp/f.py", "reward.custom_reward_function.name=my_fn"],
        "reward.custom_reward_function.name",
        "custom_reward_function.path",
        "reward.custom_reward_function",
    ),
    (
        ["+reward_model.reward_kwargs.max_resp_len=16", "+reward.reward_kwargs.overlong_buffer_cfg.len=4"],
        "reward.reward_kwargs.overlong_buffer_cfg.len",
        "reward_model.reward_kwargs.max_resp_len",
        "reward.reward_kwargs",
    ),
]


@pytest.mark.parametrize(
    ("lines", "key", "legacy", "section"),
    DROPPED_BY_THE_MIGRATION,
    ids=[key for _, key, _, _ in DROPPED_BY_THE_MIGRATION],
)
@pytest.mark.parametrize("where", ["setup hook", "prepare_verl_config"])
def test_a_new_key_the_migration_would_drop_is_refused_naming_both_keys(lines, key, legacy, section, where):
    """verl's ``migrate_legacy_reward_impl`` assigns a legacy section in place of its new one: a key
    set only under the new one would be dropped without a word."""
    config = compose_verl_config([*lines, JUDGE])
    with pytest.raises(ConfigError) as error:
        apply_legacy_and_check(config) if where == "setup hook" else prepare_verl_config(config)
    message = str(error.value)
    assert error.value.key == key, message
    assert legacy in message and "replaces the whole" in message, message
    assert error.value.fix and f"under {section} instead" in error.value.fix


@pytest.mark.parametrize(
    "lines",
    [
        ["sandbox_fusion.max_concurrent=32"],  # the new section at verl's defaults: nothing to lose
        ["sandbox_fusion.url=http://sb:8080/run", "reward.sandbox_fusion.url=http://sb:8080/run"],  # same
        ["sandbox_fusion.max_concurrent=32", "reward.sandbox_fusion.max_concurrent=64"],  # verl's default
        ["custom_reward_function.path=/tmp/f.py", "reward.custom_reward_function.path=/tmp/f.py"],
        ["reward_model.rollout.name=vllm"],  # verl leaves the new key mandatory (???): not a setting
    ],
)
def test_a_legacy_section_beside_new_keys_it_carries_over_is_migrated(lines):
    config = compose_verl_config(lines)
    prepare_verl_config(config)
    assert "reward_model" not in config and "sandbox_fusion" not in config


@pytest.mark.parametrize(
    ("legacy", "new"),
    [
        (
            "reward_model.rollout.gpu_memory_utilization=0.3",
            "reward.reward_model.rollout.gpu_memory_utilization=0.7",
        ),
        ("reward_model.model.path=/models/a", "reward.reward_model.model_path=/models/b"),
        ("reward_model.n_gpus_per_node=4", "reward.reward_model.n_gpus_per_node=2"),
    ],
)
def test_a_legacy_reward_model_key_overwriting_its_new_key_is_refused_where_it_migrates(legacy, new):
    """verl's migration copies these one by one over the new keys; our entry point (which migrates
    before verl reads them) refuses the pair as it refuses the manager's, the hook refuses the legacy
    key itself (verl has read it already)."""
    key = legacy.split("=")[0]
    with pytest.raises(ConfigError, match="conflicts with") as error:
        prepare_verl_config(compose_verl_config([legacy, new, JUDGE]))
    assert error.value.key == key
    with pytest.raises(ConfigError) as late:
        apply_legacy_and_check(compose_verl_config([legacy, new, JUDGE]))
    assert late.value.key == key


def test_the_fallback_defaults_of_the_replaced_sections_are_verls():
    """Where verl's reward.yaml cannot be read, the defaults of the sections its migration replaces
    whole are ours: they must be the file's, or a key at verl's default would read as set."""
    from async_reward.config import verl_keys

    from_file = verl_keys._verl_reward_defaults()
    assert from_file is not verl_keys._REPLACED_SECTION_DEFAULTS  # verl's file was read
    for section, defaults in verl_keys._REPLACED_SECTION_DEFAULTS.items():
        assert from_file[section] == defaults, section
    composed = compose_verl_config([])
    for section in verl_keys._REPLACED_SECTION_DEFAULTS:  # and the file is what hydra composes
        assert {k: v for k, v in composed.reward[section].items() if k != "_target_"} == from_file[section]
