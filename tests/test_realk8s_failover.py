"""Two scheduler replicas, as the chart deploys them, against the real kube-apiserver (v1.37, with
etcd) and the real kube-scheduler: each replica is a kube-scheduler with leader election on the
one Lease `gputopo-system/gputopo-scheduler` and its own gputopo sidecar. The leader (both of its
containers, as when its pod dies) is SIGKILLed at random points of a gang's life; the standby
takes the lease and finishes. Whatever the point, every gang ends whole in one leaf, and no
observation ever sees a gang's bound members in two leaves.

The lease timings are the chart's values `scheduler.leaderElection.*` set short (4 s / 3 s /
1 s) so that a takeover takes seconds. `make test-real` runs it; without the built binaries it
skips with one line.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gputopo.network.levels import LEAF
from tests import realk8s as rk

pytestmark = pytest.mark.real

LEASE_NS = "gputopo-system"
LEASE = "gputopo-scheduler"
_ids = itertools.count()


class Replica:
    """One scheduler pod: our sidecar and kube-scheduler electing on the shared Lease."""

    def __init__(self, c: rk.Cluster, name: str) -> None:
        self.c = c
        self.name = name
        self.sidecar: rk.Proc | None = None
        self.scheduler: rk.Proc | None = None

    def start(self) -> None:
        c = self.c
        self.sidecar = c.procs.start(
            f"sidecar-{self.name}",
            [rk.sys.executable, "-m", "scheduler", *rk.sidecar_args(0), "--kubeconfig", str(c.kubeconfig)],
        )
        m = rk._wait_line(self.sidecar, r'"event":"listening".*?"url":"http://127\.0\.0\.1:(\d+)"', 30)
        port = int(m.group(1))
        rk.wait_for(lambda: c._ready(port), 30, f"sidecar {self.name} ready")
        cfg = rk.scheduler_config(c.kubeconfig, f"http://127.0.0.1:{port}")
        cfg["leaderElection"] = {
            **rk.deploy_scheduler_config()["leaderElection"],
            "leaderElect": True,
            "leaseDuration": "4s",
            "renewDeadline": "3s",
            "retryPeriod": "1s",
        }
        path = c.folder / f"kube-scheduler-{self.name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        self.scheduler = c.procs.start(
            f"kube-scheduler-{self.name}",
            [str(c.bindir / "kube-scheduler"), f"--config={path}", *rk.scheduler_flags()],
        )

    def leads(self) -> bool:
        return self.scheduler is not None and "successfully acquired lease" in self.scheduler.text().lower()

    def kill(self) -> None:
        for p in (self.scheduler, self.sidecar):
            if p is not None:
                self.c.procs.kill(p)
        self.scheduler = self.sidecar = None


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[rk.Cluster, list[Replica]]]:
    bindir = rk.binaries()
    folder = Path(tmp_path_factory.mktemp("failover"))
    procs = rk.Procs(folder)
    try:
        c = rk.Cluster(procs, folder, bindir)
        c.start_api()
        c.namespace(LEASE_NS)
        replicas = [Replica(c, "r0"), Replica(c, "r1")]
        for r in replicas:
            r.start()
        rk.wait_for(lambda: any(r.leads() for r in replicas), 30, "a leader")
        yield c, replicas
    finally:
        procs.close()


def leader(replicas: list[Replica]) -> Replica:
    return rk.wait_for(lambda: next((r for r in replicas if r.leads()), None), 30, "a leader")


POINTS = ["before-any-filter", "after-1-bound", "after-2-bound", "after-3-bound", "random-0", "random-1"]


@pytest.mark.parametrize("point", POINTS)
def test_a_gang_ends_whole_in_one_leaf_whenever_the_leader_dies(
    pair: tuple[rk.Cluster, list[Replica]], point: str
) -> None:
    """A 4 x 8 gang on two leaves of four free nodes each. The leader is killed before the gang
    reaches it, as soon as 1, 2 or 3 members are bound, or at a random moment of its first half
    second; then restarted as the standby. The gang is bound whole, in one leaf, by whichever
    replica leads; bound members are never seen in two leaves."""
    c, replicas = pair
    ns = c.namespace(f"f{next(_ids)}")
    nodes = [rk.node(f"{ns}-{leaf[-1]}{i}", leaf) for leaf in ("leaf-a", "leaf-b") for i in range(4)]
    c.add_nodes(*nodes)
    leaf_of = {n["metadata"]["name"]: n["metadata"]["labels"][LEAF] for n in nodes}
    members = [f"g-{i}" for i in range(4)]

    def one_leaf(placed: dict[str, str]) -> bool:
        leaves = {leaf_of[n] for n in placed.values() if n}
        assert len(leaves) <= 1, f"gang bound across leaves: {placed}"
        return all(placed.get(m) for m in members)

    def bound() -> int:
        placed = c.api.placement(ns)
        one_leaf(placed)
        return sum(1 for n in placed.values() if n)

    try:
        old = leader(replicas)
        c.add_podgroup(ns, "g", len(members))
        for m in members:
            pod = rk.pod(m, 8, gang="g")
            pod["spec"]["schedulingGates"] = [{"name": rk.HOLD_GATE}]
            c.add_pods(ns, pod)
        if point == "before-any-filter":
            old.kill()
        for m in members:
            c.api.patch(f"/api/v1/namespaces/{ns}/pods/{m}", {"spec": {"schedulingGates": None}})
        if point.startswith("after-"):
            k = int(point.split("-")[1])
            rk.wait_for(lambda: bound() >= k, 30, f"{k} members bound", interval=0.01)
            old.kill()
        elif point.startswith("random-"):
            rk.time.sleep(random.Random(point).uniform(0.0, 0.5))
            old.kill()
        at_kill = bound()
        placed = c.wait_until(ns, one_leaf, timeout=60, what="the gang bound whole after the takeover")
        assert len(set(placed.values())) == len(members), placed
        print(
            f"{point}: {at_kill}/{len(members)} bound when the leader died, then whole in {leaf_of[placed['g-0']]}"
        )
    finally:
        for r in replicas:
            if r.scheduler is None:
                r.start()
        c.reset()
