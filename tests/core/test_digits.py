"""Whole numbers in text an operator or a node wrote: `str.isdigit()` passed '²' and any number
of digits to `int()`, which refuses both (an internal error)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fleet.core.digits import MAX_DIGITS, is_digits
from fleet.node.runstate import describe_exit
from fleet.output.reporters import _bytes, _duration
from fleet.ssh.hops import parse_hop

NOT_INT = ["²", "2²", "①", "٢٢" + "²", "9" * 5000, "", " 1", "1.0", "-1", "+1"]


@pytest.mark.parametrize("text", ["0", "22", "007", "9" * MAX_DIGITS])
def test_ascii_digits_are_digits(text: str) -> None:
    assert is_digits(text)
    assert is_digits(text.encode())
    int(text)


@pytest.mark.parametrize("text", [*NOT_INT, "٢٢", "\uff12\uff12"])
def test_anything_else_is_not(text: str) -> None:
    assert not is_digits(text)
    assert not is_digits(text.encode())


@pytest.mark.parametrize("text", ["²", "9" * 5000])
def test_what_a_node_prints_as_a_number_never_reaches_int_unchecked(text: str) -> None:
    assert describe_exit(text) == "exit status unknown"
    assert _bytes(text) == "-"
    assert _duration(text) == ""


@pytest.mark.parametrize("port", ["²", "9" * 5000])
def test_a_jump_hosts_port_of_other_digits_is_refused(port: str) -> None:
    with pytest.raises(ValueError, match="port must be a number"):
        parse_hop(f"bastion:{port}")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("inv.yaml", "all:\n  hosts:\n    gpu01: {ansible_port: '²²'}\n"),
        ("inv.yaml", "all:\n  hosts:\n    gpu01: {ansible_port: '٢٢'}\n"),
        ("inv.ini", "gpu01 ansible_port=²\n"),
        ("inv.ini", f"gpu01 ansible_port={'9' * 5000}\n"),
        ("inv.yaml", "all:\n  hosts:\n    gpu01: {ansible_ssh_common_args: '-o Port=²'}\n"),
    ],
    ids=["yaml-superscript", "yaml-arabic-indic", "ini-superscript", "ini-5000-digits", "ssh-args"],
)
def test_an_inventory_port_of_other_digits_is_one_error_at_its_line(
    write: Callable[[str, str], Path], run_main, name: str, text: str
) -> None:
    inv = write(name, text)
    code, out, err = run_main("hosts", "-i", str(inv))
    assert code == 1, err
    assert out == ""
    assert err.startswith(f"fleet: error: {inv}:")
    assert "Port" in err or "port" in err
    assert "internal error" not in err


@pytest.mark.parametrize("spec", ["gpu01:²", f"gpu01:{'9' * 5000}"])
def test_a_w_port_of_other_digits_is_a_usage_error(run_main, spec: str) -> None:
    code, _, err = run_main("hosts", "-w", spec)
    assert code == 2, err
    assert "a port is a number" in err
