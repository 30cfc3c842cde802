"""verl v1 trainer mode ``decoupled`` (``async_reward.v1.decoupled.trainer``), on CPU, through verl's code.

Each run is verl's real ``PPOTrainerSeparateAsync.fit`` (our subclass), with our decoupled agent-loop
worker, verl's ``RewardLoopManager`` whose Ray workers run our managers (real HTTP to the local judge
server, or a user function under ``async_naive``), TransferQueue and verl's replay buffer (our
subclass); stand-ins only for the standalone rollout (the scripted token server behind verl's real
load balancer), the actor's model and the weight sync (tests/support/v1_standins.py). Five runs (the slow
judge's two, failures, a group scored out of order, a full backlog), each shared by the tests
asserting on it (module fixtures): each run's fixture asserts every step's prompt ledger check found
no lost, unknown or double-counted prompt (``assert_no_prompt_unaccounted``), so one fails the run's
every test, as stopping the run on it would. One test without a run pins a resume's re-issue: each
group's own ``__rollout_n__`` reaches our worker. The TransferQueue behaviour relied on is pinned in
tests/v1/test_transfer_queue.py, the ledger's reconciliation in tests/v1/decoupled/test_ledger.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from async_reward.v1 import V1_OVERRIDES
from async_reward.v1.reward_failover import LOST_WORKERS_KEY
from async_reward.wiring.trainer_modes import register_trainer_modes_on_lookup
from tests.conftest import reset_judge_server
from tests.managers.test_managers import write_module
from tests.support.v1_standins import (
    GATE,
    GENERATION_ERROR,
    SEPARATE_ASYNC_OVERRIDES,
    ScriptedRollout,
    StandInActor,
    TrainingRun,
    assert_no_prompt_unaccounted,
    base_overrides,
    compose_v1_config,
    run_v1_training,
    sessions,
    write_dataset,
)
from tests.v1.test_reward_failover import RewardWorkerKiller
from tests.v1.test_v1_integration import FAST_RETRY, step_logs

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
        *extra,
    ]
    run = run_v1_training(compose_v1_config(overrides), rollout, script, tmp_path / "metrics.jsonl")
    if mode == "decoupled":
        assert_no_prompt_unaccounted(run)
    return run


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
#: verl's ``separate_async`` keeps ``(num_warmup_batches + 1) x train_batch_size`` groups in flight
#: (generating or in scoring); its sessions are that times ``rollout.n``.
VERL_WINDOW = 2 * PROMPTS
#: Deadline of a judge call in these runs: the judge holds every request from the start of a run
#: until the window is shown (``HeldJudgeWatch``), which takes seconds at most on a loaded machine;
#: 30 s keeps the held requests well inside their deadline. Row 0's hang becomes a timeout at it.
SLOW_TIMEOUT_S = 30.0
#: Row 0: the judge hangs on one session (status timeout at the deadline); row 1: the judge answers
#: 400 to one (status error); both trained with the fallback score (on_failure: fallback).
SLOW_SCRIPT = script_for(
    {
        0: ["The answer is 2 @@fault:hang@@", "The answer is 0"],
        1: ["The answer is 3 @@fault:400@@", "The answer is 3"],
    }
)


class HeldJudgeWatch(threading.Thread):
    """Holds the judge from :meth:`start` until the run's rollout has served ``until`` generation
    requests, then (after ``settle_s`` more, held) records what it saw and releases the judge.

    While held the judge answers nothing, so every group dispatched waits for its scores: how far
    generation gets then is set by the mode's window code alone, not by a race between generation and
    a judge latency. ``settle_s`` gives a mode that stopped at ``until`` the time to go past it if its
    window allowed that; it can only make ``requests_while_held`` larger, never smaller, so load
    cannot turn a bound on it into a failure."""

    def __init__(self, judge: Any, rollout: ScriptedRollout, until: int, settle_s: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.judge, self.rollout, self.until, self.settle_s = judge, rollout, until, settle_s
        self.requests_while_held = -1  # generation requests when the judge was released
        self.answered_while_held = -1  # judge answers by then (0: it answered nothing)
        self.reached = False
        self.held_s = -1.0  # from the run's first generation to the release: the deadline's margin
        self._run = ray.get(rollout.server.__ray_call__.remote(lambda server: server.run))

    def start(self) -> None:
        self.judge.update_config(hold=True)
        super().start()

    def _requests(self) -> int:
        """This run's generation requests (0 until the run's ``start`` resets the server's counts)."""
        run, requests = ray.get(
            self.rollout.server.__ray_call__.remote(lambda server: (server.run, server.requests()))
        )
        return requests if run > self._run else 0

    def run(self) -> None:
        started = None
        try:
            deadline = time.monotonic() + 240.0
            while time.monotonic() < deadline and (requests := self._requests()) < self.until:
                if started is None and requests:
                    started = time.monotonic()
                time.sleep(0.05)
            self.reached = self._requests() >= self.until
            time.sleep(self.settle_s)
            self.requests_while_held = self._requests()
            self.answered_while_held = sum(self.judge.stats()["responses_by_status"].values())
        finally:
            self.judge.update_config(hold=False)
            self.held_s = time.monotonic() - (started or time.monotonic())


@pytest.fixture(scope="module")
def slow_judge_runs(tmp_path_factory, model_dir, rollout, transfer_queue, judge) -> dict[str, Any]:
    """The same script and slow judge (400 ms a call) under ours and verl's ``separate_async``, the
    judge held at each run's start: ours until it generated twice verl's window of sessions, verl's
    until it generated its window (and 2 s more)."""
    judge.update_config(latency_ms=SLOW_JUDGE_MS)
    runs: dict[str, Any] = {}
    for mode, until, settle_s in (
        ("decoupled", 2 * VERL_WINDOW * N, 0.0),
        ("separate_async", VERL_WINDOW * N, 2.0),
    ):
        watch = HeldJudgeWatch(judge, rollout, until, settle_s)
        watch.start()
        judge.reset()  # held first: an answer counted from here on is this run's
        try:
            run = train(
                tmp_path_factory.mktemp(mode),
                model_dir,
                rollout,
                SLOW_SCRIPT,
                judge_lines(
                    judge.url,
                    "fallback",
                    f"+reward.async_reward.timeout_s={SLOW_TIMEOUT_S}",
                    reward_workers=2,
                ),
                steps=SLOW_STEPS,
                mode=mode,
            )
        finally:
            watch.join(timeout=300)
        runs[mode] = run
        runs[f"{mode}/watch"] = watch
        runs[f"{mode}/judge_faults"] = dict(judge.stats()["faults_injected"])
    # Row 0's hanging requests end at their deadline: wait for them (idle), so none is still inside
    # the session's judge when a later test counts what it holds or has in flight.
    deadline = time.monotonic() + SLOW_TIMEOUT_S + 30.0
    while judge.stats()["in_flight_total"] and time.monotonic() < deadline:
        time.sleep(0.1)
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
    # Which groups a step trains depends on which were scored first, and the judge releases every
    # held session at once: rows 0 and 1 may be left in flight when the last step is taken (the
    # ledger accounts for them), so each status is checked whenever its row was trained, and the
    # faults themselves on the judge's side (row 0 waits for its hang's deadline besides).
    assert set(statuses) <= {0, 1}
    assert statuses.get(0, "timeout") == "timeout" and statuses.get(1, "error") == "error"
    # A trained faulty row's fault happened on the judge's side. A row left untrained may never have
    # been sent (a fresh-clone run of 2026-11-27 trained row 1 but never sent row 0: no hang
    # counted), so the judge's counts are checked for the rows the run trained.
    trained = {row.index for row in trained_rows(run)}
    faults = slow_judge_runs["decoupled/judge_faults"]
    assert 0 not in trained or faults.get("hang", 0) >= 1, faults
    assert 1 not in trained or faults.get("400", 0) >= 1, faults
    # No "some fault reached the judge" assertion: a loaded fresh-clone run (2026-11-27) sent neither
    # row before the last step was taken, which the schedule allows. A hanging judge call becoming
    # `timeout` under verl v1 is asserted every run in tests/v1/test_v1_integration.py, a 400 under v1 `sync`
    # and our decoupled mode in tests/judge/in_job/test_in_job.py.
    failed = [
        row for row in trained_rows(run) if row.index in statuses and row.reward_extra_info["status"] != "ok"
    ]
    assert all(row.score == 0.0 and row.reward_extra_info["failure_reason"] for row in failed)


def test_a_generated_group_releases_its_place_while_it_is_scored(slow_judge_runs):
    """While the judge answers nothing (held), ours keeps generating: a group leaves the generation
    window once generated, so the rollout serves twice verl's window of ``(num_warmup_batches + 1) x
    train_batch_size`` groups' sessions, where verl's ``separate_async``, with the same judge held,
    stops at its window (its groups hold their places until scored). Both counts are set by the
    window code, not by how fast generation runs against the judge; the steps then logged more groups
    in flight than verl's window holds."""
    ours, verls = (slow_judge_runs[f"{mode}/watch"] for mode in ("decoupled", "separate_async"))
    print(
        f"generation requests, judge held: ours {ours.requests_while_held} (held {ours.held_s:.1f} s), "
        f"verl's {verls.requests_while_held} (held {verls.held_s:.1f} s)"
    )
    assert ours.reached and ours.answered_while_held == 0, vars(ours)
    assert ours.requests_while_held >= 2 * VERL_WINDOW * N
    assert verls.reached and verls.answered_while_held == 0, vars(verls)
    assert verls.requests_while_held == VERL_WINDOW * N
    # Step 1 is logged after the release, having trained 2 of the >= 2 x VERL_WINDOW groups dispatched
    # while held: TransferQueue still lists at least 6 > VERL_WINDOW in flight.
    logs = step_logs(slow_judge_runs["decoupled"])
    assert logs[0]["ledger/in_flight"] >= 2 * VERL_WINDOW - PROMPTS > VERL_WINDOW
    assert len(step_logs(slow_judge_runs["separate_async"])) == SLOW_STEPS


# ------------------------------------------------- failures under raise, staleness from generation

FAILURE_STEPS = 8
#: Row 0: generated only once the policy reaches version 4 (dispatched in step 1: a submission span of
#: 5 or more when trained, beyond the threshold 4). Row 1: a session fails in generation at once, its
#: sibling finishes generating only once the failure is published (the gate, opened by
#: ``open_gate_on_failure``) and must not be scored (were it, the judge would count a 503). Row 2:
#: the judge answers 400 to a session (on_failure: raise: the group is evicted with reward_error).
FAILURE_SCRIPT = script_for(
    {
        0: ["@@version:4@@The answer is 2", "@@version:4@@The answer is 0"],
        1: [GENERATION_ERROR, f"{GATE}The answer is 3 @@fault:503@@"],
        2: ["The answer is 4 @@fault:400@@", "The answer is 4"],
    }
)
STALENESS_THRESHOLD = 4


@contextlib.contextmanager
def open_gate_on_failure(rollout: ScriptedRollout) -> Iterator[None]:
    """Open the scripted server's gate once a listing of the ``train`` partition (the trainer's and
    the sampler's, in this process) shows a group failed in generation. Our agent-loop worker marks
    the group failed before it publishes that tag, so a session released by the gate reaches scoring
    after its group's failure, by causality rather than by a delay."""
    import transfer_queue as tq

    real_kv_list = tq.kv_list
    opened = False

    def kv_list(*args: Any, **kwargs: Any) -> Any:
        nonlocal opened
        listing = real_kv_list(*args, **kwargs)
        tags = (listing or {}).get("train", {})
        if not opened and any(tag.get("failure_reason") == "generation_error" for tag in tags.values()):
            opened = True
            ray.get(rollout.server.open_gate.remote())
        return listing

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tq, "kv_list", kv_list)
        yield


@pytest.fixture(scope="module")
def failure_run(tmp_path_factory, model_dir, rollout, transfer_queue, judge) -> tuple[TrainingRun, dict]:
    reset_judge_server(judge)
    with open_gate_on_failure(rollout):
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
        *SLOW_SCORING_WINDOWS,
    ]
    run = run_v1_training(
        compose_v1_config(overrides), rollout, script_for({}), directory / "metrics.jsonl", actor=actor
    )
    assert_no_prompt_unaccounted(run)
    return run


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


@pytest.fixture(scope="module")
def backlog_run(tmp_path_factory, model_dir, rollout, transfer_queue, judge) -> tuple[TrainingRun, list[str]]:
    """A slow judge and a backlog of 2 sessions: dispatch pauses while 2 generated sessions wait. Two
    reward workers; the judge is held from the start, and worker 1 is killed once it holds two
    requests (so sessions wait on it: with two held, one went to each worker,
    tests/v1/test_reward_failover.py), then released. Worker 1, not 0: most runs of the session have
    only worker 0 (``reward.num_workers=1``), and one after this run finds it warm
    (tests/support/warm_actors.py) instead of starting a new one."""
    reset_judge_server(judge)
    judge.update_config(latency_ms=BACKLOG_JUDGE_MS)
    killer = RewardWorkerKiller(judge, ["reward_loop_worker_1"], in_flight=2)
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
        killer.join(timeout=60)
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
    """Reward worker 1 is killed while the judge holds sessions sent through it: they are scored again
    on worker 0 (our agent loop's failover), so every step trains its batch, the ledger balances, no
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


# ----------------------------------------------------------------------------- a resume's re-issue


async def test_a_resumed_run_reissues_each_group_with_its_own_rollout_n_and_the_worker_counts_it(
    transfer_queue,
):
    """The decoupled mode keeps no session count of its own (the pipelined mode does, see
    ``test_a_resumed_run_restores_each_group_with_its_own_rollout_n``): the window and the sampler
    read ``gen_n`` from the progress tag our worker writes, with the size it reads from each prompt.
    ``rollout.n=2``; step 4 dispatched p with ``__rollout_n__=4`` and q with 1 through the mode and
    verl (which persists each prompt's fields), and the run stopped with 2 of p's 4 sessions
    generated. On resume the mode resets p's progress (its ``gen_n`` kept), verl re-issues both from
    their fields, and our worker sizes them 4 and 1 again."""
    import transfer_queue as tq
    from omegaconf import OmegaConf

    from async_reward.v1.decoupled.trainer import PPOTrainerDecoupled
    from async_reward.v1.decoupled.window import PromptLedger, WindowState
    from tests.v1.decoupled.test_units import _PromptRecordingWorker
    from tests.v1.pipelined.test_pipelined import RecordingAgentLoopManager, prompt_batch

    trainer = PPOTrainerDecoupled.__new__(PPOTrainerDecoupled)
    trainer.trainer_mode = "decoupled"
    trainer.ledger = PromptLedger()
    trainer._step_dispatched = trainer._step_refilled = 0
    trainer.agent_loop_manager = manager = RecordingAgentLoopManager()
    trainer.global_steps = 4
    try:
        trainer._submit_batch_to_rollout(prompt_batch(["p", "q"], [4, 1], step=4))
        progress = {"status": "running", "gen_done": 2, "gen_n": 4, "unscored": 2, "gen_version": 3}
        tq.kv_batch_put(keys=["p"], partition_id="train", tags=[progress])  # as our worker left it
        trainer.global_steps = 5
        assert trainer._reissue_inflight_prompts() == 2
        tags = tq.kv_list("train")["train"]
        assert (tags["p"]["status"], tags["p"]["gen_done"], tags["p"]["gen_n"]) == ("pending", 0, 4)
        assert WindowState.from_tags(tags).generating == 2

        worker = _PromptRecordingWorker.__new__(_PromptRecordingWorker)
        worker.prompts, worker.background_tasks = [], set()
        worker.reward_loop_worker_handles = None  # no reward worker: nothing is scored here
        worker.config = OmegaConf.create(
            {
                "actor_rollout_ref": {
                    "rollout": {
                        "n": 2,
                        "temperature": 1.0,
                        "top_p": 1.0,
                        "top_k": -1,
                        "calculate_log_probs": False,
                        "agent": {"default_agent_loop": "single_turn_agent"},
                    }
                }
            }
        )
        worker.rollout_config = worker.config.actor_rollout_ref.rollout
        await worker.generate_sequences(manager.batches[-1])  # verl splits the re-issued batch
        await asyncio.gather(*worker.background_tasks)
        sizes = {str(p["uid"]): worker._group_size(p, {"validate": False}) for p in worker.prompts}
        assert sizes == {"p": 4, "q": 1}
    finally:
        tq.kv_clear(keys=["p", "q"], partition_id="train")
