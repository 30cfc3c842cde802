"""``ConfigError``, the error every start-up check raises, and :func:`deprecated_key`, the warning
one gives for a key that still works but goes.

Its own small module, importing nothing of ours, so every layer can raise it (the value rules of
``_config_rules``, the config sections of ``config``, the checks of ``checks``) and a user sees it
under its real home in tracebacks and in Ray's error text. ``async_reward`` and
``async_reward.config`` re-export ``ConfigError``.
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["ConfigError", "deprecated_key"]


class ConfigError(ValueError):
    """A configuration problem found at start-up (bad key, bad value, missing environment variable).

    ``key`` names the setting (dotted path) and ``fix`` says what to do, when known; the message
    always carries both. Constructible from the message alone, so it pickles through Ray unchanged.
    """

    def __init__(self, message: str, *, key: str | None = None, fix: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.fix = fix


#: Deprecated keys already logged in this process (the loaders run several times a run).
_LOGGED_DEPRECATIONS: set[str] = set()
_deprecation_log = logging.getLogger("async_reward.config")


def deprecated_key(key: str, replaced_by: str, fix: str) -> None:
    """Say that ``key``, set by the user, is deprecated: honoured this release, removed in the next.

    A ``DeprecationWarning`` (the form tools and tests catch) and, once a process, a logged warning:
    Python hides ``DeprecationWarning`` raised in library code by default, and verl's command line
    runs it there, so the log line is what a user sees. Both say what replaced the key and ``fix``.
    """
    message = (
        f"{key} is deprecated and will be removed in the next release: {replaced_by}. The value set is "
        f"honoured until then; fix: {fix}"
    )
    warnings.warn(message, DeprecationWarning, stacklevel=2)  # the loader that read the key
    if key not in _LOGGED_DEPRECATIONS:
        _LOGGED_DEPRECATIONS.add(key)
        _deprecation_log.warning("%s", message)
