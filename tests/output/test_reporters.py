"""Reporters turn a scripted event sequence into what the operator reads; rendered to strings."""

from __future__ import annotations

import dataclasses
import io
import json
import sys

import pytest
from rich.console import Console
from screen import Screen

from fleet.core.events import (
    Event,
    HostConnected,
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
from fleet.core.result import CleanupDone
from fleet.node.runstate import NodeRun, RunState
from fleet.output.plain import (
    JsonReporter,
    LinesReporter,
    PlainReporter,
    Printer,
    RunView,
    TextPrinter,
    elapsed,
    print_summary,
)
from fleet.output.reporters import (
    ConsolePrinter,
    LiveReporter,
    StatusRow,
    print_status_table,
)

HOSTS = tuple(f"gpu{i:02d}" for i in range(1, 9))
FAILED = ("gpu03", "gpu07")
UNREACHABLE = ("gpu05",)
OK = tuple(h for h in HOSTS if h not in FAILED + UNREACHABLE)


def string_console(width: int = 100, height: int = 25) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    console = Console(file=buf, width=width, height=height, color_system=None, force_terminal=False)
    return console, buf


PRINTERS = ("text", "console")  # off a terminal (plain text) and on one (rich's console)


def string_printer(kind: str = "text", width: int = 100) -> tuple[Printer, io.StringIO]:
    """A printer of either kind onto a string (the console one without colours)."""
    if kind == "text":
        buf = io.StringIO()
        return TextPrinter(buf), buf
    console, buf = string_console(width=width)
    return ConsolePrinter(console), buf


def host_events(host: str) -> list[Event]:
    """One host's events: connect, two steps; some fail the first step, one never connects."""
    if host in UNREACHABLE:
        return [
            HostConnecting(host=host, attempt=1),
            HostConnecting(host=host, attempt=2),
            HostFinished(
                host=host,
                outcome=Outcome.UNREACHABLE,
                duration_s=2.0,
                reason="connection refused",
                last_line="nothing listens on the SSH port",
            ),
        ]
    events: list[Event] = [
        HostConnecting(host=host, attempt=1),
        HostConnected(host=host, duration_s=0.1),
        StepStarted(host=host, step="kill training processes", index=0, command="kill --grace 10"),
        OutputLine(host=host, step="kill training processes", stream="stdout", line="killed 2"),
    ]
    if host in FAILED:
        tail = ("kill: 4242: operation not permitted", f"{host}: 1 process left")
        events += [
            OutputLine(host=host, step="kill training processes", stream="stderr", line=tail[0]),
            StepFinished(
                host=host,
                step="kill training processes",
                index=0,
                exit_code=1,
                duration_s=1.5,
                timed_out=False,
                cancelled=False,
                stderr_tail=tail,
            ),
            HostFinished(
                host=host,
                outcome=Outcome.FAILED,
                duration_s=1.6,
                failed_step="kill training processes",
                exit_code=1,
                reason="exit code 1",
                last_line=tail[-1],
                stderr_tail=tail,
            ),
        ]
        return events
    events += [
        StepFinished(
            host=host,
            step="kill training processes",
            index=0,
            exit_code=0,
            duration_s=1.0,
            timed_out=False,
            cancelled=False,
            stderr_tail=(),
        ),
        StepStarted(host=host, step="verify clean", index=1, command="verify"),
        OutputLine(host=host, step="verify clean", stream="stdout", line="clean"),
        StepFinished(
            host=host,
            step="verify clean",
            index=1,
            exit_code=0,
            duration_s=0.3,
            timed_out=False,
            cancelled=False,
            stderr_tail=(),
        ),
        HostFinished(host=host, outcome=Outcome.OK, duration_s=1.4, last_line="clean"),
    ]
    return events


def scripted_run(hosts: tuple[str, ...] = HOSTS) -> list[Event]:
    events: list[Event] = [
        RunStarted(run_id="run-1", playbook="cleanup", hosts=hosts, forks=4, run_dir="/runs/run-1")
    ]
    for host in hosts:
        events += host_events(host)
    results = tuple(e for e in events if isinstance(e, HostFinished))
    summary = RunSummary(
        run_id="run-1",
        playbook="cleanup",
        results=results,
        duration_s=3.25,
        run_dir="/runs/run-1",
    )
    return [*events, RunFinished(summary=summary)]


def plain_output(verbose: bool = True, kind: str = "text") -> str:
    printer, buf = string_printer(kind)
    reporter = PlainReporter(buf, printer, verbose=verbose)
    for event in scripted_run():
        reporter.handle(event)
    reporter.close()
    return buf.getvalue()


# ---------------------------------------------------------------- plain lines


def test_plain_header_names_playbook_folded_hosts_and_forks() -> None:
    first = plain_output().splitlines()[0]
    assert first == "fleet: cleanup on gpu[01-08] (8 hosts, 4 at a time)"


def test_plain_lines_are_prefixed_with_an_aligned_host_name() -> None:
    lines = plain_output().splitlines()
    assert "gpu01 | > kill training processes" in lines
    assert "gpu01 |   killed 2" in lines
    assert "gpu03 | ! kill: 4242: operation not permitted" in lines
    assert "gpu03 | < kill training processes: exit 1 (1.5s)" in lines
    assert "gpu03 | = failed: exit code 1" in lines
    assert "gpu05 | connecting (attempt 2)" in lines
    assert "gpu05 | = unreachable: connection refused" in lines
    assert "gpu01 | = ok" in lines


def test_plain_first_connect_attempt_is_not_reported() -> None:
    assert "connecting (attempt 1)" not in plain_output()


def test_plain_without_verbose_hides_output_lines() -> None:
    out = plain_output(verbose=False)
    assert "killed 2" not in out
    assert "gpu03 | = failed: exit code 1" in out


def test_plain_reports_timeouts_and_cancels_as_words() -> None:
    printer, buf = string_printer()
    reporter = PlainReporter(buf, printer)
    reporter.handle(RunStarted(run_id="r", playbook="p", hosts=("a", "bb"), forks=1, run_dir=None))
    for host, timed_out, cancelled in (("a", True, False), ("bb", False, True)):
        reporter.handle(
            StepFinished(
                host=host,
                step="s",
                index=0,
                exit_code=None,
                duration_s=5.0,
                timed_out=timed_out,
                cancelled=cancelled,
                stderr_tail=(),
            )
        )
    lines = buf.getvalue().splitlines()
    assert "a  | < s: timed out (5.0s)" in lines
    assert "bb | < s: cancelled (5.0s)" in lines


# ---------------------------------------------------------------- the summary


def test_summary_lists_folded_host_sets_per_outcome() -> None:
    out = plain_output()
    summary_lines = [line.strip() for line in out.splitlines()]
    assert "ok     5  gpu[01-02,04,06,08]" in summary_lines
    assert "failed     2  gpu[03,07]" in summary_lines
    assert "unreachable     1  gpu05" in summary_lines


def test_summary_shows_failing_step_exit_code_and_stderr_tail_of_each_failed_host() -> None:
    out = plain_output()
    for host in FAILED:
        assert f"{host}: step 'kill training processes': exit code 1" in out
        assert f"    | {host}: 1 process left" in out
    assert "    | kill: 4242: operation not permitted" in out


def test_summary_explains_unreachable_hosts() -> None:
    out = plain_output()
    assert "gpu05: connect: connection refused" in out
    assert "    | nothing listens on the SSH port" in out


@pytest.mark.parametrize("kind", PRINTERS)
def test_summary_ends_with_the_exit_code_and_run_record(kind: str) -> None:
    last = plain_output(kind=kind).strip().splitlines()[-1]
    assert last.startswith("exit 4")
    assert "run record: /runs/run-1" in last


def test_summary_mentions_a_shared_last_line_of_ok_hosts_once() -> None:
    assert plain_output().count("last line everywhere: clean") == 1


def test_summary_of_a_clean_run_has_no_failure_details() -> None:
    printer, buf = string_printer()
    ok = tuple(HostFinished(host=h, outcome=Outcome.OK, duration_s=1.0) for h in ("a1", "a2"))
    print_summary(printer, RunSummary(run_id="r", playbook="p", results=ok, duration_s=1.0))
    out = buf.getvalue()
    assert "ok     2  a[1-2]" in out
    assert "step '" not in out
    assert "exit 0" in out


def test_summary_shows_at_most_five_stderr_lines_per_host() -> None:
    printer, buf = string_printer()
    tail = tuple(f"line {i}" for i in range(8))
    result = HostFinished(
        host="a", outcome=Outcome.FAILED, duration_s=1.0, failed_step="s", stderr_tail=tail
    )
    print_summary(printer, RunSummary(run_id="r", playbook="p", results=(result,), duration_s=1))
    out = buf.getvalue()
    assert "line 2" not in out
    assert all(f"    | line {i}" in out for i in range(3, 8))


# ---------------------------------------------------------------- a cleanup's results

DID = "killed 2 processes (TERM 2), removed 3 paths"
LEFT = "killed 1 process (TERM 1); left: 1 path"
HOSTILE = "killed 1 process (TERM 1), port 39500 freed (stopped [bold]evil[/bold]\x1b]0;pwn\x07)"


def cleanup_run() -> list[Event]:
    """Seven nodes' cleanups: four did the same (with their own pids), two were left with a path
    in use, one stopped a port holder with a hostile name. Each node's output ends with its
    result line, as fleet/node/cleanup.py says it."""
    hosts = tuple(f"node{i:02d}" for i in range(1, 8))
    events: list[Event] = [
        RunStarted(run_id="r", playbook="cleanup", hosts=hosts, forks=8, run_dir=None)
    ]
    for i, host in enumerate(hosts):
        result = LEFT if host in ("node04", "node06") else HOSTILE if host == "node07" else DID
        step = "clean node"
        events += [
            StepStarted(host=host, step=step, index=0, command="sh -s -- < facts.sh"),
            OutputLine(host=host, step=step, stream="stdout", line=f"killed {100 + i} (TERM): x"),
            OutputLine(host=host, step=step, stream="stdout", line=result),
        ]
        done = CleanupDone(killed=2, by_term=2, removed=3, clean=True)
        end = HostFinished(host=host, outcome=Outcome.OK, duration_s=1, last_line=result, done=done)
        if result == LEFT:
            left = CleanupDone(killed=1, by_term=1)
            end = dataclasses.replace(end, outcome=Outcome.FAILED, failed_step=step, exit_code=1)
            end = dataclasses.replace(end, reason="exit code 1", done=left)
        events.append(end)
    results = tuple(e for e in events if isinstance(e, HostFinished))
    summary = RunSummary(run_id="r", playbook="cleanup", results=results, duration_s=2.0)
    return [*events, RunFinished(summary=summary)]


@pytest.mark.parametrize("kind", PRINTERS)
def test_the_end_of_a_cleanup_folds_nodes_with_the_same_result_and_lists_the_others(
    kind: str,
) -> None:
    printer, buf = string_printer(kind, width=60)  # narrower than the lines: none may wrap
    reporter = PlainReporter(io.StringIO(), printer)
    for event in cleanup_run():
        reporter.handle(event)
    lines = [line.strip() for line in buf.getvalue().splitlines()]
    assert "ok     5  node[01-03,05,07]" in lines
    assert "failed     2  node[04,06]" in lines
    assert f"4  node[01-03,05]: {DID}" in lines
    # the failed ones, apart: one block for the same failure, with what was done and is left
    assert lines.count("node[04,06]: step 'clean node': exit code 1") == 1
    assert lines.count(f"| {LEFT}") == 1
    # node text is data: markup shown as written, an escape sequence as a visible escape
    hostile = (
        "killed 1 process (TERM 1), port 39500 freed (stopped [bold]evil[/bold]\\x1b]0;pwn\\x07)"
    )
    assert f"1  node07: {hostile}" in lines
    assert "\x1b" not in buf.getvalue()


def test_a_cleanup_result_every_node_shares_is_said_once() -> None:
    printer, buf = string_printer()
    reporter = PlainReporter(io.StringIO(), printer)
    hosts = ("node01", "node02")
    reporter.handle(RunStarted(run_id="r", playbook="cleanup", hosts=hosts, forks=2, run_dir=None))
    ends = tuple(
        HostFinished(host=h, outcome=Outcome.OK, duration_s=1, last_line=DID) for h in hosts
    )
    for end in ends:
        reporter.handle(OutputLine(host=end.host, step="clean node", stream="stdout", line=DID))
        reporter.handle(end)
    reporter.handle(
        RunFinished(summary=RunSummary(run_id="r", playbook="cleanup", results=ends, duration_s=1))
    )
    assert buf.getvalue().count(DID) == 1
    assert f"last line everywhere: {DID}" in buf.getvalue()


def test_json_carries_what_each_node_s_cleanup_did_in_numbers() -> None:
    buf = io.StringIO()
    reporter = JsonReporter(buf)
    for event in cleanup_run():
        reporter.handle(event)
    docs = [json.loads(line) for line in buf.getvalue().splitlines()]
    done: dict[str, object] = {
        "killed": 2, "by_term": 2, "by_kill": 0, "removed": 3, "remove_failed": 0,
        "port_freed": None, "port_holders": [], "gpu_reset": False, "gpus": None,
        "clean": True, "failed": [], "refused": False,
    }  # fmt: skip
    finished = {d["host"]: d for d in docs if d["event"] == "HostFinished"}
    assert finished["node01"]["done"] == done
    assert finished["node04"]["done"]["clean"] is False
    final = docs[-1]["hosts"]
    assert final["node01"]["done"] == done
    assert final["node01"]["last_line"] == DID
    # a step that is no cleanup carries none
    assert HostFinished(host="a", outcome=Outcome.OK, duration_s=0).to_dict()["done"] is None


# ---------------------------------------------------------------- JSON lines


def test_json_lines_each_parse_and_the_last_carries_every_hosts_outcome() -> None:
    buf = io.StringIO()
    reporter = JsonReporter(buf)
    events = scripted_run()
    for event in events:
        reporter.handle(event)
    lines = buf.getvalue().splitlines()
    assert len(lines) == len(events)
    parsed = [json.loads(line) for line in lines]
    assert [p["event"] for p in parsed] == [type(e).__name__ for e in events]
    final = parsed[-1]
    assert final["event"] == "RunFinished"
    assert final["exit_code"] == 4
    assert {h: v["outcome"] for h, v in final["hosts"].items()} == {
        **dict.fromkeys(OK, "ok"),
        **dict.fromkeys(FAILED, "failed"),
        **dict.fromkeys(UNREACHABLE, "unreachable"),
    }
    assert final["hosts"]["gpu03"]["failed_step"] == "kill training processes"
    assert final["counts"] == {"ok": 5, "failed": 2, "unreachable": 1}


def test_json_output_lines_keep_the_stream() -> None:
    buf = io.StringIO()
    reporter = JsonReporter(buf)
    for event in scripted_run():
        reporter.handle(event)
    streams = {
        (p["host"], p["stream"], p["line"])
        for p in map(json.loads, buf.getvalue().splitlines())
        if p["event"] == "OutputLine"
    }
    assert ("gpu03", "stderr", "kill: 4242: operation not permitted") in streams


# ---------------------------------------------------------------- the live view


def render_live(reporter: LiveReporter, width: int = 100) -> str:
    console, buf = string_console(width=width, height=200)
    console.print(reporter.live.get_renderable())
    return buf.getvalue()


@pytest.fixture
def live_small_terminal():
    """A LiveReporter on a 10-row terminal; closed after the test."""
    console, buf = string_console(width=100, height=10)
    reporter = LiveReporter(console, step_count=2)
    yield reporter, buf
    reporter.close()


def test_live_compact_view_when_hosts_exceed_terminal_height(live_small_terminal) -> None:
    reporter, _ = live_small_terminal
    hosts = tuple(f"gpu{i:02d}" for i in range(1, 41))
    reporter.handle(RunStarted(run_id="r", playbook="cleanup", hosts=hosts, forks=8, run_dir=None))
    for host in hosts:
        reporter.handle(HostConnecting(host=host, attempt=1))
        reporter.handle(HostConnected(host=host, duration_s=0.1))
        if host in ("gpu13", "gpu31"):
            reporter.handle(
                HostFinished(
                    host=host,
                    outcome=Outcome.FAILED,
                    duration_s=1.0,
                    failed_step="kill",
                    reason="exit code 1",
                )
            )
        elif host == "gpu22":
            reporter.handle(
                HostFinished(
                    host=host, outcome=Outcome.UNREACHABLE, duration_s=1.0, reason="no route"
                )
            )
        else:
            reporter.handle(HostFinished(host=host, outcome=Outcome.OK, duration_s=1.0))
    view = render_live(reporter)
    assert "cleanup on 40 hosts" in view
    assert "ok 37" in view
    assert "failed 2" in view
    assert "unreachable 1" in view
    for host in ("gpu13", "gpu31", "gpu22"):
        assert host in view
    assert "no route" in view
    assert "gpu01" not in view
    assert "37 more hosts not shown" in view
    assert len(view.splitlines()) <= 10


def test_live_compact_view_puts_hosts_needing_attention_before_running_ones(
    live_small_terminal,
) -> None:
    reporter, _ = live_small_terminal
    hosts = tuple(f"n{i:02d}" for i in range(1, 31))
    reporter.handle(RunStarted(run_id="r", playbook="p", hosts=hosts, forks=30, run_dir=None))
    for host in hosts:
        reporter.handle(StepStarted(host=host, step="train", index=0, command="x"))
    reporter.handle(
        HostFinished(host="n30", outcome=Outcome.TIMED_OUT, duration_s=1.0, reason="timed out")
    )
    view = render_live(reporter)
    assert "running 29" in view
    assert "timed_out 1" in view
    assert "n30" in view
    body = view.splitlines()
    assert next(i for i, line in enumerate(body) if "n30" in line) < next(
        i for i, line in enumerate(body) if "running" in line and line.lstrip().startswith("n")
    )


def test_live_full_table_when_hosts_fit() -> None:
    console, _ = string_console(width=100, height=40)
    reporter = LiveReporter(console, step_count=2)
    try:
        reporter.handle(
            RunStarted(run_id="r", playbook="p", hosts=("a1", "a2", "a3"), forks=3, run_dir=None)
        )
        reporter.handle(StepStarted(host="a2", step="verify clean", index=1, command="verify"))
        reporter.handle(
            OutputLine(host="a2", step="verify clean", stream="stdout", line="ok so far")
        )
        view = render_live(reporter)
    finally:
        reporter.close()
    assert all(h in view for h in ("a1", "a2", "a3"))
    assert "2/2 verify clean" in view
    assert "ok so far" in view
    assert "more hosts not shown" not in view


def test_live_prints_the_summary_when_the_run_finishes() -> None:
    console, buf = string_console(width=100, height=10)
    reporter = LiveReporter(console, step_count=2)
    try:
        for event in scripted_run():
            reporter.handle(event)
    finally:
        reporter.close()
    out = buf.getvalue()
    assert "gpu[03,07]" in out
    assert "exit 4" in out
    assert not reporter.live.is_started


def test_run_view_follows_a_host_through_its_states() -> None:
    view = RunView()
    view.apply(RunStarted(run_id="r", playbook="p", hosts=("a",), forks=1, run_dir=None))
    assert view.hosts["a"].state == "pending"
    view.apply(HostConnecting(host="a", attempt=3))
    assert (view.hosts["a"].state, view.hosts["a"].last_line) == ("connecting", "attempt 3")
    view.apply(StepStarted(host="a", step="s", index=0, command="c"))
    assert (view.hosts["a"].state, view.hosts["a"].step_index) == ("running", 1)
    view.apply(HostFinished(host="a", outcome=Outcome.FAILED, duration_s=1.0, reason="exit code 1"))
    assert (view.hosts["a"].state, view.hosts["a"].reason) == ("failed", "exit code 1")
    view.apply(HostFinished(host="ghost", outcome=Outcome.OK, duration_s=1.0))
    assert "ghost" not in view.hosts


def test_run_view_times_a_host_on_a_warm_connection() -> None:
    """A warm connection is said with HostConnected alone (no HostConnecting): the elapsed
    column of the live table stayed empty for the whole run."""
    view = RunView()
    view.apply(RunStarted(run_id="r", playbook="p", hosts=("a",), forks=1, run_dir=None))
    view.apply(HostConnected(host="a", duration_s=0.0005))
    view.apply(StepStarted(host="a", step="s", index=0, command="c"))
    assert elapsed(view.hosts["a"]).strip().endswith("s")
    view.apply(HostFinished(host="a", outcome=Outcome.OK, duration_s=1.0))
    assert elapsed(view.hosts["a"]).strip().endswith("s")


# ---------------------------------------------------------------- foreign text is data

# Lines real training jobs print (Llama chat template, torchrun/torch.distributed prefixes,
# DeepSpeed's logger) that look like rich markup, and markup an attacker would try.
MARKUP_LINES = (
    "<s>[INST] hi [/INST]",
    "[rank0]: loss 1.25",
    "[default0]:step 3",
    "[c10d] The client socket has timed out",
    "[real_accelerator.py:161:get_accelerator] Setting ds_accelerator to cuda",
    "[link=file:///etc/passwd]x[/link]",
    "[/x]",
    "[bold red]fake error[/]",
    ":warning: not an emoji",
)
# Terminal control a node could send: window title, clear screen, alternate screen, clipboard
# write, a one-byte C1 CSI, a carriage return that overwrites the line, a bidi override.
CONTROL_LINES = (
    "title \x1b]0;pwned\x07 end",
    "clear \x1b[2J end",
    "alt \x1b[?1049h end",
    "clip \x1b]52;c;cm0gLXJmIH4=\x07 end",
    "c1 \x9b2J end",
    "fake\rgpu01 | = ok",
    "bidi \u202eevil\u202c end",
)
CONTROL_SHOWN = (
    "title \\x1b]0;pwned\\x07 end",
    "clear \\x1b[2J end",
    "alt \\x1b[?1049h end",
    "clip \\x1b]52;c;cm0gLXJmIH4=\\x07 end",
    "c1 \\x9b2J end",
    "fake\\rgpu01 | = ok",
    "bidi \\u202eevil\\u202c end",
)
RAW_CONTROLS = ("\x1b", "\x07", "\x9b", "\r", "\u202e")


def hostile_run(host: str = "gpu01", lines: tuple[str, ...] = MARKUP_LINES) -> list[Event]:
    """One host that prints `lines` on stdout and stderr, and fails with them as its tail."""
    step = "train [rank0]"
    summary = RunSummary(
        run_id="r",
        playbook="p",
        results=(
            HostFinished(
                host=host,
                outcome=Outcome.FAILED,
                duration_s=1.0,
                failed_step=step,
                exit_code=1,
                reason=f"exit code 1 {lines[0]}",
                last_line=lines[-1],
                stderr_tail=lines[-5:],
            ),
        ),
        duration_s=1.0,
    )
    return [
        RunStarted(run_id="r", playbook="p", hosts=(host,), forks=1, run_dir=None),
        HostConnecting(host=host, attempt=1),
        StepStarted(host=host, step=step, index=0, command="x"),
        *[OutputLine(host=host, step=step, stream="stdout", line=line) for line in lines],
        *[OutputLine(host=host, step=step, stream="stderr", line=line) for line in lines],
        summary.results[0],
        RunFinished(summary=summary),
    ]


def terminal_console(width: int = 200, height: int = 60) -> tuple[Console, io.StringIO]:
    """A console that believes it drives a colour terminal: markup, links and styles would be
    rendered as escape sequences, as on the operator's screen."""
    buf = io.StringIO()
    console = Console(
        file=buf, width=width, height=height, force_terminal=True, color_system="truecolor"
    )
    return console, buf


def test_live_table_shows_markup_like_node_lines_verbatim() -> None:
    for line in MARKUP_LINES:
        console, _ = string_console(width=200, height=40)
        reporter = LiveReporter(console, step_count=1, summary=False)
        try:
            for event in hostile_run(lines=(line,))[:-2]:
                reporter.handle(event)
            view = render_live(reporter, width=200)
        finally:
            reporter.close()
        assert line in view, view


def test_live_run_with_a_chat_template_line_ends_with_the_summary_not_a_crash() -> None:
    console, buf = string_console(width=200, height=40)
    reporter = LiveReporter(console, step_count=1)
    try:
        for event in hostile_run(lines=("<s>[INST] hi [/INST]",)):
            reporter.handle(event)
    finally:
        reporter.close()
    out = buf.getvalue()
    assert "exit 3" in out
    assert "gpu01: step 'train [rank0]': exit code 1 <s>[INST] hi [/INST]" in out


def test_live_table_on_a_terminal_makes_no_link_and_passes_no_node_escape() -> None:
    console, buf = terminal_console()
    reporter = LiveReporter(console, step_count=1)
    try:
        # the table shows the last line, the summary the last five
        lines = (*MARKUP_LINES, *CONTROL_LINES, "[link=file:///etc/passwd]x[/link]")
        for event in hostile_run(lines=lines):
            reporter.handle(event)
    finally:
        reporter.close()
    out = buf.getvalue()
    assert "\x1b]8;" not in out  # OSC 8: a hyperlink
    for raw in ("\x1b]0;", "\x1b[2J", "\x1b[?1049h", "\x1b]52;", "\x9b", "\u202e", "\x07"):
        assert raw not in out
    assert "[link=file:///etc/passwd]x[/link]" in out
    assert "\\x1b]52;c;cm0gLXJmIH4=\\x07" in out


def test_live_cells_escape_control_characters() -> None:
    for line, shown in zip(CONTROL_LINES, CONTROL_SHOWN, strict=True):
        console, _ = string_console(width=200, height=40)
        reporter = LiveReporter(console, step_count=1, summary=False)
        try:
            for event in hostile_run(lines=(line,))[:-2]:
                reporter.handle(event)
            view = render_live(reporter, width=200)
        finally:
            reporter.close()
        assert shown in view
        assert not any(c in view for c in RAW_CONTROLS)


def test_live_table_escapes_hostile_host_and_step_names() -> None:
    console, _ = string_console(width=200, height=40)
    reporter = LiveReporter(console, step_count=1, summary=False)
    host = "[/x]\x1b]0;t\x07"
    try:
        reporter.handle(
            RunStarted(run_id="r", playbook="[b]p", hosts=(host,), forks=1, run_dir=None)
        )
        reporter.handle(StepStarted(host=host, step="[/step]\x1b[2J", index=0, command="x"))
        view = render_live(reporter, width=200)
    finally:
        reporter.close()
    assert "[/x]\\x1b]0;t\\x07" in view
    assert "1/1 [/step]\\x1b[2J" in view
    assert "[b]p on 1 hosts" in view
    assert "\x1b" not in view


@pytest.mark.parametrize("kind", PRINTERS)
def test_plain_lines_escape_control_characters_and_keep_tabs(kind: str) -> None:
    printer, buf = string_printer(kind, width=200)
    reporter = PlainReporter(buf, printer)
    for event in hostile_run(lines=(*CONTROL_LINES, "a\tb")):
        reporter.handle(event)
    out = buf.getvalue()
    for shown in CONTROL_SHOWN:
        assert f"gpu01 |   {shown}" in out.splitlines()
        assert f"gpu01 | ! {shown}" in out.splitlines()
    assert "gpu01 |   a\tb" in out.splitlines()
    assert not any(c in out for c in RAW_CONTROLS)


@pytest.mark.parametrize("kind", PRINTERS)
def test_plain_escapes_hostile_host_names_reasons_and_step_names(kind: str) -> None:
    printer, buf = string_printer(kind, width=200)
    reporter = PlainReporter(buf, printer)
    host = "n\x1b]0;t\x07"
    for event in hostile_run(host=host, lines=("x\ny", "\x1b[2J")):
        reporter.handle(event)
    out = buf.getvalue()
    assert "n\\x1b]0;t\\x07 | = failed: exit code 1 x\\ny" in out.splitlines()
    assert "\x1b" not in out
    assert "\x07" not in out


@pytest.mark.parametrize("kind", PRINTERS)
def test_plain_summary_shows_markup_verbatim(kind: str) -> None:
    printer, buf = string_printer(kind, width=200)
    reporter = PlainReporter(buf, printer)
    for event in hostile_run():
        reporter.handle(event)
    out = buf.getvalue()
    for line in MARKUP_LINES[-5:]:
        assert f"    | {line}" in out.splitlines()


@pytest.mark.parametrize("kind", PRINTERS)
def test_summary_escapes_control_characters_of_every_foreign_field(kind: str) -> None:
    printer, buf = string_printer(kind, width=200)
    result = HostFinished(
        host="h\x1b]0;t\x07",
        outcome=Outcome.FAILED,
        duration_s=1.0,
        failed_step="s\x1b[2J",
        reason="why\x1b[?1049h",
        stderr_tail=("tail\x1b]52;c;eA==\x07",),
    )
    ok = HostFinished(host="o1", outcome=Outcome.OK, duration_s=1.0)
    view = RunView()
    view.apply(RunStarted(run_id="r", playbook="p", hosts=("o1",), forks=1, run_dir=None))
    view.apply(OutputLine(host="o1", step="s", stream="stdout", line="done\x1b[2J"))
    summary = RunSummary(
        run_id="r", playbook="p", results=(result, ok), duration_s=1.0, run_dir="/r\x1b[2J"
    )
    print_summary(printer, summary, view)
    out = buf.getvalue()
    assert "h\\x1b]0;t\\x07: step 's\\x1b[2J': why\\x1b[?1049h" in out
    assert "    | tail\\x1b]52;c;eA==\\x07" in out
    assert "last line everywhere: done\\x1b[2J" in out
    assert "run record: /r\\x1b[2J" in out
    assert "\x1b" not in out


@pytest.mark.parametrize("kind", PRINTERS)
def test_lines_reporter_escapes_log_lines_hosts_and_reasons(kind: str) -> None:
    printer, err = string_printer(kind, width=200)
    out = io.StringIO()
    reporter = LinesReporter(out, printer)
    for event in hostile_run(lines=(*CONTROL_LINES, *MARKUP_LINES)):
        reporter.handle(event)
    lines = out.getvalue().splitlines()
    for shown in CONTROL_SHOWN:
        assert f"gpu01 | {shown}" in lines
    assert "gpu01 | <s>[INST] hi [/INST]" in lines
    assert "gpu01: failed: exit code 1 title \\x1b]0;pwned\\x07 end" in err.getvalue()
    assert not any(c in out.getvalue() + err.getvalue() for c in RAW_CONTROLS)


@pytest.mark.parametrize("kind", PRINTERS)
def test_lines_reporter_reason_with_markup_does_not_crash(kind: str) -> None:
    printer, err = string_printer(kind, width=200)
    reporter = LinesReporter(io.StringIO(), printer)
    for event in hostile_run():
        reporter.handle(event)
    assert "gpu01: failed: exit code 1 <s>[INST] hi [/INST]" in err.getvalue()


def test_json_keeps_node_text_raw_and_escaped_by_json() -> None:
    buf = io.StringIO()
    reporter = JsonReporter(buf)
    for event in hostile_run(lines=CONTROL_LINES):
        reporter.handle(event)
    assert "\x1b" not in buf.getvalue()
    printed = [
        p["line"]
        for p in map(json.loads, buf.getvalue().splitlines())
        if p["event"] == "OutputLine"
    ]
    assert printed[: len(CONTROL_LINES)] == list(CONTROL_LINES)


# ---------------------------------------------------------------- the status table


def status_output(rows: list[StatusRow], terminal: bool = False) -> str:
    console, buf = terminal_console() if terminal else string_console(width=300)
    print_status_table(console, rows)
    return buf.getvalue()


def failed_run(**kw: object) -> NodeRun:
    fields: dict[str, object] = {
        "state": RunState.FAILED,
        "run": "run-1",
        "detail": "exit 1",
        "log_tail": ("<s>[INST] hi [/INST]", "clip \x1b]52;c;eA==\x07", "[rank0]: boom"),
    }
    fields.update(kw)
    return NodeRun(**fields)  # type: ignore[arg-type]


def test_status_log_tail_shows_markup_verbatim_and_escapes_controls() -> None:
    out = status_output([("gpu01", "ok", "", {}, failed_run())])
    lines = out.splitlines()
    assert "    <s>[INST] hi [/INST]" in lines
    assert "    clip \\x1b]52;c;eA==\\x07" in lines
    assert "    [rank0]: boom" in lines
    assert "\x1b" not in out


def test_a_status_row_whose_later_step_timed_out_shows_its_run_and_which_step() -> None:
    running = NodeRun(state=RunState.RUNNING, run="run-1", pid="42", detail="2 procs")
    reason = "disk: step timed out after 30s; remote command killed"
    out = status_output([("gpu01", "timed_out", reason, {"training": "2"}, running)])
    row = next(line for line in out.splitlines() if line.startswith("gpu01"))
    assert "running" in row
    assert row.rstrip().endswith(f"2 procs; {reason}")
    ok = status_output([("gpu01", "ok", "", {}, running)])
    assert (
        next(line for line in ok.splitlines() if line.startswith("gpu01"))
        .rstrip()
        .endswith("2 procs")
    )


def test_status_cells_escape_node_facts_and_host_names() -> None:
    facts = {"training": "2\x1b[2J", "janitor": "[/x]", "gpus": "-"}
    run = failed_run(run="r\x1b]0;t\x07", detail="exit 1 \x9b2J", pid="", log_tail=())
    other = failed_run(run="r2", log_tail=())
    out = status_output(
        [
            ("h\x1b[?1049h", "ok", "", facts, run),
            ("u1", "unreachable", "why\x1b[2J", {}, None),
            ("u2", "ok", "", {}, other),
        ]
    )
    assert "h\\x1b[?1049h" in out
    assert "r\\x1b]0;t\\x07" in out
    assert "2\\x1b[2J" in out
    assert "[/x]" in out
    assert "exit 1 \\x9b2J" in out
    assert "why\\x1b[2J" in out
    assert "\x1b" not in out
    assert "\x9b" not in out


def test_status_table_on_a_terminal_passes_no_node_escape() -> None:
    out = status_output(
        [("gpu01", "ok", "", {"janitor": "\x1b]8;;http://x\x07"}, failed_run())], terminal=True
    )
    assert "\x1b]52;" not in out
    assert "\x1b]8;" not in out
    assert "<s>[INST] hi [/INST]" in out


def test_watch_table_on_80_columns_keeps_host_and_state_whole() -> None:
    """`fleet status --watch` on an 80-column terminal: the host names and states are shown
    whole, each row stays one line, and the long detail is the column that yields (cut)."""
    from fleet.ops.watch import NodeView
    from fleet.output.reporters import watch_table

    facts = {
        "training": "0",
        "gpus": "8",
        "util_avg_pct": "97",
        "mem_used_mib": "71234",
        "mem_total_mib": "81559",
        "janitor": "ok",
        "free_bytes": "123456789012",
    }
    nccl = "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275"
    views = [
        NodeView(name="gpu-node-a01", state="failed", facts=facts, last_log=nccl),
        NodeView(name="gpu-node-a02", state="no answer", reason="connection refused"),
        NodeView(name="gpu-node-a03", state="running", facts=facts, last_log="step 12/500"),
    ]
    console = Console(width=80, record=True, highlight=False)
    console.print(watch_table(views, "watch", now=0.0, interval_s=2.0))
    lines = console.export_text().splitlines()
    assert len(lines) == 2 + len(views)  # the title, the header, one line per node
    assert all(len(line) <= 80 for line in lines)
    for view, line in zip(views, lines[2:], strict=True):
        assert line.startswith(f"{view.name}  {view.state}"), line
    assert nccl not in lines[2]
    assert "Runti" in lines[2]
    assert lines[2].rstrip().endswith("…")


# ---------------------------------------------------------------- the live table on a terminal


def _running(hosts: tuple[str, ...], line: str = "loss 1.25") -> list[Event]:
    return [
        RunStarted(run_id="r", playbook="exec", hosts=hosts, forks=8, run_dir=None),
        *[StepStarted(host=h, step="exec", index=0, command="x") for h in hosts],
        *[OutputLine(host=h, step="exec", stream="stdout", line=line) for h in hosts],
    ]


def test_a_line_said_on_stderr_during_the_live_table_stays_above_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first Ctrl-C's "cancelling" line: written below the table, its next refresh erased
    it (it clears the table's height upwards) and left the table's top on screen twice."""
    console, buf = terminal_console(width=100, height=30)
    monkeypatch.setattr("sys.stderr", buf)  # stdout and stderr: one terminal
    reporter = LiveReporter(console, step_count=1, summary=False)
    try:
        for event in _running(HOSTS[:3]):
            reporter.handle(event)
        reporter.live.refresh()  # the table on screen
        with reporter.aside():
            print("\nfleet: cancelling: no new steps", file=sys.stderr)
        reporter.live.refresh()
    finally:
        reporter.close()

    shown = Screen().feed(buf.getvalue()).text()
    headers = [i for i, line in enumerate(shown) if line.startswith("exec on 3 hosts")]
    assert len(headers) == 1, shown
    assert "fleet: cancelling: no new steps" in shown[: headers[0]], shown
    assert [line.split()[0] for line in shown[-3:]] == list(HOSTS[:3])


def test_stderr_elsewhere_is_left_alone_by_the_live_table(monkeypatch: pytest.MonkeyPatch) -> None:
    console, buf = terminal_console(width=100, height=30)
    elsewhere = io.StringIO()  # 2>errors.log: nothing there tears the table
    monkeypatch.setattr("sys.stderr", elsewhere)
    reporter = LiveReporter(console, step_count=1, summary=False)
    try:
        for event in _running(HOSTS[:2]):
            reporter.handle(event)
        with reporter.aside():
            print("fleet: cancelling", file=sys.stderr)
    finally:
        reporter.close()
    assert elsewhere.getvalue() == "fleet: cancelling\n"
    assert "cancelling" not in buf.getvalue()


@pytest.mark.parametrize("width", [40, 60, 80])
def test_live_table_on_a_narrow_terminal_keeps_host_and_state_whole(width: int) -> None:
    """A split pane: the host names and states are shown whole, each row stays one line, and the
    long last output is what yields (cut). All columns were cut alike: 60 columns showed
    `nod…  cancel…`."""
    hosts = ("gpu-node-a01", "gpu-node-a02", "gpu-node-a03")
    line = "[rank0]: step 100 loss 1.2345 lr 3e-4 tokens/s 12345 grad_norm 0.5"
    console = Console(width=width, height=30, record=True, highlight=False)
    reporter = LiveReporter(console, step_count=1, summary=False)
    for event in [
        *_running(hosts, line),
        HostFinished(host=hosts[1], outcome=Outcome.CANCELLED, duration_s=1.0),
    ]:
        reporter.view.apply(event)
    console.print(reporter.live.get_renderable())
    rows = console.export_text().splitlines()[2:]
    assert len(rows) == len(hosts), rows
    for host, row in zip(hosts, rows, strict=True):
        state = "cancelled" if host == hosts[1] else "running"
        assert row.startswith(f"{host}  {state}"), row
        assert len(row) <= width
    assert line not in rows[0]
    assert rows[0].rstrip().endswith("…")
