"""Typed, validated configuration for async-reward, read from verl's ``reward.async_reward`` node.

One module per section (``limits``, ``retry``, ``judge``, ``remote``, ``stateful``); this module holds
the whole node (:class:`AsyncRewardConfig`), :func:`load_config`, and the public names of all of them.

Every field is documented where it is declared, with its valid range in its ``metadata`` rule
(checked by :func:`async_reward._core.config_rules.validate_fields`). Unknown keys are rejected with the
list of valid ones, because a typo in a rate limit (``request_per_minute``) silently ignored would let a job
hammer a paid API; every number must be finite, because a NaN deadline or fallback score corrupts
every reward of the run.

Two levels of checks: :meth:`AsyncRewardConfig.validate` checks values (ranges, relations between
fields) and holds for every manager; a section's ``require`` checks what one manager needs to run
(the judge's URL, an API key variable set in the environment). The driver runs both before any
reward worker starts (``async_reward.config.checks.check_reward``); each worker runs them again. One verb
per level: every section's ``validate`` checks its values, a section a manager needs has
``require``; the start-up checks of a whole verl config are ``async_reward.config.checks``'s ``check_*``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from omegaconf import DictConfig

from async_reward._core.config_rules import (
    at_least,
    bad_value,
    dataclass_from_flags,
    greater_than,
    parse_config,
    plain_container,
    validate_fields,
)
from async_reward._core.errors import ConfigError
from async_reward._core.result import BATCH_KEYS, RESERVED_EXTRA_KEYS
from async_reward.config._shared import CONFIG_PATH, warn_deprecated_key
from async_reward.config.composite import CompositeConfig
from async_reward.config.judge import JudgeConfig
from async_reward.config.limits import LimitsConfig
from async_reward.config.remote import RemoteConfig
from async_reward.config.retry import RetryConfig
from async_reward.config.stateful import StatefulConfig
from async_reward.config.verl_keys import apply_verl_reward_keys

__all__ = [
    "CONFIG_PATH",
    "RESERVED_EXTRA_KEYS",
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

#: Longest string ``extra_defaults`` takes: the default is copied into every sample's extras.
MAX_EXTRA_DEFAULT_CHARS = 1024


@dataclass
class AsyncRewardConfig:
    """Everything under ``reward.async_reward`` in the verl config."""

    timeout_s: float = field(default=120.0, metadata=greater_than(0, "write the deadline in seconds"))
    """Deadline of one scoring attempt, measured on the service (queueing for admission is not counted)."""
    admission_timeout_s: float | None = field(
        default=None,
        metadata=greater_than(0, "write seconds > 0, or null to wait as long as the budget needs"),
    )
    """Longest a call may queue for a concurrency slot and the RPM/TPM budgets (and, for a sync user
    function, a free thread or process) before it is given up as ``timeout`` (not retried: the queue is
    what it waited for). None: wait as long as the budget requires (N / RPM minutes for N samples)."""
    fallback_score: float = 0.0
    """Score given to a sample whose scoring failed; its ``status`` says why, so it is never silent.
    With ``llm_judge`` and ``on_failure: fallback`` it may not exceed the lowest reward a verdict gives
    (``judge.normalize_to[0]``, or ``judge.min_score``): a response can make its judge's reply invalid."""
    on_failure: Literal["fallback", "raise", "exclude"] = "fallback"
    """``fallback``: score failures with ``fallback_score``; ``raise``: stop the step with an error;
    ``exclude``: keep failed samples out of the gradient (zero loss mask; their group's advantages
    come from the members that were scored). ``exclude`` needs a trainer that honours it
    (``async_reward.config.checks.check_on_failure`` says which)."""
    executor: Literal["thread", "process"] = "thread"
    """Where sync user functions run: a thread pool, or a process pool (for scorers unsafe in threads)."""
    executor_workers: int | None = field(
        default=None, metadata=at_least(1, "write a pool size >= 1, or null for the library default")
    )
    """Size of that pool. None: the library default (min(32, cpus + 4) threads, cpus processes)."""
    extra_defaults: dict[str, Any] = field(default_factory=dict, metadata={"nan_allowed": True})
    """Extras keys your reward function returns, each with the value a failed sample gets (a number,
    a bool, a short string or null). verl stacks extras per key across a batch and fails when one
    sample lacks a key another has; keys are also learned as results arrive, but a sample that fails
    before any success in its worker only knows the keys declared here."""
    num_workers: int | None = field(
        default=None, metadata=at_least(1, "write the number of reward worker processes, or null")
    )
    """Deprecated: the reward worker processes sharing the RPM/TPM budgets are verl's
    ``reward.num_workers``, which :func:`load_config` writes here. Set, it is still honoured for one
    release with a ``DeprecationWarning`` (below ``reward.num_workers`` it is refused, as before)."""
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
    composite: CompositeConfig = field(default_factory=CompositeConfig)
    """The components of a composite reward (``async_composite``: :mod:`async_reward.config.composite`)."""

    @property
    def worker_count(self) -> int:
        """Reward worker processes that share the job-wide budgets (at least 1)."""
        return max(1, self.num_workers or 1)

    def validate(self, path: str = CONFIG_PATH) -> None:
        """Check every value of every section (not what one manager requires: see ``require``)."""
        validate_fields(self, path, recurse=False)
        if self.on_failure not in ("fallback", "raise", "exclude"):
            raise bad_value(
                f"{path}.on_failure",
                self.on_failure,
                "is not a failure policy",
                "use fallback, raise or exclude",
            )
        if self.executor not in ("thread", "process"):
            raise bad_value(f"{path}.executor", self.executor, "is not an executor", "use thread or process")
        self._check_extra_defaults(f"{path}.extra_defaults")
        self.limits.validate(self.worker_count, f"{path}.limits")
        self.retry.validate(f"{path}.retry")
        self.judge.validate(f"{path}.judge")
        self.remote.validate(f"{path}.remote")
        self.stateful.validate(f"{path}.stateful")
        self.composite.validate(f"{path}.composite")

    def validate_judge_fallback(self, path: str = CONFIG_PATH) -> None:
        """Refuse a ``fallback_score`` above the judge's lowest reward (``llm_judge``, ``fallback``).

        A response can always make its judge's reply ``invalid``: plant a verdict the judge quotes
        (a conflict), or push it past ``max_tokens``. With a fallback above the worst verdict's
        reward, a bad response would earn more by doing that than by being judged. Not a value rule
        of every manager: a fallback of 0.5 is fine for a reward function that cannot be steered so.
        """
        floor = self.judge.reward_floor
        if self.on_failure != "fallback" or self.fallback_score <= floor:
            return
        source = "judge.min_score" if self.judge.normalize_to is None else "judge.normalize_to[0]"
        raise bad_value(
            f"{path}.fallback_score",
            self.fallback_score,
            f"is above the lowest reward a judge verdict gives ({floor:g}, {source}), so a response "
            "could raise its reward by making the judge's reply invalid (planting a conflicting verdict)",
            f"set fallback_score to {floor:g} or lower, or use on_failure: exclude or raise",
        )

    def _check_extra_defaults(self, path: str) -> None:
        for key, value in self.extra_defaults.items():
            if key in RESERVED_EXTRA_KEYS:
                raise bad_value(
                    f"{path}.{key}",
                    value,
                    "is a key the library sets on samples",
                    "declare only your own keys",
                )
            if key in BATCH_KEYS:
                raise bad_value(
                    f"{path}.{key}",
                    value,
                    "names a field of verl's batch: extras are written into the batch by name, so it "
                    "would replace that field (an extras uid merges GRPO groups)",
                    "rename the key (a scorer that returns it anyway has it kept as user_<key>)",
                )
            if value is not None and not isinstance(value, (bool, int, float, str)):
                raise bad_value(
                    f"{path}.{key}",
                    value,
                    "is not a scalar (verl stacks extras into one numpy array per key)",
                    "write a number, a bool, a short string or null",
                )
            if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
                raise bad_value(
                    f"{path}.{key}",
                    value,
                    "does not fit in a 64-bit integer (verl stacks extras into numpy arrays)",
                    "write a smaller number, or a float",
                )
            if isinstance(value, str) and len(value) > MAX_EXTRA_DEFAULT_CHARS:
                raise bad_value(
                    f"{path}.{key}",
                    value,
                    f"is longer than {MAX_EXTRA_DEFAULT_CHARS} characters (it is copied into every sample)",
                    "write a short string",
                )
            if isinstance(value, float) and math.isinf(value):
                raise bad_value(
                    f"{path}.{key}", value, "is infinite", "write a finite number (NaN is allowed)"
                )


def load_config(verl_config: DictConfig | Mapping[str, Any] | None) -> AsyncRewardConfig:
    """Read and validate ``reward.async_reward`` from a full verl config.

    ``num_workers`` is ``reward.num_workers``, so that job-wide budgets are split over the reward
    workers verl starts (the deprecated ``num_workers`` key: :func:`_worker_count`).
    verl's ``rate_limited`` keys (``reward.max_concurrent``, ``max_rpm``, ``max_tpm``,
    ``estimated_tokens_per_request``, ``timeout``) are applied to the same settings here
    (``async_reward.config.verl_keys``).
    Checks values only; what one manager requires (judge URL, remote URL, API key variables) is
    checked by that manager's ``check_config`` (on the driver by ``checks.check_reward``).

    Raises:
        ConfigError: naming the key, the bad value and the fix.
    """
    reward_node: Any = {}
    if verl_config is not None:
        reward_node = verl_config.get("reward") or {}
    raw = reward_node.get("async_reward") if hasattr(reward_node, "get") else None
    raw = plain_container(raw, CONFIG_PATH)
    if isinstance(raw, Mapping) and "pipeline" in raw:
        key = f"{CONFIG_PATH}.pipeline"
        fix = "put the trainer's pipeline settings under async_reward.pipeline"
        problem = f"is not read there (reward workers parse {CONFIG_PATH})"
        raise ConfigError(f"{key} {problem}; {fix}", key=key, fix=fix)
    if raw is None or isinstance(raw, Mapping):
        # verl's rate_limited keys (reward.max_rpm, ...) with their meaning, or a ConfigError.
        raw = apply_verl_reward_keys(reward_node, raw)
    config = parse_config(AsyncRewardConfig, raw)
    verl_workers = reward_node.get("num_workers") if hasattr(reward_node, "get") else None
    deprecated = _worker_count(config, verl_workers)
    config.validate()
    if deprecated is not None:  # said once the config is known to be usable
        warn_deprecated_key(f"{CONFIG_PATH}.num_workers", *deprecated)
    return config


def _worker_count(config: AsyncRewardConfig, verl_workers: Any) -> tuple[str, str] | None:
    """Set ``config.num_workers`` to ``reward.num_workers``, the processes verl starts; where the
    deprecated ``num_workers`` key is set, what its warning says (what replaced it, the fix).

    The key below ``reward.num_workers`` is refused, as before (each worker would take more than its
    share of the job-wide budgets); above it, it is honoured this release (a smaller share each, for
    budgets shared with other jobs), and the fix is to lower the budgets to this job's part.

    Raises:
        ConfigError: ``reward.num_workers`` is not an integer >= 1, or the key is below it.
    """
    replaced = "the reward workers sharing the RPM/TPM budgets are reward.num_workers"
    if verl_workers is None:  # not a verl config (a bare reward node): the key still counts
        return None if config.num_workers is None else (replaced, "delete the line")
    if isinstance(verl_workers, bool) or not isinstance(verl_workers, int) or verl_workers < 1:
        raise bad_value(
            "reward.num_workers",
            verl_workers,
            "must be an integer >= 1 (verl starts that many reward worker processes)",
            "write reward.num_workers=1 or more",
        )
    ours = config.num_workers
    if ours is None:
        config.num_workers = verl_workers
        return None
    if ours < verl_workers:
        raise bad_value(
            f"{CONFIG_PATH}.num_workers",
            ours,
            f"is below reward.num_workers ({verl_workers}): each of the {verl_workers} reward worker "
            f"processes would take 1/{ours} of the job-wide RPM/TPM budgets, "
            f"{verl_workers / ours:g} times the total",
            f"delete the line ({CONFIG_PATH}.num_workers is deprecated: the budgets are split over "
            "reward.num_workers)",
        )
    if ours == verl_workers:
        return replaced, "delete the line"
    return (
        f"{replaced} ({verl_workers}; the key's {ours} gives each a smaller share, still honoured)",
        "delete the line, and lower limits.requests_per_minute / tokens_per_minute to the part of "
        "the budgets this job may use",
    )
