"""verl v1's TransferQueue agent loop with group post-processing and ``on_failure: exclude``.

``AgentLoopWorkerTQ`` runs the n sessions of a prompt together, scores each session through the
reward workers (where our managers run) and writes it to TransferQueue; once every session has
settled it tags the ``uid`` ``finished`` (or ``failure`` when a session raised) and the replay buffer
may hand the group out. Our worker changes only what happens between scoring and that write:

* **group post-processing**: each scored session waits at its group's :class:`GroupGate`; when all
  n sessions are scored (or ended without a score) ``post_process_scores`` runs once on the group,
  failed scores passed as NaN, before anything of the group is written;
* **exclude**: a session whose ``reward_extra_info`` says ``excluded=True`` (``on_failure: exclude``)
  is written with a zero ``response_mask`` / ``loss_mask`` and a ``uid`` of its own, exactly like
  verl's own padding samples (``verl.trainer.ppo.padding_utils``): it adds nothing to any loss, and
  group-relative advantages (GRPO, RLOO, ...) of its group come from the scored members only. It
  stays in the batch with its status, so the per-step metrics count it. A group left with fewer than
  two scored members trains on nothing (all its sessions are masked), as in the pipelined trainer.
  Validation is not trained on and keeps every session as scored.

And three things about scoring itself (:mod:`async_reward.v1.reward_failover`):

* **routing by group** (``judge.mode: group``): every session of a ``uid`` goes to the same live
  reward worker (``RewardWorkerPool.choose``), where its group is judged in one call;
* **least-loaded routing** (otherwise): verl sends each session to a reward worker drawn at
  random; ours goes to the live one with the fewest of this worker's sessions in flight. Each
  reward worker admits at most its share of the job-wide limits (``limits.max_concurrency`` per
  worker process), so a random draw leaves one worker's slots idle while another has a queue, and
  its oldest-first admission only orders what reached it (``limits.admission: job`` removes the
  split: one queue for the whole job, :mod:`async_reward._core.job_admission`). The choice is per task (a
  context variable read by the ``reward_loop_worker_handles`` property while verl's ``_compute_score`` runs
  in that task), so concurrent sessions of the worker never see each other's choice.
* **failover**: verl never restarts a reward worker; when one dies, a session whose call to it fails
  with ``RayActorError`` is scored again on a live one (scoring is idempotent; the judge may see the
  request twice) instead of failing its group, and the dead worker is never chosen again. The
  session's extras name the dead worker (``lost_reward_workers``), which the per-step metrics count.
  With no live worker left the session fails with :class:`~async_reward.v1.reward_failover.
  RewardWorkersLost` (``reward_workers_lost``) and so does this worker's next ``generate_sequences``,
  which stops the trainer with that cause rather than refilling failed groups for ever.

Everything else (generation, scoring, TransferQueue layout, failure tagging) is verl's.
"""

from __future__ import annotations

import asyncio
import logging
from contextvars import ContextVar
from functools import partial
from typing import Any

import numpy as np
import ray
import transfer_queue as tq
from omegaconf import DictConfig
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.utils import tensordict_utils as tu

from async_reward._core.config_rules import select_key
from async_reward._core.postprocess import apply_group_postprocessing
from async_reward._core.result import DISPATCH_ORDER_KEY
from async_reward.config import ConfigError
from async_reward.config.v1 import (
    REPLAY_BUFFER_NAME,
    REPLAY_BUFFER_PATH,
    uses_reward_replay_buffer,
)
from async_reward.judge.in_job.settings import colocated_judge
from async_reward.v1.checks import check_v1
from async_reward.v1.groups import GroupGate
from async_reward.v1.reward_failover import (
    LOST_WORKERS_KEY,
    RewardWorkerPool,
    RewardWorkersLost,
    SessionKillsRewardWorkers,
    is_unavailable,
)

__all__ = [
    "DRY_RUN_AGENT_LOOP_MANAGER",
    "DryRunAgentLoopManager",
    "RewardAgentLoopManager",
    "RewardAgentLoopWorker",
    "excluded_uid",
    "number_dispatches",
]

logger = logging.getLogger(__name__)

# verl decorates its worker with @ray.remote; subclass the class underneath and make ours an actor.
_VerlWorker: Any = AgentLoopWorkerTQ.__ray_actor_class__  # type: ignore[attr-defined]

#: The reward worker chosen for the session being scored in the current task (None: no choice made,
#: verl's handles are seen whole). Per task, because every session of a worker shares the object.
_CHOSEN_REWARD_WORKER: ContextVar[Any] = ContextVar("async_reward_chosen_reward_worker", default=None)


def excluded_uid(uid: str, session_id: int) -> str:
    """The ``uid`` field an excluded session gets: its own GRPO group, so it moves no group statistic
    (its TransferQueue key, and so its group membership in the replay buffer, keep the real uid)."""
    return f"{uid}/excluded/{session_id}"


#: Times a session is sent again after ``ActorUnavailableError`` (a reward worker out of reach for the
#: moment), pausing ``UNAVAILABLE_PAUSE_S`` x the attempt before each; then the error fails the session.
UNAVAILABLE_RETRIES = 5
UNAVAILABLE_PAUSE_S = 0.5


class RewardAgentLoopWorker(_VerlWorker):
    """``AgentLoopWorkerTQ`` whose sessions pass their group's gate between scoring and TransferQueue."""

    #: ``judge.mode: group``: a session goes to the reward worker chosen for its ``uid``, where its
    #: group's members meet to be judged in one call (``managers.group_scoring``).
    _route_by_group: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.reward_loop_worker_handles = None  # verl's __init__ sets the real ones
        super().__init__(*args, **kwargs)
        self._gates: dict[str, GroupGate] = {}
        self._route_by_group = select_key(self.config, "reward.async_reward.judge.mode") == "group"

    @property
    def reward_loop_worker_handles(self) -> list[Any] | None:
        """verl's reward-worker handles, or only the one chosen for the current task's session."""
        chosen = _CHOSEN_REWARD_WORKER.get()
        return [chosen] if chosen is not None else self._reward_handles

    @reward_loop_worker_handles.setter
    def reward_loop_worker_handles(self, handles: list[Any] | None) -> None:
        self._reward_handles = list(handles) if handles is not None else None
        self._reward_pool = RewardWorkerPool(self._reward_handles) if self._reward_handles else None

    async def generate_sequences(self, batch: Any) -> None:
        """verl's dispatch, refused once every reward worker is known dead: the trainer's
        ``ray.get`` on it then raises :class:`RewardWorkersLost`, so the run stops with that cause
        instead of refilling groups that can never be scored."""
        pool = self._reward_pool
        if pool is not None and not pool.live():
            raise RewardWorkersLost(pool.lost_message())
        await super().generate_sequences(batch)

    async def _compute_score(self, outputs: list[Any], kwargs: dict[str, Any]) -> None:
        """verl's scoring call, sent to the live reward worker with the fewest of our sessions in
        flight (ties go round-robin) instead of a random one, and sent again to another live one
        when the chosen worker turns out dead: once. A second death while scoring the same session
        fails that session (:class:`SessionKillsRewardWorkers`, its group is replaced), so a response
        that kills its scorer cannot take every worker down. A worker out of reach for the moment
        (``ActorUnavailableError``) is not dead: the session waits and is sent again."""
        pool = self._reward_pool
        if pool is None or not outputs or outputs[-1].reward_score is not None:
            await super()._compute_score(outputs, kwargs)
            return
        lost: list[str] = []
        unavailable = 0
        while True:
            group = str(kwargs.get("uid")) if self._route_by_group else None
            index = pool.choose(group)  # raises RewardWorkersLost when none is live
            pool.in_flight[index] += 1
            token = _CHOSEN_REWARD_WORKER.set(pool.handles[index])
            try:
                await super()._compute_score(outputs, kwargs)
            except Exception as error:
                if is_unavailable(error) and unavailable < UNAVAILABLE_RETRIES:
                    # Ray: "may be available later". The worker keeps its place; the session waits
                    # and goes to the least-loaded live worker again (this one or another).
                    unavailable += 1
                    await asyncio.sleep(UNAVAILABLE_PAUSE_S * unavailable)
                    continue
                if not pool.is_death_of(error, index):
                    raise
                if lost:  # a second worker died while scoring this session: fail it, go no further
                    pool.mark_dead(index)
                    if not pool.live():
                        raise RewardWorkersLost(pool.lost_message()) from error
                    raise SessionKillsRewardWorkers(
                        f"session {kwargs.get('uid')}_{kwargs.get('session_id')} was being scored when "
                        f"reward workers {lost[0]} and {pool.names[index]} died; it is failed (its group "
                        "is replaced) rather than sent to another, so that a response that kills its "
                        "scorer cannot take down every reward worker"
                    ) from error
                if pool.mark_dead(index):
                    logger.error(
                        "reward worker %s died (%s); it gets no more sessions, %d of %d left",
                        pool.names[index],
                        type(error).__name__,
                        len(pool.live()),
                        len(pool.handles),
                    )
                lost.append(pool.names[index])
                continue  # verl assigns the score only after the call returned: nothing to undo
            finally:
                _CHOSEN_REWARD_WORKER.reset(token)
                pool.in_flight[index] -= 1
            break
        if lost:
            self._record_rescore(outputs[-1], kwargs, lost)

    @staticmethod
    def _record_rescore(output: Any, kwargs: dict[str, Any], lost: list[str]) -> None:
        """Name the dead workers in the re-scored session's extras, for ``reward/rescored_sessions``
        and ``reward/worker_deaths``."""
        info = output.extra_fields.get("reward_extra_info")
        if isinstance(info, dict):  # in place: our managers' ScoredFloat shares this dict
            info[LOST_WORKERS_KEY] = ",".join(dict.fromkeys(lost))
        logger.warning(
            "session %s_%s re-scored on a live reward worker after %d dead one(s)",
            kwargs.get("uid"),
            kwargs.get("session_id"),
            len(lost),
        )

    async def _run_prompt(
        self,
        prompt: dict[str, Any],
        sampling_params: dict[str, Any],
        trajectory: dict[str, Any],
        trace: bool = False,
    ) -> None:
        uid = str(prompt["uid"])
        try:
            self._gates[uid] = GroupGate(
                self._group_size(prompt, trajectory), partial(_postprocess_group, uid)
            )
        except Exception:  # verl's _run_prompt reads the same size and tags the group failed if it cannot
            logger.exception("group %s runs without post-processing: its size is unknown", uid)
        try:
            await super()._run_prompt(prompt, sampling_params, trajectory, trace)
        finally:
            self._gates.pop(uid, None)

    async def _run_agent_loop(
        self,
        sampling_params: dict[str, Any],
        trajectory: dict[str, Any],
        *,
        agent_name: str,
        trace: bool = True,
        **kwargs: Any,
    ) -> Any:
        try:
            return await super()._run_agent_loop(
                sampling_params, trajectory, agent_name=agent_name, trace=trace, **kwargs
            )
        finally:
            # A session that raised (its group will be tagged ``failure``) or was cancelled must not
            # keep its siblings waiting; after arriving this is a no-op.
            gate = self._gates.get(str(kwargs.get("uid")))
            if gate is not None:
                gate.leave(int(kwargs["session_id"]))

    async def _agent_loop_postprocess(self, output: Any, validate: bool, **kwargs: Any) -> None:
        outputs = output if isinstance(output, list) else [output]
        uid, session_id = str(kwargs["uid"]), int(kwargs["session_id"])
        gate = self._gates.get(uid)
        if not outputs:
            await super()._agent_loop_postprocess(output, validate, **kwargs)
            return
        await self._compute_score(outputs, kwargs=kwargs)  # verl's streaming reward call; a no-op later
        final = outputs[-1]
        flagged = is_excluded(final.extra_fields.get("reward_extra_info"))
        # No gate only when the group's size could not be read, and then verl's _run_prompt fails the
        # group before any session starts; were one to get here anyway, an excluded session is still
        # masked (fail closed), it only misses group post-processing.
        if gate is not None:
            final.reward_score = await gate.arrive(session_id, final.reward_score, excluded=flagged)
        # A group left with fewer than two scored members trains on nothing, as in the pipeline.
        exclude = not validate and (flagged or (gate is not None and gate.starved))
        if exclude:
            for item in outputs:  # verl writes loss_mask = response_mask
                item.response_mask = [0] * len(item.response_mask)
        await super()._agent_loop_postprocess(output, validate, **kwargs)
        if exclude:
            keys = [f"{uid}_{session_id}_{index}" for index in range(len(outputs))]
            own_uid: dict[str, Any] = {
                "uid": np.array([excluded_uid(uid, session_id)] * len(keys), dtype=object)
            }
            # Written before _run_prompt tags the group terminal, so no sampled batch sees the old uid.
            await tq.async_kv_batch_put(keys=keys, partition_id="train", fields=tu.get_tensordict(own_uid))

    def _group_size(self, prompt: dict[str, Any], trajectory: dict[str, Any]) -> int:
        """Sessions ``_run_prompt`` starts for this prompt (it pops the same key with this default)."""
        rollout = self.rollout_config
        default = rollout.val_kwargs.n if trajectory["validate"] else rollout.n
        return int(prompt.get("__rollout_n__", default))


RewardAgentLoopWorkerActor: Any = ray.remote(RewardAgentLoopWorker)


class RewardAgentLoopManager(AgentLoopManagerTQ):
    """verl v1's ``AgentLoopManagerTQ`` running :class:`RewardAgentLoopWorker` actors.

    Name it with ``+actor_rollout_ref.rollout.agent.agent_loop_manager_class=
    async_reward.v1.RewardAgentLoopManager``; verl's ``TaskRunnerV1`` builds it with ``create``.
    Refused at start-up where it cannot do its job: the legacy trainer and the settings
    :func:`~async_reward.v1.checks.check_v1` refuses. With a judge on the training GPUs (no reward
    workers handed over) the sessions are scored after sampling, by the setup hook's colocated step.
    """

    def __init__(
        self,
        config: DictConfig,
        llm_client: Any,
        teacher_client: Any = None,
        reward_loop_worker_handles: list[Any] | None = None,
    ) -> None:
        if not config.trainer.get("use_v1", False):
            raise ConfigError(
                "async_reward.v1.RewardAgentLoopManager runs under verl's v1 trainer only "
                "(trainer.use_v1=true); the legacy trainer takes a non-TransferQueue agent-loop manager"
            )
        check_v1(config)
        if reward_loop_worker_handles is None and not colocated_judge(config):
            raise ConfigError(
                "async_reward.v1.RewardAgentLoopManager got no reward workers, and no judge on the "
                "training GPUs scores after sampling (reward.reward_model.enable without "
                "enable_resource_pool): nothing would score the sessions"
            )
        # With a colocated judge the agent loop scores nothing: verl scores each sampled mini-batch
        # after generation (async_reward.v1.colocated_judge, installed by the setup hook).
        super().__init__(config, llm_client, teacher_client, reward_loop_worker_handles)
        self.agent_loop_workers_class = RewardAgentLoopWorkerActor  # after super(): it sets verl's
        from async_reward.v1.pipelined.config import is_pipelined_mode

        if not uses_reward_replay_buffer(config) and not is_pipelined_mode(config):
            logger.warning(
                "async-reward under verl v1 without its replay buffer: training steps will not log "
                "reward/* metrics; add trainer.v1.sampler.custom_sampler.path=%s and .name=%s",
                REPLAY_BUFFER_PATH,
                REPLAY_BUFFER_NAME,
            )


def is_excluded(reward_extra_info: Any) -> bool:
    """Whether a session's extras mark it ``excluded`` (``on_failure: exclude``); a real bool only."""
    if not isinstance(reward_extra_info, dict):
        return False
    value = reward_extra_info.get("excluded")
    return isinstance(value, bool | np.bool_) and bool(value)


def _postprocess_group(uid: str, scores: list[Any]) -> list[Any]:
    """Our managers' group post-processing for one group (a no-op unless a score names a
    ``post_process_scores``); scores an agent loop left unset stay as they are."""
    if any(score is None for score in scores):
        return scores
    return apply_group_postprocessing([uid] * len(scores), scores)


#: The agent-loop manager a dry run hands verl's task runner: it starts nothing.
DRY_RUN_AGENT_LOOP_MANAGER = "async_reward.v1.agent_loop.DryRunAgentLoopManager"


class DryRunAgentLoopManager:
    """What a dry run hands verl's task runner instead of an agent-loop manager: nothing starts."""

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> DryRunAgentLoopManager:
        return cls()


def number_dispatches(prompts: Any, first: int) -> int:
    """Number ``prompts`` (a verl prompt batch) from ``first`` in their order, as the
    :data:`~async_reward._core.result.DISPATCH_ORDER_KEY` field; returns the next number.

    verl's agent-loop worker hands each prompt field to every session's kwargs, and its
    ``_compute_score`` puts the kwargs into the reward request's non-tensor batch, where our managers
    read it into ``RewardSample.dispatch_order``: within one policy version, each reward worker admits
    the earliest-dispatched group first (``admission_priority``)."""
    count = len(prompts)
    tu.assign_non_tensor_stack(prompts, DISPATCH_ORDER_KEY, list(range(first, first + count)))
    return first + count
