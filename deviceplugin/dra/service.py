"""The DRA service kubelet calls (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`).

NodePrepareResources gets claim references only (namespace, name, UID); the allocation lives in
the ResourceClaim's status, so each claim is read from the API server, its UID checked, and the
results of our driver for our node's pool mapped to GPUs: a set device expands to its member
GPUs (`gputopo.node.draslices.expand`), each GPU to its CDI name `nvidia.com/gpu=<uuid>` as in
device-plugin mode. Prepared claims are remembered (and checkpointed in the plugin folder, so a
restart keeps them): a second prepare of the same claim answers the same devices, and the GPUs
they hold are the node's in-use set the slice publisher orders the set devices by.

Everything a claim says is untrusted: a result naming another pool, a device we never publish, a
GPU outside the node, an unhealthy GPU or one another claim holds fails that claim alone, with
a reason in its `error`; a malformed request (no UID, too many claims) is INVALID_ARGUMENT.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from deviceplugin import settings
from deviceplugin.dra.kubeapi import DraApi
from deviceplugin.state import SnapshotStore
from deviceplugin.strategies import cdi_names
from gputopo import jsonlog
from gputopo.node import draslices
from gputopo_proto.dra.v1 import api_pb2, api_pb2_grpc

log = logging.getLogger("deviceplugin.dra.service")

#: Most claims one call may carry (kubelet sends the claims of one pod).
MAX_CLAIMS = 64
MAX_RESULTS = 64


@dataclass(frozen=True)
class Prepared:
    """One prepared claim: its devices (pool, device, request, GPU indices)."""

    namespace: str
    name: str
    devices: tuple[tuple[str, str, str, tuple[int, ...]], ...]

    @property
    def gpus(self) -> frozenset[int]:
        return frozenset(i for d in self.devices for i in d[3])


class ClaimRefused(ValueError):
    """A claim this node cannot prepare; the message goes into the claim's `error`."""


class PreparedClaims:
    """Prepared claims by UID, checkpointed as JSON (written whole, then renamed)."""

    def __init__(self, checkpoint: str | None) -> None:
        self._path = checkpoint
        self._lock = threading.Lock()
        self._claims: dict[str, Prepared] = self._load()

    def _load(self) -> dict[str, Prepared]:
        if not self._path or not os.path.exists(self._path):
            return {}
        try:
            with open(self._path, encoding="utf-8") as f:
                doc = json.load(f)
            return {
                str(uid): Prepared(
                    str(c["namespace"]),
                    str(c["name"]),
                    tuple((str(p), str(d), str(r), tuple(int(i) for i in g)) for p, d, r, g in c["devices"]),
                )
                for uid, c in doc["claims"].items()
            }
        except (OSError, ValueError, KeyError, TypeError) as e:
            jsonlog.event(
                log,
                "checkpoint_unreadable",
                logging.WARNING,
                path=self._path,
                reason=f"{type(e).__name__}: {e}",
            )
            return {}

    def _save(self) -> None:
        if not self._path:
            return
        doc = {
            "claims": {
                uid: {
                    "namespace": c.namespace,
                    "name": c.name,
                    "devices": [[d[0], d[1], d[2], list(d[3])] for d in c.devices],
                }
                for uid, c in self._claims.items()
            }
        }
        tmp = self._path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, self._path)

    def get(self, uid: str) -> Prepared | None:
        with self._lock:
            return self._claims.get(uid)

    def add(self, uid: str, claim: Prepared) -> None:
        with self._lock:
            others = frozenset().union(*(c.gpus for u, c in self._claims.items() if u != uid))
            clash = claim.gpus & others
            if clash:
                raise ClaimRefused(f"GPUs {sorted(clash)} are held by another prepared claim")
            self._claims[uid] = claim
            self._save()

    def remove(self, uid: str) -> bool:
        with self._lock:
            if self._claims.pop(uid, None) is None:
                return False
            self._save()
            return True

    def in_use(self) -> frozenset[int]:
        with self._lock:
            return frozenset().union(*(c.gpus for c in self._claims.values()))


class DraService(api_pb2_grpc.DRAPluginServicer):
    def __init__(
        self,
        store: SnapshotStore,
        api: DraApi,
        claims: PreparedClaims,
        *,
        node_name: str,
        driver: str = draslices.DRIVER,
        cdi_kind: str = settings.CDI_KIND,
        changed: Callable[[frozenset[int]], None] = lambda in_use: None,
    ) -> None:
        self._store = store
        self._api = api
        self._claims = claims
        self._node = node_name
        self._driver = driver
        self._cdi_kind = cdi_kind
        self._changed = changed

    # -------------------------------------------------------------- RPCs

    def NodePrepareResources(
        self, request: api_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.NodePrepareResourcesResponse:
        _check_claims(request.claims, context)
        out = api_pb2.NodePrepareResourcesResponse()
        changed = False
        for claim in request.claims:
            try:
                prepared = self._claims.get(claim.uid)
                if prepared is None:
                    prepared = self._prepare(claim)
                    self._claims.add(claim.uid, prepared)
                    changed = True
                snap = self._store.current()
                if any(i >= snap.topology.n for i in prepared.gpus):  # a checkpoint from other hardware
                    self._claims.remove(claim.uid)
                    changed = True
                    raise ClaimRefused("the claim was prepared for GPUs this node no longer has")
                entry = out.claims[claim.uid]
                for pool, device, req, gpus in prepared.devices:
                    entry.devices.append(
                        api_pb2.Device(
                            request_names=[req] if req else [],
                            pool_name=pool,
                            device_name=device,
                            cdi_device_ids=cdi_names(
                                self._cdi_kind, [snap.topology.gpus[i].uuid for i in gpus]
                            ),
                        )
                    )
                jsonlog.event(
                    log,
                    "claim_prepared",
                    claim=f"{claim.namespace}/{claim.name}",
                    uid=claim.uid,
                    gpus=sorted(prepared.gpus),
                    reason="kubelet asked; devices from the claim's allocation",
                )
            except ClaimRefused as e:
                out.claims[claim.uid].error = str(e)
                jsonlog.event(
                    log,
                    "claim_refused",
                    logging.WARNING,
                    claim=f"{claim.namespace}/{claim.name}",
                    uid=claim.uid,
                    reason=str(e),
                )
        if changed:
            self._changed(self._claims.in_use())
        return out

    def NodeUnprepareResources(
        self, request: api_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> api_pb2.NodeUnprepareResourcesResponse:
        _check_claims(request.claims, context)
        out = api_pb2.NodeUnprepareResourcesResponse()
        changed = False
        for claim in request.claims:
            out.claims[claim.uid].CopyFrom(api_pb2.NodeUnprepareResourceResponse())
            if self._claims.remove(claim.uid):
                changed = True
                jsonlog.event(
                    log,
                    "claim_unprepared",
                    claim=f"{claim.namespace}/{claim.name}",
                    uid=claim.uid,
                    reason="kubelet asked",
                )
        if changed:
            self._changed(self._claims.in_use())
        return out

    # -------------------------------------------------------------- one claim

    def _prepare(self, claim: api_pb2.Claim) -> Prepared:
        where = f"{claim.namespace}/{claim.name}"
        try:
            obj = self._api.get_claim(claim.namespace, claim.name)
        except Exception as e:
            raise ClaimRefused(f"cannot read ResourceClaim {where}: {_short(e)}") from None
        meta = obj.get("metadata")
        uid = meta.get("uid") if isinstance(meta, Mapping) else None
        if uid != claim.uid:
            raise ClaimRefused(f"ResourceClaim {where} has UID {uid!r}, kubelet asked for {claim.uid!r}")
        results = _results(obj)
        snap = self._store.current()
        n = snap.topology.n
        devices = []
        for r in results:
            if r.get("driver") != self._driver:
                continue
            pool, device, req = r.get("pool"), r.get("device"), r.get("request", "")
            if not isinstance(pool, str) or not isinstance(device, str) or not isinstance(req, str):
                raise ClaimRefused(f"ResourceClaim {where}: an allocation result lacks pool or device")
            if pool != self._node:
                raise ClaimRefused(
                    f"ResourceClaim {where}: device {device} is from pool {pool!r}, not this node's"
                )
            try:
                gpus = draslices.expand(device, n)
            except draslices.SliceError as e:
                raise ClaimRefused(f"ResourceClaim {where}: {e}") from None
            sick = [i for i in gpus if not snap.healthy(snap.topology.gpus[i].uuid)]
            if sick:
                raise ClaimRefused(f"ResourceClaim {where}: GPUs {sick} are unhealthy")
            devices.append((pool, device, req[:253], gpus))
        if not devices:
            raise ClaimRefused(f"ResourceClaim {where} has no device of driver {self._driver} allocated")
        return Prepared(claim.namespace, claim.name, tuple(devices))


def _results(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = obj.get("status")
    alloc = status.get("allocation") if isinstance(status, Mapping) else None
    devs = alloc.get("devices") if isinstance(alloc, Mapping) else None
    results = devs.get("results") if isinstance(devs, Mapping) else None
    if not isinstance(results, list):
        raise ClaimRefused("the ResourceClaim is not allocated (no status.allocation.devices.results)")
    if len(results) > MAX_RESULTS:
        raise ClaimRefused(f"the ResourceClaim has {len(results)} allocation results (most: {MAX_RESULTS})")
    return [r for r in results if isinstance(r, Mapping)]


def _check_claims(claims: Any, context: grpc.ServicerContext) -> None:
    if len(claims) > MAX_CLAIMS:
        context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"{len(claims)} claims in one call (most: {MAX_CLAIMS})"
        )
    for c in claims:
        if not c.uid or not c.namespace or not c.name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "every claim needs namespace, name and uid")
        if len(c.uid) > 128 or len(c.namespace) > 63 or len(c.name) > 253:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "claim namespace, name or uid is too long")


def _short(e: Exception) -> str:
    status = getattr(e, "status", None)
    reason = getattr(e, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}"[:200]
