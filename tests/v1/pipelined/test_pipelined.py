"""verl v1 trainer mode ``pipelined`` (``async_reward.v1.pipelined.trainer``), on CPU, through verl's code.

Training runs use verl's real ``PPOTrainer.fit`` (our subclass), agent loop (our pipelined worker:
each session written before it is scored), verl's ``RewardLoopManager`` with our managers in its Ray
workers, TransferQueue, and verl's advantage code; stand-ins only for the token server, the actor's
model and the weight sync (tests/support/v1_standins.py). The entry-point test starts verl's own
``python -m verl.trainer.main_ppo`` in a subprocess, as a user does.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from async_reward import ConfigError
from async_reward.v1.pipelined.batches import InFlightBatch, read_groups, session_of
from async_reward.wiring.integration import SETUP_HOOK
from tests.support.v1_standins import (
    ScriptedRollout,
    StandInActor,
    TrainingRun,
    base_overrides,
    build_tiny_model_dir,
    compose_v1_config,
    run_v1_training,
    sessions,
    write_dataset,
)

SCHEDULES = {
    "baseline": (False, False),
    "mini_batch": (True, False),
    "one_step_off": (False, True),
    "both": (True, True),
}


def schedule_flags(schedule: str) -> list[str]:
    """The mode's keys for ``schedule``: on-policy is ``max_staleness=0``; one step off policy is the
    mode's default (``max_staleness`` 1), left unset so that a run may set more, or the fill."""
    mini_batch, one_step_off = SCHEDULES[schedule]
    return [
        f"+trainer.v1.pipelined.mini_batch={str(mini_batch).lower()}",
        *([] if one_step_off else ["+trainer.v1.pipelined.max_staleness=0"]),
    ]


# ----------------------------------------------------------------------------- bookkeeping (no Ray)


def test_group_states_and_finishing_order_from_tags() -> None:
    listing = {
        "a": {"is_prompt": True, "status": "running"},
        "a_0_0": {"status": "success", "seq_len": 9},
        "a_1_0": {"status": "success", "seq_len": 9},
        "b": {"is_prompt": True, "status": "finished"},
        "b_0_0": {"seq_len": 9},
        "b_1_0": {"seq_len": 9},
        "c": {"is_prompt": True, "status": "running"},
        "c_0_0": {"seq_len": 9},
        "c_1_0": {},  # listed before its write's tags: not written yet
        "other_0_0": {"seq_len": 9},
    }
    batch = InFlightBatch(step=1, version=0, sizes={"a": 2, "b": 2, "c": 2})
    groups = read_groups(listing, batch.uids)
    assert sorted(groups["a"].sessions) == ["0", "1"] and groups["c"].keys == ["c_0_0"]
    assert not batch.generated(groups)  # c has one of its two sessions
    assert batch.take_scored(groups) == (["b"], [])
    assert batch.take_scored(groups) == ([], [])  # handed out once
    listing.update({"c_1_0": {"seq_len": 9}, "a": {"is_prompt": True, "status": "failure"}})
    groups = read_groups(listing, batch.uids)
    assert batch.generated(groups)
    assert batch.take_scored(groups) == ([], ["a"]) and not batch.settled
    listing["c"] = {"is_prompt": True, "status": "finished"}
    assert batch.take_scored(read_groups(listing, batch.uids)) == (["c"], [])
    assert batch.settled and batch.handed_out == ["b", "c"] and batch.failed == ["a"]
    assert session_of("3f2a-9_12_0") == ("3f2a-9", "12") and session_of("3f2a") is None


# ----------------------------------------------------------------------------- start-up refusals


def _config(extra: list[str], tmp_path: Path) -> Any:
    model = build_tiny_model_dir(tmp_path / "model")
    data = write_dataset(tmp_path / "d.parquet", [("q", "1")])
    return compose_v1_config(
        [
            *base_overrides(model, data, steps=1, prompts=4, n=2),
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "trainer.v1.trainer_mode=pipelined",
            "reward.reward_manager.name=async_naive",
            *extra,
        ]
    )


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (["+trainer.v1.pipelined.mini_batch=true", "algorithm.adv_estimator=gae"], "'gae'"),
        (["+trainer.v1.pipelined.mini_batch=true", "data.train_batch_size=3"], "ppo_mini_batch_size"),
        (["+trainer.v1.pipelined.typo=true"], "['typo'] in trainer.v1.pipelined"),
        (["+trainer.v1.pipelined.poll_interval_s=0.5"], "['poll_interval_s'] in trainer.v1.pipelined"),
        (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"], "filter_groups"),
        (["trainer.v1.sampler.sync_refill_failed_groups=true"], "sync_refill_failed_groups"),
        (
            [
                "+trainer.v1.pipelined.max_staleness=1",
                "trainer.v1.sampler.max_off_policy_threshold=1",
            ],
            "max_off_policy_threshold",
        ),
        (["+async_reward.pipeline.mini_batch=true"], "trainer.v1.pipelined"),
        (
            [
                "+trainer.v1.pipelined.max_staleness=0",
                "+trainer.v1.pipelined.fill_rollout_tail_at=0.5",
            ],
            "max_staleness=2 or more",
        ),
        (
            [
                "+trainer.v1.pipelined.one_step_off_policy=false",
                "+trainer.v1.pipelined.max_staleness=2",
            ],
            "max_staleness=0 for one_step_off_policy=false",
        ),
        (["+trainer.v1.pipelined.fill_rollout_tail_at=0"], "fill_rollout_tail_at"),
        (
            [
                "+trainer.v1.pipelined.fill_rollout_tail_at=0.5",
                "trainer.v1.sampler.max_off_policy_threshold=2",
            ],
            "spanning 3 model versions",
        ),
        (
            [
                "+trainer.v1.pipelined.max_staleness=3",
                "trainer.v1.sampler.max_off_policy_threshold=3",
            ],
            "spanning 4 model versions",
        ),
    ],
)
def test_settings_the_mode_cannot_honour_are_refused_by_name(extra, key, tmp_path) -> None:
    from async_reward.v1.checks import check_v1
    from async_reward.v1.pipelined.config import load_pipelined_mode_config

    config = _config(extra, tmp_path)
    with pytest.raises(ConfigError) as error:
        check_v1(config)
        load_pipelined_mode_config(config)
    assert key in str(error.value)


def test_a_foreign_agent_loop_manager_is_refused(tmp_path) -> None:
    from omegaconf import open_dict

    from async_reward.v1.pipelined.agent_loop import use_pipelined_agent_loop

    config = _config([], tmp_path)
    with open_dict(config):
        config.actor_rollout_ref.rollout.agent.agent_loop_manager_class = (
            "verl.trainer.ppo.v1.agent_loop_tq.AgentLoopManagerTQ"
        )
    with pytest.raises(ConfigError, match="written to TransferQueue before it is scored"):
        use_pipelined_agent_loop(config, dry_run=False)


# ----------------------------------------------------------------------------- training on CPU


# model_dir, rollout and transfer_queue: tests/conftest.py, one of each per module.

QUESTIONS = [f"What is {i}+1?" for i in range(8)]
ROWS = [(question, str(i + 1)) for i, question in enumerate(QUESTIONS)]
SCRIPT = {q: [f"The answer is {i + 1}", f"The answer is {i + 7}"] for i, q in enumerate(QUESTIONS)}


def test_the_scripted_server_answers_in_verls_tokens_without_loading_torch_or_verl(
    model_dir, rollout
) -> None:
    """The stand-in token server (tests/support/scripted_server.py) reads prompts and writes responses
    with the ids verl's tokenizer gives, and its answer arrives as verl's ``TokenOutput``, while its
    own process loads neither torch nor verl (nor transformers, which loads torch): what makes it a
    second of CPU to start instead of six."""
    import sys

    import ray
    from transformers import AutoTokenizer
    from verl.workers.rollout.replica import TokenOutput

    from tests.support.scripted_server import ScriptTokenizer

    verls, ours = AutoTokenizer.from_pretrained(str(model_dir)), ScriptTokenizer(model_dir)
    prompt = verls.apply_chat_template(
        [{"role": "user", "content": QUESTIONS[3]}], add_generation_prompt=True, tokenize=False
    )
    scripted = [text for texts in SCRIPT.values() for text in texts]
    for text in [prompt, *scripted, "fail @@fault:503@@", "a <eos> b"]:
        ids = verls.encode(text)
        assert ours.encode(text) == ids and ours.decode(ids) == verls.decode(ids), text
    assert ours.eos_token_id == verls.eos_token_id
    ray.get(rollout.server.start.remote({QUESTIONS[3]: ["The answer is 4"]}))
    generated = rollout.server.generate.remote(
        "r", prompt_ids=verls.encode(prompt), sampling_params={"logprobs": True}
    )
    answer = ray.get(generated)
    assert isinstance(answer, TokenOutput)
    assert answer.token_ids == [*verls.encode("The answer is 4"), verls.eos_token_id]
    assert answer.log_probs == [-1.0] * len(answer.token_ids) and answer.extra_fields == {"global_steps": 0}
    loaded = ray.get(rollout.server.__ray_call__.remote(lambda _: {m.split(".")[0] for m in sys.modules}))
    assert not {"torch", "verl", "transformers"} & loaded, sorted(loaded)


def train_pipelined(
    tmp_path: Path,
    model_dir: Path,
    rollout: ScriptedRollout,
    server: Any,
    schedule: str,
    extra: list[str] | None = None,
    steps: int = 2,
    actor: StandInActor | None = None,
    script: dict[str, list[str]] | None = None,
) -> TrainingRun:
    dataset = write_dataset(tmp_path / "train.parquet", ROWS)
    config = compose_v1_config(
        [
            *base_overrides(model_dir, dataset, steps=steps, prompts=4, n=2),
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "trainer.v1.trainer_mode=pipelined",
            *schedule_flags(schedule),
            f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}",
            "reward.reward_manager.name=async_remote",
            f"+reward.async_reward.remote.url={server.url}/score",
            "+reward.async_reward.retry.initial_backoff_s=0.01",
            "trainer.val_before_train=false",
            *(extra or []),
        ]
    )
    import async_reward.v1.pipelined.trainer  # noqa: F401  (registers the mode in this process)

    return run_v1_training(config, rollout, script or SCRIPT, tmp_path / "metrics.jsonl", actor=actor)


def step_logs(run: TrainingRun) -> list[dict[str, Any]]:
    return [entry["data"] for entry in run.logged if "training/global_step" in entry["data"]]


def assert_every_sample_trained_once(run: TrainingRun, schedule: str) -> None:
    """Two steps of 4 prompts x 2 sessions: each dataset row's two sessions are trained exactly once,
    together in one update; mini-batch schedules make 2 updates per step (ppo_mini_batch_size=2), the
    others one call for the batch; one-step-off batches are one policy version stale."""
    mini_batch, one_step_off = SCHEDULES[schedule]
    rows = [row for update in run.updates for row in sessions(update)]
    assert Counter(row.index for row in rows) == dict.fromkeys(range(8), 2)
    assert len({row.key for row in rows}) == 16  # no session trained twice
    for update in run.updates:  # complete groups only
        per_index = Counter(row.index for row in sessions(update))
        assert set(per_index.values()) == {2}
    for row in rows:  # the scores the service gave: right answer 1.0, wrong 0.0
        assert row.score == (1.0 if row.reward_extra_info.get("pred") == str(row.index + 1) else 0.0)
        assert row.reward_extra_info["status"] == "ok" and row.mask_tokens > 0
    assert len(run.updates) == (4 if mini_batch else 2)
    logs = step_logs(run)
    assert len(logs) == 2
    assert [m["pipeline/num_updates"] for m in logs] == [2.0, 2.0]
    assert [m["off_policy/staleness"] for m in logs] == ([0.0, 1.0] if one_step_off else [0.0, 0.0])
    for metrics in logs:
        assert metrics["reward/status_ok"] == 8.0 and metrics["reward/untrained"] == 0.0
        assert "timing_s/reward_blocked" in metrics and metrics["pipeline/failed_groups"] == 0.0


#: The schedules trained by :func:`test_every_sample_trains_once_in_complete_groups`; ``baseline``'s
#: run is the pipelined run of the slow-judge test (same configuration but the judge's latency and the
#: actor's log-prob time), which asserts the same, so the module trains it once, not twice.
TRAINED_ALONE = [name for name in SCHEDULES if name != "baseline"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("schedule", TRAINED_ALONE)
def test_every_sample_trains_once_in_complete_groups(
    schedule, tmp_path, model_dir, rollout, transfer_queue, ray_cluster, server
) -> None:
    """:func:`assert_every_sample_trained_once` for each schedule but ``baseline`` (asserted in
    :func:`test_log_probs_overlap_a_slow_judge_where_v1_sync_waits_for_it`)."""
    run = train_pipelined(tmp_path, model_dir, rollout, server, schedule)
    assert_every_sample_trained_once(run, schedule)


# ----------------------------------------------------------------------------- failure policies

FAILING_FUNCTION = """
def score_or_fail(data_source, solution_str, ground_truth, extra_info=None):
    if "fail" in solution_str or "boom" in solution_str:
        raise ConnectionError("judge unavailable")
    return float(str(ground_truth) in solution_str)
"""


def failing_reward(tmp_path: Path, policy: str) -> list[str]:
    from tests.managers.test_managers import write_module

    return [
        "reward.reward_manager.name=async_naive",
        f"reward.custom_reward_function.path={write_module(tmp_path, FAILING_FUNCTION, 'failing.py')}",
        "reward.custom_reward_function.name=score_or_fail",
        f"+reward.async_reward.on_failure={policy}",
        "+reward.async_reward.retry.max_attempts=1",
    ]


def run_with_failures(
    tmp_path: Path,
    model_dir: Path,
    rollout: ScriptedRollout,
    script: dict[str, list[str]],
    policy: str,
    schedule: str = "both",
) -> TrainingRun:
    """One step of 4 prompts x 2 sessions, updates of one group (``both``: 4 chunks of one group)."""
    rows = [(q, str(i + 1)) for i, q in enumerate(QUESTIONS[:4])]
    dataset = write_dataset(tmp_path / "train.parquet", rows)
    config = compose_v1_config(
        [
            *base_overrides(model_dir, dataset, steps=1, prompts=4, n=2),
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "trainer.v1.trainer_mode=pipelined",
            *schedule_flags(schedule),
            f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}",
            "trainer.val_before_train=false",
            *failing_reward(tmp_path, policy),
        ]
    )
    import async_reward.v1.pipelined.trainer  # noqa: F401

    return run_v1_training(config, rollout, script, tmp_path / "metrics.jsonl")


@pytest.mark.timeout(600)
def test_exclude_moves_no_weight_and_a_chunk_with_nothing_to_train_never_reaches_the_actor(
    tmp_path, model_dir, rollout, transfer_queue
) -> None:
    script = {q: [f"The answer is {i + 1}", f"The answer is {i + 7}"] for i, q in enumerate(QUESTIONS[:4])}
    script[QUESTIONS[0]] = ["fail", "fail"]  # a whole chunk (one group) with nothing to train
    script[QUESTIONS[1]] = ["The answer is 2", "fail"]  # one scored member left: starved
    run = run_with_failures(tmp_path, model_dir, rollout, script, "exclude")
    trained = [row for update in run.updates for row in sessions(update)]
    # Group 0 (both excluded) and group 1 (starved: its scored member masked too, since one member
    # cannot make a group-relative advantage) are chunks with no loss token: never sent to the actor.
    assert len(run.updates) == 2
    assert Counter(row.index for row in trained) == {2: 2, 3: 2}
    for row in trained:
        assert row.mask_tokens > 0 and row.reward_extra_info["status"] == "ok"
    (metrics,) = step_logs(run)
    assert metrics["reward/skipped_batches"] == 2.0 and metrics["pipeline/num_updates"] == 2.0
    assert metrics["reward/excluded"] == 3.0 and metrics["reward/status_error"] == 3.0
    assert metrics["reward/untrained"] == 4.0  # three excluded and the starved group's scored one
    assert metrics["reward/status_ok"] == 5.0  # every session counted, trained or not
    assert run.steps and all(step.loss_tokens > 0 for step in run.steps)  # every AdamW step trained


@pytest.mark.timeout(600)
def test_exclude_in_one_update_call_hands_verl_no_update_without_a_loss_token(
    tmp_path, model_dir, rollout, transfer_queue
) -> None:
    """Schedule ``baseline``: one update call for the batch, which verl's actor splits into updates
    of one group (2 rows) in its own order. The 4 rows without a loss token (an all-excluded group
    and a starved one) are not handed to it, so neither of its 2 AdamW steps trains on nothing."""
    script = {q: [f"The answer is {i + 1}", f"The answer is {i + 7}"] for i, q in enumerate(QUESTIONS[:4])}
    script[QUESTIONS[0]] = ["fail", "fail"]
    script[QUESTIONS[1]] = ["The answer is 2", "fail"]
    run = run_with_failures(tmp_path, model_dir, rollout, script, "exclude", schedule="baseline")
    (update,) = run.updates
    assert Counter(row.index for row in sessions(update)) == {2: 2, 3: 2}
    assert len(run.steps) == 2 and all(step.loss_tokens > 0 for step in run.steps)
    assert all(step.weight_change > 0 for step in run.steps)
    (metrics,) = step_logs(run)
    assert metrics["reward/untrained"] == 4.0 and metrics["reward/excluded"] == 3.0
    assert metrics["pipeline/num_updates"] == 2.0


@pytest.mark.timeout(600)
def test_raise_fails_one_group_and_the_step_trains_the_others(tmp_path, model_dir, rollout, transfer_queue):
    script = {q: [f"The answer is {i + 1}", f"The answer is {i + 7}"] for i, q in enumerate(QUESTIONS[:4])}
    script[QUESTIONS[2]] = ["The answer is 3", "boom"]
    run = run_with_failures(tmp_path, model_dir, rollout, script, "raise")
    trained = [row for update in run.updates for row in sessions(update)]
    assert Counter(row.index for row in trained) == {0: 2, 1: 2, 3: 2}  # group 2 dropped whole
    (metrics,) = step_logs(run)
    assert metrics["pipeline/failed_groups"] == 1.0 and metrics["pipeline/num_updates"] == 3.0
    # every session counted: the failed group's scored one too, and its raised one as an error
    assert metrics["reward/status_ok"] == 7.0 and metrics["reward/status_error"] == 1.0


# ----------------------------------------------------------------------------- the reward wait


class JudgeWatchingActor(StandInActor):
    """The stand-in actor noting, as each log-prob pass starts, how many rewards the judge had
    answered and how many requests it held; the first pass releases a held judge."""

    def __init__(self, judge: Any) -> None:
        super().__init__()
        self.judge = judge
        self.at_log_prob: list[tuple[int, int, int]] = []  # (answered, held, in flight) at each pass

    def compute_log_prob(self, batch: Any) -> Any:
        stats = self.judge.stats()
        answered = sum(stats["responses_by_status"].values())
        self.at_log_prob.append((answered, stats["held"], stats["in_flight_total"]))
        self.judge.update_config(hold=False)
        return super().compute_log_prob(batch)


@pytest.mark.timeout(900)
def test_log_probs_overlap_a_slow_judge_where_v1_sync_waits_for_it(
    tmp_path, model_dir, rollout, transfer_queue, server
) -> None:
    """Judge 0.5 s per sample, generation instant (the scripted server): v1 sync waits for every
    reward before its log-probs (its sampling time is the reward wait), the pipelined mode computes
    them while the rewards are still out. Shown by what the judge had done when each log-prob pass
    started, not by comparing two runs' wait times: for sync, every reward of the step answered and
    nothing in flight; for ours, with the judge held from the start (it answers nothing until the
    first log-prob pass releases it), nothing answered yet. A pipelined mode that waited for rewards
    first would never release it: its requests would time out (120 s), failing their samples. The
    pipelined run is schedule ``baseline``'s every-sample run (:func:`assert_every_sample_trained_once`).
    Every claim is causal (what the judge had answered or held) or a lower bound the latency sets, so
    it holds at any latency; 0.5 s (it was 1.5 s) keeps the two runs short."""
    from async_reward.v1 import V1_OVERRIDES

    samples = 4 * 2  # prompts x n, per step
    latency_s = 0.5
    server.update_config(latency_ms=[latency_s * 1000, latency_s * 1000])
    dataset = write_dataset(tmp_path / "train.parquet", ROWS)
    common = [
        *base_overrides(model_dir, dataset, steps=2, prompts=4, n=2),
        "reward.reward_manager.name=async_remote",
        f"+reward.async_reward.remote.url={server.url}/score",
        "trainer.val_before_train=false",
    ]
    sync_actor = JudgeWatchingActor(server)
    sync = run_v1_training(
        compose_v1_config([*common, "trainer.v1.trainer_mode=sync", *V1_OVERRIDES]),
        rollout,
        SCRIPT,
        tmp_path / "sync.jsonl",
        actor=sync_actor,
    )
    assert sync_actor.at_log_prob and all(
        answered >= samples and answered % samples == 0 and (held, in_flight) == (0, 0)
        for answered, held, in_flight in sync_actor.at_log_prob
    ), sync_actor.at_log_prob
    # each step waited for a judge call
    assert sum(m["timing_s/gen"] for m in step_logs(sync)) >= 2 * latency_s
    # Schedule baseline as test_every_sample_trains_once_in_complete_groups trains it (the judge's hold
    # and latency change timings, not what is trained): this run also proves that test's claims.
    server.reset()
    server.update_config(hold=True)
    our_actor = JudgeWatchingActor(server)
    ours = train_pipelined(tmp_path, model_dir, rollout, server, "baseline", actor=our_actor)
    assert_every_sample_trained_once(ours, "baseline")
    # Every reward is ``ok`` (above), so none of them waited past its deadline: the judge was released
    # in time, by the first log-prob pass, which found it had answered nothing.
    answered, _, _ = our_actor.at_log_prob[0]
    assert answered == 0, our_actor.at_log_prob


# ----------------------------------------------------------------------------- checkpoint and resume


class CheckpointingActor(StandInActor):
    """The stand-in actor with verl's checkpoint calls (nothing to save: it has no weights) that can
    die at its ``crash_at``-th update, as a lost node would."""

    def __init__(self, crash_at: int | None = None) -> None:
        super().__init__()
        self.crash_at = crash_at
        self.calls = 0

    def update_actor(self, batch: Any) -> dict[str, Any]:
        self.calls += 1
        if self.calls == self.crash_at:
            raise RuntimeError("node lost")
        return super().update_actor(batch)

    def save_checkpoint(self, local_path: str, *args: Any, **kwargs: Any) -> None:
        Path(local_path).mkdir(parents=True, exist_ok=True)

    def load_checkpoint(self, local_path: str, *args: Any, **kwargs: Any) -> None:
        assert Path(local_path).is_dir(), local_path


@pytest.mark.timeout(900)
@pytest.mark.parametrize("max_staleness", [1, 2])
def test_resume_trains_the_batch_in_flight_first_and_skips_or_repeats_nothing(
    tmp_path, model_dir, rollout, transfer_queue, server, max_staleness
) -> None:
    """Schedule ``both``: step 1 is saved while batch 2 (generated during step 1) is still in
    TransferQueue; a resumed run trains that batch first, then step 3's fresh one. Across both runs
    every dataset row is trained exactly once (rows 0-3 in step 1, 4-7 in step 2, 0-3 again in step 3
    from the second epoch). At ``max_staleness=2`` batches 2 and 3 were both dispatched in step 1 and
    are both in the checkpoint: the resumed run trains them, each group once, in whole batches."""
    import async_reward.v1.pipelined.trainer  # noqa: F401

    dataset = write_dataset(tmp_path / "train.parquet", ROWS)
    checkpoints = tmp_path / "ckpt"

    def config(steps: int, resume: str) -> Any:
        return compose_v1_config(
            [
                *base_overrides(model_dir, dataset, steps=steps, prompts=4, n=2),
                "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "trainer.v1.trainer_mode=pipelined",
                *schedule_flags("both"),
                f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}",
                "reward.reward_manager.name=async_remote",
                f"+reward.async_reward.remote.url={server.url}/score",
                "trainer.val_before_train=false",
                "trainer.save_freq=1",
                f"trainer.default_local_dir={checkpoints}",
                f"trainer.resume_mode={resume}",
                f"+trainer.v1.pipelined.max_staleness={max_staleness}",
            ]
        )

    # A run of 3 steps dies at step 2's first update: its checkpoint is global_step_1, saved with
    # batch 2 (generated during step 1) in TransferQueue.
    crashing = CheckpointingActor(crash_at=3)
    with pytest.raises(RuntimeError, match="node lost"):
        run_v1_training(config(3, "disable"), rollout, SCRIPT, tmp_path / "first.jsonl", actor=crashing)
    assert (checkpoints / "global_step_1" / "transfer_queue").exists()
    second = run_v1_training(
        config(3, "auto"), rollout, SCRIPT, tmp_path / "second.jsonl", actor=CheckpointingActor()
    )
    rows = [[row.index for row in sessions(update)] for update in crashing.updates + second.updates]
    per_step = [sorted(rows[i] + rows[i + 1]) for i in range(0, len(rows), 2)]
    assert [m["training/global_step"] for m in step_logs(second)] == [2, 3]
    keys = [row.key for update in crashing.updates + second.updates for row in sessions(update)]
    assert len(keys) == len(set(keys)) == 24  # no session trained twice, none skipped
    if max_staleness == 1:
        assert per_step == [
            [0, 0, 1, 1, 2, 2, 3, 3],
            [4, 4, 5, 5, 6, 6, 7, 7],
            [0, 0, 1, 1, 2, 2, 3, 3],
        ]
        assert [m["off_policy/staleness"] for m in step_logs(second)][1] == 1.0
        return
    # Both batches were dispatched by step 1: restored together, in no order among them.
    assert per_step[0] == [0, 0, 1, 1, 2, 2, 3, 3] and all(len(step) == 8 for step in per_step)
    assert Counter(index for step in per_step[1:] for index in step) == {
        **dict.fromkeys(range(4), 2),
        **dict.fromkeys(range(4, 8), 2),
    }
    # verl re-issues a checkpoint's unfinished prompts as new dispatches of the resumed step (their
    # old trajectories cleared): regenerated by the resumed policy, so never staler than the limit.
    assert all(0.0 <= m["off_policy/staleness"] <= 2.0 for m in step_logs(second))


class RecordingAgentLoopManager:
    """verl's agent-loop manager as the trainer's dispatch and verl's re-issue call it: records the
    prompt batches it is asked to generate, generates nothing."""

    def __init__(self) -> None:
        self.batches: list[Any] = []

    def generate_sequences(self, batch: Any) -> None:
        self.batches.append(batch)


def prompt_batch(uids: list[str], rollout_n: list[int], step: int) -> Any:
    """A training batch as verl's ``_next_train_batch`` makes it, each prompt with its own
    ``__rollout_n__`` (a column of the dataset, which verl's agent loop reads in place of ``rollout.n``)."""
    import numpy as np
    from verl.utils import tensordict_utils as tu

    batch = tu.get_tensordict(
        {
            "uid": np.array(uids, dtype=object),
            "index": np.array(list(range(len(uids))), dtype=object),
            "data_source": np.array(["test"] * len(uids), dtype=object),
            "__rollout_n__": np.array(rollout_n),
        }
    )
    tu.assign_non_tensor_data(batch, "global_steps", step)
    return batch


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_a_resumed_run_restores_each_group_with_its_own_rollout_n(transfer_queue, max_staleness) -> None:
    """``rollout.n=2``; step 4 dispatched p with ``__rollout_n__=4`` and q with 1 (the mode's dispatch
    and verl's, which persists each prompt's fields in TransferQueue), then the run stopped. On
    resume verl re-issues both from those fields, so p runs 4 sessions and q one; the restored batch
    (the pool's groups at ``max_staleness=2``) counts the same, so p is not generated at 2 of its 4
    sessions (it was: its sessions 2 and 3 then stopped the step with ``UnpreparedTrajectory``), and
    q is at its one (it was not: the step waited for a session that never comes until q ended)."""
    from collections import deque
    from types import SimpleNamespace

    import transfer_queue as tq
    from omegaconf import OmegaConf

    from async_reward.v1.pipelined.pool import GroupPool
    from async_reward.v1.pipelined.trainer import PPOTrainerPipelined

    trainer = PPOTrainerPipelined.__new__(PPOTrainerPipelined)
    trainer.config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"n": 2}}, "data": {"train_batch_size": 2}}
    )
    trainer.trainer_mode = "pipelined"
    trainer.pipeline_config = SimpleNamespace(staleness_limit=max_staleness)
    trainer.agent_loop_manager = manager = RecordingAgentLoopManager()
    trainer._in_flight, trainer._pool, trainer._dispatched_through = deque(), GroupPool(), 0
    trainer._submitted, trainer._next_dispatch = {}, 0
    trainer.global_steps = 4
    try:
        trainer._submit_batch_to_rollout(prompt_batch(["p", "q"], [4, 1], step=4))
        assert trainer._submitted[4] == {"p": 4, "q": 1}  # a fresh dispatch counts each prompt's own
        trainer.global_steps = 5  # resumed from the checkpoint of step 4
        assert trainer._reissue_inflight_prompts() == 2
        assert [int(n) for n in manager.batches[-1]["__rollout_n__"]] == [4, 1]  # verl re-issues p with 4
        trainer.on_train_begin()
        restored = trainer._pool.watched(5) if max_staleness >= 2 else trainer._in_flight[0]
        assert restored.sizes == {"p": 4, "q": 1}
        listing = {
            "p": {"is_prompt": True, "status": "running"},
            "q": {"is_prompt": True, "status": "running"},
            "p_0_0": {"seq_len": 5},
            "p_1_0": {"seq_len": 5},
            "q_0_0": {"seq_len": 5},
        }
        groups = read_groups(listing, restored.uids)
        assert restored.ungenerated(groups) == ["p"]
        listing.update({"p_2_0": {"seq_len": 5}, "p_3_0": {"seq_len": 5}})
        assert restored.generated(read_groups(listing, restored.uids))
    finally:
        tq.kv_clear(keys=["p", "q"], partition_id="train")


def assert_three_steps_trained_every_session_once(run: TrainingRun) -> None:
    """Three steps of 4 prompts x 2 sessions (rows 0-3, 4-7, then 0-3 of the second epoch) at
    staleness 2: each session trained once, in 6 updates (2 per step), every reward ``ok``, the
    steps 0, 1 and 2 versions behind."""
    rows = [row for update in run.updates for row in sessions(update)]
    assert Counter(row.index for row in rows) == {
        **dict.fromkeys(range(4), 4),
        **dict.fromkeys(range(4, 8), 2),
    }
    assert len({row.key for row in rows}) == 24 and len(run.updates) == 6
    logs = step_logs(run)
    assert [m["off_policy/staleness"] for m in logs] == [0.0, 1.0, 2.0]
    assert all(m["reward/status_ok"] == 8.0 for m in logs)


def train_at_staleness_two_with_row_4_answered_at(
    version: int,
    tmp_path: Path,
    model_dir: Path,
    rollout: ScriptedRollout,
    server: Any,
    actor: StandInActor | None = None,
) -> TrainingRun:
    """Three steps of schedule ``both`` at ``max_staleness=2``, row 4's sessions (batch 2) answered
    only once the policy reaches ``version``."""
    script = dict(SCRIPT)
    script[QUESTIONS[4]] = [f"@@version:{version}@@{text}" for text in SCRIPT[QUESTIONS[4]]]
    return train_pipelined(
        tmp_path,
        model_dir,
        rollout,
        server,
        "both",
        ["+trainer.v1.pipelined.max_staleness=2"],
        steps=3,
        actor=actor,
        script=script,
    )


def rows_per_step(run: TrainingRun) -> list[list[int]]:
    """The dataset rows each of the three steps trained (two updates a step), one per session."""
    return [[row.index for update in run.updates[i : i + 2] for row in sessions(update)] for i in (0, 2, 4)]


@pytest.mark.timeout(600)
def test_staleness_two_trains_a_slow_group_a_step_later_in_place_of_a_generated_one(
    tmp_path, model_dir, rollout, transfer_queue, server
) -> None:
    """``max_staleness=2``: batches 2 and 3 both generate during step 1. Row 4's group (batch 2) is
    answered only once the policy reaches version 1 (after step 1's update: it goes on generating
    into step 2's rollout), so step 2 trains batch 2's other three groups and the first generated
    group of batch 3 instead of waiting; step 3 trains row 4 (two versions after the policy that
    started it) and batch 3's other groups. Every sample is trained once, whole groups per update,
    staleness never above 2. (The batch of step 3 is chosen during step 2's rollout, before its
    update, so a group of version 0 must be generated by then: it is, by versions 0 and 1.) The judge
    answers in 2 s, far slower than the stand-in's prepare stage, so it never catches up and the
    mode chooses each next batch ahead (:mod:`async_reward.v1.pipelined.choice`), visibly."""
    server.update_config(latency_ms=[2000.0, 2000.0])
    run = train_at_staleness_two_with_row_4_answered_at(1, tmp_path, model_dir, rollout, server)
    assert_three_steps_trained_every_session_once(run)
    for update in run.updates:  # whole groups: both sessions of a row in the same update
        assert all(count == 2 for count in Counter(row.uid for row in sessions(update)).values())
    per_step = rows_per_step(run)
    assert sorted(per_step[0]) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert 4 not in per_step[1] and {5, 6, 7} <= set(per_step[1])  # row 4 left generating
    [borrowed] = set(per_step[1]) - {5, 6, 7}  # one group of batch 3 in its place
    assert borrowed in range(4)
    assert sorted(per_step[2]) == sorted([4, 4] + [i for i in range(4) if i != borrowed for _ in (0, 1)])
    logs = step_logs(run)
    assert [m["pipeline/judge_caught_up"] for m in logs[:2]] == [0.0, 0.0]
    # the last step has no next batch: not logged there
    assert [m.get("pipeline/next_batch_chosen_ahead") for m in logs] == [1.0, 1.0, None]


class SlowPrepareActor(StandInActor):
    """Log-prob passes of ``seconds`` each, as a real model's take: a fast judge scores what a
    rollout left unscored before the prepare stage ends."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def compute_log_prob(self, batch: Any) -> Any:
        time.sleep(self.seconds)
        return super().compute_log_prob(batch)


@pytest.mark.timeout(300)
def test_a_judge_that_catches_up_lets_a_batch_be_chosen_in_its_own_rollout(
    tmp_path, model_dir, rollout, transfer_queue, server
) -> None:
    """``max_staleness=2``, a judge answering at once and log-prob passes of 2.5 s: the judge scores all a
    rollout leaves unscored before training needs it, so from step 2 on the mode chooses each batch
    at the end of its own rollout, not ahead. Row 4 (batch 2) is answered only by policy version 2,
    i.e. in step 3's own rollout, and must be trained by step 3 (it was started by version 0): so
    this run ends only because step 3's batch is chosen in step 3's rollout. Chosen ahead, in step
    2's rollout (version 1), it could not be formed without row 4, and step 2 could not train
    without it (the slow-judge run above is the batch-ahead case). Every sample trained once."""
    # Log-prob passes of 2.5 s (1 s flipped it on a machine at 99 % CPU with three suites running: the
    # judge had not caught up, the batch was chosen ahead and the run waited for row 4 until timeout).
    run = train_at_staleness_two_with_row_4_answered_at(
        2, tmp_path, model_dir, rollout, server, actor=SlowPrepareActor(2.5)
    )
    assert_three_steps_trained_every_session_once(run)
    logs = step_logs(run)
    assert [m["pipeline/judge_caught_up"] for m in logs[:2]] == [1.0, 1.0]
    # step 1 has no measure yet (ahead); then each batch in its own rollout
    assert [m.get("pipeline/next_batch_chosen_ahead") for m in logs] == [1.0, 0.0, None]
    per_step = rows_per_step(run)
    assert 4 not in per_step[1] and 4 in per_step[2]  # row 4: generated only in step 3's rollout


@pytest.mark.timeout(600)
def test_filling_the_rollout_tail_trains_every_sample_once_at_staleness_at_most_two(
    tmp_path, model_dir, rollout, transfer_queue, server
) -> None:
    """``fill_rollout_tail_at=0.5``: batch 3 starts generating during step 1, once batch 2 is half
    generated, so it is trained two versions after it was generated; nothing is lost or repeated."""
    fill = ["+trainer.v1.pipelined.fill_rollout_tail_at=0.5"]
    run = train_pipelined(tmp_path, model_dir, rollout, server, "both", fill, steps=3)
    assert_three_steps_trained_every_session_once(run)
