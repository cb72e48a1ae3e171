"""What a cleanup says it killed, against a real sshd node: only what this run ended.

Two cleanups at once must not scan the same processes, both signal them, and both report every
kill as their own: a cleanup kills under a node-wide lock, so the second one scans after the
first is done, and each process is claimed once, by the run whose signal ended it.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, FleetResult, fleet_env, poll

pytestmark = pytest.mark.root

# On TERM it takes 3 s to exit (a job saving state): long enough for a second cleanup to find it
# alive, and to signal it too, while the first one waits for it. It notes the TERMs it got.
SLOW_TO_DIE = """\
import os, signal, sys, time
def on_term(*_):
    open(sys.argv[1] + "." + str(os.getpid()), "a").write("TERM\\n")
    time.sleep(3)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
time.sleep(600)
"""


def _claims(result: FleetResult, node: str) -> set[int]:
    """Pids this cleanup said it killed (`killed PID (TERM|KILL): ...`)."""
    lines = [
        e["line"]
        for e in result.json_lines()
        if e["event"] == "OutputLine" and e["host"] == node and e["stream"] == "stdout"
    ]
    return {int(m.group(1)) for line in lines if (m := re.match(r"killed (\d+) \(", line))}


def test_two_cleanups_at_once_each_claim_only_what_they_ended(sandbox: Any, tmp_path: Path) -> None:
    node = sandbox.nodes()[0]
    probe = f"fleet-claim-{uuid.uuid4().hex[:8]}"
    job = f"/tmp/{probe}.py"
    sandbox.run_on(node, f"cat >{job} <<'EOF'\n{SLOW_TO_DIE}EOF\n")
    for _ in range(3):
        sandbox.run_on(
            node,
            f"setsid python3 {job} /tmp/{probe}.term </dev/null >/dev/null 2>&1 &",
        )

    def probes() -> list[int]:
        out = sandbox.run_on(
            node,
            "for d in /proc/[0-9]*; do c=$(tr '\\0' ' ' <$d/cmdline 2>/dev/null); "
            f'case "$c" in "python3 {job} "*) echo ${{d#/proc/}};; esac; done',
        ).stdout
        return [int(p) for p in out.split()]

    assert poll(lambda: len(probes()) == 3, timeout_s=15)
    pids = set(probes())
    args = [
        "cleanup", "--limit", node.name, "--pattern", probe, "--grace", "10", "--yes", "--json",
    ]  # fmt: skip
    procs = []
    try:
        for index in range(2):
            log_dir = tmp_path / str(index)
            log_dir.mkdir()
            procs.append(
                subprocess.Popen(
                    [*FLEET, *args],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                    text=True,
                    env=fleet_env(sandbox, log_dir),
                )
            )
            if index == 0:
                # the first one's TERM has reached them all: they are dying, not dead
                assert poll(
                    lambda: (
                        sandbox.run_on(node, f"ls /tmp/{probe}.term.* | wc -l").stdout.strip()
                        == "3"
                    ),
                    timeout_s=60,
                )
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            results.append(FleetResult(proc.returncode, out, err))
        left = probes()
        term_notes = sandbox.run_on(node, f"cat /tmp/{probe}.term.* 2>/dev/null").stdout
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        sandbox.run_on(
            node, f"kill -KILL {' '.join(map(str, pids))} 2>/dev/null; rm -f /tmp/{probe}*"
        )

    first, second = (_claims(r, node.name) for r in results)
    assert first == pids, results[0].stdout[-3000:]
    assert second & first == set(), "both cleanups claimed the same kills"
    assert left == []
    assert term_notes.count("TERM") == 3, "each process got one TERM, from the first cleanup"
