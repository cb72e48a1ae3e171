"""Real training through fleet: PyTorch's CPU build, `torchrun`, DDP over gloo, on 4 sandbox nodes
x 2 processes (tests/support/ddp_train.py, installed on each node as /usr/local/bin/train.py).

Nothing here is a stand-in: the launcher is the torchrun of a venv that scripts/setup builds from
the distribution's python3 under /opt (sandbox nodes have a private /root and /tmp, so a venv or a
checkout there is invisible to them), every rank joins one process group across the four nodes'
network namespaces and all-reduces, DataLoader workers run, and `torch.save` writes real shards
that the janitor deletes while training goes on. Node names do not resolve here, so the job gets
GLOO_SOCKET_IFNAME=eth0 (what an operator sets on a cluster without DNS for its nodes).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fleetrun import poll, run_fleet
from realtorch import (
    CKPT,
    STATE,
    TORCH_LEFTOVERS,
    Runs,
    all_ranks_reduced,
    logs,
    status,
    steps_reached,
)

pytestmark = pytest.mark.root

FINITE = ("--steps", "24", "--save-every", "3", "--step-s", "0.2")
RANKS = range(8)


def training_processes(sandbox: Any, node: Any) -> str:
    """Every process on the node whose command line names torchrun or train.py."""
    return str(sandbox.run_on(node, "pgrep -af '[t]orchrun|[t]rain[.]py' || true").stdout).strip()


def test_a_run_trains_on_every_rank_finishes_and_the_janitor_bounds_its_shards(
    sandbox: Any, runs: Runs, tmp_path: Path
) -> None:
    nodes = sandbox.nodes()
    janitor = run_fleet(
        sandbox,
        "janitor",
        "start",
        "--dir",
        CKPT,
        "--interval",
        "0.5",
        "--min-age",
        "0",
        "--yes",
        log_dir=tmp_path,
    )
    assert janitor.code == 0, janitor.stdout + janitor.stderr
    try:
        started = runs.launch("finite-1", tmp_path, args=FINITE)
        assert started.code == 0, started.stdout + started.stderr

        # status while it runs: every node running, healthy, exit 0
        code, states = status(sandbox, tmp_path)
        assert code == 0, states
        assert {s["state"] for s in states.values()} == {"running"}, states

        def finished() -> dict[str, dict[str, Any]] | None:
            code, states = status(sandbox, tmp_path)
            done = {s["state"] for s in states.values()} == {"finished"}
            return states if code == 0 and done else None

        assert poll(finished, timeout_s=240, step_s=2), status(sandbox, tmp_path)
        text = logs(sandbox, tmp_path, "finite-1")
        assert all_ranks_reduced(text), text
        assert all(f"rank {r} done" in text for r in RANKS), text
        # the shards were real and written all along: 8 saves per rank
        assert all(text.count(f"rank {r} saved ") == 8 for r in RANKS), text

        def janitor_done(node: Any) -> bool:
            left = sandbox.run_on(node, f"find {CKPT} -name '*_states.pt' | wc -l").stdout
            return int(left) == 0

        for node in nodes:
            assert poll(lambda n=node: janitor_done(n), timeout_s=30), f"{node.name}: shards left"
            latest = sandbox.run_on(node, f"cat {CKPT}/latest").stdout
            assert latest.strip() == "global_step24", f"{node.name}: the janitor took `latest`"
        stats = run_fleet(sandbox, "janitor", "status", "--dir", CKPT, "--json", log_dir=tmp_path)
        deleted = [
            int(m.group(1))
            for e in stats.json_lines()
            if e["event"] == "OutputLine" and (m := re.search(r"\bdeleted=(\d+)", e["line"]))
        ]
        # 2 ranks x 2 shards x 8 saves on every node, all deleted while training went on
        assert deleted == [32] * len(nodes), stats.stdout
    finally:
        run_fleet(sandbox, "janitor", "stop", "--dir", CKPT, "--yes", log_dir=tmp_path)

    # what torch leaves after a clean run, and cleanup removing it
    for node in nodes:
        left = sandbox.run_on(node, "ls -d " + " ".join(TORCH_LEFTOVERS)).stdout.split()
        assert any(p.startswith("/tmp/torchelastic_") for p in left), left
    cleaned = run_fleet(sandbox, "cleanup", "--yes", "--grace", "2", log_dir=tmp_path)
    assert cleaned.code == 0, cleaned.stdout + cleaned.stderr
    for node in nodes:
        left = sandbox.run_on(node, "ls -d " + " ".join(TORCH_LEFTOVERS) + " 2>/dev/null")
        assert left.stdout.split() == [], f"{node.name}: cleanup left {left.stdout}"


def test_a_crashed_agent_is_flagged_relaunched_over_with_cleanup_and_stop_leaves_nothing(
    sandbox: Any, runs: Runs, tmp_path: Path
) -> None:
    nodes = sandbox.nodes()
    first = runs.launch("crash-1", tmp_path)
    assert first.code == 0, first.stdout + first.stderr
    assert poll(lambda: steps_reached(logs(sandbox, tmp_path, "crash-1"), 3), 180, 2)
    assert all_ranks_reduced(logs(sandbox, tmp_path, "crash-1"))

    # kill -9 of node02's torchrun agent: its workers are re-parented, and train on
    victim = nodes[1]
    agent = sandbox.run_on(victim, f"cat {STATE}/crash-1/launcher").stdout.strip()
    workers_before = set(runs.pids(victim, "crash-1")) - {int(agent)}
    assert sandbox.run_on(victim, f"kill -KILL {agent}").returncode == 0

    def flagged() -> dict[str, dict[str, Any]] | None:
        code, states = status(sandbox, tmp_path)
        return states if code == 3 and states[victim.name]["state"] == "orphaned" else None

    states = poll(flagged, timeout_s=60, step_s=1)
    assert states, status(sandbox, tmp_path)
    assert states[victim.name]["detail"].startswith("launcher killed by SIGKILL; ")
    assert all(states[n.name]["state"] == "running" for n in nodes if n is not victim), states
    orphans = set(runs.pids(victim, "crash-1"))
    assert orphans, "the workers died with their agent"
    assert orphans <= workers_before

    # the one-command relaunch over the ghosts: cleanup, then preflight, then the start
    second = runs.launch("crash-2", tmp_path, "--cleanup", "--yes")
    assert second.code == 0, second.stdout + second.stderr
    for node in nodes:
        assert runs.pids(node, "crash-1") == [], f"{node.name}: run 1 survived"
    assert poll(lambda: steps_reached(logs(sandbox, tmp_path, "crash-2"), 2), 180, 2)
    assert all_ranks_reduced(logs(sandbox, tmp_path, "crash-2"))
    code, states = status(sandbox, tmp_path)
    assert code == 0, states
    assert {(s["run"], s["state"]) for s in states.values()} == {("crash-2", "running")}

    stopped = run_fleet(sandbox, "stop", "--yes", "--grace", "10", "--plain", log_dir=tmp_path)
    assert stopped.code == 0, stopped.stdout + stopped.stderr
    for node in nodes:
        killed = rf"^{node.name} \|   killed pid=\d+ by (TERM|KILL): .*torchrun"
        assert re.search(killed, stopped.stdout, re.M), stopped.stdout
        done = f"{node.name} |   stopped run=crash-2: none of its processes is left"
        assert done in stopped.stdout
        assert runs.pids(node, "crash-2") == []
        assert training_processes(sandbox, node) == ""
    code, states = status(sandbox, tmp_path)
    assert code == 3  # a stopped run is not a healthy one
    assert {s["state"] for s in states.values()} == {"stopped"}
