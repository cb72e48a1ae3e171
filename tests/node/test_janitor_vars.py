"""The janitor's numbers and glob shapes, judged before anything connects (fleet/node/janitor.py),
the same way the node judges them (janitor-loop.sh), through `fleet janitor` and `fleet launch
--janitor`: one error line and a hint, exit 2 from the command line, nothing connects."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.cli import main
from fleet.node import janitor


@pytest.mark.parametrize(
    ("value", "positive", "problem"),
    [
        ("3", True, None),
        ("0.5", True, None),
        (".5", True, None),
        ("10.", False, None),
        (2.5, False, None),
        (0, False, None),
        (None, True, None),  # not given: the node's default
        ("0", True, "--x must be more than 0 seconds"),
        ("0.0", True, "--x must be more than 0 seconds"),
        ("1s", True, "--x '1s' is not a number of seconds"),
        ("-1", False, "--x '-1' is not a number of seconds"),
        ("1.2.3", False, "--x '1.2.3' is not a number of seconds"),
        (".", False, "--x '.' is not a number of seconds"),
        ("", False, "--x '' is not a number of seconds"),
        ("1e3", False, "--x '1e3' is not a number of seconds"),
        (True, False, "--x 'true' is not a number of seconds"),
    ],
)
def test_seconds_are_what_the_node_takes(
    value: object, positive: bool, problem: str | None
) -> None:
    assert janitor.seconds_problem("--x", value, positive=positive) == problem


@given(st.text(alphabet="0123456789.-e x", max_size=6))
def test_fleet_and_the_node_agree_on_seconds(text: str) -> None:
    """The node's test (janitor-loop.sh): not empty, only digits and points, one point at most,
    not a lone point."""
    node_ok = (
        text != "" and set(text) <= set("0123456789.") and text.count(".") <= 1 and text != "."
    )
    assert (janitor.seconds_problem("--x", text, positive=False) is None) == node_ok


def test_brace_alternatives_are_refused_not_matched_literally() -> None:
    """find -name has no `{a,b}`: such a --delete would delete nothing (the disk fills) and such
    a --keep keep nothing (what the operator meant to keep goes)."""
    assert janitor.problems({"action": "start"}, ["*_{optim,model}_states.pt"], []) == [
        "--delete '*_{optim,model}_states.pt': no {a,b} alternatives (find reads them "
        "literally): give one --delete per alternative"
    ]
    assert janitor.problems({"action": "run-once"}, ["*.pt"], ["{best,final}.pt"]) == [
        "--keep '{best,final}.pt': no {a,b} alternatives (find reads them literally): give one "
        "--keep per alternative"
    ]
    assert janitor.problems({"action": "start"}, ["{x}_optim_states.pt"], ["a,b.pt"]) == []


def test_only_a_start_or_run_once_is_judged_and_run_once_has_no_interval() -> None:
    bad = {"interval": "x", "min_age": "y"}
    assert janitor.problems({"action": "stop", **bad}, [], []) == []
    assert janitor.problems({"action": "status", **bad}, [], []) == []
    assert janitor.problems({"action": "run-once", **bad}, ["*.pt"], []) == [
        "--min-age 'y' is not a number of seconds"
    ]
    assert janitor.problems({"action": "start", **bad}, ["a/b.pt"], ["c/d"]) == [
        "--interval 'x' is not a number of seconds",
        "--min-age 'y' is not a number of seconds",
        "--delete 'a/b.pt': globs match file names, not paths (no /)",
        "--keep 'c/d': globs match file names, not paths (no /)",
    ]
    assert janitor.problems({"action": "start"}, [], []) == [
        "no --delete glob given: nothing to delete"
    ]


@pytest.fixture
def inventory_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("FLEET_INVENTORY", "FLEET_SSH_CONFIG", "FLEET_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLEET_LOG_DIR", str(tmp_path / "runs"))
    path = tmp_path / "inventory.yaml"
    # TEST-NET-1: nothing may connect
    path.write_text("all:\n  hosts:\n    gpu[01-02].invalid:\n      ansible_host: 192.0.2.1\n")
    return path


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["janitor", "start", "--dir", "/c", "--var", "interval=1s"],
            "--interval '1s' is not a number of seconds",
        ),
        (
            ["janitor", "run-once", "--dir", "/c", "--var", "min_age=-3"],
            "--min-age '-3' is not a number of seconds",
        ),
        (
            ["janitor", "start", "--dir", "/c", "--delete", "ckpt/optimizer.pt"],
            "--delete 'ckpt/optimizer.pt': globs match file names, not paths",
        ),
        (
            ["launch", "--janitor", "--dir", "/c", "--var", "interval=0", "--", "t.py"],
            "--interval must be more than 0 seconds",
        ),
        (
            ["janitor", "start", "--dir", "/c", "--delete", "*_{optim,model}_states.pt"],
            "--delete '*_{optim,model}_states.pt': no {a,b} alternatives (find reads them",
        ),
    ],
)
def test_bad_janitor_settings_are_refused_before_anything_connects(
    inventory_file: Path,
    capsys: pytest.CaptureFixture[str],
    mocker: object,
    argv: list[str],
    said: str,
) -> None:
    transport = mocker.patch("fleet.ssh.transport.SSHTransport")  # type: ignore[attr-defined]
    options = ["-i", str(inventory_file), "--yes"]  # before launch's `--`: not its command's
    cut = argv.index("--") if "--" in argv else len(argv)
    with pytest.raises(SystemExit) as info:
        main([*argv[:cut], *options, *argv[cut:]])
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 2, err
    assert lines[0].startswith("fleet: error: janitor: refused: "), err
    assert said in lines[0]
    assert "(from the command line)" in lines[0]
    assert lines[1].strip().startswith("hint: ")
    assert not transport.called
