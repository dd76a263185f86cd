"""The gRPC face of the plugin: v1beta1.DevicePlugin and gputopo.status.v1.Status.

Handlers only translate: read one snapshot, let `deviceplugin.kubelet.requests` validate and ask the
allocator, turn the answer into protobuf, log the decision with its reason. They never touch
NVML or the file system, so an RPC's cost is the allocator's and nothing else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from deviceplugin import settings
from deviceplugin.kubelet.api import RegistrationInfo, plugin_options
from deviceplugin.kubelet.requests import PreferredAnswer, RequestError, allocate_ids, preferred
from deviceplugin.metrics import Metrics
from deviceplugin.settings import PluginConfig
from deviceplugin.state import Snapshot, SnapshotStore
from deviceplugin.strategies import Handover, parse_strategies, probe_device_specs
from gputopo import __version__, jsonlog
from gputopo_proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from gputopo_proto.status.v1 import status_pb2, status_pb2_grpc

log = logging.getLogger("deviceplugin.service")

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
OBJECTIVE = "ring bandwidth, then least disruption of what stays free, then pair sum (design.md §2)"
# How often a ListAndWatch stream checks that kubelet is still there and the server still up.
STREAM_POLL_SECONDS = 0.25


# A decision log line names the IDs of its request; a refused request may carry thousands, each
# up to the message size: the line keeps this many IDs, each cut to this many characters.
MAX_LOGGED_IDS = 20
MAX_LOGGED_ID_CHARS = 80


def logged_ids(ids: Sequence[str]) -> list[str]:
    """`ids` for a log line, bounded: the first MAX_LOGGED_IDS (each clipped), then a count."""
    out = [
        i if len(i) <= MAX_LOGGED_ID_CHARS else f"{i[:MAX_LOGGED_ID_CHARS]}...({len(i)} chars)"
        for i in ids[:MAX_LOGGED_IDS]
    ]
    if len(ids) > MAX_LOGGED_IDS:
        out.append(f"... and {len(ids) - MAX_LOGGED_IDS} more")
    return out


def _too_many_containers(n: int) -> str | None:
    """Every container request names at least one device, so more requests than the longest
    device list a node can offer are not kubelet's (settings.MAX_REQUEST_IDS)."""
    if n > settings.MAX_REQUEST_IDS:
        return f"{n} container_requests; at most {settings.MAX_REQUEST_IDS} are accepted"
    return None


def device_list(snap: Snapshot) -> api_pb2.ListAndWatchResponse:
    out = api_pb2.ListAndWatchResponse()
    for gpu in snap.gpus:
        dev = out.devices.add(ID=gpu.uuid, health=HEALTHY if snap.healthy(gpu.uuid) else UNHEALTHY)
        if gpu.numa is not None:
            dev.topology.nodes.add(ID=gpu.numa)
    return out


def handover(config: PluginConfig) -> Handover:
    """The configured device list strategies (and device specs), built once per server: the
    control devices are looked up here, never inside Allocate."""
    return Handover(
        strategies=parse_strategies(config.device_list_strategy),
        specs=probe_device_specs(config.nvidia_driver_root) if config.pass_device_specs else None,
        annotation_prefix=config.cdi_annotation_prefix,
        cdi_kind=settings.CDI_KIND,
    )


def _minor(snap: Snapshot, uuid: str) -> int:
    """The card's /dev/nvidia<minor>: NVML's minor number, else its index."""
    gpu = snap.gpus[snap.index_of(uuid) or 0]
    return gpu.minor if gpu.minor is not None else gpu.index


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
        self._handover = handover(config)

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
        # The slot is freed the moment the RPC ends (client gone, cancelled, deadline): gRPC runs
        # this callback then, while the generator itself would only notice at its next poll. A
        # client that reconnects at once must find its old slot free.
        ended = threading.Event()
        freed = [False]

        def free() -> None:
            with self._lock:
                if not freed[0]:
                    freed[0] = True
                    self._watchers -= 1

        def on_done() -> None:
            free()
            ended.set()
            self._store.wake()  # and the generator stops waiting now, giving its thread back

        if not context.add_callback(on_done):  # the RPC already ended
            on_done()
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
            while not self._stopping.is_set() and not ended.is_set() and context.is_active():
                newer = self._store.wait_newer(version, STREAM_POLL_SECONDS, ended)
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
            free()

    def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> Any:
        snap = self._store.current()
        out = api_pb2.PreferredAllocationResponse()
        # Every container is answered before anything is counted or logged as chosen: a bad
        # container_requests[n] rejects the whole RPC, so the ones before it were not chosen.
        decided: list[tuple[list[str], list[str], int, PreferredAnswer, float]] = []
        if problem := _too_many_containers(len(request.container_requests)):
            self._preferred_invalid.inc()
            jsonlog.event(log, "preferred_allocation_rejected", logging.WARNING, reason=problem)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
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
                    offered=logged_ids(available),
                    must=logged_ids(must),
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
                    offered=logged_ids(available),
                    must=logged_ids(must),
                    size=size,
                    reason=problem,
                )
                context.abort(code, problem)
            assert answer is not None
            decided.append((available, must, size, answer, elapsed))
        for available, must, size, answer, elapsed in decided:
            self._metrics.preferred_seconds.observe(elapsed)
            self._preferred_ok.inc()
            self._metrics.observe_ring("GetPreferredAllocation", snap.allocator.exact, answer.choice.indices)
            out.container_responses.add(deviceIDs=answer.device_ids)
            c = answer.choice
            jsonlog.event(
                log,
                "preferred_allocation",
                policy=snap.allocator.name,
                offered=logged_ids(available),
                must=logged_ids(must),
                size=size,
                chosen=list(answer.device_ids),
                indices=list(c.indices),
                ring_mbps=c.ring_mbps,
                disruption=[list(d) for d in c.disruption],
                pair_sum_mbps=c.pair_sum_mbps,
                ignored_unknown=logged_ids(answer.ignored),
                unhealthy_offered=logged_ids(answer.unhealthy_offered),
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
        if problem := _too_many_containers(len(request.container_requests)):
            self._allocate_invalid.inc()
            jsonlog.event(log, "allocate_rejected", logging.WARNING, reason=problem)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
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
                    log,
                    "allocate_rejected",
                    logging.WARNING,
                    devices=logged_ids(creq.devices_ids),
                    reason=problem,
                )
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        for ids in checked:
            resp = out.container_responses.add()
            self._handover.fill(resp, ids, [_minor(snap, i) for i in ids])
            self._allocate_ok.inc()
            indices = [snap.index_of(i) for i in ids]
            self._metrics.observe_ring(
                "Allocate", snap.allocator.exact, [i for i in indices if i is not None]
            )
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
