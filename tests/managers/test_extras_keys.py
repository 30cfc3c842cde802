"""Extras keys in verl's own path: ``RewardLoopManager.compute_rm_score`` stacks ``reward_extra_info`` by
the first sample's keys, so a sample without a key another has used to be a bare ``KeyError``.

Real parts: verl's ``RewardLoopManager`` with two Ray ``RewardLoopWorker`` processes, a user manager
loaded by importlib (no ``extra_defaults`` declared) whose first samples fail in both workers.
"""

from __future__ import annotations

import logging
import math
import pickle
from typing import Any

import numpy as np
import pytest
from omegaconf import open_dict

from async_reward._core.result import RewardResult, ScoredFloat, Status, fill_missing_extras
from tests.managers.test_managers import write_module

USER_MANAGER = '''
import asyncio

from async_reward import AsyncRewardManager, RewardResult


class PickyManager(AsyncRewardManager):
    """Fails on "fail" responses; successes report extras the manager only learns from them."""

    async def score(self, sample):
        if "fail" in sample.response:
            raise RuntimeError("scorer unavailable")
        await asyncio.sleep(0.2)  # the failures finish first in every worker
        extras = {"chars": len(sample.response), "verdict_note": "fine"}
        if "late" in sample.response:
            extras["late_key"] = 1.5  # a key no earlier result had
        return RewardResult(score=len(sample.response) / 100, extras=extras)
'''


def test_first_failed_samples_do_not_break_verl_compute_rm_score(
    tmp_path, verl_config_factory, reward_loop, batch_factory
):
    path = write_module(tmp_path, USER_MANAGER, "picky.py")
    config = verl_config_factory("PickyManager", {}, num_workers=2)
    with open_dict(config):
        config.reward.reward_manager.source = "importlib"
        config.reward.reward_manager.module.path = path
    # verl splits the batch in two halves, one per worker. The first sample succeeds (its keys are the
    # ones verl stacks by); in the second worker the failures finish before any success there.
    rows = [
        {"response": "good answer"},
        {"response": "late answer"},
        {"response": "ok"},
        {"response": "fail two"},
        {"response": "another fine one"},
        {"response": "fail three"},
    ]
    batch = batch_factory(rows)
    output = reward_loop(config).compute_rm_score(batch)

    extras = output.non_tensor_batch
    keys = output.meta_info["reward_extra_keys"]
    assert {"status", "chars", "verdict_note", "late_key", "excluded"} <= set(keys)
    assert all(len(extras[key]) == len(rows) for key in keys)
    assert list(extras["status"]) == ["ok", "ok", "ok", "error", "ok", "error"]
    chars = extras["chars"].astype(float)
    assert chars[[0, 1, 2, 4]].tolist() == [11, 11, 2, 16]
    assert np.isnan(chars[[3, 5]]).all()  # failed: the neutral value, not a KeyError
    assert list(extras["verdict_note"]) == ["fine", "fine", "fine", "", "fine", ""]
    late = extras["late_key"].astype(float)
    assert late[1] == 1.5 and np.isnan(np.delete(late, 1)).all()  # first seen on sample 1, filled for all
    assert not extras["excluded"].any()
    scores = output.batch["rm_scores"].sum(dim=1).tolist()
    assert scores[3] == scores[5] == 0.0 and scores[0] == pytest.approx(0.11)


def test_scored_float_keeps_its_extras_dict_shared_through_pickle():
    """What makes the driver-side fill work: Ray pickles a worker's outputs together, and the score
    and ``reward_extra_info`` stay one dict on the other side."""
    outputs = [
        RewardResult(score=1.0, extras={"a": 1}).to_verl(0.0),
        RewardResult.failure(Status.ERROR, "x").to_verl(0.0),
    ]
    back = pickle.loads(pickle.dumps(outputs))
    for output in back:
        assert isinstance(output["reward_score"], ScoredFloat)
        assert output["reward_score"].extras is output["reward_extra_info"]
    fill_missing_extras([o["reward_score"].extras for o in back])
    assert math.isnan(back[1]["reward_extra_info"]["a"])
    assert back[1]["reward_score"].failed and not back[0]["reward_score"].failed


async def test_a_key_learnt_late_is_reported_once(
    tmp_path, verl_config_factory, tokenizer, batch_factory, caplog
):
    """In verl's agent-loop scoring path nothing on the driver can fill keys, so the manager says
    which key to declare in ``extra_defaults``."""
    from verl.trainer.ppo.reward import load_reward_manager

    path = write_module(tmp_path, USER_MANAGER, "picky_local.py")
    config = verl_config_factory("PickyManager", {})
    with open_dict(config):
        config.reward.reward_manager.source = "importlib"
        config.reward.reward_manager.module.path = path
    manager: Any = load_reward_manager(config, tokenizer)
    batch = batch_factory([{"response": "fail"}, {"response": "good"}, {"response": "good too"}])
    with caplog.at_level(logging.WARNING, logger="async_reward.managers.base"):
        first = await manager.run_single(batch[0:1])
        await manager.run_single(batch[1:2])
        await manager.run_single(batch[2:3])
    assert "chars" not in first["reward_extra_info"]  # nothing declared, nothing learnt yet
    warnings = [r.getMessage() for r in caplog.records if "extra_defaults" in r.getMessage()]
    assert len(warnings) == 2 and any("'chars'" in w for w in warnings)  # chars and verdict_note, once


def test_extras_wrapped_in_numpy_scalars_are_cut_and_shown_like_any_other():
    """A numpy string (or a 0-d object array) built from the response must not carry 100k characters
    or a dict into the batch through ``.item()``: it is cut or shown by its repr, as plain values are."""
    from async_reward._core.result import EXTRA_STRING_MAX_CHARS, normalize_user_result

    long = "A" * 100_000
    extras = {"pred": np.str_(long), "obj": np.array({"nested": [1, 2]}, dtype=object), "n": np.float32(0.5)}
    info = normalize_user_result({"score": 1.0, **extras}).to_verl(0.0)["reward_extra_info"]
    assert isinstance(info["pred"], str) and len(info["pred"]) == EXTRA_STRING_MAX_CHARS
    assert info["obj"] == repr({"nested": [1, 2]})
    assert info["n"] == 0.5 and isinstance(info["n"], float)
