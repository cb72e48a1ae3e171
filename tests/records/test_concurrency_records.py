"""Run records shared by many fleet processes at once (fleet/records/runlog.py): each test starts
real processes (this interpreter, `python -c`) that write records into one directory the way fleet
does, while the directory is at its retention limit.

What must hold, however the processes interleave: no process fails; a record being written is
never pruned (however old its name); two records never share a directory, even under one run
id; a reader never sees half a summary.json; pruning never waits for a writer; and retention
stays bounded (KEEP_RUNS, plus the records being written when the last prune ran).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet.core.events import HostFinished, Outcome, RunFinished, RunStarted, RunSummary
from fleet.records import runlog

CHECKOUT = Path(__file__).resolve().parents[2]
HOSTS = ("n1", "n2")

# One writer process: makes COUNT records in BASE under RUN_ID (or fresh ids), each with a
# RunStarted, HOSTS hosts' lines and outcomes, a pause (so records overlap), then a check that
# the record is still whole, then RunFinished. Prints "ok DIR" or "pruned DIR" per record.
WRITER = """
import sys, time
from pathlib import Path
from fleet.records import runlog
from fleet.core.events import HostFinished, OutputLine, Outcome, RunFinished, RunStarted, RunSummary

base, count, rid_arg, pause_s = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
hosts = tuple(f"n{i}" for i in range(1, int(sys.argv[5]) + 1))
while not (base / "go").exists():  # every writer starts at once
    time.sleep(0.001)
for _ in range(count):
    rid = rid_arg or runlog.new_record_id("exec")
    record = runlog.RunRecord(base, rid)
    record.handle(RunStarted(run_id=record.record_id, playbook="exec", hosts=hosts, forks=2,
                             run_dir=str(record.dir)))
    results = []
    for host in hosts:
        record.handle(OutputLine(host=host, step="exec", stream="stdout", line=f"hello {host}"))
        done = HostFinished(host=host, outcome=Outcome.OK, duration_s=0.1)
        record.handle(done)
        results.append(done)
    record.flush()  # as the engine does within FLUSH_S (fleet/core/flushing.py)
    time.sleep(pause_s)
    whole = all((record.dir / f).exists()
                for f in (runlog.MARKER, "events.jsonl", "hosts/n1.log", "hosts/n2.log"))
    record.handle(RunFinished(summary=RunSummary(run_id=record.record_id, playbook="exec",
                                                 results=tuple(results), duration_s=0.1)))
    record.close()
    print(("ok " if whole else "pruned ") + str(record.dir), flush=True)
"""


def _writers(
    base: Path,
    processes: int,
    count: int,
    record_id: str = "",
    pause_s: float = 0.02,
    hosts: int = 2,
) -> list[subprocess.CompletedProcess[str]]:
    """Start `processes` writers, release them at once, wait for all (each bounded)."""
    base.mkdir(parents=True, exist_ok=True)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER,
                str(base),
                str(count),
                record_id,
                str(pause_s),
                str(hosts),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=CHECKOUT,
        )
        for _ in range(processes)
    ]
    time.sleep(0.3)  # let the interpreters start, so that they are released together
    (base / "go").touch()
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    (base / "go").unlink()
    return done


def _fill(base: Path, prefix: str) -> list[Path]:
    """KEEP_RUNS finished records named PREFIX0101-NNNNNN-exec-0000."""
    made = []
    for i in range(runlog.KEEP_RUNS):
        record = runlog.RunRecord(base, f"{prefix}0101-{i:06d}-exec-0000")
        _finish(record)
        made.append(record.dir)
    return made


def _finish(record: runlog.RunRecord) -> None:
    record.handle(
        RunStarted(run_id=record.record_id, playbook="exec", hosts=HOSTS, forks=2, run_dir="")
    )
    results = tuple(HostFinished(host=h, outcome=Outcome.OK, duration_s=0.1) for h in HOSTS)
    for result in results:
        record.handle(result)
    summary = RunSummary(run_id=record.record_id, playbook="exec", results=results, duration_s=0.1)
    record.handle(RunFinished(summary=summary))
    record.close()


def _records(base: Path) -> list[Path]:
    return sorted(p for p in base.iterdir() if runlog.RECORD_ID.match(p.name))


def _assert_complete(record: Path) -> None:
    """Marker, events (RunStarted first, RunFinished last, every line JSON), summary, logs."""
    assert runlog.is_record(record), record
    events = [json.loads(x) for x in (record / "events.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "RunStarted", record
    assert events[-1]["event"] == "RunFinished", record
    summary = json.loads((record / "summary.json").read_text())
    assert summary["run_id"] == record.name
    assert summary["exit_code"] == events[-1]["exit_code"] == 0
    assert sorted(p.name for p in (record / "hosts").iterdir()) == ["n1.log", "n2.log"]
    assert not list(record.glob(".*.tmp")), record


def _assert_clean_exits(done: list[subprocess.CompletedProcess[str]]) -> list[str]:
    """Every writer exited 0, printed nothing on stderr; returns their report lines."""
    for proc in done:
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == "", proc.stderr
    return [line for proc in done for line in proc.stdout.splitlines()]


def test_records_made_at_once_at_the_retention_limit_all_survive_whole(tmp_path: Path) -> None:
    """KEEP_RUNS older records, then many fleets at once, each pruning while the others prune
    the same ones: no FileNotFoundError (an internal error, exit 1), every new record whole."""
    base = tmp_path / "runs"
    old = _fill(base, "2025")
    done = _writers(base, processes=16, count=4)

    lines = _assert_clean_exits(done)
    assert len(lines) == 16 * 4
    assert all(line.startswith("ok ") for line in lines), lines
    new = [Path(line.split(" ", 1)[1]) for line in lines]
    assert len(set(new)) == len(new)
    for record in new:
        _assert_complete(record)
    # the oldest made room, one for each new record: exactly KEEP_RUNS, nothing half-deleted
    assert len(_records(base)) == runlog.KEEP_RUNS
    assert [p.exists() for p in old[: len(new)]] == [False] * len(new)
    assert all(p.exists() for p in old[len(new) :])
    assert not [p for p in base.iterdir() if p.name.startswith(runlog.PRUNING)]


def test_a_record_being_written_is_never_pruned_however_old_its_name(tmp_path: Path) -> None:
    """KEEP_RUNS records with names newer than now (a clock set ahead, another time zone): every
    new record is the oldest, the first any other fleet would prune. 16 writers at once keep
    every one of their records ("run record stopped: No such file or directory" never shows)."""
    base = tmp_path / "runs"
    _fill(base, "2099")
    done = _writers(base, processes=16, count=4, pause_s=0.05)

    lines = _assert_clean_exits(done)
    assert len(lines) == 16 * 4
    assert [x for x in lines if not x.startswith("ok ")] == []
    # finished records are prunable again: bounded by KEEP_RUNS plus the 16 writers
    left = _records(base)
    assert runlog.KEEP_RUNS <= len(left) <= runlog.KEEP_RUNS + 16
    for record in left:
        _assert_complete(record)
    assert not [p for p in base.iterdir() if p.name.startswith(runlog.PRUNING)]
    # with no one writing, the next record brings it back to KEEP_RUNS (and itself)
    _finish(runlog.RunRecord(base, runlog.new_record_id("exec")))
    assert len(_records(base)) == runlog.KEEP_RUNS + 1


def test_one_record_id_in_many_processes_at_once_gets_one_directory_each(tmp_path: Path) -> None:
    """Run ids are only random enough; the record's mkdir is what makes them unique."""
    base = tmp_path / "runs"
    rid = "20261201-040713-exec-7006"
    done = _writers(base, processes=12, count=1, record_id=rid)

    lines = _assert_clean_exits(done)
    dirs = sorted(Path(line.split(" ", 1)[1]).name for line in lines)
    assert sorted(dirs) == sorted([rid] + [f"{rid}-{n}" for n in range(2, 13)])
    for name in dirs:
        _assert_complete(base / name)


def test_a_reader_never_sees_half_a_summary(tmp_path: Path) -> None:
    """A reader polls the directory while writers write and prune: a summary.json it can open is
    whole JSON (300 hosts: a summary of many pages, more than one write)."""
    base = tmp_path / "runs"
    _fill(base, "2025")
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            """
import json, os, sys, time
from pathlib import Path
base = Path(sys.argv[1]); seen = 0; bad = []
deadline = time.monotonic() + 60
while not (base / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.001)
while (base / "go").exists() and time.monotonic() < deadline:
    for name in os.listdir(base):
        if not name[:1].isdigit():
            continue
        try:
            text = (base / name / "summary.json").read_text()
        except OSError:
            continue  # not finished yet, or pruned meanwhile
        seen += 1
        try:
            json.loads(text)
        except ValueError:
            bad.append(name)
print(seen, len(bad), bad[:3])
""",
            str(base),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=CHECKOUT,
    )
    done = _writers(base, processes=8, count=6, pause_s=0, hosts=300)
    out, _ = reader.communicate(timeout=90)

    _assert_clean_exits(done)
    seen, bad = out.split()[:2]
    assert int(seen) > 0, out
    assert bad == "0", out


def test_pruning_skips_a_locked_record_without_waiting_and_takes_it_once_its_writer_died(
    tmp_path: Path,
) -> None:
    """A `fleet logs -f` left open for days while cron runs `fleet status` every minute: its
    record is the oldest, and must outlive the others while it is written; killed (kill -9, the
    kernel drops its lock), it is an ordinary old record."""
    base = tmp_path / "runs"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom pathlib import Path\nfrom fleet.records import runlog\n"
            "r = runlog.RunRecord(Path(sys.argv[1]), '20200101-000000-logs-0000')\n"
            "print('held', flush=True)\ntime.sleep(600)\n",
            str(base),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=CHECKOUT,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        held = base / "20200101-000000-logs-0000"
        slowest = 0.0
        for i in range(runlog.KEEP_RUNS + 20):
            started = time.monotonic()
            _finish(runlog.RunRecord(base, f"2026{i:04d}-000000-status-0000"))
            slowest = max(slowest, time.monotonic() - started)
        assert held.is_dir()
        assert runlog.is_record(held)
        assert len(_records(base)) == runlog.KEEP_RUNS + 1
        assert slowest < 1.0, f"a record took {slowest:.2f}s: pruning waited?"
    finally:
        holder.kill()
        holder.wait(timeout=30)
    _finish(runlog.RunRecord(base, "20270101-000000-status-0000"))
    assert not held.exists()
    assert len(_records(base)) == runlog.KEEP_RUNS


def test_a_prune_cut_short_is_finished_by_the_next_and_nothing_else_is_touched(
    tmp_path: Path,
) -> None:
    base = tmp_path / "runs"
    base.mkdir()
    # renamed aside, then the pruner was killed: still marked as fleet's, so finished off
    cut = base / f"{runlog.PRUNING}20250101-000000-exec-0000-1a2b3c4d"
    (cut / "hosts").mkdir(parents=True)
    (cut / "hosts" / "n1.log").write_text("out| hello\n")
    (cut / runlog.MARKER).write_bytes(runlog.MARKER_TEXT)
    # only the final rmdir was missing
    empty = base / f"{runlog.PRUNING}20250101-000001-exec-0000-5e6f7a8b"
    empty.mkdir()
    # not provably fleet's (no marker, yet not empty): left alone
    foreign = base / f"{runlog.PRUNING}notes"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    # marked, but its marker is locked (another fleet is deleting it right now): left to it
    busy = base / f"{runlog.PRUNING}20250101-000002-exec-0000-9c0d1e2f"
    busy.mkdir()
    (busy / runlog.MARKER).write_bytes(runlog.MARKER_TEXT)
    fd = os.open(busy / runlog.MARKER, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _finish(runlog.RunRecord(base, "20261201-000000-exec-abcd"))
        assert busy.is_dir()
    finally:
        os.close(fd)

    assert not cut.exists()
    assert not empty.exists()
    assert (foreign / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("taken", ["dir", "file", "symlink"])
def test_a_taken_record_name_is_never_reused(tmp_path: Path, taken: str) -> None:
    base = tmp_path / "runs"
    base.mkdir()
    name = "20261201-000000-exec-abcd"
    target = tmp_path / "elsewhere"
    target.mkdir()
    if taken == "dir":
        (base / name).mkdir()
        (base / name / "mine.txt").write_text("x")
    elif taken == "file":
        (base / name).write_text("x")
    else:
        (base / name).symlink_to(target)
    record = runlog.RunRecord(base, name)
    _finish(record)
    assert record.record_id == f"{name}-2"
    _assert_complete(record.dir)
    assert list(target.iterdir()) == []
    if taken == "dir":
        assert sorted(p.name for p in (base / name).iterdir()) == ["mine.txt"]


def test_launch_ids_made_in_the_same_second_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch whose start is refused stops its launch id everywhere its start ran: two launches
    sharing an id (same second, same suffix) would stop each other's run. With 16 bits of
    suffix, 200 launches in one second would share an id about one time in three."""
    from fleet.ops import launch

    ids = [launch.new_launch_id() for _ in range(3)]
    assert all(re.fullmatch(r"run-\d{8}-\d{6}-[0-9a-f]{8}", x) for x in ids), ids
    monkeypatch.setattr(launch.time, "strftime", lambda fmt, *a: "20261201-040713")
    same_second = {launch.new_launch_id() for _ in range(200)}
    assert len(same_second) == 200
    for launch_id in same_second:
        assert launch.check_launch_id(launch_id) == launch_id
