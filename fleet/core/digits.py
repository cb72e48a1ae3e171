"""Whole numbers in text: a port in an inventory, a pid or a size a node printed.

`str.isdigit()` is not the test `int()` needs: it passes superscripts and circled digits ('²',
'①'), which `int()` refuses, and any number of digits, which `int()` refuses past 4300
(Python's guard against quadratic conversion). Either reached `int()` as an internal error.
"""

from __future__ import annotations

# More than any number fleet reads (a byte count, a pid, a port), far fewer than int() refuses.
MAX_DIGITS = 40


def is_digits(text: str | bytes) -> bool:
    """`text` is ASCII digits only, at most MAX_DIGITS of them: `int(text)` cannot fail."""
    return 0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()
