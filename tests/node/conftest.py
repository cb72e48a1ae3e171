"""Node-side scripts run here as root; their state goes to a private directory, never the host's
/var/lib/fleet (lib.sh's node_state honours FLEET_NODE_STATE, as checked as any state dir)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def private_node_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """FLEET_NODE_STATE for every node script a test starts with the inherited environment."""
    state = str(tmp_path_factory.mktemp("node-state") / "fleet")
    before = os.environ.get("FLEET_NODE_STATE")
    os.environ["FLEET_NODE_STATE"] = state
    try:
        yield state
    finally:
        if before is None:
            os.environ.pop("FLEET_NODE_STATE", None)
        else:
            os.environ["FLEET_NODE_STATE"] = before
