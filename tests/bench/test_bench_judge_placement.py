"""The judge-placement benchmark's model and wiring: capacity and latency from where the judge runs,
the policy's GPUs and stages, the strategies each placement takes, and a colocated judge that
scores only between sampling and training (a short run of verl's own v1 ``sync`` on the harness)."""

from __future__ import annotations

import dataclasses

import pytest

from async_reward_bench.calibration import load_medians
from async_reward_bench.colocated_judge import colocated_judge_class
from async_reward_bench.gpu_split import colocated_stages
from async_reward_bench.judge_placement import (
    COLOCATED_STRATEGIES,
    STANDALONE_STRATEGIES,
    JudgeModel,
    Placement,
    mean_response_s,
    placements,
    plan_run,
    slots_per_gpu,
)
from async_reward_bench.placement_bench import PlacementConfig, judge_settings

STAGES = load_medians()["gsm8k_qwen2_7b_base"]
SIGMA = 0.45


def _plan(strategy: str, k: int, judge: JudgeModel | None = None, samples: int = 160):  # type: ignore[no-untyped-def]
    return plan_run(
        strategy,
        Placement(k),
        judge or JudgeModel(),
        STAGES,
        sigma=SIGMA,
        samples=samples,
        per_gpu=slots_per_gpu(samples),
    )


def test_a_standalone_judge_scales_with_its_gpus_and_a_colocated_one_has_all_of_them():
    one, two, colocated = _plan("both", 1), _plan("both", 2), _plan("v1_sync", 0)
    assert slots_per_gpu(160) == 20
    assert (one.judge_capacity, two.judge_capacity, colocated.judge_capacity) == (20, 40, 160)
    assert two.judge_work_s == pytest.approx(one.judge_work_s / 2)
    assert colocated.judge_work_s == pytest.approx(one.judge_work_s / 8)
    # The same replica speed wherever it runs: only capacity changes with the GPUs.
    assert one.judge_latency_s == two.judge_latency_s == colocated.judge_latency_s
    # The server is set from the plan: capacity as planned, latency time-scaled to milliseconds.
    settings = judge_settings(two, 0.01)
    assert settings["capacity"] == 40
    assert settings["latency_ms"] == pytest.approx([x * 10 for x in two.judge_latency_s])


def test_the_judge_latency_follows_its_tokens_and_speed_from_the_policys_rollout():
    response = mean_response_s(STAGES, SIGMA, 160)
    assert 0.2 * STAGES.gen_s < response < 0.4 * STAGES.gen_s  # the mean response, not the longest
    base = JudgeModel()
    assert sum(base.latency_s(response)) / 2 == pytest.approx(response)  # 1x tokens at 1x speed
    heavy, slow = JudgeModel(tokens_ratio=4.0), JudgeModel(speed=0.5)
    assert heavy.latency_s(response) == pytest.approx(tuple(4 * x for x in base.latency_s(response)))
    assert slow.latency_s(response) == pytest.approx(tuple(2 * x for x in base.latency_s(response)))
    lo, hi = base.latency_s(response)
    assert hi / lo == pytest.approx(40.0)  # the recipe judge's 1-40 s shape
    with pytest.raises(ValueError):
        JudgeModel(tokens_ratio=0.0)


def test_the_policy_keeps_the_gpus_the_judge_leaves():
    for k in (1, 2):
        plan = _plan("v1_sync", k)
        assert plan.stages == colocated_stages(STAGES, 8 - k) and plan.split is None
        assert plan.stages.gen_s == pytest.approx(STAGES.gen_s * 8 / (8 - k))
        assert plan.wake_sleep_s is None  # scored per sample while generating
        separate = _plan("v1_separate_async", k)
        assert separate.split is not None and separate.split.total == 8 - k
        assert separate.stages == separate.split.stages(STAGES)
    colocated = _plan("v1_colocate_async", 0)
    assert colocated.stages == STAGES and colocated.wake_sleep_s == JudgeModel().wake_sleep_s


def test_the_colocated_bound_adds_the_judge_phase_and_the_standalone_bound_takes_the_larger_term():
    judge = JudgeModel(tokens_ratio=4.0, wake_sleep_s=5.0)
    colocated = _plan("v1_sync", 0, judge)
    lo, hi = colocated.judge_latency_s
    gpu = STAGES.gen_s + STAGES.prepare_s + STAGES.update_actor_s
    assert colocated.bound_s == pytest.approx(gpu + lo + (hi - lo) * 160 / 161 + 5.0)
    one = _plan("both", 1, judge)  # 4x tokens on one GPU: the judge is the bound
    assert one.bound_s == pytest.approx(one.judge_work_s) and one.judge_work_s > gpu * 8 / 7
    two = _plan("both", 2, judge)  # on two, the policy's six GPUs are
    assert two.bound_s == pytest.approx(gpu * 8 / 6)


def test_only_verls_sync_and_colocate_async_take_a_colocated_judge():
    assert set(COLOCATED_STRATEGIES) < set(STANDALONE_STRATEGIES)
    for strategy in ("v1_separate_async", "v1_pipelined_both", "both"):
        with pytest.raises(ValueError, match="enable_resource_pool"):
            _plan(strategy, 0)
    for mode in ("separate_async", "pipelined", "decoupled"):
        with pytest.raises(ValueError, match="only sync and colocate_async"):
            colocated_judge_class(object, mode)
    assert [p.name for p in placements((1, 2))] == ["colocated", "standalone k=1", "standalone k=2"]
    with pytest.raises(ValueError, match="1 to 7"):
        Placement(8)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"strategies": ("both",)}, "baseline"),
        ({"judge_gpus": (8,)}, "1 to 7"),
        ({"prompts": 3, "mini_batches": 1}, "divisible by 8"),
        ({"judge_tokens": (-1.0,)}, "must be > 0"),
    ],
)
def test_bad_placement_settings_are_refused(change, error):
    with pytest.raises(ValueError, match=error):
        dataclasses.replace(PlacementConfig(), **change).validate()


def test_a_colocated_judge_scores_only_between_sampling_and_training(
    ray_cluster, server, tokenizer, tokenizer_dir, batch_factory
):
    """verl's own v1 ``colocate_async`` with the judge on its GPUs: no sample is scored while it
    generates; after sampling (the next batch's rollout aborted and asleep) the trainer wakes the
    judge, scores the sampled batch through verl's reward worker and our ``llm_judge``, and trains
    only after the last verdict. The ``judge`` stage overlaps neither generation (the next batch is
    in flight, so the engine has work it must not do then) nor training, and every verdict lands
    inside one. (``sync`` takes the same step: verl's ``_step_once`` is shared.)"""
    import ray

    from async_reward_bench.backend import BatchFactory
    from async_reward_bench.environment import _v1_trainer_config
    from async_reward_bench.scenarios import REGIMES
    from async_reward_bench.settings import BenchConfig
    from async_reward_bench.v1_reward_worker import start_reward_workers
    from async_reward_bench.v1_run import run_v1_strategy

    cfg = BenchConfig(
        prompts=4, group_size=2, mini_batches=2, capacity=8, steps=3, time_scale=0.004, num_workers=1,
        strategies=("v1_colocate_async",), worker_concurrency=8,
    )  # fmt: skip
    plan = _plan("v1_colocate_async", 0, samples=8)
    server.update_config(**judge_settings(plan, cfg.time_scale))
    factory = BatchFactory(tokenizer, cfg.prompts, cfg.group_size, seed=1)
    rewards = start_reward_workers(
        _v1_trainer_config(cfg, tokenizer_dir, server.url, "v1_colocate_async"), 1, factory.make(99)
    )
    env = {
        "server": server,
        "factory": factory,
        "v1_rewards": rewards,
        "v1_config": lambda strategy, split=None: _v1_trainer_config(
            cfg, tokenizer_dir, server.url, strategy, split
        ),
    }

    class _Bar:
        def update(self, n: int) -> None:
            pass

    try:
        run = run_v1_strategy(
            env, cfg, REGIMES["recipe"], plan.stages.scaled(cfg.time_scale), "v1_colocate_async", 1, _Bar(),
            None, plan.wake_sleep_s,
        )  # fmt: skip
    finally:
        for worker in rewards.reward_loop_worker_handles:
            ray.kill(worker)
    records = run["records"]
    assert len(records) == 3
    events = [e for r in records for e in r.events]
    judged = [(e.start, e.end) for e in events if e.name == "judge"]
    busy = [(e.start, e.end) for e in events if e.name in ("rollout", "prepare", "update")]
    assert len(judged) == 3  # one scoring per step
    for a, b in judged:
        assert b - a >= plan.wake_sleep_s * cfg.time_scale  # wake + sleep
        assert all(b <= c or d <= a for c, d in busy), "the colocated judge overlapped generation or training"
    scored = [at for at, kind, _ in run["agent_loop_events"] if kind == "scored"]
    assert len(scored) == 3 * 8  # every sample of every step, by the judge
    assert all(any(a <= at <= b for a, b in judged) for at in scored)
    assert all(r.metrics["reward/status_ok"] == 8 for r in records)  # real verdicts, all ok


def test_bad_placement_options_exit_2_without_running(capsys):
    from async_reward_bench.placement_bench import main

    assert main(["--judge-gpus", "8", "--no-progress"]) == 2
    assert "1 to 7" in capsys.readouterr().out
