"""Numbers written by people and other programs: plain ASCII decimal numerals only.

`str.isdigit` is true for "²", which `int` refuses (a ValueError where a parser promised one
clean error), and `str.isdecimal` is true for "٣" and fullwidth "\uff13", which `int` silently
reads as 3. A GPU index, a NUMA node, a port or a Content-Length is none of those; and `int`
refuses numerals over 4,300 digits. Every parser in the project asks this one helper.
"""

from __future__ import annotations

#: Longest numeral accepted by default: every count here fits in 18 digits (< 2**63).
MAX_DIGITS = 18


def ascii_uint(text: str, *, max_digits: int = MAX_DIGITS) -> int | None:
    """The value of `text` when it is 1..max_digits ASCII digits (no sign, space or `_`), else None."""
    if 0 < len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None
