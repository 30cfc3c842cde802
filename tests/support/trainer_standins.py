"""Small, honest CPU stand-ins for what ``RayPPOTrainer`` drives on GPUs, so verl's real ``fit`` (and
ours) run on CPU.

Replaced: the worker groups and the rollout servers. Each stand-in exposes exactly the calls the
trainer makes, with verl's data layout:

* ``actor_rollout_wg`` (:class:`ActorStandIn`): ``compute_log_prob`` and ``update_actor`` take verl's
  no-padding TensorDict (``left_right_2_no_padding``) and answer in it (verl's ``no_padding_2_padding``
  reads the answer back); ``update_actor`` splits mini-batches with verl's own ``tu.make_iterator``
  (``mini_batch_size``, ``epochs``, ``seed``, ``shuffle``, as the engine worker does) and takes one
  optimizer step per mini-batch with verl's registered PPO loss (``async_reward_bench.toy.ppo_update``);
  ``save_checkpoint`` / ``load_checkpoint``; ``_dispatch_info`` / ``_query_dispatch_info`` for
  ``_balance_batch`` (one data-parallel rank).
* ``ref_policy_wg`` (:class:`RefStandIn`): ``compute_ref_log_prob`` from a frozen copy of the initial
  policy. ``critic_wg`` (:class:`CriticStandIn`): ``infer_batch`` / ``train_mini_batch`` (futures,
  ``.get()``) over a second tiny network trained with verl's ``compute_value_loss``.
* ``async_rollout_manager`` (:class:`RolloutStandIn`): ``generate_sequences`` samples from its own
  copy of the policy, in the agent loop's output layout (left-padded prompts, right-padded responses,
  ``response_mask``, ``position_ids``, ``rollout_log_probs``). With ``score_with`` it scores inside
  generation like verl's agent reward loop (for verl's own ``fit``); without, it returns unscored
  samples with the input's fields, as ``ScoreLaterAgentLoopManager`` does.
* ``checkpoint_manager`` (:class:`WeightSyncStandIn`): ``update_weights`` copies the actor's weights
  into the rollout copy and wakes it; ``sleep_replicas`` puts it to sleep. Generating while asleep
  raises, so a trainer that forgets to sync cannot pass.

Everything else is real. Not modelled: several data-parallel ranks, entropy (reported as 0),
importance weights in the loss (verl's ``rollout_is_weights`` are computed but the toy loss ignores
them). Optional sleeps stand for GPU time (``StageDelays``), as the benchmark's calibrated waits do.
"""

from __future__ import annotations

import copy
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from tensordict import TensorDict
from torch.utils.data import Dataset
from verl import DataProto
from verl.utils import tensordict_utils as tu

from async_reward_bench.toy.policy import TinyPolicy, ppo_update
from async_reward_bench.toy.task import ArithmeticTask

__all__ = [
    "ActorStandIn",
    "ArithmeticPrompts",
    "CriticStandIn",
    "RefStandIn",
    "RolloutStandIn",
    "StageDelays",
    "StandIns",
    "WeightSyncStandIn",
    "build_standins",
]


class ArithmeticPrompts(Dataset):
    """Rows shaped like verl's ``RLHFDataset`` ones for the agent loop: ``raw_prompt`` (chat
    messages), ``dummy_tensor``, ``data_source``, ``reward_model``, ``extra_info`` and ``index``."""

    def __init__(self, task: ArithmeticTask, size: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        problems = task.problems
        self.rows = []
        for i in range(size):
            a, b = problems[int(rng.integers(len(problems)))]
            self.rows.append(
                {
                    "raw_prompt": [{"role": "user", "content": task.prompt(a, b)}],
                    "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
                    "data_source": task.data_source,
                    "reward_model": {"ground_truth": str(task.answer(a, b)), "style": "rule"},
                    "extra_info": {"index": i},
                    "index": i,
                }
            )

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return copy.deepcopy(self.rows[i])


@dataclass
class StageDelays:
    """Seconds each stage sleeps on top of its CPU work, standing for GPU time."""

    generate: float = 0.0
    log_prob: float = 0.0
    optimizer_step: float = 0.0


@dataclass
class UpdateRecord:
    """One optimizer step of the actor."""

    start: float
    end: float
    sample_ids: list[str]
    prompt_indices: list[int]
    metrics: dict[str, float]
    loss_tokens: int = 0
    """Loss tokens (``response_mask``) of the step's mini-batch."""
    weight_change: float = 0.0
    """Largest absolute change of a policy weight in this step."""


@dataclass
class GenerateRecord:
    """One ``generate_sequences`` call."""

    start: float
    end: float
    weights_version: int | None
    validate: bool
    prompt_indices: list[int]


class _Done:
    """What a non-blocking worker-group call returns: ``.get()`` gives the result."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


def _padded(td: TensorDict) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Left/right-padded ``input_ids``, ``attention_mask`` and the response width of a no-padding td."""
    prompts, responses = td["prompts"], td["responses"]
    return torch.cat([prompts, responses], dim=1), td["attention_mask"], responses.shape[1]


def _to_no_padding(values: torch.Tensor, td: TensorDict) -> torch.Tensor:
    """``[B, R]`` per-response-token values in the worker output layout: a jagged tensor over each
    sequence's valid tokens, position t holding the value for token t + 1 (``no_padding_2_padding``
    reads it back)."""
    mask = td["attention_mask"]
    width = td["prompts"].shape[1]
    prompt_lens, response_lens = mask[:, :width].sum(1), mask[:, width:].sum(1)
    pieces = []
    for row, p, r in zip(values, prompt_lens.tolist(), response_lens.tolist(), strict=True):
        piece = torch.zeros(p + r, dtype=values.dtype)
        piece[p - 1 : p - 1 + r] = row[:r]
        pieces.append(piece)
    offsets = td["input_ids"].offsets()
    assert int(offsets[-1]) == sum(len(p) for p in pieces), "sequence lengths disagree with input_ids"
    return torch.nested.nested_tensor_from_jagged(torch.cat(pieces), offsets=offsets)


def _mini_batches(td: TensorDict) -> Any:
    """The engine worker's split (``TrainingWorker.train_mini_batch``), one data-parallel rank."""
    mini_batch_size = tu.pop(td, key="mini_batch_size", default=None)
    epochs = tu.pop(td, key="epochs", default=1)
    seed = tu.pop(td, key="seed", default=42)
    dataloader_kwargs = tu.pop(td, key="dataloader_kwargs", default={})
    return tu.make_iterator(
        td, mini_batch_size=mini_batch_size, epochs=epochs, seed=seed, dataloader_kwargs=dataloader_kwargs
    )


def _as_batch(td: TensorDict, **tensors: torch.Tensor) -> DataProto:
    input_ids, attention_mask, _ = _padded(td)
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "responses": td["responses"],
            "response_mask": td["response_mask"],
            **tensors,
        },
        meta_info={"temperature": float(tu.get(td, "temperature", default=1.0))},
    )


class _LogProbs:
    """``compute_log_prob``-style inference with a TinyPolicy."""

    def __init__(self, policy: TinyPolicy, delays: StageDelays) -> None:
        self.policy, self.delays = policy, delays

    def _infer(self, td: TensorDict) -> TensorDict:
        input_ids, attention_mask, width = _padded(td)
        temperature = float(tu.get(td, "temperature", default=1.0))
        with torch.no_grad():
            log_probs = self.policy.token_log_probs(input_ids, attention_mask, width, temperature=temperature)
        time.sleep(self.delays.log_prob)
        nested = _to_no_padding(log_probs, td)
        entropy = _to_no_padding(torch.zeros_like(log_probs), td)
        return tu.get_tensordict(
            {"log_probs": nested, "entropy": entropy}, non_tensor_dict={"metrics": {"mfu": 0.0}}
        )


class ActorStandIn(_LogProbs):
    """``actor_rollout_wg``: the trained policy."""

    def __init__(
        self,
        policy: TinyPolicy,
        optimizer: torch.optim.Optimizer,
        actor_config: DictConfig,
        delays: StageDelays,
    ) -> None:
        super().__init__(policy, delays)
        self.optimizer = optimizer
        self.clip_ratio = float(actor_config.clip_ratio)
        self.loss_agg_mode = str(actor_config.loss_agg_mode)
        self._dispatch_info: dict[str, list[int]] = {}
        self.updates: list[UpdateRecord] = []
        self.update_calls: list[list[UpdateRecord]] = []
        """Optimizer steps grouped by ``update_actor`` call."""

    def _query_dispatch_info(self, role: str) -> list[int]:
        return [0]

    def compute_log_prob(self, td: TensorDict) -> TensorDict:
        return self._infer(td)

    def update_actor(self, td: TensorDict) -> TensorDict:
        metrics: dict[str, list[float]] = {}
        call: list[UpdateRecord] = []
        for mini in _mini_batches(td):
            start = time.perf_counter()
            batch = _as_batch(mini, old_log_probs=mini["old_log_probs"], advantages=mini["advantages"])
            before = torch.cat([p.detach().flatten() for p in self.policy.parameters()])
            step = ppo_update(
                self.policy,
                self.optimizer,
                batch,
                clip_ratio=self.clip_ratio,
                loss_agg_mode=self.loss_agg_mode,
            )
            time.sleep(self.delays.optimizer_step)
            record = UpdateRecord(
                start,
                time.perf_counter(),
                [str(s) for s in mini["sample_id"]],
                [int(e["index"]) for e in mini["extra_info"]],
                step,
                int(mini["response_mask"].sum()),
                float(
                    (torch.cat([p.detach().flatten() for p in self.policy.parameters()]) - before).abs().max()
                ),
            )
            call.append(record)
            for key, value in step.items():
                metrics.setdefault(key.removeprefix("actor/"), []).append(value)
        self.updates.extend(call)
        self.update_calls.append(call)
        metrics["mfu"] = [0.0]
        return tu.get_tensordict({}, non_tensor_dict={"metrics": metrics})

    def save_checkpoint(
        self,
        local_path: str,
        hdfs_path: str | None = None,
        global_step: int = 0,
        max_ckpt_to_keep: int | None = None,
    ) -> None:
        os.makedirs(local_path, exist_ok=True)
        state = {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": global_step,
        }
        torch.save(state, Path(local_path) / "standin.pt")

    def load_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False
    ) -> None:
        state = torch.load(Path(local_path) / "standin.pt", weights_only=False)
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])


class RefStandIn(_LogProbs):
    """``ref_policy_wg``: a frozen copy of the initial policy."""

    def compute_ref_log_prob(self, td: TensorDict) -> TensorDict:
        return self._infer(td)


class CriticStandIn:
    """``critic_wg``: a second tiny network whose per-token output is the value, trained with verl's
    ``compute_value_loss``."""

    def __init__(self, net: TinyPolicy, optimizer: torch.optim.Optimizer, critic_config: DictConfig) -> None:
        self.net, self.optimizer = net, optimizer
        self.cliprange_value = float(critic_config.cliprange_value)
        self.loss_agg_mode = str(critic_config.loss_agg_mode)
        self.steps = 0

    def _values(self, td: TensorDict) -> torch.Tensor:
        input_ids, attention_mask, width = _padded(td)
        return self.net.token_log_probs(input_ids, attention_mask, width)

    def infer_batch(self, td: TensorDict) -> _Done:
        with torch.no_grad():
            values = self._values(td)
        return _Done(
            tu.get_tensordict(
                {"values": _to_no_padding(values, td)}, non_tensor_dict={"metrics": {"mfu": 0.0}}
            )
        )

    def train_mini_batch(self, td: TensorDict) -> _Done:
        from verl.trainer.ppo.core_algos import compute_value_loss

        losses = []
        for mini in _mini_batches(td):
            vpreds = self._values(mini)
            loss, _ = compute_value_loss(
                vpreds=vpreds,
                returns=mini["returns"].float(),
                values=mini["values"].float(),
                response_mask=mini["response_mask"].float(),
                cliprange_value=self.cliprange_value,
                loss_agg_mode=self.loss_agg_mode,
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self.steps += 1
            losses.append(float(loss.detach()))
        return _Done(tu.get_tensordict({}, non_tensor_dict={"metrics": {"vf_loss": losses, "mfu": [0.0]}}))

    def save_checkpoint(
        self,
        local_path: str,
        hdfs_path: str | None = None,
        global_step: int = 0,
        max_ckpt_to_keep: int | None = None,
    ) -> None:
        os.makedirs(local_path, exist_ok=True)
        torch.save(
            {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict()},
            Path(local_path) / "critic.pt",
        )

    def load_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False
    ) -> None:
        state = torch.load(Path(local_path) / "critic.pt", weights_only=False)
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])


class RolloutStandIn:
    """``async_rollout_manager``: samples from its own copy of the policy (set by ``update_weights``)."""

    def __init__(
        self,
        policy: TinyPolicy,
        tokenizer: Any,
        config: DictConfig,
        *,
        seed: int,
        delays: StageDelays,
        score_with: Any = None,
    ) -> None:
        self.policy = policy
        self.tokenizer = tokenizer
        self.rollout_config = config.actor_rollout_ref.rollout
        self.generator = torch.Generator().manual_seed(seed)
        self.delays = delays
        self.score_with = score_with
        self.awake = False
        self.weights_version: int | None = None
        self.calls: list[GenerateRecord] = []

    def load_weights(self, state: dict[str, torch.Tensor], version: int | None) -> None:
        self.policy.load_state_dict(state)
        self.weights_version, self.awake = version, True

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        if not self.awake:
            raise RuntimeError("generate_sequences on sleeping replicas: update_weights was not called")
        start = time.perf_counter()
        validate = bool(prompts.meta_info.get("validate", False))
        config = self.rollout_config
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = config.prompt_length
        rows = [
            self.tokenizer.encode(m[-1]["content"], add_special_tokens=False)
            for m in prompts.non_tensor_batch["raw_prompt"]
        ]
        prompt_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
        prompt_mask = (torch.arange(width) >= torch.tensor([width - len(r) for r in rows])[:, None]).long()
        temperature = config.val_kwargs.temperature if validate else config.temperature
        responses, response_mask = self.policy.generate(
            prompt_ids,
            prompt_mask,
            config.response_length,
            eos_token_id=eos,
            pad_token_id=pad,
            temperature=temperature,
            generator=self.generator,
        )
        attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
        input_ids = torch.cat([prompt_ids, responses], dim=1)
        tensors = {
            "prompts": prompt_ids,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": torch.clip(torch.cumsum(attention_mask, dim=1) - 1, min=0),
        }
        if config.calculate_log_probs:
            with torch.no_grad():
                behaviour = self.policy.token_log_probs(
                    input_ids, attention_mask, responses.shape[1], temperature=config.temperature
                )
            tensors["rollout_log_probs"] = behaviour * response_mask
        time.sleep(self.delays.generate)
        seen: Counter[str] = Counter()
        sample_ids = []
        for uid, extra in zip(
            prompts.non_tensor_batch["uid"], prompts.non_tensor_batch["extra_info"], strict=True
        ):
            sample_ids.append(f"{extra['index']}:{seen[uid]}")
            seen[uid] += 1
        produced = {
            "__num_turns__": np.full(len(rows), 2, dtype=np.int32),
            "multi_modal_inputs": np.array([{} for _ in rows], dtype=object),
            "sample_id": np.array(sample_ids, dtype=object),
        }
        meta: dict[str, Any] = {}
        if self.score_with is None:  # verl's agent loop without reward handles returns the input's fields
            output = DataProto.from_dict(
                tensors=tensors, non_tensors={**prompts.non_tensor_batch, **produced}
            )
        else:  # verl's agent reward loop: scored before generate_sequences returns
            scoring = DataProto.from_dict(
                tensors=tensors, non_tensors={**prompts.non_tensor_batch, **produced}
            )
            chunk = self.score_with.get_chunk(self.score_with.submit(scoring), len(scoring))
            tensors["rm_scores"] = chunk.rm_scores
            extras = {k: np.asarray(v) for k, v in chunk.reward_extra_info.items()}
            output = DataProto.from_dict(tensors=tensors, non_tensors={**produced, **extras})
            meta["reward_extra_keys"] = list(extras)
        end = time.perf_counter()
        output.meta_info = {**meta, "timing": {"agent_loop/generate_sequences/mean": end - start}}
        indices = [int(e["index"]) for e in prompts.non_tensor_batch["extra_info"]]
        self.calls.append(GenerateRecord(start, end, self.weights_version, validate, indices))
        return output


class WeightSyncStandIn:
    """``checkpoint_manager``: verl's colocated weight sync between the actor and the rollout."""

    def __init__(self, actor: ActorStandIn, rollout: RolloutStandIn) -> None:
        self.actor, self.rollout = actor, rollout
        self.syncs: list[int | None] = []

    def update_weights(self, global_steps: int | None = None) -> dict[str, Any]:
        self.rollout.load_weights(copy.deepcopy(self.actor.policy.state_dict()), global_steps)
        self.syncs.append(global_steps)
        return {}

    def sleep_replicas(self) -> None:
        self.rollout.awake = False


@dataclass
class StandIns:
    actor: ActorStandIn
    rollout: RolloutStandIn
    sync: WeightSyncStandIn
    ref: RefStandIn | None = None
    critic: CriticStandIn | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def attach(self, trainer: Any) -> Any:
        """Give a trainer built without ``init_workers`` (it needs GPUs) these stand-ins instead."""
        trainer.actor_rollout_wg = self.actor
        trainer.async_rollout_manager = self.rollout
        trainer.checkpoint_manager = self.sync
        trainer.async_rollout_mode = True
        trainer.reward_loop_manager = None
        if self.ref is not None:
            trainer.ref_policy_wg = self.ref
        if self.critic is not None:
            trainer.critic_wg = self.critic
        return trainer


def build_standins(
    config: DictConfig,
    tokenizer: Any,
    *,
    seed: int = 0,
    hidden_size: int = 32,
    lr: float = 0.05,
    delays: StageDelays | None = None,
    score_with: Any = None,
    adamw_weight_decay: float | None = None,
) -> StandIns:
    """Stand-ins with identical initial weights for a given ``seed`` (for comparing two trainers).
    The actor trains with Adam, or with AdamW when ``adamw_weight_decay`` is given (verl's default
    actor optimizer: its decay moves weights on every step, even on a zero gradient)."""
    delays = delays or StageDelays()
    vocab = len(tokenizer)
    policy = TinyPolicy(vocab, hidden_size, seed=seed)
    optimizer = (
        torch.optim.Adam(policy.parameters(), lr=lr)
        if adamw_weight_decay is None
        else torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=adamw_weight_decay)
    )
    actor = ActorStandIn(policy, optimizer, config.actor_rollout_ref.actor, delays)
    rollout = RolloutStandIn(
        TinyPolicy(vocab, hidden_size, seed=seed),
        tokenizer,
        config,
        seed=seed + 1,
        delays=delays,
        score_with=score_with,
    )
    ref = critic = None
    if config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward:
        ref = RefStandIn(TinyPolicy(vocab, hidden_size, seed=seed).requires_grad_(False), delays)
    if config.critic.enable:
        net = TinyPolicy(vocab, hidden_size, seed=seed + 2)
        critic = CriticStandIn(net, torch.optim.Adam(net.parameters(), lr=lr), config.critic)
    return StandIns(actor, rollout, WeightSyncStandIn(actor, rollout), ref, critic)
