"""A ValidatingAdmissionPolicy evaluated as kube-apiserver evaluates it, with cel-python.

No API server runs here, so the policy's CEL is run by cel-python over admission requests built
like the API server builds them. What the evaluator follows (admissionregistration.k8s.io/v1):
- matchConstraints.resourceRules pick the request by group, version, resource[/subresource]
  and operation;
- every matchCondition must be true for the policy to apply (false: not matched, allowed);
- variables are bound in order, each may use earlier ones as `variables.<name>`; one that
  fails to evaluate is an error only where it is used (CEL's `||`/`&&` absorb errors the way
  cel-go does);
- every validation must be true; a false one denies with its message (messageExpression
  first); an error is handled by failurePolicy (Fail: denied);
- the binding's validationActions decide what a failure does (Deny refuses the request).
cel-python does not type-check against the Node schema as the API server does, and lacks CEL's
optional syntax (`.?field`, `[?key]`, `orValue`), which the policy therefore does not use.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest

celpy = pytest.importorskip("celpy", reason="cel-python is not installed (pip install .[dev])")
from celpy import celtypes  # noqa: E402
from celpy.evaluation import CELEvalError  # noqa: E402

Obj = dict[str, Any]


@dataclass(frozen=True)
class Decision:
    matched: bool  # did the policy apply to the request at all
    allowed: bool
    reasons: tuple[str, ...] = ()


@cache
def _program(expression: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression))


def _eval(expression: str, activation: dict[str, Any]) -> Any:
    """The expression's value, or a CELEvalError (raised or returned: cel-python does both)."""
    try:
        return _program(expression).evaluate(activation)
    except CELEvalError as e:
        return e


def _rule_matches(rule: Obj, request: Obj) -> bool:
    resource = request["resource"]
    full = resource["resource"] + (f"/{request['subResource']}" if request.get("subResource") else "")

    def has(values: list[str], value: str) -> bool:
        return "*" in values or value in values

    return (
        has(rule["apiGroups"], resource["group"])
        and has(rule["apiVersions"], resource["version"])
        and has(rule["operations"], request["operation"])
        and has(rule["resources"], full)
    )


def admission_request(
    operation: str,
    user: Obj,
    obj: Obj | None,
    old: Obj | None,
    subresource: str = "",
) -> Obj:
    """An AdmissionRequest for a Node, as the API server fills one in."""
    node = obj if obj is not None else old
    assert node is not None
    req: Obj = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Node"},
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "requestKind": {"group": "", "version": "v1", "kind": "Node"},
        "requestResource": {"group": "", "version": "v1", "resource": "nodes"},
        "name": node["metadata"]["name"],
        "operation": operation,
        "userInfo": user,
        "dryRun": False,
    }
    if subresource:
        req["subResource"] = subresource
    return req


def evaluate(policy: Obj, binding: Obj, request: Obj, obj: Obj | None, old: Obj | None) -> Decision:
    spec = policy["spec"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert "paramRef" not in binding["spec"] and "paramKind" not in spec, "the policy is paramless"
    if not any(_rule_matches(r, request) for r in spec["matchConstraints"]["resourceRules"]):
        return Decision(matched=False, allowed=True)
    fail_closed = spec.get("failurePolicy", "Fail") == "Fail"
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel(request),
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
        "params": None,
    }
    for cond in spec.get("matchConditions", []):
        value = _eval(cond["expression"], activation)
        if isinstance(value, CELEvalError):
            if fail_closed:
                return Decision(True, False, (f"matchCondition {cond['name']}: {value}",))
            return Decision(False, True)
        if value != celtypes.BoolType(True):
            return Decision(matched=False, allowed=True)
    variables: dict[Any, Any] = {}
    for var in spec.get("variables", []):
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(var["name"])] = _eval(var["expression"], activation)
    activation["variables"] = celtypes.MapType(variables)
    reasons: list[str] = []
    for v in spec["validations"]:
        value = _eval(v["expression"], activation)
        if isinstance(value, CELEvalError):
            if fail_closed:
                reasons.append(f"error: {value}")
            continue
        if value != celtypes.BoolType(True):
            message = v.get("message", f"failed expression: {v['expression']}")
            if "messageExpression" in v:
                m = _eval(v["messageExpression"], activation)
                if not isinstance(m, CELEvalError):
                    message = str(m)
            reasons.append(message)
    denied = bool(reasons) and "Deny" in binding["spec"]["validationActions"]
    return Decision(matched=True, allowed=not denied, reasons=tuple(reasons))
