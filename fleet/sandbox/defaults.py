"""The sandbox's defaults, in one place (loads nothing: `fleet --help` shows them)."""

from __future__ import annotations

import os
from pathlib import Path

from fleet.core.defaults import PORT

DEFAULT_SUBNET = "10.251.0.0/16"  # the demo's; tests and the benchmark pass their own
DEFAULT_MAX_STARTUPS = "100:30:200"  # sshd's MaxStartups on every node
GHOST_PORT = PORT  # where planted ghosts listen: fleet's default rendezvous port


def default_dir() -> Path:
    """The `fleet sandbox` state dir: $XDG_STATE_HOME/fleet/sandbox (~/.local/state/...)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "fleet" / "sandbox"
