"""`-l @failed`, `@unreachable`, `@FILE`: the hosts to rerun on, from run records or a file."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from fleet.core.errors import InventoryError
from fleet.records import retry, runlog


def _record(base: Path, name: str, outcomes: dict[str, str], age_s: float = 0) -> Path:
    path = base / name
    path.mkdir(parents=True)
    (path / runlog.MARKER).write_bytes(runlog.MARKER_TEXT)
    hosts = {h: {"host": h, "outcome": o} for h, o in outcomes.items()}
    summary = path / "summary.json"
    summary.write_text(json.dumps({"exit_code": 3, "hosts": hosts}))
    stamp = time.time() - age_s
    os.utime(summary, (stamp, stamp))
    return path


def test_failed_is_the_newest_runs_hosts_that_did_not_end_ok(tmp_path: Path) -> None:
    _record(tmp_path, "20261201-0900-exec-a", {"a": "failed", "b": "ok"}, age_s=60)
    _record(
        tmp_path,
        "20261201-0800-cleanup-b",  # an older-looking name, but written last
        {"n1": "ok", "n2": "failed", "n3": "unreachable", "n4": "timed_out", "n5": "cancelled"},
    )
    (tmp_path / "20261201-0999-unfinished").mkdir()  # being written: no summary yet
    assert retry.expand("@failed", tmp_path) == "n2,n3,n4,n5"
    assert retry.expand("@unreachable", tmp_path) == "n3,n4"
    assert retry.expand("@failed,&gpu", tmp_path) == "n2,n3,n4,n5,&gpu"
    assert retry.expand("gpu,!@unreachable", tmp_path) == "gpu,!n3,!n4"
    assert retry.expand("gpu:@unreachable", tmp_path) == "gpu:n3,n4"


def test_a_directory_fleet_did_not_mark_is_never_read(tmp_path: Path) -> None:
    _record(tmp_path, "old", {"a": "failed"}, age_s=60)
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "summary.json").write_text(json.dumps({"hosts": {"x": {"outcome": "failed"}}}))
    assert retry.expand("@failed", tmp_path) == "a"


def test_nothing_to_retry_and_no_records_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="no finished run record"):
        retry.expand("@failed", tmp_path)
    _record(tmp_path, "r", {"a": "ok"})
    with pytest.raises(InventoryError, match="no host was failed in the last run"):
        retry.expand("@failed", tmp_path)
    with pytest.raises(InventoryError, match="not supported") as info:
        retry.expand("gpu,&@failed", tmp_path)
    assert "@failed,&GROUP" in info.value.hint


def test_a_retry_file_lists_names(tmp_path: Path) -> None:
    retry_file = tmp_path / "site.retry"
    retry_file.write_text("# from the last play\nnode01\n\nnode03  # flaky\n")
    assert retry.expand(f"@{retry_file}", tmp_path) == "node01,node03"
    bad = tmp_path / "bad.retry"
    bad.write_text("node01\nrm -rf /\n")
    with pytest.raises(InventoryError, match=r"bad.retry:2: not a host name"):
        retry.expand(f"@{bad}", tmp_path)
    with pytest.raises(InventoryError, match="cannot read"):
        retry.expand(f"@{tmp_path / 'missing'}", tmp_path)


def _verb_record(
    base: Path, name: str, verb: str, outcomes: dict[str, str], age_s: float, run: str = ""
) -> None:
    path = _record(base, name, outcomes, age_s)
    summary = path / "summary.json"
    doc = json.loads(summary.read_text())
    doc.update(verb=verb, playbook=verb, invocation=run or name, ts=1764694800.0 - age_s)
    summary.write_text(json.dumps(doc))
    stamp = time.time() - age_s
    os.utime(summary, (stamp, stamp))


def test_failed_takes_the_newest_run_of_the_same_verb_and_says_which(tmp_path: Path) -> None:
    """A cron job's `fleet status` after the failed cleanup must not become what
    `fleet cleanup -l @failed` reruns on."""
    _verb_record(tmp_path, "c1", "cleanup", {"a": "failed", "b": "failed", "c": "ok"}, 300)
    _verb_record(tmp_path, "s1", "status", {"a": "ok", "b": "ok", "c": "unreachable"}, 60)
    notes: list[str] = []
    assert retry.expand("@failed", tmp_path, verb="cleanup", notes=notes) == "a,b"
    assert len(notes) == 1
    assert notes[0].startswith("using run record c1 (fleet cleanup, 2025-12-02 ")
    assert notes[0].endswith("): 2 failed hosts")
    assert retry.expand("@failed", tmp_path, verb="status", notes=notes) == "c"
    assert notes[1].endswith("): 1 failed host")
    # no verb (fleet hosts -l @failed): the newest run of any verb
    assert retry.expand("@failed", tmp_path) == "c"
    with pytest.raises(InventoryError, match="no finished fleet exec run record"):
        retry.expand("@failed", tmp_path, verb="exec")


def test_failed_unites_the_records_of_one_chained_run(tmp_path: Path) -> None:
    """A launch is several records (preflight, start, roll back): the failed start counts,
    though the roll back's record, written last, has none."""
    _verb_record(tmp_path, "pre", "launch", {"a": "ok", "b": "ok"}, 30, run="L1")
    _verb_record(tmp_path, "start", "launch", {"a": "ok", "b": "failed"}, 20, run="L1")
    _verb_record(tmp_path, "stop", "launch", {"a": "ok"}, 10, run="L1")
    notes: list[str] = []
    assert retry.expand("@failed", tmp_path, verb="launch", notes=notes) == "b"
    assert notes[0].startswith("using run record start (fleet launch, ")


def test_a_newer_run_of_the_verb_with_nothing_failed_is_nothing_to_retry(tmp_path: Path) -> None:
    _verb_record(tmp_path, "c1", "cleanup", {"a": "failed"}, 300)
    _verb_record(tmp_path, "c2", "cleanup", {"a": "ok"}, 60)
    with pytest.raises(
        InventoryError, match=r"no host was failed in the last fleet cleanup run \(c2\)"
    ):
        retry.expand("@failed", tmp_path, verb="cleanup")
