"""Install torch and this package into the virtualenv this interpreter belongs to (``make install``).

Why not plain pip: on the 2-core development machine pip spends ~78 s installing the ~170 packages
(torch, then verl's tree), uv ~33 s for the same set, the same versions to the last one (compared
with ``pip freeze``); the virtualenv is part of every fresh ``make test``. uv is installed into the
virtualenv with pip; if that fails (no registry) or uv cannot install, pip does it the old way, so a
machine that could build the virtualenv before still can.

uv does not read pip's configuration, so the settings pip would use (``pip config list``: files and
``PIP_*`` variables) are passed to uv as options; a setting this script does not know how to pass
means pip is used, never a different resolution. ``--index-strategy unsafe-best-match`` is pip's own
behaviour (every index and find-links location is one pool, the best version wins): without it uv
takes a package only from the first index that has it, and would pick PyPI's CUDA torch over the
local CPU build. ``--compile-bytecode`` is what pip does by default; it matters here because the
machine sets ``PYTHONDONTWRITEBYTECODE=1`` and every process would otherwise compile torch again.

Usage: ``python scripts/install_venv.py FIRST -- REST...``: pip installs the FIRST requirements, then
the REST (torch first, so no other requirement can pull a CUDA build); uv installs them in one go.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

#: pip settings that change nothing about what is installed (``cert`` and the timeouts are passed to
#: uv by :func:`uv_options` instead).
HARMLESS_PIP_SETTINGS = frozenset(
    {
        "disable-pip-version-check",
        "quiet",
        "verbose",
        "progress-bar",
        "no-color",
        "retries",
        "root-user-action",
        "no-input",
        "cache-dir",
        "no-cache-dir",
    }
)

#: pip settings passed to uv as the option of the same meaning; several values are whitespace-separated.
LIST_SETTINGS = {
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


class UnsupportedPipSetting(Exception):
    """A pip setting this script cannot pass to uv: pip installs instead."""


def pip_settings(pip_config_list: str) -> dict[str, str]:
    """The settings in ``pip config list`` output (``section.key='value'`` lines), for the sections
    ``pip install`` reads (``global``, ``install``, ``:env:``), the last one of a key winning as in pip
    (files are listed before the environment)."""
    settings: dict[str, str] = {}
    for line in pip_config_list.splitlines():
        name, separator, raw_value = line.partition("=")
        if not separator:
            continue
        section, _, key = name.rpartition(".")
        if section not in {"global", "install", ":env:"}:
            continue
        value = ast.literal_eval(raw_value)
        settings[key] = str(value)
    return settings


def uv_options(settings: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv's command-line options and environment for pip's ``settings``.

    Raises ``UnsupportedPipSetting`` for a setting that could change the resolution and has no
    translation here."""
    options = ["--index-strategy", "unsafe-best-match", "--compile-bytecode"]
    environment: dict[str, str] = {}
    for key, value in settings.items():
        if key in LIST_SETTINGS:
            for item in value.split():
                options += [LIST_SETTINGS[key], item]
        elif key == "index-url":
            options += ["--index-url", value]
        elif key == "no-index":
            if value.strip().lower() in {"1", "true", "yes", "on"}:
                options.append("--no-index")
        elif key == "cert":
            environment["SSL_CERT_FILE"] = value
        elif key in {"default-timeout", "timeout"}:
            environment["UV_HTTP_TIMEOUT"] = value
        elif key not in HARMLESS_PIP_SETTINGS:
            raise UnsupportedPipSetting(key)
    return options, environment


def run(command: Sequence[str], environment: Mapping[str, str] | None = None) -> bool:
    """Run ``command``; True when it succeeded."""
    return subprocess.run(list(command), env={**os.environ, **(environment or {})}).returncode == 0


def install_with_uv(python: str, requirements: Sequence[str]) -> bool:
    """Install ``requirements`` with uv; False (with the reason on stderr) when pip should instead."""
    if not run([python, "-m", "pip", "install", "--quiet", "uv"]):
        print("install_venv: uv could not be installed; installing with pip", file=sys.stderr)
        return False
    listed = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    try:
        options, environment = uv_options(pip_settings(listed))
    except UnsupportedPipSetting as setting:
        print(
            f"install_venv: pip setting {setting} has no uv option here; installing with pip", file=sys.stderr
        )
        return False
    uv = os.path.join(os.path.dirname(python), "uv")
    if run([uv, "pip", "install", "--python", python, "--quiet", *options, *requirements], environment):
        return True
    print("install_venv: uv failed (above); installing with pip", file=sys.stderr)
    return False


def main(arguments: Sequence[str]) -> int:
    if "--" not in arguments:
        print(__doc__, file=sys.stderr)
        return 2
    split = list(arguments).index("--")
    first, rest = list(arguments[:split]), list(arguments[split + 1 :])
    python = sys.executable
    if install_with_uv(python, first + rest):
        return 0
    for requirements in (first, rest):
        if requirements and not run([python, "-m", "pip", "install", "--quiet", *requirements]):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
