"""A launch's bookkeeping against real sshd nodes: a cancelled or failed start leaves no run
behind anywhere, and two launches at once never put two jobs on a node.

The job is a cheap stand-in, not torch: `--launcher "sh -c 'exec sleep 600'"` makes each node's
start run `sh -c 'exec sleep 600' --nnodes=... ... CMD` (the rendered torchrun arguments become
the shell's $0 and $@). What matters here is launch.sh's and fleet's bookkeeping, not training.
Every process a test starts carries its run's marker and is killed by pid when the test ends.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from fleetrun import FLEET, FleetResult, fleet_env, poll, run_fleet
from realtorch import STATE, RunIds

pytestmark = pytest.mark.root

JOB = "sh -c 'exec sleep 600'"
PHASES = ("launch", "--dir", "/tmp", "--var", "min_free_gb=0.01", "--launcher", JOB)


@pytest.fixture
def ids(sandbox: Any) -> Iterator[RunIds]:
    """Run ids a test used; each one's processes are killed on every node at the end."""
    for node in sandbox.nodes():
        sandbox.run_on(node, f"rm -rf {STATE}")
    made = RunIds(sandbox, "atomic")
    try:
        yield made
    finally:
        for node in sandbox.nodes():
            made.kill_all(node)
            sandbox.run_on(node, f"rm -rf {STATE}")


def launch_args(run: str, port: int, *extra: str) -> list[str]:
    return [*PHASES, "--run-id", run, "--master-port", str(port), *extra, "--", "job"]


class Background:
    """`fleet ... --json` in the background; its events read as they come."""

    def __init__(self, sandbox: Any, args: list[str], log_dir: Path) -> None:
        self._stderr: IO[str] = open(log_dir / "stderr.txt", "w+")  # noqa: SIM115 - closed in finish()
        self.proc = subprocess.Popen(
            [*FLEET, *args],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            stdin=subprocess.DEVNULL,
            text=True,
            env=fleet_env(sandbox, log_dir),
        )
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("{"):
                self.events.put(json.loads(line))
        self.events.put(None)

    def wait_for(self, match: Callable[[dict[str, Any]], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                break
            if event is None:
                pytest.fail(f"fleet ended early: {''.join(self.lines)[-2000:]}")
            if match(event):
                return
        pytest.fail(f"no matching event within {timeout_s:g}s: {''.join(self.lines)[-2000:]}")

    def finish(self, timeout_s: float = 120) -> FleetResult:
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail("fleet did not end")
        self._stderr.seek(0)
        err = self._stderr.read()
        self._stderr.close()
        self._reader.join(timeout=30)  # the reader thread's last lines: it ends at EOF
        return FleetResult(self.proc.returncode, "".join(self.lines), err)


def node_states(sandbox: Any, log_dir: Path) -> dict[str, dict[str, Any]]:
    return run_fleet(sandbox, "status", "--json", log_dir=log_dir).run_states()


def test_ctrl_c_during_the_start_stops_the_run_everywhere_and_says_so(
    sandbox: Any, ids: RunIds, tmp_path: Path
) -> None:
    """Ctrl-C once every node has launched its job (but before the nodes recorded it): not
    "started nowhere" while the job runs on every node and each node's `current` still names
    the previous run, but the run stopped on every node its start reached, and said so."""
    nodes = sandbox.nodes()
    earlier = ids.new()
    done = run_fleet(sandbox, *launch_args(earlier, 29601), "--plain", log_dir=tmp_path / "a")
    assert done.code == 0, done.stdout + done.stderr
    stopped = run_fleet(sandbox, "stop", "--yes", "--grace", "1", log_dir=tmp_path / "b")
    assert stopped.code == 0, stopped.stdout

    run = ids.new()
    (tmp_path / "c").mkdir()
    fleet = Background(sandbox, launch_args(run, 29602, "--json"), tmp_path / "c")
    fleet.wait_for(lambda e: e["event"] == "RunStarted" and e["playbook"] == "launch", 120)
    # Every node has launched the job (its marker is there); a start then waits a second for
    # the launcher to settle before it records the run: Ctrl-C lands in that second.
    for node in nodes:
        assert poll(lambda n=node: ids.pids(n, run), timeout_s=30, step_s=0.02), node.name
    fleet.proc.send_signal(signal.SIGINT)
    result = fleet.finish()

    assert result.code == 130, result.stdout + result.stderr
    assert "started nowhere" not in result.stderr
    assert f"run {run} rolled back" in result.stderr, result.stderr
    assert "could not stop" not in result.stderr
    assert ids.anywhere(run) == {}, "the cancelled launch left its job running"
    states = node_states(sandbox, tmp_path / "d")
    assert sorted(states) == [n.name for n in nodes]
    for name, state in states.items():
        # either the start was undone before it was recorded (the earlier run is still the
        # node's current one), or it was recorded and then stopped by the rollback
        assert (state["run"], state["state"]) in {(earlier, "stopped"), (run, "stopped")}, name


def test_a_node_whose_start_is_killed_outright_gets_its_run_stopped_by_id(
    sandbox: Any, ids: RunIds, tmp_path: Path
) -> None:
    """launch.sh SIGKILLed on one node after it launched the job: it cannot roll back, its
    step dies of a signal (a failed step, not a lost node), and fleet stops the run by its id
    there too (not `unreachable: connection lost`, which the rollback would skip, leaving the
    job running unrecorded)."""
    nodes = sandbox.nodes()
    victim = nodes[2]
    run = ids.new()
    (tmp_path / "a").mkdir()
    fleet = Background(sandbox, launch_args(run, 29603, "--json"), tmp_path / "a")
    fleet.wait_for(lambda e: e["event"] == "RunStarted" and e["playbook"] == "launch", 120)
    assert poll(lambda: ids.pids(victim, run), timeout_s=30, step_s=0.02)
    # the start's shell: the one holding the state dir's lock (its argv is bare `sh -s`: the
    # arguments travel on stdin, issue 17); the job closed that fd
    killer = (
        'for d in /proc/[0-9]*; do [ "$(readlink $d/fd/9 2>/dev/null)" = '
        f'{STATE}/.lock ] && kill -KILL "${{d#/proc/}}"; done; true'
    )
    sandbox.run_on(victim, killer)
    result = fleet.finish()

    assert result.code == 3, result.stdout + result.stderr
    (start,) = [
        e
        for e in map(json.loads, result.stdout.splitlines())
        if e["event"] == "RunFinished" and e["playbook"] == "launch"
    ]
    row = start["hosts"][victim.name]
    assert (row["outcome"], row["reason"]) == ("failed", "killed by SIGKILL"), row
    assert "all or nothing" in result.stderr
    assert f"run {run} rolled back" in result.stderr, result.stderr
    assert ids.anywhere(run) == {}, "a node's job survived the rollback"


def test_two_launches_at_once_never_put_two_jobs_on_a_node(
    sandbox: Any, ids: RunIds, tmp_path: Path
) -> None:
    """Two launches at once must not both succeed (two jobs per node on one port): each node's
    start is one step under its lock, a node takes one of them, and a launch refused anywhere
    is rolled back everywhere (all or nothing), so at most one of the two runs, on every node."""
    nodes = sandbox.nodes()
    runs = [ids.new(), ids.new()]
    procs = []
    for index, run in enumerate(runs):
        log_dir = tmp_path / str(index)
        log_dir.mkdir()
        procs.append(Background(sandbox, launch_args(run, 29604, "--json"), log_dir))
    results = [p.finish() for p in procs]

    codes = [r.code for r in results]
    assert codes.count(0) <= 1, [r.stderr for r in results]
    assert any(code != 0 for code in codes)
    for node in nodes:
        alive = [run for run in runs if ids.pids(node, run)]
        assert len(alive) <= 1, f"{node.name} runs {alive}"
    for run, result in zip(runs, results, strict=True):
        where = ids.anywhere(run)
        if result.code == 0:
            assert sorted(where) == [n.name for n in nodes], where
        else:
            assert where == {}, f"refused launch {run} left jobs on {sorted(where)}"
            said = ("rolled back", "not launching", "refused the start")
            assert any(words in result.stderr for words in said), result.stderr


def test_a_second_launch_is_refused_while_a_run_is_running(
    sandbox: Any, ids: RunIds, tmp_path: Path
) -> None:
    first, second = ids.new(), ids.new()
    done = run_fleet(sandbox, *launch_args(first, 29605), "--plain", log_dir=tmp_path / "a")
    assert done.code == 0, done.stdout + done.stderr
    again = run_fleet(
        sandbox, *launch_args(second, 29606), "--force", "--plain", log_dir=tmp_path / "b"
    )
    assert again.code == 3, again.stdout + again.stderr
    assert f"start: refused: run {first} is still running" in again.stdout
    assert ids.anywhere(second) == {}
    assert sorted(ids.anywhere(first)) == [n.name for n in sandbox.nodes()]
