"""The verdict weighted by the judge's own token probabilities (issue 29, item 3).

The rule (``async_reward.judge.expected``) on token lists shaped as vLLM and OpenAI return them
(``token``, ``logprob``, ``bytes``, ``top_logprobs``), including tokenizers that split ``10`` into
``1`` ``0``; then ``llm_judge`` over real HTTP against the local judge, whose replies carry
log-probabilities when asked, and a server that returns none.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from async_reward import ConfigError
from async_reward.config import JudgeConfig, load_config
from async_reward.judge.expected import (
    MALFORMED_LOGPROBS,
    NO_LOGPROBS,
    ExpectedVerdict,
    reply_tokens,
    say_unweighted,
)
from async_reward.judge.verdict import VerdictRules, read_verdict, verdict_spans
from async_reward.managers import LLMJudgeRewardManager
from async_reward.managers.llm_judge import weigh_reply_verdict
from async_reward.training.metrics import extras_metrics
from tests.managers.test_managers import judge_settings, score_rows
from tests.support.hostile_text import PROPERTY

BRACKETS = VerdictRules(parser="brackets", position="end", on_conflict="refuse", think="leading")


def entry(
    token: str, p: float = 1.0, *alternatives: tuple[str, float], raw: bytes | None = None
) -> dict[str, Any]:
    """One ``logprobs.content`` entry: ``token`` sampled with probability ``p``, plus alternatives."""
    data = raw if raw is not None else token.encode()
    listed = [(token, p), *alternatives]
    return {
        "token": token,
        "logprob": math.log(p),
        "bytes": list(data),
        "top_logprobs": [{"token": t, "logprob": math.log(q), "bytes": list(t.encode())} for t, q in listed],
    }


#: The tokens of ``Verdict: [[`` (each certain), before the verdict's own.
OPENING = (entry("Verdict"), entry(":"), entry(" "), entry("[["))


def completion(content: str, entries: list[dict[str, Any]] | None, **message: Any) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "message": {"role": "assistant", "content": content, **message},
        "finish_reason": "stop",
    }
    if entries is not None:
        choice["logprobs"] = {"content": entries}
    return {"choices": [choice]}


def weigh(content: str, entries: list[dict[str, Any]], rules: VerdictRules = BRACKETS, **scale: float) -> Any:
    reply = completion(content, entries)
    verdict = read_verdict(content, rules)
    return weigh_reply_verdict(
        reply, rules, verdict, min_score=scale.get("low", 0), max_score=scale.get("high", 10)
    )


# ------------------------------------------------------------------------------- the rule


def test_a_one_token_verdict_is_the_mean_over_its_alternatives():
    content = "Fine.\nVerdict: [[7]]"
    entries = [
        entry("Fine"),
        entry("."),
        entry("\n"),
        *OPENING,
        entry("7", 0.6, ("8", 0.3), ("6", 0.1)),
        entry("]]"),
    ]
    result = weigh(content, entries)
    assert isinstance(result, ExpectedVerdict)
    assert result.value == pytest.approx(0.6 * 7 + 0.3 * 8 + 0.1 * 6) and result.mass == pytest.approx(1.0)


def test_ten_split_into_one_and_zero_is_weighed_along_the_sampled_digits():
    """A digit-splitting tokenizer (Qwen, Llama 3) writes 10 as ``1`` ``0``: P(10) = P(1) P(0 | 1);
    the ``]]`` that was as possible after the ``1`` is a verdict of 1; other first digits end there."""
    content = "Verdict: [[10]]"
    entries = [
        *OPENING,
        entry("1", 0.5, ("9", 0.3), ("8", 0.2)),
        entry("0", 0.8, ("]]", 0.2)),
        entry("]]"),
    ]
    result = weigh(content, entries)
    expected = 0.5 * 0.8 * 10 + 0.5 * 0.2 * 1 + 0.3 * 9 + 0.2 * 8
    assert result.value == pytest.approx(expected) and result.mass == pytest.approx(1.0)


def test_a_digit_possible_after_the_verdict_makes_a_longer_one():
    """Sampled ``1``, then ``]]``; a ``0`` as likely there would have written 10."""
    content = "Verdict: [[1]]"
    entries = [
        *OPENING,
        entry("1", 0.6, ("9", 0.4)),
        entry("]]", 0.7, ("0", 0.3)),
    ]
    result = weigh(content, entries)
    assert result.value == pytest.approx(0.6 * 0.7 * 1 + 0.6 * 0.3 * 10 + 0.4 * 9)


def test_an_empty_token_after_the_verdict_ends_it():
    """An empty token after a ``1`` that 10 could continue (a SentencePiece ``▁`` or a special token
    rendered as ``""``) writes no digit: it ends the number, so its share is a 1 (review of 2026-12,
    item 4: it was read as a digit never continued and, with no neighbour listed, dropped)."""
    content = "Verdict: [[1]]"
    for end in ("", "<|im_end|>"):
        entries = [*OPENING, entry("1", 0.6, ("9", 0.4)), entry("]]", 0.5, (end, 0.5))]
        result = weigh(content, entries)
        assert result.value == pytest.approx(0.6 * 1 + 0.4 * 9) and result.mass == pytest.approx(1.0)


def test_verdicts_outside_the_scale_and_non_verdicts_are_dropped_and_the_rest_renormalised():
    content = "Verdict: [[9]]"
    entries = [
        *OPENING,
        entry("9", 0.5, ("11", 0.2), ("-", 0.1), ("8", 0.2)),
        entry("]]"),
    ]
    result = weigh(content, entries)
    assert result.value == pytest.approx((0.5 * 9 + 0.2 * 8) / 0.7) and result.mass == pytest.approx(0.7)
    assert 0 <= result.value <= 10


def test_a_verdict_token_with_its_leading_space_is_read():
    rules = VerdictRules(parser="score", position="end", on_conflict="refuse", think="leading")
    entries = [entry("Good"), entry("."), entry(" Score"), entry(":"), entry(" 4", 0.5, (" 5", 0.5))]
    assert weigh("Good. Score: 4", entries, rules).value == pytest.approx(4.5)


def test_a_structured_reply_weighs_its_score_number():
    rules = VerdictRules(parser="structured", position="end", on_conflict="refuse", think="leading")
    content = '{"reasoning": "ok", "score": 3}'
    entries = [
        entry('{"'),
        entry("reasoning"),
        entry('":'),
        entry(' "'),
        entry("ok"),
        entry('",'),
        entry(' "'),
        entry("score"),
        entry('":'),
        entry(" "),
        entry("3", 0.5, ("2", 0.25), ("4", 0.25)),
        entry("}"),
    ]
    assert weigh(content, entries, rules).value == pytest.approx(3.0)


def test_thinking_the_server_returned_apart_comes_before_the_content_in_the_tokens():
    content = "Verdict: [[6]]"
    entries = [
        entry("hmm"),
        entry(" let"),
        entry(" me"),
        entry(" see"),
        *OPENING,
        entry("6", 0.5, ("5", 0.5)),
        entry("]]"),
    ]
    reply = completion(content, entries, reasoning_content="hmm let me see")
    result = weigh_reply_verdict(reply, BRACKETS, 6.0, min_score=0, max_score=10)
    assert result.value == pytest.approx(5.5)


#: A reply whose ``è`` is split over two tokens, then an unsure 8 (0.5, else 9).
TRES_BIEN = "Très bien.\nVerdict: [[8]]"


def tres_bien_entries(first_half: dict[str, Any], second_half: dict[str, Any]) -> list[dict[str, Any]]:
    """The tokens of :data:`TRES_BIEN`, with the two halves of its ``è`` as given."""
    prose = [entry("Tr"), first_half, second_half, entry("s"), entry(" bien"), entry("."), entry("\n")]
    return [*prose, *OPENING, entry("8", 0.5, ("9", 0.5)), entry("]]")]


def test_bytes_of_a_character_split_over_two_tokens_still_align():
    e_grave = "è".encode()
    entries = tres_bien_entries(entry("\ufffd", raw=e_grave[:1]), entry("\ufffd", raw=e_grave[1:]))
    assert weigh(TRES_BIEN, entries).value == pytest.approx(8.5)


def test_vllms_reply_shape_with_its_end_of_sequence_token_and_lossy_bytes_is_weighed():
    """What vLLM 0.24 returns (seen on an H200, 2026-11-27): the end-of-sequence token is the last
    entry (``<|im_end|>``, left out of the reply's text), and a character split over two tokens is
    U+FFFD in each token's ``bytes``. Both left every served-judge sample unweighted before."""
    entries = [*tres_bien_entries(entry("\ufffd"), entry("\ufffd")), entry("<|im_end|>")]
    result = weigh(TRES_BIEN, entries)
    assert isinstance(result, ExpectedVerdict) and result.value == pytest.approx(8.5)
    assert weigh(
        "Verdict: [[7]]", [*OPENING, entry("7", 0.6, ("8", 0.4)), entry("]]"), entry("<|im_end|>")]
    ).value == (pytest.approx(7.4))


def test_the_reply_must_end_on_a_token_boundary_of_what_the_tokens_spell():
    """Text after the reply is the server's own tokens, never the end of a reply token."""
    entries = [*OPENING, entry("7", 0.6, ("8", 0.4)), entry("]]</s>")]
    assert weigh("Verdict: [[7]]", entries) == "tokens do not spell the reply"


def test_a_digits_only_alternative_that_a_longer_verdict_could_start_is_shared_by_its_neighbours():
    """On a 0-10 scale a digit-splitting tokenizer writes 10 as ``1`` ``0``: an alternative ``1``
    whose continuation was never generated may be 1 or 10. Its neighbours inside the scale tell
    which (issue 42, item 16): beside a sampled 9 it is 10; beside a 0 alone (the GPU run's judge,
    constrained to ``[[0]]`` or ``[[10]]``, listed exactly that ``1``) nothing tells, and it is left
    out, the mass saying so."""
    gpu = weigh("Verdict: [[0]]", [*OPENING, entry("0", 0.7, ("1", 0.3)), entry("]]"), entry("<|im_end|>")])
    assert gpu.value == 0.0 and gpu.mass == pytest.approx(0.7)
    torn = weigh("Verdict: [[9]]", [*OPENING, entry("9", 0.6, ("1", 0.3), ("8", 0.1)), entry("]]")])
    assert torn.value == pytest.approx(0.6 * 9 + 0.3 * 10 + 0.1 * 8) and torn.mass == pytest.approx(1.0)
    assert torn.assumed == pytest.approx(0.3)
    # an alternative that holds its own end is a verdict, and so is 1 where no 1x is on the scale
    ended = weigh("Verdict: [[9]]", [*OPENING, entry("9", 0.6, ("1]]", 0.4)), entry("]]")])
    assert ended.value == pytest.approx(0.6 * 9 + 0.4 * 1)
    small = weigh("Verdict: [[4]]", [*OPENING, entry("4", 0.6, ("1", 0.4)), entry("]]")], low=1, high=5)
    assert small.value == pytest.approx(0.6 * 4 + 0.4 * 1)
    # after the verdict: a 0 after a sampled 1 makes 10, which on a 0-100 scale may start 100
    after = weigh(
        "Verdict: [[1]]", [*OPENING, entry("1", 0.6, ("5", 0.4)), entry("]]", 0.5, ("0", 0.5))], high=100
    )
    assert after.value == pytest.approx(0.6 * 0.5 * 1 / (0.6 * 0.5))
    assert after.mass == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("content", "entries", "reason"),
    [
        (
            "Verdict: [[7]]",
            [entry("Verdict"), entry(":"), entry(" "), entry("[[7", 0.5, ("[[8", 0.5)), entry("]]")],
            "verdict shares a token with text before it",
        ),
        (
            "Verdict: [[7]]",
            [*OPENING, entry("7]]", 0.5, ("8]]", 0.5))],
            "verdict shares a token with text after it",
        ),
        ("Verdict: [[7]]", [entry("Verdict"), entry(":"), entry(" [[8]]")], "tokens do not spell the reply"),
        (
            "Verdict: [[7.5]]",
            [
                *OPENING,
                entry("7"),
                entry("."),
                entry("5"),
                entry("]]"),
            ],
            "verdict is not a whole number",
        ),
    ],
)
def test_a_verdict_the_tokens_cannot_weigh_keeps_its_plain_value_and_says_why(content, entries, reason):
    assert weigh(content, entries) == reason


def test_no_logprobs_in_the_reply_is_said():
    assert weigh_reply_verdict(
        completion("Verdict: [[7]]", None), BRACKETS, 7.0, min_score=0, max_score=10
    ) == (NO_LOGPROBS)
    for logprobs in (None, {"content": None}, {"content": []}):
        assert reply_tokens({"logprobs": logprobs}) == NO_LOGPROBS


def _malformed(where: str, key: str, value: Any) -> list[dict[str, Any]]:
    """``Fine.`` then ``Verdict: [[7]]`` weighable, but with ``key`` of the first token (``where``:
    ``token``) or of its first listed alternative (``alternative``) set to ``value``."""
    entries = [entry("Fine"), entry("."), entry("\n"), *OPENING, entry("7", 0.6, ("8", 0.4)), entry("]]")]
    first = entries[0] if where == "token" else entries[0]["top_logprobs"][0]
    first[key] = value
    return entries


@pytest.mark.parametrize(
    ("where", "key", "value", "what"),
    [
        ("token", "logprob", 1e-7, "token 0: logprob 1e-07 is above 0"),
        ("token", "logprob", math.nan, "token 0: logprob nan"),
        ("token", "logprob", "high", "token 0: logprob 'high'"),
        ("token", "logprob", None, "token 0: logprob null"),
        ("token", "top_logprobs", 3, "token 0: top_logprobs is int, not a list"),
        ("token", "top_logprobs", {"x": 1}, "token 0: top_logprobs is dict, not a list"),
        ("token", "token", None, "token 0: no text"),
        ("alternative", "logprob", None, "token 0, alternative 0: logprob null"),
        ("alternative", "logprob", 0.5, "token 0, alternative 0: logprob 0.5 is above 0"),
        # A JSON integer past float's range raised OverflowError out of the weighing: status error, the
        # reply's tokens lost from the cost (review of 2026-11-30).
        (
            "token",
            "logprob",
            -(10**400),
            "token 0: logprob -100000000000000000000000000000000000... is out of range",
        ),
        (
            "alternative",
            "logprob",
            -(10**400),
            "token 0, alternative 0: logprob -100000000000000000000000000000000000... is out of range",
        ),
        # The server sampled the token, so probability 0 is not what it sampled from: a -inf there
        # dropped the written verdict from the candidates and weighed only the unsampled ones.
        ("token", "logprob", -math.inf, "token 0: the sampled token has logprob -inf"),
    ],
)
def test_malformed_logprobs_keep_the_plain_verdict_and_say_what_was_malformed(where, key, value, what):
    """A server's malformed logprobs (review of 2026-12, items 2 and 3) are neither a crash (an
    ``int`` for ``top_logprobs`` raised TypeError: the sample was ``error``) nor "no logprobs" (which
    sends an operator after a server that ignores ``logprobs: true``): the plain verdict, and what."""
    if key == "token":
        entries = _malformed(where, "bytes", None)
        entries[0]["token"] = value
    else:
        entries = _malformed(where, key, value)
    assert weigh("Fine.\nVerdict: [[7]]", entries) == f"{MALFORMED_LOGPROBS}: {what}"


def test_the_log_tells_malformed_logprobs_from_none(capsys, monkeypatch):
    """Said once each, and apart: a reply without probabilities, and one whose probabilities are
    malformed, whatever was malformed in it (one line, not one per token index)."""
    from async_reward._core import start_lines

    monkeypatch.setattr(start_lines, "_SAID", set())
    say_unweighted(NO_LOGPROBS)
    say_unweighted(f"{MALFORMED_LOGPROBS}: token 0: logprob nan")
    say_unweighted(f"{MALFORMED_LOGPROBS}: token 3: logprob 1e-07 is above 0")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert "returned no token probabilities" in lines[0]
    assert "returned malformed token probabilities" in lines[1] and "no token probabilities" not in lines[1]


def test_a_verdict_quoted_from_the_response_is_never_the_one_weighed():
    """The response's ``[[7]]`` quoted early, with the judge's alternatives there leaning to 10; the
    judge's own ``[[7]]`` at the end, certain: the expectation is read at the judge's, so 7."""
    content = 'It says "[[7]]".\nVerdict: [[7]]'
    entries = [
        entry("It"),
        entry(" says"),
        entry(' "'),
        entry("[["),
        entry("7", 0.1, ("10", 0.9)),
        entry("]]"),
        entry('".'),
        entry("\n"),
        *OPENING,
        entry("7"),
        entry("]]"),
    ]
    assert weigh(content, entries).value == pytest.approx(7.0)


def test_disagreeing_verdicts_read_with_the_lowest_are_each_weighed_and_the_lowest_kept():
    """``on_conflict: min``: the quoted 2 (its copy unsure of 3) and the judge's 9 (unsure of 8) are
    both weighed, 2.5 and 8.5: the lowest counts, as the lowest written verdict does plainly."""
    rules = VerdictRules(parser="brackets", position="end", on_conflict="min", think="leading")
    content = "Quoted [[2]].\nVerdict: [[9]]"
    assert read_verdict(content, rules) == 2.0
    assert verdict_spans(content, rules) == [(2.0, (9, 10)), (9.0, (25, 26))]
    entries = [
        entry("Quoted"),
        entry(" [["),
        entry("2", 0.5, ("3", 0.5)),
        entry("]]."),
        entry("\n"),
        *OPENING,
        entry("9", 0.5, ("8", 0.5)),
        entry("]]"),
    ]
    assert weigh(content, entries, rules).value == pytest.approx(2.5)


@PROPERTY
@given(
    verdict=st.integers(0, 10),
    alternatives=st.lists(st.tuples(st.integers(-5, 20), st.floats(0.001, 1.0)), max_size=6),
    sampled_p=st.floats(0.001, 1.0),
)
@example(verdict=10, alternatives=[], sampled_p=0.058060037696649774)  # 10.000000000000002 before the clamp
def test_the_expected_verdict_stays_on_the_scale_and_is_the_verdict_when_certain(
    verdict, alternatives, sampled_p
):
    content = f"Verdict: [[{verdict}]]"
    alts = tuple((str(value), p) for value, p in alternatives if str(value) != str(verdict))
    entries = [
        *OPENING,
        entry(str(verdict), sampled_p, *alts),
        entry("]]"),
    ]
    result = weigh(content, entries)
    assert isinstance(result, ExpectedVerdict) and 0 <= result.value <= 10 and 0 < result.mass <= 1
    certain = weigh(content, [*entries[:4], entry(str(verdict)), entry("]]")])
    assert certain.value == verdict and certain.mass == 1.0


@PROPERTY
@given(
    words=st.lists(
        st.text(st.characters(exclude_categories=("Cs",), exclude_characters="[]"), min_size=1, max_size=4),
        min_size=1,
        max_size=6,
    ),
    verdict=st.integers(0, 10),
    sampled_p=st.floats(0.05, 0.95),  # the neighbour gets the rest: never probability 0
    end_token=st.sampled_from(["", "<|im_end|>", "</s>", "<|eot_id|>"]),
    lossy=st.booleans(),
)
def test_a_servers_own_tokens_after_the_reply_and_lossy_bytes_never_change_the_weighing(
    words, verdict, sampled_p, end_token, lossy
):
    """What a server adds or garbles around the reply (an end token after it, U+FFFD for characters
    split over tokens before the verdict) weighs exactly as the clean reply does."""
    prose = "".join(words)
    content = f"{prose}\nVerdict: [[{verdict}]]"
    neighbour = str(verdict - 1 if verdict > 0 else verdict + 2)
    verdict_entries = [*OPENING, entry(str(verdict), sampled_p, (neighbour, 1.0 - sampled_p)), entry("]]")]

    def prose_entries(garbled: bool) -> list[dict[str, Any]]:
        out = []
        for char in prose:
            data = char.encode()
            if garbled and len(data) > 1:  # split over two tokens, each rendered as U+FFFD
                out += [entry("\ufffd"), entry("\ufffd")]
            else:
                out.append(entry(char))
        return out

    clean = weigh(content, [*prose_entries(False), entry("\n"), *verdict_entries])
    served = [*prose_entries(lossy), entry("\n"), *verdict_entries]
    if end_token:
        served.append(entry(end_token))
    assert isinstance(clean, ExpectedVerdict), clean
    assert weigh(content, served) == clean


# ------------------------------------------------------------------------------- settings


def test_expected_verdict_needs_a_whole_number_scale_and_owns_the_logprobs_fields():
    with pytest.raises(ConfigError) as scale:
        JudgeConfig(base_url="http://x/v1", expected_verdict=True, max_score=9.5).validate()
    assert scale.value.key == "reward.async_reward.judge.expected_verdict"
    with pytest.raises(ConfigError) as owned:
        JudgeConfig(base_url="http://x/v1", expected_verdict=True, extra_body={"top_logprobs": 5}).validate()
    assert owned.value.key == "reward.async_reward.judge.extra_body"
    with pytest.raises(ConfigError) as top:  # derived from the scale, not a key
        load_config({"reward": {"async_reward": {"judge": {"base_url": "http://x/v1", "top_logprobs": 21}}}})
    assert top.value.key == "reward.async_reward.judge.top_logprobs"


# ------------------------------------------------------------------------------- over real HTTP

ROWS = [
    {"prompt": "What is 2+3?", "response": "The answer is 5", "ground_truth": "5"},
    {"prompt": "What is 2+3?", "response": "The answer is 6", "ground_truth": "5"},
]


@pytest.mark.parametrize("parser", ["brackets", "structured"])
async def test_llm_judge_scores_the_expected_verdict_of_the_local_judge(
    server, verl_config_factory, tokenizer, batch_factory, parser
):
    """The local judge puts 0.6 on its verdict and 0.2 on each of the two nearest (10 -> 9, 8;
    0 -> 1, 2) and lists the end-of-sequence token last, as vLLM does. The ``1`` next to a 0 may be
    the first token of 10: its neighbour 2 (10's, 9, is not listed) makes it 1."""
    server.update_config(verdict_probability=0.6, logprobs_end_token="<|im_end|>")
    settings = judge_settings(server, judge={"expected_verdict": True, "parser": parser})
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    outputs = await score_rows(manager, batch_factory, ROWS)
    right, wrong = (output["reward_extra_info"] for output in outputs)
    assert right["status"] == wrong["status"] == "ok"
    assert right["judge_verdict"] == 10 and right["judge_expected_verdict"] == pytest.approx(9.4)
    assert wrong["judge_verdict"] == 0 and wrong["judge_expected_verdict"] == pytest.approx(0.6)
    assert float(outputs[0]["reward_score"]) == pytest.approx(0.94)
    assert float(outputs[1]["reward_score"]) == pytest.approx(0.06)
    assert right["judge_weighting"] == wrong["judge_weighting"] == "expected"
    assert right["judge_verdict_mass"] == pytest.approx(1.0)
    assert wrong["judge_verdict_mass"] == pytest.approx(1.0)
    assert extras_metrics([right, wrong])["reward/extra/judge_weighted/mean"] == 1.0


async def test_a_judge_without_logprobs_keeps_plain_verdicts_and_says_so(
    server, verl_config_factory, tokenizer, batch_factory, capsys, monkeypatch
):
    from async_reward._core import start_lines

    monkeypatch.setattr(start_lines, "_SAID", set())
    server.update_config(verdict_probability=0.6, logprobs="ignore")
    settings = judge_settings(server, judge={"expected_verdict": True})
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    outputs = await score_rows(manager, batch_factory, ROWS)
    infos = [output["reward_extra_info"] for output in outputs]
    assert [float(output["reward_score"]) for output in outputs] == [1.0, 0.0]
    assert all(info["judge_weighting"] == f"plain: {NO_LOGPROBS}" for info in infos)
    assert all(math.isnan(info["judge_expected_verdict"]) for info in infos)
    assert extras_metrics(infos)["reward/extra/judge_weighted/mean"] == 0.0  # visible in the step's metrics
    said = [line for line in capsys.readouterr().out.splitlines() if "expected_verdict is on" in line]
    assert len(said) == 1  # once, not once a sample


async def test_replies_left_unweighted_say_each_reason_once_in_the_log(
    server, verl_config_factory, tokenizer, capsys, monkeypatch
):
    """Weighting turned on but failing for every reply (the H200 run of 2026-11-27: vLLM's reply
    shape) must be visible: each reason once in the log, and in the metrics."""
    from async_reward._core import start_lines

    monkeypatch.setattr(start_lines, "_SAID", set())
    settings = judge_settings(server, judge={"expected_verdict": True})
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    unspelled = completion("Verdict: [[7]]", [entry("Verdict"), entry(":"), entry(" [[8]]")])
    for _ in range(3):
        score, extras = manager._weigh(unspelled, 7.0)
        assert score == 7.0 and extras == {
            "judge_weighted": 0.0,
            "judge_weighting": "plain: tokens do not spell the reply",
        }
    said = [line for line in capsys.readouterr().out.splitlines() if "expected_verdict is on" in line]
    assert len(said) == 1 and "tokens do not spell the reply" in said[0]


async def test_without_expected_verdict_nothing_asks_for_or_reads_probabilities(
    server, verl_config_factory, tokenizer, batch_factory
):
    server.update_config(verdict_probability=0.6)
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", judge_settings(server)), tokenizer)
    outputs = await score_rows(manager, batch_factory, ROWS)
    assert [float(output["reward_score"]) for output in outputs] == [1.0, 0.0]
    assert "judge_weighting" not in outputs[0]["reward_extra_info"]


@pytest.mark.parametrize("fmt", ["brackets", "boxed", "score", "json"])
@pytest.mark.parametrize(
    ("style", "think"), [("verdict-last", False), ("verdict-last", True), ("verdict-then-quote", True)]
)
async def test_every_reply_shape_of_the_local_judge_is_weighed_at_the_judges_own_verdict(
    server, verl_config_factory, tokenizer, batch_factory, fmt, style, think
):
    """Thinking with decoy verdicts first, the response quoted before or after the verdict: the
    expectation is always the one at the judge's own verdict."""
    server.update_config(
        verdict_probability=0.75, verdict_format=fmt, judge_style=style, think=think, echo_response=True
    )
    position = "anywhere" if style == "verdict-then-quote" else "end"
    settings = judge_settings(
        server, judge={"expected_verdict": True, "parser": fmt, "verdict_position": position}
    )
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    outputs = await score_rows(manager, batch_factory, ROWS)
    infos = [output["reward_extra_info"] for output in outputs]
    assert [info["judge_weighting"] for info in infos] == ["expected", "expected"], infos
    assert [info["judge_expected_verdict"] for info in infos] == [
        pytest.approx(0.75 * 10 + 0.125 * 9 + 0.125 * 8),
        pytest.approx(0.125 * 1 + 0.125 * 2),  # the 1 beside a 0 (its neighbour 2 listed) is 1
    ]


async def test_the_local_judge_refuses_malformed_logprobs_fields(server):
    import aiohttp

    for knob in ({"verdict_probability": 0.0}, {"verdict_probability": 1.5}, {"logprobs": "sometimes"}):
        with pytest.raises(ValueError):
            server.update_config(**knob)

    body = {"model": "judge", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        for extra in ({"logprobs": "yes"}, {"logprobs": True, "top_logprobs": 21}, {"top_logprobs": 3}):
            async with session.post(f"{server.url}/v1/chat/completions", json={**body, **extra}) as reply:
                assert reply.status == 400, extra
        async with session.post(
            f"{server.url}/v1/chat/completions", json={**body, "logprobs": True, "top_logprobs": 2}
        ) as reply:
            choice = (await reply.json())["choices"][0]
    spelled = "".join(token["token"] for token in choice["logprobs"]["content"])
    assert spelled == choice["message"]["content"]
    assert all(len(token["top_logprobs"]) <= 2 for token in choice["logprobs"]["content"])


async def test_a_judge_unsure_in_different_measure_breaks_a_groups_tie(
    server, verl_config_factory, tokenizer, batch_factory
):
    """Three correct responses of one group: the same plain verdict (10, 10, 10: zero advantage), but
    the local judge's confidence differs by response text, so the expected verdicts differ; the same
    text twice gets the same one."""
    server.update_config(verdict_probability=0.95, verdict_probability_low=0.55)
    settings = judge_settings(server, judge={"expected_verdict": True})
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    texts = ["The answer is 5", "So it is 5", "Adding gives 5", "The answer is 5"]
    rows = [
        {"prompt": f"What is 2+3? ({i})", "response": text, "ground_truth": "5"}
        for i, text in enumerate(texts)
    ]
    infos = [output["reward_extra_info"] for output in await score_rows(manager, batch_factory, rows)]
    assert [info["judge_verdict"] for info in infos] == [10, 10, 10, 10]
    expected = [info["judge_expected_verdict"] for info in infos]
    assert len(set(expected[:3])) == 3 and all(9.55 <= value <= 9.95 for value in expected)
    assert expected[3] == expected[0]
    with pytest.raises(ValueError):
        server.update_config(verdict_probability_low=0.99)  # above verdict_probability
