"""The gRPC face of the plugin: v1beta1.DevicePlugin and gputopo.status.v1.Status.

Handlers only translate: read one snapshot, let `deviceplugin.requests` validate and ask the
allocator, turn the answer into protobuf, log the decision with its reason. They never touch
NVML or the file system, so an RPC's cost is the allocator's and nothing else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from deviceplugin import defaults
from deviceplugin.config import PluginConfig
from deviceplugin.metrics import Metrics
from deviceplugin.registration import RegistrationInfo, plugin_options
from deviceplugin.requests import PreferredAnswer, RequestError, allocate_ids, preferred
from deviceplugin.state import Snapshot, SnapshotStore
from gputopo import __version__, jsonlog
from gputopo_proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gputopo_proto.status.v1 import status_pb2, status_pb2_grpc

log = logging.getLogger("deviceplugin.service")

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
OBJECTIVE = "ring bandwidth, then least disruption of what stays free, then pair sum (design.md §2)"
# How often a ListAndWatch stream checks that kubelet is still there and the server still up.
STREAM_POLL_SECONDS = 0.25


def device_list(snap: Snapshot) -> api_pb2.ListAndWatchResponse:
    out = api_pb2.ListAndWatchResponse()
    for gpu in snap.gpus:
        dev = out.devices.add(ID=gpu.uuid, health=HEALTHY if snap.healthy(gpu.uuid) else UNHEALTHY)
        if gpu.numa is not None:
            dev.topology.nodes.add(ID=gpu.numa)
    return out


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """One instance per server generation: `stopping` ends its streams when that server stops."""

    def __init__(
        self,
        store: SnapshotStore,
        config: PluginConfig,
        metrics: Metrics,
        stopping: threading.Event,
        timer: Callable[[], float] = time.perf_counter,
        allocated: Callable[[], None] = lambda: None,
        max_streams: int = 8,
    ) -> None:
        self._store = store
        self._max_streams = max_streams
        self._allocated = allocated
        self._config = config
        self._metrics = metrics
        self._stopping = stopping
        self._timer = timer
        self._lock = threading.Lock()
        self._watchers = 0
        # Labelled children bound once: .labels() costs a lock and a dict lookup per call.
        self._preferred_ok = metrics.allocations.labels("GetPreferredAllocation", "ok")
        self._preferred_invalid = metrics.allocations.labels("GetPreferredAllocation", "invalid")
        self._allocate_ok = metrics.allocations.labels("Allocate", "ok")
        self._allocate_invalid = metrics.allocations.labels("Allocate", "invalid")

    @property
    def watchers(self) -> int:
        return self._watchers

    def GetDevicePluginOptions(self, request: api_pb2.Empty, context: grpc.ServicerContext) -> Any:
        return plugin_options()

    def ListAndWatch(self, request: api_pb2.Empty, context: grpc.ServicerContext) -> Iterator[Any]:
        # Every open stream holds a server thread until it ends; without a cap, a client opening
        # many would leave none for Allocate, which kubelet calls without a deadline.
        with self._lock:
            full = self._watchers >= self._max_streams
            if not full:
                self._watchers += 1
        if full:
            problem = f"already {self._max_streams} ListAndWatch streams open; close one first"
            jsonlog.event(log, "list_and_watch_refused", logging.WARNING, reason=problem)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, problem)
        try:
            snap = self._store.current()
            last = device_list(snap)
            jsonlog.event(
                log,
                "list_and_watch",
                version=snap.version,
                devices=len(last.devices),
                unhealthy=[d.ID for d in last.devices if d.health != HEALTHY],
                reason="kubelet opened the stream: sending the full device list",
            )
            yield last
            version = snap.version
            while not self._stopping.is_set() and context.is_active():
                newer = self._store.wait_newer(version, STREAM_POLL_SECONDS)
                if newer is None:
                    if self._store.closed:
                        break
                    continue
                version = newer.version
                listing = device_list(newer)
                if listing == last:
                    continue
                last = listing
                jsonlog.event(
                    log,
                    "list_and_watch",
                    version=version,
                    devices=len(listing.devices),
                    unhealthy=[d.ID for d in listing.devices if d.health != HEALTHY],
                    reason="device list changed: sending the full list again",
                )
                yield listing
        finally:
            with self._lock:
                self._watchers -= 1

    def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> Any:
        snap = self._store.current()
        out = api_pb2.PreferredAllocationResponse()
        # Every container is answered before anything is counted or logged as chosen: a bad
        # container_requests[n] rejects the whole RPC, so the ones before it were not chosen.
        decided: list[tuple[list[str], list[str], int, PreferredAnswer, float]] = []
        for n, creq in enumerate(request.container_requests):
            available = list(creq.available_deviceIDs)
            must = list(creq.must_include_deviceIDs)
            size = creq.allocation_size
            start = self._timer()
            answer: PreferredAnswer | None = None
            problem = ""
            code = grpc.StatusCode.INVALID_ARGUMENT
            try:
                answer = preferred(snap, available, must, size)
            except RequestError as e:
                problem = f"container_requests[{n}]: {e}"
            except Exception as e:  # an allocator bug must cost one request, not the daemon
                code = grpc.StatusCode.INTERNAL
                problem = f"container_requests[{n}]: internal error: {type(e).__name__}: {e}"
                jsonlog.event(
                    log,
                    "preferred_allocation_failed",
                    logging.ERROR,
                    offered=available,
                    must=must,
                    size=size,
                    reason=problem,
                )
            elapsed = self._timer() - start
            if answer is None:
                self._preferred_invalid.inc()
                jsonlog.event(
                    log,
                    "preferred_allocation_rejected",
                    logging.WARNING,
                    offered=available,
                    must=must,
                    size=size,
                    reason=problem,
                )
                context.abort(code, problem)
            assert answer is not None
            decided.append((available, must, size, answer, elapsed))
        for available, must, size, answer, elapsed in decided:
            self._metrics.preferred_seconds.observe(elapsed)
            self._preferred_ok.inc()
            self._metrics.observe_ring("GetPreferredAllocation", snap.allocator, answer.choice.indices)
            out.container_responses.add(deviceIDs=answer.device_ids)
            c = answer.choice
            jsonlog.event(
                log,
                "preferred_allocation",
                offered=available,
                must=must,
                size=size,
                chosen=list(answer.device_ids),
                indices=list(c.indices),
                ring_mbps=c.ring_mbps,
                disruption=[list(d) for d in c.disruption],
                pair_sum_mbps=c.pair_sum_mbps,
                ignored_unknown=list(answer.ignored),
                unhealthy_offered=list(answer.unhealthy_offered),
                micros=round(elapsed * 1e6),
                reason=OBJECTIVE,
            )
        return out

    def Allocate(self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext) -> Any:
        snap = self._store.current()
        out = api_pb2.AllocateResponse()
        # Validate every container first: a rejected RPC allocates nothing, so nothing is counted.
        checked: list[tuple[str, ...]] = []
        owner: dict[str, int] = {}  # a GPU goes to one container, never to two of one request
        for n, creq in enumerate(request.container_requests):
            try:
                ids = allocate_ids(snap, list(creq.devices_ids))
                if shared := [i for i in ids if i in owner]:
                    raise RequestError(f"{shared[0]} is also in container_requests[{owner[shared[0]]}]")
                owner.update(dict.fromkeys(ids, n))
                checked.append(ids)
            except RequestError as e:
                self._allocate_invalid.inc()
                problem = f"container_requests[{n}]: {e}"
                jsonlog.event(
                    log, "allocate_rejected", logging.WARNING, devices=list(creq.devices_ids), reason=problem
                )
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        for ids in checked:
            resp = out.container_responses.add()
            if self._config.device_list_strategy == "cdi":
                for uuid in ids:
                    resp.cdi_devices.add(name=f"{defaults.CDI_KIND}={uuid}")
            else:
                resp.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
            self._allocate_ok.inc()
            indices = [snap.index_of(i) for i in ids]
            self._metrics.observe_ring("Allocate", snap.allocator, [i for i in indices if i is not None])
            jsonlog.event(
                log,
                "allocate",
                devices=list(ids),
                strategy=self._config.device_list_strategy,
                unhealthy=[i for i in ids if not snap.healthy(i)],
                reason="kubelet allocated these devices to a container",
            )
        self._allocated()
        return out

    def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> Any:
        # pre_start_required is false: nothing to prepare per container.
        return api_pb2.PreStartContainerResponse()


class StatusService(status_pb2_grpc.StatusServicer):
    """What `gputopo status` shows: devices, registration, and where the plugin looks."""

    def __init__(
        self,
        store: SnapshotStore,
        config: PluginConfig,
        registration: Callable[[], RegistrationInfo],
        watchers: Callable[[], int],
    ) -> None:
        self._store = store
        self._config = config
        self._registration = registration
        self._watchers = watchers

    def GetStatus(self, request: status_pb2.GetStatusRequest, context: grpc.ServicerContext) -> Any:
        snap = self._store.current()
        reg = self._registration()
        cfg = self._config
        out = status_pb2.GetStatusResponse(
            resource_name=cfg.resource_name,
            kubelet_dir=cfg.kubelet_dir,
            socket_name=cfg.socket_name,
            topology_name=snap.topology.name,
            backend=cfg.backend_kind,
            node_name=cfg.node_name or "",
            device_list_strategy=cfg.device_list_strategy,
            watchers=self._watchers(),
            version=__version__,
            registration=status_pb2.RegistrationStatus(
                registered=reg.registered,
                last_registration_unix=reg.last_registration_unix or 0.0,
                count=reg.count,
                last_error=reg.last_error,
                failed_attempts=reg.failed_attempts,
            ),
        )
        for gpu in snap.gpus:
            dev = out.devices.add(
                uuid=gpu.uuid,
                index=gpu.index,
                healthy=snap.healthy(gpu.uuid),
                health_reason=snap.reasons.get(gpu.uuid, ""),
                model=gpu.model,
                pci_bus_id=gpu.pci_bus_id,
            )
            if gpu.numa is not None:
                dev.numa = gpu.numa
        return out
