"""The output conventions every command shares (gputopo.output)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputopo.output import ago, short_age, table


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.2, "just now"),
        (42, "42 s ago"),
        (180, "3 min ago"),
        (5 * 3600, "5 h ago"),
        (3 * 86400, "3 d ago"),
        (-12, "in 12 s"),
        (None, "never"),
        (math.nan, "never"),
        (math.inf, "never"),
    ],
)
def test_ago_reads_as_a_person_says_it(seconds: float | None, text: str) -> None:
    assert ago(seconds) == text


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_ago_is_total(seconds: float) -> None:
    assert isinstance(ago(seconds), str) and "\n" not in ago(seconds)


@given(st.lists(st.lists(st.text(alphabet="ab c", max_size=8), min_size=3, max_size=3), max_size=6))
def test_table_aligns_every_column_but_the_last(rows: list[list[str]]) -> None:
    lines = table(["A", "B", "C"], rows)
    widths = [max(len(r[k]) for r in [["A", "B", "C"], *rows]) for k in range(2)]
    for line, r in zip(lines[1:], rows, strict=True):
        prefix = r[0].ljust(widths[0]) + "  " + r[1].ljust(widths[1]) + "  "
        assert line == (prefix + r[2]).rstrip()


def test_short_age_is_one_word_as_kubectl_prints_it() -> None:
    assert [short_age(s) for s in (42, 180, 5 * 3600, 3 * 86400, None, -5)] == [
        "42s",
        "3m",
        "5h",
        "3d",
        "-",
        "future",
    ]
