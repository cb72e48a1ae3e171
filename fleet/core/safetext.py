"""Make text fleet did not write safe to show on the operator's terminal.

Node output, inventory values, reasons, stderr tails and log lines are data. Printed raw, a node
could set the window title (ESC ]0;), clear the screen (ESC [2J), switch to the alternate screen,
write the operator's clipboard (ESC ]52), overwrite a line with a carriage return, or hide and
reorder text with bidi overrides and invisible characters. `clean` shows every such character as
a visible escape (ESC -> `\\x1b`) instead; everything else, tab included, stays as it is.

This module only escapes characters; it knows nothing of rich. Markup is the other half of the
rule: reporters wrap foreign text in rich `Text` objects, which rich never parses as markup.
"""

from __future__ import annotations

import re

# C0 controls except TAB (kept readable) and newline (added below unless kept), DEL, C1 controls
# (U+009B is a one-byte CSI on some terminals), and lone surrogates (they cannot be encoded:
# writing one would crash the output).
_CONTROLS = "\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff"
# Bidi embeddings, overrides, isolates and marks ("Trojan Source", CVE-2021-42574): they reorder
# what the operator reads.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
# Invisible characters that hide or smuggle text: zero-width space, word joiner and invisible
# operators, deprecated format controls, BOM, Mongolian vowel separator, interlinear annotation,
# and the tag characters (invisible ASCII). ZWJ/ZWNJ (U+200C/D) stay: emoji and scripts need them.
_INVISIBLE = (
    "\u200b\u2060-\u2064\u206a-\u206f\ufeff\u180e\ufff9-\ufffb\U000e0001\U000e0020-\U000e007f"
)
# Line and paragraph separators: some renderers break lines there, so one line could pose as two.
_SEPARATORS = "\u2028\u2029"

_UNSAFE = re.compile(f"[\n{_CONTROLS}{_BIDI}{_INVISIBLE}{_SEPARATORS}]")
_UNSAFE_KEEP_NEWLINES = re.compile(f"[{_CONTROLS}{_BIDI}{_INVISIBLE}{_SEPARATORS}]")
_SHORT = {"\n": "\\n", "\r": "\\r"}


def escape_char(char: str) -> str:
    """One character as a visible escape: `\\n`, `\\r`, `\\x1b`, `\\u202e`, `\\U000e0041`."""
    if char in _SHORT:
        return _SHORT[char]
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _escape(match: re.Match[str]) -> str:
    return escape_char(match.group())


def clean(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every control, bidi and invisible character shown as an escape; tab kept.

    One line stays one line (a newline shows as `\\n`), so a node cannot forge a line that seems
    to come from another host. `keep_newlines` is for multi-line text fleet lays out itself (a
    dry run's rendered script): newlines stay, everything else is escaped alike.
    """
    if text.isprintable():
        # The common case, and the run record's hot path: a C loop, ~4x faster than the regex
        # for a plain ASCII line. Every character escaped here is one Python deems unprintable
        # (categories Cc, Cf, Cs, Zl, Zp: tests/core/test_safetext.py checks it), so a printable
        # text has nothing to escape.
        return text
    pattern = _UNSAFE_KEEP_NEWLINES if keep_newlines else _UNSAFE
    return pattern.sub(_escape, text)
