"""Typed, validated configuration for async-reward, read from verl's ``reward.async_reward`` node.

Every field is documented where it is declared. Unknown keys are rejected with the list of valid
ones, because a typo in a rate limit (``request_per_minute``) silently ignored would let a job
hammer a paid API.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from omegaconf import DictConfig, OmegaConf

__all__ = [
    "AsyncRewardConfig",
    "ConfigError",
    "JudgeConfig",
    "LimitsConfig",
    "RemoteConfig",
    "RetryConfig",
    "StatefulConfig",
    "dataclass_from_flags",
    "load_config",
    "parse_config",
]


class ConfigError(ValueError):
    """A configuration problem found at start-up (bad key, bad value, missing environment variable)."""


@dataclass
class LimitsConfig:
    """Admission limits for outbound calls. RPM and TPM are budgets of the whole job."""

    max_concurrency: int = 64
    """Most calls in flight at once in one reward worker process (a slot is held for the call only)."""
    requests_per_minute: float | None = None
    """Job-wide request budget per minute, shared by all ``reward.num_workers`` processes. None: unlimited."""
    tokens_per_minute: float | None = None
    """Job-wide token budget per minute (prompt + completion), shared by all workers. None: unlimited."""
    estimated_tokens_per_request: int = 512
    """Tokens reserved from the TPM budget before a call; corrected by the usage the response reports."""

    def validate(self, num_workers: int) -> None:
        if self.max_concurrency < 1:
            raise ConfigError(f"limits.max_concurrency must be >= 1, got {self.max_concurrency}")
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"limits.{name} must be > 0 or null, got {value}")
        if self.estimated_tokens_per_request < 0:
            raise ConfigError("limits.estimated_tokens_per_request must be >= 0")
        if self.requests_per_minute is not None and self.requests_per_minute / num_workers < 1:
            raise ConfigError(
                f"limits.requests_per_minute={self.requests_per_minute} split over {num_workers} reward "
                "workers leaves less than one request per minute each; lower reward.num_workers"
            )


@dataclass
class RetryConfig:
    """Retry policy for transient failures (connection errors, timeouts, 408, 409, 429, 5xx)."""

    max_attempts: int = 4
    """Attempts in total, the first included. 1 disables retries."""
    initial_backoff_s: float = 0.5
    """Backoff before the second attempt; doubles each attempt (exponential), plus jitter."""
    max_backoff_s: float = 20.0
    """Cap on one backoff computed by the exponential rule."""
    jitter_s: float = 0.5
    """Uniform random extra wait in [0, jitter_s], so workers that failed together do not retry together."""
    max_retry_after_s: float = 60.0
    """A server's Retry-After / retry-after-ms is honoured up to this many seconds."""
    max_total_s: float = 300.0
    """No new attempt starts after this many seconds since the first one."""

    def validate(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"retry.max_attempts must be >= 1, got {self.max_attempts}")
        for name in ("initial_backoff_s", "max_backoff_s", "jitter_s", "max_retry_after_s", "max_total_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"retry.{name} must be >= 0, got {getattr(self, name)}")


_JUDGE = "reward.async_reward.judge"


@dataclass
class JudgeConfig:
    """An OpenAI-compatible ``/v1/chat/completions`` judge."""

    base_url: str | None = None
    """Base URL of the API, e.g. ``http://127.0.0.1:8000/v1``. Required for ``llm_judge``."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key. None: send no Authorization header."""
    model: str = "judge"
    """Model name sent in the request."""
    template: str = "correctness"
    """Built-in template name (``correctness``, ``rubric``) or a template text with ``{prompt}``,
    ``{response}`` and ``{ground_truth}`` placeholders."""
    system_prompt: str | None = None
    """Overrides the template's system message."""
    parser: Literal["auto", "brackets", "boxed", "score", "json", "structured"] = "auto"
    """The one verdict format read from the reply (see ``async_reward.verdict``): ``brackets``
    (``Verdict: [[n]]``), ``boxed`` (``\\boxed{n}``), ``score`` (``Score: n``), ``json``
    (``{"reasoning": ..., "score": n}`` ending the reply), ``structured`` (the server is asked for that
    JSON object through ``response_format`` json_schema and the reply must be exactly it), or ``auto``:
    the format the template asks for (``brackets`` for the built-in templates, whose wording follows
    this setting; for your template text, the one format it shows)."""
    verdict_position: Literal["end", "anywhere"] = "end"
    """``end``: the last verdict must end the reply (only whitespace or markdown after it), as the
    built-in templates instruct; ``anywhere``: it may be followed by more text (e.g. a judge that
    gives its verdict and then discusses the response)."""
    on_conflict: Literal["refuse", "min"] = "refuse"
    """Several verdicts in the reply's format that disagree (the judge's, and one quoted from the
    response): ``refuse`` makes the sample ``invalid``; ``min`` takes the lowest, so text from the
    response can lower the score but never raise it above the judge's verdict."""
    think: Literal["leading", "prefilled", "none"] = "leading"
    """The judge's thinking, skipped before reading: ``leading``, a ``<think>...</think>`` block that
    opens the reply; ``prefilled``, everything up to the first ``</think>`` (the chat template opened
    ``<think>`` itself); ``none``, nothing (servers that return reasoning apart from the content). A
    ``<think>`` anywhere else is plain text."""
    min_score: float = 0.0
    """Lowest verdict the judge may give; a verdict outside [min_score, max_score] is ``invalid``."""
    max_score: float = 10.0
    """Highest verdict the judge may give."""
    normalize_to: tuple[float, float] | None = (0.0, 1.0)
    """Verdicts are mapped linearly onto this range. None: keep the judge's scale."""
    temperature: float = 0.0
    """Sampling temperature sent to the judge."""
    max_tokens: int = 512
    """Completion token cap sent to the judge."""
    extra_body: dict[str, Any] = field(default_factory=dict)
    """Extra JSON fields merged into each request body."""
    cache: bool = False
    """Cache verdicts of identical requests for the life of the worker (identical in-flight requests
    always share one call)."""

    def __post_init__(self) -> None:
        # At load (parse_config builds this class), not at the first sample: a parser that can never
        # read the template's format would make every sample invalid.
        self.check_verdict_rules()

    def check_verdict_rules(self) -> None:
        """Raise ConfigError on a verdict setting that is unknown or cannot work with the template."""
        from async_reward.judge import resolve_parser, resolve_template
        from async_reward.verdict import CONFLICT_RULES, PARSERS, POSITIONS, THINK_MODES

        for key, valid in (
            ("parser", PARSERS),
            ("verdict_position", POSITIONS),
            ("on_conflict", CONFLICT_RULES),
            ("think", THINK_MODES),
        ):
            value = getattr(self, key)
            if value not in valid:
                raise ConfigError(f"{_JUDGE}.{key} is {value!r}; set it to one of {', '.join(valid)}")
        try:
            resolve_template(self.template, self.parser)
        except ValueError as exc:
            raise ConfigError(f"{_JUDGE}.template is not usable: {exc}") from None
        try:
            resolve_parser(self.template, self.parser)
        except ValueError as exc:
            raise ConfigError(f"{_JUDGE}.parser={self.parser!r} does not fit the template: {exc}") from None
        if self.parser == "structured" and "response_format" in self.extra_body:
            raise ConfigError(
                f"{_JUDGE}.extra_body.response_format is set while judge.parser is 'structured', which "
                "sends its own response_format; remove one of them"
            )

    def validate(self) -> None:
        if not self.base_url:
            raise ConfigError("reward.async_reward.judge.base_url is required for the llm_judge manager")
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"judge.base_url must start with http:// or https://, got {self.base_url!r}")
        _require_env(self.api_key_env, "judge.api_key_env")
        if self.max_score <= self.min_score:
            raise ConfigError(f"judge.max_score ({self.max_score}) must exceed min_score ({self.min_score})")
        if self.normalize_to is not None and len(self.normalize_to) != 2:
            raise ConfigError("judge.normalize_to must be [low, high] or null")


@dataclass
class RemoteConfig:
    """A user's HTTP reward service: each sample is POSTed as JSON, the reply carries ``score``."""

    url: str | None = None
    """Full URL of the scoring endpoint, e.g. ``http://127.0.0.1:8000/score``. Required for
    ``async_remote``."""
    api_key_env: str | None = None
    """Name of the environment variable holding a bearer token. None: no Authorization header."""
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    """Extra HTTP headers. Kept out of reprs, but put secrets in ``api_key_env``, not here."""

    def validate(self) -> None:
        if not self.url:
            raise ConfigError("reward.async_reward.remote.url is required for the async_remote manager")
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"remote.url must start with http:// or https://, got {self.url!r}")
        _require_env(self.api_key_env, "remote.api_key_env")


@dataclass
class StatefulConfig:
    """Options of the ``async_stateful`` manager (the class comes from ``custom_reward_function``)."""

    init_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to the user class's constructor."""


@dataclass
class AsyncRewardConfig:
    """Everything under ``reward.async_reward`` in the verl config."""

    timeout_s: float = 120.0
    """Deadline of one scoring attempt, measured on the service (queueing for admission is not counted)."""
    admission_timeout_s: float | None = None
    """Longest a call may queue for a concurrency slot and the RPM/TPM budgets before it is given up
    as ``timeout`` (not retried: the budget is what it waited for). None: wait as long as the budget
    requires (N / RPM minutes for N samples)."""
    fallback_score: float = 0.0
    """Score given to a sample whose scoring failed; its ``status`` says why, so it is never silent."""
    on_failure: Literal["fallback", "raise"] = "fallback"
    """``fallback``: score failures with ``fallback_score``; ``raise``: stop the step with an error."""
    executor: Literal["thread", "process"] = "thread"
    """Where sync user functions run: a thread pool, or a process pool (for scorers unsafe in threads)."""
    executor_workers: int | None = None
    """Size of that pool. None: the library default (min(32, cpus + 4) threads, cpus processes)."""
    extra_defaults: dict[str, Any] = field(default_factory=dict)
    """Extras keys your reward function returns, each with the value a failed sample gets. verl stacks
    extras per key across a batch and fails when one sample lacks a key another has; keys are also
    learned as results arrive, but a sample that fails before any success in its worker only knows
    the keys declared here. (The pipelined manager fills missing keys across the batch itself.)"""
    num_workers: int | None = None
    """Reward worker processes sharing the RPM/TPM budgets. None: read ``reward.num_workers``."""
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    """Admission limits."""
    retry: RetryConfig = field(default_factory=RetryConfig)
    """Retry policy for transient failures."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """LLM judge endpoint (``llm_judge``)."""
    remote: RemoteConfig = field(default_factory=RemoteConfig)
    """HTTP reward service (``async_remote``)."""
    stateful: StatefulConfig = field(default_factory=StatefulConfig)
    """Stateful user class options (``async_stateful``)."""

    @property
    def worker_count(self) -> int:
        """Reward worker processes that share the job-wide budgets (at least 1)."""
        return max(1, self.num_workers or 1)

    def validate(self) -> None:
        if self.timeout_s <= 0:
            raise ConfigError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.admission_timeout_s is not None and self.admission_timeout_s <= 0:
            raise ConfigError(f"admission_timeout_s must be > 0 or null, got {self.admission_timeout_s}")
        if self.on_failure not in ("fallback", "raise"):
            raise ConfigError(f"on_failure must be 'fallback' or 'raise', got {self.on_failure!r}")
        if self.executor not in ("thread", "process"):
            raise ConfigError(f"executor must be 'thread' or 'process', got {self.executor!r}")
        if self.executor_workers is not None and self.executor_workers < 1:
            raise ConfigError("executor_workers must be >= 1 or null")
        self.limits.validate(self.worker_count)
        self.retry.validate()


def _require_env(var_name: str | None, key: str) -> None:
    if var_name is not None and not os.environ.get(var_name):
        raise ConfigError(f"{key} names the environment variable {var_name!r}, which is not set or empty")


_T = TypeVar("_T")


def parse_config(cls: type[_T], raw: Mapping[str, Any] | None, path: str = "reward.async_reward") -> _T:
    """Build dataclass ``cls`` from a mapping, recursing into nested dataclasses.

    Raises:
        ConfigError: on an unknown key (naming the valid ones) or a value of the wrong type.
    """
    raw = dict(raw or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in {path}; valid keys: {sorted(fields)}")
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        kwargs[name] = _coerce(hints[name], value, f"{path}.{name}")
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, path: str) -> Any:
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path} must be a mapping, got {type(value).__name__}")
        return parse_config(hint, value, path)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"{path} must not be null")
        non_null = [a for a in args if a is not type(None)]
        errors = []
        for arg in non_null:
            try:
                return _coerce(arg, value, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0])
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path} must be one of {list(args)}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{path} must be a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(a, v, path) for a, v in zip(args, value, strict=True))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path} must be a mapping, got {type(value).__name__}")
        return dict(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path} must be a number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path} must be an integer, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path} must be true or false, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path} must be a string, got {value!r}")
        return value
    return value


def dataclass_from_flags(cls: type[_T], flags: Any, preset: Mapping[str, Any] | None = None) -> _T:
    """Build dataclass ``cls`` from argparse flags named like its fields (the benchmarks' CLIs).

    A flag left unset (None) keeps the ``preset`` value (e.g. ``--quick``), else the field's default;
    list values become tuples.
    """
    values: dict[str, Any] = dict(preset or {})
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        given = getattr(flags, f.name, None)
        if given is not None:
            values[f.name] = tuple(given) if isinstance(given, list) else given
    return cls(**values)


def load_config(verl_config: DictConfig | Mapping[str, Any] | None) -> AsyncRewardConfig:
    """Read and validate ``reward.async_reward`` from a full verl config.

    ``num_workers`` defaults to ``reward.num_workers`` so that job-wide budgets are split correctly.
    Component-specific checks (judge URL, remote URL) are run by the manager that needs them.
    """
    reward_node: Any = {}
    if verl_config is not None:
        reward_node = verl_config.get("reward") or {}
    raw = reward_node.get("async_reward") if hasattr(reward_node, "get") else None
    if isinstance(raw, DictConfig):
        raw = OmegaConf.to_container(raw, resolve=True)
    config = parse_config(AsyncRewardConfig, raw)  # type: ignore[arg-type]
    if config.num_workers is None and hasattr(reward_node, "get"):
        verl_workers = reward_node.get("num_workers")
        if isinstance(verl_workers, int) and verl_workers > 0:
            config.num_workers = verl_workers
    config.validate()
    return config
