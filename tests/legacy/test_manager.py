"""``PipelinedRewardLoopManager`` on real parts: a local Ray cluster, the local judge server, our real
managers (``llm_judge``, ``async_stateful``) and real verl ``DataProto`` batches.

Starting worker processes dominates the cost on a small machine, so two managers serve the whole
module (module-scoped). Tests that break a manager (killing workers, closing) run last on it.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import torch
from verl import DataProto

from async_reward.legacy import PipelinedRewardLoopManager, RewardChunkTimeout, Ticket, TicketError
from async_reward.legacy.worker import PipelineRewardWorker
from async_reward.managers.base import RewardScoringError  # noqa: F401  (documented error type)
from tests.support.warm_actors import fresh_workers

GOOD = {"prompt": "What is 2+3?", "response": "The answer is 5", "ground_truth": "5"}
BAD = {"prompt": "What is 2+3?", "response": "The answer is 7", "ground_truth": "5"}


def grouped_rows(sizes: list[int], pattern: Callable[[int], dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows in groups of the given sizes (explicit uids), row ``i`` built by ``pattern(i)``."""
    rows, i = [], 0
    for size in sizes:
        uid = uuid.uuid4().hex
        for _ in range(size):
            rows.append({**pattern(i), "uid": uid})
            i += 1
    return rows


_ROW_IDS = itertools.count()


def judge_rows(sizes: list[int]) -> list[dict[str, Any]]:
    """Judge rows, every third one wrong; prompts are unique so no two requests are shared in flight."""

    def row(i: int) -> dict[str, Any]:
        return {**(GOOD if i % 3 else BAD), "prompt": f"What is 2+3? #{next(_ROW_IDS)}"}

    return grouped_rows(sizes, row)


def drain(manager: PipelinedRewardLoopManager, ticket: Ticket, n: int, timeout: float = 60) -> list[Any]:
    chunks = []
    while True:
        chunk = manager.get_chunk(ticket, n, timeout=timeout)
        chunks.append(chunk)
        if chunk.is_last:
            return chunks


def assert_complete_groups(batch: DataProto, chunks: list[Any]) -> None:
    uids = batch.non_tensor_batch["uid"]
    seen: list[int] = []
    for chunk in chunks:
        assert chunk.indices.dtype == np.int64
        assert np.all(np.diff(chunk.indices) > 0), "indices sorted, no duplicate"
        for uid in set(uids[chunk.indices]):
            members = np.flatnonzero(uids == uid)
            assert set(members) <= set(chunk.indices.tolist()), "a group is never split"
        assert chunk.rm_scores.shape == (len(chunk), batch.batch["responses"].shape[1])
        assert all(len(v) == len(chunk) for v in chunk.reward_extra_info.values())
        seen.extend(chunk.indices.tolist())
    assert sorted(seen) == list(range(len(batch))), "every sample delivered exactly once"


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def judge_config(verl_config_factory: Callable[..., Any], judge_server: Any) -> Any:
    return verl_config_factory(
        "llm_judge",
        {
            "judge": {"base_url": judge_server.url + "/v1"},
            "limits": {"max_concurrency": 4},
            "timeout_s": 300.0,  # a hang outlasts every bound below (a test cancels its ticket)
            "retry": {"max_attempts": 1},
        },
        num_workers=1,  # verl's reference RewardLoopManager starts one worker; ours are set below
    )


@pytest.fixture(scope="module")
def pipeline(ray_cluster: None, judge_config: Any) -> Iterator[PipelinedRewardLoopManager]:
    manager = PipelinedRewardLoopManager(judge_config, num_workers=2, collect_wait_s=0.5)
    yield manager
    manager.close()


STATEFUL_SOURCE = """
import asyncio
import math


class FlakyScorer:
    async def compute_score(self, data_source, solution_str, ground_truth, extra_info):
        if "FAIL" in solution_str:
            raise ValueError("scorer failed on purpose")
        if "SLOW" in solution_str:
            await asyncio.sleep(60)
        return 1.0 if "right" in solution_str else 0.0

    def post_process_scores(self, scores):
        finite = [s for s in scores if not math.isnan(s)]
        mean = sum(finite) / len(finite) if finite else float("nan")
        return [mean if math.isnan(s) else s for s in scores]
"""


@pytest.fixture(scope="module")
def stateful_config(verl_config_factory: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("scorer") / "flaky.py"
    path.write_text(STATEFUL_SOURCE)
    return verl_config_factory(
        "async_stateful",
        {"timeout_s": 120.0, "retry": {"max_attempts": 1}, "fallback_score": -1.0},
        custom_reward_function={"path": str(path), "name": "FlakyScorer"},
    )


@pytest.fixture(scope="module")
def stateful_pipeline(ray_cluster: None, stateful_config: Any) -> Iterator[PipelinedRewardLoopManager]:
    manager = PipelinedRewardLoopManager(stateful_config, num_workers=1, collect_wait_s=0.5)
    yield manager
    manager.close()


# --------------------------------------------------------------------------- worker alone (no Ray)


ORDER_SOURCE = """
import asyncio


class OrderRecorder:
    def __init__(self):
        self.started = []

    async def compute_score(self, data_source, solution_str, ground_truth, extra_info):
        self.started.append(solution_str)
        await asyncio.sleep(0.02)
        return 1.0
"""


async def test_worker_gives_free_slots_to_the_oldest_ticket(
    verl_config_factory: Callable[..., Any], batch_factory: Callable[..., Any], tmp_path: Path
) -> None:
    path = tmp_path / "order.py"
    path.write_text(ORDER_SOURCE)
    config = verl_config_factory(
        "async_stateful", custom_reward_function={"path": str(path), "name": "OrderRecorder"}
    )
    worker = PipelineRewardWorker(config, max_concurrency=2)
    newer = batch_factory([{"response": f"t2-{i}", "ground_truth": "1"} for i in range(4)])
    older = batch_factory([{"response": f"t1-{i}", "ground_truth": "1"} for i in range(4)])
    await worker.enqueue(2, [0, 1, 2, 3], newer)  # starts two of ticket 2 at once
    await worker.enqueue(1, [0, 1, 2, 3], older)
    results = []
    while len(results) < 8:
        report = await worker.collect(5.0)
        results.extend(report["results"])
    started = worker.manager.instance.started
    assert started == ["t2-0", "t2-1", "t1-0", "t1-1", "t1-2", "t1-3", "t2-2", "t2-3"]
    assert sorted((seq, i) for seq, i, _ in results) == [(s, i) for s in (1, 2) for i in range(4)]
    assert all(payload["reward_extra_info"]["status"] == "ok" for _, _, payload in results)
    # A cancelled ticket's queued samples are dropped and later enqueues for it ignored.
    await worker.enqueue(3, [0, 1, 2, 3], older)
    assert await worker.cancel(3) == 4
    assert await worker.enqueue(3, [0], older) == 0
    assert (await worker.stats())["waiting"] == 0


async def test_worker_reports_a_raising_sample_as_an_error_marker(
    verl_config_factory: Callable[..., Any], batch_factory: Callable[..., Any], tmp_path: Path
) -> None:
    path = tmp_path / "flaky.py"
    path.write_text(STATEFUL_SOURCE)
    config = verl_config_factory(
        "async_stateful",
        {"on_failure": "raise", "retry": {"max_attempts": 1}},
        custom_reward_function={"path": str(path), "name": "FlakyScorer"},
    )
    worker = PipelineRewardWorker(config, max_concurrency=4)
    await worker.enqueue(1, [0, 1], batch_factory([{"response": "right"}, {"response": "FAIL"}]))
    results: list[Any] = []
    while len(results) < 2:
        results.extend((await worker.collect(5.0))["results"])
    payloads = {index: payload for _, index, payload in results}
    assert payloads[0]["reward_score"] == 1.0
    assert "RewardScoringError" in payloads[1]["error"]  # the driver raises it from get_chunk


# --------------------------------------------------------------------------- llm_judge pipeline


def test_chunks_are_complete_groups_and_match_verl(
    pipeline: PipelinedRewardLoopManager,
    reward_loop: Callable[[Any], Any],
    judge_config: Any,
    batch_factory: Callable[..., Any],
    server: Any,
) -> None:
    batch = batch_factory(judge_rows([3, 5, 4, 1, 5, 2, 4, 6]))  # unequal groups, 30 samples
    ticket = pipeline.submit(batch)
    chunks = drain(pipeline, ticket, 7)
    assert_complete_groups(batch, chunks)
    assert all(len(c) >= 7 for c in chunks[:-1]) and len(chunks) >= 2
    with pytest.raises(TicketError, match="finished"):
        pipeline.get_chunk(ticket, 1)

    reference = reward_loop(judge_config).compute_rm_score(batch)
    ours = torch.zeros_like(reference.batch["rm_scores"])
    for chunk in chunks:
        ours[torch.from_numpy(chunk.indices)] = chunk.rm_scores
        assert (chunk.statuses == "ok").all()
    assert torch.equal(ours, reference.batch["rm_scores"])
    assert sorted(ours.sum(dim=1).unique().tolist()) == [0.0, 1.0]

    blocking = pipeline.compute_rm_score(batch)
    assert torch.equal(blocking.batch["rm_scores"], reference.batch["rm_scores"])
    assert set(blocking.meta_info["reward_extra_keys"]) == set(reference.meta_info["reward_extra_keys"])
    for key in ("status", "judge_verdict"):
        assert blocking.non_tensor_batch[key].tolist() == reference.non_tensor_batch[key].tolist()

    metrics = pipeline.ticket_metrics(ticket)
    assert metrics["reward/status_ok"] == 30 and metrics["reward/queued"] == 0
    assert metrics["reward/in_flight"] == 0 and metrics["reward/retries"] == 0
    # What judging the ticket cost: each sample made one call or shared one (no retries here).
    assert metrics["reward/cost/calls"] + metrics["reward/cost/shared"] == 30
    tokens = metrics["reward/cost/prompt_tokens"] + metrics["reward/cost/completion_tokens"]
    assert metrics["reward/cost/tokens"] == tokens > 0
    assert 0 < metrics["reward/latency_p50"] <= metrics["reward/latency_p95"] <= metrics["reward/latency_max"]
    assert metrics["timing_s/reward_blocked"] > 0 and metrics["timing_s/reward_submit_to_done"] > 0


def _until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Poll ``condition`` (bounded): a wait for a state, never a guess at how long it takes."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_oldest_ticket_finishes_first_at_the_capacity_bound(
    pipeline: PipelinedRewardLoopManager, batch_factory: Callable[..., Any], server: Any
) -> None:
    """Structural, not timed (a loaded 2-core machine stretches any wall-clock bound): the judge holds
    every request and lets them through a slot's worth at a time (``hold``), so each stage is a
    frozen state: every slot busy (the service at its capacity, never above it), and no worker runs a
    ticket-2 sample while a ticket-1 sample waits there (the worker's heap gives a freed slot to the
    oldest ticket). Ticket 1 is complete when ticket 2 has had no answer at all."""
    capacity, n = 8, 64  # two workers x max_concurrency 4 == the server's capacity
    server.update_config(capacity=capacity, overflow="queue", hold=True)
    first, second = (batch_factory(judge_rows([4] * (n // 4))) for _ in range(2))
    ticket1 = pipeline.submit(first)
    # Ticket 1 is at both workers (every slot holds one of its samples) before ticket 2 is sent: the
    # two tickets are shipped concurrently, and a worker that met ticket 2 first would rightly start it.
    _until(lambda: server.stats()["held"] == capacity)
    ticket2 = pipeline.submit(second)
    seq1, seq2 = ticket1.seq, ticket2.seq
    second_when_first_done: int | None = None
    try:
        for stage in range(2 * n // capacity):
            # This stage's slot's worth held, the earlier ones all answered.
            _until(
                lambda stage=stage: (
                    (stats := server.stats())["held"] == capacity
                    and sum(stats["responses_by_status"].values()) == stage * capacity
                )
            )
            workers = ray.get([handle.stats.remote() for handle in pipeline.worker_handles])
            for worker in workers:
                assert worker["running"] == capacity // 2, worker  # every slot busy
                # A freed slot went to the oldest ticket waiting there.
                assert not (worker["queued"].get(seq1) and worker["in_flight"].get(seq2)), worker
            first_left = sum(w["queued"].get(seq1, 0) + w["in_flight"].get(seq1, 0) for w in workers)
            if first_left == 0 and second_when_first_done is None:  # ticket 1 all answered
                second_when_first_done = stage * capacity - n  # answers to ticket 2 by then
            server.update_config(hold=capacity)  # answer these; the next ones are held
    finally:
        server.update_config(hold=False)
    pipeline.get_chunk(ticket1, n, timeout=60)
    pipeline.get_chunk(ticket2, n, timeout=60)

    assert second_when_first_done == 0
    m1, m2 = pipeline.ticket_metrics(ticket1), pipeline.ticket_metrics(ticket2)
    assert m1["reward/status_ok"] == n and m2["reward/status_ok"] == n
    stats = server.stats()
    assert stats["max_in_flight"] == capacity  # the capacity was used: every slot busy at once
    assert stats["max_in_flight_total"] == capacity  # and we never sent more (nothing queued there)
    assert stats["requests_total"] == 2 * n


def test_submit_returns_at_once_for_5120_samples(
    pipeline: PipelinedRewardLoopManager, batch_factory: Callable[..., Any], server: Any
) -> None:
    server.update_config(latency_ms=[5000.0, 5000.0])  # no sample can be scored while submit runs
    rows = [{**GOOD, "prompt": f"What is 2+3? #{i // 5}"} for i in range(5120)]
    batch = batch_factory(rows, group_size=5)
    started = time.perf_counter()
    ticket = pipeline.submit(batch)
    elapsed = time.perf_counter() - started
    scored_by_then = pipeline.ticket_metrics(ticket)["reward/status_ok"]
    pipeline.cancel(ticket)
    # Structural: submit waited for no result (none can exist before 5 s). The bound on its own time is
    # generous (a loaded 2-core machine); serialising the batch sample by sample would take longer.
    assert scored_by_then == 0
    assert elapsed < 4.0, f"submit took {elapsed * 1000:.0f} ms"
    assert ticket.num_samples == 5120
    with pytest.raises(TicketError, match="cancelled"):
        pipeline.get_chunk(ticket, 5)


def test_get_chunk_timeout_names_ticket_and_pending(
    pipeline: PipelinedRewardLoopManager, batch_factory: Callable[..., Any], server: Any
) -> None:
    rows = grouped_rows([4, 4], lambda i: dict(GOOD))
    rows[5]["response"] = "The answer is 5 @@fault:hang@@"  # group 2 never completes
    batch = batch_factory(rows)
    ticket = pipeline.submit(batch)
    chunk = pipeline.get_chunk(ticket, 4, timeout=20)
    assert chunk.indices.tolist() == [0, 1, 2, 3] and chunk.remaining == 4
    # The message is read once the three good members of group 2 are scored (generous bound: on a
    # loaded machine they can take longer than the short timeout below), so only the hung one is left.
    deadline = time.monotonic() + 60
    while True:
        metrics = pipeline.ticket_metrics(ticket)
        if metrics["reward/in_flight"] + metrics["reward/queued"] == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    with pytest.raises(
        RewardChunkTimeout, match=rf"ticket {ticket.seq}: .* 1 of 8 samples still pending"
    ) as info:
        pipeline.get_chunk(ticket, 4, timeout=0.3)
    assert isinstance(info.value, TimeoutError) and info.value.pending == 1
    metrics = pipeline.ticket_metrics(ticket)
    assert metrics["reward/in_flight"] + metrics["reward/queued"] == 1
    assert metrics["timing_s/reward_blocked"] >= 0.3
    pipeline.cancel(ticket)
    with pytest.raises(TicketError, match="cancelled"):
        pipeline.get_chunk(ticket, 4)


def test_bad_input_and_unknown_tickets(
    pipeline: PipelinedRewardLoopManager, batch_factory: Callable[..., Any], server: Any
) -> None:
    batch = batch_factory([GOOD, BAD])
    for missing in ("responses", "attention_mask"):
        keep = [k for k in batch.batch.keys() if k != missing]  # noqa: SIM118 (TensorDict iterates rows)
        broken = DataProto(batch=batch.batch.select(*keep), non_tensor_batch=dict(batch.non_tensor_batch))
        with pytest.raises(ValueError, match=missing):
            pipeline.submit(broken)
    no_uid = DataProto(
        batch=batch.batch, non_tensor_batch={k: v for k, v in batch.non_tensor_batch.items() if k != "uid"}
    )
    with pytest.warns(UserWarning, match="uid"):
        ticket = pipeline.submit(no_uid)
    for bad_n in (0, -3):
        with pytest.raises(ValueError, match="positive"):
            pipeline.get_chunk(ticket, bad_n)
    first = pipeline.get_chunk(ticket, 1, timeout=20)  # one group per sample
    assert len(first) == 1 and first.remaining == 1
    last = pipeline.get_chunk(ticket, 100, timeout=20)  # more than left: the rest
    assert len(last) == 1 and last.is_last
    assert sorted(first.indices.tolist() + last.indices.tolist()) == [0, 1]
    with pytest.raises(TicketError, match="finished"):
        pipeline.get_chunk(ticket, 1)
    with pytest.raises(TicketError, match="not issued by this manager"):
        pipeline.get_chunk(Ticket(seq=ticket.seq, num_samples=2, manager_id="someone-else"), 1)
    with pytest.raises(TicketError):
        pipeline.ticket_metrics(Ticket(seq=10_000, num_samples=1, manager_id="someone-else"))


def test_idle_worker_takes_over_samples_queued_behind_a_stuck_one(
    pipeline: PipelinedRewardLoopManager, batch_factory: Callable[..., Any], server: Any
) -> None:
    rows = judge_rows([1] * 16)  # worker 0 gets samples 0-7, worker 1 gets 8-15
    for i in range(4):  # worker 0's four slots hang; 4-7 wait behind them
        rows[i] = {**rows[i], "response": f"The answer is 5 @@fault:hang@@ {i}"}
    ticket = pipeline.submit(batch_factory(rows))
    chunk = pipeline.get_chunk(ticket, 12, timeout=60)  # without rebalancing: stuck 300 s (timeout_s)
    assert chunk.indices.tolist() == list(range(4, 16))
    assert (chunk.statuses == "ok").all()
    pipeline.cancel(ticket)


def test_killed_worker_samples_are_resent_and_delivered_once(
    pipeline: PipelinedRewardLoopManager, batch_factory: Callable[..., Any], server: Any
) -> None:
    server.update_config(latency_ms=[100.0, 200.0])
    batch = batch_factory(judge_rows([4] * 16))
    ticket = pipeline.submit(batch)
    chunks = [pipeline.get_chunk(ticket, 4, timeout=30)]  # mid-batch: both workers hold work
    victim = pipeline.worker_handles[0]
    ray.kill(victim, no_restart=True)
    chunks += drain(pipeline, ticket, 16)
    assert_complete_groups(batch, chunks)
    assert all((c.statuses == "ok").all() for c in chunks)
    assert len(pipeline.worker_handles) == 1
    assert pipeline.ticket_metrics(ticket)["reward/status_ok"] == 64
    # The survivor keeps serving new tickets.
    out = pipeline.compute_rm_score(batch_factory(judge_rows([2, 2])))
    assert out.batch["rm_scores"].shape[0] == 4


def test_close_kills_actors_and_rejects_use(
    pipeline: PipelinedRewardLoopManager, batch_factory: Callable[..., Any], server: Any
) -> None:
    server.update_config(latency_ms=[5000.0, 5000.0])
    ticket = pipeline.submit(batch_factory(judge_rows([2])))
    handles = pipeline.worker_handles
    with fresh_workers():  # our close and kill_workers, not the harness's hand-back to its warm pool
        pipeline.close()
        pipeline.close()  # idempotent
    for handle in handles:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(handle.stats.remote(), timeout=30)
    with pytest.raises(RuntimeError, match="closed"):
        pipeline.submit(batch_factory([GOOD]))
    with pytest.raises(RuntimeError, match="closed"):
        pipeline.get_chunk(ticket, 1)


# --------------------------------------------------------------------------- failures and post-processing


def test_failed_samples_get_status_and_group_mean(
    stateful_pipeline: PipelinedRewardLoopManager, batch_factory: Callable[..., Any]
) -> None:
    responses = [
        ["right", "right", "wrong", "FAIL"],  # failure imputed with the group mean 2/3
        ["FAIL", "FAIL"],  # nothing to impute from: the fallback score stays
        ["right", "wrong", "wrong"],
    ]
    rows = []
    for group in responses:
        uid = uuid.uuid4().hex
        rows += [{"response": text, "ground_truth": "1", "uid": uid} for text in group]
    batch = batch_factory(rows)
    ticket = stateful_pipeline.submit(batch)
    chunks = drain(stateful_pipeline, ticket, 4)
    assert_complete_groups(batch, chunks)
    scores = np.zeros(len(rows))
    statuses = np.empty(len(rows), dtype=object)
    reasons = np.empty(len(rows), dtype=object)
    for chunk in chunks:
        scores[chunk.indices] = chunk.rm_scores.sum(dim=1).numpy()
        statuses[chunk.indices] = chunk.statuses
        reasons[chunk.indices] = chunk.reward_extra_info["failure_reason"]
    assert scores.tolist() == pytest.approx([1, 1, 0, 2 / 3, -1, -1, 1, 0, 0])
    assert statuses.tolist() == ["ok", "ok", "ok", "error", "error", "error", "ok", "ok", "ok"]
    assert "scorer failed on purpose" in reasons[3]
    metrics = stateful_pipeline.ticket_metrics(ticket)
    assert metrics["reward/status_error"] == 3 and metrics["reward/status_ok"] == 6


def test_all_workers_dead_fails_pending_samples_instead_of_hanging(
    stateful_pipeline: PipelinedRewardLoopManager, batch_factory: Callable[..., Any]
) -> None:
    batch = batch_factory([{"response": "SLOW", "ground_truth": "1"} for _ in range(4)], group_size=2)
    ticket = stateful_pipeline.submit(batch)
    with pytest.raises(RewardChunkTimeout):
        stateful_pipeline.get_chunk(ticket, 2, timeout=0.5)
    ray.kill(stateful_pipeline.worker_handles[0], no_restart=True)
    chunk = stateful_pipeline.get_chunk(ticket, 4, timeout=30)
    assert chunk.indices.tolist() == [0, 1, 2, 3]
    assert (chunk.statuses == "error").all()
    assert all("all reward workers died" in r for r in chunk.reward_extra_info["failure_reason"])
    assert chunk.rm_scores.sum().item() == -4.0  # the configured fallback score
    with pytest.raises(RuntimeError, match="dead"):
        stateful_pipeline.submit(batch)
