"""The sidecar as deployed, at scale: `python -m scheduler` watching an API server, called over HTTP.

    .venv/bin/python bench/bench_live_http.py [--nodes 5000,20000,60000] [--singles 200] [--gang 64x8]

Per size, an API stand-in (tests/fake_apiserver.py) runs in a child process holding
bench_extender's generated fat tree (20 nodes a leaf, 25 leaves a spine; DGX A100 / HGX H100 /
DGX-1 in 2:1:1; 30 % of nodes partly busy, their GPUs held by bound pods and named in the
plugin annotation), `--singles` pending single pods of 1/2/4/8 GPUs and one PodGroup gang
(`--gang`, 64 pods of 8 GPUs by default). The sidecar starts as its own process
(`python -m scheduler --kubeconfig ...`, live mode) and a kube-scheduler stand-in
(tests/kube_scheduler_standin.py: filter offering every node, prioritize on the survivors, bind)
drives it over HTTP, as kube-scheduler does. Every pod is new to the sidecar when it is first
filtered, and each bind comes back to it as watch events, the pod's and its node's (the child
re-publishes the node's annotation with the pod's GPUs in use, as each node's plugin does), so
the figures include the live store's work, not only the verbs'.

Printed per size, beside the issue-30 targets and a baseline measured on the same machine:

  ready       start of the sidecar process to its first filter answer (after /readyz says every
              kind is listed; a filter before that finds the nodes unknown), against `json.load` of
              the same cluster's NodeList (the baseline: at most 3x is the target)
  singles/s   filter + prioritize + bind cycles per second for the single pods (≥ 200 at 20,000)
  filter ms   the /filter round trip of those pods, p50 / p99, wall clock (client included)
  gang s      the gang's first filter to its last bind (≤ 2 s at 20,000, ≤ 4 s at 60,000)
  RSS MiB     the sidecar process's peak resident memory (≤ 1 GiB at 60,000)

The three processes share the machine's CPUs, so on a 2-core box the wall-clock figures include
the stand-in and the client's JSON encoding; the sidecar process's own CPU seconds (from
/proc/PID/stat) are printed beside them, the figure to compare on a shared machine.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MIX = {"dgx-a100": 2.0, "hgx-h100": 1.0, "dgx1-v100": 1.0}
GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
TARGETS = {  # issue 30: (nodes, what) -> bound
    (20000, "singles"): 200.0,
    (20000, "gang"): 2.0,
    (60000, "gang"): 4.0,
    (60000, "rss"): 1024.0,
}


def _single(i: int) -> dict[str, Any]:
    from tests import fake_apiserver as fk

    return fk.pod("bench", f"single-{i:04d}", (1, 2, 4, 8)[i % 4])


def _gang(count: int, gpus: int) -> list[dict[str, Any]]:
    from tests import fake_apiserver as fk

    return fk.gang_pods("bench", "big", count, gpus)


def serve(size: int, singles: int, gang: tuple[int, int], list_file: str) -> None:
    """Child process: the API stand-in with the cluster and the pending pods; prints its URL."""
    from gputopo.network.annotation import encode, make
    from gputopo.network.cluster import generate_cluster
    from tests import fake_apiserver as fk

    spines = max(1, size // 500)
    snap = generate_cluster(spines, 25, 20, MIX, 0, busy_fraction=0.3)
    api = fk.FakeAPI()
    now = time.time()
    items = []
    for n in snap.nodes:
        assert n.topology is not None
        allocated = tuple(sorted(n.allocated))
        text = encode(make(n.name, n.topology, generated_at=now, plugin_version="0.1.0", allocated=allocated))
        obj = fk.node(n.name, dict(n.labels), gpus=n.gpu_count, annotations={"gputopo.io/topology": text})
        api.put("nodes", obj)
        items.append(obj)
        if n.allocated:
            api.put("pods", fk.pod("bench", f"bound-{n.name}", len(n.allocated), node_name=n.name))
    Path(list_file).write_text(json.dumps({"kind": "NodeList", "apiVersion": "v1", "items": items}))
    for i in range(singles):
        api.put("pods", _single(i))
    count, gpus = gang
    api.put("podgroups", fk.podgroup("bench", "big", count))
    for p in _gang(count, gpus):
        api.put("pods", p)
    api.history.clear()
    topologies = {n.name: n.topology for n in snap.nodes}
    held = {n.name: set(n.allocated) for n in snap.nodes}
    done = threading.Event()

    def plugins() -> None:
        """Every node's plugin: after a bind, the node's annotation is re-published with the
        pod's GPUs in use (the lowest free ones), as the device plugin does at each allocation,
        so each bind costs the sidecar a node event as well as a pod event."""
        seen = 0
        while not done.wait(0.01):
            for key, node in api.bindings[seen:]:
                pod = api.objects["pods"][key]
                gpus = int(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
                topo, used = topologies[node], held[node]
                assert topo is not None
                used.update([g for g in range(topo.n) if g not in used][:gpus])
                text = encode(
                    make(
                        node,
                        topo,
                        generated_at=time.time(),
                        plugin_version="0.1.0",
                        allocated=tuple(sorted(used)),
                    )
                )
                obj = json.loads(json.dumps(api.objects["nodes"][node]))
                obj["metadata"]["annotations"]["gputopo.io/topology"] = text
                api.put("nodes", obj)
            seen = len(api.bindings)

    with fk.running(api) as (_, server, _client):
        thread = threading.Thread(target=plugins, daemon=True)
        thread.start()
        print(server.url, flush=True)
        sys.stdin.read()
        done.set()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kubeconfig(url: str, path: Path) -> None:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "bench", "cluster": {"server": url}}],
                "users": [{"name": "bench", "user": {}}],
                "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
                "current-context": "bench",
            }
        )
    )


def _ready(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/readyz")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(url: str, list_file: str, singles: int, gang: tuple[int, int], workdir: Path) -> dict[str, Any]:
    from tests.kube_scheduler_standin import Outcome, StandIn

    names = [i["metadata"]["name"] for i in json.loads(Path(list_file).read_text())["items"]]
    t = time.perf_counter()
    with open(list_file) as f:
        json.load(f)
    json_load_s = time.perf_counter() - t

    kubeconfig = workdir / "kubeconfig"
    _kubeconfig(url, kubeconfig)
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "proto")]))
    start = time.perf_counter()
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "scheduler", "--kubeconfig", str(kubeconfig), "--listen", f"127.0.0.1:{port}",
         "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while not _ready(port):  # /readyz: every kind listed (what the chart's readinessProbe asks)
            if sidecar.poll() is not None:
                raise SystemExit(f"the sidecar exited with {sidecar.returncode} before it was ready")
            time.sleep(0.02)
        standin = StandIn("127.0.0.1", port, names)
        status, res = standin._post("/filter", standin._args(_single(-1), names))  # the first answer
        if status != 200 or res.get("Error") or not res.get("NodeNames"):
            raise SystemExit(f"the first filter after ready failed: {status} {str(res)[:300]}")
        ready_s = time.perf_counter() - start
        ready_cpu = _cpu_s(sidecar.pid)
        assert standin is not None

        filter_ms: list[float] = []
        post = standin._post

        def timed_post(path: str, doc: Any) -> tuple[int, Any]:
            t0 = time.perf_counter()
            got = post(path, doc)
            if path == "/filter":
                filter_ms.append((time.perf_counter() - t0) * 1000)
            return got

        standin._post = timed_post  # type: ignore[method-assign]
        out = Outcome()
        t, c = time.perf_counter(), _cpu_s(sidecar.pid)
        bound = sum(standin.schedule_one(_single(i), out) is not None for i in range(singles))
        singles_s = time.perf_counter() - t
        singles_cpu = _cpu_s(sidecar.pid) - c
        reasons = sorted({r for r in out.pending.values()})[:3]
        single_filters = list(filter_ms)

        count, gpus = gang
        pods = _gang(count, gpus)
        gout = Outcome()
        t, c = time.perf_counter(), _cpu_s(sidecar.pid)
        deadline = t + 120
        pending = list(pods)
        while pending and time.perf_counter() < deadline:
            pending = [p for p in pending if standin.schedule_one(p, gout) is None]
        gang_s = time.perf_counter() - t
        gang_cpu = _cpu_s(sidecar.pid) - c
        standin.close()
        rss = _peak_rss_mib(sidecar.pid)
    finally:
        sidecar.terminate()
        sidecar.wait(timeout=30)
    return {
        "nodes": len(names),
        "json_load_s": json_load_s,
        "ready_s": ready_s,
        "ready_cpu_s": ready_cpu,
        "singles_bound": bound,
        "singles_per_s": singles / singles_s,
        "singles_per_cpu_s": singles / singles_cpu if singles_cpu > 0 else float("inf"),
        "singles_pending_reasons": reasons,
        "filter_p50_ms": float(np.percentile(single_filters, 50)),
        "filter_p99_ms": float(np.percentile(single_filters, 99)),
        "gang_bound": len(gout.bound),
        "gang_s": gang_s,
        "gang_cpu_s": gang_cpu,
        "gang_filters": gout.calls,
        "rss_mib": rss,
    }


def _verdict(size: int, what: str, value: float, higher_is_better: bool = False) -> str:
    bound = TARGETS.get((size, what))
    if bound is None:
        return ""
    ok = value >= bound if higher_is_better else value <= bound
    return f" [{'met' if ok else 'missed'}: {'≥' if higher_is_better else '≤'} {bound:g}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="5000,20000,60000")
    ap.add_argument("--singles", type=int, default=200)
    ap.add_argument("--gang", default="64x8", help="COUNTxGPUS (default 64x8)")
    ap.add_argument("--role", choices=["serve"], help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--list-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    count, gpus = (int(x) for x in args.gang.split("x"))
    if args.role == "serve":
        serve(args.size, args.singles, (count, gpus), args.list_file)
        return 0
    for size in (int(s) for s in args.nodes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            list_file = str(Path(tmp) / "nodes.json")
            child = subprocess.Popen(
                [sys.executable, __file__, "--role", "serve", "--size", str(size), "--singles", str(args.singles),
                 "--gang", args.gang, "--list-file", list_file],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert child.stdout is not None and child.stdin is not None
            url = child.stdout.readline().strip()
            try:
                got = measure(url, list_file, args.singles, (count, gpus), Path(tmp))
            finally:
                child.stdin.close()
                child.wait(timeout=120)
        n = got["nodes"]
        ratio = got["ready_s"] / got["json_load_s"]
        print(f"nodes {n:,}", flush=True)
        print(
            f"  ready              {got['ready_s']:8.2f} s   json.load {got['json_load_s']:.2f} s   "
            f"{ratio:.1f}x [{'met' if ratio <= 3 else 'missed'}: ≤ 3x]   sidecar CPU {got['ready_cpu_s']:.2f} s"
        )
        print(
            f"  singles            {got['singles_per_s']:8.1f} /s  ({got['singles_bound']}/{args.singles} bound; "
            f"{got['singles_per_cpu_s']:.0f} per sidecar CPU second)"
            + _verdict(n, "singles", got["singles_per_s"], True)
        )
        print(
            f"  filter p50 / p99   {got['filter_p50_ms']:8.2f} / {got['filter_p99_ms']:.2f} ms (wall, client included)"
        )
        print(
            f"  gang {args.gang:<8}      {got['gang_s']:8.2f} s   ({got['gang_bound']}/{count} bound, "
            f"{got['gang_filters']} calls; sidecar CPU {got['gang_cpu_s']:.2f} s)"
            + _verdict(n, "gang", got["gang_s"])
        )
        print(
            f"  peak RSS           {got['rss_mib']:8.0f} MiB" + _verdict(n, "rss", got["rss_mib"]), flush=True
        )
        print(json.dumps(got), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
