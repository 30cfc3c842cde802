"""``scripts/install_venv.py``: pip's settings reach uv unchanged in meaning, or pip installs."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from tests.support.script_module import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install_venv.py"


install_venv = load_script(SCRIPT, "install_venv")

#: ``pip config list`` on the development machine (a file and ``PIP_*`` variables).
MACHINE_CONFIG = """\
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels-from-env'
"""


def test_every_index_location_and_constraint_of_pip_reaches_uv():
    options, environment = install_venv.uv_options(install_venv.pip_settings(MACHINE_CONFIG))
    pairs = list(itertools.pairwise(options))
    assert ("--extra-index-url", "file:///opt/pypi/simple") in pairs
    assert ("--extra-index-url", "file:///opt/pypi-more/simple") in pairs
    assert ("--constraint", "/etc/xdg/pip/constraints.txt") in pairs
    # The environment variable wins over the file, as in pip: only its find-links is passed.
    assert ("--find-links", "/opt/wheels-from-env") in pairs
    assert "/opt/wheels" not in options
    # pip's pooling of every location (else PyPI's CUDA torch could win over a local CPU build) and its
    # byte-compilation on install.
    assert ("--index-strategy", "unsafe-best-match") in pairs
    assert "--compile-bytecode" in options
    assert environment == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", "UV_HTTP_TIMEOUT": "180"}


def test_index_url_and_no_index_are_passed():
    settings = install_venv.pip_settings(
        "global.index-url='https://mirror.example/simple'\n:env:.no-index='true'\n"
    )
    options, _ = install_venv.uv_options(settings)
    assert ("--index-url", "https://mirror.example/simple") in list(itertools.pairwise(options))
    assert "--no-index" in options


def test_sections_pip_install_does_not_read_are_left_out():
    listed = "freeze.find-links='/nowhere'\ninstall.find-links='/here'\nno equals sign\n"
    settings = install_venv.pip_settings(listed)
    assert settings == {"find-links": "/here"}


@pytest.mark.parametrize("line", ["global.only-binary=':all:'", ":env:.pre='1'", "install.no-deps='yes'"])
def test_a_setting_that_could_change_what_is_installed_and_has_no_translation_means_pip(line):
    with pytest.raises(install_venv.UnsupportedPipSetting, match=line.split(".")[-1].split("=")[0]):
        install_venv.uv_options(install_venv.pip_settings(line + "\n"))


def test_usage_without_the_separator_is_refused(capsys):
    assert install_venv.main(["torch==2.13.0"]) == 2
    assert "Usage" in capsys.readouterr().err


def test_without_uv_pip_installs_first_then_the_rest(monkeypatch):
    """uv not installable: pip runs twice, the first requirements (torch) alone before the rest."""
    commands: list[list[str]] = []

    def fake_run(command, environment=None):
        commands.append(list(command))
        return "uv" not in command  # installing uv fails; every pip install succeeds

    monkeypatch.setattr(install_venv, "run", fake_run)
    assert install_venv.main(["torch==2.13.0", "--", "-e", ".[test]"]) == 0
    assert commands == [
        [sys.executable, "-m", "pip", "install", "--quiet", "uv"],
        [sys.executable, "-m", "pip", "install", "--quiet", "torch==2.13.0"],
        [sys.executable, "-m", "pip", "install", "--quiet", "-e", ".[test]"],
    ]
