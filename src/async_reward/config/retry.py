"""``reward.async_reward.retry``: retries of transient failures."""

from __future__ import annotations

from dataclasses import dataclass, field

from async_reward._core.config_rules import (
    at_least,
    bad_value,
    greater_than,
    validate_fields,
)
from async_reward.config._shared import CONFIG_PATH

__all__ = ["RetryConfig"]


@dataclass
class RetryConfig:
    """Retry policy for transient failures (connection errors, timeouts, 408, 409, 429, 5xx)."""

    max_attempts: int = field(default=4, metadata=at_least(1, "write 1 to disable retries"))
    """Attempts in total, the first included. 1 disables retries."""
    initial_backoff_s: float = field(default=0.5, metadata=at_least(0, "write seconds >= 0"))
    """Backoff before the second attempt; doubles each attempt (exponential), plus jitter."""
    max_backoff_s: float = field(default=20.0, metadata=at_least(0, "write seconds >= 0"))
    """Cap on one backoff computed by the exponential rule (at least ``initial_backoff_s``)."""
    jitter_s: float = field(default=0.5, metadata=at_least(0, "write seconds >= 0 (0: no jitter)"))
    """Uniform random extra wait in [0, jitter_s], so workers that failed together do not retry together."""
    max_retry_after_s: float = field(default=60.0, metadata=at_least(0, "write seconds >= 0"))
    """A server's Retry-After / retry-after-ms is honoured up to this many seconds."""
    max_total_s: float = field(default=300.0, metadata=greater_than(0, "write seconds > 0"))
    """No new attempt starts after this many seconds since the first one."""

    def validate(self, path: str = f"{CONFIG_PATH}.retry") -> None:
        validate_fields(self, path)
        if self.max_backoff_s < self.initial_backoff_s:
            raise bad_value(
                f"{path}.max_backoff_s",
                self.max_backoff_s,
                f"is below initial_backoff_s ({self.initial_backoff_s:g}): the cap would undo the backoff",
                "make max_backoff_s >= initial_backoff_s",
            )
