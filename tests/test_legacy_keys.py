"""The legacy ``reward_model.*`` reward keys under verl's own entry point with our setup hook (issue 17,
item 2).

verl 0.9's ``python -m verl.trainer.main_ppo`` never calls ``migrate_legacy_reward_impl``: without the
hook, ``reward_model.reward_manager=llm_judge`` is silently dropped and verl builds ``naive``. The hook
applies the legacy keys where verl builds its trainer, in the task-runner actor, before any GPU
worker. The subprocess tests start verl's entry point as a user does (hydra, ``run_ppo``, the task
runner on the session's Ray cluster) with the tiny local model of ``test_entry_point``; this machine
has no GPU, so a run that passes our checks stops at verl's own resource check, which is where the
output is read.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from async_reward.checks import apply_legacy_and_check
from async_reward.config import ConfigError
from async_reward.integration import SETUP_HOOK, prepare_verl_config
from tests.conftest import cluster_env, compose_verl_config
from tests.test_entry_point import assets, overrides  # noqa: F401 (assets is a fixture)

JUDGE = "+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1"
HOOK = f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}"
#: What verl prints when the GPU layout cannot be had: the run got past every reward check.
NO_GPU = "Total available GPUs 0 is less than total desired GPUs"


def legacy_overrides(assets_dir: Path, *extra: str) -> list[str]:
    """``test_entry_point``'s GRPO run, with the reward manager left to the line under test."""
    base = [o for o in overrides(assets_dir) if not o.startswith(("reward.reward_manager.name=", JUDGE))]
    # One TransferQueue storage actor (verl's default starts 8, more than the test cluster's CPUs hold).
    return [*base, HOOK, "transfer_queue.backend.SimpleStorage.num_data_storage_units=1", *extra]


def run_verl_main_ppo(assets_dir: Path, tmp_path: Path, *extra: str) -> tuple[int, str]:

    env = cluster_env()
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *legacy_overrides(assets_dir, *extra)]
    process = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output, _ = process.communicate(timeout=540)
    finally:
        process.kill()  # only if it is still running
    return process.returncode, output


# ------------------------------------------------------------------ verl's entry point, in a subprocess
@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(600)
def test_legacy_manager_line_takes_effect_under_verls_main_ppo(assets, tmp_path):  # noqa: F811
    """``reward_model.reward_manager=llm_judge`` is applied: llm_judge's own start-up check runs (and
    refuses the missing judge URL by name), where verl would have built ``naive`` and gone on."""
    code, output = run_verl_main_ppo(assets, tmp_path, "reward_model.reward_manager=llm_judge")
    assert code != 0
    assert "legacy reward_model.reward_manager='llm_judge' -> reward.reward_manager.name" in output, output[
        -4000:
    ]
    assert "reward.async_reward.judge.base_url is required by the llm_judge manager" in output, output[-4000:]
    assert NO_GPU not in output  # stopped by the reward check, before verl laid out any GPU


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(600)
def test_legacy_manager_line_with_its_settings_reaches_verls_gpu_layout(assets, tmp_path):  # noqa: F811
    code, output = run_verl_main_ppo(assets, tmp_path, "reward_model.reward_manager=llm_judge", JUDGE)
    assert "legacy reward_model.reward_manager='llm_judge' -> reward.reward_manager.name" in output, output[
        -4000:
    ]
    assert "ConfigError" not in output, output[-4000:]
    assert code != 0 and NO_GPU in output, output[-4000:]  # every reward check passed


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.timeout(600)
def test_legacy_and_new_manager_keys_in_conflict_stop_verls_main_ppo(assets, tmp_path):  # noqa: F811
    code, output = run_verl_main_ppo(
        assets, tmp_path, "reward_model.reward_manager=llm_judge", "reward.reward_manager.name=async_remote"
    )
    assert code != 0
    assert (
        "reward_model.reward_manager='llm_judge' conflicts with reward.reward_manager.name='async_remote'"
        in output
    )
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
