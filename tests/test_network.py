"""Network levels: validation, domains of labelled and unlabelled nodes, the per-level index."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.network.levels import (
    CLUSTER,
    DEFAULT_LEVELS,
    HOSTNAME,
    LEAF,
    SPINE,
    ZONE,
    LevelError,
    NetworkIndex,
    domain_of,
    is_label_key,
    short_name,
    validate_levels,
)


def test_default_levels_are_smallest_first() -> None:
    assert DEFAULT_LEVELS == (
        "kubernetes.io/hostname",
        "network.topology.nvidia.com/accelerator",
        "network.topology.nvidia.com/leaf",
        "network.topology.nvidia.com/spine",
        "network.topology.nvidia.com/core",
        "topology.kubernetes.io/zone",
    )
    assert validate_levels(list(DEFAULT_LEVELS)) == DEFAULT_LEVELS


@pytest.mark.parametrize(
    "key",
    ["kubernetes.io/hostname", "rack", "example.com/Rack_1.a", "a" * 63, f"{'b' * 63}.io/x"],
)
def test_valid_label_keys(key: str) -> None:
    assert is_label_key(key)


@pytest.mark.parametrize(
    "key",
    ["", "*", "a/b/c", "/leaf", "Example.com/leaf", "leaf-", "-leaf", "a" * 64, "x.io/", 5, None],
)
def test_invalid_label_keys(key: object) -> None:
    assert not is_label_key(key)


@pytest.mark.parametrize(
    ("levels", "message"),
    [
        ("kubernetes.io/hostname", "must be a list"),
        ([], "at least one level"),
        ([HOSTNAME, "not a key"], r"levels\[1\]: 'not a key' is not a valid node-label key"),
        ([HOSTNAME, LEAF, HOSTNAME], r"levels\[2\]: 'kubernetes.io/hostname' is listed twice"),
        ([CLUSTER], "not a valid node-label key"),
        (None, "must be a list"),
    ],
)
def test_bad_level_lists(levels: object, message: str) -> None:
    with pytest.raises(LevelError, match=message):
        validate_levels(levels)


def test_domain_of() -> None:
    labels = {LEAF: "leaf-1", HOSTNAME: "other-name", SPINE: ""}
    assert domain_of("a1", labels, LEAF) == "leaf-1"
    assert domain_of("a1", labels, HOSTNAME) == "a1"  # the node name, whatever the label says
    assert domain_of("a1", labels, SPINE) == "node/a1"  # empty value: own domain
    assert domain_of("a1", labels, ZONE) == "node/a1"  # missing: own domain
    assert domain_of("a1", labels, CLUSTER) == CLUSTER


def test_unlabelled_node_never_joins_a_domain_named_like_it() -> None:
    idx = NetworkIndex.build(
        [("leaf-1", {}), ("b", {LEAF: "leaf-1"}), ("c", {LEAF: "leaf-1"})], (HOSTNAME, LEAF)
    )
    assert idx.domain("leaf-1", LEAF) != idx.domain("b", LEAF)
    assert idx.domain("b", LEAF) == idx.domain("c", LEAF) == "leaf-1"


def test_short_names() -> None:
    assert [short_name(lv) for lv in (HOSTNAME, LEAF, ZONE, CLUSTER)] == ["node", "leaf", "zone", "cluster"]


def test_index_groups_and_sums_per_domain() -> None:
    nodes = [("c", {LEAF: "l2"}), ("a", {LEAF: "l1"}), ("b", {LEAF: "l1"}), ("d", {})]
    idx = NetworkIndex.build(nodes, (HOSTNAME, LEAF))
    assert idx.nodes == ("a", "b", "c", "d")
    lx = idx.level(LEAF)
    assert lx.names == ("l1", "l2", "node/d")
    assert [m.tolist() for m in lx.members] == [[0, 1], [2], [3]]
    free = np.array([8, 4, 2, 1])
    assert idx.free_per_domain(LEAF, free).tolist() == [12, 2, 1]
    assert idx.free_per_domain(HOSTNAME, free).tolist() == [8, 4, 2, 1]
    assert idx.free_per_domain(CLUSTER, free).tolist() == [15]
    with pytest.raises(LevelError, match="not one of the network levels"):
        idx.level(SPINE)
    with pytest.raises(ValueError, match="listed twice"):
        NetworkIndex.build([("a", {}), ("a", {})], (HOSTNAME,))


names = st.text(alphabet="abc", min_size=1, max_size=3)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        names,
        st.fixed_dictionaries(
            {}, optional={LEAF: st.sampled_from(["x", "y", "a"]), SPINE: st.sampled_from(["s", "t"])}
        ),
    )
)
def test_index_agrees_with_domain_of(nodes: dict[str, dict[str, str]]) -> None:
    levels = (HOSTNAME, LEAF, SPINE)
    idx = NetworkIndex.build(nodes.items(), levels)
    for level in (*levels, CLUSTER):
        lx = idx.level(level)
        assert list(lx.names) == sorted({domain_of(n, lb, level) for n, lb in nodes.items()})
        for name, labels in nodes.items():
            assert idx.domain(name, level) == domain_of(name, labels, level)
        # members of each domain are exactly the nodes with that domain, in name order
        for d, members in enumerate(lx.members):
            assert [idx.nodes[p] for p in members] == sorted(
                n for n, lb in nodes.items() if domain_of(n, lb, level) == lx.names[d]
            )
