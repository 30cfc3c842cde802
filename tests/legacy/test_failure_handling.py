"""The legacy pipelined manager's Ray workers under a scorer that misbehaves: every sample comes back
once, with a status, and the job-wide budget is split by the workers really started (the scorer's
hazards and the in-process cases: tests/_core/test_failure_handling.py)."""

from __future__ import annotations

from tests._core.test_failure_handling import CONTROL_FLOW


def test_the_pipeline_accounts_for_every_sample_and_splits_the_budget_by_its_workers(
    ray_cluster, hazards, verl_config_factory, batch_factory
):
    """Two workers started with ``num_workers=2`` while ``reward.num_workers`` is 1: each used to take
    the whole job-wide budget (120 RPM for 60). And a user function raising control flow used to leave
    its sample without a result: ``get_chunk`` waited forever."""
    import ray

    from async_reward.legacy import PipelinedRewardLoopManager

    config = verl_config_factory(
        "async_rate_limited",
        {"limits": {"requests_per_minute": 600}, "retry": {"max_attempts": 1}},
        num_workers=1,
        custom_reward_function={"path": hazards, "name": "async_score"},
    )
    with PipelinedRewardLoopManager(config, num_workers=2) as rewards:
        shares = ray.get(
            [
                handle.__ray_call__.remote(lambda worker: worker.manager.admission.request_budget)
                for handle in rewards.worker_handles
            ]
        )
        assert shares == [300.0, 300.0]
        truths = [*CONTROL_FLOW, "ok", "ok"]
        rows = [{"response": "x", "ground_truth": t, "uid": f"g{i // 2}"} for i, t in enumerate(truths)]
        chunk = rewards.get_chunk(rewards.submit(batch_factory(rows)), len(rows), timeout=60)
    assert list(chunk.statuses) == ["error"] * len(CONTROL_FLOW) + ["ok", "ok"]
    assert "KeyboardInterrupt raised by the scoring code" in chunk.reward_extra_info["failure_reason"][0]
