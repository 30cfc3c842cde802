"""The data that flows through a manager: a decoded ``RewardSample`` in, a ``RewardResult`` out.

``RewardResult.to_verl()`` produces the dict verl's Reward Loop expects
(``{"reward_score": float, "reward_extra_info": {...}}``) and always carries ``status``,
``latency_s`` and ``attempts``, so a failure is visible in every batch's extras instead of hiding
as a 0.0.

Longer than 400 lines: the sample, the result and the one reading of a user's result (a number,
a dict, NaN, a bool) that every manager shares, with the extras rules verl's batching needs.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

__all__ = [
    "BATCH_KEYS",
    "DISPATCH_ORDER_KEY",
    "EXTRA_STRING_MAX_CHARS",
    "LOST_WORKERS_KEY",
    "MAX_ABS_SCORE",
    "RESERVED_EXTRA_KEYS",
    "USER_KEY_PREFIX",
    "ExtraInfo",
    "RewardResult",
    "RewardSample",
    "ScoredFloat",
    "Status",
    "as_score",
    "extras_fill_values",
    "extras_key_for",
    "fill_missing_extras",
    "neutral_value",
    "normalize_user_result",
]

#: A prompt field (so a sample's non-tensor field) numbering the trainer's dispatches to generation,
#: first 0; set by the decoupled mode's agent-loop manager, read into ``RewardSample.dispatch_order``.
DISPATCH_ORDER_KEY = "__dispatch_order__"
#: Long strings in extras bloat every batch (verl stacks them into numpy arrays); they are cut here.
EXTRA_STRING_MAX_CHARS = 256
#: ``reward_extra_info`` key of a session our v1 agent loop re-scored because its reward worker died:
#: the names (Ray actor ids) of the reward workers it found dead, comma-separated. Only such a session
#: carries it; ``reward/rescored_sessions`` and ``reward/worker_deaths`` are counted from it.
LOST_WORKERS_KEY = "lost_reward_workers"
#: Extras keys set by the library: every sample carries the first five, a re-scored session also
#: :data:`LOST_WORKERS_KEY` (a scorer's own value under one of these names is kept as ``user_<key>``;
#: ``extra_defaults`` may not declare them).
RESERVED_EXTRA_KEYS = ("status", "latency_s", "attempts", "failure_reason", "excluded", LOST_WORKERS_KEY)
#: Fields of verl's batches (non-tensor and tensor) that extras must never replace: verl's trainers and
#: ours write each extras key into the batch under its own name, so an extras ``uid`` would merge GRPO
#: groups and a ``data_source`` would relabel metrics, silently. A sample's other fields are protected
#: at run time too (``run_single`` sees them).
BATCH_KEYS = frozenset(
    {
        "uid",
        "data_source",
        "reward_model",
        "extra_info",
        "raw_prompt",
        "raw_prompt_ids",
        "index",
        "tools_kwargs",
        "interaction_kwargs",
        "multi_modal_data",
        "multi_modal_inputs",
        "agent_name",
        "request_id",
        "reward_scores",
        "__num_turns__",
        DISPATCH_ORDER_KEY,
        "score",
        "rm_scores",
        "token_level_scores",
        "token_level_rewards",
        "advantages",
        "returns",
        "values",
        "response_mask",
        "old_log_probs",
        "ref_log_prob",
        "rollout_log_probs",
        "input_ids",
        "attention_mask",
        "position_ids",
        "prompts",
        "responses",
    }
)
#: Prefix of a scorer's extras key renamed because it names one of the keys above.
USER_KEY_PREFIX = "user_"


def extras_key_for(
    key: str, batch_keys: frozenset[str] | set[str] = frozenset(), taken: Mapping[str, Any] | None = None
) -> str:
    """The name a scorer's extras ``key`` is kept under: itself, or ``user_<key>`` (repeated until free)
    when it names a library key (:data:`RESERVED_EXTRA_KEYS`), a batch field (:data:`BATCH_KEYS`,
    ``batch_keys``), or, once renamed, another key in ``taken``."""
    name = key
    while (
        name in RESERVED_EXTRA_KEYS
        or name in BATCH_KEYS
        or name in batch_keys
        or (name != key and taken is not None and name in taken)
    ):
        name = USER_KEY_PREFIX + name
    return name


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
    training_step: int | None = None
    """The training step whose batch the sample belongs to (``non_tensor_batch["global_steps"]``, set
    by verl's v1 agent loop: the step at which the trainer dispatched its prompt), None when unknown."""
    generation_step: int | None = None
    """The training step of the policy whose weights generated the sample's first token: the rollout's
    weight version plus one (verl's ``extra_fields["min_global_steps"]``, version v being the weights
    step v + 1 trains from), None when the rollout does not report it."""
    dispatch_order: int | None = None
    """Where the sample's prompt came in the trainer's dispatches to generation (``DISPATCH_ORDER_KEY``,
    numbered by the decoupled mode), None when the trainer does not number them."""
    session_id: int | None = None
    """Which of its group's responses the sample is (``non_tensor_batch["session_id"]``, set by verl's
    v1 agent loop), None when the batch does not say: group judging refuses a second arrival of the
    same session as a duplicate."""

    @property
    def admission_priority(self) -> tuple[float, float]:
        """Lower is admitted first: the step the sample was generated for (``generation_step``, else
        ``training_step``; unknown: 0), then its dispatch order (unknown: 0); equals are served as
        they come. In fully-async training a prompt dispatched early may start generating late;
        ordering by the weights that generated it serves the oldest policy's samples first, the ones
        closest to being evicted as stale. Among samples of one policy version, the earliest
        dispatched group goes first, so groups complete (and become trainable) one after another
        instead of all together at the end."""
        step = self.generation_step if self.generation_step is not None else self.training_step
        order = self.dispatch_order
        return (float(step) if step is not None else 0.0, float(order) if order is not None else 0.0)

    @property
    def prompt_text(self) -> str:
        """The prompt as plain text (chat messages joined by role), for templates and services."""
        if self.prompt is None:
            return ""
        if isinstance(self.prompt, str):
            return self.prompt
        return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in self.prompt)


class ExtraInfo(dict[str, Any]):
    """A sample's ``reward_extra_info``: a plain dict to every reader.

    Its own type only for Ray: a worker's outputs go through Ray's msgpack path, which copies plain
    dicts, while other objects are pickled together (one pickle, shared references kept). As a
    subclass this dict is pickled with the :class:`ScoredFloat` that holds it, so the driver still
    sees one object through both names.
    """

    def __reduce__(self):
        return (ExtraInfo, (dict(self),))


class ScoredFloat(float):
    """A reward score that remembers whether it is a fallback, which group post-processor it belongs
    to, and its sample's ``reward_extra_info`` dict.

    verl's Reward Loop hands only the list of scores to ``assemble_rm_scores`` on the driver. Group
    post-processing (e.g. the recipe's group-mean imputation of failed scores) needs to know which
    scores failed, and verl stacks the extras right after that call by the *first* sample's keys
    (``RewardLoopManager.compute_rm_score``), so a key another sample lacks is a ``KeyError``; holding
    the very dict verl reads lets ``assemble_rm_scores`` give every sample every key first. A ``float``
    subclass carries all of it through Ray (the dict stays shared with the output's
    ``reward_extra_info``: see :class:`ExtraInfo`), while every consumer that treats it as a number
    (verl's agent loop, ``torch.tensor``) still sees the plain value.
    """

    failed: bool
    postprocess_spec: tuple[str, ...] | None
    extras: dict[str, Any] | None
    """The sample's ``reward_extra_info`` (an :class:`ExtraInfo`, so Ray keeps it shared)."""

    def __new__(
        cls,
        value: float,
        failed: bool = False,
        postprocess_spec: tuple[str, ...] | None = None,
        extras: dict[str, Any] | None = None,
    ):
        obj = super().__new__(cls, value)
        obj.failed = failed
        obj.postprocess_spec = postprocess_spec
        obj.extras = extras
        return obj

    def __reduce__(self):  # pickling keeps the flags and the shared extras dict (Ray uses pickle)
        return (ScoredFloat, (float(self), self.failed, self.postprocess_spec, self.extras))

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
        self,
        fallback_score: float,
        postprocess_spec: tuple[str, ...] | None = None,
        *,
        exclude_failures: bool = False,
    ) -> dict[str, Any]:
        """The dict verl's ``run_single`` returns. Failed samples score ``fallback_score``; with
        ``exclude_failures`` (``on_failure: exclude``) they are also flagged ``excluded``, for the
        trainer to give them no gradient. Every sample carries ``excluded``, so the keys agree."""
        failed = not self.ok or self.score is None
        value = fallback_score if failed else float(self.score)  # type: ignore[arg-type]
        extra = ExtraInfo((k, _scalar(v)) for k, v in self.extras.items())
        extra["status"] = self.status.value
        extra["latency_s"] = round(float(self.latency_s), 6)
        extra["attempts"] = int(self.attempts)
        extra["failure_reason"] = self.failure_reason
        extra["excluded"] = bool(failed and exclude_failures)
        return {
            "reward_score": ScoredFloat(value, failed, postprocess_spec, extras=extra),
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


def extras_fill_values(
    infos: Sequence[Mapping[str, Any]], known: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Key -> value for a sample that lacks it, for every key any of ``infos`` (or ``known``) has.

    ``known`` fill values win (declared ``extra_defaults``, or values learned earlier); otherwise the
    neutral value of the first sample's value for that key. Key order: first appearance in ``infos``,
    then ``known``.
    """
    known = known or {}
    fills: dict[str, Any] = {}
    for info in infos:
        for key, value in info.items():
            if key not in fills:
                fills[key] = known[key] if key in known else neutral_value(value)
    for key, value in known.items():
        fills.setdefault(key, value)
    return fills


def fill_missing_extras(infos: Sequence[dict[str, Any]], known: Mapping[str, Any] | None = None) -> None:
    """Give every dict of ``infos`` every key any of them has (in place), with neutral values."""
    fills = extras_fill_values(infos, known)
    for info in infos:
        for key, value in fills.items():
            info.setdefault(key, value)


def _short(text: str) -> str:
    text = str(text)
    if len(text) > EXTRA_STRING_MAX_CHARS:
        return text[: EXTRA_STRING_MAX_CHARS - 3] + "..."
    return text


def _scalar(value: Any) -> Any:
    """Extras must be scalars or short strings: verl stacks them into numpy arrays per key. Anything
    else is shown by its ``repr``; a value that cannot even be shown becomes a placeholder."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    try:
        if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            item = value.item()  # a numpy scalar or 0-d array may hold a long str or any object
            return item if item is None or isinstance(item, (bool, int, float)) else _scalar_text(item)
        return _scalar_text(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _scalar_text(value: Any) -> str:
    return _short(value if isinstance(value, str) else repr(value))


MAX_ABS_SCORE = 1e15
"""The largest magnitude a score may have. verl trains on rewards in float32: a score of 1e39 made
the sample's write fail (and its group be dropped) though it reported ``ok``, and two of 3e38 gave a
group NaN advantages (the float32 mean overflows). Below this bound the mean, and the square of any
difference a group-normalised advantage sums (for groups up to about 10^7 samples), stay finite;
no reward worth training on comes near it."""


def as_score(value: Any) -> float | None:
    """A finite float from a real number (``int``, ``float``, ``bool``, numpy numbers, or a 0-d numpy
    array / torch tensor holding one); None for anything else, text included (``"0.7"`` is a string
    the scorer returned, not a score), for a number that is not finite as a float (NaN, inf,
    ``10**400``), and for one past :data:`MAX_ABS_SCORE`."""
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    try:
        if (
            not isinstance(value, numbers.Real)
            and getattr(value, "ndim", None) == 0
            and hasattr(value, "item")
        ):
            value = value.item()  # a 0-d array or tensor (torch.tensor(0.5))
        if isinstance(value, (bool, np.bool_)):
            return float(value)
        if not isinstance(value, numbers.Real):
            return None
        score = float(value)
    except Exception:  # OverflowError (10**400), a __float__ that raises, ...
        return None
    return score if math.isfinite(score) and abs(score) <= MAX_ABS_SCORE else None


def normalize_user_result(value: Any) -> RewardResult:
    """Turn what a user function returned into a ``RewardResult``.

    Accepted: a real number (see :func:`as_score`); a dict with ``score`` (other keys become
    extras); a ``(score, query, explanation)`` tuple (the recipe's contract); a ``RewardResult``.
    Anything else, text and ``None`` included, or a score that is not a finite real number gives
    status ``invalid`` with the reason.
    """
    if isinstance(value, RewardResult):
        return value
    if isinstance(value, dict):
        if "score" not in value:
            keys = sorted(map(str, value))
            return RewardResult.failure(Status.INVALID, f"dict result has no 'score' key (keys: {keys})")
        score = as_score(value["score"])
        extras = {k: v for k, v in value.items() if k not in ("score", "reward_score")}
        if score is None:
            return RewardResult.failure(
                Status.INVALID, f"score is not a finite real number: {_shown(value['score'])}"
            )
        return RewardResult(score=score, extras=extras)
    if isinstance(value, tuple) and len(value) == 3:
        score = as_score(value[0])
        if score is None:
            return RewardResult.failure(
                Status.INVALID, f"score is not a finite real number: {_shown(value[0])}"
            )
        return RewardResult(score=score, extras={"judge_query": value[1], "judge_explanation": value[2]})
    if value is None:
        return RewardResult.failure(Status.INVALID, "reward function returned None")
    score = as_score(value)
    if score is None:
        return RewardResult.failure(Status.INVALID, f"unusable score {_shown(value)}")
    return RewardResult(score=score)


def _shown(value: Any) -> str:
    """``repr(value)`` and its type, cut short, and why a real number past :data:`MAX_ABS_SCORE` is
    no score; never raises (a user's ``__repr__`` may)."""
    try:
        text = repr(value)
    except Exception:
        text = "<unprintable>"
    if len(text) > 80:
        text = text[:77] + "..."
    shown = f"{text} of type {type(value).__name__}"
    try:
        too_large = isinstance(value, numbers.Real) and MAX_ABS_SCORE < abs(float(value)) < math.inf
    except Exception:  # 10**400 overflows float(): not finite, said as such
        too_large = False
    return f"{shown} (past {MAX_ABS_SCORE:g} in magnitude: verl trains on float32)" if too_large else shown
