"""The RBAC of the gang and Topology APIs is the core's table of gang sources, in both installs.

`gputopo.gang.sources.APIS` lists every API the sidecar reads beside Nodes and Pods (each gang
source's group object, Kueue's and KAI's Topology). The sidecar's ClusterRole, as deploy/
(`kubectl kustomize`) and the chart (Helm's own engine) install it, must allow get/list/watch on
each, and must name no gang or Topology resource the table does not have (a source removed or
renamed leaves no stale grant). `kubectl gputopo why` reads the same objects, and its docs say so.
"""

from __future__ import annotations

from typing import Any

import pytest

from gputopo.gang import sources as gangsources
from tests.manifests import ROOT, kustomize, render_chart

READ = ("get", "list", "watch")
#: The resources only gang and Topology APIs serve here: a grant on one must be in the table.
GANG_RESOURCES = {api.plural for api in gangsources.APIS}


def extender_rules(docs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """The rules of the ClusterRole that lets its subject bind pods: the sidecar's (the
    names of roles and accounts are the installer's, so the role is found by what it does)."""
    roles = [
        d
        for d in docs
        if d["kind"] == "ClusterRole"
        and any("pods/binding" in r.get("resources", []) for r in d.get("rules", []))
    ]
    assert len(roles) == 1, [d["metadata"]["name"] for d in roles]
    return list(roles[0]["rules"])


def allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def check(rules: list[dict[str, Any]]) -> None:
    for api in gangsources.APIS:
        for verb in READ:
            assert allows(rules, api.group, api.plural, verb), f"{verb} {api.plural}.{api.group}"
    known = {(api.group, api.plural) for api in gangsources.APIS}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in set(rule["resources"]) & GANG_RESOURCES:
                assert (group, resource) in known, f"stale grant: {resource}.{group} is no gang source's API"
        if set(rule["resources"]) & GANG_RESOURCES:
            assert set(rule["verbs"]) <= set(READ), f"the sidecar only reads gang objects: {rule}"


def test_the_table_lists_each_api_once_and_every_source_with_an_object_has_a_parser() -> None:
    assert len({(a.group, a.plural) for a in gangsources.APIS}) == len(gangsources.APIS)
    assert len({a.reflector for a in gangsources.APIS}) == len(gangsources.APIS)
    for source in gangsources.SOURCES:
        assert (source.api is None) == (source.parse is None), source.name


def test_deploy_rbac_reads_every_api_of_the_table_and_no_other_gang_api() -> None:
    check(extender_rules(kustomize("")))


def test_chart_rbac_reads_every_api_of_the_table_and_no_other_gang_api() -> None:
    pytest.importorskip("helm_python", reason="helm-python-sdk is not installed (pip install .[dev])")
    check(extender_rules(render_chart({})))


def test_a_stale_or_missing_grant_is_caught() -> None:
    """The check above fails on a role missing a table API, or granting one the table lacks."""
    full = [{"apiGroups": [a.group], "resources": [a.plural], "verbs": list(READ)} for a in gangsources.APIS]
    check(full)
    with pytest.raises(AssertionError, match="list"):
        check(full[1:])
    with pytest.raises(AssertionError, match="stale grant"):
        check([*full, {"apiGroups": ["example.com"], "resources": ["podgroups"], "verbs": list(READ)}])


def test_kubectl_gputopo_docs_name_every_gang_object_it_reads() -> None:
    text = (ROOT / "docs" / "kubectl-gputopo.md").read_text()
    for source in gangsources.SOURCES:
        if source.api is not None:
            assert f"`{source.api.plural}.{source.api.group}`" in text, source.name
