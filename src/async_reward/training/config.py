"""``async_reward.pipeline.*``: the pipelined trainer's modes, read from the verl config and checked
against it at start-up.

The node sits at the top level of the verl config (``+async_reward.pipeline.mini_batch=true`` on the
command line), not under ``reward.async_reward``: that node is parsed by every reward worker
(:func:`async_reward.config.load_config`), which knows nothing of trainer schedules and rejects
unknown keys.

Every combination that would silently train on something other than what the user asked for is
refused here, with the reason and the way out, before any worker starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from async_reward._core.config_rules import (
    bad_value,
    greater_than,
    names_config_errors,
    plain_container,
    select_key,
    validate_fields,
)
from async_reward.config import ConfigError, parse_config
from async_reward.training.schedule import check_estimator

__all__ = [
    "PIPELINE_CONFIG_PATH",
    "PipelineConfig",
    "check_against_verl",
    "check_judge_placement",
    "load_pipeline_config",
]

#: Where the node lives in the verl config.
PIPELINE_CONFIG_PATH = "async_reward.pipeline"


@dataclass
class PipelineConfig:
    """What overlaps the reward wait. Both flags off is ``baseline``: verl's order, rewards scored by
    our pipeline instead of inside the rollout."""

    mini_batch: bool = False
    """Mini-batch pipeline: each step makes ``train_batch_size // ppo_mini_batch_size`` updates, each on
    the next chunk of ``ppo_mini_batch_size`` complete groups as soon as it is scored. Group-local
    advantage estimators only (GRPO, RLOO, ...)."""
    one_step_off_policy: bool = False
    """Roll out batch k+1 and submit its rewards before the updates on batch k, so generation overlaps
    k's reward wait. Every batch after the first is generated one policy version behind
    (``off_policy/staleness`` = 1); verl's ``algorithm.rollout_correction`` settings apply to it."""
    chunk_timeout_s: float | None = field(
        default=None,
        metadata=greater_than(0, "write seconds > 0, or null for no limit beyond the managers' deadlines"),
    )
    """Longest wait for one chunk of rewards before the step fails with ``RewardChunkTimeout``. None:
    no limit beyond the reward managers' own per-sample deadlines and bounded retries."""
    assume_group_local: bool = False
    """Accept, in the mini-batch modes, an advantage estimator this package does not know (one you
    registered with verl's ``register_adv_est``) on your word that it only looks at each group."""
    allow_ppo_epochs_per_chunk: bool = False
    """Accept ``ppo_epochs > 1`` in the mini-batch modes. Each chunk then gets its epochs right after
    it arrives (chunk 1 x E, chunk 2 x E, ...) instead of verl's E passes over the whole batch; refused
    unless set, because that changes what is optimised."""
    dry_run: bool = False
    """Build everything a run builds before its workers (config checks, tokenizer, datasets, the
    trainer inside Ray's task-runner actor), print the trainer class and mode, and exit without
    starting workers or training. Needs no GPU: a cheap check of a launch command."""

    @property
    def mode(self) -> str:
        """The :class:`~async_reward.training.schedule.StepSchedule` mode these flags select."""
        if self.mini_batch and self.one_step_off_policy:
            return "both"
        if self.mini_batch:
            return "mini_batch"
        return "one_step_off" if self.one_step_off_policy else "baseline"

    def validate(self, path: str = PIPELINE_CONFIG_PATH) -> None:
        """Every field's value rule (declared on the field), naming ``path.<field>``: the node this
        config was read from (verl v1's ``trainer.v1.pipelined`` reads the same fields)."""
        validate_fields(self, path)


@names_config_errors("async_reward")
def load_pipeline_config(verl_config: DictConfig | Mapping[str, Any]) -> PipelineConfig:
    """Read ``async_reward.pipeline`` (absent: baseline) and check it against the rest of the config.

    Raises:
        ConfigError: an unknown key (naming the valid ones), a bad value, the node in the wrong place,
            or a combination the pipelined trainer cannot run as asked (see :func:`check_against_verl`).
    """
    reward_node = plain_container(verl_config.get("reward") or {}, "reward")
    misplaced = (reward_node.get("async_reward") or {}) if isinstance(reward_node, Mapping) else {}
    if isinstance(misplaced, Mapping) and "pipeline" in misplaced:
        raise ConfigError(
            "reward.async_reward.pipeline is not read there (reward workers parse reward.async_reward); "
            f"put the trainer's pipeline settings under {PIPELINE_CONFIG_PATH} instead"
        )
    top = plain_container(verl_config.get("async_reward") or {}, "async_reward")
    if not isinstance(top, Mapping):
        raise bad_value(
            "async_reward",
            top,
            "is not a mapping",
            f"write the pipelined trainer's settings under {PIPELINE_CONFIG_PATH}, e.g. "
            f"+{PIPELINE_CONFIG_PATH}.mini_batch=true",
        )
    unknown = sorted(set(top) - {"pipeline"})
    if unknown:
        raise ConfigError(
            f"unknown key(s) {unknown} in async_reward; valid keys: ['pipeline']",
            key=f"async_reward.{unknown[0]}",
            fix="use async_reward.pipeline",
        )
    config = parse_config(PipelineConfig, top.get("pipeline"), PIPELINE_CONFIG_PATH)
    config.validate()
    check_against_verl(config, verl_config)
    return config


def check_judge_placement(verl_config: Any, schedule: str) -> None:
    """Refuse a reward model served on the training GPUs (``reward.reward_model.enable`` without
    ``enable_resource_pool``) under one of our pipelined schedules (``schedule``: where it is set).

    verl wakes such a judge only after sampling, scores the whole batch and puts it back to sleep:
    it needs the GPUs that our schedules keep busy with generation and updates while rewards are
    awaited, so the overlap they exist for could not happen. Decided from that reasoning, without a
    GPU measurement. A judge on GPUs of its own streams per sample and works with every schedule.

    Raises:
        ConfigError: naming ``reward.reward_model.enable_resource_pool`` and the fix.
    """
    from async_reward.judge.in_job.settings import colocated_judge

    if colocated_judge(verl_config):
        fix = (
            "set reward.reward_model.enable_resource_pool=true with reward.reward_model.n_gpus_per_node "
            "and nnodes for the judge's own GPUs, or train with verl's v1 sync / colocate_async"
        )
        raise ConfigError(
            f"reward.reward_model.enable=true without enable_resource_pool puts the judge on the training "
            f"GPUs, which {schedule} keeps busy while rewards are awaited: verl would wake the judge only "
            f"after sampling and score the whole batch, so nothing could overlap; {fix}",
            key="reward.reward_model.enable_resource_pool",
            fix=fix,
        )


def check_against_verl(
    config: PipelineConfig,
    verl_config: Any,
    path: str = PIPELINE_CONFIG_PATH,
    *,
    whole_gen_batch: bool = True,
) -> None:
    """Refuse the verl settings the pipelined trainer cannot honour in ``config.mode``.

    ``path`` is where ``config`` was read (the legacy trainer's node, or verl v1's
    ``trainer.v1.pipelined``), named in the errors. ``whole_gen_batch``: the trainer generates a
    batch in one ``gen_batch_size`` draw (legacy); verl v1 draws it in ``gen_batch_size`` chunks
    (and sets 1 itself when unset), which any divisor of ``train_batch_size`` serves.

    Raises:
        ConfigError: naming the setting, why, and what to change.
    """
    select = lambda key, default=None: select_key(verl_config, key, default)  # noqa: E731
    estimator = str(getattr(select("algorithm.adv_estimator"), "value", select("algorithm.adv_estimator")))
    check_judge_placement(verl_config, path)
    if estimator.lower() == "remax":
        raise ConfigError(
            "algorithm.adv_estimator=remax needs a greedy-baseline reward per prompt scored inside the "
            "rollout, which the pipelined trainer does not do; use grpo/rloo or verl's own trainer"
        )
    if select("global_profiler.steps"):
        raise ConfigError(
            "global_profiler.steps is not supported by the pipelined trainer (its steps overlap, so a "
            "per-step profile window has no clear bounds); set global_profiler.steps=null"
        )
    if config.one_step_off_policy:
        correction = select("algorithm.rollout_correction") or {}
        wants_correction = bool(
            correction.get("rollout_is") or correction.get("rollout_rs") or correction.get("bypass_mode")
        )
        if wants_correction and not select("actor_rollout_ref.rollout.calculate_log_probs", False):
            raise ConfigError(
                "algorithm.rollout_correction is configured for the one-step off-policy batches, but "
                "actor_rollout_ref.rollout.calculate_log_probs=false: the rollout keeps no behaviour "
                "log-probs, so the correction would silently not apply; set it to true"
            )
    if not config.mini_batch:
        return
    try:
        check_estimator(estimator, assume_group_local=config.assume_group_local)
    except ValueError as exc:
        raise ConfigError(f"{path}.mini_batch=true: {exc}") from None
    train = int(select("data.train_batch_size"))
    mini = int(select("actor_rollout_ref.actor.ppo_mini_batch_size"))
    if mini <= 0 or train % mini:
        raise ConfigError(
            f"{path}.mini_batch=true needs data.train_batch_size ({train}) to be a multiple "
            f"of actor_rollout_ref.actor.ppo_mini_batch_size ({mini}): each step makes train_batch_size // "
            "ppo_mini_batch_size updates on equal chunks of complete groups"
        )
    gen_batch = select("data.gen_batch_size")
    if whole_gen_batch and gen_batch not in (None, train):
        raise ConfigError(
            f"{path}.mini_batch=true needs data.gen_batch_size unset or equal to "
            f"data.train_batch_size ({train}), got {gen_batch}"
        )
    critic_on = select("critic.enable")
    for key in ("actor_rollout_ref.actor.ppo_epochs", "critic.ppo_epochs"):
        if key.startswith("critic") and not critic_on:
            continue
        epochs = int(select(key, 1) or 1)
        if epochs > 1 and not config.allow_ppo_epochs_per_chunk:
            raise ConfigError(
                f"{path}.mini_batch=true with {key}={epochs}: the pipeline makes each "
                "chunk's epochs as it arrives (chunk 1 x E, chunk 2 x E, ...), not E passes over the "
                f"whole batch. Set it to 1, or accept the change with "
                f"{path}.allow_ppo_epochs_per_chunk=true"
            )
    if select("algorithm.use_kl_in_reward") and select("algorithm.kl_ctrl.type") == "adaptive":
        raise ConfigError(
            f"{path}.mini_batch=true with algorithm.use_kl_in_reward and an adaptive "
            "kl_ctrl: the controller would move once per chunk, so later chunks of a batch get another "
            "penalty than earlier ones. Use kl_ctrl.type=fixed, or use_kl_loss instead of the reward KL"
        )
    if critic_on:
        critic_mini = int(select("critic.ppo_mini_batch_size", mini))
        if critic_mini != mini:
            raise ConfigError(
                f"{path}.mini_batch=true updates the critic on each actor chunk: set "
                f"critic.ppo_mini_batch_size ({critic_mini}) equal to the actor's ({mini})"
            )
