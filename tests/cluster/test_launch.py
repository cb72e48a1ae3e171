"""`fleet launch`, `status`, `logs` and `stop` against real sshd nodes.

No GPU or PyTorch runs here: a small Python stand-in named `torchrun` sits on each node's PATH
(tests/cluster/trainer_standin.py). It records the arguments and environment fleet rendered, and
rank 0 listens on the master port while the other ranks connect to it, as a rendezvous would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import poll, run_fleet

pytestmark = pytest.mark.cluster

STANDIN = Path(__file__).with_name("trainer_standin.py")
# /tmp on a sandbox node is a small tmpfs: preflight's free-space floor is lowered, not skipped.
LAUNCH = ("launch", "--dir", "/tmp", "--var", "min_free_gb=0.01", "--json")


def _record(sandbox: Any, node: Any) -> dict[str, Any] | None:
    out = sandbox.run_on(node, "cat /tmp/trainer-record.json 2>/dev/null").stdout
    return json.loads(out) if out.strip() else None


def _alive(sandbox: Any, node: Any, pid: int) -> bool:
    return sandbox.run_on(node, f"kill -0 {pid}").returncode == 0


@pytest.fixture
def standin(sandbox: Any) -> Iterator[None]:
    """`torchrun` on every node is the stand-in; afterwards no launched process is left."""
    for node in sandbox.nodes():
        target = node.bin_dir / "torchrun"
        target.write_text(STANDIN.read_text())
        target.chmod(0o755)
        sandbox.run_on(node, "rm -f /tmp/trainer-record.json /tmp/fail-launch")
    yield
    for node in sandbox.nodes():
        (node.bin_dir / "torchrun").unlink(missing_ok=True)
        record = _record(sandbox, node)
        if record:
            sandbox.run_on(node, f"kill -KILL {record['pid']} 2>/dev/null; true")
        sandbox.run_on(
            node, "rm -rf /tmp/trainer-record.json /tmp/fail-launch /root/.local/state/fleet/launch"
        )


def test_launch_starts_every_rank_with_the_right_master_then_status_logs_stop(
    sandbox: Any, standin: None, tmp_path: Path
) -> None:
    nodes = sandbox.nodes()
    result = run_fleet(
        sandbox,
        *LAUNCH,
        "--run-id",
        "run-a",
        "--master-port",
        "29511",
        "--env",
        "EXTRA=from-cli",
        "--env",
        "SPACED=a b; c",
        "--",
        "train.py",
        "--deepspeed",
        "ds config.json",
        log_dir=tmp_path,
    )
    assert result.code == 0, result.stdout + result.stderr

    records = {n.name: poll(timeout_s=20, check=lambda n=n: _record(sandbox, n)) for n in nodes}
    assert all(records.values()), records
    ranks = sorted(int(r["env"]["NODE_RANK"]) for r in records.values())
    assert ranks == [0, 1, 2, 3]
    for name, r in records.items():
        assert r["hostname"] == name
        assert r["args"]["node_rank"] == r["env"]["NODE_RANK"]
        assert r["env"]["MASTER_ADDR"] == nodes[0].address == r["args"]["master_addr"]
        assert r["env"]["MASTER_PORT"] == "29511" == r["args"]["master_port"]
        assert r["env"]["NNODES"] == "4"
        assert r["env"]["NPROC_PER_NODE"] == "8"  # the sandbox inventory's gpus
        assert r["env"]["EXTRA"] == "from-cli"
        assert r["env"]["SPACED"] == "a b; c"  # quoted all the way, not split or executed
        assert r["rest"] == ["train.py", "--deepspeed", "ds config.json"]
    assert records[nodes[0].name]["env"]["NODE_RANK"] == "0"
    assert all(r["connected"] for r in records.values() if r["env"]["NODE_RANK"] != "0")

    # it survives the SSH session that started it
    status = run_fleet(sandbox, "status", "--json", log_dir=tmp_path)
    assert status.code == 0, status.stdout
    states = status.run_states()
    assert {(s["run"], s["state"]) for s in states.values()} == {("run-a", "running")}
    assert sorted(states) == [n.name for n in nodes]

    logs = run_fleet(sandbox, "logs", "-n", "2", log_dir=tmp_path)
    assert logs.code == 0, logs.stderr
    for node in nodes:
        rank = records[node.name]["env"]["NODE_RANK"]
        assert any(
            line.startswith(f"{node.name} | rank {rank} step") for line in logs.stdout.splitlines()
        ), logs.stdout

    # a second launch while one runs is refused on every node, and the first run is untouched
    again = run_fleet(
        sandbox,
        *LAUNCH,
        "--run-id",
        "run-b",
        "--master-port",
        "29512",
        "--force",
        "--",
        "train.py",
        log_dir=tmp_path,
    )
    assert again.code == 3
    assert "still running" in again.stdout
    for node in nodes:
        assert _alive(sandbox, node, records[node.name]["pid"])

    stopped = run_fleet(sandbox, "stop", "--yes", "--grace", "2", log_dir=tmp_path)
    assert stopped.code == 0, stopped.stdout
    for node in nodes:
        pid = records[node.name]["pid"]
        assert poll(timeout_s=20, check=lambda n=node, p=pid: not _alive(sandbox, n, p)), (
            f"{node.name} still runs"
        )


def test_a_node_that_fails_to_start_rolls_the_launch_back_everywhere(
    sandbox: Any, standin: None, tmp_path: Path
) -> None:
    nodes = sandbox.nodes()
    sandbox.run_on(nodes[2], "touch /tmp/fail-launch")

    result = run_fleet(sandbox, *LAUNCH, "--run-id", "run-c", "--", "train.py", log_dir=tmp_path)

    assert result.code == 3, result.stdout + result.stderr
    assert "all or nothing" in result.stderr
    for node in nodes:
        if node is nodes[2]:
            continue
        record = poll(timeout_s=20, check=lambda n=node: _record(sandbox, n))
        assert record, f"{node.name} never started"
        assert poll(
            timeout_s=20, check=lambda n=node, p=record["pid"]: not _alive(sandbox, n, p)
        ), f"{node.name}: the run was not rolled back"
    status = run_fleet(sandbox, "status", "--json", log_dir=tmp_path)
    assert status.code == 3, status.stdout  # no node's run is healthy
    states = status.run_states()
    assert states[nodes[2].name]["state"] == "failed"  # exited at once
    assert "stand-in: refusing to start" in states[nodes[2].name]["log_tail"][-1]
    assert all(s["state"] == "stopped" for n, s in states.items() if n != nodes[2].name), states


def test_preflight_failure_refuses_to_launch(sandbox: Any, standin: None, tmp_path: Path) -> None:
    result = run_fleet(
        sandbox,
        "launch",
        "--dir",
        "/nonexistent/ckpt",
        "--json",
        "--",
        "train.py",
        log_dir=tmp_path,
    )

    assert result.code == 3
    assert "not launching" in result.stderr
    for node in sandbox.nodes():
        assert _record(sandbox, node) is None, f"{node.name} started despite preflight"


def test_launch_inside_a_container_then_status_logs_stop(
    sandbox: Any, standin: None, tmp_path: Path
) -> None:
    """`--container`: the job starts with `docker exec -d` inside the container's own PID
    namespace. No Docker engine runs here: the nodes get the docker stand-in of the kill-docker
    tests (tests/cluster/docker_shim.sh), whose containers are real child PID+mount namespaces."""
    node = sandbox.nodes()[1]
    shim = node.bin_dir / "docker"
    shim.write_text(Path(__file__).with_name("docker_shim.sh").read_text())
    shim.chmod(0o755)
    try:
        sandbox.run_on(node, "docker run -d --name trainbox pytorch:24.05 sleep 600")
        result = run_fleet(
            sandbox,
            *LAUNCH,
            "--limit",
            node.name,
            "--container",
            "trainbox",
            "--run-id",
            "run-box",
            "--",
            "train.py",
            log_dir=tmp_path,
        )
        assert result.code == 0, result.stdout + result.stderr
        calls = sandbox.run_on(node, "cat /run/fake-docker/calls").stdout
        assert "docker exec -d trainbox" in calls

        record = poll(timeout_s=20, check=lambda: _record(sandbox, node))
        assert record is not None
        assert record["env"]["NODE_RANK"] == "0"
        status = run_fleet(sandbox, "status", "--limit", node.name, "--json", log_dir=tmp_path)
        lines = [e["line"] for e in status.json_lines() if e["event"] == "OutputLine"]
        assert any("run=run-box state=running" in line for line in lines), lines

        logs = run_fleet(sandbox, "logs", "--limit", node.name, "-n", "1", log_dir=tmp_path)
        assert logs.code == 0, logs.stderr
        assert f"{node.name} | rank 0 step" in logs.stdout

        stopped = run_fleet(
            sandbox, "stop", "--limit", node.name, "--grace", "1", "--json", log_dir=tmp_path
        )
        assert stopped.code == 0, stopped.stdout
        again = run_fleet(sandbox, "status", "--limit", node.name, "--json", log_dir=tmp_path)
        lines = [e["line"] for e in again.json_lines() if e["event"] == "OutputLine"]
        assert any("run=run-box state=exited" in line for line in lines), lines
    finally:
        sandbox.run_on(node, "docker stop -t 0 trainbox >/dev/null 2>&1; rm -rf /run/fake-docker")
        shim.unlink()
