"""Cost of one oversized device-ID list, before and after the limit, and shutdown under load.

    python bench/bench_requests.py [--sizes 1000,16000] [--repeat 3] [--shutdown]

Per size N, two request shapes kubelet never sends but any client of the socket can:

* prefer-unknown: GetPreferredAllocation offering the node's 8 GPUs plus N-8 unknown IDs;
* alloc-dups: Allocate listing N/2 IDs twice each (the list of duplicates grows with N).

Columns (seconds per request, best of --repeat, all measured in this process side by side):

* baseline: the first cut's validation, kept here verbatim as the reference: duplicates found
  with `i not in dups` over a list, unknown IDs excluded with `a not in ignored` over a tuple
  (both quadratic in N);
* linear: the same validation with sets but without the length limit, to show the algorithmic
  change alone;
* now: `deviceplugin.kubelet.requests` as shipped (the limit refuses N > MAX_REQUEST_IDS before any
  per-ID work);
* grpc now: the same request to `python -m deviceplugin` over its unix socket (protobuf
  decoding of N strings included).

`--shutdown` also times SIGTERM -> exit of `python -m deviceplugin` while four clients keep
100,000-ID requests in flight.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from deviceplugin.kubelet import requests  # noqa: E402
from deviceplugin.kubelet.requests import RequestError  # noqa: E402
from deviceplugin.state import Snapshot, make_snapshot  # noqa: E402
from gputopo.node.topofile import load_preset  # noqa: E402
from gputopo_proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc  # noqa: E402
from tests.kubelet_fake import fake_kubelet, short_tmpdir  # noqa: E402

PRESET = "dgx1-v100"


# --- the first cut's validation, verbatim in its data structures (the baseline) ---------------
def _old_duplicates(ids: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    dups: list[str] = []
    for i in ids:
        if i in seen and i not in dups:
            dups.append(i)
        seen.add(i)
    return dups


def old_preferred(snap: Snapshot, available: Sequence[str], size: int) -> object:
    if _old_duplicates(available):
        raise RequestError("dups")
    ignored = tuple(a for a in available if snap.index_of(a) is None)
    free = sorted(i for a in available if (i := snap.index_of(a)) is not None)
    choice = snap.allocator.choose(free, size, [])
    return choice, tuple(a for a in available if a not in ignored and not snap.healthy(a))


def old_allocate(snap: Snapshot, ids: Sequence[str]) -> object:
    if dups := _old_duplicates(ids):
        raise RequestError(f"{dups[0]} twice")
    return ids


# --- the same without the limit: what the data structures alone change -----------------------
def linear_preferred(snap: Snapshot, available: Sequence[str], size: int) -> object:
    if requests._duplicates(available):
        raise RequestError("dups")
    ignored = {a for a in available if snap.index_of(a) is None}
    free = sorted(i for a in available if (i := snap.index_of(a)) is not None)
    choice = snap.allocator.choose(free, size, [])
    return choice, tuple(a for a in available if a not in ignored and not snap.healthy(a))


def linear_allocate(snap: Snapshot, ids: Sequence[str]) -> object:
    if dups := requests._duplicates(ids):
        raise RequestError(f"{dups[0]} twice")
    return ids


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            fn()
        except RequestError:
            pass
        times.append(time.perf_counter() - start)
    return min(times)


def grpc_best(call: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            call()
        except grpc.RpcError:
            pass
        times.append(time.perf_counter() - start)
    return min(times)


def requests_of(uuids: list[str], n: int) -> tuple[list[str], list[str]]:
    unknown = uuids + [f"GPU-unknown-{i:08d}" for i in range(n - len(uuids))]
    half = unknown[: n // 2]
    return unknown, half + half  # every ID twice: the duplicate list grows to N/2


def plugin(folder: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "deviceplugin", "--kubelet-dir", str(folder), "--topology", PRESET],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "GPUTOPO_METRICS_PORT": "0", "GPUTOPO_LOG_LEVEL": "warning"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def shutdown_seconds(folder: Path, uuids: list[str]) -> float:
    sock = folder / "gputopo-gpu.sock"
    big_p, big_a = requests_of(uuids, 100_000)
    preq = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=big_p, allocation_size=1)
        ]
    )
    areq = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=big_a)])
    stop = threading.Event()

    def hammer() -> None:
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            stub = api_pb2_grpc.DevicePluginStub(ch)
            while not stop.is_set():
                for f in (stub.GetPreferredAllocation.future(preq), stub.Allocate.future(areq)):
                    try:
                        f.result(timeout=30)
                    except grpc.RpcError:
                        pass

    with fake_kubelet(folder) as kubelet:
        proc = plugin(folder)
        try:
            kubelet.wait(1, 30)
            threads = [threading.Thread(target=hammer, daemon=True) for _ in range(4)]
            for t in threads:
                t.start()
            time.sleep(1.0)
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            return time.monotonic() - start
        finally:
            stop.set()
            if proc.poll() is None:
                proc.kill()
                proc.wait()


Row = tuple[str, int, float, float, float, float]


def measure(
    snap: Snapshot, stub: api_pb2_grpc.DevicePluginStub, uuids: list[str], n: int, r: int
) -> list[Row]:
    """Both request shapes at N IDs: baseline, linear, now (in process) and now over gRPC."""
    unknown, dups = requests_of(uuids, n)
    preq = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=unknown, allocation_size=2)
        ]
    )
    areq = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=dups)])
    return [
        (
            "prefer-unknown",
            n,
            best(lambda: old_preferred(snap, unknown, 2), r),
            best(lambda: linear_preferred(snap, unknown, 2), r),
            best(lambda: requests.preferred(snap, unknown, [], 2), r),
            grpc_best(lambda: stub.GetPreferredAllocation(preq, timeout=600), r),
        ),
        (
            "alloc-dups",
            n,
            best(lambda: old_allocate(snap, dups), r),
            best(lambda: linear_allocate(snap, dups), r),
            best(lambda: requests.allocate_ids(snap, dups), r),
            grpc_best(lambda: stub.Allocate(areq, timeout=600), r),
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes", default="1000,16000", help="comma list of N (100000 takes minutes for the baseline)"
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shutdown", action="store_true", help="also time SIGTERM with requests in flight")
    args = ap.parse_args(argv)
    topo = load_preset(PRESET)
    snap = make_snapshot(1, topo, {})
    uuids = [g.uuid for g in topo.gpus]
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    folder = short_tmpdir()
    rows: list[Row] = []
    try:
        with fake_kubelet(folder) as kubelet:
            proc = plugin(folder)
            try:
                kubelet.wait(1, 30)
                with grpc.insecure_channel(f"unix://{folder / 'gputopo-gpu.sock'}") as ch:
                    grpc.channel_ready_future(ch).result(timeout=30)
                    stub = api_pb2_grpc.DevicePluginStub(ch)
                    for n in sizes:
                        rows += measure(snap, stub, uuids, n, args.repeat)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)
        print(
            f"limit: MAX_REQUEST_IDS = {requests.MAX_REQUEST_IDS}; seconds per request, best of {args.repeat}"
        )
        print(
            f"{'request':<16}{'N':>8}{'baseline':>12}{'linear':>12}{'now':>12}{'grpc now':>12}{'base/now':>12}"
        )
        for name, n, old, lin, now, rpc in rows:
            print(f"{name:<16}{n:>8,}{old:>12.6f}{lin:>12.6f}{now:>12.6f}{rpc:>12.6f}{old / now:>11.0f}x")
        by = {(name, n): old for name, n, old, *_ in rows}
        for name in ("prefer-unknown", "alloc-dups"):
            pairs = [n for n in sizes if (name, n) in by]
            if len(pairs) >= 2:
                a, b = pairs[0], pairs[-1]
                print(
                    f"baseline {name}: {b:,} vs {a:,} IDs costs {by[(name, b)] / by[(name, a)]:.0f}x ({b / a:.0f}x the IDs)"
                )
        if args.shutdown:
            shutil.rmtree(folder, ignore_errors=True)
            folder = short_tmpdir()
            print(
                f"SIGTERM -> exit with 100,000-ID requests in flight: {shutdown_seconds(folder, uuids):.2f} s"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
