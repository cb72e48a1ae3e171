"""The frames a worker process sends its parent: every event type it can send comes back equal,
and nothing but the registered types, whole, is ever built from a frame."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.core import events
from fleet.core.events import (
    Event,
    HostConnected,
    HostConnecting,
    HostFinished,
    LateOutputIgnored,
    Outcome,
    OutputLine,
    RunStarted,
    ShellNoiseIgnored,
    StepFinished,
    StepStarted,
)
from fleet.core.result import CleanupDone
from fleet.engine import wire
from fleet.engine.wire import WireError, WorkerFigures, decode, encode

SAMPLES: list[Event | WorkerFigures] = [
    HostConnecting(host="gpu01", attempt=2),
    HostConnected(host="gpu01", duration_s=0.25),
    StepStarted(host="gpu01", step="exec", index=0, command="echo 'a b'"),
    OutputLine(host="gpu01", step="exec", stream="stdout", line="\x1b[31mred\n\udcff é [/INST]"),
    OutputLine(host="gpu01", step="exec", stream="stderr", line=""),
    ShellNoiseIgnored(host="gpu01", step="exec", lines=("motd", "banner"), count=7),
    LateOutputIgnored(host="gpu01", step="exec", lines=("bg1",), count=20),
    StepFinished(
        host="gpu01",
        step="exec",
        index=0,
        exit_code=None,
        duration_s=1.5,
        timed_out=True,
        cancelled=False,
        stderr_tail=("x", "y"),
    ),
    HostFinished(host="gpu01", outcome=Outcome.OK, duration_s=0.1),
    HostFinished(
        host="gpu02",
        outcome=Outcome.TIMED_OUT,
        duration_s=3.0,
        failed_step="exec",
        exit_code=124,
        reason="step timed out after 3s",
        last_line="last",
        stderr_tail=("e1",),
        done=CleanupDone(
            killed=3,
            by_term=2,
            by_kill=1,
            port_freed=39500,
            port_holders=(12, 13),
            gpus=8,
            clean=False,
            failed=("kill", "gpu-reset"),
            refused=True,
        ),
    ),
    WorkerFigures(index=1, pid=4242, hosts=64, user_s=0.5, sys_s=0.25, maxrss_kb=51200),
]


@pytest.mark.parametrize("item", SAMPLES, ids=lambda item: type(item).__name__)
def test_every_item_comes_back_equal(item: Event | WorkerFigures) -> None:
    frame = encode(item)
    assert frame.endswith(b"\n")
    assert frame.count(b"\n") == 1  # one line, whatever the text
    frame.decode("ascii")  # node text is escaped: never a raw control or non-ASCII byte
    back = decode(frame[:-1])
    assert back == item
    assert type(back) is type(item)


def test_every_event_a_worker_emits_is_registered() -> None:
    """Each Event subclass is either on the wire or the parent's own (made after the merge)."""
    parents_own = {"RunStarted", "RunFinished", "VerbFinished"}
    subclasses = {
        name
        for name, value in vars(events).items()
        if isinstance(value, type) and issubclass(value, Event) and value is not Event
    }
    assert subclasses - parents_own == set(wire.REGISTRY) - {"WorkerFigures"}
    assert {type(s).__name__ for s in SAMPLES} == set(wire.REGISTRY)


def test_a_type_made_only_by_the_parent_is_not_sent() -> None:
    started = RunStarted(run_id="r", playbook="p", hosts=("a",), forks=1, run_dir=None)
    with pytest.raises(WireError, match="not a wire type: RunStarted"):
        encode(started)


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (b'{"event": "RunStarted", "run_id": "r"}', "unknown frame type 'RunStarted'"),
        (b'{"event": "os.system", "command": "rm -rf /"}', "unknown frame type"),
        (b'{"host": "gpu01"}', "unknown frame type 'None'"),
        (b'["HostConnecting"]', "a frame is a JSON object"),
        (b'{"event": "HostConnecting", "host": "g"', "not a JSON frame"),
        (b'{"event": "HostConnecting", "host": "g"}', "HostConnecting: .*attempt"),
        (b'{"event": "HostConnecting", "host": "g", "attempt": 1, "x": 2}', "unknown field 'x'"),
        (b'{"event": "HostFinished", "host": "g", "outcome": "gone", "duration_s": 0}', "outcome"),
        (b'{"event": "StepFinished", "stderr_tail": "not a list"}', "stderr_tail"),
    ],
)
def test_anything_else_is_refused(frame: bytes, message: str) -> None:
    with pytest.raises(WireError, match=message):
        decode(frame)


def test_a_frame_is_plain_json_with_its_type_name() -> None:
    fields = json.loads(encode(HostConnected(host="gpu01", duration_s=0.5, ts=12.0)))
    assert fields == {
        "event": "HostConnected",
        "ts": 12.0,
        "host": "gpu01",
        "duration_s": 0.5,
        "connection": None,
        "ssh": None,
    }


@pytest.mark.parametrize(
    "event",
    [s for s in SAMPLES if not isinstance(s, (OutputLine, WorkerFigures))],
    ids=lambda e: type(e).__name__,
)
def test_a_frame_is_the_line_the_run_record_writes_for_its_event(
    event: Event, trusted_tmp: Path
) -> None:
    """The parent writes a worker's frame to events.jsonl as it came (RunRecord.handle's
    `line`): it must be, byte for byte, the line the record writes for the event itself."""
    from fleet.records import runlog

    lines = []
    for given in (None, encode(event).rstrip(b"\n")):
        record = runlog.RunRecord(trusted_tmp, f"r{len(lines)}")
        record.handle(event, given)
        record.close()
        lines.append((record.dir / "events.jsonl").read_bytes())
    assert lines[0] == lines[1] == encode(event)
