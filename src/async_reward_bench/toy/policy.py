"""A tiny autoregressive policy that learns on CPU, and one PPO step with verl's own policy loss.

``TinyPolicy`` is an embedding, a one-layer GRU and a linear head over a small vocabulary. The GRU
runs one position at a time and keeps its state through padding (``attention_mask`` 0), so a
left-padded prompt gives exactly the log-probs of the unpadded one and a right-padded response's
padding changes nothing before it. Sequences here are a handful of tokens, so the Python loop over
positions costs less than packing would.

Batches follow verl's layout: ``input_ids`` = left-padded prompt + right-padded response,
``attention_mask`` over both, ``responses`` the response part; log-probs are ``[B, response_length]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from verl import DataProto

__all__ = ["TinyPolicy", "compute_log_probs", "ppo_update", "response_mask_of"]


class TinyPolicy(nn.Module):
    """A tiny autoregressive policy: embedding + GRU (hidden ``hidden_size``) + linear head.

    Args:
        vocab_size: number of token ids (the tokenizer's ``len(tokenizer)``).
        hidden_size: embedding and GRU width.
        seed: seeds the parameter initialisation only (the global RNG is left untouched), so two
            policies built with the same arguments are identical.
    """

    def __init__(self, vocab_size: int, hidden_size: int = 64, seed: int = 0) -> None:
        super().__init__()
        if vocab_size < 2 or hidden_size < 1:
            raise ValueError(f"need vocab_size >= 2 and hidden_size >= 1, got {vocab_size}, {hidden_size}")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = nn.Embedding(vocab_size, hidden_size)
            self.cell = nn.GRUCell(hidden_size, hidden_size)
            self.head = nn.Linear(hidden_size, vocab_size)
        self.initial_state = nn.Parameter(torch.zeros(hidden_size))

    # -- internals --------------------------------------------------------------------------------

    def _start(self, batch_size: int) -> Tensor:
        return self.initial_state.unsqueeze(0).expand(batch_size, -1)

    def _advance(self, state: Tensor, token: Tensor, mask: Tensor) -> Tensor:
        """The state after ``token``; unchanged where ``mask`` is 0 (padding)."""
        new = self.cell(self.embed(token), state)
        return torch.where(mask.bool().unsqueeze(-1), new, state)

    def _logits(self, state: Tensor, temperature: float) -> Tensor:
        logits = self.head(state).float()
        return logits / temperature if temperature > 0 else logits

    # -- public -----------------------------------------------------------------------------------

    def response_logits(
        self, input_ids: Tensor, attention_mask: Tensor, response_length: int, temperature: float = 1.0
    ) -> Tensor:
        """Temperature-scaled logits predicting each of the last ``response_length`` tokens.

        ``[B, response_length, vocab_size]`` float32; see :meth:`token_log_probs` for the layout.
        """
        batch, length = input_ids.shape
        if not 0 < response_length < length:
            raise ValueError(f"response_length must be in (0, {length}), got {response_length}")
        state = self._start(batch)
        start = length - response_length
        out: list[Tensor] = []
        for t in range(length):
            if t >= start:
                out.append(self._logits(state, temperature))  # the state after tokens < t predicts t
            if t < length - 1:
                state = self._advance(state, input_ids[:, t], attention_mask[:, t])
        return torch.stack(out, dim=1)

    def token_log_probs(
        self, input_ids: Tensor, attention_mask: Tensor, response_length: int, temperature: float = 1.0
    ) -> Tensor:
        """log p(token_t | tokens_<t) of the last ``response_length`` positions of ``input_ids``.

        ``input_ids`` is ``[B, prompt + response]`` with prompts left-padded and responses
        right-padded (verl's layout); masked positions do not move the state. Logits are divided by
        ``temperature`` as verl's actor does (``temperature <= 0`` means no scaling). Returns
        ``[B, response_length]`` float32, differentiable; padded response positions carry the
        log-prob of the pad token and must be masked by the caller (``response_mask``).
        """
        logits = self.response_logits(input_ids, attention_mask, response_length, temperature)
        targets = input_ids[:, -response_length:].unsqueeze(-1)
        return torch.log_softmax(logits, dim=-1).gather(-1, targets).squeeze(-1)

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        max_new_tokens: int,
        *,
        eos_token_id: int,
        pad_token_id: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Sample a response per (left-padded) prompt.

        ``temperature <= 0`` decodes greedily. Sampling draws from ``generator`` (the global RNG if
        None), so a seeded generator gives the same responses every time. Returns ``response_ids``
        ``[B, max_new_tokens]`` (pad after the eos) and ``response_mask`` (1 up to and including the
        eos, 1 everywhere for a response cut at ``max_new_tokens``), both int64.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        batch, length = prompt_ids.shape
        state = self._start(batch)
        for t in range(length):
            state = self._advance(state, prompt_ids[:, t], prompt_mask[:, t])
        ids = torch.full((batch, max_new_tokens), pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch, max_new_tokens), dtype=torch.long)
        alive = torch.ones(batch, dtype=torch.bool)
        for t in range(max_new_tokens):
            logits = self._logits(state, temperature)
            if temperature > 0:
                token = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(-1)
            else:
                token = logits.argmax(dim=-1)
            ids[:, t] = torch.where(alive, token, torch.full_like(token, pad_token_id))
            mask[:, t] = alive.long()
            alive = alive & (token != eos_token_id)
            if not bool(alive.any()):
                break
            state = self._advance(state, token, alive.long())
        return ids, mask


def response_mask_of(batch: DataProto) -> Tensor:
    """The batch's ``response_mask``, or the response part of ``attention_mask`` (verl's fallback)."""
    if "response_mask" in batch.batch:
        return batch.batch["response_mask"]
    width = batch.batch["responses"].shape[1]
    return batch.batch["attention_mask"][:, -width:]


def _temperature(batch: DataProto) -> float:
    return float(batch.meta_info.get("temperature", 1.0))


@torch.no_grad()
def compute_log_probs(policy: TinyPolicy, batch: DataProto) -> Tensor:
    """The policy's log-probs of the batch's responses (the "prepare" stage's ``old_log_probs``).

    Uses ``batch.meta_info["temperature"]`` (default 1.0), as verl's actor does. ``[B, R]`` float32.
    """
    width = batch.batch["responses"].shape[1]
    return policy.token_log_probs(
        batch.batch["input_ids"], batch.batch["attention_mask"], width, temperature=_temperature(batch)
    )


_LOSS_CONFIGS: dict[tuple[float, str], Any] = {}


def _actor_config(clip_ratio: float, loss_agg_mode: str) -> Any:
    """verl's ``ActorConfig``, which its registered policy losses read the clip range from."""
    key = (clip_ratio, loss_agg_mode)
    if key not in _LOSS_CONFIGS:
        from verl.workers.config.actor import ActorConfig

        _LOSS_CONFIGS[key] = ActorConfig(
            strategy="fsdp",
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=1,
            clip_ratio=clip_ratio,
            clip_ratio_low=clip_ratio,
            clip_ratio_high=clip_ratio,
            loss_agg_mode=loss_agg_mode,
            use_torch_compile=False,
        )
    return _LOSS_CONFIGS[key]


def ppo_update(
    policy: TinyPolicy,
    optimizer: torch.optim.Optimizer,
    batch: DataProto,
    *,
    clip_ratio: float = 0.2,
    loss_agg_mode: str = "token-mean",
    entropy_coeff: float = 0.0,
    grad_clip: float | None = 1.0,
    loss_mode: str = "vanilla",
) -> dict[str, float]:
    """One optimizer step of the clipped PPO objective on a (mini-)batch.

    The policy-gradient loss is verl's registered policy loss (``get_policy_loss_fn(loss_mode)``;
    ``vanilla`` is clipped PPO with dual clip, ``verl.trainer.ppo.core_algos``), fed the batch's
    ``old_log_probs``, ``advantages`` and ``response_mask`` (or the response part of
    ``attention_mask``), and ``rollout_is_weights`` when the batch has them (verl's rollout
    correction of off-policy samples). As in verl's actor, ``entropy_coeff * entropy`` (aggregated
    with ``agg_loss``) is subtracted from it, and gradients are clipped to ``grad_clip`` in norm
    (verl's default 1.0; None disables).

    Returns verl-named metrics: ``actor/pg_loss`` (the policy-gradient loss), ``actor/entropy``,
    ``actor/pg_clipfrac``, ``actor/ppo_kl`` (approximate KL of the old from the current policy),
    ``actor/pg_clipfrac_lower`` and ``actor/grad_norm``.
    """
    from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn
    from verl.utils.torch_functional import entropy_from_logits

    loss_fn = get_policy_loss_fn(loss_mode)
    config = _actor_config(clip_ratio, loss_agg_mode)
    keys = set(batch.batch.keys())
    mask = response_mask_of(batch).float()
    responses = batch.batch["responses"]
    width = responses.shape[1]
    policy.train()
    logits = policy.response_logits(
        batch.batch["input_ids"], batch.batch["attention_mask"], width, temperature=_temperature(batch)
    )
    log_prob = torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    pg_loss, metrics = loss_fn(
        old_log_prob=batch.batch["old_log_probs"].float(),
        log_prob=log_prob,
        advantages=batch.batch["advantages"].float(),
        response_mask=mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=batch.batch["rollout_is_weights"] if "rollout_is_weights" in keys else None,
    )
    entropy = agg_loss(loss_mat=entropy_from_logits(logits), loss_mask=mask, loss_agg_mode=loss_agg_mode)
    loss = pg_loss - entropy_coeff * entropy if entropy_coeff else pg_loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grads = [p.grad for p in policy.parameters() if p.grad is not None]
    if grad_clip is not None:
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip)
    else:
        grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    optimizer.step()
    result = {key: float(value) for key, value in metrics.items()}
    result["actor/pg_loss"] = float(pg_loss.detach())
    result["actor/entropy"] = float(entropy.detach())
    result["actor/grad_norm"] = float(grad_norm)
    return result
