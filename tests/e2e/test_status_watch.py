"""`fleet status --watch` against real nodes: refreshed in place under a pseudo-terminal, a node
that stops answering is marked (not fatal) and comes back, Ctrl-C ends it with exit 0."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, fleet_env, poll

pytestmark = pytest.mark.root

TITLE = "fleet status --watch 1s on 4 hosts"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RUN_STATES = ("running", "finished", "failed", "orphaned", "stopped", "not started", "unknown")


class Terminal:
    """`fleet` on a pseudo-terminal of 50 x 200, its output collected by a thread."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: fleet, with the pty as its terminal
            os.execvpe(FLEET[0], [*FLEET, *args], env)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        os.kill(self.pid, signal.SIGWINCH)
        self.raw = bytearray()
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            with self.lock:
                self.raw += chunk

    def text(self) -> str:
        with self.lock:
            return ANSI.sub("", self.raw.decode("utf-8", "replace"))

    def frames(self) -> list[str]:
        """Each redraw of the table, oldest first."""
        return self.text().split(TITLE)[1:]

    def row(self, frame: str, host: str) -> str:
        return next((ln for ln in frame.splitlines() if ln.startswith(host + " ")), "")

    def stop(self) -> int:
        os.kill(self.pid, signal.SIGINT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.1)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError("fleet status --watch did not end on Ctrl-C")


def test_watch_redraws_in_place_marks_a_silent_node_and_ends_on_ctrl_c(
    sandbox: Any, tmp_path: Path
) -> None:
    nodes = [n.name for n in sandbox.nodes()]
    victim = sandbox.nodes()[2]
    term = Terminal(["status", "--watch", "1"], fleet_env(sandbox, tmp_path, TERM="xterm"))
    try:

        def every_node_reported() -> bool:
            frames = term.frames()
            last = frames[-1] if frames else ""
            return len(frames) >= 3 and all(
                any(s in term.row(last, n) for s in RUN_STATES) for n in nodes
            )

        assert poll(every_node_reported, 60), term.text()[-3000:]
        sandbox.run_on(victim, "ip link set eth0 down")
        try:
            marked = poll(lambda: "no answer" in term.row(term.frames()[-1], victim.name), 30)
            assert marked, term.text()[-3000:]
            others = [term.row(term.frames()[-1], n) for n in nodes if n != victim.name]
            assert all(any(s in row for s in RUN_STATES) for row in others), others
        finally:
            sandbox.run_on(victim, "ip link set eth0 up")
        back = poll(
            lambda: any(s in term.row(term.frames()[-1], victim.name) for s in RUN_STATES), 60
        )
        assert back, term.text()[-3000:]
    finally:
        code = term.stop()
    assert code == 0
    assert "Traceback" not in term.text()


def test_watch_off_a_terminal_prints_state_changes_as_json(sandbox: Any, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*FLEET, "status", "--watch", "1", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=fleet_env(sandbox, tmp_path),
    )
    seen: dict[str, dict[str, Any]] = {}
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while len(seen) < 4 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            doc = json.loads(line)
            assert doc["event"] == "NodeState"
            seen[doc["host"]] = doc
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert sorted(seen) == sorted(n.name for n in sandbox.nodes()), err
    assert all(doc["state"] in RUN_STATES for doc in seen.values()), seen
    assert proc.returncode == 0, err
    assert "Traceback" not in err
