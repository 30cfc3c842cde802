"""verl v1 trainer mode ``decoupled`` (``async_reward.v1.decoupled_trainer``), on CPU, through verl's code.

Each run is verl's real ``PPOTrainerSeparateAsync.fit`` (our subclass), with our decoupled agent-loop
worker, verl's ``RewardLoopManager`` whose Ray workers run our managers (real HTTP to the local judge
server, or a user function under ``async_naive``), TransferQueue and verl's replay buffer (our
subclass); stand-ins only for the standalone rollout (the scripted token server behind verl's real
load balancer), the actor's model and the weight sync (tests/v1_standins.py). Five runs (the slow
judge's two, failures, a group scored out of order, a full backlog), each shared by the tests
asserting on it (module fixtures): every run keeps the prompt ledger at ``raise``, so any lost,
unknown or double-counted prompt stops it. The TransferQueue behaviour relied on is pinned in
tests/test_v1_transfer_queue.py, the ledger's reconciliation in tests/test_v1_decoupled_ledger.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from async_reward.v1 import V1_OVERRIDES
from async_reward.v1.registration import register_trainer_modes_on_lookup
from async_reward.v1.reward_failover import LOST_WORKERS_KEY
from tests.conftest import reset_judge_server
from tests.test_managers import write_module
from tests.test_v1 import FAST_RETRY, step_logs
from tests.test_v1_reward_failover import RewardWorkerKiller
from tests.v1_standins import (
    GENERATION_ERROR,
    SEPARATE_ASYNC_OVERRIDES,
    ScriptedRollout,
    StandInActor,
    TrainingRun,
    base_overrides,
    compose_v1_config,
    run_v1_training,
    sessions,
    write_dataset,
)

pytestmark = pytest.mark.usefixtures("ray_cluster")

#: Enough distinct rows that no run's dataloader comes back to row 0 (the scripted server cycles each
#: question's responses, so a second pass would meet a marker again).
ROWS = [(f"What is {a}+{b}?", str(a + b)) for a in range(1, 9) for b in range(1, 6)]
SYNC_EVERY = 2  # mini-batches (one group each) per step
PROMPTS, N = 2, 2


def script_for(special: dict[int, list[str]]) -> dict[str, list[str]]:
    """Right and wrong answer per row; ``special`` rows get their own responses."""
    script = {question: [f"The answer is {truth}", "The answer is 0"] for question, truth in ROWS}
    for index, responses in special.items():
        script[ROWS[index][0]] = responses
    return script


def judge_lines(url: str, on_failure: str, *extra: str, reward_workers: int = 1) -> list[str]:
    return [
        "reward.reward_manager.name=llm_judge",
        f"+reward.async_reward.judge.base_url={url}/v1",
        f"+reward.async_reward.on_failure={on_failure}",
        "+reward.async_reward.retry.max_attempts=1",
        f"reward.num_workers={reward_workers}",
        *FAST_RETRY,
        *extra,
    ]


def train(
    tmp_path: Path,
    model_dir: Path,
    rollout: ScriptedRollout,
    script: dict[str, list[str]],
    reward_lines: list[str],
    *,
    steps: int,
    mode: str = "decoupled",
    extra: tuple[str, ...] = (),
) -> TrainingRun:
    # What the setup hook does in verl's task-runner process (here the test's): register our modes.
    register_trainer_modes_on_lookup()
    dataset = write_dataset(tmp_path / "train.parquet", ROWS)
    overrides = [
        *base_overrides(
            model_dir, dataset, steps=steps, prompts=PROMPTS, n=N, mini_batch=PROMPTS // SYNC_EVERY
        ),
        f"trainer.v1.trainer_mode={mode}",
        f"trainer.v1.separate_async.parameter_sync_step={SYNC_EVERY}",
        *SEPARATE_ASYNC_OVERRIDES,
        *V1_OVERRIDES,
        *reward_lines,
        "trainer.val_before_train=false",
        *(["+trainer.v1.decoupled.ledger=raise"] if mode == "decoupled" else []),
        *extra,
    ]
    return run_v1_training(compose_v1_config(overrides), rollout, script, tmp_path / "metrics.jsonl")


@pytest.fixture(scope="module")
def judge(judge_server: Any) -> Iterator[Any]:
    reset_judge_server(judge_server)
    yield judge_server
    reset_judge_server(judge_server)


def trained_rows(run: TrainingRun) -> list[Any]:
    return [row for update in run.updates for row in sessions(update)]


def trained_step(run: TrainingRun, index: int) -> int:
    """The step that trained dataset row ``index`` (SYNC_EVERY updates per step)."""
    (update,) = {
        position
        for position, update in enumerate(run.updates)
        for row in sessions(update)
        if row.index == index
    }
    return update // SYNC_EVERY + 1


DECOUPLED_METRICS = (
    "monitor/queue/reward_queue_size",
    "reward_queue/backlog_max",
    "static/max_reward_queue_size",
    "reward_queue/total_produced",
    "reward_queue/total_consumed",
    "reward_queue/dropped_samples",
    "aggregator/pending_groups_count",
    "timing_s/reward_compute/mean",
    "timing_s/reward_compute/max",
    "timing_s/reward_compute/tp95",
    "decoupled/window/generating",
    "decoupled/window/limit",
    "decoupled/backpressure_s",
    "decoupled/rollout_idle_s",
    "decoupled/outstanding_full_s",
    "ledger/dispatched",
    "ledger/trained",
    "ledger/in_flight",
    "ledger/unaccounted",
    "ledger/balanced",
    "decoupled/staleness_wait_s",
    "decoupled/stale_overflow",
    "reward/status_ok",
)


def assert_accounted_every_step(run: TrainingRun, steps: int) -> list[dict[str, Any]]:
    """Every step trained a full batch, logged the mode's metrics, and reconciled its ledger with
    TransferQueue: what the ledger counted dispatched is what it counted trained or evicted plus the
    prompt keys TransferQueue lists (``ledger/in_flight`` is TransferQueue's count), with no prompt
    lost, unknown or double counted so far (``ledger/balanced``)."""
    logs = step_logs(run)
    assert len(logs) == steps
    for metrics in logs:
        missing = [key for key in DECOUPLED_METRICS if key not in metrics]
        assert not missing, missing
        assert metrics["ledger/unaccounted"] == 0 and metrics["ledger/double_counted"] == 0
        assert metrics["ledger/balanced"] == 1.0
        assert metrics["ledger/dispatched"] + metrics["ledger/carried_over"] == (
            metrics["ledger/trained"] + metrics["ledger/evicted"] + metrics["ledger/in_flight"]
        )
        assert metrics["ledger/refilled"] <= metrics["ledger/evicted"]
    assert [m["ledger/trained"] for m in logs] == [PROMPTS * (s + 1) for s in range(steps)]
    rows = trained_rows(run)
    assert len(rows) == steps * PROMPTS * N
    assert not [key for key, count in Counter(row.key for row in rows).items() if count > 1]
    return logs


# ----------------------------------------------------------------- a slow judge: ours against verl's

SLOW_JUDGE_MS = (400.0, 400.0)
SLOW_STEPS = 3
#: Row 0: the judge hangs on one session (deadline 1 s: status timeout); row 1: the judge answers 400
#: to one (status error); both trained with the fallback score (on_failure: fallback).
SLOW_SCRIPT = script_for(
    {
        0: ["The answer is 2 @@fault:hang@@", "The answer is 0"],
        1: ["The answer is 3 @@fault:400@@", "The answer is 3"],
    }
)


@pytest.fixture(scope="module")
def slow_judge_runs(tmp_path_factory, model_dir, rollout, transfer_queue, judge) -> dict[str, Any]:
    """The same script and slow judge (400 ms a call) under ours and verl's ``separate_async``."""
    judge.update_config(latency_ms=SLOW_JUDGE_MS)
    runs: dict[str, Any] = {}
    for mode in ("decoupled", "separate_async"):
        run = train(
            tmp_path_factory.mktemp(mode),
            model_dir,
            rollout,
            SLOW_SCRIPT,
            judge_lines(judge.url, "fallback", "+reward.async_reward.timeout_s=1.0", reward_workers=2),
            steps=SLOW_STEPS,
            mode=mode,
        )
        runs[mode] = run
        runs[f"{mode}/generation_requests"] = ray.get(rollout.server.requests.remote())
        runs[f"{mode}/judge_faults"] = dict(judge.stats()["faults_injected"])
    reset_judge_server(judge)
    return runs


def test_trains_every_step_with_every_prompt_accounted_and_the_reward_queue_metrics(slow_judge_runs):
    """Baseline: every step trains its batch once, logs verl-recipe's reward-queue metrics, ours and
    ``reward/*``; the ledger balances every step; a hanging judge became a timeout and a 400 an error,
    both trained with the fallback score, neither a silent number."""
    run = slow_judge_runs["decoupled"]
    logs = assert_accounted_every_step(run, SLOW_STEPS)
    assert all(m["static/max_reward_queue_size"] == logs[0]["static/max_reward_queue_size"] > 0 for m in logs)
    assert logs[-1]["reward_queue/total_consumed"] >= SLOW_STEPS * PROMPTS * N
    scoring = [m for m in logs if m["reward_queue/consumed"] > 0]  # 0 s in a step that scored nothing
    assert scoring and all(m["timing_s/reward_compute/max"] >= SLOW_JUDGE_MS[0] / 1000 for m in scoring)
    statuses = {
        row.index: row.reward_extra_info["status"]
        for row in trained_rows(run)
        if row.reward_extra_info["status"] != "ok"
    }
    # The 400 comes back at once, so row 1's group is always trained within the run. Row 0's group
    # waits for its hanging session's deadline: on a loaded machine the run's last step can be taken
    # from faster groups before it is sampleable (it is then in flight, which the ledger accounts for),
    # so its status is checked whenever it was trained, and the hang itself on the judge's side.
    assert statuses.get(1) == "error" and set(statuses) <= {0, 1}
    assert statuses.get(0, "timeout") == "timeout"
    assert slow_judge_runs["decoupled/judge_faults"].get("hang", 0) >= 1
    failed = [
        row for row in trained_rows(run) if row.index in statuses and row.reward_extra_info["status"] != "ok"
    ]
    assert all(row.score == 0.0 and row.reward_extra_info["failure_reason"] for row in failed)


def test_a_generated_group_releases_its_place_while_it_is_scored(slow_judge_runs):
    """Under a judge slower than generation, ours keeps generating while groups wait for scores: at a
    step's end more groups are in flight (generating + in scoring) than verl's window of
    ``(num_warmup_batches + 1) x train_batch_size`` holds, and by the end the rollout served more
    sessions than under verl's ``separate_async`` with the same judge."""
    logs = step_logs(slow_judge_runs["decoupled"])
    verl_window = 2 * PROMPTS
    in_flight = [m["decoupled/window/generating"] + m["aggregator/pending_groups_count"] for m in logs]
    assert max(in_flight) > verl_window, in_flight
    assert max(m["ledger/in_flight"] for m in logs) > verl_window
    ours, verls = (slow_judge_runs[f"{mode}/generation_requests"] for mode in ("decoupled", "separate_async"))
    print(f"generation requests, {SLOW_STEPS} steps of a slow judge: ours {ours}, verl's {verls}")
    assert ours > verls, (ours, verls)
    assert len(step_logs(slow_judge_runs["separate_async"])) == SLOW_STEPS


# ------------------------------------------------- failures under raise, staleness from generation

FAILURE_STEPS = 8
#: Row 0: generated only once the policy reaches version 4 (dispatched in step 1: a submission span of
#: 5 or more when trained, beyond the threshold 4). Row 1: a session fails in generation at once, its
#: sibling finishes generating later and must not be scored (were it, the judge would count a
#: 503). Row 2: the judge answers 400 to a session
#: (on_failure: raise: the group is evicted with reward_error).
FAILURE_SCRIPT = script_for(
    {
        0: ["@@version:4@@The answer is 2", "@@version:4@@The answer is 0"],
        1: [GENERATION_ERROR, "@@sleep:1.0@@The answer is 3 @@fault:503@@"],
        2: ["The answer is 4 @@fault:400@@", "The answer is 4"],
    }
)
STALENESS_THRESHOLD = 4


@pytest.fixture(scope="module")
def failure_run(tmp_path_factory, model_dir, rollout, transfer_queue, judge) -> tuple[TrainingRun, dict]:
    reset_judge_server(judge)
    run = train(
        tmp_path_factory.mktemp("failures"),
        model_dir,
        rollout,
        FAILURE_SCRIPT,
        judge_lines(judge.url, "raise"),
        steps=FAILURE_STEPS,
        extra=(
            f"trainer.v1.sampler.max_off_policy_threshold={STALENESS_THRESHOLD}",
            "+trainer.v1.decoupled.generation_window=2",
        ),
    )
    return run, judge.stats()


def test_failed_generation_evicts_and_replaces_its_group_without_scoring_its_siblings(failure_run):
    """A session raising in generation fails its group, which is evicted with its reason and
    replaced; its sibling, generated after the failure, is never sent to the judge: the judge saw
    exactly one request per session scored, and the skipped one is counted."""
    run, judge_stats = failure_run
    logs = step_logs(run)
    skipped = sum(m["decoupled/skipped_scoring"] for m in logs)
    # The sibling entered the reward backlog (generated) and left it unscored: a dropped sample (row
    # 2's sibling is one too when the judge's 400 comes back before it reaches scoring).
    assert sum(m["reward_queue/dropped_samples"] for m in logs) == skipped >= 1
    assert_accounted_every_step(run, FAILURE_STEPS)
    assert logs[-1]["ledger/evicted/generation_error"] == 1
    assert 1 not in {row.index for row in trained_rows(run)}
    # The sibling's answer carries a fault marker the judge counts: it was never sent.
    assert judge_stats["faults_injected"].get("503", 0) == 0
    assert judge_stats["faults_injected"].get("400") == 1  # the marker of row 2 was (the judge counts)


def test_reward_failure_under_raise_evicts_the_group_with_its_reason(failure_run):
    run, _ = failure_run
    logs = step_logs(run)
    assert logs[-1]["ledger/evicted/reward_error"] == 1
    assert 2 not in {row.index for row in trained_rows(run)}
    assert logs[-1]["ledger/refilled"] == logs[-1]["ledger/evicted"] == 2


def test_staleness_counts_from_generation_so_a_slow_generation_is_trained_not_evicted(failure_run):
    """Row 0 was dispatched in step 1 and generated with the weights of step 4: trained at step 5 or
    later, its span from submission is beyond the threshold (verl's separate_async would evict it),
    its span from generation is not; no group was evicted as stale."""
    run, _ = failure_run
    step = trained_step(run, 0)
    assert step - 1 + 1 > STALENESS_THRESHOLD
    logs = step_logs(run)
    assert sum(m.get("training/off_policy/evicted_samples", 0) for m in logs) == 0
    assert logs[-1]["ledger/evicted/stale"] == 0


# ------------------------------------------ a group scored out of order, at its staleness limit

#: Windows that pass the start-up check with no room to spare: G=2, R=4 sessions, S=2, so H=6 and
#: ceil(H/B)+1 = 4 = the threshold.
SLOW_SCORING_WINDOWS = (
    "trainer.v1.sampler.max_off_policy_threshold=4",
    "+trainer.v1.decoupled.generation_window=2",
    "+trainer.v1.decoupled.reward_backlog=4",
    "+trainer.v1.decoupled.sampleable_buffer=2",
)
SLOW_SCORING_STEPS = 5
#: Row 0 (dispatched first, generated at once with the weights of version 0) is scored by a judge that
#: answers it only once step 4 (its last at threshold 4) no longer needs it: when the trainer has
#: sampled step 4's last mini-batch (the actor computes its log-probs), or, should the trainer wait
#: for it, a few seconds after step 4's first update. Every other group is scored at once.
SLOW_SCORING_FUNCTION = """
import asyncio
import os
import time

STEP_4_FIRST_UPDATE = {first_update!r}
STEP_4_LAST_SAMPLE = {last_sample!r}
GRACE_S = 3.0


async def score(data_source, solution_str, ground_truth, extra_info=None):
    if (extra_info or {{}}).get("index") == 0:
        deadline, since = time.monotonic() + 120.0, None
        while not os.path.exists(STEP_4_LAST_SAMPLE) and time.monotonic() < deadline:
            if since is None and os.path.exists(STEP_4_FIRST_UPDATE):
                since = time.monotonic()
            if since is not None and time.monotonic() - since > GRACE_S:
                break
            await asyncio.sleep(0.05)
    return float(str(ground_truth) in solution_str)
"""


class SignallingActor(StandInActor):
    """The stand-in actor, writing a file after step 4's first update (its 7th: two per step) and
    when it computes the log-probs of step 4's last mini-batch (its 8th call), i.e. once step 4's
    last sample is taken."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.first_update, self.last_sample = directory / "step4_update1", directory / "step4_sampled"
        self.log_prob_calls = 0

    def update_actor(self, batch: Any) -> dict[str, Any]:
        result = super().update_actor(batch)
        if len(self.updates) == 3 * SYNC_EVERY + 1:
            self.first_update.touch()
        return result

    def compute_log_prob(self, batch: Any) -> Any:
        self.log_prob_calls += 1
        if self.log_prob_calls == 4 * SYNC_EVERY:
            self.last_sample.touch()
        return super().compute_log_prob(batch)


@pytest.fixture(scope="module")
def slow_scoring_run(tmp_path_factory, model_dir, rollout, transfer_queue) -> TrainingRun:
    directory = tmp_path_factory.mktemp("slow_scoring")
    actor = SignallingActor(directory)
    source = SLOW_SCORING_FUNCTION.format(
        first_update=str(actor.first_update), last_sample=str(actor.last_sample)
    )
    register_trainer_modes_on_lookup()
    dataset = write_dataset(directory / "train.parquet", ROWS)
    overrides = [
        *base_overrides(
            model_dir,
            dataset,
            steps=SLOW_SCORING_STEPS,
            prompts=PROMPTS,
            n=N,
            mini_batch=PROMPTS // SYNC_EVERY,
        ),
        "trainer.v1.trainer_mode=decoupled",
        f"trainer.v1.separate_async.parameter_sync_step={SYNC_EVERY}",
        *SEPARATE_ASYNC_OVERRIDES,
        *V1_OVERRIDES,
        "reward.reward_manager.name=async_naive",
        f"reward.custom_reward_function.path={write_module(directory, source, 'slow_judge.py')}",
        "reward.custom_reward_function.name=score",
        "+reward.async_reward.retry.max_attempts=1",
        "trainer.val_before_train=false",
        "+trainer.v1.decoupled.ledger=raise",
        *SLOW_SCORING_WINDOWS,
    ]
    return run_v1_training(
        compose_v1_config(overrides), rollout, script_for({}), directory / "metrics.jsonl", actor=actor
    )


def test_a_group_waiting_for_the_judge_at_its_staleness_limit_is_trained_not_evicted(slow_scoring_run):
    """Row 0 is generated at step 1 (version 0) and scored only at step 4, its last step under
    threshold 4, while younger groups are scored and trained: its scoring takes 4 policy versions.
    Step 4's first sample trains a younger group (a place is left), the second waits for row 0, and
    row 0 is trained at span 4 instead of being evicted ``stale`` at step 5, its generation and
    scoring wasted (verl's separate_async, and this mode before the wait). No group was evicted stale,
    and every prompt is accounted."""
    run = slow_scoring_run
    logs = step_logs(run)
    assert 0 in {row.index for row in trained_rows(run)}, logs[-1].get("ledger/evicted/stale")
    assert trained_step(run, 0) == 4
    assert logs[-1]["ledger/evicted/stale"] == 0 and logs[-1]["ledger/evicted"] == 0
    assert_accounted_every_step(run, SLOW_SCORING_STEPS)
    assert sum(m.get("training/off_policy/evicted_samples", 0) for m in logs) == 0
    assert logs[3]["decoupled/staleness_wait_s"] > 0  # the cost: step 4 waited for row 0's score
    assert all(m["decoupled/stale_overflow"] == 0 for m in logs)


# ----------------------------------- a full backlog, under exclude, and a reward worker killed mid-batch

BACKLOG_STEPS = 3
BACKLOG_JUDGE_MS = (150.0, 150.0)
#: Row 0: the judge answers 400 to one session (on_failure: exclude): a group of two left with one
#: scored member trains on nothing, so its mini-batch is skipped and its prompt replaced.
BACKLOG_SCRIPT = script_for({0: ["The answer is 2 @@fault:400@@", "The answer is 0"]})


class KillerKeepingTheJudgeSlow(RewardWorkerKiller):
    """B's killer (tests/test_v1_reward_failover.py), with the judge put back to its latency after the
    kill (B's makes it answer at once), so the backlog still fills for the rest of the run."""

    def run(self) -> None:
        super().run()
        self.server.update_config(latency_ms=BACKLOG_JUDGE_MS)


@pytest.fixture(scope="module")
def backlog_run(tmp_path_factory, model_dir, rollout, transfer_queue, judge) -> tuple[TrainingRun, list[str]]:
    """A slow judge and a backlog of 2 sessions: dispatch pauses while 2 generated sessions wait. Two
    reward workers; worker 0 is killed once the judge holds two requests (sessions wait on it)."""
    reset_judge_server(judge)
    judge.update_config(latency_ms=BACKLOG_JUDGE_MS)
    killer = KillerKeepingTheJudgeSlow(judge, ["reward_loop_worker_0"], in_flight=2)
    killer.start()
    try:
        run = train(
            tmp_path_factory.mktemp("backlog"),
            model_dir,
            rollout,
            BACKLOG_SCRIPT,
            judge_lines(judge.url, "exclude", reward_workers=2),
            steps=BACKLOG_STEPS,
            extra=("+trainer.v1.decoupled.reward_backlog=2",),
        )
    finally:
        killer.stop.set()
        killer.join(timeout=10)
    reset_judge_server(judge)
    return run, killer.killed


def test_a_full_backlog_pauses_dispatch_and_drops_nothing(backlog_run):
    run, _ = backlog_run
    logs = assert_accounted_every_step(run, BACKLOG_STEPS)
    assert all(m["static/max_reward_queue_size"] == 2 for m in logs)
    assert sum(m["decoupled/backpressure_s"] for m in logs) > 0
    generation_window = logs[0]["decoupled/window/limit"]
    assert all(m["reward_queue/backlog_max"] <= 2 + generation_window * N for m in logs)
    # Measured, not a constant (the failure run sees its skipped sibling): the excluded session was
    # scored, and the sessions of the killed reward worker were scored again, so none was dropped.
    assert all(m["reward_queue/dropped_samples"] == 0 for m in logs)


def test_exclude_skips_a_group_left_with_nothing_to_train_and_replaces_it(backlog_run):
    """``on_failure: exclude``: the failed session is masked, its group (one scored member) trains on
    nothing, so verl never steps on it: the mini-batch is skipped, the group counted ``untrained`` in
    the ledger and replaced through the window."""
    run, _ = backlog_run
    logs = step_logs(run)
    assert 0 not in {row.index for row in trained_rows(run)}
    assert sum(m["reward/skipped_batches"] for m in logs) == 1
    assert sum(m["reward/excluded"] for m in logs) == 1
    assert logs[-1]["ledger/evicted/untrained"] == 1 and logs[-1]["ledger/evicted/reward_error"] == 0
    assert logs[-1]["ledger/refilled"] == 1


def test_a_reward_worker_killed_mid_batch_costs_no_group_and_keeps_the_progress_tags_right(backlog_run):
    """Reward worker 0 is killed while the judge holds sessions sent through it: they are scored again
    on worker 1 (our agent loop's failover), so every step trains its batch, the ledger balances, no
    group is evicted for it (the one eviction is the excluded group above), one death is counted and
    the re-scored sessions are. A re-scored session leaves the reward backlog once: the backlog read
    from the progress tags never goes negative and ends with every scored session consumed once."""
    run, killed = backlog_run
    assert len(killed) == 1
    logs = assert_accounted_every_step(run, BACKLOG_STEPS)
    assert logs[-1]["ledger/evicted"] == logs[-1]["ledger/evicted/untrained"] == 1
    assert logs[-1]["ledger/evicted/reward_error"] == logs[-1]["ledger/evicted/generation_error"] == 0
    assert not [m for m in logs if m.get("training/rollout_failure/evicted_samples")]
    assert sum(m["reward/worker_deaths"] for m in logs) == 1.0
    rescored = [row for row in trained_rows(run) if row.reward_extra_info.get(LOST_WORKERS_KEY)]
    assert {row.reward_extra_info[LOST_WORKERS_KEY] for row in rescored} == set(killed)
    assert sum(m["reward/rescored_sessions"] for m in logs) >= len(rescored) >= 1
    assert all(m["monitor/queue/reward_queue_size"] >= 0 for m in logs)
    # Each session generated is consumed at most once, however often it was sent to a reward worker.
    assert all(m["reward_queue/total_consumed"] <= m["reward_queue/total_produced"] for m in logs)
