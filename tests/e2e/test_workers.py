"""Worker processes (--workers) against real sshd nodes: a run split over 3 processes gives the
same events per host, the same run record and the same exit code as one process; Ctrl-C
cancels every host and stops the remote commands; no worker outlives the command."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, FleetResult, fleet_env, poll, run_fleet
from freesubnet import on_a_free_subnet

from fleet.core import nodeset
from fleet.sandbox import Sandbox
from fleet.sandbox.ghosts import plant_ghosts, read_ghosts

pytestmark = pytest.mark.root

NODES = 8
# A throwaway sandbox's subnet (the session's is FLEET_TEST_SUBNET): /24s far from the usual ones.
_SUBNETS = [f"10.{b}.78.0/24" for b in range(230, 247)]
VOLATILE = {"ts", "duration_s", "run_id", "run_dir", "invocation", "workers"}


@pytest.fixture(scope="module")
def box8(cluster_host: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """Eight nodes of this module's own, torn down after it."""

    def up(subnet: str) -> Sandbox:
        box = Sandbox(tmp_path_factory.mktemp("workers-sandbox"), subnet=subnet)
        try:
            box.up(NODES)
        except BaseException:
            box.down()
            raise
        return box

    box = on_a_free_subnet(_SUBNETS, up)[0]
    try:
        yield box
    finally:
        box.down()


def _run(box: Sandbox, tmp_path: Path, workers: int, *args: str) -> tuple[FleetResult, Path]:
    """`fleet ARGS --workers N` with a log dir of its own; the result and its one record."""
    log_dir = tmp_path / f"w{workers}"
    result = run_fleet(box, *args, "--workers", str(workers), log_dir=log_dir)
    records = [p for p in log_dir.iterdir() if p.is_dir()]
    return result, records[-1] if len(records) == 1 else _last(records)


def _last(records: list[Path]) -> Path:
    return sorted(records, key=lambda p: p.stat().st_mtime)[-1]


def _stable(value: Any) -> Any:
    """A JSON value without what differs between two runs of the same thing (times, ids)."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _per_host(events: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Each host's events, in the order they came, without times; its output lines apart, per
    stream (stdout and stderr are two streams of one channel: their order is the node's)."""
    out: dict[str, list[Any]] = {}
    for event in events:
        if "host" in event:
            key = event["host"] + (f" {event['stream']}" if "stream" in event else "")
            out.setdefault(key, []).append(_stable(event))
    return out


def _by_stream(lines: list[Any], stream_of: Any) -> dict[str, list[Any]]:
    """Lines apart by stream, each in its order (stdout and stderr interleave as they come)."""
    out: dict[str, list[Any]] = {}
    for line in lines:
        out.setdefault(stream_of(line), []).append(line)
    return out


def _final(event: dict[str, Any]) -> Any:
    """A RunFinished line without times and ids, its gathered output per host and stream.
    (Hosts are grouped when their lines came in the same order: a host printing on both
    streams may land in a group in one run and alone in the other.)"""
    stable = _stable(event)
    if "output" in stable:
        stable["output"] = {
            host: _by_stream(group["lines"], lambda x: x["stream"])
            for group in stable["output"]
            for host in nodeset.expand(group["hosts"])
        }
    return stable


def _log(path: Path) -> dict[str, list[str]]:
    """A host log without times: its output per stream, fleet's own lines apart."""
    lines = [
        re.sub(r"^\d\d:\d\d:\d\d |in \d+\.\d\ds$", "", x) for x in path.read_text().split("\n")
    ]
    return _by_stream(lines, lambda x: x[:4] if x[:4] in ("out|", "err|") else "fleet")


def _record(run_dir: Path) -> dict[str, Any]:
    """A run record, times and ids left out: summary.json, events.jsonl per host, host logs."""
    summary = _stable(json.loads((run_dir / "summary.json").read_text()))
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    logs = {p.name: _log(p) for p in sorted((run_dir / "hosts").iterdir())}
    kinds = [e["event"] for e in events if "host" not in e]
    return {"summary": summary, "hosts": _per_host(events), "logs": logs, "run": kinds}


def _assert_same(one: tuple[FleetResult, Path], three: tuple[FleetResult, Path]) -> None:
    (r1, d1), (r3, d3) = one, three
    assert r1.code == r3.code
    lines1, lines3 = r1.json_lines(), r3.json_lines()
    assert _per_host(lines1) == _per_host(lines3)
    assert [_final(x) for x in lines1[-2:]] == [
        _final(x) for x in lines3[-2:]
    ]  # Run-, VerbFinished
    assert _record(d1) == _record(d3)
    assert "workers" not in json.loads((d1 / "summary.json").read_text())
    figures = json.loads((d3 / "summary.json").read_text())["workers"]
    assert [f["index"] for f in figures] == [0, 1, 2]
    assert sorted(f["hosts"] for f in figures) == [2, 3, 3]
    assert all(f["user_s"] + f["sys_s"] > 0 and f["maxrss_kb"] > 0 for f in figures)


def test_exec_on_three_workers_is_exec_in_one_process(box8: Sandbox, tmp_path: Path) -> None:
    args = ("exec", "echo out; echo err >&2; hostname", "--json")
    one, three = _run(box8, tmp_path, 1, *args), _run(box8, tmp_path, 3, *args)

    assert one[0].code == 0, one[0].stderr
    _assert_same(one, three)
    assert len({e["host"] for e in three[0].json_lines() if "host" in e}) == NODES


def test_a_failing_step_fails_the_same_with_workers(box8: Sandbox, tmp_path: Path) -> None:
    script = 'echo start; case "$(hostname)" in node0[36]) echo bad >&2; exit 3;; esac; echo ok'
    args = ("exec", script, "--json")
    one, three = _run(box8, tmp_path, 1, *args), _run(box8, tmp_path, 3, *args)

    assert one[0].code == 3
    _assert_same(one, three)
    outcomes = {h: r["outcome"] for h, r in three[0].final()["hosts"].items()}
    assert sorted(h for h, o in outcomes.items() if o == "failed") == ["node03", "node06"]


def test_cleanup_on_three_workers_is_cleanup_in_one_process(box8: Sandbox, tmp_path: Path) -> None:
    """cleanup's op step (facts, decide, act, facts again) on every node, ghosts planted."""
    results = []
    for workers in (1, 3):
        for node in box8.nodes():
            plant_ghosts(box8, node)
        results.append(_run(box8, tmp_path, workers, "cleanup", "--yes", "--grace", "1", "--json"))
        for node in box8.nodes():
            ghosts = read_ghosts(box8, node)
            assert ghosts.training == (), node.name
            assert ghosts.paths == (), node.name
    one, three = results

    assert one[0].code == three[0].code == 0, three[0].stdout + three[0].stderr
    final1, final3 = one[0].final(), three[0].final()
    for final in (final1, final3):
        for host in final["hosts"].values():
            host["done"].pop("port_holders")  # pids: new ghosts each time
    assert _stable(final1["hosts"]) == _stable(final3["hosts"])
    assert final1["counts"] == final3["counts"] == {"ok": NODES}


def test_a_preview_stays_in_one_process_and_shows_every_node(box8: Sandbox, tmp_path: Path) -> None:
    """A preview keeps its findings in the op object the verb reads after the run (also the
    look before cleanup's question): a worker's copy would be lost, so it never forks."""
    for node in box8.nodes()[:3]:
        plant_ghosts(box8, node)
    try:
        results = [
            _run(box8, tmp_path, workers, "cleanup", "--preview", "--json")[0] for workers in (1, 3)
        ]
    finally:
        box8_cleanup = run_fleet(
            box8, "cleanup", "--yes", "--grace", "1", "--json", log_dir=tmp_path / "after"
        )
        assert box8_cleanup.code == 0, box8_cleanup.stderr

    def previews(result: FleetResult) -> dict[str, Any]:
        return {
            x["host"]: _stable({k: v for k, v in x.items() if k != "processes"})
            for x in result.json_lines()
            if x["event"] == "CleanupPreview"
        }

    one, three = (previews(r) for r in results)
    assert len(one) == NODES
    assert one == three
    assert "workers" not in json.loads(
        next((tmp_path / "w3").iterdir()).joinpath("summary.json").read_text()
    )


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(x) for x in text.split()]


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie waiting for its parent to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _probe_pids(box: Sandbox, node: Any, probe: str) -> str:
    script = (
        f"for d in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $d/cmdline 2>/dev/null);"
        f' case "$c" in {probe}*) echo $d;; esac; done'
    )
    return str(box.run_on(node, script).stdout.strip())


def _start_sleepers(
    box: Sandbox, tmp_path: Path, probe: str
) -> tuple[subprocess.Popen[str], list[int]]:
    """fleet exec of a long remote command on 3 workers, in a process group of its own (as a
    terminal's foreground job), once every node runs it; with its workers' pids."""
    proc = subprocess.Popen(
        [*FLEET, "exec", f"bash -c 'exec -a {probe} sleep 300'", "--json", "--workers", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=fleet_env(box, tmp_path),
        start_new_session=True,
    )
    assert proc.stdout is not None
    started: set[str] = set()
    deadline = time.monotonic() + 60
    while len(started) < NODES and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        event = json.loads(line)
        if event["event"] == "StepStarted":
            started.add(event["host"])
    assert len(started) == NODES, proc.stderr.read() if proc.stderr else ""
    workers = _children(proc.pid)
    assert len(workers) == 3
    for node in box.nodes():  # the remote commands really run before we interrupt
        assert poll(lambda node=node: _probe_pids(box, node, probe)), node.name
    return proc, workers


def test_ctrl_c_cancels_every_host_of_every_worker(box8: Sandbox, tmp_path: Path) -> None:
    proc, workers = _start_sleepers(box8, tmp_path, "fleet-workers-probe")

    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does: the whole foreground group
    rest, _ = proc.communicate(timeout=90)

    assert proc.returncode == 130
    final = next(json.loads(x) for x in rest.splitlines() if '"RunFinished"' in x)
    assert {r["outcome"] for r in final["hosts"].values()} == {"cancelled"}
    assert len(final["hosts"]) == NODES
    assert all(r["reason"] == "cancelled; remote command stopped" for r in final["hosts"].values())
    for node in box8.nodes():
        assert poll(lambda node=node: not _probe_pids(box8, node, "fleet-workers-probe")), node.name
    assert not any(_alive(pid) for pid in workers)


def test_a_second_ctrl_c_ends_fleet_and_its_workers_at_once(box8: Sandbox, tmp_path: Path) -> None:
    proc, workers = _start_sleepers(box8, tmp_path, "fleet-workers-abort")
    try:
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.stderr is not None
        assert "cancelling" in proc.stderr.readline() + proc.stderr.readline()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
        assert proc.returncode == 130
        assert poll(lambda: not any(_alive(pid) for pid in workers))
    finally:
        for node in box8.nodes():
            box8.run_on(node, "pkill -f '^fleet-workers-abort'; true")


def test_a_worker_killed_from_outside_fails_its_hosts_and_the_run_ends(
    box8: Sandbox, tmp_path: Path
) -> None:
    proc, workers = _start_sleepers(box8, tmp_path, "fleet-workers-victim")
    try:
        os.kill(workers[1], signal.SIGKILL)
        failed = set()
        assert proc.stdout is not None
        while len(failed) < 3:  # the parent says so as soon as the worker's pipe ends
            event = json.loads(proc.stdout.readline())
            if event["event"] == "HostFinished":
                assert event["outcome"] == "failed", event
                failed.add(event["host"])
        assert failed == {"node02", "node05", "node08"}
        os.killpg(proc.pid, signal.SIGINT)  # the other workers' hosts: cancelled as usual
        rest, _ = proc.communicate(timeout=90)
    finally:
        for node in box8.nodes():
            box8.run_on(node, "pkill -f '^fleet-workers-victim'; true")
    assert proc.returncode == 130
    final = next(json.loads(x) for x in rest.splitlines() if '"RunFinished"' in x)
    hosts = final["hosts"]
    # Worker 1 had every third host from the second: node02, node05, node08.
    for name in ("node02", "node05", "node08"):
        assert hosts[name]["outcome"] == "failed"
        assert hosts[name]["reason"] == (
            f"fleet's worker process {workers[1]} was killed by SIGKILL before this host finished"
        )
    others = {h: r["outcome"] for h, r in hosts.items() if h not in ("node02", "node05", "node08")}
    assert set(others.values()) == {"cancelled"}
    assert not any(_alive(pid) for pid in workers)
