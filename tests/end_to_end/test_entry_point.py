"""The tiny assets a ``main_ppo`` run is started on (a random Qwen2 config, a tokenizer and parquet
prompts, the entry-point tests share them), and verl's own reward loop refusing the legacy trainer's
``async_reward.pipeline`` node.

The legacy entry point itself (``python -m async_reward.legacy.main_ppo`` and ``run(config)``, built in
Ray's task-runner actor): tests/legacy/test_entry_point.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import open_dict

from async_reward.config import ConfigError

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 config with a locally trained tokenizer (and chat template), and parquet
    prompts in verl's RL format: what ``actor_rollout_ref.model.path`` and ``data.*_files`` name."""
    import pandas as pd
    from transformers import Qwen2Config

    from async_reward.testing import build_tiny_tokenizer

    root = tmp_path_factory.mktemp("entry_assets")
    model = root / "model"
    tokenizer = build_tiny_tokenizer(model)
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    tokenizer.save_pretrained(str(model))
    Qwen2Config(
        architectures=["Qwen2ForCausalLM"],
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    ).save_pretrained(str(model))
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"What is {i} + 3?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i + 3)},
            "extra_info": {"index": i},
        }
        for i in range(8)
    ]
    (root / "data").mkdir()
    pd.DataFrame(rows).to_parquet(root / "data" / "train.parquet")
    pd.DataFrame(rows[:4]).to_parquet(root / "data" / "val.parquet")
    return root


def overrides(assets: Path) -> list[str]:
    """A GRPO run on the tiny assets, one GPU per node as a user would ask (none is started)."""
    return [
        f"actor_rollout_ref.model.path={assets / 'model'}",
        f"data.train_files={assets / 'data' / 'train.parquet'}",
        f"data.val_files={assets / 'data' / 'val.parquet'}",
        "data.train_batch_size=4",
        "data.max_prompt_length=32",
        "data.max_response_length=16",
        "data.dataloader_num_workers=0",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.n=2",
        "algorithm.adv_estimator=grpo",
        "critic.enable=false",
        "reward.reward_manager.name=llm_judge",
        "+reward.async_reward.judge.base_url=http://127.0.0.1:9/v1",
        "trainer.n_gpus_per_node=1",
        "trainer.logger=[console]",
    ]


def test_verls_reward_loop_refuses_to_score_when_the_pipeline_is_configured(
    server, verl_config_factory, reward_loop, batch_factory, monkeypatch
):
    """verl's own trainer with ``async_reward.pipeline`` set (e.g. ``python -m verl.trainer.main_ppo
    +async_reward.pipeline.mini_batch=true``): our verl plugin refuses it where verl builds its reward
    loop, naming the v1 line; and without the plugin's check, our manager, called by verl's reward
    loop, refuses on its own."""
    from async_reward.wiring import verl_plugin

    config = verl_config_factory("llm_judge", {"judge": {"base_url": server.url + "/v1"}})
    with open_dict(config):
        config.async_reward = {"pipeline": {"mini_batch": True}}
    batch = batch_factory([{"prompt": "What is 2+3?", "response": "5", "ground_truth": "5"}])
    with pytest.raises(ConfigError, match=r"async_reward\.pipeline is set") as refused:
        reward_loop(config)
    assert "trainer.v1.trainer_mode=pipelined" in str(refused.value)
    monkeypatch.setattr(verl_plugin, "prepare_where_verl_builds", lambda config: None)
    with pytest.raises(Exception, match="came from verl's own reward loop") as failure:
        reward_loop(config).compute_rm_score(batch)
    assert "python -m async_reward.legacy.main_ppo" in str(failure.value)
    assert server.stats()["requests_total"] == 0  # refused before the judge was asked
