"""verl's v1 agent loop, as the benchmark runs it: generation is time, scoring is real.

What verl 0.9.1 does (``verl/trainer/ppo/v1/agent_loop_tq.py``): ``AgentLoopWorkerTQ._run_prompt`` tags a
prompt group ``running``, starts its ``rollout.n`` sessions, and each session, once its generation
finishes, is scored at once (``AgentLoopWorker._compute_score``: one ``compute_score.remote`` call to a
randomly chosen ``RewardLoopWorker`` with a one-sample ``DataProto``; our agent-loop worker takes the
least-loaded one instead, which this model does not credit: it draws at random as verl does) and
written to TransferQueue as a trajectory (``_agent_loop_postprocess``, tag ``success``). When every
session has settled the group becomes ``finished`` (``failure`` if one raised), and only then can the
replay buffer sample it.

Here the same happens with the LLM server replaced by :class:`~async_reward_bench.generation.
GenerationState` driven in (time-scaled) real time, and everything after generation real: verl's
``RewardLoopWorker`` (:class:`~async_reward_bench.v1_reward_worker.HeldBatchRewardWorker`, told
in bulk which samples finished rather than one Ray call each, see there) running our manager, HTTP
to the judge, tags in a :class:`~async_reward_bench.tag_store.TagStore` that verl's own replay
buffer reads. The trainer switches the engine with :meth:`pause` / :meth:`resume` (a colocated GPU
either generates or trains); scoring continues while it is paused, as verl's reward workers do.

With a judge on the training GPUs (``score_when_generated=False``, verl's
``reward.reward_model.enable_resource_pool=false``) the agent loop scores nothing: a group is
``finished`` once generated, and the trainer scores the batch it sampled with :meth:`score_now`
(verl's ``_compute_reward_colocate``), through the same reward workers.

One asyncio loop in a thread holds the engine and the reward workers' result streams (verl's
agent-loop workers are asyncio actors too); the trainer talks to it from its own thread.

Longer than 400 lines: one class, the model of verl's agent loop (groups, sessions, generation as
time, scoring as real calls), whose state lives on one event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from async_reward_bench.generation import GenerationState
from async_reward_bench.tag_store import TagStore

__all__ = ["V1AgentLoop"]

logger = logging.getLogger(__name__)
PARTITION = "train"


@dataclass
class _Group:
    """One prompt and its sessions (``AgentLoopWorkerTQ._run_prompt``)."""

    uid: str
    global_steps: int
    sessions_left: int
    failed: bool = False
    generated: int = 0
    """Sessions out of generation (``gen_done`` of the decoupled mode's progress tag)."""
    unscored: int = 0
    """Sessions generated and not yet scored (``unscored``)."""
    version: int | None = None
    """Oldest policy version that generated a token of the group (``gen_version``)."""
    size: int = 0
    """All its sessions (``gen_n``)."""

    def progress(self) -> dict[str, Any]:
        """The decoupled mode's progress tag (``async_reward.v1.decoupled.window``)."""
        tag: dict[str, Any] = {"gen_done": self.generated, "gen_n": self.size, "unscored": self.unscored}
        if self.version is not None:
            tag["gen_version"] = self.version
        return tag


@dataclass(frozen=True, eq=False)
class _Session:
    """One of a group's ``rollout.n`` sessions: row ``row`` of the batch held under ``key`` by
    reward worker number ``worker`` (hashed by identity)."""

    key: str
    worker: int
    row: int
    group: _Group
    session: int


class V1AgentLoop:
    """Generates submitted prompt groups on a simulated engine and scores each sample as it finishes.

    Args:
        reward_workers: ``HeldBatchRewardWorker`` actor handles; each sample goes to a random one,
            as verl's agent loop picks a ``RewardLoopWorker`` per sample.
        store: where group and trajectory tags go (what the replay buffer reads).
        full_speed_slots: sequences the engine decodes at full speed (see ``GenerationState``).
        seed: seed of the reward-worker choice.
        clock: monotonic seconds, shared with the trainer's timeline.
        write_when_generated: tag each trajectory in the store as soon as it is generated (before it
            is scored), as :class:`~async_reward.v1.pipelined.agent_loop.PipelinedAgentLoopWorker` does.
        write_progress: keep each group's progress on its prompt tag (``gen_done`` / ``gen_n`` /
            ``unscored`` / ``gen_version``), as the decoupled mode's agent-loop worker does
            (``async_reward.v1.decoupled.agent_loop``).
        score_when_generated: score each sample when its generation ends (a standalone judge or an
            API); False: a judge on the training GPUs, scored only by :meth:`score_now`.
    """

    def __init__(
        self,
        reward_workers: list[Any],
        store: TagStore,
        *,
        full_speed_slots: int,
        seed: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        write_when_generated: bool = False,
        write_progress: bool = False,
        score_when_generated: bool = True,
    ) -> None:
        if not reward_workers:
            raise ValueError("need at least one reward worker")
        self.reward_workers = list(reward_workers)
        self.store = store
        self.write_when_generated = write_when_generated
        self.write_progress = write_progress
        self.score_when_generated = score_when_generated
        self.version = 0
        """Policy version of the engine's weights (``set_version``: each weight push)."""
        self.clock = clock
        self.engine = GenerationState(full_speed_slots)
        self.busy: list[tuple[float, float]] = []
        """Intervals in which the engine was decoding (the GPU busy generating)."""
        self.events: list[tuple[float, str, int]] = []
        """``(time, "generated" | "scored", global_steps)`` per sample, in order."""
        self._rng = random.Random(seed)
        self._running = False
        self._closed = False
        self._last = clock()
        self._commands: list[tuple[float, Callable[[], None]]] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="v1-agent-loop", daemon=True)
        self._wake = asyncio.Event()
        self._tasks: list[Any] = []
        self._sender = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="v1-batch-sender")
        self._sends: list[concurrent.futures.Future[Any]] = []
        self._batches = 0
        self._started: dict[_Session, int] = {}
        """Sessions decoding -> the policy version of their first token (partial rollout keeps it)."""
        self._scoring: dict[tuple[str, int], _Session] = {}
        self._generated: dict[str, _Session] = {}
        """Colocated judge: sessions generated and not yet scored, by trajectory key."""
        self._wanted: set[str] = set()
        """Colocated judge: trajectory keys :meth:`score_now` waits for."""
        self._wanted_done: concurrent.futures.Future[None] | None = None
        """Samples handed to a reward worker, by (batch key, row)."""
        self._left: dict[str, tuple[int, set[int]]] = {}
        """Batch key -> (sessions not yet settled, reward workers holding its rows)."""

    # -- the trainer's side (any thread) ------------------------------------------------------------

    def start(self) -> V1AgentLoop:
        self._thread.start()
        self._tasks.append(asyncio.run_coroutine_threadsafe(self._run_engine(), self._loop))
        for worker in range(len(self.reward_workers)):
            self._tasks.append(asyncio.run_coroutine_threadsafe(self._collect(worker), self._loop))
        return self

    def submit(self, batch: Any, durations_s: np.ndarray, global_steps: int, group_key: str = "uid") -> None:
        """Start generating ``batch`` (a verl ``DataProto``, one row per session, grouped by
        ``group_key``); row ``i`` needs ``durations_s[i]`` seconds of decoding at full speed.

        Each row's reward worker is drawn now (verl draws it when the sample is scored: the same
        distribution) and is sent its rows by a sender thread while generation starts."""
        import ray

        self.check()
        uids = [str(u) for u in batch.non_tensor_batch[group_key]]
        if len(durations_s) != len(uids):
            raise ValueError(f"{len(durations_s)} durations for {len(uids)} samples")
        key = f"{global_steps}:{self._batches}"
        self._batches += 1
        workers = [self._rng.randrange(len(self.reward_workers)) for _ in uids]
        rows_of = {w: [row for row, chosen in enumerate(workers) if chosen == w] for w in set(workers)}

        # Sent from a thread of its own, so generation starts now: slicing and pickling a batch for the
        # reward workers takes tens of milliseconds, seconds at the time scale, which verl spends on
        # its agent-loop workers in real time (nothing against a step of minutes). A row enqueued
        # before its batch arrived waits for it in the worker.
        def send() -> Any:
            return ray.get([self.reward_workers[w].hold.remote(key, batch[r], r) for w, r in rows_of.items()])

        self._sends.append(self._sender.submit(send))
        groups: dict[str, _Group] = {}
        sessions: list[tuple[_Session, float]] = []
        for row, uid in enumerate(uids):
            group = groups.setdefault(uid, _Group(uid, global_steps, 0))
            sessions.append(
                (_Session(key, workers[row], row, group, group.sessions_left), float(durations_s[row]))
            )
            group.sessions_left += 1
            group.size += 1

        def start() -> None:
            self._left[key] = (len(uids), set(rows_of))
            for uid, group in groups.items():
                tag: dict[str, Any] = {"status": "running"}
                if self.write_progress:
                    tag |= group.progress()
                self.store.kv_put(uid, PARTITION, tag=tag)
            for session, work in sessions:
                self.engine.add(session, work)
                self._started[session] = self.version

        self._post(start)

    def set_version(self, version: int) -> None:
        """New weights in the engine (a weight push): tokens decoded from now on are ``version``'s."""
        self._post(lambda: setattr(self, "version", version))

    def pause(self) -> None:
        """Stop decoding (``sleep_replicas`` / ``abort_replicas``: sequences keep their progress)."""
        self._post(lambda: setattr(self, "_running", False))

    def resume(self) -> None:
        """Decode again (``update_weights`` wakes the replicas; ``resume_generation_replicas``)."""
        self._post(lambda: setattr(self, "_running", True))

    def score_now(self, keys: list[str]) -> concurrent.futures.Future[None]:
        """Score the generated sessions ``keys`` (trajectory keys ``{uid}_{session}_0``) now, all at
        once: a colocated judge's batch (``score_when_generated=False``). The future is done when
        every one is scored, and fails if one raised or is not generated."""
        if self.score_when_generated:
            raise RuntimeError("score_now is for a colocated judge: the agent loop scores each sample itself")
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def start() -> None:
            missing = [key for key in keys if key not in self._generated]
            if missing:
                done.set_exception(KeyError(f"not generated (or scored already): {missing[:3]}"))
                return
            self._wanted, self._wanted_done = set(keys), done
            if not keys:
                done.set_result(None)
            rows: dict[tuple[int, str], list[int]] = defaultdict(list)
            for key in keys:
                session = self._generated.pop(key)
                self._scoring[(session.key, session.row)] = session
                rows[(session.worker, session.key)].append(session.row)
            for (worker, batch), chosen in rows.items():
                self.reward_workers[worker].enqueue.remote(batch, chosen)

        self._post(start)
        return done

    def check(self) -> None:
        """Raise if the engine or a result stream died (its error would otherwise only show as a
        batch that never finishes)."""
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError("the v1 agent loop stopped") from task.exception()
        for send in [s for s in self._sends if s.done()]:
            self._sends.remove(send)
            if send.exception() is not None:
                raise RuntimeError("sending a batch to the reward workers failed") from send.exception()

    def close(self, timeout: float = 60.0) -> None:
        """Drop what is still generating, cancel the scoring in flight, stop the loop."""
        if not self._thread.is_alive():
            return
        self._sender.shutdown(wait=True)
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout)
        for task in self._tasks:  # each returns once it sees the loop is closed
            with contextlib.suppress(Exception):
                task.result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()

    # -- the loop's side --------------------------------------------------------------------------

    def _post(self, command: Callable[[], None]) -> None:
        self.check()
        with self._lock:
            self._commands.append((self.clock(), command))
        self._loop.call_soon_threadsafe(self._wake.set)

    async def _run_engine(self) -> None:
        while not self._closed:
            timeout = self.engine.time_to_next() if self._running else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            with self._lock:
                commands, self._commands = self._commands, []
            for at, command in commands:
                self._advance_to(at)
                command()
            self._advance_to(self.clock())

    def _advance_to(self, now: float) -> None:
        start, self._last = self._last, max(self._last, now)
        if not self._running or not len(self.engine) or self._last <= start or self._closed:
            return
        if self.busy and self.busy[-1][1] == start:
            self.busy[-1] = (self.busy[-1][0], self._last)
        else:
            self.busy.append((start, self._last))
        finished: dict[tuple[int, str], list[int]] = defaultdict(list)
        for session in self.engine.advance(self._last - start):
            assert isinstance(session, _Session)
            self.events.append((self._last, "generated", session.group.global_steps))
            first = self._started.pop(session, self.version)
            if not self.score_when_generated:  # colocated judge: done once generated, scored later
                self._generated_unscored(session)
                continue
            self._scoring[(session.key, session.row)] = session
            if self.write_progress:
                group = session.group
                group.generated += 1
                group.unscored += 1
                group.version = first if group.version is None else min(group.version, first)
                self.store.kv_put(group.uid, PARTITION, tag=group.progress())
            if self.write_when_generated:
                self.store.kv_put(
                    f"{session.group.uid}_{session.session}_0",
                    PARTITION,
                    tag={"status": "success", "global_steps": session.group.global_steps, "seq_len": 1},
                )
            finished[(session.worker, session.key)].append(session.row)
        for (worker, key), rows in finished.items():  # one call per worker and batch, not per sample
            self.reward_workers[worker].enqueue.remote(key, rows)

    async def _collect(self, worker: int) -> None:
        """Results of one reward worker, as they come: ``_agent_loop_postprocess`` of each session,
        then the group's status once its last session settled (``_run_prompt``)."""
        handle = self.reward_workers[worker]
        while not self._closed:
            for key, row, result, error in await handle.collect.remote(0.5):
                session = self._scoring.pop((key, row), None)
                if session is None:  # a result of a run already closed
                    continue
                group = session.group
                if error is not None:  # the session raised: verl marks the whole group failed
                    logger.warning("scoring %s session %d raised: %s", group.uid, session.session, error)
                    group.failed = True
                else:
                    assert result is not None
                    self.events.append((self.clock(), "scored", group.global_steps))
                    self.store.kv_put(
                        f"{group.uid}_{session.session}_0",
                        PARTITION,
                        fields={
                            "score": float(result["reward_score"]),
                            "extras": dict(result["reward_extra_info"]),
                        },
                        tag={"status": "success", "global_steps": group.global_steps},
                    )
                if not self.score_when_generated:
                    self._colocated_scored(f"{group.uid}_{session.session}_0", error)
                    self._settled(key)
                    continue
                group.sessions_left -= 1
                group.unscored -= 1
                if group.sessions_left == 0:
                    status = "failure" if group.failed else "finished"
                    self.store.kv_put(group.uid, PARTITION, tag={"status": status, **self._progress(group)})
                elif self.write_progress:
                    self.store.kv_put(group.uid, PARTITION, tag=group.progress())
                self._settled(key)

    def _generated_unscored(self, session: _Session) -> None:
        """A colocated judge's session out of generation: a trajectory without a score yet, and its
        group ``finished`` (sampleable) once every session is generated, as verl's agent loop tags
        them when the reward model is colocated."""
        group = session.group
        key = f"{group.uid}_{session.session}_0"
        self._generated[key] = session
        self.store.kv_put(key, PARTITION, tag={"status": "success", "global_steps": group.global_steps})
        group.sessions_left -= 1
        if group.sessions_left == 0:
            self.store.kv_put(group.uid, PARTITION, tag={"status": "finished"})

    def _colocated_scored(self, key: str, error: str | None) -> None:
        done = self._wanted_done
        if done is None or key not in self._wanted or done.done():
            return
        if error is not None:
            done.set_exception(RuntimeError(f"scoring {key} raised: {error}"))
            return
        self._wanted.discard(key)
        if not self._wanted:
            done.set_result(None)

    def _progress(self, group: _Group) -> dict[str, Any]:
        return group.progress() if self.write_progress else {}

    def _settled(self, key: str) -> None:
        left, holders = self._left[key]
        if left > 1:
            self._left[key] = (left - 1, holders)
            return
        del self._left[key]
        for worker in holders:
            self.reward_workers[worker].release.remote(key)

    async def _shutdown(self) -> None:
        self._closed = True  # the result streams see it within their 0.5 s long poll
        self._wake.set()
        self.engine.clear()
        self._started.clear()
        self._scoring.clear()
        self._generated.clear()
        if self._wanted_done is not None and not self._wanted_done.done():
            self._wanted_done.set_exception(RuntimeError("the agent loop closed"))
        self._left.clear()
        await asyncio.gather(*(w.cancel_all.remote() for w in self.reward_workers), return_exceptions=True)
