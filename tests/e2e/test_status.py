"""`fleet status` against a real sshd node whose output dir hangs, as a stale NFS mount does.

The hang is a stand-in `df` on that one node's PATH (`/usr/local/bin` is private to each node)
that never returns for the one output dir the test names, and is the real `df` for any other
(a janitor another test left running reports its own dir's free space): the real `df` on a dead
NFS server's mount blocks the same way. The status playbook's `disk` step then runs into its
30 s timeout; the node's run step had answered first.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import run_fleet

pytestmark = pytest.mark.root

MARK = "fleet-test-hung-df"  # the stand-in's process name, to end what is left of it by name
STALE = "/tmp/fleet-test-stale-nfs"  # the output dir whose df hangs
HUNG_DF = f"""#!/bin/bash
for a; do [ "$a" = {STALE} ] && exec -a {MARK} sleep 600; done
exec /usr/bin/df "$@"
"""


JANITOR_DIR = "/tmp/fleet-test-status-janitor"  # a janitor's dir on a healthy mount


@pytest.fixture
def hung_df(sandbox: Any, tmp_path: Path) -> Iterator[Any]:
    """The node, its df hanging for STALE only, and a janitor running for another dir (its
    status reports that dir's free space through df, which must still answer)."""
    node = sandbox.nodes()[1]
    script = f"cat >/usr/local/bin/df <<'EOF'\n{HUNG_DF}EOF\nchmod 755 /usr/local/bin/df"
    sandbox.run_on(node, f"{script}; mkdir -p {STALE} {JANITOR_DIR}")
    janitor = ["--dir", JANITOR_DIR, "-l", node.name, "--yes", "--json"]
    try:
        started = run_fleet(sandbox, "janitor", "start", *janitor, log_dir=tmp_path / "j")
        assert started.code == 0, started.stdout + started.stderr
        yield node
    finally:
        run_fleet(sandbox, "janitor", "stop", *janitor, log_dir=tmp_path / "j")
        sandbox.run_on(
            node, f"rm -rf /usr/local/bin/df {STALE} {JANITOR_DIR}; pkill -KILL -x {MARK}; true"
        )


def test_a_node_whose_disk_check_hangs_still_shows_its_run_and_names_the_step(
    sandbox: Any, hung_df: Any, tmp_path: Path
) -> None:
    result = run_fleet(
        sandbox, "status", "--dir", STALE, "-l", hung_df.name, log_dir=tmp_path, timeout_s=120
    )
    assert result.code == 4, result.stdout + result.stderr  # a step timed out
    [row] = [line for line in result.stdout.splitlines() if line.startswith(hung_df.name + " ")]
    assert "timed_out" not in row.split()[1], row  # the run column holds the run's state
    assert "disk: step timed out after 30s" in row, row
    assert "janitor:" not in row, row  # its step answered: its df was of a healthy mount
