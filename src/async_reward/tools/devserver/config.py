"""Configuration and counters of the dev server (see ``async_reward.tools.devserver.server``).

Separate from the HTTP handlers so the CLI can build and validate a config without the app, and so
each module stays one concept.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Literal

from async_reward.tools.devserver.judge import JudgeStyle, ThinkStyle, VerdictFormat

__all__ = [
    "FAULT_KINDS",
    "JUDGE_STYLES",
    "RUNTIME_CONFIG_KEYS",
    "STRUCTURED_OUTPUT_MODES",
    "THINK_STYLES",
    "DevServerConfig",
    "ServerStats",
    "coerce_runtime_value",
]

FAULT_KINDS: tuple[str, ...] = ("429", "500", "503", "hang", "malformed", "drop", "400")
"""Fault kinds understood by ``fault_rates`` and by ``@@fault:KIND@@`` markers."""
RUNTIME_CONFIG_KEYS: tuple[str, ...] = (
    "latency_ms",
    "capacity",
    "overflow",
    "retry_after_s",
    "fault_rates",
    "verdict_format",
    "think",
    "think_style",
    "echo_response",
    "judge_style",
    "fixed_verdict",
    "structured_output",
    "unescaped_json",
    "honour_max_tokens",
    "api_key",
    "hold",
    "logprobs",
    "verdict_probability",
    "verdict_probability_low",
    "logprobs_end_token",
    "logprobs_digits",
    "logprobs_space_share",
    "verdict_distribution",
    "repeat_penalty",
    "group_position_bonus",
)
"""Config fields ``POST /admin/config`` and ``update_config`` may change while the server runs."""
_VERDICT_FORMATS = ("brackets", "boxed", "score", "json")
JUDGE_STYLES: tuple[str, ...] = ("verdict-last", "verdict-then-quote")
"""Values of ``DevServerConfig.judge_style``."""
THINK_STYLES: tuple[str, ...] = ("inline", "prefilled", "separate")
"""Values of ``DevServerConfig.think_style``."""
STRUCTURED_OUTPUT_MODES: tuple[str, ...] = ("honour", "reject", "ignore")
"""Values of ``DevServerConfig.structured_output``."""
LOGPROBS_MODES: tuple[str, ...] = ("honour", "ignore")
"""Values of ``DevServerConfig.logprobs``."""
LOGPROBS_DIGITS: tuple[str, ...] = ("whole", "split")
"""Values of ``DevServerConfig.logprobs_digits``."""
_REQUEST_TIMES_KEPT = 100_000


@dataclass
class DevServerConfig:
    """How the dev server behaves. All fields but ``seed`` can change at runtime (``RUNTIME_CONFIG_KEYS``)."""

    latency_ms: tuple[float, float] = (0.0, 0.0)
    """Each service request sleeps uniform(lo, hi) ms while holding its capacity slot (a slow service)."""
    capacity: int | None = None
    """Most service requests served at once (latency + answering). None: unlimited."""
    overflow: Literal["queue", "reject"] = "queue"
    """Over capacity: ``queue`` waits FIFO for a slot (latency starts once it is held), ``reject``
    answers 429 at once with a ``Retry-After`` of ``retry_after_s``."""
    retry_after_s: float = 1.0
    """Retry-After sent with every 429: whole seconds (rounded up) in ``Retry-After``, exact in
    ``retry-after-ms`` (the OpenAI header), so fast tests can use sub-second values."""
    fault_rates: dict[str, float] = field(default_factory=dict)
    """Probability per service request of each fault kind (see ``FAULT_KINDS``); the sum must be <= 1."""
    seed: int | None = 0
    """Seed of the one RNG drawing faults and latency, so a run is reproducible. None: unseeded."""
    api_key: str | None = field(default=None, repr=False)
    """When set, service and admin requests need ``Authorization: Bearer <api_key>`` (else 401).
    Kept out of ``repr`` so it cannot leak into logs."""
    verdict_format: VerdictFormat = "brackets"
    """How the judge states its verdict: ``Rating: [[7]]``, ``\\boxed{7}``, ``Score: 7`` or
    ``{"score": 7, "reason": ...}``."""
    think: bool = False
    """Replies carry thinking holding a decoy verdict, to test parsers skip it (see ``think_style``)."""
    think_style: ThinkStyle = "inline"
    """How that thinking is returned: ``inline``, a ``<think>...</think>`` block opening the content;
    ``prefilled``, the same without ``<think>`` (a chat template that opens it itself); ``separate``,
    in the message's ``reasoning_content`` (a server with a reasoning parser)."""
    echo_response: bool = False
    """Quote the policy response before the verdict, to test parsers take the final verdict only."""
    judge_style: JudgeStyle = "verdict-last"
    """``verdict-last``: the verdict ends the reply; ``verdict-then-quote``: the judge gives its
    verdict, then quotes the response after it (a reply a hostile response can plant text after)."""
    fixed_verdict: int | None = None
    """When set, the judge always gives this verdict, whatever the response: the adversarial tests'
    known ground truth. None: judge by rule (final answer against the reference)."""
    structured_output: Literal["honour", "reject", "ignore"] = "honour"
    """A request with ``response_format`` json_schema: ``honour`` replies with a JSON object filling
    the schema; ``reject`` answers 400 (a server without structured output); ``ignore`` replies in
    text as if the field were absent (servers that drop unknown fields)."""
    unescaped_json: bool = False
    """With ``verdict_format: json``, the reply is one JSON object whose reasoning quotes the response
    pasted in without JSON escaping (a judge writing JSON by hand): score last for ``verdict-last``,
    first for ``verdict-then-quote``. The response can then add keys to the object, or break it."""
    honour_max_tokens: bool = True
    """Cut each reply after the request's ``max_tokens`` words (thinking first) and answer
    ``finish_reason: length``, as servers do; off: replies are never cut (``stop``)."""
    hold: bool | int = False
    """``True``: answer no service request until ``hold`` is set back to ``False``: each one waits,
    after its latency (holding its capacity slot), counted in ``in_flight_total`` and ``held``; one
    whose client gives up meanwhile leaves. An integer n: answer the next n requests to reach their
    answer (those held first, oldest first), then hold every later one as ``True`` does; setting it
    again counts from then. A gate for tests: "the judge has answered nothing (or only these) yet"
    becomes a fact the test controls, not a race against a latency."""

    logprobs: Literal["honour", "ignore"] = "honour"
    """A request with ``logprobs: true``: ``honour`` returns each reply token's log-probability and
    ``top_logprobs`` alternatives (``async_reward.tools.devserver.logprobs``); ``ignore`` returns none, as
    servers without them do."""
    verdict_probability: float = 1.0
    """With logprobs: the probability of the judge's verdict token (on a rubric reply, of each
    criterion's); the rest is split evenly between the verdicts one below and one above (within 0-10;
    at an end, the two nearest on its one side), listed as its alternatives."""
    verdict_probability_low: float | None = None
    """When set: a judge whose confidence differs by response; each reply's verdict probability is
    drawn in [verdict_probability_low, verdict_probability], the same for the same response text."""
    logprobs_end_token: str = ""
    """With logprobs: a token listed after the reply's own, which its text leaves out, as vLLM lists the
    end-of-sequence token (e.g. ``<|im_end|>``); empty lists none, as OpenAI's API does."""
    logprobs_digits: Literal["whole", "split"] = "whole"
    """With logprobs: ``whole``, a number is one token; ``split``, one digit a token, as Qwen's, Llama
    2's and Mistral's tokenizers write numbers (10 is ``1`` then ``0``), each place listing the
    conditional probabilities of the verdict distribution (``devserver.logprobs``)."""
    logprobs_space_share: float = 0.0
    """With logprobs: this share (0 to 0.5) of each verdict's first token is listed under a second
    spelling with a leading space (``" 7"`` beside the written ``"7"``), as tokenizers with both do."""
    verdict_distribution: dict[int, float] | None = None
    """With logprobs: the judge's distribution over the verdicts 0-10 (verdict -> weight, normalised),
    whichever verdict the reply writes (a written verdict it leaves out gets 1e-6); None: the written
    verdict gets ``verdict_probability`` and its two neighbours the rest."""
    repeat_penalty: float = 1.0
    """The penalty the server samples with when the request sets none (``repeat_penalty``, or vLLM's
    ``repetition_penalty``): above 1, a reply's verdict is not the favourite of the log-probabilities
    listed, which are from before the penalty, as llama.cpp's server (1.1 by default) reports them."""
    group_position_bonus: int = 0
    """A group request (``judge.mode: group``): add this much (capped at 10) to the verdict of the
    response listed first, as a judge biased towards the first response would (``devserver.group``)."""

    def validate(self) -> None:
        """Raise ValueError on a bad value; called on start-up and on every runtime change."""
        lo, hi = self.latency_ms
        # Finite, as every timing: an infinite latency holds its capacity slot for ever, and a NaN or
        # infinite Retry-After makes every 429 fail (its header is math.ceil of it). JSON NaN parses.
        if not (_is_finite_number(lo) and _is_finite_number(hi) and 0 <= lo <= hi):
            raise ValueError(
                f"latency_ms must be (lo, hi) finite numbers with 0 <= lo <= hi, got {self.latency_ms}"
            )
        capacity = self.capacity
        if capacity is not None and (type(capacity) is not int or capacity < 1):  # bool is not a capacity
            raise ValueError(f"capacity must be an integer >= 1 or None, got {self.capacity!r}")
        if self.overflow not in ("queue", "reject"):
            raise ValueError(f"overflow must be 'queue' or 'reject', got {self.overflow!r}")
        if not (_is_finite_number(self.retry_after_s) and self.retry_after_s >= 0):
            raise ValueError(f"retry_after_s must be a finite number >= 0, got {self.retry_after_s}")
        unknown = sorted(set(self.fault_rates) - set(FAULT_KINDS))
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; valid kinds: {list(FAULT_KINDS)}")
        rates = self.fault_rates.values()
        if any(not 0 <= rate <= 1 for rate in rates) or sum(rates) > 1:
            raise ValueError(f"fault rates must be in [0, 1] and sum to <= 1, got {self.fault_rates}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key):
            raise ValueError("api_key must be a non-empty string or None")
        if self.verdict_format not in _VERDICT_FORMATS:
            raise ValueError(f"verdict_format must be one of {list(_VERDICT_FORMATS)}")
        if self.judge_style not in JUDGE_STYLES:
            raise ValueError(f"judge_style must be one of {list(JUDGE_STYLES)}, got {self.judge_style!r}")
        if self.logprobs not in LOGPROBS_MODES:
            raise ValueError(f"logprobs must be one of {list(LOGPROBS_MODES)}, got {self.logprobs!r}")
        if not 0.0 < self.verdict_probability <= 1.0:
            raise ValueError(f"verdict_probability must be in (0, 1], got {self.verdict_probability!r}")
        low = self.verdict_probability_low
        if low is not None and not 0.0 < low <= self.verdict_probability:
            raise ValueError(f"verdict_probability_low must be in (0, verdict_probability], got {low!r}")
        if self.logprobs_digits not in LOGPROBS_DIGITS:
            raise ValueError(
                f"logprobs_digits must be one of {list(LOGPROBS_DIGITS)}, got {self.logprobs_digits!r}"
            )
        if not 0.0 <= self.logprobs_space_share <= 0.5:
            raise ValueError(f"logprobs_space_share must be in [0, 0.5], got {self.logprobs_space_share!r}")
        if not (_is_finite_number(self.repeat_penalty) and self.repeat_penalty > 0.0):
            raise ValueError(f"repeat_penalty must be a finite number > 0, got {self.repeat_penalty!r}")
        _validate_distribution(self.verdict_distribution)
        if not isinstance(self.logprobs_end_token, str):
            raise ValueError(f"logprobs_end_token must be a string, got {self.logprobs_end_token!r}")
        bonus = self.group_position_bonus
        if type(bonus) is not int or not 0 <= bonus <= 10:
            raise ValueError(f"group_position_bonus must be an integer from 0 to 10, got {bonus!r}")
        verdict = self.fixed_verdict
        if verdict is not None and (type(verdict) is not int or not 0 <= verdict <= 10):
            raise ValueError(f"fixed_verdict must be an integer from 0 to 10 or None, got {verdict!r}")
        if self.think_style not in THINK_STYLES:
            raise ValueError(f"think_style must be one of {list(THINK_STYLES)}, got {self.think_style!r}")
        if not isinstance(self.hold, bool) and (type(self.hold) is not int or self.hold < 0):
            raise ValueError(f"hold must be true, false or an integer >= 0, got {self.hold!r}")
        if self.structured_output not in STRUCTURED_OUTPUT_MODES:
            raise ValueError(
                f"structured_output must be one of {list(STRUCTURED_OUTPUT_MODES)}, "
                f"got {self.structured_output!r}"
            )


def _is_finite_number(value: Any) -> bool:
    """An int or float that is neither NaN nor infinite (a bool is not a number here)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _validate_distribution(distribution: dict[int, float] | None) -> None:
    """A verdict distribution: whole verdicts 0-10, finite weights >= 0, some above 0."""
    if distribution is None:
        return
    if not isinstance(distribution, dict) or not distribution:
        raise ValueError(f"verdict_distribution must be a non-empty mapping or None, got {distribution!r}")
    for verdict, weight in distribution.items():
        if type(verdict) is not int or not 0 <= verdict <= 10:
            raise ValueError(f"verdict_distribution's verdicts must be integers 0-10, got {verdict!r}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.0 <= weight < math.inf:
            raise ValueError(f"verdict_distribution's weights must be finite numbers >= 0, got {weight!r}")
    if sum(distribution.values()) <= 0.0:
        raise ValueError("verdict_distribution must give some verdict a weight above 0")


def coerce_runtime_value(key: str, value: Any) -> Any:
    """Turn a JSON value into the field's type, or raise ValueError (types from JSON are not trusted)."""
    if key == "verdict_distribution" and isinstance(value, dict):
        try:  # JSON object keys are strings
            return {
                int(verdict) if isinstance(verdict, str) else verdict: weight
                for verdict, weight in value.items()
            }
        except ValueError:
            raise ValueError("verdict_distribution's verdicts must be integers 0-10") from None
    if key == "latency_ms":
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise ValueError("latency_ms must be [lo, hi]")
        return (float(value[0]), float(value[1]))
    if key == "capacity":
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError("capacity must be an integer or null")
        return value
    if key == "verdict_probability_low" and value is None:
        return None
    if key in (
        "retry_after_s",
        "verdict_probability",
        "verdict_probability_low",
        "logprobs_space_share",
        "repeat_penalty",
    ):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key} must be a number")
        return float(value)
    if key == "fault_rates":
        if not isinstance(value, dict):
            raise ValueError("fault_rates must be an object of kind -> rate")
        return {str(kind): float(rate) for kind, rate in value.items()}
    if key == "hold" and (isinstance(value, float) or not isinstance(value, int) or value < 0):
        raise ValueError("hold must be true, false or an integer >= 0")
    if key in ("think", "echo_response", "unescaped_json", "honour_max_tokens") and not isinstance(
        value, bool
    ):
        raise ValueError(f"{key} must be true or false")
    if (
        key == "fixed_verdict"
        and value is not None
        and (isinstance(value, bool) or not isinstance(value, int))
    ):
        raise ValueError("fixed_verdict must be an integer or null")
    return value


class ServerStats:
    """Counters behind ``/admin/stats``. Touched only from the server's event loop, so no lock."""

    def __init__(self) -> None:
        self.in_flight = 0  # holding a capacity slot: what tests compare with ``capacity``
        self.in_flight_total = 0  # every service request inside the server: queued, served, hanging
        self.held = 0  # service requests waiting for ``hold`` to let them be answered
        self.epoch = 0  # how many resets so far: a request's outcome counts in its arrival's epoch only
        self.reset()

    def reset(self) -> None:
        """Zero the counters; requests still inside keep counting, so the maxima restart from them.

        What such a request goes on to do (its response status, injected fault, tokens) is not counted:
        its arrival was counted before the reset, so counting its outcome after would make the counters
        disagree (a test's ``tokens_total`` including a reply to the test before it)."""
        self.epoch += 1
        self.requests_by_path: Counter[str] = Counter()
        self.responses_by_status: Counter[str] = Counter()
        self.faults_injected: Counter[str] = Counter()
        self.request_times: deque[float] = deque(maxlen=_REQUEST_TIMES_KEPT)
        self.overflow_rejected = 0
        self.tokens_total = 0
        self.max_in_flight = self.in_flight
        self.max_in_flight_total = self.in_flight_total

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests_total": sum(self.requests_by_path.values()),
            "requests_by_path": dict(self.requests_by_path),
            "responses_by_status": dict(self.responses_by_status),
            "faults_injected": dict(self.faults_injected),
            "overflow_rejected": self.overflow_rejected,
            "in_flight": self.in_flight,
            "in_flight_total": self.in_flight_total,
            "held": self.held,
            "max_in_flight": self.max_in_flight,
            "max_in_flight_total": self.max_in_flight_total,
            "request_times": list(self.request_times),
            "tokens_total": self.tokens_total,
        }
