"""The deprecated pipelined trainer on verl's legacy ``RayPPOTrainer`` (``python -m
async_reward.legacy.main_ppo``), and its reward manager: submit a batch, take its rewards back in
chunks of complete groups. Superseded by the v1 mode ``trainer.v1.trainer_mode=pipelined``. Nothing
else in the library imports this package, so it can be deleted as a unit.

``PipelinedRewardLoopManager(config)`` takes the same verl config as verl's ``RewardLoopManager``::

    manager = PipelinedRewardLoopManager(config)
    ticket = manager.submit(batch)                 # returns at once; scoring starts
    chunk = manager.get_chunk(ticket, 256)         # >= 256 samples of complete groups
    batch[chunk.indices] ... chunk.rm_scores ...   # rm_scores laid out for batch[chunk.indices]
    manager.ticket_metrics(ticket)                 # timing_s/reward_*, reward/* metrics
    manager.close()

Chunks hold complete groups only (``uid``; groups may differ in size and need not be adjacent),
taken in index order of each group's first member among the complete ones; the call that asks for
at least what is left returns "the rest" once it is all scored. Older tickets get workers' free
slots first. Importing this package does not start Ray.

The names below load on first use: the package's light modules (the pipelined trainer's settings,
which ``async_reward.config.checks`` reads) are imported without the manager, which runs those checks.

Internal apart from its entry point ``python -m async_reward.legacy.main_ppo`` ("What is public"
in docs/package_structure.md): the rest may move without a deprecation.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers only: at run time the names load on first use (below)
    from async_reward.legacy.chunks import RewardChunk
    from async_reward.legacy.manager import PipelinedRewardLoopManager
    from async_reward.legacy.state import RewardChunkTimeout, Ticket, TicketError

__all__ = ["PipelinedRewardLoopManager", "RewardChunk", "RewardChunkTimeout", "Ticket", "TicketError"]

_LAZY = {
    "PipelinedRewardLoopManager": "async_reward.legacy.manager",
    "RewardChunk": "async_reward.legacy.chunks",
    "RewardChunkTimeout": "async_reward.legacy.state",
    "Ticket": "async_reward.legacy.state",
    "TicketError": "async_reward.legacy.state",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'async_reward.pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
