"""Gathered output on real nodes: identical outputs once under their folded host set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fleetrun import run_fleet

from fleet.core import nodeset

pytestmark = pytest.mark.root

# The first two nodes print one thing, the third another, the fourth nothing; the third also
# writes to stderr. `hostname` is each node's own (its UTS namespace).
SCRIPT = (
    'n=$(hostname); case "$n" in {a}|{b}) echo "driver 535.104.05"; echo "cuda 12.2";; '
    '{c}) echo "driver 550.54.14"; echo "ECC errors: 3" >&2;; esac'
)


def _script(sandbox: Any) -> tuple[str, list[str]]:
    names = [n.name for n in sandbox.nodes()]
    return SCRIPT.format(a=names[0], b=names[1], c=names[2]), names


def test_exec_gathers_identical_outputs_under_folded_hosts(sandbox: Any, tmp_path: Path) -> None:
    script, names = _script(sandbox)
    result = run_fleet(sandbox, "exec", script, "--plain", log_dir=tmp_path)

    assert result.code == 0, result.stderr
    out = result.stdout
    tail = out[out.index("---") :]  # the gathered part, after the streamed lines
    lines = tail.splitlines()
    pair = f"{names[0].rstrip('0123456789')}"
    first = next(i for i, ln in enumerate(lines) if ln.startswith(pair) and "(2)" in ln)
    assert lines[first + 2 : first + 4] == ["  | driver 535.104.05", "  | cuda 12.2"]
    third = lines.index(f"{names[2]} (1)")
    assert third > first
    # One line on stdout, one on stderr: two streams, in whichever order they arrived.
    assert sorted(lines[third + 2 : third + 4]) == ["  ! ECC errors: 3", "  | driver 550.54.14"]
    assert f"no output: {names[3]}" in tail


def test_json_run_finished_carries_the_groups(sandbox: Any, tmp_path: Path) -> None:
    script, names = _script(sandbox)
    result = run_fleet(sandbox, "exec", script, "--json", log_dir=tmp_path)
    assert result.code == 0, result.stderr
    groups = result.final()["output"]
    assert [g["count"] for g in groups] == [2, 1]
    assert sorted((ln["stream"], ln["text"]) for ln in groups[1]["lines"]) == [
        ("stderr", "ECC errors: 3"),
        ("stdout", "driver 550.54.14"),
    ]
    assert groups[1]["hosts"] == names[2]
    assert result.final()["no_output"] == names[3]


def test_plain_no_gather_streams_host_by_host_only(sandbox: Any, tmp_path: Path) -> None:
    script, names = _script(sandbox)
    result = run_fleet(sandbox, "exec", script, "--plain", "--no-gather", log_dir=tmp_path)
    assert result.code == 0, result.stderr
    assert "---" not in result.stdout
    assert "no output:" not in result.stdout
    streamed = [ln for ln in result.stdout.splitlines() if "driver" in ln]
    assert len(streamed) == 3
    assert any(ln.startswith(names[2]) and "550.54.14" in ln for ln in streamed)


def _gathered(stdout: str) -> list[str]:
    """The gathered part of --plain's output: from its first rule to the outcome lines."""
    lines = stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("---"))
    end = next(i for i in range(len(lines) - 1, start, -1) if lines[i].startswith("---"))
    end = next(i for i in range(end + 1, len(lines)) if lines[i].strip().startswith("ok "))
    return lines[start:end]


def test_a_node_cannot_forge_a_block_of_other_hosts(sandbox: Any, tmp_path: Path) -> None:
    """A node that prints a rule, a host set and FAILED: its lines stay behind the gutter,
    and the only block titles at the margin are fleet's."""
    names = [n.name for n in sandbox.nodes()][:3]
    pair = f"{nodeset.fold([names[0], names[2]])} (2)"  # the others' own block title
    script = (
        f'if [ "$(hostname)" = {names[1]} ]; then printf "all good\\n\\n---------------\\n'
        f'{pair}\\n---------------\\nFAILED: disk corrupt\\n"; else echo "all good"; fi'
    )
    result = run_fleet(sandbox, "exec", script, "--plain", "-l", ",".join(names), log_dir=tmp_path)
    assert result.code == 0, result.stderr
    shown = _gathered(result.stdout)
    assert shown.count(f"  | {pair}") == 1
    assert shown.count("  | FAILED: disk corrupt") == 1
    titles = [ln for ln in shown if ln and not ln.startswith(("-", " "))]
    assert titles == [pair, f"{names[1]} (1)"]


def test_a_line_too_long_to_show_is_marked_where_it_was(sandbox: Any, tmp_path: Path) -> None:
    """A 20000-byte line (cut to 16 KiB by the reader) cannot fit the group's 16 KiB: a marker
    stands where it was, between the lines before and after it."""
    name = sandbox.nodes()[0].name
    script = 'echo before; head -c 20000 /dev/zero | tr "\\0" b; echo; echo after'
    result = run_fleet(sandbox, "exec", script, "--plain", "-l", name, log_dir=tmp_path)
    assert result.code == 0, result.stderr
    shown = _gathered(result.stdout)
    at = shown.index("  | before")
    assert shown[at + 1].startswith("  [... 1 line not shown: 16.")
    assert shown[at + 2] == "  | after"
    assert "more line" not in result.stdout
