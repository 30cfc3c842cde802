"""``reward.async_reward.remote``: a user's HTTP reward service (``async_remote``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from async_reward._core.config_rules import (
    bad_value,
    missing_value,
    rule,
    validate_fields,
)
from async_reward.config._shared import _URL_FIX, CONFIG_PATH, _env_name, _is_url, _require_env

__all__ = ["RemoteConfig"]


@dataclass
class RemoteConfig:
    """A user's HTTP reward service: each sample is POSTed as JSON, the reply carries ``score``."""

    url: str | None = field(default=None, metadata=rule(_is_url, "is not an http(s) URL", _URL_FIX))
    """Full URL of the scoring endpoint, e.g. ``http://127.0.0.1:8000/score``. Required for
    ``async_remote``."""
    api_key_env: str | None = field(
        default=None, metadata=_env_name("write the NAME of the variable holding the token, never the token")
    )
    """Name of the environment variable holding a bearer token. None: no Authorization header."""
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    """Extra HTTP headers (string values). Kept out of reprs and errors, but put secrets in
    ``api_key_env``, not here."""

    def validate(self, path: str = f"{CONFIG_PATH}.remote") -> None:
        """Check every value (not what ``async_remote`` requires to run: see :meth:`require`)."""
        validate_fields(self, path)
        for name, value in self.headers.items():
            if not isinstance(value, str):
                # The value is never shown: headers are where people paste tokens.
                raise bad_value(
                    f"{path}.headers.{name}", value, "is not a string", "quote the header value", hide=True
                )

    def require(self, env: Mapping[str, str] | None = None, path: str = f"{CONFIG_PATH}.remote") -> None:
        """What ``async_remote`` cannot run without: the URL, and the token variable when one is named."""
        if not self.url:
            fix = f"set +{path}.url=http://<host>:<port>/score"
            raise missing_value(f"{path}.url", "the async_remote manager", fix)
        _require_env(self.api_key_env, f"{path}.api_key_env", env)
