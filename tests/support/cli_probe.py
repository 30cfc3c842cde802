"""The fresh processes of tests/tools/test_cli_front.py: one interpreter loads the third-party packages
once, then forks a child per case, in which the case's own imports are the first of ours and verl's.
Kept apart from the test module, whose imports load the package (and so verl)."""

from __future__ import annotations

import sys

#: The checks that need an interpreter in which nothing of ours (nor verl) was imported yet, each run
#: in a forked child of one probe interpreter (:func:`probe_first_imports`).
FIRST_IMPORT_CASES = ("import async_reward", "front door first")


def _first_import_case(case: str) -> dict[str, object]:
    """In a forked child of :func:`probe_first_imports` (nothing of ours or verl's loaded yet)."""
    if case == "import async_reward":  # nothing but the package's import
        import async_reward  # first, and nothing else of ours

        # isort: split
        from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

        registered = {name: f"{cls.__module__}.{cls.__qualname__}" for name, cls in REWARD_MANAGER.items()}
        return {"case": case, "registered": registered}
    # "front door first": ``async-reward score`` imports the command line before the package's __init__
    import async_reward_cli

    async_reward_cli.import_command_line()
    early = sorted(n for n in sys.modules if n.startswith("async_reward.") and n.count(".") == 1)
    import async_reward

    missing = [n for n in early if getattr(async_reward, n.split(".")[1], None) is not sys.modules[n]]
    return {"case": case, "early": early, "missing": missing}


def probe_first_imports() -> None:
    """Run in a subprocess: the third-party packages once (torch, transformers, ...: most of the
    CPU-seconds of importing verl; ``tests/support/first_import_probe.py``), then a forked child per
    case of :data:`FIRST_IMPORT_CASES`, in which none of our modules nor verl is loaded before the
    case's own imports (asserted here). What the cases read (verl's registry, which of our modules
    are loaded and bound on the package) depends only on those. One interpreter for both: each start
    costs a verl import."""
    from tests.support.first_import_probe import preload_third_party, report_each_in_a_fork

    preload_third_party()
    assert not [m for m in sys.modules if m.split(".")[0] in ("verl", "async_reward", "async_reward_cli")]
    report_each_in_a_fork(FIRST_IMPORT_CASES, _first_import_case)
