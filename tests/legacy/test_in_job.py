"""The legacy pipelined manager and trainer on the judge verl serves inside the job: both score every
sample through verl's router (the served judge, its replicas and router: tests/judge/in_job/test_in_job.py,
whose module fixtures tests/legacy/conftest.py makes this folder's).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from async_reward import ConfigError
from tests.conftest import compose_verl_config, make_batch
from tests.judge.in_job.test_in_job import (
    EXPECTED,
    ROWS,
    judge_config,
    judge_lines,
    served_name,
)
from tests.support.judge_replica_standins import replica_stats, reset_replicas


@pytest.mark.ray
def test_the_legacy_pipelined_manager_scores_through_the_router(served_judge, model_dir, judge_dir):
    from transformers import AutoTokenizer

    from async_reward.legacy import PipelinedRewardLoopManager

    served_judge.wake_up()
    reset_replicas(served_judge)
    config = judge_config(model_dir, judge_dir)
    with pytest.raises(ConfigError, match="reward_router_address"):
        PipelinedRewardLoopManager(config)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    with PipelinedRewardLoopManager(
        config, reward_router_address=served_judge.get_router_address()
    ) as manager:
        ticket = manager.submit(make_batch(tokenizer, ROWS, group_size=2))
        chunk = manager.get_chunk(ticket, len(ROWS), timeout=120)
    assert chunk.rm_scores.sum(dim=1).tolist() == [EXPECTED[i] for i in chunk.indices]
    assert list(chunk.reward_extra_info["status"]) == ["ok"] * len(ROWS)
    assert sum(s["models"].get(served_name(judge_dir), 0) for s in replica_stats(served_judge)) == len(ROWS)


# Last: our trainer's init_workers kills verl's reward worker (the module's warm one; a test after it
# would start a new process), as it does in a job.
@pytest.mark.ray
@pytest.mark.timeout(600)
def test_the_legacy_pipelined_trainer_scores_through_the_served_judges_router(
    served_judge, judge_dir, tmp_path, monkeypatch
):
    """Our legacy pipelined trainer, ``init_workers`` then ``fit`` (one step), with a judge on GPUs of
    its own: verl's ``RewardLoopManager`` (built where verl's ``init_workers`` builds it, the GPU
    worker groups stand-ins) starts the judge's router and wakes it; our ``init_workers`` hands the
    router's address to the pipelined reward workers, which score every sample through it."""
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager
    from verl.trainer.ppo import ray_trainer
    from verl.utils.tracking import Tracking

    from async_reward.legacy.trainer import PipelinedRayPPOTrainer
    from async_reward_bench.toy.task import build_char_tokenizer
    from tests.legacy.test_trainer import GROUP, PROMPTS, build_trainer
    from tests.support.trainer_standins import build_standins
    from tests.support.warm_actors import _kill

    served_judge.sleep()
    reset_replicas(served_judge)
    tokenizer_dir = tmp_path / "chars"
    tokenizer = build_char_tokenizer(tokenizer_dir)
    dumps = tmp_path / "rollouts"
    config = compose_verl_config(
        [
            f"actor_rollout_ref.model.path={tokenizer_dir}",
            f"data.train_batch_size={PROMPTS}",
            "data.max_prompt_length=4",
            "data.max_response_length=3",
            "data.dataloader_num_workers=0",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
            f"actor_rollout_ref.rollout.n={GROUP}",
            "actor_rollout_ref.rollout.prompt_length=4",
            "actor_rollout_ref.rollout.response_length=3",
            "algorithm.adv_estimator=grpo",
            "critic.enable=false",
            "reward.num_workers=1",
            *judge_lines(judge_dir, standalone=True),
            "trainer.total_training_steps=1",
            "trainer.save_freq=-1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "trainer.logger=[]",
            "trainer.resume_mode=disable",
            f"trainer.rollout_data_dir={dumps}",
        ]
    )
    standins = build_standins(config, tokenizer)
    verl_workers: list[Any] = []

    def init_workers(self: Any) -> None:
        """verl's ``init_workers`` on CPU: the worker groups are stand-ins; its ``RewardLoopManager``
        is verl's own (the module's replicas, the hook's wake-up)."""
        standins.attach(self)
        self.reward_loop_manager = RewardLoopManager(config=self.config)
        verl_workers.extend(self.reward_loop_manager.reward_loop_workers)

    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "init_workers", init_workers)
    logged: list[dict[str, Any]] = []
    monkeypatch.setattr(Tracking, "log", lambda self, data, step, **kw: logged.append(dict(data)))
    trainer = build_trainer(PipelinedRayPPOTrainer, config, tokenizer, standins)
    try:
        trainer.init_workers()
        trainer.fit()
    finally:
        for handle in verl_workers:  # our init_workers killed them: wait until their names are free
            _kill(handle, "reward_loop_worker_0")
    samples = PROMPTS * GROUP
    (metrics,) = [m for m in logged if "training/global_step" in m]
    assert metrics["reward/status_ok"] == float(samples), metrics
    rows = [json.loads(line) for line in (dumps / "1.jsonl").read_text().splitlines()]
    assert len(rows) == samples and {row["status"] for row in rows} == {"ok"}
    asked = sum(not row["judge_shared"] for row in rows)  # identical requests share one call
    stats = replica_stats(served_judge)
    assert [s["requests_while_asleep"] for s in stats] == [0, 0]
    assert all(set(s["models"]) <= {served_name(judge_dir)} for s in stats), stats
    assert sum(s["models"].get(served_name(judge_dir), 0) for s in stats) == asked > 0
