"""`fleet checkpoints`: scan every selected node (in parallel, bounded), decide, show.

Exit codes: 0 every tag whole (or pruned), every `latest` agreeing, no empty, unreadable or
differing adapter; 3 any of those found, or a node without the output dir (no such directory,
or not a directory: a wrong --dir or host; with none that has it, nothing was audited); 4 a
node could not be reached (wins over 3).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fleet.checkpoints.analysis import Audit, audit
from fleet.checkpoints.node import NodeScan, scan
from fleet.core.errors import ExitCode
from fleet.core.hosts import Host
from fleet.core.safetext import clean
from fleet.engine.runner import RunSettings, Secrets, make_transport


def scan_hosts(
    run: RunSettings,
    hosts: Sequence[Host],
    dirs: dict[str, str],
    crc: bool,
    secrets: Secrets | None = None,
) -> list[NodeScan]:
    """Every host's scan; a host that cannot be reached or read is a scan with `error`."""
    transport = make_transport(run.ssh, secrets, hosts)
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(run.forks, len(hosts)))) as pool:
            return list(pool.map(lambda h: _scan_one(transport, h, dirs[h.name], crc), hosts))
    finally:
        transport.close()


def with_session(transport: Any, host: Host, work: Callable[[Any], Any]) -> Any:
    """`work(paramiko client)` on one connection to the host, closed afterwards."""
    session = transport.connect(host)
    try:
        return work(session.client)
    finally:
        session.close()


def _scan_one(transport: Any, host: Host, directory: str, crc: bool) -> NodeScan:
    from fleet.ssh.transport import ConnectFailed

    try:
        got: NodeScan = with_session(transport, host, lambda c: scan(c, host.name, directory, crc))
    except ConnectFailed as exc:
        got = NodeScan(host.name, directory, error=f"unreachable: {exc.reason}: {exc.detail}")
    except (OSError, EOFError) as exc:
        got = NodeScan(host.name, directory, error=f"unreachable: {exc}")
    except Exception as exc:  # paramiko's SSHException and kin: the node's failure, not ours
        got = NodeScan(host.name, directory, error=f"failed: {type(exc).__name__}: {exc}")
    return got


def exit_code(result: Audit) -> ExitCode:
    if any(s.error for s in result.scans):
        return ExitCode.UNREACHABLE
    return ExitCode.STEP_FAILED if result.failures else ExitCode.OK


def run_audit(
    run: RunSettings,
    hosts: Sequence[Host],
    dirs: dict[str, str],
    crc: bool,
    secrets: Secrets | None = None,
) -> ExitCode:
    result = audit(scan_hosts(run, hosts, dirs, crc, secrets))
    code = exit_code(result)
    if run.output.json:
        sys.stdout.write(json.dumps(to_json(result, code)) + "\n")
    else:
        from fleet.checkpoints.report import print_audit

        print_audit(result)
    return code


def to_json(result: Audit, code: ExitCode) -> dict[str, Any]:
    """The whole audit as one JSON object (node text is JSON-escaped by json.dumps)."""
    scans = []
    for s in result.scans:
        d = dataclasses.asdict(s)
        d["entries"] = [e for e in d["entries"] if e["kind"] != "dir"]
        scans.append(d)
    return {
        "event": "Checkpoints",
        "nodes": scans,
        "tags": [dataclasses.asdict(t) for t in result.tags],
        "latest": [dataclasses.asdict(x) for x in result.latest],
        "adapters": [dataclasses.asdict(a) for a in result.adapters],
        "failures": result.failures,
        "exit_code": int(code),
    }


def shown(text: str) -> str:
    return clean(text)
