"""``reward.async_reward.judge``: the LLM judge's endpoint, prompt, verdict rules, rubric, group
mode, weighting and pricing.

Longer than 400 lines: one dataclass, a docstring per field (about 40 fields) and the rules
between them; what the fields mean is the judge's documentation."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from async_reward._core.config_rules import (
    at_least,
    bad_value,
    in_range,
    missing_value,
    rule,
    validate_fields,
)
from async_reward._core.result import MAX_ABS_SCORE
from async_reward.config._shared import (
    _URL_FIX,
    CONFIG_PATH,
    _env_name,
    _is_url,
    _refuse_url_credentials_beside,
    _repr_hiding_url_secrets,
    _require_env,
)
from async_reward.judge.cost import JudgePricing
from async_reward.judge.rubric.criteria import Criterion

__all__ = ["MAX_TOP_LOGPROBS", "JudgeConfig", "scale_top_logprobs"]

#: Request fields the judge config sets itself; ``judge.extra_body`` may not override them.
#: ``max_completion_tokens`` is the OpenAI API's newer name for ``max_tokens`` (vLLM reads it first):
#: set in ``extra_body`` it would replace ``judge.max_tokens``, which the prompt-room checks read.
_JUDGE_OWN_FIELDS = ("model", "messages", "temperature", "max_tokens", "max_completion_tokens", "stream", "n")
#: Most alternatives a token OpenAI's API and vLLM list (``top_logprobs`` above it is refused, HTTP 400).
MAX_TOP_LOGPROBS = 20


def scale_top_logprobs(min_score: float, max_score: float) -> int:
    """The ``top_logprobs`` ``expected_verdict`` asks for on the scale ``[min_score, max_score]``.

    Two per whole-number verdict on the scale, at most :data:`MAX_TOP_LOGPROBS`: the rule of
    ``async_reward.judge.expected`` weighs every verdict the server lists at a place, in each of its
    spellings (``" 7"`` and ``"7"`` at the first place), so one per verdict could leave half the scale
    unlisted. 0-10 asks for 20 (the cap), pass/fail 0-1 for 4. A scale of more than 10 verdicts asks
    for the cap, as a fixed 20 did: the verdicts not listed are left out, and each sample's
    ``judge_verdict_mass`` says how much probability the listed ones covered. A rubric's criteria
    are graded on the judge's one scale, so they need the same number."""
    verdicts = math.floor(max_score) - math.ceil(min_score) + 1
    return max(1, min(MAX_TOP_LOGPROBS, 2 * verdicts))


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
    """The one verdict format read from the reply (see ``async_reward.judge.verdict``): ``brackets``
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
    """Rubric judging (``async_reward.judge.rubric.criteria``): weighted criteria, each a mapping with
    ``name``, ``description``, and optionally ``weight`` (1), ``polarity`` (``positive`` / ``negative``) and
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
    by the rule in ``async_reward.judge.expected`` (ties broken, less variance). A reply without
    them keeps its plain verdict, said in the log and in each sample's ``judge_weighting``. Needs a
    whole-number verdict scale. With ``criteria``, each criterion's verdict is weighed at its own line
    (``judge.rubric.weighting``): all of a sample's criteria, or none, with the reason; a criterion
    counted at a quoted line's lower written number says so."""
    mode: Literal["pointwise", "group"] = "pointwise"
    """``pointwise``: one verdict per response, one call each. ``group``: the members of a GRPO group
    (the samples sharing a ``uid``, ``actor_rollout_ref.rollout.n`` of them) graded together in one
    call, listed in a shuffled order, one ``R<k>: [[n]]`` line each, each member's verdict normalised
    as a pointwise one (``async_reward.judge.group.judging``). It needs the whole group in one reward
    worker: our pipelined trainer or manager, our v1 agent loop (which routes by ``uid``), or one
    reward worker; it is refused at start-up elsewhere (``async_reward.judge.group.placement``)."""
    group_wait_s: float | None = field(
        default=None, metadata=in_range(1e-3, 86400, "give the seconds a group's members may take to arrive")
    )
    """With ``mode: group``: how long a worker waits, from a group's first member, for the rest of it
    (null: 600). When it passes, every member that arrived fails with status ``timeout`` and the
    count that arrived (never a partial group judged, never a wait without end). Where sessions are
    scored as they finish generating (verl's agent loop), it must cover the spread of generation
    times inside a group."""
    group_shuffle: bool = True
    """With ``mode: group``: list the members in an order shuffled per call (seeded by the group's
    ``uid``), so a judge's position bias favours no member systematically. False: arrival order
    (for measuring that bias); refused without ``mode: group``."""
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

    def __repr__(self) -> str:
        """The fields, with :attr:`base_url`'s ``user:password@`` and query shown as ``<hidden>``."""
        return _repr_hiding_url_secrets(self, ("base_url",))

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
        from async_reward.judge.prompts import resolve_parser, resolve_template
        from async_reward.judge.verdict import CONFLICT_RULES, PARSERS, POSITIONS, THINK_MODES

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
        if self.parser == "structured":
            # The reply is one JSON object, read whole: no text follows a verdict, and there is no
            # second verdict to disagree with (judge.verdict's read_verdict never reads these two).
            conflicts = [
                (
                    "verdict_position",
                    self.verdict_position != "end",
                    "the reply is one JSON object, read whole, so no text can follow its verdict",
                ),
                (
                    "on_conflict",
                    self.on_conflict != "refuse",
                    "the reply is one JSON object with one score, so no verdicts can disagree",
                ),
            ]
            self._refuse_conflicts(
                path,
                conflicts,
                "judge.parser=structured",
                "use a text parser (judge.parser=json reads the same object from the reply's text)",
            )

    def validate(self, path: str = f"{CONFIG_PATH}.judge") -> None:
        """Check every value (not what ``llm_judge`` requires to run: see :meth:`require`)."""
        validate_fields(self, path)
        key_from = f"{path}.api_key_env" if self.api_key_env is not None else None
        _refuse_url_credentials_beside(self.base_url, f"{path}.base_url", key_from)
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
        rewards = self.normalize_to if self.normalize_to is not None else (self.min_score, self.max_score)
        if max(abs(rewards[0]), abs(rewards[1])) > MAX_ABS_SCORE:
            key = f"{path}.normalize_to" if self.normalize_to is not None else f"{path}.max_score"
            raise bad_value(
                key,
                list(rewards) if self.normalize_to is not None else self.max_score,
                f"gives rewards past {MAX_ABS_SCORE:g} in magnitude, which verl's float32 training cannot "
                "hold (a group's advantage would be NaN)",
                "write the reward range you train on with judge.normalize_to, e.g. [0, 1]",
            )
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
        self._validate_criteria(path)
        self._validate_group(path)
        own = set(_JUDGE_OWN_FIELDS) | ({"logprobs", "top_logprobs"} if self.expected_verdict else set())
        overridden = sorted(set(self.extra_body) & own)
        if overridden:
            raise bad_value(
                f"{path}.extra_body",
                overridden,
                "would override request fields the judge config sets",
                "set judge.model / temperature / max_tokens / template instead (logprobs and "
                "top_logprobs follow judge.expected_verdict and the scale; stream and n are not "
                "supported: one complete reply is read per call)",
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
            # group_shuffle: true is the default, so only false says it was meant for a group.
            for key, is_set in (
                ("group_wait_s", self.group_wait_s is not None),
                ("group_shuffle", self.group_shuffle is not True),
            ):
                if is_set:
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
        """The ``top_logprobs`` a request with ``expected_verdict`` asks for, derived from the scale
        (:func:`scale_top_logprobs`)."""
        return scale_top_logprobs(self.min_score, self.max_score)

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
