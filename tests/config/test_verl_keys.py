"""verl's own reward settings: each honoured with verl's meaning or refused by name (issue 17, item 1).

Configs are composed by hydra from verl's real ``ppo_trainer`` config, with the keys written as a
user writes them on verl's command line (``+reward.max_rpm=60``). The rate-limit scenarios are verl's
own (tests/experimental/reward_loop/test_rate_limited_reward_manager_on_cpu.py on verl's main
branch), with its timing floors, run against our manager built by verl's ``load_reward_manager`` and
scored through ``run_single`` on real ``DataProto`` items.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from async_reward.config import ConfigError, load_config
from async_reward.config.checks import check_reward
from tests.conftest import compose_verl_config

FUNCTIONS = """
import asyncio, time

async def instant(data_source, solution_str, ground_truth, extra_info, **kwargs):
    return 1.0

async def timed(data_source, solution_str, ground_truth, extra_info, **kwargs):
    started = time.monotonic()
    await asyncio.sleep(0.1)
    return {"score": 1.0, "started": started, "ended": time.monotonic()}

async def slow(data_source, solution_str, ground_truth, extra_info, **kwargs):
    await asyncio.sleep(3600)
    return 1.0

def echo_kwargs(data_source, solution_str, ground_truth, extra_info, **kwargs):
    return {
        "score": 1.0,
        "got": ",".join(sorted(kwargs)),
        "turns": extra_info.get("num_turns"),
        "tool": extra_info.get("tool_field", ""),
    }

class Agent:
    def compute_score(self, data_source, solution_str, ground_truth, extra_info, **kwargs):
        return {"score": float(kwargs.get("weight", -1.0))}
"""


@pytest.fixture(scope="module")
def functions(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("verl_settings") / "reward_fns.py"
    path.write_text(FUNCTIONS)
    return str(path)


def compose(manager: str, *extra: str, function: tuple[str, str] | None = None) -> Any:
    overrides = [f"reward.reward_manager.name={manager}", "reward.num_workers=1", *extra]
    if function is not None:
        overrides += [f"reward.custom_reward_function.path={function[0]}"]
        overrides += [f"reward.custom_reward_function.name={function[1]}"]
    return compose_verl_config(overrides)


# ------------------------------------------------------------------ honoured: verl's rate_limited keys
@pytest.mark.parametrize(
    ("verl_key", "value", "ours", "others"),
    [
        ("max_concurrent", 2, ("limits", "max_concurrency"), ()),
        ("max_rpm", 60, ("limits", "requests_per_minute"), ()),
        ("max_tpm", 100000, ("limits", "tokens_per_minute"), ()),
        # An estimate counts against a token budget only (without one it is refused, below).
        (
            "estimated_tokens_per_request",
            300,
            ("limits", "estimated_tokens_per_request"),
            ("+reward.async_reward.limits.tokens_per_minute=100000",),
        ),
        ("timeout", 0.5, ("timeout_s",), ()),
    ],
)
def test_verl_rate_limited_key_sets_ours_and_says_so(
    verl_key, value, ours, others, functions, capsys, monkeypatch
):
    from async_reward._core import start_lines

    monkeypatch.setattr(start_lines, "_SAID", set())  # printed once per process: this test's line
    config = compose(
        "async_rate_limited", f"+reward.{verl_key}={value}", *others, function=(functions, "instant")
    )
    check_reward(config)  # the driver's start-up check accepts it
    settings: Any = load_config(config)
    load_config(config)
    for part in ours:
        settings = getattr(settings, part)
    assert settings == value
    lines = [line for line in capsys.readouterr().out.splitlines() if "rate_limited settings applied" in line]
    assert len(lines) == 1, lines  # one start-up line, however often the config is read
    assert f"reward.{verl_key}={value} as reward.async_reward.{'.'.join(ours)}" in lines[0]


def test_max_tpm_alone_keeps_verls_estimate_of_2000_tokens(functions):
    config = compose("async_rate_limited", "+reward.max_tpm=60000", function=(functions, "instant"))
    assert load_config(config).limits.estimated_tokens_per_request == 2000


@pytest.mark.parametrize(
    ("verl_key", "ours", "verl_value", "our_value"),
    [
        ("max_concurrent", "limits.max_concurrency", 2, 8),
        ("max_rpm", "limits.requests_per_minute", 60, 120),
        ("max_tpm", "limits.tokens_per_minute", 100000, 50000),
        ("estimated_tokens_per_request", "limits.estimated_tokens_per_request", 300, 200),
        ("timeout", "timeout_s", 0.5, 30),
    ],
)
def test_verl_key_and_ours_with_different_values_is_an_error(
    verl_key, ours, verl_value, our_value, functions
):
    config = compose(
        "async_rate_limited",
        f"+reward.{verl_key}={verl_value}",
        f"+reward.async_reward.{ours}={our_value}",
        function=(functions, "instant"),
    )
    with pytest.raises(ConfigError) as error:
        check_reward(config)
    assert error.value.key == f"reward.{verl_key}"
    assert f"reward.async_reward.{ours}" in str(error.value)


#: A token estimate where no token budget reads it: (manager, overrides, the key named, words).
ESTIMATE_WITHOUT_A_BUDGET = [
    (
        "async_naive",
        ["+reward.async_reward.limits.estimated_tokens_per_request=5000"],
        "reward.async_reward.limits.estimated_tokens_per_request",
        "async_naive has no token budget",
    ),
    (
        "async_rate_limited",
        ["+reward.async_reward.limits.estimated_tokens_per_request=5000"],
        "reward.async_reward.limits.estimated_tokens_per_request",
        "tokens_per_minute, which is not set",
    ),
    (  # a request budget is no token budget
        "async_rate_limited",
        [
            "+reward.async_reward.limits.requests_per_minute=60",
            "+reward.async_reward.limits.estimated_tokens_per_request=5000",
        ],
        "reward.async_reward.limits.estimated_tokens_per_request",
        "tokens_per_minute, which is not set",
    ),
    (  # verl's own key, named as the user wrote it (verl's rate_limited ignored it without max_tpm too)
        "async_rate_limited",
        ["+reward.estimated_tokens_per_request=300"],
        "reward.estimated_tokens_per_request",
        "tokens_per_minute, which is not set",
    ),
]


@pytest.mark.parametrize(
    ("manager", "extra", "key", "words"),
    ESTIMATE_WITHOUT_A_BUDGET,
    ids=["naive", "rate_limited", "rate_limited_rpm_only", "rate_limited_verls_key"],
)
def test_a_token_estimate_without_a_token_budget_is_refused_not_ignored(
    manager, extra, key, words, functions
):
    """``limits.estimated_tokens_per_request`` is what a call is charged against ``tokens_per_minute``:
    without that budget the managers rebuilt or kept limits that never read it, and it was accepted."""
    config = compose(manager, *extra, function=(functions, "instant"))
    with pytest.raises(ConfigError) as error:
        check_reward(config)
    assert error.value.key == key
    message = str(error.value)
    assert words in message and "would be ignored" in message, message
    assert error.value.fix is not None and "tokens_per_minute" in error.value.fix
    assert error.value.fix.startswith("remove it") and error.value.fix in message


@pytest.mark.parametrize(
    "budget",
    ["+reward.async_reward.limits.tokens_per_minute=100000", "+reward.max_tpm=100000"],
    ids=["ours", "verls"],
)
def test_a_token_estimate_with_a_token_budget_is_honoured(budget, functions):
    for estimate in (
        "+reward.async_reward.limits.estimated_tokens_per_request=300",
        "+reward.estimated_tokens_per_request=300",
    ):
        config = compose("async_rate_limited", budget, estimate, function=(functions, "instant"))
        check_reward(config)
        assert load_config(config).limits.estimated_tokens_per_request == 300


JUDGE_WITH_A_BUDGET = (
    "{name: judge, manager: llm_judge, async_reward: {judge: {base_url: 'http://127.0.0.1:9/v1'}, "
    "limits: {tokens_per_minute: 100000, estimated_tokens_per_request: 300}}}"
)


def test_a_composite_passes_a_components_token_estimate_to_its_budget():
    """A judge component with its own budget and estimate: valid, and the estimate reaches it."""
    config = compose(
        "async_composite",
        f"+reward.async_reward.composite.components=[{JUDGE_WITH_A_BUDGET}]",
    )
    check_reward(config)


def test_a_composite_refuses_a_shared_token_estimate_that_a_component_without_budgets_inherits(functions):
    """At ``reward.async_reward.limits`` every component inherits it, ``async_naive`` included, which
    has no budget to charge it against."""
    components = f"[{{name: rule, manager: async_naive, score_range: [0, 1]}}, {JUDGE_WITH_A_BUDGET}]"
    config = compose(
        "async_composite",
        f"+reward.async_reward.composite.components={components}",
        "+reward.async_reward.limits.estimated_tokens_per_request=300",
        function=(functions, "instant"),
    )
    with pytest.raises(ConfigError) as error:
        check_reward(config)
    assert error.value.key == "reward.async_reward.limits.estimated_tokens_per_request"
    assert "component 'rule' (async_naive)" in str(error.value), str(error.value)
    assert (
        error.value.fix is not None and "components that have a tokens_per_minute budget" in error.value.fix
    )


def test_a_verl_key_that_is_not_a_number_is_named():
    config = compose("async_rate_limited", "+reward.max_rpm=lots")
    with pytest.raises(ConfigError) as error:
        check_reward(config)
    assert error.value.key == "reward.max_rpm"


# ------------------------------------------------------------------ refused
@pytest.mark.parametrize(
    ("manager", "extra", "function", "key", "words"),
    [
        ("async_naive", ["+reward.max_rpm=60"], "instant", "reward.max_rpm", "async_rate_limited"),
        ("async_naive", ["+reward.max_tpm=6000"], "instant", "reward.max_tpm", "async_rate_limited"),
        (
            "async_naive",
            ["+reward.estimated_tokens_per_request=100"],
            "instant",
            "reward.estimated_tokens_per_request",
            "async_rate_limited",
        ),
        (
            "async_naive",
            ["+reward.async_reward.limits.requests_per_minute=60"],
            "instant",
            "reward.async_reward.limits.requests_per_minute",
            "async_rate_limited",
        ),
        (
            "async_naive",
            [
                "+reward.reward_kwargs.overlong_buffer_cfg.enable=true",
                "+reward.reward_kwargs.max_resp_len=16",
            ],
            "instant",
            "reward.reward_kwargs.overlong_buffer_cfg",
            "dapo",
        ),
        (
            "llm_judge",
            ["+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1"],
            "instant",
            "reward.custom_reward_function.path",
            "does not call one",
        ),
        (  # a judge server and the judge verl serves in the job: two judges (issue 27)
            "llm_judge",
            ["+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1", "reward.reward_model.enable=true"],
            None,
            "reward.async_reward.judge.base_url",
            "two judges",
        ),
        (  # verl would send every sample to /classify and never run the manager
            "async_naive",
            ["reward.reward_model.enable=true"],
            None,
            "reward.reward_model.enable",
            "/classify",
        ),
        (
            "async_remote",
            ["+reward.async_reward.remote.url=http://127.0.0.1:9/score", "reward.reward_model.enable=true"],
            None,
            "reward.reward_model.enable",
            "never calls",
        ),
        (
            "async_remote",
            [
                "+reward.async_reward.remote.url=http://127.0.0.1:9/score",
                "reward.sandbox_fusion.url=http://sb",
            ],
            None,
            "reward.sandbox_fusion.url",
            "does not use",
        ),
        (
            "async_naive",
            ["reward.sandbox_fusion.url=http://sb"],
            "instant",
            "reward.sandbox_fusion.url",
            "custom_reward_function replaces",
        ),
        (
            "async_stateful",
            ["reward.sandbox_fusion.url=http://sb"],
            "Agent",
            "reward.sandbox_fusion.url",
            "does not use",
        ),
        # A function's name or arguments without its path: verl loads no function, so both are ignored.
        (
            "llm_judge",
            [
                "+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1",
                "reward.custom_reward_function.name=my_fn",
            ],
            None,
            "reward.custom_reward_function.name",
            "calls no reward function",
        ),
        (
            "async_remote",
            [
                "+reward.async_reward.remote.url=http://127.0.0.1:9/score",
                "+reward.custom_reward_function.reward_kwargs.alpha=0.5",
            ],
            None,
            "reward.custom_reward_function.reward_kwargs",
            "calls no reward function",
        ),
        (
            "async_naive",
            ["reward.custom_reward_function.name=my_fn"],
            None,
            "reward.custom_reward_function.name",
            "without reward.custom_reward_function.path",
        ),
        (
            "async_rate_limited",
            ["+reward.custom_reward_function.reward_kwargs.alpha=0.5"],
            None,
            "reward.custom_reward_function.reward_kwargs",
            "without reward.custom_reward_function.path",
        ),
        (
            "async_composite",
            [
                "+reward.async_reward.composite.components=[{name: rule, manager: async_naive}]",
                "reward.custom_reward_function.name=my_fn",
            ],
            None,
            "reward.custom_reward_function.name",
            "without reward.custom_reward_function.path",
        ),
    ],
)
def test_verl_setting_the_manager_cannot_honour_is_refused_by_name(
    manager, extra, function, key, words, functions
):
    config = compose(manager, *extra, function=None if function is None else (functions, function))
    with pytest.raises(ConfigError) as error:
        check_reward(config)
    assert error.value.key == key
    assert words in str(error.value)


def test_a_composite_passes_the_jobs_function_to_its_function_components_only(functions):
    """The job's function (path, name, arguments) is for the composite's function component; its
    judge component gets the path cleared and the name left (``component_config``), and is not
    refused for it: the name-without-path rule reads the job's own config."""
    components = (
        "[{name: rule, manager: async_naive, score_range: [0, 1]}, "
        "{name: judge, manager: llm_judge, async_reward: {judge: {base_url: 'http://127.0.0.1:9/v1'}}}]"
    )
    config = compose(
        "async_composite",
        f"+reward.async_reward.composite.components={components}",
        "+reward.custom_reward_function.reward_kwargs.weight=2",
        function=(functions, "echo_kwargs"),
    )
    check_reward(config)


def test_overlong_penalty_refused_only_when_enabled(functions):
    """dapo applies its penalty only with ``overlong_buffer_cfg.enable``: a disabled one asks for nothing."""
    kwargs = ["+reward.reward_kwargs.max_resp_len=16", "+reward.reward_kwargs.overlong_buffer_cfg.len=4"]
    enabled = compose("async_naive", *kwargs, "+reward.reward_kwargs.overlong_buffer_cfg.enable=true")
    with pytest.raises(ConfigError, match="dapo"):
        check_reward(enabled)
    disabled = compose("async_naive", *kwargs, "+reward.reward_kwargs.overlong_buffer_cfg.enable=false")
    check_reward(disabled)


# ------------------------------------------------------------------ honoured: function arguments
def _manager(config: Any, tokenizer: Any, **kwargs: Any) -> Any:
    from verl.trainer.ppo.reward import load_reward_manager

    return load_reward_manager(config, tokenizer, **kwargs)


async def test_stateful_class_gets_custom_reward_function_reward_kwargs(functions, tokenizer, batch_factory):
    config = compose(
        "async_stateful",
        "+reward.custom_reward_function.reward_kwargs.weight=0.25",
        function=(functions, "Agent"),
    )
    manager = _manager(config, tokenizer)
    result = await manager.run_single(batch_factory([{"response": "x", "ground_truth": "1"}]))
    assert result["reward_extra_info"]["status"] == "ok"
    assert result["reward_score"] == 0.25  # -1.0 before: the kwargs never reached the class


async def test_reward_model_router_address_reaches_the_function_as_verl_passes_it(
    functions, tokenizer, batch_factory
):
    config = compose("async_naive", function=(functions, "echo_kwargs"))
    manager = _manager(
        config, tokenizer, reward_router_address="127.0.0.1:30000", reward_model_tokenizer=tokenizer
    )
    result = await manager.run_single(batch_factory([{"response": "x", "ground_truth": "1"}]))
    assert result["reward_extra_info"]["got"] == "reward_model_tokenizer,reward_router_address"


# ------------------------------------------------------------------ verl's rate-limit scenarios
def _rate_limited(functions: str, name: str, tokenizer: Any, *extra: str) -> Any:
    return _manager(compose("async_rate_limited", *extra, function=(functions, name)), tokenizer)


async def _score(manager: Any, batch: Any, count: int) -> tuple[list[dict[str, Any]], float]:
    import asyncio

    start = time.monotonic()
    results = await asyncio.gather(*(manager.run_single(batch) for _ in range(count)))
    return list(results), time.monotonic() - start


async def test_verl_scenario_rpm_60_paces_three_calls(functions, tokenizer, batch_factory):
    manager = _rate_limited(
        functions, "instant", tokenizer, "+reward.max_concurrent=10", "+reward.max_rpm=60"
    )
    results, elapsed = await _score(manager, batch_factory([{"response": "x"}]), 3)
    assert elapsed >= 1.8, f"RPM limiting failed: {elapsed:.3f}s for 3 requests"  # verl's floor
    assert all(r["reward_score"] == 1.0 for r in results)


async def test_verl_scenario_max_concurrent_2_holds_five_calls_to_two(functions, tokenizer, batch_factory):
    manager = _rate_limited(functions, "timed", tokenizer, "+reward.max_concurrent=2")
    results, elapsed = await _score(manager, batch_factory([{"response": "x"}]), 5)
    assert elapsed >= 0.02  # verl's floor
    intervals = [(r["reward_extra_info"]["started"], r["reward_extra_info"]["ended"]) for r in results]
    most = max(sum(1 for s, e in intervals if s <= t < e) for t, _ in intervals)
    assert most == 2  # five at once before: the key was ignored


async def test_verl_scenario_timeout_half_a_second_stops_an_hour_long_function(
    functions, tokenizer, batch_factory
):
    manager = _rate_limited(
        functions,
        "slow",
        tokenizer,
        "+reward.max_concurrent=10",
        "+reward.timeout=0.5",
        "+reward.async_reward.retry.max_attempts=1",
    )
    results, elapsed = await _score(manager, batch_factory([{"response": "x"}]), 1)
    info = results[0]["reward_extra_info"]
    assert info["status"] == "timeout", info
    assert results[0]["reward_score"] == 0.0
    assert elapsed < 30  # the function would take an hour: stopped at its 0.5 s deadline (+ grace)


async def test_verl_scenario_rpm_6000_holds_200_calls_to_100_per_second(functions, tokenizer, batch_factory):
    manager = _rate_limited(
        functions, "instant", tokenizer, "+reward.max_concurrent=20", "+reward.max_rpm=6000"
    )
    results, elapsed = await _score(manager, batch_factory([{"response": "x"}]), 200)
    assert all(r["reward_score"] == 1.0 for r in results)
    assert elapsed >= 0.9, f"Should take at least 0.9s for rate limiting, took {elapsed:.3f}s"  # verl's floor
    assert 200 / elapsed <= 200  # verl's ceiling on the rate


async def test_multi_turn_fields_reach_the_function_as_verls_naive_passes_them(
    functions, tokenizer, batch_factory
):
    """verl's naive adds ``num_turns``, ``rollout_reward_scores`` and the tool fields to extra_info."""
    import numpy as np

    manager = _manager(compose("async_naive", function=(functions, "echo_kwargs")), tokenizer)
    batch = batch_factory([{"response": "x", "ground_truth": "1"}])
    batch.non_tensor_batch["__num_turns__"] = np.array([3], dtype=object)
    batch.non_tensor_batch["tool_extra_fields"] = np.array([{"tool_field": "grep"}], dtype=object)
    info = (await manager.run_single(batch))["reward_extra_info"]
    assert (info["turns"], info["tool"]) == (3, "grep")
