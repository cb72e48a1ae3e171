"""Two or more fleet processes acting on one node's state at once: fleet/remote/launch.sh and
janitor.sh run here, the way a node runs them (dash, the script on stdin), many at a time.

launch: of many starts at once one starts and every other is refused, with `current`, the run's
files and every status read meanwhile whole. janitor: many starts at once leave one daemon;
starts and stops at once leave a state that `status` reports truly (a daemon runs exactly when
status says so, under the pid it gives).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .test_janitor_script import SCRIPT as JANITOR
from .test_janitor_script import _daemons
from .test_launch_script import Node, marked, node  # noqa: F401 (node: a fixture)

SLEEPER = "exec sleep 300\n"
Spawn = Callable[..., subprocess.Popen[str]]


def _tmp_files(root: Path) -> list[Path]:
    """Files written aside and never renamed (a writer that was cut short, or a bug)."""
    return [p for p in root.rglob("*") if ".tmp" in p.name or p.name.startswith(".current.")]


def test_many_starts_at_once_start_one_run_and_readers_see_whole_state(node: Node) -> None:  # noqa: F811
    first_id, first = node.start(SLEEPER)
    assert first.returncode == 0, first.stdout
    statuses: list[str] = []
    reading = threading.Event()

    def read_status() -> None:
        while not reading.is_set():
            statuses.append(node("status").stdout)

    reader = threading.Thread(target=read_status)
    reader.start()
    try:
        jobs = [node.job(SLEEPER) for _ in range(6)]
        procs = [node.spawn("start", *args) for _, args in jobs]
        stop = node.spawn("stop", "--run-id", first_id, "--grace", "0.5")
        outs = [(p.communicate(timeout=90)[0], p.returncode) for p in procs]
        stop_out = stop.communicate(timeout=90)[0]
    finally:
        reading.set()
        reader.join(timeout=60)

    assert stop.returncode == 0, stop_out
    assert marked(first_id) == []
    started = [rid for (rid, _), (_, rc) in zip(jobs, outs, strict=True) if rc == 0]
    assert len(started) <= 1, outs
    for out, rc in outs:
        if rc != 0:
            assert "start: refused: " in out, out
    for rid, _ in jobs:
        if rid not in started:
            assert marked(rid) == [], f"refused start {rid} left processes"
    if started:
        (winner,) = started
        assert (node.state / "current").read_text() == f"{winner}\n"
        assert re.fullmatch(r"\d+\n", (node.state / winner / "pid").read_text())
        assert re.fullmatch(r"\d+\n", (node.state / winner / "launcher").read_text())
        assert int((node.state / winner / "launcher").read_text()) in marked(winner)
    else:
        assert (node.state / "current").read_text() == f"{first_id}\n"
    # every status read meanwhile names a run that started, with whole facts
    assert statuses
    known = {first_id, *started}
    for out in statuses:
        last = out.splitlines()[-1]
        run = re.match(r"run=(\S+) wrapper=(alive|gone) launcher=(alive|gone|none) ", last)
        assert run, out
        assert run.group(1) in known, out
    assert _tmp_files(node.state) == []
    node("stop", "--grace", "0.5")


@pytest.fixture
def janitor(tmp_path: Path) -> Iterator[Spawn]:
    """janitor.sh ACTION ... under dash with HOME and node state in tmp_path (flock(1) takes
    the lock); every daemon killed at the end."""
    if not shutil.which("flock"):
        pytest.skip("flock(1) is not installed")
    home = tmp_path / "home"
    home.mkdir()
    path = os.environ.get("PATH", "/usr/bin:/bin")
    env = {
        "PATH": path,
        "HOME": str(home),
        "LC_ALL": "C",
        "FLEET_NODE_STATE": str(tmp_path / "state"),
    }
    script = tmp_path / "janitor.sh"
    script.write_text(JANITOR)

    def spawn(*args: str) -> subprocess.Popen[str]:
        with script.open() as stdin:
            return subprocess.Popen(
                ["dash", "-s", "--", *args],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                cwd=tmp_path,
            )

    yield spawn
    for pid in _daemons(str(tmp_path)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _all(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    return [(p.wait(timeout=90), (p.stdout.read() if p.stdout else "")) for p in procs]


def _status_agrees_with_the_daemons(janitor: Spawn, ckpt: Path, tmp_path: Path) -> int | None:
    """`status --dir` against the truth: running with pid P exactly when P is the one daemon."""
    ((code, out),) = _all([janitor("status", "--dir", str(ckpt))])
    assert code == 0, out
    daemons = _daemons(str(tmp_path))
    running = re.search(r"janitor=running dir=\S+ pid=(\d+) ", out)
    if running:
        assert daemons == [int(running.group(1))], out
        return daemons[0]
    assert "janitor=stopped" in out, out
    assert daemons == [], out
    return None


@pytest.mark.skipif(not Path("/usr/bin/dash").exists(), reason="dash is not installed")
def test_janitor_starts_and_stops_at_once_leave_one_daemon_and_a_true_status(
    janitor: Spawn, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    start = ("start", "--dir", str(ckpt), "--interval", "1", "--delete", "*_optim_states.pt")
    done = _all([janitor(*start) for _ in range(8)])
    assert [code for code, _ in done] == [0] * 8, done
    said = [out for _, out in done]
    assert sum("janitor: started for" in out for out in said) == 1, said
    pid = _status_agrees_with_the_daemons(janitor, ckpt, tmp_path)
    assert pid is not None
    assert all(f"pid {pid}" in out for out in said), said

    for _ in range(3):
        stop = ("stop", "--dir", str(ckpt))
        mixed = [janitor(*(start if i % 2 else stop)) for i in range(8)]
        outs = _all(mixed)
        assert [code for code, _ in outs] == [0] * 8, outs
        _status_agrees_with_the_daemons(janitor, ckpt, tmp_path)
        state = next((tmp_path / "state").rglob("config")).parent
        assert _tmp_files(state) == []

    ((code, out),) = _all([janitor("stop", "--dir", str(ckpt))])
    assert code == 0, out
    assert _status_agrees_with_the_daemons(janitor, ckpt, tmp_path) is None
