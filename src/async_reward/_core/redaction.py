"""Keeping secrets out of what we print and log: configs, and values shown in errors.

A verl config can hold secrets in three places we know of: header values of ``remote.headers``, the
value of an environment variable named by an ``*api_key_env`` key when a user passes it through
``ray_kwargs.ray_init.runtime_env.env_vars``, and any other variable put there whose name looks
secret (``HF_TOKEN``, ``OPENAI_API_KEY``, ...). :func:`redact_config` is the one helper used wherever
we print a config or hand it to a tracker (wandb, mlflow); it also hides every other string that
contains one of those values, wherever a user copied it. :func:`holds_secret_value` lets error
messages refuse to echo a value that is a secret of this environment (``timeout_s:
${oc.env:JUDGE_API_KEY}``).

verl's own task runners print the whole resolved config too (``pprint`` in its ``TaskRunner.run``),
and its ``run_ppo`` prints the Ray ``runtime_env`` with every ``env_vars`` value before starting Ray.
Our entry point runs them under :func:`redacted_output`, which hides every value
:func:`redact_config` would hide in all this process writes to stdout and stderr (the Ray workers'
lines it relays included). Under verl's own entry points prefer the workers' real environment to
``runtime_env.env_vars`` for keys.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = [
    "HIDDEN",
    "config_secret_values",
    "hide_url_secrets",
    "holds_secret_value",
    "is_secret_field",
    "is_secret_name",
    "redact_config",
    "redacted_output",
    "secret_values",
    "secrets_of",
]

#: Printed instead of a value that may be a secret (a header, or a key pasted where its variable's
#: name belongs).
HIDDEN = "<hidden>"
#: Shorter values are not searched for inside other strings (``false`` is no secret).
_MIN_SECRET_CHARS = 8
_SECRET_WORDS = frozenset(
    {
        "KEY",
        "KEYS",
        "APIKEY",
        "TOKEN",
        "TOKENS",
        "SECRET",
        "SECRETS",
        "PASSWORD",
        "PASSWD",
        "PASS",
        "PAT",
        "CREDENTIAL",
        "CREDENTIALS",
        "AUTH",
        "AUTHORIZATION",
        "COOKIE",
        "SIGNATURE",
    }
)
_SECRET_SUFFIXES = ("KEY", "TOKEN", "SECRET", "PASSWORD")
_ENV_VARS_PATH = ("ray_kwargs", "ray_init", "runtime_env", "env_vars")


#: A URL in a shown text: its ``user:password@`` and its query string (``?token=...``) are hidden.
_URL = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/?#@\s'\"]*@)?(?P<rest>[^?#\s'\"]*)"
    r"(?P<query>\?[^#\s'\"]*)?"
)


def hide_url_secrets(text: str) -> str:
    """``text`` with ``<hidden>`` for the user info and the query of every URL in it: a refused URL is
    still shown, so the user sees which one, without the password or token it may carry."""

    def hide(url: re.Match[str]) -> str:
        user = f"{HIDDEN}@" if url["user"] else ""
        query = f"?{HIDDEN}" if url["query"] else ""
        return f"{url['scheme']}{user}{url['rest']}{query}"

    return _URL.sub(hide, text)


def is_secret_name(name: str) -> bool:
    """Whether a variable or header named ``name`` probably holds a secret: one of its words is KEY,
    TOKEN, SECRET, PASSWORD, AUTH, ... (``HF_TOKEN``, ``X-Api-Key``), or it ends with one
    (``MYKEY``). ``TOKENIZERS_PARALLELISM`` does not."""
    upper = str(name).upper()
    words = re.split(r"[^A-Z0-9]+", upper)
    return any(word in _SECRET_WORDS for word in words) or upper.endswith(_SECRET_SUFFIXES)


_SECRET_FIELD_WORDS = frozenset(
    {"APIKEY", "TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "AUTH", "AUTHORIZATION", "COOKIE"}
    | {"CREDENTIAL", "CREDENTIALS"}
)
_SECRET_FIELD_PAIRS = frozenset({("API", "KEY"), ("ACCESS", "KEY"), ("PRIVATE", "KEY"), ("SECRET", "KEY")})


def is_secret_field(name: str) -> bool:
    """Whether a config key named ``name`` probably holds a secret as its value (``api_key``,
    ``openai_token``, ``password``), narrower than :func:`is_secret_name` because verl's config is
    full of ``*_key`` fields naming data columns (``prompt_key``) and ``*_tokens`` counts; a key naming
    an environment variable (``api_key_env``) holds a name, not a secret."""
    words = [word for word in re.split(r"[^A-Z0-9]+", str(name).upper()) if word]
    if not words or words[-1] == "ENV":
        return False
    return any(word in _SECRET_FIELD_WORDS for word in words) or any(
        pair in _SECRET_FIELD_PAIRS for pair in itertools.pairwise(words)
    )


def secret_values(env: Mapping[str, str] | None = None) -> set[str]:
    """Values of the environment variables (default: this process's) whose names look secret."""
    environment = os.environ if env is None else env
    return {
        value
        for name, value in environment.items()
        if isinstance(value, str) and len(value) >= _MIN_SECRET_CHARS and is_secret_name(name)
    }


#: Secrets of the config being checked (its ``runtime_env.env_vars``), set by :func:`secrets_of`.
_CONFIG_SECRETS: ContextVar[frozenset[str]] = ContextVar("async_reward_config_secrets", default=frozenset())
#: The config whose secrets :data:`_CONFIG_SECRETS` holds (None outside any check).
_CHECKED_CONFIG: ContextVar[Any] = ContextVar("async_reward_checked_config", default=None)


def holds_secret_value(text: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether ``text`` contains the value of a secret-looking environment variable: of this process
    (or ``env``), or of the workers' environment that the config being checked passes through
    ``runtime_env.env_vars`` (see :func:`secrets_of`)."""
    return any(value in text for value in secret_values(env) | _CONFIG_SECRETS.get())


def config_secret_values(config: Any) -> set[str]:
    """Values a config hands its Ray workers as secrets: each ``ray_kwargs.ray_init.runtime_env.env_vars``
    value whose variable has a secret-looking name or is named by an ``*api_key_env`` key.

    Every start-up check and every manager a reward worker builds asks this of verl's whole config:
    an OmegaConf config without ``env_vars`` (the common case) is answered from that one node, since
    converting all of verl's config with its interpolations resolved costs ~36 ms of CPU a call."""
    if not _may_hold_worker_secrets(config):
        return set()
    return {value for value in _worker_secrets(_plain(config)).values() if len(value) >= _MIN_SECRET_CHARS}


def _may_hold_worker_secrets(config: Any) -> bool:
    """False only for an OmegaConf config whose ``env_vars`` node is absent, null or empty (or cannot be
    resolved: :func:`_plain` would then read it unresolved, as a string, which holds no variables)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if not isinstance(config, (DictConfig, ListConfig)):
        return True
    try:
        env_vars = OmegaConf.select(
            config, ".".join(_ENV_VARS_PATH), default=None, throw_on_resolution_failure=False
        )
    except Exception:  # a node on the path of the wrong shape: let the full conversion decide
        return True
    return not (env_vars is None or (isinstance(env_vars, DictConfig) and len(env_vars) == 0))


def _worker_secrets(plain: Any) -> dict[str, str]:
    """``{variable: value}`` of the ``runtime_env.env_vars`` of a plain config that hold secrets: a
    secret-looking name, or one named by an ``*api_key_env`` key."""
    env_vars = _get(plain, _ENV_VARS_PATH)
    if not isinstance(env_vars, Mapping):
        return {}
    key_names = set(_api_key_env_names(plain))
    return {
        str(name): "" if value is None else str(value)
        for name, value in env_vars.items()
        if is_secret_name(str(name)) or str(name) in key_names
    }


@contextmanager
def secrets_of(config: Any) -> Iterator[None]:
    """While checking ``config``, treat the secrets it passes to its workers as secrets here too, so
    no error message echoes one (a key put in ``env_vars`` and pasted into a URL field as well).
    Start-up checks call each other with the same config: it is read once, by the outermost."""
    if config is None or config is _CHECKED_CONFIG.get():
        yield
        return
    try:
        found = config_secret_values(config)
    except Exception:  # finding secrets must never turn into a crash of its own
        found = set()
    secrets = _CONFIG_SECRETS.set(_CONFIG_SECRETS.get() | frozenset(found))
    checked = _CHECKED_CONFIG.set(config)
    try:
        yield
    finally:
        _CHECKED_CONFIG.reset(checked)
        _CONFIG_SECRETS.reset(secrets)


def redact_config(config: Any) -> Any:
    """A plain copy of a verl config (an OmegaConf node, resolved, or a mapping), safe to print or log.

    Hidden (replaced with ``<hidden>``): every value under a ``headers`` mapping; every string value
    of a key that names a secret (:func:`is_secret_field`: ``reward_kwargs.api_key``,
    ``extra_body.api_key``, ``hf_token``); each
    ``ray_kwargs.ray_init.runtime_env.env_vars`` value whose variable is named by an ``*api_key_env``
    key or has a secret-looking name; and every string anywhere that contains one of those values or
    the value of a secret-looking variable of this process's environment.
    """
    plain = _plain(config)
    workers = _worker_secrets(plain)
    key_names = set(_api_key_env_names(plain))
    secrets = (
        secret_values()
        | {os.environ[name] for name in key_names if len(os.environ.get(name) or "") >= _MIN_SECRET_CHARS}
        | {value for value in workers.values() if len(value) >= _MIN_SECRET_CHARS}
    )
    return _redacted(plain, (), secrets, set(workers))


def _plain(config: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if not isinstance(config, (DictConfig, ListConfig)):
        return config
    try:
        return OmegaConf.to_container(config, resolve=True)
    except Exception:  # an unresolvable interpolation: print it as written
        return OmegaConf.to_container(config, resolve=False)


def _get(node: Any, path: Iterable[str]) -> Any:
    for part in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def _api_key_env_names(node: Any) -> Iterable[str]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if str(key).endswith("api_key_env") and isinstance(value, str):
                yield value
            else:
                yield from _api_key_env_names(value)
    elif isinstance(node, list):
        for item in node:
            yield from _api_key_env_names(item)


def _redacted(node: Any, path: tuple[str, ...], secrets: set[str], hidden_vars: set[str]) -> Any:
    if isinstance(node, Mapping):
        copy: dict[Any, Any] = {}
        for key, value in node.items():
            header = bool(path) and path[-1] == "headers" and value is not None
            secret_field = isinstance(value, str) and bool(value) and is_secret_field(str(key))
            if header or secret_field or (path == _ENV_VARS_PATH and str(key) in hidden_vars):
                copy[key] = HIDDEN
            else:
                copy[key] = _redacted(value, (*path, str(key)), secrets, hidden_vars)
        return copy
    if isinstance(node, list):
        return [_redacted(item, path, secrets, hidden_vars) for item in node]
    if isinstance(node, str) and any(secret in node for secret in secrets):
        return HIDDEN
    return node


def hidden_values(config: Any) -> set[str]:
    """Every value :func:`redact_config` hides for ``config`` (headers, secret fields, worker keys,
    this process's secret variables), long enough to be searched for in text."""
    plain = _plain(config)
    found = {
        value
        for value in secret_values()
        | {os.environ.get(name) or "" for name in _api_key_env_names(plain)}
        | set(_worker_secrets(plain).values())
    }
    found |= set(_hidden_strings(plain, redact_config(plain)))
    return {value for value in found if len(value) >= _MIN_SECRET_CHARS}


def _hidden_strings(plain: Any, shown: Any) -> Iterator[str]:
    if shown == HIDDEN and isinstance(plain, str | int | float) and not isinstance(plain, bool):
        yield str(plain)
    elif isinstance(plain, Mapping) and isinstance(shown, Mapping):
        for key, value in plain.items():
            yield from _hidden_strings(value, shown.get(key))
    elif isinstance(plain, list) and isinstance(shown, list):
        for value, redacted in zip(plain, shown, strict=False):
            yield from _hidden_strings(value, redacted)


class _RedactingStream(io.TextIOBase):
    """A text stream that writes whole lines to ``target`` with every secret replaced by ``<hidden>``.

    Line-buffered so that a secret written in pieces is still whole when searched for (secrets hold
    no newline); :meth:`flush` writes a pending partial line (a progress bar) as it is. Thread-safe:
    Ray relays its workers' output from a thread of its own.
    """

    def __init__(self, target: Any, secrets: set[str]) -> None:
        super().__init__()
        self.target = target
        self._secrets = sorted(secrets, key=len, reverse=True)  # a longer secret may contain a shorter
        self._pending = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            lines = (self._pending + text).split("\n")
            self._pending = lines.pop()
            if lines:
                self.target.write("".join(self._redact(line) + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                self.target.write(self._redact(self._pending))
                self._pending = ""
            self.target.flush()

    def isatty(self) -> bool:
        return bool(getattr(self.target, "isatty", lambda: False)())

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.target, "encoding", "utf-8"))

    def fileno(self) -> int:
        return int(self.target.fileno())

    def _redact(self, line: str) -> str:
        for secret in self._secrets:
            line = line.replace(secret, HIDDEN)
        return line


@contextmanager
def redacted_output(config: Any) -> Iterator[None]:
    """Everything this process writes to ``sys.stdout`` / ``sys.stderr`` meanwhile (prints, logging
    handlers on those streams, the Ray worker lines Ray relays) with the values
    :func:`redact_config` hides for ``config`` replaced by ``<hidden>``.

    For code we do not own that prints a config: verl's ``run_ppo`` prints the Ray ``runtime_env``,
    ``env_vars`` values included, before starting Ray. A no-op when there is nothing to hide.
    """
    secrets = hidden_values(config)
    if not secrets:
        yield
        return
    original = {"stdout": sys.stdout, "stderr": sys.stderr}
    wrapped = {name: _RedactingStream(stream, secrets) for name, stream in original.items()}
    handlers = [
        (handler, handler.stream)
        for handler in _stream_handlers()
        if handler.stream in (original["stdout"], original["stderr"])
    ]
    sys.stdout, sys.stderr = wrapped["stdout"], wrapped["stderr"]
    for handler, stream in handlers:
        handler.setStream(wrapped["stdout"] if stream is original["stdout"] else wrapped["stderr"])
    try:
        yield
    finally:
        for stream in wrapped.values():
            stream.flush()
        sys.stdout, sys.stderr = original["stdout"], original["stderr"]
        for handler, stream in handlers:
            handler.setStream(stream)


def _stream_handlers() -> list[logging.StreamHandler]:
    """The stream handlers of the root logger and of every logger that has its own."""
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in logging.root.manager.loggerDict)]
    return [
        handler
        for log in loggers
        if isinstance(log, logging.Logger)
        for handler in log.handlers
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
    ]
