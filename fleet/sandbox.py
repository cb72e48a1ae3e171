"""A local fleet of real OpenSSH "nodes" on this machine, for tests and the `fleet sandbox` demo.

Each node is a little host of its own:

* a network namespace `fl-<sid>-<name>` whose `eth0` is one end of a veth pair; the other end is
  a port of the bridge `flbr-<sid>` in the root namespace, which holds the gateway address. The
  subnet (default 10.251.0.0/16) exists only on that bridge, and nothing adds a default route or
  NAT, so traffic never leaves the machine;
* PID (own /proc), mount (propagation private), IPC and UTS (hostname = node name) namespaces,
  entered by `ip netns exec <ns> unshare ...`; pid 1 is `tini -s` so orphans are reaped;
* private tmpfs on /tmp, /dev/shm, /root and /run; `state_dir/nodes/<name>/` is bind-mounted at
  /run/fleet (sshd config, host key, authorized_keys, pid file, log) and its `bin/` over
  /usr/local/bin, so tests can put shims such as a fake `nvidia-smi` on the node's PATH;
* its own `/usr/sbin/sshd`, started separately through `nsenter`, so a test can stop and start it.

`sid` is 4 hex digits of a hash of the state dir, so two sandboxes (demo and tests) can run at
once on different subnets. `state_dir/sandbox.json` records everything `down()` needs, so another
process can stop the sandbox; every process we start also carries FLEET_SANDBOX* variables in its
environment, which is how we tell our processes from anyone else's before killing by pid.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from fleet.errors import FleetError

__all__ = ["DEFAULT_MAX_STARTUPS", "DEFAULT_SUBNET", "Sandbox", "SandboxError", "SandboxNode"]

DEFAULT_SUBNET = "10.251.0.0/16"
DEFAULT_MAX_STARTUPS = "100:30:200"
SSHD = "/usr/sbin/sshd"
INNER_DIR = "/run/fleet"  # a node's own directory, as seen from inside the node
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MAX_NODES = 1024
STATE_VERSION = 1
PER_OCTET = 240  # node addresses use .10-.249 of each /24 block: never .0, .255 or the gateway
_TOOLS = ("ip", "unshare", "nsenter", "tini", "ssh-keygen", "mount", "umount", "hostname", "pkill")
_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
_MAX_STARTUPS_RE = re.compile(r"^\d+(:\d+:\d+)?$")
_ENV_SANDBOX = "FLEET_SANDBOX"
_ENV_NODE = "FLEET_SANDBOX_NODE"
_LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
_T = TypeVar("_T")
_R = TypeVar("_R")

# Runs as the node's pid 1 before it becomes tini: network, mounts, hostname.
# $1 = node name, $2 = node dir on the host, $3 = address/prefix. The node dir is entered first,
# so it stays reachable as "." (mount -c keeps the path relative) even when a tmpfs hides it.
_NODE_INIT = r"""
set -eu
name=$1 dir=$2 addr=$3
cd "$dir"
for c in all default eth0; do
    echo 1 >"/proc/sys/net/ipv6/conf/$c/disable_ipv6" 2>/dev/null || true
done
printf 'link set lo up\naddr add %s dev eth0\nlink set eth0 up\n' "$addr" | ip -batch -
umount -l /run/netns 2>/dev/null || true  # one lazy detach drops the whole subtree
mount -t tmpfs -o mode=0755,size=64m tmpfs /run
mkdir -m 0755 /run/sshd /run/fleet
mount -c --bind . /run/fleet
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=0700 tmpfs /root
mount -c --bind /run/fleet/bin /usr/local/bin
hostname "$name"
ln -s /bin/sleep /run/sandbox-keepalive
echo "fleet sandbox: node $name is up"
exec tini -s -- /run/sandbox-keepalive infinity
"""
# pid 1's child is `sleep` under another name, so a test's `pkill sleep` cannot take a node down.

# Starts the launcher detached (reparented to init, own session) and prints its pid.
_DETACH = '"$@" </dev/null >>"$FLEET_CONSOLE" 2>&1 & echo $!'

# Paths every node mounts for itself (tmpfs or bind): a host path under them is not the node's.
_NODE_PRIVATE = ("/tmp", "/dev/shm", "/root", "/run", "/usr/local/bin")

# bind_into, run inside the node: drop mounts already at dst, make the mount point, bind.
_BIND = """
set -eu
src={src} dst={dst}
while mountpoint -q "$dst"; do umount "$dst"; done
if [ ! -e "$dst" ]; then
    if [ {kind} = d ]; then mkdir -p "$dst"; else mkdir -p "$(dirname "$dst")"; : >"$dst"; fi
fi
mount --bind "$src" "$dst"
"""

# unbind, run inside the node: every mount at dst, then (remove=1) the mount point itself.
_UNBIND = """
set -eu
dst={dst}
while mountpoint -q "$dst"; do umount "$dst"; done
if [ {remove} = 1 ]; then
    if [ -d "$dst" ]; then rmdir "$dst"; else rm -f "$dst"; fi
fi
"""

_STOP_SSHD = r"""
pid=$(cat /run/fleet/sshd.pid 2>/dev/null || true)
if [ -n "$pid" ] && [ "$(cat /proc/$pid/comm 2>/dev/null)" = sshd ]; then kill -TERM "$pid"; fi
pkill -TERM -f '^sshd: .*\[listener\]' || true
"""


class SandboxError(FleetError):
    """The sandbox cannot be started, used or stopped; `message` says why, `hint` what next."""


@dataclass(frozen=True)
class SandboxNode:
    """One sandbox node: its name, address, network namespace, host pid of its init, files."""

    name: str
    address: str
    netns: str
    pid1: int
    node_dir: Path

    @property
    def bin_dir(self) -> Path:
        """Host directory mounted over the node's /usr/local/bin: drop shims here."""
        return self.node_dir / "bin"


@dataclass(frozen=True)
class _Record:
    """What we keep about a node beyond `SandboxNode`: slot, veth and launcher pid."""

    node: SandboxNode
    index: int
    veth: str
    launcher_pid: int


@dataclass
class _State:
    """The contents of sandbox.json."""

    status: str
    sid: str
    subnet: str
    max_startups: str
    nodes: list[_Record]


def preflight() -> None:
    """Fail early with one clear line when this machine cannot host a sandbox."""
    if os.geteuid() != 0:
        raise SandboxError(
            "fleet sandbox needs root (network, PID and mount namespaces)",
            hint="run it as root, e.g. with sudo",
        )
    missing = [tool for tool in _TOOLS if shutil.which(tool, path=NODE_PATH) is None]
    if not os.access(SSHD, os.X_OK):
        missing.append(SSHD)
    if missing:
        raise SandboxError(
            f"fleet sandbox needs {', '.join(missing)}, not found",
            hint="apt-get install openssh-server openssh-client tini iproute2 util-linux procps",
        )


def sandbox_id(state_dir: Path) -> str:
    """Short id for interface and netns names (Linux interface names max out at 15 chars)."""
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:4]


def parse_subnet(subnet: str) -> ipaddress.IPv4Network:
    """Validate a sandbox subnet: private IPv4, /8 to /24, so node addresses fit the scheme."""
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as exc:
        raise SandboxError(
            f"bad sandbox subnet {subnet!r}: {exc}", hint="e.g. 10.251.0.0/16"
        ) from exc
    if not net.is_private or not 8 <= net.prefixlen <= 24 or net.overlaps(_LOOPBACK):
        raise SandboxError(
            f"bad sandbox subnet {subnet}: need a private IPv4 network between /8 and /24",
            hint="e.g. 10.251.0.0/16",
        )
    return net


def node_address(net: ipaddress.IPv4Network, index: int) -> ipaddress.IPv4Address:
    """Address of node slot `index` (0-based): x.y.<index//240>.<index%240 + 10> for a /16."""
    return net.network_address + (index // PER_OCTET) * 256 + index % PER_OCTET + 10


def gateway_address(net: ipaddress.IPv4Network) -> ipaddress.IPv4Address:
    """The bridge's address: the last usable one, e.g. 10.251.255.254 for a /16."""
    return net.broadcast_address - 1


def capacity(net: ipaddress.IPv4Network) -> int:
    """How many nodes fit in the subnet (bounded by MAX_NODES)."""
    return min(MAX_NODES, net.num_addresses // 256 * PER_OCTET)


def node_names(count: int, prefix: str) -> list[str]:
    """Names node01, node02, ...: two digits at least, stable as the fleet grows."""
    return [f"{prefix}{i:02d}" for i in range(1, count + 1)]


# --------------------------------------------------------------------------- process helpers


def _run(
    cmd: Sequence[str], *, stdin: str | None = None, timeout_s: float = 60, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a host tool with a clean env; turn failure into a SandboxError naming the tool."""
    try:
        proc = subprocess.run(
            list(cmd),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=_node_env(),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"{cmd[0]} failed: {exc}") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise SandboxError(
            f"`{' '.join(cmd[:4])}` failed (exit {proc.returncode}): "
            f"{detail[-1] if detail else 'no output'}"
        )
    return proc


def _node_env(**extra: str) -> dict[str, str]:
    """A minimal login-like environment, so the host's env does not leak into nodes."""
    env = {"PATH": NODE_PATH, "HOME": "/root", "USER": "root", "LOGNAME": "root"}
    env["LANG"] = "C.UTF-8"
    env.update(extra)
    return env


def _parallel(fn: Callable[[_T], _R], items: Iterable[_T], workers: int = 16) -> list[_R]:
    """Map over a thread pool: per-node tool runs are process-bound, not Python-bound."""
    todo = list(items)
    if len(todo) <= 1:
        return [fn(item) for item in todo]
    with ThreadPoolExecutor(max_workers=min(workers, len(todo))) as pool:
        return list(pool.map(fn, todo))


def _proc_read(pid: int, what: str) -> bytes | None:
    """A /proc/<pid>/<what> file, or None if the process is gone."""
    try:
        return Path(f"/proc/{pid}/{what}").read_bytes()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """True if the pid exists and is not a zombie waiting to be reaped."""
    if pid <= 0:
        return False
    stat = _proc_read(pid, "stat")
    if stat is None:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


def _argv0(pid: int) -> str:
    """Basename of a process's argv[0] ('' if gone)."""
    raw = _proc_read(pid, "cmdline") or b""
    return os.path.basename(raw.split(b"\0", 1)[0].decode(errors="replace"))


def _marker(pid: int) -> tuple[str, str] | None:
    """The (state dir, node name) a process was started for, from its environment."""
    raw = _proc_read(pid, "environ")
    if not raw:
        return None
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    sandbox, node = env.get(_ENV_SANDBOX.encode()), env.get(_ENV_NODE.encode())
    if sandbox is None or node is None:
        return None
    return sandbox.decode(errors="replace"), node.decode(errors="replace")


def _kill(pids: Iterable[int]) -> None:
    """SIGKILL each pid, ignoring those already gone."""
    for pid in dict.fromkeys(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _all_pids() -> list[int]:
    """Every pid on the host."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from one scan of /proc (no /proc/<pid>/task/*/children here)."""
    kids: dict[int, list[int]] = {}
    for pid in _all_pids():
        stat = _proc_read(pid, "stat")
        if stat is None:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        kids.setdefault(int(fields[1]), []).append(pid)
    return kids


def _tcp_open(address: str, device: str, port: int = 22, timeout_s: float = 0.5) -> bool:
    """True if something accepts TCP there now; bound to `device` so it cannot leave the host."""
    # SO_BINDTODEVICE: if the bridge (and so its route) is gone, connect fails instead of
    # following the default route off the machine.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
            sock.connect((address, port))
        except OSError:
            return False
        return True


def _poll(
    done: Callable[[], bool], timeout_s: float, what: str | Callable[[], str], hint: str = ""
) -> None:
    """Poll `done` until it holds; SandboxError naming `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while not done():
        if time.monotonic() > deadline:
            said = what if isinstance(what, str) else what()
            raise SandboxError(f"timed out after {timeout_s:.0f}s waiting for {said}", hint=hint)
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def _tail(path: Path, lines: int = 5) -> str:
    """Last lines of a log file, joined for a one-line message."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


def _write(path: Path, text: str, mode: int = 0o644) -> bool:
    """Atomically replace a file if its content changed; True if it did."""
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            os.chmod(path, mode)
            return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return True


def _wait_captured(cmd: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
    """Run cmd with output to files, so background children cannot hold a pipe open."""
    # On timeout the process group is killed and TimeoutExpired carries the output so far.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=_node_env(),
            cwd="/",
            start_new_session=True,
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    if timed_out:
        raise subprocess.TimeoutExpired(list(cmd), timeout_s, stdout, stderr)
    return proc.returncode, stdout, stderr


def _keygen(path: Path, comment: str) -> None:
    """A fresh ed25519 keypair with no passphrase (the sandbox is unattended)."""
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def _mac(sid: str, index: int) -> str:
    """Deterministic MAC for a node slot, so a recreated node is not hidden by a stale ARP entry."""
    return f"02:f1:{sid[:2]}:{sid[2:]}:{index >> 8:02x}:{index & 0xFF:02x}"


# --------------------------------------------------------------------------- the sandbox


class Sandbox:
    """A fleet of sshd nodes in namespaces, described by (and stoppable from) its state dir."""

    def __init__(
        self,
        state_dir: Path,
        subnet: str | None = None,
        max_startups: str | None = None,
    ) -> None:
        """`subnet`/`max_startups` default to what the state dir recorded, else the defaults."""
        self.state_dir = Path(state_dir).resolve()
        self.sid = sandbox_id(self.state_dir)
        self.bridge = f"flbr-{self.sid}"
        self._alias = f"fleet-sandbox {self.state_dir}"[:250]  # ifalias holds 255 bytes
        self._subnet_arg = subnet
        if subnet is not None:
            parse_subnet(subnet)
        if max_startups is not None and not _MAX_STARTUPS_RE.match(max_startups):
            raise SandboxError(
                f"bad MaxStartups {max_startups!r}", hint="write start:rate:full, e.g. 100:30:200"
            )
        self._max_startups_arg = max_startups

    # ----------------------------------------------------------------- paths

    @property
    def subnet(self) -> str:
        """The subnet this sandbox runs (or will run) on."""
        state = self._load()
        if state is not None and (state.status != "stopped" or self._subnet_arg is None):
            return state.subnet
        return self._subnet_arg or DEFAULT_SUBNET

    @property
    def state_path(self) -> Path:
        """The JSON state file another process uses to find and stop this sandbox."""
        return self.state_dir / "sandbox.json"

    @property
    def inventory_path(self) -> Path:
        """Ansible-style inventory listing every node."""
        return self.state_dir / "inventory.yaml"

    @property
    def ssh_config_path(self) -> Path:
        """OpenSSH client config for `ssh -F` with strict host key checking."""
        return self.state_dir / "ssh_config"

    @property
    def known_hosts_path(self) -> Path:
        """Every node's host key, so clients can keep StrictHostKeyChecking on."""
        return self.state_dir / "known_hosts"

    @property
    def key_path(self) -> Path:
        """The client private key (ed25519, no passphrase) every node accepts for root."""
        return self.state_dir / "id_ed25519"

    def _node_dir(self, name: str) -> Path:
        """Host-side directory of one node."""
        return self.state_dir / "nodes" / name

    # ----------------------------------------------------------------- public API

    def up(self, count: int, prefix: str = "node") -> list[SandboxNode]:
        """Make the sandbox exactly `prefix01..prefixNN`, all answering SSH; reuse what runs."""
        preflight()
        with self._locked():
            state = self._load() or self._fresh_state()
            state = self._reconcile_settings(state)
            net = parse_subnet(state.subnet)
            if not 1 <= count <= capacity(net):
                raise SandboxError(
                    f"cannot run {count} nodes in {net}: between 1 and {capacity(net)}",
                    hint="pick a smaller count or a larger --subnet",
                )
            if not _NAME_RE.match(prefix):
                raise SandboxError(
                    f"bad node name prefix {prefix!r}", hint="use lowercase letters, digits, '-'"
                )
            try:
                self._bring_up(state, net, node_names(count, prefix))
            except SandboxError as exc:
                exc.hint = exc.hint or "`fleet sandbox down` removes whatever was started"
                raise
            return [r.node for r in state.nodes]

    def _bring_up(self, state: _State, net: ipaddress.IPv4Network, wanted: list[str]) -> None:
        """The steps of `up`, saving state after each so a crash leaves `down` able to clean."""
        self._ensure_client_key()
        state.status = "starting"
        self._save(state)
        self._ensure_bridge(net)
        keep = [r for r in state.nodes if r.node.name in wanted and self._healthy(r)]
        self._teardown([r for r in state.nodes if r not in keep])
        state.nodes = keep
        self._save(state)
        fresh = self._create_nodes(state, net, [n for n in wanted if n not in _names(keep)])
        state.nodes = sorted(keep + fresh, key=lambda r: r.index)
        self._save(state)
        self._attach(state.nodes)
        self._start_sshds(state)
        self._write_client_files(state)
        state.status = "running"
        self._save(state)

    def down(self) -> None:
        """Kill every node, remove netns, veths and bridge; keep the files, mark state stopped."""
        preflight()
        with self._locked():
            state = self._load()
            self._teardown(state.nodes if state else [], sweep=True)
            self._delete_bridge()
            if state is not None:
                state.status = "stopped"
                state.nodes = []
                self._save(state)

    def nodes(self) -> list[SandboxNode]:
        """The nodes of the running sandbox (none once it is stopped)."""
        state = self._load()
        if state is None or state.status == "stopped":
            return []
        return [r.node for r in state.nodes]

    def status(self) -> list[tuple[SandboxNode, bool, bool]]:
        """(node, pid 1 alive, sshd accepting TCP on port 22) for every node."""

        def check(node: SandboxNode) -> tuple[SandboxNode, bool, bool]:
            """Probe one node (only a live one, so a dead node costs no timeout)."""
            alive = self._is_ours(node.pid1, node.name, "tini")
            return node, alive, alive and self._listening(node)

        return _parallel(check, self.nodes())

    def run_on(
        self, node: SandboxNode | str, script: str, timeout_s: float = 30
    ) -> subprocess.CompletedProcess[str]:
        """Run shell `script` as root inside the node's namespaces (no SSH), cwd /root.

        The script runs from a file (`/bin/sh /run/fleet/.run-on/<id>.sh`), so its text is not
        on any command line: `pgrep -f pattern` in it cannot match its own shell. stdin is
        /dev/null; stdout/stderr go through temporary files, not pipes, and only the shell is
        waited for, so a script that leaves a background child never hangs this call. To plant
        a process that outlives the call, detach it fully:
        `setsid my-command </dev/null >/dev/null 2>&1 &`. On timeout the call's own process
        group (not detached children) is killed and subprocess.TimeoutExpired is raised.
        """
        target = self._live_node(node)
        scripts = target.node_dir / ".run-on"
        scripts.mkdir(exist_ok=True)
        fd, host_path = tempfile.mkstemp(dir=scripts, suffix=".sh")
        with os.fdopen(fd, "w") as fh:
            fh.write(script)
        inner_path = f"{INNER_DIR}/.run-on/{os.path.basename(host_path)}"
        login = 'cd "$HOME" && exec /bin/sh "$1"'
        cmd = [*self._nsenter(target), "/bin/sh", "-c", login, "fleet-run-on", inner_path]
        args = ["run_on", target.name, script]
        try:
            code, stdout, stderr = _wait_captured(cmd, timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise subprocess.TimeoutExpired(args, timeout_s, exc.output, exc.stderr) from None
        finally:
            os.unlink(host_path)
        return subprocess.CompletedProcess(args, code, stdout, stderr)

    def stop_sshd(self, node: SandboxNode | str) -> None:
        """Stop the node's sshd listener (node stays up): port 22 then refuses connections."""
        target = self._live_node(node)
        self.run_on(target, _STOP_SSHD, timeout_s=15)
        _poll(
            lambda: not self._listening(target),
            15,
            f"sshd on {target.name} to stop listening",
        )

    def start_sshd(self, node: SandboxNode | str) -> None:
        """Start the node's sshd if it is not listening, and wait until it accepts TCP."""
        target = self._live_node(node)
        if not self._listening(target):
            self._spawn_sshd(target)
        self._wait_listening([target])

    def bind_into(self, node: SandboxNode | str, host_path: Path | str, inner_path: str) -> None:
        """Bind-mount a host file or directory at `inner_path` inside one node only.

        The mount lands in the node's own mount namespace (its propagation is private), so the
        host and the other nodes never see it: how a test gives one node a service's socket
        (e.g. a private dockerd's at /run/docker.sock) or hides a file. `host_path` must be
        visible in the node, so not under the paths every node mounts privately (/tmp,
        /dev/shm, /root, /run, /usr/local/bin). A missing mount point is created (an empty
        file or a directory, like the source); a mount already there is replaced, not stacked.
        """
        source = Path(host_path).resolve()
        if any(source == Path(p) or Path(p) in source.parents for p in _NODE_PRIVATE):
            raise SandboxError(
                f"cannot bind {source} into a node: "
                f"nodes mount their own {', '.join(_NODE_PRIVATE)}",
                hint="keep the source elsewhere, e.g. under /var/lib",
            )
        if not source.exists():
            raise SandboxError(f"cannot bind {source} into a node: it does not exist")
        kind = "d" if source.is_dir() else "f"
        script = _BIND.format(src=shlex.quote(str(source)), dst=shlex.quote(inner_path), kind=kind)
        self._run_checked(node, script, f"bind {source} at {inner_path}")

    def unbind(self, node: SandboxNode | str, inner_path: str, remove: bool = False) -> None:
        """Undo `bind_into` on the node (every mount at `inner_path`); with `remove`, also delete
        the mount point left behind (for one `bind_into` created, e.g. on the node's /run)."""
        script = _UNBIND.format(dst=shlex.quote(inner_path), remove=int(remove))
        self._run_checked(node, script, f"unbind {inner_path}")

    def _run_checked(self, node: SandboxNode | str, script: str, what: str) -> None:
        """run_on that raises SandboxError naming `what` and the node when the script fails."""
        result = self.run_on(node, script, timeout_s=15)
        if result.returncode != 0:
            name = node if isinstance(node, str) else node.name
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise SandboxError(
                f"{what} on {name} failed (exit {result.returncode}): "
                f"{detail[-1] if detail else 'no output'}"
            )

    # ----------------------------------------------------------------- state

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise up/down on one state dir across processes."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.state_dir / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _fresh_state(self) -> _State:
        """State for a sandbox that has never run here."""
        return _State(
            status="stopped",
            sid=self.sid,
            subnet=self._subnet_arg or DEFAULT_SUBNET,
            max_startups=self._max_startups_arg or DEFAULT_MAX_STARTUPS,
            nodes=[],
        )

    def _reconcile_settings(self, state: _State) -> _State:
        """Apply constructor settings; a running sandbox cannot move to another subnet."""
        if self._subnet_arg is not None and self._subnet_arg != state.subnet:
            if state.status != "stopped" and state.nodes:
                raise SandboxError(
                    f"sandbox {self.state_dir} runs on {state.subnet}, not {self._subnet_arg}",
                    hint="run `fleet sandbox down` first, or use another state dir",
                )
            state.subnet = self._subnet_arg
        if self._max_startups_arg is not None:
            state.max_startups = self._max_startups_arg
        return state

    def _load(self) -> _State | None:
        """Read sandbox.json, or None if there is none."""
        try:
            raw: dict[str, Any] = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise SandboxError(
                f"{self.state_path}: unreadable sandbox state: {exc}",
                hint="remove the state dir after checking `ip netns list` for leftovers",
            ) from exc
        nodes = [
            _Record(
                node=SandboxNode(
                    name=n["name"],
                    address=n["address"],
                    netns=n["netns"],
                    pid1=int(n["pid1"]),
                    node_dir=Path(n["node_dir"]),
                ),
                index=int(n["index"]),
                veth=n["veth"],
                launcher_pid=int(n["launcher_pid"]),
            )
            for n in raw.get("nodes", [])
        ]
        return _State(
            status=raw["status"],
            sid=raw["sid"],
            subnet=raw["subnet"],
            max_startups=raw["max_startups"],
            nodes=nodes,
        )

    def _save(self, state: _State) -> None:
        """Write sandbox.json atomically: it must be usable by `down` after any crash."""
        net = parse_subnet(state.subnet)
        doc = {
            "version": STATE_VERSION,
            "generated_by": "fleet sandbox up",
            "status": state.status,
            "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "state_dir": str(self.state_dir),
            "sid": state.sid,
            "subnet": state.subnet,
            "bridge": {"name": self.bridge, "address": f"{gateway_address(net)}/{net.prefixlen}"},
            "max_startups": state.max_startups,
            "nodes": [
                {
                    "name": r.node.name,
                    "index": r.index,
                    "address": r.node.address,
                    "netns": r.node.netns,
                    "veth": r.veth,
                    "pid1": r.node.pid1,
                    "launcher_pid": r.launcher_pid,
                    "node_dir": str(r.node.node_dir),
                }
                for r in state.nodes
            ],
        }
        _write(self.state_path, json.dumps(doc, indent=2) + "\n")

    def _live_node(self, node: SandboxNode | str) -> SandboxNode:
        """Resolve a node (or name) against the state file; it must be running."""
        name = node if isinstance(node, str) else node.name
        for current in self.nodes():
            if current.name == name:
                if not self._is_ours(current.pid1, name, "tini"):
                    raise SandboxError(
                        f"sandbox node {name} is not running", hint="run `fleet sandbox up`"
                    )
                return current
        raise SandboxError(f"no sandbox node {name} in {self.state_dir}")

    # ----------------------------------------------------------------- processes

    def _is_ours(self, pid: int, name: str, argv0: str) -> bool:
        """True if pid is alive, runs `argv0` and was started by this sandbox for node `name`."""
        return _alive(pid) and _argv0(pid) == argv0 and _marker(pid) == (str(self.state_dir), name)

    def _healthy(self, rec: _Record) -> bool:
        """A node worth keeping: init alive, netns and veth still there."""
        return (
            self._is_ours(rec.node.pid1, rec.node.name, "tini")
            and Path("/run/netns", rec.node.netns).exists()
            and Path("/sys/class/net", rec.veth).exists()
        )

    def _listening(self, node: SandboxNode, timeout_s: float = 0.5) -> bool:
        """True if the node's sshd accepts TCP on port 22 (probed via our bridge only)."""
        return _tcp_open(node.address, self.bridge, timeout_s=timeout_s)

    def _nsenter(self, node: SandboxNode) -> list[str]:
        """Command prefix that enters all of a node's namespaces."""
        ns = ["--net", "--pid", "--mount", "--uts", "--ipc"]
        return ["nsenter", "--target", str(node.pid1), *ns, "--"]

    def _marked(self, names: set[str] | None) -> list[int]:
        """Live processes started by this sandbox (for the named nodes, or all if None)."""
        found = []
        for pid in _all_pids():
            mark = _marker(pid)
            if mark and mark[0] == str(self.state_dir) and (names is None or mark[1] in names):
                found.append(pid)
        return [pid for pid in found if _alive(pid)]

    def _kill_nodes(self, records: Sequence[_Record], sweep: bool) -> None:
        """SIGKILL each node's pid 1 (verified ours): that ends its whole PID namespace."""
        # The launcher (unshare) then reaps pid 1 and exits; marked stragglers are killed last.
        names = None if sweep else {r.node.name for r in records}
        inits = [r.node.pid1 for r in records if self._is_ours(r.node.pid1, r.node.name, "tini")]
        inits += [pid for pid in self._marked(names) if _argv0(pid) == "tini"]
        launchers = [
            r.launcher_pid for r in records if self._is_ours(r.launcher_pid, r.node.name, "unshare")
        ]
        _kill(inits)
        with contextlib.suppress(SandboxError):  # launchers normally exit at once
            _poll(lambda: not any(_alive(p) for p in inits + launchers), 5, "node init")
        leftovers = self._marked(names)
        _kill(leftovers)
        _poll(lambda: not any(_alive(p) for p in leftovers), 20, "sandbox processes to exit")

    def _teardown(self, records: Sequence[_Record], sweep: bool = False) -> None:
        """Kill nodes, then delete their veths and netns (sweep: all with our names)."""
        self._kill_nodes(records, sweep)
        netns = [r.node.netns for r in records]
        veths = [r.veth for r in records]
        if sweep and self._bridge_not_foreign():  # names hash the state dir: sweep leftovers
            netns += [n for n in _listdir("/run/netns") if n.startswith(f"fl-{self.sid}-")]
            veths += [v for v in _listdir("/sys/class/net") if v.startswith(f"fl{self.sid}-")]
        lines = [f"link del {v}" for v in dict.fromkeys(veths) if _exists_iface(v)]
        lines += [f"netns del {n}" for n in dict.fromkeys(netns) if Path("/run/netns", n).exists()]
        if lines:
            _run(["ip", "-force", "-batch", "-"], stdin="\n".join(lines) + "\n", check=False)
        left = [v for v in veths if _exists_iface(v)] + [
            n for n in netns if Path("/run/netns", n).exists()
        ]
        if left:
            raise SandboxError(
                f"could not remove {', '.join(left[:5])}",
                hint="check `ip netns pids <ns>`; then `ip netns del` / `ip link del` by hand",
            )

    # ----------------------------------------------------------------- network

    def _ensure_bridge(self, net: ipaddress.IPv4Network) -> None:
        """Create the bridge with the gateway address, after checking the subnet is free."""
        self._check_subnet_free(net)
        alias = self._alias
        if _exists_iface(self.bridge):
            current = _iface_alias(self.bridge)
            if current not in ("", alias):
                raise SandboxError(
                    f"bridge {self.bridge} belongs to another sandbox ({current})",
                    hint="use another state dir (the interface names hash it)",
                )
        else:
            mac = f"02:f0:{self.sid[:2]}:{self.sid[2:]}:00:01"
            _run(["ip", "link", "add", "name", self.bridge, "address", mac, "type", "bridge"])
        gateway = f"{gateway_address(net)}/{net.prefixlen}"
        batch = [
            f'link set {self.bridge} alias "{alias}"',
            f"addr replace {gateway} dev {self.bridge}",
            f"link set {self.bridge} up",
        ]
        _run(["ip", "-batch", "-"], stdin="\n".join(batch) + "\n")
        # Defence in depth: even if a node adds a default route via the gateway and the host
        # forwards IPv4, packets arriving on our bridge are not forwarded; no IPv6 at all.
        Path(f"/proc/sys/net/ipv4/conf/{self.bridge}/forwarding").write_text("0\n")
        with contextlib.suppress(OSError):  # a kernel without IPv6 has no such file
            Path(f"/proc/sys/net/ipv6/conf/{self.bridge}/disable_ipv6").write_text("1\n")

    def _check_subnet_free(self, net: ipaddress.IPv4Network) -> None:
        """Refuse a subnet that any other interface or route already uses."""
        addrs = json.loads(_run(["ip", "-j", "-4", "addr", "show"]).stdout or "[]")
        for link in addrs:
            for info in link.get("addr_info", []):
                there = ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}").network
                if link["ifname"] != self.bridge and there.overlaps(net):
                    self._subnet_taken(net, link["ifname"], str(there))
        routes = json.loads(_run(["ip", "-j", "-4", "route", "show", "table", "all"]).stdout)
        for route in routes or []:
            dst = route.get("dst", "default")
            if dst == "default" or route.get("dev") == self.bridge:
                continue
            there = ipaddress.IPv4Network(dst, strict=False)
            if there.subnet_of(net):
                self._subnet_taken(net, route.get("dev", "?"), f"route {dst}")

    def _subnet_taken(self, net: ipaddress.IPv4Network, ifname: str, what: str) -> None:
        """Raise the 'subnet in use' error, naming the owner when it is another sandbox."""
        owner = _iface_alias(ifname)
        raise SandboxError(
            f"subnet {net} is already in use: {what} on {ifname}"
            + (f" ({owner})" if owner else ""),
            hint="pick another subnet (--subnet 10.252.0.0/16) or stop the other sandbox",
        )

    def _bridge_not_foreign(self) -> bool:
        """False if a bridge with our name belongs to another state dir (a sid collision)."""
        return not _exists_iface(self.bridge) or _iface_alias(self.bridge) in ("", self._alias)

    def _delete_bridge(self) -> None:
        """Remove our bridge, but never one whose alias names another sandbox."""
        if not _exists_iface(self.bridge) or not self._bridge_not_foreign():
            return
        _run(["ip", "link", "del", self.bridge], check=False)
        if _exists_iface(self.bridge):
            raise SandboxError(f"could not delete bridge {self.bridge}")

    def _attach(self, records: Sequence[_Record]) -> None:
        """(Re)attach every node's veth to the bridge: idempotent, heals a recreated bridge."""
        lines = [f"link set {r.veth} master {self.bridge} up" for r in records]
        if lines:
            _run(["ip", "-batch", "-"], stdin="\n".join(lines) + "\n")

    # ----------------------------------------------------------------- node creation

    def _create_nodes(
        self, state: _State, net: ipaddress.IPv4Network, names: Sequence[str]
    ) -> list[_Record]:
        """Create nodes: files and keys, netns+veth in one batch, then launch all at once."""
        if not names:
            return []
        used = {r.index for r in state.nodes}
        free = (i for i in range(capacity(net)) if i not in used)
        records = [self._new_record(name, next(free), net) for name in names]
        self._teardown(records)  # leftovers of a crashed run with the same names
        _parallel(self._prepare_node_dir, records)
        state.nodes = state.nodes + records
        self._save(state)  # recorded before anything exists, so `down` can always clean up
        batch: list[str] = []
        for r in records:
            mac = _mac(state.sid, r.index)
            batch += [
                f"netns add {r.node.netns}",
                f"link add {r.veth} type veth peer name eth0 address {mac} netns {r.node.netns}",
                f"neigh flush to {r.node.address} dev {self.bridge}",
            ]
        _run(["ip", "-batch", "-"], stdin="\n".join(batch) + "\n")
        prefix = f"/{net.prefixlen}"
        pids = _parallel(lambda r: self._launch(r, prefix), records, workers=8)
        launched = [replace(r, launcher_pid=pid) for r, pid in zip(records, pids, strict=True)]
        state.nodes = [r for r in state.nodes if r not in records] + launched
        self._save(state)
        self._attach(launched)
        return self._await_init(launched)

    def _new_record(self, name: str, index: int, net: ipaddress.IPv4Network) -> _Record:
        """The record of a node about to be created (no pids yet)."""
        node = SandboxNode(
            name=name,
            address=str(node_address(net, index)),
            netns=f"fl-{self.sid}-{name}",
            pid1=0,
            node_dir=self._node_dir(name),
        )
        return _Record(node=node, index=index, veth=f"fl{self.sid}-{index}", launcher_pid=0)

    def _prepare_node_dir(self, rec: _Record) -> None:
        """Node dir with bin/, host key (kept across restarts) and authorized_keys."""
        d = rec.node.node_dir
        (d / "bin").mkdir(parents=True, exist_ok=True)
        host_key = d / "ssh_host_ed25519_key"
        if not host_key.exists() or not host_key.with_suffix(".pub").exists():
            host_key.unlink(missing_ok=True)
            _keygen(host_key, comment=rec.node.name)
        pub = self.key_path.with_suffix(".pub").read_text()
        _write(d / "authorized_keys", pub, 0o600)
        for stale in ("sshd.pid", "console.log"):
            (d / stale).unlink(missing_ok=True)

    def _launch(self, rec: _Record, prefix: str) -> int:
        """Start the node's init, detached from us; return the launcher's (unshare's) pid."""
        unshare = ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--uts", "--ipc"]
        unshare += ["--propagation", "private", "--mount-proc"]
        node = rec.node
        inner = ["sh", "-c", _NODE_INIT, "fleet-node-init", node.name, str(node.node_dir)]
        cmd = ["ip", "netns", "exec", node.netns, *unshare, *inner, node.address + prefix]
        env = _node_env(
            FLEET_CONSOLE=str(node.node_dir / "console.log"),
            **{_ENV_SANDBOX: str(self.state_dir), _ENV_NODE: node.name},
        )
        proc = subprocess.run(
            ["sh", "-c", _DETACH, "fleet-launch", *cmd],
            capture_output=True,
            text=True,
            env=env,
            cwd="/",
            start_new_session=True,
            timeout=30,
            check=False,
        )
        if proc.returncode != 0 or not proc.stdout.strip().isdigit():
            raise SandboxError(f"could not launch node {node.name}: {proc.stderr.strip()}")
        return int(proc.stdout.strip())

    def _await_init(self, records: Sequence[_Record]) -> list[_Record]:
        """Wait until every launcher's child has finished setup and become tini; fill pid1."""
        pending = {r.node.name: r for r in records}
        done: dict[str, _Record] = {}

        def ready() -> bool:
            """One /proc scan: record inits that became tini, fail fast on a dead launcher."""
            kids = _children()
            for name, rec in list(pending.items()):
                init = [k for k in kids.get(rec.launcher_pid, []) if _argv0(k) == "tini"]
                if init:
                    done[name] = replace(rec, node=replace(rec.node, pid1=init[0]))
                    del pending[name]
                elif not _alive(rec.launcher_pid):
                    log = rec.node.node_dir / "console.log"
                    raise SandboxError(
                        f"sandbox node {name} failed to start: {_tail(log)}",
                        hint=f"see {log}",
                    )
            return not pending

        _poll(ready, 20 + 0.25 * len(records), "sandbox nodes to boot")
        return [done[r.node.name] for r in records]

    # ----------------------------------------------------------------- sshd

    def _sshd_config(self, rec: _Record, max_startups: str) -> str:
        """sshd_config for one node; paths are as seen inside the node (/run/fleet)."""
        return f"""\
# Generated by `fleet sandbox up` for {rec.node.name}. Paths are inside the node, where
# {INNER_DIR} is this directory ({rec.node.node_dir}).
ListenAddress {rec.node.address}:22
HostKey {INNER_DIR}/ssh_host_ed25519_key
AuthorizedKeysFile {INNER_DIR}/authorized_keys
PidFile {INNER_DIR}/sshd.pid
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
MaxStartups {max_startups}
LogLevel VERBOSE
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
Subsystem sftp internal-sftp
# AcceptEnv is left unset: sshd then accepts no environment variables from clients.
"""

    def _start_sshds(self, state: _State) -> None:
        """Write configs; (re)start every sshd that is down or whose config changed; wait."""

        def ensure(rec: _Record) -> None:
            """Restart only when needed, so `up` on a running sandbox disturbs nothing."""
            config = rec.node.node_dir / "sshd_config"
            changed = _write(config, self._sshd_config(rec, state.max_startups))
            listening = self._listening(rec.node, timeout_s=1)
            if listening and changed:
                self.stop_sshd(rec.node)
            if changed or not listening:
                self._spawn_sshd(rec.node)

        _parallel(ensure, state.nodes)
        self._wait_listening([r.node for r in state.nodes])

    def _spawn_sshd(self, node: SandboxNode) -> None:
        """Run sshd (it daemonizes; tini adopts it) inside the node's namespaces."""
        cmd = [*self._nsenter(node), SSHD, "-f", f"{INNER_DIR}/sshd_config"]
        cmd += ["-E", f"{INNER_DIR}/sshd.log"]
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=_node_env(),
            cwd="/",
            stdin=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )
        if proc.returncode != 0:
            log = node.node_dir / "sshd.log"
            raise SandboxError(
                f"sshd on {node.name} failed (exit {proc.returncode}): "
                f"{proc.stderr.strip() or _tail(log, 2)}",
                hint=f"see {log}",
            )

    def _wait_listening(self, nodes: Sequence[SandboxNode]) -> None:
        """Poll until every node's sshd accepts TCP on port 22."""
        pending = list(nodes)

        def ready() -> bool:
            """Drop nodes that accept now; done when none is left."""
            pending[:] = [n for n in pending if not self._listening(n)]
            return not pending

        _poll(
            ready,
            20 + 0.1 * len(nodes),
            lambda: "sshd to listen on " + ", ".join(n.name for n in pending[:5]),
            hint="see sshd.log in the node's directory",
        )

    # ----------------------------------------------------------------- client files

    def _ensure_client_key(self) -> None:
        """The sandbox-wide client keypair, created once."""
        if not self.key_path.exists():
            _keygen(self.key_path, comment=f"fleet-sandbox-{self.sid}")
        os.chmod(self.key_path, 0o600)
        pub = self.key_path.with_suffix(".pub")
        if not pub.exists():
            _write(pub, _run(["ssh-keygen", "-y", "-f", str(self.key_path)]).stdout)

    def _write_client_files(self, state: _State) -> None:
        """known_hosts, ssh_config and inventory.yaml for the current nodes."""
        nodes = [r.node for r in state.nodes]
        _write(self.known_hosts_path, self._known_hosts(nodes))
        _write(self.ssh_config_path, self._ssh_config(state, nodes))
        _write(self.inventory_path, self._inventory(state, nodes))

    def _known_hosts(self, nodes: Sequence[SandboxNode]) -> str:
        """`<ip> ssh-ed25519 AAAA...` per node, from the generated host keys."""
        lines = []
        for node in nodes:
            keytype, key = (node.node_dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
            lines.append(f"{node.address} {keytype} {key}\n")
        return "".join(lines)

    def _ssh_config(self, state: _State, nodes: Sequence[SandboxNode]) -> str:
        """Client config: a Host alias per node name, then shared options for names and IPs."""
        out = [
            f"# Generated by `fleet sandbox up` for {self.state_dir} (subnet {state.subnet}).\n"
            "# Rewritten on every `up`. Use: ssh -F <this file> node01 (or the node's address)\n\n"
        ]
        out += [f"Host {n.name}\n    HostName {n.address}\n\n" for n in nodes]
        patterns = " ".join([n.name for n in nodes] + [n.address for n in nodes])
        out.append(
            f"Host {patterns}\n"
            "    User root\n"
            "    Port 22\n"
            f"    IdentityFile {self.key_path}\n"
            "    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {self.known_hosts_path}\n"
            "    GlobalKnownHostsFile /dev/null\n"
            "    StrictHostKeyChecking yes\n"
            "    UpdateHostKeys no\n"
            "    PasswordAuthentication no\n"
            "    KbdInteractiveAuthentication no\n"
            "    BatchMode yes\n"
            "    ConnectTimeout 10\n"
        )
        return "".join(out)

    def _inventory(self, state: _State, nodes: Sequence[SandboxNode]) -> str:
        """Ansible-style YAML inventory: every node in group `gpu`, with `gpus: 8`."""
        hosts = "".join(
            f"        {n.name}:\n          ansible_host: {n.address}\n          gpus: 8\n"
            for n in nodes
        )
        return (
            "# Generated by `fleet sandbox up`; rewritten on every run, do not edit.\n"
            f"# Sandbox {self.state_dir} (subnet {state.subnet}); "
            f"ssh -F {self.ssh_config_path} <node>\n"
            "all:\n"
            "  vars:\n"
            "    ansible_user: root\n"
            "    ansible_port: 22\n"
            f"    ansible_ssh_private_key_file: {json.dumps(str(self.key_path))}\n"
            "  children:\n"
            "    gpu:\n"
            "      hosts:\n"
            f"{hosts}"
        )


def _names(records: Iterable[_Record]) -> set[str]:
    """Node names of some records."""
    return {r.node.name for r in records}


def _listdir(path: str) -> list[str]:
    """Directory entries, or none if it does not exist."""
    try:
        return os.listdir(path)
    except OSError:
        return []


def _exists_iface(name: str) -> bool:
    """True if a network interface of that name exists in the root namespace."""
    return Path("/sys/class/net", name).exists()


def _iface_alias(name: str) -> str:
    """An interface's alias (`ip link set X alias ...`), '' if none."""
    try:
        return Path("/sys/class/net", name, "ifalias").read_text().strip()
    except OSError:
        return ""
