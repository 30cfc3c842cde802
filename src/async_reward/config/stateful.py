"""``reward.async_reward.stateful``: options of ``async_stateful``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["StatefulConfig"]


@dataclass
class StatefulConfig:
    """Options of the ``async_stateful`` manager (the class comes from ``custom_reward_function``)."""

    init_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to the user class's constructor."""
