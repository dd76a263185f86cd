"""How the pynvml binding answers, for the NVML backend's two halves (`nvml_topology`,
`nvml_health`): the error codes they tell apart, and text that comes back as bytes or str
depending on the nvidia-ml-py version."""

from __future__ import annotations

from typing import Any

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this node (no library, no driver, no permission)."""


def text(value: Any) -> str:
    """pynvml returns bytes from some versions and str from others."""
    return value.decode("ascii", "replace").strip("\x00 ") if isinstance(value, bytes) else str(value).strip()


def code(error: Exception) -> int | None:
    """The NVML return code an NVMLError carries, if any."""
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None
