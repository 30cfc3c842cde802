"""The weighted verdict's math and inputs (issue 42, items 4, 5, 16 and 17).

* item 4: a spelling of the sampled digits with or without a leading space (``"7"`` beside a sampled
  ``" 7"``) is the same verdict: its probability counts, it is not lost;
* item 5: a signed scale is refused at start-up with ``expected_verdict`` (what a sign's alternative
  would have continued with is never listed), and a sample left unweighted is visible;
* item 16: with a digit-splitting tokenizer, a digit that may be a verdict or the start of a longer
  one (``1``: 1 or 10) is read by the neighbour rule, so the expectation does not depend on which
  verdict was written beyond what the listed alternatives cannot tell;
* item 17: the request asks for the distribution it reads (``top_p`` 1, no penalties; vLLM's keys
  only towards the served judge), and a written verdict that is not the listed favourite is counted
  (``judge_verdict_not_favourite``) and said once.

Over real HTTP against the local judge, whose token emulation splits digits, lists space-led
spellings, takes a whole verdict distribution and samples with a penalty as llama.cpp does
(``async_reward.tools.devserver.logprobs``); the rule on token lists built by hand or by that emulation.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from async_reward import ConfigError
from async_reward.config import JudgeConfig
from async_reward.judge.expected import ExpectedVerdict, distribution_params
from async_reward.managers import LLMJudgeRewardManager
from async_reward.tools.devserver.logprobs import Emulation, reply_logprobs
from async_reward.training.metrics import extras_metrics
from tests.judge.test_expected import OPENING, ROWS, entry, weigh
from tests.managers.test_managers import judge_settings, score_rows
from tests.support.hostile_text import PROPERTY

#: A judge's distribution over 0-10 shaped as the one row the issue measured on llama.cpp: the first
#: digit ``1`` at 0.39, continued by ``0`` at 0.87 (so P(10) = 0.3393, P(1) = 0.0507), ``9`` at 0.19.
ROW = {
    10: 0.3393,
    1: 0.0507,
    9: 0.19,
    8: 0.14,
    7: 0.10,
    6: 0.06,
    5: 0.05,
    4: 0.025,
    3: 0.02,
    2: 0.015,
    0: 0.01,
}


def mean(distribution: dict[int, float]) -> float:
    total = sum(distribution.values())
    return sum(value * p for value, p in distribution.items()) / total


def emulated(written: int, distribution: dict[int, float], **emulation: Any) -> Any:
    """The rule on the dev server's own token emulation of ``Verdict: [[written]]``."""
    content = f"Verdict: [[{written}]]"
    logprobs = reply_logprobs(
        content, [(11, written)], 1.0, 20, "", Emulation(distribution=distribution, **emulation)
    )
    return weigh(content, logprobs["content"])


# ------------------------------------------------------------------------------- item 4


def test_a_spelling_with_a_leading_space_of_the_sampled_digits_counts_toward_that_verdict():
    """Sampled ``" 7"`` (0.15), ``"7"`` (0.45), ``" 6"`` (0.4): 7 has 0.6, so 6.6 over the whole mass
    (skipping ``"7"`` gave 6.27 over 0.55)."""
    entries = [
        entry("Good"),
        entry("."),
        entry(" Score"),
        entry(":"),
        entry(" 7", 0.15, ("7", 0.45), (" 6", 0.4)),
    ]
    result = weigh("Good. Score: 7", entries, _score_rules())
    assert isinstance(result, ExpectedVerdict)
    assert result.value == pytest.approx(6.6) and result.mass == pytest.approx(1.0)


def test_a_spelling_of_a_digit_that_may_start_ten_continues_as_the_sampled_one_did():
    """Sampled ``1`` then ``0`` (10); ``" 1"`` beside it is the same first digit: it continues as the
    sampled ``1`` did (10 with 0.9, 1 with 0.1), not dropped as a digit that was never continued."""
    entries = [*OPENING, entry("1", 0.4, (" 1", 0.4), ("9", 0.2)), entry("0", 0.9, ("]]", 0.1)), entry("]]")]
    result = weigh("Verdict: [[10]]", entries)
    assert result.value == pytest.approx(0.8 * (0.9 * 10 + 0.1 * 1) + 0.2 * 9)
    assert result.mass == pytest.approx(1.0)


async def test_the_local_judges_space_led_spellings_weigh_as_the_written_verdict(
    server, verl_config_factory, tokenizer, batch_factory
):
    """Half of each verdict's probability is listed under ``" 10"``, ``" 9"``, ...: the expectations
    are those of the distribution (10 with 0.6, 9 and 8 with 0.2: 9.4), over the whole mass."""
    server.update_config(verdict_probability=0.6, logprobs_space_share=0.5)
    settings = judge_settings(server, judge={"expected_verdict": True})
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    right, _wrong = (out["reward_extra_info"] for out in await score_rows(manager, batch_factory, ROWS))
    assert right["judge_weighting"] == "expected"
    assert right["judge_expected_verdict"] == pytest.approx(9.4)
    assert right["judge_verdict_mass"] == pytest.approx(1.0)


# ------------------------------------------------------------------------------- item 5


@pytest.mark.parametrize(("low", "high"), [(-5, 5), (-1, 1), (-10, 0)])
def test_a_signed_scale_is_refused_with_expected_verdict_naming_the_keys(low, high):
    with pytest.raises(ConfigError) as refused:
        JudgeConfig(base_url="http://x/v1", expected_verdict=True, min_score=low, max_score=high).validate()
    assert refused.value.key == "reward.async_reward.judge.expected_verdict"
    assert "judge.min_score" in str(refused.value) and "normalize_to" in refused.value.fix
    JudgeConfig(base_url="http://x/v1", min_score=low, max_score=high).validate()  # plain: accepted
    JudgeConfig(base_url="http://x/v1", expected_verdict=True, min_score=0, max_score=high - low).validate()


def test_the_manager_built_as_verl_builds_it_refuses_a_signed_weighted_scale(verl_config_factory, tokenizer):
    settings = {
        "judge": {
            "base_url": "http://127.0.0.1:1/v1",
            "expected_verdict": True,
            "min_score": -5,
            "max_score": 5,
        }
    }
    with pytest.raises(ConfigError) as refused:
        LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    assert refused.value.key == "reward.async_reward.judge.expected_verdict"


# ------------------------------------------------------------------------------- item 16


def test_a_one_beside_a_written_nine_is_read_as_the_ten_its_neighbours_point_to():
    """The issue's row on a digit-splitting tokenizer: written 9 or written 10, the same judge. The
    ``1`` beside a written 9 may be 1 or 10; its neighbours inside the scale (2 for 1, 9 for 10) share
    it, 0.015 : 0.19. Written 10, the ``0`` after the ``1`` tells the split (0.87) and the expectation
    is exact; written 9, it differs from that by the neighbour rule's error alone (0.2, where dropping
    the ``1`` cost 0.68)."""
    truth = mean(ROW)
    ten, nine = emulated(10, ROW, split_digits=True), emulated(9, ROW, split_digits=True)
    assert ten.value == pytest.approx(truth) and ten.mass == pytest.approx(1.0) and ten.assumed == 0.0
    told_ten = 0.19 / (0.19 + 0.015)
    assert nine.value == pytest.approx(truth + 0.39 * (told_ten - 0.87) * 9)
    assert nine.mass == pytest.approx(1.0) and nine.assumed == pytest.approx(0.39)
    assert abs(nine.value - ten.value) < 0.25


def test_a_one_beside_a_written_zero_is_read_as_one_when_its_neighbours_say_so():
    """A judge torn between 0, 1 and 2: the ``1`` beside a written 0 is 1 (its neighbour 2 is listed,
    10's neighbour 9 is not); a judge torn between 0 and 10 alone leaves nothing to tell them apart:
    the ``1`` is left out, and the mass says how much."""
    low = {0: 0.5, 1: 0.3, 2: 0.2}
    assert emulated(0, low, split_digits=True).value == pytest.approx(mean(low))
    assert emulated(1, low, split_digits=True).value == pytest.approx(mean(low))
    torn = emulated(0, {0: 0.7, 10: 0.3}, split_digits=True)
    assert torn.value == 0.0 and torn.mass == pytest.approx(0.7) and torn.assumed == 0.0


def test_a_tokenizer_with_whole_number_tokens_spells_ten_itself_so_a_one_is_one():
    """Where ``10`` is listed as one token (Llama 3's tokenizer), a ``1`` beside it is the verdict 1."""
    entries = [*OPENING, entry("9", 0.5, ("10", 0.3), ("1", 0.2)), entry("]]")]
    result = weigh("Verdict: [[9]]", entries)
    assert result.value == pytest.approx(0.5 * 9 + 0.3 * 10 + 0.2 * 1) and result.assumed == 0.0


_WEIGHTS = st.one_of(st.just(0.0), st.floats(1e-4, 1.0))


@PROPERTY
@given(weights=st.lists(_WEIGHTS, min_size=11, max_size=11), ratio=st.floats(0.05, 20.0))
@example(weights=[0.01, 0.0507, 0.015, 0.02, 0.025, 0.05, 0.06, 0.1, 0.14, 0.19, 0.3393], ratio=12.667)
def test_the_expectation_does_not_depend_on_the_verdict_written_beyond_what_the_listing_cannot_tell(
    weights, ratio
):
    """Any judge distribution on 0-10, written digit by digit, each verdict it gives weight written in
    turn. Written 1 or 10, the continuation of the ``1`` is read: the expectation is the
    distribution's. Written anything else, the ``1``'s split between 1 and 10 is what no listed token
    tells: the expectation is one value whatever was written, off the truth by at most the ``1``'s
    probability times 9, and exact when the judge is as likely at 10 against 1 as at 9 against 2
    (``ratio``, the neighbour rule's premise)."""
    distribution = {value: weight for value, weight in enumerate(weights) if weight > 0.0}
    if sum(distribution.values()) <= 0.0 or len(distribution) < 2:
        return
    total = sum(distribution.values())
    distribution = {value: weight / total for value, weight in distribution.items()}
    truth, one = mean(distribution), distribution.get(1, 0.0) + distribution.get(10, 0.0)
    results = {written: emulated(written, distribution, split_digits=True) for written in distribution}
    for written, result in results.items():
        assert isinstance(result, ExpectedVerdict), (written, result)
        if written in (1, 10):
            assert result.value == pytest.approx(truth, abs=1e-9) and result.mass == pytest.approx(1.0)
    others = [results[written].value for written in distribution if written not in (1, 10)]
    assert max(others, default=0.0) - min(others, default=0.0) < 1e-9
    assert all(abs(value - truth) <= 10 * one + 1e-9 for value in others)
    # the same judge, made as likely at 10 against 1 as at 9 against 2: every verdict written weighs it
    smooth = {**distribution, 2: 0.1, 9: 0.1 * ratio}
    if 1 in smooth or 10 in smooth:
        one_or_ten = smooth.pop(1, 0.0) + smooth.pop(10, 0.0)
        smooth[10], smooth[1] = one_or_ten * ratio / (1 + ratio), one_or_ten / (1 + ratio)
    for written in smooth:
        assert emulated(written, smooth, split_digits=True).value == pytest.approx(mean(smooth), abs=1e-9)


async def test_the_issues_row_written_nine_or_ten_over_http_on_a_digit_splitting_judge(
    server, verl_config_factory, tokenizer, batch_factory
):
    """The measurement the docs quote: the local judge splits digits and weighs by the issue's row,
    writing 10 for the right answer and 9 for the wrong one (``fixed_verdict`` per row is not a knob:
    two runs)."""
    server.update_config(logprobs_digits="split", verdict_distribution=ROW, logprobs_end_token="<|im_end|>")
    settings = judge_settings(server, judge={"expected_verdict": True})
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    measured = {}
    for written in (10, 9):
        server.update_config(fixed_verdict=written)
        (out,) = await score_rows(manager, batch_factory, ROWS[:1])
        info = out["reward_extra_info"]
        assert info["judge_verdict"] == written and info["judge_weighting"] == "expected", info
        measured[written] = info["judge_expected_verdict"]
    assert measured[10] == pytest.approx(mean(ROW))  # 7.77
    assert measured[9] == pytest.approx(7.97, abs=0.01)  # dropping the 1 gave 7.10
    assert abs(measured[9] - measured[10]) < 0.25


# ------------------------------------------------------------------------------- item 17


async def test_the_request_asks_for_the_distribution_it_reads_with_keys_an_openai_endpoint_accepts(
    verl_config_factory, tokenizer, batch_factory
):
    """``top_p`` 1 and no presence / frequency penalty for every judge (OpenAI's own parameters, which
    the official client names), in the body the judge receives; vLLM's / SGLang's
    ``repetition_penalty``, ``top_k`` and ``min_p`` only towards the judge served in the job (OpenAI
    answers 400 to keys it does not know); a value the user sets in ``extra_body`` wins."""
    from openai.resources.chat.completions import Completions

    from tests.support.openai_standin import standin_judge

    openai_keys = set(inspect.signature(Completions.create).parameters)
    bodies = {}
    async with standin_judge(content="Fine.\nVerdict: [[7]]") as judge:
        for label, judge_keys in (
            ("weighted", {"expected_verdict": True}),
            ("mine", {"expected_verdict": True, "extra_body": {"top_p": 0.9, "repeat_penalty": 1.0}}),
            ("plain", {}),
        ):
            settings = {"judge": {"base_url": judge.url + "/v1", **judge_keys}}
            manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
            await score_rows(manager, batch_factory, ROWS[:1])
            bodies[label] = judge.bodies[-1]
    weighted = bodies["weighted"]
    assert weighted["top_p"] == 1.0 and weighted["presence_penalty"] == weighted["frequency_penalty"] == 0.0
    assert weighted["logprobs"] is True and set(weighted) <= openai_keys, set(weighted) - openai_keys
    assert bodies["mine"]["top_p"] == 0.9 and bodies["mine"]["repeat_penalty"] == 1.0
    assert "top_p" not in bodies["plain"]  # without weighting, nothing is asked of the sampler
    served = distribution_params(served=True)
    assert served["repetition_penalty"] == 1.0 and served["top_k"] == -1 and served["min_p"] == 0.0
    assert set(served) - openai_keys == {"repetition_penalty", "top_k", "min_p"}


def test_the_judge_served_in_the_job_is_asked_with_vllms_and_sglangs_keys_too(
    model_dir, tmp_path_factory, tokenizer
):
    """verl serves the judge with vLLM or SGLang, which both take these keys, and vLLM applies the
    model's own generation_config (Qwen2.5: repetition_penalty 1.05) to a request that sets none."""
    from async_reward.judge.in_job.settings import routed_workers
    from tests.judge.in_job.test_in_job import judge_config
    from tests.support.v1_standins import build_tiny_model_dir

    judge_dir = build_tiny_model_dir(tmp_path_factory.mktemp("judge_model"))
    config = judge_config(model_dir, judge_dir, "+reward.async_reward.judge.expected_verdict=true")
    with routed_workers():
        params = LLMJudgeRewardManager(config, tokenizer, reward_router_address="127.0.0.1:1")._params
    assert {key: params[key] for key in distribution_params(served=True)} == distribution_params(served=True)


async def test_a_written_verdict_that_is_not_the_listed_favourite_is_counted_and_said_once(
    server, verl_config_factory, tokenizer, batch_factory, capsys, monkeypatch
):
    """The local judge samples with llama.cpp's default penalty (1.1) and lists the probabilities
    from before it: at temperature 0 each written verdict is not the favourite. Every sample says so,
    the step's metric is 1.0, the log says it once; the request's ``repeat_penalty: 1.0`` (through
    ``extra_body``, as the docs tell a llama.cpp user) puts it right."""
    from async_reward._core import start_lines

    monkeypatch.setattr(start_lines, "_SAID", set())
    server.update_config(verdict_probability=0.6, repeat_penalty=1.1)
    settings = judge_settings(server, judge={"expected_verdict": True})
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    infos = [out["reward_extra_info"] for out in await score_rows(manager, batch_factory, ROWS)]
    assert [info["judge_weighting"] for info in infos] == ["expected", "expected"]
    assert [info["judge_verdict_not_favourite"] for info in infos] == [1.0, 1.0]
    assert extras_metrics(infos)["reward/extra/judge_verdict_not_favourite/mean"] == 1.0
    said = [line for line in capsys.readouterr().out.splitlines() if "not the most probable" in line]
    assert len(said) == 1 and "repeat_penalty" in said[0], said

    fixed = judge_settings(server, judge={"expected_verdict": True, "extra_body": {"repeat_penalty": 1.0}})
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", fixed), tokenizer)
    infos = [out["reward_extra_info"] for out in await score_rows(manager, batch_factory, ROWS)]
    assert [info["judge_verdict_not_favourite"] for info in infos] == [0.0, 0.0]
    assert not [line for line in capsys.readouterr().out.splitlines() if "not the most probable" in line]


async def test_above_temperature_0_a_verdict_off_the_favourite_is_counted_but_not_warned(
    server, verl_config_factory, tokenizer, batch_factory, capsys, monkeypatch
):
    from async_reward._core import start_lines

    monkeypatch.setattr(start_lines, "_SAID", set())
    server.update_config(verdict_probability=0.6, repeat_penalty=1.1)
    settings = judge_settings(server, judge={"expected_verdict": True, "temperature": 0.7})
    manager = LLMJudgeRewardManager(verl_config_factory("llm_judge", settings), tokenizer)
    infos = [out["reward_extra_info"] for out in await score_rows(manager, batch_factory, ROWS)]
    assert [info["judge_verdict_not_favourite"] for info in infos] == [1.0, 1.0]
    assert not [line for line in capsys.readouterr().out.splitlines() if "not the most probable" in line]


def test_the_favourite_is_checked_at_every_token_that_decides_the_verdict():
    """A tie is no sign (greedy takes either); a ``0`` after a written ``1`` likelier than the ``]]``
    written there is (greedy would have written 10)."""
    tie = weigh("Verdict: [[7]]", [*OPENING, entry("7", 0.5, ("8", 0.5)), entry("]]")])
    assert tie.favourite
    ended = weigh("Verdict: [[1]]", [*OPENING, entry("1", 0.9, ("9", 0.1)), entry("]]", 0.3, ("0", 0.7))])
    assert not ended.favourite and ended.value == pytest.approx(0.9 * (0.3 * 1 + 0.7 * 10) + 0.1 * 9)
    assert weigh(
        "Verdict: [[7]]", [*OPENING, entry("7", 0.9, ("8", 0.1)), entry("]]", 0.4, ("]]\n", 0.6))]
    ).favourite


def test_a_listed_token_of_thousands_of_digits_is_off_the_scale_not_an_error():
    """Python refuses to turn more than 4300 digits into an int: such a token is off any scale."""
    huge = "9" * 5000
    result = weigh("Verdict: [[7]]", [*OPENING, entry("7", 0.5, (huge, 0.5)), entry("]]", 0.5, (huge, 0.5))])
    assert result.value == 7.0 and result.mass == pytest.approx(0.25)


def _score_rules() -> Any:
    from async_reward.judge.verdict import VerdictRules

    return VerdictRules(parser="score", position="end", on_conflict="refuse", think="leading")


def test_every_sample_carries_the_new_weighting_extras(server, verl_config_factory, tokenizer):
    manager = LLMJudgeRewardManager(
        verl_config_factory("llm_judge", judge_settings(server, judge={"expected_verdict": True})), tokenizer
    )
    for key in ("judge_verdict_not_favourite", "judge_verdict_assumed"):
        assert math.isnan(manager._extra_defaults[key])


# ------------------------------------------------------------------------------- the local judge's knobs


async def test_the_local_judges_token_emulation_spells_the_reply_and_refuses_bad_knobs(server):
    """Split digits, space-led spellings and a distribution given over JSON (string keys): the tokens
    still spell the reply, each place's listing is a distribution; bad values are refused."""
    import aiohttp

    server.update_config(
        logprobs_digits="split", logprobs_space_share=0.25, verdict_distribution={"10": 3, "9": 1, "1": 1}
    )
    assert server.server.config.verdict_distribution == {10: 3, 9: 1, 1: 1}
    body = {
        "model": "judge",
        "messages": [{"role": "user", "content": "Question: What is 2+3?\nResponse: 5\nReference: 5"}],
        "logprobs": True,
        "top_logprobs": 20,
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{server.url}/v1/chat/completions", json=body) as reply,
    ):
        choice = (await reply.json())["choices"][0]
    tokens = choice["logprobs"]["content"]
    assert "".join(token["token"] for token in tokens) == choice["message"]["content"]
    for token in tokens:
        assert sum(math.exp(alt["logprob"]) for alt in token["top_logprobs"]) == pytest.approx(1.0)
    for knob in (
        {"logprobs_digits": "bytes"},
        {"logprobs_space_share": 0.6},
        {"repeat_penalty": 0.0},
        {"verdict_distribution": {"11": 1.0}},
        {"verdict_distribution": {"x": 1.0}},
        {"verdict_distribution": {"5": -1.0}},
        {"verdict_distribution": {"5": 0.0}},
        {"verdict_distribution": {}},
    ):
        with pytest.raises(ValueError):
            server.update_config(**knob)


@pytest.mark.parametrize("per_call", [None, 1])
async def test_a_rubric_says_when_a_criterions_written_verdict_is_not_the_listed_favourite(
    server, verl_config_factory, tokenizer, batch_factory, capsys, monkeypatch, per_call
):
    """The same check for a weighted rubric, in one call or a call per criterion: the sample says
    whether any criterion's written verdict was off the favourite (the largest over its calls), the
    log says it once at temperature 0, and ``repeat_penalty: 1.0`` puts it right."""
    from async_reward._core import start_lines
    from tests.judge.rubric.test_criteria import CRITERIA

    monkeypatch.setattr(start_lines, "_SAID", set())
    server.update_config(verdict_probability=0.6, repeat_penalty=1.1)
    rubric = {"criteria": CRITERIA, "criteria_per_call": per_call, "expected_verdict": True}
    manager = LLMJudgeRewardManager(
        verl_config_factory("llm_judge", judge_settings(server, judge=rubric)), tokenizer
    )
    infos = [out["reward_extra_info"] for out in await score_rows(manager, batch_factory, ROWS)]
    assert [info["judge_weighting"] for info in infos] == ["expected", "expected"]
    assert [info["judge_verdict_not_favourite"] for info in infos] == [1.0, 1.0]
    assert all(info["judge_verdict_assumed"] >= 0.0 for info in infos)
    said = [line for line in capsys.readouterr().out.splitlines() if "not the most probable" in line]
    assert len(said) == 1, said

    fixed = {**rubric, "extra_body": {"repeat_penalty": 1.0}}
    manager = LLMJudgeRewardManager(
        verl_config_factory("llm_judge", judge_settings(server, judge=fixed)), tokenizer
    )
    infos = [out["reward_extra_info"] for out in await score_rows(manager, batch_factory, ROWS)]
    assert [info["judge_verdict_not_favourite"] for info in infos] == [0.0, 0.0]
