"""Many fleet processes at once on one bastion, against the sandbox's real sshd nodes: an
operator's terminals, a cron job and a second operator sharing a login, all with one run-record
directory (already at its retention limit) and one known_hosts (`accept-new`, empty at first).

Each round starts 16 `fleet` processes at the same moment: five `exec` (success, a failing
command everywhere, a failing command on one node, one that leaves a file on every node, output
on both streams), three `status`, two `cleanup --yes`, two `logs -n`, two `hosts`, a `launch` of
a new run and a `stop` of the previous one (racing: the launch is refused while the previous run
still has processes, and then nothing of it may run anywhere). After every round and at the end:
no internal error and no traceback anywhere; every exit code is the one the nodes' results call
for; every record complete and parseable, with the exit code its process returned; retention
bounded; known_hosts holding one whole line per node.

The launched job is a stand-in (`sh -c 'exec sleep 600'` as the launcher, as in
test_launch_atomic.py); every process a run started is killed by its marker at the end.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
import pytest
from fleetrun import FLEET, FleetResult, fleet_env, poll, run_fleet
from realtorch import MARKED, STATE

from fleet.core.events import HostFinished, Outcome, RunFinished, RunStarted, RunSummary
from fleet.node.runstate import HEALTHY
from fleet.records import runlog

pytestmark = pytest.mark.root

ROUNDS = 3
PROCESSES = 16
ROUND_TIMEOUT_S = 90
JOB = "sh -c 'exec sleep 600'"
LAUNCH = ("launch", "--dir", "/tmp", "--var", "min_free_gb=0.01", "--launcher", JOB, "--plain")
RECORD_LINE = re.compile(r"run record: (\S+)")
RUN_DIR = re.compile(r'"run_dir": "([^"]+)"')


@dataclass
class Job:
    """One fleet process of a round: its arguments, and what its result must be."""

    name: str
    args: tuple[str, ...]
    check: Callable[[FleetResult], None]
    single_run: bool = True  # one record, whose exit code is the process's (or record_exit)
    record_exit: int | None = None  # when it is not the process's


@dataclass
class Stress:
    """What the rounds share: the sandbox, the records dir, the ssh config, the runs used."""

    sandbox: Any
    logs: Path
    ssh_config: Path
    known_hosts: Path
    names: list[str]
    runs: list[str]
    tokens: list[str]

    def env(self) -> dict[str, str]:
        return fleet_env(self.sandbox, self.logs, ssh_config=self.ssh_config)

    def pids(self, run: str) -> dict[str, list[int]]:
        """node -> live pids carrying the run's marker, for the nodes where it has any."""
        found = {}
        for node in self.sandbox.nodes():
            out = self.sandbox.run_on(node, MARKED + f"marked {shlex.quote(run)}").stdout
            if out.split():
                found[node.name] = [int(p) for p in out.split()]
        return found


@pytest.fixture
def stress(sandbox: Any, tmp_path: Path) -> Iterator[Stress]:
    """A records dir filled to KEEP_RUNS, an empty known_hosts that every run may add to
    (`StrictHostKeyChecking accept-new`), and a clean launch state on every node."""
    known = tmp_path / "known_hosts"
    config = tmp_path / "ssh_config"
    text = sandbox.ssh_config_path.read_text()
    assert str(sandbox.known_hosts_path) in text
    assert "StrictHostKeyChecking yes" in text
    config.write_text(
        text.replace(str(sandbox.known_hosts_path), str(known)).replace(
            "StrictHostKeyChecking yes", "StrictHostKeyChecking accept-new"
        )
    )
    logs = tmp_path / "runs"
    for i in range(runlog.KEEP_RUNS):  # older records, complete, as fleet wrote them
        _finish(runlog.RunRecord(logs, f"20250101-{i:06d}-exec-0000"))
    for node in sandbox.nodes():
        sandbox.run_on(node, f"rm -rf {STATE}")
    made = Stress(sandbox, logs, config, known, sorted(n.name for n in sandbox.nodes()), [], [])
    try:
        yield made
    finally:
        for node in sandbox.nodes():
            for run in made.runs:
                sandbox.run_on(
                    node, MARKED + f"kill -KILL $(marked {shlex.quote(run)}) 2>/dev/null"
                )
            files = " ".join(f"/tmp/stress-{t}" for t in made.tokens)
            sandbox.run_on(node, f"rm -rf {STATE} {files}")


def _finish(record: runlog.RunRecord) -> None:
    hosts = ("node01",)
    record.handle(
        RunStarted(run_id=record.record_id, playbook="exec", hosts=hosts, forks=1, run_dir="")
    )
    done = HostFinished(host="node01", outcome=Outcome.OK, duration_s=0.1)
    record.handle(done)
    summary = RunSummary(run_id=record.record_id, playbook="exec", results=(done,), duration_s=0.1)
    record.handle(RunFinished(summary=summary))
    record.close()


# ---------------------------------------------------------------- what each result must be


def _final(result: FleetResult) -> dict[str, Any]:
    return result.final()


def _hosts_of(result: FleetResult) -> dict[str, dict[str, Any]]:
    return {x["host"]: x for x in result.json_lines() if x.get("event") == "HostFinished"}


def _exec_ok(names: list[str]) -> Callable[[FleetResult], None]:
    def check(result: FleetResult) -> None:
        assert result.code == 0, result.stderr
        hosts = _hosts_of(result)
        assert sorted(hosts) == names
        assert {h["outcome"] for h in hosts.values()} == {"ok"}

    return check


def _exec_failed(where: list[str], code: int) -> Callable[[FleetResult], None]:
    def check(result: FleetResult) -> None:
        assert result.code == 3, result.stdout[-2000:] + result.stderr
        hosts = _hosts_of(result)
        assert sorted(hosts) == where
        assert {(h["outcome"], h["exit_code"]) for h in hosts.values()} == {("failed", code)}

    return check


def _streams(names: list[str], token: str) -> Callable[[FleetResult], None]:
    """`--plain`: every node's stdout line and stderr line, under that node's name."""

    def check(result: FleetResult) -> None:
        assert result.code == 0, result.stdout[-2000:] + result.stderr
        for name in names:
            assert re.search(rf"^{name} \|\s+out-{token}$", result.stdout, re.M), name
            assert re.search(rf"^{name} \| ! err-{token}$", result.stdout, re.M), name

    return check


def _status(names: list[str], runs: set[str]) -> Callable[[FleetResult], None]:
    """Whatever moment it saw: 0 exactly when every node answered with a healthy run."""

    def check(result: FleetResult) -> None:
        states = result.run_states()
        assert sorted(states) == names, result.stdout[-2000:]
        for state in states.values():
            assert state["run"] in runs, state
        healthy = all(s["state"] in {h.value for h in HEALTHY} for s in states.values())
        assert result.code == (0 if healthy else 3), (result.code, states)

    return check


def _cleanup(names: list[str]) -> Callable[[FleetResult], None]:
    def check(result: FleetResult) -> None:
        assert result.code == 0, result.stdout[-3000:] + result.stderr
        hosts = _hosts_of(result)
        assert sorted(hosts) == names
        assert {h["outcome"] for h in hosts.values()} == {"ok"}

    return check


def _logs(names: list[str]) -> Callable[[FleetResult], None]:
    def check(result: FleetResult) -> None:
        assert result.code == 0, result.stdout[-2000:] + result.stderr
        assert sorted(_hosts_of(result)) == names

    return check


def _hosts_table(names: list[str]) -> Callable[[FleetResult], None]:
    def check(result: FleetResult) -> None:
        assert result.code == 0, result.stderr
        assert f"{len(names)} of {len(names)} hosts" in result.stdout, result.stdout
        for name in names:
            assert name in result.stdout

    return check


def _hosts_json(names: list[str]) -> Callable[[FleetResult], None]:
    def check(result: FleetResult) -> None:
        assert result.code == 0, result.stderr
        assert sorted(h["name"] for h in json.loads(result.stdout)) == names

    return check


def _launched(stress: Stress, run: str) -> Callable[[FleetResult], None]:
    """Started (0): on every node; refused or rolled back (3): nowhere. Nothing else."""

    def check(result: FleetResult) -> None:
        assert result.code in (0, 3), result.stdout[-3000:] + result.stderr
        if result.code == 0:
            assert f"fleet: run {run} started on {len(stress.names)} hosts" in result.stderr
            assert poll(lambda: sorted(stress.pids(run)) == stress.names), stress.pids(run)
        else:
            assert "refused" in result.stdout or "rolled back" in result.stderr, (
                result.stdout[-3000:] + result.stderr
            )
            assert stress.pids(run) == {}, f"refused launch {run} left processes"

    return check


def _stopped(stress: Stress, run: str) -> Callable[[FleetResult], None]:
    def check(result: FleetResult) -> None:
        assert result.code == 0, result.stdout[-2000:] + result.stderr
        assert stress.pids(run) == {}, f"{run} still runs after its stop"

    return check


def _round_jobs(stress: Stress, token: str, previous: str, new: str) -> list[Job]:
    names = stress.names
    mark = f"/tmp/stress-{token}"
    runs = set(stress.runs)
    jobs = [
        Job("exec ok", ("exec", "true", "--json"), _exec_ok(names)),
        Job("exec exit 7", ("exec", "exit 7", "--json"), _exec_failed(names, 7)),
        Job(
            "exec one node",
            ("exec", "-l", names[1], "exit 5", "--json"),
            _exec_failed([names[1]], 5),
        ),
        Job("exec file", ("exec", f"echo {token} > {mark}", "--json"), _exec_ok(names)),
        Job(
            "exec streams",
            ("exec", f"echo out-{token}; echo err-{token} >&2", "--plain"),
            _streams(names, token),
        ),
        # status's own run succeeds on every node; its exit says whether the runs are healthy
        *(
            Job(f"status {i}", ("status", "--json"), _status(names, runs), record_exit=0)
            for i in range(3)
        ),
        *(
            Job(f"cleanup {i}", ("cleanup", "--yes", "--grace", "1", "--json"), _cleanup(names))
            for i in range(2)
        ),
        *(Job(f"logs {i}", ("logs", "-n", "5", "--json"), _logs(names)) for i in range(2)),
        Job("hosts", ("hosts",), _hosts_table(names), single_run=False),
        Job("hosts json", ("hosts", "--json"), _hosts_json(names), single_run=False),
        Job(
            "launch",
            (*LAUNCH, "--run-id", new, "--master-port", str(29700 + len(stress.runs)), "--", "job"),
            _launched(stress, new),
            single_run=False,
        ),
        Job(
            "stop",
            ("stop", "--run-id", previous, "--yes", "--grace", "1", "--plain"),
            _stopped(stress, previous),
        ),
    ]
    assert len(jobs) == PROCESSES
    return jobs


def _at_once(stress: Stress, jobs: list[Job], out_dir: Path) -> list[FleetResult]:
    """Start every job, as close together as process creation allows; wait for all."""
    env = stress.env()
    out_dir.mkdir()
    procs = []
    for index, job in enumerate(jobs):
        stdout = (out_dir / f"{index}.out").open("w")
        stderr = (out_dir / f"{index}.err").open("w")
        procs.append(
            (
                subprocess.Popen(
                    [*FLEET, *job.args],
                    stdin=subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=stderr,
                    env=env,
                ),
                stdout,
                stderr,
            )
        )
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    results = []
    for index, ((proc, stdout, stderr), job) in enumerate(zip(procs, jobs, strict=True)):
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other, _, _ in procs:
                other.kill()
            pytest.fail(f"{job.name} ({' '.join(job.args)}) still running after {ROUND_TIMEOUT_S}s")
        stdout.close()
        stderr.close()
        results.append(
            FleetResult(
                code,
                (out_dir / f"{index}.out").read_text(),
                (out_dir / f"{index}.err").read_text(),
            )
        )
    return results


def _records_of(result: FleetResult) -> list[Path]:
    text = result.stdout + result.stderr
    return sorted({Path(p) for p in RECORD_LINE.findall(text) + RUN_DIR.findall(text)})


def _check_record(record: Path) -> dict[str, Any]:
    """Marker, events (RunStarted first, RunFinished last, every line JSON), summary.json with
    the same exit code, a log for every host; nothing left written aside. Returns the summary."""
    assert runlog.is_record(record), record
    events = [json.loads(x) for x in (record / "events.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "RunStarted", record
    assert events[-1]["event"] == "RunFinished", record
    summary = json.loads((record / "summary.json").read_text())
    assert summary["run_id"] == record.name == events[0]["run_id"]
    assert summary["exit_code"] == events[-1]["exit_code"]
    logs = {p.name for p in (record / "hosts").iterdir()}
    assert logs == {f"{h}.log" for h in summary["hosts"]}, record
    assert not [p for p in record.iterdir() if p.name.endswith(".tmp")], record
    return summary


def test_sixteen_fleets_at_once_for_several_rounds_never_break_each_other(
    stress: Stress, tmp_path: Path
) -> None:
    started = time.monotonic()
    old = {p.name for p in stress.logs.iterdir()}
    assert len(old) == runlog.KEEP_RUNS
    first = f"stress-{uuid.uuid4().hex[:8]}-0"
    stress.runs.append(first)
    base = run_fleet(
        stress.sandbox,
        *LAUNCH,
        "--run-id",
        first,
        "--master-port",
        "29699",
        "--",
        "job",
        log_dir=stress.logs,
        ssh_config=stress.ssh_config,
    )
    assert base.code == 0, base.stdout + base.stderr
    previous = first
    referenced: list[Path] = _records_of(base)
    launched = []
    for round_ in range(ROUNDS):
        token = uuid.uuid4().hex[:10]
        stress.tokens.append(token)
        new = f"stress-{token[:8]}-{round_ + 1}"
        stress.runs.append(new)
        jobs = _round_jobs(stress, token, previous, new)
        results = _at_once(stress, jobs, tmp_path / f"round{round_}")

        for job, result in zip(jobs, results, strict=True):
            text = result.stdout + result.stderr
            what = f"round {round_}, {job.name}: exit {result.code}\n{text[-3000:]}"
            assert "internal error" not in text, what
            assert "Traceback" not in text, what
            job.check(result)
            records = _records_of(result)
            referenced += records
            if job.single_run:
                (record,) = records
                expected = result.code if job.record_exit is None else job.record_exit
                assert _check_record(record)["exit_code"] == expected, what
        # what the exec that writes a file did, on every node
        for node in stress.sandbox.nodes():
            out = stress.sandbox.run_on(node, f"cat /tmp/stress-{token}").stdout
            assert out == f"{token}\n", node.name
        launched.append(results[-2].code == 0)
        previous = new

    # every record a process named is there, whole; none is the same as another
    assert len(referenced) == len(set(referenced))
    for record in referenced:
        _check_record(record)
    # retention: the newest KEEP_RUNS, all of them this test's; nothing half-deleted
    entries = sorted(stress.logs.iterdir())
    assert [p for p in entries if p.name.startswith(runlog.PRUNING)] == []
    assert len(entries) == runlog.KEEP_RUNS
    assert set(referenced) <= set(entries)
    assert len(old - {p.name for p in entries}) == len(referenced)
    # known_hosts: written by every run at once, one whole line per node
    lines = stress.known_hosts.read_text().splitlines()
    entries_kh = [paramiko.hostkeys.HostKeyEntry.from_line(x) for x in lines]
    addresses = sorted(str(n.address) for n in stress.sandbox.nodes())
    assert sorted(name for e in entries_kh if e for name in e.hostnames) == addresses, lines
    seen = {
        (e.hostnames[0], e.key.get_name(), e.key.get_base64())
        for e in (paramiko.hostkeys.HostKeyEntry.from_line(x) for x in lines)
        if e
    }
    truth = stress.sandbox.known_hosts_path.read_text().split("\n")
    for host, keytype, key in seen:
        assert f"{host} {keytype} {key}" in truth, host
    elapsed = time.monotonic() - started
    print(f"{ROUNDS} rounds of {PROCESSES} at once: {elapsed:.1f}s; launches started: {launched}")
