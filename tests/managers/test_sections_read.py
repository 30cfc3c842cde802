"""A setting of ``reward.async_reward`` that the chosen manager never reads is refused at start-up, on
the driver (``check_reward``, as verl's trainer runs it) and where a reward worker builds the manager
(verl's ``load_reward_manager``), never ignored: a ``judge`` rubric under ``async_naive`` would
otherwise leave the rubric out of every reward without a word."""

from __future__ import annotations

from pathlib import Path

import pytest

from async_reward import ConfigError
from async_reward.config.checks import check_reward

JUDGE = {"base_url": "http://127.0.0.1:9/v1"}
REMOTE = {"url": "http://127.0.0.1:9/score"}
STATEFUL_CLASS = """
class Scorer:
    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        return 1.0
"""

#: (manager, its own sections, the section set for another manager, that manager)
CASES = [
    ("async_naive", {}, {"judge": {"template": "rubric"}}, "llm_judge"),
    ("async_rate_limited", {}, {"judge": JUDGE}, "llm_judge"),
    ("async_rate_limited", {}, {"composite": {"components": [{"name": "rule"}]}}, "async_composite"),
    ("async_remote", {"remote": REMOTE}, {"judge": {"model": "grader"}}, "llm_judge"),
    ("llm_judge", {"judge": JUDGE}, {"remote": REMOTE}, "async_remote"),
    ("llm_judge", {"judge": JUDGE}, {"stateful": {"init_kwargs": {"level": 1}}}, "async_stateful"),
    ("async_stateful", {}, {"remote": REMOTE}, "async_remote"),
]


def function_for(manager: str, tmp_path: Path) -> dict[str, str] | None:
    if manager != "async_stateful":
        return None
    path = tmp_path / "scorer.py"
    path.write_text(STATEFUL_CLASS)
    return {"path": str(path), "name": "Scorer"}


@pytest.mark.parametrize(("manager", "own", "foreign", "reader"), CASES)
def test_a_section_of_another_manager_is_refused_on_the_driver_and_in_a_worker(
    manager, own, foreign, reader, tmp_path, verl_config_factory, tokenizer
):
    from verl.trainer.ppo.reward import load_reward_manager

    (section,) = foreign
    config = verl_config_factory(
        manager, {**own, **foreign}, custom_reward_function=function_for(manager, tmp_path)
    )
    for build in (check_reward, lambda c: load_reward_manager(c, tokenizer)):
        with pytest.raises(ConfigError) as info:
            build(config)
        assert info.value.key == f"reward.async_reward.{section}"
        message = str(info.value)
        assert f"is read by {reader} only, and the manager is {manager}" in message
        assert f"set reward.reward_manager.name={reader}, or remove reward.async_reward.{section}" in message
    # Its own sections alone start.
    check_reward(verl_config_factory(manager, own, custom_reward_function=function_for(manager, tmp_path)))


@pytest.mark.parametrize("key", ["executor", "executor_workers"])
@pytest.mark.parametrize(
    ("manager", "own"), [("llm_judge", {"judge": JUDGE}), ("async_remote", {"remote": REMOTE})]
)
def test_an_executor_for_a_manager_that_runs_no_function_is_refused(manager, own, key, verl_config_factory):
    value = "process" if key == "executor" else 3
    with pytest.raises(ConfigError) as info:
        check_reward(verl_config_factory(manager, {**own, key: value}))
    assert info.value.key == f"reward.async_reward.{key}"
    assert "runs none" in str(info.value) and f"remove reward.async_reward.{key}" in str(info.value)


def test_a_top_level_section_no_component_reads_is_refused_under_the_composite(verl_config_factory):
    rule_only = {"composite": {"components": [{"name": "rule", "manager": "async_naive"}]}}
    with pytest.raises(ConfigError) as info:
        check_reward(verl_config_factory("async_composite", {**rule_only, "judge": {"criteria": []}}))
    assert info.value.key == "reward.async_reward.judge"
    assert "is read by llm_judge components only, and async_composite has none" in str(info.value)
    check_reward(verl_config_factory("async_composite", rule_only))


def test_a_manager_of_ones_own_keeps_the_sections_it_may_read(verl_config_factory, tmp_path):
    """A subclass of ours not of the built-ins declares no sections: only ``composite`` is checked."""
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

    from async_reward import AsyncRewardManager, RewardResult, register_manager

    @register_manager("sections_probe")
    class SectionsProbe(AsyncRewardManager):
        async def score(self, sample):
            return RewardResult(score=0.0)

    try:
        check_reward(verl_config_factory("sections_probe", {"judge": JUDGE}))
        with pytest.raises(ConfigError) as info:
            check_reward(
                verl_config_factory("sections_probe", {"composite": {"components": [{"name": "rule"}]}})
            )
        assert info.value.key == "reward.async_reward.composite"
    finally:
        REWARD_MANAGER.pop("sections_probe", None)
