"""Keepers a command forks (fleet/ssh/keeperfork.py): detached like a spawned keeper, named in
`ps`, holding none of the command's files, and spawned instead whenever forking is not safe.

Real processes: each test runs a small client in a fresh interpreter against its own runtime
directory, and stops the keepers it started, by pid, at the end."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.ssh import keeperfork

# Keepers started as WarmTransport.check starts them: forked while the command is still
# single-threaded (fork_ahead), else spawned, then reached; it reports each keeper's pid and
# the file it had open itself.
CLIENT = """\
import json, os, socket, sys, threading
from fleet.ssh import warm
held = open(sys.argv[1], "w")  # a file of the command's: no keeper may hold it
if sys.argv[2] == "thread":
    stop = threading.Event()
    threading.Thread(target=stop.wait).start()
paths = warm.socket_paths(warm.shard_count())
ahead = {path: warm.fork_ahead(path) for path in paths}
socks = [warm.connect_or_start(path, ahead[path]) for path in paths]
if sys.argv[2] == "thread":
    stop.set()
found = []
for s in socks:
    creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    found.append(int.from_bytes(creds[:4], "little"))
print(json.dumps({"keepers": found, "held": os.readlink(f"/proc/self/fd/{held.fileno()}")}))
sys.stdout.flush()
"""


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A private runtime directory (short: a socket's path is at most 107 bytes); every keeper
    that served a socket in it is stopped after."""
    path = Path(tempfile.mkdtemp(prefix="fleet-test-"))
    try:
        yield path
    finally:
        for pid in _keepers_in(path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(path, ignore_errors=True)


def _keepers_in(runtime: Path) -> list[int]:
    """Pids of the processes holding a socket under `runtime` (keepers started by the test)."""
    inodes = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 8 and parts[7].startswith(str(runtime)):
            inodes.add(f"socket:[{parts[6]}]")
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _client(runtime: Path, tmp_path: Path, mode: str, cwd: Path | None = None) -> dict[str, object]:
    """Run CLIENT with its stdout a pipe, to its end and the pipe's; returns its report. `-P`:
    the client itself imports fleet's own code whatever directory it runs in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env |= {"XDG_RUNTIME_DIR": str(runtime), "FLEET_KEEPERS": "2"}
    proc = subprocess.run(
        [sys.executable, "-P", "-c", CLIENT, str(tmp_path / "held.txt"), mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=True,
        cwd=cwd,
    )
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def _proc(pid: int, name: str) -> str:
    return Path(f"/proc/{pid}/{name}").read_bytes().replace(b"\0", b" ").decode().strip()


def test_a_forked_keeper_is_detached_named_and_holds_none_of_the_commands_files(
    runtime: Path, tmp_path: Path
) -> None:
    report = _client(runtime, tmp_path, "single")
    keepers = report["keepers"]
    assert isinstance(keepers, list)
    assert len(keepers) == 2
    # run() above returned at the end of the command's stdout pipe, and the keepers are still
    # there: they never held it (else it would have ended only with them).
    assert sorted(keepers) == sorted(_keepers_in(runtime))
    for pid in keepers:
        title = _proc(pid, "cmdline")
        assert title.startswith(f"{keeperfork.TITLE} {runtime}/"), title  # forked, and named
        assert os.getsid(pid) == pid  # a session of its own: no terminal, no operator's Ctrl-C
        fds = {fd.name: os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
        assert [fds[n] for n in ("0", "1", "2")] == ["/dev/null"] * 3
        others = {n: target for n, target in fds.items() if n not in ("0", "1", "2")}
        assert all(target.startswith("socket:") for target in others.values()), others
        assert report["held"] not in fds.values()
        assert os.readlink(f"/proc/{pid}/cwd") == "/"  # nor the command's working directory


def test_a_command_with_threads_spawns_its_keepers_instead(runtime: Path, tmp_path: Path) -> None:
    """A fork copies only the calling thread: a lock another one held would stay held."""
    report = _client(runtime, tmp_path, "thread")
    keepers = report["keepers"]
    assert isinstance(keepers, list)
    assert len(keepers) == 2
    for pid in keepers:
        assert "-m fleet.ssh.keeper" in _proc(pid, "cmdline")
        assert os.getsid(pid) == pid


def test_a_spawned_keeper_never_imports_a_fleet_package_from_the_working_directory(
    runtime: Path, tmp_path: Path
) -> None:
    """`python -m` puts the working directory first on the import path: a `fleet/` someone
    else made where the operator stands (/tmp, a shared directory) would run as the operator."""
    planted = tmp_path / "shared"
    (planted / "fleet" / "ssh").mkdir(parents=True)
    ran = tmp_path / "planted-code-ran"
    code = f"open({str(ran)!r}, 'w').close()\n"
    for init in ("fleet/__init__.py", "fleet/ssh/__init__.py", "fleet/ssh/keeper.py"):
        (planted / init).write_text(code)
    report = _client(runtime, tmp_path, "thread", cwd=planted)
    keepers = report["keepers"]
    assert isinstance(keepers, list)
    assert len(keepers) == 2  # spawned (the command had a thread), and serving
    for pid in keepers:
        assert "-m fleet.ssh.keeper" in _proc(pid, "cmdline")
        # Out of the command's directory (fleet/ssh/workdir.py): it does not pin it.
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
    assert not ran.exists()


def test_no_fork_without_a_way_to_name_the_keeper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keeperfork, "threads_now", lambda: 1)
    assert keeperfork.can_fork()
    monkeypatch.setattr(keeperfork.importlib.util, "find_spec", lambda name: None)
    assert not keeperfork.can_fork()


# A keeper forked for a socket outside the checked directory: it exits 2 at once.
EXITS_AT_START = """\
import json, os, sys
from fleet.core.errors import ConfigError
from fleet.ssh import keeperfork, warm
path = os.path.join(sys.argv[1], "elsewhere.sock")
lock = os.open(os.path.join(sys.argv[1], "lock"), os.O_RDWR | os.O_CREAT, 0o600)
keeper = keeperfork.fork_keeper(warm.Path(path))
try:
    warm.connect_or_start(warm.Path(path), (lock, keeper))
    said = ""
except ConfigError as exc:
    said = exc.message
print(json.dumps({"said": said, "status": keeper.poll()}))
"""


def test_a_forked_keeper_that_exits_at_start_is_reported_with_its_status(tmp_path: Path) -> None:
    """A keeper serves only sockets in the checked directory: asked for one elsewhere, the
    forked keeper exits 2 at once, and the command says so instead of waiting."""
    proc = subprocess.run(
        [sys.executable, "-c", EXITS_AT_START, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(proc.stdout)
    assert "exited at start (status 2)" in report["said"]
    assert report["status"] == 2  # reaped by the command, not left a zombie


# A thread the kernel runs and Python does not know: what a thread whose Python code has ended
# is while it exits (OpenSSL's thread-exit handler then holds its global lock). Made with
# pthread_create on libc's sleep(), given 1 (second) as its argument.
NATIVE_THREAD = """\
import ctypes, sys, threading, time
from fleet.ssh import keeperfork
libc = ctypes.CDLL(None)
tid = ctypes.c_ulong()
start = ctypes.cast(libc.sleep, ctypes.c_void_p)
assert libc.pthread_create(ctypes.byref(tid), None, start, ctypes.c_void_p(1)) == 0
during = (threading.active_count(), keeperfork.threads_now())
libc.pthread_join(tid, None)
after = keeperfork.threads_now()
print(during[0], during[1], after)
"""


def test_a_thread_python_no_longer_counts_still_forbids_a_fork() -> None:
    out = subprocess.run(
        [sys.executable, "-c", NATIVE_THREAD], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["1", "2", "1"]  # Python sees one thread, the kernel two, then one
