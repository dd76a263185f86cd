"""Keeps this node's ResourceSlices in step with the GPUs' health and use.

The content comes from `gputopo.node.draslices.build_slices` (pure); this module only decides when
to write and how. Which devices exist depends on the topology alone (a device that left the
slices while allocated would free its GPUs in kube-scheduler's counting); a new snapshot
(health changed) or a new in-use set (a claim was prepared or unprepared) changes the devices'
`healthy` attributes and their order, and the order is what kube-scheduler's first fit
follows, so the slices are rebuilt on every such change and written only when their content
differs from what the API server holds. Each write bumps the pool generation (the scheduler
then ignores the older slices) and replaces all slices of the pool — on a DGX-2, which
publishes every set, 236 of them — ; slices of ours that are no longer wanted (another
topology, other sizes) are deleted.

`sync(now)` makes one decision and says when it wants to run next, so tests can drive it; a
thread runs it, woken by `update()` / `set_in_use()`. API errors are logged and retried with
back-off; nothing here stops the daemon.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from deviceplugin.dra.kubeapi import DraApi
from deviceplugin.state import Snapshot
from gputopo import jsonlog
from gputopo.node import draslices
from gputopo.node.allocator import Allocator

log = logging.getLogger("deviceplugin.dra.slices")


class SlicePublisher:
    def __init__(
        self,
        node_name: str,
        api: DraApi,
        *,
        driver: str = draslices.DRIVER,
        sizes: Sequence[int] = draslices.DEFAULT_SIZES,
        max_sets: int = draslices.MAX_SETS_PER_SIZE,
        pcie_roots: Callable[[Snapshot], Mapping[int, str]] = lambda snap: {},
        min_interval_s: float = 0.2,
        resync_s: float = 60.0,
        backoff_s: tuple[float, float] = (0.5, 30.0),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node_name = node_name
        self.api = api
        self.driver = driver
        self.sizes = tuple(sizes)
        self.max_sets = max_sets
        self._pcie_roots = pcie_roots
        self.min_interval_s = min_interval_s
        self.resync_s = resync_s
        self.backoff_s = backoff_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._snapshot: Snapshot | None = None
        self._in_use: frozenset[int] = frozenset()
        self._alloc: Allocator | None = None
        self._published: list[dict[str, Any]] | None = None  # our last content (generation 0)
        self._generation = 0
        self._dirty = True
        self._last_write = -1e18
        self._last_sync = -1e18
        self._failures = 0
        self.writes = 0  # slices written (created or replaced) since start

    # ------------------------------------------------------------------ inputs

    def update(self, snapshot: Snapshot) -> None:
        """The daemon's snapshot listener: topology and health."""
        with self._lock:
            self._snapshot = snapshot
            self._dirty = True
        self._wake.set()

    def set_in_use(self, indices: Iterable[int]) -> None:
        """The GPUs prepared claims hold (the service calls this after every change)."""
        with self._lock:
            self._in_use = frozenset(indices)
            self._dirty = True
        self._wake.set()

    @property
    def generation(self) -> int:
        return self._generation

    # ------------------------------------------------------------------ thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dra-slices", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        wait = 0.0
        while not self._stop.is_set():
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            wait = self.sync(self._monotonic())

    # ------------------------------------------------------------------ one decision

    def desired(self) -> list[dict[str, Any]] | None:
        """The slices for the current inputs, generation 0 (None before the first snapshot)."""
        with self._lock:
            snap, in_use = self._snapshot, self._in_use
        if snap is None:
            return None
        topo = snap.topology
        if self._alloc is None or self._alloc.topology != topo:
            # the snapshot's policy scores with the exact allocator (built once per topology)
            exact = snap.allocator.exact
            self._alloc = exact if isinstance(exact, Allocator) else Allocator(topo)
        healthy = [g.index for g in topo.gpus if snap.healthy(g.uuid)]
        free = [i for i in healthy if i not in in_use]
        return draslices.build_slices(
            topo,
            self._alloc,
            self.node_name,
            healthy=healthy,
            free=free,
            generation=0,
            sizes=self.sizes,
            max_sets=self.max_sets,
            pcie_roots=self._pcie_roots(snap),
            driver=self.driver,
        )

    def sync(self, now: float) -> float:
        """Write the slices if they changed (or a resync is due); seconds until the next call."""
        if self._failures and now < self._last_sync + self._backoff():
            return self._last_sync + self._backoff() - now
        wait_for = self._last_write + self.min_interval_s - now
        if self._dirty and wait_for > 0:
            return wait_for
        due = now >= self._last_sync + self.resync_s
        if not self._dirty and not due:
            return self._last_sync + self.resync_s - now
        with self._lock:
            self._dirty = False
        self._last_sync = now
        try:
            wanted = self.desired()
            if wanted is None:
                return self.resync_s
            self._reconcile(wanted, force_check=due or self._published is None)
        except Exception as e:
            self._failures += 1
            with self._lock:
                self._dirty = True
            jsonlog.event(
                log,
                "slices_failed",
                logging.WARNING,
                node=self.node_name,
                failures=self._failures,
                retry_in_s=self._backoff(),
                reason=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
            )
            return self._backoff()
        self._failures = 0
        return self.resync_s

    def _backoff(self) -> float:
        first, most = self.backoff_s
        return float(min(most, first * 2 ** max(0, self._failures - 1)))

    def _reconcile(self, wanted: list[dict[str, Any]], force_check: bool) -> None:
        if not force_check and wanted == self._published:
            return
        problems = draslices.check_limits(wanted)
        if problems:  # a bug, never the input's fault: say so loudly and publish nothing broken
            raise draslices.SliceError("; ".join(problems[:3]))
        existing = {
            str(s.get("metadata", {}).get("name")): s
            for s in self.api.list_slices(self.node_name, self.driver)
        }
        server_gen = max((_generation(s) for s in existing.values()), default=0)
        if server_gen > 0 and _content(existing.values()) == _content(wanted):
            # the server already says this (a restart, or a resync with nothing to fix)
            self._generation = max(self._generation, server_gen)
            self._published = wanted
            return
        self._generation = max(self._generation, server_gen) + 1
        names = set()
        for s in wanted:
            body = _with_generation(s, self._generation)
            name = body["metadata"]["name"]
            names.add(name)
            old = existing.get(name)
            if old is None:
                self.api.create_slice(body)
            else:
                rv = old.get("metadata", {}).get("resourceVersion")
                if rv:
                    body["metadata"]["resourceVersion"] = rv
                self.api.replace_slice(name, body)
            self.writes += 1
        for name in existing:
            if name not in names:
                self.api.delete_slice(name)
        self._published = wanted
        self._last_write = self._monotonic()
        summary = draslices.summary(wanted)
        jsonlog.event(
            log,
            "slices_published",
            node=self.node_name,
            generation=self._generation,
            slices=summary["slices"],
            devices=summary["devices"],
            per_part=summary["per_part"],
            reason="health or use changed the devices' health or order",
        )


def _generation(s: Mapping[str, Any]) -> int:
    gen = s.get("spec", {}).get("pool", {}).get("generation", 0)
    return gen if isinstance(gen, int) and not isinstance(gen, bool) else 0


def _with_generation(s: Mapping[str, Any], generation: int) -> dict[str, Any]:
    spec = dict(s["spec"])
    spec["pool"] = {**spec["pool"], "generation": generation}
    return {**s, "metadata": dict(s["metadata"]), "spec": spec}


def _content(slices: Iterable[Mapping[str, Any]]) -> list[tuple[str, Any]]:
    """What a slice says, without the fields the server or the generation change."""
    out = []
    for s in slices:
        spec = dict(s.get("spec", {}))
        pool = dict(spec.get("pool", {}))
        pool.pop("generation", None)
        spec["pool"] = pool
        out.append((str(s.get("metadata", {}).get("name")), spec))
    return sorted(out, key=lambda x: x[0])
