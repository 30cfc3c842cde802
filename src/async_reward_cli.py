"""The ``async-reward`` command's front door: ``--help`` and ``--version`` answer at once.

Importing ``async_reward`` registers our reward managers with verl, which imports verl, torch and
Ray: seconds, and the reason the registration is guaranteed wherever the package is imported (Ray
workers included). So the console script enters here, in a module outside the package, whose only
imports are the standard library's: the command list, the version and argument errors before a
command are answered without touching the package. A command is handed to ``async_reward.tools.cli``,
which builds the full parser from the same names and texts (so both print the same ``--help``).

``async_reward.tools.cli`` is imported without running the package's ``__init__`` first (see
:func:`import_command_line`): a command's ``--help``, ``serve`` (the dev judge server: aiohttp and
the standard library) and a usage error never import verl, torch or Ray. ``score`` imports them
when it builds the manager, as a verl reward worker does (``verl.trainer.ppo.reward.
load_reward_manager`` and our managers' verl base classes), and ``bench`` when it starts.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = [
    "COMMANDS",
    "DESCRIPTION",
    "PROG",
    "add_front_arguments",
    "distribution_version",
    "import_command_line",
    "main",
]

PROG = "async-reward"
DESCRIPTION = "asyncio-native reward managers for verl: tools for serving, benchmarking and scoring."
#: Each command and its one-line help, in the order ``--help`` lists them.
COMMANDS: dict[str, str] = {
    "serve": "run the local OpenAI-compatible judge and /score reward service (with fault injection)",
    "bench": "pipeline speed-up benchmark against a local judge server (make bench runs --quick)",
    "score": "score a JSONL file of (prompt, response, ground truth) rows offline, resumably",
}
_DISTRIBUTION = "async-reward"


def distribution_version() -> str:
    """The installed ``async-reward`` distribution's version (read from its metadata, not the package)."""
    from importlib.metadata import PackageNotFoundError, version  # ~0.08 s: only when asked

    try:
        return version(_DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``, like argparse's own, but the version is looked up only when it is asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show program's version number and exit")
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"{parser.prog} {distribution_version()}")
        parser.exit()


def add_front_arguments(parser: argparse.ArgumentParser) -> None:
    """The top-level options every ``async-reward`` parser has (here and in ``async_reward.tools.cli``)."""
    parser.add_argument("--version", action=_VersionAction)


def _front_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    add_front_arguments(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in COMMANDS.items():
        commands.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``async-reward`` script; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not (args and args[0] in COMMANDS):
        # --help, --version, no command or an unknown one: argparse answers and exits, at once.
        _front_parser().parse_known_args(args)
    command_line = import_command_line()
    return int(command_line.main(args))


def import_command_line() -> ModuleType:
    """``async_reward.tools.cli``, imported without running ``async_reward/__init__.py``.

    The package's ``__init__`` registers our managers with verl, which imports verl, torch and
    Ray: seconds of CPU that ``serve`` and ``--help`` do not need. ``async_reward.tools.cli`` imports only
    modules that need neither (the dev server, the score options' names and checks); the heavy ones
    are imported by the command that uses them. So the package module is put in ``sys.modules``
    unexecuted while ``async_reward.tools.cli`` is imported, and taken out again: the first later
    ``import async_reward`` (``score`` building its manager) runs ``__init__`` as usual, registering
    the managers, and reuses the submodules already loaded.
    """
    if (
        "async_reward" in sys.modules
    ):  # imported already (python -m async_reward.tools.cli, a test): no saving
        import async_reward.tools.cli

        return async_reward.tools.cli
    spec = importlib.util.find_spec("async_reward")
    if spec is None:  # pragma: no cover (the distribution ships both)
        raise ModuleNotFoundError("async_reward is not installed", name="async_reward")
    sys.modules["async_reward"] = importlib.util.module_from_spec(spec)
    try:
        # Binds the unexecuted package module here; a plain ``import async_reward.tools.cli`` after the
        # ``del`` would import the package itself first, __init__ and all.
        import async_reward.tools.cli

        return async_reward.tools.cli
    finally:
        del sys.modules["async_reward"]


if __name__ == "__main__":
    raise SystemExit(main())
