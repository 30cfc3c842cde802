"""``on_failure: exclude``: a failed sample keeps its status, is flagged ``excluded``, and moves the weights
exactly as if it were absent.

From the bottom up, all with verl's real code: the managers' flags; where the policy is refused
(``check_on_failure``) and why (verl's loss aggregation and policy losses, every registered one, on
a mini-batch with zero-mask rows against the same mini-batch without them); advantages from the
scored members (verl's estimators); the schedule; and verl's ``fit`` machinery on the CPU stand-ins
with a reward function that fails a known subset, against a run where those samples are really absent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from async_reward import ConfigError, prepare_verl_config
from async_reward.config.checks import EXCLUDE_LOSS_AGG_MODES, EXCLUDE_POLICY_LOSSES, check_on_failure
from async_reward.config.v1 import AGENT_LOOP_MANAGER, REPLAY_BUFFER_NAME, REPLAY_BUFFER_PATH
from async_reward.training.exclusion import advantage_without_excluded, trainable_rows
from async_reward.training.schedule import StepSchedule
from async_reward.wiring.integration import declare_pipelined_trainer
from tests.conftest import make_batch
from tests.legacy import test_trainer as trainer_tests
from tests.legacy.test_trainer import GROUP, PROMPTS, build_trainer, make_config, train_steps
from tests.managers.test_managers import USER_FUNCTIONS, write_module
from tests.support.trainer_standins import build_standins

# The CPU trainer tests' fixtures, shared rather than copied.
char_tokenizer_dir = trainer_tests.char_tokenizer_dir
char_tokenizer = trainer_tests.char_tokenizer
logged = trainer_tests.logged

# -- the managers' flags -----------------------------------------------------------------------------


async def test_manager_flags_failures_keeps_status_and_is_refused_outside_our_trainer(
    tmp_path, verl_config_factory, tokenizer, batch_factory
):
    from verl.trainer.ppo.reward import load_reward_manager

    path = write_module(tmp_path, USER_FUNCTIONS)
    config = verl_config_factory(
        "async_naive",
        {"on_failure": "exclude", "fallback_score": -1.0},
        custom_reward_function={"path": path, "name": "sync_score"},
    )
    # verl's own trainer would build the manager from this config: refused in the worker too.
    with pytest.raises(ConfigError, match="not honoured by verl's own trainers"):
        load_reward_manager(config, tokenizer)
    manager: Any = load_reward_manager(declare_pipelined_trainer(config), tokenizer)
    manager.driven_by_pipeline = True  # as PipelineRewardWorker marks the manager it drives
    batch = batch_factory(
        [{"response": "boom"}, {"response": "it is 5", "ground_truth": "5"}, {"response": "none"}]
    )
    outputs = [await manager.run_single(batch[i : i + 1]) for i in range(3)]
    infos = [o["reward_extra_info"] for o in outputs]
    assert [i["status"] for i in infos] == ["error", "ok", "invalid"]  # the status says what happened
    assert [i["excluded"] for i in infos] == [True, False, True]
    assert [float(o["reward_score"]) for o in outputs] == [-1.0, 1.0, -1.0]
    assert len({tuple(sorted(i)) for i in infos}) == 1  # same keys on every sample


# -- where exclude is refused ----------------------------------------------------------------------

OURS = {"async_reward": {"pipeline": {}}}
V1_AGENT = {"actor_rollout_ref": {"rollout": {"agent": {"agent_loop_manager_class": AGENT_LOOP_MANAGER}}}}
V1_SAMPLER = {"path": REPLAY_BUFFER_PATH, "name": REPLAY_BUFFER_NAME}
V1_OURS = {"trainer": {"use_v1": True, "v1": {"sampler": {"custom_sampler": V1_SAMPLER}}}, **V1_AGENT}
SEQ_MEAN = {"loss_agg_mode": "seq-mean-token-mean"}
BYPASS_LOSS = {"policy_loss": {"loss_mode": "bypass_mode"}}


@pytest.mark.parametrize(
    ("settings", "refused_key"),
    [
        ({}, "reward.async_reward.on_failure"),  # verl's own trainer
        ({"trainer": {"use_v1": True}}, "reward.async_reward.on_failure"),  # verl's v1 trainer
        (V1_OURS, None),  # verl's v1 trainer with our agent-loop manager and replay buffer
        ({"trainer": {"use_v1": True}, **V1_AGENT}, "reward.async_reward.on_failure"),  # no replay buffer
        ({"trainer": {"use_v1": False}, **V1_AGENT}, "reward.async_reward.on_failure"),  # legacy
        (
            {**V1_OURS, "actor_rollout_ref": {**V1_AGENT["actor_rollout_ref"], "actor": SEQ_MEAN}},
            "actor_rollout_ref.actor.loss_agg_mode",
        ),
        (OURS, None),
        ({**OURS, "actor_rollout_ref": {"actor": {"loss_agg_mode": "token-sum"}}}, None),
        (
            {**OURS, "actor_rollout_ref": {"actor": {"loss_agg_mode": "seq-mean-token-mean"}}},
            "actor_rollout_ref.actor.loss_agg_mode",
        ),
        (
            {**OURS, "actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "geo_mean"}}}},
            "actor_rollout_ref.actor.policy_loss.loss_mode",
        ),
        (
            {**OURS, "critic": {"enable": True, "loss_agg_mode": "seq-mean-token-sum"}},
            "critic.loss_agg_mode",
        ),
        ({**OURS, "critic": {"enable": False, "loss_agg_mode": "seq-mean-token-sum"}}, None),
        (
            {**OURS, "algorithm": {"rollout_correction": {"rollout_is_batch_normalize": True}}},
            "algorithm.rollout_correction.rollout_is_batch_normalize",
        ),
        ({**OURS, "algorithm": {"use_pf_ppo": True}}, "algorithm.use_pf_ppo"),
        # bypass: its loss stops on a micro-batch without a loss token (one excluded sample suffices)
        (
            {**OURS, "actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "bypass_mode"}}}},
            "actor_rollout_ref.actor.policy_loss.loss_mode",
        ),
        (
            {**V1_OURS, "actor_rollout_ref": {**V1_AGENT["actor_rollout_ref"], "actor": BYPASS_LOSS}},
            "actor_rollout_ref.actor.policy_loss.loss_mode",
        ),
        # the legacy trainer switches the loss to bypass_mode at run time; v1 keeps the configured one
        (
            {**OURS, "algorithm": {"rollout_correction": {"bypass_mode": True}}},
            "algorithm.rollout_correction.bypass_mode",
        ),
        ({**V1_OURS, "algorithm": {"rollout_correction": {"bypass_mode": True}}}, None),
        # a critic updating in other sizes than the actor could get an update of excluded rows only
        (
            {**OURS, "critic": {"enable": True, "ppo_mini_batch_size": 3}},
            "critic.ppo_mini_batch_size",
        ),
    ],
)
def test_check_on_failure(verl_config_factory, settings, refused_key):
    config = verl_config_factory("async_naive", {"on_failure": "exclude"})
    with open_dict(config):
        merged = OmegaConf.merge(config, settings)
    if refused_key is None:
        check_on_failure(merged)
        return
    with pytest.raises(ConfigError) as info:
        check_on_failure(merged)
    assert info.value.key == refused_key
    assert "exclude" in str(info.value)


def test_other_policies_and_offline_scoring_are_never_refused(verl_config_factory):
    check_on_failure(verl_config_factory("async_naive", {"on_failure": "fallback"}))
    offline = OmegaConf.create({"reward": {"async_reward": {"on_failure": "exclude"}}})
    check_on_failure(offline)  # no trainer: rows just report `excluded`


def test_users_launcher_is_refused_and_our_entry_point_is_not(verl_config_factory, tokenizer_dir):
    from async_reward.legacy.main_ppo import prepare_config
    from tests.conftest import compose_verl_config

    with pytest.raises(ConfigError, match=r"python -m async_reward\.legacy\.main_ppo"):
        prepare_verl_config(verl_config_factory("async_naive", {"on_failure": "exclude"}))
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


# -- why: verl's loss on a mini-batch with zero-mask rows vs the same mini-batch without them ------------


def _policy_loss(
    name: str,
    agg: str,
    rows: torch.Tensor,
    data: dict[str, torch.Tensor],
    mini_batch: torch.Tensor | None = None,
) -> tuple[Any, Any]:
    """verl's registered policy loss ``name`` with the global normalisers verl 0.9's actor passes
    (``losses.ppo_loss``: dp_size, valid tokens, sequences of the mini-batch), on the micro-batch
    ``rows`` of the mini-batch ``mini_batch`` (default: ``rows`` themselves)."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=agg,
        use_torch_compile=False,
        policy_loss=PolicyLossConfig(loss_mode=name, dro_beta=0.1, clip_cov_ratio=0.2, kl_cov_ratio=0.2),
    )
    mask = data["mask"][rows]
    whole = rows if mini_batch is None else mini_batch
    config.global_batch_info.update(
        dp_size=1,
        batch_num_tokens=int(data["mask"][whole].sum()),
        global_batch_size=len(whole),
        loss_scale_factor=None,
    )
    log_prob = data["log_prob"][rows].clone().requires_grad_(True)
    loss, _ = get_policy_loss_fn(name)(
        old_log_prob=data["old"][rows],
        log_prob=log_prob,
        advantages=data["advantages"][rows],
        response_mask=mask,
        loss_agg_mode=agg,
        config=config,
        rollout_is_weights=None,
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    return loss.detach(), grad


LOSS_AGG_MODES = [
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]


def _registered_policy_losses() -> list[str]:
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    return sorted(POLICY_LOSS_REGISTRY)


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
def test_allowed_losses_are_exactly_those_that_ignore_excluded_rows(agg):
    """For every policy loss verl registers: a mini-batch whose excluded rows have a zero mask gives the
    loss and gradient of the mini-batch without them, and a micro-batch made of excluded rows only (one
    excluded sample with ppo_micro_batch_size_per_gpu=1) a finite zero loss and gradient, exactly when
    check_on_failure allows it."""
    generator = torch.Generator().manual_seed(0)
    rows, width = 8, 6
    old = -1 - 0.1 * torch.rand(rows, width, generator=generator)
    data = {
        "old": old,
        "log_prob": old + 0.05 * torch.randn(rows, width, generator=generator),
        "advantages": torch.randn(rows, 1, generator=generator).expand(rows, width).clone(),
        "mask": (torch.arange(width) < torch.tensor([6, 4, 5, 6, 3, 6, 2, 5])[:, None]).float(),
    }
    excluded = torch.tensor([False, False, True, False, False, True, False, False])
    masked = dict(
        data, mask=data["mask"] * ~excluded[:, None], advantages=data["advantages"] * ~excluded[:, None]
    )
    everything, kept = torch.arange(rows), torch.arange(rows)[~excluded]
    for name in _registered_policy_losses():
        loss_masked, grad_masked = _policy_loss(name, agg, everything, masked)
        loss_absent, grad_absent = _policy_loss(name, agg, kept, data)
        exact = (
            torch.allclose(loss_masked, loss_absent, rtol=1e-6, atol=1e-7)
            and torch.allclose(grad_masked[~excluded], grad_absent, rtol=1e-6, atol=1e-7)
            and not grad_masked[excluded].any()
            and _tolerates_an_empty_micro_batch(name, agg, everything[excluded], masked, everything)
        )
        allowed = agg in EXCLUDE_LOSS_AGG_MODES and name in EXCLUDE_POLICY_LOSSES
        assert exact == allowed, (name, agg, float(loss_masked), float(loss_absent))


def _tolerates_an_empty_micro_batch(
    name: str, agg: str, rows: torch.Tensor, data: dict[str, torch.Tensor], mini_batch: torch.Tensor
) -> bool:
    """Whether the loss on a micro-batch of zero-mask rows (inside a mini-batch that has loss tokens)
    is exactly zero, with an exactly zero gradient, rather than an error or NaN."""
    try:
        loss, grad = _policy_loss(name, agg, rows, data, mini_batch)
    except (ValueError, AssertionError):  # bypass_mode: "response_mask must contain at least one valid token"
        return False
    return bool(loss == 0 and torch.isfinite(grad).all() and not grad.any())


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
def test_critic_value_loss_ignores_excluded_rows_under_the_allowed_modes(agg):
    from verl.trainer.ppo.core_algos import compute_value_loss

    generator = torch.Generator().manual_seed(1)
    rows, width = 6, 5
    values, returns = (
        torch.randn(rows, width, generator=generator),
        torch.randn(rows, width, generator=generator),
    )
    vpreds = values + 0.1 * torch.randn(rows, width, generator=generator)
    mask = (torch.arange(width) < torch.tensor([5, 3, 4, 5, 2, 4])[:, None]).float()
    excluded = torch.tensor([False, True, False, False, True, False])

    def loss(keep: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
        m = loss_mask[keep]
        value, _ = compute_value_loss(
            vpreds=vpreds[keep],
            returns=returns[keep],
            values=values[keep],
            response_mask=m,
            cliprange_value=0.5,
            loss_agg_mode=agg,
            batch_num_tokens=int(m.sum()),
            global_batch_size=len(m),
        )
        return value

    masked = loss(torch.ones(rows, dtype=torch.bool), mask * ~excluded[:, None])
    exact = torch.allclose(masked, loss(~excluded, mask), rtol=1e-6, atol=1e-7)
    assert exact == (agg in EXCLUDE_LOSS_AGG_MODES)


# -- advantages from the scored members only ---------------------------------------------------------


def test_trainable_rows():
    keys = np.array(["a"] * 4 + ["b"] * 4 + ["c"] * 2 + ["d"], dtype=object)
    excluded = np.zeros(11, dtype=bool)
    excluded[[1, 4, 5, 6, 8]] = True
    keep = trainable_rows(excluded, keys)
    # a: 3 scored stay; b: 1 scored left, trains on nothing; c: 1 left; d: a lone member that lost none.
    assert keep.tolist() == [True, False, True, True] + [False] * 4 + [False, False, True]
    assert trainable_rows(excluded).tolist() == (~excluded).tolist()  # no groups: only the flags
    assert trainable_rows(np.zeros(3, dtype=bool), np.array(["x"] * 3, dtype=object)).all()


def _scored_batch(batch_factory: Any, estimator: str) -> Any:
    rows = [{"response": f"answer {i}", "uid": f"g{i // 4}"} for i in range(12)]
    batch = batch_factory(rows, prompt_length=8, response_length=6)
    generator = torch.Generator().manual_seed(2)
    width = batch.batch["responses"].shape[1]
    scores = torch.rand(len(batch), generator=generator)
    rewards = torch.zeros(len(batch), width)
    response_mask = batch.batch["attention_mask"][:, -width:].clone()
    rewards[torch.arange(len(batch)), response_mask.sum(1) - 1] = scores
    batch.batch["token_level_rewards"] = rewards
    batch.batch["rm_scores"] = rewards.clone()
    batch.batch["response_mask"] = response_mask
    batch.batch["values"] = torch.randn(len(batch), width, generator=generator)
    # g0 loses one member, g1 three (one scored member left), g2 none.
    batch.non_tensor_batch["excluded"] = np.array([i in (1, 4, 5, 7) for i in range(12)])
    return batch


ESTIMATORS = [
    "grpo",
    "grpo_vectorized",
    "rloo",
    "rloo_vectorized",
    "grpo_passk",
    "opo",
    "gae",
    "reinforce_plus_plus",
]


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_advantages_come_from_the_scored_members(batch_factory, estimator):
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from tests.conftest import compose_verl_config

    algorithm = compose_verl_config([f"algorithm.adv_estimator={estimator}"]).algorithm

    def verl_advantage(data: Any) -> Any:
        return compute_advantage(data, adv_estimator=estimator, num_repeat=4, config=algorithm)

    outcome = advantage_without_excluded(_scored_batch(batch_factory, estimator), verl_advantage)
    keep = np.array([i not in (1, 4, 5, 6, 7) for i in range(12)])  # g1's lone scored member too
    assert (outcome.excluded, outcome.untrained, outcome.keep.tolist()) == (4, 5, keep.tolist())
    # The reference: verl on a batch where those samples are really absent.
    absent = verl_advantage(_scored_batch(batch_factory, estimator)[np.flatnonzero(keep)])
    trained = outcome.batch
    assert torch.equal(trained.batch["advantages"][keep], absent.batch["advantages"])
    assert torch.equal(trained.batch["returns"][keep], absent.batch["returns"])
    assert not trained.batch["advantages"][~keep].any()
    assert not trained.batch["response_mask"][~keep].any()  # zero loss mask: no gradient
    assert trained.batch["response_mask"][keep].sum(1).min() > 0
    assert list(trained.non_tensor_batch["uid"]) == [f"g{i // 4}" for i in range(12)]  # groups untouched


def test_nothing_excluded_is_the_backend_call_unchanged(batch_factory):
    batch = _scored_batch(batch_factory, "grpo")
    batch.non_tensor_batch["excluded"] = np.zeros(12, dtype=bool)
    seen = []
    outcome = advantage_without_excluded(batch, lambda data: seen.append(data) or data)
    assert seen == [batch] and outcome.batch is batch and outcome.trainable and outcome.untrained == 0


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
