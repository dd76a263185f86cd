"""Failover as it happens: two sidecars over one API server, the leader killed mid-gang.

kube-scheduler with leader election calls only its own pod's sidecar, over loopback; the other
replica's sidecar watches the API and is called by nobody until its kube-scheduler wins the
lease. So here: sidecar A (the leader) and sidecar B (the standby) both watch the fake API
server through the official client; a kube-scheduler stand-in (tests/kube_scheduler_standin.py)
drives A through part of a gang's life, A is killed (its HTTP server and its watches stopped,
its memory gone with it), and a second stand-in drives B. B knows only what the API shows.

Kill points, per seed: `quorum` (members filtered while the gang waits for its last member),
`planned` (the first member filtered: a plan and reservations exist, nothing bound) and
`bound-j` (j members bound). In `better-leaf` seeds the leaf the gang was planned in is no
longer the best choice when B takes over (the other leaf was full and empties meanwhile), and
competing pods (single pods, a second gang) reach B before the gang's remaining members, in a
seeded order. Every gang must end whole in one leaf or not at all, and no node may be given
more GPUs than it has, nor one GPU predicted for two pods.

Set GPUTOPO_FAILOVER_TABLE=path to append one JSON line per seed (the failover table of
docs/operator.md "Failover").
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gputopo.network.annotation import encode, make
from gputopo.network.levels import LEAF, SPINE
from gputopo.node.topofile import load_preset
from scheduler.extender import Extender
from scheduler.live.kube import KubeState
from scheduler.model import parse_pod
from scheduler.report.events import EventEmitter
from scheduler.web.server import Server
from tests import fake_apiserver as fk
from tests import realk8s as rk
from tests.kube_scheduler_standin import Outcome, StandIn

NOW = 1_800_000_000.0
KEY = "gputopo.io/topology"
GROUP = "pod-group.scheduling.sigs.k8s.io/name"
MIN = "pod-group.scheduling.sigs.k8s.io/min-available"
REQUIRED = "gputopo.io/required-topology"
NS = "ml"
LEAVES = {"l1": ("a1", "a2"), "l2": ("b1", "b2")}
NODES = [n for names in LEAVES.values() for n in names]
LEAF_OF = {n: leaf for leaf, names in LEAVES.items() for n in names}
SEEDS = range(24)


def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached")


@dataclass
class Sidecar:
    """One replica's sidecar: its watches, its extender (all its memory) and its HTTP server."""

    state: KubeState
    ext: Extender
    server: Server
    emitter: EventEmitter | None = None

    @classmethod
    def start(
        cls, api_client: Any, clock: list[float], events: bool = False, spill_after_s: float | None = None
    ) -> Sidecar:
        state = KubeState(api_client, clock=lambda: clock[0], watch_timeout_s=5, backoff_s=(0.05, 0.2))
        emitter = None
        if events:  # Kubernetes Events of gang decisions, as `python -m scheduler` writes them
            emitter = EventEmitter(api_client, pod_uid=state.pod_uid, group_ref=state.group_ref)
        wait = {} if spill_after_s is None else {"spill_after_s": spill_after_s}
        ext = Extender(state, clock=lambda: clock[0], events=emitter, **wait)
        server = Server(ext, "127.0.0.1", 0)
        state.start()
        wait_until(state.ready)
        server.start()
        return cls(state, ext, server, emitter)

    def scheduler(self) -> StandIn:
        """A kube-scheduler that calls this sidecar (as the lease holder's does over loopback)."""
        return StandIn("127.0.0.1", self.server.address[1], NODES)

    def kill(self) -> None:
        self.server.stop()
        self.state.stop()
        if self.emitter is not None:
            self.emitter.stop()

    def sees(self, api: fk.FakeAPI) -> bool:
        """Whether this sidecar's watch shows every pod as the API holds it (bound or not)."""
        want = {k: (o["spec"].get("nodeName") or "") for k, o in api.objects["pods"].items()}
        have = {k: p.node for k, p in self.state.snapshot().pods.items()}
        return want == have


def annotation(name: str) -> str:
    topo = load_preset("dgx-a100")
    return encode(make(name, topo, generated_at=NOW, plugin_version="0.1.0", allocated=()))


def gang_pod(gang: str, i: int, gpus: int, minimum: int, required: bool) -> dict[str, Any]:
    labels = {GROUP: gang, MIN: str(minimum)}
    return fk.pod(NS, f"{gang}-{i}", gpus, labels=labels, annotations={REQUIRED: LEAF} if required else {})


@dataclass
class Scenario:
    seed: int
    kill: str  # quorum | planned | bound-<j>
    better_leaf: bool
    members: int
    gpus: int
    required: bool
    competitors: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def draw(cls, seed: int) -> Scenario:
        rnd = random.Random(seed)
        members, gpus = rnd.choice([(2, 8), (3, 4), (4, 4), (2, 4)])
        kill = rnd.choice(["quorum", "planned", "bound", "bound"])
        if kill == "bound":
            kill = f"bound-{rnd.randint(1, members - 1)}"
        s = cls(seed, kill, rnd.random() < 0.6, members, gpus, rnd.random() < 0.3)
        for i in range(rnd.randint(1, 3)):
            s.competitors.append(fk.pod(NS, f"single-{i}", rnd.choice([2, 4, 8])))
        if rnd.random() < 0.5:
            s.competitors += [gang_pod("other", i, 4, 2, False) for i in range(2)]
        rnd.shuffle(s.competitors)
        return s


@pytest.fixture
def api() -> Iterator[tuple[fk.FakeAPI, Any]]:
    with fk.running() as (fake, _, api_client):
        for n in NODES:
            labels = {LEAF: LEAF_OF[n], SPINE: "s1"}
            fake.put("nodes", fk.node(n, labels, annotations={KEY: annotation(n)}))
        yield fake, api_client


def run_failover(fake: fk.FakeAPI, api_client: Any, s: Scenario) -> dict[str, Any]:
    """One seed: leader A works the gang to the kill point, dies, standby B finishes."""
    clock = [NOW]
    gang = [gang_pod("g", i, s.gpus, s.members, s.required) for i in range(s.members)]
    if s.better_leaf:  # l2 is full while A plans: the gang goes to l1
        for n in LEAVES["l2"]:
            fake.put("pods", fk.pod(NS, f"filler-{n}", 8, node_name=n))
    first = gang[:-1] if s.kill == "quorum" else gang
    for p in first:
        fake.put("pods", p)
    a = Sidecar.start(api_client, clock)
    b = Sidecar.start(api_client, clock)  # the standby: watching, never called
    try:
        wait_until(lambda: a.sees(fake))
        leader = a.scheduler()
        out = Outcome()
        if s.kill == "quorum":
            for p in first:
                assert leader.schedule_one(p, out) is None  # waits for its last member
        elif s.kill == "planned":
            status, res = leader._post("/filter", {"Pod": gang[0], "Nodes": None, "NodeNames": NODES})
            assert status == 200 and res["NodeNames"], res
        else:
            for p in gang[: int(s.kill.split("-")[1])]:
                assert leader.schedule_one(p, out) is not None, out.pending
        leader.close()
        a.kill()  # its plan, reservations, predictions, wait clocks and demand mix die with it
        before = dict(out.bound)

        # between the kill and the takeover (kube-scheduler's lease runs out meanwhile)
        if s.better_leaf:
            for n in LEAVES["l2"]:
                fake.delete("pods", f"{NS}/filler-{n}")
        if s.kill == "quorum":
            fake.put("pods", gang[-1])
        for p in s.competitors:
            fake.put("pods", p)
        clock[0] += 15.0  # kube-scheduler's default leaseDuration
        wait_until(lambda: b.sees(fake))

        pending = list(s.competitors) + [p for p in gang if f"{NS}/{p['metadata']['name']}" not in before]
        random.Random(s.seed + 1000).shuffle(pending)
        first_call: list[float] = []
        new_leader = b.scheduler()
        new_leader.before_filter = lambda pod: (
            first_call.append(time.perf_counter()) if not first_call else None
        )
        new_leader.after_filter = lambda pod, res: (
            first_call.append(time.perf_counter()) if len(first_call) == 1 else None
        )
        t0 = time.perf_counter()
        new_leader.run(pending, clock=clock, tick_s=1.0, idle_rounds=4)
        total = time.perf_counter() - t0
        new_leader.close()
        return {
            "first_call_ms": round(1000 * (first_call[1] - first_call[0]), 2)
            if len(first_call) > 1
            else None,
            "finish_s": round(total, 3),
            "adopted": b.ext.takeovers,
        }
    finally:
        a.kill()
        b.kill()


def verdict(fake: fk.FakeAPI) -> dict[str, Any]:
    return judge(list(fake.objects["pods"].values()), fake.events, LEAF_OF)


def judge(
    pods: list[dict[str, Any]], events: list[dict[str, Any]], leaf_of: dict[str, str]
) -> dict[str, Any]:
    """Where every gang ended, and whether any node or GPU was promised twice."""
    by_key = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
    gangs: dict[str, list[str]] = {}
    used: dict[str, int] = {}
    for p in pods:
        node = p["spec"].get("nodeName") or ""
        g = (p["metadata"].get("labels") or {}).get(GROUP)
        if g:
            gangs.setdefault(g, []).append(node)
        if node:
            gpus = int(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
            used[node] = used.get(node, 0) + gpus
    ends = {}
    for g, nodes in gangs.items():
        leaves = {leaf_of[n] for n in nodes if n}
        bound = sum(1 for n in nodes if n)
        if len(leaves) > 1 and bound == len(nodes):
            ends[g] = "spread"  # all bound, across leaves: a preferred level spilt to the spine
        elif len(leaves) > 1:
            ends[g] = "split"
        elif bound == 0:
            ends[g] = "none"
        elif bound == len(nodes):
            ends[g] = "whole"
        else:
            ends[g] = "part"
    # the GPUs each sidecar predicted per bound pod (its GPUsPredicted Event, latest wins)
    predicted: dict[str, tuple[str, set[int]]] = {}
    for e in map(fk.event_view, events):  # core/v1 or events.k8s.io/v1, as the sidecar wrote it
        if e["reason"] == "GPUsPredicted":
            msg = e["message"]  # "gputopo predicts GPUs 0,1 on node a1"
            gpus = {int(x) for x in msg.split("GPUs ")[1].split(" on node ")[0].split(",")}
            pod = f"{e['ref']['namespace']}/{e['name']}"
            predicted[pod] = (msg.rsplit(" ", 1)[1], gpus)
    double = 0
    for node in leaf_of:
        seen: set[int] = set()
        for key, (n, g) in predicted.items():
            if n == node and (by_key.get(key) or {}).get("spec", {}).get("nodeName") == node:
                double += len(seen & g)
                seen |= g
    over = {n: u - 8 for n, u in used.items() if u > 8}
    return {"gangs": ends, "overbooked_gpus": sum(over.values()), "double_predicted_gpus": double}


@pytest.mark.parametrize("seed", SEEDS)
def test_a_leader_killed_mid_gang_leaves_every_gang_whole_or_unbound(api, seed: int) -> None:
    fake, api_client = api
    s = Scenario.draw(seed)
    timing = run_failover(fake, api_client, s)
    v = verdict(fake)
    row = {
        "seed": seed,
        "kill": s.kill,
        "better_leaf": s.better_leaf,
        "gang": f"{s.members}x{s.gpus}" + (" required leaf" if s.required else ""),
        **v,
        **timing,
    }
    table = os.environ.get("GPUTOPO_FAILOVER_TABLE")
    if table:
        with open(table, "a") as f:
            f.write(json.dumps(row) + "\n")
    assert v["overbooked_gpus"] == 0, row
    assert v["double_predicted_gpus"] == 0, row
    assert v["gangs"]["g"] in ("whole", "none"), row
    # the competing gang asks for no level: placed now in the smallest level that holds it
    # (docs/scheduler.md "start when you can"), which may be the spine once single pods may no
    # longer take a member's reserved GPUs (issue 30); all of it or none of it, always
    assert v["gangs"].get("other", "none") in ("whole", "none", "spread"), row
    if s.kill.startswith("bound"):  # a part-bound gang is finished where it began
        assert v["gangs"]["g"] == "whole", row


def test_a_leader_that_comes_back_drops_its_stale_plan_for_members_another_replica_bound(api) -> None:
    """A plans the gang in l1 (l2 full), loses the lease without dying; l2 empties, a1 is
    cordoned, and B binds two members in l2 on its own plan, then loses the lease in turn (a1
    uncordoned). A, called again with its reservations still in time, must not send the last
    member to l1: members bound by another replica break its plan, and the rest is re-planned
    beside them."""
    fake, api_client = api
    clock = [NOW]
    gang = [gang_pod("g", i, 4, 3, False) for i in range(3)]
    for n in LEAVES["l2"]:
        fake.put("pods", fk.pod(NS, f"filler-{n}", 8, node_name=n))
    for p in gang:
        fake.put("pods", p)
    a = Sidecar.start(api_client, clock)
    b = Sidecar.start(api_client, clock)
    try:
        wait_until(lambda: a.sees(fake))
        first_term = a.scheduler()
        status, res = first_term._post("/filter", {"Pod": gang[0], "Nodes": None, "NodeNames": NODES})
        assert status == 200 and LEAF_OF[res["NodeNames"][0]] == "l1", res
        assert a.ext.reservations.get(f"{NS}/g-2") is not None
        first_term.close()

        for n in LEAVES["l2"]:  # l2 empties; B is the leader now
            fake.delete("pods", f"{NS}/filler-{n}")
        clock[0] += 15.0
        wait_until(lambda: b.sees(fake))
        second = StandIn("127.0.0.1", b.server.address[1], NODES, unschedulable={"a1"})
        out = Outcome()
        for p in gang[:2]:
            assert second.schedule_one(p, out) is not None, out.pending
        second.close()
        assert {LEAF_OF[n] for n in out.bound.values()} == {"l2"}, out.bound  # B's own best plan

        clock[0] += 15.0  # A wins the lease back, its reservations (120 s) still in time
        wait_until(lambda: a.sees(fake))
        third = a.scheduler()
        third.run([gang[2]], clock=clock, idle_rounds=3)
        third.close()
        assert verdict(fake)["gangs"] == {"g": "whole"}, fake.objects["pods"].keys()
        placed = {k: o["spec"].get("nodeName") for k, o in fake.objects["pods"].items() if "/g-" in k}
        assert {LEAF_OF[n] for n in placed.values()} == {"l2"}, placed
    finally:
        a.kill()
        b.kill()


# --------------------------------------------------------------- processes, SIGKILL


CHAIN = ["quorum", "planned", "bound-1", "bound-2"]  # one failover each, leaders alternating


def drive_to(kill: str, drive: StandIn, made: list[dict[str, Any]], nodes: list[str]) -> Outcome:
    """The leader's kube-scheduler takes the gang to the kill point (asking again until the
    leader's watch shows every member: kube-scheduler's own informer would wait for that too)."""
    out = Outcome()
    if kill == "quorum":
        for p in made:
            assert drive.schedule_one(p, out) is None
    elif kill == "planned":
        args = {"Pod": made[0], "Nodes": None, "NodeNames": nodes}
        rk.wait_for(lambda: drive._post("/filter", args)[1]["NodeNames"], 10, "a plan")
    else:
        for p in made[: int(kill.split("-")[1])]:
            rk.wait_for(lambda p=p: drive.schedule_one(p, out), 10, f"{p['metadata']['name']} bound")
    drive.close()
    return out


def test_sidecar_processes_killed_mid_gang_in_a_chain_of_failovers(tmp_path) -> None:
    """The same as real processes: `python -m scheduler --kubeconfig` twice over the API server
    stand-in of ../shared/realk8s, the leader SIGKILLed at each kill point in turn, the killed
    one restarted as the new standby (its cold start measured), the standby taking over after
    a short stand-in for the lease. Each failover has its own nodes, namespace and gang (3 x 4
    GPUs); in the bound ones the other leaf was full at the plan and is empty at the takeover,
    and competitors (an 8-GPU pod, then a 4-GPU pod) are asked about before the gang's rest."""
    standin = rk.REALK8S / "apiserver_standin.py"
    if not standin.is_file():
        pytest.skip(f"API server stand-in not present ({standin})")
    procs = rk.Procs(tmp_path)
    kubeconfig = tmp_path / "kc.json"
    try:
        proc = procs.start(
            "apiserver",
            [sys.executable, str(standin), "--port", "0", "--kubeconfig", str(kubeconfig)],
        )
        port = int(rk._wait_line(proc, r"fake apiserver on 127\.0\.0\.1:(\d+)", 20).group(1))
        api = rk.Api(f"http://127.0.0.1:{port}")

        def sidecar() -> tuple[rk.Proc, int, float]:
            t0 = time.perf_counter()
            p = procs.start(
                "sidecar",
                [
                    sys.executable,
                    "-m",
                    "scheduler",
                    "--listen=127.0.0.1:0",
                    "--metrics-listen=127.0.0.1:0",
                    "--kubeconfig",
                    str(kubeconfig),
                ],
            )
            m = rk._wait_line(p, r'"event":"listening".*?"url":"http://127\.0\.0\.1:(\d+)"', 30)
            sport = int(m.group(1))
            rk.wait_for(lambda: rk.Cluster._ready(sport), 30, "the sidecar's /readyz")
            return p, sport, time.perf_counter() - t0

        leader, standby = sidecar(), sidecar()
        rows = []
        for k, kill in enumerate(CHAIN):
            ns = f"chain-{k}"
            api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
            leaves = {f"c{k}l1": (f"c{k}a1", f"c{k}a2"), f"c{k}l2": (f"c{k}b1", f"c{k}b2")}
            leaf_of = {n: leaf for leaf, names in leaves.items() for n in names}
            for n, leaf in leaf_of.items():
                api.create("/api/v1/nodes", rk.node(n, leaf))
            nodes = list(leaf_of)
            full = list(leaves)[1]
            bound_phase = kill.startswith("bound")
            if bound_phase:
                for n in leaves[full]:
                    filler = rk.pod(f"filler-{n}", 8)
                    filler["spec"]["nodeName"] = n
                    api.create(f"/api/v1/namespaces/{ns}/pods", filler)
            gang = []
            for i in range(3):
                p = rk.pod(f"g-{i}", 4)
                p["metadata"]["labels"] = {GROUP: "g", MIN: "3"}
                gang.append(p)
            first = gang[:-1] if kill == "quorum" else gang
            made = [api.create(f"/api/v1/namespaces/{ns}/pods", p) for p in first]
            out = drive_to(kill, StandIn("127.0.0.1", leader[1], nodes), made, nodes)
            t_kill = time.perf_counter()
            procs.kill(leader[0])  # SIGKILL: its memory is gone
            if bound_phase:
                for n in leaves[full]:
                    api.delete(f"/api/v1/namespaces/{ns}/pods/filler-{n}")
            rest = [p for p in made if f"{ns}/{p['metadata']['name']}" not in out.bound]
            if kill == "quorum":
                rest.append(api.create(f"/api/v1/namespaces/{ns}/pods", gang[-1]))
            competitors = [
                api.create(f"/api/v1/namespaces/{ns}/pods", rk.pod(name, gpus))
                for name, gpus in (("single-8", 8), ("single-4", 4))
            ]
            time.sleep(1.0)  # kube-scheduler's lease (15 s by default) runs out meanwhile
            drive = StandIn("127.0.0.1", standby[1], nodes)
            t0 = time.perf_counter()
            drive.run(competitors + rest, idle_rounds=4)
            finish = time.perf_counter() - t0
            drive.close()
            placed = api.pods(ns)
            events = api.get(f"/api/v1/namespaces/{ns}/events")["items"]
            v = judge(list(placed.values()), events, leaf_of)
            kill_to_done = time.perf_counter() - t_kill
            last = k == len(CHAIN) - 1
            restarted = None if last else sidecar()  # the killed replica comes back as the standby
            rows.append(
                {
                    "failover": k,
                    "kill": kill,
                    **v,
                    "finish_s": round(finish, 3),
                    "kill_to_done_s": round(kill_to_done, 3),
                    "cold_start_s": None if restarted is None else round(restarted[2], 2),
                }
            )
            if restarted is not None:
                leader, standby = standby, restarted
        table = os.environ.get("GPUTOPO_FAILOVER_TABLE")
        if table:
            with open(table, "a") as f:
                for row in rows:
                    f.write(json.dumps(row) + "\n")
        for row in rows:
            assert row["overbooked_gpus"] == 0 and row["double_predicted_gpus"] == 0, rows
            assert row["gangs"]["g"] == "whole", (rows, procs.logs())
    finally:
        procs.close()


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@pytest.mark.parametrize(("age", "clock_from"), [(100.0, "creation"), (8 * 86_400.0, "takeover")])
def test_a_waiting_gangs_wait_clock_goes_on_from_its_creation(api, age: float, clock_from: str) -> None:
    """The standby's first call re-derives the wait clock of a gang still waiting from its oldest
    member's creationTimestamp; one older than the gang's spill time (here the cluster opts into
    7 days; the default is no wait) is not trusted and the clock restarts at the takeover
    (waiting longer, never spilling early)."""
    fake, api_client = api
    clock = [NOW]
    waiting = gang_pod("g", 0, 8, 2, False)
    waiting["metadata"]["creationTimestamp"] = stamp(NOW - age)
    fake.put("pods", waiting)
    solo = fk.pod(NS, "solo", 1)
    fake.put("pods", solo)
    b = Sidecar.start(api_client, clock, spill_after_s=7 * 86_400.0)
    try:
        wait_until(lambda: b.sees(fake))
        clock[0] += 15.0
        assert b.ext.gangs.first_seen(f"{NS}/g") is None
        drive = b.scheduler()
        assert drive.schedule_one(solo, Outcome()) is not None  # any first call takes over
        # the demand mix was seeded with both GPU pods, the one not asked about yet included
        assert b.ext.objective.mix.observations == 2
        assert drive.schedule_one(waiting, Outcome()) is None  # waits for its second member
        assert b.ext.objective.mix.observations == 2, "each pod counted once"
        drive.close()
        want = NOW - age if clock_from == "creation" else NOW + 15.0
        assert b.ext.gangs.first_seen(f"{NS}/g") == want
    finally:
        b.kill()


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("2027-01-15T08:00:00Z", NOW),
        ("2027-01-15T08:00:00", None),  # no zone: not as the API server writes it
        ("yesterday", None),
        (12345, None),
        ("9" * 100, None),
    ],
)
def test_a_pods_creation_time_is_read_or_left_out_never_fatal(raw: object, want: float | None) -> None:
    doc = fk.pod(NS, "p", 1)
    doc["metadata"]["creationTimestamp"] = raw
    assert parse_pod(doc).created == want


def test_the_new_leader_tells_the_gangs_group_object_it_took_the_gang_over(api) -> None:
    """A PodGroup gang part-bound by A: B's takeover writes `GangAdopted` on the PodGroup (where
    `kubectl describe podgroup` shows it) and finishes the gang in A's leaf."""
    fake, api_client = api
    clock = [NOW]
    fake.put("podgroups", fk.podgroup(NS, "pg", 2))
    members = [fk.pod(NS, f"pg-{i}", 8, labels={"scheduling.x-k8s.io/pod-group": "pg"}) for i in range(2)]
    for p in members:
        fake.put("pods", p)
    a = Sidecar.start(api_client, clock)
    b = Sidecar.start(api_client, clock, events=True)
    try:
        wait_until(lambda: a.sees(fake))
        leader = a.scheduler()
        first = leader.schedule_one(members[0], Outcome())
        leader.close()
        assert first is not None
        a.kill()
        solo = fake.put("pods", fk.pod(NS, "solo", 8))
        clock[0] += 15.0
        wait_until(lambda: b.sees(fake))
        drive = b.scheduler()
        assert drive.schedule_one(solo, Outcome()) is not None  # asked first
        second = drive.schedule_one(members[1], Outcome())
        drive.close()
        assert second is not None and LEAF_OF[second] == LEAF_OF[first] and second != first
        assert b.emitter is not None and b.emitter.flush()
        adopted = [e for e in map(fk.event_view, fake.events) if e["reason"] == "GangAdopted"]
        assert [(e["kind"], e["name"]) for e in adopted] == [("PodGroup", "pg")]
    finally:
        a.kill()
        b.kill()
