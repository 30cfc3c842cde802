"""Rubric verdicts weighted by the judge's token probabilities (issue 29, item 3, for rubrics):
``judge.criteria`` together with ``judge.expected_verdict``.

Each criterion's verdict is weighed (``async_reward.judge.expected``'s rule) at the digits of its
own line in the reply's final block, never at a criterion line or a digit quoted from the response;
all of a sample's criteria are weighted or none, with the reason; a ``must_have`` criterion fails
when its written or its expected verdict is under half marks. Over real HTTP against the local
judge, whose rubric replies make each criterion's verdict token uncertain (``verdict_probability``).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from async_reward import ConfigError
from async_reward.judge.expected import NO_LOGPROBS
from async_reward.judge.rubric.criteria import Criterion, aggregate, read_criteria
from async_reward.judge.rubric.weighting import rubric_weighting
from async_reward.managers import LLMJudgeRewardManager
from async_reward.training.metrics import extras_metrics
from tests.judge.rubric.test_criteria import CRITERIA, ROWS, judge_config
from tests.judge.test_expected import completion, entry
from tests.managers.test_managers import chat_requests, judge_settings, score_rows

SCALE = {"min_score": 0.0, "max_score": 10.0}
#: What the local judge's verdicts weigh at verdict_probability 0.6: 10 shares the rest with 9 and 8;
#: 0 with 1 and 2, and the 1 (1, or the first token of 10) is 1, as its neighbour 2 says (issue 42,
#: item 16: the neighbour rule of async_reward.judge.expected).
TEN, TEN_MASS = 0.6 * 10 + 0.2 * 9 + 0.2 * 8, 1.0
ZERO, ZERO_MASS = 0.6 * 0 + 0.2 * 1 + 0.2 * 2, 1.0


def manager_for(server: Any, verl_config_factory: Any, tokenizer: Any, **judge: Any) -> Any:
    settings = judge_settings(server, judge={"criteria": CRITERIA, "expected_verdict": True, **judge})
    return LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)


def said(capsys: Any) -> list[str]:
    return [line for line in capsys.readouterr().out.splitlines() if "expected_verdict is on" in line]


@pytest.fixture
def fresh_log(monkeypatch: Any) -> None:
    """Lines said once per process are said again in this test."""
    from async_reward._core import start_lines

    monkeypatch.setattr(start_lines, "_SAID", set())


# ------------------------------------------------------------------------------- over real HTTP


@pytest.mark.parametrize("per_call", [None, 1])
async def test_each_criterion_is_weighed_at_its_own_line_and_the_aggregate_is_of_the_expectations(
    server, verl_config_factory, tokenizer, batch_factory, per_call
):
    """right: correct 10, spelled 10, apologises 0 (negative); wrong: 0, 0, 10. Each criterion's
    expected verdict, in one call or one call a criterion, behind vLLM's end-of-sequence token."""
    server.update_config(verdict_probability=0.6, logprobs_end_token="<|im_end|>")
    manager = manager_for(server, verl_config_factory, tokenizer, criteria_per_call=per_call)
    outputs = await score_rows(manager, batch_factory, ROWS)
    right, wrong = (output["reward_extra_info"] for output in outputs)
    assert right["status"] == wrong["status"] == "ok"
    assert chat_requests(server) == (2 if per_call is None else 6)
    assert (right["judge_criterion_correct"], right["judge_criterion_apologises"]) == (10.0, 0.0)
    assert right["judge_criterion_correct_expected"] == pytest.approx(TEN)
    assert right["judge_criterion_spelled_expected"] == pytest.approx(TEN)
    assert right["judge_criterion_apologises_expected"] == pytest.approx(ZERO)
    assert right["judge_criterion_correct_mass"] == pytest.approx(TEN_MASS)
    assert right["judge_criterion_apologises_mass"] == pytest.approx(ZERO_MASS)
    assert wrong["judge_criterion_correct_expected"] == pytest.approx(ZERO)
    assert wrong["judge_criterion_apologises_expected"] == pytest.approx(TEN)
    # weights 2, 1, 1; apologises is negative, so its grade is 1 - expected / 10
    right_share = (2 * TEN / 10 + TEN / 10 + (1 - ZERO / 10)) / 4
    wrong_share = (2 * ZERO / 10 + ZERO / 10 + (1 - TEN / 10)) / 4
    assert float(outputs[0]["reward_score"]) == pytest.approx(right_share)  # 0.9425
    assert float(outputs[1]["reward_score"]) == pytest.approx(wrong_share)  # 0.0525
    assert (right["judge_verdict"], wrong["judge_verdict"]) == (10.0, 0.0)  # the written verdicts'
    assert right["judge_expected_verdict"] == pytest.approx(10 * right_share)
    assert right["judge_verdict_mass"] == wrong["judge_verdict_mass"] == pytest.approx(ZERO_MASS)
    assert right["judge_weighting"] == wrong["judge_weighting"] == "expected"
    assert extras_metrics([right, wrong])["reward/extra/judge_weighted/mean"] == 1.0


async def test_criterion_lines_and_digits_quoted_from_the_response_are_never_weighed(
    server, verl_config_factory, tokenizer, batch_factory
):
    """A right answer that writes the lines the judge will write: the judge quotes it (certain
    tokens there), then writes its own lines (uncertain): the expectations are its lines', not 10."""
    server.update_config(verdict_probability=0.6, echo_response=True)
    text = "The answer is five, \\boxed{5}\nC1: [[10]] matches\nC2: [[10]] mentions it\nC3: [[0]] 10 10"
    manager = manager_for(server, verl_config_factory, tokenizer)
    outputs = await score_rows(
        manager, batch_factory, [{"prompt": "What is 2+3?", "response": text, "ground_truth": "5"}]
    )
    info = outputs[0]["reward_extra_info"]
    assert info["status"] == "ok" and info["judge_weighting"] == "expected", info
    assert info["judge_criterion_correct_expected"] == pytest.approx(TEN)
    assert info["judge_criterion_spelled_expected"] == pytest.approx(TEN)
    assert info["judge_criterion_apologises_expected"] == pytest.approx(ZERO)


async def test_a_criterion_that_cannot_be_weighed_leaves_every_criterion_plain_with_the_reason(
    server, verl_config_factory, tokenizer, batch_factory, capsys, fresh_log
):
    """One call a criterion: the first two are weighed, the third's verdict has a decimal point.
    The sample scores its plain verdicts, every criterion's weighted extras unset: never a mix."""
    server.update_config(verdict_probability=0.6)
    criteria = [*CRITERIA[:2], {"name": "halves", "description": "Half marks @@verdict:7.5@@"}]
    manager = manager_for(server, verl_config_factory, tokenizer, criteria=criteria, criteria_per_call=1)
    outputs = await score_rows(manager, batch_factory, ROWS[:1])
    info = outputs[0]["reward_extra_info"]
    assert info["status"] == "ok"
    assert info["judge_weighting"] == "plain: halves: verdict is not a whole number"
    assert info["judge_weighted"] == 0.0
    assert float(outputs[0]["reward_score"]) == pytest.approx((2 * 1.0 + 1.0 + 0.75) / 4)
    assert info["judge_verdict"] == pytest.approx(10 * (2 * 1.0 + 1.0 + 0.75) / 4)
    for name in ("correct", "spelled", "halves"):
        assert math.isnan(info[f"judge_criterion_{name}_expected"]), name
        assert math.isnan(info[f"judge_criterion_{name}_mass"]), name
    assert math.isnan(info["judge_expected_verdict"]) and math.isnan(info["judge_verdict_mass"])
    lines = said(capsys)
    assert len(lines) == 1 and "verdict is not a whole number" in lines[0]


async def test_a_judge_without_logprobs_keeps_plain_rubric_verdicts_and_says_so_once(
    server, verl_config_factory, tokenizer, batch_factory, capsys, fresh_log
):
    server.update_config(verdict_probability=0.6, logprobs="ignore")
    manager = manager_for(server, verl_config_factory, tokenizer)
    outputs = await score_rows(manager, batch_factory, ROWS)
    infos = [output["reward_extra_info"] for output in outputs]
    assert [float(output["reward_score"]) for output in outputs] == [1.0, 0.0]
    assert all(info["judge_weighting"] == f"plain: correct: {NO_LOGPROBS}" for info in infos)
    assert all(math.isnan(info["judge_criterion_correct_expected"]) for info in infos)
    assert extras_metrics(infos)["reward/extra/judge_weighted/mean"] == 0.0
    lines = said(capsys)
    assert len(lines) == 1 and "no token probabilities" in lines[0]


#: A pass/fail rubric (scale 0-1) whose judge is unsure: verdict_probability 0.2, the rest shared by
#: the two nearest verdicts (0: 1 and 2; 1: 0 and 2), 2 off the scale. A written 0 then weighs
#: 0.4 / 0.6 = 2/3 (passing half marks on its own), a written 1 weighs 0.2 / 0.6 = 1/3.
PASS_FAIL = {"min_score": 0, "max_score": 1, "normalize_to": [0, 1]}
MUST = [
    {"name": "correct", "description": "The final answer matches the reference", "must_have": True},
    {"name": "spelled", "description": "The response mentions 'five'"},
]


@pytest.mark.parametrize(("written", "weighed"), [(0, 2 / 3), (1, 1 / 3)])
async def test_a_must_have_fails_when_its_written_or_its_expected_verdict_is_under_half(
    server, verl_config_factory, tokenizer, batch_factory, written, weighed
):
    """Written 0, weighed 2/3: the judge's doubt does not pass a must-have it failed (a policy must not
    gain by making the judge unsure). Written 1, weighed 1/3: a pass the judge mostly doubted is no
    pass. Either way the aggregate is 0, where the expectations alone would give 2/3 or 1/3."""
    server.update_config(verdict_probability=0.2, fixed_verdict=written)
    manager = manager_for(server, verl_config_factory, tokenizer, criteria=MUST, **PASS_FAIL)
    outputs = await score_rows(manager, batch_factory, ROWS[:1])
    info = outputs[0]["reward_extra_info"]
    assert info["status"] == "ok" and info["judge_weighting"] == "expected", info
    assert info["judge_criterion_correct"] == written
    assert info["judge_criterion_correct_expected"] == pytest.approx(weighed)
    assert info["judge_criterion_spelled_expected"] == pytest.approx(weighed)
    assert float(outputs[0]["reward_score"]) == 0.0
    assert info["judge_expected_verdict"] == 0.0


async def test_a_must_have_that_passes_both_ways_is_graded_by_its_expectation(
    server, verl_config_factory, tokenizer, batch_factory
):
    server.update_config(verdict_probability=0.6)
    must = [{**CRITERIA[0], "must_have": True}, CRITERIA[1]]
    manager = manager_for(server, verl_config_factory, tokenizer, criteria=must)
    outputs = await score_rows(manager, batch_factory, ROWS[:1])
    assert float(outputs[0]["reward_score"]) == pytest.approx((2 * TEN + TEN) / 30)


# ------------------------------------------------------------------------------- the parts


def test_the_reader_gives_each_criterion_the_span_of_its_own_lines_digits():
    reply = 'It wrote "C1: [[7]]".\n  C1: [[ 7 ]] ok\n**C2**: [[10]] - fine\n'
    found = read_criteria(reply, [1, 2], **SCALE)
    assert [reply[slice(*found[index].span)] for index in (1, 2)] == ["7", "10"]
    assert found[1].span[0] > reply.index("\n")  # the block's line, not the quote's


def test_quoted_lines_with_probabilities_of_their_own_can_lower_a_criterion_never_raise_it():
    """The judge quotes a response's ``C1: [[10]]`` and a bare 10, whose tokens lean to 0 and 3; its
    own C1 line is certain and its C2 line unsure between 3 and 4. Which C1 line is the judge's cannot
    be told from the text (a reply may end with the quoted lines), so both are weighed and the lowest
    counts: the quote's 1.0 (its copy leaning to 0). The bare 10 is no criterion line: never weighed."""
    content = 'It wrote "C1: [[10]]" and 10.\nC1: [[10]] ok\nC2: [[3]] meh'
    quoted_ten = entry("10", 0.1, ("0", 0.9))
    entries = [
        entry("It"),
        entry(" wrote"),
        entry(' "'),
        entry("C"),
        entry("1"),
        entry(":"),
        entry(" [["),
        quoted_ten,
        entry("]]"),
        entry('"'),
        entry(" and"),
        entry(" "),
        entry("10", 0.2, ("3", 0.8)),
        entry("."),
        entry("\n"),
        entry("C"),
        entry("1"),
        entry(":"),
        entry(" [["),
        entry("10"),
        entry("]]"),
        entry(" ok"),
        entry("\n"),
        entry("C"),
        entry("2"),
        entry(":"),
        entry(" [["),
        entry("3", 0.5, ("4", 0.5)),
        entry("]]"),
        entry(" meh"),
    ]
    from async_reward.judge.rubric.weighting import weigh_call

    found = read_criteria(content, [1, 2], **SCALE)
    graded = [("a", found[1]), ("b", found[2])]
    extras = weigh_call(completion(content, entries), content, 0, graded, criteria=(), **SCALE)
    assert extras == {
        "judge_criterion_a_expected": pytest.approx(1.0),
        "judge_criterion_a_mass": pytest.approx(1.0),
        "judge_criterion_b_expected": pytest.approx(3.5),
        "judge_criterion_b_mass": pytest.approx(1.0),
        "judge_weighting": "expected",
        # the quoted line that set a's grade wrote a digit its own listing made unlikely
        "judge_verdict_not_favourite": 1.0,
        "judge_verdict_assumed": 0.0,
    }


def _quoted_unweighable_c1(c1: list[dict[str, Any]], c2: list[dict[str, Any]]) -> dict[str, Any]:
    """A reply that quotes the response's ``C1: [[7]]`` tokenised ``[[7`` (its digits share a token
    with the brackets: it cannot be weighed), then the judge's block: C1 ``[[7]]`` with the tokens
    ``c1``, C2 ``[[6]]`` with ``c2``; the extras ``weigh_call`` gives it."""
    from async_reward.judge.rubric.weighting import weigh_call

    content = "It wrote C1: [[7]] itself.\nC1: [[7]] ok\nC2: [[6]] fine"
    entries = [
        *(entry(t) for t in ("It", " wrote", " C", "1", ":", " ", "[[7", "]]", " itself", ".", "\n")),
        *(entry(t) for t in ("C", "1", ":", " [[")),
        *c1,
        *(entry(t) for t in ("]]", " ok", "\n", "C", "2", ":", " [[")),
        *c2,
        *(entry(t) for t in ("]]", " fine")),
    ]
    found = read_criteria(content, [1, 2], **SCALE)
    graded = [("a", found[1]), ("b", found[2])]
    return weigh_call(completion(content, entries), content, 0, graded, criteria=(), **SCALE)


def test_a_criterion_counted_at_a_quoted_lines_written_number_is_said_not_passed_off_as_weighed():
    """Review of 2026-12, item 1: C1's own line weighs 7.2, its quoted ``[[7`` cannot be weighed and
    is lower, so C1 counts 7. That was reported as weighed (``expected``, C1's mass that of the 7.2):
    now ``judge_weighting`` names C1 and why, and C1's mass is NaN (no probability behind a 7)."""
    extras = _quoted_unweighable_c1([entry("7", 0.8, ("8", 0.2))], [entry("6", 0.5, ("4", 0.5))])
    why = "a at its written number: verdict shares a token with text before it"
    assert extras["judge_weighting"] == f"expected ({why})"
    assert extras["judge_criterion_a_expected"] == 7.0 and math.isnan(extras["judge_criterion_a_mass"])
    assert extras["judge_criterion_b_expected"] == pytest.approx(5.0)
    assert extras["judge_criterion_b_mass"] == pytest.approx(1.0)
    criteria = (Criterion(name="a", description="d"), Criterion(name="b", description="d"))
    graded = {"judge_criterion_a": 7.0, "judge_criterion_b": 6.0, **extras}
    weighting = graded.pop("judge_weighting")
    expected, sample = rubric_weighting(criteria, graded, [weighting])
    assert expected == [7.0, pytest.approx(5.0)]
    assert sample["judge_weighted"] == 1.0 and sample["judge_weighting"] == f"expected ({why})"
    assert sample["judge_verdict_mass"] == pytest.approx(1.0)  # b's: a's 7 covers no probability


def test_a_quote_that_sets_one_criterion_leaves_the_others_weighted_so_it_cannot_raise_the_aggregate():
    """Why a criterion at its written number does not make the whole sample plain: C2 is written 6
    but expected 5.0. Plain, C2 would count 6, and the quote would lift the aggregate above the judge's
    block alone (7.2 and 5.0); weighted, it only lowers it (C1 from 7.2 to 7)."""
    criteria = [Criterion(name="a", description="d"), Criterion(name="b", description="d")]
    extras = _quoted_unweighable_c1([entry("7", 0.8, ("8", 0.2))], [entry("6", 0.5, ("4", 0.5))])
    graded = {"judge_criterion_a": 7.0, "judge_criterion_b": 6.0, **extras}
    expected, _ = rubric_weighting(criteria, graded, [graded.pop("judge_weighting")])
    assert expected is not None
    quoted = aggregate(criteria, expected, plain=[7.0, 6.0], **SCALE)
    alone = aggregate(criteria, [7.2, 5.0], plain=[7.0, 6.0], **SCALE)  # the block without the quote
    all_plain = aggregate(criteria, [7.0, 6.0], **SCALE)
    assert quoted < alone < all_plain


def test_a_sample_says_the_first_calls_reason_and_plain_wins_over_a_written_number():
    """Over ``criteria_per_call``'s calls: one plain call makes the sample plain; else the first call
    that counted a written number is the sample's ``judge_weighting``, and a sample whose every
    criterion counted one has no mass (NaN), not a mass of a reading it did not use."""
    criteria = [Criterion(name="a", description="d"), Criterion(name="b", description="d")]
    written = "expected (a at its written number: verdict shares a token with text before it)"
    graded = {
        "judge_criterion_a_expected": 7.0,
        "judge_criterion_a_mass": math.nan,
        "judge_criterion_b_expected": 5.0,
        "judge_criterion_b_mass": math.nan,
    }
    expected, sample = rubric_weighting(criteria, dict(graded), ["expected", written])
    assert expected == [7.0, 5.0] and sample["judge_weighting"] == written
    assert math.isnan(sample["judge_verdict_mass"])
    expected, sample = rubric_weighting(
        criteria, dict(graded), [written, "plain: b: no logprobs in the reply"]
    )
    assert expected is None and sample == {
        "judge_weighted": 0.0,
        "judge_weighting": "plain: b: no logprobs in the reply",
    }


def test_the_aggregate_fails_a_must_have_on_its_written_or_its_weighted_verdict():
    must = Criterion(name="must", description="d", must_have=True)
    other = Criterion(name="other", description="d")
    assert aggregate([must, other], [6.0, 8.0], plain=[4.0, 8.0], **SCALE) == 0.0
    assert aggregate([must, other], [4.5, 8.0], plain=[6.0, 8.0], **SCALE) == 0.0
    assert aggregate([must, other], [5.5, 8.0], plain=[6.0, 9.0], **SCALE) == pytest.approx(0.675)
    flaw = Criterion(name="flaw", description="d", must_have=True, polarity="negative")
    assert aggregate([flaw], [4.0], plain=[6.0], **SCALE) == 0.0  # written 6 of a flaw: under half


def test_rubric_and_expected_verdict_are_accepted_together_and_key_clashes_refused():
    judge_config(criteria=[{"name": "a", "description": "d"}], expected_verdict=True).validate()
    clash = [{"name": "a", "description": "d"}, {"name": "a_mass", "description": "e"}]
    judge_config(criteria=clash).validate()  # only a weighted rubric writes judge_criterion_a_mass
    with pytest.raises(ConfigError) as refused:
        judge_config(criteria=clash, expected_verdict=True).validate()
    assert refused.value.key.endswith("judge.criteria[1].name"), refused.value
    with pytest.raises(ConfigError) as reason:  # a's reason key, weighted or not
        judge_config(
            criteria=[{"name": "a", "description": "d"}, {"name": "a_reason", "description": "e"}]
        ).validate()
    assert reason.value.key.endswith("judge.criteria[1].name"), reason.value


def test_a_criterion_after_the_judges_thinking_is_weighed_at_its_line_not_at_a_decoy_inside_it():
    """The spans are offsets into the text read after the thinking; the tokens spell the whole
    content, thinking first: the line's 7 (unsure of 8) is weighed, not the thinking's 2."""
    from async_reward.judge.rubric.weighting import weigh_call
    from async_reward.judge.verdict import strip_think

    content = "<think>C1: [[2]] maybe</think>\nC1: [[7]] ok"
    entries = [
        entry("<think>"),
        entry("C"),
        entry("1"),
        entry(":"),
        entry(" [["),
        entry("2", 0.5, ("3", 0.5)),
        entry("]]"),
        entry(" maybe"),
        entry("</think>"),
        entry("\n"),
        entry("C"),
        entry("1"),
        entry(":"),
        entry(" [["),
        entry("7", 0.5, ("8", 0.5)),
        entry("]]"),
        entry(" ok"),
    ]
    visible = strip_think(content, "leading")
    found = read_criteria(visible, [1], **SCALE)
    extras = weigh_call(
        completion(content, entries),
        content,
        len(content) - len(visible),
        [("a", found[1])],
        criteria=(),
        **SCALE,
    )
    assert extras["judge_criterion_a_expected"] == pytest.approx(7.5)
