"""The run record (fleet/records/runlog.py): private files, output streamed and capped, no output in
summary.json, pruning only what fleet marked as its own, and a bad --log-dir refused up front."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.core.errors import ConfigError
from fleet.core.events import (
    HostConnecting,
    HostFinished,
    Outcome,
    OutputLine,
    RunFinished,
    RunStarted,
    RunSummary,
    StepFinished,
    StepStarted,
)
from fleet.records import runlog


def _started(record: runlog.RunRecord, *hosts: str) -> None:
    record.handle(
        RunStarted(run_id="r", playbook="exec", hosts=hosts, forks=4, run_dir=str(record.dir))
    )


def _line(host: str, text: str, stream: str = "stdout") -> OutputLine:
    return OutputLine(host=host, step="exec", stream=stream, line=text)


def _finished(host: str, **extra: object) -> HostFinished:
    return HostFinished(host=host, outcome=Outcome.OK, duration_s=1.0, **extra)  # type: ignore[arg-type]


def _run_finished(*results: HostFinished) -> RunFinished:
    return RunFinished(
        summary=RunSummary(run_id="r", playbook="exec", results=results, duration_s=1.0)
    )


@pytest.fixture
def umask_zero() -> Iterator[None]:
    """The most permissive umask there is: what fleet writes must be private anyway."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# ---------------------------------------------------------------- private files


def test_record_is_private_whatever_the_umask(tmp_path: Path, umask_zero: None) -> None:
    record = runlog.RunRecord(tmp_path / "runs", "20261201-000000-exec-abcd")
    _started(record, "n1")
    record.handle(StepStarted(host="n1", step="exec", index=0, command="true"))
    record.handle(_line("n1", "hello"))
    record.handle(_finished("n1"))
    record.handle(_run_finished(_finished("n1")))

    written = [record.dir, *record.dir.rglob("*")]
    assert {p.name for p in written} >= {
        "summary.json",
        "events.jsonl",
        "n1.log",
        "hosts",
        runlog.MARKER,
    }
    for path in written:
        expected = 0o700 if path.is_dir() else 0o600
        assert _mode(path) == expected, f"{path}: {oct(_mode(path))}"


def test_a_record_never_writes_through_a_planted_symlink(tmp_path: Path) -> None:
    base = tmp_path / "runs"
    base.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (base / "20261201-000000-exec-abcd").symlink_to(target)
    record = runlog.RunRecord(base, "20261201-000000-exec-abcd")
    record.close()
    # the name is taken: the record goes beside it, a real directory of its own
    assert record.record_id == "20261201-000000-exec-abcd-2"
    assert record.dir == base / record.record_id
    assert not record.dir.is_symlink()
    assert runlog.is_record(record.dir)
    assert list(target.iterdir()) == []


# ---------------------------------------------------------------- output: streamed, capped


def test_output_is_streamed_to_the_host_log_not_held_until_the_host_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runlog, "HOLD_MAX_BYTES", 64_000)
    record = runlog.RunRecord(tmp_path, "20261201-000000-exec-abcd")
    _started(record, "n1")
    for i in range(20_000):
        record.handle(_line("n1", f"line {i}"))
    log = record.dir / "hosts" / "n1.log"
    # still running, never flushed by an engine: all but the last HOLD_MAX_BYTES is on disk
    written = log.stat().st_size
    held = sum(len(x) for x in record.logs["n1"].held)
    assert written > 20_000 * len("00:00:00 out| line 1") - 64_000
    assert 0 < held <= 64_000
    assert not record.logs["n1"].tail
    record.flush()  # the engine's, within FLUSH_S of the last line
    assert log.stat().st_size == written + held
    assert not record.logs["n1"].held
    assert log.read_text().splitlines()[-1].endswith("out| line 19999")
    record.close()


def test_host_log_holds_node_text_escaped_one_line_per_line(tmp_path: Path) -> None:
    """`cat` or `tail -f` of a host log obeys no node's escape sequence, and a node cannot make
    one line look like two (or like fleet's own): controls show as clean() shows them."""
    record = runlog.RunRecord(tmp_path, "20261201-000000-exec-abcd")
    _started(record, "n1")
    record.handle(_line("n1", "\x1b]0;pwned\x07title \r\x08\x00 \x9b2J\tend"))
    record.handle(_line("n1", "fake\n00:00:00 outcome: ok", stream="stderr"))
    record.handle(_line("n1", "plain ascii line"))
    record.close()
    raw = (record.dir / "hosts" / "n1.log").read_bytes()
    assert not set(raw) & {*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F}
    assert "\x9b".encode() not in raw
    lines = raw.decode().splitlines()
    assert [ln.split(" ", 1)[1] for ln in lines] == [
        "out| \\x1b]0;pwned\\x07title \\r\\x08\\x00 \\x9b2J\tend",
        "err| fake\\n00:00:00 outcome: ok",
        "out| plain ascii line",
    ]


def test_events_are_held_back_until_a_flush_then_written_whole_and_in_order(
    tmp_path: Path,
) -> None:
    record = runlog.RunRecord(tmp_path, "20261201-000000-exec-abcd")
    _started(record, "n1", "n2")
    record.handle(HostConnecting(host="n1", attempt=1))
    record.handle(HostConnecting(host="n2", attempt=1))
    events = record.dir / "events.jsonl"
    assert events.read_bytes() == b""  # held: no write per event
    assert not (record.dir / "hosts" / "n1.log").exists()  # made at its first write
    record.flush()
    kinds = [json.loads(x)["event"] for x in events.read_text().splitlines()]
    assert kinds == ["RunStarted", "HostConnecting", "HostConnecting"]
    assert "connecting (attempt 1)" in (record.dir / "hosts" / "n2.log").read_text()
    record.handle(_finished("n1"))
    record.close()  # what is held is written at close too (Ctrl-C, an error)
    kinds = [json.loads(x)["event"] for x in events.read_text().splitlines()]
    assert kinds[-1] == "HostFinished"
    assert "outcome: ok" in (record.dir / "hosts" / "n1.log").read_text()


def test_host_log_keeps_its_head_then_a_note_then_its_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runlog, "HOST_LOG_MAX_BYTES", 10_000)
    monkeypatch.setattr(runlog, "HOST_LOG_TAIL_BYTES", 2_000)
    record = runlog.RunRecord(tmp_path, "20261201-000000-exec-abcd")
    _started(record, "n1")
    record.handle(StepStarted(host="n1", step="exec", index=0, command="flood"))
    for i in range(5_000):
        record.handle(_line("n1", f"flood {i:05d} " + "x" * 80))
    assert sum(len(x) for x in record.logs["n1"].tail) <= 2_000 + 200  # bounded while running
    record.handle(
        StepFinished(
            host="n1",
            step="exec",
            index=0,
            exit_code=0,
            duration_s=1.0,
            timed_out=False,
            cancelled=False,
            stderr_tail=(),
        )
    )
    record.handle(_finished("n1"))
    record.flush()

    text = (record.dir / "hosts" / "n1.log").read_text()
    lines = text.splitlines()
    notes = [x for x in lines if "[record cut:" in x]
    assert len(notes) == 1
    kept = [x for x in lines if "out| flood" in x]
    head = lines[: lines.index(notes[0])]
    tail = lines[lines.index(notes[0]) + 1 :]
    assert "step 1" in head[0]
    assert "flood 00000" in head[1]
    assert tail[-3].endswith("x" * 80)
    assert "flood 04999" in tail[-3]
    assert "finished: exit 0" in tail[-2]
    assert "outcome: ok" in tail[-1]
    left_out = int(notes[0].split("[record cut: ")[1].split()[0])
    assert left_out + len(kept) == 5_000  # every line is either kept or counted
    assert len(text) < 10_000 + 2_000 + 1_000


def test_several_hosts_write_their_own_logs_even_past_the_open_file_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runlog, "OPEN_LOGS_MAX", 3)
    record = runlog.RunRecord(tmp_path, "20261201-000000-exec-abcd")
    hosts = [f"n{i}" for i in range(10)]
    _started(record, *hosts)
    for round_ in range(3):
        for host in hosts:
            record.handle(_line(host, f"{host} round {round_}"))
        record.flush()
        assert sum(log.fd >= 0 for log in record.logs.values()) == 3
    for host in hosts:
        record.handle(_finished(host))
    record.flush()
    assert not record._open  # every finished host's log is closed
    for host in hosts:
        text = (record.dir / "hosts" / f"{host}.log").read_text()
        assert [x.split("| ")[1] for x in text.splitlines() if "out|" in x] == [
            f"{host} round {r}" for r in range(3)
        ]


def test_events_have_no_output_lines_and_summary_has_no_output(tmp_path: Path) -> None:
    secret_output = "the node printed this"
    record = runlog.RunRecord(tmp_path, "20261201-000000-exec-abcd")
    _started(record, "n1")
    record.handle(HostConnecting(host="n1", attempt=1))
    record.handle(_line("n1", secret_output))
    done = _finished("n1", last_line=secret_output, stderr_tail=(secret_output,))
    record.handle(done)
    record.handle(_run_finished(done))

    events = [json.loads(x) for x in (record.dir / "events.jsonl").read_text().splitlines()]
    assert "OutputLine" not in {e["event"] for e in events}
    summary_text = (record.dir / "summary.json").read_text()
    assert secret_output not in summary_text
    summary = json.loads(summary_text)
    assert summary["hosts"]["n1"]["outcome"] == "ok"
    assert "last_line" not in summary["hosts"]["n1"]
    assert secret_output in (record.dir / "hosts" / "n1.log").read_text()


# ---------------------------------------------------------------- pruning


def _old_record(base: Path, index: int) -> Path:
    record = runlog.RunRecord(base, f"2026{index:04d}-000000-exec-{index:04x}")
    record.close()
    return record.dir


def test_pruning_removes_only_fleets_own_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runlog, "KEEP_RUNS", 3)
    base = tmp_path / "runs"
    checkpoints = []
    for step in (0, 100, 200):  # a training job's checkpoints beside the records
        ckpt = base / f"{step:08d}-step"
        ckpt.mkdir(parents=True)
        (ckpt / "model.safetensors").write_bytes(b"weights")
        checkpoints.append(ckpt)
    unmarked = base / "20250101-000000-not-fleets"
    unmarked.mkdir()
    forged = base / "20250101-000001-wrong-marker"
    forged.mkdir()
    (forged / runlog.MARKER).write_text("something else\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (outside / runlog.MARKER).write_bytes(runlog.MARKER_TEXT)
    (base / "20250101-000002-symlink").symlink_to(outside)

    records = [_old_record(base, i) for i in range(1, 6)]

    assert [r.exists() for r in records] == [False, False, True, True, True]
    for path in (*checkpoints, unmarked, forged):
        assert path.is_dir(), path
    assert (checkpoints[0] / "model.safetensors").read_bytes() == b"weights"
    assert (outside / "keep.txt").read_text() == "keep"
    assert (base / "20250101-000002-symlink").is_symlink()


def test_a_record_that_vanishes_while_pruning_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another fleet pruning the same dir removes a record between our listing and our delete."""
    monkeypatch.setattr(runlog, "KEEP_RUNS", 1)
    base = tmp_path / "runs"
    first = _old_record(base, 1)
    real = runlog._open_marker
    raced: list[Path] = []

    def racing(path: Path) -> int | None:
        if path == first and path.exists():  # the other fleet takes it just before us
            for f in sorted(path.rglob("*"), reverse=True):
                f.rmdir() if f.is_dir() else f.unlink()
            path.rmdir()
            raced.append(path)
        return real(path)

    monkeypatch.setattr(runlog, "_open_marker", racing)
    second = _old_record(base, 2)  # prunes: must not raise
    assert raced == [first]
    assert second.is_dir()
    assert not first.exists()


def test_pruning_counts_a_look_alike_among_the_newest_and_never_touches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runlog, "KEEP_RUNS", 2)
    base = tmp_path / "runs"
    older = [_old_record(base, i) for i in (1, 2)]
    look_alike = base / "20990101-000000-exec-ffff"  # newest by name, not fleet's
    look_alike.mkdir()
    (look_alike / "data").write_text("someone's")
    newest = _old_record(base, 3)
    assert [p.exists() for p in older] == [False, False]
    assert newest.is_dir()
    assert (look_alike / "data").read_text() == "someone's"


def test_pruning_removes_a_record_whole_and_follows_no_symlink_inside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pruned record goes with everything in it, nested directories too; a symlink inside it
    (to a directory, to a file) is removed itself, and what it points at is left alone."""
    monkeypatch.setattr(runlog, "KEEP_RUNS", 1)
    base = tmp_path / "runs"
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "keep.txt").write_text("keep")
    (outside / "file.txt").write_text("keep too")
    old = _old_record(base, 1)
    (old / "hosts" / "gpu01.log").write_text("a line\n")
    nested = old / "hosts" / "a" / "b" / "c"
    nested.mkdir(parents=True)
    (nested / "x.log").write_text("x")
    (old / "hosts" / "dir-link").symlink_to(outside)
    (old / "hosts" / "a" / "file-link").symlink_to(outside / "file.txt")
    (old / "hosts" / "a" / "deep-link").symlink_to(outside / "deep", target_is_directory=True)

    newest = _old_record(base, 2)  # prunes the first

    assert not old.exists()
    assert sorted(p.name for p in base.iterdir()) == [newest.name]
    assert (outside / "deep" / "keep.txt").read_text() == "keep"
    assert (outside / "file.txt").read_text() == "keep too"


def test_pruning_loads_no_shutil(tmp_path: Path) -> None:
    """Every command prunes one record once the dir is full: it must not pay for shutil (and
    the bz2 and lzma it loads) each time."""
    code = (
        "import sys; from pathlib import Path; from fleet.records import runlog\n"
        "runlog.KEEP_RUNS = 1\n"
        "base = Path(sys.argv[1])\n"
        "for i in (1, 2):\n"
        "    runlog.RunRecord(base, f'2026{i:04d}-000000-exec-{i:04x}').close()\n"
        "print(len(list(base.iterdir())), 'shutil' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["1", "False"]


# ---------------------------------------------------------------- --log-dir checked up front


def test_a_file_as_log_dir_is_refused_with_a_hint(tmp_path: Path) -> None:
    file = tmp_path / "passwd"
    file.write_text("root:x:0:0\n")
    with pytest.raises(ConfigError) as caught:
        runlog.check_base(file)
    assert caught.value.message == f"run record dir {file}: not a directory"
    assert "--log-dir" in caught.value.hint
    with pytest.raises(ConfigError, match="is not a directory"):
        runlog.check_base(file / "runs")
    assert file.read_text() == "root:x:0:0\n"


def test_a_missing_log_dir_is_fine_and_not_created_by_the_check(tmp_path: Path) -> None:
    runlog.check_base(tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()


def test_an_unwritable_log_dir_is_refused() -> None:
    """/proc/self: a directory nobody may create files in, not even root (the tests run as root,
    who may write anywhere else)."""
    with pytest.raises(ConfigError, match="/proc/self: not writable"):
        runlog.check_base(Path("/proc/self"))
    with pytest.raises(ConfigError, match="cannot create it: /proc/self is not writable"):
        runlog.check_base(Path("/proc/self/runs"))


def test_a_record_that_cannot_be_created_is_a_config_error_not_a_crash() -> None:
    """What check_base cannot foresee (here: procfs refuses mkdir) still ends in one clear error."""
    with pytest.raises(ConfigError, match="run record dir /proc/fleet-test: cannot write a record"):
        runlog.RunRecord(Path("/proc/fleet-test"), "20261201-000000-exec-abcd")


def test_cli_with_a_file_as_log_dir_exits_1_before_connecting(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("all:\n  hosts:\n    gpu01.invalid:\n      ansible_host: 192.0.2.1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet",
            "exec",
            "-i",
            str(inventory),
            "--log-dir",
            "/etc/passwd",
            "true",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],  # this checkout's fleet
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert "run record dir /etc/passwd: not a directory" in lines[0]
    assert lines[1].strip().startswith("hint:")
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
