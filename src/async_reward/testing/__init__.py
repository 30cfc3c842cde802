"""Helpers for tests and benchmarks, not for training: they stand in for what a real job brings.

* :func:`build_tiny_tokenizer`: a byte-level BPE tokenizer trained locally (no hub access needed);
* :func:`rollout_batch`: the one builder of rollout-shaped verl ``DataProto`` batches.

The local judge server in a child process is ``async_reward.tools.devserver.ServerProcess``.
"""

from __future__ import annotations

from async_reward.testing.batches import rollout_batch
from async_reward.testing.tokenizer import build_tiny_tokenizer

__all__ = ["build_tiny_tokenizer", "rollout_batch"]
