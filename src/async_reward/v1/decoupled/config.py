"""``trainer.v1.decoupled.*``: the windows of verl v1's ``decoupled`` trainer mode, checked at start-up.

``decoupled`` is verl's ``separate_async`` (standalone rollout GPUs, NCCL weight sync with partial
rollout, decoupled PPO) with generation and scoring decoupled: a prompt group holds a place in the
*generation window* only while it generates; once generated its sessions wait in a bounded *reward
backlog*; scored groups wait for the trainer in a bounded *sampleable buffer*. Three numbers bound
the pipeline, each derived from verl's own settings and the reward service's capacity unless set:

* ``generation_window`` G (prompt groups still generating), default ``(num_warmup_batches + 1) x
  train_batch_size``: as many groups as verl's ``separate_async`` keeps in flight, but only the
  generating ones count;
* ``reward_backlog`` R (sessions generated and not yet scored), default twice the calls the reward
  manager admits at once (the service's concurrency as our admission knows it, once in service and
  once queued behind it), derived as the manager derives it
  (:func:`~async_reward.judge.in_job.admitted.manager_admission`: ``limits.max_concurrency`` or
  verl's ``reward.max_concurrent``, or a served judge's capacity, per reward worker or for the
  whole job with ``limits.admission: job``), clamped to at least one mini-batch of sessions and
  at most what the staleness bound allows;
* ``sampleable_buffer`` S (scored groups waiting for the trainer), default ``train_batch_size``.

**The staleness bound.** All dispatched groups not yet trained are at most ``H = G + ceil(R / n) +
S``. Start-up refuses windows with ``ceil(H / B) + 1 > T`` (``T``: ``trainer.v1.sampler.
max_off_policy_threshold``, ``B``: ``train_batch_size``), naming the largest value that fits. With
staleness counted from generation (a group's *span* at step ``s`` is ``s - gen_version``, verl's
``global_steps - entry + 1`` with entry ``gen_version + 1``), what holds is:

* *in order* (every group scored by the time the trainer reaches it), a group is trained within
  ``ceil(H / B) + 1 <= T`` versions of its generation: the groups ahead of it are at most ``H``;
* *out of order* (a group waits for the judge while younger ones are scored and trained), waiting for
  the judge does not count: a group fully generated within the threshold is not evicted ``stale``,
  because a sample that would leave its last step (``span == T``) without a place for it waits until
  it is scored, and oldest-first selection trains it (the sampler,
  :mod:`async_reward.v1.decoupled.replay_buffer`). With ``H <= (T - 1) B`` the groups at their last
  step are at most ``max(B, k)``, ``k`` those of one policy version that were still unscored while
  younger ones were trained, so every one fits when ``k <= B``.

*Cost*: the trainer waits for a slow group in its last step (``decoupled/staleness_wait_s``); the
rollout keeps being topped up meanwhile. The wait is bounded: every scoring attempt has a deadline
(``reward.async_reward.timeout_s``, ``retry.max_attempts``, oldest policy version admitted first), and
``stale_wait_timeout_s`` caps it. *Limit*: more groups at their last step than the step's remaining
places (``k > B``: the judge stalls on more than a batch of groups of one version), or a wait given up
at ``stale_wait_timeout_s``: those groups are evicted ``stale`` and counted in
``decoupled/stale_overflow``. A group whose *generation* (not its scoring) spans more than ``T``
versions (partial rollout across weight syncs) is evicted ``stale`` as under verl: its tokens are that
old. With ``staleness_from: submission`` verl's measure and rules are kept unchanged (no wait).

verl's ``separate_async`` settings (``parameter_sync_step``, ``num_warmup_batches``,
``hybrid_rollout``) stay where verl documents them, under ``trainer.v1.separate_async``; the trainer
copies them into this node (verl's base trainer reads ``trainer.v1.<mode>.parameter_sync_step``).

Kept free of verl's v1 modules (which import TransferQueue), like :mod:`async_reward.config.v1`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from omegaconf import DictConfig

from async_reward._core.config_rules import (
    bad_value,
    names_config_errors,
    parse_config,
    plain_container,
    select_key,
)
from async_reward.config import ConfigError
from async_reward.config.v1 import DECOUPLED_MODE, DECOUPLED_MODE_PATH, is_decoupled_mode
from async_reward.judge.in_job.admitted import manager_admission

__all__ = [
    "DECOUPLED_MODE",
    "DECOUPLED_MODE_PATH",
    "POLL_INTERVAL_S",
    "DecoupledModeConfig",
    "DecoupledWindows",
    "derive_windows",
    "is_decoupled_mode",
    "load_decoupled_mode_config",
    "stale_wait_limit_s",
]

#: ``trainer.v1.trainer_mode`` of our trainer (registered by :mod:`async_reward.v1.decoupled.trainer`).
#: verl's node the mode's verl settings are read from (and copied into ours).
SEPARATE_ASYNC_PATH = "trainer.v1.separate_async"

#: Seconds between the sampler's reads of TransferQueue while the trainer waits for scored groups;
#: each poll also tops up the generation window. A poll is three tag listings (verl's, the sampler's
#: prompt tags, the top-up's) of every prompt in flight: at a quarter of the pipelined mode's rate of
#: one listing a poll, about the same listing cost a second; 0.2 s still adds at most a fifth of a
#: second to a wait for scoring that takes seconds, where verl's 2 s would be a visible share of a
#: step. Internal: nothing for a user to trade at this value.
POLL_INTERVAL_S = 0.2


@dataclass
class DecoupledModeConfig:
    """What a user may set under ``trainer.v1.decoupled`` (None: derived, see the module docstring).

    ``dry_run`` is a key although it acts as a flag: verl's command line is made of Hydra overrides, so
    a key of the node is the flag. How often the sampler polls (:data:`POLL_INTERVAL_S`) and what a
    prompt ledger out of balance does (logged, counted in ``ledger/unaccounted``) are not keys."""

    generation_window: int | None = None
    """Prompt groups generating at once (pending or with a session still generating). A group leaves
    the window as soon as its last session is generated, whatever its scoring. None: ``(separate_async
    .num_warmup_batches + 1) x data.train_batch_size``."""

    reward_backlog: int | None = None
    """Sessions generated and not yet scored. Below it dispatch fills the generation window; above it
    the backlog plus the sessions generating are kept within ``reward_backlog + generation_window x
    rollout.n`` (backpressure: a group is dispatched for each group's worth of sessions scored, so the
    rollout follows the judge instead of idling while the backlog drains and then dispatching the
    whole window), and that is where the backlog peaks (counting the sessions generating against
    ``reward_backlog`` alone capped the rollout at ``reward_backlog`` sessions: measured slower, see
    docs/benchmarks.md). Nothing is ever dropped. None: twice
    :attr:`~async_reward.judge.in_job.admitted.ManagerAdmission.calls_in_flight` (the manager's
    ``limits.max_concurrency`` x ``reward.num_workers``, x 1 with ``limits.admission: job``),
    clamped to ``[ppo_mini_batch_size x rollout.n, the largest value the staleness bound allows]``."""

    sampleable_buffer: int | None = None
    """Scored groups waiting for the trainer before dispatch pauses (while more groups are generating
    or scoring; with none on their way the window refills, so a sample needing more is never stuck):
    keeps a training-bound run from generating data that can only go stale. None:
    ``data.train_batch_size``."""

    staleness_from: Literal["generation", "submission"] = "generation"
    """What verl's staleness rules (``max_off_policy_threshold``, oldest-first sampling) count from:
    ``generation``, the policy version that generated a group's oldest token (time queued in the
    window or waiting for the judge does not count); ``submission``, verl's own measure (the step the
    prompt was dispatched in), for comparison."""

    stale_wait_timeout_s: float | None = None
    """Longest a sample waits for groups at their staleness limit to be scored (module docstring);
    then it samples without them and they are evicted ``stale`` (``decoupled/stale_overflow``, with a
    warning naming this key). None: the longest one session's scoring can take under the manager's
    deadlines (:attr:`~async_reward.judge.in_job.admitted.ManagerAdmission.longest_scoring_s`),
    ``(retry.max_attempts + 1) x timeout_s + (retry.max_attempts - 1) x retry.max_backoff_s`` (one
    ``timeout_s`` for the calls in service ahead of it; with ``admission_timeout_s`` set, that
    instead); through verl's router a timed-out attempt lasts up to ``max(timeout_s,
    retry.max_total_s)`` (the first and the last ``timeout_s``)."""

    dry_run: bool = False
    """Build the trainer in verl's task-runner actor, print its start line and a ``dry run: built``
    line, and return from ``fit`` without starting any worker, GPU, rollout or reward worker (to check
    that ``python -m verl.trainer.main_ppo`` picks this mode, with these windows, before a GPU job)."""

    def validate(self) -> None:
        for name in ("generation_window", "reward_backlog", "sampleable_buffer"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 1):
                raise bad_value(
                    f"{DECOUPLED_MODE_PATH}.{name}",
                    value,
                    "must be an integer >= 1, or null (derived)",
                    "write e.g. 8, or null",
                )
        wait = self.stale_wait_timeout_s
        if wait is not None and (isinstance(wait, bool) or not 0 < wait < float("inf")):
            raise bad_value(
                f"{DECOUPLED_MODE_PATH}.stale_wait_timeout_s",
                wait,
                "must be a number of seconds > 0, or null (derived from the scoring deadline)",
                "write e.g. 600, or null",
            )


@dataclass(frozen=True)
class DecoupledWindows:
    """The mode's three bounds and what they imply, as the trainer enforces them."""

    generation_window: int
    """G: prompt groups generating at once."""
    reward_backlog: int
    """R: sessions generated and not yet scored before dispatch pauses."""
    sampleable_buffer: int
    """S: scored groups waiting for the trainer before dispatch pauses."""
    train_batch_size: int
    """B: prompt groups trained per step."""
    rollout_n: int
    """n: sessions per group."""

    @property
    def outstanding_cap(self) -> int:
        """H = G + ceil(R / n) + S: dispatched groups not yet trained or evicted, at most."""
        return (
            self.generation_window + math.ceil(self.reward_backlog / self.rollout_n) + self.sampleable_buffer
        )

    @property
    def staleness_bound(self) -> int:
        """Largest span (verl's convention: versions behind + 1) a group reaches when groups are scored
        in order; out of order the sampler's wait keeps a generated group within the threshold (module
        docstring)."""
        return math.ceil(self.outstanding_cap / self.train_batch_size) + 1


@names_config_errors("trainer")
def load_decoupled_mode_config(verl_config: DictConfig | Mapping[str, Any]) -> DecoupledModeConfig:
    """Read ``trainer.v1.decoupled`` and refuse what the mode cannot honour.

    verl's ``separate_async`` keys the trainer copied into the node are accepted when equal to their
    source; any other value there is refused (it would be ignored by verl's ``separate_async`` code).

    Raises:
        ConfigError: an unknown key or bad value, and every setting the mode would silently not
            apply (see :func:`check_decoupled_mode_against_verl` and :func:`derive_windows`).
    """
    node = plain_container(select_key(verl_config, DECOUPLED_MODE_PATH) or {}, DECOUPLED_MODE_PATH)
    if not isinstance(node, Mapping):
        raise bad_value(
            DECOUPLED_MODE_PATH,
            node,
            "is not a mapping",
            f"write e.g. +{DECOUPLED_MODE_PATH}.reward_backlog=64",
        )
    separate = plain_container(select_key(verl_config, SEPARATE_ASYNC_PATH) or {}, SEPARATE_ASYNC_PATH)
    ours = {f.name for f in fields(DecoupledModeConfig)}
    own: dict[str, Any] = {}
    for key, value in node.items():
        if key in ours or not isinstance(separate, Mapping) or key not in separate:
            own[key] = value
        elif value != separate[key]:
            raise ConfigError(
                f"{DECOUPLED_MODE_PATH}.{key}={value!r}: trainer_mode=decoupled runs verl's separate_async "
                f"code, which reads {SEPARATE_ASYNC_PATH}.{key} (now {separate[key]!r})",
                key=f"{DECOUPLED_MODE_PATH}.{key}",
                fix=f"set {SEPARATE_ASYNC_PATH}.{key} instead",
            )
    config = parse_config(DecoupledModeConfig, own, DECOUPLED_MODE_PATH)
    config.validate()
    check_decoupled_mode_against_verl(config, verl_config)
    derive_windows(config, verl_config)
    return config


def derive_windows(config: DecoupledModeConfig, verl_config: Any) -> DecoupledWindows:
    """G, R and S for this run (see the module docstring), checked against the staleness threshold.

    Raises:
        ConfigError: the bound ``ceil(H / B) + 1`` exceeds ``max_off_policy_threshold``, naming the
            window to shrink and the largest value that fits.
    """
    batch = int(select_key(verl_config, "data.train_batch_size"))
    n = int(select_key(verl_config, "actor_rollout_ref.rollout.n", 1))
    mini = int(select_key(verl_config, "actor_rollout_ref.actor.ppo_mini_batch_size", batch))
    warmup = float(select_key(verl_config, f"{SEPARATE_ASYNC_PATH}.num_warmup_batches", 1) or 0)
    window = config.generation_window or max(1, math.floor((warmup + 1) * batch))
    sampleable = config.sampleable_buffer or batch
    threshold = select_key(verl_config, "trainer.v1.sampler.max_off_policy_threshold")
    strategy = select_key(verl_config, "trainer.v1.sampler.max_off_policy_strategy", "drop")
    bounded = threshold is not None and strategy == "drop"
    # Groups the bound lets be outstanding: ceil(H / B) + 1 <= threshold  <=>  H <= (threshold - 1) B.
    room = (int(threshold) - 1) * batch if bounded else None
    floor = mini * n  # one mini-batch of sessions: less and one update's groups could never all queue
    if config.reward_backlog is not None:
        backlog = config.reward_backlog
    else:  # the calls the manager admits, as it derives them (verl's keys, the served judge's capacity)
        backlog = max(2 * manager_admission(verl_config).calls_in_flight, floor)
        if room is not None:
            largest = (room - window - sampleable) * n
            if largest < floor:
                raise _too_stale(
                    "generation_window",
                    window,
                    room - sampleable - math.ceil(floor / n),
                    threshold,
                    "with the smallest reward backlog (one mini-batch of sessions)",
                )
            backlog = min(backlog, largest)
    windows = DecoupledWindows(window, backlog, sampleable, batch, n)
    if room is not None and windows.outstanding_cap > room:
        if config.reward_backlog is not None:
            largest = (room - window - sampleable) * n
            if largest >= 1:
                raise _too_stale("reward_backlog", backlog, largest, threshold, "")
        largest_window = room - sampleable - math.ceil(backlog / n)
        raise _too_stale("generation_window", window, largest_window, threshold, "")
    groups_per_sample = max(1, mini)
    if windows.outstanding_cap < groups_per_sample:
        raise ConfigError(
            f"{DECOUPLED_MODE_PATH}: at most {windows.outstanding_cap} groups would be outstanding "
            f"(generation_window + ceil(reward_backlog / n) + sampleable_buffer), fewer than the "
            f"{groups_per_sample} one mini-batch (actor.ppo_mini_batch_size) samples: training would "
            "wait forever",
            key=f"{DECOUPLED_MODE_PATH}.sampleable_buffer",
            fix=f"set {DECOUPLED_MODE_PATH}.sampleable_buffer to at least {groups_per_sample}",
        )
    return windows


def stale_wait_limit_s(config: DecoupledModeConfig, verl_config: Any) -> float:
    """Seconds a sample waits at most for groups at their staleness limit (see
    :attr:`DecoupledModeConfig.stale_wait_timeout_s`)."""
    if config.stale_wait_timeout_s is not None:
        return float(config.stale_wait_timeout_s)
    return manager_admission(verl_config).longest_scoring_s


def _too_stale(name: str, value: int, largest: int, threshold: Any, how: str) -> ConfigError:
    key = f"{DECOUPLED_MODE_PATH}.{name}"
    fits = (
        f"set {key} to at most {largest}{' ' + how if how else ''}, or raise "
        "trainer.v1.sampler.max_off_policy_threshold"
        if largest >= 1
        else "raise trainer.v1.sampler.max_off_policy_threshold or lower "
        f"{DECOUPLED_MODE_PATH}.sampleable_buffer"
    )
    return ConfigError(
        f"{key}={value}: groups could be trained more than trainer.v1.sampler.max_off_policy_threshold="
        f"{threshold} policy versions after generation (outstanding groups H = generation_window + "
        "ceil(reward_backlog / rollout.n) + sampleable_buffer must be <= (threshold - 1) x "
        f"train_batch_size), so verl's drop rule would evict them; {fits}",
        key=key,
        fix=fits,
    )


def check_decoupled_mode_against_verl(config: DecoupledModeConfig, verl_config: Any) -> None:
    """The verl settings that mean nothing, or something else, under this mode: refused by name.

    Raises:
        ConfigError: naming the setting, why, and what to change.
    """
    from async_reward.training.config import check_judge_placement

    check_judge_placement(verl_config, "trainer_mode=decoupled")  # a judge on the training GPUs
    if select_key(verl_config, f"{SEPARATE_ASYNC_PATH}.hybrid_rollout.enable_switch"):
        raise ConfigError(
            f"{SEPARATE_ASYNC_PATH}.hybrid_rollout.enable_switch=true is not run by trainer_mode=decoupled: "
            "verl lends the trainer's GPUs to generation when a step waited for samples, which under a "
            "slow judge waits on scoring, not generation (lending buys nothing while the reward backlog "
            "is full)",
            key=f"{SEPARATE_ASYNC_PATH}.hybrid_rollout.enable_switch",
            fix="set it to false (the standalone rollout keeps generating), or use "
            "trainer_mode=separate_async",
        )
    if select_key(verl_config, "skip.rollout_tq.enable"):
        raise ConfigError(
            "skip.rollout_tq.enable=true replays recorded rollouts instead of dispatching prompts, which the "
            "decoupled mode's generation window does",
            key="skip.rollout_tq.enable",
            fix="set it to false, or use another trainer_mode",
        )
    strategy = select_key(verl_config, "trainer.v1.sampler.max_off_policy_strategy", "drop")
    if strategy == "wait" and config.staleness_from == "generation":
        raise ConfigError(
            "trainer.v1.sampler.max_off_policy_strategy=wait with trainer_mode=decoupled: verl's wait rule "
            "reads the age of groups still generating, which the mode counts from generation (unknown "
            "until generated); the mode bounds staleness by its windows instead",
            key="trainer.v1.sampler.max_off_policy_strategy",
            fix=f"use drop (verl's default), or set {DECOUPLED_MODE_PATH}.staleness_from=submission",
        )
    sampler = select_key(verl_config, "trainer.v1.sampler.custom_sampler") or {}
    path = sampler.get("path") if hasattr(sampler, "get") else None
    if path and path != "pkg://async_reward.v1.replay_buffer":
        raise ConfigError(
            f"trainer.v1.sampler.custom_sampler={path}: trainer_mode=decoupled samples through "
            "async-reward's replay buffer (staleness from generation, the prompt ledger)",
            key="trainer.v1.sampler.custom_sampler",
            fix="unset it (the mode names its own), or use another trainer_mode",
        )
