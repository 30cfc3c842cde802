"""``trainer.v1.pipelined.*``: the schedule of verl v1's ``pipelined`` trainer mode, checked at start-up.

The node sits beside verl's own per-mode sections (``trainer.v1.sync``, ``trainer.v1.colocate_async``),
so ``python -m verl.trainer.main_ppo trainer.v1.trainer_mode=pipelined`` reads like any other v1 mode,
and pipelines: ``mini_batch`` is on and ``max_staleness`` is 1 unless set
(``+trainer.v1.pipelined.mini_batch=false``, ``+trainer.v1.pipelined.max_staleness=0``). How far
ahead batches generate is one key, ``max_staleness`` (0: on-policy, 1: the next batch generates
during a step, 2..7: batches further ahead); the legacy trainer's ``one_step_off_policy`` is not a
key here (refused, naming ``max_staleness=0``). The legacy trainer's node,
``async_reward.pipeline.*`` (:class:`~async_reward.training.config.PipelineConfig`, off by default
there), is refused under v1, with this one named as the fix.

Kept free of verl's v1 modules (which import TransferQueue), like :mod:`async_reward.config.v1`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from async_reward._core.config_rules import (
    bad_value,
    names_config_errors,
    plain_container,
    rule,
    select_key,
)
from async_reward.config import ConfigError, parse_config
from async_reward.config.v1 import PIPELINED_MODE, PIPELINED_MODE_PATH, is_pipelined_mode
from async_reward.training.config import PipelineConfig, check_against_verl

__all__ = [
    "DEFAULT_ON",
    "NOT_KEYS",
    "PIPELINED_MODE",
    "PIPELINED_MODE_PATH",
    "POLL_INTERVAL_S",
    "PipelinedModeConfig",
    "is_pipelined_mode",
    "load_pipelined_mode_config",
]

#: What the mode pipelines with unless told otherwise, and the value that turns each off:
#: ``trainer_mode=pipelined`` alone runs the schedule the README recommends (mini-batch updates, the
#: next batch generated during a step, ``max_staleness`` 1).
DEFAULT_ON = {"mini_batch": "false", "max_staleness": "0"}

#: Seconds between the trainer's reads of TransferQueue's tags while it waits for a batch to be
#: generated or for the next chunk of scored groups (TransferQueue has no change notification). A tag
#: listing costs about a millisecond, so 0.05 s keeps polling to a few percent of one core while
#: adding at most 50 ms to a wait of seconds; verl's replay buffer polls every 2 s, which at tens of
#: seconds per step is a visible share of the step. Internal: at this value both the polling's cost and
#: the delay it adds are small beside a step, so there is nothing for a user to trade.
POLL_INTERVAL_S = 0.05

#: Keys of the legacy trainer's node (the base class's fields) that are not keys of this mode, with
#: why and the fix: the mode says how far ahead batches generate with one key, ``max_staleness``.
NOT_KEYS = {
    "one_step_off_policy": (
        "is not a key of this mode: max_staleness alone says how far ahead batches generate "
        "(0: on-policy, 1 (default): the next batch during a step, 2..7: further ahead)",
        f"write +{PIPELINED_MODE_PATH}.max_staleness=0 for one_step_off_policy=false; "
        "delete the line for true",
    ),
}


@dataclass
class PipelinedModeConfig(PipelineConfig):
    """The legacy trainer's settings (same names, same meaning), with how far ahead batches generate
    as one key, ``max_staleness``, and what only v1 needs.

    Unlike the legacy trainer's node (``async_reward.pipeline``, baseline unless told), the mode
    pipelines by default (:data:`DEFAULT_ON`). ``dry_run`` stays a key of this node although verl's
    command line has no flags of its own: it is made of Hydra overrides, so a key is the flag.
    ``one_step_off_policy`` is not a key of this node (:data:`NOT_KEYS`): it is derived,
    ``max_staleness >= 1``, for the checks and the schedule's name the legacy trainer shares."""

    mini_batch: bool = True
    """As :attr:`PipelineConfig.mini_batch`; on by default in this mode."""
    one_step_off_policy: bool = True
    """Not a key here (:data:`NOT_KEYS`): set from ``max_staleness`` (>= 1) when the config is built."""

    fill_rollout_tail_at: float | None = field(
        default=None,
        metadata=rule(
            lambda v: 0 < v <= 1,
            "must be a share in (0, 1], or null",
            "write e.g. 0.5, or null to keep staleness 1",
        ),
    )
    """An override of when the batch after next starts (staleness 2, ``max_staleness`` below): once
    this share (0 < x <= 1) of the next step's batch is generated, instead of at once. Its sequences
    are aborted for training and resumed with the new weights (verl's partial rollout). None
    (default): at ``max_staleness`` >= 2 the batches ahead are dispatched as soon as the next one is."""

    max_staleness: int | None = field(
        default=None,
        metadata=rule(
            lambda v: isinstance(v, int) and 0 <= v <= 7,
            "must be an integer from 0 to 7, or null",
            "write 0 (on-policy), 1 (the next batch generates during a step), or 2 or more (batches "
            "further ahead too)",
        ),
    )
    """The most policy versions a trained group may lag the policy it updates
    (``off_policy/staleness``). 0: on-policy, no batch generates ahead (each step generates its own
    batch, then trains on it). 1: the next step's batch generates while this one trains on the batch
    before it, as the legacy trainer's one-step off-policy schedule. s >= 2: the batches of the next s steps
    generate together, and each step trains the first ``train_batch_size`` groups to be generated,
    oldest dispatch first, across the batches in flight (:mod:`async_reward.v1.pipelined.pool`), so
    the slowest groups of a long-tailed rollout go on generating (partial rollout) into later steps
    instead of holding this one; a group is never trained more than s versions late (the step waits
    for it). At most 7: verl's ``max_off_policy_threshold`` defaults to 8 versions. None (default):
    2 with ``fill_rollout_tail_at``, else 1."""

    def __post_init__(self) -> None:
        self.one_step_off_policy = self.staleness_limit >= 1  # what the shared checks read

    @property
    def staleness_limit(self) -> int:
        """The resolved ``max_staleness`` (module docstring; its field's docstring for None)."""
        if self.max_staleness is not None:
            return self.max_staleness
        return 2 if self.fill_rollout_tail_at is not None else 1

    def validate(self, path: str = PIPELINED_MODE_PATH) -> None:
        """Each field's value rule and the rules between fields, naming ``path.<field>``."""
        super().validate(path)
        fill = self.fill_rollout_tail_at
        staleness = self.max_staleness
        if fill is not None and staleness == 0:
            raise bad_value(
                f"{path}.max_staleness",
                staleness,
                f"with {path}.fill_rollout_tail_at={fill}: it starts the batch after next early "
                "(trained 2 versions late), which the on-policy schedule (max_staleness=0) never "
                "generates",
                f"set {path}.max_staleness=2 or more (or leave it null), or unset fill_rollout_tail_at",
            )
        if fill is not None and staleness == 1:
            raise bad_value(
                f"{path}.max_staleness",
                self.max_staleness,
                f"is 1, but {path}.fill_rollout_tail_at={fill} starts the batch after next, which is "
                "trained 2 versions late",
                f"set {path}.max_staleness=2 (or leave it null), or unset fill_rollout_tail_at",
            )


@names_config_errors("trainer")
def load_pipelined_mode_config(verl_config: DictConfig | Mapping[str, Any]) -> PipelinedModeConfig:
    """Read ``trainer.v1.pipelined`` (absent: the schedule of :data:`DEFAULT_ON`) and refuse what the
    mode cannot honour; a refusal of a setting left at its default says so, with the override.

    Raises:
        ConfigError: an unknown key or bad value, and every verl setting the schedule would
            silently not apply (see :func:`check_pipelined_mode_against_verl`).
    """
    select = lambda key, default=None: select_key(verl_config, key, default)  # noqa: E731
    node = plain_container(select(PIPELINED_MODE_PATH) or {}, PIPELINED_MODE_PATH)
    if not isinstance(node, Mapping):
        raise bad_value(
            PIPELINED_MODE_PATH,
            node,
            "is not a mapping",
            f"write e.g. +{PIPELINED_MODE_PATH}.mini_batch=true",
        )
    for key, (why, fix) in NOT_KEYS.items():
        if key in node:
            raise bad_value(f"{PIPELINED_MODE_PATH}.{key}", node[key], why, fix)
    config = parse_config(PipelinedModeConfig, node, PIPELINED_MODE_PATH)
    # max_staleness is at its default only where nothing that sets it is set
    staleness_set = bool({"max_staleness", "fill_rollout_tail_at"} & set(node))
    defaulted = [
        key for key in DEFAULT_ON if key not in node and not (key == "max_staleness" and staleness_set)
    ]
    try:
        config.validate()
        check_against_verl(config, verl_config, path=PIPELINED_MODE_PATH, whole_gen_batch=False)
        check_pipelined_mode_against_verl(config, verl_config)
    except ConfigError as error:
        raise _naming_the_default(error, defaulted) from None
    return config


def _naming_the_default(error: ConfigError, defaulted: list[str]) -> ConfigError:
    """``error`` refusing a setting the user did not set (on by default): said so, with the override."""
    flags = [flag for flag in defaulted if re.search(rf"\b{flag}\b", str(error))]
    if not flags:
        return error
    overrides = " ".join(f"+{PIPELINED_MODE_PATH}.{flag}={DEFAULT_ON[flag]}" for flag in flags)
    fix = f"{error.fix}; or turn the schedule off with {overrides}" if error.fix else f"or {overrides}"
    return ConfigError(
        f"{error} ({', '.join(flags)}: on by default under trainer.v1.trainer_mode={PIPELINED_MODE}; "
        f"{overrides} turns it off)",
        key=error.key or f"{PIPELINED_MODE_PATH}.{flags[0]}",
        fix=fix,
    )


def check_pipelined_mode_against_verl(config: PipelinedModeConfig, verl_config: Any) -> None:
    """The v1 settings that mean nothing, or something else, under this mode: refused by name.

    Raises:
        ConfigError: naming the setting, why, and what to change.
    """
    select = lambda key, default=None: select_key(verl_config, key, default)  # noqa: E731
    if select("algorithm.filter_groups.enable"):
        raise ConfigError(
            "algorithm.filter_groups.enable=true (DAPO) is not run by trainer.v1.trainer_mode=pipelined: "
            "it trains every generated group of a batch and never samples through the replay buffer, "
            "so no group would be filtered. Use trainer_mode=sync or colocate_async for DAPO",
            key="algorithm.filter_groups.enable",
            fix="set it to false, or use another trainer_mode",
        )
    if select("trainer.v1.sampler.sync_refill_failed_groups"):
        raise ConfigError(
            "trainer.v1.sampler.sync_refill_failed_groups=true is not run by the pipelined mode: a group "
            "whose session raised is dropped from its batch (counted in pipeline/failed_groups), not "
            "generated again, so the step never waits for a fresh rollout",
            key="trainer.v1.sampler.sync_refill_failed_groups",
            fix="set it to false",
        )
    sampler = select("trainer.v1.sampler.custom_sampler") or {}
    path = sampler.get("path") if hasattr(sampler, "get") else None
    if path and path != "pkg://async_reward.v1.replay_buffer":
        raise ConfigError(
            f"trainer.v1.sampler.custom_sampler={path} is not used for training by the pipelined mode "
            "(it takes each batch's groups as they are scored, not through a sampler); only validation "
            "samples through it",
            key="trainer.v1.sampler.custom_sampler",
            fix="unset it, or use another trainer_mode",
        )
    threshold = select("trainer.v1.sampler.max_off_policy_threshold")
    span = 1 + config.staleness_limit
    if threshold is not None and int(threshold) < span:
        raise ConfigError(
            f"trainer.v1.sampler.max_off_policy_threshold={threshold}, but the schedule trains batches "
            f"spanning {span} model versions (max_staleness + 1; max_staleness is 1 unless set, 2 with "
            "fill_rollout_tail_at)",
            key="trainer.v1.sampler.max_off_policy_threshold",
            fix=f"set it to {span} or more (verl's default is 8), or change the schedule",
        )
    if select("skip.rollout_tq.enable"):
        raise ConfigError(
            "skip.rollout_tq.enable=true replays rollouts through the replay buffer's sample(), which "
            "the pipelined mode does not call",
            key="skip.rollout_tq.enable",
            fix="set it to false, or use another trainer_mode",
        )
    if config.mini_batch and select("algorithm.rollout_correction.rollout_is_batch_normalize"):
        raise ConfigError(
            "algorithm.rollout_correction.rollout_is_batch_normalize=true with "
            f"{PIPELINED_MODE_PATH}.mini_batch=true: the importance weights would be normalised over each "
            "chunk of groups rather than the whole batch",
            key="algorithm.rollout_correction.rollout_is_batch_normalize",
            fix="set it to false, or mini_batch=false",
        )
