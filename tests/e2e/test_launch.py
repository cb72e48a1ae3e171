"""`fleet launch`, `status`, `logs` and `stop` against real sshd nodes, with real PyTorch: the
venv's torchrun starts tests/support/ddp_train.py (DDP over gloo, 2 processes per node, see
realtorch.py), which records what fleet and torchrun handed each rank (host, rendezvous
environment, --env values, its arguments) once every rank has joined and all-reduced.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docker_engine import DockerEngine, image_name
from fleetrun import poll, run_fleet
from realtorch import STATE, TORCHRUN, TRAIN_PY, TRAINER, VENV, Runs, logs, status, steps_reached

pytestmark = pytest.mark.root

RECORD = "/tmp/rank-{rank}.json"


def _records(sandbox: Any, node: Any) -> list[dict[str, Any]] | None:
    """Both ranks' records on the node, once both are written."""
    out = sandbox.run_on(node, "cat /tmp/rank-*.json 2>/dev/null; true").stdout
    found = [json.loads(line) for line in out.replace("}{", "}\n{").splitlines() if line]
    return found if len(found) == 2 else None


def test_launch_starts_every_rank_with_the_right_master_then_status_logs_stop(
    sandbox: Any, runs: Runs, tmp_path: Path
) -> None:
    nodes = sandbox.nodes()
    result = runs.launch(
        "run-a",
        tmp_path,
        "--master-port",
        "29511",
        "--env",
        "EXTRA=from-cli",
        "--env",
        "SPACED=a b; c",
        args=("--record", RECORD, "--deepspeed", "ds config.json"),
    )
    assert result.code == 0, result.stdout + result.stderr

    records = {
        n.name: poll(lambda n=n: _records(sandbox, n), timeout_s=180, step_s=1) for n in nodes
    }
    assert all(records.values()), records
    ranks = sorted(int(r["env"]["RANK"]) for rs in records.values() for r in rs)
    assert ranks == list(range(8))
    for index, node in enumerate(nodes):
        for r in records[node.name]:
            env = r["env"]
            assert r["hostname"] == node.name
            assert env["NODE_RANK"] == env["GROUP_RANK"] == str(index)  # fleet's and torchrun's
            assert int(env["RANK"]) // 2 == index
            assert env["MASTER_ADDR"] == nodes[0].address
            assert env["MASTER_PORT"] == "29511"
            assert (env["NNODES"], env["NPROC_PER_NODE"], env["WORLD_SIZE"]) == ("4", "2", "8")
            assert env["EXTRA"] == "from-cli"
            assert env["SPACED"] == "a b; c"  # quoted all the way, not split or executed
            assert env["FLEET_RUN_ID"] == "run-a"
            assert r["rest"] == ["--deepspeed", "ds config.json"]

    # it survives the SSH session that started it
    code, states = status(sandbox, tmp_path)
    assert code == 0, states
    assert {(s["run"], s["state"]) for s in states.values()} == {("run-a", "running")}
    assert sorted(states) == [n.name for n in nodes]

    assert poll(lambda: steps_reached(logs(sandbox, tmp_path, "run-a"), 2), 60, 1)
    tail = run_fleet(sandbox, "logs", "-n", "2", log_dir=tmp_path)
    assert tail.code == 0, tail.stderr
    for node in nodes:
        mine = [x for x in tail.stdout.splitlines() if x.startswith(f"{node.name} | ")]
        assert len(mine) == 2, tail.stdout

    # a second launch while one runs is refused on every node, and the first run is untouched
    before = {n.name: runs.pids(n, "run-a") for n in nodes}
    again = runs.launch("run-b", tmp_path, "--master-port", "29512", "--force")
    assert again.code == 3
    assert "still running" in again.stdout
    for node in nodes:
        assert set(before[node.name]) <= set(runs.pids(node, "run-a")), node.name
        assert runs.pids(node, "run-b") == []

    stopped = run_fleet(sandbox, "stop", "--yes", "--grace", "5", log_dir=tmp_path)
    assert stopped.code == 0, stopped.stdout
    for node in nodes:
        assert runs.pids(node, "run-a") == [], f"{node.name} still runs"


def test_a_node_that_fails_to_start_rolls_the_launch_back_everywhere(
    sandbox: Any, runs: Runs, tmp_path: Path
) -> None:
    """node03 has no torchrun (a venv missing on one node): its start fails at once, and the
    run is stopped where it did start."""
    nodes = sandbox.nodes()
    for node in nodes:
        if node is not nodes[2]:
            (node.bin_dir / "torchrun").symlink_to(TORCHRUN)
    try:
        result = runs.launch("run-c", tmp_path, launcher="/usr/local/bin/torchrun")
    finally:
        for node in nodes:
            (node.bin_dir / "torchrun").unlink(missing_ok=True)

    assert result.code == 3, result.stdout + result.stderr
    assert "all or nothing" in result.stderr
    for node in nodes:
        assert runs.pids(node, "run-c") == [], f"{node.name}: the run was not rolled back"
    code, states = status(sandbox, tmp_path)
    assert code == 3, states  # no node's run is healthy
    failed = states[nodes[2].name]
    assert (failed["state"], failed["detail"]) == ("failed", "exit 127")
    assert "No such file or directory" in failed["log_tail"][-1]
    assert all(s["state"] == "stopped" for n, s in states.items() if n != nodes[2].name), states


def test_preflight_failure_refuses_to_launch(sandbox: Any, runs: Runs, tmp_path: Path) -> None:
    result = runs.launch("run-p", tmp_path, "--dir", "/nonexistent/ckpt")

    assert result.code == 3
    assert "not launching" in result.stderr
    for node in sandbox.nodes():
        assert sandbox.run_on(node, f"test -e {STATE}").returncode == 1, node.name
        assert runs.pids(node, "run-p") == []


@pytest.fixture
def trainbox(
    sandbox: Any, docker_engine: DockerEngine, tmp_path: Path
) -> Iterator[tuple[Any, str]]:
    """A real container on the private engine, reachable from node02 as its docker: the image
    has python3 but no torch, so the venv is mounted read-only at the same path (its python is
    the distribution's, as the image's is), and train.py at /usr/local/bin/train.py."""
    node = sandbox.nodes()[1]
    name = f"trainbox-{uuid.uuid4().hex[:8]}"
    script = docker_engine.root / f"{name}-train.py"
    script.write_text(TRAINER.read_text())
    docker_engine.attach(sandbox, node)
    try:
        docker_engine.docker(
            "run",
            "-d",
            "--init",
            "--name",
            name,
            "-v",
            f"{VENV}:{VENV}:ro",
            "-v",
            f"{script}:{TRAIN_PY}:ro",
            image_name(),
            "sleep",
            "infinity",
        )
        yield node, name
    finally:
        docker_engine.docker("rm", "-f", name, check=False)
        docker_engine.detach(sandbox, node)
        script.unlink()


def in_box(engine: DockerEngine, box: str, script: str) -> str:
    return engine.docker("exec", box, "sh", "-c", script, check=False).stdout


def test_launch_inside_a_container_then_status_logs_crash_stop(
    docker_engine: DockerEngine,
    runs: Runs,
    trainbox: tuple[Any, str],
    tmp_path: Path,
) -> None:
    """`--container`: the job starts with `docker exec -d` in the container's own PID namespace
    (invisible from the node), and status, logs and stop reach it there. The container has
    loopback only, so the one-node job rendezvouses on 127.0.0.1 over lo."""
    node, box = trainbox
    result = runs.launch(
        "run-box",
        tmp_path,
        "--limit",
        node.name,
        "--container",
        box,
        "--master-addr",
        "127.0.0.1",
        "--env",
        "GLOO_SOCKET_IFNAME=lo",
        args=("--record", "/tmp/rank-{rank}.json"),
    )
    assert result.code == 0, result.stdout + result.stderr

    def recorded() -> dict[str, Any] | None:
        out = in_box(docker_engine, box, "cat /tmp/rank-1.json 2>/dev/null")
        return json.loads(out) if out.strip() else None

    record = poll(recorded, timeout_s=120, step_s=0.5)
    assert record is not None
    assert record["env"]["FLEET_RUN_ID"] == "run-box"
    assert (record["env"]["NODE_RANK"], record["env"]["WORLD_SIZE"]) == ("0", "2")
    assert record["hostname"] != node.name  # it ran in the container, not on the node
    assert runs.pids(node, "run-box") == []  # nothing of it on the node itself

    code, states = status(sandbox_of(runs), tmp_path, "--limit", node.name)
    assert code == 0, states
    assert (states[node.name]["run"], states[node.name]["state"]) == ("run-box", "running")
    text = logs(sandbox_of(runs), tmp_path, "run-box", "--limit", node.name)
    assert f"{node.name} | rank 1 allreduce ok world=2 sum=1" in text, text

    # the agent dies inside the container: its workers go on, and status says so
    agent = in_box(docker_engine, box, "cat /tmp/fleet-launch-run-box/launcher").strip()
    in_box(docker_engine, box, f"kill -KILL {agent}")

    def flagged() -> dict[str, Any] | None:
        code, states = status(sandbox_of(runs), tmp_path, "--limit", node.name)
        return states[node.name] if code == 3 and states[node.name]["state"] == "orphaned" else None

    assert poll(flagged, timeout_s=30, step_s=0.5), status(sandbox_of(runs), tmp_path)

    stopped = run_fleet(
        sandbox_of(runs), "stop", "--limit", node.name, "--grace", "5", "--plain", log_dir=tmp_path
    )
    assert stopped.code == 0, stopped.stdout
    assert re.search(
        rf"^{node.name} \|   killed pid=\d+ by \w+: .*train[.]py", stopped.stdout, re.M
    )
    left = in_box(docker_engine, box, "grep -lzx FLEET_RUN_ID=run-box /proc/[0-9]*/environ")
    assert left == "", left
    assert docker_engine.docker("inspect", "-f", "{{.State.Running}}", box).stdout.strip() == "true"
    code, states = status(sandbox_of(runs), tmp_path, "--limit", node.name)
    assert (code, states[node.name]["state"]) == (3, "stopped")


def sandbox_of(runs: Runs) -> Any:
    return runs.sandbox


def test_launch_and_status_json_end_with_a_line_whose_exit_code_is_fleets(
    sandbox: Any, runs: Runs, tmp_path: Path
) -> None:
    """Scripts read the last JSON line. A launch is a chain of runs (preflight, start, roll
    back) and status has its own verdict: the last RunFinished (the roll back's stop, or the
    status run where every node answered) says 0 while fleet exits 3. The verb's own last
    line says what fleet exits with."""
    nodes = sandbox.nodes()
    for node in nodes:
        if node is not nodes[2]:
            (node.bin_dir / "torchrun").symlink_to(TORCHRUN)
    try:
        result = runs.launch("run-j", tmp_path, "--json", launcher="/usr/local/bin/torchrun")
    finally:
        for node in nodes:
            (node.bin_dir / "torchrun").unlink(missing_ok=True)

    assert result.code == 3, result.stdout + result.stderr
    lines = result.json_lines()
    last = lines[-1]
    assert (last["event"], last["verb"], last["exit_code"]) == ("VerbFinished", "launch", 3)
    finished = [x for x in lines if x["event"] == "RunFinished"]
    assert finished[-1]["exit_code"] == 0  # the roll back's stop: not fleet's exit code
    assert [(p["run_id"], p["playbook"], p["exit_code"]) for p in last["runs"]] == [
        (r["run_id"], r["playbook"], r["exit_code"]) for r in finished
    ]
    start = next(p for p in last["runs"] if p["exit_code"] == 3)
    assert start["counts"] == {"ok": 3, "failed": 1}

    status = run_fleet(sandbox, "status", "--json", log_dir=tmp_path)
    assert status.code == 3, status.stdout + status.stderr  # no node's run is healthy
    lines = status.json_lines()
    assert [x["event"] for x in lines[-1:]] == ["VerbFinished"]
    assert (lines[-1]["verb"], lines[-1]["exit_code"]) == ("status", 3)
    (run,) = [x for x in lines if x["event"] == "RunFinished"]
    assert run["exit_code"] == 0  # every node answered; the verdict is status's own
    assert lines[-1]["runs"][0]["run_id"] == run["run_id"]
