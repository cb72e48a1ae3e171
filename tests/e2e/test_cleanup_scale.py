"""`fleet cleanup`, its preview and preflight against real sshd nodes with what no count or length
limit may hide (issue 17): a trainer whose command line is longer than 4,096 bytes (matched on
its whole command line, like `pgrep -f`), and thousands of leftover state paths with hundreds of
matching processes (the lists act.sh works through travel on stdin, not as arguments or in one
SSH packet).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FleetResult, run_fleet

pytestmark = pytest.mark.root

PATHS = 5000
PROCS = 300
LONG = 4200  # bytes of argv before the pattern's match


def _count(sandbox: Any, node: Any, script: str) -> int:
    return int(sandbox.run_on(node, script).stdout.strip() or 0)


def _trainers(sandbox: Any, node: Any, name: str) -> int:
    """Live processes whose argv[0] ends with `name` (read from /proc: never this shell)."""
    script = (
        "n=0; for d in /proc/[0-9]*; do "
        f"case $(head -c 5000 $d/cmdline 2>/dev/null | tr '\\0' ' ') in *{name}' '*) "
        "grep -q '^State:.*Z' $d/status 2>/dev/null || n=$((n+1));; esac; done; echo $n"
    )
    return _count(sandbox, node, script)


@pytest.fixture
def node(sandbox: Any) -> Iterator[Any]:
    node = sandbox.nodes()[0]
    yield node
    sandbox.run_on(
        node,
        "for d in /proc/[0-9]*; do case $(head -c 5000 $d/cmdline 2>/dev/null | tr '\\0' ' ') in "
        "*scaletrainer' '* | *torchrun' 600 ') kill -KILL ${d#/proc/} 2>/dev/null;; esac; done; "
        "rm -rf /dev/shm/torch_scale_* /tmp/.torch_distributed_scale_*; true",
        timeout_s=120,
    )


def _cleanup(sandbox: Any, node: Any, log_dir: Path, *extra: str) -> FleetResult:
    return run_fleet(
        sandbox, "cleanup", "--yes", "--grace", "1", "--json", "-l", node.name, *extra,
        log_dir=log_dir, timeout_s=600,
    )  # fmt: skip


def test_a_trainer_whose_command_line_passes_4096_bytes_is_cleaned_up(
    sandbox: Any, node: Any, tmp_path: Path
) -> None:
    head = "x" * LONG
    sandbox.run_on(
        node,
        f"setsid bash -c 'exec -a \"{head} torchrun\" sleep 600' </dev/null >/dev/null 2>&1 &",
    )
    deadline = time.monotonic() + 15
    while _trainers(sandbox, node, "torchrun") < 1:
        assert time.monotonic() < deadline, "the long trainer did not come up"
        time.sleep(0.05)
    assert sandbox.run_on(node, "pgrep -f torchrun").stdout.strip(), "pgrep -f finds it"

    preview = _cleanup(sandbox, node, tmp_path / "p", "--preview")
    assert preview.code == 0, preview.stdout + preview.stderr
    assert "kill 1 process" in preview.stdout, preview.stdout

    result = _cleanup(sandbox, node, tmp_path / "c")

    assert result.code == 0, result.stdout + result.stderr
    assert result.final()["hosts"][node.name]["done"]["killed"] == 1, result.stdout
    assert _trainers(sandbox, node, "torchrun") == 0


def test_thousands_of_leftovers_and_hundreds_of_trainers_are_all_cleaned_up(
    sandbox: Any, node: Any, tmp_path: Path
) -> None:
    plant = (
        f"i=0; while [ $i -lt {PATHS // 2} ]; do "
        ": > /dev/shm/torch_scale_$i; mkdir /tmp/.torch_distributed_scale_$i; i=$((i+1)); done; "
        f"i=0; while [ $i -lt {PROCS} ]; do "
        "setsid bash -c 'exec -a scaletrainer sleep 600' </dev/null >/dev/null 2>&1 & "
        "i=$((i+1)); done"
    )
    sandbox.run_on(node, plant, timeout_s=120)
    deadline = time.monotonic() + 60
    while _trainers(sandbox, node, "scaletrainer") < PROCS:
        assert time.monotonic() < deadline, "the trainers did not come up"
        time.sleep(0.2)
    args = ("--pattern", "scaletrainer", "--var", "max_kill_share=1")

    preview = _cleanup(sandbox, node, tmp_path / "p", *args, "--preview")
    assert preview.code == 0, preview.stdout + preview.stderr
    assert f"kill {PROCS} processes" in preview.stdout, preview.stdout[-3000:]
    assert f"remove {PATHS} paths" in preview.stdout, preview.stdout[-3000:]

    checked = run_fleet(
        sandbox, "preflight", "--dir", "/tmp", "--min-free-gb", "0", "-l", node.name,
        "--var", "min_shm_gb=0.01", "--var", "patterns=scaletrainer", "--json",
        log_dir=tmp_path / "f", timeout_s=600,
    )  # fmt: skip
    assert checked.code == 0, checked.stdout + checked.stderr
    lines = [json.dumps(e) for e in checked.json_lines() if e.get("event") == "OutputLine"]
    assert any(f"{PROCS} processes, {PATHS} paths" in line for line in lines), lines

    result = _cleanup(sandbox, node, tmp_path / "c", *args)

    assert result.code == 0, result.stdout + result.stderr
    host = result.final()["hosts"][node.name]
    assert host["outcome"] == "ok", host
    assert host["done"]["killed"] == PROCS, host
    assert host["done"]["removed"] == PATHS, host
    assert host["done"]["clean"] is True, host
    assert _trainers(sandbox, node, "scaletrainer") == 0
    left = "ls -d /dev/shm/torch_scale_* /tmp/.torch_distributed_scale_* 2>/dev/null | wc -l"
    assert _count(sandbox, node, left) == 0
