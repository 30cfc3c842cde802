"""``limits.admission: job``: one admission queue for the whole job, held by a Ray actor.

Reward workers here are real Ray actor processes, each with its own ``JobAdmission`` (as each of
verl's reward workers builds one in its manager), meeting at one broker actor found by name; and
verl's own ``RewardLoopManager`` with two reward workers scoring through ``llm_judge`` over loopback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest

from async_reward.config import LimitsConfig, load_config
from async_reward.errors import ConfigError
from async_reward.job_admission import JobAdmission, broker_name
from tests.test_verl_integration import assert_statuses

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture
def unique() -> str:
    """A broker name of this test's own, so no test meets another's queue."""
    return f"test-{time.monotonic_ns()}"


def make_limits(**fields: Any) -> LimitsConfig:
    return LimitsConfig(admission="job", **fields)


def _worker_class() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class Worker:
        """One reward worker process's admission: calls that hold a slot for a while."""

        def __init__(self, limits: dict[str, Any], name: str, hold_limit_s: float = 60.0) -> None:
            self.admission = JobAdmission(LimitsConfig(**limits), name, hold_limit_s)
            self.log: list[tuple[str, float]] = []

        async def call(self, label: str, hold_s: float, priority: Any = 0.0, tokens: int = 0) -> str:
            async with self.admission.admit(tokens, priority) as reservation:
                self.log.append((label, time.monotonic()))
                await asyncio.sleep(hold_s)
                if tokens:
                    reservation.settle(tokens * 10)
            return label

        async def call_with_deadline(self, hold_s: float, wait_s: float) -> str:
            try:
                async with asyncio.timeout(wait_s):
                    async with self.admission.admit(0):
                        await asyncio.sleep(hold_s)
                return "admitted"
            except TimeoutError:
                return "gave up"

        def order(self) -> list[str]:
            return [label for label, _ in self.log]

        def stats(self) -> Any:
            return self.admission.broker().stats.remote()

    return Worker


def broker_stats(limits: LimitsConfig, name: str) -> dict[str, int]:
    """The counters of the broker the workers started (found by name: a handle made here and dropped
    would be a broker of its own, collected at once)."""
    import ray

    deadline = time.monotonic() + 30
    while True:
        try:
            return ray.get(ray.get_actor(name).stats.remote())
        except ValueError:  # not started yet
            assert time.monotonic() < deadline, f"no broker {name}"
            time.sleep(0.02)


def wait_for(limits: LimitsConfig, name: str, **counts: int) -> None:
    """Until the broker's counters read ``counts`` (a worker's call has reached the queue)."""
    deadline = time.monotonic() + 30
    while any(broker_stats(limits, name)[key] != value for key, value in counts.items()):
        assert time.monotonic() < deadline, (counts, broker_stats(limits, name))
        time.sleep(0.02)


def test_the_job_queue_caps_calls_across_workers_and_lends_a_slot_wherever_a_call_waits(unique):
    """Two workers, two slots for the job: never more than two calls in flight in all, and a worker
    with nothing to do leaves both slots to the other (per worker, each would get one)."""
    import ray

    limits = make_limits(max_concurrency=2)
    worker = _worker_class()
    busy, idle = (
        worker.remote(dataclasses.asdict(limits), unique),
        worker.remote(dataclasses.asdict(limits), unique),
    )
    ray.get(idle.order.remote())  # started, holding nothing
    ray.get([busy.call.remote(f"b{i}", 0.3) for i in range(4)])
    stats = broker_stats(limits, unique)
    assert stats["max_in_flight"] == 2
    assert (stats["granted"], stats["in_flight"], stats["waiting"]) == (4, 0, 0)
    starts = [t for _, t in ray.get(busy.__ray_call__.remote(lambda w: w.log))]
    # Two at once (the idle worker's slot lent), then two more once those finish.
    assert starts[1] - starts[0] < 0.25 and starts[2] - starts[0] >= 0.25
    # Both workers together: still two at once at most.
    ray.get([busy.call.remote("x", 0.1), idle.call.remote("y", 0.1), idle.call.remote("z", 0.1)])
    assert broker_stats(limits, unique)["max_in_flight"] == 2


def test_the_oldest_step_goes_first_wherever_its_call_waits(unique):
    """A later step's call queued at one worker does not overtake an earlier step's call queued after
    it at another: the job's queue orders by priority (training step), not by worker or arrival."""
    import ray

    limits = make_limits(max_concurrency=1)
    worker = _worker_class()
    first, second = (
        worker.remote(dataclasses.asdict(limits), unique),
        worker.remote(dataclasses.asdict(limits), unique),
    )
    ray.get([first.order.remote(), second.order.remote()])  # both started
    holding = first.call.remote("holder", 1.0, (0,))
    wait_for(limits, unique, in_flight=1)
    late_step = second.call.remote("step 5", 0.0, (5,))
    wait_for(limits, unique, waiting=1)
    early_step = first.call.remote("step 1", 0.0, (1,))
    wait_for(limits, unique, waiting=2)
    ray.get([holding, late_step, early_step])
    log = ray.get(first.__ray_call__.remote(lambda w: w.log)) + ray.get(
        second.__ray_call__.remote(lambda w: w.log)
    )
    assert [label for label, _ in sorted(log, key=lambda entry: entry[1])] == ["holder", "step 1", "step 5"]


def test_a_call_that_gives_up_waiting_leaves_no_waiter_and_takes_no_slot(unique):
    import ray

    limits = make_limits(max_concurrency=1)
    worker = _worker_class()
    one = worker.remote(dataclasses.asdict(limits), unique)
    holding = one.call.remote("holder", 1.0)
    wait_for(limits, unique, in_flight=1)
    assert ray.get(one.call_with_deadline.remote(0.0, 0.2)) == "gave up"
    ray.get(holding)
    deadline = time.monotonic() + 10
    while (stats := broker_stats(limits, unique))["in_flight"] or stats["waiting"]:
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)
    # The slot is free: the next call is admitted at once, and nothing was granted to the one that left.
    assert ray.get(one.call_with_deadline.remote(0.0, 5.0)) == "admitted"
    assert broker_stats(limits, unique)["granted"] == 2


def test_a_cancel_that_reaches_the_broker_before_or_after_its_grant_leaks_nothing(unique):
    """Ray may run an async actor's calls out of order: a cancel may come before its acquire, or
    after the grant it did not see. Either way the lease ends up neither held nor waiting."""
    import ray

    limits = make_limits(max_concurrency=1)
    broker = JobAdmission(limits, unique, 60.0).broker()
    ray.get(broker.cancel.remote("early"))
    assert ray.get(broker.acquire.remote("early", 0, 0.0, 60.0)) is False
    assert ray.get(broker.acquire.remote("late", 0, 0.0, 60.0)) is True
    ray.get(broker.cancel.remote("late"))
    assert ray.get(broker.acquire.remote("next", 0, 0.0, 60.0)) is True  # the slot came back
    stats = ray.get(broker.stats.remote())
    assert (stats["in_flight"], stats["waiting"], stats["granted"]) == (1, 0, 2)
    ray.get(broker.release.remote("next"))
    ray.get(broker.release.remote("next"))  # a second release changes nothing
    assert ray.get(broker.stats.remote())["in_flight"] == 0


def test_a_dead_workers_lease_is_taken_back_after_its_hold_limit(unique):
    """A worker killed while holding a slot: the job's queue takes the slot back once the lease's
    hold limit passes, and a call waiting at another worker gets in (not a hang)."""
    import ray

    limits = make_limits(max_concurrency=1)
    worker = _worker_class()
    survivor = worker.remote(dataclasses.asdict(limits), unique, 1.0)
    ray.get(survivor.call.remote("starts the broker", 0.0))
    doomed = worker.remote(dataclasses.asdict(limits), unique, 1.0)
    doomed.call.remote("never finishes", 3600.0)
    wait_for(limits, unique, in_flight=1)
    ray.kill(doomed)
    assert ray.get(survivor.call_with_deadline.remote(0.0, 30.0)) == "admitted"
    assert broker_stats(limits, unique)["reclaimed"] == 1


def test_when_the_worker_that_started_the_broker_dies_the_next_caller_starts_another(unique):
    """The broker lives as long as the worker that started it: a call waiting at another worker when
    it dies, and every call after, goes through a new broker (an error would fail every sample)."""
    import ray

    limits = make_limits(max_concurrency=1)
    worker = _worker_class()
    owner = worker.remote(dataclasses.asdict(limits), unique)
    other = worker.remote(dataclasses.asdict(limits), unique)
    owner.call.remote("never finishes", 3600.0)
    wait_for(limits, unique, in_flight=1)
    waiting = other.call_with_deadline.remote(0.0, 60.0)
    wait_for(limits, unique, waiting=1)
    ray.kill(owner)
    assert ray.get(waiting) == "admitted"
    assert ray.get(other.call_with_deadline.remote(0.0, 30.0)) == "admitted"
    assert broker_stats(limits, unique)["granted"] == 2  # the new broker's


def test_the_whole_budgets_are_the_jobs_and_usage_above_the_estimate_is_charged(unique):
    """With one queue nothing is split: a request budget too small to share over four workers is valid,
    and the tokens a response reported beyond its estimate become the queue's debt."""
    import ray

    limits = make_limits(
        max_concurrency=4, requests_per_minute=2, tokens_per_minute=1000, estimated_tokens_per_request=5
    )
    limits.validate(4)  # per worker this is refused: half a request a minute each
    with pytest.raises(ConfigError, match="less than one request per minute each"):
        dataclasses.replace(limits, admission="worker").validate(4)
    worker = _worker_class()
    one = worker.remote(dataclasses.asdict(limits), unique)
    ray.get(one.call.remote("a", 0.0, 0.0, 5))  # settles 50 tokens against 5 charged
    broker = JobAdmission(limits, unique, 60.0).broker()
    deadline = time.monotonic() + 10
    while ray.get(broker.__ray_call__.remote(lambda b: b._admission._token_debt)) != 45:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert ray.get(broker.__ray_call__.remote(lambda b: b._admission.request_budget)) == 2
    with pytest.raises(ValueError, match="exceeds the job's whole budget of 1000 tokens"):
        ray.get(one.call.remote("too big", 0.0, 0.0, 1001))


def test_the_broker_name_depends_on_limits_and_endpoint_and_shows_neither():
    limits = make_limits(max_concurrency=3)
    secret = "https://user:hunter2@judge.example/v1"
    name = broker_name(limits, secret)
    assert name == broker_name(make_limits(max_concurrency=3), secret)
    assert name != broker_name(limits, "https://other.example/v1")
    assert name != broker_name(make_limits(max_concurrency=4), secret)
    assert "hunter2" not in name and "judge.example" not in name


def test_an_unknown_admission_scope_is_refused_naming_the_key():
    with pytest.raises(ConfigError) as error:
        load_config({"reward": {"async_reward": {"limits": {"admission": "cluster"}}}})
    assert error.value.key == "reward.async_reward.limits.admission"
    assert "use worker" in str(error.value) and "or job" in str(error.value)


def test_the_start_up_checks_say_that_the_jobs_queue_is_on(verl_config_factory, monkeypatch, capsys):
    from async_reward import start_lines
    from async_reward.checks import check_reward

    monkeypatch.setattr(start_lines, "_SAID", set())
    limits = {"admission": "job", "max_concurrency": 12, "requests_per_minute": 90}
    check_reward(
        verl_config_factory(
            "async_remote", {"remote": {"url": "http://127.0.0.1:1/score"}, "limits": limits}, num_workers=3
        )
    )
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "admission=job" in line]
    assert line == (
        "async_reward: limits.admission=job: one admission queue for the job's 3 reward worker(s), in a "
        "Ray actor: 12 calls in flight in the whole job, 90 requests a minute, no tokens limit, oldest "
        "training step first (two actor calls per attempt)"
    )
    check_reward(
        verl_config_factory("async_remote", {"remote": {"url": "http://127.0.0.1:1/score"}}, num_workers=3)
    )
    assert "admission=job" not in capsys.readouterr().out


def test_llm_judge_through_verls_reward_loop_shares_one_queue_between_its_workers(
    server, verl_config_factory, reward_loop, batch_factory
):
    """The path a user takes: verl's RewardLoopManager starts two reward worker processes, each
    builds llm_judge, and both admit through the job's one queue: the judge never sees more than the
    job's three calls at once, and every sample is scored once."""
    import ray

    server.update_config(latency_ms=(100.0, 100.0))
    settings = {
        "judge": {"base_url": server.url + "/v1"},
        "limits": {"max_concurrency": 3, "admission": "job"},
    }
    config = verl_config_factory("llm_judge", settings, num_workers=2)
    rows = [{"response": f"The answer is {i}", "ground_truth": str(i % 3)} for i in range(16)]
    batch = batch_factory(rows)
    manager = reward_loop(config)
    output = manager.compute_rm_score(batch)
    assert_statuses(output, ["ok"] * len(rows))
    assert server.stats()["max_in_flight_total"] <= 3
    names = ray.get(
        [
            handle.__ray_call__.remote(lambda w: w.reward_manager.admission.name)
            for handle in manager.reward_loop_workers
        ]
    )
    assert len(set(names)) == 1
    stats = ray.get(ray.get_actor(names[0]).stats.remote())
    assert stats["max_concurrency"] == 3 and stats["max_in_flight"] <= 3
    assert stats["granted"] >= len(rows) and stats["in_flight"] == 0


def test_the_score_command_outside_ray_is_the_whole_job(server, tmp_path):
    """``async-reward score`` starts no Ray: with ``admission: job`` its own process is the job, so its
    own admission over the whole limits is the job's (no actor, no cluster started for it)."""
    import json
    import subprocess
    import sys

    from tests.test_cli_score import make_rows, read_output, write_jsonl

    server.update_config(latency_ms=(50.0, 50.0))
    src = write_jsonl(tmp_path / "in.jsonl", make_rows(8))
    out = tmp_path / "out.jsonl"
    argv = ["score", "--input", str(src), "--output", str(out), "--manager", "llm_judge", "--no-progress"]
    argv += ["--set", f"judge.base_url={server.url}/v1", "limits.admission=job", "limits.max_concurrency=2"]
    probe = (
        "import sys, ray, async_reward_cli; code = async_reward_cli.main(sys.argv[1:]); "
        "print('RAY_STARTED' if ray.is_initialized() else 'NO_RAY'); sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "NO_RAY" in done.stdout
    assert [row["status"] for row in read_output(out)] == ["ok"] * 8
    assert server.stats()["max_in_flight_total"] <= 2
    assert json.dumps(read_output(out))  # every row written once, readable
