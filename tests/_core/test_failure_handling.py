"""Whatever a scorer does, every sample comes back once, on time, with a status.

A user's reward code may raise what asyncio treats as control flow (``KeyboardInterrupt``,
``SystemExit``, ``GeneratorExit``, a ``CancelledError`` nobody asked for), swallow the cancellation
that enforces its deadline, hang in a thread, return a score that is not a number, or return extras
named like the batch's own fields. Driven as a user's job drives it: ``run_single`` on a manager built
by verl's ``load_reward_manager`` from a real reward file (the legacy pipelined manager's Ray workers:
tests/legacy/test_failure_handling.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from async_reward._core.deadline import DeadlineAbandoned, DeadlineExceeded, run_with_deadline
from async_reward._core.result import extras_fill_values
from async_reward.training.schedule import _with_rewards
from tests.managers.test_managers import write_module

HAZARDS = """
import asyncio
import decimal
import os
import threading
import time

import numpy as np
import torch

from async_reward import RewardResult


class BadFloat:
    def __float__(self):
        raise RuntimeError("boom in __float__")


class BadRepr:
    def __repr__(self):
        raise RuntimeError("boom in __repr__")


def raise_for(case):
    if case == "kbint":
        raise KeyboardInterrupt("user ctrl-c")
    if case == "sysexit":
        raise SystemExit(3)
    if case == "genexit":
        raise GeneratorExit()
    if case == "cancelled":
        raise asyncio.CancelledError()


RETURNS = {
    "text": lambda: "0.7",
    "decimal": lambda: decimal.Decimal("0.3"),
    "np_float32": lambda: np.float32(0.5),
    "np_int": lambda: np.int64(1),
    "bool": lambda: True,
    "torch_scalar": lambda: torch.tensor(0.25),
    "torch_vector": lambda: torch.tensor([0.5, 0.5]),
    "huge": lambda: 10**400,
    "float32_overflow": lambda: 1e39,
    "past_the_bound": lambda: {"score": -3e38},
    "at_the_bound": lambda: 1e15,
    "bad_float": lambda: BadFloat(),
    "result_huge": lambda: RewardResult(score=10**400),
    "result_vector": lambda: RewardResult(score=torch.tensor([1.0, 2.0])),
    "bad_repr_extra": lambda: {"score": 1.0, "shown": BadRepr()},
    "named_like_the_batch": lambda: {
        "score": 1.0, "uid": "problem-7", "data_source": "mine", "status": "mine", "acc": 1
    },
}


BARRIERS = {}  # parties -> threading.Barrier: calls that return only once all parties run at once
RUNNING = {}  # gate -> [calls of swallow:<gate> running now, the most that ran at once]


def released(gate):  # whether the test opened the gate (a file): a cause it controls, not a duration
    return os.path.exists(gate)


def sync_score(data_source, solution_str, ground_truth, extra_info=None):
    raise_for(ground_truth)
    if ground_truth in RETURNS:
        return RETURNS[ground_truth]()
    if ground_truth.startswith("sleep:"):
        time.sleep(float(ground_truth.split(":")[1]))
    if ground_truth.startswith("together:"):  # returns once N calls run at the same time (60 s bound)
        parties = int(ground_truth.split(":")[1])
        BARRIERS.setdefault(parties, threading.Barrier(parties, timeout=60)).wait()
    if ground_truth.startswith("until:"):  # blocks its thread until the gate file exists (60 s bound)
        open(ground_truth.split(":", 1)[1] + ".started", "a").close()
        until = time.monotonic() + 60
        while not released(ground_truth.split(":", 1)[1]) and time.monotonic() < until:
            time.sleep(0.01)
    return 1.0


async def async_score(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(0)
    raise_for(ground_truth)
    if ground_truth.startswith("swallow:"):  # ignores every cancellation until the gate file exists
        gate = ground_truth.split(":", 1)[1]
        running = RUNNING.setdefault(gate, [0, 0])  # calls running now, the most at once (in .peak)
        running[0] += 1
        running[1] = max(running)
        with open(gate + ".peak", "w") as peak:
            peak.write(str(running[1]))
        until = time.monotonic() + 60
        while not released(gate) and time.monotonic() < until:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                pass
        running[0] -= 1
        open(gate + ".ended", "w").close()
    if ground_truth == "forever":
        await asyncio.sleep(3600)
    if ground_truth.startswith("block:"):  # blocks the event loop itself (a sync sleep in async code)
        time.sleep(float(ground_truth.split(":")[1]))
    return 1.0
"""

CONTROL_FLOW = ["kbint", "sysexit", "genexit", "cancelled"]


@pytest.fixture(scope="module")
def hazards(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_module(tmp_path_factory.mktemp("hazards"), HAZARDS, "hazards.py")


def build(verl_config_factory: Any, tokenizer: Any, path: str, name: str, **settings: Any) -> Any:
    from verl.trainer.ppo.reward import load_reward_manager

    config = verl_config_factory("async_naive", settings, custom_reward_function={"path": path, "name": name})
    return load_reward_manager(config, tokenizer)  # as verl's RewardLoopWorker builds it


async def score(
    manager: Any, batch_factory: Any, truths: list[str], bound_s: float = 30
) -> list[dict[str, Any]]:
    """Every row scored concurrently; a hang fails the test instead of the suite."""
    batch = batch_factory([{"response": "x", "ground_truth": t} for t in truths])
    calls = [manager.run_single(batch[i : i + 1]) for i in range(len(batch))]
    return await asyncio.wait_for(asyncio.gather(*calls), bound_s)


def statuses(outputs: list[dict[str, Any]]) -> list[str]:
    return [o["reward_extra_info"]["status"] for o in outputs]


# ------------------------------------------------------------------ control flow raised by user code


@pytest.mark.parametrize("name", ["sync_score", "async_score"])
async def test_control_flow_raised_by_user_code_fails_only_its_sample(
    name, hazards, verl_config_factory, tokenizer, batch_factory
):
    """Each used to escape ``run_single`` (KeyboardInterrupt and SystemExit stop the event loop;
    CancelledError cancelled the batch; GeneratorExit passed every ``except Exception``)."""
    manager = build(verl_config_factory, tokenizer, hazards, name, retry={"max_attempts": 1})
    outputs = await score(manager, batch_factory, [*CONTROL_FLOW, "ok"])
    assert statuses(outputs) == ["error"] * len(CONTROL_FLOW) + ["ok"]
    reasons = [o["reward_extra_info"]["failure_reason"] for o in outputs[:-1]]
    names = ["KeyboardInterrupt", "SystemExit", "GeneratorExit", "CancelledError"]
    for case, reason in zip(names, reasons, strict=True):
        assert reason.startswith(f"{case} raised by the scoring code"), reason
    assert all(o["reward_score"].failed for o in outputs[:-1])


async def test_a_real_cancellation_still_cancels(hazards, verl_config_factory, tokenizer, batch_factory):
    manager = build(verl_config_factory, tokenizer, hazards, "async_score")
    batch = batch_factory([{"response": "x", "ground_truth": "forever"}])
    task = asyncio.ensure_future(manager.run_single(batch))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    # The call stopped when cancelled: its slot is back, and it is not counted as left running.
    await until(lambda: manager.admission.in_flight == 0)
    assert manager.admission.left_running.stuck == 0


async def test_a_cancellation_turned_into_an_error_by_a_subclass_still_cancels(
    verl_config_factory, tokenizer, batch_factory
):
    """A manager subclass whose ``score`` wraps every exception (``except BaseException: raise
    RuntimeError``) must not make a cancelled ``run_single`` return as if it had scored."""
    from async_reward import AsyncRewardManager

    class WrapsEverything(AsyncRewardManager):
        async def score(self, sample: Any) -> Any:
            try:
                await asyncio.sleep(30)
            except BaseException as exc:
                raise RuntimeError("wrapped") from exc

    manager = WrapsEverything(verl_config_factory("async_naive", {}), tokenizer)
    task = asyncio.ensure_future(manager.run_single(batch_factory([{"response": "x"}])))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)


async def test_a_subclass_result_with_broken_bookkeeping_is_a_status_with_a_reason_never_an_exception(
    verl_config_factory, tokenizer, batch_factory
):
    """What a manager subclass's ``score`` returns is checked beyond its score: ``attempts=None`` made
    ``run_single`` raise ``RecursionError`` (the sample's conversion failed, and so did its fallback's,
    without end), and a failure without a reason came back with ``failure_reason`` ``''`` or ``None``.
    Now each sample gets one status, and every failed one says why."""
    from async_reward import AsyncRewardManager, RewardResult
    from async_reward._core.result import Status

    results = {
        "attempts None": RewardResult(score=0.7, attempts=None),  # type: ignore[arg-type]
        "attempts -1": RewardResult(score=0.7, attempts=-1),
        "attempts True": RewardResult(score=0.7, attempts=True),
        "status text": RewardResult(score=0.7, status="ok"),  # type: ignore[arg-type]
        "error, no reason": RewardResult(score=None, status=Status.ERROR),
        "timeout, reason None": RewardResult(score=None, status=Status.TIMEOUT, failure_reason=None),  # type: ignore[arg-type]
        "ok, reason None": RewardResult(score=0.5, failure_reason=None),  # type: ignore[arg-type]
        "attempts np.int64": RewardResult(score=0.25, attempts=np.int64(3)),  # type: ignore[arg-type]
    }

    class Returns(AsyncRewardManager):
        async def score(self, sample: Any) -> Any:
            return results[sample.response]

    manager = Returns(verl_config_factory("async_naive", {"fallback_score": -1.0}), tokenizer)
    outputs = [
        await asyncio.wait_for(manager.run_single(batch_factory([{"response": case}])), 30)
        for case in results
    ]
    got = {
        case: (
            o["reward_extra_info"]["status"],
            float(o["reward_score"]),
            o["reward_extra_info"]["failure_reason"],
        )
        for case, o in zip(results, outputs, strict=True)
    }
    for case in ("attempts None", "attempts -1", "attempts True"):
        assert got[case][:2] == ("invalid", -1.0) and "is not a count" in got[case][2], got[case]
    assert got["status text"][:2] == ("invalid", -1.0) and "is not a Status" in got["status text"][2]
    assert got["error, no reason"] == ("error", -1.0, "score() gave status error without a reason")
    assert got["timeout, reason None"] == ("timeout", -1.0, "score() gave status timeout without a reason")
    assert got["ok, reason None"] == ("ok", 0.5, "")
    assert got["attempts np.int64"] == ("ok", 0.25, "")
    assert outputs[-1]["reward_extra_info"]["attempts"] == 3


async def test_a_coroutine_swallowing_its_cancellation_times_out_on_time(
    hazards, verl_config_factory, tokenizer, batch_factory, caplog, tmp_path
):
    """``asyncio.timeout`` waited for the coroutine to give up (here: until the test releases it,
    after the sample came back) and then reported it ``ok``; now the sample is ``timeout`` at its
    deadline plus a short grace, not retried."""
    gate = tmp_path / "gate"
    manager = build(
        verl_config_factory, tokenizer, hazards, "async_score", timeout_s=0.5, retry={"max_attempts": 3}
    )
    with caplog.at_level(logging.WARNING, logger="async_reward._core.deadline"):
        # The coroutine gives up only once the gate opens, after this returns: the result coming back
        # at all (before the 30 s bound of ``score``) is the proof it was abandoned, not waited for.
        [output] = await score(manager, batch_factory, [f"swallow:{gate}"])
    info = output["reward_extra_info"]
    assert (info["status"], info["attempts"]) == ("timeout", 1), info
    assert "ignored its cancellation and was abandoned" in info["failure_reason"]
    assert any("left running" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "gate.ended").exists()  # still running, abandoned
    gate.touch()  # let the abandoned coroutine end before this test's loop closes
    await until(lambda: (tmp_path / "gate.ended").exists())


async def test_calls_that_ignore_their_cancellation_keep_their_slots_so_max_concurrency_holds(
    hazards, verl_config_factory, tokenizer, batch_factory, caplog, tmp_path
):
    """An async function that swallows its cancellation, ``max_concurrency`` 2: each call abandoned
    at its deadline gave its slot back while it ran on, so all 6 samples' calls ran at once (the
    review's probe: 8 of 10, 6 still running after the batch returned). Now an abandoned call keeps
    its slot until it really ends: 2 run, the other samples wait and, as no slot can come free, fail
    as ``timeout`` at ``timeout_s`` naming the stuck calls (no ``admission_timeout_s`` is set: without
    that bound they would wait for them, here until the gate opens, after the checks)."""
    gate = tmp_path / "gate"
    manager = build(
        verl_config_factory,
        tokenizer,
        hazards,
        "async_score",
        timeout_s=0.3,
        retry={"max_attempts": 1},
        limits={"max_concurrency": 2},
    )
    with caplog.at_level(logging.WARNING, logger="async_reward._core.deadline"):
        outputs = await score(manager, batch_factory, [f"swallow:{gate}"] * 6)
    assert statuses(outputs) == ["timeout"] * 6
    reasons = [o["reward_extra_info"]["failure_reason"] for o in outputs]
    abandoned = [r for r in reasons if "ignored its cancellation and was abandoned" in r]
    waited = [r for r in reasons if r.startswith("no free concurrency slot within")]
    assert (len(abandoned), len(waited)) == (2, 4), reasons
    assert all("2 call(s) that ignored their cancellation still run" in r for r in waited), waited
    assert all("limit: timeout_s=0.3 s" in r for r in waited), waited
    assert (tmp_path / "gate.peak").read_text() == "2"  # the function never ran more than 2 at once
    assert (manager.admission.in_flight, manager.admission.left_running.stuck) == (2, 2)
    assert any("2 call(s) ignored their cancellation" in r.getMessage() for r in caplog.records)
    gate.touch()  # the abandoned calls end: their slots come back, and nothing stays counted
    await until(lambda: (manager.admission.in_flight, manager.admission.left_running.stuck) == (0, 0))
    assert statuses(await score(manager, batch_factory, ["ok", "ok"])) == ["ok", "ok"]


async def test_a_cancelled_sample_returns_at_once_and_its_call_keeps_its_slot_until_it_ends(
    hazards, verl_config_factory, tokenizer, batch_factory, tmp_path
):
    """A sample cancelled (a stopped batch) while its call swallows the cancellation: ``run_single``
    still raises ``CancelledError`` at once (the call ends only when the gate opens, after), and the
    call keeps its slot until then, counted as stuck once it ignored the cancellation for the grace."""
    gate = tmp_path / "gate"
    manager = build(
        verl_config_factory, tokenizer, hazards, "async_score", timeout_s=60.0, limits={"max_concurrency": 1}
    )
    await start_then_cancel(manager, batch_factory, f"swallow:{gate}", tmp_path / "gate.peak")
    assert manager.admission.in_flight == 1
    await until(lambda: manager.admission.left_running.stuck == 1)
    assert not (tmp_path / "gate.ended").exists()  # still running: cancelled, not waited for
    gate.touch()
    await until(lambda: (manager.admission.in_flight, manager.admission.left_running.stuck) == (0, 0))
    assert statuses(await score(manager, batch_factory, ["ok"])) == ["ok"]


async def test_an_async_function_that_blocks_the_loop_past_its_deadline_is_a_timeout(
    hazards, verl_config_factory, tokenizer, batch_factory
):
    """It returned 1.0 after blocking the event loop 2.5 s with timeout_s=1 and was ``ok``: the
    deadline's timer cannot fire while the loop is blocked, and the late result was taken."""
    manager = build(
        verl_config_factory, tokenizer, hazards, "async_score", timeout_s=0.5, retry={"max_attempts": 1}
    )
    [output] = await score(manager, batch_factory, ["block:1.5"])
    info = output["reward_extra_info"]
    assert (info["status"], float(output["reward_score"]), info["attempts"]) == ("timeout", 0.0, 1)
    reason = info["failure_reason"]
    assert "past its deadline of 0.5 s" in reason and "event loop was blocked" in reason, reason
    assert reason.endswith("(timeout_s)"), reason
    [output] = await score(manager, batch_factory, ["ok"])  # one that does not block is still ok
    assert (output["reward_extra_info"]["status"], float(output["reward_score"])) == ("ok", 1.0)


async def test_a_result_after_the_deadline_is_refused_by_run_with_deadline_itself() -> None:
    async def blocks_the_loop() -> float:
        time.sleep(0.3)
        return 1.0

    with pytest.raises(DeadlineExceeded, match="event loop was blocked") as info:
        await run_with_deadline(blocks_the_loop(), 0.1)
    assert info.value.timeout_s == 0.1


async def test_run_with_deadline_tells_of_every_call_it_leaves_running() -> None:
    """So that its caller can keep the call's slot until it ends: a call abandoned at its deadline
    (told as stuck), and one whose caller was cancelled, while it waited for the call or during the
    call's grace (told as not stuck yet: it was just cancelled). Each is told while it still runs."""
    release = asyncio.Event()
    cancelled = asyncio.Event()
    started = asyncio.Event()
    told: list[tuple[asyncio.Future[Any], bool]] = []

    async def swallows() -> None:
        started.set()
        while not release.is_set():
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                cancelled.set()

    def left_running(task: asyncio.Future[Any], stuck: bool) -> None:
        told.append((task, stuck))

    with pytest.raises(DeadlineAbandoned):
        await run_with_deadline(swallows(), 0.05, grace_s=0.05, left_running=left_running)
    for timeout_s, until_event in ((60.0, started), (0.05, cancelled)):  # waiting; in the grace
        started.clear()
        cancelled.clear()
        caller = asyncio.ensure_future(
            run_with_deadline(swallows(), timeout_s, grace_s=60.0, left_running=left_running)
        )
        await asyncio.wait_for(until_event.wait(), 30)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(caller, 30)
    assert [stuck for _, stuck in told] == [True, False, False]
    assert not any(task.done() for task, _ in told)
    release.set()
    await asyncio.wait_for(asyncio.gather(*(task for task, _ in told), return_exceptions=True), 30)


async def until(condition: Any, timeout_s: float = 60.0) -> None:
    """Wait (bounded) until ``condition()`` holds: a poll, not a guess at how long it takes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


# ------------------------------------------------------------------ sync functions and their threads


async def test_the_deadline_of_a_sync_function_measures_the_call_not_the_queue(
    hazards, verl_config_factory, tokenizer, batch_factory
):
    """160 calls allowed in flight, each returning only once all 160 run at the same time (a
    barrier), with a 30 s deadline: the loop's default pool (min(32, cpus + 4) threads) queued them,
    so no call could ever return and every one timed out without the function being slow. The
    barrier makes that a fact of the pool's size, not a race of 160 thread starts against a deadline."""
    manager = build(
        verl_config_factory, tokenizer, hazards, "sync_score", timeout_s=30.0, limits={"max_concurrency": 160}
    )
    outputs = await score(manager, batch_factory, ["together:160"] * 160, bound_s=90)
    assert statuses(outputs) == ["ok"] * 160
    assert manager.function_pool.size == 160


async def test_a_pool_busy_with_healthy_calls_is_queueing_not_a_timeout(
    hazards, verl_config_factory, tokenizer, batch_factory
):
    """2 threads, 60 calls of 0.1 s, a 2 s deadline: the last calls wait about 2.9 s for a thread
    (29 rounds of 0.1 s; load only lengthens it), longer than the deadline, and none of them is slow,
    so every sample is ok (the wait is queueing, as admission). Margin: each call has 1.9 s beyond its
    0.1 s sleep for two thread hand-offs and a loop wake-up."""
    manager = build(verl_config_factory, tokenizer, hazards, "sync_score", timeout_s=2.0, executor_workers=2)
    outputs = await score(manager, batch_factory, ["sleep:0.1"] * 60)
    assert statuses(outputs) == ["ok"] * 60
    assert manager.function_pool.overdue == 0


async def test_calls_stuck_past_their_deadline_are_reported_and_cannot_starve_later_samples(
    hazards, verl_config_factory, tokenizer, batch_factory, caplog, tmp_path
):
    """Two calls hold both threads until the test opens their gate (after the checks): a later sample
    fails as ``timeout`` naming them, instead of waiting for them (which would be until the gate)."""
    gate = tmp_path / "gate"
    manager = build(verl_config_factory, tokenizer, hazards, "sync_score", timeout_s=0.3, executor_workers=2)
    with caplog.at_level(logging.WARNING, logger="async_reward._core.user_code"):
        stuck = await score(manager, batch_factory, [f"until:{gate}", f"until:{gate}"])
        assert statuses(stuck) == ["timeout", "timeout"]
        assert manager.function_pool.overdue == 2
        # Bounded by timeout_s (no admission_timeout_s set), not by the stuck calls: those return only
        # once the gate opens below, so this coming back at all (within score's 30 s) is the proof.
        [starved] = await score(manager, batch_factory, ["ok"])
    info = starved["reward_extra_info"]
    assert info["status"] == "timeout"
    assert "no free thread for the reward function" in info["failure_reason"]
    assert "2 call(s) of the reward function still run past their deadline" in info["failure_reason"]
    assert any("still run past their 0.3 s deadline" in r.getMessage() for r in caplog.records)
    assert manager.function_pool.overdue == 2  # still stuck: nothing but the gate frees them
    gate.touch()  # the stuck calls return and give their threads back
    await until(lambda: manager.function_pool.overdue == 0)
    assert statuses(await score(manager, batch_factory, ["ok"])) == ["ok"]


async def start_then_cancel(manager: Any, batch_factory: Any, truth: str, started: Any) -> None:
    """Score one sample and cancel it (a stopped batch) once its function has started (``started``
    exists); the cancellation must come back at once."""
    batch = batch_factory([{"response": "x", "ground_truth": truth}])
    task = asyncio.ensure_future(manager.run_single(batch))
    await until(started.exists)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)


async def test_a_hung_call_whose_sample_was_cancelled_is_stuck_from_its_deadline_and_starves_nobody(
    hazards, verl_config_factory, tokenizer, batch_factory, caplog, tmp_path
):
    """A sync call that hangs, its sample cancelled before its deadline: its thread stayed held but
    was never counted overdue, so with one thread and no admission_timeout_s the next sample waited
    for it for ever. Now it counts as overdue (once) from its deadline until it returns, and the next
    sample fails as ``timeout`` naming it, as when the hung call is left to reach its deadline."""
    gate = tmp_path / "gate"
    manager = build(verl_config_factory, tokenizer, hazards, "sync_score", timeout_s=1.0, executor_workers=1)
    await start_then_cancel(manager, batch_factory, f"until:{gate}", tmp_path / "gate.started")
    with caplog.at_level(logging.WARNING, logger="async_reward._core.user_code"):
        # The hung call returns only once the gate opens below: this coming back at all (within
        # score's 30 s) is the proof that the sample did not wait for it.
        [starved] = await score(manager, batch_factory, ["ok"])
    info = starved["reward_extra_info"]
    assert info["status"] == "timeout", info
    assert "no free thread for the reward function" in info["failure_reason"]
    assert "1 call(s) of the reward function still run past their deadline" in info["failure_reason"]
    assert any("still run past their 1 s deadline" in r.getMessage() for r in caplog.records)
    assert manager.function_pool.overdue == 1
    gate.touch()  # the hung call returns: its thread is free again and it is no longer counted
    await until(lambda: manager.function_pool.overdue == 0)
    assert statuses(await score(manager, batch_factory, ["ok"])) == ["ok"]


async def test_a_cancelled_call_that_returns_frees_its_thread_and_is_never_counted_stuck(
    hazards, verl_config_factory, tokenizer, batch_factory, tmp_path
):
    """The other way a cancelled sample's call ends: its function returns (here when the test opens
    the gate). Its thread serves the next sample, and its deadline passing later counts nothing."""
    gate = tmp_path / "gate"
    manager = build(verl_config_factory, tokenizer, hazards, "sync_score", timeout_s=1.0, executor_workers=1)
    await start_then_cancel(manager, batch_factory, f"until:{gate}", tmp_path / "gate.started")
    gate.touch()
    assert statuses(await score(manager, batch_factory, ["ok"])) == ["ok"]  # it had its thread back
    await asyncio.sleep(1.5)  # past the cancelled call's deadline: it has returned, so it is not overdue
    assert manager.function_pool.overdue == 0


# ------------------------------------------------------------------ what a scorer returns


async def test_only_real_numbers_are_scores_and_nothing_escapes_as_an_exception(
    hazards, verl_config_factory, tokenizer, batch_factory
):
    cases = {
        "text": ("invalid", None),
        "decimal": ("invalid", None),
        "np_float32": ("ok", 0.5),
        "np_int": ("ok", 1.0),
        "bool": ("ok", 1.0),
        "torch_scalar": ("ok", 0.25),
        "torch_vector": ("invalid", None),
        "huge": ("invalid", None),
        "float32_overflow": ("invalid", None),
        "past_the_bound": ("invalid", None),
        "at_the_bound": ("ok", 1e15),
        "bad_float": ("invalid", None),
        "result_huge": ("invalid", None),
        "result_vector": ("invalid", None),
        "bad_repr_extra": ("ok", 1.0),
    }
    manager = build(verl_config_factory, tokenizer, hazards, "sync_score", fallback_score=-1.0)
    outputs = await score(manager, batch_factory, list(cases))
    for (case, (status, value)), output in zip(cases.items(), outputs, strict=True):
        info = output["reward_extra_info"]
        assert info["status"] == status, (case, info)
        assert float(output["reward_score"]) == (-1.0 if value is None else value), case
    assert outputs[-1]["reward_extra_info"]["shown"] == "<unprintable BadRepr>"
    assert "unusable score '0.7' of type str" in outputs[0]["reward_extra_info"]["failure_reason"]
    # verl trains in float32: 1e39 failed the write (its group dropped) though it said ok, and two of
    # 3e38 gave a group NaN advantages
    reasons = {case: o["reward_extra_info"]["failure_reason"] for case, o in zip(cases, outputs, strict=True)}
    assert "past 1e+15 in magnitude" in reasons["float32_overflow"], reasons["float32_overflow"]
    assert "past 1e+15 in magnitude" in reasons["past_the_bound"], reasons["past_the_bound"]


async def test_extras_never_replace_batch_fields_or_library_keys(
    hazards, verl_config_factory, tokenizer, batch_factory, caplog
):
    """A scorer reporting the problem id it graded as ``uid`` used to rewrite the batch's GRPO groups."""
    manager = build(verl_config_factory, tokenizer, hazards, "sync_score")
    batch = batch_factory(
        [{"response": "x", "ground_truth": "named_like_the_batch", "uid": u} for u in ("A", "A", "B", "B")]
    )
    with caplog.at_level(logging.WARNING, logger="async_reward.managers.base"):
        outputs = [await manager.run_single(batch[i : i + 1]) for i in range(len(batch))]
    info = outputs[0]["reward_extra_info"]
    assert info["status"] == "ok" and info["user_status"] == "mine"
    assert (info["user_uid"], info["user_data_source"], info["acc"]) == ("problem-7", "mine", 1)
    assert "uid" not in info and "data_source" not in info
    renamed = [r.getMessage() for r in caplog.records if "kept as" in r.getMessage()]
    assert len(renamed) == 3  # once per key, not once per sample

    joined = _with_rewards(batch, _chunk_of(batch, stacked([o["reward_extra_info"] for o in outputs])))
    assert list(joined.non_tensor_batch["uid"]) == ["A", "A", "B", "B"]
    assert list(joined.non_tensor_batch["user_uid"]) == ["problem-7"] * 4


def stacked(infos: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Per-sample extras as one array per key, a missing value filled as every reward source fills it."""
    fills = extras_fill_values(infos)
    return {key: np.array([info.get(key, fill) for info in infos]) for key, fill in fills.items()}


@dataclass
class _Chunk:
    """What a reward source's ``get_chunk`` returns (``training.schedule.RewardChunkLike``)."""

    indices: np.ndarray
    rm_scores: torch.Tensor
    reward_extra_info: dict[str, np.ndarray]


def _chunk_of(batch, extras):
    """A whole-batch chunk carrying ``extras`` (zero scores), as a reward source hands it out."""
    return _Chunk(
        indices=np.arange(len(batch)),
        rm_scores=torch.zeros(len(batch), batch.batch["responses"].shape[1]),
        reward_extra_info=extras,
    )


def test_any_reward_source_joins_extras_without_replacing_a_batch_field(batch_factory):
    """``_with_rewards`` guards the schedule against reward sources other than our managers too."""
    batch = batch_factory([{"response": "x", "uid": u} for u in ("A", "A", "B", "B")])
    extras = {"uid": np.array(["p"] * 4, dtype=object), "status": np.array(["ok"] * 4, dtype=object)}
    joined = _with_rewards(batch, _chunk_of(batch, extras))
    assert list(joined.non_tensor_batch["uid"]) == ["A", "A", "B", "B"]
    assert list(joined.non_tensor_batch["user_uid"]) == ["p"] * 4
    assert joined.meta_info["reward_extra_keys"] == ["user_uid", "status"]
