"""Warm connections, the client's side: a fleet command's sessions as proxies to keepers.

With --persist > 0 every connection of a run is held by a keeper (fleet/ssh/keeper.py), a
detached process that outlives the command, so the next command within the window reuses the
authenticated connections instead of paying a handshake per host. A first command's workers
make them and become the keepers (fleet/ssh/handoff.py); a command that finds keepers goes
through them. This module is what the engine then sees (the Transport and Session of
fleet/engine/executor.py): it finds or starts the keepers, sends them each host's connection and
command, and turns their replies back into CommandResults and ConnectFailed. It never loads
paramiko: a warm command starts fast.

Hosts are spread over one keeper per usable core, at most KEEPERS_MAX (a keeper is one core),
by a hash of the host's name and address, the same for every command. A keeper serves only
commands of its own user with the same environment (HOME, USER, SSH_AUTH_SOCK, PATH, working
directory): its socket's name says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fleet.core.digits import is_digits
from fleet.core.errors import ConfigError
from fleet.core.hosts import Host
from fleet.core.result import CommandResult
from fleet.core.shell import Cmd
from fleet.ssh import rundir, wire
from fleet.ssh.failure import ConnectFailed
from fleet.ssh.keeperfork import Forked, can_fork, fork_keeper
from fleet.ssh.settings import SshSettings

START_WAIT_S = 20.0  # a keeper's start, on a busy bastion
POLL_S = 0.2  # how often a waiting run looks at its cancel switch
# Node output read from the keepers and not yet taken by the engine, per keeper: past this the
# keeper is read no more until it is (backpressure to the node, as with a cold connection).
BUFFER_BYTES = 8 * 1024 * 1024
# A keeper that says nothing this long while a request waits is asked (`ping`: its reader
# answers at once, whatever its threads do); no word at all within PONG_WAIT_S more and it is
# taken for gone (stopped, wedged): the requests fail as a lost connection would, instead of
# the command waiting for ever. A keeper busy for 1,000 hosts answers within a second or two.
PING_AFTER_S = 5.0
PONG_WAIT_S = 15.0
ENV_NAMES = ("HOME", "USER", "LOGNAME", "SSH_AUTH_SOCK", "PATH")
PREFIX = "keeper-"
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last a NUL
TEMP_SUFFIX = ".t4194304"  # what a keeper adds while it binds (fleet/ssh/keeper.py), at most


# Keepers beyond this bring little: every request and reply of a command passes through the
# command, one process, which costs ~0.45 ms of CPU per host on a warm command and ~0.7 ms on a
# first one, against a keeper's ~0.65 and ~1.9 ms through libssh2 (measured), spread over the
# keepers: with three the command is already the limit. Connections through paramiko (a jump
# host, a certificate) cost a keeper ~4x as much: eight come near the command's pace for those
# too. And each keeper is a fork at every command that starts them, whatever its size: one per
# core would be 64 forks for a one-host command on a 64-core bastion. (A first command's workers,
# one per shard that has hosts, are as many.)
KEEPERS_MAX = 8


def shard_count() -> int:
    """One keeper per usable core, at most KEEPERS_MAX (FLEET_KEEPERS sets it: tests, the
    benchmark)."""
    given = os.environ.get("FLEET_KEEPERS", "")
    if is_digits(given) and int(given) > 0:
        return min(int(given), 64)
    return max(1, min(len(os.sched_getaffinity(0)), KEEPERS_MAX))


def identity(shards: int, here: Path | None = None) -> str:
    """What a keeper must share with a command to serve it, hashed into its socket's name:
    the environment that decides how hosts are reached, this fleet's code (`here`: fleet.ssh's
    directory), the wire's version."""
    here = here or Path(__file__).parent
    # Every module of fleet.ssh and of fleet.core: a keeper runs them all (the libssh2 and
    # paramiko paths, the config, host keys; the frame and the remote kill, a command's and a
    # result's fields), so a change to any of them must not be served by an older keeper.
    code = [
        [f"{directory.name}/{name}", os.stat(directory / name).st_mtime_ns]
        for directory in (here, here.parent / "core")
        if directory.is_dir()
        for name in sorted(os.listdir(directory))
        if name.endswith(".py") and not name.startswith(".")  # an editor's .#lock file too
    ]
    facts = {
        "uid": os.getuid(),
        "env": {name: os.environ.get(name) for name in ENV_NAMES},
        "cwd": os.getcwd(),
        "python": sys.executable,
        "code": [str(here), code],
        "protocol": wire.PROTOCOL,
        "shards": shards,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def typed_secrets(opts: SshSettings) -> bool:
    """The operator typed a secret for this command (-K's sudo password, a key's passphrase).
    A process forked from the command after that holds it in its memory, so no keeper is
    forked then: a keeper lives on after the command, for the window."""
    return opts.sudo_password is not None or opts.key_passphrase is not None


def shard_of(host: Host, shards: int) -> int:
    text = f"{host.name}\0{host.address}\0{host.port}\0{host.user}"
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % shards


def _connect(path: Path) -> socket.socket | None:
    """A connection to the keeper at `path`, checked to run as us; None when none listens."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"{path}: cannot reach the keeper of warm connections: {exc.strerror or exc}",
            hint="pass --persist 0 to connect afresh",
        ) from None
    if not wire.same_user(sock):
        sock.close()
        raise ConfigError(
            f"{path}: the keeper there runs as another user",
            hint="remove the socket; pass --persist 0 to connect afresh",
        )
    return sock


def _spawn(path: Path) -> subprocess.Popen[bytes]:
    """Start a keeper for `path`: detached (own session), stdio on /dev/null, no fd inherited.

    `-P`: `python -m` would put the working directory first on the keeper's import path, so a
    `fleet/` another user made there (in /tmp, in a shared directory) would run as the operator
    instead of fleet's own code. The keeper starts in the command's working directory, which is
    part of its identity(), notes it and leaves it (fleet/ssh/workdir.py): relative paths in the
    settings still mean what they meant there."""
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "fleet.ssh.keeper", str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


def _lock(path: Path) -> int:
    """The lock file of `path`'s keeper, opened (not locked)."""
    return os.open(
        path.with_name(path.name + ".lock"),
        os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )


Ahead = socket.socket | tuple[int, Forked] | None  # what fork_ahead found or started


def _claim(path: Path, *, wait: bool) -> socket.socket | int:
    """The keeper listening at `path`; else its start lock, held (`wait`: for as long as another
    command holds it; else OSError at once), with no keeper listening once it is held."""
    sock = _connect(path)
    if sock is not None:
        return sock
    lock = _lock(path)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        sock = _connect(path)
    except BaseException:
        os.close(lock)
        raise
    if sock is not None:
        os.close(lock)
        return sock
    return lock


def fork_ahead(path: Path) -> Ahead:
    """From a single-threaded command, before its threads start: the keeper listening at
    `path`, or, when none listens and no other command is starting one, a keeper forked now
    (fleet/ssh/keeperfork.py) with its start lock held, for connect_or_start to wait on. None:
    nothing found or started here (this process has threads, another command is starting the
    keeper, or something failed: connect_or_start then meets it in its own words)."""
    if not can_fork():
        return None
    try:
        claimed = _claim(path, wait=False)
    except (OSError, ConfigError):
        return None
    if isinstance(claimed, socket.socket):
        return claimed
    try:
        return claimed, fork_keeper(path)
    except OSError:
        os.close(claimed)
        return None


def connect_or_start(path: Path, ahead: Ahead = None) -> socket.socket:
    """The keeper at `path`, started when none listens. Two commands starting at once: the
    first to hold the lock starts it, the other finds it. `ahead`: what fork_ahead found (the
    keeper's socket) or started (its lock, held, and the keeper)."""
    forked: Forked | None
    if isinstance(ahead, socket.socket):
        return ahead
    if ahead is not None:
        lock, forked = ahead
    else:
        claimed = _claim(path, wait=True)
        if isinstance(claimed, socket.socket):
            return claimed
        lock, forked = claimed, None
    try:
        return _started(path, forked or _spawn(path))
    finally:
        os.close(lock)


def _started(path: Path, keeper: Forked | subprocess.Popen[bytes]) -> socket.socket:
    """The keeper just started for `path`, once it listens; its exit or a timeout, said."""
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        sock = _connect(path)
        if sock is not None:
            return sock
        if keeper.poll() is not None:
            raise ConfigError(
                f"{path}: the keeper of warm connections exited at start "
                f"(status {keeper.returncode})",
                hint="pass --persist 0 to connect afresh; `python -m fleet.ssh.keeper "
                "SOCKET` in a terminal shows why",
            )
        time.sleep(0.02)
    raise ConfigError(
        f"{path}: the keeper of warm connections did not start within {START_WAIT_S:g}s",
        hint="pass --persist 0 to connect afresh",
    )


def socket_paths(shards: int) -> list[Path]:
    """The socket of each shard's keeper for this command's user and environment, by shard."""
    directory = rundir.socket_dir()
    name = identity(shards)
    paths = [directory / f"{PREFIX}{name}-{shard}.sock" for shard in range(shards)]
    if max(len(os.fsencode(p)) for p in paths) + len(TEMP_SUFFIX) > SOCKET_PATH_MAX:
        raise rundir.Unusable(
            f"{directory}: too long a path for the warm connections' sockets "
            f"(a unix socket's path is at most {SOCKET_PATH_MAX} bytes)",
            hint="set XDG_RUNTIME_DIR to a shorter directory of yours, or pass --persist 0",
        )
    return paths


class Link:
    """One command's connection to one keeper: requests out, replies routed by id."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.write_lock = threading.Lock()
        self.ids = itertools.count(1)
        self.waiting: dict[int, queue.SimpleQueue[dict[str, Any]]] = {}
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)
        self.buffered = 0  # bytes of node output read from the keeper, not yet taken
        self.owed: dict[int, int] = {}  # the same, per request
        self.lost: str | None = None
        self.heard = time.monotonic()  # the keeper's last word, or our own wait for room
        self.closed = threading.Event()
        self.reader = threading.Thread(target=self._read, name="fleet-warm", daemon=True)
        self.reader.start()
        watch = threading.Thread(target=self._watch, name="fleet-warm-watch", daemon=True)
        watch.start()

    def request(self, message: dict[str, Any]) -> tuple[int, queue.SimpleQueue[dict[str, Any]]]:
        """Send a request; its replies arrive on the queue returned."""
        rid = next(self.ids)
        replies: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        with self.lock:
            if self.lost is not None:
                replies.put({"lost": self.lost})
                return rid, replies
            self.waiting[rid] = replies
        self.send({**message, "id": rid})
        return rid, replies

    def send(self, message: dict[str, Any]) -> None:
        try:
            with self.write_lock:
                self.sock.sendall(wire.encode(message))
        except OSError as exc:
            self._lose(f"the keeper's socket failed: {exc.strerror or exc}")

    def done(self, rid: int) -> None:
        with self.room:
            self.waiting.pop(rid, None)
            self.buffered -= self.owed.pop(rid, 0)
            self.room.notify_all()

    def taken(self, rid: int, reply: dict[str, Any]) -> None:
        """A reply is off its queue: its bytes no longer count against the buffer."""
        cost = _cost(reply)
        if cost:
            with self.room:
                self.buffered -= cost
                self.owed[rid] = self.owed.get(rid, 0) - cost
                self.room.notify_all()

    def _read(self) -> None:
        reader = wire.LineReader(self.sock)
        why = "the keeper of warm connections went away"
        try:
            while True:
                message = reader.next()
                if message is None:
                    break
                self.heard = time.monotonic()
                self._route(message)
        except (OSError, wire.WireError) as exc:
            why = f"the keeper's socket failed: {exc}"
        self._lose(why)

    def _watch(self) -> None:
        """Ask a keeper that has gone quiet while requests wait; lose it when it stays silent
        (PING_AFTER_S, PONG_WAIT_S). A run's step that prints nothing for an hour is fine: the
        keeper answers the ping."""
        asked: float | None = None  # when we asked, not answered since
        while not self.closed.wait(1.0):
            with self.lock:
                if self.lost is not None:
                    return
                waiting = bool(self.waiting)
            now = time.monotonic()
            calm = not waiting or now - self.heard < PING_AFTER_S  # nothing to ask about
            if calm or (asked is not None and self.heard > asked):  # no need, or answered
                asked = None
            if asked is None and not calm:
                asked = now
                self.send({"op": "ping", "id": 0})
            elif asked is not None and now - asked >= PONG_WAIT_S:
                self._lose(
                    f"the keeper of warm connections stopped answering ({now - self.heard:.0f}s "
                    "without a word; stopped or wedged?): `fleet disconnect` ends it, "
                    "--persist 0 connects afresh"
                )
                return

    def _route(self, message: dict[str, Any]) -> None:
        """Onto its request's queue. Past BUFFER_BYTES of output not yet taken, wait: the keeper's
        writes then block, its reads from the node stop, and the node's own writes block (as a
        cold run's SSH channel window does), instead of the output piling up here."""
        rid = int(message.get("id", -1))
        cost = _cost(message)
        with self.room:
            while cost and self.buffered > BUFFER_BYTES and rid in self.waiting:
                self.room.wait(POLL_S)
                self.heard = time.monotonic()  # we keep the keeper waiting, not it us
            replies = self.waiting.get(rid)
            if replies is None:
                return
            self.buffered += cost
            self.owed[rid] = self.owed.get(rid, 0) + cost
            replies.put(message)

    def _lose(self, why: str) -> None:
        with self.lock:
            if self.lost is None:
                self.lost = why
            waiting = list(self.waiting.values())
        for replies in waiting:
            replies.put({"lost": why})

    def ask(self, message: dict[str, Any], timeout_s: float = START_WAIT_S) -> dict[str, Any]:
        """One request, its one reply."""
        rid, replies = self.request(message)
        try:
            return replies.get(timeout=timeout_s)
        except queue.Empty:
            return {"lost": f"no answer from the keeper within {timeout_s:g}s"}
        finally:
            self.done(rid)

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class WarmSession:
    """One host's connection, held by a keeper; `connection` says how it was had (warm: reused;
    fresh: made now; stale: a held one had died or was no longer trusted, made now)."""

    def __init__(self, link: Link, sid: int, connection: str) -> None:
        self.link = link
        self.sid = sid
        self.connection = connection
        self.engine: str | None = None  # the SSH library of the keeper's connection

    def run(
        self,
        cmd: Cmd,
        on_line: Callable[[str, str], None],
        cancel: threading.Event,
        sudo_password: str | None = None,
    ) -> CommandResult:
        """Run on the node through the keeper; a cancel is passed on (the keeper stops the
        command on the node, as SSHSession does)."""
        request: dict[str, Any] = {"op": "run", "session": self.sid, "cmd": wire.cmd_to_wire(cmd)}
        if sudo_password is not None:
            request["sudo_password"] = sudo_password
        rid, replies = self.link.request(request)
        cancelled = False
        try:
            while True:
                if cancel.is_set() and not cancelled:
                    cancelled = True
                    self.link.send({"op": "cancel", "run": rid, "id": 0})
                try:
                    reply = replies.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                self.link.taken(rid, reply)
                if "l" in reply:
                    on_line(str(reply["s"]), str(reply["l"]))
                elif "result" in reply:
                    return wire.result_from_wire(reply["result"])
                elif "reconnected" in reply:
                    self.connection = str(reply["reconnected"])
                else:
                    raise _failure(reply)
        finally:
            self.link.done(rid)

    def close(self) -> None:
        """Give the connection back to the keeper (it stays open for the window)."""
        self.link.send({"op": "close", "session": self.sid, "id": 0})


def _cost(message: dict[str, Any]) -> int:
    """What a message counts against the buffer: a line of node output, its text and overhead."""
    line = message.get("l")
    return len(line) + 200 if isinstance(line, str) else 0


def _failure(reply: dict[str, Any]) -> ConnectFailed:
    if "lost" in reply:
        return ConnectFailed("connection lost", str(reply["lost"]))
    if "failed" in reply:
        return ConnectFailed(str(reply["failed"]), str(reply.get("detail", "")))
    # Never sent by a keeper of this code (its socket's name says which code it runs): said as
    # it is rather than as a bare "ssh error", so that a bug here can be seen in the record.
    keys = ", ".join(sorted(str(k) for k in reply if k != "id"))[:80]
    return ConnectFailed("ssh error", f"unexpected reply from the keeper ({keys})")


class WarmTransport:
    """The engine's Transport, through keepers (one per shard of the hosts)."""

    def __init__(
        self,
        opts: SshSettings,
        found: dict[int, socket.socket] | None = None,
        paths: list[Path] | None = None,
    ) -> None:
        """`found`: connections to keepers already listening, by shard; `paths`: the keepers'
        sockets, by shard, when the caller has worked them out (socket_paths)."""
        self.opts = opts
        self.paths = paths if paths is not None else socket_paths(shard_count())
        self.shards = len(self.paths)
        self.found = dict(found or {})
        self.links: dict[int, Link] = {}
        # Each checked host by id: (the host, its shard, its index in that shard's hello), so a
        # connect request names it by index instead of carrying it again.
        self.placed: dict[int, tuple[Host, int, int]] = {}

    def check(self, hosts: Sequence[Host]) -> None:
        """Reach (or start) the keepers these hosts need and greet each with the settings and
        its hosts: they check them as a cold run would, before anything connects."""
        by_shard: dict[int, list[Host]] = {}
        for host in hosts:
            shard = shard_of(host, self.shards)
            group = by_shard.setdefault(shard, [])
            self.placed[id(host)] = (host, shard, len(group))
            group.append(host)
        errors: list[BaseException] = []
        # Keepers that must start are forked now, from this process while it is still
        # single-threaded (fork_ahead), unless the operator typed a secret (a forked keeper
        # would hold it for the window: it is spawned, and is sent only what it needs);
        # threads then wait for them, greet them, in parallel.
        ahead: dict[int, Ahead] = {}
        fork = not typed_secrets(self.opts)
        for shard in by_shard:
            found = self.found.pop(shard, None)
            ahead[shard] = found or (fork_ahead(self.paths[shard]) if fork else None)
        for sock in self.found.values():  # a keeper of a shard none of these hosts fell in
            sock.close()
        self.found.clear()

        def open_one(shard: int) -> None:
            try:
                self.links[shard] = self._greet(shard, by_shard[shard], ahead[shard])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_one, args=(s,)) for s in by_shard]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.close()
            raise errors[0]

    def _greet(self, shard: int, hosts: list[Host], ahead: Ahead = None) -> Link:
        hello = {
            "op": "hello",
            "settings": wire.settings_to_wire(self.opts),
            "persist_s": self.opts.persist_s,
            "hosts": [wire.host_to_wire(h) for h in hosts],
            # The keeper reads the ssh config in it (Include's ${VAR}s, Match exec), and runs a
            # ProxyCommand in it: its own is that of the command that started it.
            "env": dict(os.environ),
        }
        if self.opts.key_passphrase is not None:
            hello["key_passphrase"] = self.opts.key_passphrase
        path = self.paths[shard]
        for _attempt in range(2):  # a keeper may exit just as we reach it: start another
            link = Link(connect_or_start(path, ahead))
            ahead = None
            reply = link.ask(hello)
            if "error" in reply:
                link.close()
                raise ConfigError(str(reply["error"]), str(reply.get("hint", "")))
            if "ok" in reply:
                return link
            link.close()
        raise ConfigError(
            f"{path}: the keeper of warm connections does not answer",
            hint="fleet disconnect ends it; pass --persist 0 to connect afresh",
        )

    def connect(self, host: Host, on_attempt: Callable[[int], None] | None = None) -> WarmSession:
        """The host's connection, warm when the keeper holds a live one."""
        placed = self.placed.get(id(host))
        request: dict[str, Any] = {"op": "connect"}
        if placed is not None and placed[0] is host:
            shard, request["h"] = placed[1], placed[2]
        else:  # not this very object: the keeper resolves it afresh
            shard, request["host"] = shard_of(host, self.shards), wire.host_to_wire(host)
        link = self.links.get(shard)
        if link is None:
            raise ConnectFailed("ssh error", "host not checked before connecting")
        rid, replies = link.request(request)
        try:
            while True:
                reply = replies.get()
                if "attempt" in reply:
                    if on_attempt:
                        on_attempt(int(reply["attempt"]))
                    continue
                if "connected" in reply:
                    session = WarmSession(link, rid, str(reply["connected"]))
                    session.engine = str(reply.get("ssh") or "") or None
                    return session
                raise _failure(reply)
        finally:
            link.done(rid)

    def close(self) -> None:
        """Hang up: the keepers keep the connections for the window."""
        for link in self.links.values():
            link.close()
        self.links.clear()


def keeper_sockets() -> list[Path]:
    """Every keeper socket of this user (whatever environment started it)."""
    directory = rundir.socket_dir(create=False)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    return [directory / n for n in names if n.startswith(PREFIX) and n.endswith(".sock")]


def ask_each(message: dict[str, Any]) -> list[dict[str, Any]]:
    """`message` to every keeper that answers; their replies."""
    replies = []
    for path in keeper_sockets():
        sock = _connect(path)
        if sock is None:
            continue
        link = Link(sock)
        try:
            reply = link.ask(message, timeout_s=10.0)
        finally:
            link.close()
        if "lost" not in reply:
            replies.append(reply)
    return replies


def connections() -> list[dict[str, Any]]:
    """What each keeper holds: pid, socket, age, CPU seconds, its connections."""
    return [r["status"] for r in ask_each({"op": "status"}) if "status" in r]


def disconnect(names: set[str] | None, wait_s: float = 10.0) -> list[str]:
    """Close the warm connections to `names` (all when None); wait for the keepers left with
    nothing to exit. The hosts whose connections were closed."""
    replies = ask_each({"op": "disconnect", "hosts": sorted(names) if names is not None else None})
    closed = sorted({h for r in replies for h in r.get("closed", ())})
    pids = [int(r["pid"]) for r in replies if "pid" in r]
    if names is None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(_running(pid) for pid in pids):
            time.sleep(0.02)
    return closed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
