"""Another user on a node cannot steer fleet with its markers (issue 17), against real sshd nodes.

fleet acts as root on every node and knows its own processes by markers in their environment:
FLEET_NODE_HELPER (a cleanup or status step of fleet's, whose argv holds the patterns) and a
launched run's FLEET_RUN_ID. Any user can put those names in the environment of their own
processes; here uid 4242 (no passwd entry) does, and fleet must not take its processes for
its own: a forged helper is cleaned up like any trainer, a forged run marker neither makes a
finished run look orphaned, nor blocks the next launch, nor gets killed by `fleet stop`.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import run_fleet
from realtorch import MARKED, STATE

pytestmark = pytest.mark.root

OTHER = "setpriv --reuid=4242 --regid=4242 --clear-groups"
JOB = "sh -c 'exec sleep 600'"
PHASES = ("launch", "--dir", "/tmp", "--var", "min_free_gb=0.01", "--plain")


class Planted:
    """Processes a test planted on nodes; each killed by pid when the test ends."""

    def __init__(self, sandbox: Any) -> None:
        self.sandbox = sandbox
        self.pids: list[tuple[Any, int]] = []

    def start(self, node: Any, env: str, argv0: str, user: str = OTHER) -> int:
        """A detached `sleep` shown as `argv0`, run by `user` with `env` (K=V words) added."""
        inner = f"exec -a {shlex.quote(argv0)} sleep 600"
        script = (
            f"setsid {user} env {env} bash -c {shlex.quote(inner)} </dev/null >/dev/null 2>&1 &"
            " echo $!"
        )
        pid = int(self.sandbox.run_on(node, script).stdout.strip())
        self.pids.append((node, pid))
        deadline = time.monotonic() + 15
        while argv0.split(maxsplit=1)[0] not in self.cmdline(node, pid):
            assert time.monotonic() < deadline, f"planted {argv0!r} did not come up"
            time.sleep(0.05)
        return pid

    def cmdline(self, node: Any, pid: int) -> str:
        out = self.sandbox.run_on(node, f"tr '\\0' ' ' < /proc/{pid}/cmdline 2>/dev/null; true")
        return str(out.stdout)

    def alive(self, node: Any, pid: int) -> bool:
        state = self.sandbox.run_on(node, f"sed -n 's/^State:\\s*//p' /proc/{pid}/status").stdout
        return bool(state) and not state.startswith("Z")


@pytest.fixture
def planted(sandbox: Any) -> Iterator[Planted]:
    made = Planted(sandbox)
    for node in sandbox.nodes():
        sandbox.run_on(node, f"rm -rf {STATE}")
    try:
        yield made
    finally:
        for node, pid in made.pids:
            sandbox.run_on(node, f"kill -KILL {pid} 2>/dev/null; true")
        for node in sandbox.nodes():
            for run in ("forge-a", "forge-b"):
                kill = f"kill -KILL $(marked {run}) 2>/dev/null; true"
                sandbox.run_on(node, MARKED + kill)
            sandbox.run_on(node, f"rm -rf {STATE}")


def _gone_within(planted: Planted, node: Any, pid: int, timeout_s: float = 15) -> bool:
    deadline = time.monotonic() + timeout_s
    while planted.alive(node, pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_forged_helper_marker_spares_no_trainer_of_another_user(
    sandbox: Any, planted: Planted, tmp_path: Path
) -> None:
    node = sandbox.nodes()[0]
    forged = planted.start(node, "FLEET_NODE_HELPER=1", "torchrun --nproc-per-node 2 train.py")
    # a real trainer of yet another uid, unmarked: cleaned up as before
    plain = planted.start(
        node,
        "A=1",
        "torchrun --nproc-per-node 1 other.py",
        user="setpriv --reuid=4343 --regid=4343 --clear-groups",
    )

    result = run_fleet(
        sandbox, "cleanup", "--yes", "--grace", "1", "--plain", "-l", node.name, log_dir=tmp_path
    )

    assert result.code == 0, result.stdout + result.stderr
    assert _gone_within(planted, node, forged), "the forged helper was spared"
    assert _gone_within(planted, node, plain), "the other user's trainer was spared"
    assert "killed 2 processes" in result.stdout, result.stdout


def test_a_forged_run_marker_neither_orphans_blocks_nor_gets_stopped(
    sandbox: Any, planted: Planted, tmp_path: Path
) -> None:
    node = sandbox.nodes()[0]
    first = run_fleet(
        sandbox,
        *PHASES,
        "--launcher",
        "sh -c 'sleep 2'",
        "--run-id",
        "forge-a",
        "--master-port",
        "29621",
        "--",
        "job",
        log_dir=tmp_path / "a",
    )
    assert first.code == 0, first.stdout + first.stderr
    deadline = time.monotonic() + 30
    while True:
        states = run_fleet(sandbox, "status", "--json", log_dir=tmp_path / "s").run_states()
        if states[node.name]["state"] == "finished":
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.5)

    fake_a = planted.start(node, "FLEET_RUN_ID=forge-a", "torchrun --fake")

    states = run_fleet(sandbox, "status", "--json", log_dir=tmp_path / "s2").run_states()
    assert (states[node.name]["run"], states[node.name]["state"]) == ("forge-a", "finished")

    second = run_fleet(
        sandbox,
        *PHASES,
        "--launcher",
        JOB,
        "--run-id",
        "forge-b",
        "--master-port",
        "29622",
        "--",
        "job",
        log_dir=tmp_path / "b",
    )
    assert second.code == 0, second.stdout + second.stderr
    fake_b = planted.start(node, "FLEET_RUN_ID=forge-b", "torchrun --fake-b")
    states = run_fleet(sandbox, "status", "--json", log_dir=tmp_path / "s3").run_states()
    assert states[node.name]["state"] == "running"
    assert states[node.name]["processes"] == 0, states[node.name]

    stopped = run_fleet(sandbox, "stop", "--yes", "--grace", "1", log_dir=tmp_path / "c")
    assert stopped.code == 0, stopped.stdout + stopped.stderr
    assert "4242" not in stopped.stdout
    assert planted.alive(node, fake_b), "fleet stop killed another user's process"
    assert planted.alive(node, fake_a)
    real = sandbox.run_on(node, MARKED + "marked forge-b").stdout.split()
    assert set(real) <= {str(fake_b)}, real
