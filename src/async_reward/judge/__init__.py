"""The LLM judge: prompts and templates (``prompts``), reading a verdict (``verdict``, ``reply``),
weighing it by the judge's token probabilities (``expected``, ``span_weighting``), what judging cost
(``cost``), rubrics (``rubric``), judging a whole group in one call (``group``) and the judge verl
serves inside the job (``in_job``). The manager that puts them together is
:class:`async_reward.managers.llm_judge.LLMJudgeRewardManager`.

In release 0.1 ``async_reward.judge`` was the module now at :mod:`async_reward.judge.prompts`; its
names still resolve here for one release, with a ``DeprecationWarning``.

Internal: nothing here is public API ("What is public" in docs/package_structure.md); it may move
without a deprecation.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    """A name of 0.1's ``async_reward.judge`` module, from :mod:`async_reward.judge.prompts`."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    prompts = importlib.import_module("async_reward.judge.prompts")
    if name not in getattr(prompts, "__all__", ()):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from async_reward._moved import moved_warning

    moved_warning(f"async_reward.judge.{name}", f"async_reward.judge.prompts.{name}")
    return getattr(prompts, name)
