"""sudo with -K as a real non-root login, and ProxyJump through one node, against real sshd nodes.

The sudo tests never touch this machine's /etc: the login user `fleetop` exists only inside one
node's private mount namespace, where copies of /etc/passwd, /etc/shadow, /etc/group and
/etc/sudoers.d (kept on the node's own /run tmpfs) are bind-mounted over the originals. The
node's sshd runs in that mount namespace, so it and sudo see the user; the host does not.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, FleetResult, fleet_env, run_fleet
from freesubnet import on_a_free_subnet

pytestmark = pytest.mark.root

USER = "fleetop"
UID = 4242
# Random per session, so a grep for it can only match this run's leaks; shell metacharacters on
# purpose: if the line ever reached a shell as text, `$(...)` would run and `!`/`'` would break it.
PASSWORD = f"S3cr3t-pw!'$(touch /tmp/pw-ran)-{secrets.token_hex(4)}"
ETC_COPY = "/run/fleetop-etc"  # on the node's private /run tmpfs
HOME = "/tmp/fleetop-home"  # on the node's private /tmp tmpfs
SAMPLER = "/tmp/fleet-ps-sampler"  # prefix of the ps sampler's files on the node
SAW_SUDO = "/tmp/fleet-ps-saw-sudo"  # the sampler creates it once it has seen `sudo -S` running
AUTH_KEYS = "/run/fleet/authorized_keys"  # the sandbox sshd's one AuthorizedKeysFile
MOUNTS = f"{AUTH_KEYS} /etc/passwd /etc/group /etc/shadow /etc/sudoers.d"  # what _SETUP binds

# Creates fleetop inside the node. $1 = the password's SHA-512 crypt hash (computed on the host,
# so the plaintext never lands on the node). Fails (set -e) rather than half-configure.
_SETUP = rf"""
set -eu
hash=$1
d={ETC_COPY}
if getent passwd {USER} >/dev/null || getent passwd {UID} >/dev/null; then
    echo "{USER} or uid {UID} already exists on the node" >&2; exit 1
fi
mkdir -m 0755 "$d"
cp -p /etc/passwd /etc/group /etc/shadow "$d/"
cp -a /etc/sudoers.d "$d/sudoers.d"
echo '{USER}:x:{UID}:{UID}:fleet sudo test:{HOME}:/bin/sh' >>"$d/passwd"
echo '{USER}:x:{UID}:' >>"$d/group"
printf '%s:%s:19000:0:99999:7:::\n' {USER} "$hash" >>"$d/shadow"
# Password required (no NOPASSWD); never lecture (would write /var/lib/sudo on the host's disk).
printf 'Defaults:{USER} lecture=never\n{USER} ALL=(ALL) ALL\n' >"$d/sudoers.d/{USER}"
chown root:root "$d/sudoers.d/{USER}"
chmod 0440 "$d/sudoers.d/{USER}"
# sshd opens AuthorizedKeysFile as the target user, and the sandbox's is root's 0600 file:
# give fleetop a readable copy of the same key list (this mount namespace only).
install -m 0644 {AUTH_KEYS} "$d/authorized_keys"
mkdir -m 0700 {HOME}
chown {UID}:{UID} {HOME}
for f in passwd group shadow sudoers.d; do mount --bind "$d/$f" "/etc/$f"; done
mount --bind "$d/authorized_keys" {AUTH_KEYS}
visudo -c -q
id -un {UID}
"""

# Undoes _SETUP (idempotent): unmount every bind mount we made, remove the copies and the home,
# sudo's timestamp dir (node tmpfs), and any process still running as fleetop (by pid).
_TEARDOWN = rf"""
mounted() {{ awk -v m="$1" '$5 == m {{ f = 1 }} END {{ exit !f }}' /proc/self/mountinfo; }}
for m in {MOUNTS}; do
    n=0
    while mounted "$m" && [ $n -lt 5 ]; do umount "$m" || umount -l "$m"; n=$((n+1)); done
done
for s in /proc/[0-9]*/status; do
    awk '/^Uid:/ {{ exit !($2 == {UID}) }}' "$s" 2>/dev/null || continue
    p=${{s#/proc/}}; kill -KILL "${{p%/status}}" 2>/dev/null || :
done
rm -rf {ETC_COPY} {HOME}
rm -f /run/sudo/ts/{USER}
rmdir /run/sudo/ts /run/sudo 2>/dev/null || :
status=0
for m in {MOUNTS}; do
    if mounted "$m"; then echo "still mounted: $m" >&2; status=1; fi
done
if getent passwd {USER} >/dev/null; then echo "{USER} still visible" >&2; status=1; fi
exit $status
"""

# Samples every process's command line and environment on the node until told to stop (or 90 s
# pass), and flags when it has seen fleet's `sudo -S` running. Started detached; $1 = pid file.
_SAMPLER = rf"""
echo $$ >"$1"
out={SAMPLER}.out
: >"$out"
n=0
while [ ! -e {SAMPLER}.stop ] && [ $n -lt 1800 ]; do
    for d in /proc/[0-9]*; do
        c=$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null) || continue
        [ -n "$c" ] || continue
        printf 'cmdline %s\n' "$c" >>"$out"
        tr '\0' '\n' <"$d/environ" 2>/dev/null | sed 's/^/environ /' >>"$out"
        case "$c" in "sudo -S "*) : >{SAW_SUDO} ;; esac
    done
    : >{SAMPLER}.ready
    n=$((n+1))
    sleep 0.05
done
sort -u -o "$out" "$out"
: >{SAMPLER}.done
"""

# While a sampler runs, the sudo step holds (10 s at most) until it has seen the step's `sudo -S`
# process, so the ps check is not a race it could lose by the step being too quick to observe.
_WAIT_FOR_SAMPLER = (
    f"i=0; while [ -e {SAMPLER}.ready ] && [ ! -e {SAW_SUDO} ] && [ $i -lt 200 ]; "
    "do sleep 0.05; i=$((i+1)); done"
)

PROBE_SCRIPT = """\
echo first-line-ran
printf 'arg:%s\\n' "$@"
echo "uid:$(id -u)"
"""


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _poll(check: Callable[[], bool], timeout_s: float = 15, step_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step_s)
    return check()


def _on(sandbox: Any, node: Any, script: str) -> subprocess.CompletedProcess[str]:
    """run_on that must succeed."""
    result: subprocess.CompletedProcess[str] = sandbox.run_on(node, script)
    assert result.returncode == 0, f"{node.name}: {result.stderr or result.stdout}"
    return result


def _sha512_crypt(password: str) -> str:
    """The password as /etc/shadow stores it; the plaintext goes to openssl's stdin only."""
    if shutil.which("openssl") is None:
        pytest.fail("the sudo tests need `openssl` (apt-get install openssl; see scripts/setup)")
    proc = subprocess.run(
        ["openssl", "passwd", "-6", "-stdin"],
        input=password + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    crypted = proc.stdout.strip()
    assert crypted.startswith("$6$"), proc.stdout
    return crypted


def _host_etc_untouched() -> None:
    for path in ("/etc/passwd", "/etc/group", "/etc/shadow"):
        text = Path(path).read_text()
        assert not re.search(rf"^{USER}:", text, re.M), f"{USER} leaked into the host's {path}"
    assert not Path("/etc/sudoers.d", USER).exists(), "sudoers file leaked onto the host"


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def fleetop(sandbox: Any) -> Iterator[Any]:
    """The last sandbox node, with a password-sudo login user `fleetop` in its namespace only."""
    node = sandbox.nodes()[-1]
    _host_etc_untouched()
    crypted = _sha512_crypt(PASSWORD)
    try:
        setup = sandbox.run_on(node, f"set -- {shlex.quote(crypted)}\n{_SETUP}")
        assert setup.returncode == 0, setup.stderr
        assert setup.stdout.split() == [USER]
        _host_etc_untouched()  # the bind mounts did not propagate out of the node
        yield node
    finally:
        teardown = sandbox.run_on(node, _TEARDOWN)
        assert teardown.returncode == 0, teardown.stderr
        _host_etc_untouched()


@pytest.fixture
def nopasswd(sandbox: Any, fleetop: Any) -> Iterator[Any]:
    """fleetop's sudo needs no password for this test (a later sudoers file wins)."""
    rule = f"{ETC_COPY}/sudoers.d/zz-{USER}-nopasswd"
    _on(
        sandbox,
        fleetop,
        f"printf '{USER} ALL=(ALL) NOPASSWD: ALL\\n' >{rule}; chmod 0440 {rule}; visudo -c -q",
    )
    try:
        yield fleetop
    finally:
        _on(sandbox, fleetop, f"rm -f {rule}")


@pytest.fixture
def ps_sampler(sandbox: Any, fleetop: Any) -> Iterator[Callable[[], str]]:
    """Start the sampler on fleetop's node; yields `stop()`, which returns what it saw."""
    _on(sandbox, fleetop, f"rm -f {SAMPLER}.* {SAW_SUDO}")
    _on(sandbox, fleetop, f"cat >{SAMPLER}.sh <<'EOF'\n{_SAMPLER}EOF\n")
    _on(sandbox, fleetop, f"setsid sh {SAMPLER}.sh {SAMPLER}.pid </dev/null >/dev/null 2>&1 &")
    ready = _poll(lambda: sandbox.run_on(fleetop, f"test -e {SAMPLER}.ready").returncode == 0)
    assert ready, "the ps sampler did not start"

    def stop() -> str:
        _on(sandbox, fleetop, f": >{SAMPLER}.stop")
        done = _poll(lambda: sandbox.run_on(fleetop, f"test -e {SAMPLER}.done").returncode == 0)
        assert done, "the ps sampler did not stop"
        return str(sandbox.run_on(fleetop, f"cat {SAMPLER}.out").stdout)

    try:
        yield stop
    finally:
        # Stop it if the test did not; then make sure it is gone, by its pid.
        sandbox.run_on(
            fleetop,
            f": >{SAMPLER}.stop; p=$(cat {SAMPLER}.pid 2>/dev/null) || exit 0; i=0; "
            f'while [ $i -lt 100 ] && grep -q fleet-ps-sampler "/proc/$p/cmdline" 2>/dev/null; '
            "do sleep 0.05; i=$((i+1)); done; "
            f'if grep -q fleet-ps-sampler "/proc/$p/cmdline" 2>/dev/null; then kill "$p"; fi; '
            f"rm -f {SAMPLER}.* {SAW_SUDO}",
        )


# ---------------------------------------------------------------- helpers for the sudo tests


def _inventory(tmp_path: Path, sandbox: Any, node: Any) -> Path:
    return _write(
        tmp_path / "inventory.yaml",
        "all:\n  hosts:\n"
        f"    {node.name}:\n"
        f"      ansible_host: {node.address}\n"
        f"      ansible_user: {USER}\n"
        f"      ansible_ssh_private_key_file: {json.dumps(str(sandbox.key_path))}\n",
    )


def _playbook(tmp_path: Path) -> Path:
    _write(tmp_path / "probe.sh", PROBE_SCRIPT)
    return _write(
        tmp_path / "sudo.yaml",
        f"""\
name: sudo-probe
steps:
  - name: as root
    sudo: true
    run: 'id -u; whoami; {_WAIT_FOR_SAMPLER}'
  - name: as me
    run: id -un
  - name: script as root
    sudo: true
    script: probe.sh
    timeout: 60
    run: one 'two words'
""",
    )


def _run_with_password(
    sandbox: Any, *args: str, inventory: Path, log_dir: Path, password: str
) -> FleetResult:
    """`python -m fleet ARGS` with the password as stdin's first line and NO controlling terminal.

    start_new_session=True makes the child a session leader without a terminal, so getpass
    cannot open /dev/tty and reads the line from stdin (its documented fallback).
    """
    env = fleet_env(sandbox, log_dir, inventory=inventory)
    proc = subprocess.run(
        [*FLEET, *args],
        input=password + "\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        start_new_session=True,
        check=False,
    )
    return FleetResult(proc.returncode, proc.stdout, proc.stderr)


def _lines(result: FleetResult, step: str, stream: str = "stdout") -> list[str]:
    return [
        e["line"]
        for e in result.json_lines()
        if e["event"] == "OutputLine" and e["step"] == step and e["stream"] == stream
    ]


def _assert_nowhere(secret: str, result: FleetResult, log_dir: Path) -> None:
    """Not in fleet's stdout/stderr, nor in any file of the run record (which must exist)."""
    assert secret not in result.stdout
    assert secret not in result.stderr
    files = [p for p in log_dir.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"summary.json", "events.jsonl"} <= names, names
    assert any(p.parent.name == "hosts" and p.suffix == ".log" for p in files), names
    for path in files:
        assert secret.encode() not in path.read_bytes(), f"password written to {path}"


# ---------------------------------------------------------------- sudo tests


def test_sudo_step_without_K_fails_saying_sudo_needs_a_password(
    sandbox: Any, fleetop: Any, tmp_path: Path
) -> None:
    result = run_fleet(
        sandbox,
        "run",
        str(_playbook(tmp_path)),
        "--json",
        inventory=_inventory(tmp_path, sandbox, fleetop),
        log_dir=tmp_path / "logs",
    )

    assert result.code == 3, result.stdout + result.stderr
    host = result.final()["hosts"][fleetop.name]
    assert host["outcome"] == "failed"
    assert host["failed_step"] == "as root"
    assert "password" in host["reason"]
    assert "-K" in host["reason"]
    assert _lines(result, "as root") == []  # sudo refused before the command ran
    assert _lines(result, "as me") == []  # the host stopped at the failed step


def test_sudo_with_K_runs_as_root_and_the_password_leaks_nowhere(
    sandbox: Any, fleetop: Any, ps_sampler: Callable[[], str], tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    result = _run_with_password(
        sandbox,
        "run",
        str(_playbook(tmp_path)),
        "-K",
        "--json",
        inventory=_inventory(tmp_path, sandbox, fleetop),
        log_dir=logs,
        password=PASSWORD,
    )
    seen = ps_sampler()

    assert result.code == 0, result.stdout + result.stderr
    assert "sudo password" in result.stderr  # it really asked, and read the answer from stdin
    assert _lines(result, "as root") == ["0", "root"]
    assert _lines(result, "as me") == [USER]
    # The script arrived intact (its first line ran, nothing before it) with its arguments.
    assert _lines(result, "script as root") == [
        "first-line-ran",
        "arg:one",
        "arg:two words",
        "uid:0",
    ]
    assert not [x for x in _lines(result, "script as root", "stderr") if "not found" in x]
    assert sandbox.run_on(fleetop, "test -e /tmp/pw-ran").returncode != 0, "the password ran"
    _assert_nowhere(PASSWORD, result, logs)
    # The node's process table while sudo ran: fleet's sudo was seen, without the password.
    assert any(line.startswith("cmdline sudo -S ") for line in seen.splitlines()), seen[-2000:]
    assert PASSWORD not in seen


def test_K_against_nopasswd_sudo_never_feeds_the_password_to_the_step(
    sandbox: Any, nopasswd: Any, tmp_path: Path
) -> None:
    """With NOPASSWD, sudo never reads stdin: the password line must still not reach the step
    (a `script:` step's shell would run it as a command and print it in its error message)."""
    logs = tmp_path / "logs"
    result = _run_with_password(
        sandbox,
        "run",
        str(_playbook(tmp_path)),
        "-K",
        "--json",
        inventory=_inventory(tmp_path, sandbox, nopasswd),
        log_dir=logs,
        password=PASSWORD,
    )

    assert result.code == 0, result.stdout + result.stderr
    assert _lines(result, "as root") == ["0", "root"]
    assert _lines(result, "script as root") == [
        "first-line-ran",
        "arg:one",
        "arg:two words",
        "uid:0",
    ]
    assert not [x for x in _lines(result, "script as root", "stderr") if "not found" in x]
    assert sandbox.run_on(nopasswd, "test -e /tmp/pw-ran").returncode != 0, "the password ran"
    _assert_nowhere(PASSWORD, result, logs)


def test_a_wrong_K_password_is_one_failed_attempt_and_no_script_line_is_tried(
    sandbox: Any, fleetop: Any, tmp_path: Path
) -> None:
    """sudo -S asks again after a wrong password (passwd_tries, 3): only the one line fleet was
    given may be tried, not the stdin lines after it (STDIN_FOLLOWS, a script's first line), or
    one typo is three failed logins on every node and pam_faillock locks the account."""
    _write(tmp_path / "probe.sh", PROBE_SCRIPT)
    playbook = _write(
        tmp_path / "script.yaml",
        "name: sudo-script\nsteps:\n"
        "  - name: script as root\n    sudo: true\n    script: probe.sh\n    run: one\n",
    )
    result = _run_with_password(
        sandbox,
        "run",
        str(playbook),
        "-K",
        "--json",
        inventory=_inventory(tmp_path, sandbox, fleetop),
        log_dir=tmp_path / "logs",
        password="not-" + PASSWORD,
    )

    assert result.code == 3, result.stdout + result.stderr
    host = result.final()["hosts"][fleetop.name]
    assert host["reason"] == "sudo refused the password given with -K", host
    said = _lines(result, "script as root", "stderr")
    assert "sudo: 1 incorrect password attempt" in said, said
    assert _lines(result, "script as root") == []  # nothing of the script ran


# ---------------------------------------------------------------- cancelling sudo steps


def _root_probe(sandbox: Any, node: Any, probe: str) -> list[int]:
    """Pids of root processes on the node whose command line starts with `probe`."""
    script = (
        "for d in /proc/[0-9]*; do c=$(tr '\\0' ' ' <$d/cmdline 2>/dev/null); "
        f'case "$c" in {shlex.quote(probe)}*) '
        "awk '/^Uid:/ { exit !($2 == 0) }' $d/status && echo ${d#/proc/};; esac; done"
    )
    return [int(p) for p in sandbox.run_on(node, script).stdout.split()]


def _cancel_once_running(
    sandbox: Any,
    node: Any,
    probe: str,
    args: list[str],
    inventory: Path,
    log_dir: Path,
    password: str | None,
) -> FleetResult:
    """`fleet ARGS --json` without a terminal (the password, if any, on stdin); Ctrl-C once the
    probe runs as root on the node; the result once fleet has ended."""
    read_end, write_end = os.pipe()  # the password line, then EOF (it fits the pipe's buffer)
    os.write(write_end, f"{password}\n".encode() if password is not None else b"")
    os.close(write_end)
    with os.fdopen(read_end) as stdin:
        proc = subprocess.Popen(
            [*FLEET, *args, "--json"],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=fleet_env(sandbox, log_dir, inventory=inventory),
            start_new_session=True,
        )
    try:
        assert _poll(lambda: bool(_root_probe(sandbox, node, probe)), timeout_s=60)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return FleetResult(proc.returncode, out, err)


def test_ctrl_c_with_K_kills_the_root_step_with_the_same_sudo(
    sandbox: Any, fleetop: Any, tmp_path: Path
) -> None:
    """The kill runs with the step's own sudo and password: `sudo -n`, which a password sudo
    refuses, would leave the root process running while fleet says "remote command stopped"."""
    probe = f"fleet-K-cancel-{secrets.token_hex(3)}"
    book = _write(
        tmp_path / "hold.yaml",
        f"name: hold\nsteps:\n  - name: hold as root\n    sudo: true\n"
        f"    run: exec bash -c 'exec -a {probe} sleep 300'\n",
    )
    try:
        result = _cancel_once_running(
            sandbox,
            fleetop,
            probe,
            ["run", str(book), "-K"],
            _inventory(tmp_path, sandbox, fleetop),
            tmp_path / "logs",
            PASSWORD,
        )

        assert result.code == 130, result.stdout + result.stderr
        host = result.final()["hosts"][fleetop.name]
        assert (host["outcome"], host["reason"]) == (
            "cancelled",
            "cancelled; remote command stopped",
        )
        assert _poll(lambda: not _root_probe(sandbox, fleetop, probe), timeout_s=10)
        _assert_nowhere(PASSWORD, result, tmp_path / "logs")
    finally:
        sandbox.run_on(fleetop, f"pkill -KILL -f '^{probe}' || true")


def test_a_kill_that_cannot_stop_the_step_is_reported_as_such(
    sandbox: Any, nopasswd: Any, tmp_path: Path
) -> None:
    """A step run as fleetop that made itself root (sudo inside the step) and ignores TERM: the
    kill, as fleetop, cannot end it, and fleet does not say "remote command stopped"."""
    probe = f"fleet-unkillable-{secrets.token_hex(3)}"
    step = f"exec sudo -n bash -c 'trap \"\" TERM; exec -a {probe} sleep 300'"
    try:
        result = _cancel_once_running(
            sandbox,
            nopasswd,
            probe,
            ["exec", step],
            _inventory(tmp_path, sandbox, nopasswd),
            tmp_path / "logs",
            None,
        )

        assert result.code == 130, result.stdout + result.stderr
        host = result.final()["hosts"][nopasswd.name]
        assert host["outcome"] == "cancelled", host
        assert host["reason"].startswith(
            "cancelled; the remote command may still run: left pids"
        ), host
        assert _root_probe(sandbox, nopasswd, probe), "the report said it was left: it must be"
    finally:
        sandbox.run_on(nopasswd, f"pkill -KILL -f '^{probe}' || true")


# ---------------------------------------------------------------- ProxyJump


def _sshd_log(node: Any) -> str:
    return (node.node_dir / "sshd.log").read_text(errors="replace")


def _accepted(text: str) -> list[str]:
    """Source addresses of accepted logins in an sshd log excerpt."""
    return re.findall(r"Accepted publickey for \S+ from (\S+) port", text)


def _behind_the_first(box: Any, path: Path) -> Path:
    """An ssh config that reaches every node of `box` but the first through the first
    (ProxyJump), with strict host key checking."""
    nodes = box.nodes()
    jump, others = nodes[0], nodes[1:]
    return _write(
        path,
        "".join(f"Host {n.name}\n    HostName {n.address}\n\n" for n in nodes)
        + f"Host {' '.join(f'{n.name} {n.address}' for n in others)}\n"
        f"    ProxyJump root@{jump.address}\n\n"
        "Host *\n"
        "    User root\n"
        "    Port 22\n"
        f"    IdentityFile {box.key_path}\n"
        "    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {box.known_hosts_path}\n"
        "    GlobalKnownHostsFile /dev/null\n"
        "    StrictHostKeyChecking yes\n"
        "    BatchMode yes\n"
        "    ConnectTimeout 10\n",
    )


def test_proxyjump_reaches_every_node_through_one_gateway_connection(
    sandbox: Any, tmp_path: Path
) -> None:
    nodes = sandbox.nodes()
    jump, others = nodes[0], nodes[1:]
    config = _behind_the_first(sandbox, tmp_path / "ssh_config")
    before = {n.name: len(_sshd_log(n)) for n in nodes}

    result = run_fleet(
        sandbox, "exec", "hostname", "--json", ssh_config=config, log_dir=tmp_path / "logs"
    )

    assert result.code == 0, result.stdout + result.stderr
    printed = {
        e["host"]: e["line"]
        for e in result.json_lines()
        if e["event"] == "OutputLine" and e["stream"] == "stdout"
    }
    assert printed == {n.name: n.name for n in nodes}

    def new_logins(node: Any) -> list[str]:
        return _accepted(_sshd_log(node)[before[node.name] :])

    # sshd logs the login before the session's command runs; poll anyway, never sleep blindly.
    assert _poll(lambda: all(new_logins(n) for n in nodes), timeout_s=10)
    for node in others:
        assert new_logins(node) == [jump.address], f"{node.name} was not reached via the jump"
    on_jump = new_logins(jump)
    # node01's own session plus ONE shared gateway connection (not one per jumped node).
    assert 1 <= len(on_jump) <= 2, on_jump
    assert jump.address not in on_jump  # node01 itself was reached directly


# /24s for a throwaway sandbox of this module's: far from the session's and other modules'.
_JUMP_SUBNETS = [f"10.{b}.81.0/24" for b in range(230, 254)]


def test_hosts_behind_one_jump_host_all_finish_whatever_order_they_close_in(
    make_sandbox: Callable[[str], Any], tmp_path: Path
) -> None:
    """Seven hosts through one jump host: their tunnels close while the others' steps still
    run, and every run must end with every host ok. paramiko's Channel could write a tunnel's
    CLOSE before data already built for it; the jump host's sshd then ended the shared
    connection ("data packet referred to nonexistent channel") and the hosts still running
    lost theirs. Before fleet/ssh/tunnel.py that failed 11 runs of 80 here; 20 runs of a race
    that struck one run in seven (the step-by-step check is tests/ssh/test_tunnel.py)."""

    def up(subnet: str) -> Any:
        box = make_sandbox(subnet)
        box.up(8)
        return box

    box = on_a_free_subnet(_JUMP_SUBNETS, up)[0]
    config = _behind_the_first(box, tmp_path / "ssh_config")
    names = {n.name for n in box.nodes()}
    for attempt in range(1, 21):
        result = run_fleet(
            box, "exec", "hostname", "--json", ssh_config=config, log_dir=tmp_path / "logs"
        )
        assert result.code == 0, f"run {attempt}: {result.stdout[-3000:]}{result.stderr}"
        printed = {e["host"] for e in result.json_lines() if e["event"] == "OutputLine"}
        assert printed == names, f"run {attempt}"
