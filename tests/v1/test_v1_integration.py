"""Our managers under verl's v1 trainer, on CPU, through verl's real v1 code.

Each test trains with ``PPOTrainer.fit`` of the configured v1 mode: verl's agent loop (our
``RewardAgentLoopManager`` / worker, named by the config), verl's ``RewardLoopManager`` whose Ray
workers run our managers, TransferQueue, and verl's replay buffer (our ``RewardReplayBuffer``, named
by the config). The config is composed from the README's lines (``V1_OVERRIDES`` plus the manager's
own). Stand-ins replace only the token-generating server, the actor's model and the weight sync
(tests/support/v1_standins.py). What the actor would train on and what v1 logs are checked.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from async_reward import ConfigError
from async_reward.v1 import AGENT_LOOP_MANAGER, V1_OVERRIDES
from async_reward.v1.agent_loop import excluded_uid
from async_reward.v1.replay_buffer import session_reward_extras, untrained_sessions
from async_reward.wiring.integration import SETUP_HOOK
from tests.managers.test_managers import STATEFUL_CLASS, USER_FUNCTIONS, write_module
from tests.support.v1_standins import (
    ScriptedRollout,
    TrainingRun,
    base_overrides,
    clear_partition,
    compose_v1_config,
    group_by_index,
    run_v1_training,
    sessions,
    write_dataset,
)

pytestmark = pytest.mark.usefixtures("ray_cluster")

STANDARD_KEYS = {"status", "latency_s", "attempts", "failure_reason"}
FAST_RETRY = [
    "+reward.async_reward.retry.initial_backoff_s=0.01",
    "+reward.async_reward.retry.jitter_s=0.0",
]


def train(
    tmp_path: Path,
    model_dir: Path,
    rollout: ScriptedRollout,
    rows: list[tuple[str, str]],
    script: dict[str, list[str]],
    reward_lines: list[str],
    *,
    n: int,
    prompts: int = 2,
    steps: int = 1,
    mode: str = "sync",
    validate_first: bool = False,
    mini_batch: int | None = None,
) -> TrainingRun:
    dataset = write_dataset(tmp_path / "train.parquet", rows)
    overrides = [
        *base_overrides(model_dir, dataset, steps=steps, prompts=prompts, n=n, mini_batch=mini_batch),
        f"trainer.v1.trainer_mode={mode}",
        *V1_OVERRIDES,
        *reward_lines,
        f"trainer.val_before_train={str(validate_first).lower()}",
    ]
    config = compose_v1_config(overrides)
    return run_v1_training(config, rollout, script, tmp_path / "metrics.jsonl")


def step_logs(run: TrainingRun) -> list[dict[str, Any]]:
    """The metrics v1 logged for each training step (validation-only entries left out)."""
    return [entry["data"] for entry in run.logged if "training/global_step" in entry["data"]]


def assert_reward_metrics_every_step(run: TrainingRun, steps: int, samples_per_step: int) -> None:
    logs = step_logs(run)
    assert len(logs) == steps
    for metrics in logs:
        counted = sum(metrics[f"reward/status_{s}"] for s in ("ok", "timeout", "error", "invalid"))
        assert counted == samples_per_step, metrics
        for key in ("reward/excluded", "reward/untrained", "reward/retries", "reward/latency_p50"):
            assert key in metrics, key
        latencies = [metrics[f"reward/latency_{q}"] for q in ("p50", "p95", "max")]
        assert 0 <= latencies[0] <= latencies[1] <= latencies[2]


def assert_same_extras_keys(run: TrainingRun) -> set[str]:
    keys = {frozenset(row.reward_extra_info) for update in run.updates for row in sessions(update)}
    assert len(keys) == 1, keys
    (only,) = keys
    assert set(only) >= STANDARD_KEYS
    return set(only)


# ----------------------------------------------------------------------------- llm_judge, sync mode

JUDGE_ROWS = [("What is 2+3?", "5"), ("What is 4*4?", "16"), ("What is 7+1?", "8"), ("What is 9-4?", "5")]
JUDGE_SCRIPT = {
    "What is 2+3?": ["The answer is 5", "The answer is 6", "The answer is 5", "The answer is 5"],
    "What is 4*4?": ["The answer is 16", "It is 15 @@fault:hang@@", "The answer is 16", "The answer is 4"],
    "What is 7+1?": ["The answer is 8", "The answer is 8", "The answer is 9", "The answer is 9"],
    "What is 9-4?": ["The answer is 5", "The answer is 1", "The answer is 2", "The answer is 3"],
}
JUDGE_SCORES = {
    0: [0.0, 1.0, 1.0, 1.0],
    1: [0.0, 0.0, 1.0, 1.0],
    2: [0.0, 0.0, 1.0, 1.0],
    3: [0.0, 0.0, 0.0, 1.0],
}


def test_llm_judge_trains_under_v1_with_per_step_metrics_and_a_hanging_judge(
    tmp_path, model_dir, rollout, transfer_queue, server
):
    """The README's lines, verl's v1 sync trainer, two steps; one judge call hangs on every attempt."""
    timeout_s = 1.5
    run = train(
        tmp_path,
        model_dir,
        rollout,
        JUDGE_ROWS,
        JUDGE_SCRIPT,
        [
            "reward.reward_manager.name=llm_judge",
            f"+reward.async_reward.judge.base_url={server.url}/v1",
            f"+reward.async_reward.timeout_s={timeout_s}",
            "+reward.async_reward.retry.max_attempts=2",
            *FAST_RETRY,
        ],
        n=4,
        steps=2,
    )
    # Scores and our extras reach the batch the replay buffer handed out, the same keys everywhere.
    assert len(run.updates) == 2
    for update in run.updates:
        groups = group_by_index(update)
        assert len(groups) == 2 and all(len(group) == 4 for group in groups.values())
        for index, group in groups.items():
            assert sorted(row.score for row in group) == JUDGE_SCORES[index]
    keys = assert_same_extras_keys(run)
    assert {"judge_verdict", "judge_tokens", "judge_shared"} <= keys

    # The hanging judge became a timeout within its deadline; its group completed and was trained.
    rows = [row for update in run.updates for row in sessions(update)]
    (hung,) = [row for row in rows if row.reward_extra_info["status"] != "ok"]
    info = hung.reward_extra_info
    assert info["status"] == "timeout" and info["attempts"] == 2 and "deadline" in info["failure_reason"]
    # Two deadlines, not a hang: ``attempts == 2`` already rules out a third attempt; the upper bound
    # (30 s of slack in a Ray worker on a busy CPU) only catches a deadline that was not enforced.
    assert 2 * timeout_s <= info["latency_s"] < 2 * timeout_s + 30.0
    assert hung.score == 0.0 and hung.index == 1
    assert server.stats()["faults_injected"].get("hang") == 2

    # reward/* metrics are in what v1 logged for every training step.
    assert_reward_metrics_every_step(run, steps=2, samples_per_step=8)
    logs = step_logs(run)
    assert [m["reward/status_timeout"] for m in logs] == [1.0, 0.0]
    assert [m["reward/retries"] for m in logs] == [1.0, 0.0]
    assert logs[0]["reward/latency_max"] >= 2 * timeout_s
    assert all(m["reward/excluded"] == 0.0 for m in logs)
    # Seven verdicts of 10 or 0 (five right answers); the timed-out sample's NaN is left out, not a 0.
    assert logs[0]["reward/extra/judge_verdict/mean"] == pytest.approx(50 / 7)
    assert all(0 <= m["reward/extra/judge_shared/mean"] <= 1 for m in logs)  # a boolean: a fraction
    # What judging cost, per step: summed over the run, the calls and tokens the judge server counted.
    stats = server.stats()
    assert sum(m["reward/cost/calls"] for m in logs) == stats["requests_by_path"]["/v1/chat/completions"]
    assert sum(m["reward/cost/tokens"] for m in logs) == stats["tokens_total"] > 0


# ----------------------------------------------------------------------------- async_remote
# (async_rate_limited runs in the raise test, async_naive in the exclude test, async_stateful in the
# post-processing test: each Ray worker process costs seconds, so each run proves two things)

ROWS = [("What is 2+3?", "5"), ("What is 4*4?", "16")]
SCRIPT = {
    "What is 2+3?": ["The answer is 5", "The answer is 6", "The answer is 5", "The answer is 7"],
    "What is 4*4?": ["The answer is 16", "The answer is 16", "The answer is 3", "The answer is 16"],
}
SCORES = {0: [0.0, 0.0, 1.0, 1.0], 1: [0.0, 1.0, 1.0, 1.0]}


def test_async_remote_reaches_the_v1_batch(tmp_path, model_dir, rollout, transfer_queue, server):
    lines = [
        "reward.reward_manager.name=async_remote",
        f"+reward.async_reward.remote.url={server.url}/score",
        *FAST_RETRY,
    ]
    run = train(tmp_path, model_dir, rollout, ROWS, SCRIPT, lines, n=4)
    groups = group_by_index(run.updates[0])
    assert {index: sorted(row.score for row in group) for index, group in groups.items()} == SCORES
    assert {"acc", "pred"} <= assert_same_extras_keys(run)  # the service's extras
    assert server.stats()["requests_by_path"].get("/score", 0) >= 8
    assert_reward_metrics_every_step(run, steps=1, samples_per_step=8)
    assert step_logs(run)[0]["reward/status_ok"] == 8.0


# ----------------------------------------------------------------------------- group post-processing


SHIFTING_SUBCLASS = """

class ShiftingRewardAgent(RewardAgent):
    def post_process_scores(self, rewards):
        return [score + 10.0 for score in super().post_process_scores(rewards)]
"""


def test_stateful_group_postprocessing_runs_once_per_group_before_sampling(
    tmp_path, model_dir, rollout, transfer_queue
):
    """The recipe's imputation: a failed member's score (NaN) becomes its group's mean of the rest;
    then +10 per pass, so a group post-processed twice (or not at all) shows it."""
    script = {
        "What is 2+3?": ["The answer is 5", "fail", "The answer is 2", "The answer is 5"],
        "What is 4*4?": ["fail", "The answer is 16", "The answer is 16", "The answer is 16"],
    }
    agent = write_module(tmp_path, STATEFUL_CLASS + SHIFTING_SUBCLASS, "agent.py")
    run = train(
        tmp_path,
        model_dir,
        rollout,
        ROWS,
        script,
        [
            "reward.reward_manager.name=async_stateful",
            f"reward.custom_reward_function.path={agent}",
            "reward.custom_reward_function.name=ShiftingRewardAgent",
            "+reward.async_reward.extra_defaults={judge_query:'',judge_explanation:''}",
        ],
        n=4,
        validate_first=True,  # v1's validation runs through the same worker and replay buffer
    )
    groups = group_by_index(run.updates[0])
    failed = {
        i: [row for row in group if row.reward_extra_info["status"] != "ok"] for i, group in groups.items()
    }
    assert [row.reward_extra_info["status"] for row in failed[0] + failed[1]] == ["error", "error"]
    # group 0: [1, nan, 0, 1] -> nan := 2/3; group 1: [nan, 1, 1, 1] -> nan := 1; then +10, once
    assert failed[0][0].score == pytest.approx(10 + 2 / 3) and failed[1][0].score == pytest.approx(11.0)
    assert sorted(row.score for row in groups[0]) == pytest.approx([10.0, 10 + 2 / 3, 11.0, 11.0])
    assert sorted(row.score for row in groups[1]) == pytest.approx([11.0] * 4)
    assert_same_extras_keys(run)
    assert step_logs(run)[0]["reward/status_error"] == 2.0
    (validation,) = [entry["data"] for entry in run.logged if entry["step"] == 0]
    assert any(key.startswith("val-core/v1test/reward/") for key in validation), validation
    assert not any(key.startswith("reward/") for key in validation)  # sampler metrics are training only


# ----------------------------------------------------------------------------- on_failure: raise


def test_raise_fails_the_group_and_v1_replaces_it(tmp_path, model_dir, rollout, transfer_queue):
    """colocate_async with ``async_rate_limited``: the group whose sample raised is tagged failed,
    evicted and replaced; the run neither crashes nor hangs, and no member of that group is trained on."""
    rows = [("What is 1+1?", "2"), ("What is 2+3?", "5"), ("What is 4*4?", "16"), ("What is 7+1?", "8")]
    # enough rows that the run never comes back to row 0 (warm-up 2, two steps of 2, one refill)
    rows += [("What is 9-4?", "5"), ("What is 3*3?", "9"), ("What is 6+1?", "7"), ("What is 8-5?", "3")]
    script = {question: [f"The answer is {truth}", "The answer is 0"] for question, truth in rows}
    script["What is 1+1?"] = ["The answer is 2", "boom"]
    run = train(
        tmp_path,
        model_dir,
        rollout,
        rows,
        script,
        [
            "reward.reward_manager.name=async_rate_limited",
            f"reward.custom_reward_function.path={write_module(tmp_path, USER_FUNCTIONS)}",
            "reward.custom_reward_function.name=sync_score",
            "+reward.async_reward.limits.requests_per_minute=6000",
            "+reward.async_reward.on_failure=raise",
        ],
        n=2,
        steps=2,
        mode="colocate_async",
    )
    assert len(run.updates) == 2
    trained = [row for update in run.updates for row in sessions(update)]
    assert 0 not in {row.index for row in trained}
    for update in run.updates:  # the user function's scores: one right and one wrong answer per group
        assert all(
            sorted(row.score for row in group) == [0.0, 1.0] for group in group_by_index(update).values()
        )
    assert_same_extras_keys(run)
    logs = step_logs(run)
    assert sum(m.get("training/rollout_failure/evicted_samples", 0) for m in logs) == 1
    assert_reward_metrics_every_step(run, steps=2, samples_per_step=4)
    assert all(m["reward/status_ok"] == 4.0 for m in logs)


# ----------------------------------------------------------------------------- on_failure: exclude

EXCLUDING_FUNCTION = """
def score_or_fail(data_source, solution_str, ground_truth, extra_info=None):
    if "fail" in solution_str:
        raise ConnectionError("judge unavailable")
    return float(str(ground_truth) in solution_str)
"""


def excluding_reward(tmp_path: Path) -> list[str]:
    """``async_naive`` over ``score_or_fail`` with ``on_failure: exclude`` and no retry."""
    return [
        "reward.reward_manager.name=async_naive",
        f"reward.custom_reward_function.path={write_module(tmp_path, EXCLUDING_FUNCTION, 'exclude.py')}",
        "reward.custom_reward_function.name=score_or_fail",
        "+reward.async_reward.on_failure=exclude",
        "+reward.async_reward.retry.max_attempts=1",
    ]


def grpo_advantages(scores: list[float]) -> list[float]:
    """verl's GRPO outcome advantage of one group: (score - mean) / (std + 1e-6), unbiased std."""
    values = torch.tensor(scores)
    return ((values - values.mean()) / (values.std() + 1e-6)).tolist()


def test_excluded_sample_gets_no_loss_and_its_group_advantages_come_from_the_scored(
    tmp_path, model_dir, rollout, transfer_queue
):
    """``async_naive`` with ``on_failure: exclude`` and a user function that fails one sample: it keeps
    its ``error`` status, is flagged ``excluded`` by the manager, and trains on nothing."""
    script = {
        "What is 2+3?": ["The answer is 5", "fail", "The answer is 2", "The answer is 5"],
        # Three of four fail: one scored member cannot make a group-relative advantage; none trains.
        "What is 4*4?": ["fail", "The answer is 16", "fail", "fail"],
    }
    run = train(
        tmp_path,
        model_dir,
        rollout,
        ROWS,
        script,
        excluding_reward(tmp_path),
        n=4,
    )
    group = group_by_index(run.updates[0])[0]
    (excluded,) = [row for row in group if row.reward_extra_info["excluded"]]
    scored = [row for row in group if row is not excluded]
    real_uid = scored[0].uid
    assert {row.uid for row in scored} == {real_uid}
    assert excluded.key.startswith(f"{real_uid}_")  # still its group's member in the replay buffer
    assert excluded.uid == excluded_uid(real_uid, int(excluded.key.split("_")[1]))
    assert excluded.reward_extra_info["status"] == "error" and excluded.score == 0.0
    assert excluded.mask_tokens == 0 and excluded.advantage == 0.0  # nothing to any loss
    expected = dict(zip([1.0, 0.0], grpo_advantages([1.0, 0.0, 1.0])[:2], strict=True))
    for row in scored:
        assert row.mask_tokens > 0
        assert row.advantage == pytest.approx(expected[row.score], abs=1e-4)
    assert not math.isclose(expected[1.0], grpo_advantages([1.0, 0.0, 0.0, 1.0])[0], abs_tol=1e-3)
    starved = group_by_index(run.updates[0])[1]
    assert sorted(row.reward_extra_info["excluded"] for row in starved) == [False, True, True, True]
    assert all(row.mask_tokens == 0 for row in starved)  # the lone scored member trains on nothing too
    (metrics,) = step_logs(run)
    assert metrics["reward/excluded"] == 4.0 and metrics["reward/status_error"] == 4.0
    assert metrics["reward/untrained"] == 5.0  # the excluded four and the starved group's scored one
    assert Counter(row.reward_extra_info["status"] for row in sessions(run.updates[0]))["ok"] == 4


def test_a_mini_batch_with_nothing_to_train_is_skipped_and_its_prompts_generated_again(
    tmp_path, model_dir, rollout, transfer_queue, caplog
):
    """Every session of the first mini-batch excluded: verl v1 cannot skip an update (rollout
    correction stops the run, or AdamW steps on a zero gradient), so our replay buffer never hands it
    out. It clears the batch, has verl generate as many prompts again, and trains on those; the
    skipped sessions still count in the step's reward metrics."""
    caplog.set_level(logging.WARNING, logger="async_reward.v1.replay_buffer")
    script = {"What is 2+3?": ["fail", "fail"], "What is 4*4?": ["The answer is 16", "The answer is 3"]}
    run = train(
        tmp_path,
        model_dir,
        rollout,
        ROWS,
        script,
        excluding_reward(tmp_path),
        n=2,
        prompts=1,
    )
    (update,) = run.updates
    assert sorted(row.score for row in update) == [0.0, 1.0]  # the second prompt, scored and trained
    assert all(row.mask_tokens > 0 for row in update)
    assert {row.reward_extra_info["status"] for row in update} == {"ok"}
    (metrics,) = step_logs(run)
    assert metrics["reward/skipped_batches"] == 1.0
    assert metrics["reward/status_error"] == 2.0 and metrics["reward/excluded"] == 2.0  # still counted
    assert metrics["reward/status_ok"] == 2.0 and metrics["reward/untrained"] == 2.0
    (warning,) = [r.getMessage() for r in caplog.records if "train on nothing" in r.getMessage()]
    assert (
        warning.startswith("step 1: all 2 sessions") and "skipped, and 1 prompt(s) generated again" in warning
    )


@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_no_optimizer_update_of_verls_trains_on_excluded_rows_only(
    tmp_path, model_dir, rollout, transfer_queue, mode
):
    """3 prompts x 2 sessions, ``ppo_mini_batch_size=1``: verl's actor makes three AdamW updates of 2
    rows each from the sampled batch. Two prompts' sessions are all excluded: the batch as a whole
    trains, but 4 rows without a loss token in 3 updates of 2 leave at least one update with none,
    whatever verl's order, and AdamW (momentum, weight decay) would still move the weights on it. Our
    replay buffer hands verl only the rows that keep every update trained, so every AdamW step the
    actor takes has loss tokens."""
    rows = [*ROWS, ("What is 7+1?", "8"), ("What is 9-4?", "5"), ("What is 3*3?", "9"), ("What is 6+1?", "7")]
    script = {question: [f"The answer is {truth}", "The answer is 0"] for question, truth in rows}
    # sync trains on rows 0-2 (two of them fail whole); colocate_async on 3 of its 6 warm-up and step
    # prompts, which ones is verl's choice, so at least one of them is scored.
    script["What is 2+3?"] = script["What is 7+1?"] = ["fail", "fail"]
    run = train(
        tmp_path,
        model_dir,
        rollout,
        rows,
        script,
        excluding_reward(tmp_path),
        n=2,
        prompts=3,
        mini_batch=1,
        mode=mode,
    )
    assert run.steps, "the actor took no optimizer step"
    assert all(step.weight_change > 0 for step in run.steps)  # AdamW steps move the weights...
    assert [step.loss_tokens > 0 for step in run.steps] == [True] * len(run.steps)  # ...only on tokens
    (update,) = run.updates
    assert update and all(row.mask_tokens > 0 for row in update)  # 2 sessions per group: no filler
    (metrics,) = step_logs(run)
    assert metrics["reward/excluded"] == metrics["reward/untrained"] == 6 - len(update)  # still counted
    assert metrics["reward/status_error"] == 6 - len(update) and metrics["reward/skipped_batches"] == 0.0
    if mode == "sync":
        assert metrics["reward/excluded"] == 4  # 4 rows without a loss token, 3 updates of 2 rows


@pytest.mark.parametrize(("mode", "skips"), [("sync", 1), ("colocate_async", 2)])
def test_a_reward_service_that_stays_down_stops_the_run_saying_so(
    tmp_path, model_dir, rollout, transfer_queue, caplog, mode, skips
):
    """Every mini-batch has nothing to train on: each one is dropped and its prompt generated again
    (verl's refill, in both schedules), and after ``max_untrained_skips`` drops in a row the run stops
    with an error that names the cause and the setting: never a hang, never verl's 'response_mask must
    contain at least one valid token', never an update on a zero gradient."""
    caplog.set_level(logging.WARNING, logger="async_reward.v1.replay_buffer")
    with pytest.raises(
        RuntimeError, match=f"{skips + 1} mini-batches in a row had nothing to train on"
    ) as error:
        train(
            tmp_path,
            model_dir,
            rollout,
            ROWS[:1],
            {"What is 2+3?": ["fail", "fail"]},
            [*excluding_reward(tmp_path), f"+trainer.v1.sampler.sampler_kwargs.max_untrained_skips={skips}"],
            n=2,
            prompts=1,
            mode=mode,
        )
    assert f"trainer.v1.sampler.sampler_kwargs.max_untrained_skips (now {skips})" in str(error.value)
    warnings = [r.getMessage() for r in caplog.records if "train on nothing" in r.getMessage()]
    assert [w.split("(skip ")[1] for w in warnings] == [
        f"{k} of at most {skips} in a row)" for k in range(1, skips + 1)
    ]


# ----------------------------------------------------------------------------- start-up refusals

PIPELINE_LINE = "+async_reward.pipeline.mini_batch=true"


def raised_in(error: pytest.ExceptionInfo[Any], path: str) -> bool:
    return any(str(entry.path).endswith(path) for entry in error.traceback)


@ray.remote
def build_verls_reward_loop_manager(config: Any) -> str:
    """What verl's ``TaskRunnerV1`` does in its Ray actor, where our setup hook ran (Ray worker)."""
    from verl.experimental.reward_loop import RewardLoopManager

    try:
        RewardLoopManager(config=config)
    except ConfigError as exc:
        return str(exc)
    return "built"


def test_pipeline_settings_under_v1_are_refused_where_v1_builds_our_parts(
    tmp_path, model_dir, rollout, transfer_queue, monkeypatch
):
    """The pipelined trainer's settings under verl's v1 trainer: a ConfigError at start-up naming the
    fix, not groups that fail forever (async modes) or verl's "no materializable trajectories" (sync).

    The verl plugin (loaded in this process by ``import verl``) refuses them where verl builds its
    trainer, before any of our parts; each part also refuses on its own, for a process without the
    plugin (a launcher of your own with verl's plugins off), shown with the plugin's check switched
    off here."""
    dataset = write_dataset(tmp_path / "train.parquet", ROWS)
    function = write_module(tmp_path, EXCLUDING_FUNCTION, "score.py")
    common = [
        *base_overrides(model_dir, dataset, steps=1, prompts=2, n=2),
        "reward.reward_manager.name=async_naive",
        f"reward.custom_reward_function.path={function}",
        "reward.custom_reward_function.name=score_or_fail",
        "trainer.val_before_train=false",
        PIPELINE_LINE,
    ]
    fix = "python -m async_reward.legacy.main_ppo"
    # No line of ours: the plugin's check where verl builds its trainer refuses, before anything else.
    config = compose_v1_config([*common, "trainer.v1.trainer_mode=colocate_async"])
    with pytest.raises(ConfigError, match=fix) as refused:
        run_v1_training(config, rollout, SCRIPT, tmp_path / "plugin.jsonl")
    assert raised_in(refused, "async_reward/wiring/verl_plugin.py")
    import async_reward.wiring.verl_plugin

    monkeypatch.setattr(async_reward.wiring.verl_plugin, "prepare_where_verl_builds", lambda config: None)
    # The README's v1 lines: our replay buffer, the first part the v1 trainer builds, refuses.
    config = compose_v1_config([*common, "trainer.v1.trainer_mode=colocate_async", *V1_OVERRIDES])
    with pytest.raises(ConfigError, match=fix) as refused:
        run_v1_training(config, rollout, SCRIPT, tmp_path / "a.jsonl")
    assert raised_in(refused, "async_reward/v1/replay_buffer.py")
    # Only the agent-loop line: our manager refuses when verl's TaskRunnerV1 creates it.
    hook = f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}"
    agent_line = f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={AGENT_LOOP_MANAGER}"
    config = compose_v1_config([*common, "trainer.v1.trainer_mode=sync", hook, agent_line])
    with pytest.raises(ConfigError, match=fix) as refused:
        run_v1_training(config, rollout, SCRIPT, tmp_path / "b.jsonl")
    assert raised_in(refused, "async_reward/v1/agent_loop.py")
    # Neither line (verl's own v1 agent loop): verl's RewardLoopManager, checked by our setup hook.
    config = compose_v1_config(common)
    message = ray.get(build_verls_reward_loop_manager.remote(config), timeout=120)
    assert fix in message and "async_reward.pipeline" in message


def test_session_extras_count_each_session_once_by_its_last_output(transfer_queue):
    """A multi-output session (several ``{uid}_{session}_{index}`` keys) is one sample in ``reward/*``,
    read from its last output; ``untrained_sessions`` counts a session trained if any output is."""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    keys = ["u1_0_0", "u1_0_1", "u1_0_2", "u1_1_0", "u2_0_1", "u2_0_0"]
    infos = [{"status": "error", "turn": k} for k in keys]  # the last output of each session: its verdict
    mask_tokens = [0, 3, 0, 0, 0, 0]
    fields = [
        {
            "extra_fields": {"reward_extra_info": info},
            "loss_mask": torch.tensor([1] * n + [0] * (4 - n), dtype=torch.int64),
        }
        for info, n in zip(infos, mask_tokens, strict=True)
    ]
    import transfer_queue as tq

    batch = tq.kv_batch_put(
        keys=keys, partition_id="dedup", fields=list_of_dict_to_tensordict(fields), tags=[{}] * len(keys)
    )
    try:
        extras = session_reward_extras(batch)
        assert [info["turn"] for info in extras] == ["u1_0_2", "u1_1_0", "u2_0_1"]
        assert untrained_sessions(batch) == (2, 3)  # u1_0 trains (one output has loss tokens)
    finally:
        tq.kv_clear(keys=keys, partition_id="dedup")


def test_a_lone_scored_member_beside_excluded_ones_trains_on_nothing(transfer_queue):
    """Suspicion 3 of issue 16, confirmed: in ``sync`` (no ``sync_refill_failed_groups``) verl hands out
    a group tagged ``failure`` with whatever its sessions wrote. If a session fails after its group's
    gate opened, a group of three can reach the sampler as one excluded session and one scored one, and
    the scored one would train on verl's GRPO advantage of a group of one (its raw score). Our replay
    buffer gives it no loss token; a complete group, and a group of one that lost nobody, keep theirs."""
    import transfer_queue as tq
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from tests.v1.test_v1_units import EXCLUDE, v1_config, verl_builds_replay_buffer

    tokens = {"g_0_0": 0, "g_1_0": 3, "h_0_0": 2, "h_1_0": 2, "h_2_0": 0, "k_0_0": 2}
    fields = [
        {
            "loss_mask": torch.tensor([1] * n + [0] * (4 - n), dtype=torch.int64),
            "response_mask": torch.tensor([1] * n + [0] * (4 - n), dtype=torch.int64),
            "extra_fields": {"reward_extra_info": {"status": "ok" if n else "error", "excluded": not n}},
        }
        for n in tokens.values()
    ]
    keys = list(tokens)
    tq.kv_batch_put(
        keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=[{}] * len(keys)
    )
    for uid, status in (("g", "failure"), ("h", "finished"), ("k", "failure")):
        tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": status, "global_steps": 1})
    try:
        buffer = verl_builds_replay_buffer(
            v1_config(
                "+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1",
                EXCLUDE,
                "data.train_batch_size=3",
            )
        )
        batch, _ = buffer.sample(global_steps=1, partition_id="train", batch_size=3)
        data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["loss_mask", "response_mask"])
        for name in ("loss_mask", "response_mask"):
            counts = dict(zip(keys, data[name].to_padded_tensor(0).sum(dim=1).tolist(), strict=True))
            assert counts == {**tokens, "g_1_0": 0}, name
        assert sorted(batch.keys) == sorted(keys)  # handed out as verl sampled it, masks changed
    finally:
        clear_partition("train")


async def test_an_excluded_session_without_a_group_gate_is_still_masked(transfer_queue):
    """Suspicion 2 of issue 16. A session reaches ``_agent_loop_postprocess`` without a gate only if its
    group's size could not be read, and verl's ``_run_prompt`` then fails the group before starting a
    session (it reads the same size), so no such session is written. Should one arrive anyway, it
    fails closed: an excluded session is written with no loss token and a uid of its own, through
    verl's own TransferQueue write (the worker built without its Ray actor and servers)."""
    import transfer_queue as tq
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    from async_reward.v1.agent_loop import RewardAgentLoopWorker

    worker = RewardAgentLoopWorker.__new__(RewardAgentLoopWorker)
    worker._gates = {}  # no gate for this group
    worker.reward_loop_worker_handles = None  # the score is already set: verl's reward call is a no-op
    worker.distillation_enabled = False
    worker.processor = None
    output = AgentLoopOutput(
        prompt_ids=[5, 6, 7],
        response_ids=[8, 9],
        response_mask=[1, 1],
        reward_score=0.5,
        metrics=AgentLoopMetrics(),
        extra_fields={"reward_extra_info": {"status": "error", "excluded": True}},
    )
    await worker._agent_loop_postprocess(output, False, uid="gateless", session_id=0, global_steps=1)
    try:
        data = tq.kv_batch_get(
            keys=["gateless_0_0"], partition_id="train", select_fields=["loss_mask", "uid"]
        )
        assert data["loss_mask"].to_padded_tensor(0).sum() == 0
        assert list(data["uid"]) == [excluded_uid("gateless", 0)]
    finally:
        clear_partition("train")
