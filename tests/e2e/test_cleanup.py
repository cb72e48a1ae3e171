"""`fleet cleanup` against real sshd nodes, each in its own network, PID and mount namespaces.

No GPU exists here: nodes have no `nvidia-smi` (the reset step must report "skipped"), except where
a test drops a small `nvidia-smi` stand-in on one node's PATH that records its arguments.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import run_fleet

from fleet.sandbox.ghosts import plant_ghosts, read_ghosts

pytestmark = pytest.mark.root


@pytest.fixture(autouse=True)
def _no_ghosts_left_behind(sandbox: Any) -> Iterator[None]:
    """Each test plants its own ghosts; afterwards every planted process is gone (by pid)."""
    yield
    for node in sandbox.nodes():
        g = read_ghosts(sandbox, node)
        pids = " ".join(str(p) for p in (*g.training, *g.bystander))
        sandbox.run_on(
            node,
            f"kill -KILL {pids} 2>/dev/null; pkill -f '^python3 /tmp/rdzv_store.py'; "
            "rm -rf /tmp/.torch_distributed_ghost /tmp/cuda_ghost /root/.nv "
            "/dev/shm/torch_ghost_*; true",
        )


def _assert_clean(box: Any, node: Any) -> None:
    ghosts = read_ghosts(box, node)
    assert ghosts.training == (), f"{node.name}: training processes survived: {ghosts.training}"
    assert not ghosts.listening, f"{node.name}: port 39500 still held"
    assert ghosts.paths == (), f"{node.name}: state left: {ghosts.paths}"
    assert ghosts.bystander, f"{node.name}: cleanup killed an unrelated process"


def test_cleanup_cleans_every_node_and_spares_bystanders(sandbox: Any, tmp_path: Path) -> None:
    nodes = sandbox.nodes()
    planted = {}
    for node in nodes:
        plant_ghosts(sandbox, node)
        before = read_ghosts(sandbox, node)
        assert len(before.training) == 2
        assert before.listening
        assert len(before.paths) >= 4
        planted[node.name] = len(before.paths)

    result = run_fleet(sandbox, "cleanup", "--yes", "--grace", "1", "--json", log_dir=tmp_path)

    assert result.code == 0, result.stdout + result.stderr
    final = result.final()
    assert final["exit_code"] == 0
    assert {h: r["outcome"] for h, r in final["hosts"].items()} == {n.name: "ok" for n in nodes}
    for node in nodes:
        # The end summary says what was done: torchrun by TERM, the TERM-ignoring train.py by
        # KILL, the rdzv store holding the port by TERM; every planted path removed.
        host = final["hosts"][node.name]
        paths = planted[node.name]
        assert host["last_line"] == (
            f"killed 3 processes (TERM 2, KILL 1), removed {paths} paths, "
            "port 39500 freed (stopped python3)"
        )
        assert host["done"] == {
            "killed": 3, "by_term": 2, "by_kill": 1, "removed": paths, "remove_failed": 0,
            "port_freed": 39500, "port_holders": host["done"]["port_holders"], "gpu_reset": False,
            "gpus": None, "clean": True, "failed": [], "refused": False,
        }  # fmt: skip
        assert len(host["done"]["port_holders"]) == 1
        _assert_clean(sandbox, node)
    lines = [e for e in result.json_lines() if e["event"] == "OutputLine"]
    killed = [e["line"] for e in lines if e["line"].startswith("killed ")]
    # one torchrun and one TERM-ignoring train.py per node, the latter only by SIGKILL
    assert sum("(KILL)" in k and "train.py" in k for k in killed) == len(nodes)
    assert any("gpu-reset: skipped: no nvidia-smi" in e["line"] for e in lines)
    assert any("port 39500" in e["line"] and "rdzv_store" in e["line"] for e in lines)


def test_cleanup_limit_touches_only_the_named_node(sandbox: Any, tmp_path: Path) -> None:
    node01, node02 = sandbox.nodes()[:2]
    for node in (node01, node02):
        plant_ghosts(sandbox, node)

    result = run_fleet(
        sandbox, "cleanup", "--limit", node02.name, "--grace", "1", "--plain", log_dir=tmp_path
    )

    assert result.code == 0, result.stdout + result.stderr
    _assert_clean(sandbox, node02)
    untouched = read_ghosts(sandbox, node01)
    assert len(untouched.training) == 2
    assert untouched.listening
    assert f"{node01.name} |" not in result.stdout
    run_fleet(sandbox, "cleanup", "--limit", node01.name, "--grace", "1", log_dir=tmp_path)


def test_cleanup_on_many_hosts_refuses_without_yes_when_no_terminal(
    sandbox: Any, tmp_path: Path
) -> None:
    plant_ghosts(sandbox, sandbox.nodes()[0])

    result = run_fleet(sandbox, "cleanup", log_dir=tmp_path)

    assert result.code == 2
    assert "--yes" in result.stderr
    assert len(read_ghosts(sandbox, sandbox.nodes()[0]).training) == 2, "refused run touched a node"
    run_fleet(sandbox, "cleanup", "--yes", "--grace", "1", log_dir=tmp_path)


def test_dry_run_prints_commands_per_host_and_connects_nowhere(
    sandbox: Any, tmp_path: Path
) -> None:
    result = run_fleet(sandbox, "cleanup", "--dry-run", "--var", "port=39501", log_dir=tmp_path)

    assert result.code == 0, result.stderr
    for node in sandbox.nodes():
        assert node.name in result.stdout
    assert "--port 39501" in result.stdout
    assert "--pattern torchrun" in result.stdout
    assert not list(tmp_path.iterdir()), "a dry run must not even write a run record"


def test_gpu_reset_runs_the_node_nvidia_smi_when_gpus_are_idle(
    sandbox: Any, tmp_path: Path
) -> None:
    # Stand-in for the real tool (no GPU here): records its arguments, reports no compute apps.
    node = sandbox.nodes()[2]
    shim = node.bin_dir / "nvidia-smi"
    shim.write_text(
        '#!/bin/sh\necho "$*" >> /tmp/nvidia-smi.calls\n'
        'case "$*" in *--gpu-reset*) echo "GPU 00000000:01:00.0 was reset";; esac\n'
    )
    shim.chmod(0o755)
    try:
        result = run_fleet(sandbox, "cleanup", "--limit", node.name, "--json", log_dir=tmp_path)
        calls = sandbox.run_on(node, "cat /tmp/nvidia-smi.calls").stdout
    finally:
        shim.unlink()
        sandbox.run_on(node, "rm -f /tmp/nvidia-smi.calls")

    assert result.code == 0, result.stdout
    assert "--gpu-reset" in calls
    assert any(e.get("line") == "gpu-reset: done" for e in result.json_lines())


def test_preview_shows_what_each_node_would_lose_and_changes_nothing(
    sandbox: Any, tmp_path: Path
) -> None:
    node = sandbox.nodes()[1]
    plant_ghosts(sandbox, node)
    before = read_ghosts(sandbox, node)

    result = run_fleet(
        sandbox, "cleanup", "--preview", "--limit", node.name, "--json", log_dir=tmp_path
    )

    assert result.code == 0, result.stdout + result.stderr
    (seen,) = [e for e in result.json_lines() if e["event"] == "CleanupPreview"]
    assert seen["host"] == node.name
    assert {p["pid"] for p in seen["processes"]} == set(before.training)
    assert all(p["user"] == "root" and p["command"] for p in seen["processes"])
    assert [p["command"] for p in seen["port_holders"]] == ["python3 /tmp/rdzv_store.py 39500"]
    removed = {p["path"] for p in seen["paths"] if p["action"].startswith("remove")}
    assert {"/tmp/.torch_distributed_ghost", "/tmp/cuda_ghost", "/root/.nv"} <= removed
    assert seen["gpus"] == "gpu-reset: skipped: no nvidia-smi"
    after = read_ghosts(sandbox, node)
    assert (after.training, after.paths, after.listening) == (
        before.training,
        before.paths,
        before.listening,
    )


@pytest.mark.parametrize("pattern", ["sshd", "tini", "."])
def test_patterns_that_reach_sshd_or_the_node_s_init_are_refused_and_touch_nothing(
    sandbox: Any, tmp_path: Path, pattern: str
) -> None:
    """`--pattern .` once killed a node's supervisor and the node went dark; `--pattern sshd`
    killed another user's session. Now the node says what the patterns matched and is left as
    it was."""
    node = sandbox.nodes()[2]
    plant_ghosts(sandbox, node)
    other = sandbox.run_on(node, "setsid bash -c 'exec -a \"sshd: bob@pts/0\" sleep 600' "
                                 "</dev/null >/dev/null 2>&1 & echo $!")  # fmt: skip
    bob = int(other.stdout)
    try:
        result = run_fleet(
            sandbox, "cleanup", "--limit", node.name, "--pattern", pattern, "--grace", "1",
            "--json", log_dir=tmp_path,
        )  # fmt: skip
        bob_alive = sandbox.run_on(node, f"kill -0 {bob}").returncode == 0
    finally:
        sandbox.run_on(node, f"kill -KILL {bob}")

    assert result.code == 3, result.stdout + result.stderr
    host = result.final()["hosts"][node.name]
    assert host["last_line"].startswith("refused: the patterns match what cleanup never kills")
    lines = [e["line"] for e in result.json_lines() if e["event"] == "OutputLine"]
    assert any("(sshd)" in line or "(pid 1)" in line for line in lines), lines
    assert not any(line.startswith("killed ") for line in lines)
    assert bob_alive
    assert len(read_ghosts(sandbox, node).training) == 2, "a refused node was touched"


@pytest.mark.parametrize(
    "planted",
    [
        # a process merely named `sshd`
        "setsid setpriv --reuid=4242 --regid=4242 --clear-groups "
        "bash -c 'exec -a \"sshd: torchrun\" sleep 600'",
        # the real tini, run by the stranger around a trainer
        "cd / && setsid setpriv --reuid=4242 --regid=4242 --clear-groups "
        "tini -s -- sh -c 'sleep 600' train.py",
    ],
    ids=["named-sshd", "own-tini"],
)
def test_a_strangers_daemon_name_neither_stops_the_cleanup_nor_survives_it(
    sandbox: Any, tmp_path: Path, planted: str
) -> None:
    """Any user can name a process `sshd`, or run tini (or docker-init, sshd) themselves.
    Believed from anyone, one such process matching the patterns made every cleanup of the node
    refuse, and the dead run stayed. Another user's daemon name is believed only when its program
    has it and a daemon of root's started it (a user's real `sshd: bob@pts/0`)."""
    node = sandbox.nodes()[1]
    plant_ghosts(sandbox, node)
    started = sandbox.run_on(node, f"{planted} </dev/null >/dev/null 2>&1 & echo $!")
    stranger = int(started.stdout)
    try:
        result = run_fleet(
            sandbox, "cleanup", "--limit", node.name, "--grace", "1", "--json", log_dir=tmp_path
        )
        survived = sandbox.run_on(node, f"kill -0 {stranger}").returncode == 0
    finally:
        sandbox.run_on(node, f"kill -KILL {stranger}")
    assert result.code == 0, result.stdout + result.stderr
    assert not survived
    _assert_clean(sandbox, node)


def test_another_users_program_on_the_rendezvous_port_is_left_and_said(
    sandbox: Any, tmp_path: Path
) -> None:
    """A stranger's `python3 -m http.server PORT`, matching no pattern, is no part of the run:
    cleanup used to stop whatever held the port. It names it, leaves it, and fails the port."""
    node = sandbox.nodes()[1]
    started = sandbox.run_on(
        node,
        "cd / && setsid setpriv --reuid=4242 --regid=4242 --clear-groups "
        "python3 -m http.server 39531 </dev/null >/dev/null 2>&1 & echo $!",
    )
    stranger = int(started.stdout)
    try:
        sandbox.run_on(node, "for i in $(seq 50); do grep -q ':9A6B ' /proc/net/tcp && break; "
                             "sleep 0.1; done")  # fmt: skip
        result = run_fleet(
            sandbox, "cleanup", "--limit", node.name, "--grace", "1", "--port", "39531",
            "--json", log_dir=tmp_path,
        )  # fmt: skip
        survived = sandbox.run_on(node, f"kill -0 {stranger}").returncode == 0
    finally:
        sandbox.run_on(node, f"kill -KILL {stranger}")
    assert survived, "cleanup stopped another user's unrelated program on the port"
    assert result.code == 3, result.stdout + result.stderr
    lines = [e["line"] for e in result.json_lines() if e["event"] == "OutputLine"]
    assert any(f"port 39531: not stopping {stranger} (user 4242's" in line for line in lines)
    assert result.final()["hosts"][node.name]["last_line"].endswith("failed: port")


def test_a_strangers_environment_naming_the_runs_ghost_state_does_not_keep_it(
    sandbox: Any, tmp_path: Path
) -> None:
    """Any user can name a path in their environment (how a live torchrun worker holds its
    /tmp/torchelastic_*): a stranger's `HOLD=/tmp/cuda_ghost sleep` kept the run's ghost state
    on the node for good, and every cleanup failed. Only root's, fleet's or the owner's use
    keeps a path."""
    node = sandbox.nodes()[1]
    plant_ghosts(sandbox, node)
    started = sandbox.run_on(
        node,
        "cd / && set -- /tmp/cuda_* && setsid setpriv --reuid=4242 --regid=4242 --clear-groups "
        'env HOLD="$1" sleep 600 </dev/null >/dev/null 2>&1 & echo $!',
    )
    stranger = int(started.stdout)
    try:
        result = run_fleet(
            sandbox, "cleanup", "--limit", node.name, "--grace", "1", "--json", log_dir=tmp_path
        )
    finally:
        sandbox.run_on(node, f"kill -KILL {stranger}")
    assert result.code == 0, result.stdout + result.stderr
    _assert_clean(sandbox, node)
