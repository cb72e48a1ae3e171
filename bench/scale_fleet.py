"""What bench/scale.py needs to know about the fleet it measures: which of the scale features it
has (`--workers`, `--persist`, `fleet disconnect`, `fleet connections --json`), its workers' CPU
from the run record, its keepers, and who each process of a run was.

Every feature is probed from `--help`, never assumed: a checkout without one is measured as it
is and the report says "not available". The run record's and `fleet connections --json`'s
layouts are read loosely (any object with a `pid`, CPU under the usual rusage names) so the
harness does not break when they gain fields.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.scale_proc import ClientGroup, read_stat

HELP_TIMEOUT_S = 60


def features(fleet: list[str], env: dict[str, str]) -> dict[str, bool]:
    """Which scale features this fleet has, from its own --help texts."""

    def help_of(*verb: str) -> str:
        try:
            p = subprocess.run(
                [*fleet, *verb, "--help"],
                env=env,
                capture_output=True,
                text=True,
                timeout=HELP_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return ""
        return p.stdout if p.returncode == 0 else ""

    top, exec_ = help_of(), help_of("exec")
    commands = {
        line.split()[0] for line in top.splitlines() if line.startswith("  ") and line.split()
    }
    return {
        "workers": "--workers" in exec_,
        "persist": "--persist" in exec_,
        "disconnect": "disconnect" in commands,
        "connections": "connections" in commands,
    }


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def cpu_of(obj: dict[str, Any]) -> float | None:
    """user+sys CPU seconds from an object holding rusage-like fields (nested one level too)."""
    flat = dict(obj)
    for value in obj.values():
        if isinstance(value, dict):
            flat.update(value)
    for total in ("cpu_s", "cpu_seconds", "cpu"):
        if isinstance(flat.get(total), (int, float)):
            return float(flat[total])
    for user, sys_ in (
        ("user_s", "sys_s"),
        ("ru_utime", "ru_stime"),
        ("utime", "stime"),
        ("utime_s", "stime_s"),
        ("user", "sys"),
        ("user", "system"),
        ("user_cpu_s", "sys_cpu_s"),
    ):
        if isinstance(flat.get(user), (int, float)) and isinstance(flat.get(sys_), (int, float)):
            return float(flat[user]) + float(flat[sys_])
    return None


def record_workers(log_dir: Path) -> list[dict[str, Any]] | None:
    """The workers of the run whose record is in log_dir: pid (if recorded) and CPU, from any
    object under a key naming workers in summary.json or events.jsonl; None if there are none."""
    records = sorted((p for p in log_dir.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if not records:
        return None
    docs: list[Any] = []
    summary = records[-1] / "summary.json"
    if summary.is_file():
        docs.append(json.loads(summary.read_text()))
    events = records[-1] / "events.jsonl"
    if events.is_file():
        for line in events.read_text().splitlines():
            try:
                docs.append(json.loads(line))
            except ValueError:
                continue
    found: dict[Any, dict[str, Any]] = {}
    for doc in docs:
        for obj in _walk(doc):
            for key, value in obj.items():
                if "worker" not in key.lower():
                    continue
                items = value if isinstance(value, list) else [value]
                for item in items:
                    if isinstance(item, dict) and (cpu := cpu_of(item)) is not None:
                        ident = item.get("pid", item.get("index", item.get("worker", len(found))))
                        found[ident] = {"pid": item.get("pid"), "cpu_s": round(cpu, 4)}
    return list(found.values()) or None


def connections(fleet: list[str], env: dict[str, str]) -> dict[str, Any]:
    """`fleet connections --json`: the keepers (pid, CPU: theirs if given, else /proc's) and how
    many warm connections they hold, as far as the output says."""
    try:
        p = subprocess.run(
            [*fleet, "connections", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=HELP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    docs: list[Any] = []
    try:
        docs.append(json.loads(p.stdout))
    except ValueError:
        for line in p.stdout.splitlines():
            try:
                docs.append(json.loads(line))
            except ValueError:
                continue
    keepers: dict[int, dict[str, Any]] = {}
    hosts = 0
    for obj in (o for d in docs for o in _walk(d)):
        pid = obj.get("pid")
        if isinstance(pid, int) and pid not in keepers:
            st = read_stat(pid)
            keepers[pid] = {
                "pid": pid,
                "cpu_s_reported": cpu_of(obj),
                "cpu_s_proc": round(st.cpu_s, 3) if st else None,
                "hosts": next(
                    (len(obj[k]) for k in ("hosts", "connections") if isinstance(obj.get(k), list)),
                    None,
                ),
            }
        if isinstance(obj.get("host"), str):
            hosts += 1
    return {
        "rc": p.returncode,
        "keepers": list(keepers.values()),
        "host_entries": hosts,
        "stderr_tail": p.stderr.splitlines()[-3:],
    }


def disconnect(fleet: list[str], env: dict[str, str], group: ClientGroup) -> dict[str, Any]:
    """`fleet disconnect` (when it exists), then wait for the group to empty; whatever is left
    after 20 s is killed and counted (a keeper that did not exit is a finding)."""
    out: dict[str, Any] = {}
    if group.pids():
        t0 = time.monotonic()
        try:
            p = subprocess.run(
                [*fleet, "disconnect"],
                env=env,
                capture_output=True,
                text=True,
                timeout=HELP_TIMEOUT_S,
                check=False,
            )
            out["rc"] = p.returncode
            if p.returncode != 0:
                out["stderr_tail"] = p.stderr.splitlines()[-3:]
        except subprocess.TimeoutExpired:
            out["rc"] = "timed out"
        out["disconnect_s"] = round(time.monotonic() - t0, 2)
        out["exited_after_s"] = group.wait_empty(20)
    out["killed_left"] = group.kill_all()
    return out


def label_roles(
    procs: list[dict[str, Any]],
    workers: list[dict[str, Any]] | None,
    keeper_pids: set[int],
    fleet: bool = True,
) -> list[dict[str, Any]]:
    """Name each process of a run: for fleet client, worker (a child of the client, or any other
    Python process of its tree: a forkserver's children too), keeper or other, workers' CPU from
    the run record where it has their pids; for a peer, client or the process's name (ssh)."""
    client = next((p["pid"] for p in procs if p["role"] == "client"), None)
    recorded = {w["pid"]: w["cpu_s"] for w in workers or [] if isinstance(w.get("pid"), int)}
    for p in procs:
        if not fleet:
            p["role"] = "client" if p["pid"] == client else p["comm"]
        elif p["pid"] in keeper_pids or "keeper" in p.get("cmd", ""):
            p["role"] = "keeper"
        elif p["role"] != "client" and (
            p["pid"] in recorded or p.get("ppid") == client or "python" in p["comm"]
        ):
            p["role"] = "worker"
            if p["pid"] in recorded:
                p["cpu_s"], p["source"] = recorded[p["pid"]], "run record (getrusage)"
    procs.sort(key=lambda p: -p["cpu_s"])
    return procs


def keeper_pids_in(group: ClientGroup) -> set[int]:
    """Processes still in the client's group after the client exited: its keepers."""
    return {pid for pid in group.pids() if read_stat(pid) is not None}
