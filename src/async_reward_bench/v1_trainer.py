"""verl's own v1 trainer (``sync``, ``colocate_async``) with calibrated GPU stages, on our reward path.

The schedule is verl 0.9.1's code, run unchanged: ``PPOTrainer.step`` (``prepare_step`` submits the
next batch; ``parameter_sync_step`` times ``_step_once``: ``on_sample_begin``, ``ReplayBuffer.sample``
/ ``ReplayBufferAsync.sample``, ``on_sample_end``, balance, old log-probs, reference, advantage,
actor update), the mode's hooks (``PPOTrainerSync``: sleep the replicas after sampling, sync weights
at step end; ``PPOTrainerColocateAsync``: ``num_warmup_batches`` submitted before the first step,
abort + sleep after sampling, sync weights and resume generation at step end) and the replay
buffers' selection, eviction and 2-second polling (time-scaled like every other duration).

Replaced, because they need GPUs or services this machine does not run:

* the GPU stages (``_compute_old_log_prob``, ``_compute_ref_log_prob``, ``_update_actor``) sleep the
  recipe's medians, shared out by the samples they get, as ``CalibratedBackend`` does for ours;
  ``_balance_batch`` is a no-op (one data-parallel rank); ``_compute_advantage`` runs verl's GRPO on
  the real scores;
* the dataloader (``_next_train_batch``) builds the benchmark's batches; ``_submit_batch_to_rollout``
  tags the prompts as verl does and hands them to :class:`~async_reward_bench.v1_agent_loop.
  V1AgentLoop` (generation as calibrated time, scoring real: verl's ``RewardLoopWorker`` actors
  running our manager);
* TransferQueue by :class:`~async_reward_bench.tag_store.TagStore`; the checkpoint manager's
  weight sync / sleep / abort / resume by switching the simulated engine. Weight sync costs no extra
  time: the legacy trainer's ``gen`` median, which the rollout makespan is, already includes it.
* ``separate_async`` (``PPOTrainerSeparateAsync``, standalone rollout GPUs, no hybrid replicas): the
  standalone checkpoint manager's once-a-step ``update_weights`` pauses the engine for the harness's
  ``weight_sync_s`` and resumes it (partial rollout); nothing else stops generation. The GPU split's
  slower stages come in through the harness's stages and durations (``gpu_split``). Its decoupled-PPO
  CPU snapshots of pi_old (``_compute_old_log_prob``) never run: ``_CalibratedStages`` comes first in
  the MRO.

``fit`` is not called (it also validates, checkpoints and logs); :func:`run_v1_steps` runs its loop
body: ``on_step_begin``, ``step``, ``on_step_end``, clear the step's keys.

Longer than 400 lines: verl's v1 trainers with their GPU stages replaced, one small subclass per
mode over the calibrated stages they share, so that what is replaced is read in one place.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from verl import DataProto
from verl.trainer.ppo.v1 import PPOTrainerColocateAsync, PPOTrainerSync
from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode, PPOTrainerSeparateAsync

from async_reward._core.result import DISPATCH_ORDER_KEY
from async_reward.training.schedule import StepRecord, TimelineEvent
from async_reward.v1.decoupled.trainer import PPOTrainerDecoupled
from async_reward.v1.pipelined.trainer import PPOTrainerPipelined
from async_reward.v1.replay_buffer import RewardReplayBuffer
from async_reward_bench.calibration import StageMedians
from async_reward_bench.gpu_split import SEPARATE_MODES
from async_reward_bench.tag_store import TagStore
from async_reward_bench.v1_agent_loop import PARTITION, V1AgentLoop

__all__ = ["V1Harness", "build_v1_trainer", "run_v1_steps"]

#: Least time between two polls of our v1 mode's trainer, in scaled (recipe) seconds: at most about
#: 200 tag listings a second of wall time at the default time scale, each about 1 ms of CPU.
POLL_GAP_S = 0.5
#: Least poll interval of the decoupled mode's sampler, in scaled (recipe) seconds. Its default is
#: 0.2 s of wall time (each poll lists the tags twice and tops up the window, about 3 ms of CPU here):
#: at the time scale that would be a poll every 2 ms, so the benchmark polls every recipe second
#: (coarser than the real default, never finer; the window is also topped up at every sample and
#: before every GPU stage, as the mode does).
DECOUPLED_POLL_S = 1.0


@dataclass
class V1Harness:
    """What the v1 trainer runs against instead of GPUs, a dataloader and TransferQueue."""

    stages: StageMedians
    """Time-scaled stage medians (``gen_s`` is the rollout makespan)."""
    factory: Any
    """``BatchFactory``: batch number -> verl ``DataProto``."""
    durations: Callable[[int, int], np.ndarray]
    """(batch number, samples) -> each sample's decoding time, real seconds."""
    agent_loop: V1AgentLoop
    store: TagStore
    reward_loop_manager: Any
    """verl's ``RewardLoopManager`` (its ``reward_loop_worker_handles`` score in the agent loop)."""
    time_scale: float
    weight_sync_s: float = 0.0
    """Real (time-scaled) seconds a separate mode's weight push pauses the engine and the trainer."""
    judge_wake_sleep_s: float | None = None
    """A judge on the training GPUs (``colocated_judge``): real (time-scaled) seconds its wake-up and
    sleep add to each scoring; the agent loop must then not score (``score_when_generated=False``).
    None: the judge scores each sample when generated (standalone, or an API)."""
    judge_timeout_s: float = 600.0
    """Real seconds a colocated judge's scoring of a batch may take before the run fails."""
    clock: Callable[[], float] = time.perf_counter
    sleep: Callable[[float], None] = time.sleep
    events: list[TimelineEvent] = field(default_factory=list)
    sample_windows: list[tuple[float, float]] = field(default_factory=list)
    update_sizes: list[int] = field(default_factory=list)
    """Samples per optimizer step, in order."""


@dataclass
class _PromptBatch:
    data: Any
    global_steps: int
    durations: np.ndarray
    """Each row's decoding time (real seconds), drawn per benchmark batch and sliced with its rows."""

    def __getitem__(self, key: str) -> list[str]:
        """``batch["uid"]``, as on verl's prompt batch: one uid per prompt (the rows here are sessions)."""
        if key != "uid":
            raise KeyError(key)
        return list(dict.fromkeys(str(u) for u in self.data.non_tensor_batch["uid"]))


class _EngineSwitch:
    """The trainer's ``checkpoint_manager``: weight sync, sleep, abort and resume switch the engine."""

    def __init__(self, agent_loop: V1AgentLoop) -> None:
        self.agent_loop = agent_loop

    def update_weights(self, global_steps: int | None = None) -> None:
        self.agent_loop.resume()  # the naive (colocated) backend wakes the replicas with new weights

    def sleep_replicas(self) -> None:
        self.agent_loop.pause()

    def abort_replicas(self, reject_request: bool = False) -> None:
        self.agent_loop.pause()  # partial rollout: aborted sequences resume later from their tokens

    def resume_generation_replicas(self) -> None:
        self.agent_loop.resume()


class _StandaloneSync:
    """A separate mode's ``standalone_checkpoint_manager``: ``update_weights`` (at init and at each
    step's end) pauses the standalone rollout, waits ``sync_s`` (the trainer blocks as in verl: its
    ``on_step_end`` is synchronous) and resumes it; sequences keep their progress (partial rollout)."""

    def __init__(self, harness: V1Harness) -> None:
        self.harness = harness

    def update_weights(self, global_steps: int | None = None) -> dict[str, Any]:
        bench = self.harness
        start = bench.clock()
        bench.agent_loop.pause()
        if bench.weight_sync_s > 0:
            bench.sleep(bench.weight_sync_s)
            step = (global_steps or 0) - 1  # at step s's end: the record of step s - 1 (0-based)
            bench.events.append(TimelineEvent("weight_sync", start, bench.clock(), step))
        bench.agent_loop.set_version(global_steps or 0)
        bench.agent_loop.resume()
        return {}


class _CalibratedStages:
    """verl ``PPOTrainer`` overrides: GPU stages as calibrated waits, data from the harness."""

    bench: V1Harness
    config: Any
    global_steps: int
    _bench_batches: int
    _prefetched: dict[int, Any]
    """Batches built before the run (verl's dataloader prefetches; building one here takes tens of
    milliseconds, seconds at the time scale, which the legacy backend hides inside its rollout)."""
    _leftover: tuple[Any, np.ndarray] | None = None
    """Rows (and their decoding times) of a benchmark batch not yet dispatched: async modes fetch any
    number of prompts (verl sets ``gen_batch_size=1`` there), e.g. to refill evicted groups."""

    def _batch_samples(self) -> int:
        return int(self.config.data.train_batch_size) * int(self.config.actor_rollout_ref.rollout.n)

    def _gpu(self, name: str, seconds: float, chunk: int | None = None) -> None:
        bench = self.bench
        start = bench.clock()
        left = start + seconds - bench.clock()
        if left > 0:
            bench.sleep(left)
        bench.events.append(TimelineEvent(name, start, bench.clock(), self.global_steps - 1, chunk))

    def _next_train_batch(self, num_prompts: int | None = None) -> _PromptBatch:
        train = int(self.config.data.train_batch_size)
        wanted = train if num_prompts is None else num_prompts
        gen = int(self.config.data.get("gen_batch_size", None) or train)
        if wanted <= 0 or wanted % gen:  # verl's rule
            raise ValueError(f"num_prompts ({wanted}) must be a positive multiple of gen_batch_size ({gen})")
        n = int(self.config.actor_rollout_ref.rollout.n)
        parts, times, have = [], [], 0
        while have < wanted:
            if self._leftover is None:
                number = self._bench_batches
                built = self._prefetched.pop(number, None)
                data = built if built is not None else self.bench.factory.make(number)
                self._leftover = (data, self.bench.durations(number, len(data)))
                self._bench_batches += 1
            data, durations = self._leftover
            take = min(len(data) // n, wanted - have)  # whole groups: the factory's rows come grouped
            if take * n == len(data):
                parts.append(data)
                times.append(durations)
                self._leftover = None
            else:
                parts.append(data[: take * n])
                times.append(durations[: take * n])
                self._leftover = (data[take * n :], durations[take * n :])
            have += take
        data = parts[0] if len(parts) == 1 else DataProto.concat(parts)
        return _PromptBatch(data, self.global_steps, np.concatenate(times))

    def _submit_batch_to_rollout(self, batch: _PromptBatch) -> int:
        uids = list(dict.fromkeys(str(u) for u in batch.data.non_tensor_batch["uid"]))
        # verl stamps each prompt with the step that dispatched it; the reward managers admit the
        # oldest step's samples first (``RewardSample.admission_priority``).
        steps = np.full(len(batch.data), self.global_steps, dtype=object)
        batch.data.non_tensor_batch["global_steps"] = steps
        tag = {"is_prompt": True, "status": "pending", "global_steps": self.global_steps}
        self.bench.store.kv_batch_put(keys=uids, partition_id=PARTITION, tags=[dict(tag) for _ in uids])
        self.bench.agent_loop.submit(batch.data, batch.durations, self.global_steps)
        return len(uids)

    def _balance_batch(
        self, batch: Any, metrics: dict, logging_prefix: str = "", keep_minibatch: bool = False
    ) -> Any:
        return batch

    def _compute_old_log_prob(self, batch: Any, metrics: dict) -> Any:
        self._gpu("prepare", self.bench.stages.old_log_prob_s * len(batch) / self._batch_samples())
        return batch

    def _compute_ref_log_prob(self, batch: Any, metrics: dict) -> Any:
        self._gpu("prepare", self.bench.stages.ref_s * len(batch) / self._batch_samples())
        return batch

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        start = self.bench.clock()
        values = self.bench.store.values(batch.keys, batch.partition_id)
        scores = torch.tensor([[v["score"]] for v in values], dtype=torch.float32)
        uids = np.array([key.split("_")[0] for key in batch.keys], dtype=object)
        compute_grpo_outcome_advantage(scores, torch.ones_like(scores), index=uids)
        metrics["critic/score/mean"] = float(scores.mean())
        self.bench.events.append(TimelineEvent("advantage", start, self.bench.clock(), self.global_steps - 1))
        return batch

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        # verl's update_actor splits the batch into ppo_mini_batch_size x n samples, one step each.
        mini = int(self.config.actor_rollout_ref.actor.ppo_mini_batch_size) * int(
            self.config.actor_rollout_ref.rollout.n
        )
        per_sample = self.bench.stages.update_actor_s / self._batch_samples()
        sizes = [min(mini, len(batch) - start) for start in range(0, len(batch), mini)]
        for i, size in enumerate(sizes):
            self._gpu("update", per_sample * size, chunk=i)
        self.bench.update_sizes.extend(sizes)
        return batch

    def on_sample_begin(self) -> None:
        super().on_sample_begin()  # type: ignore[misc]
        self._sample_started = self.bench.clock()

    def on_sample_end(self) -> None:
        self.bench.sample_windows.append((self._sample_started, self.bench.clock()))
        super().on_sample_end()  # type: ignore[misc]


class _BenchSync(_CalibratedStages, PPOTrainerSync):
    """verl's ``PPOTrainerSync`` (``trainer.v1.trainer_mode=sync``) with calibrated stages."""


class _BenchColocateAsync(_CalibratedStages, PPOTrainerColocateAsync):
    """verl's ``PPOTrainerColocateAsync`` (``trainer.v1.trainer_mode=colocate_async``)."""


class _BenchSeparateAsync(_CalibratedStages, PPOTrainerSeparateAsync):
    """verl's ``PPOTrainerSeparateAsync`` (``trainer.v1.trainer_mode=separate_async``) on standalone
    rollout GPUs only (``actor_rollout_ref.hybrid_engine=false``): its warm-up window, one batch
    dispatched per step, ``parameter_sync_step`` sample+update rounds, one weight push per step."""


class _BenchDecoupled(PPOTrainerDecoupled, _BenchSeparateAsync):
    """Our ``PPOTrainerDecoupled`` (``trainer.v1.trainer_mode=decoupled``). Its overrides come first in
    the MRO and reach the calibrated stages through ``super()``, as they reach verl's GPU stages: the
    ledger at each dispatch, the window's top-up at each step start, sample, poll and before each GPU
    stage, one weight push per step. The agent loop writes the progress tags the window reads
    (``V1AgentLoop(write_progress=True)``)."""

    announce = False


class _BenchPipelined(_CalibratedStages, PPOTrainerPipelined):
    """Our ``PPOTrainerPipelined`` (``trainer.v1.trainer_mode=pipelined``): its step, chunking and
    waits run unchanged against the tag store; reads of TransferQueue values it makes come from the
    store's values (every sample has loss tokens here: nothing is excluded)."""

    announce = False

    def _submit_batch_to_rollout(self, batch: _PromptBatch) -> int:
        rows = [str(u) for u in batch.data.non_tensor_batch["uid"]]
        uids = list(dict.fromkeys(rows))
        self._note_submitted(uids, [int(self.config.actor_rollout_ref.rollout.n)] * len(uids))
        # the mode's dispatch numbers (``number_dispatches``, one per prompt), on each session's row
        order = {uid: self._next_dispatch + i for i, uid in enumerate(uids)}
        self._next_dispatch += len(uids)
        batch.data.non_tensor_batch[DISPATCH_ORDER_KEY] = np.array([order[uid] for uid in rows], dtype=object)
        return super()._submit_batch_to_rollout(batch)

    def _loss_tokens(self, meta: Any) -> list[int]:
        return [1] * len(meta.keys)

    def _session_extras(self, meta: Any) -> list[dict[str, Any]]:
        return [dict(value["extras"]) for value in self.bench.store.values(meta.keys, meta.partition_id)]

    def _reward_blocked(self, start: float, end: float, chunk: int) -> None:
        self.bench.events.append(TimelineEvent("reward_wait", start, end, self.global_steps - 1, chunk))

    _writes_seen = 0
    _last_poll_at = -math.inf

    def _pause_between_polls(self) -> None:
        # The mode's default poll is 0.05 s of wall time, a rounding error against a step of minutes;
        # time-scaled it would be 0.5 ms here, and each poll lists every tag (about 1 ms of CPU). So
        # the next poll waits for a write to the store (nothing to see before one), at most the
        # scaled poll interval, and comes at least ``POLL_GAP`` scaled seconds after the last one:
        # a coarser poll than the real default, never a finer one. Only what is left of the gap is
        # slept: a write that comes after a quiet spell (the last sample of a chunk, typically) is
        # seen at once, as the real poll would see it within 0.05 s (the whole gap after every
        # wake-up cost up to 0.5 s a wait, 6 waits a step; about 1 s a step in balanced, measured
        # within one run's noise).
        self._writes_seen = self.bench.store.wait_for_write(self._writes_seen, timeout=self.poll_interval_s)
        left = POLL_GAP_S * self.bench.time_scale - (time.perf_counter() - self._last_poll_at)
        if left > 0:
            time.sleep(left)
        self._last_poll_at = time.perf_counter()


def build_v1_trainer(config: Any, harness: V1Harness, strategy: str | None = None) -> Any:
    """verl's v1 trainer of ``config.trainer.v1.trainer_mode``, wired to ``harness``."""
    classes: dict[str, type[Any]] = {
        "sync": _BenchSync,
        "colocate_async": _BenchColocateAsync,
        "pipelined": _BenchPipelined,
        "separate_async": _BenchSeparateAsync,
        "decoupled": _BenchDecoupled,
    }
    mode = str(config.trainer.v1.trainer_mode)
    if mode not in classes:
        raise ValueError(f"v1 trainer mode {mode!r} is not benchmarked; choose one of {sorted(classes)}")
    cls = classes[mode]
    if harness.judge_wake_sleep_s is not None:  # a judge on the training GPUs
        from async_reward_bench.colocated_judge import colocated_judge_class

        if harness.agent_loop.score_when_generated:
            raise ValueError(
                "a colocated judge needs an agent loop that does not score: score_when_generated=False"
            )
        cls = colocated_judge_class(cls, mode)
    trainer: Any = cls(config)
    trainer.bench_mode = strategy or mode
    trainer.bench = harness
    if mode == "pipelined":
        trainer._tq = harness.store
        # Its poll of TransferQueue's tags: woken by the store's writes (``_pause_between_polls``),
        # and at the latest after verl's replay-buffer poll interval (2 s), time-scaled.
        trainer.poll_interval_s = 2.0 * harness.time_scale
    trainer.reward_loop_manager = harness.reward_loop_manager
    if harness.judge_wake_sleep_s is not None:
        from async_reward_bench.colocated_judge import NO_WORKER_HANDLES

        trainer.reward_loop_manager = NO_WORKER_HANDLES  # verl's _step_once then scores the batch itself
    trainer.checkpoint_manager = _EngineSwitch(harness.agent_loop)
    if mode in SEPARATE_MODES:  # what _setup makes: the standalone rollout's weight sync, no hybrid
        trainer.standalone_checkpoint_manager = _StandaloneSync(harness)
        trainer.current_mode = HybridEngineMode.TRAINER
        trainer.prev_step_profile = False
    trainer.curr_step_profile = False
    trainer.global_steps = 0
    trainer._bench_batches = 0
    trainer._prefetched = {}
    trainer._leftover = None
    if isinstance(trainer.replay_buffer, RewardReplayBuffer):
        # Our RewardReplayBuffer (decoupled's, and the one our verl plugin implies under verl's own
        # modes with our managers) wraps the mode's sampler to add reward/* metrics and `exclude`
        # handling, reading values TransferQueue holds (the tag store serves tags only); every sample
        # here is scored ok and trains, so the benchmark samples through the mode's sampler itself.
        trainer.replay_buffer = trainer.replay_buffer._builtin
    if mode == "decoupled":
        trainer.replay_buffer.poll_interval = max(trainer.replay_buffer.poll_interval, DECOUPLED_POLL_S)
    # verl polls TransferQueue every poll_interval (2 s) of wall time: scale it like every duration.
    trainer.replay_buffer.poll_interval = trainer.replay_buffer.poll_interval * harness.time_scale
    return trainer


def run_v1_steps(trainer: Any, num_steps: int) -> Iterator[StepRecord]:
    """``PPOTrainer.fit``'s loop without validation, checkpoints and logging; one record per step.

    The caller wraps it in ``serving_replay_buffer(harness.store)``.
    """
    bench: V1Harness = trainer.bench
    train = int(trainer.config.data.train_batch_size)
    parts = (num_steps + 4) * max(1, train // bench.factory.prompts)  # + warm-up and fill batches
    trainer._prefetched = {i: bench.factory.make(i) for i in range(parts)}
    trainer.on_init_end()  # sync / colocate_async: update_weights, which wakes the engine
    trainer.global_steps = 1  # fit: "we start from step 1"
    trainer.total_training_steps = num_steps  # the pipelined mode generates nothing past the last step
    trainer.steps_per_epoch = num_steps  # (fit's last step is also bounded by total_epochs x this)
    trainer.on_train_begin()  # colocate_async: the warm-up batch(es)
    step_start = bench.clock()
    for _ in range(num_steps):
        metrics: dict[str, Any] = {}
        trainer.timing_raw = {}
        first = (len(bench.events), len(bench.sample_windows), len(bench.update_sizes))
        trainer.on_step_begin()
        batch = trainer.step(metrics, trainer.timing_raw)
        trainer.on_step_end()
        metrics.update(trainer._consume_sync_metrics())  # fit merges them into the step's log
        end = bench.clock()
        record = _record(trainer, batch, metrics, step_start, end, first)
        bench.store.kv_clear(keys=batch.keys, partition_id=batch.partition_id)  # fit: cleanup
        trainer.global_steps += 1
        yield record
        step_start = bench.clock()


def _record(
    trainer: Any,
    batch: Any,
    metrics: dict[str, Any],
    start: float,
    end: float,
    first: tuple[int, int, int],
) -> StepRecord:
    """The step's record, in the shape our schedule's records have (``report.summarize`` reads both)."""
    bench: V1Harness = trainer.bench
    step = trainer.global_steps - 1
    first_event, first_window, first_update = first
    events = list(bench.events[first_event:])
    busy = [(max(a, start), min(b, end)) for a, b in bench.agent_loop.busy if b > start and a < end]
    events += [TimelineEvent("rollout", a, b, step) for a, b in busy]
    for lo, hi in bench.sample_windows[first_window:]:
        events += [TimelineEvent("reward_wait", a, b, step) for a, b in _gaps(lo, hi, busy)]
    events.sort(key=lambda e: e.start)
    values = bench.store.values(batch.keys, batch.partition_id)
    statuses = [str(v["extras"].get("status", "ok")) for v in values]
    latencies = [float(v["extras"]["latency_s"]) for v in values if "latency_s" in v["extras"]]
    record_metrics = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
    for status in ("ok", "timeout", "error", "invalid"):
        record_metrics[f"reward/status_{status}"] = float(statuses.count(status))
    record_metrics["reward/latency_p50"] = float(np.median(latencies)) if latencies else math.nan
    submitted = [int(tag["global_steps"]) for tag in batch.tags]
    blocked = sum(e.duration for e in events if e.name == "reward_wait")
    return StepRecord(
        step=step,
        mode=str(getattr(trainer, "bench_mode", trainer.trainer_mode)),
        start=start,
        end=end,
        policy_version=min(submitted) - 1,
        trained_version=step,
        num_samples=len(batch.keys),
        chunk_sizes=bench.update_sizes[first_update:],
        reward_blocked_s=blocked,
        events=events,
        metrics=record_metrics,
    )


def _gaps(lo: float, hi: float, busy: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of [lo, hi] not covered by the (sorted, disjoint) ``busy`` intervals."""
    gaps, at = [], lo
    for a, b in busy:
        if b <= at or a >= hi:
            continue
        if a > at:
            gaps.append((at, a))
        at = max(at, b)
    if at < hi:
        gaps.append((at, hi))
    return gaps
