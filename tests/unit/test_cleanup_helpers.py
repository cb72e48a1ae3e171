"""cleanup.sh's pure helpers, cut out of the shipped script and run in each node shell.

sort_pids sorts short lists in the shell (no sort/tr per call) and longer ones with sort -n -u;
both must give what Python's sorted(set()) gives.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

SCRIPT = Path(__file__).resolve().parents[2] / "fleet" / "remote" / "cleanup.sh"
SHELLS = [["dash"], ["bash", "--posix"], ["busybox", "sh"]]


def _function(name: str) -> str:
    match = re.search(rf"^{name}\(\) {{\n.*?^}}\n", SCRIPT.read_text(), re.S | re.M)
    assert match, f"{name} not found in {SCRIPT}"
    return match.group(0)


def _sort_pids(shell: list[str], pids: list[int]) -> list[int]:
    program = _function("sort_pids") + 'sort_pids "$1"; printf "%s" "$SORTED"'
    out = subprocess.run(
        [*shell, "-c", program, "sh", " ".join(map(str, pids))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [int(p) for p in out.split()]


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
@settings(max_examples=60, deadline=None)
@given(pids=st.lists(st.integers(min_value=1, max_value=4_194_304), max_size=40))
def test_sort_pids_sorts_numerically_without_duplicates(shell: list[str], pids: list[int]) -> None:
    if shutil.which(shell[0]) is None:
        pytest.skip(f"{shell[0]} is not installed")
    assert _sort_pids(shell, pids) == sorted(set(pids))
