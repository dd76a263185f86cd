"""GPU sharing for `gputopo simulate --gpu-sharing`: fractional pods take a share of one GPU.

An openb pod with `gpu_milli < 1000` (`Job.milli`) asks for that many thousandths of one GPU.
Under sharing a GPU with some share taken is not free for whole-GPU pods but takes further
fractional pods while the shares fit in 1000. The whole-GPU bookkeeping (`ClusterState`: masks,
classes, the free histogram) stays as it is: a GPU that holds a share is simply taken there,
and `ShareBook` keeps, beside it, how much of each such GPU the shares use. Only a run with the
flag builds a book, so the default run's hot path never sees it.

Which policies share, and how, is each one's own rule (gputopo/sim/policies/shared.py);
the policies standing for systems that hand out whole GPUs only (`WHOLE_GPU_POLICIES`: this
project's device plugin, NVIDIA's without time-slicing) keep counting a fractional pod as a
whole GPU. Figures that count GPUs (free at the first failure, allocated, demand placed) count
milli-GPUs in such a run (`ShareRecorder`): a partly used GPU's free share is unallocated, as
the FGD paper counts it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace

from gputopo.node.allocator import Allocator
from gputopo.sim.comm import CommModel
from gputopo.sim.metrics import Recorder, Summary
from gputopo.sim.policies.base import Failure, Hinted, Slot
from gputopo.sim.state import ClusterState, SimCluster
from gputopo.sim.workload import Job

#: One GPU in milli-GPUs.
WHOLE = 1000
#: Policies that share GPUs under --gpu-sharing (the rest count a fractional pod as one GPU).
SHARING_POLICIES: tuple[str, ...] = ("kubelet-default", "best-combo", "fgd")
#: Policies whose device plugin hands out whole GPUs only, flag or not.
WHOLE_GPU_POLICIES: tuple[str, ...] = (
    "gputopo",
    "gang-only",
    "best-effort-pairs",
    "kueue-tas",
    "dra-first-fit",  # DRA devices are whole GPUs or whole sets
    "dra-gputopo-sets",
)


class ShareBook:
    """Milli-GPU bookkeeping beside a ClusterState (owned by one run).

    `used[node][gpu]` is the milli-GPUs the shares on that GPU use: > 0 only for a shared GPU,
    which the state counts as taken. A GPU free in the state's mask has 1000 free, a shared one
    1000 - used, one taken whole 0 (`vec`). Nodes with the same sorted free vector (`classes`)
    answer every topology-blind question alike (node scores, FGD's fragmentation)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.used = [[0] * s for s in state.size]
        self.vec: list[tuple[int, ...]] = []
        self.classes: dict[tuple[int, ...], set[int]] = {}
        self.free_milli = 0
        for node in range(len(state.size)):
            v = self._vector(node)
            self.vec.append(v)
            self.classes.setdefault(tuple(sorted(v)), set()).add(node)
            self.free_milli += sum(v)

    def _vector(self, node: int) -> tuple[int, ...]:
        mask, used = self.state.mask[node], self.used[node]
        return tuple(WHOLE if mask >> g & 1 else (WHOLE - u if u else 0) for g, u in enumerate(used))

    def _refresh(self, node: int) -> None:
        old = self.vec[node]
        key = tuple(sorted(old))
        members = self.classes[key]
        members.discard(node)
        if not members:
            del self.classes[key]
        new = self._vector(node)
        self.vec[node] = new
        self.classes.setdefault(tuple(sorted(new)), set()).add(node)
        self.free_milli += sum(new) - sum(old)

    def take(self, node: int, gpus: Sequence[int], milli: int = WHOLE) -> None:
        """Whole GPUs (`milli` 1000) or a share of one; ValueError, changing nothing, when they
        are not free (a whole GPU that holds a share is not) or the share does not fit."""
        if milli >= WHOLE:
            self.state.take(node, gpus)
        else:
            g = self._one(node, gpus, milli)
            used = self.used[node][g]
            if used == 0:
                self.state.take(node, (g,))  # raises when it is taken whole
            elif used + milli > WHOLE:
                raise ValueError(
                    f"GPU {g} on node {self.state.cluster.nodes[node].name} has {WHOLE - used} "
                    f"milli-GPUs free, not {milli}"
                )
            self.used[node][g] = used + milli
        self._refresh(node)

    def give(self, node: int, gpus: Sequence[int], milli: int = WHOLE) -> None:
        """The inverse of `take`; ValueError, changing nothing, for what was not taken so."""
        if milli >= WHOLE:
            if any(self.used[node][g] for g in gpus if 0 <= g < len(self.used[node])):
                raise ValueError(f"GPUs {list(gpus)} hold shares, not whole pods")
            self.state.give(node, gpus)
        else:
            g = self._one(node, gpus, milli)
            used = self.used[node][g]
            if used < milli:
                raise ValueError(
                    f"GPU {g} on node {self.state.cluster.nodes[node].name} holds {used} "
                    f"milli-GPUs of shares, not {milli}"
                )
            self.used[node][g] = used - milli
            if used == milli:
                self.state.give(node, (g,))
        self._refresh(node)

    def _one(self, node: int, gpus: Sequence[int], milli: int) -> int:
        if len(gpus) != 1 or not 0 <= gpus[0] < len(self.used[node]) or milli <= 0:
            raise ValueError(f"a share of {milli} milli-GPUs takes one GPU of the node, got {list(gpus)}")
        return gpus[0]


def shares(policy: str) -> bool:
    """Whether `policy` lets fractional pods share a GPU under --gpu-sharing."""
    return policy in SHARING_POLICIES


class ShareRecorder(Recorder):
    """The Recorder with its GPU counts in milli-GPUs: a job fails "with enough free" when its
    demand (its share, or 1000 per GPU) is at most the free milli-GPUs, partly used GPUs' free
    shares included, and demand placed counts each placed job's own demand."""

    def __init__(self, cluster: SimCluster, allocators: Sequence[Allocator], comm: CommModel) -> None:
        super().__init__(cluster, allocators, comm)
        self.placed_milli = 0

    def failure(self, job: Job, now: float, free_total: int, admission: bool) -> None:
        """`free_total` is in milli-GPUs here (the book's)."""
        if admission:
            self.admission_failures += 1
        if job.demand_milli <= free_total and max(job.pods) <= self._largest_node:
            self._fragmented.add(job.id)
            if self.first_failure is None:
                self.first_failure = (now, free_total)

    def placed_job(self, job: Job, slots: Sequence[tuple[int, tuple[int, ...]]], now: float) -> float:
        self.placed_milli += job.demand_milli
        return super().placed_job(job, slots, now)

    def shared_summary(
        self, policy: str, jobs: Sequence[Job], never: int, seconds: float, timed: bool, free_end: int | None
    ) -> Summary:
        base = self.summary(policy, jobs, never, seconds, timed)
        total = WHOLE * self.gpus_total
        demand = sum(j.demand_milli for j in jobs)
        first = self.first_failure
        return replace(
            base,
            free_at_first_failure=None if first is None else first[1],
            allocated_at_first_failure=None if first is None or not total else 1 - first[1] / total,
            allocated_at_end=None if free_end is None or not total else 1 - free_end / total,
            demand_placed=self.placed_milli / demand if demand else None,
            milli_gpus=True,
        )


#: A policy's answer under sharing: the job's slots and the milli-GPUs each pod takes (given the
#: policy's last answer for the job, returned unasked while it holds: `engine.Ledger.place`).
Place = Callable[[Job, "Hinted | None"], "tuple[list[Slot], int] | Failure"]


class ShareLedger:
    """The event loop's ledger under sharing (`engine.Ledger`): jobs of one shape are alike only
    with the same share, every take and give goes through the book with the milli-GPUs each pod
    takes, and free capacity counts milli-GPUs."""

    def __init__(self, book: ShareBook, place: Place) -> None:
        self.book = book
        self._place = place

    def place(self, job: Job, hint: Hinted | None = None) -> tuple[list[Slot], int] | Failure:
        return self._place(job, hint)

    def shape(self, job: Job) -> Hashable:
        return (job.pods, job.milli)

    def take(self, held: tuple[list[Slot], int]) -> None:
        slots, milli = held
        for node, gpus in slots:
            self.book.take(node, gpus, milli)

    def give(self, held: tuple[list[Slot], int]) -> None:
        slots, milli = held
        for node, gpus in slots:
            self.book.give(node, gpus, milli)

    def free(self) -> int:
        return self.book.free_milli

    def tick(self, now: float) -> None:
        self.book.state.now = now  # the sidecar's gang lifecycle runs on the simulation's clock
