"""The pieces the benchmark's v1 rows stand on, without Ray: the rollout engine's timing model, and
the TransferQueue tag store served to verl's own, unchanged v1 replay buffers."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
from omegaconf import OmegaConf

from async_reward_bench.generation import GenerationState, rollout_durations
from async_reward_bench.scenarios import REGIMES, regime_stages
from async_reward_bench.tag_store import TagStore, serving_replay_buffer

# -- generation -------------------------------------------------------------------------------------


def test_durations_put_the_longest_response_at_the_makespan():
    rng = np.random.default_rng(0)
    durations = rollout_durations(640, 39.8, 0.45, rng)
    assert durations.max() == pytest.approx(39.8) and durations.min() > 0
    assert 0.15 < np.median(durations) / 39.8 < 0.4  # "median about a quarter of the longest"
    long_tail = rollout_durations(640, 159.2, REGIMES["long_tail"].gen_sigma, np.random.default_rng(0))
    assert np.median(long_tail) / 159.2 < 0.12
    assert np.all(rollout_durations(5, 2.0, 0.0, rng) == 2.0)
    with pytest.raises(ValueError):
        rollout_durations(0, 1.0, 0.5, rng)


def test_a_lone_batch_decodes_at_full_speed_and_finishes_in_length_order():
    engine = GenerationState(full_speed_slots=4)
    for key, work in (("a", 3.0), ("b", 1.0), ("c", 2.0)):
        engine.add(key, work)
    assert engine.rate() == 1.0 and engine.time_to_next() == pytest.approx(1.0)
    assert engine.advance(0.5) == []
    assert engine.advance(2.0) == ["b", "c"]
    assert engine.advance(10.0) == ["a"] and len(engine) == 0 and engine.time_to_next() is None


def test_more_sequences_than_slots_share_the_engine_and_speed_up_as_they_finish():
    engine = GenerationState(full_speed_slots=2)
    for key, work in (("a", 1.0), ("b", 1.0), ("c", 1.0), ("d", 4.0)):
        engine.add(key, work)
    assert engine.rate() == pytest.approx(0.5)
    # 2 s at half speed finish a, b, c; d then runs alone at full speed: 4 - 1 = 3 s more.
    assert sorted(engine.advance(2.0)) == ["a", "b", "c"]
    assert engine.rate() == 1.0 and engine.time_to_next() == pytest.approx(3.0)
    # The same work in one long step as in many short ones.
    other = GenerationState(full_speed_slots=2)
    for key, work in (("a", 1.0), ("b", 1.0), ("c", 1.0), ("d", 4.0)):
        other.add(key, work)
    assert other.advance(5.0) == ["a", "b", "c", "d"]


def test_clear_drops_what_is_decoding_and_work_is_validated():
    engine = GenerationState(full_speed_slots=1)
    engine.add("x", 1.0)
    with pytest.raises(KeyError):
        engine.add("x", 1.0)
    with pytest.raises(ValueError):
        engine.add("y", float("nan"))
    assert engine.clear() == ["x"] and len(engine) == 0


class _PassPerCompletion:
    """The engine as first written (a pass over every sequence per completion): the reference the
    heap-based ``GenerationState`` must match."""

    def __init__(self, slots: int) -> None:
        self.slots, self.left = slots, {}

    def rate(self) -> float:
        return min(1.0, self.slots / len(self.left)) if self.left else 0.0

    def advance(self, elapsed: float) -> list:
        finished, left_s = [], max(0.0, elapsed)
        while self.left:
            done = [k for k, w in self.left.items() if w <= 1e-9]
            for k in done:
                del self.left[k]
            finished.extend(done)
            if not self.left or left_s <= 0:
                break
            step = min(left_s, max(0.0, min(self.left.values())) / self.rate())
            for k in self.left:
                self.left[k] -= step * self.rate()
            left_s -= step
        return finished


@pytest.mark.parametrize("seed", range(5))
def test_the_engine_finishes_what_a_pass_per_completion_finishes_when_it_does(seed):
    """Arrivals between advances, more sequences than slots, long runs: every advance returns the same
    sequences as the reference, and the next finish is due at the same time."""
    rng = np.random.default_rng(seed)
    engine, reference = GenerationState(full_speed_slots=8), _PassPerCompletion(8)
    arrived = 0
    for _ in range(300):
        for _ in range(int(rng.integers(0, 6))):
            work = float(rng.choice([0.0, 1.0, rng.uniform(0.01, 40.0)]))  # ties and instant ones too
            engine.add(arrived, work)
            reference.left[arrived] = work
            arrived += 1
        elapsed = float(rng.exponential(2.0))
        assert sorted(engine.advance(elapsed)) == sorted(reference.advance(elapsed))
        assert len(engine) == len(reference.left) and engine.rate() == reference.rate()
        due = engine.time_to_next()
        expected = min(reference.left.values()) / reference.rate() if reference.left else None
        assert due == pytest.approx(expected, rel=1e-6, abs=1e-6) if expected is not None else due is None
    engine.advance(1e6)
    assert arrived > 500 and len(engine) == 0 and engine.time_to_next() is None


def test_long_tail_regime_stretches_only_the_rollout():
    from async_reward_bench.calibration import load_medians

    stages = load_medians()["gsm8k_qwen2_7b_base"]
    long_tail = regime_stages(REGIMES["long_tail"], stages)
    assert long_tail.gen_s == pytest.approx(4 * 39.8) and long_tail.update_actor_s == stages.update_actor_s
    assert regime_stages(REGIMES["recipe"], stages) == stages


# -- TransferQueue's tags, read by verl's replay buffers -----------------------------------------------


def _put_group(store: TagStore, uid: str, step: int, status: str, sessions: int = 2) -> None:
    store.kv_put(uid, "train", tag={"is_prompt": True, "status": "pending", "global_steps": step})
    store.kv_put(uid, "train", tag={"status": status})  # merges, as TransferQueue does
    if status in ("finished", "failure"):
        for s in range(sessions if status == "finished" else 1):
            store.kv_put(f"{uid}_{s}_0", "train", fields={"score": 1.0}, tag={"status": "success"})


def _buffer(mode: str):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    kwargs = dict(
        trainer_mode=mode,
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=8,
        max_off_policy_strategy="drop",
        sampler_kwargs=OmegaConf.create({}),
        poll_interval=0.01,
        refill_fn=lambda n: n,
    )
    if mode == "sync":
        return ReplayBuffer(**kwargs, train_batch_size=2, gen_batch_size=2)
    return ReplayBufferAsync(**kwargs)


def test_tags_merge_list_and_clear():
    store = TagStore()
    _put_group(store, "u1", 3, "finished")
    listed = store.kv_list()
    assert listed["train"]["u1"] == {"is_prompt": True, "status": "finished", "global_steps": 3}
    assert set(listed["train"]) == {"u1", "u1_0_0", "u1_1_0"}
    listed["train"]["u1"]["status"] = "changed"  # a snapshot, not the store
    assert store.kv_list("train")["train"]["u1"]["status"] == "finished"
    assert store.values(["u1_0_0"], "train") == [{"score": 1.0}]
    store.kv_clear(["u1", "u1_0_0"], "train")
    assert set(store.kv_list()["train"]) == {"u1_1_0"}
    with pytest.raises(NotImplementedError):
        store.kv_batch_get(keys=["u1_1_0"], partition_id="train")


def test_verl_sync_replay_buffer_samples_finished_groups_oldest_first():
    store = TagStore()
    _put_group(store, "new", 2, "finished")
    _put_group(store, "old", 1, "finished")
    _put_group(store, "busy", 1, "running")
    with serving_replay_buffer(store):
        batch, _ = _buffer("sync").sample(global_steps=2, partition_id="train", batch_size=1)
    assert sorted(batch.keys) == ["old_0_0", "old_1_0"]
    assert "old" not in store.kv_list()["train"]  # the sampled prompt key is consumed
    from verl.trainer.ppo.v1 import replay_buffer

    assert replay_buffer.tq is not store  # put back after the block


def test_the_store_serves_our_modes_tag_readers_too_for_the_block_only():
    from verl.trainer.ppo.v1 import replay_buffer

    from async_reward.v1.decoupled import replay_buffer as decoupled_replay_buffer
    from async_reward.v1.decoupled import trainer as decoupled_trainer

    before = (replay_buffer.tq, decoupled_trainer.tq, decoupled_replay_buffer.tq)
    store = TagStore()
    names = ("async_reward.v1.decoupled.trainer", "async_reward.v1.decoupled.replay_buffer")
    with serving_replay_buffer(store, *names):
        assert replay_buffer.tq is decoupled_trainer.tq is decoupled_replay_buffer.tq is store
    assert (replay_buffer.tq, decoupled_trainer.tq, decoupled_replay_buffer.tq) == before


def test_verl_sync_replay_buffer_waits_until_enough_groups_finish():
    store = TagStore()
    _put_group(store, "a", 1, "finished")
    _put_group(store, "b", 1, "running")

    finished_at: list[float] = []

    def finish_b_later() -> None:
        time.sleep(0.1)
        finished_at.append(time.monotonic())  # before the writes: the sample cannot return earlier
        store.kv_put("b", "train", tag={"status": "finished"})
        store.kv_put("b_0_0", "train", fields={"score": 0.0}, tag={"status": "success"})

    threading.Thread(target=finish_b_later).start()
    with serving_replay_buffer(store):
        batch, _ = _buffer("sync").sample(global_steps=1, partition_id="train", batch_size=2)
    returned_at = time.monotonic()
    # Causal order, not a duration (the thread's sleep may start before this test's clock would):
    # the sample returned only after b was finished.
    assert finished_at and returned_at >= finished_at[0]
    assert sorted(batch.keys) == ["a_0_0", "a_1_0", "b_0_0"]


def test_verl_async_replay_buffer_evicts_and_refills_a_failed_group():
    store = TagStore()
    _put_group(store, "good", 1, "finished")
    _put_group(store, "bad", 1, "failure")
    refills: list[int] = []
    buffer = _buffer("colocate_async")
    buffer.refill_fn = refills.append
    with serving_replay_buffer(store):
        batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=1)
    assert sorted(batch.keys) == ["good_0_0", "good_1_0"]
    assert refills == [1] and metrics["training/rollout_failure/evicted_samples"] == 1
    assert not any(key.startswith("bad") for key in store.kv_list()["train"])


# -- the agent loop on verl's real RewardLoopWorker ---------------------------------------------------


def test_agent_loop_scores_each_sample_when_its_generation_ends(
    ray_cluster, server, verl_config_factory, batch_factory
):
    """verl's ``RewardLoopWorker`` (a Ray actor running ``llm_judge`` over HTTP) scores each sample
    as soon as its generation ends, before slower samples of its group finish; a paused engine
    finishes nothing, and resumes where it stopped; the group turns ``finished`` once every sample is
    scored, as ``AgentLoopWorkerTQ`` tags it, and ``failure`` when a session raised (here
    ``on_failure: raise`` and a judge answering 400)."""
    import ray

    from async_reward_bench.v1_agent_loop import V1AgentLoop
    from async_reward_bench.v1_reward_worker import start_reward_workers

    config = verl_config_factory(
        "llm_judge", {"judge": {"base_url": server.url + "/v1"}, "on_failure": "raise"}
    )
    rows = [
        {"prompt": "2+2?", "response": "The answer is \\boxed{4}.", "ground_truth": "4", "uid": "g"},
        {"prompt": "2+2?", "response": "The answer is \\boxed{5}.", "ground_truth": "4", "uid": "g"},
        {"prompt": "3+3?", "response": "@@fault:400@@ \\boxed{6}", "ground_truth": "6", "uid": "h"},
    ]
    rewards = start_reward_workers(config, 1, batch_factory(rows[:1]))
    store = TagStore()
    for uid in ("g", "h"):
        store.kv_put(uid, "train", tag={"is_prompt": True, "status": "pending", "global_steps": 1})
    loop = V1AgentLoop(rewards.reward_loop_worker_handles, store, full_speed_slots=2, write_progress=True)
    loop.start()
    loop.set_version(3)  # the weights' policy version, as a weight push sets it
    deadline = time.monotonic() + 120

    def wait_for(condition) -> None:  # type: ignore[no-untyped-def]
        while not condition():
            assert time.monotonic() < deadline, "the agent loop stalled"
            time.sleep(0.005)

    try:
        loop.resume()
        # The long sample needs 10 s of decoding: the pause lands mid-way unless this thread stalls
        # for 9.9 s between seeing the short ones generated and posting it (load 8 stalls far less).
        loop.submit(batch_factory(rows), np.array([0.05, 10.0, 0.05]), global_steps=1)
        wait_for(lambda: len(loop.engine) == 1)  # the short samples are generated...
        loop.pause()  # ...and the long one stops mid-way: it cannot finish while paused
        wait_for(lambda: "g_0_0" in store.kv_list("train")["train"])
        wait_for(lambda: store.kv_list("train")["train"]["h"]["status"] != "running")
        tags = store.kv_list("train")["train"]
        assert tags["g_0_0"] == {"status": "success", "global_steps": 1}  # scored without its group
        assert tags["g"]["status"] == "running" and "g_1_0" not in tags and len(loop.engine) == 1
        # The decoupled mode's progress tags: one of g's two sessions generated and scored.
        assert {k: tags["g"][k] for k in ("gen_done", "gen_n", "unscored", "gen_version")} == {
            "gen_done": 1,
            "gen_n": 2,
            "unscored": 0,
            "gen_version": 3,
        }
        assert tags["h"]["status"] == "failure" and "h_0_0" not in tags  # the raising session
        loop.resume()
        wait_for(lambda: store.kv_list("train")["train"]["g"]["status"] != "running")
        tags = store.kv_list("train")["train"]
        assert tags["g"]["status"] == "finished" and tags["g_1_0"]["status"] == "success"
        assert (tags["g"]["gen_done"], tags["g"]["unscored"], tags["h"]["gen_done"]) == (2, 0, 1)
        scores = [v["score"] for v in store.values(["g_0_0", "g_1_0"], "train")]
        extras = store.values(["g_0_0"], "train")[0]["extras"]
        assert scores == [1.0, 0.0] and extras["status"] == "ok"  # the judge's verdicts, right and wrong
        kinds = [kind for _, kind, _ in loop.events]
        assert kinds.count("generated") == 3 and kinds.count("scored") == 2 and kinds[-1] == "scored"
        busy = sum(b - a for a, b in loop.busy)
        assert 9.9 < busy < 60  # decoding time only: the pause and the scoring are not in it
        assert not loop._left  # the worker released the batch once every sample was scored
    finally:
        loop.close()
        for worker in rewards.reward_loop_worker_handles:
            ray.kill(worker)


def test_the_v1_modes_harness_poll_sees_a_write_after_a_quiet_spell_at_once_and_never_polls_finer():
    """``_BenchPipelined._pause_between_polls``: at least ``POLL_GAP_S`` scaled seconds between two
    polls (never finer than the mode's real poll), and only what is left of that gap is slept, so a
    write that comes after a quiet spell is seen at once. Bounds are generous: the gap here is 2 s."""
    from types import SimpleNamespace

    from async_reward_bench.v1_trainer import POLL_GAP_S, _BenchPipelined

    store = TagStore()
    gap = 2.0
    trainer = SimpleNamespace(
        bench=SimpleNamespace(store=store, time_scale=gap / POLL_GAP_S),
        poll_interval_s=5.0,
        _writes_seen=0,
        _last_poll_at=-math.inf,
    )
    pause = _BenchPipelined._pause_between_polls
    store.kv_put("a", "train", tag={"status": "running"})
    started = time.perf_counter()
    pause(trainer)  # a write waiting, no poll before: at once
    assert time.perf_counter() - started < gap * 0.75
    store.kv_put("b", "train", tag={"status": "running"})
    started = time.perf_counter()
    pause(trainer)  # a write waiting, but the last poll was just now: the rest of the gap
    assert time.perf_counter() - started >= gap * 0.95
    assert trainer._writes_seen == 2
