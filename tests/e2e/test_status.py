"""`fleet status` against a real sshd node whose output dir hangs, as a stale NFS mount does.

The hang is a stand-in `df` on that one node's PATH (`/usr/local/bin` is private to each node)
that never returns: the real `df` on a dead NFS server blocks the same way. The status
playbook's `disk` step then runs into its 30 s timeout; the node's run step had answered first.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import run_fleet

pytestmark = pytest.mark.root

MARK = "fleet-test-hung-df"  # the stand-in's process name, to end what is left of it by name
HUNG_DF = f"#!/bin/bash\nexec -a {MARK} sleep 600\n"


@pytest.fixture
def hung_df(sandbox: Any) -> Iterator[Any]:
    node = sandbox.nodes()[1]
    script = f"cat >/usr/local/bin/df <<'EOF'\n{HUNG_DF}EOF\nchmod 755 /usr/local/bin/df"
    sandbox.run_on(node, script)
    try:
        yield node
    finally:
        sandbox.run_on(node, f"rm -f /usr/local/bin/df; pkill -KILL -x {MARK}; true")


def test_a_node_whose_disk_check_hangs_still_shows_its_run_and_names_the_step(
    sandbox: Any, hung_df: Any, tmp_path: Path
) -> None:
    result = run_fleet(
        sandbox, "status", "--dir", "/tmp", "-l", hung_df.name, log_dir=tmp_path, timeout_s=120
    )
    assert result.code == 4, result.stdout + result.stderr  # a step timed out
    [row] = [line for line in result.stdout.splitlines() if line.startswith(hung_df.name + " ")]
    assert "timed_out" not in row.split()[1], row  # the run column holds the run's state
    assert "disk: step timed out after 30s" in row, row
