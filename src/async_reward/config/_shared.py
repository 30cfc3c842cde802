"""What the config sections share: where they live in the verl config, the checks of a URL and of an
API key's environment variable, and a repr that shows a URL without its credentials."""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from async_reward._core.config_rules import (
    bad_value,
    rule,
)
from async_reward._core.errors import ConfigError
from async_reward._core.http_secrets import shown_url
from async_reward._core.redaction import HIDDEN
from async_reward._core.start_lines import say_once

__all__ = ["CONFIG_PATH", "warn_deprecated_key"]

#: Where the settings live in the verl config.
CONFIG_PATH = "reward.async_reward"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_URL_FIX = "write an http:// or https:// URL with a host"
#: What HTTP forbids in a header name or value (RFC 9110 5.5; TAB is allowed): aiohttp's own rule,
#: by which it refuses the request, failing every sample. CR and LF would split the header.
_FORBIDDEN_HEADER_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _is_url(value: str) -> bool:
    """An http(s) URL with a host and no whitespace (``http://`` alone would fail every call)."""
    if any(ch.isspace() for ch in value):
        return False
    try:
        parts = urlsplit(value)
        _ = parts.port  # a port that is not a number raises here
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _refuse_url_credentials_beside(url: str | None, url_key: str, authorization_from: str | None) -> None:
    """Refuse a ``user:password@`` in ``url`` when ``authorization_from`` (a key) sends an
    ``Authorization`` header too: aiohttp sends URL credentials as ``Authorization: Basic``, and
    refuses a request that has both, so every sample would fail. Neither value is shown."""
    if url is None or authorization_from is None or "@" not in urlsplit(url).netloc:
        return
    fix = f"remove the user:password@ from {url_key}, or unset {authorization_from}"
    raise bad_value(
        url_key,
        url,
        f"holds a user:password (sent as an Authorization: Basic header) and {authorization_from} "
        "sends an Authorization header too; a request carries one (each would fail)",
        fix,
        hide=True,
    )


def _env_name(fix: str) -> dict[str, Any]:
    # Hidden: what fails this rule is often the key itself, pasted where its variable's name belongs.
    return rule(lambda v: bool(_ENV_NAME.fullmatch(v)), "is not an environment variable name", fix, hide=True)


def _require_env(var_name: str | None, key: str, env: Mapping[str, str] | None) -> None:
    """Refuse ``key`` (an ``api_key_env``) unless the variable it names is set, and to a value that
    can go in a header. Neither the name nor the value is shown."""
    environment = os.environ if env is None else env
    if var_name is None:
        return
    value = environment.get(var_name)
    if value and _FORBIDDEN_HEADER_CHARS.search(value):
        # A key read with its line ending (the CR of a CRLF file, an env file, a secret store):
        # aiohttp refuses the header as an injection, failing every sample, so refuse it here.
        short_key = key.removeprefix(CONFIG_PATH + ".")
        fix = "remove the line breaks and other control characters from the key (a trailing newline?)"
        raise ConfigError(
            f"{key}={HIDDEN}: the key in the variable named in {short_key} has a control character "
            f"(CR, LF, ...), which HTTP forbids in a header: every request would be refused; {fix}",
            key=key,
            fix=fix,
        )
    if value:
        return
    # Never printed: what sits where the variable's name belongs is too often the key itself.
    holder = next((name for name, value in environment.items() if value and value == var_name), None)
    if holder is not None:
        problem = (
            f"holds a key, not a variable name (it equals the value of the environment variable {holder})"
        )
        raise bad_value(key, var_name, problem, f"write {key}={holder}, the variable's NAME", hide=True)
    fix = (
        "export that variable before starting, pass it in ray_kwargs.ray_init.runtime_env.env_vars, "
        "or set the key to null for an endpoint without authentication"
    )
    short_key = key.removeprefix(CONFIG_PATH + ".")
    raise ConfigError(
        f"{key}={HIDDEN}: the variable named in {short_key} is not set (or empty) where the reward "
        f"workers run; {fix}",
        key=key,
        fix=fix,
    )


def _repr_hiding_url_secrets(config: Any, url_fields: tuple[str, ...]) -> str:
    """The dataclass repr of ``config`` with each of ``url_fields`` shown by
    :func:`~async_reward._core.http_secrets.shown_url` (``user:password@`` and query as ``<hidden>``):
    a repr lands in logs and tracebacks, and a URL may carry a password or an ``?api_key=``."""
    shown = []
    for item in dataclasses.fields(config):
        if item.repr:
            value = getattr(config, item.name)
            if item.name in url_fields and isinstance(value, str):
                value = shown_url(value)
            shown.append(f"{item.name}={value!r}")
    return f"{type(config).__name__}({', '.join(shown)})"


def warn_deprecated_key(key: str, replaced_by: str, fix: str) -> None:
    """Say that ``key`` is deprecated (still honoured this release): what replaced it and the fix.

    A ``DeprecationWarning`` for code that asks for them, and the same words once in the job's log
    (:func:`say_once`): Python hides a ``DeprecationWarning`` raised outside ``__main__``, and a key
    set in a YAML file has no caller of its own to be shown to."""
    message = f"{key} is deprecated: {replaced_by}; {fix}. It is still honoured in this release."
    warnings.warn(message, DeprecationWarning, stacklevel=3)
    say_once(message)
