"""Every link between README.md and docs/ resolves: relative links name files that exist, and
anchors name headings of the file they point into. The README stays a landing page."""

from __future__ import annotations

from pathlib import Path

import pytest
from doctext import ROOT, anchors, code_blocks, doc_files, is_external, links, rel

LINKS = [(path, line, target) for path in doc_files() for line, target in links(path)]


def _broken(path: Path, target: str) -> str | None:
    """Why a link from PATH to TARGET does not resolve, or None."""
    file_part, _, fragment = target.partition("#")
    dest = (path.parent / file_part).resolve() if file_part else path
    if not dest.exists():
        return f"no such file {file_part}"
    if fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text("utf-8")):
        return f"no heading #{fragment} in {dest.name}"
    return None


def test_there_are_links_to_check() -> None:
    assert len(LINKS) >= 40


@pytest.mark.parametrize(
    ("path", "line", "target"),
    [link for link in LINKS if not is_external(link[2])],
    ids=lambda v: rel(v) if isinstance(v, Path) else str(v),
)
def test_every_relative_link_resolves(path: Path, line: int, target: str) -> None:
    assert _broken(path, target) is None, f"{rel(path)}:{line}: {target}: {_broken(path, target)}"


@pytest.mark.parametrize("path", doc_files(), ids=rel)
def test_every_code_fence_is_closed(path: Path) -> None:
    fences = [
        line for line in path.read_text("utf-8").splitlines() if line.lstrip().startswith("```")
    ]
    assert len(fences) % 2 == 0, f"{rel(path)}: a ``` fence is never closed"


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    page.write_text("# Title\n\n## `fleet cleanup`\n", encoding="utf-8")
    assert _broken(page, "#fleet-cleanup") is None
    assert _broken(page, "#title") is None
    assert _broken(page, "#nope") is not None
    assert _broken(page, "b.md") is not None


def test_the_readme_is_a_landing_page_with_the_two_commands_first() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 250
    first = code_blocks(readme)[0].body.splitlines()
    assert [line.split()[0] for line in first] == ["./scripts/demo", "./scripts/test"]
    assert "./scripts/test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_what_fleet_trusts_is_findable_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "what-fleet-trusts" in anchors(readme)
    assert "docs/safety.md#what-fleet-trusts" in readme
    safety = (ROOT / "docs" / "safety.md").read_text(encoding="utf-8")
    assert "what-fleet-trusts" in anchors(safety)


@pytest.mark.parametrize(
    "guide",
    ["guides/cleanup.md", "guides/launch.md", "guides/containers.md", "guides/janitor.md"],
)
def test_every_guide_is_one_click_from_the_readme(guide: str) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"(docs/{guide}" in readme
