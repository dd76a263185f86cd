"""Value parsers for the plugin's settings: text from a flag or an environment variable, or a
YAML scalar, list or mapping from the config file, turned into one checked value.

Each parser is total: it returns the value or raises `ValueError` with a reason, which
`deviceplugin.config` wraps into a `ConfigError` naming the source and the setting. Kept apart
from the table of settings (`deviceplugin.configoptions`) and from the loading
(`deviceplugin.config`) so each can be read, and property-tested, on its own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from deviceplugin import defaults, strategies
from gputopo.node.links import PCIE_LEVELS

STRATEGIES = strategies.STRATEGIES  # the names --device-list-strategy accepts (plus "cdi")
PUBLISH_MODES = ("auto", "true", "false")
LOG_LEVELS = ("debug", "info", "warning", "error")
_RESOURCE_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def parse_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a non-empty string")
    if "\0" in value:  # only YAML can carry one; every path and name would fail later, less clearly
        raise ValueError("must not contain a NUL character")
    return value.strip()


def parse_socket_path(value: Any) -> str:
    """Absolute: gRPC reads `unix://a/b` as host `a`, so a relative path could never be served."""
    return os.path.abspath(parse_text(value))


def parse_optional_text(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return parse_text(value)


def parse_choice(options: Sequence[str]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = parse_text(value).lower()
        if text not in options:
            raise ValueError(f"must be one of {', '.join(options)}, got {value!r}")
        return text

    return parse


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"must be true or false, got {value!r}")


def parse_port(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"must be a port number 0..65535, got {value!r}")
    try:
        port = int(str(value).strip())
    except ValueError:
        raise ValueError(f"must be a port number 0..65535, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"must be a port number 0..65535, got {value!r}")
    return port


def parse_seconds(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"must be a number of seconds >= 0, got {value!r}")
    try:
        seconds = float(str(value).strip())
    except ValueError:
        raise ValueError(f"must be a number of seconds >= 0, got {value!r}") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"must be a number of seconds >= 0, got {value!r}")
    return seconds


def parse_xids(value: Any) -> tuple[int, ...]:
    items: list[Any]
    if isinstance(value, (list, tuple)):
        items = list(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        items = [value]
    elif isinstance(value, str):
        items = [p for p in re.split(r"[,\s]+", value.strip()) if p]
    else:
        raise ValueError(f"must be a comma-separated list of XID numbers, got {value!r}")
    out: list[int] = []
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"{item!r} is not an XID number")
        try:
            xid = int(str(item))
        except ValueError:
            raise ValueError(f"{item!r} is not an XID number") from None
        if xid < 0:
            raise ValueError(f"{item!r} is not an XID number")
        out.append(xid)
    return tuple(sorted(set(out)))


def parse_resource(value: Any) -> str:
    text = parse_text(value)
    if not _RESOURCE_RE.match(text) or len(text) > 253:
        raise ValueError(f"must be an extended resource name like nvidia.com/gpu, got {value!r}")
    return text


def parse_socket_name(value: Any) -> str:
    text = parse_text(value)
    if "/" in text or text in (".", "..", defaults.KUBELET_SOCKET_NAME):
        raise ValueError(
            f"must be a plain file name other than {defaults.KUBELET_SOCKET_NAME}, got {value!r}"
        )
    return text


def parse_gbps(value: Any) -> float | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        raise ValueError(f"must be a positive number of GB/s, got {value!r}")
    try:
        gbps = float(str(value).strip())
    except ValueError:
        raise ValueError(f"must be a positive number of GB/s, got {value!r}") from None
    if not 0 < gbps < float("inf"):
        raise ValueError(f"must be a positive number of GB/s, got {value!r}")
    return gbps


def parse_pcie_gbps(value: Any) -> tuple[tuple[str, float], ...] | None:
    """`PIX=24,PXB=20` (flag/env) or a mapping (YAML) of PCIe level -> GB/s."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, Mapping):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, str):
        items = []
        for part in (p.strip() for p in value.split(",") if p.strip()):
            level, sep, number = part.partition("=")
            if not sep:
                raise ValueError(f"must look like PIX=24,SYS=6, got {value!r}")
            items.append((level.strip(), number.strip()))
    else:
        raise ValueError(f"must look like PIX=24,SYS=6, got {value!r}")
    out: dict[str, float] = {}
    for level, number in items:
        name = level.upper()
        if name not in PCIE_LEVELS:
            raise ValueError(f"unknown PCIe level {level!r} (one of {', '.join(PCIE_LEVELS)})")
        try:
            gbps = parse_gbps(number)
        except ValueError as e:
            raise ValueError(f"{level}: {e}") from None
        if gbps is None:
            raise ValueError(f"{level} needs a number of GB/s")
        out[name] = gbps
    return tuple(sorted(out.items()))


_LABEL_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def parse_label_key(value: Any) -> str:
    """A Kubernetes label key: optional DNS-subdomain prefix and '/', then a name of <= 63."""
    text = parse_text(value)
    prefix, _, name = text.rpartition("/")
    if not _LABEL_NAME_RE.match(name) or (
        prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix))
    ):
        raise ValueError(f"must be a label key like gputopo.io/config, got {value!r}")
    return text


def parse_config_name(value: Any) -> str | None:
    """A ConfigMap key (the name of one config in --config-dir)."""
    text = parse_optional_text(value)
    if text is not None and not re.fullmatch(r"[-._a-zA-Z0-9]{1,253}", text):
        raise ValueError(f"must be a ConfigMap key (letters, digits, '-', '_', '.'), got {value!r}")
    return text


def parse_strategy_list(value: Any) -> str:
    """`envvar,cdi-cri` (canonical order, comma-joined: the status API reports it as text)."""
    return ",".join(strategies.parse_strategies(value))


def parse_log_level(value: Any) -> str:
    return parse_choice(LOG_LEVELS)(value)
