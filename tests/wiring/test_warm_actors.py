"""The harness's warm reward-loop workers (tests/support/warm_actors.py) hold what the suite relies on: a
reused worker runs verl's ``__init__`` again with the new config (its manager is the new one), one
that refuses its new config fails as a fresh worker would, a killed one is never handed out, and one
whose TransferQueue was closed and opened again since its last run attaches to the new one."""

from __future__ import annotations

from typing import Any

import pytest
import ray

from tests.support.warm_actors import WARM

ROWS = [
    {"response": "The answer is 1", "ground_truth": "1"},
    {"response": "The answer is 2", "ground_truth": "3"},
]


def scores(output: Any) -> list[float]:
    return output.batch["rm_scores"].sum(dim=-1).tolist()


def manager_names(manager: Any) -> list[str]:
    return ray.get(
        [
            worker.__ray_call__.remote(lambda self: type(self.reward_manager).__name__)
            for worker in manager.reward_loop_workers
        ]
    )


def test_a_reused_worker_is_rebuilt_with_the_new_config(
    server, verl_config_factory, reward_loop, batch_factory
):
    judge = {"judge": {"base_url": server.url + "/v1"}}
    first = reward_loop(verl_config_factory("llm_judge", judge))
    handle = first.reward_loop_workers[0]
    assert manager_names(first) == ["LLMJudgeRewardManager"]
    assert scores(first.compute_rm_score(batch_factory(ROWS))) == [1.0, 0.0]
    from tests.conftest import shutdown_reward_loop

    shutdown_reward_loop(first)
    remote = {"remote": {"url": server.url + "/score"}, "on_failure": "fallback", "fallback_score": -1.0}
    reused = before = WARM.reused["RewardLoopWorker"]
    second = reward_loop(verl_config_factory("async_remote", remote))
    reused = WARM.reused["RewardLoopWorker"]
    assert second.reward_loop_workers[0] == handle and reused == before + 1  # the same process...
    assert manager_names(second) == ["AsyncRemoteRewardManager"]  # ...with the new manager
    assert scores(second.compute_rm_score(batch_factory(ROWS))) == [1.0, 0.0]


def test_a_worker_that_refuses_its_new_config_fails_as_a_fresh_one_would(
    server, verl_config_factory, reward_loop, batch_factory, monkeypatch
):
    from async_reward import ConfigError
    from async_reward.wiring import verl_plugin
    from tests.conftest import shutdown_reward_loop

    shutdown_reward_loop(
        reward_loop(verl_config_factory("llm_judge", {"judge": {"base_url": server.url + "/v1"}}))
    )
    # our verl plugin refuses the config where verl builds its reward loop, before any worker...
    with pytest.raises(ConfigError, match=r"remote\.url"):
        reward_loop(verl_config_factory("async_remote", {}))
    # ...and without that check, a warm worker refuses it as a fresh one would
    monkeypatch.setattr(verl_plugin, "prepare_where_verl_builds", lambda config: None)
    started = WARM.started["RewardLoopWorker"]
    refused = reward_loop(verl_config_factory("async_remote", {}))  # no remote.url: the manager refuses
    assert WARM.started["RewardLoopWorker"] == started + 1  # a fresh actor, built by verl's own call
    with pytest.raises(ray.exceptions.RayActorError, match=r"remote\.url"):
        refused.compute_rm_score(batch_factory(ROWS))


def test_a_killed_worker_is_never_handed_out_again(server, verl_config_factory, reward_loop):
    from tests.conftest import shutdown_reward_loop

    config = verl_config_factory("llm_judge", {"judge": {"base_url": server.url + "/v1"}})
    first = reward_loop(config)
    killed = first.reward_loop_workers[0]
    ray.kill(killed, no_restart=True)
    shutdown_reward_loop(first)
    second = reward_loop(config)
    assert second.reward_loop_workers[0] != killed


class TransferQueueUser:
    """Attaches to the cluster's TransferQueue in ``__init__`` (``tq.init()``), as verl's agent-loop
    workers do."""

    def __init__(self) -> None:
        import transfer_queue as tq

        tq.init()

    def controller(self) -> Any:
        from transfer_queue import interface

        return interface._TQ_CONTROLLER


@pytest.mark.timeout(300)
def test_a_warm_worker_attaches_to_a_transfer_queue_opened_again_since_its_last_run(transfer_queue):
    """A ``main_ppo`` subprocess (or the toy benchmark) closes the process's TransferQueue and the
    next run opens another: a warm worker is re-initialised against the new one, not refused (its
    ``tq.init()`` asked the closed controller) and rebuilt."""
    from tests.conftest import _SESSION_TQ

    first = WARM.acquire(TransferQueueUser, slot="tq-user", options={}, args=())
    old_controller = ray.get(first.controller.remote())
    WARM.release([first])
    _SESSION_TQ.close()
    _SESSION_TQ.ensure_open()
    reused = WARM.reused["TransferQueueUser"]
    second = WARM.acquire(TransferQueueUser, slot="tq-user", options={}, args=())
    try:
        assert second == first and WARM.reused["TransferQueueUser"] == reused + 1
        current = ray.get_actor("TransferQueueController", namespace="transfer_queue")
        assert ray.get(second.controller.remote()) == current != old_controller
    finally:
        ray.kill(second, no_restart=True)
