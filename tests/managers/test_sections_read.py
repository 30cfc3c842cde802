"""A setting of ``reward.async_reward`` that the chosen manager never reads is refused at start-up, on
the driver (``check_reward``, as verl's trainer runs it) and where a reward worker builds the manager
(verl's ``load_reward_manager``), never ignored: a ``judge`` rubric under ``async_naive`` would
otherwise leave the rubric out of every reward without a word. So are an executor for a manager that
runs no function of yours, the composite's section under another manager, and (under
``async_composite``) a shared section that no component reads. The refusals name the key and do not
echo a section's value, which may hold a header's secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from async_reward import ConfigError
from async_reward.config.checks import check_reward

JUDGE = {"base_url": "http://127.0.0.1:9/v1"}
REMOTE = {"url": "http://127.0.0.1:9/score"}
SECRET = "hdr-secret-in-config"
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
    ("async_naive", {}, {"stateful": {"init_kwargs": {"level": 1}}}, "async_stateful"),
    ("async_remote", {"remote": REMOTE}, {"judge": {"model": "grader"}}, "llm_judge"),
    ("async_remote", {"remote": REMOTE}, {"stateful": {"init_kwargs": {"level": 1}}}, "async_stateful"),
    ("llm_judge", {"judge": JUDGE}, {"remote": {**REMOTE, "headers": {"X-Key": SECRET}}}, "async_remote"),
    ("llm_judge", {"judge": JUDGE}, {"stateful": {"init_kwargs": {"level": 1}}}, "async_stateful"),
    ("async_stateful", {}, {"remote": REMOTE}, "async_remote"),
    ("async_stateful", {}, {"judge": {"extra_body": {"token": SECRET}}}, "llm_judge"),
]


def function_for(manager: str, tmp_path: Path) -> dict[str, str] | None:
    if manager != "async_stateful":
        return None
    path = tmp_path / "scorer.py"
    path.write_text(STATEFUL_CLASS)
    return {"path": str(path), "name": "Scorer"}


@pytest.mark.parametrize(("manager", "own", "foreign", "reader"), CASES)
def test_a_section_of_another_manager_is_refused_on_the_driver_and_in_a_worker_without_its_value(
    manager, own, foreign, reader, tmp_path, verl_config_factory, tokenizer
):
    from verl.trainer.ppo.reward import load_reward_manager

    (section,) = foreign
    config = verl_config_factory(
        manager, {**own, **foreign}, custom_reward_function=function_for(manager, tmp_path)
    )
    for build in (check_reward, lambda c: load_reward_manager(c, tokenizer)):  # driver, worker
        with pytest.raises(ConfigError) as info:
            build(config)
        assert info.value.key == f"reward.async_reward.{section}"
        message = str(info.value)
        assert f"reward.async_reward.{section} is set, and is read by {reader} only" in message
        assert f"the manager is {manager}: it would be ignored" in message
        assert f"set reward.reward_manager.name={reader}" in message
        assert f"or remove reward.async_reward.{section}" in message
        assert SECRET not in message and "level" not in message and "grader" not in message
    # Its own sections alone start.
    check_reward(verl_config_factory(manager, own, custom_reward_function=function_for(manager, tmp_path)))


@pytest.mark.parametrize("key", ["executor", "executor_workers"])
@pytest.mark.parametrize(
    ("manager", "own"), [("llm_judge", {"judge": JUDGE}), ("async_remote", {"remote": REMOTE})]
)
def test_an_executor_for_a_manager_that_runs_no_function_is_refused(
    manager, own, key, verl_config_factory, tokenizer
):
    from verl.trainer.ppo.reward import load_reward_manager

    value = "process" if key == "executor" else 3
    config = verl_config_factory(manager, {**own, key: value})
    for build in (check_reward, lambda c: load_reward_manager(c, tokenizer)):  # driver, worker
        with pytest.raises(ConfigError) as info:
            build(config)
        assert info.value.key == f"reward.async_reward.{key}"
        assert "runs none" in str(info.value) and f"remove reward.async_reward.{key}" in str(info.value)
    check_reward(verl_config_factory(manager, own))


def test_a_shared_section_no_component_reads_is_refused_under_the_composite_without_its_value(
    verl_config_factory,
):
    rule_only = {"composite": {"components": [{"name": "rule", "manager": "async_naive"}]}}
    remote = {**REMOTE, "headers": {"X-Api-Key": SECRET}}
    for section, value, reader in (("judge", JUDGE, "llm_judge"), ("remote", remote, "async_remote")):
        with pytest.raises(ConfigError) as info:
            check_reward(verl_config_factory("async_composite", {**rule_only, section: value}))
        assert info.value.key == f"reward.async_reward.{section}"
        assert f"is read by {reader} components only, and async_composite has none" in str(info.value)
        assert SECRET not in str(info.value)
    check_reward(verl_config_factory("async_composite", rule_only))


def test_the_composite_section_under_another_manager_is_refused_without_its_value(verl_config_factory):
    components = [
        {"name": "svc", "manager": "async_remote", "async_reward": {"remote": {"headers": {"X": SECRET}}}}
    ]
    with pytest.raises(ConfigError) as info:
        check_reward(
            verl_config_factory("llm_judge", {"judge": JUDGE, "composite": {"components": components}})
        )
    assert info.value.key == "reward.async_reward.composite" and SECRET not in str(info.value)


def test_a_manager_of_ones_own_keeps_the_sections_it_may_read_and_is_refused_the_composites(
    verl_config_factory,
):
    """A manager of one's own may read ``self.settings.judge`` (or ``remote``, ``stateful``): none of
    them is refused for it, also where it extends a built-in that does not read the section (what
    a built-in reads is set on that class alone, not inherited). The composite's section is read by
    the composite's machinery only, so it stays refused."""
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

    from async_reward import AsyncRewardManager, RewardResult, register_manager
    from async_reward.managers.naive import AsyncNaiveRewardManager

    @register_manager("sections_probe")
    class SectionsProbe(AsyncRewardManager):
        async def score(self, sample):
            return RewardResult(score=0.0)

    @register_manager("sections_probe_naive")
    class NaiveWithAJudge(AsyncNaiveRewardManager):
        async def score(self, sample):
            return RewardResult(score=0.0)

    remote = {**REMOTE, "headers": {"X-Key": SECRET}}
    composite = {"composite": {"components": [{"name": "r"}]}}
    try:
        for name in ("sections_probe", "sections_probe_naive"):
            for section in ({"judge": JUDGE}, {"remote": remote}, {"stateful": {"init_kwargs": {"a": 1}}}):
                check_reward(verl_config_factory(name, section))  # its own to read
            with pytest.raises(ConfigError) as info:
                check_reward(verl_config_factory(name, composite))
            assert info.value.key == "reward.async_reward.composite"
        # The built-in it extends still refuses what it does not read.
        with pytest.raises(ConfigError) as info:
            check_reward(verl_config_factory("async_naive", {"judge": JUDGE}))
        assert info.value.key == "reward.async_reward.judge"
    finally:
        REWARD_MANAGER.pop("sections_probe", None)
        REWARD_MANAGER.pop("sections_probe_naive", None)
