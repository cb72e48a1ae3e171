"""Which transport a run with warm connections (--persist > 0) gets: through the keepers
(fleet/ssh/warm.py), or, for a first command, one whose workers become them
(fleet/ssh/handoff.py). Apart from both: the handoff loads the SSH libraries, which a warm
command never needs."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fleet.core.hosts import Host
from fleet.ssh import warm
from fleet.ssh.keeperfork import can_fork
from fleet.ssh.settings import SshSettings

if TYPE_CHECKING:
    from fleet.ssh.handoff import HandoffTransport


def transport_for(
    opts: SshSettings, hosts: Sequence[Host], *, hand_off: int
) -> warm.WarmTransport | HandoffTransport:
    """The transport of a run with warm connections: through the keepers, when one listens for
    any shard these hosts fall in (the others are started); else, when the run may be split
    over as many worker processes as its hosts fill shards (`hand_off`: at most) and this
    process may fork, one whose workers connect themselves and become the keepers
    (fleet/ssh/handoff.py). Never after the operator typed a secret (warm.typed_secrets): a
    keeper forked now would hold it for the window."""
    shards = warm.shard_count()
    paths = warm.socket_paths(shards)
    needed = sorted({warm.shard_of(host, shards) for host in hosts})
    found: dict[int, socket.socket] = {}
    for shard in needed:
        sock = warm._connect(paths[shard])
        if sock is not None:
            found[shard] = sock
    split = 0 < len(needed) <= hand_off
    if split and not found and not warm.typed_secrets(opts) and can_fork():
        from fleet.ssh.handoff import HandoffTransport

        return HandoffTransport(opts, paths, shards)
    return warm.WarmTransport(opts, found, paths)
