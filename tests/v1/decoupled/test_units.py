"""The decoupled mode's pure parts, without Ray: its config (defaults derived, refusals named), the
window read from prompt tags, the top-up rule, the sampler's wait for a group at its staleness limit,
and the progress tags our agent-loop worker writes while verl's ``_compute_score`` runs (reward
workers as small handle stand-ins). The prompt ledger: tests/v1/decoupled/test_ledger.py."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from async_reward.config import ConfigError
from async_reward.config.v1 import DEFAULT_MAX_UNTRAINED_SKIPS
from async_reward.v1.decoupled.agent_loop import DecoupledAgentLoopWorker, _GroupProgress
from async_reward.v1.decoupled.config import (
    DecoupledModeConfig,
    DecoupledWindows,
    derive_windows,
    is_decoupled_mode,
    load_decoupled_mode_config,
    stale_wait_limit_s,
)
from async_reward.v1.decoupled.window import (
    WindowState,
    dispatch_blocker,
    groups_to_wait_for,
    reward_room,
    top_up_count,
)
from async_reward.v1.reward_failover import LOST_WORKERS_KEY
from tests.support.hostile_text import PROPERTY
from tests.v1.test_reward_failover import DyingRewardWorker
from tests.v1.test_reward_routing import RecordingRewardWorker, session


def verl_config(
    *,
    batch: int = 128,
    n: int = 5,
    mini: int = 32,
    warmup: float = 1,
    workers: int = 8,
    concurrency: int | None = 64,
    threshold: int | None = 8,
    decoupled: dict | None = None,
    **extra: object,
) -> object:
    config = {
        "data": {"train_batch_size": batch},
        "actor_rollout_ref": {"rollout": {"n": n}, "actor": {"ppo_mini_batch_size": mini}},
        "reward": {
            "num_workers": workers,
            "async_reward": {"limits": {} if concurrency is None else {"max_concurrency": concurrency}},
        },
        "trainer": {
            "use_v1": True,
            "v1": {
                "trainer_mode": "decoupled",
                "separate_async": {
                    "parameter_sync_step": batch // mini,
                    "num_warmup_batches": warmup,
                    "hybrid_rollout": {"enable_switch": False},
                },
                "sampler": {"max_off_policy_threshold": threshold, "max_off_policy_strategy": "drop"},
                "decoupled": decoupled or {},
            },
        },
    }
    return OmegaConf.merge(OmegaConf.create(config), OmegaConf.create(extra))


def test_defaults_follow_verl_settings_and_the_service_capacity():
    """verl's defaults (B=128, n=5, 8 reward workers, W=1) with ours (max_concurrency 64): the design's
    worked example, G=256, R=1024 sessions, S=128, H=589, span bound 6 <= 8."""
    config = verl_config()
    windows = derive_windows(load_decoupled_mode_config(config), config)
    assert (windows.generation_window, windows.reward_backlog, windows.sampleable_buffer) == (256, 1024, 128)
    assert windows.outstanding_cap == 589 and windows.staleness_bound == 6
    assert is_decoupled_mode(config)
    # One queue for the whole job: max_concurrency already counts every worker's calls.
    job_wide = verl_config(concurrency=256, reward={"async_reward": {"limits": {"admission": "job"}}})
    assert derive_windows(load_decoupled_mode_config(job_wide), job_wide).reward_backlog == 512


def served_judge(*, workers: int, admission: str = "worker") -> object:
    """A decoupled job whose llm_judge judges with the model verl serves: 8 replicas x 100 sequences
    (capacity 800), no limit written, no staleness bound (the backlog is not clamped)."""
    return verl_config(
        workers=workers,
        concurrency=None,
        threshold=None,
        reward={
            "reward_manager": {"name": "llm_judge", "source": "register"},
            "reward_model": {
                "enable": True,
                "enable_resource_pool": True,
                "n_gpus_per_node": 8,
                "nnodes": 1,
                "model_path": "/models/judge",
                "rollout": {"max_num_seqs": 100},
            },
            "async_reward": {"limits": {"admission": admission}},
        },
    )


def backlog(config: object) -> int:
    return derive_windows(load_decoupled_mode_config(config), config).reward_backlog


def test_default_backlog_follows_the_concurrency_the_manager_admits():
    """Issue 42, item 14: the backlog read only ``limits.max_concurrency`` (else 64). It is twice
    the calls the job's managers admit, derived as the manager derives them: verl's
    ``reward.max_concurrent`` per worker, a served judge's capacity split over the workers, or all of
    it with one queue for the job."""
    from async_reward.managers import LLMJudgeRewardManager

    verl_key = verl_config(concurrency=None, threshold=None, reward={"max_concurrent": 256})
    assert backlog(verl_key) == 2 * 256 * 8  # was 2 x 64 x 8
    assert backlog(verl_config(concurrency=None, threshold=None)) == 2 * 64 * 8  # our default
    per_worker = served_judge(workers=3)
    assert LLMJudgeRewardManager.check_settings(per_worker).limits.max_concurrency == 267  # ceil(800 / 3)
    assert backlog(per_worker) == 2 * 267 * 3  # was 2 x 64 x 3
    job_wide = served_judge(workers=3, admission="job")
    assert LLMJudgeRewardManager.check_settings(job_wide).limits.max_concurrency == 800
    assert backlog(job_wide) == 2 * 800  # was 2 x 64
    written = served_judge(workers=3)
    written.reward.async_reward.limits.max_concurrency = 5  # yours wins, as in the manager
    assert backlog(written) == max(2 * 5 * 3, 32 * 5)


def test_default_backlog_is_clamped_to_one_mini_batch_and_to_the_staleness_bound():
    small = verl_config(workers=1, concurrency=1)  # 2 sessions < one mini-batch (32 x 5)
    assert derive_windows(DecoupledModeConfig(), small).reward_backlog == 160
    tight = verl_config(threshold=4)  # (4-1) x 128 = 384 outstanding: R = (384 - 256 - 128) x 5 = 0 < 160
    with pytest.raises(ConfigError) as refused:
        derive_windows(DecoupledModeConfig(), tight)
    assert refused.value.key == "trainer.v1.decoupled.generation_window"
    assert "at most 224" in str(refused.value)  # 384 - 128 - 32 groups of the smallest backlog
    assert derive_windows(DecoupledModeConfig(generation_window=224), tight).reward_backlog == 160


def test_a_backlog_beyond_the_staleness_bound_is_refused_naming_the_largest_that_fits():
    config = verl_config(decoupled={"reward_backlog": 5000})
    with pytest.raises(ConfigError) as refused:
        load_decoupled_mode_config(config)
    assert refused.value.key == "trainer.v1.decoupled.reward_backlog"
    assert "at most 2560" in str(refused.value)  # ((8-1) x 128 - 256 - 128) x 5
    assert derive_windows(DecoupledModeConfig(reward_backlog=2560), config).staleness_bound == 8
    unbounded = verl_config(threshold=None, decoupled={"reward_backlog": 5000})
    assert derive_windows(load_decoupled_mode_config(unbounded), unbounded).reward_backlog == 5000


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (
            {"trainer": {"v1": {"separate_async": {"hybrid_rollout": {"enable_switch": True}}}}},
            "trainer.v1.separate_async.hybrid_rollout.enable_switch",
        ),
        ({"skip": {"rollout_tq": {"enable": True}}}, "skip.rollout_tq.enable"),
        (
            {"trainer": {"v1": {"sampler": {"max_off_policy_strategy": "wait"}}}},
            "trainer.v1.sampler.max_off_policy_strategy",
        ),
        (
            {"trainer": {"v1": {"sampler": {"custom_sampler": {"path": "pkg://mine", "name": "X"}}}}},
            "trainer.v1.sampler.custom_sampler",
        ),
        (
            {"trainer": {"v1": {"decoupled": {"parameter_sync_step": 2}}}},
            "trainer.v1.decoupled.parameter_sync_step",
        ),
        ({"trainer": {"v1": {"decoupled": {"windw": 2}}}}, "trainer.v1.decoupled.windw"),
        ({"trainer": {"v1": {"decoupled": {"reward_backlog": 0}}}}, "trainer.v1.decoupled.reward_backlog"),
        (
            {"trainer": {"v1": {"decoupled": {"stale_wait_timeout_s": 0}}}},
            "trainer.v1.decoupled.stale_wait_timeout_s",
        ),
        (
            {
                "trainer": {
                    "v1": {"decoupled": {"sampleable_buffer": 1, "generation_window": 1, "reward_backlog": 1}}
                },
                "data": {"train_batch_size": 4},
                "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4}},
            },
            "trainer.v1.decoupled.sampleable_buffer",
        ),
    ],
)
def test_what_the_mode_cannot_honour_is_refused_naming_the_key(change, key):
    config = OmegaConf.merge(verl_config(), OmegaConf.create(change))
    with pytest.raises(ConfigError) as refused:
        load_decoupled_mode_config(config)
    assert refused.value.key == key


def test_separate_async_keys_copied_into_the_node_are_accepted_when_equal():
    config = verl_config(
        decoupled={"parameter_sync_step": 4, "num_warmup_batches": 1, "staleness_from": "submission"}
    )
    assert load_decoupled_mode_config(config).staleness_from == "submission"


def tags(**groups: dict) -> dict[str, dict]:
    return {uid: {"is_prompt": True, "global_steps": 1, **tag} for uid, tag in groups.items()}


def test_window_counts_only_groups_still_generating_and_the_backlog_in_sessions():
    listing = {
        **tags(
            a={"status": "pending"},
            b={"status": "running"},  # started, nothing generated yet
            c={"status": "running", "gen_done": 1, "gen_n": 2, "unscored": 1},  # half generated
            d={"status": "running", "gen_done": 2, "gen_n": 2, "unscored": 2},  # generated: in scoring
            e={"status": "finished", "gen_done": 2, "gen_n": 2, "unscored": 0},
            f={"status": "failure", "gen_done": 2, "gen_n": 2, "unscored": 0},
        ),
        "e_0_0": {"status": "success"},  # a trajectory key: not a group
    }
    state = WindowState.from_tags(listing)
    assert (state.generating, state.backlog, state.pending_groups, state.sampleable) == (3, 3, 2, 2)
    assert state.in_flight == {"a", "b", "c", "d", "e", "f"}


def test_top_up_fills_the_window_and_pauses_on_a_full_backlog_or_the_outstanding_cap():
    config = verl_config(batch=4, n=2, mini=2, workers=1, concurrency=2)
    windows = derive_windows(DecoupledModeConfig(generation_window=4, reward_backlog=8), config)
    assert (windows.reward_backlog, windows.outstanding_cap) == (8, 12)  # H = 4 + 4 + 4
    empty = WindowState(0, 0, 0, 0, frozenset())
    assert top_up_count(empty, windows) == 4
    scoring = WindowState(1, 3, 3, 0, frozenset("abcd"))  # three groups released at generation
    assert top_up_count(scoring, windows) == 3
    # The reward pipeline's bound is R + G x n = 16 sessions: a backlog of 14 and a group generating
    # (2 sessions) fill it; a backlog at R leaves the window's free places; between, a group a place.
    full_pipeline = WindowState(1, 14, 7, 0, frozenset("abcdefgh"))
    assert top_up_count(full_pipeline, windows) == 0
    assert dispatch_blocker(full_pipeline, windows) == "backpressure"
    assert top_up_count(WindowState(1, 8, 4, 0, frozenset("abcde")), windows) == 3  # at R: the window
    assert top_up_count(WindowState(1, 11, 6, 0, frozenset("abcdefg")), windows) == 1  # (16-11)//2 - 1
    at_cap = WindowState(0, 0, 0, 3, frozenset("abcdefghijk"))
    assert top_up_count(at_cap, windows) == 1


@PROPERTY
@given(
    window=st.integers(1, 12),
    backlog_cap=st.integers(1, 40),
    n=st.integers(1, 8),
    generating=st.integers(0, 12),
    backlog=st.integers(0, 150),
)
def test_property_dispatch_keeps_the_reward_pipeline_within_its_bound_and_follows_the_judge(
    window, backlog_cap, n, generating, backlog
):
    """Whatever the state: a top-up never takes the backlog plus the sessions generating past
    ``R + G x n`` (when it dispatches), fills the window while the backlog is at most R, and once the
    pipeline is full, the judge scoring k groups' worth of sessions frees exactly k places (a window
    with room: the rollout follows the judge, no burst of the whole window)."""
    generating = min(generating, window)
    windows = DecoupledWindows(window, backlog_cap, sampleable_buffer=10**6, train_batch_size=1, rollout_n=n)
    in_flight = frozenset(str(i) for i in range(generating + -(-backlog // n)))
    state = WindowState(generating, backlog, -(-backlog // n), 0, in_flight)
    count = top_up_count(state, windows)
    bound = backlog_cap + window * n
    assert 0 <= count <= window - generating
    if count:
        assert backlog + (generating + count) * n <= bound
    if backlog <= backlog_cap:
        assert count == min(window - generating, windows.outstanding_cap - state.outstanding)
    elif backlog + (generating + 1) * n > bound:
        assert count == 0
        assert dispatch_blocker(state, windows) == ("window_full" if generating == window else "backpressure")
    # a pipeline exactly full above R, then the judge scores k groups' worth of sessions: k places
    if generating < window and backlog > backlog_cap and reward_room(state, windows) == 0:
        for k in range(1, window - generating + 1):
            scored = replace(state, backlog=backlog - k * n)
            if scored.backlog <= backlog_cap:
                break
            assert top_up_count(scored, windows) == min(k, windows.outstanding_cap - scored.outstanding)


def test_top_up_pauses_while_the_sampleable_buffer_is_full_and_more_groups_are_on_their_way():
    config = verl_config(batch=4, n=2, mini=2, workers=1, concurrency=2)
    windows = derive_windows(DecoupledModeConfig(generation_window=4, reward_backlog=8), config)
    assert windows.sampleable_buffer == 4
    keys = frozenset("abcdefg")
    assert dispatch_blocker(WindowState(1, 0, 1, 4, keys), windows) == "sampleable_full"
    assert top_up_count(WindowState(1, 0, 1, 3, keys), windows) == 3  # 3 < S: fill
    assert top_up_count(WindowState(1, 0, 1, 4, keys), windows) == 0  # S reached
    assert top_up_count(WindowState(0, 2, 1, 5, keys), windows) == 0  # one group still scoring
    # Nothing generating or scoring: the window refills, so a sampler needing more than S still gets it.
    assert top_up_count(WindowState(0, 0, 0, 5, frozenset("abcde")), windows) == 4


def test_a_sample_waits_only_when_a_group_at_its_staleness_limit_would_find_no_place():
    """Threshold 4, one group per sample, two samples per step. ``slow`` waits for the judge at span
    4 (its last step): the step's first sample goes on (the second keeps a place for it), the second
    waits; a scored group at its limit takes the first sample's place, so then the first waits too.
    Groups younger than the limit, and ones already past it (evicted anyway), never make it wait."""
    spans = {"slow": 4, "young": 2, "past": 5, "ready_old": 4, "ready_young": 1}
    wait = groups_to_wait_for
    assert wait({"slow"}, {"ready_young"}, spans, 4, sample_size=1, slots_left=2) == []
    assert wait({"slow"}, {"ready_young"}, spans, 4, sample_size=1, slots_left=1) == ["slow"]
    assert wait({"slow"}, {"ready_old", "ready_young"}, spans, 4, sample_size=1, slots_left=2) == []
    assert wait({"slow"}, {"ready_old", "other_old"}, {**spans, "other_old": 4}, 4, 1, 2) == ["slow"]
    assert wait({"young", "past"}, {"ready_young"}, spans, 4, sample_size=1, slots_left=1) == []
    assert wait(set(), {"ready_old"}, spans, 4, sample_size=1, slots_left=1) == []
    # Two groups at their limit awaiting the judge, one sample of two groups left: wait for both.
    assert wait({"slow", "slow2"}, set(), {**spans, "slow2": 4}, 4, sample_size=2, slots_left=2) == [
        "slow",
        "slow2",
    ]


def test_a_held_sample_waits_for_the_group_at_its_limit_and_gives_up_at_the_timeout(monkeypatch):
    """The mode's sampler (verl's ``ReplayBufferAsync`` subclass) on a snapshot of step 4, threshold 4,
    the step's second (last) sample: ``slow`` is generated and awaits the judge at its last step, so
    the sample is held while it is scored; the time held is the step's ``staleness_wait_s``. Held past
    ``stale_wait_timeout_s``, it samples without the group (which will be evicted stale, counted as
    overflow) and does not hold for it again. The clock is the test's."""
    from types import SimpleNamespace

    from async_reward.v1.decoupled import replay_buffer as module

    now = [100.0]
    monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    buffer = module.DecoupledReplayBufferAsync(
        trainer_mode="decoupled",
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=4,
        max_off_policy_strategy="drop",
        sampler_kwargs=OmegaConf.create({}),
    )
    trainer = SimpleNamespace(parameter_sync_step=2, local_trigger_step=1, ledger=None)
    buffer.attach(trainer, staleness_from="generation", poll_interval_s=0.1, stale_wait_limit_s=30.0)
    buffer.prompt_global_steps["train"] = {"slow": 1, "young": 3}
    buffer._awaiting_judge, buffer._given_up, buffer._in_time = {"slow"}, set(), set()
    ready = {"young"}

    assert not buffer._has_enough_samples(4, "train", 1, ready)
    now[0] += 5.0
    assert not buffer._has_enough_samples(4, "train", 1, ready)
    buffer._awaiting_judge = set()  # scored: the sample goes on (and will take it first, oldest)
    assert buffer._has_enough_samples(4, "train", 1, ready | {"slow"})
    assert buffer.staleness_wait_s == 5.0

    trainer.local_trigger_step = 0  # the first of two samples: a place is left for slow, no wait
    buffer._awaiting_judge = {"slow"}
    assert buffer._has_enough_samples(4, "train", 1, ready)
    trainer.local_trigger_step = 1
    assert not buffer._has_enough_samples(4, "train", 1, ready)
    now[0] += 31.0
    assert buffer._has_enough_samples(4, "train", 1, ready)  # given up
    assert buffer._given_up == {"slow"} and buffer.staleness_wait_s == 36.0
    assert buffer._has_enough_samples(4, "train", 1, ready)
    submission = module.DecoupledReplayBufferAsync(
        trainer_mode="decoupled",
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=4,
        max_off_policy_strategy="drop",
        sampler_kwargs=OmegaConf.create({}),
    )
    submission.attach(trainer, staleness_from="submission", poll_interval_s=0.1)
    submission.prompt_global_steps["train"] = {"slow": 1, "young": 3}
    submission._awaiting_judge, submission._given_up = {"slow"}, set()
    assert submission._has_enough_samples(4, "train", 1, ready)  # verl's measure, verl's rules


class FailingRollout:
    """The rollout and the trainer's top-up as verl's sampler sees them, on the benchmark's
    TransferQueue stand-in: each prompt dispatched (first, then through the sampler's refill) ends
    with the next status of ``script`` (``failure`` with ``reason``, or ``finished`` with one written
    session), as our worker tags it; the ledger records each dispatch as the trainer's would."""

    def __init__(self, store: Any, script: list[str], reason: str = "reward_error") -> None:
        from async_reward.v1.decoupled.window import PromptLedger

        self.store, self.script, self.reason = store, list(script), reason
        self.ledger = PromptLedger()
        self.refilled = 0
        self._uids = iter(f"g{i}" for i in range(10**6))

    def dispatch(self, count: int) -> None:
        for _ in range(count):
            uid, status = next(self._uids), self.script.pop(0) if self.script else "failure"
            tag = {"is_prompt": True, "status": status, "global_steps": 1, "gen_done": 2, "gen_n": 2}
            tag["unscored"] = 0
            if status == "failure":
                tag["failure_reason"] = self.reason
            else:
                self.store.kv_batch_put(keys=[f"{uid}_0_0"], partition_id="train", tags=[{"seq_len": 5}])
            self.store.kv_batch_put(keys=[uid], partition_id="train", tags=[tag])
            self.ledger.dispatched([uid], "refill")

    def refill(self, count: int) -> int:
        self.refilled += count
        assert self.refilled < 1000, "the sampler evicts and regenerates failed groups without a bound"
        self.dispatch(count)
        return count


def failing_sampler(rollout: FailingRollout, max_untrained_skips: int | None) -> Any:
    """The mode's sampler (verl's ``ReplayBufferAsync`` subclass), attached as the trainer attaches it
    (``max_untrained_skips`` None: not given, the key's default)."""
    from types import SimpleNamespace

    from async_reward.v1.decoupled.replay_buffer import DecoupledReplayBufferAsync

    buffer = DecoupledReplayBufferAsync(
        trainer_mode="decoupled",
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=4,
        max_off_policy_strategy="drop",
        sampler_kwargs=OmegaConf.create({}),
        refill_fn=rollout.refill,
    )
    trainer = SimpleNamespace(
        parameter_sync_step=1, local_trigger_step=0, ledger=rollout.ledger, _top_up=lambda: None
    )
    bound = {} if max_untrained_skips is None else {"max_untrained_skips": max_untrained_skips}
    buffer.attach(trainer, staleness_from="generation", poll_interval_s=0.0, **bound)
    return buffer


@pytest.mark.parametrize("reason", ["reward_error", "generation_error"])
@pytest.mark.parametrize("bound", [None, 0, 2])
def test_groups_that_all_fail_stop_the_sample_after_max_untrained_skips_batches_worth(reason, bound):
    """Every group fails (``on_failure: raise`` through a judge outage, or a generation error):
    verl's sampler evicts each and has the trainer dispatch another, with no bound of its own. The
    mode stops once ``max_untrained_skips + 1`` batches' worth of groups (the sample's size, 4) failed
    with nothing sampled (default 8: 36 groups; 0: the first 4), naming the reasons with their
    counts and the key; the last ones evicted are not replaced. Without the bound the sampler
    regenerated for ever (the guard: 1000 refills)."""
    from async_reward.v1.decoupled import replay_buffer as module
    from async_reward_bench.tag_store import TagStore, serving_replay_buffer

    store = TagStore()
    rollout = FailingRollout(store, [], reason)
    buffer = failing_sampler(rollout, bound)
    with serving_replay_buffer(store, module.__name__):
        rollout.dispatch(4)
        with pytest.raises(RuntimeError) as stopped:
            buffer.sample(global_steps=1, partition_id="train", batch_size=4)
    bound = DEFAULT_MAX_UNTRAINED_SKIPS if bound is None else bound
    failed = (bound + 1) * 4
    message = str(stopped.value)
    assert f"{failed} group(s) failed and were evicted with nothing sampled" in message
    assert f"failure_reason {reason}: {failed}; the last 4: {reason}: 4" in message
    assert f"trainer.v1.sampler.sampler_kwargs.max_untrained_skips (now {bound})" in message
    assert rollout.refilled == failed - 4
    assert rollout.ledger.counts[f"evicted/{reason}"] == failed and rollout.ledger.counts["trained"] == 0


def test_a_sample_starts_the_count_of_failed_groups_again():
    """``max_untrained_skips=1``, samples of 2 groups: the run stops at 4 failed groups with nothing
    sampled in between. 3 fail before the first sample and 2 before the second (5 in all): both
    samples go on; then 4 in a row stop it."""
    from async_reward.v1.decoupled import replay_buffer as module
    from async_reward_bench.tag_store import TagStore, serving_replay_buffer

    store = TagStore()
    script = ["failure", "failure", "failure", "finished", "finished"]
    rollout = FailingRollout(store, script)
    buffer = failing_sampler(rollout, 1)
    with serving_replay_buffer(store, module.__name__):
        rollout.dispatch(2)
        first, _ = buffer.sample(global_steps=1, partition_id="train", batch_size=2)
        rollout.script = ["failure", "failure", "finished", "finished"]
        rollout.dispatch(2)
        second, _ = buffer.sample(global_steps=1, partition_id="train", batch_size=2)
        rollout.dispatch(2)  # the script is spent: every group fails from here
        with pytest.raises(RuntimeError, match=r"4 group\(s\) failed .* reward_error: 4"):
            buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    assert sorted(first.keys) == ["g3_0_0", "g4_0_0"] and sorted(second.keys) == ["g7_0_0", "g8_0_0"]
    assert rollout.ledger.counts["evicted/reward_error"] == 3 + 2 + 4


def test_the_wait_for_a_group_at_its_limit_is_bounded_by_the_scoring_deadline_unless_set():
    config = verl_config()
    assert stale_wait_limit_s(load_decoupled_mode_config(config), config) == 120 + 4 * 120 + 3 * 20
    tuned = verl_config(
        reward={
            "async_reward": {
                "timeout_s": 10,
                "admission_timeout_s": 5,
                "retry": {"max_attempts": 2, "max_backoff_s": 1},
            }
        }
    )
    assert stale_wait_limit_s(DecoupledModeConfig(), tuned) == 5 + 2 * 10 + 1
    assert stale_wait_limit_s(DecoupledModeConfig(stale_wait_timeout_s=30), tuned) == 30
    # A served judge: the manager's own retry default (2 attempts), and a timed-out request through
    # verl's router is waited for up to retry.max_total_s (300 s) before the sample returns.
    assert stale_wait_limit_s(DecoupledModeConfig(), served_judge(workers=1)) == 300 + (120 + 20) + 300


class _TagRecordingWorker(DecoupledAgentLoopWorker):
    """Our decoupled worker with its tag writes recorded instead of sent to TransferQueue."""

    published: list[dict[str, Any]]

    async def _publish(self, uid: str, group: _GroupProgress) -> None:
        self.published.append(group.tag())


def decoupled_worker(handles: list[Any]) -> _TagRecordingWorker:
    """The worker with only what verl's ``_compute_score`` and our progress reads (no LLM server)."""
    worker = _TagRecordingWorker.__new__(_TagRecordingWorker)
    worker.processor = None
    worker.mm_processor_kwargs = None
    worker.reward_loop_worker_handles = handles
    worker._progress, worker.published, worker._score_seconds = {}, [], []
    worker._produced = worker._consumed = worker._skipped = worker._abandoned = 0
    return worker


def test_a_session_rescored_after_its_reward_worker_died_leaves_the_backlog_once():
    """Both sessions of a group are generated (two unscored); session 0 goes to a reward worker that
    dies while scoring it, and is scored again on the live one (B's failover). The group's tag
    drops to one unscored and then to none, with no failure reason: the re-score is one pass through
    scoring, not two, and the group is not failed for it."""

    async def run() -> tuple[_TagRecordingWorker, list[Any]]:
        dying, live = DyingRewardWorker("dead-actor"), RecordingRewardWorker("live", fast=False)
        worker = decoupled_worker([dying, live])
        worker._progress["u"] = _GroupProgress(2, generated={0, 1}, unscored={0, 1})
        outputs = [session(), session()]
        tasks = [
            asyncio.create_task(worker._compute_score([o], {"uid": "u", "session_id": i}))
            for i, o in enumerate(outputs)
        ]
        for _ in range(5):
            await asyncio.sleep(0)
        assert (dying.calls, live.in_flight) == (1, 1)
        dying.die.set()
        for _ in range(5):
            await asyncio.sleep(0)
        live.release.set()
        await asyncio.gather(*tasks)
        return worker, outputs

    worker, outputs = asyncio.run(run())
    assert [tag["unscored"] for tag in worker.published] == [1, 0]
    assert not [tag for tag in worker.published if "failure_reason" in tag]
    assert worker._consumed == 2 and all(o.reward_score == 1.0 for o in outputs)
    lost = [o.extra_fields["reward_extra_info"].get(LOST_WORKERS_KEY) for o in outputs]
    assert lost.count("dead-actor") == 1


class _PromptRecordingWorker(DecoupledAgentLoopWorker):
    """Our decoupled worker whose ``_run_prompt`` (what verl's ``generate_sequences`` starts per
    prompt) records the prompt verl split from the batch instead of generating."""

    prompts: list[dict[str, Any]]

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False):
        self.prompts.append(prompt)


async def test_within_a_policy_version_the_earliest_dispatched_group_is_admitted_first(
    tmp_path, verl_config_factory, tokenizer
):
    """Two dispatches of two prompts, numbered by the mode's manager; verl's own ``generate_sequences``
    splits each batch into prompts and its ``_compute_score`` builds each session's reward request;
    every session was generated by the same weights (version 0), so the step priority ties. The
    requests reach a reward worker with one slot latest-dispatched group first (sessions of many
    groups finish generating together), all queued behind the slot the test holds; our manager
    admits the groups in dispatch order, both sessions of a group together, so the first group is
    complete first. Without the dispatch order they were served as they came."""
    import numpy as np
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl.trainer.ppo.reward import load_reward_manager
    from verl.utils import tensordict_utils as tu

    from async_reward.v1.agent_loop import number_dispatches
    from tests.managers.test_managers import ORDER_RECORDING_FUNCTION, admitted_in_turn, write_module
    from tests.v1.test_reward_failover import CapturingRewardWorker

    path = write_module(tmp_path, ORDER_RECORDING_FUNCTION, "recorded.py")
    config = verl_config_factory(
        "async_naive",
        {"limits": {"max_concurrency": 1}, "extra_defaults": {"started": -1}},
        custom_reward_function={"path": path, "name": "recorded"},
    )
    manager = load_reward_manager(config, tokenizer)
    capture = CapturingRewardWorker()
    worker = _PromptRecordingWorker.__new__(_PromptRecordingWorker)
    worker.processor = worker.mm_processor_kwargs = None
    worker.reward_loop_worker_handles = [capture]
    worker._progress, worker.prompts, worker.background_tasks = {}, [], set()
    worker.config = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": -1,
                    "calculate_log_probs": False,
                    "agent": {"default_agent_loop": "single_turn_agent"},
                }
            }
        }
    )

    def prompt_batch(uids: list[str]) -> Any:  # as verl's _next_train_batch makes it
        batch = tu.get_tensordict(
            {
                "uid": np.array(uids, dtype=object),
                "index": np.array([int(uid[1:]) for uid in uids], dtype=object),
                "data_source": np.array(["test"] * len(uids), dtype=object),
                "reward_model": np.array([{"ground_truth": "1"}] * len(uids), dtype=object),
                "extra_info": np.array([{"index": int(uid[1:])} for uid in uids], dtype=object),
            }
        )
        tu.assign_non_tensor_data(batch, "global_steps", 1)
        return batch

    following = 0
    for uids in (["g0", "g1"], ["g2", "g3"]):
        batch = prompt_batch(uids)
        following = number_dispatches(batch, following)
        await worker.generate_sequences(batch)
    await asyncio.gather(*worker.background_tasks)
    assert [p["uid"] for p in worker.prompts] == ["g0", "g1", "g2", "g3"] and following == 4

    prompt_ids = tokenizer.encode("What is 1*1?")
    arrivals = [(prompt, session_id) for session_id in (0, 1) for prompt in reversed(worker.prompts)]
    for prompt, session_id in arrivals:
        output = AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=tokenizer.encode("1"),
            response_mask=[1],
            metrics=AgentLoopMetrics(),
            extra_fields={"min_global_steps": 0, "max_global_steps": 0},
        )
        await worker._compute_score([output], {**prompt, "session_id": session_id})
    # Arrival order: latest-dispatched group first, each queued behind the slot the test holds.
    outputs = await admitted_in_turn(manager, capture.compute_score.requests)
    started = {
        (prompt["uid"], session_id): output["reward_extra_info"]["started"]
        for (prompt, session_id), output in zip(arrivals, outputs, strict=True)
    }
    order = sorted(started, key=started.__getitem__)
    assert order == [
        ("g0", 0),
        ("g0", 1),
        ("g1", 0),
        ("g1", 1),
        ("g2", 0),
        ("g2", 1),
        ("g3", 0),
        ("g3", 1),
    ]
