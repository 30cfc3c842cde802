"""A setting of ``reward.async_reward`` that the chosen manager never reads is refused at start-up,
never ignored: an executor for a manager that runs no function of yours, the composite's section
under another manager, and (under ``async_composite``) a shared section that no component reads.
The refusals name the key and do not echo a section's value, which may hold a header's secret."""

from __future__ import annotations

import pytest

from async_reward import ConfigError
from async_reward.config.checks import check_reward

JUDGE = {"base_url": "http://127.0.0.1:9/v1"}
REMOTE = {"url": "http://127.0.0.1:9/score"}
SECRET = "hdr-secret-in-config"


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


def test_a_manager_of_ones_own_is_refused_the_composites_section(verl_config_factory):
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

    from async_reward import AsyncRewardManager, RewardResult, register_manager

    @register_manager("sections_probe")
    class SectionsProbe(AsyncRewardManager):
        async def score(self, sample):
            return RewardResult(score=0.0)

    try:
        check_reward(verl_config_factory("sections_probe", {"judge": JUDGE}))  # its own to read
        with pytest.raises(ConfigError) as info:
            check_reward(
                verl_config_factory("sections_probe", {"composite": {"components": [{"name": "r"}]}})
            )
        assert info.value.key == "reward.async_reward.composite"
    finally:
        REWARD_MANAGER.pop("sections_probe", None)
