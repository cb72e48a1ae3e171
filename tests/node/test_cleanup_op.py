"""The cleanup op end to end on this machine's own shell (fleet.engine.local: the same facts.sh,
decisions and act.sh as over SSH, one command at a time), and its vars checked before anything
connects. The processes, paths and port are the test's own: a unique token names them all."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleet.cli import main
from fleet.core.playbook import load_playbook
from fleet.engine import local
from fleet.node.ops import cleanup_spec
from fleet.node.step import OpVarError

Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def token() -> Iterator[str]:
    name = f"fleetop{uuid.uuid4().hex[:10]}"
    yield name
    subprocess.run(["rm", "-rf", *map(str, Path("/tmp").glob(f"{name}*"))], check=False)


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    started: list[subprocess.Popen[bytes]] = []

    def _spawn(argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, start_new_session=True, **kw)
        started.append(proc)
        return proc

    yield _spawn
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run(*assignments: str) -> tuple[int, list[str]]:
    lines: list[str] = []
    code = local.run(list(assignments), lambda stream, line: lines.append(line))
    return code, lines


def poll(check: Callable[[], object], what: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def test_a_dead_run_is_cleaned_in_rounds_on_one_machine(
    token: str, spawn: Spawn, tmp_path: Path
) -> None:
    launcher = spawn(
        ["bash", "-c", f"(exec -a {token}-worker sleep 61) & exec -a {token} sleep 60"]
    )
    stubborn = spawn(["bash", "-c", f"trap '' TERM; exec -a '{token} stubborn' sleep 62"])
    bystander = spawn(["sleep", "63"])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    holder = spawn(["sleep", "64"], pass_fds=[listener.fileno()])
    listener.close()
    for name in ("a", "b"):
        Path(f"/tmp/{token}-{name}").mkdir()
    Path(f"/tmp/{token}-held").mkdir()
    cwd_holder = spawn(["sleep", "65"], cwd=f"/tmp/{token}-held")
    poll(
        lambda: Path(f"/proc/{launcher.pid}/cmdline").read_bytes().startswith(token.encode()),
        "exec",
    )

    code, lines = run(
        f"patterns=[{token}]", "grace=0.5", f"port={port}", f"state_paths=[/tmp/{token}-*]"
    )

    assert code == 1, lines  # the held path is left: a verdict, not a failure
    assert lines[0] == "kill: sending TERM to 3 processes, KILL after 0.5s"
    assert f"killed {stubborn.pid} (KILL): {token} stubborn 62" in lines
    assert f"killed {holder.pid} (TERM): sleep 64" in lines
    assert f"removed: /tmp/{token}-a" in lines
    assert "kill: 3 ended (2 by TERM, 1 by KILL)" in lines
    assert f"port {port}: freed (killed {holder.pid} sleep 64)" in lines
    assert f"kept (in use by {cwd_holder.pid} sleep 65): /tmp/{token}-held" in lines
    assert lines[-1] == (
        f"killed 4 processes (TERM 3, KILL 1), removed 2 paths, port {port} freed (stopped sleep); "
        "left: 1 path"
    )
    for proc in (launcher, stubborn, holder):
        proc.wait(5)
    assert alive(bystander)
    assert alive(cwd_holder)
    assert sorted(p.name for p in Path("/tmp").glob(f"{token}*")) == [f"{token}-held"]


def test_a_process_that_starts_another_as_it_dies_is_caught_by_the_next_round(
    token: str, spawn: Spawn, tmp_path: Path
) -> None:
    """A launcher restarting workers during teardown: its replacement appears after the round's
    look, in a session of its own, and the next round ends it too."""
    respawn = (
        "import signal, subprocess, sys, time\n"
        "def term(*_):\n"
        f"    subprocess.Popen(['bash', '-c', 'exec -a \"{token} restarted\" sleep 66'],\n"
        "                     start_new_session=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "open(sys.argv[1], 'w').close(); time.sleep(60)"
    )
    spawn([sys.executable, "-c", respawn, str(tmp_path / "ready"), token])
    poll((tmp_path / "ready").exists, "the launcher")

    code, lines = run(f"patterns=[{token}]", "grace=2", "port=", "state_paths=[]")

    assert code == 0, lines
    killed = [line for line in lines[:-1] if line.startswith("killed ")]
    assert len(killed) == 2, lines
    assert killed[1].endswith(f"{token} restarted 66")
    assert lines[-1] == "killed 2 processes (TERM 2)"


def test_a_preview_changes_nothing(token: str, spawn: Spawn) -> None:
    victim = spawn(["bash", "-c", f"exec -a {token} sleep 60"])
    Path(f"/tmp/{token}-x").mkdir()
    poll(
        lambda: Path(f"/proc/{victim.pid}/cmdline").read_bytes().startswith(token.encode()), "exec"
    )

    code, lines = run(f"patterns=[{token}]", "port=", f"state_paths=[/tmp/{token}-*]", "preview=1")

    assert code == 0, lines
    assert lines[0].startswith(f"would kill {victim.pid} (root, matches '{token}'): {token} 60")
    assert f"would remove: /tmp/{token}-x" in lines
    assert lines[-1].startswith("preview: would kill 1 process; remove 1 path")
    assert alive(victim)
    assert Path(f"/tmp/{token}-x").is_dir()


# ------------------------------------------------------------------------ the vars, up front


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("patterns", ["("], "--pattern '(': '(' is never closed"),
        ("patterns", [""], "--pattern '': is empty"),
        ("patterns", [], "no --pattern"),
        ("patterns", ["a|"], "matches the empty string"),
        ("patterns", [r"\d+"], r"\d is not part of POSIX extended regexes"),
        ("grace", "soon", "grace: 'soon' is not a number"),
        ("grace", 601, "grace: 601 is not between 0 and 600"),
        ("port", "70000", "port: 70000 is not between 1 and 65535"),
        ("port", "1.5", "port: '1.5' is not a port number"),
        ("max_kill_share", 0, "max_kill_share: 0 is not between"),
    ],
)
def test_a_var_the_op_cannot_use_is_named_with_a_hint(var: str, value: Any, message: str) -> None:
    variables = {**load_playbook("cleanup").vars, var: value}
    with pytest.raises(OpVarError) as info:
        cleanup_spec(variables)
    assert info.value.var == var
    assert message in str(info.value)
    assert info.value.hint


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mocker: Any) -> Path:
    for name in ("FLEET_INVENTORY", "FLEET_SSH_CONFIG", "FLEET_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLEET_LOG_DIR", str(tmp_path / "runs"))
    mocker.patch("fleet.ssh.transport.SSHTransport", side_effect=AssertionError("connected"))
    path = tmp_path / "inventory.yaml"
    path.write_text("all:\n  hosts:\n    gpu[01-02].invalid:\n      patterns: ['x(']\n")
    return path


def fleet(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    _, err = capsys.readouterr()
    assert isinstance(info.value.code, int)
    return info.value.code, [line for line in err.splitlines() if line.strip()]


def test_a_bad_pattern_is_refused_before_the_question_or_any_connection(
    inventory: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = fleet(capsys, "cleanup", "-i", str(inventory), "--pattern", "torchrun(")
    assert code == 2
    assert err == [
        "fleet: error: cleanup: --pattern 'torchrun(': '(' is never closed (from the command line)",
        "  hint: write \\( for a literal parenthesis",
    ]
    code, err = fleet(capsys, "cleanup", "-i", str(inventory), "-n")
    assert code == 1  # from the inventory: a fleet error, not a usage one
    assert err[0].endswith("(from inventory vars of gpu[01-02].invalid)")
    code, err = fleet(capsys, "run", "cleanup", "-i", str(inventory), "--var", "patterns=[x, '']")
    assert code == 2
    assert "--pattern '': is empty" in err[0]


def test_the_question_shows_what_a_look_at_the_nodes_found_and_no_means_nothing_runs(
    inventory: Path,
    capsys: pytest.CaptureFixture[str],
    mocker: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a terminal, without --yes, cleanup first looks (a preview run) and asks with the
    totals; the real run decides again from what it finds."""
    from fleet.core.events import HostFinished, Outcome, RunSummary
    from fleet.node.cleanup import Preview, Touched
    from fleet.node.ops import CleanupOp
    from fleet.ops import jobs as verbs

    inventory.write_text("all:\n  hosts:\n    gpu[01-03].invalid:\n")
    runs: list[bool] = []

    def run_plan(plan: Any, *args: Any, **kw: Any) -> RunSummary:
        ops = [ps.op for hp in plan.hosts for ps in hp.steps]
        runs.append(all(isinstance(op, CleanupOp) and op.is_preview for op in ops))
        for index, op in enumerate(ops[:2]):  # the third host never answered
            procs = tuple(Touched(10 + i, "root", "torchrun", "x") for i in range(index + 1))
            op.previews.append(Preview(processes=procs, paths=(("remove", "/tmp/cuda_1"),)))
        done = tuple(
            HostFinished(host=n, outcome=Outcome.OK, duration_s=0) for n in plan.host_names
        )
        return RunSummary(run_id="r", playbook="cleanup", results=done, duration_s=0)

    mocker.patch.object(verbs, "run_plan", side_effect=run_plan)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    asked = mocker.patch("click.confirm", return_value=False)
    code, err = fleet(capsys, "cleanup", "-i", str(inventory))
    assert code == 1
    assert err[0] == "fleet: error: not confirmed; nothing was run"
    assert runs == [True]  # only the look ran
    (prompt,), _ = asked.call_args
    assert prompt == (
        "Run 'cleanup' on 3 hosts gpu[01-03].invalid? Right now it would kill 3 processes and "
        "remove 2 paths; 1 did not answer (fleet cleanup --preview shows them)."
    )
