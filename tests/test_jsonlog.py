"""The JSON log line format: every line must parse as strict JSON, whatever the fields hold."""

from __future__ import annotations

import io
import json
import logging

from gputopo import jsonlog


def _line(**fields: object) -> dict[str, object]:
    stream = io.StringIO()
    log = logging.getLogger("test-jsonlog")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(jsonlog.JsonFormatter())
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    try:
        jsonlog.event(log, "decision", **fields)
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    assert text.count("\n") == 1

    def strict(token: str) -> None:
        raise ValueError(f"not strict JSON: {token}")

    return json.loads(text, parse_constant=strict)


def test_fields_and_reserved_keys() -> None:
    doc = _line(size=2, chosen=[0, 3], event="clash", reason="best ring")
    assert doc["event"] == "decision" and doc["event_"] == "clash"
    assert doc["size"] == 2 and doc["chosen"] == [0, 3] and doc["reason"] == "best ring"


def test_non_finite_numbers_become_strings() -> None:
    """json.dumps writes NaN/Infinity, which jq and log shippers reject: the line was lost."""
    doc = _line(ratio=float("nan"), wait_s=float("inf"), nested={"x": [float("-inf"), 1.5]})
    assert doc["ratio"] == "nan" and doc["wait_s"] == "inf"
    assert doc["nested"] == {"x": ["-inf", 1.5]}
