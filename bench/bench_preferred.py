"""GetPreferredAllocation latency: the allocator in process, the plugin over its unix socket,
and a brute-force baseline measured in the same process on the same requests.

    python bench/bench_preferred.py [--requests 300] [--seed 7]

Requests: a random free set (1..n GPUs), a random size (1..|free|), sometimes one
must-include GPU; kubelet's random ID order is imitated by shuffling the offered UUIDs.

* baseline: `tests.oracle` brute force, a fresh oracle per request (no tables, no caching
  across calls). Up to 8 GPUs it is the full objective; on 16 GPUs the full objective is out
  of reach for brute force (the least-disruption packing of 15 leftover GPUs alone runs for
  minutes), so the baseline is brute force over key 1 (ring bandwidth) only, the part
  design.md §2 promises exact on 16 GPUs.
* allocator: `gputopo.node.allocator.Allocator.choose`, the allocator built once (build time shown).
  Up to 8 GPUs its no-must-include answers are tabulated at build, so a request is a lookup.
* pair points: the simulator's model of NVIDIA go-gpuallocator's best-effort policy (pair-point
  partitions), the in-node choice most clusters run, on the same requests in the same process.
* grpc floor: GetDevicePluginOptions on the same channel, a call that does no work: what the
  Python gRPC transport alone costs on this machine.
* grpc: `python -m deviceplugin` in its own process (file backend, info-level decision logs
  written to /dev/null, so their cost is included) answering GetPreferredAllocation from a
  client in this process over the plugin's socket, one container request per call as kubelet
  sends it.

Speed-up = baseline / method at the same percentile (> 1: faster than brute force).
"agree" counts answers equal to the baseline's (whole set up to 8 GPUs, ring bandwidth on 16).
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gputopo.node.allocator import Allocator  # noqa: E402
from gputopo.node.policies.pairpoints import pair_points  # noqa: E402
from gputopo.node.policies.search import best_effort  # noqa: E402
from gputopo.node.topofile import load_preset  # noqa: E402
from gputopo.node.topology import Topology  # noqa: E402
from gputopo_proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc  # noqa: E402
from tests.oracle import Oracle, brute_force_choose  # noqa: E402

PRESETS = ("rtx8000-4", "gb200-tray", "dgx1-v100", "hgx-h100", "dgx2-v100")
TARGET_P99_MS = {8: 2.0, 16: 20.0}  # over gRPC


@dataclass(frozen=True)
class Request:
    free: tuple[int, ...]
    size: int
    must: tuple[int, ...]


def make_requests(n: int, count: int, rng: random.Random) -> list[Request]:
    out = []
    for _ in range(count):
        free = tuple(sorted(rng.sample(range(n), rng.randint(1, n))))
        size = rng.randint(1, len(free))
        must = tuple(rng.sample(free, 1)) if size > 1 and rng.random() < 0.25 else ()
        out.append(Request(free, size, must))
    return out


def timed(fn: Callable[[Request], object], reqs: Sequence[Request]) -> tuple[list[float], list[object]]:
    times, answers = [], []
    for r in reqs:
        t0 = time.perf_counter()
        answers.append(fn(r))
        times.append(time.perf_counter() - t0)
    return times, answers


def pct(times: Sequence[float], q: float) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000.0


class PluginProcess:
    """The real plugin, in its own process, on a socket in a fresh folder."""

    def __init__(self, preset: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="gt-bench-", dir="/tmp"))
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "deviceplugin",
                "--kubelet-dir",
                str(self.folder),
                "--topology",
                preset,
                "--metrics-port",
                "0",
                "--log-level",
                "info",
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.channel = grpc.insecure_channel(f"unix://{self.folder / 'gputopo-gpu.sock'}")
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.stub = api_pb2_grpc.DevicePluginStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)


def grpc_caller(stub: api_pb2_grpc.DevicePluginStub, topo: Topology, rng: random.Random) -> Callable:
    uuids = [g.uuid for g in topo.gpus]
    index = {u: i for i, u in enumerate(uuids)}

    def call(r: Request) -> tuple[int, ...]:
        offer = [uuids[i] for i in r.free]
        rng.shuffle(offer)
        req = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=offer,
                    must_include_deviceIDs=[uuids[i] for i in r.must],
                    allocation_size=r.size,
                )
            ]
        )
        resp = stub.GetPreferredAllocation(req, timeout=30)
        return tuple(sorted(index[u] for u in resp.container_responses[0].deviceIDs))

    return call


def bench_preset(preset: str, count: int, seed: int) -> list[tuple]:
    topo = load_preset(preset)
    n = topo.n
    rng = random.Random(seed)
    reqs = make_requests(n, count, rng)
    t0 = time.perf_counter()
    alloc = Allocator(topo)
    build_ms = (time.perf_counter() - t0) * 1000

    full = n <= 8
    base_reqs = reqs if full else reqs[: max(20, count // 10)]
    if full:
        base_fn: Callable[[Request], object] = lambda r: brute_force_choose(topo, r.free, r.size, r.must)  # noqa: E731
        base_name = "brute force (full objective)"
    else:
        base_fn = lambda r: Oracle(topo).best_ring(r.free, r.size, r.must)  # noqa: E731
        base_name = "brute force (key 1: ring)"
    base_t, base_a = timed(base_fn, base_reqs)

    alloc_t, alloc_a = timed(lambda r: alloc.choose(r.free, r.size, r.must), reqs)
    points = pair_points(topo, nvswitch_visible=False)
    pairs_t, pairs_a = timed(lambda r: best_effort(points, r.free, r.size, r.must), reqs)
    plugin = PluginProcess(preset)
    try:
        call = grpc_caller(plugin.stub, topo, random.Random(seed + 1))
        # warm the channel and the plugin's code paths on other requests (the allocator caches answers)
        timed(call, make_requests(n, 20, random.Random(seed + 2)))
        grpc_t, grpc_a = timed(call, reqs)
        # the transport alone: a call that does no work, on the same channel and process
        floor_t, _ = timed(lambda r: plugin.stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=30), reqs)
    finally:
        plugin.close()

    def agree(answers: Sequence[object]) -> str:
        # the pair-point model may answer () or a set padded with None (its nil device)
        sets = [
            tuple(sorted(i for i in getattr(a, "indices", a) if i is not None))
            for a in answers[: len(base_a)]
        ]
        if full:
            same = sum(a == b for a, b in zip(sets, base_a, strict=True))
        else:
            same = sum(alloc.ring_mbps(a) == b for a, b in zip(sets, base_a, strict=True))
        return f"{same}/{len(base_a)}"

    b50, b99 = pct(base_t, 0.5), pct(base_t, 0.99)
    rows = [(preset, n, base_name, len(base_t), b50, b99, "1.0", "1.0", "-", "-")]
    for name, times, answers in (
        (f"allocator.choose (build {build_ms:.0f} ms)", alloc_t, alloc_a),
        ("pair points (go-gpuallocator model)", pairs_t, pairs_a),
        ("grpc GetPreferredAllocation", grpc_t, grpc_a),
    ):
        p50, p99 = pct(times, 0.5), pct(times, 0.99)
        target = TARGET_P99_MS.get(n) if name.startswith("grpc") else None
        verdict = "-" if target is None else (f"ok (<{target:g})" if p99 < target else f"MISS (>{target:g})")
        rows.append(
            (
                preset,
                n,
                name,
                len(times),
                p50,
                p99,
                f"{b50 / p50:.1f}",
                f"{b99 / p99:.1f}",
                agree(answers),
                verdict,
            )
        )
    f50, f99 = pct(floor_t, 0.5), pct(floor_t, 0.99)
    rows.append(
        (preset, n, "grpc floor (GetDevicePluginOptions)", len(floor_t), f50, f99, "-", "-", "-", "-")
    )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="requests per preset (default 300)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--presets", default=",".join(PRESETS), help="comma-separated preset names")
    args = ap.parse_args(argv)
    if args.requests < 20:
        ap.error("--requests must be at least 20")
    head = (
        "preset",
        "gpus",
        "method",
        "n",
        "p50 ms",
        "p99 ms",
        "speed-up p50",
        "speed-up p99",
        "agree",
        "p99 target",
    )
    rows = []
    for preset in args.presets.split(","):
        rows += bench_preset(preset.strip(), args.requests, args.seed)
    cells = [[str(c) if not isinstance(c, float) else f"{c:.3f}" for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
