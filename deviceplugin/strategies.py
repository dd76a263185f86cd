"""How Allocate hands the chosen GPUs to the container runtime: NVIDIA's device list strategies.

Operators configure these on NVIDIA's plugin (`--device-list-strategy`, a list, and
`--pass-device-specs`); the same names mean the same response fields here, so switching a node
from NVIDIA's plugin to gputopo keeps its runtime setup working:

* `envvar`: `NVIDIA_VISIBLE_DEVICES=<uuid>,<uuid>` in `envs`; the NVIDIA container toolkit's
  hook (or runtime) reads it.
* `volume-mounts`: `NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices` and one mount per
  GPU, `/dev/null` -> `/var/run/nvidia-container-devices/<uuid>`, read-only: the toolkit's
  `accept-nvidia-visible-devices-as-volume-mounts` mode, where an unprivileged pod cannot ask
  for GPUs by setting the variable itself.
* `cdi-annotations`: one annotation per container response, key
  `cdi.k8s.io/gputopo-device-plugin_<response uuid>` (the CDI `AnnotationKey` format:
  prefix + plugin name + `_` + an ID unique to this allocation, at most 63 characters after the
  prefix), value the comma-joined CDI names `nvidia.com/gpu=<uuid>`; for runtimes that read
  CDI requests from annotations (containerd < 1.7, CRI-O < 1.28, nvidia-container-runtime in
  CDI mode).
* `cdi-cri`: the same CDI names in `ContainerAllocateResponse.cdi_devices` (kubelet >= 1.28
  passes them to the runtime through CRI's `CDIDevices`). `cdi` is accepted as its old name.
* device specs (`pass_device_specs`, a separate switch as in NVIDIA's plugin): `devices` lists
  `/dev/nvidia<minor>` of each GPU and the control devices `/dev/nvidiactl`, `/dev/nvidia-uvm`,
  `/dev/nvidia-uvm-tools`, `/dev/nvidia-modeset` present under the driver root, `rw`: for
  runtimes without the NVIDIA hook, and for the device cgroup of non-privileged pods.

`envvar` and `volume-mounts` both set NVIDIA_VISIBLE_DEVICES (NVIDIA's plugin lets the second
silently win); asking for both is refused here, so a configuration says what it gets.
"""

from __future__ import annotations

import os
import re
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

ENVVAR = "envvar"
VOLUME_MOUNTS = "volume-mounts"
CDI_ANNOTATIONS = "cdi-annotations"
CDI_CRI = "cdi-cri"
STRATEGIES = (ENVVAR, VOLUME_MOUNTS, CDI_ANNOTATIONS, CDI_CRI)
ALIASES = {"cdi": CDI_CRI}  # the first cut's name for cdi-cri

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNTS_HOST_PATH = "/dev/null"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
CDI_PLUGIN_NAME = "gputopo-device-plugin"
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
_MAX_CDI_NAME = 63  # CDI AnnotationKey: plugin name + "_" + ID, after the prefix
_PREFIX_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/$")


def parse_strategies(value: Any) -> tuple[str, ...]:
    """A comma list (flag, env) or a YAML list of strategies, in canonical order; ValueError
    with the reason otherwise (unknown name, empty list, envvar together with volume-mounts)."""
    if isinstance(value, str):
        items = [p.strip().lower() for p in value.split(",")]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [v.strip().lower() for v in value]
    else:
        raise ValueError(f"must be a comma-separated list of {', '.join(STRATEGIES)}, got {value!r}")
    items = [ALIASES.get(i, i) for i in items if i]
    if not items:
        raise ValueError(f"must name at least one of {', '.join(STRATEGIES)}")
    if unknown := [i for i in items if i not in STRATEGIES]:
        shown = unknown[0] if len(unknown[0]) <= 40 else unknown[0][:40] + "..."
        raise ValueError(f"unknown strategy {shown!r} (known: {', '.join(STRATEGIES)})")
    chosen = set(items)
    if {ENVVAR, VOLUME_MOUNTS} <= chosen:
        raise ValueError("envvar and volume-mounts both set NVIDIA_VISIBLE_DEVICES; choose one")
    return tuple(s for s in STRATEGIES if s in chosen)


def parse_annotation_prefix(value: Any) -> str:
    """A DNS-subdomain-like prefix ending in '/', as NVIDIA's `--cdi-annotation-prefix`."""
    if not isinstance(value, str) or not _PREFIX_RE.match(value.strip()) or len(value.strip()) > 254:
        raise ValueError(f"must look like cdi.k8s.io/ (a DNS name and a trailing '/'), got {value!r}")
    return value.strip()


@dataclass(frozen=True, slots=True)
class DeviceSpecs:
    """What `pass_device_specs` adds: the driver root (host paths) and the control devices
    found under it when the server started (Allocate itself never touches the file system)."""

    driver_root: str
    control: tuple[str, ...]

    def host_path(self, container_path: str) -> str:
        return os.path.join(self.driver_root, container_path.lstrip("/"))


def probe_device_specs(driver_root: str) -> DeviceSpecs:
    """Which control devices exist under `driver_root` (NVIDIA passes only those present)."""
    root = os.path.abspath(driver_root or "/")
    present = tuple(p for p in CONTROL_DEVICES if os.path.exists(os.path.join(root, p.lstrip("/"))))
    return DeviceSpecs(root, present)


def cdi_names(kind: str, uuids: Sequence[str]) -> list[str]:
    """The fully qualified CDI device names of GPUs (`nvidia.com/gpu=<uuid>`): what the device
    plugin's Allocate and the DRA mode's NodePrepareResources both hand the runtime."""
    return [f"{kind}={u}" for u in uuids]


@dataclass(frozen=True, slots=True)
class Handover:
    """The chosen strategies, ready to fill container responses."""

    strategies: tuple[str, ...]
    specs: DeviceSpecs | None = None
    annotation_prefix: str = CDI_ANNOTATION_PREFIX
    cdi_kind: str = "nvidia.com/gpu"
    new_id: Callable[[], str] = lambda: str(uuidlib.uuid4())

    def fill(self, resp: Any, uuids: Sequence[str], minors: Sequence[int]) -> None:
        """Fill one ContainerAllocateResponse for GPUs `uuids` (device nodes `minors`)."""
        if ENVVAR in self.strategies:
            resp.envs[VISIBLE_DEVICES] = ",".join(uuids)
        if VOLUME_MOUNTS in self.strategies:
            resp.envs[VISIBLE_DEVICES] = VOLUME_MOUNTS_ROOT
            for u in uuids:
                resp.mounts.add(
                    container_path=f"{VOLUME_MOUNTS_ROOT}/{u}",
                    host_path=VOLUME_MOUNTS_HOST_PATH,
                    read_only=True,
                )
        names = cdi_names(self.cdi_kind, uuids)
        if CDI_ANNOTATIONS in self.strategies:
            resp.annotations[self.annotation_key()] = ",".join(names)
        if CDI_CRI in self.strategies:
            for name in names:
                resp.cdi_devices.add(name=name)
        if self.specs is not None:
            paths = [f"/dev/nvidia{m}" for m in minors] + list(self.specs.control)
            for p in paths:
                resp.devices.add(container_path=p, host_path=self.specs.host_path(p), permissions="rw")

    def annotation_key(self) -> str:
        """CDI's AnnotationKey: prefix + plugin + '_' + a fresh ID (unique per allocation)."""
        name = f"{CDI_PLUGIN_NAME}_{self.new_id().replace('/', '_')}"
        if len(name) > _MAX_CDI_NAME:  # cannot happen with uuid4 IDs; guards a custom new_id
            name = name[:_MAX_CDI_NAME].rstrip("-_.")
        return self.annotation_prefix + name
