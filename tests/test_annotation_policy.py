"""The annotation's optional `policy` field: which in-node policy the node's plugin runs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.network.annotation import AnnotationError, decode, encode, make
from gputopo.node.policy import POLICY_NAMES
from gputopo.node.topofile import load_preset

NOW = 1_800_000_000.0
TOPO = load_preset("dgx1-v100")


def text(policy: str = "gputopo") -> str:
    return encode(make("n1", TOPO, generated_at=NOW, plugin_version="0.1.0", policy=policy))


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_policy_round_trips(policy: str) -> None:
    assert decode(text(policy), now=NOW, max_age_s=60).policy == policy


def test_default_policy_is_not_written_and_absent_means_gputopo() -> None:
    doc = json.loads(text())
    assert "policy" not in doc  # a gputopo node's annotation is what older sidecars read
    assert decode(text(), now=NOW, max_age_s=60).policy == "gputopo"
    assert json.loads(text("best-combo"))["policy"] == "best-combo"


@settings(max_examples=60, deadline=None)
@given(
    value=st.one_of(st.text(max_size=300), st.integers(), st.none(), st.lists(st.integers()), st.booleans())
)
def test_an_unknown_policy_is_an_annotation_error_never_a_crash(value: object) -> None:
    doc = json.loads(text())
    doc["policy"] = value
    if value in POLICY_NAMES:
        assert decode(json.dumps(doc), now=NOW, max_age_s=60).policy == value
        return
    with pytest.raises(AnnotationError, match="policy") as e:
        decode(json.dumps(doc), now=NOW, max_age_s=60)
    assert "known: gputopo" in str(e.value) and len(str(e.value)) < 300
