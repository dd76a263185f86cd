"""`python -m deviceplugin [--mode dra]`: run the gputopo node daemon until SIGTERM/SIGINT.

This picks the mode; deviceplugin/startup.py runs either one the same way (settings, signals,
backend, exit codes: 0 after a signal, 2 for a bad setting or topology given, 1 when the node
cannot be served).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from deviceplugin.settings import DEVICE_PLUGIN, DRA, MODES
from deviceplugin.startup import Mode, run

PROG = "deviceplugin"


def mode_named(name: str) -> Mode | None:
    """The mode `--mode` names (its module loads only when chosen), None for an unknown name."""
    if name == DEVICE_PLUGIN:
        from deviceplugin.kubelet.mode import MODE as device_plugin

        return device_plugin
    if name == DRA:
        from deviceplugin.dra.mode import MODE as dra

        return dra
    return None


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ
    name, args = _mode(args)
    mode = mode_named(name)
    if mode is None:
        print(f"{PROG}: error: --mode must be one of {', '.join(MODES)}, got {name!r}", file=sys.stderr)
        return 2
    return run(mode, args, env)


def _mode(args: list[str]) -> tuple[str, list[str]]:
    """`--mode dra|device-plugin` (or `--mode=…`) taken out of the arguments."""
    for k, a in enumerate(args):
        if a == "--mode" and k + 1 < len(args):
            return args[k + 1], args[:k] + args[k + 2 :]
        if a.startswith("--mode="):
            return a.partition("=")[2], args[:k] + args[k + 1 :]
    return DEVICE_PLUGIN, args


if __name__ == "__main__":
    sys.exit(main())
