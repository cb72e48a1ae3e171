"""Hosts without an inventory, end to end: `fleet exec -w NODESET` on real sshd nodes, reached
through the sandbox's ssh config alone, then `-l @failed` reruns on the one node that failed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fleetrun import run_fleet

from fleet.core import nodeset

pytestmark = pytest.mark.root

# No inventory at all: the hosts come from -w, how to reach them from the sandbox's ssh config
# (its Host aliases, key and known_hosts), as for hosts named to pdsh.
NO_INVENTORY = {"FLEET_INVENTORY": ""}


def test_a_node_set_runs_without_an_inventory_and_failed_reruns_only_there(
    sandbox: Any, tmp_path: Path
) -> None:
    names = [node.name for node in sandbox.nodes()]
    nodes = nodeset.fold(names)  # node[01-04], as an operator types it
    bad = names[1]

    first = run_fleet(
        sandbox,
        "exec",
        "-w",
        nodes,
        f'test "$(hostname)" != {bad}',
        "--json",
        log_dir=tmp_path,
        extra_env=NO_INVENTORY,
    )
    assert first.code == 3, first.stdout + first.stderr
    outcomes = {h: r["outcome"] for h, r in first.final()["hosts"].items()}
    assert outcomes == {name: "failed" if name == bad else "ok" for name in names}

    listed = run_fleet(
        sandbox,
        "hosts",
        "-w",
        nodes,
        "-l",
        "@failed",
        "--json",
        log_dir=tmp_path,
        extra_env=NO_INVENTORY,
    )
    assert listed.code == 0, listed.stderr
    assert [(h["name"], h["source"]) for h in json.loads(listed.stdout)] == [(bad, "-w")]

    again = run_fleet(
        sandbox,
        "exec",
        "-w",
        nodes,
        "-l",
        "@failed",
        "hostname",
        "--json",
        log_dir=tmp_path,
        extra_env=NO_INVENTORY,
    )
    assert again.code == 0, again.stdout + again.stderr
    final = again.final()
    assert {h: r["outcome"] for h, r in final["hosts"].items()} == {bad: "ok"}
    # It ran there, and only there: the one output is that node's own hostname.
    assert [(g["hosts"], [ln["text"] for ln in g["lines"]]) for g in final["output"]] == [
        (bad, [bad])
    ]

    # That rerun is now the newest record, and nothing failed in it.
    nothing = run_fleet(
        sandbox,
        "exec",
        "-w",
        nodes,
        "-l",
        "@failed",
        "true",
        log_dir=tmp_path,
        extra_env=NO_INVENTORY,
    )
    assert nothing.code == 1
    assert nothing.stderr.startswith(
        "fleet: error: -l @failed: no host was failed in the last fleet exec run"
    )
    assert "Traceback" not in nothing.stderr


def test_w_host_port_connects_to_that_port(sandbox: Any, tmp_path: Path) -> None:
    """`-w node01:2222` reaches the sshd listening on 2222 (a second one, started here on the
    node), though the ssh config says Port 22; a port nothing listens on is unreachable."""
    node = sandbox.nodes()[0]
    inner = "/run/fleet"
    started = sandbox.run_on(
        node,
        f"sed -e 's/:22$/:2222/' -e 's/sshd.pid/sshd-2222.pid/' {inner}/sshd_config "
        f"> {inner}/sshd_config_2222 && /usr/sbin/sshd -f {inner}/sshd_config_2222 "
        f"-E {inner}/sshd-2222.log",
    )
    assert started.returncode == 0, started.stderr
    # OpenSSH's known_hosts names a host on another port `[address]:port`; the key is the same.
    known = tmp_path / "known_hosts"
    lines = sandbox.known_hosts_path.read_text().splitlines()
    known.write_text(
        "".join(
            f"[{line.split()[0]}]:2222 {line.split(None, 1)[1]}\n"
            for line in lines
            if line.split()[:1] == [node.address]
        )
    )
    config = tmp_path / "ssh_config"
    config.write_text(
        sandbox.ssh_config_path.read_text().replace(str(sandbox.known_hosts_path), str(known))
    )
    try:
        result = run_fleet(
            sandbox,
            "exec",
            "-w",
            f"{node.name}:2222",
            'echo "port=${SSH_CONNECTION##* }"',
            "--json",
            log_dir=tmp_path,
            ssh_config=config,
            extra_env=NO_INVENTORY,
        )
        assert result.code == 0, result.stdout + result.stderr
        final = result.final()
        assert [ln["text"] for g in final["output"] for ln in g["lines"]] == ["port=2222"]
        closed = run_fleet(
            sandbox,
            "exec",
            "-w",
            f"{node.name}:2223",
            "true",
            "--json",
            log_dir=tmp_path,
            ssh_config=config,
            extra_env=NO_INVENTORY,
        )
        assert closed.code == 4, closed.stdout + closed.stderr
        assert closed.final()["hosts"][node.name]["outcome"] == "unreachable"
    finally:
        sandbox.run_on(node, f'kill -TERM "$(cat {inner}/sshd-2222.pid)"')


def test_a_limit_that_cannot_be_read_runs_on_no_node(sandbox: Any, tmp_path: Path) -> None:
    """`-l "$EMPTY"`, `-l ':'`, `-l '~['`, `-l 'node01]'`: Ansible's splitter dropped what it
    could not read, and fleet read no term as every host, so `fleet cleanup --yes -l "$EMPTY"`
    cleaned every node. Each is now exit 2 before anything connects."""
    names = [node.name for node in sandbox.nodes()]
    mark = f"/tmp/fleet-unreadable-limit-{tmp_path.name}"
    records = tmp_path / "runs"
    stem = names[0].rstrip("0123456789")  # node01 -> node
    for limit in ("", " ", ":", "::", "~[", f"~{stem}0[", f"{names[0]}]", "all,!"):
        refused = run_fleet(
            sandbox, "exec", "--yes", "-l", limit, f"touch {mark}", "--json", log_dir=records
        )
        assert refused.code == 2, (limit, refused.stdout, refused.stderr)
        assert refused.stdout == ""
        assert refused.stderr.startswith("fleet: error: --limit"), refused.stderr
    cleanup = run_fleet(sandbox, "cleanup", "--yes", "-l", "", "--json", log_dir=records)
    assert cleanup.code == 2, cleanup.stdout + cleanup.stderr
    assert cleanup.stdout == ""
    assert not records.exists()  # no run was even recorded

    check = run_fleet(sandbox, "exec", f"test ! -e {mark}", "--json", log_dir=records)
    assert check.code == 0, check.stdout + check.stderr  # no node has the mark
    assert sorted(check.final()["hosts"]) == sorted(names)
