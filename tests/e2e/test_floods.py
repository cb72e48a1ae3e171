"""Output floods through the real CLI against real sshd nodes: fleet's memory and its run record
stay bounded whatever the nodes print (a memory bound, read from the kernel, not a timing)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, fleet_env

from fleet.records import runlog

pytestmark = pytest.mark.root

MIB = 1024 * 1024
# Per node: one 20 MB line, then ~70 MB of 1000-byte lines (more than a host log keeps in full).
HUGE_LINE = 20_000_000
KIB_LINES = 70_000
FLOOD = (
    f"head -c {HUGE_LINE} /dev/zero | tr '\\0' x; echo; "
    f"yes \"$(head -c 999 /dev/zero | tr '\\0' 0)\" | head -n {KIB_LINES}; echo flood-done"
)
# What fleet may hold beyond an idle run of the same hosts: the output budget in flight to the
# main thread (executor.OUTPUT_IN_FLIGHT_BYTES, 8 MiB, counted with an estimate of each event's
# overhead), paramiko's receive window per channel (2 MiB x 4 nodes), per host a line buffer and
# tails (~0.1 MiB) and a host log's kept tail (0.25 MB), and the allocator's slack. Measured:
# about 25 MiB. A fleet that held every line (a record buffering each host's log until the host
# ends, an unbounded queue) would need hundreds of MiB for this flood's 360 MB.
HEADROOM_MIB = 64


def _peak_rss_mib(box: Any, log_dir: Path, *args: str, timeout_s: float = 300) -> tuple[int, float]:
    """Run `fleet ARGS` (stdout to /dev/null, as a script would) and return its exit code and its
    own peak RSS: wait4's rusage of exactly that child, the kernel's high-water mark."""
    env = fleet_env(box, log_dir)
    with open(log_dir.parent / f"{log_dir.name}.stderr", "w") as err:
        proc = subprocess.Popen(
            [*FLEET, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                pytest.fail(f"fleet {' '.join(args)} did not end within {timeout_s}s")
            time.sleep(0.1)
    return proc.returncode, usage.ru_maxrss / 1024  # ru_maxrss is KiB on Linux


def test_a_flood_keeps_memory_and_the_record_bounded(sandbox: Any, tmp_path: Path) -> None:
    idle_dir, flood_dir = tmp_path / "idle", tmp_path / "flood"
    code, idle = _peak_rss_mib(sandbox, idle_dir, "exec", "true", "--plain")
    assert code == 0, (tmp_path / "idle.stderr").read_text()

    code, flooded = _peak_rss_mib(sandbox, flood_dir, "exec", FLOOD, "--plain")

    assert code == 0, (tmp_path / "flood.stderr").read_text()
    assert flooded < idle + HEADROOM_MIB, f"peak RSS {flooded:.0f} MiB, idle run {idle:.0f} MiB"

    (record,) = flood_dir.iterdir()
    nodes = sandbox.nodes()
    per_host = runlog.HOST_LOG_MAX_BYTES + runlog.HOST_LOG_TAIL_BYTES + 64 * 1024
    total = sum(p.stat().st_size for p in record.rglob("*") if p.is_file())
    assert total < len(nodes) * per_host + MIB, f"record of {total / MIB:.0f} MiB"
    for node in nodes:
        log = (record / "hosts" / f"{node.name}.log").read_text()
        assert "x ... [cut: 20.0 MB more]" in log  # the 20 MB line, cut and saying so
        assert log.count("[record cut: ") == 1  # past the host's cap, a note of what is left out
        assert log.splitlines()[-3].endswith("out| flood-done")  # and the end is kept
        assert "outcome: ok" in log.splitlines()[-1]

    events = (record / "events.jsonl").read_text()
    assert len(events) < 64 * 1024
    assert "OutputLine" not in events
    summary_text = (record / "summary.json").read_text()
    assert len(summary_text) < 8 * 1024
    assert "xxxxxxxx" not in summary_text
    assert "00000000" not in summary_text
    assert "flood-done" not in summary_text
    summary = json.loads(summary_text)
    assert set(summary["hosts"]) == {n.name for n in nodes}
    assert {h["outcome"] for h in summary["hosts"].values()} == {"ok"}
