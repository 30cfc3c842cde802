"""Reward-worker failover and generation-ordered scoring in our v1 agent loop.

Units first (no Ray cluster): verl's own ``_compute_score`` runs in :class:`RewardAgentLoopWorker`
against small reward-worker handles whose ``compute_score.remote`` raises what Ray raises for a dead
actor (``ActorDiedError``); the metrics and the admission order are the library's own code. Then one
run of verl's real ``separate_async`` trainer on CPU in which a real reward worker (a Ray actor running
our judge manager, with requests held by the local judge server) is killed mid-batch.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError

from async_reward.training.metrics import extras_metrics
from async_reward.v1 import agent_loop as agent_loop_module
from async_reward.v1.agent_loop import RewardAgentLoopWorker
from async_reward.v1.replay_buffer import StepRewardMetrics
from async_reward.v1.reward_failover import (
    LOST_WORKERS_KEY,
    REWARD_WORKERS_LOST,
    RewardWorkerPool,
    RewardWorkersLost,
    SessionKillsRewardWorkers,
)
from tests.managers.test_managers import ORDER_RECORDING_FUNCTION, admitted_in_turn, write_module
from tests.support.v1_standins import kill_and_wait
from tests.v1.test_reward_routing import RecordingRewardWorker, agent_loop_worker, session

# ----------------------------------------------------------------------------- units, no Ray


class _ActorId:
    def __init__(self, name: str) -> None:
        self.name = name

    def hex(self) -> str:
        return self.name


class _DyingComputeScore:
    def __init__(self, owner: DyingRewardWorker) -> None:
        self.owner = owner

    async def remote(self, data: Any) -> dict[str, Any]:
        self.owner.calls += 1
        await self.owner.die.wait()
        raise self.owner.error_for()


class DyingRewardWorker:
    """A reward worker handle whose calls wait until ``die`` is set, then fail as a dead actor's do
    (``error_for``: the exception, by default ``ActorDiedError`` naming this actor)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._actor_id = _ActorId(name)
        self.die = asyncio.Event()
        self.calls = 0
        self.error_for = self.died
        self.compute_score = _DyingComputeScore(self)

    def died(self) -> BaseException:
        error = ActorDiedError()
        error.actor_id = self.name
        return error


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_sessions_of_a_dead_reward_worker_are_rescored_on_a_live_one_which_alone_gets_the_rest() -> None:
    """Three sessions wait on a worker that then dies: each is scored again on the live worker (no
    error reaches verl, so no group fails), its extras name the dead worker, and none of the later
    sessions is sent to the dead one, though it would be the least loaded."""

    async def run() -> tuple[DyingRewardWorker, RecordingRewardWorker, list[Any], RewardAgentLoopWorker]:
        dying, live = DyingRewardWorker("dead-actor"), RecordingRewardWorker("live", fast=False)
        worker = agent_loop_worker([dying, live])
        first = [session() for _ in range(6)]
        kwargs = {"uid": "u", "session_id": 0}
        tasks = [asyncio.create_task(worker._compute_score([o], kwargs)) for o in first]
        await _settle()
        assert (dying.calls, live.in_flight) == (3, 3)
        dying.die.set()
        await _settle()
        assert live.in_flight == 6  # the three re-sent at once
        live.release.set()
        await asyncio.gather(*tasks)
        later = [session() for _ in range(4)]
        await asyncio.gather(*(worker._compute_score([o], {"uid": "v", "session_id": 0}) for o in later))
        return dying, live, first + later, worker

    dying, live, outputs, worker = asyncio.run(run())
    assert dying.calls == 3 and live.scored == 10
    assert all(o.reward_score == 1.0 for o in outputs)
    infos = [o.extra_fields["reward_extra_info"] for o in outputs]
    assert [info.get(LOST_WORKERS_KEY) for info in infos].count("dead-actor") == 3
    assert sum(LOST_WORKERS_KEY in info for info in infos) == 3
    assert worker._reward_pool is not None and worker._reward_pool.dead == {0}
    assert worker.reward_loop_worker_handles == [dying, live]  # verl's list itself is left as given


def test_an_error_of_the_reward_worker_itself_or_of_another_actor_is_not_a_death() -> None:
    """What a reward worker raises reaches us as ``RayTaskError`` (also a ``RayActorError`` when the
    reward worker's own call to another actor failed), and an actor error naming another actor is not
    this worker's death: both propagate as before, and the worker stays in the rotation."""

    async def attempt(error: BaseException) -> tuple[RewardAgentLoopWorker, DyingRewardWorker]:
        failing = DyingRewardWorker("w0")
        failing.error_for = lambda: error
        failing.die.set()
        worker = agent_loop_worker([failing, RecordingRewardWorker("w1", fast=True)])
        with pytest.raises(type(error)):
            await worker._compute_score([session()], {"uid": "u", "session_id": 0})
        return worker, failing

    inner = ActorDiedError()
    inner.actor_id = "a-router"
    wrapped = RayTaskError("compute_score", "traceback", inner).as_instanceof_cause()
    other = ActorDiedError()
    other.actor_id = "someone-else"
    for error in (wrapped, other, ValueError("bad sample")):
        worker, failing = asyncio.run(attempt(error))
        assert worker._reward_pool is not None and not worker._reward_pool.dead, error
        assert failing.calls == 1


def test_with_every_reward_worker_dead_the_session_fails_with_the_cause_and_dispatch_is_refused() -> None:
    """No silent score: the session raises ``RewardWorkersLost`` (``reward_workers_lost``), and the
    worker's next ``generate_sequences`` (what the trainer's refill calls) raises it too."""

    async def run() -> tuple[BaseException, BaseException, list[DyingRewardWorker]]:
        handles = [DyingRewardWorker("w0"), DyingRewardWorker("w1")]
        for handle in handles:
            handle.die.set()
        worker = agent_loop_worker(handles)
        output = session()
        with pytest.raises(RewardWorkersLost) as lost:
            await worker._compute_score([output], {"uid": "u", "session_id": 0})
        assert output.reward_score is None
        with pytest.raises(RewardWorkersLost) as refused:
            await worker.generate_sequences(None)
        return lost.value, refused.value, handles

    lost, refused, handles = asyncio.run(run())
    assert [h.calls for h in handles] == [1, 1]  # each tried once, then known dead
    for error in (lost, refused):
        assert str(error).startswith(REWARD_WORKERS_LOST) and "w0, w1" in str(error)
        assert "resume" in str(error)


def test_a_session_that_kills_the_worker_it_is_scored_on_is_failed_after_the_second_death() -> None:
    """A response that kills its scorer (a verifier blown up by the policy's output) must not take down
    every reward worker in turn: after the first death the session is sent once more; when that worker
    dies too the session fails (its group is replaced, as verl does for a failed session), the third
    worker never sees it, and stays in the rotation."""

    async def run() -> tuple[list[Any], RewardAgentLoopWorker]:
        first, second = DyingRewardWorker("w0"), DyingRewardWorker("w1")
        first.die.set()
        second.die.set()
        third = RecordingRewardWorker("w2", fast=True)
        worker = agent_loop_worker([first, second, third])
        output = session()
        with pytest.raises(SessionKillsRewardWorkers) as failed:
            worker._reward_pool.in_flight[2] = 5  # w2 is the busiest: w0 and w1 are chosen first
            await worker._compute_score([output], {"uid": "u", "session_id": 0})
        assert output.reward_score is None
        assert "w0" in str(failed.value) and "w1" in str(failed.value)
        worker._reward_pool.in_flight[2] = 0
        await worker._compute_score([session()], {"uid": "v", "session_id": 0})  # w2 still serves
        return [first, second, third], worker

    (first, second, third), worker = asyncio.run(run())
    assert (first.calls, second.calls, third.scored) == (1, 1, 1)
    assert worker._reward_pool is not None and worker._reward_pool.dead == {0, 1}


def test_a_reward_worker_out_of_reach_for_a_moment_is_not_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ActorUnavailableError`` ("may be available later") sends the session again after a pause and
    keeps the worker: a one-worker run survives a moment without its connection."""
    monkeypatch.setattr(agent_loop_module, "UNAVAILABLE_PAUSE_S", 0.0)

    class _Flaky:
        def __init__(self, owner: FlakyRewardWorker) -> None:
            self.owner = owner

        async def remote(self, data: Any) -> dict[str, Any]:
            self.owner.calls += 1
            if self.owner.calls <= 2:
                raise ActorUnavailableError("connection lost for a moment", None)
            return {"reward_score": 1.0, "reward_extra_info": {}}

    class FlakyRewardWorker:
        def __init__(self) -> None:
            self._actor_id = _ActorId("flaky")
            self.calls = 0
            self.compute_score = _Flaky(self)

    flaky = FlakyRewardWorker()
    worker = agent_loop_worker([flaky])
    output = session()
    asyncio.run(worker._compute_score([output], {"uid": "u", "session_id": 0}))
    assert output.reward_score == 1.0 and flaky.calls == 3
    assert worker._reward_pool is not None and not worker._reward_pool.dead
    assert LOST_WORKERS_KEY not in output.extra_fields["reward_extra_info"]


def test_pool_choice_skips_dead_workers_and_breaks_ties_round_robin() -> None:
    pool = RewardWorkerPool(["a", "b", "c"])
    assert [pool.choose() for _ in range(3)] == [0, 1, 2]
    assert pool.mark_dead(1) and not pool.mark_dead(1)
    assert {pool.choose() for _ in range(6)} == {0, 2}
    pool.in_flight[0] = 2
    assert pool.choose() == 2
    assert pool.names == ["reward_worker_0", "reward_worker_1", "reward_worker_2"]


def test_rescored_sessions_and_worker_deaths_per_step_count_each_death_once() -> None:
    """A death seen by sessions trained in two steps counts in the first; re-scored sessions count
    in their own step; a session without the key counts for neither."""
    ok = {"status": "ok", "latency_s": 0.1, "attempts": 1}
    step_metrics = StepRewardMetrics(samples_per_step=1)
    first = step_metrics.add(1, [ok, {**ok, LOST_WORKERS_KEY: "x"}, {**ok, LOST_WORKERS_KEY: "x,y"}])
    second = step_metrics.add(2, [ok, {**ok, LOST_WORKERS_KEY: "y"}])
    third = step_metrics.add(3, [ok, ok])
    assert (first["reward/rescored_sessions"], first["reward/worker_deaths"]) == (2.0, 2.0)
    assert (second["reward/rescored_sessions"], second["reward/worker_deaths"]) == (1.0, 0.0)
    assert (third["reward/rescored_sessions"], third["reward/worker_deaths"]) == (0.0, 0.0)
    assert "reward/extra/lost_reward_workers/mean" not in first
    alone = extras_metrics([{**ok, LOST_WORKERS_KEY: "x"}, {**ok, LOST_WORKERS_KEY: "x"}])
    assert (alone["reward/rescored_sessions"], alone["reward/worker_deaths"]) == (2.0, 1.0)


class _CaptureComputeScore:
    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def remote(self, data: Any) -> dict[str, Any]:
        self.requests.append(data)
        return {"reward_score": 0.0, "reward_extra_info": {}}


class CapturingRewardWorker:
    """A reward worker handle that keeps the ``DataProto`` verl's ``_compute_score`` sends it."""

    def __init__(self) -> None:
        self.compute_score = _CaptureComputeScore()


async def test_samples_generated_by_older_weights_are_admitted_first(
    tmp_path, verl_config_factory, tokenizer
):
    """One slot; every sample was dispatched at step 3, but the first three were generated by the
    weights of step 5 (version 4: ``min_global_steps`` in the agent-loop output's extra fields, set by
    verl's ``LLMServerClient``) and the last two by those of step 2. The score requests are the ones
    verl's ``_compute_score`` builds in our agent-loop worker (the extra fields travel as
    ``tool_extra_fields``); our manager gives every freed slot to the older generation first, the
    samples closest to being evicted as stale."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.trainer.ppo.reward import load_reward_manager

    path = write_module(tmp_path, ORDER_RECORDING_FUNCTION, "recorded.py")
    config = verl_config_factory(
        "async_naive",
        {"limits": {"max_concurrency": 1}, "extra_defaults": {"started": -1}},
        custom_reward_function={"path": path, "name": "recorded"},
    )
    manager = load_reward_manager(config, tokenizer)
    capture = CapturingRewardWorker()
    worker = agent_loop_worker([capture])
    responses = ["new a", "new b", "new c", "old a", "old b"]
    prompt_ids = tokenizer.encode("What is 1*1?")
    for i, (response, version) in enumerate(zip(responses, [4, 4, 4, 1, 1], strict=True)):
        output = AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=tokenizer.encode(response),
            response_mask=[1] * len(tokenizer.encode(response)),
            metrics=AgentLoopMetrics(),
            extra_fields={"global_steps": version, "min_global_steps": version, "max_global_steps": version},
        )
        kwargs = {
            "uid": f"u{i}",
            "session_id": 0,
            "global_steps": 3,
            "data_source": "test",
            "reward_model": {"ground_truth": "1"},
            "extra_info": {"index": i},
        }
        await worker._compute_score([output], kwargs)
    # Arrival order: the newer generation first, each queued behind the slot the test holds.
    outputs = await admitted_in_turn(manager, capture.compute_score.requests)
    assert all(o["reward_extra_info"]["status"] == "ok" for o in outputs)
    started = {r: o["reward_extra_info"]["started"] for r, o in zip(responses, outputs, strict=True)}
    assert sorted(started, key=started.__getitem__) == ["old a", "old b", "new a", "new b", "new c"]


# ----------------------------------------------------------------------------- verl's separate_async


class RewardWorkerKiller(threading.Thread):
    """Kills verl's reward workers ``names`` while the judge holds ``in_flight`` requests, then
    releases the judge.

    The judge is held (``hold``) from :meth:`start` on, so the sessions sent to it wait there however
    fast or slow the machine is. With ``in_flight`` >= 2 held from our one agent-loop worker, at
    least one went through worker 0 (it picks the reward worker with the fewest of its sessions in
    flight), so that worker dies with a session on it: a fact, not a race of the kill against a
    latency. The kill is waited for (``kill_and_wait``) before the release, so the sessions on a
    killed worker fail over instead of being answered."""

    def __init__(self, server: Any, names: list[str], in_flight: int, timeout_s: float = 280.0) -> None:
        super().__init__(daemon=True)
        self.server, self.names, self.in_flight, self.timeout_s = server, names, in_flight, timeout_s
        self.killed: list[str] = []  # the killed actors' ids
        self.stop = threading.Event()

    def start(self) -> None:
        self.server.update_config(hold=True)
        super().start()

    def run(self) -> None:
        import ray

        try:
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline and not self.stop.is_set():
                if self.server.stats()["held"] >= self.in_flight:
                    handles = [ray.get_actor(name) for name in self.names]
                    kill_and_wait(handles)
                    self.killed = [handle._actor_id.hex() for handle in handles]
                    return
                time.sleep(0.02)
        finally:
            self.server.update_config(hold=False)  # also when never reached: the run goes on and fails


def _train_while_killing(
    tmp_path: Path, model_dir: Path, rollout: Any, server: Any, names: list[str], in_flight: int
) -> tuple[Any, RewardWorkerKiller]:
    """verl's ``separate_async`` (two steps of two mini-batches) with our judge manager in two reward
    workers, the judge holding every request until ``names`` are killed."""
    from tests.v1.test_separate_async import ROWS, train_separate_async
    from tests.v1.test_v1_integration import FAST_RETRY

    script = {question: [f"The answer is {truth}", "The answer is 0"] for question, truth in ROWS}
    killer = RewardWorkerKiller(server, names, in_flight)
    killer.start()
    try:
        run = train_separate_async(
            tmp_path,
            model_dir,
            rollout,
            script,
            [
                "reward.reward_manager.name=llm_judge",
                f"+reward.async_reward.judge.base_url={server.url}/v1",
                "reward.num_workers=2",
                *FAST_RETRY,
            ],
            steps=2,
        )
    finally:
        killer.stop.set()
        killer.join(timeout=10)
    return run, killer


def test_a_reward_worker_killed_mid_batch_costs_no_group_under_separate_async(
    tmp_path: Path, model_dir: Path, rollout: Any, transfer_queue: None, server: Any
) -> None:
    """verl's ``separate_async`` with our v1 lines and two reward workers running our judge manager:
    worker 0 is killed while the judge holds its requests. Its sessions are scored again on worker 1
    (the judge sees them twice), no group fails or is evicted, every step trains its sessions once,
    and the step logs count one death and the re-scored sessions. Without failover the killed
    worker's sessions fail their groups (verl evicts and refills them) and it keeps being chosen."""
    from tests.support.v1_standins import sessions
    from tests.v1.test_v1_integration import assert_reward_metrics_every_step, step_logs

    run, killer = _train_while_killing(tmp_path, model_dir, rollout, server, ["reward_loop_worker_0"], 2)
    assert len(killer.killed) == 1
    trained = [row for update in run.updates for row in sessions(update)]
    assert len(trained) == 8
    assert not [key for key, count in Counter(row.key for row in trained).items() if count > 1]
    assert all(row.reward_extra_info["status"] == "ok" for row in trained)
    for update in run.updates:  # one group per mini-batch, one right and one wrong answer
        assert sorted(row.score for row in sessions(update)) == [0.0, 1.0]
    logs = step_logs(run)
    assert_reward_metrics_every_step(run, steps=2, samples_per_step=4)
    assert not [m for m in logs if m.get("training/rollout_failure/evicted_samples")]
    assert sum(m["reward/worker_deaths"] for m in logs) == 1.0
    rescored = [row for row in trained if row.reward_extra_info.get(LOST_WORKERS_KEY)]
    assert {row.reward_extra_info[LOST_WORKERS_KEY] for row in rescored} == set(killer.killed)
    assert sum(m["reward/rescored_sessions"] for m in logs) == len(rescored) >= 1


def test_with_every_reward_worker_killed_the_run_stops_naming_the_cause(
    tmp_path: Path, model_dir: Path, rollout: Any, transfer_queue: None, server: Any
) -> None:
    """Both reward workers killed mid-batch: the sessions waiting on them fail with
    ``reward_workers_lost`` (no score invented), verl fails their groups, and the refill that follows
    reaches our agent-loop worker, which refuses it: ``fit`` raises with the cause instead of
    refilling groups that can never be scored."""
    with pytest.raises(RewardWorkersLost, match=f"{REWARD_WORKERS_LOST}: all 2 reward worker"):
        _train_while_killing(
            tmp_path, model_dir, rollout, server, ["reward_loop_worker_0", "reward_loop_worker_1"], 1
        )
