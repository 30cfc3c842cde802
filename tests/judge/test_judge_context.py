"""A judge prompt too long for the served judge's context is ``invalid`` before any call.

Found on a GPU (2026-11-27, a 1024-token judge served in the job): vLLM refuses a prompt whose tokens
plus ``max_tokens`` exceed ``max_model_len`` with a 400, verl's router turns it into a bare 500, and
28-31 of 32 samples a step came back ``error`` after a wasted retry, with a reason that could not say
why. Here the prompt is counted with the served judge's own tokenizer and chat template (what the
replica applies); the judge is the local server over real HTTP standing where verl's router stands.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from async_reward import ConfigError
from async_reward._core.result import EXTRA_STRING_MAX_CHARS
from async_reward.config.checks import check_reward
from async_reward.judge.in_job.context import JudgeContext, PromptBudget, judge_context
from async_reward.judge.in_job.settings import routed_workers
from async_reward.judge.prompts import build_messages, resolve_parser, resolve_template
from async_reward.managers import LLMJudgeRewardManager
from tests.conftest import compose_verl_config
from tests.managers.test_managers import chat_requests

SHORT = {"prompt": "What is 2+3?", "response": "The answer is 5", "ground_truth": "5"}
LONG = {
    "prompt": "What is 2+3?",
    "response": "The answer is 5 " + "because two and three make five " * 6,
    "ground_truth": "5",
}


@pytest.fixture(scope="module")
def judge_tokenizer(model_dir: Path) -> Any:
    """The served judge's tokenizer, as verl's reward worker loads it (``reward_model_tokenizer``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def in_job_config(judge_dir: Path, *extra: str) -> Any:
    return compose_verl_config(
        [
            f"actor_rollout_ref.model.path={judge_dir}",
            "reward.reward_manager.name=llm_judge",
            "reward.num_workers=1",
            "reward.reward_model.enable=true",
            f"reward.reward_model.model_path={judge_dir}",
            "reward.reward_model.rollout.name=vllm",
            "reward.reward_model.enable_resource_pool=true",
            "reward.reward_model.n_gpus_per_node=1",
            "reward.reward_model.nnodes=1",
            "+reward.async_reward.retry.max_attempts=1",
            *extra,
        ]
    )


def judge_prompt_tokens(tokenizer: Any, row: dict[str, str]) -> int:
    """What the replica would count for ``row``'s judge prompt: the built-in template's messages
    through the judge's chat template, generation prompt included (counted here independently)."""
    template = resolve_template("correctness", resolve_parser("correctness", "auto"))
    messages = build_messages(
        template, prompt=row["prompt"], response=row["response"], ground_truth=row["ground_truth"]
    )
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


# ------------------------------------------------------------------------------- the window


def test_the_window_is_max_model_len_else_the_models_max_position_embeddings(tmp_path):
    model = tmp_path / "judge"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    assert judge_context(in_job_config(model)) == JudgeContext(4096, "the model's max_position_embeddings")
    assert judge_context(in_job_config(model, "reward.reward_model.rollout.max_model_len=1024")) == (
        JudgeContext(1024, "rollout.max_model_len")
    )
    (model / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 8192}}))
    assert judge_context(in_job_config(model)).tokens == 8192  # a multimodal config, as verl reads it
    (model / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    assert judge_context(in_job_config(model)) is None  # nothing to go by: left to the replica
    assert judge_context(in_job_config(tmp_path / "hub-id-not-a-directory")) is None


def test_a_prompt_fits_up_to_the_last_token_and_not_one_more(judge_tokenizer):
    count = judge_prompt_tokens(judge_tokenizer, SHORT)
    template = resolve_template("correctness", resolve_parser("correctness", "auto"))
    messages = build_messages(
        template, prompt=SHORT["prompt"], response=SHORT["response"], ground_truth=SHORT["ground_truth"]
    )
    assert (
        PromptBudget(JudgeContext(count + 32, "x"), max_tokens=32).refusal(judge_tokenizer, messages) is None
    )
    reason = PromptBudget(JudgeContext(count + 31, "rollout.max_model_len"), max_tokens=32).refusal(
        judge_tokenizer, messages
    )
    assert reason is not None and len(reason) <= EXTRA_STRING_MAX_CHARS  # never cut in the extras
    assert (
        f"judge prompt {count} tokens + judge.max_tokens 32 > the served judge's context {count + 31}"
        in reason
    )
    assert "rollout.max_model_len" in reason and "not sent" in reason


def test_a_tokenizer_without_a_chat_template_leaves_the_check_to_the_replica(
    judge_tokenizer, monkeypatch, capsys
):
    import copy

    from async_reward._core import start_lines

    monkeypatch.setattr(start_lines, "_SAID", set())
    plain = copy.deepcopy(judge_tokenizer)
    plain.chat_template = None
    budget = PromptBudget(JudgeContext(10, "x"), max_tokens=5)
    assert budget.refusal(plain, [{"role": "user", "content": "long " * 100}]) is None
    assert "not counted against the served judge's context" in capsys.readouterr().out


# ------------------------------------------------------------------------------- start-up


def test_max_tokens_that_leave_no_room_for_a_prompt_are_refused_at_start_up(model_dir):
    config = in_job_config(
        model_dir,
        "reward.reward_model.rollout.max_model_len=512",
        "+reward.async_reward.judge.max_tokens=512",
    )
    with pytest.raises(ConfigError) as refused:
        check_reward(config)
    assert refused.value.key == "reward.async_reward.judge.max_tokens"
    assert "context of 512 tokens (rollout.max_model_len)" in str(refused.value)
    check_reward(
        in_job_config(
            model_dir,
            "reward.reward_model.rollout.max_model_len=512",
            "+reward.async_reward.judge.max_tokens=64",
        )
    )


def test_the_start_up_line_says_how_long_a_judge_prompt_may_be(model_dir, monkeypatch, capsys):
    from async_reward._core import start_lines

    monkeypatch.setattr(start_lines, "_SAID", set())
    check_reward(
        in_job_config(
            model_dir,
            "reward.reward_model.rollout.max_model_len=1024",
            "+reward.async_reward.judge.max_tokens=24",
        )
    )
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "llm_judge scores" in line]
    assert line.endswith(
        "judge prompts over 1000 tokens (context 1024, rollout.max_model_len, less judge.max_tokens 24) "
        "are invalid, never sent"
    )


# ------------------------------------------------------------------------------- over real HTTP


async def score_rows(manager: Any, batch_factory: Any, rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Each row through ``run_single``, its response long enough to keep every token."""
    batch = batch_factory(rows, response_length=256)
    return list(await asyncio.gather(*(manager.run_single(batch[i : i + 1]) for i in range(len(batch)))))


def served_judge_manager(config: Any, tokenizer: Any, judge_tokenizer: Any, server: Any) -> Any:
    """``llm_judge`` as our reward worker builds it in the job: routed, handed verl's router address
    (here the local judge server's) and the served judge's tokenizer."""
    with routed_workers():
        return LLMJudgeRewardManager(
            config,
            tokenizer,
            reward_router_address=server.url.removeprefix("http://"),
            reward_model_tokenizer=judge_tokenizer,
        )


async def test_a_prompt_too_long_for_the_served_judge_is_invalid_and_never_sent(
    model_dir, judge_tokenizer, tokenizer, batch_factory, server
):
    """Between the two prompt lengths: the short one is judged (``ok``), the long one is ``invalid``
    with the lengths, made no call (the server counts one request), spent nothing and scores the
    fallback, like any failed sample."""
    short, long_ = (judge_prompt_tokens(judge_tokenizer, row) for row in (SHORT, LONG))
    assert long_ > short + 8, "the rows must differ enough to put the limit between them"
    config = in_job_config(
        model_dir,
        f"reward.reward_model.rollout.max_model_len={short + 4 + 16}",
        "+reward.async_reward.judge.max_tokens=16",
    )
    manager = served_judge_manager(config, tokenizer, judge_tokenizer, server)
    outputs = await score_rows(manager, batch_factory, [SHORT, LONG])
    judged, refused = (output["reward_extra_info"] for output in outputs)
    assert judged["status"] == "ok" and outputs[0]["reward_score"] == 1.0
    assert refused["status"] == "invalid" and refused["attempts"] == 0
    assert f"judge prompt {long_} tokens + judge.max_tokens 16" in refused["failure_reason"]
    assert refused["judge_tokens"] == 0 and refused["judge_cache_hit"] is False
    assert outputs[1]["reward_score"] == manager.settings.fallback_score
    assert chat_requests(server) == 1


async def test_without_the_judges_tokenizer_or_window_every_prompt_goes_to_the_judge(
    model_dir, judge_tokenizer, tokenizer, batch_factory, server, tmp_path
):
    """No tokenizer handed over (a loop of the user's own), or no window to go by: nothing is refused
    here; the replica answers for itself."""
    config = in_job_config(
        model_dir, "reward.reward_model.rollout.max_model_len=40", "+reward.async_reward.judge.max_tokens=16"
    )
    manager = served_judge_manager(config, tokenizer, None, server)
    assert manager.prompt_budget is None
    outputs = await score_rows(manager, batch_factory, [LONG])
    assert outputs[0]["reward_extra_info"]["status"] == "ok"
    assert chat_requests(server) == 1
