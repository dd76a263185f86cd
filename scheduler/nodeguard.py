"""One bad node costs one node: the guard every per-node step of the sidecar runs under.

Each node's annotation is written by another machine, so decoding it, building its allocator
and its free-GPU view are all steps that may meet something nobody foresaw. A failing step must
turn that node into "unknown topology" (GPUs counted from the Node's allocatable, neutral score)
and leave every other node, every answer and the watch untouched. The guard keeps the promise
observable: the refusal is logged once per node and reason (not at every watch event or
heartbeat) and counted per step in `gputopo_node_topology_rejected_total`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gputopo import jsonlog
from scheduler.report.metrics import Metrics

log = logging.getLogger("gputopo.scheduler.nodes")

#: Reasons remembered at most (a cluster of 5,000 nodes each failing differently fits).
MAX_REMEMBERED = 100_000
#: The codec's reason for a node with no annotation: the plugin's business (it says on the Node
#: why it cannot publish), so no Event of the sidecar's.
MISSING = "annotation missing"
#: A reason is cut to this length: it may quote a value from the annotation.
MAX_REASON_CHARS = 300


def describe(error: BaseException) -> str:
    """A short, single-line reason for an unexpected exception."""
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


class NodeGuard:
    """Logs and counts per-node refusals, each (node, step, reason) once. Thread-safe."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self.metrics = metrics
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], str] = {}
        #: Called (node, stage, reason) on each new refusal and (node, stage, None) when a refused
        #: step succeeds again: the sidecar's Node Events (scheduler/report/events.py). Must not block.
        self.notify: Callable[[str, str, str | None], None] | None = None

    def rejected(
        self, node: str, stage: str, reason: str, *, error: bool = False, quiet: bool = False
    ) -> None:
        """`node`'s step `stage` refused its topology for `reason`; `error` marks an unexpected
        exception (a bug or an input nobody foresaw) rather than a validation failure; `quiet`
        counts without logging, for refusals the extender already logs as `unknown_topology`."""
        reason = reason[:MAX_REASON_CHARS]
        with self._lock:
            if self._seen.get((node, stage)) == reason:
                return
            if len(self._seen) >= MAX_REMEMBERED:
                self._seen.clear()
            self._seen[(node, stage)] = reason
        if self.metrics is not None:
            self.metrics.node_rejections.labels(stage=stage).inc()
        if self.notify is not None and reason != MISSING:
            self.notify(node, stage, reason)
        if quiet:
            return
        jsonlog.event(
            log,
            "node_topology_failed" if error else "node_topology_rejected",
            logging.ERROR if error else logging.WARNING,
            node=node,
            stage=stage,
            reason=reason,
            effect="unknown topology: GPUs counted from allocatable, neutral score; other nodes unaffected",
        )

    def accepted(self, node: str, stage: str) -> None:
        """The step succeeded again: a later refusal with the same reason is news once more."""
        if (node, stage) in self._seen:
            with self._lock:
                reason = self._seen.pop((node, stage), None)
            if self.notify is not None and reason is not None and reason != MISSING:
                self.notify(node, stage, None)
