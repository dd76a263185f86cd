"""Declared profiles: a pod or its gang's group object says what it trains
(`gputopo.io/profile`, or gradient bytes and compute seconds per step), and the objective weighs
its placements by that profile instead of the workload mix, for single pods and gangs alike.

Over real HTTP (file mode and the API stand-in), and in the simulator (`--declared-share`)."""

from __future__ import annotations

import logging

import pytest

from gputopo.jobtime.profiles import (
    COMPUTE_S_ANNOTATION,
    GRAD_BYTES_ANNOTATION,
    OVERLAP_ANNOTATION,
    PROFILE_ANNOTATION,
    PROFILES,
    TRANSFORMER_OVERLAP,
    ProfileError,
    declared_profile,
)
from gputopo.network.cluster import parse_cluster
from gputopo.sim.cli import UsageError
from gputopo.sim.jobmodel import JobModel
from scheduler.picture.feed import from_cluster
from tests import fake_apiserver as fk
from tests.test_scheduler_http import args, serve  # noqa: F401  (the fixture)
from tests.test_scheduler_interop import OLD_LEAF, gang_pods, live_with, two_domains  # noqa: F401


def test_a_named_profile_or_numbers_are_read_and_anything_else_is_refused() -> None:
    assert declared_profile({}) is None
    assert declared_profile({"other": "x"}) is None
    assert declared_profile({PROFILE_ANNOTATION: " LLM "}) == PROFILES["llm"]
    got = declared_profile({GRAD_BYTES_ANNOTATION: "4e9", COMPUTE_S_ANNOTATION: "0.25"})
    assert got is not None and (got.grad_bytes, got.compute_s, got.overlap) == (
        4e9,
        0.25,
        TRANSFORMER_OVERLAP,
    )
    got = declared_profile(
        {GRAD_BYTES_ANNOTATION: "1e8", COMPUTE_S_ANNOTATION: "0.1", OVERLAP_ANNOTATION: "0.6"}
    )
    assert got is not None and got.overlap == 0.6
    # a name wins over numbers beside it
    assert declared_profile({PROFILE_ANNOTATION: "cnn", GRAD_BYTES_ANNOTATION: "oops"}) == PROFILES["cnn"]
    bad = [
        ({PROFILE_ANNOTATION: "gpt-5"}, PROFILE_ANNOTATION),
        ({PROFILE_ANNOTATION: "x" * 5000}, PROFILE_ANNOTATION),
        ({GRAD_BYTES_ANNOTATION: "1e9"}, COMPUTE_S_ANNOTATION),
        ({COMPUTE_S_ANNOTATION: "0.1", OVERLAP_ANNOTATION: "0.5"}, GRAD_BYTES_ANNOTATION),
        ({GRAD_BYTES_ANNOTATION: "nan", COMPUTE_S_ANNOTATION: "0.1"}, GRAD_BYTES_ANNOTATION),
        ({GRAD_BYTES_ANNOTATION: "1e9", COMPUTE_S_ANNOTATION: "inf"}, COMPUTE_S_ANNOTATION),
        ({GRAD_BYTES_ANNOTATION: "-1", COMPUTE_S_ANNOTATION: "0.1"}, "gradient bytes"),
        ({GRAD_BYTES_ANNOTATION: "1e9", COMPUTE_S_ANNOTATION: "0.1", OVERLAP_ANNOTATION: "1.5"}, "overlap"),
        ({GRAD_BYTES_ANNOTATION: "9" * 400, COMPUTE_S_ANNOTATION: "0.1"}, GRAD_BYTES_ANNOTATION),
    ]
    for given, named in bad:
        with pytest.raises(ProfileError, match=named):
            declared_profile(given)


def mixed_state():
    """One empty PCIe box and one empty HGX H100, in one leaf."""
    nodes = [
        {"name": "pcie", "labels": {OLD_LEAF: "l1"}, "gpus": "pcie8-plx"},
        {"name": "hgx", "labels": {OLD_LEAF: "l1"}, "gpus": "hgx-h100"},
    ]
    return from_cluster(parse_cluster({"nodes": nodes}))


def scores(client, annotations: dict[str, str]) -> dict[str, int]:
    status, out = client.post(
        "/prioritize", args(fk.pod("ml", "p", 8, annotations=annotations), ["pcie", "hgx"])
    )
    assert status == 200, out
    return {h["Host"]: h["Score"] for h in out}


def test_a_single_pod_is_scored_by_the_profile_it_declares(serve) -> None:  # noqa: F811
    """A CNN hides its all-reduce behind its backward pass even on PCIe: both servers are good
    enough for it, and the PCIe box costs the jobs after it less. An LLM (and the mix, a fifth
    of which are LLMs) needs the NVSwitch server."""
    client, _ = serve(mixed_state())
    cnn = scores(client, {PROFILE_ANNOTATION: "cnn"})
    assert cnn["pcie"] > cnn["hgx"]
    llm = scores(client, {PROFILE_ANNOTATION: "llm"})
    assert llm["hgx"] > llm["pcie"]
    mix = scores(client, {})
    assert mix["hgx"] > mix["pcie"]
    numbers = scores(
        client, {GRAD_BYTES_ANNOTATION: "1e8", COMPUTE_S_ANNOTATION: "0.5", OVERLAP_ANNOTATION: "0.9"}
    )
    assert numbers == cnn


def test_a_bad_declaration_is_a_400_naming_the_annotation(serve) -> None:  # noqa: F811
    client, _ = serve(mixed_state())
    for path in ("/filter", "/prioritize"):
        pod = fk.pod("ml", "p", 8, annotations={PROFILE_ANNOTATION: "resnet"})
        status, out = client.post(path, args(pod, ["pcie", "hgx"]))
        assert status == 400
        assert PROFILE_ANNOTATION in out["Error"] and "resnet" in out["Error"]


def test_a_gang_reads_its_group_objects_declaration_and_its_pods_own_one_wins(live_with, caplog) -> None:  # noqa: F811
    pg = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "namespace": "ml",
            "name": "vc",
            "uid": "vc-uid",
            "annotations": {PROFILE_ANNOTATION: "cnn"},
        },
        "spec": {"minMember": 2, "queue": "default"},
    }
    bad = {
        **pg,
        "metadata": {
            "namespace": "ml",
            "name": "vb",
            "uid": "vb-uid",
            "annotations": {PROFILE_ANNOTATION: "??"},
        },
    }
    group = {"scheduling.k8s.io/group-name": "vc"}
    pods = gang_pods(2, annotations=group)
    own = gang_pods(1, annotations={**group, PROFILE_ANNOTATION: "llm"}, name="own")
    other = gang_pods(1, annotations={"scheduling.k8s.io/group-name": "vb"}, name="other")
    with caplog.at_level(logging.WARNING, logger="gputopo.scheduler.kube"):
        live = live_with(
            nodes=two_domains(OLD_LEAF),
            objects=[("volcano-podgroups", pg), ("volcano-podgroups", bad)],
            pods=pods + own + other,
        )
        snap = live.state.snapshot()
    assert snap.pods["ml/w-0"].profile == PROFILES["cnn"]
    assert snap.pods["ml/own-0"].profile == PROFILES["llm"]
    # an unusable declaration costs its object the declaration, never its gang
    assert snap.pods["ml/other-0"].profile is None and snap.pods["ml/other-0"].gang.min_member == 2
    assert any("group_profile_ignored" in r.getMessage() for r in caplog.records)


def test_the_simulator_declares_a_stable_growing_share_of_jobs() -> None:
    half, every = JobModel(seed=3, declared_share=0.5), JobModel(seed=3, declared_share=1.0)
    none = JobModel(seed=3)
    ids = range(4000)
    halves = {i for i in ids if half.declared(i) is not None}
    assert 1800 < len(halves) < 2200
    assert all(every.declared(i) is not None for i in ids) and all(none.declared(i) is None for i in ids)
    for i in halves:  # a job that declares, declares the profile it runs
        assert half.declared(i) == every.declared(i)
    llm = JobModel(mix="llm", declared_share=1.0)
    assert {llm.declared(i) for i in range(50)} == {PROFILES["llm"]}
    with pytest.raises(ValueError, match="declared share"):
        JobModel(declared_share=1.5)


@pytest.mark.parametrize("share", ["-0.1", "1.5", "nan"])
def test_a_bad_declared_share_is_a_usage_error(share: str) -> None:
    import argparse

    from gputopo.sim.cli import add_arguments, prepare

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(UsageError, match="--declared-share"):
        prepare(parser.parse_args(["--pods", "50", "--declared-share", share]))
