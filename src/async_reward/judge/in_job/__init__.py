"""The judge inside the job: ``llm_judge`` scoring through the reward model verl serves.

verl 0.9's Reward Loop serves ``reward.reward_model.model_path`` on its own vLLM / SGLang replicas
behind a router (``reward.reward_model.enable=true``), on GPUs of their own
(``enable_resource_pool=true``) or on the training GPUs. With our setup hook, ``llm_judge`` sends its
chat completions to that router with nothing more than verl's keys and the manager's name:

* :mod:`~async_reward.judge.in_job.settings`: what the config says about the served judge (its model
  name, its capacity, where it runs); light, read by the checks and the managers;
* :mod:`~async_reward.judge.in_job.routing`: the reward worker that hands every sample to our
  manager (never to verl's ``/classify`` path) and the hook that installs it where verl builds its
  ``RewardLoopManager``, waking a standalone judge that verl's trainers put to sleep at start-up;
* :mod:`~async_reward.v1.colocated_judge`: verl v1's score-the-batch step for a judge on the
  training GPUs, reading every field our managers need;
* :mod:`~async_reward.judge.in_job.router_calls`: a request through verl's router, which cannot be
  cancelled, waited for past ``timeout_s`` with its admission slot held, and not sent again;
* :mod:`~async_reward.judge.in_job.admitted`: the concurrency and deadlines the configured manager
  derives, for what is sized after it (the decoupled trainer's reward backlog).

The names below load on first use, so the light module imports without verl's reward loop.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers only: at run time the names load on first use (below)
    from async_reward.judge.in_job.routing import JudgeRewardLoopWorker, install_reward_loop_hooks
    from async_reward.judge.in_job.settings import JudgeCapacity, judge_capacity, served_model_name

__all__ = [
    "JudgeCapacity",
    "JudgeRewardLoopWorker",
    "install_reward_loop_hooks",
    "judge_capacity",
    "served_model_name",
]

_LAZY = {
    "JudgeCapacity": "async_reward.judge.in_job.settings",
    "JudgeRewardLoopWorker": "async_reward.judge.in_job.routing",
    "install_reward_loop_hooks": "async_reward.judge.in_job.routing",
    "judge_capacity": "async_reward.judge.in_job.settings",
    "served_model_name": "async_reward.judge.in_job.settings",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'async_reward.judge.in_job' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
