"""fleet/remote/act.sh run for real, in dash, bash and busybox sh: it signals exactly the
pid@start it is given (the test's own children) and removes exactly the paths it is given
(in tmp_path), and says what became of each."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleet.core.playbook import shipped_script
from fleet.node.act import Actions, Outcome, escape, parse
from fleet.node.facts import PathMatch

SHELLS = [["dash"], ["bash", "--posix"], ["busybox", "sh"]]
Spawn = Callable[..., subprocess.Popen[bytes]]


def act(
    shell: list[str], args: list[str], env: dict[str, str] | None = None, prelude: str = ""
) -> tuple[int, list[Outcome], str]:
    """Run act.sh with ARGS; `prelude` is shell text put before the script (a seam: a shell
    function there takes the place of a builtin such as kill)."""
    if shutil.which(shell[0]) is None:
        pytest.skip(f"{shell[0]} is not installed")
    proc = subprocess.run(
        [*shell, "-s", "--", *args],
        input=(prelude + shipped_script("act.sh")).encode(),
        capture_output=True,
        env=env or {"PATH": os.environ["PATH"], "FLEET_NODE_STATE": os.environ["FLEET_NODE_STATE"]},
        timeout=60,
        check=False,
    )
    lines = proc.stdout.decode("ascii").splitlines()
    assert all(line.isprintable() for line in lines)
    return proc.returncode, parse(lines), proc.stderr.decode()


def start_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(") ", 1)[1].split()[19])


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    started: list[subprocess.Popen[bytes]] = []

    def _spawn(argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, start_new_session=True, **kw)  # type: ignore[call-overload]
        started.append(proc)
        return proc

    yield _spawn
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


IGNORES_TERM = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
IGNORES_TERM += "open(sys.argv[1], 'w').close(); time.sleep(60)"


def stubborn(spawn: Spawn, tmp_path: Path) -> subprocess.Popen[bytes]:
    ready = tmp_path / f"ready-{len(list(tmp_path.iterdir()))}"
    proc = spawn([sys.executable, "-c", IGNORES_TERM, str(ready)])
    for _ in range(500):
        if ready.exists():
            return proc
        time.sleep(0.01)
    pytest.fail("the TERM-ignoring process never came up")


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_term_then_kill_and_only_what_it_ended_is_claimed(
    shell: list[str], spawn: Spawn, tmp_path: Path
) -> None:
    polite = spawn(["sleep", "60"])
    hard = stubborn(spawn, tmp_path)
    gone = spawn(["true"])
    gone_start = start_of(gone.pid) if gone.poll() is None else 1
    gone.wait()
    items = [f"{p.pid}:{start_of(p.pid)}" for p in (polite, hard)] + [f"{gone.pid}:{gone_start}"]
    started = time.monotonic()
    code, outcomes, _ = act(shell, ["signal", "3", *items])
    assert code == 0
    assert time.monotonic() - started < 5  # TERM, 0.3 s grace, KILL: the wait is on the node
    results = {o.key: o.result for o in outcomes if o.kind == "signal"}
    assert results == {polite.pid: "term", hard.pid: "kill", gone.pid: "gone"}
    assert outcomes[-1].kind == "done"
    assert polite.wait(5) == -signal.SIGTERM
    assert hard.wait(5) == -signal.SIGKILL


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_pid_with_another_start_time_is_never_signalled(shell: list[str], spawn: Spawn) -> None:
    proc = spawn(["sleep", "60"])
    code, outcomes, _ = act(shell, ["signal", "1", f"{proc.pid}:{start_of(proc.pid) + 1}"])
    assert code == 0
    assert Outcome("signal", proc.pid, "gone") in outcomes
    assert proc.poll() is None


# kill(1) as the kernel answers when the process died between the check and the TERM (a parent's
# init, e.g. `tini -s`, passed the TERM on and its child ended first): the process is ended here,
# and once it is a zombie the TERM fails with "No such process". A zombie still takes a signal,
# so the failure is this function's, the way ESRCH comes once the parent has reaped it.
DIES_BEFORE_TERM = """
kill() {
    if [ "$1" = -s ] && [ "$2" = TERM ]; then
        command kill -s KILL "$3"
        while ! grep -q '^State:.*Z' "/proc/$3/status" 2>/dev/null && [ -e "/proc/$3" ]; do :; done
        echo "kill: ($3) - No such process" >&2
        return 1
    fi
    command kill "$@"
}
"""


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_process_that_ends_before_its_term_is_gone_not_denied(
    shell: list[str], spawn: Spawn
) -> None:
    proc = spawn(["sleep", "60"])
    code, outcomes, _ = act(
        shell, ["signal", "3", f"{proc.pid}:{start_of(proc.pid)}"], prelude=DIES_BEFORE_TERM
    )
    assert code == 0
    assert proc.wait(5) == -signal.SIGKILL  # the stand-in did end it before failing
    assert [o for o in outcomes if o.kind == "signal"] == [Outcome("signal", proc.pid, "gone")]


@pytest.mark.root
def test_a_process_it_may_not_signal_is_denied_at_once(spawn: Spawn) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run act.sh unprivileged")
    proc = spawn(["sleep", "60"])
    started = time.monotonic()
    code, outcomes, _ = act(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "dash"],
        ["signal", "100", f"{proc.pid}:{start_of(proc.pid)}"],
    )
    assert code == 0
    assert Outcome("signal", proc.pid, "denied") in outcomes
    assert time.monotonic() - started < 3  # no grace period for what it cannot signal
    assert proc.poll() is None


def matches(*specs: tuple[str, Path, Path | None]) -> tuple[PathMatch, ...]:
    return tuple(
        PathMatch(i, 0, kind, bytes(path), bytes(real or path))
        for i, (kind, path, real) in enumerate(specs)
    )


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_remove_takes_exactly_the_listed_paths_and_never_follows_a_symlink(
    shell: list[str], tmp_path: Path
) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep").write_text("keep")
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "to-precious").symlink_to(precious)
    f = tmp_path / "f"
    f.write_text("x")
    link = tmp_path / "l"
    link.symlink_to(precious)
    hostile = tmp_path / "new\nline \\ back\tslash \xff".encode("utf-8", "surrogateescape").decode(
        "utf-8", "surrogateescape"
    )
    hostile.mkdir()
    was_dir = tmp_path / "was-dir"
    was_dir.write_text("now a file")
    moved = tmp_path / "moved"
    moved.mkdir()
    listed = matches(
        ("d", d, None),
        ("f", f, None),
        ("l", link, None),
        ("d", hostile, None),
        ("d", was_dir, None),  # was a directory when fleet looked: left alone
        ("d", moved, tmp_path / "elsewhere"),  # its physical path changed: left alone
        ("f", tmp_path / "never", None),
    )
    code, outcomes, _ = act(shell, Actions(remove=listed).args())
    assert code == 0
    results = [o.result for o in outcomes if o.kind == "remove"]
    assert results == ["removed", "removed", "removed", "removed", "changed", "changed", "gone"]
    assert not d.exists()
    assert not f.exists()
    assert not link.is_symlink()
    assert (precious / "keep").read_text() == "keep"
    assert not hostile.exists()
    assert was_dir.exists()
    assert moved.exists()


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_path_held_by_what_it_signals_goes_only_once_they_all_ended(
    shell: list[str], spawn: Spawn, tmp_path: Path
) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    polite = spawn(["sleep", "60"])
    code, outcomes, _ = act(
        shell,
        ["signal", "1", f"{polite.pid}:{start_of(polite.pid)}", "remove",
         "D", str(tmp_path / "a"), str(tmp_path.resolve() / "a")],
    )  # fmt: skip
    assert code == 0
    assert Outcome("remove", 0, "removed") in outcomes
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return
    victim = spawn(["sleep", "60"])  # root's: act.sh as nobody may not signal it
    code, outcomes, _ = act(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *shell],
        ["signal", "1", f"{victim.pid}:{start_of(victim.pid)}", "remove",
         "D", str(tmp_path / "b"), str(tmp_path.resolve() / "b")],
    )  # fmt: skip
    assert Outcome("remove", 0, "held") in outcomes
    assert (tmp_path / "b").is_dir()


def test_escape_keeps_plain_paths_readable_and_every_byte_exact() -> None:
    assert escape(b"/tmp/pymp-abc_1.x") == "/tmp/pymp-abc_1.x"
    assert escape(b"/tmp/a b\\\n\xff") == "/tmp/a\\0040b\\0134\\0012\\0377"
    assert escape(b"x").isascii()


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_gpu_reset_reports_nvidia_smi_s_status_and_output(shell: list[str], tmp_path: Path) -> None:
    shim = tmp_path / "nvidia-smi"
    shim.write_text('#!/bin/sh\necho "reset $*"\n[ -t 0 ] || cat >/dev/null\nexit 3\n')
    shim.chmod(0o755)
    code, outcomes, _ = act(shell, ["gpu-reset"], {"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert code == 0
    (reset,) = [o for o in outcomes if o.kind == "gpu-reset"]
    assert (reset.key, reset.text) == (3, b"reset --gpu-reset\n")


def test_two_at_once_take_turns_and_the_second_claims_nothing(spawn: Spawn, tmp_path: Path) -> None:
    """The kill lock: while one act.sh waits for its processes to end, another one given the
    same processes waits for it, then finds them gone."""
    if shutil.which("flock") is None:
        pytest.skip("flock(1) is not installed")
    dying = spawn([sys.executable, "-c", (
        "import signal, sys, time\n"
        "def term(*_):\n"
        "    open(sys.argv[1] + '.term', 'w').close(); time.sleep(1.5); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "open(sys.argv[1], 'w').close(); time.sleep(60)"
    ), str(tmp_path / "ready")])  # fmt: skip
    while not (tmp_path / "ready").exists():
        time.sleep(0.01)
    item = f"{dying.pid}:{start_of(dying.pid)}"
    script = tmp_path / "act.sh"
    script.write_text(shipped_script("act.sh"))
    with script.open("rb") as stdin:
        first = subprocess.Popen(
            ["dash", "-s", "--", "signal", "50", item], stdin=stdin, stdout=subprocess.PIPE
        )
    deadline = time.monotonic() + 10
    while not (tmp_path / "ready.term").exists():  # the first one sent TERM and holds the lock
        assert time.monotonic() < deadline, "the first act.sh never signalled"
        time.sleep(0.01)
    code, outcomes, _ = act(["dash"], ["signal", "50", item])
    out, _ = first.communicate(timeout=30)
    assert code == 0
    assert Outcome("lock", result="wait") in outcomes
    assert Outcome("signal", dying.pid, "gone") in outcomes
    assert f"signal {dying.pid} term" in out.decode()


@pytest.mark.parametrize(
    "args",
    [["signal", "soon", "1:2"], ["signal", "10", "1:2:3"], ["explode"], ["remove", "d"]],
)
def test_bad_usage_exits_2_and_acts_on_nothing(args: list[str], spawn: Spawn) -> None:
    victim = spawn(["sleep", "60"])
    code, outcomes, err = act(
        ["dash"], ["signal", "1", f"{victim.pid}:{start_of(victim.pid)}", *args]
    )
    assert code == 2
    assert outcomes == []
    assert err.startswith("act.sh: ")
    assert victim.poll() is None


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_after_acting_it_looks_again_in_the_same_run(shell: list[str], spawn: Spawn) -> None:
    """`facts ARGS` last: act.sh's answers, `done`, then facts.sh's report (the next round's
    look, without another SSH channel)."""
    from fleet.node.facts import parse as parse_facts

    victim = spawn(["sleep", "60"])
    if shutil.which(shell[0]) is None:
        pytest.skip(f"{shell[0]} is not installed")
    proc = subprocess.run(
        [*shell, "-s", "--", "signal", "5", f"{victim.pid}:{start_of(victim.pid)}",
         "facts", "--port", "1"],
        input=shipped_script("act.sh").encode(), capture_output=True, check=False,
        env={"PATH": os.environ["PATH"], "FLEET_NODE_HELPER": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode("ascii").splitlines()
    done = lines.index("done")
    assert parse(lines[:done]) == [Outcome("signal", victim.pid, "term")]
    snap = parse_facts(lines[done + 1 :])
    assert victim.pid not in snap.procs
    assert snap.listens == ()
