"""Node output stays bounded in memory whatever a node prints: lines are cut (and say so), tails
are short, output in flight to the main thread is budgeted, and environment values are redacted
from every event. Through the real line reader and the real executor (fake SSH sessions)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet.core.events import Event, HostFinished, OutputLine, RunStarted, StepFinished, StepStarted
from fleet.core.hosts import Host
from fleet.core.playbook import Playbook, Step
from fleet.core.redact import REDACTED, Redactor, env_pairs, shown_names
from fleet.core.result import (
    LINE_MAX_BYTES,
    TAIL_LINE_MAX_BYTES,
    CommandResult,
    cut_bytes,
    size_text,
)
from fleet.core.shell import PID_MARKER, Cmd
from fleet.engine import executor
from fleet.engine.executor import Run
from fleet.engine.plan import build_plan
from fleet.engine.runner import OutputCollector
from fleet.output.plain import RunView
from fleet.ssh.transport import TAIL_LINES, _Reader

CHUNK = 65536  # what the transport reads from a channel at a time


def _reader() -> tuple[_Reader, list[tuple[str, str]]]:
    got: list[tuple[str, str]] = []
    return _Reader(lambda stream, line: got.append((stream, line))), got


# ---------------------------------------------------------------- one line, cut


def test_a_20_mb_line_is_held_only_up_to_the_cap_and_says_how_much_it_lost() -> None:
    reader, got = _reader()
    total = 20_000_000
    block = b"x" * CHUNK
    sent = 0
    while sent < total:
        piece = block[: min(CHUNK, total - sent)]
        reader.feed("stdout", piece)
        sent += len(piece)
        assert len(reader.partial["stdout"]) <= LINE_MAX_BYTES + 3  # never the whole line
    reader.feed("stdout", b"\nnext\n")

    assert [line for _, line in got][1] == "next"
    line = got[0][1]
    assert line == "x" * LINE_MAX_BYTES + f" ... [cut: {size_text(total - LINE_MAX_BYTES)} more]"
    assert line.endswith("[cut: 20.0 MB more]")
    tail = reader.tails["stdout"][0]
    assert tail.startswith("x" * TAIL_LINE_MAX_BYTES + " ... [cut: ")
    assert len(tail) < TAIL_LINE_MAX_BYTES + 40


def test_a_long_line_in_one_chunk_and_at_the_end_without_newline_is_cut_too() -> None:
    reader, got = _reader()
    reader.feed("stderr", b"y" * 40_000 + b"\n" + b"z" * 30_000)
    reader.flush()
    assert got[0] == (
        "stderr",
        "y" * LINE_MAX_BYTES + f" ... [cut: {size_text(40_000 - 16384)} more]",
    )
    assert got[1][1].startswith("z" * LINE_MAX_BYTES + " ... [cut: ")


def test_a_cut_never_splits_a_character() -> None:
    reader, got = _reader()
    reader.feed("stdout", "€".encode() * 10_000 + b"\n")  # 3 bytes each: 16384 is mid-character
    reader.feed("stdout", b"a" + "é".encode() * 10_000 + b"\n")  # 2 bytes each, shifted by one
    assert len(got) == 2
    for _, line in got:
        head = line.split(" ... [cut: ")[0]
        assert "\ufffd" not in head
        assert LINE_MAX_BYTES - 3 <= len(head.encode()) <= LINE_MAX_BYTES


def test_short_lines_pass_unchanged_and_the_pid_line_is_taken() -> None:
    reader, got = _reader()
    reader.feed("stderr", f"{PID_MARKER}4242\n".encode())
    reader.feed("stdout", b"one\r\ntw")
    reader.feed("stdout", b"o\n\nthree")
    reader.flush()
    assert reader.pid == 4242
    assert got == [("stdout", "one"), ("stdout", "two"), ("stdout", ""), ("stdout", "three")]
    assert list(reader.tails["stdout"]) == ["one", "two", "", "three"]


def test_tails_keep_the_last_lines_only() -> None:
    reader, _ = _reader()
    reader.feed("stdout", b"".join(f"{i}\n".encode() for i in range(1000)))
    assert list(reader.tails["stdout"]) == [str(i) for i in range(1000 - TAIL_LINES, 1000)]


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (0, "0 bytes"),
        (1, "1 byte"),
        (999, "999 bytes"),
        (16_384, "16.4 kB"),
        (19_983_616, "20.0 MB"),
    ],
)
def test_sizes_read_like_df_h(count: int, text: str) -> None:
    assert size_text(count) == text


def test_cut_bytes_counts_what_was_already_dropped() -> None:
    assert cut_bytes(b"abcdef", 4, more=10) == "abcd ... [cut: 12 bytes more]"
    assert cut_bytes(b"abc", 4) == "abc"


# ---------------------------------------------------------------- in flight: a budget


def test_budget_blocks_a_worker_until_the_main_thread_gives_back() -> None:
    budget = executor.OutputBudget(limit=1000)
    budget.take(600)
    done = threading.Event()

    def worker() -> None:
        budget.take(600)  # would exceed the limit: waits
        done.set()

    threading.Thread(target=worker, daemon=True).start()
    assert not done.wait(0.3)
    budget.give(600)
    assert done.wait(10)
    assert budget.used == 600


def test_a_single_line_larger_than_the_budget_still_passes_when_nothing_is_queued() -> None:
    budget = executor.OutputBudget(limit=100)
    budget.take(5000)  # must not block forever
    assert budget.used == 5000


class _Flooding:
    """A session whose step prints `count` lines of 1000 bytes as fast as on_line returns."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.sent = 0

    def connect(self, host: Host, on_attempt: Callable[[int], None] | None = None) -> _Flooding:
        return self

    def run(
        self,
        cmd: Cmd,
        on_line: Callable[[str, str], None],
        cancel: threading.Event,
        sudo_password: str | None = None,
    ) -> CommandResult:
        for i in range(self.count):
            on_line("stdout", f"line {i:06d} ".ljust(1000, "y"))
            self.sent += 1
        return CommandResult(exit_code=0, stdout_tail=("last",))

    def close(self) -> None:
        return None


def _playbook(run: str = "flood") -> Playbook:
    return Playbook(name="t", path=Path("t.yaml"), steps=(Step(name="s", run=run),))


def _settled(count: Callable[[], int]) -> int:
    """Poll until `count()` stops growing (the worker is waiting) or it never stops (10 s)."""
    deadline = time.monotonic() + 10
    last = -1
    while time.monotonic() < deadline and count() != last:
        last = count()
        time.sleep(0.3)
    return count()


def test_a_flooding_host_waits_for_the_main_thread_instead_of_filling_the_queue() -> None:
    """20 MB of lines while nobody drains: about 8 MiB (the budget) is queued, then the worker
    waits; once drained, every line arrives, in order."""
    session = _Flooding(20_000)
    run = Run(
        plan=build_plan([Host(name="n1", address="n1.invalid")], _playbook(), {}),
        transport=session,
    )
    threads = run.start()
    sent = _settled(lambda: session.sent)
    queued = run.events.qsize()
    assert sent < 10_000, "the worker did not wait"
    assert queued * 1000 < 10 * 1024 * 1024

    events = list(run.drain(threads, poll_s=0.01))
    lines = [e.line for e in events if isinstance(e, OutputLine)]
    assert len(lines) == 20_000
    assert lines == sorted(lines)  # nothing lost or reordered by the waiting
    assert run.budget.used == 0


# ---------------------------------------------------------------- environment values redacted


class _Echo:
    """A session that prints its command back, on both streams, and fails."""

    def connect(self, host: Host, on_attempt: Callable[[int], None] | None = None) -> _Echo:
        return self

    def run(
        self,
        cmd: Cmd,
        on_line: Callable[[str, str], None],
        cancel: threading.Event,
        sudo_password: str | None = None,
    ) -> CommandResult:
        on_line("stdout", cmd.display)
        on_line("stderr", "env: HF_TOKEN=hf_SECRET and NCCL_DEBUG=INFO")
        return CommandResult(
            exit_code=1,
            stdout_tail=(cmd.display,),
            stderr_tail=("env: HF_TOKEN=hf_SECRET and NCCL_DEBUG=INFO",),
        )

    def close(self) -> None:
        return None


def _echo_run(**extra: object) -> list[Event]:
    host = Host(name="n1", address="n1.invalid", vars={"env": {"HF_TOKEN": "hf_SECRET"}})
    pb = _playbook("start ${env|opt:--env} ${extra_env|opt:--env}")
    overrides = {"extra_env": ["WANDB_API_KEY=it's a secret", "NCCL_DEBUG=INFO"]}
    run = Run(plan=build_plan([host], pb, overrides), transport=_Echo(), **extra)  # type: ignore[arg-type]
    return list(run.drain(run.start(), poll_s=0.01))


def test_env_values_are_redacted_from_every_event() -> None:
    events = _echo_run()
    text = repr([e.to_dict() for e in events])
    assert "hf_SECRET" not in text
    assert "a secret" not in text
    assert "NCCL_DEBUG=INFO" not in text
    started = next(e for e in events if isinstance(e, StepStarted))
    assert started.command == (
        f"start --env HF_TOKEN={REDACTED} --env WANDB_API_KEY={REDACTED} "
        f"--env NCCL_DEBUG={REDACTED}"
    )
    lines = [e.line for e in events if isinstance(e, OutputLine)]
    assert lines[1] == f"env: HF_TOKEN={REDACTED} and NCCL_DEBUG={REDACTED}"
    finished = next(e for e in events if isinstance(e, StepFinished))
    assert finished.stderr_tail == (lines[1],)
    host_done = next(e for e in events if isinstance(e, HostFinished))
    assert host_done.last_line is not None
    assert REDACTED in host_done.last_line


def test_env_values_named_by_the_operator_are_shown() -> None:
    events = _echo_run(show_env=frozenset({"NCCL_DEBUG"}))
    started = next(e for e in events if isinstance(e, StepStarted))
    assert started.command.endswith("--env NCCL_DEBUG=INFO")
    assert "hf_SECRET" not in repr([e.to_dict() for e in events])


def test_a_line_cut_inside_a_secret_does_not_show_its_start() -> None:
    redact = Redactor([("HF_TOKEN", "hf_0123456789")])
    cut = "x" * 20 + " HF_TOKEN=hf_0123 ... [cut: 1.2 MB more]"
    assert redact(cut) == "x" * 20 + f" HF_TOKEN={REDACTED} ... [cut: 1.2 MB more]"


def test_longer_values_win_and_empty_values_are_left_alone() -> None:
    redact = Redactor([("K", "ab"), ("K", "abcd"), ("E", "")])
    assert redact("K=abcd K=ab E=") == f"K={REDACTED} K={REDACTED} E="


def test_env_pairs_come_from_env_and_extra_env_and_names_from_the_variable() -> None:
    pairs = env_pairs({"env": {"A": 1, "B": True}, "extra_env": ["C=x=y", "junk"], "other": "D=1"})
    assert pairs == (("A", "1"), ("B", "true"), ("C", "x=y"))
    assert shown_names({"FLEET_RECORD_ENV": " NCCL_DEBUG, ,OMP_NUM_THREADS"}) == frozenset(
        {"NCCL_DEBUG", "OMP_NUM_THREADS"}
    )


# ---------------------------------------------------------------- what the main thread keeps


def test_status_collector_keeps_a_bounded_tail_per_step() -> None:
    collector = OutputCollector()
    for i in range(100_000):
        collector.handle(OutputLine(host="n1", step="run", stream="stdout", line=f"log: {i}"))
    collector.handle(OutputLine(host="n1", step="run", stream="stdout", line="run=r1 pid=7"))
    kept = collector.lines["n1"]["run"]
    assert len(kept) <= 2 * OutputCollector.KEEP_LINES
    assert kept[-6:-1] == [f"log: {i}" for i in range(99_995, 100_000)]
    assert collector.facts("n1", "run") == {"run": "r1", "pid": "7"}


def test_live_view_keeps_a_short_last_line() -> None:
    view = RunView()
    view.apply(RunStarted(run_id="r", playbook="p", hosts=("n1",), forks=1, run_dir=None))
    view.apply(OutputLine(host="n1", step="s", stream="stdout", line="z" * LINE_MAX_BYTES))
    assert len(view.hosts["n1"].last_line) <= TAIL_LINE_MAX_BYTES


def test_freed_heap_is_handed_back_as_output_flows(monkeypatch: pytest.MonkeyPatch) -> None:
    """HeapTrim calls malloc_trim once per TRIM_EVERY_BYTES of output (other events: never)."""
    from fleet.engine import runner

    calls: list[int] = []
    monkeypatch.setattr(runner, "TRIM_EVERY_BYTES", 1000)
    trim = runner.HeapTrim()
    trim._trim = lambda pad: calls.append(pad) or 1
    line = OutputLine(host="n1", step="s", stream="stdout", line="x" * 100)
    for _ in range(25):
        trim.handle(line)
        trim.handle(RunStarted(run_id="r", playbook="p", hosts=("n1",), forks=1, run_dir=None))
    assert calls == [0, 0]
