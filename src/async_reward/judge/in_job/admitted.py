"""What the configured reward manager admits, read from the verl config as the manager reads it.

A reward manager's concurrency is not the raw key ``limits.max_concurrency``: verl's
``reward.max_concurrent`` sets it too (``async_reward.config.verl_keys``), and ``llm_judge`` on the judge
verl serves in the job defaults it to the replicas' capacity (:func:`~async_reward.judge.in_job.
checks.apply_in_job_judge`). Code that sizes something after the manager (the decoupled trainer's
reward backlog and its wait for a slow group) reads :func:`manager_admission`, which derives the
settings with the functions the manager itself runs, so the two can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from async_reward.config import AsyncRewardConfig, load_config
from async_reward.judge.in_job.checks import apply_in_job_judge
from async_reward.judge.in_job.router_calls import router_wait_limit_s
from async_reward.judge.in_job.settings import in_job_judge, reward_worker_processes

__all__ = ["ManagerAdmission", "manager_admission"]


@dataclass(frozen=True)
class ManagerAdmission:
    """The configured manager's settings, and what follows from them for the whole job."""

    settings: AsyncRewardConfig
    """The settings the manager scores with (``load_config``, then the served judge's defaults)."""
    routed: bool
    """Whether it judges through verl's router (``llm_judge`` with ``reward.reward_model.enable``),
    where a request past ``timeout_s`` is waited for (:mod:`~async_reward.judge.in_job.router_calls`)."""
    processes: int
    """Reward worker processes verl starts (``reward.num_workers``)."""

    @property
    def calls_in_flight(self) -> int:
        """The most calls the job's managers admit at once: ``limits.max_concurrency`` per process,
        or for the whole job with ``limits.admission: job``."""
        limits = self.settings.limits
        return limits.max_concurrency * limits.sharing_workers(self.processes)

    @property
    def attempt_limit_s(self) -> float:
        """The longest one attempt holds its slot: ``timeout_s``, or through verl's router the wait
        for a timed-out request to leave its replica (:func:`router_wait_limit_s`)."""
        return router_wait_limit_s(self.settings) if self.routed else self.settings.timeout_s

    @property
    def longest_scoring_s(self) -> float:
        """The longest one sample's scoring takes once called: the calls in service ahead of it
        (``admission_timeout_s`` when set, else one attempt), then its attempts and backoffs; a
        timed-out attempt through the router is its last (not retried)."""
        settings = self.settings
        retry = settings.retry
        ahead = settings.admission_timeout_s or self.attempt_limit_s
        retried = max(0, retry.max_attempts - 1) * (settings.timeout_s + retry.max_backoff_s)
        return ahead + retried + self.attempt_limit_s


def manager_admission(verl_config: Any) -> ManagerAdmission:
    """:class:`ManagerAdmission` of the manager ``verl_config`` configures.

    Raises:
        ConfigError: a ``reward.async_reward`` value, a verl reward key or a served-judge setting the
            manager would refuse, naming the key.
    """
    settings = load_config(verl_config)
    routed = in_job_judge(verl_config) and _scores_with_reward_model(verl_config)
    if routed:
        settings = apply_in_job_judge(verl_config, settings)
    return ManagerAdmission(settings, routed, reward_worker_processes(verl_config))


def _scores_with_reward_model(verl_config: Any) -> bool:
    """Whether the configured manager judges with the served model itself (``llm_judge``, and any
    manager declaring ``scores_with_reward_model``); False when verl cannot resolve its name (the
    start-up checks refuse that, naming the key)."""
    from verl.trainer.ppo.reward import resolve_reward_manager_cls

    try:
        manager_cls = resolve_reward_manager_cls(verl_config)
    except Exception:
        return False
    return bool(getattr(manager_cls, "scores_with_reward_model", False))
