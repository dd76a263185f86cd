"""Output conventions every gputopo command shares, as kubectl's: `-o json|yaml|wide`, `--json`
as an alias of `-o json`, `--version`, and times a person reads ("3 min ago").

One module so `gputopo`, its node-side commands (`gputopo status`, from the plugin package) and
`kubectl gputopo` print the same way. Pure: it formats strings; callers print them and pass in
"now", so tests decide the clock.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import yaml

from gputopo import __version__

#: What `-o` takes; no `-o` means the table a person reads.
FORMATS = ("json", "yaml", "wide")


def add_output_arguments(parser: argparse._ActionsContainer, *, wide: bool = True) -> None:
    """`-o/--output`, `--json` (an alias of `-o json`) and `--version` on one (sub)command."""
    choices = FORMATS if wide else tuple(f for f in FORMATS if f != "wide")
    parser.add_argument(
        "-o",
        "--output",
        choices=choices,
        default=None,
        help="json or yaml for machines"
        + (", wide for more columns" if wide else "")
        + " (default: a table for people)",
    )
    parser.add_argument(
        "--json", dest="output", action="store_const", const="json", help="the same as -o json"
    )
    add_version_argument(parser)


def add_version_argument(parser: argparse._ActionsContainer) -> None:
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


def is_machine(fmt: str | None) -> bool:
    """True for the formats a program parses (json, yaml)."""
    return fmt in ("json", "yaml")


def dump(doc: Any, fmt: str) -> str:
    """`doc` as JSON (indented, key order kept) or YAML (block style, key order kept)."""
    if fmt == "yaml":
        return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True).rstrip("\n")
    return json.dumps(doc, indent=1)


def ago(seconds: float | None) -> str:
    """A duration in the past as a person says it: "just now", "42 s ago", "3 min ago", "5 h ago",
    "2 d ago"; "in 12 s" for a time in the future (clock skew), "never" for None or a non-number."""
    if seconds is None or not math.isfinite(seconds):
        return "never"
    if seconds < 0:
        return f"in {_span(-seconds)}"
    if seconds < 1:
        return "just now"
    return f"{_span(seconds)} ago"


def short_age(seconds: float | None) -> str:
    """An age as kubectl's AGE column prints it ("42s", "3m", "5h", "2d"; "-" when unknown), one
    word so tables stay easy to cut with awk."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 0:
        return "future"
    return _span(seconds).replace(" min", "m").replace(" ", "")


def _span(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def table(header: list[str], rows: list[list[str]], indent: str = "") -> list[str]:
    """Rows aligned on the widest cell of each column; the last column is never padded, so free
    text (a health reason) goes last and cannot push the others."""
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    out = []
    for r in [header, *rows]:
        cells = [c.ljust(widths[k]) for k, c in enumerate(r[:-1])] + [r[-1]]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def yes_no(value: object) -> str:
    return "yes" if value else "no"
