"""Typed, validated configuration for async-reward, read from verl's ``reward.async_reward`` node.

Every field is documented where it is declared, with its valid range in its ``metadata`` rule
(checked by :func:`async_reward._config_rules.validate_fields`). Unknown keys are rejected with the
list of valid ones, because a typo in a rate limit (``request_per_minute``) silently ignored would let a job
hammer a paid API; every number must be finite, because a NaN deadline or fallback score corrupts
every reward of the run.

Two levels of checks: :meth:`AsyncRewardConfig.validate` checks values (ranges, relations between
fields) and holds for every manager; a section's ``require`` checks what one manager needs to run
(the judge's URL, an API key variable set in the environment). The driver runs both before any
reward worker starts (``async_reward.checks.check_reward``); each worker runs them again. One verb
per level: every section's ``validate`` checks its values, a section a manager needs has
``require``; the start-up checks of a whole verl config are ``async_reward.checks``'s ``check_*``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from omegaconf import DictConfig

from async_reward._config_rules import (
    at_least,
    bad_value,
    dataclass_from_flags,
    greater_than,
    in_range,
    missing_value,
    parse_config,
    plain_container,
    rule,
    validate_fields,
)
from async_reward.composite_config import CompositeConfig
from async_reward.cost import JudgePricing
from async_reward.criteria import Criterion
from async_reward.errors import ConfigError
from async_reward.redaction import HIDDEN
from async_reward.result import BATCH_KEYS, RESERVED_EXTRA_KEYS
from async_reward.verl_settings import apply_verl_reward_keys

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

#: Where the settings live in the verl config.
CONFIG_PATH = "reward.async_reward"
#: Request fields the judge config sets itself; ``judge.extra_body`` may not override them.
_JUDGE_OWN_FIELDS = ("model", "messages", "temperature", "max_tokens", "stream", "n")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_URL_FIX = "write an http:// or https:// URL with a host"
#: Longest string ``extra_defaults`` takes: the default is copied into every sample's extras.
MAX_EXTRA_DEFAULT_CHARS = 1024


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


def _env_name(fix: str) -> dict[str, Any]:
    # Hidden: what fails this rule is often the key itself, pasted where its variable's name belongs.
    return rule(lambda v: bool(_ENV_NAME.fullmatch(v)), "is not an environment variable name", fix, hide=True)


def _require_env(var_name: str | None, key: str, env: Mapping[str, str] | None) -> None:
    environment = os.environ if env is None else env
    if var_name is None or environment.get(var_name):
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


#: Values of ``limits.admission``: where the limits are enforced.
ADMISSION_SCOPES = ("worker", "job")


@dataclass
class LimitsConfig:
    """Admission limits for outbound calls. RPM and TPM are budgets of the whole job."""

    max_concurrency: int = field(default=64, metadata=at_least(1, "allow at least one call in flight"))
    """Most calls in flight at once in one reward worker process (a slot is held for the call only);
    with ``admission: job``, in the whole job (all reward workers together)."""
    admission: str = "worker"
    """Where the limits are enforced. ``worker``: each reward worker process on its own, with its
    ``max_concurrency`` and an equal share of RPM / TPM (no round trip, but a slot or a share of the
    budget can idle at one worker while calls wait at another). ``job``: one queue for the whole job,
    held by a Ray actor (``async_reward.job_admission``): ``max_concurrency`` calls in flight across all
    workers, the whole RPM / TPM, the oldest training step first wherever its calls wait; costs two actor
    calls per attempt (``benchmarks/job_admission.py`` measures them)."""
    requests_per_minute: float | None = field(
        default=None, metadata=greater_than(0, "write a positive budget, or null for no request limit")
    )
    """Job-wide request budget per minute, shared by all ``reward.num_workers`` processes. None: unlimited."""
    tokens_per_minute: float | None = field(
        default=None, metadata=greater_than(0, "write a positive budget, or null for no token limit")
    )
    """Job-wide token budget per minute (prompt + completion), shared by all workers. None: unlimited."""
    estimated_tokens_per_request: int = field(
        default=512, metadata=at_least(0, "write the typical tokens of one request (0 reserves none)")
    )
    """Tokens reserved from the TPM budget before a call; corrected by the usage the response reports."""

    def validate(self, num_workers: int, path: str = f"{CONFIG_PATH}.limits") -> None:
        """Check every value, and that each of ``num_workers`` processes gets a usable share (with
        ``admission: job`` there are no shares: the job's one queue holds the whole budgets)."""
        validate_fields(self, path)
        if self.admission not in ADMISSION_SCOPES:
            raise bad_value(
                f"{path}.admission",
                self.admission,
                "is not an admission scope",
                "use worker (each reward worker its own limits) or job (one queue for the whole job)",
            )
        num_workers = self.sharing_workers(num_workers)
        if self.requests_per_minute is not None and self.requests_per_minute / num_workers < 1:
            raise bad_value(
                f"{path}.requests_per_minute",
                self.requests_per_minute,
                f"split over {num_workers} reward workers leaves less than one request per minute each",
                "raise it or lower reward.num_workers",
            )
        if self.tokens_per_minute is None:
            return
        share = math.floor(self.tokens_per_minute / num_workers)
        if share < 1:
            raise bad_value(
                f"{path}.tokens_per_minute",
                self.tokens_per_minute,
                f"split over {num_workers} reward workers leaves less than one token per minute each",
                "raise it or lower reward.num_workers",
            )
        if self.estimated_tokens_per_request > share:
            raise bad_value(
                f"{path}.estimated_tokens_per_request",
                self.estimated_tokens_per_request,
                f"exceeds one worker's share of tokens_per_minute ({self.tokens_per_minute:g} / "
                f"{num_workers} workers = {share}): no request could ever be admitted",
                "lower it, raise tokens_per_minute, or lower reward.num_workers",
            )

    @property
    def job_wide(self) -> bool:
        """One admission queue for the whole job (``admission: job``)."""
        return self.admission == "job"

    def sharing_workers(self, num_workers: int) -> int:
        """Processes that split the budgets: ``num_workers`` per worker, 1 when the job's queue holds them."""
        return 1 if self.job_wide else num_workers


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


@dataclass
class JudgeConfig:
    """An OpenAI-compatible ``/v1/chat/completions`` judge."""

    base_url: str | None = field(
        default=None, metadata=rule(_is_url, "is not an http(s) URL", f"{_URL_FIX} ending in /v1")
    )
    """Base URL of the API, e.g. ``http://127.0.0.1:8000/v1``. Required for ``llm_judge``."""
    api_key_env: str | None = field(
        default=None, metadata=_env_name("write the NAME of the variable holding the key, never the key")
    )
    """Name of the environment variable holding the API key. None: send no Authorization header."""
    model: str = field(
        default="judge", metadata=rule(lambda v: bool(v.strip()), "is empty", "write the judge's model name")
    )
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
    ``<think>`` itself; the first ``</think>`` is trusted to be the judge's); ``none``, nothing. A
    ``<think>`` anywhere else is plain text. Whatever the mode, a reply whose message carries the
    thinking apart (``reasoning_content`` or ``reasoning``) is read as ``none``."""
    min_score: float = 0.0
    """Lowest verdict the judge may give; a verdict outside [min_score, max_score] is ``invalid``."""
    max_score: float = 10.0
    """Highest verdict the judge may give (greater than ``min_score``)."""
    normalize_to: tuple[float, float] | None = (0.0, 1.0)
    """Verdicts are mapped linearly onto this range, low < high. None: keep the judge's scale."""
    temperature: float = field(
        default=0.0, metadata=in_range(0, 2, "write a sampling temperature in the API's range [0, 2]")
    )
    """Sampling temperature sent to the judge."""
    max_tokens: int = field(default=512, metadata=at_least(1, "allow the judge at least one token"))
    """Completion token cap sent to the judge."""
    extra_body: dict[str, Any] = field(default_factory=dict)
    """Extra JSON fields merged into each request body (not the ones set by the keys above)."""
    criteria: tuple[Criterion, ...] = ()
    """Rubric judging (``async_reward.criteria``): weighted criteria, each a mapping with ``name``,
    ``description``, and optionally ``weight`` (1), ``polarity`` (``positive`` / ``negative``) and
    ``must_have`` (false), graded in one call; each criterion's verdict and reason are in the sample's
    extras and the weighted aggregate is the reward (with ``expected_verdict``, the aggregate of each
    criterion's expected verdict). Empty: one verdict per response (``template``)."""
    criteria_per_call: int | None = field(
        default=None, metadata=at_least(1, "grade at least one criterion a call (null: all in one)")
    )
    """With ``criteria``: how many criteria one call grades (the rubric split into several calls, all
    of which must succeed); null: every criterion in one call."""
    expected_verdict: bool = False
    """Score with the expected verdict under the judge's own token probabilities, not the one it
    sampled: the request asks for ``logprobs`` / ``top_logprobs`` and the verdict's tokens are weighed
    by the rule in ``async_reward.expected_verdict`` (ties broken, less variance). A reply without
    them keeps its plain verdict, said in the log and in each sample's ``judge_weighting``. Needs a
    whole-number verdict scale. With ``criteria``, each criterion's verdict is weighed at its own line
    (``managers.criteria_weighting``): all of a sample's criteria, or none, with the reason."""
    top_logprobs: int | None = field(
        default=None,
        metadata=in_range(1, 20, "ask for 1 to 20 alternatives a token (OpenAI's and vLLM's cap)"),
    )
    """With ``expected_verdict``: alternatives listed per token (null: 20); enough to cover the
    scale (0-10 written as one token each needs 11). Refused without ``expected_verdict``, which is
    what asks for them: set alone it would be ignored."""
    mode: Literal["pointwise", "group"] = "pointwise"
    """``pointwise``: one verdict per response, one call each. ``group``: the members of a GRPO group
    (the samples sharing a ``uid``, ``actor_rollout_ref.rollout.n`` of them) graded together in one
    call, listed in a shuffled order, one ``R<k>: [[n]]`` line each, each member's verdict normalised
    as a pointwise one (``async_reward.group_judging``). It needs the whole group in one reward
    worker: our pipelined trainer or manager, our v1 agent loop (which routes by ``uid``), or one
    reward worker; it is refused at start-up elsewhere (``async_reward.group_placement``)."""
    group_wait_s: float | None = field(
        default=None, metadata=in_range(1e-3, 86400, "give the seconds a group's members may take to arrive")
    )
    """With ``mode: group``: how long a worker waits, from a group's first member, for the rest of it
    (null: 600). When it passes, every member that arrived fails with status ``timeout`` and the
    count that arrived (never a partial group judged, never a wait without end). Where sessions are
    scored as they finish generating (verl's agent loop), it must cover the spread of generation
    times inside a group."""
    group_shuffle: bool | None = None
    """With ``mode: group``: list the members in an order shuffled per call (seeded by
    ``group_seed`` and the group's ``uid``), so a judge's position bias favours no member
    systematically (null: true). False: arrival order (for measuring that bias)."""
    group_seed: int | None = None
    """With ``mode: group``: the seed of the shuffle (null: 0)."""
    cache: bool = False
    """Cache verdicts of identical requests for the life of the worker (identical in-flight requests
    always share one call)."""
    prompt_price_per_million: float | None = field(
        default=None, metadata=at_least(0, "write the price of a million prompt tokens, >= 0")
    )
    """Price of a million prompt (input) tokens, in your currency; with
    ``completion_price_per_million``, each sample's ``judge_cost`` and the step's
    ``reward/cost/money``. None: no money figures (tokens and calls are always counted)."""
    completion_price_per_million: float | None = field(
        default=None, metadata=at_least(0, "write the price of a million completion tokens, >= 0")
    )
    """Price of a million completion (output) tokens, in the same currency; set both prices or none."""

    def __post_init__(self) -> None:
        # At load (parse_config builds this class), not at the first sample: a parser that can never
        # read the template's format would make every sample invalid.
        self._validate_verdict_rules()
        self._validate_prices()

    def _validate_prices(self, path: str = f"{CONFIG_PATH}.judge") -> None:
        """Both prices or neither: one price alone would count the other kind of token as free."""
        prices = {
            "prompt_price_per_million": self.prompt_price_per_million,
            "completion_price_per_million": self.completion_price_per_million,
        }
        unset = [key for key, price in prices.items() if price is None]
        if len(unset) == 1:  # one price alone would count the other kind of token as free
            (missing,) = unset
            (given,) = set(prices) - {missing}
            raise bad_value(
                f"{path}.{given}",
                prices[given],
                f"is set without {path}.{missing}: the other kind of token would cost nothing",
                f"set {path}.{missing} too (0 if those tokens are free), or neither",
            )

    def _validate_verdict_rules(self, path: str = f"{CONFIG_PATH}.judge") -> None:
        """Raise ConfigError on a verdict setting that is unknown or cannot work with the template."""
        from async_reward.judge import resolve_parser, resolve_template
        from async_reward.verdict import CONFLICT_RULES, PARSERS, POSITIONS, THINK_MODES

        for key, what, valid in (
            ("parser", "verdict parser", PARSERS),
            ("verdict_position", "verdict position", POSITIONS),
            ("on_conflict", "conflict rule", CONFLICT_RULES),
            ("think", "think mode", THINK_MODES),
        ):
            value = getattr(self, key)
            if value not in valid:
                raise bad_value(f"{path}.{key}", value, f"is not a {what}", f"use one of {list(valid)}")
        try:
            resolve_template(self.template, self.parser)
        except ValueError as exc:
            raise bad_value(f"{path}.template", self.template, "is not a usable template", str(exc)) from None
        try:
            resolve_parser(self.template, self.parser)
        except ValueError as exc:
            raise bad_value(f"{path}.parser", self.parser, "does not fit the template", str(exc)) from None
        if self.parser == "structured" and "response_format" in self.extra_body:
            raise bad_value(
                f"{path}.extra_body.response_format",
                self.extra_body["response_format"],
                "is set while judge.parser is 'structured', which sends its own response_format",
                "remove one of them",
            )

    def validate(self, path: str = f"{CONFIG_PATH}.judge") -> None:
        """Check every value (not what ``llm_judge`` requires to run: see :meth:`require`)."""
        validate_fields(self, path)
        self._validate_verdict_rules(path)
        self._validate_prices(path)
        if self.max_score <= self.min_score:
            raise bad_value(
                f"{path}.max_score",
                self.max_score,
                f"must exceed min_score ({self.min_score:g})",
                "give the judge's scale as min_score < max_score",
            )
        scale = self.max_score - self.min_score
        if not math.isfinite(scale):
            raise bad_value(
                f"{path}.max_score",
                self.max_score,
                f"is so far from min_score ({self.min_score:g}) that the scale's width overflows "
                "floating point (every verdict would normalise to 0.0)",
                "give the judge's real scale, e.g. min_score: 0 and max_score: 10",
            )
        if self.normalize_to is not None:
            self._check_normalize_to(self.normalize_to, scale, f"{path}.normalize_to")
        if self.expected_verdict and not (
            float(self.min_score).is_integer() and float(self.max_score).is_integer()
        ):
            raise bad_value(
                f"{path}.expected_verdict",
                True,
                f"weighs whole-number verdicts, but the scale is {self.min_score:g} to {self.max_score:g}",
                "give judge.min_score and judge.max_score as whole numbers, or set expected_verdict=false",
            )
        if self.expected_verdict and self.min_score < 0:
            # A sign is a token of its own: where the judge wrote +1, what its ``-`` would have continued
            # with (-1 or -5) was never generated, so P(-) has no value to weigh (and the same for + after
            # a written -3). A non-negative scale with normalize_to gives the same signed reward.
            raise bad_value(
                f"{path}.expected_verdict",
                True,
                f"weighs unsigned verdicts, but judge.min_score is {self.min_score:g} (a signed scale: the "
                "probability of a '-' cannot be weighed)",
                f"set judge.min_score: 0 and judge.max_score: {self.max_score - self.min_score:g} (the "
                "judge's template asking for that scale) and judge.normalize_to, e.g. [-1, 1], for a "
                "signed reward; or set judge.expected_verdict=false",
            )
        if self.top_logprobs is not None and not self.expected_verdict:
            raise bad_value(
                f"{path}.top_logprobs",
                self.top_logprobs,
                "is set without judge.expected_verdict (only the weighted verdict asks for alternatives)",
                "remove judge.top_logprobs, or set judge.expected_verdict=true",
            )
        self._validate_criteria(path)
        self._validate_group(path)
        own = set(_JUDGE_OWN_FIELDS) | ({"logprobs", "top_logprobs"} if self.expected_verdict else set())
        overridden = sorted(set(self.extra_body) & own)
        if overridden:
            raise bad_value(
                f"{path}.extra_body",
                overridden,
                "would override request fields the judge config sets",
                "set judge.model / temperature / max_tokens / template / top_logprobs instead (stream "
                "and n are not supported: one complete reply is read per call)",
            )

    def _validate_criteria(self, path: str) -> None:
        """Each criterion's fields, unique names, and the settings a rubric cannot work with."""
        if not self.criteria:
            if self.criteria_per_call is not None:
                raise bad_value(
                    f"{path}.criteria_per_call",
                    self.criteria_per_call,
                    "is set without judge.criteria",
                    "remove it, or give judge.criteria",
                )
            return
        if len(self.criteria) > 100:
            raise bad_value(
                f"{path}.criteria",
                f"<{len(self.criteria)} criteria>",
                "has more than 100 criteria",
                "keep a rubric to at most 100 criteria",
            )
        names: set[str] = set()
        for index, criterion in enumerate(self.criteria):
            if not isinstance(criterion, Criterion):
                raise bad_value(
                    f"{path}.criteria[{index}]",
                    criterion,
                    "is not a criterion",
                    "write name, description and optionally weight, polarity, must_have",
                )
            validate_fields(criterion, f"{path}.criteria[{index}]")
            if criterion.polarity not in ("positive", "negative"):
                raise bad_value(
                    f"{path}.criteria[{index}].polarity",
                    criterion.polarity,
                    "is not allowed",
                    "use positive or negative",
                )
            if criterion.name in names:
                raise bad_value(
                    f"{path}.criteria[{index}].name",
                    criterion.name,
                    "names two criteria",
                    "give each criterion its own name",
                )
            names.add(criterion.name)
        # A criterion's verdict key, judge_criterion_<name>, must not be another's reason key (nor,
        # weighted, its _expected or _mass key): one would overwrite the other in the sample's extras.
        suffixes = ("_reason", "_expected", "_mass") if self.expected_verdict else ("_reason",)
        for index, criterion in enumerate(self.criteria):
            for suffix in suffixes:
                stem = criterion.name.removesuffix(suffix)
                if stem != criterion.name and stem in names:
                    raise bad_value(
                        f"{path}.criteria[{index}].name",
                        criterion.name,
                        f"is criterion {stem!r}'s name and {suffix}: both would write the extras key "
                        f"judge_criterion_{criterion.name}",
                        f"rename it so it is not another criterion's name followed by {suffix}",
                    )
        conflicts = [
            (
                "template",
                self.template != "correctness",
                "the rubric builds its own prompt from the criteria",
            ),
            ("parser", self.parser not in ("auto", "brackets"), "criteria are read as C<k>: [[n]] lines"),
            ("verdict_position", self.verdict_position != "end", "the criterion lines must end the reply"),
            (
                "on_conflict",
                self.on_conflict != "refuse",
                "a disagreeing criterion verdict is always refused",
            ),
            ("cache", self.cache, "rubric verdicts are not cached (nor shared in flight) yet"),
        ]
        self._refuse_conflicts(path, conflicts, "judge.criteria", "judge.criteria")

    def _validate_group(self, path: str) -> None:
        """The settings group judging cannot work with (``mode: group``), and group keys without it."""
        if self.mode not in ("pointwise", "group"):
            raise bad_value(f"{path}.mode", self.mode, "is not a judging mode", "use pointwise or group")
        if self.mode != "group":
            for key in ("group_wait_s", "group_shuffle", "group_seed"):
                if getattr(self, key) is not None:
                    raise bad_value(
                        f"{path}.{key}",
                        getattr(self, key),
                        "is set without judge.mode=group",
                        f"remove judge.{key}, or set judge.mode=group",
                    )
            return
        conflicts = [
            ("criteria", bool(self.criteria), "a rubric per member in one group call is not supported"),
            ("expected_verdict", self.expected_verdict, "group verdicts are not weighed by logprobs yet"),
            ("template", self.template != "correctness", "group judging builds its own prompt"),
            ("parser", self.parser not in ("auto", "brackets"), "members are read as R<k>: [[n]] lines"),
            ("verdict_position", self.verdict_position != "end", "the member lines must end the reply"),
            ("on_conflict", self.on_conflict != "refuse", "a disagreeing member verdict is always refused"),
            ("cache", self.cache, "group verdicts are not cached"),
        ]
        self._refuse_conflicts(path, conflicts, "judge.mode=group", "set judge.mode=pointwise")

    def _refuse_conflicts(
        self, path: str, conflicts: list[tuple[str, bool, str]], feature: str, turn_off: str
    ) -> None:
        """Refuse the first ``(key, conflicting, why)`` that conflicts with ``feature``, naming the key
        and the two ways out (remove the key, or ``turn_off`` the feature)."""
        for key, conflicting, why in conflicts:
            if conflicting:
                raise bad_value(
                    f"{path}.{key}",
                    getattr(self, key),
                    f"does not apply with {feature}: {why}",
                    f"remove judge.{key}, or {turn_off}",
                )

    @staticmethod
    def _check_normalize_to(normalize_to: tuple[float, float], scale: float, key: str) -> None:
        low, high = normalize_to
        if not low < high:
            raise bad_value(
                key,
                list(normalize_to),
                "is not strictly increasing: the reward would be inverted or constant",
                "write [low, high] with low < high; to reward the opposite of what the judge rates, "
                "ask for the opposite in judge.template (e.g. 10 = worst)",
            )
        # normalize_score computes low * (max - v) + high * (v - min): its terms must stay finite.
        if not math.isfinite(high - low) or not math.isfinite(max(abs(low), abs(high)) * scale):
            raise bad_value(
                key,
                list(normalize_to),
                "is so wide that normalising a verdict overflows floating point",
                "write the reward range you train on, e.g. [0, 1]",
            )

    @property
    def requested_top_logprobs(self) -> int:
        """The ``top_logprobs`` a request with ``expected_verdict`` asks for (``top_logprobs``, or 20)."""
        return 20 if self.top_logprobs is None else self.top_logprobs

    @property
    def reward_floor(self) -> float:
        """The lowest reward a verdict can give: ``normalize_to[0]``, or ``min_score`` without it."""
        return self.min_score if self.normalize_to is None else self.normalize_to[0]

    def pricing(self) -> JudgePricing | None:
        """The prices per million tokens, or None when they are not set."""
        if self.prompt_price_per_million is None or self.completion_price_per_million is None:
            return None
        return JudgePricing(float(self.prompt_price_per_million), float(self.completion_price_per_million))

    def require(self, env: Mapping[str, str] | None = None, path: str = f"{CONFIG_PATH}.judge") -> None:
        """What ``llm_judge`` cannot run without: a base URL, and the API key variable when one is named."""
        if not self.base_url:
            fix = f"set +{path}.base_url=http://<host>:<port>/v1"
            raise missing_value(f"{path}.base_url", "the llm_judge manager", fix)
        _require_env(self.api_key_env, f"{path}.api_key_env", env)


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


@dataclass
class StatefulConfig:
    """Options of the ``async_stateful`` manager (the class comes from ``custom_reward_function``)."""

    init_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to the user class's constructor."""


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
    (``async_reward.checks.check_on_failure`` says which)."""
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
    composite: CompositeConfig = field(default_factory=CompositeConfig)
    """The components of a composite reward (``async_composite``: ``async_reward.composite_config``)."""

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
        validate_fields(self.stateful, f"{path}.stateful")
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

    ``num_workers`` defaults to ``reward.num_workers`` so that job-wide budgets are split correctly.
    verl's ``rate_limited`` keys (``reward.max_concurrent``, ``max_rpm``, ``max_tpm``,
    ``estimated_tokens_per_request``, ``timeout``) are applied to the same settings here
    (``async_reward.verl_settings``).
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
    if verl_workers is not None:
        if isinstance(verl_workers, bool) or not isinstance(verl_workers, int) or verl_workers < 1:
            raise bad_value(
                "reward.num_workers",
                verl_workers,
                "must be an integer >= 1 (verl starts that many reward worker processes)",
                "write reward.num_workers=1 or more",
            )
        if config.num_workers is None:
            config.num_workers = verl_workers
        elif config.num_workers < verl_workers:
            raise bad_value(
                f"{CONFIG_PATH}.num_workers",
                config.num_workers,
                f"is below reward.num_workers ({verl_workers}): each of the {verl_workers} reward worker "
                f"processes would take 1/{config.num_workers} of the job-wide RPM/TPM budgets, "
                f"{verl_workers / config.num_workers:g} times the total",
                f"remove it (it defaults to reward.num_workers) or set it to at least {verl_workers}",
            )
    config.validate()
    return config
