"""The licence a user is told about is the licence that ships: ``pyproject.toml`` declares Apache-2.0
(PEP 639 ``license`` + ``license-files``) and the LICENSE file at the root is that licence's full text,
which hatchling copies into the wheel's ``.dist-info/licenses/`` and into the sdist."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_license_file_is_the_full_apache_2_text_pyproject_declares() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    assert project["license"] == "Apache-2.0"  # an SPDX expression, as PEP 639 wants
    assert project["license-files"] == ["LICENSE"]
    # PEP 639's license-files is honoured from hatchling 1.27 on; older ones would drop the file.
    assert "hatchling>=1.27" in pyproject["build-system"]["requires"]
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    for section in ("TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION", "9. Accepting Warranty"):
        assert section in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text


def test_the_installed_distribution_declares_the_verl_plugin_verl_reads() -> None:
    """verl's ``import verl`` loads ``importlib.metadata.entry_points(group="verl.plugins")``: the
    installed ``async-reward`` (editable here: its ``.dist-info``) must hold ours, naming the module
    outside the package that the wheel ships."""
    from importlib.metadata import distribution, entry_points

    (ours,) = [ep for ep in entry_points(group="verl.plugins") if ep.name == "async_reward"]
    assert ours.value == "async_reward_verl_plugin"
    assert ours.dist is not None and ours.dist.metadata["Name"] == "async-reward"
    assert [ep.value for ep in distribution("async-reward").entry_points if ep.group == "verl.plugins"] == [
        "async_reward_verl_plugin"
    ]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["verl.plugins"] == {
        "async_reward": "async_reward_verl_plugin"
    }
    wheel = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert "src/async_reward_verl_plugin.py" in wheel["only-include"]
    assert (ROOT / "src" / "async_reward_verl_plugin.py").is_file()
