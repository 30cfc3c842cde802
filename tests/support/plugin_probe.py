"""The fresh processes of tests/wiring/test_verl_plugin.py: one interpreter loads the third-party packages
once, then forks a child per case, each importing verl (and so loading its plugins) for the first
time, as a process of a job does. Kept apart from the test module, whose imports load verl."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

from tests.support.first_import_probe import preload_third_party, report_each_in_a_fork

#: Each child's case: the environment it imports verl with, and what it breaks first.
CASES: dict[str, dict[str, Any]] = {
    "plugin": {},
    "our switch off": {"env": {"ASYNC_REWARD_VERL_PLUGIN": "0"}},
    "verl's switch off": {"env": {"VERL_USE_EXTERNAL_PLUGINS": "none"}},
    "other plugins only": {"env": {"VERL_USE_EXTERNAL_PLUGINS": "someone_else"}},
    "plugin broken": {"broken": "async_reward.wiring.verl_plugin"},
    "managers broken": {"broken": "async_reward.managers.llm_judge"},
}
#: verl modules the processes of a job import first (after ``verl`` itself): the driver, verl's task
#: runners, its reward and agent-loop workers.
VERL_FIRST = (
    "verl.trainer.main_ppo",
    "verl.trainer.main_ppo_v0",
    "verl.trainer.ppo.v1",
    "verl.trainer.ppo.v1.trainer_base",
    "verl.trainer.ppo.v1.agent_loop_tq",
    "verl.trainer.ppo.ray_trainer",
    "verl.trainer.ppo.reward",
    "verl.experimental.reward_loop",
    "verl.experimental.reward_loop.reward_loop",
    "verl.experimental.reward_loop.reward_manager.registry",
)


class _Refuse:
    """A meta-path finder that fails the import of one module (a broken install, in one process)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == self.name:
            raise ImportError(f"{name} is broken in this test")


def _lookups() -> dict[str, str]:
    from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
    from verl.trainer.ppo.v1 import get_trainer_cls

    found: dict[str, str] = {}
    for name, lookup in [
        *((mode, get_trainer_cls) for mode in ("sync", "pipelined", "decoupled")),
        *((name, get_reward_manager_cls) for name in ("naive", "llm_judge")),
    ]:
        try:
            found[name] = lookup(name).__qualname__
        except Exception as error:  # the case's refusal, whatever its type
            found[name] = f"{type(error).__name__}: {error}"
    return found


def _probe(case: str) -> dict[str, Any]:
    """In a forked child: import verl as the case says, then look our names and verl's up."""
    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(f"{record.levelname} {record.getMessage()}")

    logging.getLogger().addHandler(Collect(level=logging.WARNING))
    first = None
    if case.startswith("first:"):
        first = case.removeprefix("first:")
        setup: dict[str, Any] = {}
    else:
        setup = CASES[case]
    os.environ.update(setup.get("env", {}))
    if "broken" in setup:
        sys.meta_path.insert(0, _Refuse(setup["broken"]))
    import verl  # noqa: F401  (verl loads its plugins here)

    ours_after_verl = sorted(m for m in sys.modules if m.startswith("async_reward"))
    if first is not None:
        importlib.import_module(first)
    heavy = (
        "async_reward.managers",
        "async_reward.v1.pipelined.trainer",
        "async_reward.v1.colocated_judge",
    )
    loaded_before_lookups = sorted(name for name in heavy if name in sys.modules)
    return {
        "loaded_before_lookups": loaded_before_lookups,
        "case": case,
        "ours_after_verl": ours_after_verl,
        "found": _lookups(),
        "said": [w for w in warnings if "async-reward" in w or "async_reward" in w],
        "errors": [w for w in warnings if w.startswith(("ERROR", "CRITICAL"))],
    }


def probe_the_plugin() -> None:
    """Run in a subprocess: the third-party packages once, then a forked child per case, each
    importing verl (and so loading its plugins) for the first time."""
    preload_third_party()
    assert not [
        m for m in sys.modules if m.split(".")[0] in ("verl", "async_reward", "async_reward_verl_plugin")
    ]
    report_each_in_a_fork([*CASES, *(f"first:{name}" for name in VERL_FIRST)], _probe)


def score_in_a_job_without_the_hook(address: str, tokenizer_dir: str, judge_url: str, scorer: str) -> None:
    """Run as a job's driver (a subprocess joined to the session's cluster, with a runtime env of its
    own and no setup hook): verl's ``RewardLoopManager`` builds its ``RewardLoopWorker`` actors, whose
    processes know our managers only through the plugin. First ``reward.reward_manager.name=
    llm_judge`` against the judge at ``judge_url``, then a plain verl job (``naive`` with the user's
    ``scorer`` file, a legacy key beside it): each worker's manager class, the scores, whether the
    worker's job had a setup hook, and whether the plain config came back as it went in."""
    import json

    import ray
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    from tests.conftest import compose_verl_config, make_batch

    ray.init(
        address=address, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}, log_to_driver=False
    )
    rows = [
        {"prompt": "What is 2+3?", "response": "The answer is 5", "ground_truth": "5"},
        {"prompt": "What is 2+3?", "response": "The answer is 6", "ground_truth": "5"},
    ]
    batch = make_batch(AutoTokenizer.from_pretrained(tokenizer_dir), rows)
    common = [f"actor_rollout_ref.model.path={tokenizer_dir}", "reward.num_workers=1"]
    jobs = {
        "ours": [
            *common,
            "reward.reward_manager.name=llm_judge",
            f"+reward.async_reward.judge.base_url={judge_url}",
        ],
        "plain": [
            *common,
            "reward.reward_manager.name=naive",
            f"reward.custom_reward_function.path={scorer}",
            "reward.custom_reward_function.name=sync_score",
            "reward_model.reward_manager=naive",  # verl's main_ppo leaves it be, and so must we
        ],
    }
    report = {}
    for name, overrides in jobs.items():
        config = compose_verl_config(overrides)
        before = OmegaConf.to_container(config, resolve=False)
        manager = RewardLoopManager(config)
        output = manager.compute_rm_score(batch)
        workers = manager.reward_loop_workers
        report[name] = {
            "classes": ray.get(
                [w.__ray_call__.remote(lambda w: type(w.reward_manager).__qualname__) for w in workers]
            ),
            "hooked": ray.get(
                [
                    w.__ray_call__.remote(
                        lambda w: "worker_process_setup_hook" in (ray.get_runtime_context().runtime_env or {})
                    )
                    for w in workers
                ]
            ),
            "scores": output.batch["rm_scores"].sum(dim=1).tolist(),
            "statuses": list(output.non_tensor_batch.get("status", [])),
            "config_unchanged": OmegaConf.to_container(config, resolve=False) == before,
        }
        for worker in workers:
            ray.kill(worker)
    print("REPORT", json.dumps(report), flush=True)
