"""The command's directory, and a keeper that has left it (fleet/ssh/workdir.py): relative paths
resolved against the directory's name, the same before and after leaving; a directory gone when
something needs it, said. Real files and processes; what chdirs runs in a fresh interpreter of
its own (a keeper leaves its directory for good), and the keepers themselves are tested end to
end in tests/e2e/test_warm_workdir.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet.core.hosts import Host
from fleet.ssh.settings import SshSettings
from fleet.ssh.transport import SSHTransport


def _python(code: str, cwd: Path) -> dict[str, Any]:
    """Run `code` in a fresh Python in `cwd` (a process of its own, as a keeper is) and return
    the JSON it prints."""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def _config(directory: Path, text: str) -> Path:
    path = directory / "cfg"
    path.write_text(text)
    return path


def test_a_targets_relative_paths_are_the_commands_directorys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _config(
        tmp_path,
        "Host *\n"
        "    IdentityFile keys/id\n"
        "    CertificateFile keys/id-cert.pub\n"
        "    UserKnownHostsFile kh /etc/ssh/kh\n",
    )
    transport = SSHTransport(SshSettings(ssh_config=Path("cfg"), known_hosts=(Path("more"),)))
    target = transport.target(Host(name="a", address="10.0.0.1", key_file="inv/key"))
    here = str(tmp_path)
    assert target.key_files == (f"{here}/inv/key", f"{here}/keys/id")
    assert target.certificate_files == (f"{here}/keys/id-cert.pub",)
    assert target.known_hosts[1:] == (
        Path(f"{here}/more"),
        Path(f"{here}/kh"),
        Path("/etc/ssh/kh"),
    )
    assert target.workdir == here


def test_a_target_needs_the_directory_only_for_a_relative_path_or_a_proxy_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = _config(
        tmp_path,
        "Host 10.0.0.2\n"
        "    ProxyCommand nc %h %p\n"
        "Host *\n"
        "    IdentityFile /keys/id\n"
        "    UserKnownHostsFile /kh\n",
    )
    transport = SSHTransport(SshSettings(ssh_config=config))
    assert transport.target(Host(name="a", address="10.0.0.1")).workdir is None
    assert transport.target(Host(name="b", address="10.0.0.2")).workdir == str(tmp_path)


# Run in a directory of its own: the target of a host whose files are named relative to it,
# before and after leaving it (what a connection's key is made of), and what a `Match exec`
# with a relative path finds there.
LEAVES = """\
import json, os, sys
from pathlib import Path
from fleet.core.hosts import Host
from fleet.ssh import keeper, workdir
from fleet.ssh.settings import SshSettings
from fleet.ssh.transport import SSHTransport
host = Host(name="a", address="10.0.0.1", key_file="inv/key")
os.environ["HOME"] = "home"  # relative: ~/.ssh/known_hosts is the directory's too
def key():
    transport = SSHTransport(SshSettings(ssh_config=Path("cfg")))
    target = transport.target(host)
    return keeper._target_text(target), target.key_files
before = key()
sys.path.insert(0, "")
workdir.leave()
after = key()
print(json.dumps({
    "same": before == after,
    "key_files": after[1],
    "cwd": os.getcwd(),
    "path0": sys.path[0],
    "home": os.environ["HOME"],
    "here": workdir.here(),
}))
"""


def test_a_keeper_that_left_resolves_as_its_command_did(tmp_path: Path) -> None:
    (tmp_path / "marker").touch()
    _config(
        tmp_path,
        'Match exec "test -e marker"\n    IdentityFile matched/id\nHost *\n    User root\n',
    )
    said = _python(LEAVES, tmp_path)
    here = str(tmp_path)
    assert said["same"]  # the same connection key: a handed-off connection is found again
    assert said["key_files"] == [f"{here}/inv/key", f"{here}/matched/id"]
    assert said["cwd"] == "/"
    assert said["path0"] == here  # '' meant the working directory: it still means that one
    assert said["home"] == f"{here}/home"
    assert said["here"] == here


# A keeper whose directory was removed before it could note it: a relative path is refused,
# saying why; an absolute one is fine.
GONE_BEFORE = """\
import json, os
from fleet.ssh import workdir
os.rmdir(os.getcwd())
workdir.leave()
try:
    workdir.absolute("keys/id")
    said = ""
except workdir.Unknown as exc:
    said = exc.message
print(json.dumps({"said": said, "absolute": workdir.absolute("/keys/id"), "cwd": os.getcwd()}))
"""


def test_a_keeper_whose_directory_was_gone_before_it_left_refuses_relative_paths(
    tmp_path: Path,
) -> None:
    doomed = tmp_path / "doomed"
    doomed.mkdir()
    said = _python(GONE_BEFORE, doomed)
    assert "was gone before its keeper" in said["said"]
    assert said["absolute"] == "/keys/id"
    assert said["cwd"] == "/"


# A keeper that left its directory, which is then removed: a host whose ProxyCommand runs there
# fails for itself, saying why, and so does the ssh config named relative to it.
GONE_AFTER = """\
import json, os, shutil
from pathlib import Path
from fleet.core.errors import ConfigError
from fleet.core.hosts import Host
from fleet.ssh import workdir
from fleet.ssh.settings import SshSettings
from fleet.ssh.transport import ConnectFailed, SSHTransport
here = os.getcwd()
workdir.leave()
transport = SSHTransport(SshSettings(ssh_config=Path("cfg")))
host = Host(name="a", address="10.0.0.1")
transport.check([host])
shutil.rmtree(here)
out = {}
try:
    transport.connect(host)
except ConnectFailed as exc:
    out["connect"] = [exc.reason, exc.detail]
try:
    SSHTransport(SshSettings(ssh_config=Path("cfg")))
except ConfigError as exc:
    out["config"] = exc.message
print(json.dumps(out))
"""


def test_a_directory_gone_when_a_keeper_needs_it_fails_the_host_saying_so(
    tmp_path: Path,
) -> None:
    doomed = tmp_path / "doomed"
    doomed.mkdir()
    _config(doomed, "Host *\n    ProxyCommand ./proxy %h %p\n")
    said = _python(GONE_AFTER, doomed)
    reason, detail = said["connect"]
    assert reason == "working directory gone"
    assert detail.startswith(f"{doomed}, the directory fleet was started in, is gone")
    assert said["config"] == (
        f"{doomed}/cfg: ssh config not found: {doomed}, the directory fleet was started in, is gone"
    )


def test_a_proxy_command_runs_in_the_directory_it_is_given(tmp_path: Path) -> None:
    from fleet.ssh.proxy import ProxyCommandSocket

    sock = ProxyCommandSocket("pwd", str(tmp_path))
    try:
        sock.timeout = 10
        assert sock.recv(4096).decode().strip() == str(tmp_path)
    finally:
        sock.close()


def test_a_proxy_command_that_cannot_start_there_is_a_connect_failure(tmp_path: Path) -> None:
    from fleet.ssh.failure import ConnectFailed
    from fleet.ssh.proxy import ProxyCommandSocket

    with pytest.raises(ConnectFailed) as failed:
        ProxyCommandSocket("true", str(tmp_path / "gone"))
    assert failed.value.reason == "proxy command failed"
    assert f"in {tmp_path / 'gone'}" in failed.value.detail
    assert os.getcwd() != "/"  # nothing here left the test's own directory
