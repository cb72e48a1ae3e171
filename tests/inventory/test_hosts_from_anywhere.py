"""Hosts without writing an inventory, through the CLI: `-w NODESET`, hostfiles given to `-i`,
`-l @failed` read from real run records, and `fleet hosts` saying where each host came from.

The node sets and hostfiles are the examples of pdsh's, Slurm's and DeepSpeed's own
documentation. Nothing here connects: dry runs and `fleet hosts` only (the SSH transport, the
one seam, fails the test if anything builds it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from fleet.cli import cli
from fleet.core.events import HostFinished, Outcome, RunFinished, RunStarted, RunSummary
from fleet.records import runlog

# Unroutable on purpose (the .invalid TLD, TEST-NET-1): a dry run must not care.
INVENTORY = """\
all:
  vars:
    ansible_user: train
    output_dir: /mnt/ckpt
  hosts:
    gpu01.invalid:
      ansible_host: 192.0.2.1
      ansible_port: 2222
  children:
    login:
      hosts:
        login.invalid:
"""
# DeepSpeed's "Resource Configuration (multi-node)" hostfile.
DEEPSPEED_HOSTFILE = "worker-1 slots=4\nworker-2 slots=4\n"
GPUS_BOOK = """\
name: show-gpus
steps:
  - name: show
    run: echo ${inventory_hostname} has ${gpus} gpus
"""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No inventory, ssh config, debug switch or config file leaks in; records in tmp_path."""
    for name in ("FLEET_INVENTORY", "FLEET_SSH_CONFIG", "FLEET_DEBUG", "FLEET_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLEET_LOG_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-user-config"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def no_ssh(mocker) -> None:
    mocker.patch(
        "fleet.ssh.transport.SSHTransport",
        side_effect=AssertionError("a dry run or `fleet hosts` must not create a transport"),
    )


def one_error(err: str) -> tuple[str, str]:
    """Exactly one `fleet: error:` line and one hint line, no traceback."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 2, err
    assert lines[0].startswith("fleet: error: "), err
    assert lines[1].strip().startswith("hint: "), err
    return lines[0].removeprefix("fleet: error: "), lines[1].strip().removeprefix("hint: ")


def dry_hosts(*argv: str) -> list[str]:
    """The hosts a `--dry-run --json` would act on."""
    result = CliRunner().invoke(cli, [*argv, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    return [json.loads(line)["host"] for line in result.stdout.splitlines()]


def hosts_json(*argv: str) -> list[dict[str, object]]:
    result = CliRunner().invoke(cli, ["hosts", "--json", *argv])
    assert result.exit_code == 0, result.output
    rows: list[dict[str, object]] = json.loads(result.stdout)
    return rows


def write_record(base: Path, outcomes: dict[str, Outcome], verb: str = "") -> Path:
    """A finished run's record, written by fleet's own record writer from a run's events (a
    second record with the same id gets its own directory, `ID-2`); `verb`: the command that
    wrote it (none: a record from before verbs were recorded, read as its playbook's)."""
    hosts = tuple(outcomes)
    record = runlog.RunRecord(
        base, f"20261201-000000-{verb or 'exec'}-abcd", verb=verb, invocation=verb
    )
    name = record.dir.name
    record.handle(
        RunStarted(run_id=name, playbook="exec", hosts=hosts, forks=4, run_dir=str(record.dir))
    )
    results = tuple(HostFinished(host=h, outcome=o, duration_s=0.1) for h, o in outcomes.items())
    for result in results:
        record.handle(result)
    summary = RunSummary(name, "exec", results, 0.2, run_dir=str(record.dir))
    record.handle(RunFinished(summary=summary))
    record.close()
    return record.dir


# ---------------------------------------------------------------- -w


def test_exec_dry_run_on_a_node_set_needs_no_inventory(tmp_path: Path) -> None:
    assert not (tmp_path / "inventory.yaml").exists()
    result = CliRunner().invoke(cli, ["exec", "--dry-run", "-w", "gpu[01-03]", "true"])
    assert result.exit_code == 0, result.output
    assert "dry run: exec on 3 hosts gpu[01-03] (from -w)" in result.stdout
    for name in ("gpu01", "gpu02", "gpu03"):
        assert f"{name}  ({name})" in result.stdout


@pytest.mark.parametrize(
    ("nodeset", "expected"),
    [
        ("foo[01-05]", ["foo01", "foo02", "foo03", "foo04", "foo05"]),  # pdsh(1)
        ("foo[7,9-10]", ["foo7", "foo9", "foo10"]),  # pdsh(1)
        ("lx[10-12]", ["lx10", "lx11", "lx12"]),  # Slurm: sbatch --nodelist, "lx[10-20]"
        ("tux[0-3,8],lx1", ["tux0", "tux1", "tux2", "tux3", "tux8", "lx1"]),  # SLURM_JOB_NODELIST
    ],
)
def test_node_sets_from_pdsh_and_slurm_select_those_hosts(
    nodeset: str, expected: list[str]
) -> None:
    assert dry_hosts("exec", "-w", nodeset, "true") == expected


def test_a_slurm_allocation_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """`-w "$SLURM_JOB_NODELIST"` as a job script writes it, through a real shell."""
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu-[01-04,09]")
    script = '"$0" -m fleet exec -n --json -w "$SLURM_JOB_NODELIST" hostname'
    proc = subprocess.run(
        ["sh", "-c", script, sys.executable],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    hosts = [json.loads(line)["host"] for line in proc.stdout.splitlines()]
    assert hosts == ["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-09"]


def test_limit_filters_the_node_set_and_user_at_host_is_the_login(tmp_path: Path) -> None:
    (tmp_path / "spares").write_text("spare1  # pdsh's -w ^FILE\nspare2\n")
    argv = ["exec", "-n", "--json", "-w", "root@gpu[01-04]", "-w", "^spares"]
    result = CliRunner().invoke(cli, [*argv, "-l", "gpu0[2-3]", "true"])
    assert result.exit_code == 0, result.output
    targets = [json.loads(line)["target"] for line in result.stdout.splitlines()]
    assert targets == ["root@gpu02", "root@gpu03"]
    assert dry_hosts("exec", "-w", "gpu[01-02]", "-w", "^spares", "-l", "spare*", "true") == [
        "spare1",
        "spare2",
    ]


def test_with_an_inventory_the_node_set_names_the_hosts_and_the_inventory_reaches_them(
    write: Callable[[str, str], Path],
) -> None:
    inv = write("cluster.yaml", INVENTORY)
    rows = {
        r["name"]: r for r in hosts_json("-i", str(inv), "-w", "gpu01.invalid,new01,root@new02")
    }
    assert list(rows) == ["gpu01.invalid", "new01", "new02"]  # login.invalid: not in -w
    # Defined in the inventory: its address, port, user and groups.
    assert rows["gpu01.invalid"]["address"] == "192.0.2.1"
    assert rows["gpu01.invalid"]["port"] == 2222
    assert rows["gpu01.invalid"]["source"] == f"{inv}:6"
    # Not defined there: its own name, but the inventory's `all` vars apply; user@ wins.
    assert rows["new01"] == {
        "name": "new01",
        "address": "new01",
        "port": 22,
        "user": "train",
        "groups": [],
        "source": "-w",
    }
    assert rows["new02"]["user"] == "root"
    # -l still filters: a group of the inventory picks nothing outside -w.
    result = CliRunner().invoke(cli, ["hosts", "-i", str(inv), "-w", "new01", "-l", "login"])
    assert result.exit_code == 1
    assert "login" in str(result.exception)


def test_node_set_without_i_does_not_read_the_default_inventory_but_does_read_the_env(
    write: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    write("inventory.yaml", INVENTORY)  # ./inventory.yaml: the default without -w only
    assert [r["user"] for r in hosts_json("-w", "gpu01.invalid")] == [None]
    assert [r["address"] for r in hosts_json("-w", "gpu01.invalid")] == ["gpu01.invalid"]
    monkeypatch.setenv("FLEET_INVENTORY", str(write("named.yaml", INVENTORY)))
    assert [r["address"] for r in hosts_json("-w", "gpu01.invalid")] == ["192.0.2.1"]


def test_every_command_that_selects_hosts_takes_w() -> None:
    def commands(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
        for name, command in group.commands.items():
            if isinstance(command, click.Group):
                yield from commands(command, f"{prefix}{name} ")
            else:
                yield f"{prefix}{name}", command

    selecting = {
        name: {opt for p in command.params for opt in getattr(p, "opts", ())}
        for name, command in commands(cli)
    }
    selecting = {name: opts for name, opts in selecting.items() if "--limit" in opts}
    assert {"hosts", "exec", "run", "cleanup", "logs", "status", "launch"} <= set(selecting)
    assert [name for name, opts in selecting.items() if not {"-w", "--hosts"} <= opts] == []
    # logs keeps -n and -f for itself: -w still selects its hosts.
    assert dry_hosts("logs", "-w", "gpu[1-2]") == ["gpu1", "gpu2"]


@pytest.mark.parametrize(
    ("nodeset", "message"),
    [
        ("gpu[3-1]", "-w 'gpu[3-1]': range '[3-1]' in 'gpu[3-1]' runs backwards"),
        ("gpu[01-04", "-w 'gpu[01-04': unbalanced or misplaced brackets"),
        ("bad user@gpu1", "-w: bad user in 'bad user@gpu1'"),
    ],
)
def test_a_bad_node_set_is_one_line_and_exit_2(nodeset: str, message: str, run_main) -> None:
    code, out, err = run_main("exec", "-n", "-w", nodeset, "true")
    assert code == 2
    error, hint = one_error(err)
    assert error.startswith(message), error
    assert "-w" in hint
    assert out == ""


# ---------------------------------------------------------------- hostfiles


def test_a_deepspeed_hostfile_gives_the_hosts_and_their_gpus(
    write: Callable[[str, str], Path],
) -> None:
    hostfile = write("hostfile", DEEPSPEED_HOSTFILE)
    book = write("book.yaml", GPUS_BOOK)
    result = CliRunner().invoke(cli, ["run", str(book), "-i", str(hostfile), "-n", "--json"])
    assert result.exit_code == 0, result.output
    commands = [json.loads(line)["steps"][0]["command"] for line in result.stdout.splitlines()]
    assert commands == ["echo worker-1 has 4 gpus", "echo worker-2 has 4 gpus"]
    assert [r["source"] for r in hosts_json("-i", str(hostfile))] == [
        f"{hostfile}:1",
        f"{hostfile}:2",
    ]


def test_openmpi_and_mpich_hostfiles_and_a_plain_list(write: Callable[[str, str], Path]) -> None:
    book = write("book.yaml", GPUS_BOOK)
    # OpenMPI's FAQ hostfile: comments, a host without slots, max_slots accepted.
    openmpi = write(
        "openmpi",
        "# This is an example hostfile.  Comments begin with #\n"
        "foo.example.com\n"
        "bar.example.com slots=2 max_slots=2\n",
    )
    mpich = write("machinefile", "host1:2\nhost2:4\n")  # MPICH's `host:processes`
    plain = write("nodes.txt", "gpu[01-02]\n")

    def commands(*argv: str) -> list[str]:
        result = CliRunner().invoke(cli, ["run", str(book), "-n", "--json", *argv])
        assert result.exit_code == 0, result.output
        return [json.loads(x)["steps"][0]["command"] for x in result.stdout.splitlines()]

    assert commands("-i", str(mpich)) == ["echo host1 has 2 gpus", "echo host2 has 4 gpus"]
    assert commands("-i", str(openmpi), "-l", "bar*") == ["echo bar.example.com has 2 gpus"]
    result = CliRunner().invoke(cli, ["run", str(book), "-n", "-i", str(openmpi)])
    assert result.exit_code == 1  # foo has no slots: no gpus var, and the template says so
    assert "gpus" in str(result.exception)
    assert [(r["name"], r["source"]) for r in hosts_json("-i", str(plain))] == [
        ("gpu01", f"{plain}:1"),
        ("gpu02", f"{plain}:1"),
    ]


def test_an_ansible_inventory_is_not_taken_for_a_hostfile(
    write: Callable[[str, str], Path],
) -> None:
    ini = write("hosts", "[gpu]\nworker-1 slots=4\n")
    rows = hosts_json("-i", str(ini))
    assert rows[0]["groups"] == ["gpu"]
    assert rows[0]["source"] == f"{ini}:2"
    # In an inventory directory, files are Ansible's formats only: `slots` stays `slots`.
    directory = ini.parent / "inv"
    directory.mkdir()
    (directory / "workers").write_text(DEEPSPEED_HOSTFILE)
    book = write("book.yaml", GPUS_BOOK)
    result = CliRunner().invoke(cli, ["run", str(book), "-i", str(directory), "-n"])
    assert result.exit_code == 1
    assert "gpus" in str(result.exception)


def test_bad_hostfile_lines_are_file_and_line_and_exit_1(
    write: Callable[[str, str], Path], run_main
) -> None:
    twice = write("twice", "worker-1 slots=8\nworker-1 slots=8\n")
    code, _, err = run_main("hosts", "-i", str(twice))
    assert code == 1
    error, hint = one_error(err)
    assert error == f"{twice}:2: host worker-1 is listed twice (first at {twice}:1)"
    assert hint == "list each host once"
    # An Ansible `name:port` in a file without [groups] would read as 2222 processes: refused.
    ports = write("ports", "gpu01:2222\ngpu02:2222\n")
    code, _, err = run_main("hosts", "-i", str(ports))
    assert code == 1
    error, hint = one_error(err)
    assert error == f"{ports}:1: more than 1024 slots on one host"
    assert "[group]" in hint
    code, _, err = run_main("hosts", "-w", f"^{twice.parent / 'missing'}")
    assert code == 1
    error, hint = one_error(err)
    assert error == f"{twice.parent / 'missing'}: cannot read: no such file"
    assert "^" in hint


# ---------------------------------------------------------------- -l @failed


def test_limit_failed_reruns_on_the_last_runs_failed_hosts(tmp_path: Path) -> None:
    base = tmp_path / "runs"
    write_record(base, {"gpu01": Outcome.FAILED, "gpu02": Outcome.OK})
    time.sleep(0.01)  # the newest record is the one whose summary was written last
    write_record(
        base,
        {
            "gpu01": Outcome.OK,
            "gpu02": Outcome.FAILED,
            "gpu03": Outcome.UNREACHABLE,
            "gpu04": Outcome.OK,
        },
    )
    nodes = ("-w", "gpu[01-04]")
    assert dry_hosts("exec", *nodes, "-l", "@failed", "true") == ["gpu02", "gpu03"]
    assert dry_hosts("exec", *nodes, "-l", "@unreachable", "true") == ["gpu03"]
    assert dry_hosts("exec", *nodes, "-l", "!@failed", "true") == ["gpu01", "gpu04"]
    assert [r["name"] for r in hosts_json(*nodes, "-l", "@failed")] == ["gpu02", "gpu03"]
    # --log-dir says where the records are: none there.
    result = CliRunner().invoke(
        cli, ["exec", *nodes, "-l", "@failed", "--log-dir", str(tmp_path / "other"), "-n", "x"]
    )
    assert result.exit_code == 1
    assert "no finished fleet exec run record in" in str(result.exception)


def test_limit_failed_with_an_inventory_and_a_retry_file(
    tmp_path: Path, write: Callable[[str, str], Path]
) -> None:
    inv = write("cluster.yaml", INVENTORY)
    write_record(
        tmp_path / "runs", {"gpu01.invalid": Outcome.TIMED_OUT, "login.invalid": Outcome.OK}
    )
    assert dry_hosts("exec", "-i", str(inv), "-l", "@failed", "true") == ["gpu01.invalid"]
    retry = write("site.retry", "login.invalid\n")
    assert dry_hosts("exec", "-i", str(inv), "-l", f"@{retry}", "true") == ["login.invalid"]


def test_nothing_to_retry_is_one_line_and_exit_1(tmp_path: Path, run_main) -> None:
    code, out, err = run_main("exec", "-n", "-w", "gpu[01-02]", "-l", "@failed", "true")
    assert code == 1
    error, hint = one_error(err)
    assert error == f"-l @failed: no finished fleet exec run record in {tmp_path / 'runs'}"
    assert "--log-dir" in hint
    record = write_record(tmp_path / "runs", {"gpu01": Outcome.OK, "gpu02": Outcome.OK})
    code, out, err = run_main("exec", "-n", "-w", "gpu[01-02]", "-l", "@failed", "true")
    assert code == 1
    error, _ = one_error(err)
    assert error == f"-l @failed: no host was failed in the last fleet exec run ({record.name})"
    assert out == ""


def test_failed_hosts_outside_this_commands_hosts_are_named(tmp_path: Path, run_main) -> None:
    record = write_record(tmp_path / "runs", {"gpu07": Outcome.FAILED, "gpu09": Outcome.FAILED})
    code, _, err = run_main("exec", "-n", "-w", "gpu[01-08]", "-l", "@failed", "true")
    assert code == 1
    error, hint = one_error(err)
    assert error == (
        f"-l @failed: gpu09 (from run {record.name}) is not among this command's hosts"
    )
    assert "-w" in hint


# ---------------------------------------------------------------- fleet hosts: the source


def test_hosts_shows_where_each_host_came_from(write: Callable[[str, str], Path]) -> None:
    inv = write("cluster.yaml", INVENTORY)
    hostfile = write("hostfile", DEEPSPEED_HOSTFILE)
    args = ["-i", str(inv), "-i", str(hostfile), "-w", "login.invalid,worker-2,extra1"]
    rows = hosts_json(*args)
    assert [(r["name"], r["source"]) for r in rows] == [
        ("login.invalid", f"{inv}:12"),
        ("worker-2", f"{hostfile}:2"),
        ("extra1", "-w"),
    ]
    result = CliRunner().invoke(cli, ["hosts", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    header, *lines = result.stdout.splitlines()[1:]
    assert header.split() == ["name", "address", "port", "user", "groups", "source"]
    assert lines[0].split()[-1] == f"{inv}:12"
    assert lines[2].split() == ["extra1", "extra1", "22", "train", "-w"]


# ---------------------------------------------------------------- issue 17


def test_w_takes_host_port_and_ipv6_addresses(write: Callable[[str, str], Path]) -> None:
    rows = hosts_json("-w", "gpu01:2222,root@[fd00::1]:2200", "-w", "fd00::2")
    assert [(r["name"], r["address"], r["port"], r["user"]) for r in rows] == [
        ("gpu01", "gpu01", 2222, None),
        ("fd00::1", "fd00::1", 2200, "root"),
        ("fd00::2", "fd00::2", 22, None),
    ]
    # with an inventory that reaches the host on another port, the command line's wins
    inv = write("cluster.yaml", INVENTORY)
    rows = hosts_json("-i", str(inv), "-w", "gpu01.invalid:2200,login.invalid")
    assert [(r["name"], r["address"], r["port"]) for r in rows] == [
        ("gpu01.invalid", "192.0.2.1", 2200),
        ("login.invalid", "login.invalid", 22),
    ]


def test_a_bad_port_or_address_in_w_says_what_it_is(run_main) -> None:
    code, _out, err = run_main("hosts", "-w", "[fd00::zz]:22")
    assert code == 2
    error, hint = one_error(err)
    assert error == "-w: '[fd00::zz]' is not an IPv6 address"
    assert "[fd00::1]:2222" in hint


def test_a_hostfile_with_a_utf8_bom_and_one_with_a_bad_slots_token(
    tmp_path: Path, run_main
) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_bytes(b"\xef\xbb\xbfworker-1 slots=4\nworker-2 slots=4\n")
    book = tmp_path / "book.yaml"
    book.write_text(GPUS_BOOK)
    result = CliRunner().invoke(cli, ["run", str(book), "-i", str(hostfile), "-n", "--json"])
    assert result.exit_code == 0, result.output
    commands = [json.loads(line)["steps"][0]["command"] for line in result.stdout.splitlines()]
    assert commands == ["echo worker-1 has 4 gpus", "echo worker-2 has 4 gpus"]
    hostfile.write_text("worker-1 slots=8\nworker-2 slots=8\nworker-3 slots=eight\n")
    code, out, err = run_main("hosts", "-i", str(hostfile), "--json")
    assert code == 1
    error, hint = one_error(err)
    assert error == f"{hostfile}:3: 'slots=eight': slots must be a whole number"
    assert "slots=8" in hint
    assert out == ""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[gpu]\nhost[000-999][000-999]\n",
            ":2: 'host[000-999][000-999]' expands to 1,000,000 names",
        ),
        (
            "".join(f"[g{i}]\nr{i}n[0-59999]\n" for i in range(10)),
            ":4: the inventory reaches 120,000 hosts here, more than 100,000",
        ),
        (
            "all:\n  hosts:\n    a[0-99999]:\n    b[0-99999]:\n",
            ":4: all.hosts.b[0-99999]: the inventory reaches 200,000 hosts here",
        ),
    ],
)
def test_an_inventory_past_the_host_limit_is_refused_with_its_count(
    text: str, message: str, tmp_path: Path, run_main
) -> None:
    inv = tmp_path / "inventory"
    inv.write_text(text)
    code, _out, err = run_main("hosts", "-i", str(inv), "--json")
    assert code == 1
    error, hint = one_error(err)
    assert error.startswith(str(inv)), error
    assert message in error
    assert "100,000" in error + hint


def test_a_node_set_past_the_host_limit_is_one_line_and_exit_2(run_main) -> None:
    code, _out, err = run_main("hosts", "-w", "n[0-99999][0-99999]")
    assert code == 2
    error, _ = one_error(err)
    assert error == "-w: the node set expands to 10,000,000,000 hosts, more than 100,000"


def test_limit_failed_reads_the_last_run_of_the_same_verb_and_says_which(
    tmp_path: Path, run_main
) -> None:
    """The cleanup failed on two hosts; a cron job's `fleet status` ran since. `fleet cleanup
    -l @failed` reruns the cleanup's failed hosts, and says which record it read."""
    base = tmp_path / "runs"
    cleanup = write_record(
        base,
        {"gpu01": Outcome.FAILED, "gpu02": Outcome.OK, "gpu03": Outcome.UNREACHABLE},
        verb="cleanup",
    )
    time.sleep(0.01)  # the newest record is the one whose summary was written last
    write_record(
        base, {"gpu01": Outcome.OK, "gpu02": Outcome.TIMED_OUT, "gpu03": Outcome.OK}, "status"
    )
    nodes = ("-w", "gpu[01-03]")
    code, out, err = run_main("cleanup", *nodes, "-l", "@failed", "--yes", "-n", "--json")
    assert code == 0, err
    assert [json.loads(line)["host"] for line in out.splitlines()] == ["gpu01", "gpu03"]
    assert err.startswith(f"fleet: using run record {cleanup.name} (fleet cleanup, 20"), err
    assert err.endswith("): 2 failed hosts\n"), err
    code, out, err = run_main("status", *nodes, "-l", "@failed", "-n", "--json")
    assert code == 0, err
    assert [json.loads(line)["host"] for line in out.splitlines()] == ["gpu02"]
    assert "(fleet status, " in err
