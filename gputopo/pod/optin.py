"""Which pods the opt-in admission webhook hands to gputopo's scheduler, and the patch that does it.

Pure: a pod object (as JSON) in, a JSONPatch (RFC 6902) and a reason out. The sidecar's webhook
(`scheduler/web/webhook.py`) is the only caller; the chart's MutatingAdmissionPolicy says the same in
CEL for clusters that serve it. Which namespaces and pods are opted in is decided by the
webhook configuration's namespaceSelector / objectSelector before the API server calls; this
module decides only what is safe to change on a pod that reaches it:

  * only pods that ask for GPUs (a positive quantity of a GPU resource in the requests or limits
    of any container or init container) — a CPU pod in an opted-in namespace keeps the default
    scheduler, so gputopo's scheduler being down never stops it;
  * never a pod that names another scheduler (anything but empty or `default-scheduler`): the
    user chose that one on purpose (Volcano, KAI, a second kube-scheduler profile);
  * a pod already naming ours needs no patch.

The pod is untrusted input: any shape it comes in yields "no patch" with the reason, never an
exception.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: The scheduler name the API server defaults an unset `spec.schedulerName` to.
DEFAULT_SCHEDULER = "default-scheduler"
#: The GPU resource every pod is checked for, whatever else is configured.
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class Decision:
    """What to do with one pod: `patch` is empty when nothing changes; `reason` says why."""

    patch: tuple[Mapping[str, Any], ...]
    reason: str


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _positive(quantity: Any) -> bool:
    """Whether a resource quantity asks for something. GPUs are whole numbers ("1", 2); any other
    non-zero text ("1k", "0.5") counts as asking, so a malformed request still reaches the
    scheduler that can refuse it with a reason rather than slipping past it."""
    if isinstance(quantity, bool):
        return False
    if isinstance(quantity, (int, float)):
        return quantity > 0
    if isinstance(quantity, str):
        text = quantity.strip()
        return bool(text) and text.strip("0.+") != ""
    return False


def gpu_resources_asked(pod: Mapping[str, Any], resources: Iterable[str]) -> list[str]:
    """The GPU resources (of `resources`, plus nvidia.com/gpu) the pod's containers or init
    containers request or limit with a positive quantity, sorted; [] for none."""
    wanted = {GPU_RESOURCE, *resources}
    spec = _map(pod.get("spec"))
    found: set[str] = set()
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        for container in containers if isinstance(containers, list) else []:
            res = _map(_map(container).get("resources"))
            for part in ("requests", "limits"):
                for name, quantity in _map(res.get(part)).items():
                    if name in wanted and _positive(quantity):
                        found.add(name)
    return sorted(found)


def decide(pod: Any, *, scheduler_name: str, resources: Iterable[str] = ()) -> Decision:
    """The JSONPatch that sets `spec.schedulerName` to `scheduler_name` on a GPU pod, or no patch."""
    if not isinstance(pod, Mapping) or not isinstance(pod.get("spec"), Mapping):
        return Decision((), "not a pod object with a spec")
    current = pod["spec"].get("schedulerName")
    if current is not None and not isinstance(current, str):
        return Decision((), "spec.schedulerName is not a string")
    if current == scheduler_name:
        return Decision((), f"already names {scheduler_name}")
    if current not in (None, "", DEFAULT_SCHEDULER):
        return Decision((), f"names another scheduler ({current}): left as the user chose")
    asked = gpu_resources_asked(pod, resources)
    if not asked:
        return Decision((), "asks for no GPUs")
    op = {"op": "add", "path": "/spec/schedulerName", "value": scheduler_name}  # add replaces a member
    return Decision((op,), f"asks for {','.join(asked)}: schedulerName set to {scheduler_name}")
