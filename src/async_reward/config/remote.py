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
from async_reward.config._shared import (
    _FORBIDDEN_HEADER_CHARS,
    _URL_FIX,
    CONFIG_PATH,
    _env_name,
    _is_url,
    _refuse_url_credentials_beside,
    _repr_hiding_url_secrets,
    _require_env,
)

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
    """Name of the environment variable holding a bearer token, sent as ``Authorization: Bearer
    <token>``. None: no Authorization header. Refused beside an ``Authorization`` in :attr:`headers`
    or a ``user:password@`` in :attr:`url`."""
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    """Extra HTTP headers (string values without control characters). Kept out of reprs and errors,
    and redacted from what the service echoes back, but put secrets in ``api_key_env``, not here."""

    def __repr__(self) -> str:
        """The fields, with :attr:`url`'s ``user:password@`` and query shown as ``<hidden>``."""
        return _repr_hiding_url_secrets(self, ("url",))

    def validate(self, path: str = f"{CONFIG_PATH}.remote") -> None:
        """Check every value (not what ``async_remote`` requires to run: see :meth:`require`). Header
        values are never shown: headers are where people paste tokens."""
        validate_fields(self, path)
        for name, value in self.headers.items():
            if not isinstance(value, str):
                raise bad_value(
                    f"{path}.headers.{name}", value, "is not a string", "quote the header value", hide=True
                )
            _check_header(name, value, f"{path}.headers")
        self._check_one_authorization(path)

    def _check_one_authorization(self, path: str) -> None:
        """At most one source of the ``Authorization`` header: ``api_key_env``, ``headers``, or the
        URL's ``user:password@``. With two, one would silently replace the other (ours replaced a
        header of the user's), or aiohttp would refuse every request (the URL's with a header)."""
        header = self.authorization_header()
        if header is not None and self.api_key_env is not None:
            fix = (
                f"keep the key in {path}.api_key_env and remove headers.{header}, or unset "
                "api_key_env to send the header as written"
            )
            problem = (
                f"is set together with {path}.api_key_env, which sends its own Authorization header "
                "(Bearer <the key>) in its place"
            )
            raise bad_value(f"{path}.headers.{header}", self.headers[header], problem, fix, hide=True)
        sender = f"{path}.headers.{header}" if header is not None else None
        if self.api_key_env is not None:
            sender = f"{path}.api_key_env"
        _refuse_url_credentials_beside(self.url, f"{path}.url", sender)

    def authorization_header(self) -> str | None:
        """The name of the ``Authorization`` header in :attr:`headers`, as written (any letter case)."""
        return next((name for name in self.headers if name.lower() == "authorization"), None)

    def require(self, env: Mapping[str, str] | None = None, path: str = f"{CONFIG_PATH}.remote") -> None:
        """What ``async_remote`` cannot run without: the URL, and the token variable when one is named."""
        if not self.url:
            fix = f"set +{path}.url=http://<host>:<port>/score"
            raise missing_value(f"{path}.url", "the async_remote manager", fix)
        _require_env(self.api_key_env, f"{path}.api_key_env", env)


def _check_header(name: str, value: str, path: str) -> None:
    """Refuse a control character (CR, LF, ...) in a header's name or value, showing neither."""
    if _FORBIDDEN_HEADER_CHARS.search(value):
        key, where = f"{path}.{name}", "its value"
    elif _FORBIDDEN_HEADER_CHARS.search(name):
        key, where = path, "a header's name"
    else:
        return
    raise bad_value(
        key,
        value,
        f"has a control character (CR, LF, ...) in {where}, which HTTP forbids in a header: every "
        "request would be refused",
        "remove the line breaks and other control characters",
        hide=True,
    )
