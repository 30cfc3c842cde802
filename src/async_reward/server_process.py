"""Old home of :class:`ServerProcess`, kept so existing imports keep working.

The dev server's child-process runner lives in ``async_reward.devserver.process`` (also exported by
``async_reward.devserver`` and ``async_reward.testing``); import it from there.
"""

from __future__ import annotations

from async_reward.devserver.process import ServerProcess

__all__ = ["ServerProcess"]
