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


#: Seconds per unit of a written duration (Go's time.ParseDuration units that matter here).
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}
#: Longest duration text accepted ("12h30m15.5s" is 11 characters).
MAX_DURATION_CHARS = 32


def duration_s(text: str, *, max_s: float) -> float | None:
    """Seconds of a duration as Kubernetes objects write them ("300s", "5m", "1h30m", "1.5h";
    Go's time.ParseDuration with the units h, m, s), or bare ASCII digits as seconds; None for
    anything else, a sign, an empty or over-long text, or a value over `max_s`. Total: every
    string gets a number or None, never an exception."""
    if not (0 < len(text) <= MAX_DURATION_CHARS and text.isascii()):
        return None
    plain = ascii_uint(text)
    if plain is not None:
        return float(plain) if plain <= max_s else None
    total, i, n = 0.0, 0, len(text)
    while i < n:
        j = i
        while j < n and (text[j].isdigit() or text[j] == "."):
            j += 1
        number, unit = text[i:j], text[j : j + 1]
        whole, _, frac = number.partition(".")
        if unit not in _UNITS or not (whole or frac) or "." in frac:
            return None
        if (whole and ascii_uint(whole) is None) or (frac and ascii_uint(frac) is None):
            return None
        total += float(number if whole else "0" + number) * _UNITS[unit]
        i = j + 1
    return total if total <= max_s else None
