"""Runs of steps over libssh2 (ssh2-python): the same SSH as transport.py, at a quarter of the CPU.

paramiko handles every packet in Python: a cold `exec true` costs the bastion ~2.2 ms of CPU per
host in paramiko alone (connect, key exchange, auth, one channel), as much as parallel-ssh's whole
run; libssh2 does the same work in C in ~0.6 ms, and releases the GIL while it does
(bench/scale.py). So a run of steps (exec, run, cleanup, launch...: Session.run only, no file
transfer) connects through libssh2 wherever the host's connection needs nothing that libssh2
cannot give with the very same checks, and through paramiko (transport.py) everywhere else:

- Direct TCP only: a ProxyJump or ProxyCommand host goes through paramiko.
- The host key is judged before anything is sent: libssh2 is offered only the plain key
  algorithms of the keys known_hosts lists for the host (no certificates), and the key the node
  shows must be one of them (known_hosts.judge says KNOWN). Any other verdict (unknown, changed,
  revoked, a CA) closes the connection unauthenticated and goes to paramiko's path, which judges
  the key again and refuses, reports or records it (accept-new) exactly as before.
- Authentication by the host's IdentityFiles (the inventory's key first), with the passphrase
  --ask-key-pass took. A host with none, or whose keys are all refused, goes to paramiko's path,
  which also tries the agent and reports why it failed.
- No per-host Ciphers/MACs/KexAlgorithms/HostKeyAlgorithms in ssh_config (paramiko honours
  them). Otherwise OpenSSH's modern algorithms are offered, AEAD ciphers first, strict key
  exchange (the Terrapin guard) included, nothing weaker than paramiko offers.

FLEET_SSH_ENGINE=paramiko (or `ssh_engine: paramiko` in the config) turns this path off.

A session runs steps as SSHSession.run does: the same frame, stdin mark and sudo password line,
the same tails and line caps (transport._Reader), the node-side deadline, the remote kill on cancel
or timeout, and the keepalive check of a node gone silent (any bytes from the node answer it).
One difference is libssh2's: it reports an exit status of 0 both for `exit 0` and for none at all,
so the status is read once the node has closed the channel, or once the command's end frame came
on both streams (the frame exits right after printing it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ssh2 import exceptions as l2
from ssh2.channel import Channel
from ssh2.error_codes import LIBSSH2_ERROR_EAGAIN
from ssh2.session import (
    LIBSSH2_METHOD_CRYPT_CS,
    LIBSSH2_METHOD_CRYPT_SC,
    LIBSSH2_METHOD_HOSTKEY,
    LIBSSH2_METHOD_KEX,
    LIBSSH2_METHOD_MAC_CS,
    LIBSSH2_METHOD_MAC_SC,
    LIBSSH2_SESSION_BLOCK_OUTBOUND,
)
from ssh2.session import Session as L2Session

from fleet.core.frame import Frame, new_token
from fleet.core.hosts import Host
from fleet.core.result import CommandResult
from fleet.core.shell import (
    COMMAND_MAX_BYTES,
    FATAL_STATUSES,
    ONE_ARGUMENT,
    Cmd,
    CommandTooLong,
    check_length,
    framed,
)
from fleet.ssh import known_hosts
from fleet.ssh.failure import ConnectFailed
from fleet.ssh.known_hosts import KnownLine
from fleet.ssh.settings import SshSettings
from fleet.ssh.target import Target
from fleet.ssh.transport import (
    CLOSED_BEFORE,
    DEAD_PEER_S,
    DRAIN_BYTES,
    DRAIN_S,
    HANDSHAKE_S,
    KEEPALIVE_S,
    KILL_WAIT_S,
    POLL_S,
    ExitSignal,
    OnLine,
    SSHSession,
    SSHTransport,
    _bound_silence,
    _classify,
    _client_deadline,
    _finished,
    _kill_for,
    _kill_verdict,
    _open_socket,
    _Reader,
    _stdin_parts,
    _Stop,
    _TailWait,
    _unanswered,
)

T = TypeVar("T")
# What is offered, in order. Key exchange: OpenSSH's classic choices (libssh2 has no post-quantum
# one), then the markers for extension negotiation and strict key exchange (CVE-2023-48795).
KEX = (
    "curve25519-sha256,curve25519-sha256@libssh.org,ecdh-sha2-nistp256,ecdh-sha2-nistp384,"
    "ecdh-sha2-nistp521,diffie-hellman-group-exchange-sha256,diffie-hellman-group16-sha512,"
    "diffie-hellman-group18-sha512,diffie-hellman-group14-sha256,ext-info-c,"
    "kex-strict-c-v00@openssh.com"
)
CIPHERS = (
    "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
    "aes128-ctr,aes192-ctr,aes256-ctr"
)
MACS = "hmac-sha2-256-etm@openssh.com,hmac-sha2-512-etm@openssh.com,hmac-sha2-256,hmac-sha2-512"
READ_BYTES = 65536
# libssh2 sends no packet over 35000 bytes (MAX_SSH_PACKET_LEN): with the exec request's own
# fields, padding and MAC, a framed command of 34725 bytes went, one of 34728 did not.
REQUEST_MAX_BYTES = 34000
CLOSE_WAIT_S = 5.0  # for the node's close of a finished channel, once it sent EOF
DISCONNECT_S = 1.0
KEEPALIVE_SEND_S = 2  # libssh2's smallest interval (1 reads as 2)


SOCKET_ERRORS = (l2.SocketRecvError, l2.SocketSendError, l2.SocketDisconnectError, l2.SocketTimeout)


class Unsuited(Exception):
    """This connection is paramiko's to make (see the module's docstring); says why."""


class _Lost(Exception):
    """The connection failed mid-step: libssh2's words."""


class NativeTransport(SSHTransport):
    """SSHTransport whose runs of steps connect through libssh2 where a host suits it."""

    def __init__(self, opts: SshSettings) -> None:
        super().__init__(opts)
        # Per identity file, read once per run: its bytes (None: unreadable), and whether a
        # KEY-cert.pub lies beside it. Every host that uses it asks, before and at connect.
        self._key_files: dict[str, tuple[bytes | None, bool]] = {}
        self._key_lock = threading.Lock()

    def _connect_once(self, target: Target, depth: int = 0) -> SSHSession:
        if depth == 0 and self._unsuited(target) is None:
            try:
                return self._native(target)  # type: ignore[return-value]
            except Unsuited:
                pass  # paramiko's path judges the host again and says what it finds
        return super()._connect_once(target, depth)

    def paramiko_hosts(self, hosts: Sequence[Host]) -> int:
        """How many of `hosts` go to paramiko for a reason known before connecting (a host
        key not on record is found only then)."""
        return sum(1 for host in hosts if self._unsuited(self.target_of(host)) is not None)

    def _unsuited(self, target: Target) -> str | None:
        if target.proxy_command is not None or target.proxy_jump:
            return "proxy"
        if target.certificate_files or any(self._key_file(p)[1] for p in target.key_files):
            # OpenSSH and paramiko present KEY-cert.pub with its key; libssh2 would not.
            return "certificate"
        if target.disabled_algorithms:
            return "algorithms"
        if not any(self._key_file(p)[0] for p in target.key_files):
            return "no key file"
        return None

    def _key_file(self, path: str) -> tuple[bytes | None, bool]:
        """An identity file's bytes (None when it cannot be read) and whether a certificate
        (KEY-cert.pub) lies beside it, looked at once per run."""
        with self._key_lock:
            if path not in self._key_files:
                try:
                    data: bytes | None = Path(path).read_bytes()
                except OSError:
                    data = None
                self._key_files[path] = (data, os.path.exists(f"{path}-cert.pub"))
            return self._key_files[path]

    def _native(self, target: Target) -> NativeSession:
        hostname = target.address if target.port == 22 else f"[{target.address}]:{target.port}"
        known_name = target.host_key_alias or hostname
        lines = self.keys.lines(target.known_hosts, known_name)
        algorithms = [
            a
            for line in lines
            if not line.marker
            for a in known_hosts.ALGORITHMS.get(line.keytype, ())
        ]
        if not algorithms:
            raise Unsuited("host key not on record")
        started = time.monotonic()
        try:
            sock = _open_socket(target)
        except OSError as exc:
            raise _classify(exc, started, self.opts, target.connect_timeout_s) from None
        io: _IO | None = None
        try:
            session = L2Session()
        except BaseException:
            sock.close()
            raise
        try:
            _bound_silence(sock)
            sock.setblocking(False)
            self._await_banner(sock)
            session.method_pref(LIBSSH2_METHOD_HOSTKEY, ",".join(dict.fromkeys(algorithms)))
            session.method_pref(LIBSSH2_METHOD_KEX, KEX)
            for kind in (LIBSSH2_METHOD_CRYPT_CS, LIBSSH2_METHOD_CRYPT_SC):
                session.method_pref(kind, CIPHERS)
            for kind in (LIBSSH2_METHOD_MAC_CS, LIBSSH2_METHOD_MAC_SC):
                session.method_pref(kind, MACS)
            io = _IO(session, sock)
            self._handshake(io, sock)
            shown = self._judge(session, target, lines)
            self._authenticate(io, target)
        except BaseException as exc:
            import traceback  # a failed connect only

            traceback.clear_frames(exc.__traceback__)
            _hang_up(session, sock)
            session = io = None  # the last references: freed before the socket is closed
            sock.close()
            raise
        return NativeSession(session, sock, target, shown)

    @staticmethod
    def _judge(session: L2Session, target: Target, lines: list[KnownLine]) -> bytes:
        """The node's key, which must be one on record for it; any other verdict is paramiko's."""
        blob = bytes(session.hostkey()[0])
        principal = target.host_key_alias or target.address
        verdict = known_hosts.judge(lines, principal, blob, None)
        if verdict.outcome != known_hosts.KNOWN:
            raise Unsuited(f"host key: {verdict.outcome}")
        return blob

    def _await_banner(self, sock: socket.socket) -> None:
        """sshd speaks first: its banner within --banner-timeout, as paramiko's path asks."""
        if not _readable(sock, self.opts.banner_timeout_s):
            raise ConnectFailed(
                "no SSH banner",
                f"TCP connected but no SSH banner within {self.opts.banner_timeout_s:g}s "
                "(host overloaded or I/O-stalled?)",
            )

    def _handshake(self, io: _IO, sock: socket.socket) -> None:
        started = time.monotonic()
        try:
            io.until(lambda: io.session.handshake(sock), started + HANDSHAKE_S)
        except TimeoutError:
            raise ConnectFailed(
                "handshake timed out",
                f"TCP connected but the SSH handshake did not finish within {HANDSHAKE_S:.0f}s",
            ) from None
        except (l2.SocketDisconnectError, l2.SocketRecvError, l2.BannerRecvError) as exc:
            # sshd drops handshakes past MaxStartups: retried, as on paramiko's path.
            raise ConnectFailed(
                "connection closed during handshake", _words(exc), retryable=True
            ) from None
        except l2.SSH2Error as exc:
            raise Unsuited(f"handshake: {type(exc).__name__}") from None

    def _authenticate(self, io: _IO, target: Target) -> None:
        passphrase = self.opts.key_passphrase or ""
        deadline = time.monotonic() + self.opts.auth_timeout_s
        for path in target.key_files:
            data = self._key_file(path)[0]
            if not data:
                continue
            try:
                io.until(
                    lambda d=data: io.session.userauth_publickey_frommemory(  # type: ignore[misc]
                        target.user, d, passphrase
                    ),
                    deadline,
                )
            except TimeoutError:
                raise ConnectFailed(
                    "authentication timed out",
                    f"no answer to authentication within {self.opts.auth_timeout_s:g}s",
                ) from None
            except (l2.SocketDisconnectError, l2.SocketRecvError, l2.SocketSendError) as exc:
                raise ConnectFailed("connection lost", _words(exc), retryable=True) from None
            except l2.SSH2Error:
                continue  # refused, or a key libssh2 cannot read: the next one
            if io.session.userauth_authenticated():
                return
        raise Unsuited("no key accepted")


# alive()'s recv flags as a plain int: OR-ing the two enum members on each call made a look
# 2.1 us instead of 1.3 (a keeper looks at every held connection twice a second).
_PEEK_NOW = int(socket.MSG_PEEK | socket.MSG_DONTWAIT)


def _readable(sock: socket.socket, timeout_s: float, *, writing: bool = False) -> bool:
    """Wait up to `timeout_s` for the socket to be readable (or writable, with `writing`); True
    when it is readable (data, EOF or an error to read). poll(), not select(): a keeper holding a
    thousand connections has descriptors past select()'s 1,024."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | (select.POLLOUT if writing else 0))
    events = poller.poll(max(0, int(timeout_s * 1000)))
    return any(ev & (select.POLLIN | select.POLLHUP | select.POLLERR) for _, ev in events)


def _send_keepalive(session: L2Session) -> None:
    """A keepalive that asks for a reply. The interval is on only for this one send: with one
    set, libssh2 waits no longer than it in a blocking call, so every deadline of _IO.until
    ended after 2 s of silence."""
    session.keepalive_config(True, KEEPALIVE_SEND_S)
    try:
        session.keepalive_send()
    finally:
        session.keepalive_config(True, 0)


def _words(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _hang_up(session: L2Session, sock: socket.socket) -> None:
    """End a session politely if it can be done at once (one non-blocking try), then shut the
    socket down. Its owner closes it only once the session is freed: libssh2 frees a session's
    channels with the session, and must never use a descriptor number that the process has
    given to something else meanwhile."""
    with contextlib.suppress(l2.SSH2Error, OSError):
        session.set_blocking(False)
        session.disconnect()
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _IO:
    """libssh2 calls on one session: whole operations (handshake, auth, open, exec, write,
    close) as one blocking call bounded by a deadline; reads non-blocking (the run loop waits on
    the socket itself, to look at cancel, deadline and liveness in between).

    One blocking call, rather than a non-blocking one repeated on EAGAIN, releases Python's lock
    once for the whole operation: with 64 hosts at once, every release wakes another thread,
    and the repeated calls cost ~300 futex calls per host (strace -c), a third of the client's
    CPU per host."""

    def __init__(self, session: L2Session, sock: socket.socket) -> None:
        self.session = session
        self.sock = sock
        self.blocking = True  # libssh2's mode: switched only when it must change (a call each)
        session.set_blocking(True)

    def nonblocking(self) -> None:
        """For reads: they return EAGAIN instead of waiting."""
        if self.blocking:
            self.session.set_blocking(False)
            self.blocking = False

    def wait(self, timeout_s: float) -> bool:
        """Wait for the socket (readable, or writable when libssh2 is blocked on sending);
        True when there is something to read: the node said something."""
        writing = bool(self.session.block_directions() & LIBSSH2_SESSION_BLOCK_OUTBOUND)
        return _readable(self.sock, timeout_s, writing=writing)

    def until(self, call: Callable[[], T], deadline: float) -> T:
        """call() in blocking mode, within `deadline`; TimeoutError past it."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        self.session.set_timeout(max(1, int(remaining * 1000)))
        if not self.blocking:
            self.session.set_blocking(True)
            self.blocking = True
        try:
            result = call()
        except l2.Timeout:
            raise TimeoutError from None
        if result == LIBSSH2_ERROR_EAGAIN:  # not in blocking mode; a timeout, as a code
            raise TimeoutError
        return result


class NativeSession:
    """One authenticated libssh2 connection to one host: SSHSession's run() and close()."""

    connection = None  # not a warm connection (fleet/ssh/warm.py)
    engine = "libssh2"
    gateway = None  # direct connections only
    # libssh2 sessions are not thread-safe: one command at a time (keeper.Pool hands an in-use
    # one to nobody else); close() from another thread leaves the freeing to the command's.
    shared = False

    def __init__(
        self, session: L2Session, sock: socket.socket, target: Target, host_key: bytes
    ) -> None:
        self.session = session
        self.sock = sock
        self.target = target
        self.io = _IO(session, sock)
        self.heard = time.monotonic()
        self.asked: float | None = None
        self.shown = host_key
        self.lock = threading.RLock()
        self.closed = False

    def alive(self) -> bool:
        """Not closed, and the node has not closed its end (a look at the socket only: safe
        from any thread, with a command running)."""
        if self.closed:
            return False
        try:  # one peek that never blocks: nothing to read (alive), bytes (alive), or EOF
            return self.sock.recv(1, _PEEK_NOW) != b""
        except BlockingIOError:
            return True
        except (OSError, ValueError):
            return False

    def host_key(self) -> tuple[bytes, bytes | None] | None:
        """The host key this connection was made with (libssh2 was offered no certificates)."""
        return None if self.closed else (self.shown, None)

    def run(
        self, cmd: Cmd, on_line: OnLine, cancel: threading.Event, sudo_password: str | None = None
    ) -> CommandResult:
        """Run one wrapped command, streaming lines; enforce its deadline and honour cancel."""
        self.lock.acquire()
        try:
            if not self.alive():
                raise ConnectFailed("connection lost", CLOSED_BEFORE)
            return self._guarded(cmd, on_line, cancel, sudo_password)
        finally:
            self._leave()

    def _leave(self) -> None:
        """Release the lock; a close() that came meanwhile (and could not take the lock) left
        the freeing to whoever holds it, so it is done here, also when close() came just after
        a look at `closed` and before the release."""
        while True:
            if self.closed:
                self._free()
            self.lock.release()
            if not self.closed or self.session is None or not self.lock.acquire(blocking=False):
                return

    def _guarded(
        self, cmd: Cmd, on_line: OnLine, cancel: threading.Event, sudo_password: str | None
    ) -> CommandResult:
        try:
            return self._run(cmd, on_line, cancel, sudo_password)
        except BaseException as exc:
            # The channel is referenced from the traceback's frames: dropped here, under the
            # lock, not wherever the caller lets the exception go.
            import traceback  # a failed command only

            traceback.clear_frames(exc.__traceback__)
            failed = _failure(exc)
            if failed is exc:
                raise
            raise failed from None

    def _open(self, timeout_s: float) -> Channel:
        try:
            return self.io.until(self.session.open_session, time.monotonic() + timeout_s)
        except TimeoutError:
            raise _Lost("Timeout opening channel.") from None

    def _run(
        self, cmd: Cmd, on_line: OnLine, cancel: threading.Event, sudo_password: str | None
    ) -> CommandResult:
        started = time.monotonic()
        frame = Frame(new_token())
        try:
            channel = self._start(
                cmd, sudo_password, frame, self.target.connect_timeout_s, own=True
            )
        except CommandTooLong as exc:
            return CommandResult(exit_code=None, broken=str(exc))
        try:
            return self._follow(channel, frame, started, cmd, on_line, cancel, sudo_password)
        finally:
            self._discard(channel)

    def _discard(self, channel: Channel) -> None:
        """A step's channel is done with: closed if it is not yet, without waiting, so that
        libssh2 frees it at once here (under the session's lock) on every path."""
        self.io.nonblocking()
        with contextlib.suppress(l2.SSH2Error, OSError):
            channel.close()

    def _follow(
        self,
        channel: Channel,
        frame: Frame,
        started: float,
        cmd: Cmd,
        on_line: OnLine,
        cancel: threading.Event,
        sudo_password: str | None,
    ) -> CommandResult:
        """Read the started command to its end, cancel or deadline."""
        reader = _Reader(on_line, frame)
        deadline = _client_deadline(started, cmd)
        cancelled = timed_out = False
        stop: _Stop | None = None
        tail = _TailWait()
        self.heard, self.asked = started, None
        while True:
            got = self._drain(channel, reader)
            if channel.eof():
                while self._drain(channel, reader):
                    pass  # what came before the EOF: bounded by it
                break
            if self._status_ready(channel, frame) and tail.over(got, time.monotonic(), frame):
                break
            if cancel.is_set():
                cancelled = True
                stop = self._stop_remote(self._await_pid(channel, reader), cmd, sudo_password)
                self._read_last_words(channel, reader)
                break
            if deadline is not None and time.monotonic() > deadline:
                timed_out = True
                stop = self._stop_remote(self._await_pid(channel, reader), cmd, sudo_password)
                if not stop.delivered:
                    raise _unanswered(deadline - started, cmd)
                break
            self._check_alive()
            if not got:
                self._listen(POLL_S)
        reader.flush()
        exit_code: int | None = None
        died_of: ExitSignal | None = None
        if not (cancelled or timed_out):
            exit_code, died_of = self._exit_of(channel, frame)
        else:
            self._close(channel, wait=False)
        return _finished(
            reader, frame, cmd, started, (exit_code, died_of), cancelled, timed_out, stop
        )

    def _listen(self, timeout_s: float) -> None:
        if self.io.wait(timeout_s):
            self.heard, self.asked = time.monotonic(), None

    def _check_alive(self) -> None:
        """The keepalive check (transport.KEEPALIVE_S): after KEEPALIVE_S of silence ask the node
        for a reply; any bytes from it answer. None within DEAD_PEER_S: it is gone."""
        now = time.monotonic()
        if self.asked is not None:
            if now - self.asked > DEAD_PEER_S:
                raise ConnectFailed(
                    "connection lost",
                    f"the node went away while a step ran: silent for {KEEPALIVE_S}s, then no "
                    f"answer to a keepalive for {DEAD_PEER_S}s",
                )
        elif now - self.heard >= KEEPALIVE_S:
            self.asked = now
            self.io.nonblocking()
            _send_keepalive(self.session)

    def _start(
        self, cmd: Cmd, sudo_password: str | None, frame: Frame, timeout_s: float, *, own: bool
    ) -> Channel:
        """Open a session channel, start the framed command and send all of its stdin. `own`:
        the step's own command (not the kill of one), which a connection found dead before
        anything was sent may run on a fresh connection instead (keeper: CLOSED_BEFORE)."""
        mark = cmd.stdin is not None or (cmd.sudo and sudo_password is not None)
        command = framed(cmd.command, frame.token, helper=cmd.helper, stdin_mark=mark)
        check_length(command, COMMAND_MAX_BYTES, ONE_ARGUMENT)
        check_length(
            command,
            REQUEST_MAX_BYTES,
            f"libssh2 sends at most {{limit}} in one request (--ssh-engine paramiko: "
            f"{COMMAND_MAX_BYTES})",
        )
        try:
            channel = self._open(timeout_s)
        except (*SOCKET_ERRORS, OSError):
            if not own:
                raise
            raise ConnectFailed("connection lost", CLOSED_BEFORE) from None
        self.io.until(lambda: channel.execute(command), time.monotonic() + timeout_s)
        self._send_stdin(channel, cmd.sudo, sudo_password, cmd.stdin, frame.token if mark else None)
        return channel

    def _send_stdin(
        self,
        channel: Channel,
        sudo: bool,
        sudo_password: str | None,
        text: str | None,
        token: str | None,
    ) -> None:
        """As SSHSession._send_stdin: the mark, the password line, the stdin, then EOF. A command
        that ended before reading it all closed its channel: that is its outcome, not a lost
        connection (a lost one fails the reads that follow)."""
        try:
            self._write_all(channel, b"".join(_stdin_parts(sudo, sudo_password, text, token)))
            self.io.until(channel.send_eof, _write_deadline())
        except (l2.ChannelClosedError, l2.ChannelEOFSentError, l2.ChannelUnknownError):
            pass

    def _write_all(self, channel: Channel, data: bytes) -> None:
        view = memoryview(data)
        deadline = _write_deadline()
        while view:
            chunk = bytes(view[:READ_BYTES])
            _, written = self.io.until(functools.partial(_write, channel, chunk), deadline)
            view = view[written:]

    def _drain(self, channel: Channel, reader: _Reader) -> bool:
        """Read what both streams have, DRAIN_BYTES of each or DRAIN_S at most (a chunk of each
        stream at least: the run loop's checks come between passes); True if there was
        anything."""
        self.io.nonblocking()
        got = False
        until = time.monotonic() + DRAIN_S
        for stream, read in (("stdout", channel.read), ("stderr", channel.read_stderr)):
            budget = DRAIN_BYTES
            while budget > 0:
                size, data = read(READ_BYTES)
                if size <= 0:
                    break
                reader.feed(stream, data)
                budget -= size
                got = True
                if time.monotonic() > until:
                    break
        if got:
            self.heard, self.asked = time.monotonic(), None
        return got

    @staticmethod
    def _status_ready(channel: Channel, frame: Frame) -> bool:
        """Has the command ended? Its end frame on both streams, or a status libssh2 can tell
        from none (non-zero)."""
        return frame.ended or bool(channel.get_exit_status())

    def _exit_of(self, channel: Channel, frame: Frame) -> tuple[int, ExitSignal | None]:
        """The finished command's exit status, or the signal it died of (as 128+N).

        From the frame's end line (shell.framed prints the status there): ssh2-python never
        passes libssh2's exit-signal on, so a command killed by a signal would read as exit 0.
        Without that line (the frame itself was killed, or never ran) libssh2's status, whose 0
        may mean none: the frame's own problem() then says the output is not whole. A non-zero
        status from libssh2 is sshd's own word, as paramiko's engine takes it: it wins over the
        frame's line, which the command itself could have printed (Frame.status)."""
        self._close(channel, wait=channel.eof())
        told = int(channel.get_exit_status())
        status = frame.status
        if status is None or told:
            return told, None
        if status > 128 and re.fullmatch(FATAL_STATUSES, str(status)):
            # The frame dies of the step's signal (so sshd would report it): say it as such.
            # libssh2 keeps no core-dumped flag for it.
            try:
                name = signal.Signals(status - 128).name.removeprefix("SIG")
            except ValueError:
                return status, None
            return status, ExitSignal(name, False)
        return status, None

    def _close(self, channel: Channel, *, wait: bool) -> None:
        """Close a channel; `wait`: until the node's close (its exit status comes before it)."""
        deadline = time.monotonic() + CLOSE_WAIT_S
        try:
            self.io.until(channel.close, deadline)
            if wait:
                self.io.until(channel.wait_closed, deadline)
        except TimeoutError:
            if wait:
                raise _Lost("the node did not close a finished channel") from None
        except (l2.ChannelClosedError, l2.ChannelEOFSentError):
            pass

    def _await_pid(self, channel: Channel, reader: _Reader, wait_s: float = 3.0) -> int | None:
        deadline = time.monotonic() + wait_s
        while reader.pid is None and time.monotonic() < deadline and not channel.eof():
            if not self._drain(channel, reader):
                self._listen(POLL_S)
        return reader.pid

    def _stop_remote(self, pid: int | None, cmd: Cmd, sudo_password: str | None) -> _Stop:
        """As SSHSession._stop_remote: kill what the step started, with its own privileges."""
        if pid is None:
            return _Stop(False, "the step's pid never arrived, so nothing could be signalled")
        kill, password = _kill_for(pid, cmd, sudo_password)
        frame = Frame(new_token())
        reader = _Reader(lambda stream, line: None, frame)
        channel: Channel | None = None
        try:
            channel = self._start(kill, password, frame, 5.0, own=False)
            until = time.monotonic() + KILL_WAIT_S
            while not channel.eof() and time.monotonic() < until:
                if not self._drain(channel, reader):
                    self._listen(POLL_S)
            self._drain(channel, reader)
            reader.flush()
            done = channel.eof()
            status = self._exit_of(channel, frame)[0] if done else None
        except (l2.SSH2Error, OSError, _Lost, ConnectFailed) as exc:
            return _Stop(False, f"the kill could not be sent: {_words(exc)}")
        finally:
            if channel is not None:
                self._discard(channel)
        if not done:
            return _Stop(False, f"the kill did not finish within {KILL_WAIT_S:g}s")
        return _kill_verdict(frame, reader, status)

    def _read_last_words(self, channel: Channel, reader: _Reader) -> None:
        until = time.monotonic() + 1.0
        while not channel.eof() and time.monotonic() < until:
            if not self._drain(channel, reader):
                self._listen(POLL_S)
        self._drain(channel, reader)

    def close(self) -> None:
        """End the connection. A command running on it in another thread fails at once (its
        socket is shut down), and that thread frees libssh2 when it is out of it: close() never
        waits for it, nor frees anything under it."""
        self.closed = True
        if not self.lock.acquire(blocking=False):
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            return
        try:
            self._free()
        finally:
            self.lock.release()

    def _free(self) -> None:
        """Under the lock: the session freed, then the socket closed (once)."""
        session, self.session = self.session, None
        if session is None:
            return
        self.io.session = None
        _hang_up(session, self.sock)
        del session  # the last reference: libssh2 frees it now, before the socket is closed
        self.sock.close()


def _failure(exc: BaseException) -> BaseException:
    """What a step's libssh2 error says to the operator (other exceptions as they are)."""
    if isinstance(exc, l2.ChannelFailure):
        return ConnectFailed("channel refused", f"sshd refused a session: {_words(exc)}")
    if isinstance(exc, (*SOCKET_ERRORS, OSError)) and not isinstance(exc, TimeoutError):
        return ConnectFailed(
            "connection lost",
            f"the node went away while a step ran: the connection closed ({_words(exc)})",
        )
    if isinstance(exc, TimeoutError):
        return ConnectFailed(
            "connection lost", "the SSH connection failed: the node stopped answering a request"
        )
    if isinstance(exc, (l2.SSH2Error, _Lost)):
        return ConnectFailed("connection lost", f"the SSH connection failed: {_words(exc)}")
    return exc


def _write(channel: Channel, chunk: bytes) -> Any:
    """channel.write's (rc, written) as until() wants it: EAGAIN alone when nothing went."""
    rc, written = channel.write(chunk)
    return LIBSSH2_ERROR_EAGAIN if rc == LIBSSH2_ERROR_EAGAIN and not written else (rc, written)


def _write_deadline() -> float:
    """A deadline for writes: the node's window opens as it reads; a dead node fails the socket
    (TCP_USER_TIMEOUT) and libssh2 with it."""
    return time.monotonic() + DEAD_PEER_S + KEEPALIVE_S
