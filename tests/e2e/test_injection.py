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
from docker_engine import DockerEngine
from fleetrun import poll, run_fleet
from realtorch import Runs

pytestmark = pytest.mark.root

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
    # a harmless pattern runs (0); one fleet refuses (a newline) is refused before anything
    # connects (2); what matters is that nothing ran
    assert result.code in (0, 2), result.stdout + result.stderr


@pytest.mark.parametrize("payload", PAYLOADS[:5])
def test_container_names_and_labels_are_quoted(
    sandbox: Any, clean_nodes: list[Any], docker_engine: DockerEngine, tmp_path: Path, payload: str
) -> None:
    # the node's docker is the real (private) engine: every selector reaches the daemon as data
    docker_engine.attach(sandbox, clean_nodes[0])
    try:
        result = _kill_docker_with(sandbox, clean_nodes[0], payload, tmp_path)
    finally:
        docker_engine.detach(sandbox, clean_nodes[0])
    # a selector that matches nothing runs (0, or 3 for a named container that is not there);
    # one fleet cannot use (not a regex, a blank in an image) is refused before anything
    # connects (2); what matters is that nothing ran
    assert result.code in (0, 2, 3), result.stdout + result.stderr


def _kill_docker_with(sandbox: Any, node: Any, payload: str, tmp_path: Path) -> Any:
    return run_fleet(
        sandbox,
        "kill-docker",
        "--container",
        payload,
        "--label",
        payload,
        "--image",
        payload,
        "--limit",
        node.name,
        "--json",
        log_dir=tmp_path,
    )


def test_launch_arguments_and_env_arrive_intact(
    sandbox: Any, clean_nodes: list[Any], runs: Runs, tmp_path: Path
) -> None:
    """Through fleet, launch.sh, the real torchrun and into the training script's argv."""
    node = clean_nodes[0]
    result = runs.launch(
        "inject",
        tmp_path,
        "--limit",
        node.name,
        "--force",
        "--env",
        f"PAYLOAD={PAYLOADS[1]}",
        args=("--record", "/tmp/rank-{rank}.json", *PAYLOADS),
    )
    assert result.code == 0, result.stdout + result.stderr

    def recorded() -> dict[str, Any] | None:
        out = sandbox.run_on(node, "cat /tmp/rank-0.json 2>/dev/null; true").stdout
        return json.loads(out) if out.strip() else None

    record = poll(recorded, timeout_s=120, step_s=0.5)
    assert record is not None
    assert record["env"]["PAYLOAD"] == PAYLOADS[1]
    assert record["rest"] == PAYLOADS


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_launcher_is_words_never_shell_code(
    sandbox: Any, clean_nodes: list[Any], runs: Runs, tmp_path: Path, payload: str
) -> None:
    node = clean_nodes[0]
    result = runs.launch("inject-l", tmp_path, "--limit", node.name, "--force", launcher=payload)
    # nothing by that name exists on the node: the start fails; nothing it named ran
    assert result.code == 3, result.stdout + result.stderr


@pytest.mark.parametrize("name", ["gpu01;touch", "gpu$(x)", "gpu`x`", "a b", "gpu'1"])
def test_host_names_that_are_not_names_are_refused_before_connecting(
    sandbox: Any, tmp_path: Path, name: str
) -> None:
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(f"all:\n  hosts:\n    {json.dumps(name)}: {{ansible_host: 10.0.0.1}}\n")

    result = run_fleet(sandbox, "exec", "true", inventory=inventory, log_dir=tmp_path / "logs")

    assert result.code == 1
    assert "not a host name or range" in result.stderr
    assert not (tmp_path / "logs").exists(), "nothing may run when the inventory is bad"
