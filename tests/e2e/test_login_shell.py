"""A node whose login shell talks: rc files that print banners (some of them imitating fleet's own
records) must not break fleet's parsing anywhere; each banner is reported once per host as a
warning, and a login shell that never runs fleet's command is a failure, not a silent success.

sshd runs every command as `$SHELL -c COMMAND`: bash sources ~/.bashrc for it (Debian builds bash
with the "bashrc over ssh" rule), zsh sources ~/.zshenv, and sshd itself runs ~/.ssh/rc through
the login shell first, whatever that shell is (dash, busybox sh). Each test gives the sandbox's
nodes such files (their /root is private to each node) and takes them away afterwards.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, FleetResult, fleet_env, poll, run_fleet
from realtorch import Runs, status

pytestmark = pytest.mark.root

# Several lines on both streams, some of them shaped like fleet's records: facts.sh's header
# and end, a status facts line, the wrapper's pid line, a frame marker with a made-up token.
BANNER = r"""
echo "Welcome to $(hostname): chatty rc file"
echo 'facts 1'
echo 'self 1'
echo 'end'
echo 'run=ghost state=running launcher=alive launcher_pid=1 procs=0'
echo 'fleet-frame 00000000000000000000000000000000 end'
echo 'fleet-remote-pid 1' >&2
echo 'a banner line on stderr' >&2
printf 'a last line without a newline'
"""
WARNING = "the login shell printed"
RC_FILES = "/root/.bashrc /root/.zshenv /root/.ssh/rc /root/.bb"
# The node's root gets another login shell: a private copy of /etc/passwd, bind-mounted over the
# shared one inside the node's own mount namespace.
SET_SHELL = r"""
cp /etc/passwd /run/fleet/passwd
sed -i "s|^root:\([^:]*:[^:]*:[^:]*:[^:]*:[^:]*\):.*$|root:\1:$1|" /run/fleet/passwd
mount --bind /run/fleet/passwd /etc/passwd
"""
RESET_SHELL = (
    "while mountpoint -q /etc/passwd; do umount /etc/passwd; done; rm -f /run/fleet/passwd"
)


def _sh(sandbox: Any, node: Any, script: str) -> None:
    result = sandbox.run_on(node, script)
    assert result.returncode == 0, f"{node.name}: {script}\n{result.stdout}{result.stderr}"


def _write_rc(sandbox: Any, node: Any, path: str, text: str) -> None:
    _sh(sandbox, node, f"mkdir -p \"$(dirname {path})\" && cat >{path} <<'EOF'\n{text}\nEOF")


@pytest.fixture
def chatty(sandbox: Any) -> Iterator[Any]:
    """Every node's rc files and login shell restored after the test."""
    try:
        yield sandbox
    finally:
        for node in sandbox.nodes():
            sandbox.run_on(node, f"rm -rf {RC_FILES}; {RESET_SHELL}")


def _login_shell(sandbox: Any, node: Any, shell: str) -> None:
    _sh(sandbox, node, f"set -- {shell}\n{SET_SHELL}")


def _warned_once(result: FleetResult, names: list[str]) -> None:
    """Each host's banner is said once, on stderr, as a warning; the banner never reaches the
    hosts' own output."""
    lines = result.stderr.splitlines()
    for name in names:
        mine = [x for x in lines if x.startswith(f"fleet: warning: {name}: {WARNING}")]
        assert len(mine) == 1, result.stderr
        assert "Welcome to" in mine[0], mine
    assert "Welcome to" not in result.stdout, result.stdout


def _each_verb(sandbox: Any, tmp_path: Path, names: list[str], *limit: str) -> None:
    """cleanup, its preview, preflight, status and janitor status: all succeed despite the
    banner, and say it once per host. (status exits 3 when no node runs a job: not started.)"""
    runs = {
        "cleanup": ("cleanup", "--yes", "--plain"),
        "preview": ("cleanup", "--preview", "--plain"),
        "preflight": ("preflight", "--dir", "/tmp", "--var", "min_free_gb=0.01", "--plain"),
        "status": ("status", "--plain"),
        "janitor": ("janitor", "status", "--dir", "/tmp/chatty-ckpt", "--plain"),
    }
    for what, args in runs.items():
        result = run_fleet(sandbox, *args, *limit, log_dir=tmp_path)
        expected = 3 if what == "status" else 0
        assert result.code == expected, f"{what}:\n{result.stdout}\n{result.stderr}"
        _warned_once(result, names)
    states = run_fleet(sandbox, "status", "--json", *limit, log_dir=tmp_path).run_states()
    assert {s["state"] for s in states.values()} == {"not started"}, states


def test_a_chatty_bashrc_breaks_no_verb_and_is_warned_about_once_per_host(
    chatty: Any, tmp_path: Path
) -> None:
    nodes = chatty.nodes()
    for node in nodes:
        _write_rc(chatty, node, "/root/.bashrc", BANNER)
    _each_verb(chatty, tmp_path, [n.name for n in nodes])


def test_a_chatty_bashrc_does_not_break_a_real_launch(
    chatty: Any, runs: Runs, tmp_path: Path
) -> None:
    nodes = chatty.nodes()
    for node in nodes:
        _write_rc(chatty, node, "/root/.bashrc", BANNER)
    result = runs.launch("chatty-run", tmp_path)
    assert result.code == 0, result.stdout + result.stderr
    _warned_once(result, [n.name for n in nodes])
    code, states = status(chatty, tmp_path)
    assert code == 0, states
    assert {(s["run"], s["state"]) for s in states.values()} == {("chatty-run", "running")}


@pytest.mark.parametrize("shell", ["/bin/dash", "busybox"])
def test_a_dash_or_busybox_login_shell_with_a_talking_ssh_rc(
    chatty: Any, tmp_path: Path, shell: str
) -> None:
    """sshd runs ~/.ssh/rc through the login shell before every command: its output reaches
    the client whatever the shell."""
    node = chatty.nodes()[1]
    if shell == "busybox":
        busybox = shutil.which("busybox")
        assert busybox, "scripts/setup installs busybox"
        # busybox picks its applet by argv[0]: the login shell must be named sh.
        _sh(chatty, node, f"mkdir -p /root/.bb && ln -sf {busybox} /root/.bb/sh")
        shell = "/root/.bb/sh"
    _login_shell(chatty, node, shell)
    _write_rc(chatty, node, "/root/.ssh/rc", BANNER)
    _each_verb(chatty, tmp_path, [node.name], "--limit", node.name)


def test_a_chatty_zshenv(chatty: Any, tmp_path: Path) -> None:
    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.skip("zsh is not installed (scripts/setup installs it)")
    node = chatty.nodes()[2]
    _login_shell(chatty, node, zsh)
    _write_rc(chatty, node, "/root/.zshenv", BANNER)
    _each_verb(chatty, tmp_path, [node.name], "--limit", node.name)


def test_a_login_shell_that_exits_before_the_command_is_a_failure_not_a_success(
    chatty: Any, tmp_path: Path
) -> None:
    node = chatty.nodes()[3]
    _write_rc(chatty, node, "/root/.bashrc", 'echo "Welcome"; exit 0')
    for args in (("exec", "true"), ("cleanup", "--yes"), ("status",)):
        result = run_fleet(chatty, *args, "--json", "--limit", node.name, log_dir=tmp_path)
        assert result.code == 3, f"{args}: {result.stdout}{result.stderr}"
        row = result.final()["hosts"][node.name]
        assert row["outcome"] == "failed", row
        assert "login shell" in (row["reason"] or "") + (row["last_line"] or ""), row


def test_an_rc_file_that_reads_stdin_fails_the_step_instead_of_running_half_a_script(
    chatty: Any, tmp_path: Path
) -> None:
    """A `read` in ~/.bashrc would eat the first line of the script fleet feeds on stdin."""
    node = chatty.nodes()[3]
    _write_rc(chatty, node, "/root/.bashrc", "IFS= read -r eaten")
    result = run_fleet(chatty, "cleanup", "--yes", "--json", "--limit", node.name, log_dir=tmp_path)
    assert result.code == 3, result.stdout + result.stderr
    row = result.final()["hosts"][node.name]
    assert "stdin" in (row["reason"] or "") + (row["last_line"] or ""), row
    # a step without stdin is untouched by it
    ok = run_fleet(chatty, "exec", "echo fine", "--json", "--limit", node.name, log_dir=tmp_path)
    assert ok.code == 0, ok.stdout + ok.stderr


def _probe_pids(sandbox: Any, node: Any, probe: str) -> list[int]:
    """Pids on the node whose command line starts with `probe` (the scan runs from a file)."""
    scan = (
        "for d in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $d/cmdline 2>/dev/null);"
        f' case "$c" in {shlex.quote(probe)}*) echo "${{d#/proc/}}";; esac; done'
    )
    return [int(p) for p in sandbox.run_on(node, scan).stdout.split()]


def test_ctrl_c_stops_the_real_step_not_the_pid_a_banner_forged(
    chatty: Any, tmp_path: Path
) -> None:
    """The banner prints `fleet-remote-pid 1` on stderr before the wrapper's own pid line: the
    kill on Ctrl-C must go to the step fleet started, not to the session of the node's pid 1
    (whose init forwards the TERM and takes the whole node down)."""
    node = chatty.nodes()[0]
    _write_rc(chatty, node, "/root/.bashrc", BANNER)
    probe = f"fleet-chatty-{os.getpid()}"
    step = f"exec bash -c 'exec -a {probe} sleep 300'"
    argv = [*FLEET, "exec", step, "--json", "--limit", node.name]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env=fleet_env(chatty, tmp_path),
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if json.loads(line)["event"] == "StepStarted":
                break
        assert poll(lambda: _probe_pids(chatty, node, probe), timeout_s=15), "no probe"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        left = _probe_pids(chatty, node, probe)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in _probe_pids(chatty, node, probe):
            chatty.run_on(node, f"kill -KILL {pid}")
    final = [json.loads(x) for x in out.splitlines() if '"RunFinished"' in x]
    row = final[0]["hosts"][node.name]
    assert (row["outcome"], row["reason"]) == ("cancelled", "cancelled; remote command stopped")
    assert not left, "the step survived the cancel"
    after = run_fleet(chatty, "exec", "true", "--limit", node.name, log_dir=tmp_path)
    assert after.code == 0, after.stdout + after.stderr
    assert [n.name for n, up, _ in chatty.status() if up] == [n.name for n in chatty.nodes()]
