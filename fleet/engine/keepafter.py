"""A first command's run in one process; at its end, forked keepers take its connections.

With warm connections on (--persist) and no keeper running for a run's hosts, the command makes
the keepers itself (fleet/ssh/handoff.py). A run big enough for worker processes is split over
them by keeper shard, and each worker lives on as its shard's keeper (fleet/engine/workers.py).
A smaller one (workers.worker_count: one process) whose hosts all connect through libssh2 runs
here instead, as with --persist 0, its connections held at the end of each host. Splitting it
would cost more than it spares: forking a worker per shard at the start and passing every event
through a pipe cost ~40 ms of CPU at 128 hosts (0.3 ms a host) over the same run in one
process, and ~28 ms at 8.

When the run ends whole, keep_after_run forks one child per shard the held connections fall in.
Each holds its shard's connections and lives on as that shard's keeper, as a worker does: bound
as a keeper binds (its shard's start lock, 0600 socket, checked directory), then out of the
command's world (workers.leave: a session of its own, every descriptor it had from the command
made /dev/null in place, the other shards' connections with them, dropped without a word). The
command waits until each child has bound or given up, so that the next command finds the
keepers listening, then makes its own copies of the sockets /dev/null in place and forgets the
connections: the keepers own them, and a goodbye from the command would end them.

It is never done from a process running another thread (a fork copies no lock another thread
holds: a paramiko connection's thread, the live table's), nor for a run that was cancelled or
failed: the connections are closed then, and the next command connects afresh. The keeper is
a fork of the command only when the operator typed no secret (fleet/ssh/choose.py gives no
hand-off transport then), as for workers.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import time
from typing import Any, NoReturn

from fleet.engine import workers

BIND_WAIT_S = 5.0  # for a forked keeper to bind its socket (or give up) before the command goes
STAYS = b"s"  # what a forked child says before leaving the command's world: it lives on


def keep_after_run(transport: Any, whole: bool, wait_s: float = BIND_WAIT_S) -> int:
    """Fork a keeper per shard for the connections `transport` (a HandoffTransport) held over
    a run in this process that ended `whole`; else close them. Returns how many live on."""
    shards = transport.held_by_shard() if whole else {}
    fds = {shard: transport.fds_of(held) for shard, held in shards.items()}
    if not shards or any(f is None for f in fds.values()) or not workers.fork_safe():
        transport.let_go()
        return 0
    workers.flush_std_streams()
    # What each child would import (the keeper's name): once, here.
    with contextlib.suppress(ImportError):
        import setproctitle  # noqa: F401
    children: list[tuple[int, int]] = []
    forked: set[int] = set()
    gc.freeze()  # the collector would otherwise write to (and copy) every page a child shares
    try:
        for shard in sorted(shards):
            try:
                read_fd, write_fd = os.pipe()
            except OSError:
                break  # out of descriptors: the shards not forked are closed below
            try:
                pid = os.fork()
            except OSError:  # out of processes or memory: as above
                os.close(read_fd)
                os.close(write_fd)
                break
            if pid == 0:
                _keeper(transport, shard, fds[shard] or set(), read_fd, write_fd)
            os.close(write_fd)
            children.append((pid, read_fd))
            forked.add(shard)
    finally:
        gc.unfreeze()
    transport.give_away(forked)  # the rest stay held: transport.close() closes them
    deadline = time.monotonic() + wait_s
    kept = 0
    for pid, read_fd in children:
        said = _said(read_fd, deadline)
        os.close(read_fd)
        if said == STAYS:
            kept += 1  # lives on: reaped by whoever outlives the command, as a worker keeper
        else:
            _reap(pid, deadline)  # gave up (another command's keeper serves the shard): exits
    return kept


def _keeper(transport: Any, shard: int, keep: set[int], read_fd: int, done_fd: int) -> NoReturn:
    """The forked child: its shard's keeper, bound, then out of the command's world (the
    command hears `done_fd` end), serving until its window ends."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the operator's Ctrl-C is the command's
        theirs = workers.open_fds()
        transport.keep_only(shard)
        serve = transport.stay(shard, True) if theirs is not None else None
        if theirs is None:
            transport.let_go()
        if serve is not None:
            os.write(done_fd, STAYS)
        workers.leave((theirs or set()) - keep | {read_fd}, done_fd, death_signal=False)
        if serve is not None:
            serve()
    finally:
        os._exit(0)  # never back into the command's code


def _said(fd: int, deadline: float) -> bytes:
    """What the child wrote before its end of the pipe closed (it is bound, or gave up), read
    until then or until `deadline`."""
    said = b""
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 16)
            if not chunk:
                break
            said += chunk
    return said


def _reap(pid: int, deadline: float) -> None:
    """Wait for a child that is exiting, until `deadline` (else init reaps it later)."""
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done or time.monotonic() > deadline:
            return
        time.sleep(0.005)
