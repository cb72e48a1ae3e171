"""Shared fixtures (files in tmp_path, inventories and playbooks from text) and the `root` marker:
a test that needs root is skipped, saying so, when the suite runs as another user."""

from __future__ import annotations

import os
import shutil
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleet.core.playbook import Playbook, load_playbook
from fleet.inventory.loader import Inventory, load_inventory

# Warm connections (--persist) would leave keeper processes behind every test that runs fleet:
# off for the suite; the tests of warm connections (tests/e2e/test_warm.py) turn them on.
os.environ["FLEET_PERSIST"] = "0"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (namespaces, sshd nodes or another uid)")
    for item in items:
        if item.get_closest_marker("root"):
            item.add_marker(skip)


@pytest.fixture
def trusted_tmp() -> Iterator[Path]:
    """A directory fleet's trust rule accepts (fleet/core/trust.py): tmp_path is under /tmp, which
    is world-writable, so project files found there (fleet.yaml, ./inventory.yaml, ./group_vars)
    are ignored; this one is under the home directory, owned by the test's user."""
    base = Path.home() / ".cache" / "fleet-tests"
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write dedented text to tmp_path/name and return the path."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return path

    return _write


@pytest.fixture
def inventory(write: Callable[[str, str], Path]) -> Callable[[str], Inventory]:
    """Load an inventory from YAML text (via a real file, as the CLI does)."""

    def _inventory(text: str) -> Inventory:
        return load_inventory(write("inventory.yaml", text))

    return _inventory


@pytest.fixture
def playbook(write: Callable[[str, str], Path]) -> Callable[[str], Playbook]:
    """Load a playbook from YAML text (via a real file, as the CLI does)."""

    def _playbook(text: str) -> Playbook:
        return load_playbook(str(write("book.yaml", text)))

    return _playbook


@pytest.fixture
def run_main(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """The console entry point `fleet.cli.main(argv)`, which maps every error to its exit code:
    (exit code, stdout, stderr)."""
    from fleet.cli import main

    def _run(*argv: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as info:
            main(list(argv))
        out, err = capsys.readouterr()
        assert isinstance(info.value.code, int)
        return info.value.code, out, err

    return _run
