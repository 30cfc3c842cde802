"""What our setup hook costs a Ray worker (:mod:`async_reward.worker_imports`): a worker that never
loads verl (TransferQueue's controller and storage, a server) imports none of it, and one where verl
looks a manager up finds ours, on the session's cluster whose workers run the hook."""

from __future__ import annotations

import sys

import pytest
import ray

pytestmark = pytest.mark.usefixtures("ray_cluster")

#: Our managers' registered names (``async_reward.MANAGER_NAMES``, spelled out: reading that name in
#: the worker would import the managers before verl's lookup could).
MANAGER_NAMES = ("async_naive", "async_rate_limited", "async_remote", "llm_judge", "async_stateful")


@ray.remote(num_cpus=0)
class ImportProbe:
    """An actor of no verl class: what the setup hook left loaded, and verl's lookups once asked."""

    def loaded(self) -> dict[str, bool]:
        import async_reward  # what a user's code in a worker may do first

        return {
            "hook_ran": "async_reward.integration" in sys.modules,
            "verl": "verl" in sys.modules,
            "torch": "torch" in sys.modules,
            "managers": "async_reward.managers" in sys.modules,
            "has_config": hasattr(async_reward, "AsyncRewardConfig"),
        }

    def lookups(self) -> dict[str, str]:
        from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
        from verl.experimental.reward_loop.reward_manager.registry import get_reward_manager_cls as home

        import async_reward

        assert "async_reward.managers" not in sys.modules  # verl loaded; ours not yet: the lookup loads them
        found = {name: get_reward_manager_cls(name).__qualname__ for name in MANAGER_NAMES}
        found["via_registry_module"] = home("llm_judge").__qualname__
        found["package_attribute"] = async_reward.LLMJudgeRewardManager.__qualname__
        return found


def test_a_worker_that_never_loads_verl_imports_none_of_it_and_a_lookup_finds_our_managers():
    import async_reward

    assert tuple(async_reward.MANAGER_NAMES) == MANAGER_NAMES
    probe = ImportProbe.remote()
    try:
        loaded = ray.get(probe.loaded.remote(), timeout=120)
        assert loaded == {
            "hook_ran": True,
            "verl": False,
            "torch": False,
            "managers": False,
            "has_config": True,
        }
        found = ray.get(probe.lookups.remote(), timeout=120)
    finally:
        ray.kill(probe, no_restart=True)
    assert found == {
        "async_naive": "AsyncNaiveRewardManager",
        "async_rate_limited": "AsyncRateLimitedRewardManager",
        "async_remote": "AsyncRemoteRewardManager",
        "llm_judge": "LLMJudgeRewardManager",
        "async_stateful": "AsyncStatefulRewardManager",
        "via_registry_module": "LLMJudgeRewardManager",
        "package_attribute": "LLMJudgeRewardManager",
    }
