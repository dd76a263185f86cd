"""Print what the NVML backend discovers on this machine, as JSON (`python -m deviceplugin.hardware.nvml_probe`).

A one-shot check for operators and for the team's GPU runs: the topology the plugin would
publish (design.md §3 form, with the PCIe level under each NVLink) and how long probing took,
so a wrong NVSwitch or NUMA reading can be seen without starting the daemon.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from deviceplugin.hardware.nvml import NvmlBackend, NvmlUnavailable


def main(argv: Sequence[str] | None = None, *, nvml: Any = None) -> int:
    parser = argparse.ArgumentParser(prog="nvml_probe", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="probes to time (default 3)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    try:
        start = time.perf_counter()
        backend = NvmlBackend(nvml=nvml)
        init_seconds = time.perf_counter() - start
    except NvmlUnavailable as e:
        print(f"nvml_probe: {e}", file=sys.stderr)
        return 1
    try:
        timings = []
        for _ in range(args.repeat):
            topology = backend.discover()
            timings.append(backend.last_probe_seconds or 0.0)
    finally:
        backend.close()
    doc = {
        "gpus": topology.n,
        "init_seconds": round(init_seconds, 6),
        "probe_seconds": round(min(timings), 6),
        "probe_seconds_all": [round(t, 6) for t in timings],
        "topology": topology.to_dict(),
        "matrix": [
            " ".join(f"{topology.code(i, j):>5}" for j in range(topology.n)) for i in range(topology.n)
        ],
    }
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
