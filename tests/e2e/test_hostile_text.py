"""Text from nodes and inventories is data: never rich markup, never raw terminal control.

Real nodes print lines that look like markup (Llama's chat template, torch.distributed's `[rank0]:`
prefixes, DeepSpeed's `[file.py:161:func]` logger) and, hostile or broken, escape sequences that
would retitle, clear or switch the operator's terminal or write its clipboard. The live table runs
under a real pseudo-terminal, as on an operator's screen; the other outputs are captured as pipes.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shlex
import signal
import struct
import subprocess
import termios
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetrun import FLEET, fleet_env, poll, run_fleet
from screen import Screen

pytestmark = pytest.mark.root

# What real training jobs print that rich would read as markup, and markup an attacker would try.
MARKUP = (
    "<s>[INST] hi [/INST]",
    "[rank0]: loss 1.25",
    "[default0]:step 3",
    "[c10d] The client socket has timed out",
    "[real_accelerator.py:161:get_accelerator] Setting ds_accelerator to cuda",
    "[link=file:///etc/passwd]x[/link]",
)
# (printf format the node runs, what fleet must show): title, clear, alternate screen, clipboard.
ESCAPES = (
    ("title \\033]0;pwned\\007 end", "title \\x1b]0;pwned\\x07 end"),
    ("clear \\033[2J end", "clear \\x1b[2J end"),
    ("alt \\033[?1049h end", "alt \\x1b[?1049h end"),
    ("clip \\033]52;c;cm0gLXJmIH4=\\007 end", "clip \\x1b]52;c;cm0gLXJmIH4=\\x07 end"),
    ("c1 \\302\\2332J end", "c1 \\x9b2J end"),  # U+009B (a one-byte CSI), UTF-8 encoded
)
RAW = (b"\x1b]0;", b"\x1b[2J", b"\x1b[?1049h", b"\x1b]52;", b"\x1b]8;", "\x9b".encode())
ONE_LINE = " ".join(MARKUP)  # all of them in one line: the live table shows each host's last


def _print_markup(*lines: str) -> str:
    """A node command printing each line verbatim (no printf escapes in them)."""
    return "printf '%s\\n' " + " ".join(shlex.quote(line) for line in lines)


def _print_escapes(stream: str = "") -> str:
    """A node command printing every escape line (on stderr with stream='>&2')."""
    return "; ".join(f"printf {shlex.quote(fmt + chr(92) + 'n')} {stream}" for fmt, _ in ESCAPES)


def run_in_pty(
    box: Any,
    *args: str,
    log_dir: Path,
    timeout_s: float = 120,
    columns: int = 250,
    poke: Callable[[bytes, subprocess.Popen[bytes]], None] | None = None,
) -> tuple[int, bytes]:
    """`fleet ARGS` with stdin, stdout and stderr on a COLUMNSx50 pseudo-terminal: the live
    table. `poke` sees the output so far (and the process) as it comes: Ctrl-C, say."""
    env = fleet_env(box, log_dir, TERM="xterm-256color", COLUMNS=str(columns), LINES="50")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(
        [*FLEET, *args], stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
    )
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if poke is not None:
                poke(bytes(out), proc)
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every process holding the terminal has exited
                break
            if not chunk:
                break
            out += chunk
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, bytes(out)


def assert_no_raw_escape(out: bytes) -> None:
    for raw in RAW:
        assert raw not in out, (raw, out[-2000:])


# ---------------------------------------------------------------- the live table, on a terminal


def test_live_table_shows_markup_like_lines_verbatim_and_the_run_succeeds(
    sandbox: Any, tmp_path: Path
) -> None:
    code, out = run_in_pty(sandbox, "exec", _print_markup(*MARKUP, ONE_LINE), log_dir=tmp_path)

    text = out.decode("utf-8", "replace")
    assert code == 0, text[-3000:]
    assert "internal error" not in text
    assert "MarkupError" not in text
    # The gathered output at the end: every host printed the same, so it is shown once, verbatim,
    # line by line under the folded host set (markup would have eaten the [..] tags).
    gathered = text.replace("\r\n", "\n").split("node[01-04] (4)", 1)[-1]
    shown = "\n".join(f"  | {line}" for line in (*MARKUP, ONE_LINE)) + "\n"
    assert shown in gathered, repr(text[-2500:])
    assert b"\x1b]8;" not in out  # no hyperlink was made of the node's [link=...]


def test_live_table_and_summary_show_node_escapes_escaped(sandbox: Any, tmp_path: Path) -> None:
    command = f"{_print_escapes()}; {_print_escapes('>&2')}; exit 1"

    code, out = run_in_pty(sandbox, "exec", command, log_dir=tmp_path)

    text = out.decode("utf-8", "replace")
    assert code == 3, text[-3000:]
    assert_no_raw_escape(out)
    for _, shown in ESCAPES:
        assert f"    | {shown}" in text  # each failed host's stderr tail, in the summary


# ---------------------------------------------------------------- --plain lines


def test_plain_lines_show_markup_verbatim_and_escapes_escaped(sandbox: Any, tmp_path: Path) -> None:
    command = f"{_print_markup(*MARKUP)}; {_print_escapes()}; {_print_escapes('>&2')}; exit 1"

    result = run_fleet(sandbox, "exec", command, "--plain", log_dir=tmp_path)

    assert result.code == 3, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for node in sandbox.nodes():
        for line in MARKUP:
            assert f"{node.name} |   {line}" in lines
        for _, shown in ESCAPES:
            assert f"{node.name} |   {shown}" in lines
            assert f"{node.name} | ! {shown}" in lines
    for _, shown in ESCAPES:
        assert f"    | {shown}" in lines
    assert_no_raw_escape((result.stdout + result.stderr).encode())
    assert "\x1b" not in result.stdout + result.stderr


def test_run_record_host_log_holds_escapes_and_events_the_exact_text(
    sandbox: Any, tmp_path: Path
) -> None:
    """The host log is read with `cat` and `tail -f` (fleet's summary points there): node text
    in it is escaped as on the terminal. events.jsonl's tails keep the exact text, JSON-escaped."""
    node = sandbox.nodes()[0]
    result = run_fleet(
        sandbox, "exec", _print_escapes(), "--plain", "--limit", node.name, log_dir=tmp_path
    )

    assert result.code == 0, result.stdout + result.stderr
    (record,) = tmp_path.iterdir()
    log = (record / "hosts" / f"{node.name}.log").read_bytes()
    assert_no_raw_escape(log)
    assert not set(log) & {*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F}
    text = log.decode("utf-8")
    for _, shown in ESCAPES:
        assert f"out| {shown}\n" in text
    events = (record / "events.jsonl").read_text(encoding="utf-8")
    assert "\x1b" not in events  # JSON: \u001b
    finished = [json.loads(ln) for ln in events.splitlines() if '"HostFinished"' in ln]
    assert finished[0]["last_line"] == "c1 \x9b2J end"


# ---------------------------------------------------------------- fleet logs and fleet status


@pytest.fixture
def hostile_job(sandbox: Any) -> Iterator[str]:
    """/tmp/hostile-job on every node: prints markup-like and escape lines, then waits for
    /tmp/hostile-go and exits 1 (a failed run, whose log tail `fleet status` shows)."""
    last = _print_markup(MARKUP[0], MARKUP[-1])  # the log's last five: 3 escapes, 2 markups
    body = f"{_print_markup(*MARKUP)}; {_print_escapes()}; {last}\n"
    script = f"#!/bin/sh\n{body}while [ ! -e /tmp/hostile-go ]; do sleep 0.2; done\nexit 1\n"
    for node in sandbox.nodes():
        sandbox.run_on(
            node,
            f"rm -f /tmp/hostile-go; printf '%s' {shlex.quote(script)} > /tmp/hostile-job; "
            "chmod +x /tmp/hostile-job",
        )
    try:
        yield "/tmp/hostile-job"
    finally:
        for node in sandbox.nodes():
            sandbox.run_on(node, "touch /tmp/hostile-go; sleep 0.5; rm -f /tmp/hostile-job")


def test_logs_and_status_show_a_runs_log_as_data(
    sandbox: Any, hostile_job: str, tmp_path: Path
) -> None:
    run_id = f"hostile-{uuid.uuid4().hex[:6]}"
    started = run_fleet(
        sandbox,
        "launch",
        "--dir",
        "/tmp",
        "--var",
        "min_free_gb=0.01",
        "--nproc-per-node",
        "1",
        "--launcher",
        hostile_job,
        "--run-id",
        run_id,
        "--",
        "job",
        log_dir=tmp_path,
    )
    assert started.code == 0, started.stdout + started.stderr

    logs = run_fleet(sandbox, "logs", "--run-id", run_id, "-n", "100", log_dir=tmp_path)

    assert logs.code == 0, logs.stdout + logs.stderr
    lines = logs.stdout.splitlines()
    for node in sandbox.nodes():
        for line in MARKUP:
            assert f"{node.name} | {line}" in lines
        for _, shown in ESCAPES:
            assert f"{node.name} | {shown}" in lines
    assert "\x1b" not in logs.stdout + logs.stderr

    for node in sandbox.nodes():
        sandbox.run_on(node, "touch /tmp/hostile-go")

    def failed_everywhere() -> bool:
        states = run_fleet(sandbox, "status", "--json", log_dir=tmp_path).run_states()
        return len(states) == 4 and {s["state"] for s in states.values()} == {"failed"}

    assert poll(failed_everywhere, timeout_s=30, step_s=0.5)
    status = run_fleet(sandbox, "status", log_dir=tmp_path)

    assert status.code == 3, status.stdout + status.stderr
    shown = status.stdout.splitlines()  # with each failed run's last five log lines
    for line in (*[escaped for _, escaped in ESCAPES[-3:]], MARKUP[0], MARKUP[-1]):
        assert shown.count(f"    {line}") == 4, status.stdout
    assert "\x1b" not in status.stdout + status.stderr


# ---------------------------------------------------------------- inventory values


def _hostile_inventory(tmp_path: Path, box: Any) -> Path:
    """The sandbox's first node, with a user and vars that look like markup and hold escapes."""
    node = box.nodes()[0]
    path = tmp_path / "hostile.yaml"
    path.write_text(
        "all:\n"
        "  hosts:\n"
        f"    {node.name}:\n"
        f"      ansible_host: {node.address}\n"
        '      ansible_user: "[/x]"\n'
        '      motd: "hi \\e]0;pwned\\a [/y] \\e]52;c;eA==\\a"\n'
    )
    return path


def test_hosts_shows_markup_like_inventory_values_verbatim(sandbox: Any, tmp_path: Path) -> None:
    inventory = _hostile_inventory(tmp_path, sandbox)

    result = run_fleet(sandbox, "hosts", "-i", str(inventory), log_dir=tmp_path)

    assert result.code == 0, result.stdout + result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("node01"))
    assert row.split()[3] == "[/x]"


def test_dry_run_shows_inventory_values_escaped(sandbox: Any, tmp_path: Path) -> None:
    inventory = _hostile_inventory(tmp_path, sandbox)
    playbook = tmp_path / "motd.yaml"
    playbook.write_text("name: motd\nsteps:\n  - name: say\n    run: echo ${motd}\n")

    result = run_fleet(
        sandbox, "run", str(playbook), "--dry-run", "-i", str(inventory), log_dir=tmp_path
    )

    assert result.code == 0, result.stdout + result.stderr
    assert "$ echo 'hi \\x1b]0;pwned\\x07 [/y] \\x1b]52;c;eA==\\x07'" in result.stdout
    assert "\x1b" not in result.stdout


def test_errors_quoting_inventory_text_show_it_escaped(sandbox: Any, tmp_path: Path) -> None:
    inventory = tmp_path / "bad.yaml"
    inventory.write_text('all:\n  children:\n    "g\\e]0;pwned\\a":\n      hosts: {a: }\n')

    result = run_fleet(sandbox, "hosts", "-i", str(inventory), log_dir=tmp_path)

    assert result.code == 1, result.stdout + result.stderr
    # a key that is not a name is not quoted at all (inventory errors never echo the file)
    assert f"{inventory}:3: all.children.<key>: is not a valid group name" in result.stderr
    assert "\x1b" not in result.stderr
    assert "pwned" not in result.stderr


# ---------------------------------------------------------------- Ctrl-C on the live table


def test_ctrl_c_says_cancelling_above_the_live_table_and_leaves_the_terminal_sane(
    sandbox: Any, tmp_path: Path
) -> None:
    """The first Ctrl-C's line stays on screen above the table (the table's next refresh used to
    erase it and leave the table's top twice); the cursor is shown again; exit 130."""
    interrupted: list[bool] = []

    def ctrl_c(out: bytes, proc: subprocess.Popen[bytes]) -> None:
        # the table drawn a few times over with the run's lines (each draw names every host's
        # last line, `step N`), then Ctrl-C
        if not interrupted and out.count(b"step ") >= 30:
            os.killpg(proc.pid, signal.SIGINT)  # as the terminal does on Ctrl-C
            interrupted.append(True)

    loop = "for i in $(seq 1 600); do echo step $i; sleep 0.1; done"
    code, out = run_in_pty(sandbox, "exec", loop, log_dir=tmp_path, columns=200, poke=ctrl_c)
    screen = Screen().feed(bytes(out))
    shown = screen.text()
    assert code == 130, "\n".join(shown[-40:])
    assert screen.cursor_shown
    headers = [i for i, line in enumerate(shown) if line.startswith("exec on 4 hosts")]
    assert len(headers) == 1, "\n".join(shown)
    assert any(line.startswith("fleet: cancelling") for line in shown[: headers[0]]), shown
    assert any(line.startswith("  cancelled     4") for line in shown[headers[0] :]), shown
