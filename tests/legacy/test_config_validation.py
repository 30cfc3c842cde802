"""The legacy trainer refuses bad settings before any worker starts: its entry point's checks on the
user's command line (its own ``async_reward.pipeline`` node included), its rollout settings' check, and
``PipelinedRewardLoopManager`` (every other setting's rows: tests/config/test_config_validation.py)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf, open_dict

from async_reward import ConfigError
from tests.config.test_config_validation import UNSET, WRONG_SHAPES, wrong_shape_refused

#: The legacy trainer's own node (``async_reward``, its ``pipeline``), misshapen or too large, and the
#: key named.
PIPELINE_NODE_SHAPES: list[tuple[list[str], str]] = [
    (["+async_reward.pipeline=true"], "async_reward.pipeline"),
    (["+async_reward.pipeline=both"], "async_reward.pipeline"),
    (["+async_reward=x"], "async_reward"),
    (["+async_reward.pipeline.chunk_timeout_s=" + "9" * 400], "async_reward.pipeline.chunk_timeout_s"),
]


@pytest.mark.parametrize(("overrides", "key"), PIPELINE_NODE_SHAPES + WRONG_SHAPES)
def test_wrong_shapes_and_unresolvable_values_are_config_errors(overrides, key, monkeypatch):
    """The user's command line through our entry point's checks: each used to be a bare TypeError,
    ValueError, AttributeError, OverflowError or OmegaConf InterpolationResolutionError."""
    from async_reward.legacy.main_ppo import prepare_config

    error = wrong_shape_refused(prepare_config, overrides, monkeypatch)
    assert error.key == key, str(error)
    assert error.fix and error.fix in str(error)


def test_an_unresolvable_rollout_setting_is_a_config_error(verl_config_factory):
    from async_reward.legacy.rollout_settings import check_pipelined_rollout_settings

    config = verl_config_factory("async_naive", {})
    key = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
    with open_dict(config):
        OmegaConf.update(config, key, UNSET, merge=False, force_add=True)
    with pytest.raises(ConfigError, match="cannot be resolved"):
        check_pipelined_rollout_settings(config)


def test_pipelined_manager_refuses_before_starting_workers(ray_cluster, verl_config_factory, monkeypatch):
    import async_reward.legacy.manager as manager_module
    from async_reward.legacy import PipelinedRewardLoopManager

    started: list[int] = []
    monkeypatch.setattr(manager_module, "start_workers", lambda *a, **k: started.append(1))
    config = verl_config_factory("llm_judge", {"judge": {"base_url": "http://x/v1", "normalize_to": [1, 0]}})
    with pytest.raises(ConfigError, match=r"judge\.normalize_to=\[1\.0, 0\.0\]"):
        PipelinedRewardLoopManager(config)
    assert started == []
