"""The kill fleet sends for a cancelled or timed-out step (shell.kill_command), run in local
sessions the way sshd starts a step; run ids, checked before anything connects; and the words a
step's end is reported in (a death by signal is a failed step; a kill that failed says so)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.cli import main
from fleet.core.events import Outcome
from fleet.core.result import CommandResult
from fleet.core.shell import KILL_REPORT, Cmd, kill_command
from fleet.engine.executor import _reason, _step_outcome

SH = shutil.which("dash") or "/bin/sh"


def session_members(sid: int) -> list[int]:
    """Live (not zombie) pids whose session is `sid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(") ", 1)[1].split()
        if fields[3] == str(sid) and fields[0] != "Z":
            found.append(int(entry))
    return found


def wait_for(check: object, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return bool(check())  # type: ignore[operator]


@pytest.fixture
def step() -> Iterator[subprocess.Popen[str]]:
    """A step as sshd starts one (a session of its own), which moves its work into another
    process group, as `timeout` and sudo do, and ignores TERM there."""
    script = (
        "sh -c 'trap \"\" TERM; while :; do sleep 0.1; done' & "
        "python3 -c 'import os, signal, time; os.setpgid(0, 0); "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)' & wait"
    )
    proc = subprocess.Popen([SH, "-c", script], start_new_session=True, text=True)
    assert wait_for(lambda: len(session_members(proc.pid)) >= 3)
    yield proc
    for pid in session_members(proc.pid):
        with contextlib.suppress(ProcessLookupError):  # a `sleep 0.1` that ended meanwhile
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=10)


def run_kill(pid: int, *prefix: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, SH, "-c", kill_command(pid, grace_s=0.4)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_kill_ends_every_process_of_the_steps_session_even_in_other_groups(
    step: subprocess.Popen[str],
) -> None:
    """The kill ends the whole session, not only the wrapper's process group: `timeout` and
    sudo move the work into a group of their own, and the kill says what it ended."""
    killed = run_kill(step.pid)
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert killed.stdout.splitlines()[-1] == f"{KILL_REPORT}stopped by KILL"
    assert session_members(step.pid) == []


@pytest.mark.root
def test_a_kill_that_cannot_reach_the_step_says_so_and_fails(
    step: subprocess.Popen[str],
) -> None:
    """A kill without the step's privileges (a plain user against a step sudo made root) fails,
    naming what is left."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run the kill as another user")
    killed = run_kill(step.pid, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    assert killed.returncode == 1, killed.stdout + killed.stderr
    last = killed.stdout.splitlines()[-1]
    assert last.startswith(f"{KILL_REPORT}left pids "), last
    assert "not permitted" in last
    assert len(session_members(step.pid)) >= 3  # still there: the kill told the truth


def test_a_step_already_gone_is_reported_gone() -> None:
    proc = subprocess.Popen([SH, "-c", "exit 0"], start_new_session=True)
    proc.wait(timeout=10)
    killed = run_kill(proc.pid)
    assert (killed.returncode, killed.stdout.strip()) == (0, f"{KILL_REPORT}gone")


# ---------------------------------------------------------------- run ids


@pytest.fixture
def inventory_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("FLEET_INVENTORY", "FLEET_SSH_CONFIG", "FLEET_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLEET_LOG_DIR", str(tmp_path / "runs"))
    path = tmp_path / "inventory.yaml"
    # TEST-NET-1: nothing may connect; a run id check that let it try would hang or fail here
    path.write_text("all:\n  hosts:\n    gpu[01-02].invalid:\n      ansible_host: 192.0.2.1\n")
    return path


def fleet(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`fleet ARGV` in-process: exit code, stdout, stderr."""
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    code = info.value.code
    assert isinstance(code, int)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "bad", ["current", ".hidden", "-x", "a/b", "..", "a b", "$(id)", "a;b", "x" * 129, "é"]
)
@pytest.mark.parametrize("verb", ["launch", "stop", "logs"])
def test_a_bad_or_reserved_run_id_is_refused_before_anything_runs(
    inventory_file: Path, capsys: pytest.CaptureFixture[str], mocker: object, verb: str, bad: str
) -> None:
    """`--run-id current` would name the node's pointer file: launch ids are checked locally
    (exit 2, one line and a hint), and nothing connects."""
    transport = mocker.patch("fleet.ssh.transport.SSHTransport")  # type: ignore[attr-defined]
    tail = ["--", "train.py"] if verb == "launch" else []
    args = [verb, "-i", str(inventory_file), "--yes", "--run-id", bad, *tail]
    code, _, err = fleet(capsys, *args)
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 2, err
    assert lines[0].startswith("fleet: error: --run-id "), err
    assert lines[1].strip().startswith("hint: ")
    assert not transport.called


def test_launch_refuses_a_run_id_smuggled_in_as_a_var(
    inventory_file: Path, capsys: pytest.CaptureFixture[str], mocker: object
) -> None:
    transport = mocker.patch("fleet.ssh.transport.SSHTransport")  # type: ignore[attr-defined]
    args = ["launch", "-i", str(inventory_file), "--var", "run_id=other", "--", "t.py"]
    code, _, err = fleet(capsys, *args)
    assert code == 2, err
    assert "--var run_id" in err
    assert not transport.called


@pytest.mark.parametrize("good", ["run-20261130-041233-3fa2", "llama_sft.3", "A+B", "x" * 128])
def test_plain_run_ids_pass(
    inventory_file: Path, capsys: pytest.CaptureFixture[str], good: str
) -> None:
    args = ["launch", "-i", str(inventory_file), "--dir", "/c", "--dry-run", "--run-id", good]
    code, out, err = fleet(capsys, *args, "--", "t.py")
    assert code == 0, err
    assert f"start --run-id {good} " in out


# ---------------------------------------------------------------- what a step's end is called


@pytest.mark.parametrize(
    ("result", "outcome", "reason"),
    [
        (
            CommandResult(exit_code=137, signal="KILL"),
            Outcome.FAILED,
            "killed by SIGKILL",
        ),
        (
            CommandResult(exit_code=134, signal="ABRT", core_dumped=True),
            Outcome.FAILED,
            "killed by SIGABRT (core dumped)",
        ),
        (
            CommandResult(exit_code=137),
            Outcome.FAILED,
            "exit code 137 (a command it ran died of SIGKILL)",
        ),
        (CommandResult(exit_code=3), Outcome.FAILED, "exit code 3"),
        (
            CommandResult(exit_code=None, cancelled=True),
            Outcome.CANCELLED,
            "cancelled; remote command stopped",
        ),
        (
            CommandResult(exit_code=None, cancelled=True, stop_failed="left pids 93"),
            Outcome.CANCELLED,
            "cancelled; the remote command may still run: left pids 93",
        ),
        (
            CommandResult(exit_code=137, timed_out=True),
            Outcome.TIMED_OUT,
            "step timed out after 5s; remote command killed",
        ),
    ],
)
def test_a_steps_end_is_named_for_what_happened(
    result: CommandResult, outcome: Outcome, reason: str
) -> None:
    cmd = Cmd(command="x", display="x", timeout_s=5)
    assert _step_outcome(result) is outcome
    assert _reason(result, cmd) == reason
