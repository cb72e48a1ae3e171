"""`fleet preflight` against real sshd nodes: real mounts, listeners and leftovers on the nodes.

Each test mounts what it needs inside one node's own mount namespace (a private tmpfs "scratch"
dir, an overlay or an ext4 image on a loop device inside it), plants processes detached with
setsid in the node's PID namespace, and removes all of it afterwards. No NFS server or FUSE
filesystem runs here: network and FUSE verdicts are covered by `classify-fs` in
tests/node/test_preflight_decide.py.
"""

from __future__ import annotations

import re
import shlex
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FleetResult, run_fleet

pytestmark = pytest.mark.root

PORT = 39517  # not cleanup's 39500, so ghosts planted by other tests cannot interfere
CHECKS = ["dir", "fs", "free", "port", "leftovers", "shm"]
# A rendezvous store that nothing matching the training patterns left on the port.
LISTENER = """\
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(8)
time.sleep(600)
"""


def _sh(sandbox: Any, node: Any, script: str) -> str:
    """Run `script` as root inside the node; fail the test if it fails."""
    result = sandbox.run_on(node, script)
    assert result.returncode == 0, f"{node.name}: {script}\n{result.stdout}{result.stderr}"
    return str(result.stdout)


def _poll(check: Callable[[], bool], what: str, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def preflight(sandbox: Any, log_dir: Path, *args: str, min_shm_gb: str = "0.01") -> FleetResult:
    """`fleet preflight ARGS --json`; the /dev/shm threshold low, so small CI machines pass."""
    return run_fleet(
        sandbox, "preflight", *args, "--var", f"min_shm_gb={min_shm_gb}", "--json", log_dir=log_dir
    )


def checks(result: FleetResult, host: str) -> dict[str, tuple[str, str]]:
    """check -> (verdict, reason) from the host's output (ok and warn on stdout, fail on
    stderr); every check exactly once, on one stream."""
    out: dict[str, tuple[str, str]] = {}
    events = [e for e in result.json_lines() if e["event"] == "OutputLine" and e["host"] == host]
    lines = [e["line"] for e in events if e["stream"] == "stdout"]
    assert lines, result.stdout + result.stderr
    for line in lines[:-1] + [e["line"] for e in events if e["stream"] == "stderr"]:
        verdict, _, rest = line.partition(" ")
        name, _, reason = rest.strip().partition(": ")
        assert verdict in ("ok", "warn", "fail"), line
        assert (verdict == "fail") == (line not in lines), f"{line}: on the wrong stream"
        assert name not in out, f"{name} reported twice: {lines}"
        out[name] = (verdict, reason)
    assert sorted(out, key=CHECKS.index) == CHECKS, lines
    assert lines[-1].startswith("preflight: "), lines
    return out


def host(result: FleetResult, name: str) -> dict[str, Any]:
    hosts: dict[str, dict[str, Any]] = result.final()["hosts"]
    return hosts[name]


@pytest.fixture
def node01(sandbox: Any) -> Any:
    return sandbox.nodes()[0]


@pytest.fixture
def scratch(sandbox: Any, node01: Any) -> Iterator[str]:
    """A fresh tmpfs mounted in node01's mount namespace; unmounted (with all below) after."""
    path = f"/tmp/fleet-preflight-{uuid.uuid4().hex[:8]}"
    _sh(sandbox, node01, f"mkdir {path} && mount -t tmpfs -o size=64m fleet-scratch {path}")
    yield path
    _sh(sandbox, node01, f"umount -R {path} && rmdir {path}")


@pytest.fixture
def plant(sandbox: Any) -> Iterator[Callable[[Any, str], int]]:
    """Start a command detached (own session, like a job sshd left behind); killed after."""
    planted: list[tuple[Any, int]] = []

    def _plant(node: Any, command: str) -> int:
        out = _sh(sandbox, node, f"setsid {command} </dev/null >/dev/null 2>&1 & echo $!")
        pid = int(out.strip())  # setsid does not fork: not a process group leader here
        planted.append((node, pid))
        return pid

    yield _plant
    for node, pid in planted:
        _sh(sandbox, node, f"kill -KILL {pid} 2>/dev/null; true")
        _poll(partial(_gone, sandbox, node, pid), f"planted pid {pid} on {node.name} to end")


def _cmdline(sandbox: Any, node: Any, pid: int) -> str:
    return str(sandbox.run_on(node, f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout).strip()


def _gone(sandbox: Any, node: Any, pid: int) -> bool:
    return bool(sandbox.run_on(node, f"test -d /proc/{pid}").returncode != 0)


def _listening(sandbox: Any, node: Any, port: int) -> bool:
    script = f"grep -q ':{port:04X} [0-9A-F:]* 0A ' /proc/net/tcp /proc/net/tcp6"
    return bool(sandbox.run_on(node, script).returncode == 0)


# ------------------------------------------------------------------------------ filesystems


def test_a_tmpfs_dir_warns_fs_naming_the_mount_and_the_host_passes(
    sandbox: Any, node01: Any, scratch: str, tmp_path: Path
) -> None:
    # A blank in the mount point: the mount table escapes it (\040, \x20); the reason must not.
    ram = f"{scratch}/ram disk"
    _sh(sandbox, node01, f"mkdir '{ram}' && mount -t tmpfs -o size=8m fleet-ram '{ram}'")

    result = preflight(sandbox, tmp_path, "--dir", ram, "--min-free-gb", "0", "-l", "node01")

    assert result.code == 0, result.stdout + result.stderr
    verdict, reason = checks(result, "node01")["fs"]
    assert verdict == "warn"
    assert reason.startswith(f"{ram} is on tmpfs (fleet-ram mounted at {ram}): "), reason
    assert "RAM" in reason
    assert host(result, "node01")["last_line"] == "preflight: 5 ok, 1 warn, 0 fail"


def test_an_overlay_dir_fails_fs_and_the_host_with_the_reason_in_its_stderr_tail(
    sandbox: Any, node01: Any, scratch: str, tmp_path: Path
) -> None:
    # A container's root filesystem, for real: overlayfs with upper and work dirs on a tmpfs.
    merged = f"{scratch}/merged"
    _sh(
        sandbox,
        node01,
        f"cd {scratch} && mkdir lower upper work merged && "
        f"mount -t overlay overlay -o lowerdir=lower,upperdir=upper,workdir=work merged && "
        f'[ "$(stat -f -c %T {merged})" = overlayfs ]',
    )

    result = preflight(sandbox, tmp_path, "--dir", merged, "--min-free-gb", "0", "-l", "node01")

    assert result.code == 3, result.stdout + result.stderr
    verdict, reason = checks(result, "node01")["fs"]
    assert verdict == "fail"
    assert reason.startswith(f"{merged} is on overlay (overlay mounted at {merged}): ")
    assert "container overlay" in reason
    node = host(result, "node01")
    assert (node["outcome"], node["failed_step"], node["exit_code"]) == ("failed", "preflight", 1)
    assert f"fail  fs: {reason}" in node["stderr_tail"]
    assert node["last_line"] == "preflight: 5 ok, 0 warn, 1 fail"


def test_a_read_only_dir_fails_because_the_probe_really_writes(
    sandbox: Any, node01: Any, scratch: str, tmp_path: Path
) -> None:
    # Root passes every permission check; only a real write sees the read-only mount.
    ro = f"{scratch}/ro"
    _sh(sandbox, node01, f"mkdir {ro} && mount -t tmpfs -o ro fleet-ro {ro}")

    result = preflight(sandbox, tmp_path, "--dir", ro, "--min-free-gb", "0", "-l", "node01")

    assert result.code == 3, result.stdout + result.stderr
    assert checks(result, "node01")["dir"] == (
        "fail",
        f"{ro} is not writable (Read-only file system)",
    )


def test_an_ext4_disk_passes_every_check_on_a_clean_node(
    sandbox: Any, node01: Any, scratch: str, tmp_path: Path
) -> None:
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("needs mkfs.ext4 (e2fsprogs) for a node-local disk image")
    disk = f"{scratch}/disk"
    _sh(
        sandbox,
        node01,
        f"truncate -s 16M {scratch}/disk.img && mkfs.ext4 -q -F {scratch}/disk.img && "
        f"mkdir {disk} && mount -o loop {scratch}/disk.img {disk}",
    )

    result = preflight(
        sandbox, tmp_path, "--dir", disk, "--min-free-gb", "0.005", "--port", str(PORT),
        "-l", "node01",
    )  # fmt: skip

    assert result.code == 0, result.stdout + result.stderr
    found = checks(result, "node01")
    assert {name: verdict for name, (verdict, _) in found.items()} == dict.fromkeys(CHECKS, "ok")
    assert found["dir"][1] == f"{disk} is a writable directory"
    assert found["fs"][1].startswith(f"{disk} is on ext4 (/dev/loop")
    assert found["port"][1] == f"port {PORT} is free"
    assert host(result, "node01")["last_line"] == "preflight: 6 ok, 0 warn, 0 fail"
    assert _sh(sandbox, node01, f"ls -A {disk}").split() == ["lost+found"], "probe left behind"


def test_a_missing_dir_fails(sandbox: Any, tmp_path: Path) -> None:
    missing = "/tmp/fleet-preflight-nowhere/ckpt"

    result = preflight(sandbox, tmp_path, "--dir", missing, "--min-free-gb", "0", "-l", "node01")

    assert result.code == 3, result.stdout + result.stderr
    reason = f"{missing} does not exist on this node"
    assert checks(result, "node01")["dir"] == ("fail", reason)
    assert f"fail  dir: {reason}" in host(result, "node01")["stderr_tail"]


def test_plain_output_shows_a_failing_check_once_as_it_happens_and_once_in_the_summary(
    sandbox: Any, tmp_path: Path
) -> None:
    missing = "/tmp/fleet-preflight-nowhere/ckpt"
    result = run_fleet(
        sandbox, "preflight", "--dir", missing, "--plain", "-l", "node01", log_dir=tmp_path
    )

    assert result.code == 3, result.stdout + result.stderr
    line = f"fail  dir: {missing} does not exist on this node"
    live = [x for x in result.stdout.splitlines() if x.startswith("node01 |") and line in x]
    assert len(live) == 1, result.stdout
    assert f"    | {line}" in result.stdout.splitlines(), result.stdout  # the summary


def test_too_little_free_space_fails_with_the_numbers(
    sandbox: Any, scratch: str, tmp_path: Path
) -> None:
    result = preflight(
        sandbox, tmp_path, "--dir", scratch, "--min-free-gb", "999999", "-l", "node01"
    )

    assert result.code == 3, result.stdout + result.stderr
    verdict, reason = checks(result, "node01")["free"]
    assert verdict == "fail"
    # the scratch tmpfs is 64 MB
    assert re.match(rf"only 6\d MB free on {scratch}, 999999 GB required \(", reason), reason


# ------------------------------------------------------------------------- port, leftovers


def test_a_held_port_fails_on_rank_0_naming_the_holder_and_is_not_checked_on_rank_1(
    sandbox: Any, plant: Callable[[Any, str], int], tmp_path: Path
) -> None:
    node01, node02 = sandbox.nodes()[:2]
    holders = {}
    for node in (node01, node02):
        _sh(sandbox, node, f"printf %s {shlex.quote(LISTENER)} > /tmp/rdzv_store.py")
        holders[node.name] = plant(node, f"python3 /tmp/rdzv_store.py {PORT}")
        _poll(partial(_listening, sandbox, node, PORT), f"a listener on {node.name}")

    try:
        result = preflight(
            sandbox, tmp_path, "--dir", "/tmp", "--min-free-gb", "0", "--port", str(PORT),
            "-l", "node01,node02",
        )  # fmt: skip
    finally:
        for node in (node01, node02):
            sandbox.run_on(node, "rm -f /tmp/rdzv_store.py")

    assert result.code == 3, result.stdout + result.stderr
    verdict, reason = checks(result, "node01")["port"]
    assert verdict == "fail"
    holder = f"{holders['node01']} (python3 /tmp/rdzv_store.py {PORT})"
    assert reason.startswith(f"port {PORT} is already in use by {holder}: "), reason
    assert host(result, "node01")["outcome"] == "failed"
    assert checks(result, "node02")["port"] == ("ok", "not checked (rank 1)")
    assert host(result, "node02")["outcome"] == "ok"
    # the check only looked: the listener is still there
    assert _listening(sandbox, node01, PORT)


def test_planted_leftovers_warn_and_suggest_fleet_cleanup(
    sandbox: Any, node01: Any, plant: Callable[[Any, str], int], tmp_path: Path
) -> None:
    pid = plant(node01, "bash -c 'exec -a torchrun sleep 600'")
    _poll(lambda: _cmdline(sandbox, node01, pid) == "torchrun 600", "the planted torchrun")
    _sh(sandbox, node01, "echo x > /dev/shm/torch_fleet_preflight")
    try:
        result = preflight(sandbox, tmp_path, "--dir", "/tmp", "--min-free-gb", "0", "-l", "node01")
    finally:
        _sh(sandbox, node01, "rm -f /dev/shm/torch_fleet_preflight")

    assert result.code == 0, result.stdout + result.stderr
    # exactly one process: fleet's own shell, whose argv holds `--pattern torchrun`, is not one
    assert checks(result, "node01")["leftovers"] == (
        "warn",
        "leftover training processes or torch state (1 process, 1 path): run fleet cleanup",
    )
    assert host(result, "node01")["outcome"] == "ok"
    assert _cmdline(sandbox, node01, pid) == "torchrun 600", "preflight must not kill anything"


def test_a_docker_sized_dev_shm_warns(sandbox: Any, node01: Any, tmp_path: Path) -> None:
    # Docker's default /dev/shm, stacked over the node's own for the test, then removed.
    _sh(sandbox, node01, "mount -t tmpfs -o size=64m fleet-shm /dev/shm")
    try:
        result = preflight(
            sandbox, tmp_path, "--dir", "/tmp", "--min-free-gb", "0", "-l", "node01",
            min_shm_gb="1",
        )  # fmt: skip
    finally:
        _sh(sandbox, node01, "umount /dev/shm")

    assert result.code == 0, result.stdout + result.stderr
    verdict, reason = checks(result, "node01")["shm"]
    assert verdict == "warn"
    assert reason.startswith("/dev/shm is only 64 MB (< 1 GB): Docker's default 64 MB "), reason
    assert _sh(sandbox, node01, "df -Pk /dev/shm | sed -n 2p").split()[1] != "65536"
