"""verl v1 training on CPU: verl's real v1 trainer, agent loop, reward loop, TransferQueue and replay
buffer, with small stand-ins only for what needs GPUs.

Stand-ins (each honest about what it does not do):

* :class:`ScriptedLLMServer` (a Ray actor) replaces a vLLM replica behind verl's real load balancer
  and ``LLMServerClient``: it answers each prompt with the next scripted response for that prompt
  (after a delay, for a response marked :data:`SLOW`; once the test opens it, for one at :data:`GATE`).
  It lives in tests/support/scripted_server.py, which imports neither torch nor verl (its process
  starts in a sixth of the CPU time).
* :class:`StandInActor` replaces the actor worker group: constant log-probs and entropy, no model;
  ``update_actor`` records exactly what the actor would train on (the batch's advantages,
  ``loss_mask`` (checked equal to ``response_mask``), uids, scores and reward extras, read from
  TransferQueue), splits it into optimizer updates as verl's engine worker does (verl's own
  ``tu.make_iterator`` with the ``mini_batch_size``, ``epochs``, ``seed`` and ``shuffle`` the trainer
  passes) and takes one AdamW step (momentum and weight decay on) per update on a small weight vector
  with a token-mean loss over the update's loss tokens, recording each step (:class:`OptimizerStep`).
* :class:`StandInCheckpointManager` replaces the weight sync: it only tells the server the version.
* :class:`StandInServerManager` hands out verl's own client classes over the load balancer.

:func:`run_v1_training` then does what ``TaskRunnerV1.run`` does, with verl's own code: the trainer
class for ``trainer.v1.trainer_mode`` (whose ``__init__`` builds the replay buffer named by the
config), verl's ``RewardLoopManager`` (our managers run in its Ray workers), the agent-loop manager
picked by ``TaskRunnerV1.init_agent_loop_manager`` from the config, and ``PPOTrainer.fit``.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import ray
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from tests.conftest import compose_verl_config, shutdown_reward_loop
from tests.support.scripted_server import (  # noqa: F401  (the stand-ins' names, as the tests import them)
    AT_VERSION,
    GATE,
    GENERATION_ERROR,
    SLOW,
    ScriptedLLMServer,
)
from tests.support.warm_actors import release

CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def build_tiny_model_dir(directory: Path) -> Path:
    """A model directory verl's ``HFModelConfig`` accepts: our tiny tokenizer with a chat template and
    a one-layer Llama config (no weights: nothing here runs the model)."""
    from transformers import LlamaConfig

    from async_reward.testing import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(directory)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(directory))
    LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(str(directory))
    return directory


def write_dataset(path: Path, rows: list[tuple[str, str]]) -> str:
    """A verl RL parquet file: one chat prompt per (question, ground truth), ``extra_info.index`` = row."""
    import pandas as pd

    pd.DataFrame(
        [
            {
                "data_source": "v1test",
                "prompt": [{"role": "user", "content": question}],
                "reward_model": {"style": "rule", "ground_truth": truth},
                "extra_info": {"index": index},
            }
            for index, (question, truth) in enumerate(rows)
        ]
    ).to_parquet(path)
    return str(path)


class ScriptedRollout:
    """The stand-in server behind verl's real load balancer, shared by a module's runs (each Ray
    process costs seconds to start); ``close`` kills both."""

    def __init__(self, model_dir: Path) -> None:
        from verl.workers.rollout.router import get_router_handle

        self.server = ScriptedLLMServer.remote(str(model_dir))
        self.load_balancer = get_router_handle(servers={"scripted-0": self.server})

    def close(self) -> None:
        ray.kill(self.load_balancer, no_restart=True)
        ray.kill(self.server, no_restart=True)


class StandInServerManager:
    """What the trainer asks of ``LLMServerManager`` (``get_client``), over verl's real load balancer."""

    def __init__(self, config: DictConfig, load_balancer: Any) -> None:
        self.config = config
        self.load_balancer = load_balancer

    def get_client(self, client_cls: type | None = None, **kwargs: Any) -> Any:
        from verl.workers.rollout.llm_server import LLMServerClient

        client = client_cls or LLMServerClient
        return client(config=self.config, load_balancer_handle=self.load_balancer, **kwargs)


class StandInCheckpointManager:
    """The weight sync cannot run without GPUs; the server only learns the policy version."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def update_weights(self, global_steps: int | None = None) -> None:
        if global_steps is not None:
            ray.get(self.server.set_version.remote(global_steps))

    def sleep_replicas(self) -> None:
        pass

    def abort_replicas(self, reject_request: bool = False) -> None:
        pass

    def resume_generation_replicas(self) -> None:
        pass


@dataclass
class TrainedSample:
    """One row of a batch ``update_actor`` received, as the actor would read it from TransferQueue."""

    key: str
    uid: str
    index: int
    score: float
    advantage: float
    mask_tokens: int
    padding: bool
    reward_extra_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimizerStep:
    """One AdamW step of :class:`StandInActor`: one of verl's updates (mini-batch x epoch)."""

    keys: list[str]
    loss_tokens: int
    """Loss tokens (``loss_mask``) of the update's rows: what verl's token-mean divides by."""
    weight_change: float
    """Largest absolute change of a weight in this step."""


class StandInActor:
    """The actor worker group of a single data-parallel rank, without a model."""

    def __init__(self) -> None:
        self._dispatch_info = {"actor": [0]}
        self.updates: list[list[TrainedSample]] = []
        self.weights = torch.nn.Parameter(torch.ones(4))
        # verl's default actor optimizer is AdamW; weight decay on, so a step moves weights whatever
        # the gradient (and momentum carries earlier steps into it).
        self.optimizer = torch.optim.AdamW([self.weights], lr=0.1, weight_decay=0.1)
        self.steps: list[OptimizerStep] = []
        self.cpu_snapshots: list[tuple[str, int]] = []

    def _query_dispatch_info(self, role: str) -> list[int]:
        return self._dispatch_info[role]

    # verl's separate_async keeps pi_old on the CPU across the mini-batches of a parameter sync
    # (``DetachActorWorker``: save / restore / clear by slot); the stand-in's log-probs do not depend
    # on weights, so it only records the protocol.
    def save_model_to_cpu(self, slot: int) -> None:
        self.cpu_snapshots.append(("save", slot))

    def restore_model_from_cpu(self, slot: int) -> None:
        self.cpu_snapshots.append(("restore", slot))

    def clear_cpu_model(self, slot: int) -> None:
        self.cpu_snapshots.append(("clear", slot))

    def compute_log_prob(self, batch: Any) -> Any:
        import transfer_queue as tq
        from tensordict import TensorDict

        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["input_ids"])
        lengths = data["input_ids"].offsets().diff().tolist()
        log_probs = _nested([torch.full((n,), -1.0) for n in lengths])
        entropy = _nested([torch.full((n,), 0.5) for n in lengths])
        fields = TensorDict({"log_probs": log_probs, "entropy": entropy}, batch_size=len(lengths))
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
        return batch

    def update_actor(self, batch: Any) -> dict[str, Any]:
        import transfer_queue as tq

        fields = [
            "uid",
            "advantages",
            "loss_mask",
            "response_mask",
            "rm_scores",
            "extra_fields",
            "extra_info",
        ]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        advantages = data["advantages"].to_padded_tensor(0.0)
        # verl's engines count loss tokens from loss_mask (batch_num_tokens) and the policy loss reads
        # response_mask: an excluded row must have neither, so the stand-in reads both.
        masks = data["loss_mask"].to_padded_tensor(0)
        if not torch.equal(masks, data["response_mask"].to_padded_tensor(0)):
            raise AssertionError("loss_mask and response_mask differ: the policy loss would see other tokens")
        scores = data["rm_scores"].to_padded_tensor(0.0).sum(dim=1).tolist()
        extra_fields, extra_infos = list(data["extra_fields"]), list(data["extra_info"])
        rows = []
        for i, key in enumerate(batch.keys):
            mask = masks[i].bool()
            rows.append(
                TrainedSample(
                    key=key,
                    uid=str(data["uid"][i]),
                    index=int((extra_infos[i] or {}).get("index", -1)),
                    score=float(scores[i]),
                    # the advantage the loss sees; a row with no loss tokens must carry none at all
                    advantage=float(advantages[i][mask].mean() if mask.any() else advantages[i].abs().sum()),
                    mask_tokens=int(mask.sum()),
                    padding=bool(batch.tags[i].get("is_padding", False)),
                    reward_extra_info=dict((extra_fields[i] or {}).get("reward_extra_info") or {}),
                )
            )
        self.updates.append(rows)
        losses = [self._optimizer_step(batch, rows, index) for index in _verl_updates(batch)]
        return {"metrics": {"mfu": [0.0], "pg_loss": losses}}

    def _optimizer_step(self, batch: Any, rows: list[TrainedSample], index: list[int]) -> float:
        """One AdamW step on the rows ``index``: a token-mean loss (verl's default aggregation) of
        ``advantage x weights.sum()`` over their loss tokens. With no loss token verl's loss is 0/0
        with an exactly zero gradient (issue 16); the step is still taken, as verl takes it."""
        tokens = sum(rows[i].mask_tokens for i in index)
        signal = sum(rows[i].advantage * rows[i].mask_tokens for i in index)
        before = self.weights.detach().clone()
        self.optimizer.zero_grad()
        loss = signal * self.weights.sum() / max(tokens, 1)
        loss.backward()
        self.optimizer.step()
        change = float((self.weights.detach() - before).abs().max())
        self.steps.append(OptimizerStep([batch.keys[i] for i in index], tokens, change))
        return float(loss.detach()) if tokens else float("nan")


def _verl_updates(batch: Any) -> list[list[int]]:
    """The row indices of each optimizer update verl's engine worker makes of ``batch``
    (``TrainingWorker.train_mini_batch``: ``tu.make_iterator`` over the trainer's ``mini_batch_size``,
    ``epochs``, ``seed`` and ``dataloader_kwargs``; one data-parallel rank)."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    info = batch.extra_info
    rows = TensorDict({"row": torch.arange(len(batch.keys))}, batch_size=[len(batch.keys)])
    iterator = tu.make_iterator(
        rows,
        mini_batch_size=int(info["mini_batch_size"]),
        epochs=int(info.get("epochs", 1)),
        seed=int(info.get("seed", 42)),
        dataloader_kwargs=dict(info.get("dataloader_kwargs") or {}),
    )
    return [mini["row"].tolist() for mini in iterator]


def _nested(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def base_overrides(
    model_dir: Path, dataset: str, *, steps: int, prompts: int, n: int, mini_batch: int | None = None
) -> list[str]:
    """verl config for a tiny GRPO run on one stand-in rank (everything not a reward setting); one
    optimizer update per step unless ``mini_batch`` (``ppo_mini_batch_size``, prompts) is smaller."""
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.prompt_length=64",
        "actor_rollout_ref.rollout.response_length=32",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch or prompts}",
        "algorithm.adv_estimator=grpo",
        f"data.train_files={dataset}",
        f"data.val_files={dataset}",
        f"data.train_batch_size={prompts}",
        "data.max_prompt_length=64",
        "data.max_response_length=32",
        "data.dataloader_num_workers=0",
        "data.shuffle=false",
        "reward.num_workers=1",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.n_gpus_per_node=1",
        "trainer.logger=[file]",
    ]


#: What verl's ``separate_async`` needs beyond :func:`base_overrides`: the rollout on a standalone pool
#: of its own (no hybrid replicas on the trainer's GPUs) and a weight-sync backend other than
#: ``naive`` (never used: :func:`install_separate_async_standins` replaces the sync).
SEPARATE_ASYNC_OVERRIDES = [
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
]


def install_separate_async_standins(trainer: Any, config: DictConfig, rollout: ScriptedRollout) -> None:
    """What ``PPOTrainerSeparateAsync._setup`` builds (skipped here, as ``init`` is), with stand-ins:
    the standalone rollout's server manager over the scripted server's load balancer (verl asks it
    for its ``FullyAsyncLLMServerClient``), its weight sync, and the trainer-only mode
    (``hybrid_engine=false``: no colocated replica to lend to generation)."""
    from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode

    if bool(config.actor_rollout_ref.get("hybrid_engine", True)):
        raise ValueError("the stand-ins run separate_async without hybrid replicas: SEPARATE_ASYNC_OVERRIDES")
    trainer.standalone_server_manager = StandInServerManager(config, rollout.load_balancer)
    trainer.standalone_checkpoint_manager = StandInCheckpointManager(rollout.server)
    trainer.current_mode = HybridEngineMode.TRAINER


def compose_v1_config(overrides: list[str]) -> DictConfig:
    """verl's ``ppo_trainer`` config from command-line style overrides, as ``main_ppo`` composes it."""
    return compose_verl_config(overrides)


@dataclass
class TrainingRun:
    """What a v1 training run left behind."""

    logged: list[dict[str, Any]]
    """Each ``Tracking.log`` call of the run (verl's ``file`` logger): ``{"step": n, "data": metrics}``."""
    updates: list[list[TrainedSample]]
    """The batch of each ``update_actor`` call."""
    steps: list[OptimizerStep]
    """Each AdamW step the stand-in actor took (one per verl update)."""
    wall_s: float
    trainer: Any = None
    """The trainer, after ``fit`` returned."""
    leftover: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The ``train`` partition's tags as ``fit`` left them (before the harness clears it)."""


def run_v1_training(
    config: DictConfig,
    rollout: ScriptedRollout,
    script: dict[str, list[str]],
    log_path: Path,
    poll_interval_s: float = 0.1,
    actor: StandInActor | None = None,
) -> TrainingRun:
    """``TaskRunnerV1.run`` with stand-ins for the GPU parts; returns what was logged and trained.

    TransferQueue must be up (``tq.init``). The run's agent-loop and reward workers are killed and
    the ``train`` partition is cleared afterwards. ``actor``: the actor stand-in (default a new
    :class:`StandInActor`).
    """
    from verl.experimental.reward_loop import RewardLoopManager
    from verl.trainer.main_ppo import TaskRunnerV1
    from verl.trainer.ppo.v1 import get_trainer_cls

    with open_dict(config):
        config.transfer_queue.enable = True
    OmegaConf.resolve(config)
    previous_log_path = os.environ.get("VERL_FILE_LOGGER_PATH")
    os.environ["VERL_FILE_LOGGER_PATH"] = str(log_path)  # verl's "file" tracking backend writes here
    ray.get(rollout.server.start.remote(script))
    actor = actor if actor is not None else StandInActor()
    runner = SimpleNamespace(config=config, trainer=None, agent_loop_manager=None)
    reward_loop = None
    leftover: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    try:
        trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
        # The sampler polls TransferQueue every 2 s by default (verl passes no interval); tests are
        # faster with a shorter poll. Behaviour is otherwise verl's.
        getattr(trainer.replay_buffer, "_builtin", trainer.replay_buffer).poll_interval = poll_interval_s
        trainer._init_tokenizer()
        trainer._init_dataloader()
        trainer._init_dump_executor()
        trainer._init_resource_pool_mgr()
        trainer.actor_rollout_wg = actor
        trainer.ref_in_actor = False
        reward_loop = trainer.reward_loop_manager = RewardLoopManager(config=config)
        trainer.teacher_model_manager = None
        trainer.distillation_config = None
        trainer.llm_server_manager = StandInServerManager(config, rollout.load_balancer)
        trainer.checkpoint_manager = StandInCheckpointManager(rollout.server)
        if config.trainer.v1.trainer_mode in ("separate_async", "decoupled"):
            install_separate_async_standins(trainer, config, rollout)
        trainer._load_checkpoint()
        trainer.on_init_end()
        runner.trainer = trainer
        TaskRunnerV1.__ray_actor_class__.init_agent_loop_manager(runner)
        trainer.fit(runner.agent_loop_manager)
        trainer.logger.finish()
        import transfer_queue as tq

        leftover = dict((tq.kv_list("train") or {}).get("train", {}))
    finally:
        if previous_log_path is None:
            os.environ.pop("VERL_FILE_LOGGER_PATH", None)
        else:
            os.environ["VERL_FILE_LOGGER_PATH"] = previous_log_path
        # Agent-loop workers of an async run still generate ahead: stop them (cancelled, back to the
        # warm pool: tests/support/warm_actors.py) before clearing what they wrote, so the next run starts
        # from an empty partition.
        release(getattr(runner.agent_loop_manager, "agent_loop_workers", []))
        if reward_loop is not None:
            shutdown_reward_loop(reward_loop)
        clear_partition("train")
    logged = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    return TrainingRun(
        logged=logged,
        updates=actor.updates,
        steps=actor.steps,
        wall_s=time.monotonic() - started,
        trainer=runner.trainer,
        leftover=leftover,
    )


def assert_no_prompt_unaccounted(run: TrainingRun) -> None:
    """A decoupled run's prompt ledger never found a prompt lost, unknown or counted twice: what the
    mode logs and counts instead of stopping the run, asserted on its metrics. Every
    step logs its own check (``ledger/unaccounted``, ``ledger/double_counted``), and
    ``ledger/balanced`` stays 0 for good once any check found one (and needs the counts to agree)."""
    logs = [entry["data"] for entry in run.logged if "training/global_step" in entry["data"]]
    assert logs, "the run logged no step"
    for metrics in logs:
        found = (metrics["ledger/unaccounted"], metrics["ledger/double_counted"], metrics["ledger/balanced"])
        assert found == (0.0, 0.0, 1.0), (metrics["training/global_step"], found)


def kill_and_wait(actors: list[Any], timeout_s: float = 30.0) -> None:
    """Kill actors and return once each is gone (``ray.kill`` only sends the request)."""
    for handle in actors:
        ray.kill(handle, no_restart=True)
    deadline = time.monotonic() + timeout_s
    for handle in actors:
        while time.monotonic() < deadline:
            try:
                ray.get(handle.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                break
            time.sleep(0.05)


def clear_partition(partition_id: str) -> None:
    """Drop every key of a TransferQueue partition (prompt tags left in flight by an async run)."""
    import transfer_queue as tq

    listing = tq.kv_list(partition_id) or {}
    keys = list(listing.get(partition_id, {}))
    if keys:
        tq.kv_clear(keys=keys, partition_id=partition_id)


def sessions(update: list[TrainedSample]) -> list[TrainedSample]:
    """The real (non-padding) rows of one update."""
    return [row for row in update if not row.padding]


def group_by_index(update: list[TrainedSample]) -> dict[int, list[TrainedSample]]:
    """Rows of one update by dataset row (``extra_info.index``)."""
    groups: dict[int, list[TrainedSample]] = defaultdict(list)
    for row in sessions(update):
        groups[row.index].append(row)
    return dict(groups)


def as_array(values: list[float]) -> np.ndarray:
    return np.asarray(values, dtype=float)
