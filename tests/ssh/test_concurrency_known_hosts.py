"""One known_hosts written by many fleet processes at once under `--host-keys accept-new`
(fleet/ssh/hostkeys.py HostKeyStore): real processes (this interpreter) record real keys through
the same code a connection uses, while others read the file.

What must hold: no line lost, none torn or glued to another, no host recorded twice; a host two
processes saw with different keys is recorded once, and the other process gets "host key
changed"; a reader never fails on a half-written line.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import pytest

from fleet.core.errors import ConfigError
from fleet.ssh import hostkeys
from fleet.ssh.settings import SshSettings
from fleet.ssh.transport import ConnectFailed, HostKeyStore, _classify

CHECKOUT = Path(__file__).resolve().parents[2]

# One process: records its own hosts' keys (one per host, base64, the last arguments), the
# shared host's shared key, and its own key for the contested host; prints what happened to the
# contested one.
RECORDER = """
import base64, sys, time
from pathlib import Path
import paramiko
from fleet.ssh.transport import HostKeyStore

path, me, count, shared, contested = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), \\
    sys.argv[4], sys.argv[5]
key = lambda text: paramiko.ECDSAKey(data=base64.b64decode(text))
own = [key(text) for text in sys.argv[6:]]
while not (path.parent / "go").exists():
    time.sleep(0.001)
store = HostKeyStore()
for i in range(count):
    store.record(path, f"[10.{me}.0.{i}]:2222", own[i])
store.record(path, "shared.example", key(shared))
try:
    store.record(path, "contested.example", key(contested))
    print("recorded")
except paramiko.BadHostKeyException:
    print("changed")
"""


def _keys(n: int) -> list[paramiko.PKey]:
    return [paramiko.ECDSAKey.generate() for _ in range(n)]


def _lines(path: Path) -> list[paramiko.hostkeys.HostKeyEntry]:
    """Every line of the file parsed (fails on a torn or glued one)."""
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("#"):
            continue
        entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
        assert entry is not None, f"line {number}: {line!r}"
        assert len(line.split()) == 3, f"line {number}: {line!r}"
        entries.append(entry)
    return entries


def test_many_processes_recording_keys_at_once_lose_and_tear_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ssh" / "known_hosts"
    path.parent.mkdir()
    # a file edited by hand whose last line has no newline: ours must not be glued to it
    old = _keys(1)[0]
    path.write_text(f"# mine\nold.example {old.get_name()} {old.get_base64()}")
    processes, count = 12, 20
    shared = _keys(1)[0]
    contested = _keys(processes)
    procs = []
    for me in range(processes):
        own = _keys(count)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                RECORDER,
                str(path),
                str(me),
                str(count),
                shared.get_base64(),
                contested[me].get_base64(),
                *(k.get_base64() for k in own),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=CHECKOUT,
        )
        procs.append((proc, own))
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=CHECKOUT,
    )
    time.sleep(0.5)
    (tmp_path / "ssh" / "go").touch()
    outcomes = []
    for proc, _ in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outcomes.append(out.strip())
    (tmp_path / "ssh" / "go").unlink()
    read_out, read_err = reader.communicate(timeout=60)
    assert reader.returncode == 0, read_err
    reads, failures = read_out.split()
    assert int(reads) > 0
    assert failures == "0", read_out

    entries = _lines(path)
    assert path.read_text().startswith(f"# mine\nold.example {old.get_name()} {old.get_base64()}\n")
    names = [name for entry in entries for name in entry.hostnames]
    assert len(names) == len(set(names)), "a host recorded twice"
    recorded = {name: entry.key for entry in entries for name in entry.hostnames}
    for me, (_, own) in enumerate(procs):
        for i, key in enumerate(own):
            assert recorded[f"[10.{me}.0.{i}]:2222"] == key
    assert recorded["shared.example"] == shared
    # the contested host: the first key is kept; every later process was told it changed
    assert sorted(outcomes) == ["changed"] * (processes - 1) + ["recorded"]
    winner = outcomes.index("recorded")
    assert recorded["contested.example"] == contested[winner]
    assert len(entries) == 1 + processes * count + 2


READER = """
import sys, time
from pathlib import Path
from fleet.core.errors import ConfigError
from fleet.ssh.transport import HostKeyStore
path = Path(sys.argv[1]); reads = failures = 0
while not (path.parent / "go").exists():
    time.sleep(0.001)
while (path.parent / "go").exists():
    try:
        HostKeyStore().load(path)
    except ConfigError:
        failures += 1
    reads += 1
print(reads, failures)
"""


def test_a_key_recorded_by_another_process_meanwhile_is_not_appended_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "known_hosts"
    key = _keys(1)[0]
    mine, theirs = HostKeyStore(), HostKeyStore()
    mine.load(path)  # read before the other process recorded it
    theirs.record(path, "[10.0.0.1]:22", key)
    mine.record(path, "[10.0.0.1]:22", key)
    assert len(path.read_text().splitlines()) == 1
    assert mine.known((path,), "[10.0.0.1]:22") == {key.get_name(): key}


def test_a_different_key_recorded_meanwhile_is_a_changed_key(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    first, second = _keys(2)
    mine, theirs = HostKeyStore(), HostKeyStore()
    mine.load(path)
    theirs.record(path, "node01", first)
    with pytest.raises(paramiko.BadHostKeyException) as caught:
        mine.record(path, "node01", second)
    failed = _classify(caught.value, time.monotonic(), SshSettings(), 10)
    assert failed.reason == "host key changed"
    assert path.read_text().count("node01 ") == 1


def test_a_known_hosts_locked_too_long_is_a_host_failure_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hostkeys, "KNOWN_HOSTS_LOCK_WAIT_S", 0.2)
    path = tmp_path / "known_hosts"
    path.write_text("")
    store = HostKeyStore()
    store.load(path)  # read at the start of the run
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process stuck with the lock (a flock is per open)
    try:
        with pytest.raises(ConfigError, match="locked by another process"):
            HostKeyStore().load(path)
        with pytest.raises(ConnectFailed) as caught:
            store.record(path, "node01", _keys(1)[0])
        assert caught.value.reason == "host key not recorded"
        assert "locked by another process" in caught.value.detail
    finally:
        os.close(fd)
    assert path.read_text() == ""
