"""Helpers for tests and benchmarks, not for training: they stand in for what a real job brings.

* :func:`build_tiny_tokenizer`: a byte-level BPE tokenizer trained locally (no hub access needed);
* :func:`rollout_batch`: the one builder of rollout-shaped verl ``DataProto`` batches;
* :class:`ServerProcess`: the local judge server (``async-reward serve``) in a child process.
"""

from __future__ import annotations

from async_reward.devserver.process import ServerProcess
from async_reward.testing.batches import rollout_batch
from async_reward.testing.tokenizer import build_tiny_tokenizer

__all__ = ["ServerProcess", "build_tiny_tokenizer", "rollout_batch"]
