"""``reward.async_reward.limits``: admission of outbound calls (concurrency, request and token
budgets, worker or job scope)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from async_reward._core.config_rules import (
    at_least,
    bad_value,
    greater_than,
    validate_fields,
)
from async_reward.config._shared import CONFIG_PATH

__all__ = ["ADMISSION_SCOPES", "LimitsConfig"]

#: Values of ``limits.admission``: where the limits are enforced.
ADMISSION_SCOPES = ("worker", "job")


@dataclass
class LimitsConfig:
    """Admission limits for outbound calls. RPM and TPM are budgets of the whole job."""

    max_concurrency: int = field(default=64, metadata=at_least(1, "allow at least one call in flight"))
    """Most calls in flight at once in one reward worker process (a slot is held for the call only);
    with ``admission: job``, in the whole job (all reward workers together)."""
    admission: str = "worker"
    """Where the limits are enforced. ``worker``: each reward worker process on its own, with its
    ``max_concurrency`` and an equal share of RPM / TPM (no round trip, but a slot or a share of the
    budget can idle at one worker while calls wait at another). ``job``: one queue for the whole job,
    held by a Ray actor (``async_reward._core.job_admission``): ``max_concurrency`` calls in flight across all
    workers, the whole RPM / TPM, the oldest training step first wherever its calls wait; costs two actor
    calls per attempt (``benchmarks/job_admission.py`` measures them)."""
    requests_per_minute: float | None = field(
        default=None, metadata=greater_than(0, "write a positive budget, or null for no request limit")
    )
    """Job-wide request budget per minute, shared by all ``reward.num_workers`` processes. None: unlimited."""
    tokens_per_minute: float | None = field(
        default=None, metadata=greater_than(0, "write a positive budget, or null for no token limit")
    )
    """Job-wide token budget per minute (prompt + completion), shared by all workers. None: unlimited."""
    estimated_tokens_per_request: int = field(
        default=512, metadata=at_least(0, "write the typical tokens of one request (0 reserves none)")
    )
    """Tokens reserved from the TPM budget before a call; corrected by the usage the response reports.
    Applies only with ``tokens_per_minute``: set without it (or under a manager with no budgets, such
    as ``async_naive``) it is refused at start-up, not ignored (``verl_keys.check_verl_settings``)."""

    def validate(self, num_workers: int, path: str = f"{CONFIG_PATH}.limits") -> None:
        """Check every value, and that each of ``num_workers`` processes gets a usable share (with
        ``admission: job`` there are no shares: the job's one queue holds the whole budgets)."""
        validate_fields(self, path)
        if self.admission not in ADMISSION_SCOPES:
            raise bad_value(
                f"{path}.admission",
                self.admission,
                "is not an admission scope",
                "use worker (each reward worker its own limits) or job (one queue for the whole job)",
            )
        num_workers = self.sharing_workers(num_workers)
        if self.requests_per_minute is not None and self.requests_per_minute / num_workers < 1:
            raise bad_value(
                f"{path}.requests_per_minute",
                self.requests_per_minute,
                f"split over {num_workers} reward workers leaves less than one request per minute each",
                "raise it or lower reward.num_workers",
            )
        _refuse_a_budget_the_shares_lose(f"{path}.requests_per_minute", self.requests_per_minute, num_workers)
        if self.tokens_per_minute is None:
            return
        share = math.floor(self.tokens_per_minute / num_workers)
        if share < 1:
            raise bad_value(
                f"{path}.tokens_per_minute",
                self.tokens_per_minute,
                f"split over {num_workers} reward workers leaves less than one token per minute each",
                "raise it or lower reward.num_workers",
            )
        _refuse_a_budget_the_shares_lose(f"{path}.tokens_per_minute", self.tokens_per_minute, num_workers)
        if self.estimated_tokens_per_request > share:
            raise bad_value(
                f"{path}.estimated_tokens_per_request",
                self.estimated_tokens_per_request,
                f"exceeds one worker's share of tokens_per_minute ({self.tokens_per_minute:g} / "
                f"{num_workers} workers = {share}): no request could ever be admitted",
                "lower it, raise tokens_per_minute, or lower reward.num_workers",
            )

    @property
    def job_wide(self) -> bool:
        """One admission queue for the whole job (``admission: job``)."""
        return self.admission == "job"

    def sharing_workers(self, num_workers: int) -> int:
        """Processes that split the budgets: ``num_workers`` per worker, 1 when the job's queue holds them."""
        return 1 if self.job_wide else num_workers


SHARES_KEEP_AT_LEAST = 0.9
"""The least part of a per-minute budget the workers' whole shares may keep. Each worker's limiter
admits whole units, at most ``floor(budget / workers)`` in any minute (``_core.limits``: a strict
window, as providers count it), so 15 requests a minute over verl's default 8 workers would be 8 a
minute for the job; below this part the budget is refused rather than silently cut."""


def _refuse_a_budget_the_shares_lose(key: str, budget: float | None, num_workers: int) -> None:
    """Refuse a per-minute ``budget`` whose whole per-worker shares keep less than
    :data:`SHARES_KEEP_AT_LEAST` of it, naming what the job would get and the fixes."""
    if budget is None:
        return
    kept = math.floor(budget / num_workers) * num_workers
    if kept >= SHARES_KEEP_AT_LEAST * budget:
        return
    if num_workers == 1:  # one limiter (one worker, or the job's queue): a fraction is never sent
        raise bad_value(
            key,
            budget,
            f"is not a whole number, and a limit counts whole units in any minute: {kept:g} a minute",
            f"write a whole number ({kept:g} or {kept + 1:g})",
        )
    raise bad_value(
        key,
        budget,
        f"split over {num_workers} reward workers gives each floor({budget:g} / {num_workers}) = "
        f"{kept // num_workers:g} a minute (each worker's limit counts whole units in any minute): "
        f"{kept:g} a minute for the job, {kept / budget:.0%} of the budget",
        "set limits.admission: job (one queue holds the whole budget), or a budget that the number of "
        "workers divides, or fewer reward.num_workers",
    )
