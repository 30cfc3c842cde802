"""A judge on the training GPUs in the v1 bench trainer: verl's colocated reward step, timed.

With ``reward.reward_model.enable=true`` and ``enable_resource_pool=false`` verl's v1 ``sync`` and
``colocate_async`` trainers score nothing while generating: ``_step_once`` samples a batch (the
replicas then sleep, or are aborted and sleep), and, because the reward manager has no worker
handles, calls ``_compute_reward_colocate``, whose ``compute_rm_score`` wakes the judge, scores the
whole sampled batch and puts it back to sleep, before the old log-probs. Here that step is:

* wake-up and sleep: half of ``V1Harness.judge_wake_sleep_s`` each (the GPUs do nothing else);
* scoring: every sampled session sent at once, through the same verl ``RewardLoopWorker`` actors
  and our manager, to the judge, whose capacity is the N GPUs' (``judge_placement``); the step
  waits for the last verdict.

It is one ``judge`` GPU stage on the step's timeline, which never overlaps generation (the engine is
paused: the trainer slept or aborted it at ``on_sample_end``) nor training (the trainer's own thread
runs it). ``tests/bench/test_bench_judge_placement.py`` checks both on a run.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from async_reward.training.schedule import TimelineEvent

__all__ = ["COLOCATED_JUDGE_MODES", "NO_WORKER_HANDLES", "colocated_judge_class"]

#: verl v1 trainer modes that take a colocated reward model (``separate_async`` asserts against it).
COLOCATED_JUDGE_MODES = frozenset({"sync", "colocate_async"})
#: What the trainer sees as its ``reward_loop_manager`` with a colocated judge: no worker handles, so
#: verl's ``_step_once`` calls ``_compute_reward_colocate`` (and its agent loop scores nothing).
NO_WORKER_HANDLES = SimpleNamespace(reward_loop_worker_handles=None)


class _ColocatedJudgeStep:
    """``_compute_reward_colocate`` on the harness: wake, score the sampled batch at once, sleep."""

    bench: Any
    global_steps: int

    def _compute_reward_colocate(self, batch: Any, metrics: dict | None = None) -> Any:
        bench = self.bench
        start = bench.clock()
        half = bench.judge_wake_sleep_s / 2
        bench.sleep(half)  # wake the judge (vLLM's wake_up: weights and KV cache back on the GPUs)
        bench.agent_loop.score_now(list(batch.keys)).result(timeout=bench.judge_timeout_s)
        bench.sleep(half)  # and put it back to sleep before the log-probs
        bench.events.append(TimelineEvent("judge", start, bench.clock(), self.global_steps - 1))
        return batch


def colocated_judge_class(trainer_class: type[Any], mode: str) -> type[Any]:
    """``trainer_class`` (a bench v1 trainer of ``mode``) with a judge on the training GPUs.

    Raises:
        ValueError: ``mode`` does not take a colocated judge.
    """
    if mode not in COLOCATED_JUDGE_MODES:
        raise ValueError(
            f"v1 trainer mode {mode!r} does not take a judge on the training GPUs (verl's separate_async "
            "asserts enable_resource_pool=true; ours refuse it): only sync and colocate_async do"
        )
    return type(f"ColocatedJudge{trainer_class.__name__}", (_ColocatedJudgeStep, trainer_class), {})
