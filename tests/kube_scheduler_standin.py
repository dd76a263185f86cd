"""A kube-scheduler stand-in: one pod at a time, filter -> prioritize -> pick -> bind, over HTTP.

It behaves as kube-scheduler does towards an extender: ExtenderArgs with NodeNames (or a full
NodeList), a single surviving node skips scoring, the highest score wins (name order among
equals, where kube-scheduler would pick at random), a pod that fails filter or bind goes back
to the queue and is retried later. Between rounds it advances the injected clock, so the
extender's back-offs and reservation lifetimes play out as they would in time.

Like kube-scheduler, it sends the extender only the nodes its own filters passed: nodes in
`unschedulable` (cordoned, or tainted without a toleration, or NotReady: kube-scheduler's
NodeUnschedulable/TaintToleration filters) and nodes whose labels (`node_labels`) fail the pod's
`spec.nodeSelector` (NodeAffinity) are never offered. A pod no node passes is not sent at all.
"""

from __future__ import annotations

import http.client
import json
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Outcome:
    bound: dict[str, str] = field(default_factory=dict)  # pod key -> node
    pending: dict[str, str] = field(default_factory=dict)  # pod key -> last reason
    bind_errors: list[str] = field(default_factory=list)
    calls: int = 0


class StandIn:
    def __init__(
        self,
        host: str,
        port: int,
        node_names: Sequence[str],
        *,
        cache_mode: bool = True,
        before_filter: Callable[[dict[str, Any]], None] | None = None,
        after_filter: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
        node_labels: Mapping[str, Mapping[str, str]] | None = None,
        unschedulable: Iterable[str] = (),
    ) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=30)
        self.node_names = list(node_names)
        self.cache_mode = cache_mode
        self.before_filter = before_filter
        self.after_filter = after_filter
        self.node_labels = dict(node_labels or {})
        self.unschedulable = set(unschedulable)

    def feasible(self, pod: dict[str, Any]) -> list[str]:
        """The nodes kube-scheduler's own filters pass for this pod (before the extender)."""
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        return [
            n
            for n in self.node_names
            if n not in self.unschedulable
            and all(self.node_labels.get(n, {}).get(k) == v for k, v in selector.items())
        ]

    def close(self) -> None:
        self.conn.close()

    def _post(self, path: str, doc: Any) -> tuple[int, Any]:
        self.conn.request("POST", path, body=json.dumps(doc), headers={"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        return resp.status, json.loads(resp.read())

    def _args(self, pod: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
        if self.cache_mode:
            return {"Pod": pod, "Nodes": None, "NodeNames": list(names)}
        items = [{"metadata": {"name": n}} for n in names]
        return {"Pod": pod, "Nodes": {"items": items}, "NodeNames": None}

    def schedule_one(self, pod: dict[str, Any], out: Outcome) -> str | None:
        """One scheduling cycle for one pod; the node it was bound to, or None."""
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        if self.before_filter:
            self.before_filter(pod)
        offered = self.feasible(pod)
        if not offered:
            out.pending[key] = f"0/{len(self.node_names)} nodes are available"
            return None
        status, res = self._post("/filter", self._args(pod, offered))
        out.calls += 1
        if self.after_filter:
            self.after_filter(pod, res)
        if status != 200 or res.get("Error"):
            out.pending[key] = f"filter error: {res.get('Error')}"
            return None
        names = (
            res["NodeNames"] if self.cache_mode else [i["metadata"]["name"] for i in res["Nodes"]["items"]]
        )
        if not names:
            reasons = {**res.get("FailedNodes", {}), **res.get("FailedAndUnresolvableNodes", {})}
            out.pending[key] = next(iter(sorted(set(reasons.values()))), "no nodes")
            return None
        if len(names) == 1:
            best = names[0]  # a single feasible node skips scoring
        else:
            status, scores = self._post("/prioritize", self._args(pod, names))
            out.calls += 1
            ranked = sorted((-h["Score"], h["Host"]) for h in scores) if status == 200 else []
            best = ranked[0][1] if ranked else sorted(names)[0]
        doc = {
            "PodName": pod["metadata"]["name"],
            "PodNamespace": pod["metadata"]["namespace"],
            "PodUID": pod["metadata"].get("uid", ""),
            "Node": best,
        }
        status, res = self._post("/bind", doc)
        out.calls += 1
        if status != 200 or res.get("Error"):
            out.bind_errors.append(f"{key}: {res.get('Error')}")
            out.pending[key] = f"bind error: {res.get('Error')}"
            return None
        pod["spec"]["nodeName"] = best
        out.pending.pop(key, None)
        out.bound[key] = best
        return best

    def run(
        self,
        pods: Sequence[dict[str, Any]],
        *,
        clock: list[float] | None = None,
        tick_s: float = 1.0,
        idle_rounds: int = 5,
    ) -> Outcome:
        """Schedule until every pod is bound or `idle_rounds` rounds in a row bind nothing."""
        out = Outcome()
        queue = deque(pods)
        idle = 0
        while queue and idle < idle_rounds:
            progress = False
            for _ in range(len(queue)):
                pod = queue.popleft()
                if self.schedule_one(pod, out) is None:
                    queue.append(pod)
                else:
                    progress = True
            idle = 0 if progress else idle + 1
            if clock is not None:
                clock[0] += tick_s
        return out
