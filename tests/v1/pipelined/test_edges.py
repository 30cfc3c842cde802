"""Edges of the v1 pipelined mode (issue 25): a step with nothing to train, the bound on such steps,
the reward deadline kept to rewards, a dead agent-loop worker, the last step of ``total_epochs``,
trajectories without old log-probs, and the node's errors naming its own keys.

The training runs use the harness of tests/v1/pipelined/test_pipelined.py (verl's real ``fit``, agent loop,
reward workers, TransferQueue; stand-ins for the token server and the actor). One run proves several
properties where it can (a module fixture, each test asserting its own).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import math
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import ray
from omegaconf import OmegaConf, open_dict

from async_reward import ConfigError
from async_reward.v1.pipelined.batches import (
    InFlightBatch,
    UnpreparedTrajectory,
    check_prepared,
    read_groups,
)
from async_reward.v1.pipelined.config import PipelinedModeConfig, load_pipelined_mode_config
from async_reward.v1.pipelined.waits import (
    AgentLoopWatchdog,
    AgentLoopWorkerDied,
    RewardWaitTimeout,
    wait_for_groups,
)
from async_reward.wiring.integration import SETUP_HOOK
from tests.support.v1_standins import (
    base_overrides,
    build_tiny_model_dir,
    compose_v1_config,
    run_v1_training,
    sessions,
    write_dataset,
)
from tests.v1.pipelined.test_pipelined import QUESTIONS, failing_reward, schedule_flags, step_logs

NODE = "trainer.v1.pipelined"

# ----------------------------------------------------------------------------- the node's own errors


@pytest.fixture(scope="module")
def mode_config(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A verl config that trains with the pipelined mode, composed once (each test copies it)."""
    tmp = tmp_path_factory.mktemp("edges_config")
    model = build_tiny_model_dir(tmp / "model")
    data = write_dataset(tmp / "d.parquet", [("q", "1")])
    return compose_v1_config(
        [
            *base_overrides(model, data, steps=1, prompts=4, n=2),
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "trainer.v1.trainer_mode=pipelined",
            "reward.reward_manager.name=async_naive",
        ]
    )


def with_node(config: Any, node: dict[str, Any], **verl: Any) -> Any:
    """``config`` with ``trainer.v1.pipelined`` set to ``node`` and the dotted ``verl`` keys set."""
    config = copy.deepcopy(config)
    with open_dict(config):
        config.trainer.v1.pipelined = node
        for key, value in verl.items():
            OmegaConf.update(config, key.replace("__", "."), value, force_add=True)
    return config


#: (field, its bad value, other fields of the node, what the error says): every value rule of
#: ``trainer.v1.pipelined``, type rules included.
BAD_VALUES: list[tuple[str, Any, dict[str, Any], str]] = [
    ("mini_batch", "yes", {}, "not a boolean"),
    ("one_step_off_policy", 1, {}, "is not a key of this mode"),  # max_staleness says it
    ("chunk_timeout_s", 0, {}, "must be > 0"),
    ("chunk_timeout_s", -5.0, {}, "must be > 0"),
    ("chunk_timeout_s", math.nan, {}, "finite"),
    ("chunk_timeout_s", "soon", {}, "not a number"),
    ("assume_group_local", "true", {}, "not a boolean"),
    ("allow_ppo_epochs_per_chunk", "no", {}, "not a boolean"),
    ("dry_run", "yes", {}, "not a boolean"),
    ("poll_interval_s", 0.5, {}, "unknown key"),  # internal: POLL_INTERVAL_S
    ("fill_rollout_tail_at", 0, {}, "(0, 1]"),
    ("fill_rollout_tail_at", 1.5, {}, "(0, 1]"),
    ("max_staleness", -1, {}, "from 0 to 7"),
    ("max_staleness", 8, {}, "from 0 to 7"),
    ("max_staleness", 2.5, {}, "not an integer"),
    ("max_staleness", 0, {"fill_rollout_tail_at": 0.5}, "max_staleness=2 or more"),
    ("max_staleness", 1, {"fill_rollout_tail_at": 0.5}, "max_staleness=2"),
    # the legacy trainer's key, whatever max_staleness says: refused, naming max_staleness
    ("one_step_off_policy", False, {}, "max_staleness=0 for one_step_off_policy=false"),
    ("one_step_off_policy", False, {"max_staleness": 2}, "max_staleness=0 for one_step_off_policy=false"),
    ("one_step_off_policy", True, {"max_staleness": 0}, "delete the line for true"),
    ("typo", True, {}, "unknown key"),
]


@pytest.mark.parametrize(("field", "value", "others", "says"), BAD_VALUES)
def test_every_error_of_the_node_names_its_own_key(field, value, others, says, mode_config) -> None:
    with pytest.raises(ConfigError) as error:
        load_pipelined_mode_config(with_node(mode_config, {**others, field: value}))
    message = str(error.value)
    assert error.value.key == f"{NODE}.{field}" and says in message
    assert f"{NODE}.{field}" in message or f"['{field}'] in {NODE};" in message  # (an unknown key)
    assert "async_reward.pipeline" not in str(error.value)  # a node itself refused under v1


def test_every_field_of_the_node_has_a_bad_value_row() -> None:
    """A field added later gets its rule's row here, or this fails."""
    fields = {f.name for f in dataclasses.fields(PipelinedModeConfig)}
    assert fields <= {row[0] for row in BAD_VALUES}


@pytest.mark.parametrize(
    ("node", "verl", "names"),
    [
        ({"mini_batch": True}, {"algorithm__adv_estimator": "gae"}, "mini_batch=true"),
        (
            {"mini_batch": True},
            {"actor_rollout_ref__actor__ppo_epochs": 2},
            "allow_ppo_epochs_per_chunk=true",
        ),
    ],
)
def test_the_rules_against_verl_name_the_node(node, verl, names, mode_config) -> None:
    with pytest.raises(ConfigError) as error:
        load_pipelined_mode_config(with_node(mode_config, node, **verl))
    assert f"{NODE}.{names}" in str(error.value) and "async_reward.pipeline" not in str(error.value)


# ----------------------------------------------------------------------------- bookkeeping (no Ray)


def test_a_trajectory_listed_after_its_session_counted_as_written_is_never_trained() -> None:
    """Old log-probs are computed on the batch as listed when every session was written; a key of the
    same session listed later (a worker writing a session's outputs in two puts) has none, and
    training it is refused rather than done against log-probs never computed."""
    batch = InFlightBatch(step=3, version=2, sizes={"a": 1})
    when_generated = read_groups(
        {"a": {"is_prompt": True, "status": "running"}, "a_0_0": {"seq_len": 5}}, {"a"}
    )
    assert batch.generated(when_generated)
    prepared = set(when_generated["a"].keys)
    when_scored = read_groups(
        {"a": {"is_prompt": True, "status": "finished"}, "a_0_0": {"seq_len": 5}, "a_0_1": {"seq_len": 7}},
        {"a"},
    )
    check_prepared(["a_0_0"], prepared, step=3)  # what was prepared trains
    with pytest.raises(UnpreparedTrajectory, match=r"step 3: trajectory key\(s\) \['a_0_1'\]"):
        check_prepared(when_scored["a"].keys, prepared, step=3)


def listing_of(statuses: dict[str, str | None], written: dict[str, int]) -> dict[str, dict[str, Any]]:
    """A tag listing: each group's prompt tag (None: not yet listed) and its written sessions."""
    listing: dict[str, dict[str, Any]] = {}
    for uid, status in statuses.items():
        if status is not None:
            listing[uid] = {"is_prompt": True, "status": status}
        for session in range(written.get(uid, 0)):
            listing[f"{uid}_{session}_0"] = {"seq_len": 9}
    return listing


def test_chunk_timeout_s_bounds_waits_for_scores_only_and_counts_what_was_waited_for() -> None:
    """``chunk_timeout_s`` is the longest wait for one chunk of rewards: a generation longer than it is
    waited for; a wait for scores past it names the groups not scored (here 1 of 4, the others
    scored; not those still generating, or all of them)."""
    batch = InFlightBatch(step=2, version=1, sizes={"a": 2, "b": 2, "c": 2, "d": 2})
    polls = []
    generating = listing_of({"a": "running", "b": "running", "c": "running", "d": "running"}, {"a": 2})
    generated = listing_of(dict.fromkeys("abcd", "running"), dict.fromkeys("abcd", 2))

    def tags() -> dict[str, dict[str, Any]]:
        polls.append(1)
        return generating if len(polls) < 50 else generated

    common: dict[str, Any] = {"chunk_timeout_s": 1e-6, "watchdog": None, "pause": lambda: None, "step": 2}
    groups = wait_for_groups(tags, batch, batch.generated, "generated", **common)
    assert batch.generated(groups) and len(polls) == 50  # 49 polls past the deadline, no timeout
    scored = listing_of(
        {"a": "finished", "b": "finished", "c": "finished", "d": "running"}, dict.fromkeys("abcd", 2)
    )
    with pytest.raises(
        RewardWaitTimeout, match=r"1 of its 4 group\(s\) not scored after trainer\.v1\.pipelined"
    ):
        wait_for_groups(lambda: scored, batch, lambda groups: False, "scored", **common)
    assert batch.ungenerated(read_groups(generating, batch.uids)) == ["b", "c", "d"]


class TagStore:
    """TransferQueue's tag calls the step makes, in memory; ``extras`` are the sessions' scored
    ``reward_extra_info`` (a session without an entry wrote its trajectory but no score)."""

    def __init__(self, tags: dict[str, dict[str, Any]], extras: dict[str, dict[str, Any]]) -> None:
        self.tags, self.extras = tags, extras

    def kv_list(self, partition: str) -> dict[str, dict[str, dict[str, Any]]]:
        return {partition: {key: dict(tag) for key, tag in self.tags.items()}}

    def kv_clear(self, keys: list[str], partition_id: str) -> None:
        for key in keys:
            self.tags.pop(key, None)

    def kv_put(self, key: str, partition_id: str, tag: dict[str, Any]) -> None:
        self.tags[key] = dict(tag)


def test_a_step_whose_every_group_failed_counts_every_session_and_logs_finite_latencies() -> None:
    """``on_failure: raise``, ``rollout.n=2``: in group a one session was scored ``ok`` before its
    sibling raised while scored (its trajectory written, no score); group b raised while generated
    (nothing written). Both groups fail and are cleared, the step trains nothing, and its
    ``reward/*`` still count all four sessions (they counted none, with NaN latencies)."""
    from types import SimpleNamespace

    from async_reward.v1.pipelined.trainer import PPOTrainerPipelined
    from async_reward.v1.pipelined.untrained import UntrainedSteps

    tags = {
        "a": {"is_prompt": True, "status": "failure"},
        "a_0_0": {"seq_len": 5},
        "a_1_0": {"seq_len": 5},
        "b": {"is_prompt": True, "status": "failure"},
    }
    ok = {"status": "ok", "latency_s": 0.5, "attempts": 1, "failure_reason": "", "excluded": False}
    store = TagStore(tags, {"a_0_0": ok})
    trainer = PPOTrainerPipelined.__new__(PPOTrainerPipelined)
    trainer._tq = store
    trainer.config = OmegaConf.create(
        {
            "data": {"train_batch_size": 2},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 1}, "rollout": {"n": 2}},
            "trainer": {"critic_warmup": 0},
        }
    )
    trainer.pipeline_config = SimpleNamespace(mini_batch=True, chunk_timeout_s=None, staleness_limit=1)
    trainer._watchdog, trainer.global_steps, trainer._counted_deaths = None, 1, set()
    trainer._untrained = UntrainedSteps(8)
    batch = InFlightBatch(step=1, version=0, sizes={"a": 2, "b": 2})
    trainer.on_sample_begin = trainer.on_sample_end = lambda: None
    trainer._gather_batch_by_batch = lambda timing: (batch, read_groups(store.tags, batch.uids))
    trainer._prepare = lambda meta, metrics, timing: meta
    trainer._last_step = lambda: 10
    trainer._pause_between_polls = lambda: None
    trainer._session_extras = lambda meta: [dict(store.extras.get(key, {})) for key in meta.keys]
    metrics: dict[str, Any] = {}
    trainer.step(metrics, {})
    assert metrics["pipeline/untrained_step"] == 1.0 and metrics["pipeline/failed_groups"] == 2.0
    counts = {status: metrics[f"reward/status_{status}"] for status in ("ok", "timeout", "error", "invalid")}
    assert counts == {"ok": 1.0, "timeout": 0.0, "error": 3.0, "invalid": 0.0}
    assert metrics["reward/latency_p50"] == metrics["reward/latency_max"] == 0.5
    assert all(math.isfinite(value) for value in metrics.values() if isinstance(value, float))
    assert not {"a", "a_0_0", "a_1_0", "b"} & set(store.tags)  # the failed groups were cleared


class StepClock:
    """A monotonic clock the test moves (the watchdog's checks are due by it)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@ray.remote
class Worker:
    """An async actor like verl's agent-loop workers: busy with long calls, it still answers Ray."""

    async def work(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def checks_until_dead(watchdog: AgentLoopWatchdog, clock: StepClock, checks: int) -> Any:
    """Up to ``checks`` due checks, a moment apart (Ray's answers take real time to arrive)."""
    for _ in range(checks):
        clock.now += watchdog.every_s
        found = watchdog.dead()
        if found is not None:
            return found
        time.sleep(0.2)
    return None


@pytest.mark.timeout(120)
def test_the_watchdog_sees_a_dead_agent_loop_worker_and_never_a_busy_one(ray_cluster) -> None:
    busy, doomed = Worker.remote(), Worker.remote()
    ray.get([busy.__ray_ready__.remote(), doomed.__ray_ready__.remote()])
    busy.work.remote(60)
    clock = StepClock()
    watchdog = AgentLoopWatchdog([busy, doomed], every_s=5.0, clock=clock)
    assert checks_until_dead(watchdog, clock, 10) is None  # both alive, one busy for a minute
    clock.now += 1.0
    assert watchdog.dead() is None  # not due: nothing asked between checks
    ray.kill(doomed, no_restart=True)
    found = checks_until_dead(watchdog, clock, 100)
    assert found is not None
    name, error = found
    assert name.startswith("agent-loop worker 1 (Ray actor ") and isinstance(
        error, ray.exceptions.RayActorError
    )
    ray.kill(busy, no_restart=True)


# ----------------------------------------------------------------------------- training on CPU

ROWS = [(question, str(i + 1)) for i, question in enumerate(QUESTIONS)]
#: Batch 1 (rows 0-3): every judge call fails (an injected HTTP 500, one attempt) -> all excluded.
#: Batch 2 (rows 4-7): scored; row 4's second session takes 45 s to generate, longer than the
#: run's chunk_timeout_s (40 s): batch 2 is generated during step 1 (one-step off-policy). The limit
#: also bounds step 1's wait for its failed rewards, which includes a cold reward worker's start-up
#: when this run is the first of its process: at 15 s (a 20 s generation) a full ``make test`` beside
#: other work timed that wait out (2026-11-29), so the limit leaves a loaded machine room.
OUTAGE_THEN_SLOW = {
    **{
        q: [f"@@fault:500@@ The answer is {i + 1}", f"@@fault:500@@ The answer is {i + 7}"]
        for i, q in enumerate(QUESTIONS[:4])
    },
    **{q: [f"The answer is {i + 1}", f"The answer is {i + 7}"] for i, q in enumerate(QUESTIONS[4:], start=4)},
}
OUTAGE_THEN_SLOW[QUESTIONS[4]] = ["The answer is 5", "@@sleep:45@@The answer is 11"]


@dataclasses.dataclass
class EpochRun:
    run: Any
    generation_requests: int
    judge_requests: int


@pytest.fixture(scope="module")
def epoch_run(tmp_path_factory, model_dir, rollout, transfer_queue, judge_server) -> EpochRun:
    """Schedule ``both``, 8 rows of 4 prompts x 2 sessions: ``total_epochs=1`` ends training after
    step 2, before ``total_training_steps=3``; step 1's judge calls all fail under ``exclude`` (it
    trains nothing); ``chunk_timeout_s=40`` with a 45 s generation."""
    from tests.conftest import reset_judge_server

    reset_judge_server(judge_server)
    tmp = tmp_path_factory.mktemp("epoch_run")
    config = compose_v1_config(
        [
            *base_overrides(model_dir, write_dataset(tmp / "train.parquet", ROWS), steps=3, prompts=4, n=2),
            "trainer.total_epochs=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "trainer.v1.trainer_mode=pipelined",
            *schedule_flags("both"),
            "+trainer.v1.pipelined.chunk_timeout_s=40",
            f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}",
            "reward.reward_manager.name=async_remote",
            f"+reward.async_reward.remote.url={judge_server.url}/score",
            "+reward.async_reward.on_failure=exclude",
            "+reward.async_reward.retry.max_attempts=1",
            "trainer.val_before_train=false",
        ]
    )
    import async_reward.v1.pipelined.trainer  # noqa: F401  (registers the mode in this process)

    run = run_v1_training(config, rollout, OUTAGE_THEN_SLOW, tmp / "metrics.jsonl")
    generated = ray.get(rollout.server.requests.remote())
    judged = judge_server.stats()["requests_by_path"].get("/score", 0)
    return EpochRun(run, generation_requests=generated, judge_requests=judged)


@pytest.mark.timeout(900)
def test_a_step_with_nothing_trained_is_logged_and_the_run_goes_on(epoch_run) -> None:
    first, second = step_logs(epoch_run.run)
    assert first["training/global_step"] == 1 and first["pipeline/untrained_step"] == 1.0
    assert first["pipeline/untrained_steps_in_a_row"] == 1.0 and first["pipeline/num_updates"] == 0.0
    assert first["reward/excluded"] == 8.0 and first["reward/status_error"] == 8.0
    assert first["reward/skipped_batches"] == 2.0 and first["reward/untrained"] == 8.0
    assert second["pipeline/untrained_step"] == 0.0 and second["pipeline/untrained_steps_in_a_row"] == 0.0
    assert second["pipeline/num_updates"] == 2.0 and second["reward/status_ok"] == 8.0
    trained = [row for update in epoch_run.run.updates for row in sessions(update)]
    assert Counter(row.index for row in trained) == dict.fromkeys(range(4, 8), 2)


@pytest.mark.timeout(900)
def test_no_batch_is_generated_or_judged_past_the_last_step_of_total_epochs(epoch_run) -> None:
    """2 steps of 4 prompts x 2 sessions: 16 generations and 16 judge calls (one attempt each), not
    the 24 of a third batch that ``fit`` would never train."""
    assert [m["training/global_step"] for m in step_logs(epoch_run.run)] == [1, 2]
    assert epoch_run.generation_requests == 16
    assert epoch_run.judge_requests == 16


@pytest.mark.timeout(900)
def test_nothing_is_left_in_flight_or_in_transfer_queue_when_training_ends(epoch_run) -> None:
    assert not epoch_run.run.trainer._in_flight
    assert epoch_run.run.leftover == {}


@pytest.mark.timeout(900)
def test_chunk_timeout_s_does_not_limit_generation(epoch_run) -> None:
    """Batch 2 took 45 s to generate against chunk_timeout_s=40, and trained."""
    second = step_logs(epoch_run.run)[1]
    assert second["reward/status_ok"] == 8.0
    assert step_logs(epoch_run.run)[0]["timing_s/gen_next"] >= 40.0  # the wait outlasted the limit


def logged_steps(path: Path) -> list[dict[str, Any]]:
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [entry["data"] for entry in entries if "training/global_step" in entry["data"]]


@pytest.mark.timeout(900)
def test_untrained_steps_past_max_untrained_skips_stop_the_run_naming_the_key(
    tmp_path, model_dir, rollout, transfer_queue
) -> None:
    """``on_failure: raise`` through a lasting outage: every group of every batch fails. With
    ``max_untrained_skips=1`` step 1 is ridden out (logged), step 2 stops the run, saying why."""
    dataset = write_dataset(tmp_path / "train.parquet", ROWS)
    config = compose_v1_config(
        [
            *base_overrides(model_dir, dataset, steps=3, prompts=4, n=2),
            "trainer.v1.trainer_mode=pipelined",
            *schedule_flags("baseline"),  # the mode pipelines by default; this run is about the outage
            "+trainer.v1.sampler.sampler_kwargs.max_untrained_skips=1",
            f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}",
            "trainer.val_before_train=false",
            *failing_reward(tmp_path, "raise"),
        ]
    )
    import async_reward.v1.pipelined.trainer  # noqa: F401

    script = {q: ["fail", "fail"] for q in QUESTIONS}
    with pytest.raises(RuntimeError, match="2 steps in a row had nothing to train on") as error:
        run_v1_training(config, rollout, script, tmp_path / "metrics.jsonl")
    assert "trainer.v1.sampler.sampler_kwargs.max_untrained_skips (now 1)" in str(error.value)
    assert "4 of 4 group(s) failed" in str(error.value)
    (first,) = logged_steps(tmp_path / "metrics.jsonl")
    assert first["training/global_step"] == 1 and first["pipeline/untrained_step"] == 1.0
    assert first["pipeline/failed_groups"] == 4.0 and first["pipeline/num_updates"] == 0.0
    assert first["reward/status_error"] == 8.0 and first["reward/status_ok"] == 0.0  # all raised


def pipelined_agent_loop_workers() -> list[Any]:
    """The cluster's pipelined agent-loop workers (verl names every agent-loop worker
    ``agent_loop_worker_<i>_<hex>``), by their class: idle warm workers of other classes
    (tests/support/warm_actors.py keeps a sync run's ``RewardAgentLoopWorker``) are not the run's."""
    from async_reward.v1.pipelined.agent_loop import PipelinedAgentLoopWorker

    workers = []
    for name in ray.util.list_named_actors():
        if not name.startswith("agent_loop_worker_"):
            continue
        try:
            handle = ray.get_actor(name)
        except ValueError:  # gone since it was listed
            continue
        if handle._ray_actor_creation_function_descriptor.class_name == PipelinedAgentLoopWorker.__name__:
            workers.append(handle)
    return workers


def kill_agent_loop_workers_once_generating(rollout: Any, sessions_requested: int) -> threading.Thread:
    """A thread that kills the run's agent-loop workers (:func:`pipelined_agent_loop_workers`) once
    the token server has had ``sessions_requested`` requests: the step is waiting for them."""

    def kill() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            workers = pipelined_agent_loop_workers()
            if workers and ray.get(rollout.server.requests.remote()) >= sessions_requested:
                break
            time.sleep(0.2)
        for handle in workers:
            ray.kill(handle, no_restart=True)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(300)
def test_a_dead_agent_loop_worker_stops_the_step_waiting_for_generation(
    tmp_path, model_dir, rollout, transfer_queue, server
) -> None:
    """No chunk_timeout_s: the step waits for a batch whose one group generates for a minute, and the
    agent-loop worker running it is killed. The watchdog sees the death and the run stops naming the
    worker, instead of waiting forever."""
    rows = [(q, str(i + 1)) for i, q in enumerate(QUESTIONS[:4])]
    dataset = write_dataset(tmp_path / "train.parquet", rows)
    config = compose_v1_config(
        [
            *base_overrides(model_dir, dataset, steps=1, prompts=4, n=2),
            "trainer.v1.trainer_mode=pipelined",
            *schedule_flags("baseline"),  # the mode pipelines by default; this run is about the watchdog
            f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}",
            "reward.reward_manager.name=async_remote",
            f"+reward.async_reward.remote.url={server.url}/score",
            "trainer.val_before_train=false",
        ]
    )
    import async_reward.v1.pipelined.trainer  # noqa: F401

    script = {q: [f"The answer is {i + 1}", f"The answer is {i + 7}"] for i, q in enumerate(QUESTIONS[:4])}
    script[QUESTIONS[0]] = ["The answer is 1", "@@sleep:60@@The answer is 7"]
    ray.get(rollout.server.start.remote(script))  # its request count from zero before the killer reads it
    killer = kill_agent_loop_workers_once_generating(rollout, sessions_requested=8)
    with pytest.raises(AgentLoopWorkerDied) as error:
        run_v1_training(config, rollout, script, tmp_path / "metrics.jsonl")
    killer.join(timeout=10)
    message = str(error.value)
    assert "agent-loop worker 0 (Ray actor " in message and "died while the step waited" in message
    assert "to be generated" in message and "of its 4 group(s) not generated" in message
    assert isinstance(error.value.__cause__, ray.exceptions.RayActorError)
