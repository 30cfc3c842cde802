"""``on_failure: exclude`` on the legacy pipelined trainer: its entry point accepts it, and verl's ``fit``
machinery on the CPU stand-ins, with a reward function that fails a known subset, moves the weights
exactly as a run where those samples are really absent (the policy's checks, verl's losses and the
advantages: tests/training/test_exclusion.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import DictConfig, open_dict

from async_reward import ConfigError
from async_reward.training.schedule import StepSchedule
from async_reward.wiring.integration import declare_pipelined_trainer
from tests.conftest import make_batch
from tests.legacy import test_trainer as trainer_tests
from tests.legacy.test_trainer import GROUP, PROMPTS, build_trainer, make_config, train_steps
from tests.managers.test_managers import write_module
from tests.support.trainer_standins import build_standins

# The CPU trainer tests' fixtures, shared rather than copied.
char_tokenizer_dir = trainer_tests.char_tokenizer_dir
char_tokenizer = trainer_tests.char_tokenizer
logged = trainer_tests.logged


def test_our_entry_point_accepts_exclude_and_runs_the_same_checks(tokenizer_dir):
    """``python -m async_reward.legacy.main_ppo``'s ``prepare_config`` honours ``exclude`` (a user's own
    launcher is refused it: tests/training/test_exclusion.py), and still refuses a loss that cannot."""
    from async_reward.legacy.main_ppo import prepare_config
    from tests.conftest import compose_verl_config

    config = compose_verl_config(
        [
            f"actor_rollout_ref.model.path={tokenizer_dir}",
            "reward.reward_manager.name=async_naive",
            "+reward.async_reward.on_failure=exclude",
            "algorithm.adv_estimator=grpo",
            "critic.enable=false",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
            "trainer.n_gpus_per_node=1",
        ]
    )
    prepare_config(config)  # marks the config for our trainer, then runs the same checks
    with open_dict(config):
        config.actor_rollout_ref.actor.loss_agg_mode = "seq-mean-token-sum-norm"
    with pytest.raises(ConfigError, match="loss_agg_mode"):
        prepare_config(config)


# -- the trainer: verl's fit machinery on CPU stand-ins, against a run where the samples are absent ------

#: The "judge" fails every response whose first character is an odd digit: a known subset, of about
#: 40 % of the untrained policy's samples. Other responses get a deterministic score in [0, 1].
FAILING_SUBSET = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str[:1] in "13579":
        raise RuntimeError("judge unavailable for this sample")
    return (sum(map(ord, solution_str)) % 7) / 6
"""


def exclude_config(tokenizer_dir: Path, function_path: str, tmp_path: Path, *overrides: str) -> DictConfig:
    """The CPU trainer tests' config, scored by ``async_naive`` with the failing function."""
    config = make_config(
        tokenizer_dir, "http://127.0.0.1:1", tmp_path, "trainer.balance_batch=false", *overrides
    )
    with open_dict(config):
        config.reward.reward_manager.name = "async_naive"
        config.reward.num_workers = 1
        config.reward.custom_reward_function.path = function_path
        config.reward.custom_reward_function.name = "compute_score"
        config.reward.async_reward = {"on_failure": "exclude", "fallback_score": 0.5}
    return declare_pipelined_trainer(config)


@pytest.fixture(scope="module")
def failing_rewards(ray_cluster: None, char_tokenizer_dir: Path, tmp_path_factory: Any) -> Iterator[Any]:
    """One pipelined manager (one Ray worker) for the module, scoring with the failing function."""
    from async_reward.legacy import PipelinedRewardLoopManager

    directory = tmp_path_factory.mktemp("exclude")
    path = write_module(directory, FAILING_SUBSET, "failing_judge.py")
    manager = PipelinedRewardLoopManager(exclude_config(char_tokenizer_dir, path, directory))
    manager.function_path = path  # type: ignore[attr-defined]
    yield manager
    manager.close()


class FlagsCleared:
    """The same rewards with every ``excluded`` flag cleared: the trainer sees failed samples only
    through their status, as under ``on_failure: fallback``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def submit(self, batch: Any, group_key: str = "uid") -> Any:
        return self.inner.submit(batch, group_key)

    def get_chunk(self, ticket: Any, n_samples: int, timeout: float | None = None) -> Any:
        chunk = self.inner.get_chunk(ticket, n_samples, timeout)
        chunk.reward_extra_info["excluded"] = np.zeros(len(chunk), dtype=bool)
        return chunk

    def ticket_metrics(self, ticket: Any) -> dict[str, float]:
        return self.inner.ticket_metrics(ticket)

    def cancel(self, ticket: Any) -> None:
        self.inner.cancel(ticket)


def install_absent_reference(monkeypatch: pytest.MonkeyPatch, dropped: list[str]) -> None:
    """Make the failed samples really absent, written independently of async_reward's exclusion:
    rows whose status is not ``ok`` (and the members of groups left with fewer than two) are cut out
    of the batch before verl's advantage, so the estimator never sees them, and the update gets the
    mini-batch without them (the actor takes it as one mini-batch, as it is in these runs)."""
    import tests.support.trainer_standins as standins
    from async_reward.legacy.trainer import VerlScheduleBackend

    compute_advantage, update = VerlScheduleBackend.compute_advantage, VerlScheduleBackend.update

    def absent_advantage(self: Any, batch: Any) -> Any:
        ok = np.asarray(batch.non_tensor_batch["status"]) == "ok"
        uids = np.asarray(batch.non_tensor_batch["uid"], dtype=object)
        keep = np.array([ok[i] and (ok & (uids == uids[i])).sum() >= 2 for i in range(len(batch))])
        dropped.extend(str(s) for s in batch.non_tensor_batch["sample_id"][~keep])
        return compute_advantage(self, batch[np.flatnonzero(keep)])  # no rows: an empty mini-batch

    def absent_update(self: Any, batch: Any, step: int) -> dict[str, float]:
        return update(self, batch, step) if len(batch) else {}

    def one_mini_batch(td: Any) -> Any:
        for key in ("mini_batch_size", "epochs", "seed", "dataloader_kwargs"):
            standins.tu.pop(td, key=key, default=None)
        return iter([td])

    monkeypatch.setattr(VerlScheduleBackend, "compute_advantage", absent_advantage)
    monkeypatch.setattr(VerlScheduleBackend, "update", absent_update)
    monkeypatch.setattr(standins, "_mini_batches", one_mini_batch)


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(["+async_reward.pipeline.mini_batch=true"], id="mini_batch"),
        pytest.param([f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}"], id="baseline"),
    ],
)
def test_weights_move_exactly_as_if_the_failed_samples_were_absent(
    failing_rewards,
    char_tokenizer,
    char_tokenizer_dir,
    tmp_path,
    logged,
    monkeypatch,
    mode,
):
    from async_reward.legacy.trainer import PipelinedRayPPOTrainer

    def run(rewards: Any) -> Any:
        config = exclude_config(char_tokenizer_dir, failing_rewards.function_path, tmp_path, *mode)
        standins = build_standins(config, char_tokenizer)
        build_trainer(PipelinedRayPPOTrainer, config, char_tokenizer, standins, reward_source=rewards).fit()
        return standins

    excluded_run = run(failing_rewards)
    steps = train_steps(logged)
    logged.clear()
    fallback_run = run(FlagsCleared(failing_rewards))  # failed samples trained on fallback_score
    logged.clear()
    dropped: list[str] = []
    with monkeypatch.context() as patch:
        install_absent_reference(patch, dropped)
        absent_run = run(FlagsCleared(failing_rewards))

    # The subset was real: failed samples, each flagged, counted, kept out of the gradient.
    excluded = sum(m["reward/excluded"] for m in steps)
    failed = sum(m["reward/status_error"] for m in steps)
    assert 0 < excluded == failed < len(steps) * PROMPTS * GROUP
    assert sum(m["reward/untrained"] for m in steps) == len(dropped) >= excluded
    # Same rollouts, same optimizer steps, on the same samples once the absent ones are taken out.
    generated = [[c.prompt_indices for c in run.rollout.calls] for run in (excluded_run, absent_run)]
    assert generated[0] == generated[1]
    mine, reference = excluded_run.actor.updates, absent_run.actor.updates
    assert len(mine) == len(reference) > 0
    for update, ref in zip(mine, reference, strict=True):
        assert sorted(s for s in update.sample_ids if s not in dropped) == sorted(ref.sample_ids)
    # ...and the same weights, as if those samples had never been there; training on their fallback
    # score instead moves the weights elsewhere.
    ours = torch.cat([p.detach().flatten() for p in excluded_run.actor.policy.parameters()])
    absent = torch.cat([p.detach().flatten() for p in absent_run.actor.policy.parameters()])
    fallback = torch.cat([p.detach().flatten() for p in fallback_run.actor.policy.parameters()])
    initial = torch.cat(
        [
            p.detach().flatten()
            for p in build_standins(
                exclude_config(char_tokenizer_dir, failing_rewards.function_path, tmp_path, *mode),
                char_tokenizer,
            ).actor.policy.parameters()
        ]
    )
    moved = float((ours - initial).abs().max())
    # Equal up to float32 rounding: the same sums over a mini-batch of 8 rows or of 5 run in another
    # order, and Adam magnifies that on parameters whose gradient is nearly zero (measured: at most
    # 4e-6, mean 3e-8, on weights that moved 0.15-0.25). Training on the fallback score differs by
    # 0.3-0.5.
    difference = float((ours - absent).abs().max())
    assert moved > 1e-2
    assert difference < 2e-5 and float((ours - absent).abs().mean()) < 1e-6, difference
    assert float((fallback - absent).abs().max()) > 1000 * max(difference, 1e-7)


class FixedRollouts:
    """A schedule backend over fixed responses (char tokenizer), so the failing judge fails known
    samples: verl's GRPO advantages, and a record of every update."""

    def __init__(self, tokenizer: Any, groups: list[list[str]]) -> None:
        self.tokenizer, self.groups = tokenizer, groups
        self.updates: list[Any] = []

    def rollout(self, step: int) -> Any:
        rows = [
            {"prompt": "1+1=", "response": text, "ground_truth": "2", "uid": f"{step}-{g}"}
            for g, texts in enumerate(self.groups)
            for text in texts
        ]
        return make_batch(self.tokenizer, rows, prompt_length=4, response_length=3)

    def prepare(self, batch: Any) -> Any:
        return batch

    def compute_advantage(self, batch: Any) -> Any:
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        width = batch.batch["responses"].shape[1]
        mask = batch.batch["response_mask"] if "response_mask" in batch.batch.keys() else None  # noqa: SIM118
        mask = batch.batch["attention_mask"][:, -width:] if mask is None else mask
        advantages, _ = compute_grpo_outcome_advantage(
            batch.batch["rm_scores"], mask, batch.non_tensor_batch["uid"]
        )
        batch.batch["advantages"] = advantages
        return batch

    def update(self, batch: Any, step: int) -> dict[str, float]:
        self.updates.append(batch)
        return {"actor/samples": float(len(batch))}


@pytest.mark.parametrize("mode", ["baseline", "mini_batch"])
def test_schedule_skips_an_update_with_nothing_left_to_train(failing_rewards, char_tokenizer, mode):
    # Group 0 keeps one scored member of four (trains on nothing); group 1 loses one of four.
    backend = FixedRollouts(char_tokenizer, [["1", "3", "5", "2"], ["2", "4", "7", "6"]])
    schedule = StepSchedule(backend, failing_rewards, mode, mini_batches=2, keep_batches=True)
    [record] = schedule.run(1)
    assert record.metrics["reward/excluded"] == 4 and record.metrics["reward/untrained"] == 5
    assert record.metrics["pipeline/num_updates"] == 1 and record.chunk_sizes == [4]
    [updated] = backend.updates
    assert list(updated.non_tensor_batch["status"]) == ["ok", "ok", "error", "ok"]  # status kept
    assert list(updated.non_tensor_batch["excluded"]) == [False, False, True, False]
    assert updated.batch["response_mask"].sum(1).tolist() == [1, 1, 0, 1]
    assert updated.batch["advantages"][2].abs().sum() == 0
    scores = updated.batch["rm_scores"].sum(1)[[0, 1, 3]]
    expected = (scores - scores.mean()) / (scores.std() + 1e-6)  # GRPO over the three scored members
    assert torch.allclose(updated.batch["advantages"].sum(1)[[0, 1, 3]], expected, atol=1e-5)
    assert record.batch is not None and len(record.batch) == 8  # the record still holds every sample


PROMPT_FAILING = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if extra_info["index"] % 2:
        raise RuntimeError("judge unavailable for this prompt")
    return (sum(map(ord, solution_str)) % 7) / 6
"""


@pytest.mark.parametrize("mode", [[], ["+async_reward.pipeline.one_step_off_policy=true"]])
def test_no_optimizer_step_of_the_actor_is_made_of_excluded_samples_only(
    ray_cluster, char_tokenizer, char_tokenizer_dir, tmp_path, logged, mode
):
    """The pipelined trainer's baseline and one-step-off modes hand verl's actor the whole batch,
    which verl splits into ``ppo_mini_batch_size x n`` optimizer updates (here 1 prompt x 4 samples).
    The reward fails every sample of odd-indexed prompts, so such an update would hold excluded
    samples only: no loss token, yet AdamW (momentum, weight decay) would still move the weights.
    The actor gets only the rows that leave none of its updates without a loss token."""
    from async_reward.legacy import PipelinedRewardLoopManager
    from async_reward.legacy.trainer import PipelinedRayPPOTrainer

    path = write_module(tmp_path, PROMPT_FAILING, "prompt_failing.py")
    config = exclude_config(
        char_tokenizer_dir, path, tmp_path, "actor_rollout_ref.actor.ppo_mini_batch_size=1", *mode
    )
    rewards = PipelinedRewardLoopManager(config)
    try:
        standins = build_standins(config, char_tokenizer, adamw_weight_decay=0.1)
        build_trainer(PipelinedRayPPOTrainer, config, char_tokenizer, standins, reward_source=rewards).fit()
    finally:
        rewards.close()
    steps = train_steps(logged)
    assert sum(m["reward/excluded"] for m in steps) >= GROUP  # some prompt failed whole
    updates = standins.actor.updates
    assert updates and all(update.weight_change > 0 for update in updates)  # AdamW steps move weights...
    assert [update.loss_tokens > 0 for update in updates] == [True] * len(updates)  # ...only on tokens
