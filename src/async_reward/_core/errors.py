"""``ConfigError``, the error every start-up check raises.

Its own small module, importing nothing of ours, so every layer can raise it (the value rules of
``_config_rules``, the config sections of ``config``, the checks of ``checks``) and a user sees it
under its real home in tracebacks and in Ray's error text. ``async_reward`` and
``async_reward.config`` re-export it.
"""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A configuration problem found at start-up (bad key, bad value, missing environment variable).

    ``key`` names the setting (dotted path) and ``fix`` says what to do, when known; the message
    always carries both. Constructible from the message alone, so it pickles through Ray unchanged.
    """

    def __init__(self, message: str, *, key: str | None = None, fix: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.fix = fix
