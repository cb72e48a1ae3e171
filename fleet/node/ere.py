"""POSIX extended regexes (what `grep -E` and `pkill -f` take), read exactly and run in Python.

A kill pattern is matched twice: on the node by facts.sh's `grep -E` (which picks the processes
worth a full record) and in fleet by the decision (which picks what to kill). Both must agree,
so a pattern is parsed here as the POSIX ERE grammar has it, in the C locale (bytes), and
translated to an equivalent Python bytes regex; anything outside that grammar, or where grep
implementations part ways (`\\d` is a literal `d` to some, a digit to none), is refused with a
hint rather than read two ways. GNU's `\\w \\W \\s \\S \\b \\B \\< \\>` are accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RE_DUP_MAX = 32767
_SPECIAL = b".[\\()*+?{|^$"
_ESCAPES = {
    ord("w"): rb"\w",
    ord("W"): rb"\W",
    ord("s"): rb"\s",
    ord("S"): rb"\S",
    ord("b"): rb"\b",
    ord("B"): rb"\B",
    ord("<"): rb"\b(?=\w)",
    ord(">"): rb"\b(?<=\w)",
}
_CLASSES = {
    b"alpha": b"a-zA-Z",
    b"digit": b"0-9",
    b"alnum": b"0-9a-zA-Z",
    b"upper": b"A-Z",
    b"lower": b"a-z",
    b"space": b" \\t\\n\\r\\f\\v",
    b"blank": b" \\t",
    b"punct": re.escape(b"!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    b"print": b"\\x20-\\x7e",
    b"graph": b"\\x21-\\x7e",
    b"cntrl": b"\\x00-\\x1f\\x7f",
    b"xdigit": b"0-9A-Fa-f",
}


class BadPattern(ValueError):
    """Not a POSIX extended regex fleet reads the same way as the node's grep."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint or "write a POSIX extended regex, as for grep -E (e.g. 'train\\.py')"


@dataclass(frozen=True)
class Pattern:
    """One kill pattern: as written, and compiled (Python, bytes)."""

    source: str
    regex: re.Pattern[bytes]

    def search(self, text: bytes) -> bool:
        return self.regex.search(text) is not None


def _byte(value: int) -> bytes:
    return re.escape(bytes([value]))


class _Reader:
    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.at = 0
        self.groups = 0

    def peek(self) -> int | None:
        return self.raw[self.at] if self.at < len(self.raw) else None

    def take(self) -> int:
        value = self.raw[self.at]
        self.at += 1
        return value

    def ere(self, depth: int) -> bytes:
        branches = [self.branch(depth)]
        while self.peek() == ord("|"):
            self.take()
            branches.append(self.branch(depth))
        return b"|".join(branches)

    def branch(self, depth: int) -> bytes:
        out = b""
        while (c := self.peek()) is not None and c != ord("|") and not (c == ord(")") and depth):
            atom = self.atom(depth)
            out += self.quantified(atom)
        return out

    def quantified(self, atom: bytes) -> bytes:
        while (c := self.peek()) is not None and c in b"*+?{":
            if atom in (b"^", b"$") or atom.startswith((b"\\b", b"\\B")):
                raise BadPattern("a repetition after an anchor")
            if c == ord("{"):
                quant = self.interval()
            else:
                self.take()
                quant = bytes([c])
            # ERE allows `a**`; Python wants a group around a repeated repetition.
            atom = (
                b"(?:" + atom + b")" if atom.endswith((b"*", b"+", b"?", b"}")) else atom
            ) + quant
        return atom

    def interval(self) -> bytes:
        end = self.raw.find(b"}", self.at)
        body = self.raw[self.at + 1 : end] if end > 0 else b""
        m = re.fullmatch(rb"([0-9]*)(,([0-9]*))?", body)
        if end < 0 or not m or not (m.group(1) or m.group(3)):
            raise BadPattern(
                "'{' starts no valid interval like {2} or {1,3}", "write \\{ for a literal brace"
            )
        low = int(m.group(1) or 0)
        high = int(m.group(3)) if m.group(3) else None
        if low > RE_DUP_MAX or (high is not None and (high > RE_DUP_MAX or high < low)):
            raise BadPattern(f"interval {{{body.decode()}}} is out of range")
        self.at = end + 1
        return b"{" + body + b"}"

    def atom(self, depth: int) -> bytes:
        c = self.take()
        if c in b"*+?{":
            raise BadPattern(
                f"'{chr(c)}' repeats nothing", "write \\" + chr(c) + " for the character"
            )
        if c == ord("("):
            self.groups += 1
            inner = self.ere(depth + 1)
            if self.peek() != ord(")"):
                raise BadPattern("'(' is never closed", "write \\( for a literal parenthesis")
            self.take()
            return b"(" + inner + b")"
        if c == ord(")"):
            raise BadPattern("')' closes nothing", "write \\) for a literal parenthesis")
        if c == ord("."):
            return b"."
        if c in b"^$":
            return bytes([c])
        if c == ord("["):
            return self.bracket()
        if c == ord("\\"):
            return self.escape()
        return _byte(c)

    def escape(self) -> bytes:
        if self.peek() is None:
            raise BadPattern("the pattern ends in a lone backslash")
        c = self.take()
        if c in _SPECIAL or c in b"}/":
            return _byte(c)
        if c in _ESCAPES:
            return _ESCAPES[c]
        if ord("1") <= c <= ord("9"):
            if c - ord("0") > self.groups:
                raise BadPattern(f"\\{chr(c)} refers to a group that does not exist")
            return b"\\" + bytes([c])
        raise BadPattern(
            f"\\{chr(c)} is not part of POSIX extended regexes",
            "e.g. [0-9] for a digit, [[:space:]] for white space; \\. for a literal dot",
        )

    def bracket(self) -> bytes:
        """`[...]`: in POSIX a backslash inside is itself, `]` first is a member, classes and
        ranges are of bytes (the C locale)."""
        negate = self.peek() == ord("^")
        if negate:
            self.take()
        items: list[bytes] = []
        first = True
        while True:
            if self.peek() is None:
                raise BadPattern("'[' is never closed", "write \\[ for a literal bracket")
            if self.peek() == ord("]") and not first:
                self.take()
                return b"[" + (b"^" if negate else b"") + b"".join(items) + b"]"
            first = False
            low = self.bracket_item()
            if isinstance(low, bytes):
                items.append(low)
            elif self.peek() == ord("-") and self.raw[self.at + 1 : self.at + 2] not in (b"]", b""):
                self.take()
                high = self.bracket_item()
                if isinstance(high, bytes) or high < low:
                    raise BadPattern("a range in [...] runs backwards or ends in a class")
                items.append(_byte(low) + b"-" + _byte(high))
            else:
                items.append(_byte(low))

    def bracket_item(self) -> int | bytes:
        """One member of a bracket expression: a byte, or a [:class:]'s Python ranges."""
        if self.raw.startswith(b"[:", self.at):
            end = self.raw.find(b":]", self.at + 2)
            name = self.raw[self.at + 2 : end] if end > 0 else b""
            if name not in _CLASSES:
                raise BadPattern(f"[:{name.decode('latin-1')}:] is no character class")
            self.at = end + 2
            return _CLASSES[name]
        for opener, closer in ((b"[=", b"=]"), (b"[.", b".]")):
            if self.raw.startswith(opener, self.at):
                end = self.raw.find(closer, self.at + 2)
                inner = self.raw[self.at + 2 : end] if end > 0 else b""
                if len(inner) != 1:
                    raise BadPattern("only single characters work in [= =] and [. .]")
                self.at = end + 2
                return inner[0]
        return self.take()


def compile_ere(pattern: str) -> Pattern:
    """Parse a kill pattern; BadPattern (with a hint) when grep -E would not read it the same
    way, or when it matches the empty string (and so every process)."""
    if not pattern:
        raise BadPattern("is empty: it would match every process", "name what to kill")
    if "\n" in pattern or "\0" in pattern:
        raise BadPattern("holds a newline or NUL", "give one line")
    raw = pattern.encode("utf-8", "surrogateescape")
    reader = _Reader(raw)
    body = reader.ere(0)
    if reader.at != len(raw):
        raise BadPattern("')' closes nothing", "write \\) for a literal parenthesis")
    try:
        regex = re.compile(body, re.DOTALL)
    except re.error as exc:
        raise BadPattern(f"not a valid extended regex ({exc})") from None
    if regex.search(b"") is not None:
        raise BadPattern(
            "matches the empty string, so it would match every process", "name what to kill"
        )
    return Pattern(pattern, regex)
