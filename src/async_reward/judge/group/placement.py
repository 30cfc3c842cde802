"""Where group judging (``judge.mode: group``) can run: the group size verl generates, whether the
judge's reply and (with the judge verl serves in the job) its prompt have room, and whether a group's
members all reach one reward worker's manager, checked at start-up (on the driver, through
``llm_judge``'s ``check_settings``, and in every worker).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from async_reward._core.config_rules import select_key
from async_reward._core.errors import ConfigError
from async_reward.config import CONFIG_PATH, load_config
from async_reward.judge.group.judging import GROUP_LIMIT

__all__ = [
    "GROUP_PROMPT_TOKENS",
    "PROMPT_TOKENS_PER_MEMBER",
    "TOKENS_PER_MEMBER",
    "group_size",
    "whole_groups",
]


def group_size(config: Any) -> int:
    """The size of a GRPO group, ``actor_rollout_ref.rollout.n``, checked for group judging, and
    where the job's groups reach the reward workers (:func:`_check_placement`).

    Raises:
        ConfigError: no ``actor_rollout_ref`` (offline scoring), n under 2 (a group of one has nothing
            to compare: judge it pointwise), over :data:`GROUP_LIMIT`, a ``judge.max_tokens`` under
            :data:`TOKENS_PER_MEMBER` a member, a served judge whose context cannot hold a group of
            full-length responses (:func:`_check_prompt_room`), validation (``val_kwargs.n``) with
            groups of another size, or a job whose groups would not meet in one worker.
    """
    rollout = _node(_node(config, "actor_rollout_ref"), "rollout")
    key = "actor_rollout_ref.rollout.n"
    if rollout is None:
        raise ConfigError(
            "judge.mode=group needs the group size verl generates (actor_rollout_ref.rollout.n), and "
            "this config trains nothing (offline scoring has no GRPO groups)",
            key="reward.async_reward.judge.mode",
            fix="use judge.mode=pointwise",
        )
    n = rollout.get("n", 1)
    if not isinstance(n, int) or n < 2:
        raise ConfigError(
            f"{key}={n!r} with judge.mode=group: a group of one has no group mates to be judged with",
            key=key,
            fix="set reward.async_reward.judge.mode=pointwise (one call a response), or n >= 2",
        )
    if n > GROUP_LIMIT:
        raise ConfigError(
            f"{key}={n} with judge.mode=group: at most {GROUP_LIMIT} responses are judged in one call "
            "(no tournament of several calls is implemented)",
            key=key,
            fix=f"use n <= {GROUP_LIMIT}, or reward.async_reward.judge.mode=pointwise",
        )
    _check_reply_room(config, n)
    _check_prompt_room(config, n)
    val_n = _node(rollout, "val_kwargs")
    val_size = val_n.get("n", 1) if val_n is not None else 1
    if _validates(config) and val_size != n:
        raise ConfigError(
            f"actor_rollout_ref.rollout.val_kwargs.n={val_size!r} while rollout.n={n} with "
            "judge.mode=group: the reward worker knows one group size, and validation groups of "
            "another size would never complete",
            key="actor_rollout_ref.rollout.val_kwargs.n",
            fix=f"set it to {n}, turn validation off (trainer.test_freq=-1, trainer.val_before_train="
            "false), or use judge.mode=pointwise",
        )
    _check_placement(config, n)
    return n


#: Completion tokens a group reply needs per member: its ``R<k>: [[n]] <one-sentence reason>`` line
#: (20 to 35 tokens with tokenizers that split digits, as Llama's and Qwen's do) and a little thought.
TOKENS_PER_MEMBER = 64


def _check_reply_room(config: Any, n: int) -> None:
    """Refuse a ``judge.max_tokens`` that cannot hold a line per member: a reply cut at max_tokens is
    never read, so every group would fail (at the default 512, 16 members' lines alone fill it)."""
    max_tokens = load_config(config).judge.max_tokens
    needed = n * TOKENS_PER_MEMBER
    if max_tokens < needed:
        key = f"{CONFIG_PATH}.judge.max_tokens"
        raise ConfigError(
            f"{key}={max_tokens} with judge.mode=group and groups of {n}: the reply must end with a "
            f"line per member (R<k>: [[n]] and a reason) after any thinking, {TOKENS_PER_MEMBER} tokens "
            f"a member ({needed} for {n}), and a reply cut at max_tokens fails the whole group",
            key=key,
            fix=f"set {key} to at least {needed}",
        )


#: A rough allowance, in judge tokens, for the group prompt around its responses: the system prompt,
#: the instructions, the question's and reference's tags and the chat template (about 350 tokens with
#: empty responses), and per member its label, tags and the line it asks for (about 16). The question
#: and reference themselves are not counted: a call too long for them is refused as it is built.
GROUP_PROMPT_TOKENS = 512
PROMPT_TOKENS_PER_MEMBER = 32


def _check_prompt_room(config: Any, n: int) -> None:
    """Refuse a judge verl serves in the job whose context cannot hold a group's prompt of
    full-length responses and the reply: such a call cannot be sent (``llm_judge`` counts each
    prompt against the context), so every member of a group whose responses run to
    ``response_length`` (GRPO truncates some in most steps) would be ``invalid``. Skipped where the
    context is not known here (an external judge; no ``max_model_len`` and no local
    ``config.json``): each call is then counted as it is built, or refused by the server. The
    lengths are the policy's tokens, the context the judge's: a rough check, not a count."""
    from async_reward.judge.in_job.context import judge_context
    from async_reward.judge.in_job.settings import in_job_judge

    context = judge_context(config) if in_job_judge(config) else None
    if context is None:
        return
    length_key = "actor_rollout_ref.rollout.response_length"
    response_length = select_key(config, length_key)
    if response_length is None:
        length_key = "data.max_response_length"
        response_length = select_key(config, length_key)
    if isinstance(response_length, bool) or not isinstance(response_length, int):
        return
    max_tokens = load_config(config).judge.max_tokens
    needed = n * (response_length + PROMPT_TOKENS_PER_MEMBER) + GROUP_PROMPT_TOKENS + max_tokens
    if needed <= context.tokens:
        return
    window = "reward.reward_model.rollout.max_model_len"
    raise_it = (
        f"raise {window} to at least {needed}, "
        if context.source == "rollout.max_model_len"
        else f"serve a judge with a context of at least {needed} tokens, "
    )
    raise ConfigError(
        f"judge.mode=group with groups of {n}: one call's prompt holds {n} responses of up to "
        f"{length_key}={response_length} tokens (about {PROMPT_TOKENS_PER_MEMBER} more each, and "
        f"{GROUP_PROMPT_TOKENS} for the instructions), and {CONFIG_PATH}.judge.max_tokens={max_tokens} "
        f"for the reply: {needed} tokens, over the served judge's context of {context.tokens} "
        f"({context.source}): a group whose responses run that long cannot be judged, every member invalid",
        key=window if context.source == "rollout.max_model_len" else "actor_rollout_ref.rollout.n",
        fix=f"{raise_it}or lower actor_rollout_ref.rollout.n, {length_key} or judge.max_tokens, or "
        "use judge.mode=pointwise (one response a call)",
    )


class _Dealing(threading.local):
    depth = 0


_dealt = _Dealing()


@contextlib.contextmanager
def whole_groups() -> Iterator[None]:
    """Mark the managers checked or built inside this block as driven by our pipelined manager,
    which deals whole groups to each of its workers (``pipeline.chunks.split_groups``): however
    many workers, a group's members meet in one."""
    _dealt.depth += 1
    try:
        yield
    finally:
        _dealt.depth -= 1


def _validates(config: Any) -> bool:
    """Whether verl runs validation (before training, or every ``test_freq`` steps)."""
    return (
        bool(select_key(config, "trainer.val_before_train"))
        or (select_key(config, "trainer.test_freq") or -1) > 0
    )


def _check_placement(config: Any, n: int) -> None:
    """Refuse a job where a group's members would not all reach one reward worker.

    * our pipelined trainer and manager deal whole groups to each worker
      (``pipeline.chunks.split_groups``; the manager checks and builds inside :func:`whole_groups`);
    * one reward worker (``reward.num_workers: 1``) gets every sample;
    * verl's v1 trainer with our agent loop routes each session by its ``uid``;
    * a judge colocated on the training GPUs is scored by verl's ``RewardLoopManager``, which cuts
      the batch into one contiguous chunk per worker: whole groups only when ``data.train_batch_size``
      is a multiple of ``reward.num_workers``, nothing reorders the batch first (the legacy
      trainer's ``balance_batch``), and no validation batch (of any size) is scored;
    * verl's own agent loop sends each sample to a reward worker drawn at random: refused.
    """
    from async_reward.config.v1 import PIPELINED_TRAINER_KEY, v1_integration_problem
    from async_reward.judge.in_job.settings import colocated_judge

    workers = select_key(config, "reward.num_workers") or 1
    if select_key(config, PIPELINED_TRAINER_KEY) is not None or workers == 1 or _dealt.depth > 0:
        return
    fix_one = "set reward.num_workers=1"
    if colocated_judge(config):
        batch = select_key(config, "data.train_batch_size")
        if isinstance(batch, int) and batch % workers:
            raise ConfigError(
                f"data.train_batch_size={batch} is not a multiple of reward.num_workers={workers}: verl's "
                "RewardLoopManager cuts the batch into one contiguous chunk per reward worker, which "
                f"would split groups of {n} that judge.mode=group judges in one call",
                key="data.train_batch_size",
                fix=f"make it a multiple of {workers}, or {fix_one}",
            )
        if not select_key(config, "trainer.use_v1") and select_key(config, "trainer.balance_batch"):
            raise ConfigError(
                "trainer.balance_batch=true reorders the batch before verl's RewardLoopManager cuts it "
                "into one chunk per reward worker: groups judged in one call (judge.mode=group) would split",
                key="trainer.balance_batch",
                fix=f"set it to false, or {fix_one}",
            )
        if _validates(config):
            raise ConfigError(
                f"reward.num_workers={workers} with judge.mode=group and validation: verl's "
                "RewardLoopManager pads and cuts each validation batch (of any size) into one chunk "
                "per reward worker, which splits groups",
                key="reward.num_workers",
                fix=f"{fix_one}, or turn validation off (trainer.test_freq=-1, val_before_train=false)",
            )
        return
    if select_key(config, "trainer.use_v1") and v1_integration_problem(config) is None:
        return
    raise ConfigError(
        f"reward.num_workers={workers} with judge.mode=group: verl's agent loop sends each sample to "
        "a reward worker drawn at random, so a group's members would not meet in one worker",
        key="reward.num_workers",
        fix=f"{fix_one}, or train with verl's v1 trainer and async-reward's agent loop "
        "(async_reward.v1.prepare_v1_config), which routes a group's members to one reward worker, or "
        "with async-reward's pipelined trainer",
    )


def _node(config: Any, key: str) -> Any:
    return config.get(key) if hasattr(config, "get") else None
