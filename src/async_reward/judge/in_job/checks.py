"""``llm_judge``'s settings when it judges with the model verl serves in the job (router mode).

The whole configuration is verl's keys plus the manager's name::

    reward.reward_manager.name=llm_judge reward.reward_model.enable=true
    reward.reward_model.model_path=<judge> (reward.reward_model.rollout.*, placement keys)

:func:`apply_in_job_judge` refuses what contradicts that (a second judge, a key for a server that
takes none, a model name the replicas do not answer to, a discriminative model) and fills in the
defaults that follow from the served judge, where the user wrote nothing:

* ``retry.max_attempts`` 2 and ``retry.initial_backoff_s`` 1 s: verl's router already makes up to 3
  attempts on one replica (2 s then 4 s apart) for a connection that fails or drops, so ours multiply
  with it; 2 of ours (the second one goes through the router's least-loaded pick again, usually
  another replica) bound a sample at 6 replica attempts instead of 12, and no retry storm hits a
  replica that is restarting;
* ``limits.max_concurrency``: the replicas' capacity split over the reward workers
  (:func:`~async_reward.judge.in_job.settings.judge_capacity`), or all of it with
  ``limits.admission: job`` (one queue for the whole job: no replica slot idles at one worker while
  requests wait at another).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from async_reward._core.config_rules import bad_value, select_key
from async_reward._core.errors import ConfigError
from async_reward._core.start_lines import say_once
from async_reward.config import CONFIG_PATH, AsyncRewardConfig
from async_reward.judge.in_job.context import judge_context
from async_reward.judge.in_job.settings import (
    colocated_judge,
    discriminative_architecture,
    judge_capacity,
    served_model_name,
    was_set,
)

__all__ = [
    "ROUTER_RETRY_ATTEMPTS",
    "ROUTER_RETRY_BACKOFF_S",
    "announce_in_job_judge",
    "apply_in_job_judge",
    "in_job_judge_line",
]

#: ``retry.max_attempts`` in router mode unless set (see the module docstring).
ROUTER_RETRY_ATTEMPTS = 2
#: ``retry.initial_backoff_s`` in router mode unless set.
ROUTER_RETRY_BACKOFF_S = 1.0
_JUDGE = f"{CONFIG_PATH}.judge"


def apply_in_job_judge(config: Any, settings: AsyncRewardConfig) -> AsyncRewardConfig:
    """``settings`` for ``llm_judge`` with ``reward.reward_model.enable``: conflicts refused, the
    served judge's defaults filled in (a new object; ``settings`` is not changed).

    Raises:
        ConfigError: naming the keys and the fix.
    """
    judge = settings.judge
    if judge.base_url:
        raise bad_value(
            f"{_JUDGE}.base_url",
            judge.base_url,
            "names a judge server while reward.reward_model.enable=true serves one in the job: llm_judge "
            "would have two judges",
            f"remove {_JUDGE}.base_url to judge with the model verl serves (reward.reward_model."
            "model_path), or set reward.reward_model.enable=false to judge with your server",
        )
    if judge.api_key_env:
        raise bad_value(
            f"{_JUDGE}.api_key_env",
            judge.api_key_env,
            "names an API key, but the judge verl serves in the job (reward.reward_model.enable=true) "
            "takes none, and the key would be sent to it",
            f"remove {_JUDGE}.api_key_env",
        )
    served = served_model_name(config)
    if served is None:
        raise ConfigError(
            "reward.reward_model.model_path is required with reward.reward_model.enable=true (not set): it "
            "is the judge model verl serves and llm_judge asks; set reward.reward_model.model_path=<judge>",
            key="reward.reward_model.model_path",
            fix="set reward.reward_model.model_path=<judge model>",
        )
    if was_set(config, f"{_JUDGE}.model") and judge.model != served:
        raise bad_value(
            f"{_JUDGE}.model",
            judge.model,
            f"is not the name the served judge answers to ({served!r}, from reward.reward_model."
            "model_path): every request would be refused",
            f"remove {_JUDGE}.model (llm_judge sends the served name), or serve the model you mean",
        )
    architecture = discriminative_architecture(config)
    if architecture is not None:
        raise bad_value(
            "reward.reward_model.model_path",
            select_key(config, "reward.reward_model.model_path"),
            f"is a discriminative reward model ({architecture}): it scores through /classify and cannot "
            "write the verdict llm_judge reads",
            "serve a generative (chat) model as the judge, or keep this one with verl's own manager "
            "(reward.reward_manager.name=naive and no custom_reward_function, verl's /classify path)",
        )
    context = judge_context(config)
    if context is not None and judge.max_tokens >= context.tokens:
        raise bad_value(
            f"{_JUDGE}.max_tokens",
            judge.max_tokens,
            f"leaves no room for a prompt in the served judge's context of {context.tokens} tokens "
            f"({context.source}): the replicas would refuse every request",
            f"set {_JUDGE}.max_tokens well below {context.tokens} (a verdict takes a few dozen tokens), "
            "or raise reward.reward_model.rollout.max_model_len",
        )
    retry = settings.retry
    if not was_set(config, f"{CONFIG_PATH}.retry.max_attempts"):
        retry = replace(retry, max_attempts=ROUTER_RETRY_ATTEMPTS)
    if (
        not was_set(config, f"{CONFIG_PATH}.retry.initial_backoff_s")
        and retry.max_backoff_s >= ROUTER_RETRY_BACKOFF_S
    ):
        retry = replace(retry, initial_backoff_s=max(retry.initial_backoff_s, ROUTER_RETRY_BACKOFF_S))
    limits = settings.limits
    if not (
        was_set(config, f"{CONFIG_PATH}.limits.max_concurrency") or was_set(config, "reward.max_concurrent")
    ):
        capacity = judge_capacity(config)
        limits = replace(limits, max_concurrency=capacity.total if limits.job_wide else capacity.per_worker)
    return replace(settings, judge=replace(judge, model=served), retry=retry, limits=limits)


def in_job_judge_line(config: Any, settings: AsyncRewardConfig) -> str:
    """What ``llm_judge`` does with the judge verl serves, in one line: the served name, the
    placement and when it scores, the capacity and the admission and retries in force (``settings``:
    :func:`apply_in_job_judge`'s)."""
    capacity = judge_capacity(config)
    placement = (
        "colocated on the training GPUs (reward.reward_model.enable_resource_pool=false): woken after "
        "sampling to score each batch, then put back to sleep"
        if colocated_judge(config)
        else "standalone on GPUs of its own (reward.reward_model.enable_resource_pool=true): each "
        "sample scored while its batch still generates"
    )
    limit = settings.limits.max_concurrency
    yours = was_set(config, f"{CONFIG_PATH}.limits.max_concurrency") or was_set(
        config, "reward.max_concurrent"
    )
    if settings.limits.job_wide:
        whose = "yours" if yours else "the replicas' capacity"
        admission = (
            f"{limit} in the whole job, one queue for its {capacity.workers} reward worker(s) "
            f"(limits.admission=job; {whose})"
        )
    else:
        admission = (
            f"{limit} per reward worker (yours)"
            if yours
            else f"{limit} per reward worker (the replicas' share over {capacity.workers} worker(s))"
        )
    context = judge_context(config)
    prompts = (
        f"judge prompts over {context.tokens - settings.judge.max_tokens} tokens (context {context.tokens}, "
        f"{context.source}, less judge.max_tokens {settings.judge.max_tokens}) are invalid, never sent"
        if context is not None
        else "the judge's context is unknown here (no rollout.max_model_len, no local config.json): "
        "a prompt too long for it fails at the replica"
    )
    return (
        "llm_judge scores through the judge verl serves in the job (reward.reward_model.enable=true), "
        f"behind verl's router, as model {settings.judge.model!r}; {placement}; "
        f"{capacity.replicas} replica(s) x {capacity.per_replica} requests at once = {capacity.total}; "
        f"admission {admission}; retry.max_attempts={settings.retry.max_attempts}; {prompts}"
    )


def announce_in_job_judge(config: Any, settings: AsyncRewardConfig) -> None:
    """Print :func:`in_job_judge_line` once per process (the start-up checks run several times in
    verl's task runner): a judge served in the job is visibly on in the job's log."""
    say_once(in_job_judge_line(config, settings))
