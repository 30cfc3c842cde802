"""The v1 integration's parts without Ray: the group gate, per-step metrics, the config lines and checks,
and the replay buffer verl builds from them. The end-to-end runs are in test_v1.py."""

from __future__ import annotations

import asyncio
import logging
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf, open_dict

from async_reward import ConfigError, prepare_verl_config
from async_reward.training.metrics import extras_metrics, status_metrics
from async_reward.v1 import (
    AGENT_LOOP_MANAGER,
    V1_OVERRIDES,
    prepare_v1_config,
    uses_reward_replay_buffer,
    v1_integration_problem,
)
from async_reward.v1.agent_loop import RewardAgentLoopManager, is_excluded
from async_reward.v1.groups import GroupGate
from async_reward.v1.replay_buffer import RewardReplayBuffer, StepRewardMetrics, merge_sampler_metrics
from tests.conftest import compose_verl_config

README = Path(__file__).resolve().parents[2] / "README.md"


class UserAgentLoopManager(RewardAgentLoopManager):
    """A user's own subclass, named by its import path."""


# ----------------------------------------------------------------------------- GroupGate


async def test_gate_postprocesses_the_whole_group_once_and_hands_each_session_its_score():
    calls: list[list[float]] = []

    def impute(scores):
        calls.append(list(scores))
        return [sum(s for s in scores if not math.isnan(s)) if math.isnan(s) else s for s in scores]

    gate = GroupGate(3, impute)
    first = asyncio.create_task(gate.arrive(2, 1.0))
    second = asyncio.create_task(gate.arrive(0, math.nan))
    await asyncio.sleep(0.01)
    assert not first.done() and not gate.complete  # held until the third session is accounted for
    third = await gate.arrive(1, 0.5)
    assert len(calls) == 1 and math.isnan(calls[0][0]) and calls[0][1:] == [0.5, 1.0]  # session order
    assert (await second, third, await first) == (1.5, 0.5, 1.0)


async def test_a_session_that_leaves_releases_its_siblings():
    gate = GroupGate(3, lambda scores: [s * 10 for s in scores])
    waiting = asyncio.create_task(gate.arrive(0, 1.0))
    gate.leave(2)  # raised before scoring
    await asyncio.sleep(0.01)
    assert not waiting.done()
    gate.leave(1)  # cancelled
    assert await asyncio.wait_for(waiting, 1) == 10.0
    gate.leave(0)  # after arriving: a no-op


async def test_a_failing_postprocessor_keeps_the_scores_and_opens_the_gate(caplog):
    def broken(scores):
        raise RuntimeError("user bug")

    gate = GroupGate(2, broken)
    with caplog.at_level(logging.ERROR):
        results = await asyncio.gather(gate.arrive(0, 0.25), gate.arrive(1, 0.75))
    assert results == [0.25, 0.75]
    assert "keeps its scores" in caplog.text


async def test_a_session_beyond_the_group_size_keeps_its_score(caplog):
    gate = GroupGate(1, lambda scores: [s + 1 for s in scores])
    assert await gate.arrive(0, 1.0) == 2.0
    with caplog.at_level(logging.ERROR):
        assert await asyncio.wait_for(gate.arrive(1, 5.0), 1) == 5.0
    assert "after its group of 1 was complete" in caplog.text


async def test_gate_refuses_a_second_arrival_and_an_empty_group():
    gate = GroupGate(2, list)
    task = asyncio.create_task(gate.arrive(0, 1.0))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="twice"):
        await gate.arrive(0, 1.0)
    gate.leave(1)
    assert await task == 1.0
    with pytest.raises(ValueError):
        GroupGate(0, list)


@pytest.mark.parametrize(
    ("excluded", "starved"),
    [
        ((False, False, False, False), False),  # nothing excluded
        ((True, False, False, False), False),  # three scored members still train
        ((True, True, False, False), False),  # two is enough
        ((True, True, True, False), True),  # one scored member left: the group trains on nothing
        ((True, True, True, True), True),
    ],
)
async def test_gate_says_when_exclusions_leave_too_few_scored_members(excluded, starved):
    gate = GroupGate(len(excluded), list)
    await asyncio.gather(*(gate.arrive(i, 1.0, excluded=flag) for i, flag in enumerate(excluded)))
    assert gate.starved is starved


async def test_a_group_of_one_without_exclusions_is_not_starved():
    gate = GroupGate(1, list)
    await gate.arrive(0, 1.0)
    assert not gate.starved  # rollout.n=1 trains as verl does


# ----------------------------------------------------------------------------- metrics


def test_extras_metrics_count_statuses_and_average_numeric_extras():
    extras: list[dict[str, Any]] = [
        {
            "status": "ok",
            "latency_s": 0.1,
            "attempts": 1,
            "failure_reason": "",
            "verdict": 8.0,
            "shared": True,
        },
        {
            "status": "ok",
            "latency_s": 0.3,
            "attempts": 3,
            "failure_reason": "",
            "verdict": 6.0,
            "shared": False,
        },
        {
            "status": "timeout",
            "latency_s": 2.0,
            "attempts": 2,
            "failure_reason": "deadline",
            "verdict": math.nan,
        },
        {
            "status": "error",
            "latency_s": 0.2,
            "attempts": 1,
            "excluded": True,
            "verdict": np.float32(math.nan),
        },
        {"score_note": "strings are not averaged"},  # a manager that reports no status: counts as ok
    ]
    metrics = extras_metrics(extras)
    assert {k: metrics[f"reward/status_{k}"] for k in ("ok", "timeout", "error", "invalid")} == {
        "ok": 3.0,
        "timeout": 1.0,
        "error": 1.0,
        "invalid": 0.0,
    }
    assert metrics["reward/excluded"] == 1.0
    assert metrics["reward/retries"] == 3.0  # 2 + 1
    assert metrics["reward/latency_max"] == 2.0
    assert metrics["reward/latency_p50"] == pytest.approx(0.25)
    assert metrics["reward/extra/verdict/mean"] == 7.0  # NaNs (failed samples) left out
    assert metrics["reward/extra/shared/mean"] == 0.5
    assert not any("score_note" in key or "failure_reason" in key for key in metrics)


def test_status_metrics_without_latencies_and_without_exclusion():
    """No latency known (none reported, or none finite): 0, as the decoupled mode's timings, never NaN."""
    metrics = status_metrics({"ok": 2}, [math.nan, math.inf], retries=0)
    assert {metrics[f"reward/latency_{q}"] for q in ("p50", "p95", "max")} == {0.0}
    assert metrics["reward/status_ok"] == 2.0 and "reward/excluded" not in metrics
    assert all(math.isfinite(value) for value in extras_metrics([]).values())


def test_step_metrics_report_the_whole_step_with_its_last_mini_batch():
    steps = StepRewardMetrics(samples_per_step=2)
    assert steps.add(1, [{"status": "ok"}]) == {}
    assert steps.add(1, [{"status": "timeout"}])["reward/status_ok"] == 1.0
    first_of_next = steps.add(2, [{"status": "ok"}] * 3)
    assert first_of_next == {}  # a new step starts from zero
    assert steps.add(2, [{"status": "ok"}])["reward/status_ok"] == 4.0
    assert StepRewardMetrics(1).add(7, [{"status": "invalid"}])["reward/status_invalid"] == 1.0
    untrained = StepRewardMetrics(2)
    assert untrained.add(3, [{"status": "error"}] * 2, untrained=2) == {}
    assert untrained.add(3, [{"status": "ok"}] * 2, untrained=1)["reward/untrained"] == 3.0
    assert untrained.add(4, [{"status": "ok"}]) == {} and untrained.add(4, [])["reward/untrained"] == 0.0
    with pytest.raises(ValueError):
        StepRewardMetrics(0)


def test_a_skipped_mini_batch_counts_in_the_step_it_was_skipped_for_but_is_not_one_of_its_updates():
    steps = StepRewardMetrics(samples_per_step=2)
    steps.skipped([{"status": "error", "excluded": True}] * 2, untrained=2)
    assert steps.add(5, [{"status": "ok"}]) == {}  # the skipped batch did not count as a mini-batch
    metrics = steps.add(5, [{"status": "ok"}])
    assert metrics["reward/status_error"] == 2.0 and metrics["reward/status_ok"] == 2.0
    assert metrics["reward/skipped_batches"] == 1.0 and metrics["reward/untrained"] == 2.0
    steps.add(6, [{"status": "ok"}])
    assert steps.add(6, [{"status": "ok"}])["reward/skipped_batches"] == 0.0  # a new step starts from zero


def test_only_a_real_boolean_excludes():
    assert is_excluded({"excluded": True}) and is_excluded({"excluded": np.bool_(True)})
    assert not any(is_excluded(info) for info in ({"excluded": "True"}, {"excluded": 1}, {}, None))


# ----------------------------------------------------------------------------- configuration


def v1_config(*extra: str) -> Any:
    return compose_verl_config(["reward.reward_manager.name=llm_judge", *V1_OVERRIDES, *extra])


def test_the_documented_v1_lines_compose_into_verls_config_and_enable_everything():
    """The lines for a job without the verl plugin (issue 43: the plugin implies them), as
    docs/verl-v1.md gives them."""
    page = (README.parent / "docs" / "verl-v1.md").read_text()
    for line in V1_OVERRIDES:
        assert line in page, line
    config = v1_config()
    assert config.trainer.use_v1 is True  # verl's default trainer
    assert config.actor_rollout_ref.rollout.agent.agent_loop_manager_class == AGENT_LOOP_MANAGER
    assert uses_reward_replay_buffer(config)
    assert v1_integration_problem(config) is None


def test_the_readme_quick_start_runs_our_schedule_as_a_v1_mode_with_every_line_honoured():
    """The quick start is the schedule to use (issue 28, item 7; issue 43): its block, word for word,
    composes into verl's config as the ``pipelined`` mode with both schedules (the mode's default), and
    needs none of the wiring lines the verl plugin makes redundant (issue 43, item 5)."""
    from async_reward.v1.pipelined.config import check_pipelined_mode_against_verl, load_pipelined_mode_config

    section = README.read_text().split("## Quick start", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    words = block.replace("\\\n", " ").split()
    overrides = [w for w in words if "=" in w and not w.startswith(("JUDGE_API_KEY", "#"))]
    assert not any(line in overrides for line in V1_OVERRIDES)  # the plugin wires them
    assert {"reward.reward_manager.name=llm_judge", "trainer.v1.trainer_mode=pipelined"} <= set(overrides)
    config = compose_verl_config(overrides)
    assert config.trainer.use_v1 is True and config.trainer.v1.trainer_mode == "pipelined"
    mode = load_pipelined_mode_config(config)
    assert mode.mini_batch and mode.one_step_off_policy and mode.mode == "both"
    check_pipelined_mode_against_verl(mode, config)  # raises ConfigError for a line the mode would not honour


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ((), "agent_loop_manager_class"),
        (("trainer.use_v1=false", *V1_OVERRIDES), "legacy trainer"),
        (
            (
                *(line for line in V1_OVERRIDES if "agent_loop_manager_class" not in line),
                "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=tests.nowhere.Manager",
            ),
            "not async_reward.v1.RewardAgentLoopManager",
        ),
    ],
)
def test_integration_problems_are_named(overrides, reason):
    config = compose_verl_config(["reward.reward_manager.name=llm_judge", *overrides])
    problem = v1_integration_problem(config)
    assert problem is not None and reason in problem


def test_a_judge_on_the_training_gpus_is_no_integration_problem():
    """Issue 27: verl scores a colocated judge after sampling, through the setup hook's colocated step
    (async_reward.v1.colocated_judge), which post-processes groups and honours exclude."""
    config = compose_verl_config(
        ["reward.reward_manager.name=llm_judge", "reward.reward_model.enable=true", *V1_OVERRIDES]
    )
    assert v1_integration_problem(config) is None


def test_a_users_subclass_of_our_manager_counts():
    config = v1_config()
    with open_dict(config):
        config.actor_rollout_ref.rollout.agent.agent_loop_manager_class = f"{__name__}.UserAgentLoopManager"
    assert v1_integration_problem(config) is None


def test_prepare_v1_config_sets_what_the_overrides_set_and_refuses_to_replace_a_users_choice():
    prepared = prepare_v1_config(
        compose_verl_config(
            [
                "reward.reward_manager.name=llm_judge",
                "+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1",
            ]
        )
    )
    expected = v1_config()
    for key in (
        "actor_rollout_ref.rollout.agent.agent_loop_manager_class",
        "trainer.v1.sampler.custom_sampler",
        "ray_kwargs.ray_init.runtime_env.worker_process_setup_hook",
    ):
        assert OmegaConf.select(prepared, key) == OmegaConf.select(expected, key), key
    assert prepare_v1_config(prepared) is prepared  # idempotent
    with pytest.raises(ConfigError, match="agent_loop_manager_class"):
        prepare_v1_config(
            compose_verl_config(["+actor_rollout_ref.rollout.agent.agent_loop_manager_class=x.Y"])
        )
    with pytest.raises(ConfigError, match="custom_sampler"):
        prepare_v1_config(compose_verl_config(["trainer.v1.sampler.custom_sampler.path=/mine.py"]))


def test_our_manager_refuses_the_legacy_trainer_and_no_reward_workers_without_a_colocated_judge():
    with pytest.raises(ConfigError, match="v1 trainer only"):
        RewardAgentLoopManager(v1_config("trainer.use_v1=false"), llm_client=None)
    # No reward workers is right only for a judge on the training GPUs (scored after sampling:
    # tests/judge/in_job/test_in_job.py trains that way).
    with pytest.raises(ConfigError, match="got no reward workers"):
        RewardAgentLoopManager(v1_config(), llm_client=None, reward_loop_worker_handles=None)


def test_stateful_warning_names_the_v1_option_and_is_silent_when_it_is_on(
    tmp_path, tokenizer_dir, monkeypatch, caplog
):
    from async_reward.managers import AsyncStatefulRewardManager
    from tests.managers.test_managers import STATEFUL_CLASS, write_module

    path = write_module(tmp_path, STATEFUL_CLASS, "agent.py")
    common = [
        f"actor_rollout_ref.model.path={tokenizer_dir}",
        "reward.reward_manager.name=async_stateful",
        f"reward.custom_reward_function.path={path}",
        "reward.custom_reward_function.name=RewardAgent",
    ]
    for overrides, warned in (([*common, *V1_OVERRIDES], False), (common, True)):
        monkeypatch.setattr(AsyncStatefulRewardManager, "_warned_postprocess_path", False)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            AsyncStatefulRewardManager(compose_verl_config(overrides), tokenizer=None)
        assert ("post_process_scores" in caplog.text) is warned
        if warned:
            assert AGENT_LOOP_MANAGER in caplog.text


# ----------------------------------------------------------------------------- the replay buffer verl builds


def verl_builds_replay_buffer(config: Any) -> Any:
    """verl's own ``PPOTrainer._build_replay_buffer`` on a trainer with just a config (as verl's tests do)."""
    from verl.trainer.ppo.v1 import get_trainer_cls

    trainer_cls = get_trainer_cls(config.trainer.v1.trainer_mode)
    trainer = trainer_cls.__new__(trainer_cls)
    trainer.config = config
    trainer.trainer_mode = config.trainer.v1.trainer_mode
    return trainer._build_replay_buffer()


def test_verl_builds_our_replay_buffer_around_its_own_with_every_builtin_setting():
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    sync = verl_builds_replay_buffer(
        v1_config("trainer.v1.sampler.sync_refill_failed_groups=true", "data.train_batch_size=8")
    )
    assert isinstance(sync, RewardReplayBuffer) and type(sync._builtin) is ReplayBuffer
    # the settings verl withholds from a custom sampler reach its own buffer
    assert sync.sync_refill_failed_groups is True and sync.gen_batch_size == 1 and sync.train_batch_size == 8
    assert sync.refill_fn is not None and sync._step_metrics.samples_per_step == 1

    dapo = verl_builds_replay_buffer(
        v1_config(
            "trainer.v1.trainer_mode=separate_async",
            "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.metric=acc",
        )
    )
    assert type(dapo._builtin) is ReplayBufferAsync and dapo.filter_groups_metric == "acc"
    assert dapo._step_metrics.samples_per_step == 4  # verl's separate_async.parameter_sync_step
    assert callable(dapo.wait_for_sampleable) and callable(dapo.get_sampleable_count)


def test_a_colocated_judges_step_is_reported_once_with_its_totals_and_unscored_sessions_are_not_ok(
    monkeypatch,
):
    """A judge on the training GPUs under ``sync`` with ``parameter_sync_step=2``: verl samples each
    mini-batch (unscored: extras {}), then our colocated step scores it, then its aggregator averages
    each key over the mini-batches. The step's ``reward/*`` come once, with its last mini-batch, so
    they are the step's totals (they were per-mini-batch means, beside unscored sessions counted ok)."""
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1.utils import MetricsAggregator

    import async_reward.v1.replay_buffer as replay_buffer
    from async_reward.v1.colocated_judge import _record_scored

    config = v1_config(
        "reward.reward_model.enable=true", "+trainer.v1.sync.parameter_sync_step=2", "data.train_batch_size=2"
    )
    buffer = verl_builds_replay_buffer(config)
    keys = [f"u_{session}_0" for session in range(4)]
    batch = KVBatchMeta(partition_id="train", keys=keys, tags=[{} for _ in keys])
    monkeypatch.setattr(buffer._builtin, "sample", lambda **kwargs: (batch, {}))
    monkeypatch.setattr(replay_buffer, "untrained_sessions", lambda batch: (0, 4))
    monkeypatch.setattr(replay_buffer, "session_reward_extras", lambda batch: [{} for _ in keys])

    def scored(status: str) -> dict[str, Any]:
        return {"status": status, "latency_s": 1.0, "attempts": 1, "failure_reason": "", "excluded": False}

    trainer = type("Trainer", (), {"replay_buffer": buffer, "global_steps": 7})()
    aggregator = MetricsAggregator()
    for mini_batch in ([scored("ok")] * 4, [scored("ok")] * 2 + [scored("timeout")] * 2):
        metrics = dict(buffer.sample(global_steps=7, partition_id="train", batch_size=1)[1])
        assert not any(key.startswith("reward/") for key in metrics)  # unscored: nothing counted
        metrics.update(_record_scored(trainer, mini_batch, untrained=1))
        aggregator.add_step_metrics(metrics, sample_count=len(mini_batch))
    step = aggregator.get_aggregated_metrics()
    assert step["reward/status_ok"] == 6.0 and step["reward/status_timeout"] == 2.0
    assert step["reward/untrained"] == 2.0 and step["reward/latency_p50"] == 1.0
    # with verl's own replay buffer the trainer keeps the step's count (verl's parameter_sync_step)
    plain = type("Trainer", (), {"replay_buffer": object(), "global_steps": 3, "parameter_sync_step": 2})()
    assert _record_scored(plain, [scored("ok")], 0) == {}
    assert _record_scored(plain, [scored("error")], 0)["reward/status_ok"] == 1.0


def test_our_replay_buffer_needs_verls_config():
    with pytest.raises(TypeError, match="built by verl's v1 trainer"):
        RewardReplayBuffer(trainer_mode="sync", trainer_config={}, sampler_kwargs={})


# ----------------------------------------------------------------------------- start-up refusals under v1

EXCLUDE = "+reward.async_reward.on_failure=exclude"
DAPO = ("algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc")


def test_the_pipeline_settings_and_dapo_with_exclude_are_refused_where_v1_starts():
    """``check_v1``: refused by ``prepare_v1_config`` and by our replay buffer, which verl's v1
    trainer builds first (in its ``__init__``); ``fallback`` with DAPO, or exclude without it, are fine."""
    judge = "+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1"
    pipelined = v1_config(judge, "+async_reward.pipeline.mini_batch=true")
    for build in (prepare_v1_config, verl_builds_replay_buffer):
        with pytest.raises(ConfigError, match=r"async_reward\.pipeline is set.*python -m async_reward"):
            build(pipelined.copy())
        with pytest.raises(ConfigError, match=r"filter_groups\.enable=true with .*on_failure=exclude"):
            build(v1_config(judge, EXCLUDE, *DAPO))
        build(v1_config(judge, *DAPO))
        build(v1_config(judge, EXCLUDE))


def test_exclude_under_v1_needs_our_replay_buffer_too():
    """Without it a mini-batch whose every session is excluded would reach verl, which cannot skip it."""
    judge = "+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1"
    agent_loop_only = [line for line in V1_OVERRIDES if "custom_sampler" not in line]
    config = compose_verl_config(["reward.reward_manager.name=llm_judge", *agent_loop_only, judge, EXCLUDE])
    with pytest.raises(ConfigError, match=r"on_failure=.*custom_sampler\.path=pkg://async_reward") as error:
        prepare_verl_config(config)
    assert "cannot skip one" in str(error.value)
    prepare_verl_config(v1_config(judge, EXCLUDE))  # both lines: accepted


@pytest.mark.slow
def test_exclude_in_sync_needs_mini_batches_verl_can_generate_again():
    """Suspicion 1 of issue 16, confirmed by reading verl: ``PPOTrainerSync.on_sample_end`` puts the
    replicas to sleep after each ``sample``, so with ``parameter_sync_step > 1`` a later mini-batch's
    skip would send its prompts to sleeping replicas. Refused where v1 starts, as is a train batch
    verl cannot fetch again in whole ``gen_batch_size`` chunks."""
    judge = "+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1"
    split = ("data.train_batch_size=8", "+trainer.v1.sync.parameter_sync_step=2")
    for build in (prepare_v1_config, verl_builds_replay_buffer):
        with pytest.raises(
            ConfigError, match=r"parameter_sync_step=2: sync puts the rollout replicas to sleep"
        ):
            build(v1_config(judge, EXCLUDE, *split, "+data.gen_batch_size=1"))
        with pytest.raises(ConfigError, match=r"sleeping replicas"):
            build(v1_config(judge, EXCLUDE, *split, "trainer.v1.sampler.sync_refill_failed_groups=true"))
        with pytest.raises(ConfigError, match=r"data.gen_batch_size=3: .*Set data.gen_batch_size=1"):
            build(v1_config(judge, EXCLUDE, "data.train_batch_size=8", "+data.gen_batch_size=3"))
        build(v1_config(judge, EXCLUDE, "data.train_batch_size=8"))  # one mini-batch per step
        build(v1_config(judge, *split))  # nothing excluded, nothing to generate again
        build(v1_config(judge, EXCLUDE, *split, "trainer.v1.trainer_mode=colocate_async"))


#: Our modes' settings under a trainer that never reads them: the trainer lines, and what trains.
OTHER_TRAINERS = [
    (("trainer.v1.trainer_mode=sync",), "trainer.v1.trainer_mode=sync"),
    ((), "trainer.v1.trainer_mode=sync"),  # the mode line forgotten: verl's default
    (("trainer.v1.trainer_mode=colocate_async",), "trainer.v1.trainer_mode=colocate_async"),
    (("trainer.v1.trainer_mode=separate_async",), "trainer.v1.trainer_mode=separate_async"),
    (("trainer.use_v1=false",), "verl's legacy trainer"),
]
#: One setting of each of our modes' nodes, and the mode that reads it.
MODE_SETTINGS = [
    ("+trainer.v1.pipelined.mini_batch=true", "trainer.v1.pipelined.mini_batch", "pipelined"),
    ("+trainer.v1.pipelined.max_staleness=2", "trainer.v1.pipelined.max_staleness", "pipelined"),
    ("+trainer.v1.decoupled.reward_backlog=8", "trainer.v1.decoupled.reward_backlog", "decoupled"),
    ("+trainer.v1.decoupled.staleness_from=submission", "trainer.v1.decoupled.staleness_from", "decoupled"),
]


@pytest.mark.parametrize(("trainer_lines", "training"), OTHER_TRAINERS)
@pytest.mark.parametrize(("setting", "key", "mode"), MODE_SETTINGS)
def test_our_modes_settings_are_refused_under_a_trainer_that_ignores_them(
    trainer_lines, training, setting, key, mode
):
    """Issue 25.4: ``trainer.v1.pipelined.*`` / ``trainer.v1.decoupled.*`` are read only by their own
    mode; under any other trainer they are refused where the setup hook checks (verl building its
    trainer or reward loop: ``apply_legacy_and_check``) and where a launcher prepares the config,
    naming the key, what trains instead, and the mode line as the fix."""
    from async_reward.v1.checks import apply_legacy_and_check

    judge = "+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1"
    # verl's config for the trainer lines, then the setting as hydra's "+key=value" adds it
    config = compose_verl_config(["reward.reward_manager.name=llm_judge", judge, *trainer_lines])
    path, value = setting.removeprefix("+").split("=")
    with open_dict(config):
        OmegaConf.update(config, path, yaml.safe_load(value), force_add=True)
    builds = [apply_legacy_and_check]
    if "trainer.use_v1=false" not in trainer_lines:
        builds.append(prepare_v1_config)
    for build in builds:
        refusal = rf"{key} is set .*but {re.escape(training)}.* is training"
        with pytest.raises(ConfigError, match=refusal) as error:
            build(config.copy())
        assert error.value.key == key
        assert f"trainer.use_v1=true trainer.v1.trainer_mode={mode}" in str(error.value)


def test_our_modes_settings_are_read_under_their_own_mode_and_an_empty_node_is_no_setting():
    from async_reward.v1.checks import check_trainer_mode_settings

    judge = "+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1"
    check_trainer_mode_settings(
        v1_config(judge, "trainer.v1.trainer_mode=pipelined", "+trainer.v1.pipelined.mini_batch=true")
    )
    check_trainer_mode_settings(v1_config(judge, "+trainer.v1.pipelined={}", "+trainer.v1.decoupled={}"))
    with pytest.raises(ConfigError, match=r"trainer\.v1\.decoupled\.reward_backlog is set"):
        check_trainer_mode_settings(
            v1_config(judge, "trainer.v1.trainer_mode=pipelined", "+trainer.v1.decoupled.reward_backlog=8")
        )


#: Settings of our modes that are derived, not keys (issue 44.4; none was in a release): the mode, the
#: line a job might write, and what the refusal must say (the fix, where there is more than deleting).
NOT_KEYS = [
    ("pipelined", "poll_interval_s=0.5", "unknown key"),
    ("decoupled", "poll_interval_s=0.5", "unknown key"),
    ("decoupled", "ledger=raise", "unknown key"),
    ("pipelined", "one_step_off_policy=false", "max_staleness=0 for one_step_off_policy=false"),
    ("pipelined", "one_step_off_policy=true", "delete the line for true"),
]
MODE_LOADERS = {
    "pipelined": "async_reward.v1.pipelined.config:load_pipelined_mode_config",
    "decoupled": "async_reward.v1.decoupled.config:load_decoupled_mode_config",
}


@pytest.mark.parametrize(("mode", "line", "said"), NOT_KEYS, ids=[f"{m}.{line}" for m, line, _ in NOT_KEYS])
def test_a_derived_setting_is_refused_by_name_where_the_launcher_and_the_trainer_read_it(mode, line, said):
    """Issue 44.4: how often the modes poll, what an unbalanced ledger does and whether batches
    generate ahead (``max_staleness`` alone) are not keys: set, each is refused at start-up, where a
    launcher prepares the config and where the trainer reads its node, naming the key and the fix;
    the same lines without it load."""
    import importlib

    module_name, loader_name = MODE_LOADERS[mode].split(":")
    loader = getattr(importlib.import_module(module_name), loader_name)
    key = f"trainer.v1.{mode}.{line.split('=')[0]}"
    judge = "+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1"
    lines = (judge, "algorithm.adv_estimator=grpo", f"trainer.v1.trainer_mode={mode}")
    loader(v1_config(*lines))
    prepare_v1_config(v1_config(*lines))
    for build in (prepare_v1_config, loader):
        with pytest.raises(ConfigError) as refused:
            build(v1_config(*lines, f"+trainer.v1.{mode}.{line}"))
        assert refused.value.key == key, refused.value
        assert said in str(refused.value), refused.value


@pytest.mark.parametrize("value", [-1, 1.5, "many", True])
def test_a_bad_number_of_untrained_skips_is_refused_where_v1_starts(value):
    judge = "+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1"
    for build in (prepare_v1_config, verl_builds_replay_buffer):
        config = v1_config(judge, EXCLUDE)
        with open_dict(config):
            config.trainer.v1.sampler.sampler_kwargs.max_untrained_skips = value
        with pytest.raises(
            ConfigError, match=r"trainer\.v1\.sampler\.sampler_kwargs\.max_untrained_skips="
        ) as error:
            build(config)
        assert "must be an integer >= 0" in str(error.value)
    config = v1_config(judge, EXCLUDE, "+trainer.v1.sampler.sampler_kwargs.max_untrained_skips=0")
    assert verl_builds_replay_buffer(config).max_untrained_skips == 0
    assert verl_builds_replay_buffer(v1_config(judge, EXCLUDE)).max_untrained_skips == 8


def test_the_decoupled_modes_sampler_reads_max_untrained_skips_as_its_bound_on_failed_groups():
    """Under ``trainer_mode=decoupled`` verl builds our replay buffer around the mode's sampler, which
    takes the same key (``DecoupledReplayBufferAsync._count_failed``: batches' worth of failed groups
    evicted with nothing sampled), default 8."""
    import async_reward.v1.decoupled.trainer  # noqa: F401 (registers the mode with verl)

    mode = "trainer.v1.trainer_mode=decoupled"
    bounded = verl_builds_replay_buffer(
        v1_config(mode, "+trainer.v1.sampler.sampler_kwargs.max_untrained_skips=3")
    )
    assert type(bounded._builtin).__name__ == "DecoupledReplayBufferAsync"
    assert bounded._builtin.max_untrained_skips == bounded.max_untrained_skips == 3
    assert verl_builds_replay_buffer(v1_config(mode))._builtin.max_untrained_skips == 8


def test_a_sampler_kwarg_our_sampler_does_not_read_is_refused_and_a_users_own_sampler_keeps_its_own():
    """verl hands ``sampler_kwargs`` to the custom sampler only: ours reads ``max_untrained_skips``, so a
    misspelt ``max_untrained_skip=0`` would have left the default 8 in silence."""
    judge = "+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1"
    misspelt = "+trainer.v1.sampler.sampler_kwargs.max_untrained_skip=0"
    for build in (prepare_v1_config, verl_builds_replay_buffer):
        with pytest.raises(ConfigError) as refused:
            build(v1_config(judge, misspelt))
        assert refused.value.key == "trainer.v1.sampler.sampler_kwargs.max_untrained_skip"
        assert "whose only key there is max_untrained_skips" in str(refused.value)
    # A sampler of the user's own reads its own keys: not ours to refuse.
    own = compose_verl_config(
        [
            "reward.reward_manager.name=llm_judge",
            judge,
            "trainer.v1.sampler.custom_sampler.path=pkg://my_project.sampler",
            "trainer.v1.sampler.custom_sampler.name=MySampler",
            "+trainer.v1.sampler.sampler_kwargs.temperature=0.5",
        ]
    )
    from async_reward.v1.checks import check_v1

    check_v1(own)


def test_declaring_our_trainer_turns_v1_off_so_verls_reward_loop_check_admits_it():
    """Our pipelined trainer is verl's legacy one: the setup hook's v1 check never refuses it."""
    from async_reward.wiring.integration import declare_pipelined_trainer

    config = declare_pipelined_trainer(compose_verl_config(["reward.reward_manager.name=llm_judge"]))
    assert config.trainer.use_v1 is False and config.async_reward.pipeline == {}


def test_sampler_metrics_of_a_skip_merge_by_meaning():
    """Two ``sample`` results of one mini-batch (the second after a skip), with the metrics verl's
    replay buffer reports: counts add, the staleness mean is re-weighted by its counts, max / min stay
    max / min, and DAPO's dict of counts adds per entry (it used to be replaced, the rest summed)."""
    from verl.trainer.ppo.v1.replay_buffer import DAPO_FILTERED_REWARD_COUNTS_KEY as DAPO

    prefix = "train/replay_buffer"
    first = {
        f"{prefix}/off_policy/evicted_samples": 1,
        f"{prefix}/off_policy/evicted_samples_staleness/mean": 2.0,
        f"{prefix}/off_policy/evicted_samples_staleness/max": 2.0,
        f"{prefix}/off_policy/evicted_samples_staleness/min": 2.0,
        f"{prefix}/filter_groups/evicted_samples": 2,
        DAPO: {"0.0": 1, "1.0": 1},
    }
    second = {
        f"{prefix}/off_policy/evicted_samples": 3,
        f"{prefix}/off_policy/evicted_samples_staleness/mean": 3.0,
        f"{prefix}/off_policy/evicted_samples_staleness/max": 4.0,
        f"{prefix}/off_policy/evicted_samples_staleness/min": 2.5,
        DAPO: {"1.0": 2},
    }
    merged = merge_sampler_metrics(first, second)
    assert merged == {
        f"{prefix}/off_policy/evicted_samples": 4,
        f"{prefix}/off_policy/evicted_samples_staleness/mean": (2.0 * 1 + 3.0 * 3) / 4,
        f"{prefix}/off_policy/evicted_samples_staleness/max": 4.0,
        f"{prefix}/off_policy/evicted_samples_staleness/min": 2.0,
        f"{prefix}/filter_groups/evicted_samples": 2,
        DAPO: {"0.0": 1, "1.0": 3},
    }
    assert merge_sampler_metrics({}, second) == second and merge_sampler_metrics(first, {}) == first
