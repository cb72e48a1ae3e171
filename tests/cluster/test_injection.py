"""Injection payloads in every place a value reaches a remote shell, run against real nodes.

Each payload, if it ever ran, would create /tmp/pwned on the node. None may; where the value is
data (a pattern, an env value, a launch argument) it must arrive intact.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import run_fleet

pytestmark = pytest.mark.cluster

PAYLOADS = [
    "x; touch /tmp/pwned",
    "$(touch /tmp/pwned)",
    "`touch /tmp/pwned`",
    "a\ntouch /tmp/pwned",
    "'; touch /tmp/pwned; '",
    '"; touch /tmp/pwned; "',
    "x && touch /tmp/pwned",
    "x | touch /tmp/pwned",
    "${IFS}touch${IFS}/tmp/pwned",
]


@pytest.fixture
def clean_nodes(sandbox: Any) -> Iterator[list[Any]]:
    """Every node starts without the marker; after the test, assert it never appeared."""
    nodes = sandbox.nodes()
    for node in nodes:
        sandbox.run_on(node, "rm -f /tmp/pwned")
    yield nodes
    for node in nodes:
        assert sandbox.run_on(node, "test -e /tmp/pwned").returncode != 0, (
            f"{node.name}: a payload executed"
        )


@pytest.mark.parametrize("payload", PAYLOADS)
def test_var_values_are_data_not_code(
    sandbox: Any, clean_nodes: list[Any], tmp_path: Path, payload: str
) -> None:
    playbook = tmp_path / "pb.yaml"
    playbook.write_text("name: echo\nsteps:\n  - name: echo\n    run: printf '[%s]\\n' ${value}\n")

    result = run_fleet(
        sandbox,
        "run",
        str(playbook),
        "--var",
        f"value={payload}",
        "--json",
        "--limit",
        clean_nodes[0].name,
        log_dir=tmp_path / "logs",
    )

    assert result.code == 0, result.stdout + result.stderr
    printed = [e["line"] for e in result.json_lines() if e["event"] == "OutputLine"]
    assert "\n".join(printed) == f"[{payload}]"


@pytest.mark.parametrize("payload", PAYLOADS[:5])
def test_cleanup_patterns_and_port_are_quoted(
    sandbox: Any, clean_nodes: list[Any], tmp_path: Path, payload: str
) -> None:
    result = run_fleet(
        sandbox,
        "cleanup",
        "--pattern",
        payload,
        "--limit",
        clean_nodes[0].name,
        "--json",
        log_dir=tmp_path,
    )
    # an invalid or harmless pattern is fine; what matters is that nothing ran
    assert result.code in (0, 3), result.stdout + result.stderr


@pytest.mark.parametrize("payload", PAYLOADS[:5])
def test_container_names_and_labels_are_quoted(
    sandbox: Any, clean_nodes: list[Any], tmp_path: Path, payload: str
) -> None:
    # no docker on the node: the script still parses every selector before deciding that
    result = run_fleet(
        sandbox,
        "kill-docker",
        "--container",
        payload,
        "--label",
        payload,
        "--image",
        payload,
        "--limit",
        clean_nodes[0].name,
        "--json",
        log_dir=tmp_path,
    )
    assert result.code in (0, 3), result.stdout + result.stderr


def test_launch_arguments_and_env_arrive_intact(
    sandbox: Any, clean_nodes: list[Any], tmp_path: Path
) -> None:
    node = clean_nodes[0]
    # A stand-in `torchrun` (no PyTorch here) that writes its argv and one env var as JSON.
    shim = node.bin_dir / "torchrun"
    shim.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'env': os.environ.get('PAYLOAD')}, "
        "open('/tmp/launch-args.json', 'w'))\nimport time\ntime.sleep(30)\n"
    )
    shim.chmod(0o755)
    try:
        result = run_fleet(
            sandbox,
            "launch",
            "--limit",
            node.name,
            "--dir",
            "/tmp",
            "--force",
            "--run-id",
            "inject",
            "--env",
            f"PAYLOAD={PAYLOADS[1]}",
            "--json",
            "--",
            "train.py",
            *PAYLOADS,
            log_dir=tmp_path,
        )
        assert result.code == 0, result.stdout + result.stderr
        out = sandbox.run_on(
            node,
            "for i in $(seq 50); do [ -s /tmp/launch-args.json ] && break; sleep 0.1; done;"
            " cat /tmp/launch-args.json",
        ).stdout
        recorded = json.loads(out)
        assert recorded["env"] == PAYLOADS[1]
        assert recorded["argv"][-len(PAYLOADS) - 1 :] == ["train.py", *PAYLOADS]
    finally:
        shim.unlink()
        run_fleet(sandbox, "stop", "--limit", node.name, "--grace", "1", log_dir=tmp_path)
        sandbox.run_on(node, "rm -rf /tmp/launch-args.json /root/.local/state/fleet/launch")


@pytest.mark.parametrize("name", ["gpu01;touch", "gpu$(x)", "gpu`x`", "a b", "gpu'1"])
def test_host_names_that_are_not_names_are_refused_before_connecting(
    sandbox: Any, tmp_path: Path, name: str
) -> None:
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(f"all:\n  hosts:\n    {json.dumps(name)}: {{ansible_host: 10.0.0.1}}\n")

    result = run_fleet(sandbox, "exec", "true", inventory=inventory, log_dir=tmp_path / "logs")

    assert result.code == 1
    assert "is not a host name or range" in result.stderr
    assert not (tmp_path / "logs").exists(), "nothing may run when the inventory is bad"
