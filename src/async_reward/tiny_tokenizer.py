"""Old home of :func:`build_tiny_tokenizer`, kept so existing imports keep working.

The tokenizer lives in ``async_reward.testing`` (``async_reward.testing.tokenizer``) with the other
helpers for tests and benchmarks; import it from there.
"""

from __future__ import annotations

from async_reward.testing.tokenizer import build_tiny_tokenizer

__all__ = ["build_tiny_tokenizer"]
