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


# ------------------------------------------------------------------ where state may be removed

PLACE_FUNCTIONS = (
    "login_home",
    "add_place",
    "state_places",
    "norm_path",
    "only_wildcards",
    "outside_places",
    "physical",
    "path_problem",
)


def _path_problem(shell: list[str], home: Path, path: str) -> str | None:
    """path_problem run in `shell` with HOME=home: its WHY, or None when the path may go."""
    program = (
        "NL='\n'\nDEFAULT_IFS=$IFS\n"
        + "".join(_function(name) for name in PLACE_FUNCTIONS)
        + 'state_places\nif path_problem "$1"; then printf "%s" "$WHY"; else printf "OK"; fi'
    )
    out = subprocess.run(
        [*shell, "-c", program, "sh", path],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
    ).stdout
    return None if out == "OK" else out


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/opt/*", "not where training state lives"),
        ("/usr/../opt", "/opt: not where training state lives"),
        ("/tmp/../etc/x", "/etc/x: not where training state lives"),
        ("/tmp", "not where training state lives"),
        ("/tmp/", "not where training state lives"),
        ("/", "not where training state lives"),
        ("~", "not where training state lives"),
        ("~/.cache", "not where training state lives"),
        ("~/.ssh/id_rsa", "not where training state lives"),
        ("/tmp/*", "'*' matches everything in /tmp"),
        ("/tmp/.*", "'.*' matches everything in /tmp"),
        ("/var/tmp/[!.]*", "'[!.]*' matches everything in /var/tmp"),
        ("//tmp//*/x", "'*' matches everything in /tmp"),
        ("tmp/x", "relative"),
        ("/tmp/cuda_*", None),
        ("//tmp//./cuda_*", None),
        ("/tmp/x/../torch_y", None),
        ("/dev/shm/torch_*", None),
        ("/var/tmp/job-1", None),
        ("~/.nv", None),
        ("~/.nv/ComputeCache", None),
        ("~/.triton", None),
        ("~/.cache/torch_extensions", None),
    ],
)
def test_path_problem_agrees_with_fleet_s_own_check(
    shell: list[str], tmp_path: Path, path: str, why: str | None
) -> None:
    """The node refuses exactly what fleet refuses (no symlinks involved here), and says why."""
    if shutil.which(shell[0]) is None:
        pytest.skip(f"{shell[0]} is not installed")
    from fleet.deletion import state_path_problem

    home = tmp_path / "home"
    home.mkdir()
    got = _path_problem(shell, home, path)
    if why is None:
        assert got is None
        assert state_path_problem(path) is None
    else:
        assert got is not None
        assert why in got, got
        assert state_path_problem(path) is not None


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_path_problem_resolves_symlinked_directories_before_the_first_wildcard(
    shell: list[str], tmp_path: Path
) -> None:
    if shutil.which(shell[0]) is None:
        pytest.skip(f"{shell[0]} is not installed")
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True)
    (home / ".cache" / "to-etc").symlink_to("/etc")
    (home / ".cache" / "to-tmp").symlink_to("/tmp")
    got = _path_problem(shell, home, "~/.cache/to-etc/*")
    assert got is not None
    assert got.startswith("resolves to /etc/*: not where training state lives"), got
    assert _path_problem(shell, home, "~/.cache/to-tmp/cuda_*") is None
    # the last name is never resolved: a link there is removed, not what it points to
    assert _path_problem(shell, home, "~/.cache/to-etc") is None
