"""A MutatingAdmissionPolicy applied as kube-apiserver applies it, with cel-python.

Companion of tests/admission.py (which evaluates ValidatingAdmissionPolicies), for the opt-in
policy that sets spec.schedulerName. What the evaluator follows
(admissionregistration.k8s.io/v1, also v1beta1/v1alpha1, which share these fields):
- matchConstraints.resourceRules pick the request (group, version, resource, operation);
- each binding applies the policy on its own, where its matchResources match: the
  namespaceSelector against the namespace's labels, the objectSelector against the object's
  labels (both must match; an absent selector matches everything);
- every matchCondition must be true (false: this binding does nothing); one that cannot be
  evaluated refuses the request under failurePolicy Fail and is skipped under Ignore;
- an ApplyConfiguration mutation's expression builds an object that is merged into the
  request's object (maps merged key by key, anything else replaced: what server-side apply's
  structured merge does for the scalar fields this policy sets).
cel-python cannot construct objects of the API server's types (`Object{...}`,
`Object.spec{...}`): the evaluator renames those type names to ones it declares as plain
maps before compiling; the expression is otherwise the shipped one.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

import pytest

from tests.admission import _eval, _rule_matches

celpy = pytest.importorskip("celpy", reason="cel-python is not installed (pip install .[dev])")
from celpy import celtypes  # noqa: E402
from celpy.evaluation import CELEvalError  # noqa: E402

Obj = dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    pod: Obj  # the pod as it would be stored
    refused: tuple[str, ...] = ()  # failurePolicy Fail on an error: the pod is not created
    applied: tuple[str, ...] = ()  # the bindings whose mutation ran


def selector_matches(selector: Obj | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector; None (absent) matches everything, as in matchResources."""
    if selector is None:
        return True
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def pod_create_request(pod: Obj, namespace: str) -> Obj:
    return {
        "uid": "4b0e2f9c-0d6a-4c8e-9b1e-2f3a4b5c6d7e",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": pod["metadata"].get("name", ""),
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:team-a:trainer", "groups": ["system:authenticated"]},
        "dryRun": False,
    }


_TYPE = re.compile(r"\bObject((?:\.[A-Za-z_][A-Za-z0-9_]*)*)\s*\{")


def _apply_configuration(expression: str, activation: dict[str, Any]) -> Any:
    names: set[str] = set()

    def rename(m: re.Match[str]) -> str:
        name = "Object__" + m.group(1).replace(".", "__")
        names.add(name)
        return name + "{"

    text = _TYPE.sub(rename, expression)
    env = celpy.Environment(annotations=dict.fromkeys(names, celtypes.MessageType))
    try:
        return env.program(env.compile(text)).evaluate(activation)
    except CELEvalError as e:
        return e


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.IntType):
        return int(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    return value


def _merge(into: Obj, patch: Obj) -> None:
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def admit(
    policy: Obj, bindings: list[Obj], pod: Obj, namespace: str, namespace_labels: dict[str, str]
) -> Outcome:
    """The pod after every binding of the policy has run on its CREATE."""
    spec = policy["spec"]
    request = pod_create_request(pod, namespace)
    if not any(_rule_matches(r, request) for r in spec["matchConstraints"]["resourceRules"]):
        return Outcome(pod)
    fail_closed = spec.get("failurePolicy", "Fail") == "Fail"
    current = copy.deepcopy(pod)
    refused: list[str] = []
    applied: list[str] = []
    for binding in bindings:
        assert binding["spec"]["policyName"] == policy["metadata"]["name"]
        match = binding["spec"].get("matchResources", {})
        if not selector_matches(match.get("namespaceSelector"), namespace_labels):
            continue
        if not selector_matches(match.get("objectSelector"), current["metadata"].get("labels", {})):
            continue
        activation: dict[str, Any] = {
            "request": celpy.json_to_cel(request),
            "object": celpy.json_to_cel(current),
            "oldObject": None,
            "params": None,
            "namespaceObject": celpy.json_to_cel(
                {"metadata": {"name": namespace, "labels": namespace_labels}}
            ),
        }
        matched = True
        for cond in spec.get("matchConditions", []):
            value = _eval(cond["expression"], activation)
            if isinstance(value, CELEvalError):
                if fail_closed:
                    refused.append(f"{cond['name']}: {value}")
                matched = False
                break
            if value != celtypes.BoolType(True):
                matched = False
                break
        if not matched:
            continue
        for mutation in spec["mutations"]:
            assert mutation["patchType"] == "ApplyConfiguration"
            result = _apply_configuration(mutation["applyConfiguration"]["expression"], activation)
            if isinstance(result, CELEvalError):
                if fail_closed:
                    refused.append(f"mutation: {result}")
                continue
            _merge(current, _plain(result))
            applied.append(binding["metadata"]["name"])
    return Outcome(current, tuple(refused), tuple(applied))


def conditions_hold(conditions: list[Obj], pod: Obj, namespace: str) -> bool:
    """A webhook's matchConditions on a pod's CREATE: the API server calls the webhook only
    when all hold."""
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel(pod_create_request(pod, namespace)),
        "object": celpy.json_to_cel(pod),
        "oldObject": None,
    }
    for cond in conditions:
        value = _eval(cond["expression"], activation)
        assert not isinstance(value, CELEvalError), f"{cond['name']}: {value}"
        if value != celtypes.BoolType(True):
            return False
    return True
