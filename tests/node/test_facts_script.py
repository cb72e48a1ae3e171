"""fleet/remote/facts.sh run for real, in dash, bash and busybox sh, against this machine's /proc
(read-only: nothing it does changes anything). Processes the tests start carry a unique token
in their argv and are killed afterwards; they run in sessions of their own, like a dead job."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleet.core.playbook import shipped_script
from fleet.node.decide import holders_of
from fleet.node.facts import CMDLINE_MAX, Snapshot, facts_args, parse

SHELLS = [["dash"], ["bash", "--posix"], ["busybox", "sh"]]
Spawn = Callable[..., subprocess.Popen[bytes]]


def facts(shell: list[str], args: list[str], **env: str) -> tuple[list[str], Snapshot]:
    """facts.sh's output lines and their parse, run as fleet runs it (marked as its own)."""
    if shutil.which(shell[0]) is None:
        pytest.skip(f"{shell[0]} is not installed")
    proc = subprocess.run(
        [*shell, "-s", "--", *args],
        input=shipped_script("facts.sh").encode(),
        capture_output=True,
        env={"PATH": os.environ["PATH"], "FLEET_NODE_HELPER": "1", **env},
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode("ascii").splitlines()
    return lines, parse(lines)


@pytest.fixture
def token() -> str:
    return f"fleetfacts{uuid.uuid4().hex[:10]}"


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start a process in its own session (as a job left on a node); all killed afterwards."""
    started: list[subprocess.Popen[bytes]] = []

    def _spawn(argv: list[bytes | str], **kw: object) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, start_new_session=True, **kw)  # type: ignore[call-overload]
        started.append(proc)
        return proc

    yield _spawn
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_for(check: Callable[[], bool], what: str) -> None:
    for _ in range(300):
        if check():
            return
        subprocess.run(["sleep", "0.02"], check=True)
    pytest.fail(f"timed out waiting for {what}")


SLEEPER = "import sys, time; open(sys.argv[1], 'w').close(); time.sleep(60)"


def sleeper(spawn: Spawn, tmp_path: Path, *args: bytes | str) -> subprocess.Popen[bytes]:
    ready = tmp_path / f"ready-{uuid.uuid4().hex[:6]}"
    proc = spawn([sys.executable, "-c", SLEEPER, str(ready), *args])
    wait_for(ready.exists, "the sleeper")
    return proc


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_hostile_and_huge_command_lines_round_trip_as_data(
    shell: list[str], spawn: Spawn, tmp_path: Path, token: str
) -> None:
    hostile = [token.encode(), b"a\nb", b"tab\there", b"\x1b]0;title\x07", b"\xff\xfe bad utf-8"]
    small = sleeper(spawn, tmp_path, *hostile)
    chunk = b"x" * 100_000  # one argument may hold 128 KiB; ten make a 1 MB command line
    huge = sleeper(spawn, tmp_path, token.encode() + b"huge", *([chunk] * 10))
    lines, snap = facts(shell, facts_args([token]))
    assert all(line.isascii() and line.isprintable() and len(line) < 16_384 for line in lines)
    record = snap.records[small.pid]
    argv = [sys.executable.encode(), b"-c", SLEEPER.encode()]
    assert record.cmdline.split(b"\0")[:3] == argv
    assert record.cmdline.split(b"\0")[4:-1] == hostile
    assert not record.cut
    big = snap.records[huge.pid]
    assert big.cut
    assert len(big.cmdline) == CMDLINE_MAX
    assert big.cmdline.endswith(b"xxxx")


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_newline_in_a_process_name_neither_hides_it_nor_fakes_another(
    shell: list[str], spawn: Spawn, tmp_path: Path, token: str
) -> None:
    """Any process may set its comm to text with a newline: the stat line then splits, and the
    part after the newline looks like an entry of its own (here: a fake pid 1)."""
    ready = tmp_path / "renamed"
    code = (
        "import ctypes, sys, time\n"
        "ctypes.CDLL(None).prctl(15, b'a\\n1 (b) S 0 0', 0, 0, 0)\n"
        "open(sys.argv[1], 'w').close(); time.sleep(60)"
    )
    proc = spawn([sys.executable, "-c", code, str(ready), token])
    wait_for(ready.exists, "the rename")
    _, snap = facts(shell, facts_args([token]))
    assert snap.procs[proc.pid].ppid == os.getpid()
    assert snap.records[proc.pid].comm == b"a\n1 (b) S 0 0"
    assert snap.procs[1].ppid == 0  # pid 1 is the real init, not the fake entry


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_matches_and_their_descendants_get_full_records_fleet_s_own_none(
    shell: list[str], spawn: Spawn, token: str
) -> None:
    launcher = spawn(["bash", "-c", f"(exec -a worker sleep 61) & exec -a {token} sleep 62"])
    helper = spawn(
        ["bash", "-c", f"exec -a '{token} helper' sleep 63"],
        env={**os.environ, "FLEET_NODE_HELPER": "1"},
    )
    for proc in (launcher, helper):
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        wait_for(lambda c=cmdline: c.read_bytes().startswith(token.encode()), "the exec")
    lines, snap = facts(shell, facts_args([token]))
    workers = [p for p in snap.procs.values() if p.ppid == launcher.pid]
    assert len(workers) == 1
    assert snap.records[workers[0].pid].text == b"worker 61"
    assert snap.records[launcher.pid].text == f"{token} 62".encode()
    assert helper.pid in snap.helpers
    assert helper.pid not in snap.records  # matched only by argv, and fleet's own
    # a busy node sends kilobytes: full records only for what matters
    assert len(snap.records) < 10
    assert sum(len(line) + 1 for line in lines if not line.startswith("t ")) < 8_000


@pytest.mark.root
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_the_program_of_a_match_not_roots_is_reported_root_s_not(
    shell: list[str], spawn: Spawn, token: str
) -> None:
    """A name is the process's own to choose (`exec -a sshd`); the program it runs is not."""
    stranger = spawn(
        ["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups", "bash", "-c",
         f"exec -a 'sshd {token}' sleep 64"]
    )  # fmt: skip
    root = spawn(["bash", "-c", f"exec -a 'sshd {token}' sleep 65"])
    for proc in (stranger, root):
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        wait_for(lambda c=cmdline: c.read_bytes().startswith(b"sshd "), "the exec")
    _, snap = facts(shell, facts_args([token]))
    found = snap.records[stranger.pid]
    assert (found.uid, found.exe) == (4242, os.path.realpath(shutil.which("sleep")).encode())
    assert snap.records[root.pid].exe is None  # root's: believed by its owner alone
    # who started it: a daemon's name is believed from another user only when root's daemon did
    me = Path("/proc/self/comm").read_bytes().rstrip(b"\n")
    assert found.parent == ((0, 0, 0, 0), me)
    assert snap.records[root.pid].parent is None


@pytest.mark.root
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_the_parent_of_a_match_not_roots_is_reported_with_its_uids(
    shell: list[str], spawn: Spawn, token: str
) -> None:
    parent = spawn(
        ["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups", "bash", "-c",
         f"exec -a 'tini {token}' bash -c '(exec -a \"sshd {token}\" sleep 66) & wait'"]
    )  # fmt: skip
    wait_for(lambda: len(_children(parent.pid)) == 1, "the child")
    child = _children(parent.pid)[0]
    _, snap = facts(shell, facts_args([token]))
    assert snap.records[child].parent == ((4242,) * 4, b"bash")
    me = Path("/proc/self/comm").read_bytes().rstrip(b"\n")
    assert snap.records[parent.pid].parent == ((0, 0, 0, 0), me)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()]


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_holders_of_paths_by_fd_cwd_mapping_unix_socket_and_environment(
    shell: list[str], spawn: Spawn, tmp_path: Path
) -> None:
    base = tmp_path / "st"
    for name in ("fd", "cwd", "map", "sock", "env", "free"):
        (base / f"d-{name}").mkdir(parents=True)
    (base / "d-fd" / "f").write_text("x")
    (base / "d-map" / "m").write_bytes(b"\0" * 4096)
    (base / "link").symlink_to(base / "d-fd")
    holders = {
        "fd": spawn(["sh", "-c", f"exec sleep 60 3<{base}/d-fd/f"]),
        "cwd": spawn(["sleep", "60"], cwd=base / "d-cwd"),
        "env": spawn(["sleep", "60"], env={"ERROR_FILE": f"{base}/d-env/x/error.json"}),
    }
    ready = tmp_path / "mapped"
    holders["map"] = spawn([sys.executable, "-c", (
        "import mmap, os, sys, time\n"
        "m = mmap.mmap(os.open(sys.argv[1], os.O_RDWR), 0)\n"
        "open(sys.argv[2], 'w').close(); time.sleep(60)"
    ), f"{base}/d-map/m", str(ready)])  # fmt: skip
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(base / "d-sock" / "listener"))
    holders["sock"] = spawn(["sleep", "60"], pass_fds=[sock.fileno()])
    sock.close()
    wait_for(ready.exists, "the mapping")
    wait_for(lambda: os.readlink(f"/proc/{holders['cwd'].pid}/cwd").endswith("d-cwd"), "cwd")
    _, snap = facts(shell, facts_args(paths=[f"{base}/d-*", f"{base}/link"]))
    found = {m.path: m for m in snap.matches}
    links = snap.holders()
    for name, proc in holders.items():
        match = found[f"{base}/d-{name}".encode()]
        assert match.kind == "d"
        assert proc.pid in holders_of(snap, match, links), name
    assert holders_of(snap, found[f"{base}/d-free".encode()], links) == ()
    link = found[f"{base}/link".encode()]
    assert (link.kind, holders_of(snap, link, links)) == ("l", ())
    # each match's owner, the link's own for a symlink (whose use keeps a match: decide.holds)
    assert {m.owner for m in found.values()} == {os.getuid()}
    if os.getuid() == 0:
        os.lchown(base / "link", 4242, 4242)
        _, snap = facts(shell, facts_args(paths=[f"{base}/link"]))
        assert [m.owner for m in snap.matches] == [4242]


# A /proc/net/* file is a seq_file: one read() of it returns one page (4 KiB) at most, whatever
# the buffer. A node with a dockerd and a dozen containers has pages of unix sockets.


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_every_unix_socket_bound_in_a_match_is_found_past_the_table_s_first_page(
    shell: list[str], spawn: Spawn, tmp_path: Path
) -> None:
    """100 sockets bound in a match fill ~15 KiB of /proc/net/unix: each one is reported, and a
    process holding any of them holds the match (a DataLoader worker's /tmp/pymp-*)."""
    base = tmp_path / "pymp"
    base.mkdir()
    socks = [socket.socket(socket.AF_UNIX) for _ in range(100)]
    for i, sock in enumerate(socks):
        sock.bind(str(base / f"listener-{i:03d}"))
    inodes = {os.fstat(sock.fileno()).st_ino for sock in socks}
    last = spawn(["sleep", "60"], pass_fds=[socks[-1].fileno()])
    holder = spawn(["sleep", "60"], pass_fds=[sock.fileno() for sock in socks])
    for sock in socks:
        sock.close()
    _, snap = facts(shell, facts_args(paths=[str(base)]))
    assert inodes <= set(snap.unix)
    (match,) = snap.matches
    assert {last.pid, holder.pid} <= set(holders_of(snap, match, snap.holders()))


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_every_listener_on_the_port_is_found_past_the_table_s_first_page(
    shell: list[str], spawn: Spawn
) -> None:
    """40 SO_REUSEPORT listeners on the port (a server's workers) fill 6 KiB of /proc/net/tcp."""
    listeners = [socket.socket() for _ in range(40)]
    port = 0
    for sock in listeners:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(1)
        port = sock.getsockname()[1]
    inodes = {os.fstat(sock.fileno()).st_ino for sock in listeners}
    holder = spawn(["sleep", "60"], pass_fds=[sock.fileno() for sock in listeners])
    for sock in listeners:
        sock.close()
    _, snap = facts(shell, facts_args(port=port))
    assert {inode for p, inode in snap.listens if p == port} == inodes
    sockets = {f"socket:[{inode}]".encode() for inode in inodes}
    assert {link.pid for link in snap.links if link.target in sockets} == {holder.pid}


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_a_port_listener_and_the_places_are_reported(shell: list[str], spawn: Spawn) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    holder = spawn(["sleep", "60"], pass_fds=[listener.fileno()])
    listener.close()
    _, snap = facts(shell, facts_args(paths=["~/.nv"], port=port), HOME="/root")
    inodes = [inode for p, inode in snap.listens if p == port]
    assert len(inodes) == 1
    sockets = {link.pid for link in snap.links if link.target == f"socket:[{inodes[0]}]".encode()}
    assert holder.pid in sockets
    assert snap.home == b"/root"
    assert snap.places["tmp"] == os.path.realpath("/tmp").encode()
    assert snap.globs[0] == b"/root/.nv"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--force"], "unknown option: --force"),
        (["--pattern"], "--pattern needs a value: one non-empty line"),
        (["--pattern", ""], "--pattern needs a value: one non-empty line"),
        (["--port", "http"], "--port needs a number"),
    ],
)
def test_bad_usage_exits_2_with_one_line_and_nothing_on_stdout(args: list[str], error: str) -> None:
    proc = subprocess.run(
        ["dash", "-s", "--", *args],
        input=shipped_script("facts.sh").encode(),
        capture_output=True,
        check=False,
    )
    assert (proc.returncode, proc.stdout) == (2, b"")
    assert proc.stderr.decode() == f"facts.sh: {error}\n"


SCRIPTS = ("facts.sh", "act.sh")


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_scripts_as_sent_pass_shellcheck(name: str, tmp_path: Path) -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    script = tmp_path / name
    script.write_text(shipped_script(name))
    result = subprocess.run(
        ["shellcheck", "--shell=sh", str(script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: s[0])
def test_the_scripts_parse_in_every_shell(shell: list[str], name: str, tmp_path: Path) -> None:
    if shutil.which(shell[0]) is None:
        pytest.skip(f"{shell[0]} is not installed")
    script = tmp_path / name
    script.write_text(shipped_script(name))
    result = subprocess.run(
        [*shell, "-n", str(script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_the_marker_is_found_anywhere_in_the_environment_with_busybox_s_own_tools(
    spawn: Spawn, tmp_path: Path, token: str
) -> None:
    """busybox grep stops reading a line at a NUL: a marker after the first variable of an
    environment must still be found with a node's busybox tools alone."""
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox is not installed")
    tools = tmp_path / "bin"
    tools.mkdir()
    listed = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
    for applet in listed.stdout.split():
        (tools / applet).symlink_to(busybox)
    env = {"A_FIRST": "1", "FLEET_NODE_HELPER": "1", "Z_LAST": "1"}
    marked = spawn(["bash", "-c", f"exec -a '{token} helper' sleep 60"], env=env)
    plain = spawn(["bash", "-c", f"exec -a '{token} job' sleep 61"], env={"A_FIRST": "1"})
    for proc in (marked, plain):
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        wait_for(lambda c=cmdline: c.read_bytes().startswith(token.encode()), "the exec")
    _, snap = facts([busybox, "sh"], facts_args([token]), PATH=str(tools))
    assert marked.pid in snap.helpers
    assert plain.pid not in snap.helpers
    assert set(snap.records) >= {plain.pid}
    assert marked.pid not in snap.records
