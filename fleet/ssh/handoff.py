"""A first command's connections kept: the worker processes that made them become the keepers.

With --persist > 0 and no keeper running for any of a run's hosts, the command could start the
keepers and pass every request and reply of the run through them (fleet/ssh/warm.py): the SSH
work in the keepers, and the relay of it in the command, ~1 ms of CPU per host more than a
run that connects itself. Instead the run's hosts are split over worker processes
(fleet/engine/workers.py) by the keeper shard each belongs to (warm.shard_of), and each worker
connects to its share and runs it itself, as with --persist 0. Its connections are held, not
closed, at the end of each host; once the share is done, the worker binds its shard's keeper
socket and lives on as that keeper (fleet/ssh/keeper.py), holding them for the window. The next
command finds them warm, as if a keeper had made them.

What a keeper trusts is unchanged: the worker is the operator's own command, forked; its
connections were made with every check of a cold one (host keys against known_hosts); the
socket is bound as a keeper binds it (0600, in the checked 0700 directory, peers' uid checked);
each connection is filed under the key a later command's request computes for its host, and is
judged again against known_hosts when it is handed out. A worker binds only while it holds the
shard's start lock and no keeper listens: two commands starting at once never both serve a
shard (the one that finds a keeper there closes its connections, which are then only lost).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from fleet.core.errors import ConfigError
from fleet.core.hosts import Host
from fleet.core.result import CommandResult
from fleet.core.shell import Cmd
from fleet.ssh import keeper as keeping
from fleet.ssh import warm, workdir
from fleet.ssh.keeperfork import TITLE
from fleet.ssh.settings import SshSettings
from fleet.ssh.transport import SSHSession, SSHTransport


class KeptSession:
    """A connection made by this run and kept for its keeper: runs as the session does; closing
    it hands it to the transport instead."""

    connection = "fresh"  # made now, kept for the window (as a keeper's fresh one)

    def __init__(self, owner: HandoffTransport, host: Host, session: SSHSession) -> None:
        self.owner = owner
        self.host = host
        self.session = session
        self.engine = getattr(session, "engine", None)

    def run(
        self,
        cmd: Cmd,
        on_line: Callable[[str, str], None],
        cancel: threading.Event,
        sudo_password: str | None = None,
    ) -> CommandResult:
        return self.session.run(cmd, on_line, cancel, sudo_password)

    def close(self) -> None:
        self.owner.hold(self.host, self.session)


# Connections given to keepers forked from this process, its copies talking to /dev/null: kept
# referenced until the process ends, never freed. A command ends with os._exit
# (fleet/cli/app.py), so freeing them would only cost: a libssh2 session freed and a socket
# finalized (formatting its "unclosed socket" warning) each, ~15 us a host when run_plan
# returned, and a copy of every page of theirs that the keepers still share.
GIVEN: list[tuple[Host, SSHSession]] = []


class HandoffTransport:
    """The engine's Transport for a first command with warm connections: a cold transport whose
    sessions are held at close, and what each worker then becomes (stay)."""

    def __init__(self, opts: SshSettings, paths: Sequence[Path], shards: int) -> None:
        self.opts = opts
        self.inner: SSHTransport = keeping.transport_of(opts)  # as a keeper makes them
        self.paths = list(paths)
        self.shards = shards
        self.held: list[tuple[Host, SSHSession]] = []
        self.given: list[tuple[Host, SSHSession]] = []  # held by keepers forked from here
        self.lock = threading.Lock()

    def check(self, hosts: Sequence[Host]) -> None:
        self.inner.check(hosts)

    def shard_of(self, host: Host) -> int:
        return warm.shard_of(host, self.shards)

    def connect(self, host: Host, on_attempt: Callable[[int], None] | None = None) -> KeptSession:
        return KeptSession(self, host, self.inner.connect(host, on_attempt))

    def hold(self, host: Host, session: SSHSession) -> None:
        with self.lock:
            self.held.append((host, session))

    def paramiko_hosts(self, hosts: Sequence[Host]) -> int:
        """How many of `hosts` connect through paramiko (whose connections run a thread each:
        a run in one process with any of them cannot fork its keepers at the end)."""
        return self.inner.paramiko_hosts(hosts)

    def held_by_shard(self) -> dict[int, list[tuple[Host, SSHSession]]]:
        """The connections held, by the keeper shard their hosts fall in."""
        shards: dict[int, list[tuple[Host, SSHSession]]] = {}
        with self.lock:
            for host, session in self.held:
                shards.setdefault(self.shard_of(host), []).append((host, session))
        return shards

    @staticmethod
    def fds_of(held: Sequence[tuple[Host, SSHSession]]) -> set[int] | None:
        """The socket descriptors these connections run on; None when one cannot be told (a
        connection that is not libssh2's: then it cannot be handed to a forked keeper)."""
        fds: set[int] = set()
        for _host, session in held:
            sock = getattr(session, "sock", None)
            if getattr(session, "engine", None) != "libssh2" or not isinstance(sock, socket.socket):
                return None
            fd = sock.fileno()
            if fd < 0:
                return None
            fds.add(fd)
        return fds

    def keep_only(self, shard: int) -> None:
        """In a keeper forked at the end of a run (fleet/engine/keepafter.py): hold this
        shard's connections only; the others' sockets are made /dev/null with the rest of the
        command's descriptors (never closed with a goodbye: they are other keepers' now)."""
        with self.lock:
            self.held = [(h, s) for h, s in self.held if self.shard_of(h) == shard]

    def give_away(self, shards: set[int]) -> None:
        """In the command, once keepers forked from it hold the connections of `shards`: its
        copies of their sockets made /dev/null in place and the connections forgotten, never
        closed (a goodbye here would end them for the keepers). In place: the SSH library still
        names those descriptors, and a number closed now could be reused by a file of the
        command's. The other shards' connections stay held (close() closes them)."""
        with self.lock:
            held = [(h, s) for h, s in self.held if self.shard_of(h) in shards]
            self.held = [(h, s) for h, s in self.held if self.shard_of(h) not in shards]
        fds = self.fds_of(held) or set()
        null = os.open(os.devnull, os.O_RDWR)
        try:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.dup2(null, fd)
        finally:
            os.close(null)
        self.given.extend(held)
        GIVEN.extend(held)

    def let_go(self) -> None:
        """Close every connection held (none will be kept)."""
        with self.lock:
            held, self.held = self.held, []
        for _host, session in held:
            keeping._close(session)

    def close(self) -> None:
        self.let_go()
        self.inner.close()

    def stay(self, shard: int, whole: bool) -> Callable[[], None] | None:
        """In a worker whose run is over (`whole`: not cancelled): its shard's keeper, bound and
        holding this run's connections, as a function that serves it; None (the connections
        closed) when the run was cancelled, nothing is left to hold, or another keeper listens
        or is being started for the shard."""
        if not whole or not self.held:
            self.let_go()
            return None
        path = self.paths[shard]
        try:
            claimed = warm._claim(path, wait=False)
        except (OSError, ConfigError):
            claimed = None  # another command is starting this keeper, or the socket is not ours
        if not isinstance(claimed, int):
            if isinstance(claimed, socket.socket):
                claimed.close()
            self.let_go()
            return None
        try:
            # Out of the command's directory before the command hears that this worker stays
            # (fleet/ssh/workdir.py): a keeper must not pin it for its window.
            workdir.leave()
            kept = keeping.Keeper(path)
            with self.lock:
                held, self.held = self.held, []
            kept.adopt(self.inner, held, self.opts.persist_s)
            try:
                kept.bind()
            except OSError:
                kept.shutdown()
                raise
        finally:
            os.close(claimed)  # bound: the next command finds it listening
        _name(kept.path)
        return lambda: keeping.serve(kept)


def _name(path: Path) -> None:
    """Named as a forked keeper is (fleet/ssh/keeperfork.py), before the command hears the
    worker is done: when the command returns, `ps` shows the keeper, not a worker's argv."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        return
    setproctitle(f"{TITLE} {path}")
