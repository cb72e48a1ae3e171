"""build_plan: every command for every host, rendered before anything connects."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet.core.errors import ExitCode, TemplateError, UsageError
from fleet.core.playbook import Playbook, load_playbook
from fleet.core.shell import PID_MARKER
from fleet.engine.plan import Plan, build_plan, parse_vars
from fleet.inventory.loader import Inventory, load_inventory

LoadInventory = Callable[[str], Inventory]
LoadPlaybook = Callable[[str], Playbook]

INVENTORY = """\
all:
  vars:
    slot: 39500
  hosts:
    gpu[01-03]:
  children:
    fast:
      vars:
        slot: 40000
      hosts:
        gpu02:
          greeting: from-host
"""

ECHO = """\
name: echo
vars:
  greeting: from-playbook
  slot: 1
steps:
  - name: greet
    run: echo ${greeting} ${slot}
"""


def sh(script: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", "-c", script],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )


def commands(plan: Plan, step: int = 0) -> dict[str, str]:
    return {hp.host.name: hp.steps[step].cmd.display for hp in plan.hosts}


# ---------------------------------------------------------------- rendering and precedence


def test_plan_has_every_step_for_every_host_in_order(
    inventory: LoadInventory, playbook: LoadPlaybook
) -> None:
    pb = playbook("name: two\nsteps:\n  - {name: a, run: echo a}\n  - {name: b, run: echo b}\n")
    plan = build_plan(inventory(INVENTORY).hosts, pb, {})
    assert plan.host_names == ["gpu01", "gpu02", "gpu03"]
    for hp in plan.hosts:
        assert [ps.step.name for ps in hp.steps] == ["a", "b"]
        assert [ps.cmd.display for ps in hp.steps] == ["echo a", "echo b"]


def test_playbook_defaults_lose_to_inventory_which_loses_to_var(
    inventory: LoadInventory, playbook: LoadPlaybook
) -> None:
    hosts = inventory(INVENTORY).hosts
    pb = playbook(ECHO)
    assert commands(build_plan(hosts, pb, {})) == {
        "gpu01": "echo from-playbook 39500",
        "gpu02": "echo from-host 40000",
        "gpu03": "echo from-playbook 39500",
    }
    assert set(commands(build_plan(hosts, pb, {"slot": "7", "greeting": "cli"})).values()) == {
        "echo cli 7"
    }


def test_facts_about_the_host_are_available(
    inventory: LoadInventory, playbook: LoadPlaybook
) -> None:
    pb = playbook(
        "name: f\nsteps:\n  - name: f\n"
        "    run: echo ${inventory_hostname} ${fleet_address} ${host_index} ${host_count}\n"
    )
    inv = inventory("all:\n  hosts:\n    a: {ansible_host: 10.0.0.1}\n    b:\n")
    assert commands(build_plan(inv.hosts, pb, {})) == {
        "a": "echo a 10.0.0.1 0 2",
        "b": "echo b b 1 2",
    }


def test_command_sent_is_the_wrapped_display(
    inventory: LoadInventory, playbook: LoadPlaybook
) -> None:
    pb = playbook(ECHO)
    (hp, *_) = build_plan(inventory(INVENTORY).hosts, pb, {}).hosts
    cmd = hp.steps[0].cmd
    assert cmd.command.startswith(f"printf '{PID_MARKER}")
    result = sh(cmd.command)
    assert result.stdout == "from-playbook 39500\n"
    assert result.stderr.startswith(PID_MARKER)


def test_sudo_timeout_and_script_shape_the_command(
    inventory: LoadInventory, write: Callable[[str, str], Path]
) -> None:
    write("helper.sh", 'printf "<%s>" "$@"\n')
    path = write(
        "book.yaml",
        "name: s\nsteps:\n  - name: s\n    script: helper.sh\n    run: go ${slot}\n"
        "    sudo: true\n    timeout: 30\n",
    )
    (hp, *_) = build_plan(inventory(INVENTORY).hosts, load_playbook(str(path)), {}).hosts
    cmd = hp.steps[0].cmd
    assert cmd.display == "sudo sh -s -- go 39500  < helper.sh"
    assert cmd.stdin == 'printf "<%s>" "$@"\n'
    assert (cmd.sudo, cmd.timeout_s) == (True, 30)
    assert "timeout -k" in cmd.command
    assert "sudo -n --" in cmd.command


def test_password_on_stdin_changes_only_sudo_steps(
    inventory: LoadInventory, playbook: LoadPlaybook
) -> None:
    pb = playbook("name: p\nsteps:\n  - {name: a, run: id, sudo: true}\n  - {name: b, run: id}\n")
    (hp, *_) = build_plan(inventory(INVENTORY).hosts, pb, {}, password_on_stdin=True).hosts
    assert "sudo -S -p ''" in hp.steps[0].cmd.command
    assert "sudo" not in hp.steps[1].cmd.command


def test_cleanup_plan_renders_defaults_and_overrides(inventory: LoadInventory) -> None:
    inv = inventory("all:\n  hosts:\n    gpu[01-02]:\n")
    plan = build_plan(
        inv.hosts, load_playbook("cleanup"), {"patterns": ["python -m x"], "port": 29500}
    )
    for hp in plan.hosts:
        displays = [ps.cmd.display for ps in hp.steps]
        assert displays == [
            "sudo sh -s -- --pattern 'python -m x'"
            " --path '/tmp/.torch_distributed_*' --path '/dev/shm/torch_*' --path '/tmp/cuda_*'"
            " --path '~/.nv' --path '/tmp/torchelastic_*' --path '/tmp/pymp-*'"
            " --path '/tmp/torch-shm-dir-*' --path '/dev/shm/sem.mp-*' --path '/dev/shm/nccl-*'"
            " --path '/tmp/watchdog_timer_*' --path '/tmp/torchinductor_*' --port 29500 --gpus"
            "  < facts.sh"
        ]  # the cleanup op's first command: its facts; act.sh's lists come from the node
        assert all(ps.cmd.stdin and ps.cmd.stdin.startswith("#!/bin/sh") for ps in hp.steps)
        assert all(ps.op is not None for ps in hp.steps)


def test_ssh_port_in_inventory_does_not_become_the_cleanup_rendezvous_port(
    inventory: LoadInventory,
) -> None:
    """`port:` is the inventory's short form of ansible_port (the SSH port). It must not leak into
    cleanup's `${port}` (the rendezvous port), or cleanup would free the SSH port instead."""
    inv = inventory("all:\n  hosts:\n    gpu01: {host: 10.0.0.1, port: 2222}\n")
    assert inv.host("gpu01").port == 2222
    (hp,) = build_plan(inv.hosts, load_playbook("cleanup"), {}).hosts
    (step,) = hp.steps
    assert "--port 39500" in step.cmd.display
    assert "2222" not in step.cmd.display


# ---------------------------------------------------------------- undefined variables


def test_undefined_variable_names_file_step_folded_hosts_and_variable(
    inventory: LoadInventory, playbook: LoadPlaybook
) -> None:
    inv = inventory(
        "all:\n  hosts:\n    gpu01:\n    gpu02: {model: llama}\n    gpu03:\n    gpu07:\n"
    )
    pb = playbook(
        "name: t\nsteps:\n  - {name: ok, run: 'true'}\n  - {name: load, run: 'load ${model}'}\n"
    )
    with pytest.raises(TemplateError) as info:
        build_plan(inv.hosts, pb, {})
    message = info.value.message
    assert str(pb.path) in message
    assert "step 'load'" in message
    assert "'model'" in message
    assert "gpu[01,03,07]" in message
    assert "--var model=" in info.value.hint
    assert info.value.exit_code is ExitCode.FLEET_ERROR


def test_undefined_variable_names_the_line_of_the_step_that_uses_it(
    inventory: LoadInventory, playbook: LoadPlaybook
) -> None:
    """The reference promises file and line: the step's `run`, where the name is written."""
    pb = playbook(
        "name: t\nsteps:\n  - {name: ok, run: 'true'}\n  - name: load\n    sudo: false\n"
        "    run: 'load ${model}'\n"
    )
    with pytest.raises(TemplateError) as info:
        build_plan(inventory(INVENTORY).hosts, pb, {})
    assert info.value.message.startswith(f"{pb.path}:6: step 'load': undefined variable 'model'")


def test_a_value_the_template_cannot_use_names_the_line_too(
    inventory: LoadInventory, playbook: LoadPlaybook
) -> None:
    pb = playbook("name: t\nsteps:\n  - name: go\n    run: 'go ${cmd|words}'\n")
    with pytest.raises(TemplateError) as info:
        build_plan(inventory(INVENTORY).hosts, pb, {"cmd": "a 'b"})
    assert info.value.message.startswith(f"{pb.path}:4: step 'go' on host ")


def test_var_on_the_command_line_fills_the_gap(
    inventory: LoadInventory, playbook: LoadPlaybook
) -> None:
    pb = playbook("name: t\nsteps:\n  - {name: load, run: 'load ${model}'}\n")
    plan = build_plan(inventory(INVENTORY).hosts, pb, {"model": "x"})
    assert set(commands(plan).values()) == {"load x"}


def test_default_filter_fills_the_gap(inventory: LoadInventory, playbook: LoadPlaybook) -> None:
    pb = playbook("name: t\nsteps:\n  - {name: load, run: 'load ${model|default:tiny}'}\n")
    assert set(commands(build_plan(inventory(INVENTORY).hosts, pb, {})).values()) == {"load tiny"}


# ---------------------------------------------------------------- injection

PAYLOADS = [
    "; touch {marker}",
    "$(touch {marker})",
    "`touch {marker}`",
    "x' ; touch {marker} ; '",
    'x" ; touch {marker} ; "',
    "x\ntouch {marker}",
    "x && touch {marker}",
    "x | touch {marker}",
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_inventory_value_cannot_inject_commands(
    write: Callable[[str, str], Path], playbook: LoadPlaybook, tmp_path: Path, payload: str
) -> None:
    marker = tmp_path / "pwned"
    value = payload.format(marker=marker)
    inv = load_inventory(
        write("inv.yaml", "all:\n  hosts:\n    gpu01:\n      job: " + _yaml_string(value) + "\n")
    )
    assert inv.host("gpu01").vars["job"] == value
    pb = playbook("name: t\nsteps:\n  - {name: show, run: 'printf %s ${job}'}\n")
    (hp,) = build_plan(inv.hosts, pb, {}).hosts
    cmd = hp.steps[0].cmd

    body = sh(cmd.display)
    assert body.stdout == value
    whole = sh(cmd.command)
    assert whole.stdout == value
    assert not marker.exists()


def test_script_arguments_cannot_inject_commands(inventory: LoadInventory, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    inv = inventory(
        "all:\n  hosts:\n    gpu01:\n      patterns: " + _yaml_string(f"1; touch {marker}") + "\n"
    )
    cleanup = load_playbook("cleanup")
    # As --no-sudo does: the test needs no sudo; the arguments are rendered the same way.
    no_sudo = dataclasses.replace(
        cleanup, steps=tuple(dataclasses.replace(s, sudo=False) for s in cleanup.steps)
    )
    (hp,) = build_plan(inv.hosts, no_sudo, {}).hosts
    (step,) = hp.steps  # the cleanup op's facts command: --pattern ${patterns} ..., on stdin
    args_printer = 'printf "<%s>" "$@"\n'  # stands in for facts.sh
    result = sh(step.cmd.command, stdin=args_printer)
    assert result.stdout.startswith(f"<--pattern><1; touch {marker}><--path>")
    assert not marker.exists()


def _yaml_string(value: str) -> str:
    """A YAML double-quoted scalar for `value` (JSON strings are valid YAML)."""
    return json.dumps(value)


# ---------------------------------------------------------------- --var parsing


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        ([], {}),
        (["port=39501"], {"port": "39501"}),
        (["a=1", "b=two words"], {"a": "1", "b": "two words"}),
        (["empty="], {"empty": ""}),
        (["eq=a=b"], {"eq": "a=b"}),
        (["x=1", "x=2"], {"x": "2"}),
        (["patterns=[torchrun, train.py]"], {"patterns": ["torchrun", "train.py"]}),
        (["patterns= [a]"], {"patterns": ["a"]}),
        (["m={a: 1}"], {"m": {"a": 1}}),
        (["flag=yes"], {"flag": "yes"}),
        (["cmd=echo $(id); rm"], {"cmd": "echo $(id); rm"}),
        (["_private=1"], {"_private": "1"}),
    ],
)
def test_parse_vars(pairs: list[str], expected: dict[str, object]) -> None:
    assert parse_vars(pairs) == expected


@pytest.mark.parametrize(
    "pair", ["port", "=1", "1port=2", "my-var=1", "a b=1", "list=[a, b", "m={a: [}"]
)
def test_parse_vars_refuses_bad_pairs_as_usage_errors(pair: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_vars([pair])
    assert info.value.exit_code is ExitCode.USAGE
    assert info.value.hint
    assert pair.partition("=")[0] in info.value.message


PLAN_IMPORTS = """\
import sys
from fleet.core.hosts import Host
from fleet.core.playbook import adhoc, load_shipped
from fleet.engine.plan import build_plan
hosts = [Host(name="gpu01", address="192.0.2.1")]
build_plan(hosts, adhoc("true", sudo=False, timeout_s=None), {})
print("fleet.node.ops" in sys.modules)
build_plan(hosts, load_shipped("cleanup"), {})
print("fleet.node.ops" in sys.modules)
"""


def test_only_a_plan_with_an_op_step_loads_the_node_ops() -> None:
    """`fleet exec` does without the cleanup's facts, decisions and actions (start-up time)."""
    proc = subprocess.run(
        [sys.executable, "-c", PLAN_IMPORTS], capture_output=True, text=True, check=True
    )
    assert proc.stdout.split() == ["False", "True"]
