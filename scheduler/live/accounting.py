"""Which GPUs each pod really holds: ended pods and predicted-vs-actual binds (live mode).

The plugin's annotation carries a pod -> GPUs map (docs/annotation.md, `pods`). With it the
sidecar does two things without waiting for the plugin:

* **Freed GPUs.** When the pod watch shows a pod end (phase Succeeded/Failed, or deleted), the
  GPUs the annotation lists for it count as free at once. The plugin only notices at its next
  PodResources read (up to its 30 s resync); the sidecar already watches pods, so it frees them
  within one watch event (docs/scheduler.md, "Freed GPUs").
* **Predictions.** At bind the sidecar predicts the GPUs the node will give — what the plugin
  picks from everything kubelet offers it, reserved GPUs included (views.offered) — and records
  them as an Event on the pod (reason `GPUsPredicted`). Once an annotation written after the
  bind lists the pod, the actual set replaces the prediction (the annotation is the truth), a
  mismatch is logged and counted, and the views layer breaks any reservation the actual GPUs
  now overlap.

Not thread-safe: KubeState calls it under its lock. Bookkeeping only; the one I/O is
`record_prediction`, which KubeState calls outside its lock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gputopo import jsonlog
from gputopo_kube.events import api_message
from scheduler.model import NodeInfo, PodInfo
from scheduler.report.metrics import Metrics

log = logging.getLogger("gputopo.scheduler.accounting")

#: The Event reason of a prediction recorded at bind (`kubectl describe pod` shows it).
PREDICTED_REASON = "GPUsPredicted"
#: An ended pod is remembered this long at most (the plugin re-reads PodResources every 30 s,
#: after which its annotation no longer lists the pod and the record is dropped anyway).
ENDED_TTL_S = 600.0
#: Bounds of the tables (a pathological churn of pods must not grow memory without limit).
MAX_ENDED = 100_000
MAX_PREDICTIONS = 100_000
MAX_RESULTS = 10_000


@dataclass(frozen=True)
class Prediction:
    node: str
    gpus: tuple[int, ...]
    at: float  # when it was made (or learned from the pod annotation)


@dataclass(frozen=True)
class Outcome:
    """A bind whose prediction met the node's report."""

    pod: str
    node: str
    predicted: tuple[int, ...]
    actual: tuple[int, ...]

    @property
    def matched(self) -> bool:
        return set(self.predicted) == set(self.actual)


class PodAccounting:
    def __init__(self, metrics: Metrics | None = None) -> None:
        self.metrics = metrics
        self._ended: dict[str, tuple[str, float]] = {}  # pod -> (node, when it ended)
        self._predicted: dict[str, Prediction] = {}
        self._outcomes: dict[str, Outcome] = {}
        self.version = 0  # bumped whenever the ended set changes

    # ------------------------------------------------------------------ ended pods

    def ended(self, pod: str, node: str, now: float) -> None:
        """The watch showed `pod`, bound to `node`, finished or deleted."""
        if not node:
            return
        if len(self._ended) >= MAX_ENDED:
            self._ended.clear()  # forget: GPUs then wait for the plugin's own resync, as before
        self._ended[pod] = (node, now)
        self._predicted.pop(pod, None)
        self.version += 1

    def active(self, pod: str) -> None:
        """An active pod of this name exists (again): its GPUs are in use."""
        if self._ended.pop(pod, None) is not None:
            self.version += 1

    def prune(self, nodes: dict[str, NodeInfo], now: float) -> None:
        """Forget ended pods the plugin has caught up with (its map no longer lists them) or
        that are older than ENDED_TTL_S."""
        gone = []
        for pod, (node, at) in self._ended.items():
            info = nodes.get(node)
            topo = info.topology if info is not None else None
            caught_up = topo is not None and topo.pods is not None and pod not in topo.pods
            if now - at > ENDED_TTL_S or info is None or caught_up:
                gone.append(pod)
        for pod in gone:
            del self._ended[pod]
        if gone:
            self.version += 1

    def ended_by_node(self) -> dict[str, frozenset[str]]:
        out: dict[str, set[str]] = {}
        for pod, (node, _) in self._ended.items():
            out.setdefault(node, set()).add(pod)
        return {n: frozenset(p) for n, p in out.items()}

    def observe_pod(
        self, parsed: PodInfo | None, relevant: PodInfo | None, old: PodInfo | None, now: float
    ) -> None:
        """One pod event: `parsed` is the pod now (None when deleted or unreadable), `relevant`
        the same when it is active and holds GPUs or is in a gang, `old` what was known before."""
        key = parsed.key if parsed is not None else (old.key if old is not None else "")
        if not key:
            return
        if relevant is not None:
            self.active(key)
        elif old is not None and old.node and old.gpus:
            self.ended(key, old.node, now)
        elif parsed is not None and parsed.node and parsed.gpus and not parsed.active:
            self.ended(key, parsed.node, now)

    # ------------------------------------------------------------------ predictions

    def predict(self, pod: str, node: str, gpus: tuple[int, ...], at: float) -> None:
        if not gpus:
            return
        if len(self._predicted) >= MAX_PREDICTIONS:
            self._predicted.clear()
        self._predicted[pod] = Prediction(node, tuple(sorted(gpus)), at)

    def check_node(self, info: NodeInfo) -> list[Outcome]:
        """Compare every prediction on this node that its (new) annotation now answers."""
        topo = info.topology
        if topo is None or topo.pods is None:
            return []
        out = []
        for pod, pred in list(self._predicted.items()):
            if pred.node == info.name and pod in topo.pods and topo.generated_at >= pred.at:
                out.append(self._settle(pod, pred, tuple(sorted(topo.pods[pod]))))
        return out

    def _settle(self, pod: str, pred: Prediction, actual: tuple[int, ...]) -> Outcome:
        del self._predicted[pod]
        outcome = Outcome(pod, pred.node, pred.gpus, actual)
        if len(self._outcomes) >= MAX_RESULTS:
            self._outcomes.pop(next(iter(self._outcomes)))
        self._outcomes[pod] = outcome
        result = "matched" if outcome.matched else "mismatched"
        if self.metrics is not None:
            self.metrics.predictions.labels(result=result).inc()
        jsonlog.event(
            log,
            "prediction_" + result,
            logging.INFO if outcome.matched else logging.WARNING,
            pod=pod,
            node=pred.node,
            predicted=list(pred.gpus),
            actual=list(actual),
            reason="the node's plugin reported the GPUs kubelet gave the pod; they replace the prediction"
            + ("" if outcome.matched else " (reservations they overlap are broken)"),
        )
        return outcome

    def outcomes(self) -> dict[str, Outcome]:
        """Settled predictions, newest last (bounded): for tests and operators."""
        return dict(self._outcomes)


def record_prediction(writer: Any, pod: PodInfo, node: str, gpus: tuple[int, ...]) -> None:
    """Record the GPUs the sidecar expects as an Event on the pod, before the Binding, so an
    operator (`kubectl describe pod`, `kubectl gputopo why`) and a test can compare them with
    what the node gave. An Event, not a pod annotation: creating Events is the one write this
    needs, where patching pods would let the sidecar rewrite any pod. Best effort: bounded by
    the writer's timeout (a `gputopo_kube.events.EventWriter`), a failure is logged, never
    fatal to the bind."""
    regarding = {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": pod.namespace,
        "name": pod.name,
        "uid": pod.uid,
    }
    note = f"gputopo predicts GPUs {','.join(str(g) for g in sorted(gpus))} on node {node}"
    try:
        writer.create(regarding, PREDICTED_REASON, note, action="Binding")
    except Exception as e:
        jsonlog.event(
            log,
            "prediction_not_recorded",
            logging.WARNING,
            pod=pod.key,
            node=node,
            gpus=list(gpus),
            status=getattr(e, "status", None),
            reason=api_message(e)[:300],
            effect="the bind goes on; the prediction is still compared in memory",
        )
