"""``on_failure: exclude``: a failed sample keeps its status, is flagged ``excluded``, and moves the weights
exactly as if it were absent.

From the bottom up, all with verl's real code: the managers' flags; where the policy is refused
(``check_on_failure``) and why (verl's loss aggregation and policy losses, every registered one, on
a mini-batch with zero-mask rows against the same mini-batch without them); advantages from the
scored members (verl's estimators). The schedule and verl's ``fit`` machinery on the CPU stand-ins,
with a reward function that fails a known subset against a run where those samples are really absent,
run on the legacy pipelined trainer: tests/legacy/test_exclusion.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf, open_dict

from async_reward import ConfigError, prepare_verl_config
from async_reward.config.checks import EXCLUDE_LOSS_AGG_MODES, EXCLUDE_POLICY_LOSSES, check_on_failure
from async_reward.config.v1 import AGENT_LOOP_MANAGER, REPLAY_BUFFER_NAME, REPLAY_BUFFER_PATH
from async_reward.training.exclusion import advantage_without_excluded, trainable_rows
from async_reward.wiring.integration import declare_pipelined_trainer
from tests.managers.test_managers import USER_FUNCTIONS, write_module

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


def test_users_launcher_is_refused(verl_config_factory):
    """``prepare_verl_config`` (a user's own launcher, verl's trainer): refused, naming the entry point
    that honours it (which accepts it: tests/legacy/test_exclusion.py)."""
    with pytest.raises(ConfigError, match=r"python -m async_reward\.legacy\.main_ppo"):
        prepare_verl_config(verl_config_factory("async_naive", {"on_failure": "exclude"}))


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
