"""safetext.clean: what fleet does to text it did not write before it reaches a terminal."""

from __future__ import annotations

import unicodedata

import pytest

from fleet.core import safetext
from fleet.core.safetext import clean, escape_char

EVERY_CHAR = "".join(chr(c) for c in range(0x110000))
BIDI_CLASSES = {"LRE", "RLE", "PDF", "LRO", "RLO", "LRI", "RLI", "FSI", "PDI"}


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("title \x1b]0;pwned\x07 end", "title \\x1b]0;pwned\\x07 end"),
        ("\x1b[2J\x1b[?1049h", "\\x1b[2J\\x1b[?1049h"),
        ("\x1b]52;c;cm0gLXJmIH4=\x07", "\\x1b]52;c;cm0gLXJmIH4=\\x07"),
        ("nul\x00 bs\x08 del\x7f", "nul\\x00 bs\\x08 del\\x7f"),
        ("c1 csi \x9b2J nel \x85", "c1 csi \\x9b2J nel \\x85"),
        ("one\ntwo\rthree", "one\\ntwo\\rthree"),
        (
            "rlo \u202eevil\u202c lri \u2066x\u2069 rlm \u200f",
            "rlo \\u202eevil\\u202c lri \\u2066x\\u2069 rlm \\u200f",
        ),
        ("zw\u200bsp bom\ufeff wj\u2060", "zw\\u200bsp bom\\ufeff wj\\u2060"),
        ("tag \U000e0041\U000e0042", "tag \\U000e0041\\U000e0042"),
        ("ls\u2028ps\u2029", "ls\\u2028ps\\u2029"),
        ("lone \udcff", "lone \\udcff"),
    ],
)
def test_controls_bidi_and_invisible_characters_show_as_escapes(raw: str, shown: str) -> None:
    assert clean(raw) == shown


@pytest.mark.parametrize(
    "text",
    [
        "col1\tcol2",
        "<s>[INST] hi [/INST]",
        "[rank0]: [link=file:///etc/passwd]x[/link] :smile:",
        "héllo wörld 日本語 Ελληνικά עברית العربية",
        "emoji 🙂 family 👨\u200d👩\u200d👧 zwnj \u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
        "C:\\path\\x1b is a literal backslash",
        "",
    ],
)
def test_ordinary_text_tabs_and_markup_like_brackets_are_unchanged(text: str) -> None:
    assert clean(text) == text


def test_no_terminal_control_survives_among_every_code_point() -> None:
    out = clean(EVERY_CHAR)
    left = {c for c in out if unicodedata.category(c) in {"Cc", "Cs", "Zl", "Zp"}}
    assert left == {"\t"}
    assert not {c for c in out if unicodedata.bidirectional(c) in BIDI_CLASSES}
    assert not set(out) & {"\u200e", "\u200f", "\u061c", "\u200b", "\ufeff", "\u2060"}
    out.encode("utf-8")  # no lone surrogate left to crash a UTF-8 stream


def test_every_printable_character_is_left_as_it_is() -> None:
    """clean()'s fast path returns a printable text unchanged: so the regex must have nothing
    to escape in one, whatever the Unicode version (every escaped class is unprintable)."""
    printable = "".join(c for c in EVERY_CHAR if c.isprintable())
    for pattern in (safetext._UNSAFE, safetext._UNSAFE_KEEP_NEWLINES):
        assert pattern.sub(safetext._escape, printable) == printable


def test_cleaning_twice_changes_nothing_more() -> None:
    once = clean(EVERY_CHAR)
    assert clean(once) == once


def test_keep_newlines_keeps_only_newlines() -> None:
    assert clean("a\nb\r\x1b[2J\tc", keep_newlines=True) == "a\nb\\r\\x1b[2J\tc"


@pytest.mark.parametrize(
    ("char", "escape"),
    [
        ("\n", "\\n"),
        ("\r", "\\r"),
        ("\x1b", "\\x1b"),
        ("\u202e", "\\u202e"),
        ("\U000e0001", "\\U000e0001"),
    ],
)
def test_escape_forms(char: str, escape: str) -> None:
    assert escape_char(char) == escape
