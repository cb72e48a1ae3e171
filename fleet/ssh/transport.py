"""SSH to the nodes: SSHTransport (targets, retries, jump hosts) and the session on paramiko.

fleet uses paramiko's client directly rather than fabric's `Connection`: fabric hard-codes
`AutoAddPolicy` and skips known_hosts (PITFALLS 10), and its group runner starts an uncapped thread
per host. Here host keys are checked against known_hosts by default, all three timeouts are set
(PITFALLS 8), handshakes dropped by sshd's MaxStartups are retried with jittered backoff
(PITFALLS 9), and a cancelled or expired step is stopped on the node (PITFALLS 11).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import random
import select
import signal
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.core import defaults
from fleet.core.digits import is_digits
from fleet.core.errors import ConfigError
from fleet.core.frame import Frame, new_token
from fleet.core.hosts import Host
from fleet.core.result import LINE_MAX_BYTES, TAIL_LINE_MAX_BYTES, CommandResult, cut_bytes
from fleet.core.shell import (
    COMMAND_MAX_BYTES,
    KILL_AFTER_S,
    KILL_REPORT,
    ONE_ARGUMENT,
    PID_MARKER,
    STDIN_FOLLOWS,
    STDIN_MARK,
    Cmd,
    CommandTooLong,
    check_length,
    framed,
    kill_command,
    wrap,
)
from fleet.ssh import failure, library, workdir
from fleet.ssh.config import (
    disabled_algorithms,
    expand_tokens,
    read_config,
    refusal,
)
from fleet.ssh.hops import parse_hop
from fleet.ssh.hostkeys import HostKeyStore, _cert_blob, _changed_detail
from fleet.ssh.identities import _IdentityCache
from fleet.ssh.keyfiles import check_key_files
from fleet.ssh.library import paramiko
from fleet.ssh.settings import SshSettings
from fleet.ssh.target import Target
from fleet.ssh.tunnel import TunnelSocket

if TYPE_CHECKING:
    from fleet.ssh.proxy import ProxyCommandSocket

ConnectFailed = failure.ConnectFailed  # its own light module; still importable from here
SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")
USER_KNOWN_HOSTS = "~/.ssh/known_hosts"


def _expanded(path: str) -> Path:
    """A known_hosts path of the ssh config, `~` expanded: the same few for every host of a
    fleet, so made once (a Path is parsed each time it is made), per $HOME."""
    return _expanded_in(path, os.environ.get("HOME"))


@functools.lru_cache(maxsize=256)
def _expanded_in(path: str, home: str | None) -> Path:
    """`home` is not read here: it is part of the cache's key, since expanduser reads $HOME."""
    return Path(os.path.expanduser(path))


TAIL_LINES = 20
# How much a node may send ahead of what fleet has read, per step (SSH channel window). While the
# main thread catches up with a flood, every running step's channel holds up to this much:
# paramiko's default (2 MiB) made that 256 MiB at -f 128 (measured: 346 MiB peak against 150).
# 256 KiB still moves 10 MB/s per host across a 25 ms round trip, more than the main thread can
# report for many hosts at once.
CHANNEL_WINDOW_BYTES = 256 * 1024
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
# How often an established connection's paramiko thread wakes with nothing to read (its socket
# timeout; paramiko's own is 0.1 s, for the handshake): its keepalive is checked then, and a
# transport closed from this side ends its thread within it.
QUIET_POLL_S = 1.0
DEAD_PEER_S = 30
# paramiko's own bound on key exchange once the banner has arrived (Transport.handshake_timeout).
HANDSHAKE_S = 15.0
# ProxyJump hops one connection may pass through (a jump host's own ProxyJump counts too): past
# this, the config loops.
MAX_JUMPS = 8
# How long the kill of a timed-out or cancelled step may take on the node (kill_command's grace
# is 5 s), before we stop waiting for it.
KILL_WAIT_S = 15.0
# Once a step's exit status is in and the node has not sent EOF (a background process may hold
# the step's stdout open forever), how long to keep reading: see _TailWait.
TAIL_WAIT_S = 3.0
TAIL_MAX_S = 30.0  # the same, with output still coming, when no end frame came to go by
# How much one read pass takes from a channel's stream before the run loop looks at cancel and
# the deadlines again: a node that floods faster than fleet reads never empties the channel, and
# a pass that read on until it did never came back (Ctrl-C waited out the run's last 25 s, and
# the remote command was never stopped). Bytes bound a pass of long lines; time one of short
# lines, which the main thread takes one by one (OutputBudget), far slower than they arrive.
DRAIN_BYTES = 1024 * 1024
DRAIN_S = 0.1
# What a run says of a connection that was dead before anything was sent: the one failure after
# which running the command on a fresh connection cannot run it twice (the keeper does).
CLOSED_BEFORE = "the SSH connection closed between steps"

OnLine = Callable[[str, str], None]  # (stream, line)


def _classify(
    exc: BaseException,
    started: float,
    opts: SshSettings,
    timeout_s: float,
    banner_seen: bool = False,
) -> ConnectFailed:
    """Turn socket/paramiko errors into the short reasons fleet reports and decides retries on."""
    elapsed = time.monotonic() - started
    if isinstance(exc, ConnectFailed):
        return exc
    # An exception of paramiko's, told by its class's module: the libssh2 path's socket errors
    # come here too, and must not load paramiko (nor meet one another thread is importing).
    from_paramiko = type(exc).__module__.partition(".")[0] == "paramiko"
    if from_paramiko and isinstance(exc, paramiko.BadHostKeyException):
        return ConnectFailed(
            "host key changed", _changed_detail(exc.key, exc.expected_key.asbytes())
        )
    if from_paramiko and isinstance(exc, paramiko.PasswordRequiredException):
        return ConnectFailed(
            "authentication failed",
            "the private key is encrypted: load it into ssh-agent (ssh-add) or pass --ask-key-pass",
        )
    if from_paramiko and isinstance(exc, paramiko.AuthenticationException):
        return ConnectFailed("authentication failed", str(exc) or "no accepted key")
    if from_paramiko and isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
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
        # paramiko's connect(timeout=...) also caps negotiation; when that cap expires it
        # returns without an exception and the next call fails with this text: a timeout, not
        # a dropped handshake (which would be retried). _connect_once passes a cap longer than
        # the banner and kex timeouts, so this is a backstop.
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
    if banner_seen and type(exc) is EOFError and elapsed >= HANDSHAKE_S * 0.9:
        # paramiko ends a key exchange that outlasts its handshake_timeout with a bare EOFError:
        # a node that stalls after its banner, not a handshake sshd dropped (retrying it would
        # wait as long again, each attempt).
        return ConnectFailed(
            "handshake timed out",
            f"TCP connected but the SSH handshake did not finish within {HANDSHAKE_S:.0f}s",
        )
    if (from_paramiko and isinstance(exc, paramiko.SSHException)) or isinstance(
        exc, (EOFError, ConnectionResetError)
    ):
        return ConnectFailed(
            "connection closed during handshake", text or type(exc).__name__, retryable=True
        )
    return ConnectFailed("ssh error", f"{type(exc).__name__}: {text}")


class Liveness:
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


@dataclass(frozen=True)
class _Stop:
    """How the kill of a cancelled or timed-out step went."""

    delivered: bool  # the kill ran on the node (so the node answers)
    error: str | None  # why something of the step may be left; None: nothing is


@dataclass(frozen=True)
class ExitSignal:
    """RFC 4254 6.10 `exit-signal`: the remote command died of a signal (KILL, ABRT, ...)."""

    name: str
    core_dumped: bool


# paramiko ignores `exit-signal` (paramiko#598; not merged as of 5.x), so a command killed by a
# signal looked like a vanished node: no exit status (-1). The transports fleet opens handle that
# request themselves (_watch_exit_signals); what it said is kept per channel here.
_EXIT_SIGNALS: weakref.WeakKeyDictionary[paramiko.Channel, ExitSignal]
_EXIT_SIGNALS = weakref.WeakKeyDictionary()


def _on_channel_request(channel: paramiko.Channel, message: paramiko.Message) -> None:
    """paramiko's handler for channel requests, plus `exit-signal`: string signal name (without
    "SIG"), boolean core dumped, error message, language tag."""
    start = message.packet.tell()
    if message.get_text() == "exit-signal":
        message.get_boolean()  # want reply: false by the RFC; paramiko answers one below
        _EXIT_SIGNALS[channel] = ExitSignal(message.get_text(), message.get_boolean())
    message.packet.seek(start)
    paramiko.Channel._handle_request(channel, message)  # type: ignore[attr-defined]
    if channel in _EXIT_SIGNALS:
        channel.status_event.set()  # as `exit-status` does: the command has ended


def _watch_exit_signals(transport: paramiko.Transport) -> None:
    """Route this transport's channel requests through _on_channel_request (its own table, so no
    other paramiko user is affected)."""
    table: dict[int, Any] = transport._channel_handler_table  # type: ignore[attr-defined]
    if table.get(paramiko.common.MSG_CHANNEL_REQUEST) is not _on_channel_request:
        transport._channel_handler_table = {  # type: ignore[attr-defined]
            **table,
            paramiko.common.MSG_CHANNEL_REQUEST: _on_channel_request,
        }


def _judged(result: CommandResult, frame: Frame) -> CommandResult:
    """The result with what its frame says: output not framed from start to end is no command's
    whole output, so a failure that says why (unless fleet stopped the command, or the frame
    itself died of a signal, which says it better); and the login shell's noise around it."""
    settled = result.cancelled or result.timed_out or result.signal
    broken = None if settled else frame.problem()
    code = (result.exit_code or 1) if broken else result.exit_code
    return dataclasses.replace(result, exit_code=code, broken=broken, noise=frame.noise)


def _exit_of(
    channel: paramiko.Channel, transport: paramiko.Transport
) -> tuple[int, ExitSignal | None]:
    """The finished command's exit status, or the signal it died of (as 128+N, the shell's
    convention, when the name is a known signal). Neither: the node went away."""
    status = channel.recv_exit_status()
    if status != -1:
        return status, None
    died = _EXIT_SIGNALS.get(channel)
    if died is None:
        raise ConnectFailed("connection lost", "the node went away while a step ran")
    try:
        number = int(signal.Signals[f"SIG{died.name}"])
    except KeyError:
        number = 0  # a signal this machine has no name for: still a death by signal
    return 128 + number, died


def _finished(
    reader: _Reader,
    frame: Frame,
    cmd: Cmd,
    started: float,
    exit: tuple[int | None, ExitSignal | None],
    cancelled: bool,
    timed_out: bool,
    stop: _Stop | None,
) -> CommandResult:
    """A run's result from what was read, however the command ended (either library)."""
    exit_code, died_of = exit
    duration = time.monotonic() - started
    # `timeout` ends a step that outlives its deadline: 124 when TERM did, or its own death
    # by KILL (it signals its whole group, itself included) when the step ignored TERM.
    if cmd.timeout_s and exit_code in (124, 137) and duration >= cmd.timeout_s * 0.95:
        timed_out = True
        died_of = None
    return _judged(
        CommandResult(
            exit_code=exit_code,
            stdout_tail=tuple(reader.tails["stdout"]),
            stderr_tail=tuple(reader.tails["stderr"]),
            duration_s=duration,
            timed_out=timed_out,
            cancelled=cancelled,
            signal=died_of.name if died_of else None,
            core_dumped=bool(died_of and died_of.core_dumped),
            stop_failed=stop.error if (cancelled or timed_out) and stop else None,
        ),
        frame,
    )


def _stdin_parts(
    sudo: bool, sudo_password: str | None, text: str | None, token: str | None
) -> list[bytes]:
    """What a framed command is fed, in order: the frame's stdin mark (see shell.framed), the
    password line for a -K sudo command, then the command's own stdin."""
    parts = [f"{STDIN_MARK} {token}\n".encode()] if token is not None else []
    if sudo and sudo_password is not None:
        parts.append((sudo_password + "\n").encode())
        # wrap() skips to this line before the step runs: sudo with NOPASSWD (or a root
        # login) leaves the password line unread, and it must never reach the step.
        parts.append((STDIN_FOLLOWS + "\n").encode())
    if text is not None:
        parts.append(text.encode())
    return parts


def _kill_for(pid: int, cmd: Cmd, sudo_password: str | None) -> tuple[Cmd, str | None]:
    """The kill of a step's process group, with the step's own privileges (sudo, fed the same
    password), or it could not reach a step that sudo made root; and that password."""
    password = sudo_password if cmd.sudo else None
    kill = wrap(
        kill_command(pid),
        sudo=cmd.sudo,
        timeout_s=None,
        script=False,
        password_on_stdin=password is not None,
    )
    return Cmd(command=kill, display=kill, sudo=cmd.sudo), password


def _kill_verdict(frame: Frame, reader: _Reader, status: int | None) -> _Stop:
    """What a kill that finished says: delivered, and why something of the step is left."""
    if not frame.started:  # an rc file that exits: the kill never ran, even on exit 0
        return _Stop(True, frame.problem())
    if status == 0:
        return _Stop(True, None)
    said = [x[len(KILL_REPORT) :] for x in reader.tails["stdout"] if x.startswith(KILL_REPORT)]
    why = said[-1] if said else (reader.tails["stderr"] or [f"kill exit {status}"])[-1]
    return _Stop(True, why)


def _client_deadline(started: float, cmd: Cmd) -> float | None:
    """The node's own `timeout` fires first; this client deadline only covers a node that stops
    answering altogether (then the whole connection is treated as lost)."""
    return started + cmd.timeout_s + KILL_AFTER_S + 10 if cmd.timeout_s else None


def _unanswered(waited_s: float, cmd: Cmd) -> ConnectFailed:
    return ConnectFailed(
        "connection lost",
        f"the node stopped answering: no exit status {waited_s:.0f}s after the step started "
        f"({cmd.timeout_s:g}s timeout), and the kill could not be delivered",
    )


class _TailWait:
    """Once a command has ended but its output is not closed (something it left behind holds
    it): how long to read on. With the frame's end lines in, all of the command's own output is
    too, and what still comes is a background process's (Noise.late_lines): TAIL_WAIT_S after the
    last end line, however much it writes, so a child that writes forever cannot hold the step.
    With no end frame to go by (the frame died, or never ran), output may still be in flight behind
    the exit status: read on while it comes, until TAIL_WAIT_S without any, TAIL_MAX_S at most."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.first: float | None = None
        self.ends = 0

    def over(self, got: bool, now: float, frame: Frame) -> bool:
        if self.first is None:
            self.first = now
        if frame.ended:
            if self.since is None or frame.end_lines != self.ends:  # a later end line wins
                self.since, self.ends = now, frame.end_lines
                return False
            return now - self.since > TAIL_WAIT_S
        if got or self.since is None:
            self.since = now
            return now - self.first > TAIL_MAX_S
        return now - self.since > TAIL_WAIT_S


def _wait_for_news(channel: paramiko.Channel, timeout_s: float = POLL_S) -> None:
    """Block until the channel may have news (output, EOF, its exit status, its close) or for
    `timeout_s` at most.

    select() on the channel serves until EOF. From then on paramiko keeps the channel's fd
    readable for good, so select() returned at once, again and again, until the exit status
    came: sshd sends EOF first, and while the transport thread that reads the exit status
    waited for the GIL, every run loop spun (~270 turns for `exec true`, CPU the other
    connections' threads needed). After EOF, with nothing left to read, the wait is on the
    exit status event instead, which paramiko sets on exit-status, exit-signal and close."""
    if channel.eof_received and not (channel.recv_ready() or channel.recv_stderr_ready()):
        channel.status_event.wait(timeout_s)
    else:
        select.select([channel], [], [], timeout_s)


def _transport_alive(channel: paramiko.Channel) -> bool:
    transport = channel.get_transport()
    return transport is not None and transport.is_active()


class SSHSession:
    """One authenticated connection to one host, reused for all of its steps."""

    engine = "paramiko"  # the library under it (events.HostConnected.ssh)

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
            # paramiko's own errors are a lost connection, not an internal error: "Timeout
            # opening channel." from a node that stopped answering between steps, EOFError from
            # a write on a connection that just died.
            detail = str(exc) or type(exc).__name__
            raise ConnectFailed("connection lost", f"the SSH connection failed: {detail}") from None

    def _run(
        self, cmd: Cmd, on_line: OnLine, cancel: threading.Event, sudo_password: str | None
    ) -> CommandResult:
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectFailed("connection lost", CLOSED_BEFORE)
        started = time.monotonic()
        frame = Frame(new_token())
        try:
            channel = self._start(transport, cmd, sudo_password, frame)
        except CommandTooLong as exc:
            return CommandResult(exit_code=None, broken=str(exc))
        reader = _Reader(on_line, frame)
        deadline = _client_deadline(started, cmd)
        cancelled = timed_out = False
        stop: _Stop | None = None
        tail = _TailWait()
        liveness = Liveness(transport)
        while True:
            _wait_for_news(channel)
            got = self._drain(channel, reader)
            if got:
                liveness.heard_from(time.monotonic())
            if channel.exit_status_ready():
                # sshd sends exit-status as soon as the command exits, ahead of output still
                # queued behind a slow link; stopping here would lose the tail (and the last
                # line). Read on until EOF, or as long as _TailWait says.
                pending = channel.recv_ready() or channel.recv_stderr_ready()
                if (channel.eof_received or channel.closed) and not pending:
                    break
                if tail.over(got, time.monotonic(), frame):
                    break
            if cancel.is_set():
                cancelled = True
                stop = self._stop_remote(self._await_pid(channel, reader), cmd, sudo_password)
                self._read_last_words(channel, reader)
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                # Past the node's own deadline (+ KILL_AFTER_S + 10 s) and still no exit
                # status: if the kill cannot be delivered either, the node stopped answering,
                # and fleet cannot claim the remote command was killed.
                stop = self._stop_remote(self._await_pid(channel, reader), cmd, sudo_password)
                if not stop.delivered:
                    raise _unanswered(deadline - started, cmd)
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
        died_of: ExitSignal | None = None
        if not (cancelled or timed_out):
            exit_code, died_of = _exit_of(channel, transport)
        channel.close()
        return _finished(
            reader, frame, cmd, started, (exit_code, died_of), cancelled, timed_out, stop
        )

    def _start(
        self, transport: paramiko.Transport, cmd: Cmd, sudo_password: str | None, frame: Frame
    ) -> paramiko.Channel:
        """Open a session channel, start the framed command and send all of its stdin. A
        connection found dead while the channel opens (a node that rebooted resets it) ran
        nothing: CLOSED_BEFORE, which a keeper retries on a fresh connection. One that does not
        answer ("Timeout opening channel.") says so."""
        mark = cmd.stdin is not None or (cmd.sudo and sudo_password is not None)
        command = check_length(
            framed(cmd.command, frame.token, helper=cmd.helper, stdin_mark=mark),
            COMMAND_MAX_BYTES,
            ONE_ARGUMENT,
        )
        _watch_exit_signals(transport)
        try:
            channel = transport.open_session(
                window_size=CHANNEL_WINDOW_BYTES, timeout=self.target.connect_timeout_s
            )
        except paramiko.ChannelException:
            raise  # sshd answered: it refused the session
        except (paramiko.SSHException, EOFError, OSError):
            if transport.is_active():
                raise
            raise ConnectFailed("connection lost", CLOSED_BEFORE) from None
        channel.exec_command(command)
        self._send_stdin(channel, cmd.sudo, sudo_password, cmd.stdin, frame.token if mark else None)
        return channel

    @staticmethod
    def _send_stdin(
        channel: paramiko.Channel,
        sudo: bool,
        sudo_password: str | None,
        text: str | None,
        token: str | None,
    ) -> None:
        """The frame's stdin mark (see shell.framed), the password line for a -K sudo command,
        then the command's own stdin; then EOF.

        A command may end before it has read its stdin (a login shell's rc that exits, a step
        that never reads): sshd then closes the channel and a send fails with "Socket is
        closed". That is the command's outcome, read from its exit status like any other, not
        a lost connection; only a dead transport is."""
        try:
            SSHSession._write_stdin(channel, sudo, sudo_password, text, token)
        except (OSError, EOFError):
            if not channel.closed or not _transport_alive(channel):
                raise

    @staticmethod
    def _write_stdin(
        channel: paramiko.Channel,
        sudo: bool,
        sudo_password: str | None,
        text: str | None,
        token: str | None,
    ) -> None:
        for part in _stdin_parts(sudo, sudo_password, text, token):
            channel.sendall(part)
        channel.shutdown_write()

    @staticmethod
    def _drain(channel: paramiko.Channel, reader: _Reader) -> bool:
        """Read what both streams have buffered, DRAIN_BYTES of each or DRAIN_S at most (a chunk
        of each stream at least); True if there was anything."""
        got = False
        until = time.monotonic() + DRAIN_S
        for ready, recv, stream in (
            (channel.recv_ready, channel.recv, "stdout"),
            (channel.recv_stderr_ready, channel.recv_stderr, "stderr"),
        ):
            budget = DRAIN_BYTES
            while budget > 0 and ready():
                data = recv(65536)
                reader.feed(stream, data)
                budget -= max(1, len(data))
                got = True
                if time.monotonic() > until:
                    break
        return got

    def _await_pid(
        self, channel: paramiko.Channel, reader: _Reader, wait_s: float = 3.0
    ) -> int | None:
        """The wrapper prints its pid first; on a cancel right after start it may be in flight."""
        deadline = time.monotonic() + wait_s
        while (
            reader.pid is None and time.monotonic() < deadline and not channel.exit_status_ready()
        ):
            _wait_for_news(channel)
            self._drain(channel, reader)
        return reader.pid

    def _stop_remote(self, pid: int | None, cmd: Cmd, sudo_password: str | None) -> _Stop:
        """Closing the channel does not stop the remote process: kill what the step started.

        The kill runs with the step's own privileges (sudo, fed the same password), or it could
        not reach a step that sudo made root. It reports whether it was delivered at all (so the
        node still answers) and, if anything of the step is left, why."""
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            return _Stop(False, "the SSH connection is gone")
        if pid is None:
            return _Stop(False, "the step's pid never arrived, so nothing could be signalled")
        kill, password = _kill_for(pid, cmd, sudo_password)
        frame = Frame(new_token())
        reader = _Reader(lambda stream, line: None, frame)
        mark = password is not None
        try:
            channel = transport.open_session(timeout=5)
            channel.settimeout(10)
            channel.exec_command(framed(kill.command, frame.token, helper=False, stdin_mark=mark))
            self._send_stdin(channel, cmd.sudo, password, None, frame.token if mark else None)
            # recv_exit_status() has no timeout and would wait forever on a node that accepted
            # the channel but never runs the command (I/O-stalled): poll to a deadline.
            until = time.monotonic() + KILL_WAIT_S
            while not channel.exit_status_ready() and time.monotonic() < until:
                _wait_for_news(channel)
                self._drain(channel, reader)
            # sshd may send the exit status ahead of the last output (the kill's report, its
            # end frame): read on to EOF, for a second at most.
            self._read_last_words(channel, reader)
            reader.flush()
            done = channel.exit_status_ready()
            status = channel.recv_exit_status() if done else None
            channel.close()
        except (paramiko.SSHException, OSError) as exc:
            return _Stop(False, f"the kill could not be sent: {exc or type(exc).__name__}")
        if not done:
            return _Stop(False, f"the kill did not finish within {KILL_WAIT_S:g}s")
        return _kill_verdict(frame, reader, status)

    def _read_last_words(self, channel: paramiko.Channel, reader: _Reader) -> None:
        """After a kill: what the step printed on its way out (a launch's rollback says what it
        stopped), until the node closes the stream or for a second at most."""
        until = time.monotonic() + 1.0
        while not channel.eof_received and time.monotonic() < until:
            _wait_for_news(channel)
            self._drain(channel, reader)
        self._drain(channel, reader)

    # paramiko's transport is thread-safe: several commands may run on it at once (keeper.Pool).
    shared = True

    def alive(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

    def host_key(self) -> tuple[bytes, bytes | None] | None:
        """The host key (and certificate) this connection was made with; None once it is gone."""
        transport = self.client.get_transport()
        if transport is None:
            return None
        key = transport.get_remote_server_key()
        return key.asbytes(), _cert_blob(key)

    def close(self) -> None:
        """Close the connection (the gateway stays: other hosts may share it). A connection
        that broke under it (the node, or the jump host's connection, went away) is closed all
        the same: that is no failure of the host's run, which is over (paramiko raises
        EOFError when the goodbye cannot be written)."""
        with contextlib.suppress(EOFError, OSError, paramiko.SSHException):
            self.client.close()


class _Reader:
    """Splits channel bytes into lines, keeps tails, and picks out the wrapper's pid line.

    Memory stays bounded whatever the node sends: a line is kept up to LINE_MAX_BYTES (plus the
    few bytes that finish a character); the rest of it is only counted, until its newline, and
    the line then goes out cut, saying how much it lost. The tails keep TAIL_LINES lines per
    stream, each cut to TAIL_LINE_MAX_BYTES.
    """

    def __init__(self, on_line: OnLine, frame: Frame | None = None) -> None:
        self.on_line = on_line
        self.frame = frame  # only the framed lines are the command's (fleet.core.frame)
        self.partial = {"stdout": bytearray(), "stderr": bytearray()}
        self.dropped = {"stdout": 0, "stderr": 0}  # bytes of the pending line beyond the buffer
        self.tails: dict[str, deque[str]] = {
            "stdout": deque(maxlen=TAIL_LINES),
            "stderr": deque(maxlen=TAIL_LINES),
        }
        self.pid: int | None = None

    def feed(self, stream: str, data: bytes) -> None:
        """Take one chunk from the channel (at most 64 KiB: the split below is bounded by it)."""
        *lines, rest = data.split(b"\n")
        for index, raw in enumerate(lines):
            if index == 0 and (self.partial[stream] or self.dropped[stream]):
                self._keep(stream, raw)
                self._end_line(stream)
            else:
                self._line(stream, raw, 0)
        self._keep(stream, rest)

    def _keep(self, stream: str, chunk: bytes) -> None:
        """Add to the pending line; past the cap (and a character's last bytes), only count."""
        buf = self.partial[stream]
        room = max(0, LINE_MAX_BYTES + 3 - len(buf))
        buf += chunk[:room]
        self.dropped[stream] += max(0, len(chunk) - room)

    def _end_line(self, stream: str) -> None:
        raw, more = bytes(self.partial[stream]), self.dropped[stream]
        self.partial[stream] = bytearray()
        self.dropped[stream] = 0
        self._line(stream, raw, more)

    def _line(self, stream: str, raw: bytes, more: int) -> None:
        if raw.endswith(b"\r"):
            raw = raw.rstrip(b"\r")
        if more or len(raw) > LINE_MAX_BYTES:
            line = cut_bytes(raw, LINE_MAX_BYTES, more)
        else:
            line = raw.decode("utf-8", "replace")
        if self.frame is None:
            self._take(stream, line, raw, more)
            return
        for own in self.frame.take(stream, line):
            self._take(stream, own, raw if own else b"", more if own else 0)

    def _take(self, stream: str, line: str, raw: bytes, more: int) -> None:
        """One line of the command's own output."""
        if self.pid is None and stream == "stderr" and line.startswith(PID_MARKER):
            value = line[len(PID_MARKER) :].strip()
            self.pid = int(value) if is_digits(value) else None
            return
        tail = (
            line if len(raw) <= TAIL_LINE_MAX_BYTES else cut_bytes(raw, TAIL_LINE_MAX_BYTES, more)
        )
        self.tails[stream].append(tail)
        self.on_line(stream, line)

    def flush(self) -> None:
        """The last line of each stream, when it had no newline."""
        for stream in ("stdout", "stderr"):
            if self.partial[stream] or self.dropped[stream]:
                self._end_line(stream)
        for stream, line in self.frame.flush() if self.frame else ():
            self._take(stream, line, b"", 0)


class SSHTransport:
    """Opens SSHSessions; shares host keys, ssh config and jump-host connections between workers."""

    def __init__(self, opts: SshSettings) -> None:
        library.show_logs(opts.debug)
        self.opts = opts
        self.keys = HostKeyStore()
        # The OpenSSH client config: -F PATH (/dev/null or `none`: no config), else
        # ~/.ssh/config when it exists; Include expanded, every line checked (sshconfig.py).
        # Indexed: paramiko alone tests every Host block per host (N x N for per-node blocks).
        self.config = read_config(opts.ssh_config, environ=opts.environ)
        self._gateways: dict[tuple[str, ...], SSHSession] = {}
        # Reentrant: a hop's gateway is opened while the next hop's is being opened.
        self._gateway_lock = threading.RLock()
        self._local_user = _local_user()
        # Each host's Target as check() resolved it, for connect() to reuse: resolving one is an
        # ssh_config lookup with %-token expansion, ~1 ms of CPU per host done twice otherwise.
        # Keyed by the Host object's id, the object kept beside it (a Host holds a dict: not
        # hashable), so only the very host check() saw gets its target back.
        self._targets: dict[int, tuple[Host, Target]] = {}
        # Private keys loaded once per run instead of once per host (_Client._key_from_filepath).
        self.identities = _IdentityCache()

    def check(self, hosts: Sequence[Host]) -> None:
        """Before connecting anywhere: resolve every host's target and jump hops (so an option
        fleet cannot honour stops the run here) and check every identity file they use."""
        users: dict[str, list[str]] = {}
        known: dict[Path, None] = {}
        hops: dict[tuple[str, ...], None] = {}
        for host in hosts:
            target = self.target(host)
            self._targets[id(host)] = (host, target)
            if _workdir_gone(target):  # not checked here: connecting says why
                continue
            for key in target.key_files:
                users.setdefault(key, []).append(host.name)
            known.update(dict.fromkeys(target.known_hosts))
            self._collect_hops(target.proxy_jump, hops, (host.name,))
        for chain in hops:
            hop = self._hop_target(chain[-1], chain[:-1])
            if _workdir_gone(hop):
                continue
            for key in hop.key_files:
                users.setdefault(key, []).append(hop.name)
            known.update(dict.fromkeys(hop.known_hosts))
        check_key_files(users)
        for path in known:  # read once now: a damaged file is one error, not one per host
            self.keys.load(path)

    def _collect_hops(
        self, chain: tuple[str, ...], seen: dict[tuple[str, ...], None], path: tuple[str, ...]
    ) -> None:
        """Every hop chain `chain` needs, the first hop's own ProxyJump included; `path` is how
        we got here, so a jump host whose own ProxyJump leads back to it is refused now, not
        found by connecting in circles."""
        if not chain:
            return
        if chain[0] in path or len(path) > MAX_JUMPS:
            raise ConfigError(
                f"ProxyJump loop: {' -> '.join((*path, chain[0]))}",
                hint="a jump host's own ProxyJump leads back to it; keep jump hosts out of the "
                "Host patterns that set ProxyJump (e.g. Host * !bastion)",
            )
        for end in range(1, len(chain) + 1):
            prefix = chain[:end]
            if prefix in seen:
                continue
            seen[prefix] = None
            if end == 1:
                first = self._hop_target(prefix[0], ())
                self._collect_hops(first.proxy_jump, seen, (*path, prefix[0]))

    def target(self, host: Host, via: tuple[str, ...] | None = None) -> Target:
        """Merge inventory settings (which win) with the ssh config for this host; `via` is the
        hop chain a ProxyJump hop is reached through (its own proxy settings then do not apply,
        as with OpenSSH's `ssh -J`)."""
        name = host.address
        args = _first_wins(host.ssh_options)
        looked: dict[str, Any] = dict(self.config.lookup(name))
        what = f"host {host.name}" if via is None else f"jump host {host.name}"
        # What ansible_ssh_*_args set, the config does not (ssh's -o wins): only the rest counts.
        unset = {k: v for k, v in looked.items() if k not in args}
        problem = refusal(self.config, name, unset, what)
        if problem is not None:
            raise problem
        cfg = {**args, **unset}
        cfg["identityfile"] = [*args.get("identityfile", []), *looked.get("identityfile", [])]
        address = cfg.get("hostname", host.address) if host.address == host.name else host.address

        def where(key: str) -> Any:
            """file:line of an option, or the inventory's ssh args, for errors only."""
            if key in args:
                return f"host {host.name}: ansible_ssh_*_args"
            return self.config.origin(name, key)

        port = host.port or _port(cfg.get("port", 22), lambda: where("port"))
        user = host.user or cfg.get("user") or self._local_user
        # Relative paths are the command's (as ssh reads them): resolved against its directory
        # here, in the command and in a keeper alike, which has left it (fleet/ssh/workdir.py).
        here = workdir.Resolver()
        keys: list[str] = [here.path(host.key_file)] if host.key_file else []
        keys += [here.path(os.path.expanduser(k)) for k in cfg.get("identityfile", [])]
        known: list[Path] = [SYSTEM_KNOWN_HOSTS]
        known += [_expanded(p) for p in cfg.get("globalknownhostsfile", "").split()]
        user_files = [_expanded(p) for p in cfg.get("userknownhostsfile", "").split()]
        known += list(self.opts.known_hosts) + (user_files or [_expanded(USER_KNOWN_HOSTS)])
        known = [p if p.is_absolute() else Path(here.path(str(p))) for p in known]
        certificates = tuple(here.path(p) for p in _certificate_files(cfg.get("certificatefile")))
        policy = self.opts.host_keys or _policy_from_config(cfg.get("stricthostkeychecking"))
        # --connect-timeout when given, else the ssh config's ConnectTimeout, else the default.
        connect_timeout = self.opts.connect_timeout_s or float(
            cfg.get("connecttimeout", defaults.CONNECT_TIMEOUT_S)
        )
        tokens = {"h": str(address), "n": name, "p": str(port), "r": str(user)}
        # ansible_ssh_*_args' ProxyJump/ProxyCommand win over the config's, as ssh's -o does.
        proxy_args = {k: v for k, v in args.items() if k in ("proxycommand", "proxyjump")}
        proxy_cfg: dict[str, Any] = proxy_args or looked
        command, jump = self._proxy(proxy_cfg, name, tokens, via)
        agent = str(cfg.get("identityagent", "")).lower()
        return Target(
            name=host.name,
            address=str(address),
            port=port,
            user=str(user),
            key_files=tuple(dict.fromkeys(keys)),
            known_hosts=tuple(dict.fromkeys(known)),
            policy=policy,
            proxy_jump=jump,
            connect_timeout_s=connect_timeout,
            proxy_command=command,
            host_key_alias=cfg.get("hostkeyalias"),
            bind_address=cfg.get("bindaddress"),
            address_family=_family(cfg.get("addressfamily"), lambda: where("addressfamily")),
            allow_agent=agent != "none",
            identities_only=str(cfg.get("identitiesonly", "no")).lower() in ("yes", "true"),
            certificate_files=certificates,
            disabled_algorithms=tuple(
                (kind, tuple(names))
                for kind, names in disabled_algorithms(self.config, name, cfg).items()
            ),
            workdir=here.directory(runs_something=command is not None),
        )

    def _proxy(
        self, cfg: dict[str, Any], name: str, tokens: dict[str, str], via: tuple[str, ...] | None
    ) -> tuple[str | None, tuple[str, ...]]:
        """(ProxyCommand, ProxyJump hops). As in OpenSSH, whichever of the two the config sets
        first wins, and `none` means a direct connection; a hop reached through `via` uses it."""
        if via is not None:
            return None, via
        first = next((k for k in cfg if k in ("proxycommand", "proxyjump")), None)
        value = cfg.get(first) if first else None
        if value is None or str(value).strip().lower() == "none":
            return None, ()
        if first == "proxycommand":
            return expand_tokens(str(value), tokens, quote=True), ()
        hops = tuple(h.strip() for h in expand_tokens(str(value), tokens, quote=False).split(","))
        for hop in hops:
            try:
                parse_hop(hop)
            except ValueError as exc:
                origin = self.config.origin(name, "proxyjump")
                raise ConfigError(
                    f"{origin or name}: ProxyJump: {exc}",
                    hint="write ProxyJump [user@]host[:port][,next-hop...]",
                ) from None
        return None, hops

    def connect(self, host: Host, on_attempt: Callable[[int], None] | None = None) -> SSHSession:
        """Connect and authenticate, retrying only handshakes that sshd dropped (MaxStartups)."""
        target = self.target_of(host)
        _need_workdir(target)
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

    def paramiko_hosts(self, hosts: Sequence[Host]) -> int:
        """How many of `hosts` connect through paramiko: here, all of them (NativeTransport
        takes the ones libssh2 suits). The engine sizes its worker processes by it."""
        return len(hosts)

    def target_of(self, host: Host) -> Target:
        """The target check() resolved for this very host, else resolved now."""
        seen = self._targets.get(id(host))
        if seen is not None and seen[0] is host:
            return seen[1]
        return self.target(host)

    def _connect_once(self, target: Target, depth: int = 0) -> SSHSession:
        """One connection attempt; the host key is judged by _HostKeyPolicy, and the key types on
        record for the host are offered first (_Transport), so paramiko negotiates one of them.
        paramiko's own classes, and fleet's subclasses of them, load here, on a first connection
        through paramiko (fleet/ssh/library.py)."""
        from fleet.ssh.classic import _Client, _HostKeyPolicy, _Transport
        from fleet.ssh.proxy import ProxyCommandSocket

        client = _Client(target, self.identities)
        hostname = target.address if target.port == 22 else f"[{target.address}]:{target.port}"
        # HostKeyAlias: the keys recorded under the alias are the ones this host must offer.
        known_name = target.host_key_alias or hostname
        lines = self.keys.lines(target.known_hosts, known_name)
        client.set_missing_host_key_policy(_HostKeyPolicy(self.keys, target, lines))
        gateway = self._gateway(target.proxy_jump, depth + 1) if target.proxy_jump else None
        started = time.monotonic()
        sock: Any = None
        try:
            if gateway is not None:
                gw_transport = gateway.client.get_transport()
                assert gw_transport is not None
                channel = gw_transport.open_channel(
                    "direct-tcpip",
                    (target.address, target.port),
                    ("127.0.0.1", 0),
                    timeout=target.connect_timeout_s,
                )
                sock = TunnelSocket(channel)  # its close never overtakes a send (tunnel.py)
            elif target.proxy_command is not None:
                sock = ProxyCommandSocket(target.proxy_command, target.workdir, self.opts.environ)
            else:
                # paramiko's connect(timeout=...) bounds both the TCP connect and the whole
                # negotiation: with ConnectTimeout (10 s) below the banner timeout (15 s), a
                # node that accepts TCP but sends no banner would be cut at 10 s as "No existing
                # session", a dropped handshake to retry. Connect here with the connect timeout;
                # the banner timeout then applies.
                sock = _open_socket(target)
                _bound_silence(sock)
                started = time.monotonic()  # the banner timeout counts from here
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
                allow_agent=target.allow_agent,
                look_for_keys=not target.key_files,
                passphrase=self.opts.key_passphrase,
                sock=sock,
                disabled_algorithms=dict(target.disabled_algorithms) or None,
                transport_factory=functools.partial(_Transport, lines=lines),
            )
        except BaseException as exc:
            handshake = client.get_transport()
            banner_seen = bool(handshake is not None and handshake.remote_version)
            client.close()
            if sock is not None:
                sock.close()
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            if isinstance(sock, ProxyCommandSocket) and not isinstance(exc, ConnectFailed):
                failed = _proxy_failure(sock)
                if failed is not None:
                    raise failed from None
            raise _classify(
                exc, started, self.opts, target.connect_timeout_s, banner_seen
            ) from None
        client.forget_secrets()
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(KEEPALIVE_S)
            # paramiko's thread reads its socket with a 0.1 s timeout, to look at its handshake
            # deadline and keepalive in between: ten wake-ups a second per connection, the whole
            # CPU of a core for a thousand held ones. The handshake is over; data, EOF and a
            # reset still wake it at once.
            transport.sock.settimeout(QUIET_POLL_S)
        return SSHSession(client, target, gateway)

    def _hop_target(self, spec: str, via: tuple[str, ...]) -> Target:
        """The target of one ProxyJump hop, with its own ssh config (HostName, User, Port,
        IdentityFile, host key checking); reached through `via`, or as its config says when it
        is the first hop."""
        try:
            user, address, port = parse_hop(spec)
        except ValueError as exc:
            raise ConfigError(f"ProxyJump hop '{spec}': {exc}", hint="fix the ProxyJump") from None
        hop = Host(name=address, address=address, port=port, user=user)
        return self.target(hop, via=via or None)

    def _gateway(self, chain: tuple[str, ...], depth: int = 1) -> SSHSession:
        """One shared connection per jump hop (per chain that leads to it), instead of a fresh
        handshake through it per node. Hop N is reached through hop N-1's connection."""
        if depth > MAX_JUMPS:
            raise ConnectFailed(
                "jump host loop", f"more than {MAX_JUMPS} ProxyJump hops through {chain[-1]}"
            )
        with self._gateway_lock:
            session = self._gateways.get(chain)
            transport = session.client.get_transport() if session else None
            if session is not None and transport is not None and transport.is_active():
                return session
            hop = chain[-1]
            try:
                hop_target = self._hop_target(hop, chain[:-1])
                _need_workdir(hop_target)
                session = self._connect_once(hop_target, depth)
            except ConfigError as exc:
                raise ConnectFailed(f"jump host {hop}: bad config", exc.message) from None
            except ConnectFailed as exc:
                if exc.reason.startswith("jump host"):
                    raise
                raise ConnectFailed(
                    f"jump host {hop}: {exc.reason}", exc.detail, exc.retryable
                ) from None
            self._gateways[chain] = session
            return session

    def close(self) -> None:
        """Close shared jump-host connections."""
        with self._gateway_lock:
            for session in self._gateways.values():
                session.close()
            self._gateways.clear()


def _workdir_gone(target: Target) -> bool:
    """The target depends on the command's directory, which is gone (a keeper outlives the
    command that made it)."""
    return target.workdir is not None and not workdir.exists(target.workdir)


def _need_workdir(target: Target) -> None:
    """A target that depends on the command's directory (a relative path, a ProxyCommand run
    there) cannot be connected to once that directory is gone: a keeper outlives the command
    that made it. Said for the host, rather than met as a key file not found, a host key
    unknown (its known_hosts file gone with the directory), a known_hosts file whose directory
    accept-new would make again, or a proxy that cannot start."""
    if _workdir_gone(target):
        assert target.workdir is not None
        raise ConnectFailed(
            "working directory gone",
            f"{workdir.gone(target.workdir)}; this host's relative paths or ProxyCommand need it",
        )


def _bound_silence(sock: socket.socket) -> None:
    """Fail the socket when sent data stays unacknowledged for DEAD_PEER_S (Linux only)."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is not None:
        sock.setsockopt(socket.IPPROTO_TCP, option, int(DEAD_PEER_S * 1000))


def _no_delay(sock: socket.socket) -> None:
    """Send every SSH packet at once (TCP_NODELAY). Neither paramiko nor libssh2 sets it, and
    with Nagle on, a small packet written while an earlier one is unacknowledged waits for the
    node's delayed ACK, up to 40 ms on Linux: on every channel open, exec request and handshake
    step that sends twice before it reads. Measured on one sandbox node: an exec round trip
    44 ms with Nagle, 3 ms without; a 4-node `exec --persist 0 true` 0.26 s, 0.18 s. Each write
    is a whole SSH packet already, so nothing is lost by not coalescing (as asyncssh and OpenSSH
    for interactive sessions do)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _open_socket(target: Target) -> socket.socket:
    """TCP to the target, honouring AddressFamily and BindAddress, within ConnectTimeout."""
    infos = socket.getaddrinfo(
        target.address, target.port, target.address_family, socket.SOCK_STREAM
    )
    error: OSError = OSError(errno.EHOSTUNREACH, "no address")
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(target.connect_timeout_s)
            if target.bind_address:
                sock.bind((target.bind_address, 0))
            sock.connect(address)
            _no_delay(sock)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error


def _proxy_failure(sock: ProxyCommandSocket) -> ConnectFailed | None:
    """A ProxyCommand that exited: say so, with its exit status and last stderr line. A command
    that could not run (126, 127) is not retried; others (e.g. `ssh -W` dropped by the jump
    host's MaxStartups) are, like a dropped handshake."""
    status = sock.exit_status()
    if status is None:
        return None
    return ConnectFailed(
        "proxy command failed",
        f"exit status {status}: {sock.why()}",
        retryable=status not in (126, 127),
    )


def _port(value: Any, origin: Callable[[], Any]) -> int:
    """The ssh config's Port as a number (a bad one is a config error naming the line)."""
    text = str(value).strip()
    if not is_digits(text) or not 1 <= int(text) <= 65535:
        raise ConfigError(
            f"{origin() or 'ssh config'}: Port: expected a number 1-65535", hint="fix the line"
        )
    return int(text)


def _family(value: Any, origin: Callable[[], Any]) -> int:
    """AddressFamily any/inet/inet6 as a socket family."""
    families = {"any": socket.AF_UNSPEC, "inet": socket.AF_INET, "inet6": socket.AF_INET6}
    text = str(value or "any").strip().lower()
    if text not in families:
        raise ConfigError(
            f"{origin() or 'ssh config'}: AddressFamily: expected any, inet or inet6",
            hint="fix the line",
        )
    return families[text]


def _first_wins(options: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """ssh's command-line options as a lookup result: the first value of each wins, and
    IdentityFile accumulates."""
    out: dict[str, Any] = {}
    for key, value in options:
        if key == "identityfile":
            out.setdefault(key, []).append(value)
        else:
            out.setdefault(key, value)
    return out


def _certificate_files(value: Any) -> tuple[str, ...]:
    """CertificateFile (`none`: no file), with ~ expanded."""
    if not value or str(value).strip().lower() == "none":
        return ()
    return (os.path.expanduser(str(value).strip()),)


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
