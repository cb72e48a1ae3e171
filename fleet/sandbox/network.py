"""The sandbox's network: a private subnet that exists only on one bridge in the root namespace.

Each node's network namespace `fl-<sid>-<name>` holds `eth0`, one end of a veth pair whose other
end (`fl<sid>-<slot>`) is a port of the bridge `flbr-<sid>`; the bridge holds the gateway address.
Nothing adds a default route or NAT, and the host does not forward what arrives on the bridge, so
traffic never leaves the machine. `sid` is 4 hex digits of a hash of the state dir (Linux
interface names max out at 15 characters), so sandboxes with different state dirs and subnets run
side by side; the bridge's alias names its state dir, so a sid collision is detected, never
mistaken for our own bridge.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import shlex
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from fleet.sandbox.errors import SandboxError
from fleet.sandbox.host import run
from fleet.sandbox.state import NodeRecord

MAX_NODES = 1024
SANDBOX_ALIAS = "fleet-sandbox "  # a sandbox bridge's alias: this, then its state dir
PER_OCTET = 240  # node addresses use .10-.249 of each /24 block: never .0, .255 or the gateway
_LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")


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


def node_mac(sid: str, index: int) -> str:
    """Deterministic MAC for a node slot, so a recreated node is not hidden by a stale ARP entry."""
    return f"02:f1:{sid[:2]}:{sid[2:]}:{index >> 8:02x}:{index & 0xFF:02x}"


def tcp_open(address: str, device: str, port: int = 22, timeout_s: float = 0.5) -> bool:
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


def exists_iface(name: str) -> bool:
    """True if a network interface of that name exists in the root namespace."""
    return Path("/sys/class/net", name).exists()


def exists_netns(name: str) -> bool:
    """True if a named network namespace (`ip netns`) of that name exists."""
    return Path("/run/netns", name).exists()


def iface_alias(name: str) -> str:
    """An interface's alias (`ip link set X alias ...`), '' if none."""
    try:
        return Path("/sys/class/net", name, "ifalias").read_text().strip()
    except OSError:
        return ""


def _listdir(path: str) -> list[str]:
    """Directory entries, or none if it does not exist."""
    try:
        return os.listdir(path)
    except OSError:
        return []


class Network:
    """One sandbox's bridge and its nodes' links."""

    def __init__(self, sid: str, state_dir: Path) -> None:
        self.sid = sid
        self.bridge = f"flbr-{sid}"
        self.alias = f"{SANDBOX_ALIAS}{state_dir}"[:250]  # ifalias holds 255 bytes

    def gateway(self, net: ipaddress.IPv4Network) -> dict[str, str]:
        """The bridge as sandbox.json records it."""
        return {"name": self.bridge, "address": f"{gateway_address(net)}/{net.prefixlen}"}

    def listening(self, address: str, timeout_s: float = 0.5) -> bool:
        """True if a node's sshd accepts TCP on port 22 (probed via our bridge only)."""
        return tcp_open(address, self.bridge, timeout_s=timeout_s)

    # ----------------------------------------------------------------- the bridge

    def check_free(self, net: ipaddress.IPv4Network) -> None:
        """Refuse a subnet something else uses, or a bridge of our name that is another's."""
        self._check_subnet_free(net)
        current = iface_alias(self.bridge) if exists_iface(self.bridge) else ""
        if current not in ("", self.alias):
            raise SandboxError(
                f"bridge {self.bridge} belongs to another sandbox ({current})",
                hint="use another state dir (the interface names hash it)",
            )

    def ensure_bridge(self, net: ipaddress.IPv4Network) -> None:
        """Create the bridge with the gateway address, after checking the subnet is free."""
        self.check_free(net)
        if not exists_iface(self.bridge):
            mac = f"02:f0:{self.sid[:2]}:{self.sid[2:]}:00:01"
            run(["ip", "link", "add", "name", self.bridge, "address", mac, "type", "bridge"])
        gateway = f"{gateway_address(net)}/{net.prefixlen}"
        batch = [
            f'link set {self.bridge} alias "{self.alias}"',
            f"addr replace {gateway} dev {self.bridge}",
            f"link set {self.bridge} up",
        ]
        run(["ip", "-batch", "-"], stdin="\n".join(batch) + "\n")
        # Defence in depth: even if a node adds a default route via the gateway and the host
        # forwards IPv4, packets arriving on our bridge are not forwarded; no IPv6 at all.
        Path(f"/proc/sys/net/ipv4/conf/{self.bridge}/forwarding").write_text("0\n")
        with contextlib.suppress(OSError):  # a kernel without IPv6 has no such file
            Path(f"/proc/sys/net/ipv6/conf/{self.bridge}/disable_ipv6").write_text("1\n")

    def _check_subnet_free(self, net: ipaddress.IPv4Network) -> None:
        """Refuse a subnet that any other interface or route already uses."""
        addrs = json.loads(run(["ip", "-j", "-4", "addr", "show"]).stdout or "[]")
        for link in addrs:
            for info in link.get("addr_info", []):
                there = ipaddress.IPv4Interface(f"{info['local']}/{info['prefixlen']}").network
                if link["ifname"] != self.bridge and there.overlaps(net):
                    self._subnet_taken(net, link["ifname"], str(there))
        routes = json.loads(run(["ip", "-j", "-4", "route", "show", "table", "all"]).stdout)
        for route in routes or []:
            dst = route.get("dst", "default")
            if dst == "default" or route.get("dev") == self.bridge:
                continue
            there = ipaddress.IPv4Network(dst, strict=False)
            if there.subnet_of(net):
                self._subnet_taken(net, route.get("dev", "?"), f"route {dst}")

    def _subnet_taken(self, net: ipaddress.IPv4Network, ifname: str, what: str) -> NoReturn:
        """Raise the 'subnet in use' error, naming the owner when it is another sandbox."""
        owner = iface_alias(ifname)
        # The alias holds 250 bytes: a longer state dir would be named wrong, so only one that is
        # there is named.
        other = owner.removeprefix(SANDBOX_ALIAS) if owner.startswith(SANDBOX_ALIAS) else ""
        stop = (
            f"stop that sandbox (fleet sandbox down --dir {shlex.quote(other)})"
            if other and Path(other).is_dir()
            else "stop what uses it"
        )
        raise SandboxError(
            f"subnet {net} is already in use: {what} on {ifname}"
            + (f" ({owner})" if owner else ""),
            hint=f"pick another subnet (--subnet 10.252.0.0/16) or {stop}",
        )

    def bridge_not_foreign(self) -> bool:
        """False if a bridge with our name belongs to another state dir (a sid collision)."""
        return not exists_iface(self.bridge) or iface_alias(self.bridge) in ("", self.alias)

    def delete_bridge(self) -> None:
        """Remove our bridge, but never one whose alias names another sandbox."""
        if not exists_iface(self.bridge) or not self.bridge_not_foreign():
            return
        run(["ip", "link", "del", self.bridge], check=False)
        if exists_iface(self.bridge):
            raise SandboxError(f"could not delete bridge {self.bridge}")

    # ----------------------------------------------------------------- node links

    def create_links(self, records: Sequence[NodeRecord]) -> None:
        """Each node's netns and veth pair (eth0 inside, with its slot's MAC), in one batch."""
        batch: list[str] = []
        for r in records:
            mac = node_mac(self.sid, r.index)
            batch += [
                f"netns add {r.node.netns}",
                f"link add {r.veth} type veth peer name eth0 address {mac} netns {r.node.netns}",
                f"neigh flush to {r.node.address} dev {self.bridge}",
            ]
        if batch:
            run(["ip", "-batch", "-"], stdin="\n".join(batch) + "\n")

    def attach(self, records: Sequence[NodeRecord]) -> None:
        """(Re)attach every node's veth to the bridge: idempotent, heals a recreated bridge.

        Each node's address is pinned to its slot's MAC on the bridge (a permanent neighbour
        entry): the kernel's ARP table holds 1,024 learned entries by default
        (`net.ipv4.neigh.default.gc_thresh3`) and collects them past 512, so with ~1,000 nodes
        learned entries overflow it and nodes go unreachable at random; permanent ones are
        never collected nor counted against those limits, and cost no ARP round trip."""
        lines = [f"link set {r.veth} master {self.bridge} up" for r in records]
        lines += [
            f"neigh replace {r.node.address} lladdr {node_mac(self.sid, r.index)} "
            f"dev {self.bridge} nud permanent"
            for r in records
        ]
        if lines:
            run(["ip", "-batch", "-"], stdin="\n".join(lines) + "\n")

    def delete_links(self, records: Sequence[NodeRecord], sweep: bool = False) -> None:
        """Delete the nodes' veths and netns (sweep: every one named for this sandbox)."""
        netns = [r.node.netns for r in records]
        veths = [r.veth for r in records]
        if sweep and self.bridge_not_foreign():  # names hash the state dir: sweep leftovers
            netns += [n for n in _listdir("/run/netns") if n.startswith(f"fl-{self.sid}-")]
            veths += [v for v in _listdir("/sys/class/net") if v.startswith(f"fl{self.sid}-")]
        lines = [f"link del {v}" for v in dict.fromkeys(veths) if exists_iface(v)]
        lines += [f"netns del {n}" for n in dict.fromkeys(netns) if exists_netns(n)]
        if exists_iface(self.bridge) and self.bridge_not_foreign():  # attach's pinned entries
            lines += [f"neigh del {r.node.address} dev {self.bridge}" for r in records]
        if lines:
            run(["ip", "-force", "-batch", "-"], stdin="\n".join(lines) + "\n", check=False)
        left = [v for v in veths if exists_iface(v)] + [n for n in netns if exists_netns(n)]
        if left:
            raise SandboxError(
                f"could not remove {', '.join(left[:5])}",
                hint="check `ip netns pids <ns>`; then `ip netns del` / `ip link del` by hand",
            )
