"""The run record: per-host logs and summary.json in a run directory, for every run."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

from fleet.events import (
    Event,
    HostConnecting,
    HostFinished,
    OutputLine,
    RunFinished,
    RunStarted,
    StepFinished,
    StepStarted,
)

KEEP_RUNS = 200


def default_base() -> Path:
    """`$FLEET_LOG_DIR`, else `$XDG_STATE_HOME/fleet/runs`, else ~/.local/state/fleet/runs."""
    if env := os.environ.get("FLEET_LOG_DIR"):
        return Path(env).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "fleet" / "runs"


def new_run_id(playbook: str) -> str:
    """Sortable and unique: 20261130-041233-cleanup-3fa2."""
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in playbook)[:40]
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{secrets.token_hex(2)}"


class RunRecord:
    """Buffers each host's lines, writes its log when the host finishes, summary.json at the end."""

    def __init__(self, base: Path, run_id: str) -> None:
        self.dir = base / run_id
        (self.dir / "hosts").mkdir(parents=True, exist_ok=True, mode=0o700)
        self.buffers: dict[str, list[str]] = {}
        self.events = (self.dir / "events.jsonl").open("w", encoding="utf-8")
        _prune(base)

    def handle(self, event: Event) -> None:
        """Record one event (called on the main thread)."""
        if not isinstance(event, OutputLine):
            self.events.write(json.dumps(event.to_dict(), default=str) + "\n")
        stamp = time.strftime("%H:%M:%S", time.localtime(event.ts))
        host = getattr(event, "host", None)
        if isinstance(event, RunStarted) or not isinstance(host, str):
            if isinstance(event, RunFinished):
                self._finish(event)
            return
        lines = self.buffers.setdefault(host, [])
        if isinstance(event, HostConnecting):
            lines.append(f"{stamp} connecting (attempt {event.attempt})")
        elif isinstance(event, StepStarted):
            lines.append(f"{stamp} step {event.index + 1} '{event.step}': $ {event.command}")
        elif isinstance(event, OutputLine):
            lines.append(f"{stamp} {'out' if event.stream == 'stdout' else 'err'}| {event.line}")
        elif isinstance(event, StepFinished):
            status = "timed out" if event.timed_out else f"exit {event.exit_code}"
            lines.append(
                f"{stamp} step '{event.step}' finished: {status} in {event.duration_s:.2f}s"
            )
        elif isinstance(event, HostFinished):
            lines.append(
                f"{stamp} outcome: {event.outcome.value}"
                + (f" ({event.reason})" if event.reason else "")
            )
            self._write_host(host)

    def _write_host(self, host: str) -> None:
        path = self.dir / "hosts" / f"{host}.log"
        path.write_text("\n".join(self.buffers.pop(host, [])) + "\n", encoding="utf-8")

    def _finish(self, event: RunFinished) -> None:
        for host in list(self.buffers):
            self._write_host(host)
        (self.dir / "summary.json").write_text(
            json.dumps(event.to_dict(), indent=2, default=str) + "\n", encoding="utf-8"
        )
        self.close()

    def close(self) -> None:
        """Flush what is buffered (also on interrupt)."""
        for host in list(self.buffers):
            self._write_host(host)
        if not self.events.closed:
            self.events.close()


def _prune(base: Path) -> None:
    """Keep the newest KEEP_RUNS run directories; never touch anything else."""
    try:
        runs = sorted(p for p in base.iterdir() if p.is_dir() and p.name[:8].isdigit())
    except OSError:
        return
    for old in runs[:-KEEP_RUNS]:
        for f in sorted(old.rglob("*"), reverse=True):
            if f.is_file() or f.is_symlink():
                f.unlink(missing_ok=True)
            elif f.is_dir():
                f.rmdir()
        old.rmdir()
