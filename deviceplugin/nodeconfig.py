"""Per-node settings from one ConfigMap, chosen by a label on the Node (NVIDIA's config manager).

A fleet mixes server generations (PCIe figures, NVLink speed) and an operator may A/B one node's
`--policy`; per-node flags do not scale. As NVIDIA's device plugin does with
`nvidia.com/device-plugin.config`, one ConfigMap holds several named configs (key = name, value =
the plugin's own versioned YAML config, `deviceplugin/settings.py`), it is mounted as a folder
(`--config-dir`), and the Node label `--node-config-label` (default `gputopo.io/config`) names
the one this node uses. The selected file then takes the place of `--config`: flags > env >
that file > defaults, as always.

Selection, once at start (a changed label takes effect when the pod restarts):

1. `--node-config` / `GPUTOPO_NODE_CONFIG` when set (no API call), else the Node's label, read
   once through the API server (node name from `NODE_NAME`, the publisher's client setup);
2. no name: the config named `default`, else the only config when there is exactly one
   (NVIDIA's `named`, `single` fallbacks), else none (flags and env alone);
3. a name the ConfigMap does not hold is a `ConfigError` (exit 2, one line listing the names);
   so is a selected config that sets the selection settings themselves. The API call failing
   is a `NodeConfigUnavailable` (exit 1: the pod restarts and asks again).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence

from deviceplugin.settings import CONFIG_ENV, ConfigError, PluginConfig, build_parser, read_config_file

DEFAULT_NAME = "default"
#: ConfigMap keys: what a mounted ConfigMap folder can hold as file names.
_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
#: Settings that choose the config; meaningless (and refused) inside the chosen one.
_SELECTION = ("config_dir", "node_config", "node_config_label")

#: (node name, label key, kubeconfig) -> the label's value, or None when the node lacks it.
LabelLookup = Callable[[str, str, str | None], str | None]


class NodeConfigUnavailable(RuntimeError):
    """The Node's labels could not be read; the message says why."""


def config_names(config_dir: str) -> list[str]:
    """The configs of a mounted ConfigMap folder (its `..data` bookkeeping entries skipped)."""
    try:
        entries = sorted(os.listdir(config_dir))
    except FileNotFoundError:
        return []
    except OSError as e:
        raise ConfigError(f"config dir {config_dir}: {e.strerror or e}") from None
    return [
        name
        for name in entries
        if not name.startswith(".") and _KEY_RE.match(name) and os.path.isfile(os.path.join(config_dir, name))
    ]


def select(config_dir: str, name: str | None, source: str) -> str | None:
    """The file of config `name` (from `source`, for the message), or the fallback when None."""
    names = config_names(config_dir)
    if name is None:
        if DEFAULT_NAME in names:
            return os.path.join(config_dir, DEFAULT_NAME)
        return os.path.join(config_dir, names[0]) if len(names) == 1 else None
    if name not in names:
        known = ", ".join(names[:20]) or "none"
        shown = ascii(name[:64])  # another party's text: escaped, and bounded however it escapes
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ConfigError(f"node config {shown} ({source}) is not in {config_dir} (known: {known})")
    return os.path.join(config_dir, name)


def api_label(node: str, label: str, kubeconfig: str | None) -> str | None:
    """The Node's label through the API server, with the publisher's client setup."""
    from deviceplugin.publish.publisher import core_api

    try:
        found = core_api(kubeconfig).read_node(node, _request_timeout=10)
    except Exception as e:
        reason = getattr(e, "reason", None) or e
        raise NodeConfigUnavailable(
            f"cannot read node {node}'s labels: {type(e).__name__}: {reason}"
        ) from None
    labels = (found.metadata.labels if found.metadata is not None else None) or {}
    value = labels.get(label)
    return value if isinstance(value, str) and value else None


def resolve(
    argv: Sequence[str], environ: Mapping[str, str], first: PluginConfig, lookup: LabelLookup = api_label
) -> tuple[list[str], str | None, str]:
    """(argv with `--config <chosen file>`, the chosen name, how it was chosen); argv unchanged
    when `first` (flags + env alone) has no config dir or no config applies."""
    if not first.config_dir:
        return list(argv), None, "no config dir"
    if vars(build_parser().parse_args(list(argv))).get("config") or environ.get(CONFIG_ENV):
        raise ConfigError(f"--config-dir and --config ({CONFIG_ENV}) exclude each other")
    if not config_names(first.config_dir):
        return list(argv), None, f"{first.config_dir} holds no config"
    if first.node_config:
        name: str | None = first.node_config
        source = "--node-config"
    elif first.node_name:
        name = lookup(first.node_name, first.node_config_label, first.kubeconfig) or None  # "" = unset
        source = f"label {first.node_config_label} of node {first.node_name}"
    else:
        name, source = None, "no node name"
    path = select(first.config_dir, name, source)
    if path is None:
        return list(argv), None, f"{source}: unset, and no '{DEFAULT_NAME}' or single config"
    chosen = read_config_file(path)
    if set_here := [k for k in _SELECTION if k in chosen]:
        raise ConfigError(f"config file {path}: {', '.join(set_here)} cannot be set inside a node config")
    return [*argv, "--config", path], os.path.basename(path), source if name is not None else "fallback"
