"""Hold each scored session of a ``uid`` group until the whole group is scored, then post-process it.

verl v1 runs the n sessions of a prompt together (``AgentLoopWorkerTQ._run_prompt``) and scores each
one as it finishes; the group becomes sampleable only after every session has settled. A
:class:`GroupGate` sits between scoring and the write to TransferQueue: every session arrives with
its score, and once all n are accounted for (scored, or ended without a score) the group's scores
are post-processed once and every waiting session continues with its own value. So the replay
buffer never sees a group whose scores are still to change, and the gate never waits longer than
the sessions themselves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from async_reward.training.exclusion import MIN_SCORED_PER_GROUP

__all__ = ["GroupGate", "GroupPostprocessor"]

logger = logging.getLogger(__name__)

#: Post-processes one complete group: the members' scores in session order -> their new scores.
GroupPostprocessor = Callable[[Sequence[Any]], Sequence[Any]]


class GroupGate:
    """The rendezvous of one ``uid`` group's sessions (all in one event loop, so no lock).

    Args:
        size: Sessions in the group (``rollout.n`` or the prompt's ``__rollout_n__``).
        postprocess: Applied once to the scores of the members that arrived.
    """

    def __init__(self, size: int, postprocess: GroupPostprocessor) -> None:
        if size < 1:
            raise ValueError(f"a group has at least one session, got {size}")
        self.size = size
        self._postprocess = postprocess
        self._scores: dict[int, Any] = {}
        self._excluded: set[int] = set()
        self._absent: set[int] = set()
        self._results: dict[int, Any] = {}
        self._complete = asyncio.Event()

    @property
    def complete(self) -> bool:
        """Every session has arrived or left."""
        return self._complete.is_set()

    @property
    def starved(self) -> bool:
        """The group lost members to ``on_failure: exclude`` and kept fewer than
        :data:`~async_reward.training.exclusion.MIN_SCORED_PER_GROUP` scored ones: as in the pipelined
        trainer, none of it trains (a group-relative advantage of one sample is not defined; verl's
        GRPO would give it its raw score). Meaningful once :attr:`complete`."""
        scored = len(self._scores) - len(self._excluded)
        return bool(self._excluded) and scored < MIN_SCORED_PER_GROUP

    async def arrive(self, session_id: int, score: Any, excluded: bool = False) -> Any:
        """Wait until every session is accounted for; return this session's post-processed score.

        ``excluded``: the session's reward failed under ``on_failure: exclude`` (see :attr:`starved`).
        A session beyond the group's size (the gate already open) keeps its score unchanged.
        """
        if session_id in self._scores or session_id in self._absent:
            raise RuntimeError(f"session {session_id} arrived twice at its group gate")
        if self._complete.is_set():
            logger.error("session %d arrived after its group of %d was complete", session_id, self.size)
            return score
        self._scores[session_id] = score
        if excluded:
            self._excluded.add(session_id)
        self._close_if_complete()
        await self._complete.wait()
        return self._results[session_id]

    def leave(self, session_id: int) -> None:
        """A session ended without arriving (it raised, was cancelled or produced no output).

        A no-op for a session that already arrived, so it may be called unconditionally on exit.
        """
        if session_id in self._scores or session_id in self._absent:
            return
        self._absent.add(session_id)
        self._close_if_complete()

    def _close_if_complete(self) -> None:
        if self._complete.is_set() or len(self._scores) + len(self._absent) < self.size:
            return
        order = sorted(self._scores)
        scores = [self._scores[s] for s in order]
        try:
            processed = list(self._postprocess(scores))
            if len(processed) != len(scores):
                raise ValueError(f"{len(processed)} scores back for a group of {len(scores)}")
        except Exception:  # the gate must open whatever happens, or the group would never finish
            logger.exception("group post-processing failed; the group keeps its scores")
            processed = scores
        self._results = dict(zip(order, processed, strict=True))
        self._complete.set()
