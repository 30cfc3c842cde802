"""``reward.async_reward.stateful``: options of ``async_stateful``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from async_reward._core.config_rules import bad_value, validate_fields
from async_reward._core.postprocess import passes_as_literal

__all__ = ["StatefulConfig"]


@dataclass
class StatefulConfig:
    """Options of the ``async_stateful`` manager (the class comes from ``custom_reward_function``)."""

    init_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to the user class's constructor, as configured (``{1: 0.5}`` keeps
    its int keys)."""

    def validate(self, path: str) -> None:
        """Finite numbers, and values the constructor can get as configured wherever groups are
        post-processed, verl's driver included (``async_reward._core.postprocess``)."""
        validate_fields(self, path)
        for name, value in self.init_kwargs.items():
            if not passes_as_literal(value):
                raise bad_value(
                    f"{path}.init_kwargs.{name}",
                    value,
                    "cannot be passed to your class as configured (only numbers, text, booleans, "
                    "null, and lists and mappings of them can)",
                    "write it with those, and convert it in your constructor",
                )
