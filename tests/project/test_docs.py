"""The docs site builds with every warning an error, and the README's links lead somewhere.

MkDocs is run as a user runs it (``python -m mkdocs build --strict`` in a subprocess), into a temporary
directory: a broken link between pages, a missing anchor, a page left out of the navigation or a
docstring mkdocstrings cannot render stops the build, so it fails ``make test``. The README is read
on GitHub and PyPI rather than built, so its relative links are checked here: each names a file that
exists, and each docs page it names is one the site publishes, with the anchor it points at.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

#: ``[text](target)`` with a target that is not a URL; images too. Code spans are removed first.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.MULTILINE)


class _MkDocsLoader(yaml.SafeLoader):
    """mkdocs.yml uses MkDocs' own ``!relative`` tag; the nav is all this test reads."""


_MkDocsLoader.add_constructor("!relative", lambda loader, node: loader.construct_scalar(node))


def relative_links(markdown: str) -> list[str]:
    links = _LINK.findall(_CODE.sub("", markdown))
    return [link for link in links if not re.match(r"^[a-z][a-z0-9+.-]*:", link)]


def nav_pages(nav: Any) -> set[str]:
    """Every page file the site's navigation lists."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(nav_pages(item) for item in nav))
    if isinstance(nav, dict):
        return set().union(*(nav_pages(value) for value in nav.values()))
    return set()


def anchors(page: Path) -> set[str]:
    """The heading ids MkDocs gives a page (python-markdown's toc slugify, as mkdocs.yml configures)."""
    return {
        slugify(_CODE.sub(lambda m: m.group(0).strip("`"), title), "-")
        for title in _HEADING.findall(re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL))
    }


@pytest.mark.subprocess
def test_docs_build_with_warnings_as_errors(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(site),
        ],
        cwd=tmp_path,  # not the repository: paths in mkdocs.yml must not depend on where it runs
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = build.stdout + build.stderr
    assert build.returncode == 0, output
    assert "WARNING" not in output, output
    # mkdocstrings rendered the API reference from the docstrings, not an empty page.
    api = (site / "api" / "managers" / "index.html").read_text()
    assert "AsyncRewardManager" in api and "run_single" in api
    # The changelog page includes the repository's CHANGELOG.md.
    assert "Unreleased" in (site / "changelog" / "index.html").read_text()


def test_readme_links_name_files_and_published_pages() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_MkDocsLoader)
    published = nav_pages(config["nav"])
    links = relative_links(README.read_text())
    assert links, "the README links to the docs"
    for link in links:
        path, _, anchor = link.partition("#")
        target = (ROOT / path) if path else README
        assert target.exists(), f"README links to {link}, which does not exist"
        if target.parent == DOCS and target.suffix == ".md":
            assert target.name in published, f"README links to {link}, which the docs site does not publish"
            if anchor:
                assert anchor in anchors(target), f"README links to {link}: no such heading"


def test_docs_name_no_path_of_a_development_machine() -> None:
    pages = [README, *DOCS.rglob("*.md")]
    for page in pages:
        found = re.findall(r"(?<![\w.])/(?:work|home|Users|root)/\S*", page.read_text())
        assert not found, f"{page.relative_to(ROOT)} names {found}"
