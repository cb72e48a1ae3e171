"""fleet/output/printer.py: which printer a stream gets (rich's own rule), and what each writes."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator

import pytest

from fleet.output.plain import TextPrinter
from fleet.output.printer import printer_for
from fleet.output.reporters import ConsolePrinter


@pytest.fixture
def terminal() -> Iterator[io.TextIOWrapper]:
    """The writing end of a real pseudo-terminal."""
    leader, follower = os.openpty()
    stream = open(follower, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    try:
        yield stream
    finally:
        stream.close()
        os.close(leader)


@pytest.fixture(autouse=True)
def no_style_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)


def test_a_pipe_gets_plain_text_and_a_terminal_gets_rich(terminal: io.TextIOWrapper) -> None:
    assert isinstance(printer_for(io.StringIO()), TextPrinter)
    assert isinstance(printer_for(terminal), ConsolePrinter)


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        ({"FORCE_COLOR": "1"}, ConsolePrinter),
        ({"FORCE_COLOR": ""}, TextPrinter),  # set but empty: not asked
        ({"TTY_COMPATIBLE": "1"}, ConsolePrinter),
        ({"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"}, TextPrinter),  # rich: 0 wins
    ],
    ids=repr,
)
def test_the_environment_decides_as_it_does_for_rich(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], kind: type
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert isinstance(printer_for(io.StringIO()), kind)


def test_a_closed_stream_is_not_a_terminal() -> None:
    closed = io.StringIO()
    closed.close()
    assert isinstance(printer_for(closed), TextPrinter)


def test_text_is_one_cleaned_line_without_styles_however_long() -> None:
    out = io.StringIO()
    TextPrinter(out).line(("exit ", "dim"), ("4", "bold"), "  " + "x" * 300 + "\x1b[2J\n[b]")
    assert out.getvalue() == "exit 4  " + "x" * 300 + "\\x1b[2J\\n[b]\n"
