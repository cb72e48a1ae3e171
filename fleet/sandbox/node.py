"""A sandbox node: a little host of its own, started, entered and killed from the host.

* PID (own /proc), mount (propagation private), IPC and UTS (hostname = node name) namespaces,
  entered by `ip netns exec <ns> unshare ...` (network.py makes the netns); pid 1 is `tini -s`,
  so orphans are reaped;
* private tmpfs on /tmp, /dev/shm, /root, /run and /var/lib/fleet (fleet's node state: a node's
  own disk); `state_dir/nodes/<name>/` is bind-mounted at
  /run/fleet (sshd config, host key, authorized_keys, pid file, log) and its `bin/` over
  /usr/local/bin, so tests can put shims such as a fake `nvidia-smi` on the node's PATH;
* its own `/usr/sbin/sshd` (sshd.py), started separately through `nsenter`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from fleet.sandbox.errors import SandboxError
from fleet.sandbox.host import (
    ENV_NODE,
    ENV_SANDBOX,
    alive,
    argv0,
    children,
    is_ours,
    keygen,
    kill,
    marked,
    node_env,
    poll,
    tail,
    wait_captured,
)
from fleet.sandbox.network import exists_iface, exists_netns, node_address
from fleet.sandbox.state import Layout, NodeRecord, SandboxNode, write_atomic

INNER_DIR = "/run/fleet"  # a node's own directory, as seen from inside the node
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
# Paths every node mounts for itself (tmpfs or bind): a host path under them is not the node's.
NODE_PRIVATE = ("/tmp", "/dev/shm", "/root", "/run", "/var/lib/fleet", "/usr/local/bin")

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
mkdir -p /var/lib/fleet
mount -t tmpfs -o mode=0700 tmpfs /var/lib/fleet
mount -c --bind /run/fleet/bin /usr/local/bin
hostname "$name"
ln -s /bin/sleep /run/sandbox-keepalive
echo "fleet sandbox: node $name is up"
exec tini -s -- /run/sandbox-keepalive infinity
"""
# pid 1's child is `sleep` under another name, so a test's `pkill sleep` cannot take a node down.

# Starts the launcher detached (reparented to init, own session) and prints its pid.
_DETACH = '"$@" </dev/null >>"$FLEET_CONSOLE" 2>&1 & echo $!'

# bind_script, run inside the node: drop mounts already at dst, make the mount point, bind.
_BIND = """
set -eu
src={src} dst={dst}
while mountpoint -q "$dst"; do umount "$dst"; done
if [ ! -e "$dst" ]; then
    if [ {kind} = d ]; then mkdir -p "$dst"; else mkdir -p "$(dirname "$dst")"; : >"$dst"; fi
fi
mount --bind "$src" "$dst"
"""

# unbind_script, run inside the node: every mount at dst, then (remove=1) the mount point itself.
_UNBIND = """
set -eu
dst={dst}
while mountpoint -q "$dst"; do umount "$dst"; done
if [ {remove} = 1 ]; then
    if [ -d "$dst" ]; then rmdir "$dst"; else rm -f "$dst"; fi
fi
"""


def node_names(count: int, prefix: str) -> list[str]:
    """Names node01, node02, ...: two digits at least, stable as the fleet grows."""
    return [f"{prefix}{i:02d}" for i in range(1, count + 1)]


def new_record(
    layout: Layout, sid: str, name: str, index: int, net: ipaddress.IPv4Network
) -> NodeRecord:
    """The record of a node about to be created (no pids yet)."""
    node = SandboxNode(
        name=name,
        address=str(node_address(net, index)),
        netns=f"fl-{sid}-{name}",
        pid1=0,
        node_dir=layout.node_dir(name),
    )
    return NodeRecord(node=node, index=index, veth=f"fl{sid}-{index}", launcher_pid=0)


def prepare_node_dir(rec: NodeRecord, client_pub: str) -> None:
    """Node dir with bin/, host key (kept across restarts) and authorized_keys."""
    d = rec.node.node_dir
    (d / "bin").mkdir(parents=True, exist_ok=True)
    host_key = d / "ssh_host_ed25519_key"
    pub = host_key.with_suffix(".pub")
    if not host_key.is_file() or host_key.is_symlink() or not pub.is_file() or pub.is_symlink():
        host_key.unlink(missing_ok=True)
        pub.unlink(missing_ok=True)  # ssh-keygen would write through a symlink left there
        keygen(host_key, comment=rec.node.name)
    write_atomic(d / "authorized_keys", client_pub, 0o600)
    for stale in ("sshd.pid", "console.log"):
        (d / stale).unlink(missing_ok=True)


def launch(rec: NodeRecord, prefix: str, state_dir: Path) -> int:
    """Start the node's init, detached from us; return the launcher's (unshare's) pid."""
    unshare = ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--uts", "--ipc"]
    unshare += ["--propagation", "private", "--mount-proc"]
    node = rec.node
    inner = ["sh", "-c", _NODE_INIT, "fleet-node-init", node.name, str(node.node_dir)]
    cmd = ["ip", "netns", "exec", node.netns, *unshare, *inner, node.address + prefix]
    env = node_env(
        FLEET_CONSOLE=str(node.node_dir / "console.log"),
        **{ENV_SANDBOX: str(state_dir), ENV_NODE: node.name},
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


def await_init(records: Sequence[NodeRecord]) -> list[NodeRecord]:
    """Wait until every launcher's child has finished setup and become tini; fill pid1."""
    pending = {r.node.name: r for r in records}
    done: dict[str, NodeRecord] = {}

    def ready() -> bool:
        """One /proc scan: record inits that became tini, fail fast on a dead launcher."""
        kids = children()
        for name, rec in list(pending.items()):
            init = [k for k in kids.get(rec.launcher_pid, []) if argv0(k) == "tini"]
            if init:
                done[name] = replace(rec, node=replace(rec.node, pid1=init[0]))
                del pending[name]
            elif not alive(rec.launcher_pid):
                log = rec.node.node_dir / "console.log"
                raise SandboxError(
                    f"sandbox node {name} failed to start: {tail(log)}",
                    hint=f"see {log}",
                )
        return not pending

    poll(ready, 20 + 0.25 * len(records), "sandbox nodes to boot")
    return [done[r.node.name] for r in records]


def healthy(rec: NodeRecord, state_dir: Path) -> bool:
    """A node worth keeping: init alive, netns and veth still there."""
    return (
        is_ours(rec.node.pid1, state_dir, rec.node.name, "tini")
        and exists_netns(rec.node.netns)
        and exists_iface(rec.veth)
    )


def kill_nodes(records: Sequence[NodeRecord], state_dir: Path, sweep: bool) -> None:
    """SIGKILL each node's pid 1 (verified ours): that ends its whole PID namespace."""
    # The launcher (unshare) then reaps pid 1 and exits; marked stragglers are killed last.
    names = None if sweep else {r.node.name for r in records}
    inits = [r.node.pid1 for r in records if is_ours(r.node.pid1, state_dir, r.node.name, "tini")]
    inits += [pid for pid in marked(state_dir, names) if argv0(pid) == "tini"]
    launchers = [
        r.launcher_pid
        for r in records
        if is_ours(r.launcher_pid, state_dir, r.node.name, "unshare")
    ]
    kill(inits)
    with contextlib.suppress(SandboxError):  # launchers normally exit at once
        poll(lambda: not any(alive(p) for p in inits + launchers), 5, "node init")
    leftovers = marked(state_dir, names)
    kill(leftovers)
    poll(lambda: not any(alive(p) for p in leftovers), 20, "sandbox processes to exit")


def nsenter(node: SandboxNode) -> list[str]:
    """Command prefix that enters all of a node's namespaces."""
    ns = ["--net", "--pid", "--mount", "--uts", "--ipc"]
    return ["nsenter", "--target", str(node.pid1), *ns, "--"]


def run_script(
    node: SandboxNode, script: str, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """Run shell `script` as root inside the node's namespaces (no SSH), cwd /root.

    The script runs from a file (`/bin/sh /run/fleet/.run-on/<id>.sh`), so its text is not on
    any command line. stdout/stderr go through temporary files, and only the shell is waited
    for (see `Sandbox.run_on`).
    """
    scripts = node.node_dir / ".run-on"
    scripts.mkdir(exist_ok=True)
    fd, host_path = tempfile.mkstemp(dir=scripts, suffix=".sh")
    with os.fdopen(fd, "w") as fh:
        fh.write(script)
    inner_path = f"{INNER_DIR}/.run-on/{os.path.basename(host_path)}"
    login = 'cd "$HOME" && exec /bin/sh "$1"'
    cmd = [*nsenter(node), "/bin/sh", "-c", login, "fleet-run-on", inner_path]
    args = ["run_on", node.name, script]
    try:
        code, stdout, stderr = wait_captured(cmd, timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise subprocess.TimeoutExpired(args, timeout_s, exc.output, exc.stderr) from None
    finally:
        os.unlink(host_path)
    return subprocess.CompletedProcess(args, code, stdout, stderr)


def bind_script(host_path: Path | str, inner_path: str) -> str:
    """The script that bind-mounts a host path at `inner_path` inside a node (see bind_into)."""
    source = Path(host_path).resolve()
    if any(source == Path(p) or Path(p) in source.parents for p in NODE_PRIVATE):
        raise SandboxError(
            f"cannot bind {source} into a node: nodes mount their own {', '.join(NODE_PRIVATE)}",
            hint="keep the source elsewhere, e.g. under /var/lib",
        )
    if not source.exists():
        raise SandboxError(f"cannot bind {source} into a node: it does not exist")
    kind = "d" if source.is_dir() else "f"
    return _BIND.format(src=shlex.quote(str(source)), dst=shlex.quote(inner_path), kind=kind)


def unbind_script(inner_path: str, remove: bool) -> str:
    """The script that undoes bind_script's mounts at `inner_path` (and removes the point)."""
    return _UNBIND.format(dst=shlex.quote(inner_path), remove=int(remove))
