"""Standalone rollout GPUs in the benchmark, without Ray: the split and bound arithmetic, the settings
that choose them, verl's own ``PPOTrainerSeparateAsync`` built on the config the benchmark gives it,
and the benchmark's dataloader handing out exact prompt counts (async refills)."""

from __future__ import annotations

import numpy as np
import pytest

from async_reward_bench import speedup
from async_reward_bench.calibration import StageMedians, load_medians
from async_reward_bench.generation import rollout_work
from async_reward_bench.gpu_split import (
    CALIBRATION_GPUS,
    GpuSplit,
    best_rollout_gpus,
    colocated_bound,
    colocated_stages,
    split_for,
)
from async_reward_bench.report import add_relative, busy_time
from async_reward_bench.scenarios import REGIMES, SEPARATE_STRATEGIES, regime_stages
from async_reward_bench.settings import BenchConfig


def _stages(regime: str = "recipe") -> StageMedians:
    return regime_stages(REGIMES[regime], load_medians()["gsm8k_qwen2_7b_base"])


# -- the split and its bound ---------------------------------------------------------------------------


def test_generation_work_is_what_a_continuously_fed_engine_needs_per_batch():
    # Equal responses: the work is the makespan (each of the slots decodes one response).
    assert rollout_work(40.0, 0.0, samples=640, slots=640) == pytest.approx(40.0)
    assert rollout_work(40.0, 0.0, samples=640, slots=320) == pytest.approx(80.0)  # two rounds of slots
    # The regimes' log-normal lengths: the mean response is 0.28 of the longest (0.10 in the long tail).
    assert rollout_work(1.0, REGIMES["recipe"].gen_sigma, 640, 640) == pytest.approx(0.28, abs=0.02)
    assert rollout_work(1.0, REGIMES["long_tail"].gen_sigma, 640, 640) == pytest.approx(0.10, abs=0.02)
    with pytest.raises(ValueError):
        rollout_work(1.0, 0.45, 0, 640)


def test_the_default_split_minimises_the_gpu_bound_in_each_regime():
    recipe, long_tail = _stages("recipe"), _stages("long_tail")
    train = recipe.prepare_s + recipe.update_actor_s  # 197.8 s on the 8 calibration GPUs

    def gpu_bound(work: float, total: int, r: int) -> float:
        return max(work * CALIBRATION_GPUS / r, train * CALIBRATION_GPUS / (total - r))

    for work, total in ((11.2, 8), (159.2, 8), (39.8, 8), (11.2, 16), (60.0, 16), (15.6, 3)):
        best = best_rollout_gpus(recipe, work, total)
        assert all(gpu_bound(work, total, best) <= gpu_bound(work, total, r) for r in range(1, total))
    # Generation work (0.28 of the 39.8 s makespan, 0.10 of the long tail's 159.2 s) is a small share
    # of the GPU work: at 8 GPUs one rollout GPU is enough in every regime, and the split's GPU bound
    # is the 7 trainer GPUs' 226.1 s, below the colocated 237.6 s.
    for stages in (recipe, long_tail):
        work = rollout_work(stages.gen_s, 0.45 if stages is recipe else 0.9, 640, 640)
        assert best_rollout_gpus(stages, work, 8) == 1
        terms = GpuSplit(8, 1).terms(stages, work, reward_work_s=0.0)
        assert terms["trainer_s"] == pytest.approx(226.06, abs=0.01) and terms["rollout_s"] < 130
    assert GpuSplit(8, 1).bound(recipe, 11.2, 0.0) / colocated_bound(recipe, 0.0) == pytest.approx(
        0.951, abs=0.001
    )
    # A split balanced on the makespan instead (2 + 6 for the recipe's stages, as verl's docs size
    # it) is 11 % above colocated: the trainer loses a quarter of its GPUs.
    assert best_rollout_gpus(recipe, recipe.gen_s, 8) == 2
    assert GpuSplit(8, 2).bound(recipe, recipe.gen_s, 0.0) / 237.6 == pytest.approx(1.11, abs=0.005)
    assert best_rollout_gpus(long_tail, long_tail.gen_s, 8) == 4
    # 16 GPUs: colocated halves; the split 1 + 15 trains in 105.5 s.
    sixteen = split_for(recipe, 11.2, 16)
    assert (sixteen.rollout, sixteen.trainer) == (1, 15)
    colocated_16 = colocated_bound(colocated_stages(recipe, 16), 0.0)
    assert colocated_16 == pytest.approx(237.6 / 2)
    assert sixteen.bound(recipe, 11.2, 0.0) == pytest.approx(197.8 * 8 / 15)


def test_a_split_scales_generation_and_training_and_adds_the_weight_sync():
    recipe = _stages()
    split = GpuSplit(8, 2, weight_sync_s=5.0)
    run = split.stages(recipe)
    assert run.gen_s == pytest.approx(39.8 * 4)  # x 8/2
    assert run.old_log_prob_s == pytest.approx(45.2 * 8 / 6) and run.ref_s == pytest.approx(36.3 * 8 / 6)
    assert run.update_actor_s == pytest.approx(116.3 * 8 / 6)
    assert (run.reward_s, run.adv_s, run.step_s) == (recipe.reward_s, recipe.adv_s, recipe.step_s)
    terms = split.terms(recipe, rollout_work_s=10.0, reward_work_s=410.0)
    assert terms == pytest.approx({"rollout_s": 45.0, "trainer_s": 268.733, "reward_s": 410.0}, abs=1e-3)
    assert split.bound(recipe, 10.0, 410.0) == 410.0
    assert split.bound(recipe, 10.0, 100.0) == pytest.approx(268.733, abs=1e-3)
    assert split.bound(recipe, 80.0, 100.0) == pytest.approx(325.0)  # generation-bound
    assert colocated_stages(recipe, 8) is recipe  # the calibration's own GPUs: unchanged
    assert colocated_stages(recipe, 16).update_actor_s == pytest.approx(116.3 / 2)
    assert split_for(recipe, 10.0, 8, rollout=5, weight_sync_s=2.0) == GpuSplit(8, 5, 2.0)
    for bad in ((8, 0), (8, 8), (1, 1)):
        with pytest.raises(ValueError, match="at least 1 rollout and 1 trainer GPU"):
            GpuSplit(*bad)
    with pytest.raises(ValueError, match="weight sync"):
        GpuSplit(8, 2, weight_sync_s=-1.0)


def test_each_strategy_is_measured_against_its_own_bound():
    strategies = {"both": {"step_s": 300.0}, "v1_separate_async": {"step_s": 300.0, "bound_s": 250.0}}
    add_relative(strategies, 200.0)
    assert (
        strategies["both"]["ratio_to_bound"] == 1.5 and strategies["both"]["ratio_to_colocated_bound"] == 1.5
    )
    separate = strategies["v1_separate_async"]
    assert separate["ratio_to_bound"] == 1.2 and separate["ratio_to_colocated_bound"] == 1.5


def test_busy_time_counts_overlaps_once_within_the_window():
    assert busy_time([(0, 2), (1, 3), (5, 6), (9, 12)], 0.5, 10) == pytest.approx(2.5 + 1 + 1)
    assert busy_time([], 0, 1) == 0


# -- settings -------------------------------------------------------------------------------------------


def test_the_split_flags_reach_the_run_and_the_regime_summary():
    parser = speedup.configure_parser(__import__("argparse").ArgumentParser())
    # the default strategies (the README's table) are all colocated: the split flags name separate ones
    argv = ["--total-gpus", "16", "--rollout-gpus", "5", "--weight-sync-s", "5"]
    argv += ["--strategies", "v1_separate_async"]
    args = parser.parse_args(argv)
    cfg = speedup.config_from_args(args)
    assert (cfg.total_gpus, cfg.rollout_gpus, cfg.weight_sync_s) == (16, 5, 5.0)
    cfg.validate()
    assert "v1_separate_async" in SEPARATE_STRATEGIES and "v1_separate_async" in cfg.strategies
    regime = REGIMES["long_tail"]
    split = split_for(_stages("long_tail"), 15.6, cfg.total_gpus, cfg.rollout_gpus, cfg.weight_sync_s)
    summary = speedup._regime_summary(regime, cfg, colocated_stages(_stages("long_tail"), 16), split)
    assert summary["total_gpus"] == 16 and summary["gpu_work_s"] == pytest.approx((159.2 + 197.8) / 2)
    assert summary["bound_s"] == pytest.approx(
        max((159.2 + 197.8) / 2, summary["reward_work_per_capacity_s"])
    )
    reported = summary["gpu_split"]
    assert (reported["rollout"], reported["trainer"], reported["chosen"]) == (5, 11, "--rollout-gpus")
    work = rollout_work(159.2, regime.gen_sigma, 640, 640)  # the run's batch: 128 x 5, slots one batch
    assert reported["rollout_work_s"] == pytest.approx(work) and work < 0.15 * 159.2
    assert reported["terms_s"]["rollout_s"] == pytest.approx(work * 8 / 5 + 5)
    assert reported["terms_s"]["trainer_s"] == pytest.approx(197.8 * 8 / 11 + 5)
    assert reported["bound_s"] == pytest.approx(max(reported["terms_s"].values()))
    defaults = BenchConfig()
    assert (defaults.total_gpus, defaults.rollout_gpus, defaults.weight_sync_s) == (8, None, 0.0)


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--rollout-gpus", "8"], "rollout GPUs must be between 1 and total GPUs - 1 (7)"),
        (["--rollout-gpus", "0"], "rollout GPUs must be between 1"),
        (["--total-gpus", "1", "--strategies", "v1_separate_async"], "need at least 2 GPUs"),
        (["--total-gpus", "0"], "total GPUs must be >= 1"),
        (["--weight-sync-s", "-1"], "weight sync must be >= 0"),
        (["--weight-sync-s", "5", "--strategies", "both"], "none is selected"),
        (["--rollout-gpus", "3", "--strategies", "v1_sync"], "none is selected"),
    ],
)
def test_bad_split_settings_exit_2_without_running(tmp_path, capsys, argv, error):
    assert speedup.main([*argv, "--out", str(tmp_path)]) == 2
    assert error in capsys.readouterr().err
    assert not (tmp_path / "pipeline_speedup.json").exists()


# -- verl's separate_async on the benchmark's config ---------------------------------------------------------


def _separate_trainer(tokenizer_dir, tokenizer, split: GpuSplit):  # type: ignore[no-untyped-def]
    from async_reward_bench.backend import BatchFactory
    from async_reward_bench.environment import _v1_trainer_config
    from async_reward_bench.tag_store import TagStore
    from async_reward_bench.v1_trainer import V1Harness, build_v1_trainer

    cfg = BenchConfig(prompts=4, group_size=2, mini_batches=2)
    config = _v1_trainer_config(cfg, tokenizer_dir, "http://127.0.0.1:9", "v1_separate_async", split)
    harness = V1Harness(
        stages=_stages(),
        factory=BatchFactory(tokenizer, cfg.prompts, cfg.group_size),
        durations=lambda number, samples: 100.0 * number + np.arange(samples, dtype=float),
        agent_loop=None,
        store=TagStore(),
        reward_loop_manager=None,
        time_scale=1.0,
    )
    return build_v1_trainer(config, harness, "v1_separate_async")


def test_verl_separate_async_runs_on_the_split_it_is_given(tokenizer_dir, tokenizer):
    """verl's constructor accepts the config (its asserts: ``train_batch_size = parameter_sync_step x
    ppo_mini_batch_size``, rollout GPUs > 0, a non-naive sync backend) and runs without hybrid
    replicas, on the split's rollout GPUs."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
    from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode, PPOTrainerSeparateAsync

    from async_reward_bench.environment import _v1_trainer_config

    trainer = _separate_trainer(tokenizer_dir, tokenizer, GpuSplit(8, 3))
    assert isinstance(trainer, PPOTrainerSeparateAsync) and trainer.trainer_mode == "separate_async"
    assert trainer.parameter_sync_step == 2 and not trainer._enable_hybrid_replicas
    assert type(trainer.replay_buffer) is ReplayBufferAsync
    assert trainer.current_mode is HybridEngineMode.TRAINER
    assert not trainer.hybrid_rollout_config.enable_switch
    rollout = trainer.config.actor_rollout_ref.rollout
    assert (rollout.nnodes, rollout.n_gpus_per_node, trainer.config.trainer.n_gpus_per_node) == (1, 3, 5)
    assert trainer.config.trainer.v1.separate_async.num_warmup_batches == 1  # verl's default window
    with pytest.raises(ValueError, match="give its GPU split"):
        _v1_trainer_config(BenchConfig(), tokenizer_dir, "http://127.0.0.1:9", "v1_separate_async")


def test_the_dataloader_hands_out_exact_prompt_counts_in_whole_groups(tokenizer_dir, tokenizer):
    """Async modes fetch any number of prompts (verl forces ``gen_batch_size=1`` there), e.g. to refill
    evicted groups: the benchmark's batches are cut in whole groups, each row keeping its decoding
    time, and the rest handed out next."""
    trainer = _separate_trainer(tokenizer_dir, tokenizer, GpuSplit(8, 2))
    first = trainer._next_train_batch(3)
    uids = [str(u) for u in first.data.non_tensor_batch["uid"]]
    assert len(uids) == 6 and len(set(uids)) == 3 and uids[0] == uids[1]
    assert list(first.durations) == [0, 1, 2, 3, 4, 5]
    assert first["uid"] == list(dict.fromkeys(uids))  # one uid per prompt, as verl's prompt batch
    second = trainer._next_train_batch(3)  # batch 0's last group, then two of batch 1
    assert list(second.durations) == [6, 7, 100, 101, 102, 103]
    assert len(set(second.data.non_tensor_batch["uid"]) & set(uids)) == 0
    whole = trainer._next_train_batch()  # train_batch_size prompts: 4
    assert list(whole.durations) == [104, 105, 106, 107, 200, 201, 202, 203]
    with pytest.raises(ValueError, match="positive multiple"):
        trainer._next_train_batch(0)
