"""The warm connections' wire: JSON lines over a unix socket, between a fleet command (the
client, fleet/ssh/warm.py) and a keeper (fleet/ssh/keeper.py). Plain data only, never pickle:
a message is a JSON object on one line, bounded in size. Light: no paramiko, so a warm command
never loads it.

Also the values that cross it (a host, a command, a result, the SSH settings) as plain dicts,
and the peer check both ends make: the other end of the socket runs as our own uid."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import struct
from collections import deque
from pathlib import Path
from typing import Any

from fleet.core import defaults
from fleet.core.frame import Noise
from fleet.core.hosts import Host
from fleet.core.result import CommandResult
from fleet.core.shell import Cmd
from fleet.ssh.settings import SshSettings

# A `script:` step's stdin rides in its message: shipped scripts are tens of KiB, an operator's
# own a few MiB at most. Past this a message is refused and the connection dropped.
MESSAGE_MAX_BYTES = 64 * 1024 * 1024
RECV_BYTES = 256 * 1024
# Bumped when a message changes meaning: part of a keeper's identity (fleet/ssh/warm.py), so an
# older keeper is never asked in a newer language.
PROTOCOL = 3  # 2: a connect request names a host of the hello by its index; 3: hello's env


class WireError(Exception):
    """The other end broke the protocol (a line too long, not JSON, not an object)."""


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a unix socket (SO_PEERCRED: pid, uid, gid)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def same_user(sock: socket.socket) -> bool:
    """True when the peer runs as this process's uid."""
    try:
        return peer_uid(sock) == os.getuid()
    except OSError:
        return False


def encode(message: dict[str, Any]) -> bytes:
    """One message as its line."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


class LineReader:
    """Messages from a socket, one JSON object a line; EOF is None."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.ready: deque[bytes] = deque()
        # Read into one buffer, reused: recv(RECV_BYTES) would allocate RECV_BYTES for every
        # read, a fresh mmap (and its page faults) each time, past malloc's mmap threshold.
        self.scratch = bytearray(RECV_BYTES)

    def next(self) -> dict[str, Any] | None:
        """The next message, or None at EOF. Blocks like the socket does."""
        while not self.ready:
            size = self.sock.recv_into(self.scratch)
            if not size:
                return None
            self._take(bytes(memoryview(self.scratch)[:size]))
        return self._decode(self.ready.popleft())

    def _take(self, chunk: bytes) -> None:
        self.buffer += chunk
        if b"\n" not in chunk:
            if len(self.buffer) > MESSAGE_MAX_BYTES:
                raise WireError(f"a message longer than {MESSAGE_MAX_BYTES} bytes")
            return
        *lines, rest = bytes(self.buffer).split(b"\n")
        self.buffer = bytearray(rest)
        self.ready.extend(lines)

    @staticmethod
    def _decode(line: bytes) -> dict[str, Any]:
        try:
            value = json.loads(line)
        except ValueError:
            raise WireError("a message that is not JSON") from None
        if not isinstance(value, dict):
            raise WireError("a message that is not a JSON object")
        return value


def host_to_wire(host: Host) -> dict[str, Any]:
    """What connecting to a host needs of it (groups and vars stay with the client)."""
    return {
        "name": host.name,
        "address": host.address,
        "port": host.port,
        "user": host.user,
        "key_file": host.key_file,
        "ssh_options": [list(pair) for pair in host.ssh_options],
    }


def host_from_wire(data: dict[str, Any]) -> Host:
    return Host(
        name=str(data["name"]),
        address=str(data["address"]),
        port=data.get("port"),
        user=data.get("user"),
        key_file=data.get("key_file"),
        ssh_options=tuple((str(k), str(v)) for k, v in data.get("ssh_options", ())),
    )


# Field names read once: the values below cross the wire for every host of every command.
CMD_FIELDS = tuple(f.name for f in dataclasses.fields(Cmd))
RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(CommandResult) if f.name != "done")


def cmd_to_wire(cmd: Cmd) -> dict[str, Any]:
    # Its fields are plain values: no deep copy (dataclasses.asdict) per host per command.
    return {name: getattr(cmd, name) for name in CMD_FIELDS}


def cmd_from_wire(data: dict[str, Any]) -> Cmd:
    return Cmd(**{name: data[name] for name in CMD_FIELDS if name in data})


def result_to_wire(result: CommandResult) -> dict[str, Any]:
    """An SSH command's result (`done` is an op step's, never a session's: not sent)."""
    out = {name: getattr(result, name) for name in RESULT_FIELDS}
    noise = result.noise
    out["noise"] = {
        "lines": list(noise.lines),
        "count": noise.count,
        "late_lines": list(noise.late_lines),
        "late_count": noise.late_count,
    }
    out["stdout_tail"] = list(result.stdout_tail)
    out["stderr_tail"] = list(result.stderr_tail)
    return out


def result_from_wire(data: dict[str, Any]) -> CommandResult:
    noise = data.get("noise") or {}
    return CommandResult(
        exit_code=data.get("exit_code"),
        stdout_tail=tuple(data.get("stdout_tail", ())),
        stderr_tail=tuple(data.get("stderr_tail", ())),
        duration_s=float(data.get("duration_s", 0.0)),
        timed_out=bool(data.get("timed_out")),
        cancelled=bool(data.get("cancelled")),
        signal=data.get("signal"),
        core_dumped=bool(data.get("core_dumped")),
        stop_failed=data.get("stop_failed"),
        broken=data.get("broken"),
        noise=Noise(
            tuple(noise.get("lines", ())),
            int(noise.get("count", 0)),
            tuple(noise.get("late_lines", ())),
            int(noise.get("late_count", 0)),
        ),
    )


def settings_to_wire(opts: SshSettings) -> dict[str, Any]:
    """The SSH settings without their secrets (those go once, in the hello, never stored)."""
    return {
        "ssh_config": str(opts.ssh_config) if opts.ssh_config is not None else None,
        "host_keys": opts.host_keys,
        "known_hosts": [str(p) for p in opts.known_hosts],
        "connect_timeout_s": opts.connect_timeout_s,
        "banner_timeout_s": opts.banner_timeout_s,
        "auth_timeout_s": opts.auth_timeout_s,
        "connect_attempts": opts.connect_attempts,
        "backoff_base_s": opts.backoff_base_s,
        "debug": opts.debug,
        "engine": opts.engine,
    }


def environ_from_wire(data: Any) -> dict[str, str] | None:
    """A command's environment as its hello gives it (None: not given, this process's)."""
    if not isinstance(data, dict):
        return None
    return {str(k): str(v) for k, v in data.items()}


def settings_from_wire(data: dict[str, Any], key_passphrase: str | None) -> SshSettings:
    config = data.get("ssh_config")
    return SshSettings(
        ssh_config=Path(config) if config is not None else None,
        host_keys=data.get("host_keys"),
        known_hosts=tuple(Path(p) for p in data.get("known_hosts", ())),
        connect_timeout_s=data.get("connect_timeout_s"),
        banner_timeout_s=float(data["banner_timeout_s"]),
        auth_timeout_s=float(data["auth_timeout_s"]),
        connect_attempts=int(data["connect_attempts"]),
        backoff_base_s=float(data["backoff_base_s"]),
        debug=bool(data.get("debug")),
        # Anything unknown (an older client's hello) means paramiko, as before libssh2.
        engine=data["engine"] if data.get("engine") in defaults.SSH_ENGINES else "paramiko",
        key_passphrase=key_passphrase,
    )
