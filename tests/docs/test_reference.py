"""The command reference and man pages are generated from the click definitions, committed, and
cover every command and option; every command and option has help of its own."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from doctext import ROOT, load_generator

GEN = load_generator()
ENTRIES = list(GEN.walk(GEN.root_group()))


def _options(entry: object) -> list[click.Option]:
    """The visible options of one command."""
    ctx = entry.ctx  # type: ignore[attr-defined]
    params = entry.command.get_params(ctx)  # type: ignore[attr-defined]
    return [p for p in params if isinstance(p, click.Option) and not p.hidden]


def _section(reference: str, path: str) -> str:
    """The reference's section of one command: from its heading to the next."""
    heading = f"\n## `{path}`\n"
    assert heading in reference, f"{path}: no section in docs/reference/commands.md"
    return reference.split(heading, 1)[1].split("\n## ", 1)[0]


def test_the_committed_reference_and_man_pages_match_the_cli() -> None:
    assert GEN.stale(ROOT) == [], "run: .venv/bin/python scripts/gen-reference"


def test_the_generator_check_mode_agrees() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-reference"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_a_changed_help_makes_the_reference_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    cleanup = GEN.root_group().commands["cleanup"]
    monkeypatch.setattr(cleanup, "help", "Something else entirely.")
    assert "docs/reference/commands.md" in GEN.stale(ROOT)
    assert "docs/man/man1/fleet-cleanup.1" in GEN.stale(ROOT)


def test_the_tree_has_every_command() -> None:
    paths = {e.path for e in ENTRIES}
    assert {"fleet cleanup", "fleet launch", "fleet janitor run-once", "fleet sandbox up"} <= paths
    assert len(paths) >= 20


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.path)
def test_every_command_has_help(entry: object) -> None:
    assert GEN.help_text(entry.command).strip()  # type: ignore[attr-defined]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.path)
def test_every_option_has_help(entry: object) -> None:
    bare = [o.opts[-1] for o in _options(entry) if not (o.help or "").strip()]
    assert bare == []


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.path)
def test_every_command_and_option_is_in_the_reference(entry: object) -> None:
    reference = (ROOT / "docs" / "reference" / "commands.md").read_text(encoding="utf-8")
    section = _section(reference, entry.path)  # type: ignore[attr-defined]
    names = [n for o in _options(entry) for n in (*o.opts, *o.secondary_opts)]
    assert names
    assert [n for n in names if f"`{n}`" not in section] == []


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.path)
def test_every_command_has_a_man_page(entry: object) -> None:
    name = entry.path.replace(" ", "-")  # type: ignore[attr-defined]
    page = (ROOT / "docs" / "man" / "man1" / f"{name}.1").read_text(encoding="utf-8")
    assert page.startswith(".TH ")
    assert "\b" not in page
