"""SSH to the nodes, on paramiko: the only module that imports it.

fleet uses paramiko's client directly rather than fabric's `Connection`: fabric hard-codes
`AutoAddPolicy` and skips known_hosts (PITFALLS 10), and its group runner starts an uncapped thread
per host. Here host keys are checked against known_hosts by default, all three timeouts are set
(PITFALLS 8), handshakes dropped by sshd's MaxStartups are retried with jittered backoff
(PITFALLS 9), and a cancelled or expired step is stopped on the node (PITFALLS 11).
"""

from __future__ import annotations

import errno
import logging
import os
import random
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from fleet.errors import ConfigError
from fleet.events import CommandResult
from fleet.inventory import Host
from fleet.shell import KILL_AFTER_S, PID_MARKER, STDIN_FOLLOWS, Cmd, kill_command
from fleet.sshconfig import IndexedSSHConfig

SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
USER_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
TAIL_LINES = 20
POLL_S = 0.2
# A node that vanishes mid-step (power loss, link down) sends nothing, not even a reset. Like
# OpenSSH's ServerAliveInterval/ServerAliveCountMax: after KEEPALIVE_S without a word from the node
# during a step, fleet asks it for a reply (a global request with want-reply); no reply within
# DEAD_PEER_S and the node is reported "connection lost". So a silent node is given up within
# KEEPALIVE_S + DEAD_PEER_S (plus a poll). The socket's TCP_USER_TIMEOUT (the same DEAD_PEER_S)
# stays as a backstop, but alone it overshot by 10 s and more: an ICMP host-unreachable (RFC 6069
# backoff revert) re-arms the kernel's retransmit timer past the user timeout. (Direct connections
# only for the TCP backstop; the reply check works through a ProxyJump too.)
KEEPALIVE_S = 15
DEAD_PEER_S = 30
# paramiko's own bound on key exchange once the banner has arrived (Transport.handshake_timeout).
HANDSHAKE_S = 15.0
# How long the kill of a timed-out or cancelled step may take on the node (kill_command's grace
# is 5 s), before we stop waiting for it.
KILL_WAIT_S = 15.0
# Once a step's exit status is in, how long to keep reading while no more output arrives and the
# node has not sent EOF (a background process may hold the step's stdout open forever).
TAIL_WAIT_S = 3.0

OnLine = Callable[[str, str], None]  # (stream, line)


class ConnectFailed(Exception):
    """A host could not be reached or logged into; `reason` is the short classification."""

    def __init__(self, reason: str, detail: str = "", retryable: bool = False) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.retryable = retryable


@dataclass(frozen=True)
class SSHOptions:
    """Everything the transport needs that does not come from the inventory."""

    ssh_config: Path | None = None
    host_keys: str | None = None  # "strict" | "accept-new"; None: from ssh config, else strict
    known_hosts: tuple[Path, ...] = ()
    connect_timeout_s: float | None = None  # None: the ssh config's ConnectTimeout, else 10 s
    banner_timeout_s: float = 15.0
    auth_timeout_s: float = 15.0
    # sshd's MaxStartups drops handshakes beyond ~10 pending per node; with jittered backoff
    # (0.3 s doubling) six attempts span about 10 s, enough for 128 connections to one sshd.
    connect_attempts: int = 6
    backoff_base_s: float = 0.3
    sudo_password: str | None = field(default=None, repr=False)
    key_passphrase: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Target:
    """Where and as whom to connect, after merging inventory and ssh config."""

    name: str
    address: str
    port: int
    user: str
    key_files: tuple[str, ...]
    known_hosts: tuple[Path, ...]
    policy: str
    proxy_jump: str | None
    connect_timeout_s: float


class HostKeyStore:
    """known_hosts files, read once and shared by every worker; accept-new appends under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[Path, paramiko.HostKeys] = {}

    def _load(self, path: Path) -> paramiko.HostKeys:
        with self._lock:
            if path not in self._files:
                keys = paramiko.HostKeys()
                if path.is_file():
                    try:
                        keys.load(str(path))
                    except (OSError, paramiko.SSHException) as exc:
                        raise ConfigError(
                            f"{path}: cannot read known_hosts: {exc}",
                            hint="fix or remove the bad line",
                        ) from None
                self._files[path] = keys
            return self._files[path]

    def known(self, files: tuple[Path, ...], hostname: str) -> dict[str, paramiko.PKey]:
        """Every key recorded for `hostname` (`[addr]:port` off port 22) across the files."""
        found: dict[str, paramiko.PKey] = {}
        for path in files:
            entry = self._load(path).lookup(hostname)
            if entry:
                for keytype in entry:
                    found.setdefault(keytype, entry[keytype])
        return found

    def record(self, path: Path, hostname: str, key: paramiko.PKey) -> None:
        """Trust on first use: append the key to `path` (the user's known_hosts)."""
        keys = self._load(path)
        with self._lock:
            keys.add(hostname, key.get_name(), key)
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with path.open("a", encoding="utf-8") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class _UnknownKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Called only for keys no known_hosts file lists: reject (strict) or record (accept-new)."""

    def __init__(self, store: HostKeyStore, target: Target) -> None:
        self.store = store
        self.target = target

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        if self.target.policy == "accept-new":
            self.store.record(self.target.known_hosts[-1], hostname, key)
            return
        fingerprint = key.fingerprint
        raise ConnectFailed(
            "host key unknown",
            f"{hostname} offered {key.get_name()} {fingerprint}, not in known_hosts; "
            "verify it, then rerun with --host-keys accept-new to record it",
        )


def _silence_paramiko(debug: bool) -> None:
    """paramiko logs handshake failures as tracebacks; fleet reports them itself."""
    logger = logging.getLogger("paramiko")
    if not debug:
        logger.setLevel(logging.CRITICAL + 1)
        logger.propagate = False


def _classify(
    exc: BaseException,
    started: float,
    opts: SSHOptions,
    timeout_s: float,
    banner_seen: bool = False,
) -> ConnectFailed:
    """Turn socket/paramiko errors into the short reasons fleet reports and decides retries on."""
    elapsed = time.monotonic() - started
    if isinstance(exc, ConnectFailed):
        return exc
    if isinstance(exc, paramiko.BadHostKeyException):
        return ConnectFailed(
            "host key changed",
            f"server offered {exc.key.get_name()} {exc.key.fingerprint}, known_hosts has "
            f"{exc.expected_key.fingerprint}: possible man-in-the-middle, "
            "or the node was reinstalled; "
            "if expected, remove the old line (ssh-keygen -R HOST)",
        )
    if isinstance(exc, paramiko.PasswordRequiredException):
        return ConnectFailed(
            "authentication failed",
            "the private key is encrypted: load it into ssh-agent (ssh-add) or pass --ask-key-pass",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return ConnectFailed("authentication failed", str(exc) or "no accepted key")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        codes = {getattr(e, "errno", None) for e in exc.errors.values()}
        if errno.ECONNREFUSED in codes:
            return ConnectFailed("connection refused", "nothing listens on the SSH port")
        return ConnectFailed("host unreachable", "no route to host")
    if isinstance(exc, socket.gaierror):
        return ConnectFailed("cannot resolve address", str(exc))
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return ConnectFailed("connect timed out", f"no TCP answer within {timeout_s:g}s")
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return ConnectFailed("host unreachable", os.strerror(exc.errno))
    if isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED:
        return ConnectFailed("connection refused", "nothing listens on the SSH port")
    text = str(exc)
    if text == "No existing session":
        # Fix: paramiko's connect(timeout=...) also caps negotiation; when that cap expires it
        # returns without an exception and the next call fails with this text. It used to be
        # classified (and retried, 4x) as a dropped handshake. _connect_once now passes a cap
        # longer than the banner and kex timeouts, so this is a backstop.
        return ConnectFailed(
            "no SSH banner" if not banner_seen else "handshake timed out",
            f"TCP connected but the SSH handshake did not finish within {elapsed:.0f}s",
        )
    if "protocol banner" in text:
        if elapsed >= opts.banner_timeout_s * 0.9:
            return ConnectFailed(
                "no SSH banner",
                f"TCP connected but no SSH banner within {opts.banner_timeout_s:g}s "
                "(host overloaded or I/O-stalled?)",
            )
        return ConnectFailed(
            "connection closed during handshake",
            "sshd dropped the handshake (MaxStartups?)",
            retryable=True,
        )
    if isinstance(exc, (EOFError, ConnectionResetError, paramiko.SSHException)):
        return ConnectFailed(
            "connection closed during handshake", text or type(exc).__name__, retryable=True
        )
    return ConnectFailed("ssh error", f"{type(exc).__name__}: {text}")


class _Liveness:
    """Is the node still answering? The application-level check described at KEEPALIVE_S."""

    def __init__(self, transport: paramiko.Transport) -> None:
        self.transport = transport
        self.heard = time.monotonic()
        self.asked: float | None = None
        self.answered = threading.Event()

    def heard_from(self, now: float) -> None:
        self.heard = now

    def alive(self, now: float) -> bool:
        """False once a request for a reply went unanswered for DEAD_PEER_S."""
        if self.asked is not None:
            if self.answered.is_set():
                self.asked = None
                self.heard = now
                return True
            return now - self.asked <= DEAD_PEER_S
        if now - self.heard >= KEEPALIVE_S:
            self.asked = now
            self.answered = threading.Event()
            threading.Thread(
                target=self._ask, args=(self.answered,), name="fleet-keepalive", daemon=True
            ).start()
        return True

    def _ask(self, answered: threading.Event) -> None:
        # OpenSSH answers an unknown global request with REQUEST_FAILURE: any answer will do.
        # global_request(wait=True) returns early (None) once the transport dies.
        try:
            self.transport.global_request("keepalive@openssh.com", wait=True)
        except (paramiko.SSHException, EOFError, OSError):
            return
        if self.transport.is_active():
            answered.set()


class SSHSession:
    """One authenticated connection to one host, reused for all of its steps."""

    def __init__(
        self, client: paramiko.SSHClient, target: Target, gateway: SSHSession | None
    ) -> None:
        self.client = client
        self.target = target
        self.gateway = gateway

    def run(
        self, cmd: Cmd, on_line: OnLine, cancel: threading.Event, sudo_password: str | None = None
    ) -> CommandResult:
        """Run one wrapped command, streaming lines; enforce its deadline and honour cancel."""
        try:
            return self._run(cmd, on_line, cancel, sudo_password)
        except paramiko.ChannelException as exc:
            raise ConnectFailed("channel refused", f"sshd refused a session: {exc}") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            # Fix: paramiko's own errors used to escape as an "internal error" (outcome failed,
            # exit 3, no step named): "Timeout opening channel." from a node that stopped
            # answering between steps, EOFError from a write on a connection that just died.
            detail = str(exc) or type(exc).__name__
            raise ConnectFailed("connection lost", f"the SSH connection failed: {detail}") from None

    def _run(
        self, cmd: Cmd, on_line: OnLine, cancel: threading.Event, sudo_password: str | None
    ) -> CommandResult:
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectFailed("connection lost", "the SSH connection closed between steps")
        started = time.monotonic()
        channel = self._start(transport, cmd, sudo_password)
        reader = _Reader(on_line)
        # The node's own `timeout` fires first; this client deadline only covers a node that stops
        # answering altogether (then the whole connection is treated as lost).
        deadline = started + cmd.timeout_s + KILL_AFTER_S + 10 if cmd.timeout_s else None
        cancelled = timed_out = False
        quiet_since: float | None = None
        liveness = _Liveness(transport)
        while True:
            select.select([channel], [], [], POLL_S)
            got = self._drain(channel, reader)
            if got:
                liveness.heard_from(time.monotonic())
            if channel.exit_status_ready() and not (
                channel.recv_ready() or channel.recv_stderr_ready()
            ):
                # Fix: sshd sends exit-status as soon as the command exits, ahead of output still
                # queued behind a slow link; stopping here lost the tail (and the last line).
                # Read on until EOF, or until no output came for TAIL_WAIT_S.
                now = time.monotonic()
                if channel.eof_received or channel.closed:
                    break
                if got or quiet_since is None:
                    quiet_since = now
                elif now - quiet_since > TAIL_WAIT_S:
                    break
            if cancel.is_set():
                cancelled = True
                self._stop_remote(self._await_pid(channel, reader), cmd.sudo)
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                # Fix: past the node's own deadline (+ KILL_AFTER_S + 10 s) and still no exit
                # status: if the kill cannot be delivered either, the node stopped answering. It
                # used to be reported as "step timed out; remote command killed", which fleet
                # could not know.
                if not self._stop_remote(self._await_pid(channel, reader), cmd.sudo):
                    raise ConnectFailed(
                        "connection lost",
                        f"the node stopped answering: no exit status {deadline - started:.0f}s "
                        f"after the step started ({cmd.timeout_s:g}s timeout), and the kill "
                        "could not be delivered",
                    )
                break
            if not transport.is_active():
                raise ConnectFailed("connection lost", "the node went away while a step ran")
            if not liveness.alive(time.monotonic()):
                raise ConnectFailed(
                    "connection lost",
                    f"the node went away while a step ran: silent for {KEEPALIVE_S}s, then no "
                    f"answer to a keepalive for {DEAD_PEER_S}s",
                )
        reader.flush()
        exit_code: int | None = None
        if not (cancelled or timed_out):
            exit_code = channel.recv_exit_status()
            if exit_code == -1:
                raise ConnectFailed("connection lost", "the node went away while a step ran")
        channel.close()
        duration = time.monotonic() - started
        if cmd.timeout_s and exit_code in (124, 137) and duration >= cmd.timeout_s * 0.95:
            timed_out = True
        return CommandResult(
            exit_code=exit_code,
            stdout_tail=tuple(reader.tails["stdout"]),
            stderr_tail=tuple(reader.tails["stderr"]),
            duration_s=duration,
            timed_out=timed_out,
            cancelled=cancelled,
        )

    def _start(
        self, transport: paramiko.Transport, cmd: Cmd, sudo_password: str | None
    ) -> paramiko.Channel:
        """Open a session channel, start the command and send all of its stdin."""
        channel = transport.open_session(timeout=self.target.connect_timeout_s)
        channel.exec_command(cmd.command)
        if cmd.sudo and sudo_password is not None:
            channel.sendall((sudo_password + "\n").encode())
            # wrap() skips to this line before the step runs: sudo with NOPASSWD (or a root
            # login) leaves the password line unread, and it must never reach the step.
            channel.sendall((STDIN_FOLLOWS + "\n").encode())
        if cmd.stdin is not None:
            channel.sendall(cmd.stdin.encode())
        channel.shutdown_write()
        return channel

    @staticmethod
    def _drain(channel: paramiko.Channel, reader: _Reader) -> bool:
        """Read whatever both streams have buffered; True if there was anything."""
        got = False
        while channel.recv_ready():
            reader.feed("stdout", channel.recv(65536))
            got = True
        while channel.recv_stderr_ready():
            reader.feed("stderr", channel.recv_stderr(65536))
            got = True
        return got

    def _await_pid(
        self, channel: paramiko.Channel, reader: _Reader, wait_s: float = 3.0
    ) -> int | None:
        """The wrapper prints its pid first; on a cancel right after start it may be in flight."""
        deadline = time.monotonic() + wait_s
        while (
            reader.pid is None and time.monotonic() < deadline and not channel.exit_status_ready()
        ):
            select.select([channel], [], [], POLL_S)
            self._drain(channel, reader)
        return reader.pid

    def _stop_remote(self, pid: int | None, sudo: bool) -> bool:
        """Closing the channel does not stop the remote process: kill its process group by pid.

        True if the kill ran to completion on the node (so the node still answers)."""
        transport = self.client.get_transport()
        if pid is None or transport is None or not transport.is_active():
            return False
        try:
            channel = transport.open_session(timeout=5)
            channel.settimeout(10)
            channel.exec_command(kill_command(pid, sudo))
            channel.shutdown_write()
            # Fix: recv_exit_status() has no timeout and would wait forever on a node that
            # accepted the channel but never runs the command (I/O-stalled); poll to a deadline.
            until = time.monotonic() + KILL_WAIT_S
            while not channel.exit_status_ready() and time.monotonic() < until:
                time.sleep(POLL_S)
            done = channel.exit_status_ready() and channel.recv_exit_status() == 0
            channel.close()
        except (paramiko.SSHException, OSError):
            return False
        return done

    def close(self) -> None:
        """Close the connection (the gateway stays: other hosts may share it)."""
        self.client.close()


class _Reader:
    """Splits channel bytes into lines, keeps tails, and picks out the wrapper's pid line."""

    def __init__(self, on_line: OnLine) -> None:
        self.on_line = on_line
        self.partial = {"stdout": b"", "stderr": b""}
        self.tails: dict[str, deque[str]] = {
            "stdout": deque(maxlen=TAIL_LINES),
            "stderr": deque(maxlen=TAIL_LINES),
        }
        self.pid: int | None = None

    def feed(self, stream: str, data: bytes) -> None:
        buf = self.partial[stream] + data
        *lines, self.partial[stream] = buf.split(b"\n")
        for raw in lines:
            self._line(stream, raw.decode("utf-8", "replace").rstrip("\r"))

    def _line(self, stream: str, line: str) -> None:
        if self.pid is None and stream == "stderr" and line.startswith(PID_MARKER):
            value = line[len(PID_MARKER) :].strip()
            self.pid = int(value) if value.isdigit() else None
            return
        self.tails[stream].append(line)
        self.on_line(stream, line)

    def flush(self) -> None:
        for stream, rest in self.partial.items():
            if rest:
                self._line(stream, rest.decode("utf-8", "replace").rstrip("\r"))
        self.partial = {"stdout": b"", "stderr": b""}


class SSHTransport:
    """Opens SSHSessions; shares host keys, ssh config and jump-host connections between workers."""

    def __init__(self, opts: SSHOptions, debug: bool = False) -> None:
        _silence_paramiko(debug)
        self.opts = opts
        self.keys = HostKeyStore()
        # Indexed: paramiko alone tests every Host block per host (N x N for per-node blocks).
        self.config = IndexedSSHConfig(self._load_config(opts.ssh_config))
        self._gateways: dict[str, SSHSession] = {}
        self._gateway_lock = threading.Lock()
        self._local_user = _local_user()

    @staticmethod
    def _load_config(path: Path | None) -> paramiko.SSHConfig:
        """Read the OpenSSH client config (missing default file: empty config)."""
        default = Path("~/.ssh/config").expanduser()
        chosen = path.expanduser() if path else default
        if not chosen.is_file():
            if path is not None:
                raise ConfigError(
                    f"{chosen}: ssh config not found",
                    hint="check -F/--ssh-config or FLEET_SSH_CONFIG",
                )
            return paramiko.SSHConfig()
        try:
            return paramiko.SSHConfig.from_path(str(chosen))
        except (OSError, paramiko.SSHException, ValueError) as exc:
            raise ConfigError(
                f"{chosen}: cannot parse ssh config: {exc}", hint="fix the file"
            ) from None

    def target(self, host: Host) -> Target:
        """Merge inventory settings (which win) with the ssh config for this host."""
        cfg: dict[str, Any] = dict(self.config.lookup(host.address))
        address = cfg.get("hostname", host.address) if host.address == host.name else host.address
        port = host.port or int(cfg.get("port", 22))
        user = host.user or cfg.get("user") or self._local_user
        keys: list[str] = [host.key_file] if host.key_file else []
        keys += [os.path.expanduser(k) for k in cfg.get("identityfile", [])]
        known: list[Path] = [SYSTEM_KNOWN_HOSTS]
        known += [Path(os.path.expanduser(p)) for p in cfg.get("globalknownhostsfile", "").split()]
        user_files = [
            Path(os.path.expanduser(p)) for p in cfg.get("userknownhostsfile", "").split()
        ]
        known += list(self.opts.known_hosts) + (user_files or [USER_KNOWN_HOSTS.expanduser()])
        policy = self.opts.host_keys or _policy_from_config(cfg.get("stricthostkeychecking"))
        # --connect-timeout when given, else the ssh config's ConnectTimeout, else 10 s.
        connect_timeout = self.opts.connect_timeout_s or float(cfg.get("connecttimeout", 10.0))
        jump = cfg.get("proxyjump")
        return Target(
            name=host.name,
            address=str(address),
            port=port,
            user=str(user),
            key_files=tuple(dict.fromkeys(keys)),
            known_hosts=tuple(dict.fromkeys(known)),
            policy=policy,
            proxy_jump=None if jump in (None, "none") else str(jump),
            connect_timeout_s=connect_timeout,
        )

    def connect(self, host: Host, on_attempt: Callable[[int], None] | None = None) -> SSHSession:
        """Connect and authenticate, retrying only handshakes that sshd dropped (MaxStartups)."""
        target = self.target(host)
        last: ConnectFailed | None = None
        for attempt in range(1, max(1, self.opts.connect_attempts) + 1):
            if on_attempt:
                on_attempt(attempt)
            try:
                return self._connect_once(target)
            except ConnectFailed as exc:
                last = exc
                if not exc.retryable:
                    raise
            delay = self.opts.backoff_base_s * (2 ** (attempt - 1))
            time.sleep(delay * (0.5 + random.random()))  # noqa: S311 - jitter, not crypto
        assert last is not None
        raise ConnectFailed(
            last.reason, f"{last.detail} (after {self.opts.connect_attempts} attempts)"
        )

    def _connect_once(self, target: Target) -> SSHSession:
        """One connection attempt, with known keys pinned so paramiko negotiates their type."""
        client = paramiko.SSHClient()
        hostname = target.address if target.port == 22 else f"[{target.address}]:{target.port}"
        for keytype, key in self.keys.known(target.known_hosts, hostname).items():
            client.get_host_keys().add(hostname, keytype, key)
        client.set_missing_host_key_policy(_UnknownKeyPolicy(self.keys, target))
        gateway = self._gateway(target.proxy_jump) if target.proxy_jump else None
        started = time.monotonic()
        sock: Any = None
        try:
            if gateway is None:
                # Fix: paramiko's connect(timeout=...) bounds both the TCP connect and the whole
                # negotiation, so with ConnectTimeout (10 s) below the banner timeout (15 s) a
                # node that accepts TCP but sends no banner was cut at 10 s as "No existing
                # session", classified as a dropped handshake and retried 4 times (~45 s).
                # Connect here with the connect timeout; the banner timeout then applies.
                sock = socket.create_connection(
                    (target.address, target.port), timeout=target.connect_timeout_s
                )
                _bound_silence(sock)
                started = time.monotonic()  # the banner timeout counts from here
            else:
                gw_transport = gateway.client.get_transport()
                assert gw_transport is not None
                sock = gw_transport.open_channel(
                    "direct-tcpip",
                    (target.address, target.port),
                    ("127.0.0.1", 0),
                    timeout=target.connect_timeout_s,
                )
            client.connect(
                target.address,
                port=target.port,
                username=target.user,
                key_filename=list(target.key_files) or None,  # type: ignore[arg-type]
                # With `sock` given, this only caps negotiation (banner, then key exchange):
                # longer than paramiko's own banner and kex timeouts, which then name the fault.
                timeout=self.opts.banner_timeout_s + HANDSHAKE_S + 5,
                banner_timeout=self.opts.banner_timeout_s,
                auth_timeout=self.opts.auth_timeout_s,
                channel_timeout=target.connect_timeout_s,
                allow_agent=True,
                look_for_keys=not target.key_files,
                passphrase=self.opts.key_passphrase,
                sock=sock,
            )
        except BaseException as exc:
            handshake = client.get_transport()
            banner_seen = bool(handshake is not None and handshake.remote_version)
            client.close()
            if sock is not None:
                sock.close()
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise _classify(
                exc, started, self.opts, target.connect_timeout_s, banner_seen
            ) from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(KEEPALIVE_S)
        return SSHSession(client, target, gateway)

    def _gateway(self, spec: str) -> SSHSession:
        """One shared connection per jump host, instead of a fresh handshake through it per node."""
        with self._gateway_lock:
            session = self._gateways.get(spec)
            transport = session.client.get_transport() if session else None
            if session is not None and transport is not None and transport.is_active():
                return session
            first = spec.split(",", maxsplit=1)[0]
            user, _, rest = first.rpartition("@")
            address, _, port = rest.partition(":")
            jump_host = Host(
                name=address, address=address, port=int(port) if port else None, user=user or None
            )
            jump_target = self.target(jump_host)
            try:
                session = self._connect_once(jump_target)
            except ConnectFailed as exc:
                raise ConnectFailed(f"jump host {first}: {exc.reason}", exc.detail) from None
            self._gateways[spec] = session
            return session

    def close(self) -> None:
        """Close shared jump-host connections."""
        with self._gateway_lock:
            for session in self._gateways.values():
                session.close()
            self._gateways.clear()


def _bound_silence(sock: socket.socket) -> None:
    """Fail the socket when sent data stays unacknowledged for DEAD_PEER_S (Linux only)."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is not None:
        sock.setsockopt(socket.IPPROTO_TCP, option, int(DEAD_PEER_S * 1000))


def _policy_from_config(value: str | None) -> str:
    """OpenSSH's StrictHostKeyChecking: accept-new/no/off record unknown keys; changed keys are
    always rejected. Anything else (yes, ask, unset) is strict."""
    if value and value.lower() in {"accept-new", "no", "off"}:
        return "accept-new"
    return "strict"


def _local_user() -> str:
    """The local login name, OpenSSH's default remote user."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return os.environ.get("USER", "root")
