"""The data that flows through a manager: a decoded ``RewardSample`` in, a ``RewardResult`` out.

``RewardResult.to_verl()`` produces the dict verl's Reward Loop expects
(``{"reward_score": float, "reward_extra_info": {...}}``) and always carries ``status``,
``latency_s`` and ``attempts``, so a failure is visible in every batch's extras instead of hiding
as a 0.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

__all__ = [
    "EXTRA_STRING_MAX_CHARS",
    "RewardResult",
    "RewardSample",
    "ScoredFloat",
    "Status",
    "neutral_value",
    "normalize_user_result",
]

#: Long strings in extras bloat every batch (verl stacks them into numpy arrays); they are cut here.
EXTRA_STRING_MAX_CHARS = 256


class Status(StrEnum):
    """What happened to one sample's scoring."""

    OK = "ok"
    TIMEOUT = "timeout"
    ERROR = "error"
    INVALID = "invalid"


@dataclass
class RewardSample:
    """One decoded sample, the input of every manager's ``score``."""

    index: int
    """``extra_info["index"]`` when the dataset provides it, else -1 (for logs and services)."""
    uid: str | None
    """Group id (``non_tensor_batch["uid"]``), e.g. a GRPO group; None when absent."""
    data_source: str
    """Dataset name, as verl passes it to reward functions."""
    prompt: str | list[dict[str, Any]] | None
    """The prompt: chat messages from ``raw_prompt`` when present, else decoded prompt text."""
    response: str
    """The policy's response, decoded with special tokens skipped."""
    ground_truth: Any
    """``non_tensor_batch["reward_model"]["ground_truth"]`` (None when absent)."""
    extra_info: dict[str, Any] = field(default_factory=dict)
    """``non_tensor_batch["extra_info"]`` (a copy: managers may add keys)."""

    @property
    def prompt_text(self) -> str:
        """The prompt as plain text (chat messages joined by role), for templates and services."""
        if self.prompt is None:
            return ""
        if isinstance(self.prompt, str):
            return self.prompt
        return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in self.prompt)


class ScoredFloat(float):
    """A reward score that remembers whether it is a fallback and which group it belongs to.

    verl's Reward Loop hands only the list of scores to ``assemble_rm_scores`` on the driver. Group
    post-processing (e.g. the recipe's group-mean imputation of failed scores) needs to know which
    scores failed; a ``float`` subclass carries that through Ray unchanged, while every consumer that
    treats it as a number (verl's agent loop, ``torch.tensor``) still sees the fallback value.
    """

    failed: bool
    postprocess_spec: tuple[str, ...] | None

    def __new__(cls, value: float, failed: bool = False, postprocess_spec: tuple[str, ...] | None = None):
        obj = super().__new__(cls, value)
        obj.failed = failed
        obj.postprocess_spec = postprocess_spec
        return obj

    def __reduce__(self):  # pickling keeps the flags (Ray uses pickle)
        return (ScoredFloat, (float(self), self.failed, self.postprocess_spec))

    def __repr__(self) -> str:
        return f"ScoredFloat({float(self)!r}, failed={self.failed})"


@dataclass
class RewardResult:
    """The outcome of scoring one sample."""

    score: float | None
    """The score; None when scoring failed (the fallback is applied by ``to_verl``)."""
    status: Status = Status.OK
    """ok / timeout / error / invalid."""
    extras: dict[str, Any] = field(default_factory=dict)
    """User or manager extras, merged into ``reward_extra_info``."""
    failure_reason: str = ""
    """Short human-readable reason when status is not ok."""
    latency_s: float = 0.0
    """Wall time spent scoring, from admission to result, in seconds."""
    attempts: int = 1
    """Calls made, the first included."""

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @classmethod
    def failure(cls, status: Status, reason: str, **kwargs: Any) -> RewardResult:
        return cls(score=None, status=status, failure_reason=_short(reason), **kwargs)

    def to_verl(
        self, fallback_score: float, postprocess_spec: tuple[str, ...] | None = None
    ) -> dict[str, Any]:
        """The dict verl's ``run_single`` returns. Failed samples score ``fallback_score``."""
        failed = not self.ok or self.score is None
        value = fallback_score if failed else float(self.score)  # type: ignore[arg-type]
        extra: dict[str, Any] = {k: _scalar(v) for k, v in self.extras.items()}
        extra["status"] = self.status.value
        extra["latency_s"] = round(float(self.latency_s), 6)
        extra["attempts"] = int(self.attempts)
        extra["failure_reason"] = self.failure_reason
        return {
            "reward_score": ScoredFloat(value, failed=failed, postprocess_spec=postprocess_spec),
            "reward_extra_info": extra,
        }


def neutral_value(value: Any) -> Any:
    """The extras value of a sample that lacks a key, judged from another sample's value of that key:
    verl stacks extras per key across a batch, so every sample must carry every key."""
    if isinstance(value, str):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, float, np.number)):
        return math.nan
    return None


def _short(text: str) -> str:
    text = str(text)
    if len(text) > EXTRA_STRING_MAX_CHARS:
        return text[: EXTRA_STRING_MAX_CHARS - 3] + "..."
    return text


def _scalar(value: Any) -> Any:
    """Extras must be scalars or short strings: verl stacks them into numpy arrays per key."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    return _short(value if isinstance(value, str) else repr(value))


def _as_score(value: Any) -> float | None:
    """A finite float, or None when ``value`` is not a usable score."""
    if isinstance(value, bool):
        return float(value)
    try:
        score = float(value)
    except (TypeError, ValueError):
        return None
    return score if math.isfinite(score) else None


def normalize_user_result(value: Any) -> RewardResult:
    """Turn what a user function returned into a ``RewardResult``.

    Accepted: a number; a dict with ``score`` (other keys become extras); a
    ``(score, query, explanation)`` tuple (the recipe's contract); a ``RewardResult``. Anything else,
    ``None``, or a non-finite score gives status ``invalid`` with the reason.
    """
    if isinstance(value, RewardResult):
        return value
    if isinstance(value, dict):
        if "score" not in value:
            return RewardResult.failure(
                Status.INVALID, f"dict result has no 'score' key (keys: {sorted(value)})"
            )
        score = _as_score(value["score"])
        extras = {k: v for k, v in value.items() if k not in ("score", "reward_score")}
        if score is None:
            return RewardResult.failure(Status.INVALID, f"score is not a finite number: {value['score']!r}")
        return RewardResult(score=score, extras=extras)
    if isinstance(value, tuple) and len(value) == 3:
        score = _as_score(value[0])
        if score is None:
            return RewardResult.failure(Status.INVALID, f"score is not a finite number: {value[0]!r}")
        return RewardResult(score=score, extras={"judge_query": value[1], "judge_explanation": value[2]})
    if value is None:
        return RewardResult.failure(Status.INVALID, "reward function returned None")
    score = _as_score(value)
    if score is None:
        return RewardResult.failure(
            Status.INVALID, f"unusable score {value!r} of type {type(value).__name__}"
        )
    return RewardResult(score=score)
