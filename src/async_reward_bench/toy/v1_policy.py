"""The toy policy inside verl's v1 trainer: a token server that samples from it, an actor that trains it.

verl's v1 ``fit`` needs GPU worker groups and a vLLM server; on CPU the toy replaces exactly those,
with parts that do the real thing for a :class:`~async_reward_bench.toy.policy.TinyPolicy`:

* :class:`PolicyServer` (a Ray actor behind verl's real load balancer and ``LLMServerClient``)
  samples each response from the weights it was last given, at the request's temperature and
  ``max_tokens``, and returns the tokens' log-probs (verl's ``rollout_log_probs``) when asked. Each
  draw has its own seed, from the run's seed, the policy version, the prompt and how many responses
  to that prompt that version gave before: a run samples the same responses to each prompt whatever
  order the requests arrive in (one shared generator made every run on a loaded machine a new seed);
  only which of a batch's groups asking the same prompt gets which of them can vary.
* :class:`PolicyActor` (the actor worker group, one data-parallel rank) computes log-probs and
  entropy under the current weights (``compute_log_prob``) and trains (``update_actor``): it reads
  the batch from TransferQueue, puts its rows in an order of their content (not the order they
  finished scoring, which load changes), splits it into updates as verl's engine worker does
  (``tu.make_iterator`` with the trainer's ``mini_batch_size``, ``epochs``, ``seed``, ``shuffle``) and
  takes one step of verl's registered policy loss per update
  (:func:`~async_reward_bench.toy.policy.ppo_update`), with verl's ``rollout_is_weights`` when the
  trainer computed them (rollout correction).
* :class:`PolicyWeightSync` (the checkpoint manager) copies the actor's weights to the server on
  ``update_weights``: the server samples from exactly the version the trainer's schedule syncs, so a
  one-step-off batch really comes from the stale policy.

The model directory holds the toy's character tokenizer with a chat template that renders a
prompt's text unchanged (``"3+4="``), and a config verl's ``HFModelConfig`` accepts (no weights).

Longer than 400 lines: the stand-ins for exactly the GPU parts of verl's v1 ``fit`` (the token
server, its manager and weight sync, the actor), each a small class over the same toy policy.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from async_reward_bench.toy.policy import TinyPolicy, ppo_update
from async_reward_bench.toy.task import ArithmeticTask, build_char_tokenizer

__all__ = [
    "PolicyActor",
    "PolicyServer",
    "PolicyServerManager",
    "PolicyWeightSync",
    "build_toy_model_dir",
    "write_toy_dataset",
]

#: The prompt is the user's message, character for character: the policy sees ``"a+b="`` as in the
#: legacy toy, and every character is in the 14-token vocabulary.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def build_toy_model_dir(directory: Path) -> Any:
    """The character tokenizer (with :data:`CHAT_TEMPLATE`) and a tiny Llama config, saved to
    ``directory``; returns the tokenizer. verl's reward workers decode responses with it."""
    from transformers import LlamaConfig

    tokenizer = build_char_tokenizer(directory)
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
    return tokenizer


def write_toy_dataset(path: Path, task: ArithmeticTask, rows: int, seed: int) -> str:
    """A verl RL parquet file of ``rows`` problems drawn with ``seed`` (the same for every mode of a
    seed): chat prompt ``"a+b="``, ``reward_model.ground_truth`` the answer, ``extra_info.index``."""
    import pandas as pd

    rng = np.random.default_rng([seed, 20261124])
    problems = task.problems
    picks = rng.integers(0, len(problems), size=rows)
    pd.DataFrame(
        [
            {
                "data_source": task.data_source,
                "prompt": [{"role": "user", "content": task.prompt(*problems[p])}],
                "reward_model": {"style": "rule", "ground_truth": str(task.answer(*problems[p]))},
                "extra_info": {"index": index, "a": problems[p][0], "b": problems[p][1]},
            }
            for index, p in enumerate(picks.tolist())
        ]
    ).to_parquet(path)
    return str(path)


@ray.remote
class PolicyServer:
    """Stands in for a vLLM replica: samples from a :class:`TinyPolicy` holding the weights of the
    version last loaded. Requests are served one at a time (each is a few GRU steps).

    ``response_length`` (``actor_rollout_ref.rollout.response_length``) caps every response, and is
    the length of one whose request names no ``max_tokens``, as verl's vLLM server does.
    """

    def __init__(
        self, vocab_size: int, hidden_size: int, eos_token_id: int, pad_token_id: int, response_length: int
    ) -> None:
        torch.set_num_threads(1)
        self.policy = TinyPolicy(vocab_size, hidden_size).eval()
        self.eos, self.pad = eos_token_id, pad_token_id
        self.response_length = response_length
        self.version = -1
        self.seed = 0
        self.served: dict[int, int] = {}
        self._draws: dict[tuple[int, tuple[int, ...]], int] = {}  # (version, prompt) -> responses given

    def load(self, state: dict[str, torch.Tensor], version: int, seed: int | None = None) -> None:
        """The weights of policy ``version``; a new ``seed`` also restarts sampling and the counts."""
        self.policy.load_state_dict(state)
        self.version = version
        if seed is not None:
            self.seed = seed
            self.served = {}
            self._draws = {}

    def _generator(self, prompt_ids: list[int]) -> torch.Generator:
        """The generator of this draw: seeded from (run seed, version, prompt, its draw number), so the
        k-th response of a version to a prompt is the same in every run of the seed, in any order."""
        key = (self.version, tuple(prompt_ids))
        draw = self._draws.get(key, 0)
        self._draws[key] = draw + 1
        digest = hashlib.blake2b(repr((self.seed, *key, draw)).encode(), digest_size=8).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))

    def served_by_version(self) -> dict[int, int]:
        """Responses sampled under each policy version since the last seeded ``load``."""
        return dict(self.served)

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **_: Any
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        temperature = float(sampling_params.get("temperature", 1.0))
        asked = sampling_params.get("max_tokens") or sampling_params.get("max_new_tokens")
        max_tokens = max(1, min(int(asked), self.response_length)) if asked else self.response_length
        prompt = torch.tensor([prompt_ids], dtype=torch.long)
        mask = torch.ones_like(prompt)
        with torch.no_grad():
            ids, response_mask = self.policy.generate(
                prompt,
                mask,
                max_tokens,
                eos_token_id=self.eos,
                pad_token_id=self.pad,
                temperature=temperature,
                generator=self._generator(prompt_ids),
            )
            length = int(response_mask.sum())
            tokens = ids[0, :length].tolist()
            log_probs = None
            if sampling_params.get("logprobs") is not None and sampling_params.get("logprobs") is not False:
                full = torch.cat([prompt, ids[:, :length]], dim=1)
                log_probs = self.policy.token_log_probs(
                    full, torch.ones_like(full), length, temperature=temperature if temperature > 0 else 1.0
                )[0].tolist()
        self.served[self.version] = self.served.get(self.version, 0) + 1
        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs,
            stop_reason="completed",
            num_preempted=0,
            extra_fields={"global_steps": self.version},
        )


class PolicyServerManager:
    """What the trainer asks of ``LLMServerManager`` (``get_client``), over verl's real load balancer."""

    def __init__(self, config: Any, load_balancer: Any) -> None:
        self.config = config
        self.load_balancer = load_balancer

    def get_client(self, client_cls: type | None = None, **kwargs: Any) -> Any:
        from verl.workers.rollout.llm_server import LLMServerClient

        client = client_cls or LLMServerClient
        return client(config=self.config, load_balancer_handle=self.load_balancer, **kwargs)


class PolicyWeightSync:
    """verl's checkpoint manager for the toy: ``update_weights(version)`` copies the actor's current
    weights to the server, and calls ``on_sync(version)`` first (the benchmark evaluates there: the
    policy after step ``version``'s updates). Sleeping, aborting and resuming replicas do nothing:
    the server holds no KV cache and generates nothing partial."""

    def __init__(self, server: Any, actor: PolicyActor, on_sync: Callable[[int], None] | None = None) -> None:
        self.server = server
        self.actor = actor
        self.on_sync = on_sync
        self.versions: list[int] = []

    def update_weights(self, global_steps: int | None = None) -> None:
        version = int(global_steps or 0)
        if self.on_sync is not None:
            self.on_sync(version)
        state = {k: v.detach().clone() for k, v in self.actor.policy.state_dict().items()}
        ray.get(self.server.load.remote(state, version))
        self.versions.append(version)

    def sleep_replicas(self) -> None:
        pass

    def abort_replicas(self) -> None:
        pass

    def resume_generation_replicas(self) -> None:
        pass


class PolicyActor:
    """The actor worker group (one data-parallel rank) over a :class:`TinyPolicy`, trained for real.

    Args:
        policy: the policy, trained in place (the server gets copies of its weights).
        optimizer: its optimizer.
        actor_config: verl's ``actor_rollout_ref.actor`` node: ``clip_ratio``, ``entropy_coeff``,
            ``loss_agg_mode``, ``grad_clip`` and ``policy_loss.loss_mode`` are honoured.
        rollout_is: whether the trainer writes ``rollout_is_weights`` (verl's rollout correction with
            ``rollout_is`` set, decoupled mode), which the loss then applies.
    """

    def __init__(
        self, policy: TinyPolicy, optimizer: torch.optim.Optimizer, actor_config: Any, rollout_is: bool
    ) -> None:
        self._dispatch_info = {"actor": [0]}
        self.policy = policy
        self.optimizer = optimizer
        self.clip_ratio = float(actor_config.clip_ratio)
        self.entropy_coeff = float(actor_config.entropy_coeff)
        self.loss_agg_mode = str(actor_config.loss_agg_mode)
        self.grad_clip = float(actor_config.grad_clip) if actor_config.get("grad_clip") is not None else None
        self.loss_mode = str(actor_config.policy_loss.loss_mode)
        self.rollout_is = rollout_is
        self.optimizer_steps = 0
        """Optimizer steps taken so far."""
        self.trained_keys: list[str] = []
        """TransferQueue keys of every row trained, in order (each update's rows)."""
        self.update_s = 0.0
        """Seconds spent in ``compute_log_prob`` and ``update_actor`` (the toy's "GPU" time)."""

    def _query_dispatch_info(self, role: str) -> list[int]:
        return self._dispatch_info[role]

    def compute_log_prob(self, batch: Any) -> Any:
        """Log-probs and entropy of every position under the current weights, in verl's layout: a
        nested tensor per sequence whose position ``t`` predicts token ``t + 1``."""
        import transfer_queue as tq
        from tensordict import TensorDict

        start = time.perf_counter()
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["input_ids", "response_mask"]
        )
        padded = _padded(data)
        temperature = float(batch.extra_info.get("temperature", 1.0))
        self.policy.eval()
        with torch.no_grad():
            logits = self.policy.response_logits(
                padded["input_ids"], padded["attention_mask"], padded["width"], temperature=temperature
            )
            log_softmax = torch.log_softmax(logits, dim=-1)
            log_probs = log_softmax.gather(-1, padded["responses"].unsqueeze(-1)).squeeze(-1)
            entropy = -(log_softmax.exp() * log_softmax).sum(-1)
        fields = TensorDict(
            {
                "log_probs": _to_sequence_layout(log_probs, padded),
                "entropy": _to_sequence_layout(entropy, padded),
            },
            batch_size=len(batch.keys),
        )
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
        self.update_s += time.perf_counter() - start
        return batch

    def update_actor(self, batch: Any) -> dict[str, Any]:
        """One optimizer step of verl's policy loss per update verl's engine would make of ``batch``."""
        import transfer_queue as tq
        from verl import DataProto

        start = time.perf_counter()
        fields = ["input_ids", "response_mask", "old_log_probs", "advantages"]
        if self.rollout_is:
            fields.append("rollout_is_weights")
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        padded = _padded(data)
        tensors = {
            "input_ids": padded["input_ids"],
            "attention_mask": padded["attention_mask"],
            "responses": padded["responses"],
            "response_mask": padded["response_mask"],
            "old_log_probs": data["old_log_probs"].to_padded_tensor(0.0, output_size=padded["shape"]),
            "advantages": data["advantages"].to_padded_tensor(0.0, output_size=padded["shape"]),
        }
        if self.rollout_is:
            tensors["rollout_is_weights"] = data["rollout_is_weights"].to_padded_tensor(
                0.0, output_size=padded["shape"]
            )
        full = DataProto.from_dict(tensors=tensors)
        full.meta_info["temperature"] = float(batch.extra_info.get("temperature", 1.0))
        metrics: dict[str, list[float]] = {}
        order = _canonical_order(tensors)
        for positions in _verl_updates(batch):
            rows = [order[i] for i in positions]
            part = full.select_idxs(torch.tensor(rows, dtype=torch.long))
            part.meta_info = dict(full.meta_info)
            result = ppo_update(
                self.policy,
                self.optimizer,
                part,
                clip_ratio=self.clip_ratio,
                loss_agg_mode=self.loss_agg_mode,
                entropy_coeff=self.entropy_coeff,
                grad_clip=self.grad_clip,
                loss_mode=self.loss_mode,
            )
            self.optimizer_steps += 1
            self.trained_keys.extend(batch.keys[i] for i in rows)
            for key, value in result.items():
                metrics.setdefault(key.removeprefix("actor/"), []).append(value)
        self.update_s += time.perf_counter() - start
        return {"metrics": {"mfu": [0.0], **metrics}}


def _canonical_order(tensors: dict[str, torch.Tensor]) -> list[int]:
    """The batch's rows in an order of their content (a digest of tokens and advantage), not of
    their position. verl hands the actor a batch in the order its samples finished scoring, which the
    machine's load changes, and its updates split that order into mini-batches: the same samples made
    a different run on a busy machine (a learning test flipped under load). A digest, not the
    tokens themselves, so that an update still mixes prompts as an arrival order does (sorted by
    tokens, each update saw one prompt and the policy oscillated); rows equal in every trained field
    are interchangeable."""
    ids = tensors["input_ids"].tolist()
    advantages = tensors["advantages"][:, 0].tolist()

    def digest(row: int) -> bytes:
        return hashlib.blake2b(repr((ids[row], advantages[row])).encode(), digest_size=8).digest()

    return sorted(range(len(ids)), key=lambda row: (digest(row), ids[row], advantages[row]))


def _padded(data: Any) -> dict[str, Any]:
    """verl's nested sequences as the toy policy's layout: left-padded prompts, right-padded responses."""
    sequences = list(data["input_ids"].unbind())
    response_lengths = data["response_mask"].offsets().diff().tolist()
    prompt_lengths = [len(seq) - r for seq, r in zip(sequences, response_lengths, strict=True)]
    width_p, width_r = max(prompt_lengths), max(response_lengths)
    n = len(sequences)
    ids = torch.zeros((n, width_p + width_r), dtype=torch.long)
    attention = torch.zeros_like(ids)
    response_mask = torch.zeros((n, width_r), dtype=torch.long)
    masks = list(data["response_mask"].unbind())
    for i, (seq, p, r) in enumerate(zip(sequences, prompt_lengths, response_lengths, strict=True)):
        ids[i, width_p - p : width_p] = seq[:p]
        attention[i, width_p - p : width_p] = 1
        ids[i, width_p : width_p + r] = seq[p:]
        attention[i, width_p : width_p + r] = 1
        response_mask[i, :r] = masks[i].long()
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "responses": ids[:, width_p:],
        "response_mask": response_mask,
        "width": width_r,
        "lengths": [(p, r) for p, r in zip(prompt_lengths, response_lengths, strict=True)],
        "shape": (n, width_r),
    }


def _to_sequence_layout(values: torch.Tensor, padded: dict[str, Any]) -> torch.Tensor:
    """``[B, R]`` response values as verl's model output: one nested row per sequence of length
    ``p + r`` whose position ``t`` holds the value predicting token ``t + 1`` (the last is unused)."""
    rows = []
    for i, (p, r) in enumerate(padded["lengths"]):
        row = torch.zeros(p + r, dtype=values.dtype)
        row[p - 1 : p - 1 + r] = values[i, :r]
        rows.append(row)
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


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
