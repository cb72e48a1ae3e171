"""The keeper: a detached process that holds fleet's SSH connections between commands.

`python -m fleet.ssh.keeper SOCKET`, started by a fleet command (fleet/ssh/warm.py) in its own
session, stdio on /dev/null. It serves a unix socket (0600, in the checked 0700 directory of
fleet/ssh/rundir.py) and drops any peer whose uid (SO_PEERCRED) is not its own. Clients ask it
to connect to hosts (it connects with fleet/ssh/transport.py, every check of a cold connection
made) or to reuse a live connection made with the same parameters, then to run commands on it
(SSHSession.run: framing, deadlines, the remote kill on cancel), and it streams the lines and the
result back. A connection idle for the longest window its commands asked for is closed, as is
one whose node went away; the keeper exits when it holds none.

A keeper leaves the command's working directory as it becomes one (fleet/ssh/workdir.py), and
resolves what the commands it serves name relative to it against that directory's name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import queue
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.core.errors import FleetError
from fleet.core.hosts import Host
from fleet.ssh import known_hosts, rundir, wire, workdir
from fleet.ssh.failure import ConnectFailed
from fleet.ssh.native import NativeTransport
from fleet.ssh.settings import SshSettings
from fleet.ssh.target import Target
from fleet.ssh.transport import CLOSED_BEFORE, SSHSession, SSHTransport

TICK_S = 0.5  # how often idle, dead and expired connections are looked for
# A keeper with nothing to hold waits this long for the client that started it to connect.
EMPTY_GRACE_S = 10.0
LISTEN_BACKLOG = 256


@dataclass
class Entry:
    """One held connection."""

    key: str
    session: SSHSession
    host: str
    made: float = field(default_factory=time.monotonic)
    used: float = field(default_factory=time.monotonic)
    until: float = 0.0  # closes once idle past this (monotonic)
    users: int = 0
    pooled: bool = True  # False: a duplicate made by a concurrent command, closed on release

    def alive(self) -> bool:
        return self.session.alive()


TARGET_FIELDS = tuple(f.name for f in dataclasses.fields(Target))


def _text(value: Any) -> str:
    """A field of a Target as text for its key: a tuple as the repr of its items' texts (one
    reading only, whatever commas or quotes a path holds), anything else as str. Not str() of
    a tuple of paths: that is each Path's repr, ~4 us a host per command."""
    if isinstance(value, tuple):
        return repr(tuple(_text(item) for item in value))
    return value if isinstance(value, str) else str(value)


def _target_text(target: Target) -> str:
    # Field by field, in the class's order: dataclasses.asdict deep-copies every value, a cost
    # paid per host per command.
    return repr(tuple(_text(getattr(target, name)) for name in TARGET_FIELDS))


def _stat_mark(path: str) -> list[Any]:
    """A file as (inode, size, mtime): an identity file replaced or edited changes it."""
    try:
        info = os.stat(os.path.expanduser(path))
    except OSError:
        return [path, None]
    return [path, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns]


def connection_key(
    transport: SSHTransport, target: Target, marks: dict[str, list[Any]] | None = None
) -> str:
    """Everything that decides a connection, hashed: the resolved target (address, port, user,
    identities, known_hosts files, host key policy, proxy, algorithms, ...), each ProxyJump hop
    as resolved now, and the identity and certificate files as they are on disk now. `marks`:
    the files' marks already taken for this command (a fleet's hosts share a few key files)."""
    targets = [target]
    chain = target.proxy_jump
    for end in range(1, len(chain) + 1):
        targets.append(transport._hop_target(chain[end - 1], chain[: end - 1]))
    seen = {} if marks is None else marks

    def mark(path: str) -> list[Any]:
        got = seen.get(path)
        if got is None:
            got = seen[path] = _stat_mark(path)
        return got

    files = [
        mark(path) for t in targets for key in t.key_files for path in (key, f"{key}-cert.pub")
    ]
    files += [mark(path) for t in targets for path in t.certificate_files]
    # The library too: a command that asked for paramiko gets no libssh2 connection.
    engine = transport.opts.engine
    text = repr(([_target_text(t) for t in targets], files, engine))
    return hashlib.sha256(text.encode()).hexdigest()


def still_trusted(transport: SSHTransport, session: SSHSession) -> bool:
    """The host key each connection of the chain was made with, judged again against the
    known_hosts files as they read now: a line removed, changed or revoked since then means the
    connection is not reused (a fresh one is made, and checked)."""
    current: SSHSession | None = session
    while current is not None:
        target = current.target
        shown = current.host_key()
        if shown is None:
            return False
        hostname = target.address if target.port == 22 else f"[{target.address}]:{target.port}"
        lines = transport.keys.lines(target.known_hosts, target.host_key_alias or hostname)
        principal = target.host_key_alias or target.address
        verdict = known_hosts.judge(lines, principal, *shown)
        if verdict.outcome != known_hosts.KNOWN:
            return False
        current = current.gateway
    return True


class Pool:
    """The held connections by key; every change under one lock, closes outside it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[str, Entry] = {}
        self.gateways: list[SSHSession] = []  # jump-host connections of finished clients

    def take(self, key: str, trusted: Callable[[SSHSession], bool]) -> tuple[Entry | None, bool]:
        """(a live, trusted connection for `key` now in use, whether a stale one was dropped)."""
        with self.lock:
            entry = self.entries.get(key)
        if entry is None:
            return None, False
        if entry.users and not entry.session.shared:
            return None, False  # a libssh2 session runs one command at a time: a fresh one
        if entry.alive() and trusted(entry.session):
            with self.lock:
                if self.entries.get(key) is entry and entry.alive():
                    if entry.users and not entry.session.shared:
                        # Another command took it meanwhile (the checks above ran outside
                        # the lock): it is in use, not stale. A fresh one, and it is left be.
                        return None, False
                    entry.users += 1
                    entry.used = time.monotonic()
                    return entry, False
        self.drop(entry)
        return None, True

    def put(self, key: str, session: SSHSession, host: str) -> Entry:
        """A fresh connection, in use; pooled unless a live one for `key` is there already."""
        entry = Entry(key=key, session=session, host=host, users=1)
        with self.lock:
            held = self.entries.get(key)
            if held is not None and held.alive():
                entry.pooled = False
            else:
                self.entries[key] = entry
        if held is not None and entry.pooled:
            self.drop(held)
        return entry

    def release(self, entry: Entry, window_s: float) -> None:
        """A command is done with it: idle from now, closed after the window (the longest of
        its commands' windows wins)."""
        now = time.monotonic()
        with self.lock:
            entry.users = max(0, entry.users - 1)
            entry.used = now
            entry.until = max(entry.until, now + window_s)
            close = not entry.pooled and entry.users == 0
        if close:
            _close(entry.session)

    def drop(self, entry: Entry) -> None:
        with self.lock:
            if self.entries.get(entry.key) is entry:
                del self.entries[entry.key]
        _close(entry.session)

    def reap(self, idle_too: bool = False) -> None:
        """Close what is dead, and what has been idle past its window (`idle_too`: every idle
        one: nobody can reach it any more)."""
        now = time.monotonic()
        with self.lock:  # chosen and removed at once: take() cannot hand one out between
            gone = [
                e
                for e in self.entries.values()
                if not e.alive() or (e.users == 0 and (idle_too or now >= e.until))
            ]
            for entry in gone:
                del self.entries[entry.key]
        for entry in gone:
            _close(entry.session)
        self._close_unused_gateways()

    def _close_unused_gateways(self) -> None:
        with self.lock:
            used = set()
            for entry in self.entries.values():
                hop = entry.session.gateway
                while hop is not None:
                    used.add(id(hop))
                    hop = hop.gateway
            unused = [g for g in self.gateways if id(g) not in used]
            self.gateways = [g for g in self.gateways if id(g) in used]
        for gateway in unused:
            _close(gateway)

    def disconnect(self, names: set[str] | None) -> list[str]:
        """Close the connections to `names` (all when None), in use or not."""
        with self.lock:
            chosen = [e for e in self.entries.values() if names is None or e.host in names]
            for entry in chosen:
                del self.entries[entry.key]
        for entry in chosen:
            _close(entry.session)
        self._close_unused_gateways()
        return sorted(e.host for e in chosen)

    def status(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        with self.lock:
            entries = list(self.entries.values())
        return [
            {
                "host": e.host,
                "address": e.session.target.address,
                "port": e.session.target.port,
                "user": e.session.target.user,
                "age_s": round(now - e.made, 3),
                "idle_s": 0.0 if e.users else round(now - e.used, 3),
                "in_use": e.users,
                "closes_in_s": None if e.users else round(max(0.0, e.until - now), 3),
            }
            for e in sorted(entries, key=lambda e: e.host)
        ]

    def empty(self) -> bool:
        with self.lock:
            return not self.entries


def transport_of(opts: SshSettings) -> SSHTransport:
    """The transport a keeper's connections are made with: paramiko's when the command asked
    for it, else libssh2's (which hands hosts it cannot serve to paramiko)."""
    return SSHTransport(opts) if opts.engine == "paramiko" else NativeTransport(opts)


def _close(session: SSHSession) -> None:
    with contextlib.suppress(Exception):
        session.close()


@dataclass
class Held:
    """A connection one client holds: the entry, the host, how it was had."""

    entry: Entry
    host: tuple[Any, str]  # the Host and its connection key, as Client._resolve gave them
    how: str
    ran: bool = False


class Client:
    """One fleet command on the socket: its settings, the connections it holds, its runs."""

    def __init__(self, keeper: Keeper, sock: socket.socket) -> None:
        self.keeper = keeper
        self.sock = sock
        self.write_lock = threading.Lock()
        self.transport: SSHTransport | None = None
        self.window_s = 0.0
        self.held: dict[int, Held] = {}
        self.runs: dict[int, threading.Event] = {}
        # Each host of the hello, in its order (a request names one by its index): the Host
        # and its connection key (from its Target as check() resolved it), worked out once per
        # command instead of once per request (a Target is an ssh_config lookup with %-token
        # expansion; a key stats identity files).
        self.hosts: list[tuple[Any, str]] = []
        self.lock = threading.Lock()
        self.gone = threading.Event()

    def send(self, message: dict[str, Any]) -> None:
        """Never raises: a client that went away is noted, its runs cancelled."""
        data = wire.encode(message)
        try:
            with self.write_lock:
                self.sock.sendall(data)
        except OSError:
            self._lost()

    def serve(self) -> None:
        reader = wire.LineReader(self.sock)
        try:
            while True:
                message = reader.next()
                if message is None:
                    break
                self.handle(message)
        except (OSError, wire.WireError, KeyError, ValueError, TypeError):
            pass  # gone, or not speaking the protocol: dropped
        finally:
            self._lost()
            self._release_all()
            with contextlib.suppress(OSError):
                self.sock.close()

    def _lost(self) -> None:
        """The client is gone: its runs are cancelled (stopped on their nodes)."""
        self.gone.set()
        with self.lock:
            cancels = list(self.runs.values())
        for cancel in cancels:
            cancel.set()

    def _release_all(self) -> None:
        with self.lock:
            held = list(self.held.values())
            self.held.clear()
        for h in held:
            self.keeper.pool.release(h.entry, self.window_s)
        if self.transport is not None:
            with self.keeper.pool.lock:
                self.keeper.pool.gateways.extend(self.transport._gateways.values())

    def handle(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        rid = int(message.get("id", 0))
        if op == "hello":
            self._hello(rid, message)
        elif op == "connect":
            if not self._connect_warm(rid, message):
                self._spawn(self._connect, rid, message)
        elif op == "run":
            cancel = threading.Event()
            with self.lock:
                self.runs[rid] = cancel
            self._spawn(self._run, rid, message)
        elif op == "cancel":
            with self.lock:
                target = self.runs.get(int(message.get("run", -1)))
            if target is not None:
                target.set()
        elif op == "close":
            with self.lock:
                held = self.held.pop(int(message.get("session", -1)), None)
            if held is not None:
                self.keeper.pool.release(held.entry, self.window_s)
        elif op == "ping":  # a command's check that we still answer (warm.Link._watch)
            self.send({"id": rid, "pong": True})
        elif op == "status":
            self.send({"id": rid, "status": self.keeper.status()})
        elif op == "disconnect":
            names = message.get("hosts")
            closed = self.keeper.pool.disconnect(set(names) if names is not None else None)
            self.send({"id": rid, "closed": closed, "pid": os.getpid()})
            self.keeper.wake.set()

    def _spawn(
        self, work: Callable[[int, dict[str, Any]], None], rid: int, msg: dict[str, Any]
    ) -> None:
        self.keeper.threads.submit(work, rid, msg)

    def _hello(self, rid: int, message: dict[str, Any]) -> None:
        """The command's SSH settings and secrets; the ssh config is read afresh for it, and its
        hosts are checked as a cold run checks them (refusals, identity files, known_hosts)."""
        try:
            wire.settings_from_wire(message["settings"], None)
        except (KeyError, ValueError, TypeError):
            self.send({"id": rid, "error": "a hello without usable settings"})
            return
        try:
            opts = wire.settings_from_wire(message["settings"], message.get("key_passphrase"))
            opts = dataclasses.replace(opts, environ=wire.environ_from_wire(message.get("env")))
            self.window_s = max(0.0, float(message.get("persist_s", 0.0)))
            self.transport = transport_of(opts)
            given = list(message.get("hosts", ()))
            hosts = [wire.host_from_wire(h) for h in given]
            self.transport.check(hosts)
            marks: dict[str, list[Any]] = {}
            self.hosts = [
                (host, connection_key(self.transport, self.transport.target_of(host), marks))
                for host in hosts
            ]
        except FleetError as exc:
            self.send({"id": rid, "error": exc.message, "hint": exc.hint})
            return
        except Exception as exc:  # a keeper's own bug: said, not a silent hang-up
            self.send(
                {
                    "id": rid,
                    "error": f"the keeper of warm connections failed: {type(exc).__name__}: {exc}",
                    "hint": "pass --persist 0 to connect afresh",
                }
            )
            return
        self.send({"id": rid, "ok": True, "pid": os.getpid()})

    def _resolve(self, message: dict[str, Any]) -> tuple[Any, str]:
        """(the Host, its connection key) of a connect request's host: the hello's host it names
        by index (`h`), else the host it carries, resolved now (FleetError when its target is
        bad)."""
        transport = self.transport
        if transport is None:
            raise ConnectFailed("ssh error", "connect before hello")
        index = message.get("h")
        if index is not None:
            if type(index) is not int or not 0 <= index < len(self.hosts):  # not a bool either
                raise ConnectFailed("ssh error", f"no host {index!r} in the hello")
            return self.hosts[index]
        host = wire.host_from_wire(message["host"])
        return host, connection_key(transport, transport.target_of(host))

    def _connect(self, rid: int, message: dict[str, Any]) -> None:
        try:
            host = self._resolve(message)
            entry, how = self._have(host, rid, bool(message.get("stale")))
        except ConnectFailed as exc:
            self.send({"id": rid, "failed": exc.reason, "detail": exc.detail})
            return
        except FleetError as exc:
            self.send({"id": rid, "failed": "bad config", "detail": exc.message})
            return
        except Exception as exc:
            self.send({"id": rid, "failed": "ssh error", "detail": f"{type(exc).__name__}: {exc}"})
            return
        if not self._hold(rid, Held(entry, host, how)):
            return
        self.send({"id": rid, "connected": how, "ssh": entry.session.engine})

    def _hold(self, rid: int, held: Held) -> bool:
        """Note a connection as this command's; False, and it is released at once (idle for
        the window), when the command went away while it was being made: _release_all has
        released what it held, and nobody would release this one (in use forever, the keeper
        kept up for good)."""
        with self.lock:
            gone = self.gone.is_set()
            if not gone:
                self.held[rid] = held
        if gone:
            self.keeper.pool.release(held.entry, self.window_s)
        return not gone

    def _connect_warm(self, rid: int, message: dict[str, Any]) -> bool:
        """A warm connection handed out at once, in the reader's thread (no thread per host:
        it needs no network); False when the host needs a fresh one (or its target is bad)."""
        transport = self.transport
        if transport is None:
            return False
        try:
            host = self._resolve(message)
        except (FleetError, ConnectFailed, KeyError, ValueError, TypeError):
            return False  # said by _connect, in the words a cold run uses
        entry, stale = self.keeper.pool.take(host[1], lambda s: still_trusted(transport, s))
        if entry is None:
            message["stale"] = stale  # dropped just now: the fresh one is said to be stale
            return False
        with self.lock:
            self.held[rid] = Held(entry, host, "warm")
        self.send({"id": rid, "connected": "warm", "ssh": entry.session.engine})
        return True

    def _have(
        self,
        resolved: tuple[Any, str],
        rid: int,
        stale_before: bool = False,
        *,
        for_run: bool = False,
    ) -> tuple[Entry, str]:
        """A connection to the host `resolved` names (Host, key): the live one with the same key
        (warm), else a new one (fresh; stale when a held one had died or is no longer trusted).
        Its connect attempts are told to a `connect` request; a `run` (for_run: the held
        connection died under it) hears only that it was made again, its `reconnected` reply."""
        host, key = resolved
        transport = self.transport
        assert transport is not None
        entry, stale = self.keeper.pool.take(key, lambda s: still_trusted(transport, s))
        if entry is not None:
            return entry, "warm"
        tell = None if for_run else (lambda n: self.send({"id": rid, "attempt": n}))
        session = transport.connect(host, on_attempt=tell)
        how = "stale" if stale or stale_before else "fresh"
        return self.keeper.pool.put(key, session, host.name), how

    def _run(self, rid: int, message: dict[str, Any]) -> None:
        with self.lock:
            cancel = self.runs[rid]
            held = self.held.get(int(message.get("session", -1)))
        if held is None:
            self.send({"id": rid, "failed": "connection lost", "detail": "no such warm session"})
            with self.lock:
                self.runs.pop(rid, None)
            return
        try:
            cmd = wire.cmd_from_wire(message["cmd"])
            password = message.get("sudo_password")
            result = self._run_on(held, rid, cmd, cancel, password)
        except ConnectFailed as exc:
            self.send({"id": rid, "failed": exc.reason, "detail": exc.detail})
        except Exception as exc:
            self.send({"id": rid, "failed": "ssh error", "detail": f"{type(exc).__name__}: {exc}"})
        else:
            self.send({"id": rid, "result": wire.result_to_wire(result)})
        finally:
            with self.lock:
                self.runs.pop(rid, None)

    def _run_on(
        self, held: Held, rid: int, cmd: Any, cancel: threading.Event, password: str | None
    ) -> Any:
        """Run on the held connection. A warm one found dead before its first command was sent
        is replaced by a fresh one (nothing ran, so nothing runs twice)."""

        def on_line(stream: str, line: str) -> None:
            if not self.gone.is_set():
                self.send({"id": rid, "s": stream, "l": line})

        first = not held.ran
        held.ran = True
        try:
            return held.entry.session.run(cmd, on_line, cancel, password)
        except ConnectFailed as exc:
            if not (first and held.how == "warm" and exc.detail == CLOSED_BEFORE):
                raise
        self.keeper.pool.drop(held.entry)
        # The held one was dead: one made now is stale (another live one held is warm).
        entry, how = self._have(held.host, rid, stale_before=True, for_run=True)
        with self.lock:
            gone = self.gone.is_set()  # else _release_all, still to come, releases this one
            if not gone:
                held.entry, held.how = entry, how
        if gone:  # the command went away meanwhile: nothing to run it for
            self.keeper.pool.release(entry, self.window_s)
            raise ConnectFailed("connection lost", "the fleet command went away")
        self.send({"id": rid, "reconnected": how})
        return entry.session.run(cmd, on_line, cancel, password)


class Threads:
    """Threads for the requests that wait on the network (a run, a fresh connection), reused
    from one request to the next: starting a thread per request was ~13% of the keeper's Python
    time on a warm command. As many as there are such requests at once (each blocks on its
    node); one left idle for IDLE_S ends."""

    IDLE_S = 30.0

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]]]
        self.jobs = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = 0  # threads waiting for a job that no submit has counted on yet

    def submit(self, work: Callable[..., None], *args: Any) -> None:
        with self.lock:
            waiting = self.idle > 0
            if waiting:
                self.idle -= 1
        if waiting:
            self.jobs.put((work, args))
        else:
            # Handed over in a list the thread empties: a Thread keeps its args for its life.
            threading.Thread(target=self._serve, args=([(work, args)],), daemon=True).start()

    def _serve(self, first: list[tuple[Callable[..., None], tuple[Any, ...]]]) -> None:
        work, args = first.pop()
        while True:
            with contextlib.suppress(Exception):  # a request's own errors are answered in it
                work(*args)
            # Nothing of the request is kept while idle (a run's carries -K's sudo password).
            del work, args
            with self.lock:
                self.idle += 1
            while True:
                try:
                    work, args = self.jobs.get(timeout=self.IDLE_S)
                    break
                except queue.Empty:
                    with self.lock:
                        # Every idle thread is counted on by a job on its way: wait for it.
                        if self.idle > 0:
                            self.idle -= 1
                            return


class Keeper:
    """The listening socket, the pool, and the loop that reaps idle connections and exits."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pool = Pool()
        self.threads = Threads()
        self.started = time.monotonic()
        self.last_client = time.monotonic()
        self.clients = 0
        self.served = False
        self.clients_lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = False
        self.orphaned = False  # our socket is gone: no new clients
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.inode = 0

    def bind(self) -> None:
        """Bind under a temporary name, 0600 from the start (umask), then rename it into place:
        a client never meets a half-made socket, and a stale one is replaced atomically."""
        os.umask(0o077)
        temporary = self.path.with_name(f"{self.path.name}.t{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        self.listener.bind(str(temporary))
        os.chmod(temporary, 0o600)
        self.listener.listen(LISTEN_BACKLOG)
        os.rename(temporary, self.path)
        self.inode = os.lstat(self.path).st_ino

    def adopt(
        self, transport: SSHTransport, held: Sequence[tuple[Host, SSHSession]], window_s: float
    ) -> None:
        """Hold connections a command made itself (fleet/ssh/handoff.py), each under the key a
        later command's request for its host computes, idle for `window_s` from now; a dead
        one, or a second one with the same key, is closed."""
        marks: dict[str, list[Any]] = {}
        for host, session in held:
            if not session.alive():
                _close(session)
                continue
            key = connection_key(transport, transport.target_of(host), marks)
            self.pool.release(self.pool.put(key, session, host.name), window_s)
        with self.pool.lock:
            self.pool.gateways.extend(transport._gateways.values())
        self.served = True  # once nothing is held, it exits at its next tick

    def status(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "pid": os.getpid(),
            "socket": str(self.path),
            "age_s": round(time.monotonic() - self.started, 3),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "clients": self.clients,
            "connections": self.pool.status(),
        }

    def accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            if not wire.same_user(sock):  # another uid: dropped before a byte is read
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        with self.clients_lock:
            self.clients += 1
            self.served = True
        try:
            Client(self, sock).serve()
        finally:
            with self.clients_lock:
                self.clients -= 1
                self.last_client = time.monotonic()
            self.wake.set()

    def still_ours(self) -> bool:
        """Our socket is still in place (not removed, not replaced by another keeper's)."""
        try:
            return os.lstat(self.path).st_ino == self.inode
        except OSError:
            return False

    def done(self) -> bool:
        """Nothing held and nobody connected (for a tick at least); a keeper nobody has used yet
        waits EMPTY_GRACE_S for the client that started it."""
        now = time.monotonic()
        with self.clients_lock:
            if self.clients or now - self.last_client < TICK_S:
                return False
            served = self.served
        if not self.pool.empty():
            return False
        return served or self.orphaned or now - self.started >= EMPTY_GRACE_S

    def run(self) -> None:
        threading.Thread(target=self.accept_loop, daemon=True).start()
        while True:
            self.wake.wait(TICK_S)
            self.wake.clear()
            self.pool.reap(idle_too=self.orphaned)
            if self.stopping or self.done():
                break
            if not self.orphaned and not self.still_ours():
                # Our socket was removed or replaced: nobody new can reach us. Serve the
                # commands already connected to the end, close the rest, then exit.
                self.orphaned = True
                with contextlib.suppress(OSError):
                    self.listener.close()
        self.shutdown()

    def shutdown(self) -> None:
        if not self.orphaned and self.still_ours():
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        with contextlib.suppress(OSError):
            self.listener.close()
        self.pool.disconnect(None)


def in_socket_dir(path: Path) -> bool:
    """`path` is in the checked directory of keeper sockets (never one elsewhere, whatever
    started us)."""
    try:
        return path.parent == rundir.socket_dir(create=False)
    except FleetError:
        return False


def serve(keeper: Keeper) -> None:
    """Serve the bound `keeper` until nothing is held (from the main thread: signals)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the operator's Ctrl-C is the client's

    def stop(signum: int, frame: object) -> None:
        """SIGTERM: close everything and exit, as when the last connection closes."""
        keeper.stopping = True
        keeper.wake.set()

    signal.signal(signal.SIGTERM, stop)
    keeper.run()


def main(argv: list[str]) -> int:
    """Serve the socket named on the command line until nothing is held."""
    if len(argv) != 2:
        print("usage: python -m fleet.ssh.keeper SOCKET", file=sys.stderr)
        return 2
    path = Path(argv[1])
    if not in_socket_dir(path):
        return 2
    # Out of the command's directory before anyone can find us listening (fleet/ssh/workdir.py):
    # a keeper must not pin it (umount, a removed directory) for its window.
    workdir.leave()
    keeper = Keeper(path)
    keeper.bind()
    serve(keeper)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
