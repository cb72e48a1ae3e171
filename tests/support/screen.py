"""What a terminal shows after the bytes a program wrote to it: enough of a VT100 to replay
rich's live display (carriage return, newline, erase line, cursor up and down, cursor shown or
hidden; colours and other styles dropped). The screen has no bottom: every line written stays,
as in a terminal's scrollback, so a test reads the whole session. One character, one cell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_CSI = re.compile(r"\x1b\[([0-9;?]*)([@-~])")


@dataclass
class Screen:
    lines: list[list[str]] = field(default_factory=lambda: [[]])
    row: int = 0
    col: int = 0
    cursor_shown: bool = True

    def feed(self, data: bytes | str) -> Screen:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        at = 0
        while at < len(text):
            match = _CSI.match(text, at)
            if match:
                self._csi(match.group(1), match.group(2))
                at = match.end()
                continue
            char = text[at]
            at += 1
            if char == "\r":
                self.col = 0
            elif char == "\n":  # as a terminal's line discipline sends it (onlcr): \r\n
                self.col = 0
                self._down(1)
            elif char == "\b":
                self.col = max(0, self.col - 1)
            elif char >= " ":
                line = self.lines[self.row]
                line.extend(" " * (self.col - len(line) + 1))
                line[self.col] = char
                self.col += 1
        return self

    def _down(self, n: int) -> None:
        self.row += n
        while len(self.lines) <= self.row:
            self.lines.append([])

    def _csi(self, args: str, final: str) -> None:
        n = int(args) if args.isdigit() else 1
        if args == "?25l":
            self.cursor_shown = False
        elif args == "?25h":
            self.cursor_shown = True
        elif final == "A":
            self.row = max(0, self.row - n)
        elif final == "B":
            self._down(n)
        elif final == "C":
            self.col += n
        elif final == "D":
            self.col = max(0, self.col - n)
        elif final == "K":
            line = self.lines[self.row]
            if args == "2":
                line.clear()
            elif args in ("", "0"):
                del line[self.col :]
        # anything else (SGR colours and styles): nothing to show

    def text(self) -> list[str]:
        """Every line, trailing blanks cut; trailing empty lines dropped."""
        shown = ["".join(line).rstrip() for line in self.lines]
        while shown and not shown[-1]:
            shown.pop()
        return shown
