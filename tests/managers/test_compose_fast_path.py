"""The suite's compose of verl's config (``tests/conftest.py``): value overrides applied to a copy of the
config composed without overrides give exactly what hydra's whole compose gives, and every other form
of override still goes through hydra's compose."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from tests import conftest
from tests.conftest import _composed, _hydra_compose, _value_overrides, assert_same_config

#: Every form of value override, on keys of verl's tree at several depths, with every value type.
VALUE_OVERRIDES = [
    ("data.train_batch_size=4",),
    ("trainer.use_v1=true", "trainer.v1.trainer_mode=pipelined"),
    ("+trainer.v1.pipelined.mini_batch=true", "+trainer.v1.pipelined.max_staleness=0"),
    ("++trainer.v1={trainer_mode:pipelined,pipelined:{mini_batch:true}}",),
    ("++trainer.n_gpus_per_node=2", "++trainer.brand_new_key=[1,2,3]"),
    ("~trainer.logger",),
    ("reward.reward_manager.name=llm_judge", "+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1"),
    ("actor_rollout_ref.model.path=/tmp/model", "actor_rollout_ref.rollout.n=2", "critic.enable=false"),
    ("trainer.logger=[console]", "data.val_files=null", "algorithm.adv_estimator=grpo"),
    (
        "+ray_kwargs.ray_init.runtime_env.env_vars.KEY='a b: c'",
        "trainer.project_name=${trainer.experiment_name}",
    ),
]


@pytest.mark.parametrize("overrides", VALUE_OVERRIDES)
def test_value_overrides_give_what_hydra_composes(overrides):
    assert _value_overrides(overrides) is not None  # the fast path is taken
    fast = _composed(overrides)
    assert_same_config(fast, _hydra_compose(overrides), overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        ("actor@actor_rollout_ref.actor=megatron_actor",),  # a group with its package
        ("reward=reward",),  # a group of verl's tree
        ("++reward={reward_manager:{name:async_naive}}",),  # a key that is also a group: hydra decides
        ("hydra.job.name=x",),
        ("data.train_batch_size=4,8",),  # a sweep: hydra refuses it outside --multirun
    ],
)
def test_every_other_form_goes_through_hydras_compose(overrides):
    assert _value_overrides(overrides) is None


def test_a_key_missing_without_plus_fails_as_in_hydra():
    overrides = ("trainer.no_such_key=1",)
    with pytest.raises(ConfigCompositionException) as fast:
        _composed(overrides)
    with pytest.raises(ConfigCompositionException) as composed:
        _hydra_compose(overrides)
    assert str(fast.value) == str(composed.value)
    assert "trainer.no_such_key" in str(fast.value)


def test_a_test_changing_its_config_changes_no_other():
    overrides = ("data.train_batch_size=7",)
    first = conftest.compose_verl_config(list(overrides))
    OmegaConf.set_struct(first, False)
    first.data.train_batch_size = 99
    first.trainer.added = 1
    second = conftest.compose_verl_config(list(overrides))
    assert second.data.train_batch_size == 7 and "added" not in second.trainer
    assert conftest.compose_verl_config([]).data.train_batch_size != 99
