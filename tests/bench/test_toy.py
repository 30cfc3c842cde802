"""The toy learner: TinyPolicy's log-probs, generation and PPO step, the char tokenizer, GRPO learning
through the real schedule (the parity benchmark end to end, on the legacy trainer's manager:
tests/legacy/test_toy_parity.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from async_reward.training.schedule import StepSchedule
from async_reward_bench.toy.backend import LocalRewards, ToyBackend, evaluate_accuracy, expected_score
from async_reward_bench.toy.policy import TinyPolicy, compute_log_probs, ppo_update
from async_reward_bench.toy.task import (
    ArithmeticTask,
    PromptSampler,
    build_char_tokenizer,
    decode_responses,
    encode_prompts,
    exact_match,
)

PAD, EOS = 0, 1


@pytest.fixture(scope="module")
def char_tokenizer() -> Any:
    return build_char_tokenizer()


def _manual_log_probs(policy: TinyPolicy, tokens: list[int], response_length: int) -> torch.Tensor:
    """Step the GRU by hand over the unpadded sequence."""
    state = policy.initial_state.unsqueeze(0)
    out = []
    for t, token in enumerate(tokens):
        if t >= len(tokens) - response_length:
            out.append(torch.log_softmax(policy.head(state), dim=-1)[0, token])
        state = policy.cell(policy.embed(torch.tensor([token])), state)
    return torch.stack(out)


def test_token_log_probs_match_manual_computation_and_are_differentiable() -> None:
    policy = TinyPolicy(vocab_size=14, hidden_size=16, seed=3)
    prompt, response = [5, 12, 7, 13], [9, EOS]
    # Row 0: left-padded prompt, full response; row 1: unpadded prompt, response right-padded.
    input_ids = torch.tensor([[PAD, PAD, *prompt, *response, PAD], [*prompt, *prompt[:2], 9, PAD, PAD]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1, 0, 0]])
    log_probs = policy.token_log_probs(input_ids, mask, response_length=3)
    assert log_probs.shape == (2, 3) and log_probs.dtype == torch.float32
    expected = _manual_log_probs(policy, [*prompt, *response], 2)
    torch.testing.assert_close(log_probs[0, :2], expected)
    expected = _manual_log_probs(policy, [*prompt, *prompt[:2], 9], 1)
    torch.testing.assert_close(log_probs[1, :1], expected)
    # Temperature divides the logits, as verl's actor does.
    hot = policy.token_log_probs(input_ids, mask, 3, temperature=2.0)
    state = policy.initial_state.unsqueeze(0)
    for token in prompt:
        state = policy.cell(policy.embed(torch.tensor([token])), state)
    torch.testing.assert_close(hot[0, 0], torch.log_softmax(policy.head(state) / 2.0, dim=-1)[0, 9])
    # Deterministic, and gradients reach every parameter.
    torch.testing.assert_close(policy.token_log_probs(input_ids, mask, 3), log_probs)
    (log_probs * torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])).sum().backward()
    for name, parameter in policy.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_same_seed_same_policy_and_global_rng_untouched() -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = TinyPolicy(14, seed=7), TinyPolicy(14, seed=7)
    assert torch.rand(1) == before
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert not torch.equal(TinyPolicy(14, seed=8).head.weight, a.head.weight)


def test_generate_respects_eos_pad_and_mask() -> None:
    policy = TinyPolicy(vocab_size=14, hidden_size=16, seed=0)
    prompts = torch.tensor([[PAD, 5, 12, 7, 13], [4, 12, 4, 13, 13]] * 32)
    prompt_mask = (prompts != PAD).long()
    ids, mask = policy.generate(
        prompts,
        prompt_mask,
        6,
        eos_token_id=EOS,
        pad_token_id=PAD,
        generator=torch.Generator().manual_seed(1),
    )
    assert ids.shape == mask.shape == (64, 6)
    saw_eos = saw_cut = False
    for row, row_mask in zip(ids.tolist(), mask.tolist(), strict=True):
        if EOS in row:
            end = row.index(EOS) + 1
            saw_eos = True
            assert row_mask == [1] * end + [0] * (6 - end)
            assert row[end:] == [PAD] * (6 - end)
        else:
            saw_cut = True
            assert row_mask == [1] * 6
    assert saw_eos and saw_cut
    again = policy.generate(
        prompts,
        prompt_mask,
        6,
        eos_token_id=EOS,
        pad_token_id=PAD,
        generator=torch.Generator().manual_seed(1),
    )
    assert torch.equal(again[0], ids) and torch.equal(again[1], mask)
    # A policy that always says eos stops at once; greedy decoding with temperature 0.
    with torch.no_grad():
        policy.head.bias.fill_(-50.0)
        policy.head.bias[EOS] = 50.0
    ids, mask = policy.generate(
        prompts[:2], prompt_mask[:2], 3, eos_token_id=EOS, pad_token_id=PAD, temperature=0
    )
    assert ids.tolist() == [[EOS, PAD, PAD]] * 2 and mask.tolist() == [[1, 0, 0]] * 2


def _rollout(tokenizer: Any, policy: TinyPolicy, step: int = 0) -> Any:
    task = ArithmeticTask(max_operand=4)
    sampler = PromptSampler(task, tokenizer, prompts=8, group_size=4, seed=0)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    return ToyBackend(policy, optimizer, sampler, tokenizer, seed=0).rollout(step)


def test_ppo_update_uses_verl_loss_changes_parameters_and_lowers_the_loss(char_tokenizer: Any) -> None:
    policy = TinyPolicy(len(char_tokenizer), seed=0)
    batch = _rollout(char_tokenizer, policy)
    batch.batch["old_log_probs"] = compute_log_probs(policy, batch)
    torch.testing.assert_close(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"])
    advantages = torch.randn(len(batch), generator=torch.Generator().manual_seed(0))
    batch.batch["advantages"] = advantages.unsqueeze(-1) * batch.batch["response_mask"]
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in policy.parameters()]
    losses = [ppo_update(policy, optimizer, batch)["actor/pg_loss"] for _ in range(5)]
    metrics = ppo_update(policy, optimizer, batch)
    assert any(not torch.equal(b, p) for b, p in zip(before, policy.parameters(), strict=True))
    assert losses[-1] < losses[0]
    assert {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/grad_norm", "actor/entropy"} <= set(
        metrics
    )
    assert metrics["actor/ppo_kl"] != 0.0  # the policy moved away from old_log_probs


def test_char_tokenizer_round_trips_answers_exactly(char_tokenizer: Any, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    build_char_tokenizer(tmp_path)
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))  # how verl's reward workers load it
    assert (loaded.pad_token_id, loaded.eos_token_id) == (PAD, EOS)
    for tokenizer in (char_tokenizer, loaded):
        for answer in range(19):
            ids = tokenizer(str(answer), add_special_tokens=False)["input_ids"]
            assert len(ids) == len(str(answer))
            assert tokenizer.decode([*ids, EOS, PAD, PAD], skip_special_tokens=True) == str(answer)
        prompt = tokenizer("7+8=", add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(prompt, skip_special_tokens=True) == "7+8="
    assert exact_match("15", "15") and not exact_match("1", "15") and not exact_match("", "0")
    batch = encode_prompts(ArithmeticTask(), char_tokenizer, [(7, 8), (0, 0)])
    assert [r["ground_truth"] for r in batch.non_tensor_batch["reward_model"]] == ["15", "0"]
    responses = torch.tensor([[4, 7, EOS], [2, EOS, PAD]])  # "25", "0"
    assert decode_responses(char_tokenizer, responses, (responses != PAD).long()) == ["25", "0"]


def test_prompt_batches_are_verl_shaped_grpo_groups(char_tokenizer: Any) -> None:
    sampler = PromptSampler(ArithmeticTask(), char_tokenizer, prompts=3, group_size=4, seed=5)
    batch = sampler.make(2)
    assert len(batch) == 12 and batch.batch["input_ids"].shape == (12, 4)
    uids = batch.non_tensor_batch["uid"]
    assert len(set(uids)) == 3 and all(uids[i] == uids[i - i % 4] for i in range(12))
    assert set(batch.non_tensor_batch) == {"data_source", "reward_model", "uid", "extra_info"}
    assert sampler.make(2).non_tensor_batch["uid"].tolist() == uids.tolist()  # reproducible


def test_local_rewards_give_complete_groups_in_chunks(char_tokenizer: Any) -> None:
    batch = _rollout(char_tokenizer, TinyPolicy(len(char_tokenizer), seed=1))
    rewards = LocalRewards(char_tokenizer)
    ticket = rewards.submit(batch)
    first = rewards.get_chunk(ticket, 10)
    rest = rewards.get_chunk(ticket, 100)
    assert len(first.indices) == 12 and len(rest.indices) == 20  # whole groups of 4
    assert sorted([*first.indices, *rest.indices]) == list(range(32))
    scores = first.rm_scores.sum(dim=-1)
    assert set(scores.tolist()) <= {0.0, 1.0}
    np.testing.assert_array_equal(scores.numpy(), first.reward_extra_info["acc"])


@pytest.mark.parametrize(("max_operand", "temperature"), [(1, 1.0), (2, 0.7)])
def test_expected_score_is_the_probability_that_a_sampled_response_is_right(
    char_tokenizer: Any, max_operand: int, temperature: float
) -> None:
    """The exact enumeration against 3,000 sampled responses a problem of the same policy: within
    5 standard errors, and on a policy pushed towards the right answers as well as an untrained one
    (so a rule that only counts the first token, or drops cut responses, would be caught where it
    matters)."""
    task = ArithmeticTask(max_operand=max_operand)
    policy = TinyPolicy(len(char_tokenizer), 8, seed=max_operand)
    trained = TinyPolicy(len(char_tokenizer), 8, seed=max_operand)
    with torch.no_grad():  # bias the head towards digits and <eos>: a mix of right, wrong and cut replies
        trained.head.bias[2:12] += 2.0
        trained.head.bias[EOS] += 1.0
    for candidate in (policy, trained):
        exact = expected_score(candidate, task, char_tokenizer, temperature=temperature)
        batch = encode_prompts(task, char_tokenizer, task.problems * 3_000)
        generator = torch.Generator().manual_seed(7)
        responses, mask = candidate.generate(
            batch.batch["input_ids"],
            batch.batch["attention_mask"],
            task.max_response_tokens,
            eos_token_id=EOS,
            pad_token_id=PAD,
            temperature=temperature,
            generator=generator,
        )
        texts = decode_responses(char_tokenizer, responses, mask)
        truths = [item["ground_truth"] for item in batch.non_tensor_batch["reward_model"]]
        sampled = float(np.mean([exact_match(t, g) for t, g in zip(texts, truths, strict=True)]))
        error = (max(exact * (1 - exact), 1e-4) / len(texts)) ** 0.5
        assert abs(exact - sampled) <= 5 * error, (exact, sampled)
        assert 0.0 < exact < 1.0


def test_expected_score_refuses_what_it_cannot_enumerate(char_tokenizer: Any) -> None:
    policy = TinyPolicy(len(char_tokenizer), 8, seed=0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        expected_score(policy, ArithmeticTask(max_operand=1), char_tokenizer, temperature=0.0)


@pytest.mark.slow
def test_the_toy_learns_with_grpo_through_the_schedule(char_tokenizer: Any) -> None:
    """30 GRPO steps with a local exact-match reward: accuracy +0.68 or more on seeds 0-5 (checked
    when the margin was chosen), so +0.4 leaves room."""
    torch.manual_seed(0)
    task = ArithmeticTask(max_operand=4)
    policy = TinyPolicy(len(char_tokenizer), seed=0)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    sampler = PromptSampler(task, char_tokenizer, prompts=16, group_size=16, seed=0)
    backend = ToyBackend(policy, optimizer, sampler, char_tokenizer, entropy_coeff=0.1, seed=0)
    untrained = evaluate_accuracy(policy, task, char_tokenizer)
    records = StepSchedule(backend, LocalRewards(char_tokenizer), "baseline", 4, keep_batches=False).run(30)
    trained = evaluate_accuracy(policy, task, char_tokenizer)
    assert trained >= untrained + 0.4, (untrained, trained)
    assert backend.optimizer_steps == 120 and backend.policy_version == 30
    assert records[-1].metrics["critic/score/mean"] > records[0].metrics["critic/score/mean"]


def test_one_step_off_batches_record_their_policy_version(char_tokenizer: Any) -> None:
    task = ArithmeticTask(max_operand=4)
    policy = TinyPolicy(len(char_tokenizer), seed=0)
    sampler = PromptSampler(task, char_tokenizer, prompts=4, group_size=4, seed=0)
    backend = ToyBackend(
        policy, torch.optim.Adam(policy.parameters()), sampler, char_tokenizer, rollout_is_threshold=2.0
    )
    records = StepSchedule(backend, LocalRewards(char_tokenizer), "both", 2).run(3)
    assert [r.policy_version for r in records] == [0, 0, 1]
    assert [r.batch.meta_info["policy_version"] for r in records] == [0, 0, 1]
    assert "rollout_is_weights" in records[1].batch.batch
