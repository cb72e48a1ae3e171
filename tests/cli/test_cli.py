"""The command line, in-process: click's CliRunner on `cli`, and the console entry point `main`
(which maps every error to the documented exit code). Nothing here connects anywhere."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleet.cli import cli, main
from fleet.core.errors import UsageError
from fleet.core.events import HostFinished, Outcome, RunSummary
from fleet.ops import jobs as verbs

# Unroutable on purpose: TEST-NET-1 addresses and the reserved .invalid TLD. A dry run must not
# care; anything that tried to connect would hang or fail here.
INVENTORY = """\
all:
  vars:
    ansible_user: train
  hosts:
    gpu[01-03].invalid:
      ansible_host: 192.0.2.1
      ansible_port: 2222
  children:
    login:
      hosts:
        login.invalid:
"""

CLEANUP_STEPS = ["clean node"]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No inventory, ssh config, debug switch or log dir leaks in from the developer's shell."""
    for name in ("FLEET_INVENTORY", "FLEET_SSH_CONFIG", "FLEET_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLEET_LOG_DIR", str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def no_ssh(mocker) -> None:
    """Fail loudly if anything builds an SSH transport."""
    mocker.patch(
        "fleet.ssh.transport.SSHTransport",
        side_effect=AssertionError("a dry run or refused run must not create a transport"),
    )


@pytest.fixture
def inv(write: Callable[[str, str], Path]) -> Path:
    return write("inventory.yaml", INVENTORY)


def one_error(err: str) -> tuple[str, str]:
    """stderr holds exactly one `fleet: error:` line and a hint line, and no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("fleet: error: ")]
    hints = [line for line in lines if line.strip().startswith("hint: ")]
    assert len(errors) == 1, err
    assert len(hints) == 1, err
    assert hints[0].strip() != "hint:"
    assert "Traceback" not in err
    return errors[0], hints[0]


# ---------------------------------------------------------------- hosts


def test_hosts_prints_a_table_of_every_host(inv: Path) -> None:
    result = CliRunner().invoke(cli, ["hosts", "-i", str(inv)])
    assert result.exit_code == 0, result.output
    assert "4 of 4 hosts" in result.stdout
    for name in ("gpu01.invalid", "gpu02.invalid", "gpu03.invalid", "login.invalid"):
        assert name in result.stdout
    assert "192.0.2.1" in result.stdout
    assert "2222" in result.stdout
    assert "train" in result.stdout


def test_hosts_limit_narrows_the_table(inv: Path) -> None:
    result = CliRunner().invoke(cli, ["hosts", "-i", str(inv), "-l", "login"])
    assert result.exit_code == 0, result.output
    assert "1 of 4 hosts: login.invalid" in result.stdout
    assert "gpu01" not in result.stdout


def test_hosts_sizes_columns_on_the_escaped_text_shown(
    write: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An address with control characters shows as escapes, four times its raw length: the
    column is as wide as what is shown (sized on the raw text, it was cut with an ellipsis)."""
    monkeypatch.setenv("COLUMNS", "50")
    address = "\\x1b" * 8 + "h"
    inventory = write(
        "inventory.yaml", f'all:\n  hosts:\n    gpu01:\n      ansible_host: "{address}"\n'
    )
    result = CliRunner().invoke(cli, ["hosts", "-i", str(inventory)])
    assert result.exit_code == 0, result.output
    assert "\\x1b" * 8 + "h" in result.stdout, result.stdout
    assert "\x1b" not in result.stdout


def test_hosts_json(inv: Path) -> None:
    result = CliRunner().invoke(cli, ["hosts", "-i", str(inv), "--json", "-l", "gpu*,login"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows[0] == {
        "name": "gpu01.invalid",
        "address": "192.0.2.1",
        "port": 2222,
        "user": "train",
        "groups": [],
        "source": f"{inv}:5",
    }
    assert rows[-1] == {
        "name": "login.invalid",
        "address": "login.invalid",
        "port": 22,
        "user": "train",
        "groups": ["login"],
        "source": f"{inv}:11",
    }
    assert [r["name"] for r in rows] == [
        "gpu01.invalid",
        "gpu02.invalid",
        "gpu03.invalid",
        "login.invalid",
    ]


def test_inventory_from_environment(inv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_INVENTORY", str(inv))
    result = CliRunner().invoke(cli, ["hosts", "--json"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)) == 4


def test_hosts_through_main_exits_zero(inv: Path, run_main) -> None:
    code, out, err = run_main("hosts", "-i", str(inv), "--json")
    assert code == 0
    assert len(json.loads(out)) == 4
    assert err == ""


# ---------------------------------------------------------------- dry run


def test_dry_run_cleanup_prints_every_host_and_step_and_connects_nowhere(
    inv: Path, no_ssh: None
) -> None:
    # no_ssh fails the test if anything builds an SSH transport.
    result = CliRunner().invoke(cli, ["cleanup", "-i", str(inv), "--dry-run"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "nothing connects" in out
    assert "gpu[01-03].invalid" in out.splitlines()[0]
    for host, target in [
        ("gpu01.invalid", "train@192.0.2.1:2222"),
        ("gpu02.invalid", "train@192.0.2.1:2222"),
        ("gpu03.invalid", "train@192.0.2.1:2222"),
        ("login.invalid", "train@login.invalid"),
    ]:
        assert f"{host}  ({target})" in out
    for name in CLEANUP_STEPS:
        assert out.count(f". {name}") == 4
    command = (
        r"$ sudo sh -s -- --pattern torchrun --pattern 'train\.py'"
        r" --path '/tmp/.torch_distributed_*' --path '/dev/shm/torch_*' --path '/tmp/cuda_*'"
        r" --path '~/.nv' --path '/tmp/torchelastic_*' --path '/tmp/pymp-*'"
        r" --path '/tmp/torch-shm-dir-*' --path '/dev/shm/sem.mp-*' --path '/dev/shm/nccl-*'"
        r" --path '/tmp/watchdog_timer_*' --path '/tmp/torchinductor_*' --port 39500 --gpus"
        r"  < facts.sh"
    )  # the facts the cleanup op gathers first; then the kinds of actions that may follow
    assert out.count(command) == 4
    then = "then, until clean (at most 4 rounds): act.sh signal PID:START... (TERM, 10s, KILL)"
    assert out.count(then) == 4


def test_dry_run_does_not_ask_for_confirmation(inv: Path, no_ssh: None, run_main) -> None:
    code, out, err = run_main("cleanup", "-i", str(inv), "-n")
    assert code == 0
    assert "destructive" not in err
    assert out.count("clean node") == 4


def test_cleanup_options_and_vars_reach_the_commands(inv: Path, no_ssh: None) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "cleanup",
            "-i",
            str(inv),
            "-l",
            "login",
            "--dry-run",
            "--pattern",
            "python train.py",
            "--port",
            "29500",
            "--kill-gpu-holders",
            "--var",
            "grace=3",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "$ sudo sh -s -- --pattern 'python train.py' --path" in result.stdout
    assert "--port 29500 --gpus  < facts.sh" in result.stdout
    assert "(TERM, 3s, KILL, GPU holders too)" in result.stdout
    assert "gpu01" not in result.stdout


def test_dry_run_json_lists_each_hosts_commands(inv: Path, no_ssh: None) -> None:
    result = CliRunner().invoke(cli, ["cleanup", "-i", str(inv), "-n", "--json"])
    assert result.exit_code == 0, result.output
    plans = [json.loads(line) for line in result.stdout.splitlines()]
    assert [p["host"] for p in plans] == [
        "gpu01.invalid",
        "gpu02.invalid",
        "gpu03.invalid",
        "login.invalid",
    ]
    for plan in plans:
        assert [s["name"] for s in plan["steps"]] == CLEANUP_STEPS
        assert all(s["stdin"] == "facts.sh" and s["sudo"] for s in plan["steps"])
        assert all(s["op"] == "cleanup" and "act.sh" in s["then"] for s in plan["steps"])


def test_dry_run_exec_keeps_the_operators_shell_text(inv: Path, no_ssh: None) -> None:
    result = CliRunner().invoke(
        cli, ["exec", "-i", str(inv), "-l", "login", "-n", 'echo "${HOME}" | wc -c']
    )
    assert result.exit_code == 0, result.output
    assert '$ echo "${HOME}" | wc -c' in result.stdout


def test_dry_run_shows_a_newline_in_a_name_or_address_escaped_and_keeps_a_commands_lines(
    write: Callable[[str, str], Path], no_ssh: None
) -> None:
    hosts = write(
        "hosts.yaml",
        "all:\n  hosts:\n"
        '    gpu01: {ansible_host: "10.0.0.1\\nfleet: forged", ansible_user: "u\\n"}\n',
    )
    book = write(
        "book.yaml",
        'name: "b\\nforged"\nsteps:\n  - {name: "one\\ntwo", run: "echo ${v}"}\n'
        'vars: {v: "a\\nb"}\n',
    )
    result = CliRunner().invoke(cli, ["run", str(book), "-i", str(hosts), "-n"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("dry run: b\\nforged on 1 host gpu01 ")
    assert "gpu01  (u\\n@10.0.0.1\\nfleet: forged)" in lines
    assert "  1. one\\ntwo" in lines
    assert "     $ echo 'a" in lines  # the command's own lines stay lines
    assert "b'" in lines
    assert not any(line.startswith("fleet: forged") for line in lines)


def test_dry_run_of_a_playbook_file_with_an_undefined_variable_fails_before_connecting(
    inv: Path, write: Callable[[str, str], Path], no_ssh: None, run_main
) -> None:
    book = write("book.yaml", "name: b\nsteps:\n  - {name: load, run: 'load ${model}'}\n")
    code, out, err = run_main("run", str(book), "-i", str(inv), "-n")
    assert code == 1
    error, hint = one_error(err)
    assert str(book) in error
    assert "'model'" in error
    assert "gpu[01-03].invalid" in error
    assert "--var model=" in hint
    assert out == ""


# ---------------------------------------------------------------- errors and exit codes


def test_bad_inventory_is_one_error_line_with_a_hint(
    write: Callable[[str, str], Path], run_main
) -> None:
    bad = write("bad.yaml", "all:\n  hosts:\n    gpu01:\n    gpu01:\n")
    code, out, err = run_main("hosts", "-i", str(bad))
    assert code == 1
    error, hint = one_error(err)
    assert f"{bad}:4" in error
    assert "duplicate key 'gpu01'" in error
    assert "remove one of them" in hint
    assert out == ""


def test_missing_inventory_is_one_error_line_with_a_hint(run_main) -> None:
    code, _, err = run_main("cleanup", "-n")
    assert code == 1
    error, hint = one_error(err)
    assert "inventory.yaml" in error
    assert "-i" in hint


def test_limit_matching_nothing_exits_1(inv: Path, run_main) -> None:
    code, _, err = run_main("hosts", "-i", str(inv), "-l", "tpu*")
    assert code == 1
    error, _ = one_error(err)
    assert "tpu*" in error


# Each of these once selected every host (`fleet cleanup --yes -l "$EMPTY"` cleaned every node),
# or a host the pattern does not name (`gpu01.invalid]`).
UNREADABLE_LIMITS = [
    ("", "--limit: empty pattern"),
    (" ", "--limit: empty pattern"),
    (":", "--limit ':' has an empty term"),
    ("::", "--limit '::' has an empty term"),
    (",", "--limit ',' has an empty term"),
    ("login,", "--limit 'login,' has an empty term"),
    ("all,!", "--limit 'all,!' has an empty term"),
    ("~", "'~' has no regular expression"),
    ("~[", "unbalanced bracket in '~['"),
    ("~gpu0[", "unbalanced bracket in '~gpu0['"),
    ("~[a", "unbalanced bracket in '~[a'"),
    ("gpu01.invalid]", "unbalanced bracket in 'gpu01.invalid]'"),
    ("~(a", "'~(a' is not a valid regular expression"),
    ("gpu0[5-1].invalid", "runs backwards"),
]


@pytest.mark.parametrize(("limit", "words"), UNREADABLE_LIMITS)
def test_a_limit_that_cannot_be_read_exits_2_and_selects_nothing(
    inv: Path, no_ssh: None, run_main, limit: str, words: str
) -> None:
    for argv in (["hosts"], ["hosts", "--json"], ["exec", "-n", "--json", "true"]):
        code, out, err = run_main(*argv, "-i", str(inv), "-l", limit)
        assert code == 2, (argv, out, err)
        assert out == ""  # no table, no host, nothing that would run where
        error, _ = one_error(err)
        assert words in error


NO_SUCH_USER = "~fleet-no-such-user"


@pytest.mark.parametrize(
    ("argv", "env", "where"),
    [
        (["exec", "-n", "-l", f"@{NO_SUCH_USER}/failed.txt", "true"], {}, "-l @"),
        (["exec", "-n", "-w", f"^{NO_SUCH_USER}/hosts.txt", "true"], {}, "-w ^"),
        (["run", "-n", f"{NO_SUCH_USER}/book.yaml"], {}, "playbook "),
        (["exec", "-F", f"{NO_SUCH_USER}/ssh_config", "true"], {}, "ssh config "),
        (["exec", "--log-dir", f"{NO_SUCH_USER}/runs", "true"], {}, "run record dir "),
        (["exec", "true"], {"FLEET_LOG_DIR": f"{NO_SUCH_USER}/runs"}, "run record dir "),
        (["exec", "-n", "true"], {"FLEET_CONFIG": f"{NO_SUCH_USER}/c.yaml"}, "FLEET_CONFIG="),
        (["config"], {"FLEET_CONFIG": f"{NO_SUCH_USER}/c.yaml"}, "FLEET_CONFIG="),
    ],
)
def test_a_path_under_the_home_of_no_such_user_is_one_error_not_an_internal_one(
    inv: Path,
    mocker,
    monkeypatch: pytest.MonkeyPatch,
    run_main,
    argv: list[str],
    env: dict[str, str],
    where: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if "-F" not in argv:  # the ssh config is read inside the run, before anything connects
        mocker.patch.object(verbs, "run_plan", side_effect=AssertionError("ran"))
    extra = ["-i", str(inv)] if argv[0] != "config" else []
    code, _, err = run_main(*argv, *extra)
    assert code == 1, err
    error, _ = one_error(err)
    assert f"{where}{NO_SUCH_USER}/" in error
    assert f"no user '{NO_SUCH_USER[1:]}'" in error


def test_a_config_file_path_under_the_home_of_no_such_user_names_its_line(
    inv: Path, write: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch, run_main
) -> None:
    config = write("c.yaml", f"forks: 4\nlog_dir: {NO_SUCH_USER}/runs\n")
    monkeypatch.setenv("FLEET_CONFIG", str(config))
    code, _, err = run_main("exec", "-n", "-i", str(inv), "true")
    assert code == 1, err
    error, _ = one_error(err)
    assert f"{config}:2: log_dir: {NO_SUCH_USER}/runs: cannot expand" in error


@pytest.mark.parametrize("limit", ["", ":", "~["])
def test_a_destructive_verb_with_an_unreadable_limit_runs_nowhere(
    inv: Path, mocker, run_main, limit: str
) -> None:
    run = mocker.patch.object(verbs, "run_plan", side_effect=AssertionError("ran"))
    code, _, err = run_main("cleanup", "--yes", "-i", str(inv), "-l", limit)
    assert code == 2, err
    one_error(err)
    assert run.call_count == 0
    assert not (Path.cwd() / "runs").exists()


def test_disconnect_with_an_empty_limit_is_refused_not_every_connection(
    inv: Path, mocker, run_main
) -> None:
    """`fleet disconnect` alone ends every warm connection; `-l "$EMPTY"` must not mean that."""
    ended = mocker.patch("fleet.ssh.warm.disconnect", side_effect=AssertionError("ended"))
    code, _, err = run_main("disconnect", "-i", str(inv), "-l", "")
    assert code == 2
    assert "empty pattern" in one_error(err)[0]
    assert ended.call_count == 0


def test_an_ipv6_host_is_one_term_not_two_split_at_its_colons(run_main) -> None:
    code, out, err = run_main("hosts", "--json", "-w", "fd00::1,gpu01", "-l", "fd00::1")
    assert code == 0, err
    assert [h["name"] for h in json.loads(out)] == ["fd00::1"]


def test_unknown_playbook_exits_1(inv: Path, run_main) -> None:
    code, _, err = run_main("run", "no-such-book", "-i", str(inv), "-n")
    assert code == 1
    error, hint = one_error(err)
    assert "no-such-book" in error
    assert "cleanup" in hint


@pytest.mark.parametrize(
    ("field", "place"),
    [
        ("on_error: [stop]", "steps.0.on_error"),
        ("on_error: {a: 1}", "steps.0.on_error"),
        ("timeout: .nan", "steps.0.timeout"),
    ],
)
def test_a_step_field_of_the_wrong_kind_is_a_playbook_error_not_an_internal_one(
    write: Callable[[str, str], Path], no_ssh: None, run_main, field: str, place: str
) -> None:
    book = write("book.yaml", f"name: b\nsteps:\n  - name: s\n    run: 'true'\n    {field}\n")
    code, out, err = run_main("run", str(book), "-w", "gpu01", "-n")
    assert code == 1
    error, _ = one_error(err)
    assert f"{book}:5: {place}: " in error
    assert out == ""


@pytest.mark.parametrize("op", ["[cleanup]", "{a: 1}"])
def test_an_op_of_the_wrong_kind_is_a_playbook_error(
    write: Callable[[str, str], Path], no_ssh: None, run_main, op: str
) -> None:
    book = write("book.yaml", f"name: b\nsteps:\n  - name: s\n    op: {op}\n")
    code, _, err = run_main("run", str(book), "-w", "gpu01", "-n")
    assert code == 1
    error, _ = one_error(err)
    assert f"{book}:4: steps.0.op: op must be one of" in error


@pytest.mark.parametrize(
    "args",
    [
        ["--pattern", "("],
        ["--pattern", "torchrun", "--pattern", "a)"],
        ["--var", "patterns=[ok, 'x{']"],
        ["--watch", "--pattern", "("],
        ["--watch", "5", "--pattern", "("],
    ],
)
@pytest.mark.parametrize("dry_run", [[], ["-n"]], ids=["real", "dry-run"])
def test_status_refuses_a_pattern_grep_cannot_use_before_connecting(
    inv: Path, no_ssh: None, run_main, args: list[str], dry_run: list[str]
) -> None:
    """As cleanup does: it was a `-` in the table, grep's complaint only in --json, exit 3."""
    code, out, err = run_main("status", "-i", str(inv), *args, *dry_run)
    assert code == 2
    error, hint = one_error(err)
    assert "status: --pattern '" in error
    assert error.endswith("(from the command line)")
    assert "write \\" in hint
    assert out == ""


def test_status_blames_a_bad_inventory_pattern_on_the_inventory(
    write: Callable[[str, str], Path], no_ssh: None, run_main
) -> None:
    bad = write("inv.yaml", INVENTORY.replace("ansible_port: 2222", "patterns: '('"))
    code, _, err = run_main("status", "-i", str(bad), "-n")
    assert code == 1
    error, _ = one_error(err)
    assert "status: --pattern '(': '(' is never closed (from inventory vars of gpu[01-03]" in error


@pytest.mark.parametrize(
    ("flag", "option"),
    [
        ("--ask-key-pass", "--ask-key-pass"),
        ("-K", "-K/--ask-become-pass"),
        ("--ask-become-pass", "-K/--ask-become-pass"),
    ],
)
def test_a_secret_asked_with_no_terminal_is_one_error_and_no_getpass_warning(
    tmp_path: Path, flag: str, option: str
) -> None:
    """A real process with no controlling terminal and stdin at EOF (cron, `< /dev/null`):
    getpass printed its GetPassWarning and 'Password input may be echoed' first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "no-config"), FLEET_LOG_DIR=str(tmp_path / "runs"))
    proc = subprocess.run(
        [sys.executable, "-m", "fleet", "exec", "-w", "gpu01.invalid", flag, "true"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,  # no controlling terminal
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    error, _ = one_error(proc.stderr)
    assert error.startswith(f"fleet: error: {option}: no terminal to ask ")
    assert len(proc.stderr.splitlines()) == 2, proc.stderr
    assert proc.stdout == ""


def _fleet_with_closed(fd: int, tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """A real `fleet` process started with `fd` closed (`<&-`, `>&-`, `2>&-`), no terminal."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "no-config"), FLEET_LOG_DIR=str(tmp_path / "runs"))
    close = {0: "<&-", 1: ">&-", 2: "2>&-"}[fd]
    return subprocess.run(
        ["sh", "-c", f'exec "$@" {close}', "sh", sys.executable, "-m", "fleet", *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
        timeout=60,
        check=False,
    )


def test_a_destructive_verb_with_stdin_closed_is_refused_as_with_no_terminal(
    tmp_path: Path,
) -> None:
    """`fleet cleanup <&-` asked sys.stdin, which Python leaves None, whether it is a terminal."""
    proc = _fleet_with_closed(0, tmp_path, "cleanup", "-w", "gpu[01-02].invalid")
    assert proc.returncode == 2, proc.stderr
    error, _ = one_error(proc.stderr)
    assert "no terminal to confirm" in error
    assert not (tmp_path / "runs").exists()


def test_a_closed_stdout_is_refused_before_anything_runs(tmp_path: Path) -> None:
    proc = _fleet_with_closed(1, tmp_path, "exec", "-w", "gpu01.invalid", "true")
    assert proc.returncode == 2, proc.stderr
    error, hint = one_error(proc.stderr)
    assert error == "fleet: error: stdout is closed: nowhere to write fleet's output"
    assert ">/dev/null" in hint
    assert not (tmp_path / "runs").exists()


def test_a_closed_stderr_leaves_the_output_and_the_exit_code_as_they_are(tmp_path: Path) -> None:
    proc = _fleet_with_closed(2, tmp_path, "hosts", "-w", "gpu[01-02].invalid", "--json")
    assert proc.returncode == 0
    assert [h["name"] for h in json.loads(proc.stdout)] == ["gpu01.invalid", "gpu02.invalid"]


@pytest.mark.parametrize(
    "argv",
    [
        ["hosts", "-w", "gpu[01-40].invalid"],  # rich's table
        ["--help"],  # click's, before any verb
        ["--version"],
        ["hosts", "-w", "gpu[01-40].invalid", "--json"],
    ],
    ids=["hosts", "help", "version", "hosts-json"],
)
def test_a_reader_that_left_before_the_first_line_is_exit_141_for_every_printer(
    tmp_path: Path, argv: list[str]
) -> None:
    """`fleet hosts | true`: rich's broken-pipe handling exited 1, and so did click's for
    `fleet --help`; the documented code, as for a run's output, is 141, quietly."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "no-config"), FLEET_LOG_DIR=str(tmp_path / "runs"))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before fleet writes
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "fleet", *argv],
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == ""


def test_fleet_errors_escape_cli_for_main_to_map(write: Callable[[str, str], Path]) -> None:
    bad = write("bad.yaml", "all: [x]\n")
    result = CliRunner().invoke(cli, ["hosts", "-i", str(bad)])
    assert result.exit_code == 1
    assert result.exception is not None
    assert str(bad) in str(result.exception)


@pytest.mark.parametrize(
    "argv",
    [
        ["hosts", "--bogus"],
        ["run"],
        ["nonsense-command"],
        ["cleanup", "--forks", "0"],
        ["cleanup", "--port", "70000"],
        ["hosts", "-l"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], run_main) -> None:
    code, _, err = run_main(*argv)
    assert code == 2
    assert "Traceback" not in err
    assert "Usage" in err or "Error" in err
    assert CliRunner().invoke(cli, argv).exit_code == 2


@pytest.mark.parametrize("var", ["noequals", "1bad=x", "list=[a, b"])
def test_bad_var_exits_2(inv: Path, no_ssh: None, run_main, var: str) -> None:
    code, _, err = run_main("cleanup", "-i", str(inv), "-n", "--var", var)
    assert code == 2
    error, hint = one_error(err)
    assert "--var" in error
    assert var.partition("=")[0] in error
    assert "--var" in hint


def test_var_without_equals_is_a_usage_error_in_cli_too(inv: Path) -> None:
    result = CliRunner().invoke(cli, ["exec", "-i", str(inv), "-n", "--var", "x", "true"])
    assert isinstance(result.exception, UsageError)


def test_destructive_run_on_many_hosts_without_a_terminal_is_refused(
    inv: Path, no_ssh: None, run_main, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    code, out, err = run_main("cleanup", "-i", str(inv))
    assert code == 2
    error, hint = one_error(err)
    assert "destructive" in error
    assert "gpu[01-03].invalid" in error
    assert "--yes" in hint
    assert out == ""
    assert not (Path.cwd() / "runs").exists()


def test_destructive_refusal_through_cli_runner(inv: Path, no_ssh: None) -> None:
    result = CliRunner().invoke(cli, ["cleanup", "-i", str(inv)])
    assert isinstance(result.exception, UsageError)
    assert "--yes" in result.exception.hint


def _summary(outcome: Outcome) -> RunSummary:
    """A finished run whose one host ended with `outcome`."""
    result = HostFinished(host="h", outcome=outcome, duration_s=0.1)
    return RunSummary(run_id="r", playbook="cleanup", results=(result,), duration_s=0.1)


def test_destructive_run_on_one_host_needs_no_confirmation(
    inv: Path, mocker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one host, no question is asked: the run goes straight to the executor."""
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    run = mocker.patch.object(verbs, "run_plan", return_value=_summary(Outcome.OK))
    with pytest.raises(SystemExit) as info:
        main(["cleanup", "-i", str(inv), "-l", "login"])
    assert info.value.code == 0
    (plan, _opts, _password), _ = run.call_args
    assert plan.host_names == ["login.invalid"]


def test_yes_skips_the_question(inv: Path, mocker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    run = mocker.patch.object(verbs, "run_plan", return_value=_summary(Outcome.FAILED))
    with pytest.raises(SystemExit) as info:
        main(["cleanup", "-i", str(inv), "--yes"])
    assert info.value.code == 3
    assert run.call_count == 1


def test_empty_exec_command_exits_2(inv: Path, run_main) -> None:
    code, _, err = run_main("exec", "-i", str(inv), "-n", "  ")
    assert code == 2
    one_error(err)


def test_debug_shows_the_traceback(write: Callable[[str, str], Path]) -> None:
    from fleet.core.errors import InventoryError

    bad = write("bad.yaml", "all: [x]\n")
    with pytest.raises(InventoryError):
        main(["hosts", "-i", str(bad), "--debug"])


def test_internal_errors_are_one_line_asking_for_a_report(inv: Path, mocker, run_main) -> None:
    import fleet.engine.runner

    mocker.patch.object(fleet.engine.runner, "choose_hosts", side_effect=ZeroDivisionError("oops"))
    code, _, err = run_main("hosts", "-i", str(inv))
    assert code == 1
    error, hint = one_error(err)
    assert "internal error: ZeroDivisionError: oops" in error
    assert "--debug" in hint


def test_version_and_help_exit_0(run_main) -> None:
    code, out, _ = run_main("--version")
    assert code == 0
    assert "fleet" in out
    code, out, _ = run_main("--help")
    assert code == 0
    assert "Exit codes" in out


# ---------------------------------------------------------------- launch


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ([], "torchrun --nnodes=4"),
        (["--launcher", "/opt/venv/bin/torchrun"], "/opt/venv/bin/torchrun --nnodes=4"),
        (
            ["--launcher", "'/opt/my venv/bin/python' -m torch.distributed.run"],
            "'/opt/my venv/bin/python' -m torch.distributed.run --nnodes=4",
        ),
    ],
)
def test_launch_dry_run_starts_the_given_launcher(
    inv: Path, no_ssh: None, given: list[str], shown: str
) -> None:
    args = ["launch", "-i", str(inv), "--dir", "/ckpt", "--dry-run", *given, "--", "train.py"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    starts = [line for line in result.output.splitlines() if "start --run-id" in line]
    assert len(starts) == 4
    assert all(shown in line for line in starts), starts


@pytest.mark.parametrize("given", [[], ["--"]], ids=["bare", "after --"])
def test_launch_leaves_the_command_s_own_options_to_it(
    inv: Path, no_ssh: None, given: list[str]
) -> None:
    """Options after the command's first word are the command's, even where fleet has one of
    the same name: `-n` is not --dry-run, `-w` not the hosts, `-l` not the limit."""
    args = ["launch", "-i", str(inv), "--dir", "/c", "--dry-run", *given]
    result = CliRunner().invoke(cli, [*args, "train.py", "-n", "4", "-w", "2", "-l", "1e-4"])
    assert result.exit_code == 0, result.output
    starts = [line for line in result.output.splitlines() if "start --run-id" in line]
    assert len(starts) == 4, result.output  # every inventory host, not a host called "2"
    assert all("MASTER_ADDR=192.0.2.1 " in line for line in starts), starts
    assert all("train.py -n 4 -w 2 -l 1e-4  <" in line for line in starts), starts


def test_launch_takes_the_launcher_from_the_inventory(
    write: Callable[[str, str], Path], no_ssh: None
) -> None:
    inv = write(
        "inventory.yaml",
        INVENTORY.replace(
            "ansible_user: train",
            "ansible_user: train\n    launcher: /opt/v/bin/python -m torch.distributed.run",
        ),
    )
    result = CliRunner().invoke(
        cli, ["launch", "-i", str(inv), "--dir", "/c", "--dry-run", "--", "t.py"]
    )
    assert result.exit_code == 0, result.output
    assert "/opt/v/bin/python -m torch.distributed.run --nnodes=4" in result.output


@pytest.mark.parametrize("bad", ["", "'/opt/x"])
def test_launch_refuses_a_bad_launcher_before_anything_runs(
    inv: Path, no_ssh: None, run_main, bad: str
) -> None:
    code, _, err = run_main(
        "launch", "-i", str(inv), "--dir", "/c", "--launcher", bad, "--", "t.py"
    )
    assert code == 2
    error, _ = one_error(err)
    assert error.startswith("fleet: error: --launcher"), err


def test_launch_with_cleanup_runs_cleanup_before_preflight(inv: Path, no_ssh: None) -> None:
    args = ["launch", "-i", str(inv), "--dir", "/c", "--cleanup", "--dry-run", "--", "t.py"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.index("act.sh") < out.index("--dir-check") < out.index("launch.sh")


@pytest.mark.parametrize(
    ("given", "timeout"),
    [
        ([], "[timeout 180s]"),
        (["--grace", "200"], "[timeout 460s]"),
        (["--grace", "3600"], "[timeout 7260s]"),
        (["--var", "grace=600"], "[timeout 1260s]"),
    ],
)
def test_stop_gives_its_step_time_for_the_whole_grace_and_the_kill(
    inv: Path, no_ssh: None, given: list[str], timeout: str
) -> None:
    """A stop step cut short by its own timeout before the grace ends never sends the KILL:
    whatever ignores TERM keeps running (and the step says `timed out`, exit 4)."""
    result = CliRunner().invoke(cli, ["stop", "-i", str(inv), "--dry-run", *given])
    assert result.exit_code == 0, result.output
    steps = [line for line in result.output.splitlines() if "1. stop" in line]
    assert len(steps) == 4
    assert all(timeout in line for line in steps), steps


@pytest.mark.parametrize(
    ("extra", "what"),
    [
        (["--cleanup", "--var", "state_paths=[/opt/*]"], "cleanup: refused: state path"),
        (["--janitor", "--var", "delete_patterns=['*.*']"], "janitor: refused: --delete"),
    ],
)
def test_launch_refuses_a_cleanup_or_janitor_phase_fleet_would_refuse_alone(
    inv: Path, no_ssh: None, run_main, extra: list[str], what: str
) -> None:
    args = ["launch", "-i", str(inv), "--dir", "/c", *extra, "--yes", "--", "t.py"]
    code, _, err = run_main(*args)
    assert code == 2, err
    error, _ = one_error(err)
    assert what in error, err


FIRST_HOST_VAR = """\
all:
  hosts:
    gpu01.invalid:
      ansible_host: 192.0.2.1
      {var}
    gpu02.invalid: {{ansible_host: 192.0.2.2}}
"""


@pytest.mark.parametrize(
    ("var", "said"),
    [
        ("gpus: abc", "gpus must be a whole number 1-1024 (as --nproc-per-node), got a string"),
        ("gpus: 0", "gpus must be a whole number 1-1024 (as --nproc-per-node), got a number (0)"),
        ("gpus: 99999", "gpus must be a whole number 1-1024"),
        ("master_port: 70000", "master_port must be a whole number 1-65535 (as --master-port)"),
        ("env: abc", "env must be a mapping NAME: value (as --env NAME=VALUE), got a string"),
        ('env: {"A B": 1}', "env: 'A B' is not a variable name"),
        ("env: {A: [1]}", "env: the value of A is a list, not text"),
        ("env: [HF_TOKEN hf_secret]", "env item 1 is not NAME=VALUE"),
        ("launcher: 5", "launcher must be a command (shell words, or a list of words), got a num"),
        ('launcher: "\'/opt/x"', "launcher is not valid shell words (unbalanced quotes)"),
        ("master_addr: [1]", "master_addr must be an address (text, as --master-addr), got a list"),
        ("container: [a, b]", "container must be text, got a list"),
    ],
)
def test_launch_refuses_an_inventory_value_its_option_would_refuse(
    write: Callable[[str, str], Path], no_ssh: None, run_main, var: str, said: str
) -> None:
    """As --nproc-per-node 0 or --env FOO are refused, so are the inventory's values: exit 1,
    naming the file, line and host, never the value, before anything connects."""
    inv = write("inventory.yaml", FIRST_HOST_VAR.format(var=var))
    code, _, err = run_main("launch", "-i", str(inv), "--dir", "/c", "--", "t.py")
    assert code == 1, err
    error, _ = one_error(err)
    name = var.partition(":")[0]
    assert error.startswith(f"fleet: error: {inv}:5: all.hosts."), error
    assert f".{name}: launch: {said}" in error, error
    assert "(inventory var of gpu01.invalid)" in error, error
    assert "hf_secret" not in err


def test_launch_takes_good_inventory_values_and_judges_only_the_ones_in_effect(
    write: Callable[[str, str], Path], no_ssh: None, run_main
) -> None:
    good = "gpus: '4'\n      env: {NCCL_DEBUG: INFO}\n      launcher: [/opt/v/bin/torchrun]"
    inv = write("inventory.yaml", FIRST_HOST_VAR.format(var=good))
    code, out, err = run_main("launch", "-i", str(inv), "--dir", "/c", "--dry-run", "--", "t.py")
    assert code == 0, err
    assert "/opt/v/bin/torchrun --nnodes=2 --node_rank=0 --nproc_per_node=4" in out
    # overridden by its option: not the value the nodes get, not judged
    inv = write("inventory.yaml", FIRST_HOST_VAR.format(var="gpus: abc"))
    code, out, err = run_main(
        "launch", "-i", str(inv), "--dir", "/c", "--dry-run", "--nproc-per-node", "2", "--", "t"
    )
    assert code == 0, err
    # master_addr is taken from the first host only
    inv = write(
        "inventory.yaml",
        FIRST_HOST_VAR.format(var="").replace("192.0.2.2}", "192.0.2.2, master_addr: [1]}"),
    )
    code, out, err = run_main("launch", "-i", str(inv), "--dir", "/c", "--dry-run", "--", "t.py")
    assert code == 0, err


def test_launch_refuses_a_var_its_option_would_refuse_as_a_usage_error(
    inv: Path, no_ssh: None, run_main
) -> None:
    code, _, err = run_main(
        "launch", "-i", str(inv), "--dir", "/c", "--var", "gpus=abc", "--", "t.py"
    )
    assert code == 2, err
    error, _ = one_error(err)
    assert error == (
        "fleet: error: launch: --var gpus must be a whole number 1-1024 (as --nproc-per-node), "
        "got a string"
    )


# ---------------------------------------------------------------- push, pull, checkpoints


@pytest.mark.parametrize(
    "argv",
    [
        ["push", "inventory.yaml", "/tmp/x"],
        ["pull", "/tmp/x", "out"],
        ["checkpoints", "--dir", "/tmp/ckpt"],
        ["checkpoints", "consolidate", "global_step2", "--dir", "/d", "--to", "gpu01:/x"],
    ],
)
def test_sudo_is_refused_with_a_hint_before_connecting(
    argv: list[str], inv: Path, no_ssh: None, run_main
) -> None:
    code, _out, err = run_main(*argv, "-i", str(inv), "--sudo")
    assert code == 2
    error, hint = one_error(err)
    assert "--sudo is not supported" in error
    assert "ansible_user" in hint


@pytest.mark.parametrize("dry", [[], ["--dry-run"]])
@pytest.mark.parametrize(
    ("localdir", "what"),
    [
        ("/dev/null", "/dev/null: not a directory"),
        ("inventory.yaml", "inventory.yaml: not a directory"),
        ("inventory.yaml/sub", "inventory.yaml: not a directory"),
        ("", "LOCALDIR is empty"),
    ],
)
def test_a_pull_into_what_is_not_a_directory_is_one_usage_error_before_connecting(
    inv: Path, no_ssh: None, run_main, tmp_path: Path, localdir: str, what: str, dry: list[str]
) -> None:
    code, out, err = run_main("pull", "/tmp/x", localdir, "-i", str(inv), *dry)
    assert code == 2, err
    error, hint = one_error(err)
    assert what in error
    assert "directory" in hint
    assert out == ""  # no host line: nothing connected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inventory.yaml"]


def test_a_pull_into_a_directory_fleet_cannot_write_is_one_usage_error(
    inv: Path, no_ssh: None, run_main
) -> None:
    code, out, err = run_main("pull", "/tmp/x", "/proc/1", "-i", str(inv))
    assert code == 2, err
    error, _ = one_error(err)
    assert "pull: cannot write in /proc/1" in error
    assert out == ""


@pytest.mark.parametrize(
    ("local", "what"),
    [
        ("", "push: LOCAL is empty"),
        ("/dev/null", "/dev/null: not a regular file or directory"),
        ("/dev/zero", "/dev/zero: not a regular file or directory"),
        ("fifo", "fifo: not a regular file or directory"),
        ("missing", "missing: no such file or directory"),
    ],
)
def test_push_of_nothing_a_fifo_or_a_device_is_a_usage_error_before_connecting(
    inv: Path, no_ssh: None, run_main, tmp_path: Path, local: str, what: str
) -> None:
    os.mkfifo(tmp_path / "fifo")  # opened, it would block the push: never opened
    code, out, err = run_main("push", local, "/tmp/x", "-i", str(inv), "--yes")
    assert code == 2, err
    error, _ = one_error(err)
    assert what in error
    assert out == ""


def test_the_audit_refuses_dry_run_and_points_at_consolidates(
    inv: Path, no_ssh: None, run_main
) -> None:
    code, _out, err = run_main("checkpoints", "--dir", "/tmp/ckpt", "-i", str(inv), "--dry-run")
    assert code == 2
    error, hint = one_error(err)
    assert "no plan to print" in error
    assert "consolidate TAG --dry-run" in hint


def test_launch_gives_every_rank_the_masters_port_from_the_inventory(
    write: Callable[[str, str], Path], no_ssh: None, run_main
) -> None:
    """The first host's (the master's) inventory master_port reaches every rank, as its
    master_addr does; the other hosts' own values are not the master's and are not used."""
    var = "master_port: 29511"
    inv = write("inventory.yaml", FIRST_HOST_VAR.format(var=var))
    code, out, err = run_main("launch", "-i", str(inv), "--dir", "/c", "--dry-run", "--", "t.py")
    assert code == 0, err
    starts = [line for line in out.splitlines() if "start --run-id" in line]
    assert len(starts) == 2, out
    assert all("--master_port=29511" in line for line in starts), starts
    second = FIRST_HOST_VAR.format(var="").replace("192.0.2.2}", "192.0.2.2, master_port: x}")
    code, out, err = run_main("launch", "-i", str(write("inventory.yaml", second)), "--dir",
                              "/c", "--dry-run", "--", "t.py")  # fmt: skip
    assert code == 0, err
    assert out.count("--master_port=39500") == 2, out


@pytest.mark.parametrize(
    ("verb", "remote", "becomes"),
    [
        ("push", "~/cfg/ds.json", "cfg/ds.json"),
        ("push", "~/", "./"),
        ("push", "/tmp/~x", "/tmp/~x"),
        ("pull", "~/run1/ckpt", "run1/ckpt"),
        ("pull", "~//run1", "run1"),
    ],
)
def test_a_remote_under_tilde_is_the_logins_home_not_a_directory_named_tilde(
    inv: Path, run_main, mocker, tmp_path: Path, verb: str, remote: str, becomes: str
) -> None:
    """Names reach the node quoted, so `fleet push f '~/cfg/f'` made a directory literally
    named `~` in the login's home (which a later `rm -rf ~` would not clean the way it was
    meant). Node commands start in the home: `~/x` is `x` there."""
    (tmp_path / "f").write_text("x\n")
    go = mocker.patch("fleet.cli.files._go", side_effect=SystemExit(0))
    args = ("f", remote) if verb == "push" else (remote, "out")
    code, _out, err = run_main(verb, *args, "-i", str(inv), "--yes")
    assert code == 0, err
    assert go.call_args.args[0].remote == becomes


@pytest.mark.parametrize("verb", ["push", "pull"])
def test_a_remote_of_another_users_home_is_a_usage_error(
    inv: Path, no_ssh: None, run_main, tmp_path: Path, verb: str
) -> None:
    (tmp_path / "f").write_text("x\n")
    args = ("f", "~bob/x") if verb == "push" else ("~bob/x", "out")
    code, out, err = run_main(verb, *args, "-i", str(inv), "--yes")
    assert code == 2, err
    error, _ = one_error(err)
    assert "~user is not expanded" in error
    assert out == ""
