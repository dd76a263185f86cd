"""Start-up of the sidecar on a cluster snapshot file, beside a plain `json.load` of that file.

    python bench/bench_snapshot.py [--nodes 5000] [--yaml-nodes 500]

The snapshot is 5,000 nodes with inline topologies (about 10 MB of JSON, the size the issue
measured), written to a temporary file. Rows, each timed in this process on the same file:

* json.load: the floor, what reading the bytes as JSON costs;
* PyYAML pure-Python SafeLoader: what the snapshot loader used before (on a smaller file of
  `--yaml-nodes` nodes, scaled linearly: at 5,000 nodes it runs for minutes);
* load_cluster: the snapshot loader as the sidecar calls it (decode + validation + allocators);
* python -m scheduler --cluster: a real sidecar process, from exec until /readyz answers 200
  (interpreter start and imports included; the import-only time is shown for reference).

The target of the issue: the sidecar serves within 20x a plain json.load of the same file.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gputopo.network.cluster import generate_cluster, load_cluster  # noqa: E402
from gputopo.node.topofile import load_preset  # noqa: E402

MIX = ("dgx-a100", "hgx-h100", "dgx1-v100")


def snapshot_json(nodes: int) -> str:
    per_leaf = 20
    leaves = max(1, nodes // per_leaf)
    spines = max(1, leaves // 25)
    snap = generate_cluster(spines, max(1, leaves // spines), per_leaf, MIX, seed=1, busy_fraction=0.3)
    doc = snap.to_dict()
    inline = {p: load_preset(p).to_dict() for p in MIX}
    for node in doc["nodes"]:
        node["gpus"] = inline[node["gpus"]]
    return json.dumps(doc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_time(path: str, timeout: float = 300.0) -> float:
    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler", "--cluster", path, "--listen", f"127.0.0.1:{port}"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while time.perf_counter() - t0 < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"python -m scheduler exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("the sidecar did not become ready")
    finally:
        proc.terminate()
        proc.wait(10)


def import_time() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import scheduler.__main__"], cwd=REPO, check=True)
    return time.perf_counter() - t0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--yaml-nodes", type=int, default=500, help="nodes for the slow PyYAML row")
    args = ap.parse_args(argv)
    if args.nodes < 20 or args.yaml_nodes < 20:
        ap.error("--nodes and --yaml-nodes must be at least 20")
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "cluster.json")
        text = snapshot_json(args.nodes)
        Path(path).write_text(text)
        rows: list[tuple[str, float]] = []
        t0 = time.perf_counter()
        with open(path, encoding="utf-8") as f:
            json.load(f)
        floor = time.perf_counter() - t0
        rows.append(("json.load", floor))
        small = snapshot_json(args.yaml_nodes)
        t0 = time.perf_counter()
        yaml.load(small, Loader=yaml.SafeLoader)
        scale = len(text) / len(small)
        rows.append(
            (
                f"PyYAML SafeLoader (measured on {args.yaml_nodes} nodes, x{scale:.1f})",
                (time.perf_counter() - t0) * scale,
            )
        )
        t0 = time.perf_counter()
        load_cluster(path)
        rows.append(("load_cluster", time.perf_counter() - t0))
        rows.append(("python -m scheduler --cluster: exec to /readyz", serve_time(path)))
        rows.append(("  of which interpreter start + imports", import_time()))
        print(f"snapshot: {args.nodes} nodes, {len(text) / 1e6:.1f} MB of JSON")
        width = max(len(r[0]) for r in rows)
        print(f"{'what':<{width}}  {'seconds':>8}  {'x json.load':>11}")
        print(f"{'-' * width}  {'-' * 8}  {'-' * 11}")
        for name, secs in rows:
            print(f"{name:<{width}}  {secs:8.2f}  {secs / floor:11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
