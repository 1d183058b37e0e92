"""The README and docs/ pages: every link resolves, every page is reachable from the README,
every results file a page names exists, and the README stays a five-minute read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_lines import edgefl_lines, parses

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
RESULT = re.compile(r"`?(bench/results/[\w./-]+\.(?:md|json|png))")


def _links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text()) if "://" not in t]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_resolves(page):
    missing = [t for t in _links(page) if not (page.parent / t).resolve().exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_results_file_named_exists(page):
    missing = sorted({p for p in RESULT.findall(page.read_text()) if not (ROOT / p).exists()})
    assert not missing, f"{page.name} names results that are not in the repository: {missing}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t).resolve() for t in _links(ROOT / "README.md")}
    orphans = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link: {orphans}"


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text()) < 12_000, "move detail into a docs/ page"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_on_the_page_parses(page):
    """Every `edgefl ...` line of a page's bash blocks names a real command with options it
    takes (the README's tour also runs, tests/project/test_tour.py; the docs pages' commands run in
    tests/project/test_docs_commands.py)."""
    lines = edgefl_lines(page.read_text())
    for line in lines:
        parses(line)
    if page.name in ("README.md", "deploy.md", "methods.md", "har.md"):
        assert lines, f"{page.name} shows no edgefl command any more"
