"""The event loop: replay one workload through one policy on one cluster.

Two modes. `replay` (timed traces, the generator): jobs arrive at their submit time, wait in
a queue when they do not fit, and leave after their (placement-stretched) run time; after
every batch of events the queue is tried in arrival order (or smallest job first:
`queue_priority`). `fill` (untimed lists, as FGD uses the Alibaba lists): jobs arrive one after
another and never leave; a job that does not fit is rejected, not queued.

Trying a long queue after every event is what makes naive simulators slow. Jobs of the same
shape fit or fail alike, so the queue is kept per shape and a pass tries only the head of
each shape, merging heads in queue order; once a shape fails, the rest of it is skipped,
and it stays skipped until a departure frees GPUs (arrivals only ever take capacity away).
kube-scheduler likewise retries unschedulable pods on cluster events, not in a loop.
A policy's failure may carry a queueing hint (`base.Hinted`, after kube-scheduler's
QueueingHint): the head's next pass hands it to the ledger, which returns it without asking the
policy while it holds (a gang waiting for its own level: the sidecar's answer is known without
planning).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gputopo.sim.comm import CommModel
from gputopo.sim.metrics import Recorder
from gputopo.sim.policies.base import Failure, Hinted, Slot
from gputopo.sim.policies.sidecar import Lifecycle
from gputopo.sim.state import ClusterState
from gputopo.sim.workload import Job

#: Called with the number of pods handled so far (for a progress bar); injected by the CLI.
Progress = Callable[[int], None]
#: A policy's answer for one job against the current state.
Place = Callable[[ClusterState, Job], "list[Slot] | Failure"]


#: The orders the replay's queue can be tried in (`RunConfig.queue_order`, `queue_priority`).
QUEUE_ORDERS = ("arrival", "smallest")


@dataclass(frozen=True)
class RunConfig:
    mode: str = "replay"  # "replay" or "fill"
    seed: int = 0
    comm: CommModel = field(default_factory=CommModel)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)  # the sidecar's gangs over time
    gpu_sharing: bool = False  # fractional pods share GPUs (gputopo/sim/sharing.py)
    queue_order: str = "arrival"  # one of QUEUE_ORDERS, the same for every policy

    def __post_init__(self) -> None:
        _check_order(self.queue_order)
        if self.mode == "fill" and self.queue_order != "arrival":
            raise ValueError(f"queue order {self.queue_order!r}: a fill places jobs in list order, no queue")


def _check_order(order: str) -> None:
    if order not in QUEUE_ORDERS:
        raise ValueError(f"queue order must be one of {', '.join(QUEUE_ORDERS)}, got {order!r}")


def queue_priority(jobs: Sequence[Job], order: str) -> Sequence[int]:
    """Each job's rank in the replay's queue, lowest tried first (ranks are distinct).

    "arrival" (the default) is kube-scheduler's PrioritySort and Kueue's BestEffortFIFO with one
    priority class: the oldest waiting job first, younger ones only where it does not fit.
    "smallest" tries the job asking for the fewest GPUs first (arrival order among equals), as
    Slurm's job-size factor with PriorityFavorSmall, or PriorityClasses by size, would: a what-if
    for the queue discipline, which no placement policy here decides."""
    _check_order(order)
    if order == "arrival":
        return range(len(jobs))
    rank = [0] * len(jobs)
    for r, i in enumerate(sorted(range(len(jobs)), key=lambda i: (jobs[i].gpus, i))):
        rank[i] = r
    return rank


#: One of the event loops below, as `runner` chooses it.
Run = Callable[["Ledger", Sequence[Job], Recorder, "Progress | None"], int]


def runner(config: RunConfig) -> Run:
    """The event loop of `config`'s mode, under its queue order."""
    if config.mode == "fill":  # no queue: each job placed or rejected in turn
        return run_fill
    order = config.queue_order

    def replay(ledger: Ledger, jobs: Sequence[Job], rec: Recorder, progress: Progress | None) -> int:
        return run_replay(ledger, jobs, rec, progress, priority=queue_priority(jobs, order))

    return replay


#: A placed job as the event loop holds it until it leaves: its slots, and what each pod takes
#: beyond its GPUs (milli-GPUs under --gpu-sharing; nothing for whole GPUs).
Held = tuple[list[Slot], int]


class Ledger(Protocol):
    """What the event loop needs of the cluster's bookkeeping: whole GPUs (`WholeGpus` over a
    ClusterState) or shares (`gputopo.sim.sharing`), so both run the one loop below."""

    def shape(self, job: Job) -> Hashable:
        """Jobs of one shape fit or fail alike (the queue is kept per shape)."""
        ...

    def place(self, job: Job, hint: Hinted | None = None) -> Held | Failure:
        """The policy's answer against the current state, which it leaves unchanged. `hint` is
        the policy's last answer for this job: returned, without asking the policy, while it
        holds (checked after the ledger's own checks, where the policy would have been asked)."""
        ...

    def take(self, held: Held) -> None: ...

    def give(self, held: Held) -> None: ...

    def free(self) -> int:
        """Free capacity in the unit the failure figures count (GPUs, or milli-GPUs)."""
        ...

    def tick(self, now: float) -> None:
        """The simulation's clock before a placement pass (the gang lifecycle runs on it)."""
        ...


class WholeGpus:
    """The default run's ledger: whole GPUs in a ClusterState, placed by one policy."""

    def __init__(self, state: ClusterState, place: Place) -> None:
        self.state = state
        self._place = place

    def shape(self, job: Job) -> Hashable:
        return job.pods

    def place(self, job: Job, hint: Hinted | None = None) -> Held | Failure:
        state = self.state
        if not state.could_fit(job.pods):
            return Failure("not enough free GPUs")
        if hint is not None and hint.holds():
            return hint
        got = self._place(state, job)
        return got if isinstance(got, Failure) else (got, 0)

    def take(self, held: Held) -> None:
        for node, gpus in held[0]:
            self.state.take(node, gpus)

    def give(self, held: Held) -> None:
        for node, gpus in held[0]:
            self.state.give(node, gpus)

    def free(self) -> int:
        return self.state.free_total

    def tick(self, now: float) -> None:
        self.state.now = now


def run_fill(ledger: Ledger, jobs: Sequence[Job], rec: Recorder, progress: Progress | None) -> int:
    """Fill mode: each job in turn, placed or rejected, never leaving; returns 0 (none queued)."""
    for k, job in enumerate(jobs):
        got = ledger.place(job)
        if isinstance(got, Failure):
            rec.rejected += 1
            rec.failure(job, float(k), ledger.free(), got.admission)
        else:
            ledger.take(got)
            rec.placed_job(job, got[0], job.submit)
        if progress is not None and k % 512 == 0:
            progress(k)
    return 0


def run_replay(
    ledger: Ledger,
    jobs: Sequence[Job],
    rec: Recorder,
    progress: Progress | None,
    *,
    priority: Sequence[int] | None = None,
) -> int:
    """Replay mode (module docstring): returns how many jobs never started. A pass tries the
    shapes' heads by `priority` (`queue_priority`; default: arrival order)."""
    prio = range(len(jobs)) if priority is None else priority
    departures: list[tuple[float, int, Held]] = []
    queues: dict[Hashable, deque[int]] = {}
    blocked: set[Hashable] = set()  # shapes that failed since capacity was last freed
    hints: dict[Hashable, tuple[int, Hinted]] = {}  # shape -> its head's last answer, if Hinted
    nxt = 0
    handled = 0
    seq = 0
    while nxt < len(jobs) or departures:
        now = min(
            jobs[nxt].submit if nxt < len(jobs) else math.inf,
            departures[0][0] if departures else math.inf,
        )
        if departures and departures[0][0] <= now:
            blocked.clear()  # only freed GPUs can unblock a shape: placements only take
        while departures and departures[0][0] <= now:
            ledger.give(heapq.heappop(departures)[2])
        ledger.tick(now)
        while nxt < len(jobs) and jobs[nxt].submit <= now:
            queues.setdefault(ledger.shape(jobs[nxt]), deque()).append(nxt)
            nxt += 1
        heads = [(prio[q[0]], shape) for shape, q in queues.items() if q and shape not in blocked]
        heapq.heapify(heads)
        while heads:
            shape = heapq.heappop(heads)[1]  # ranks are distinct: shapes are never compared
            queue = queues[shape]
            idx = queue[0]
            job = jobs[idx]
            hint = hints.get(shape) if hints else None  # the head's last answer, if it was Hinted
            got = ledger.place(job, hint[1] if hint is not None and hint[0] == idx else None)
            if isinstance(got, Failure):
                rec.failure(job, now, ledger.free(), got.admission)
                blocked.add(shape)
                if isinstance(got, Hinted):
                    hints[shape] = (idx, got)
                continue
            ledger.take(got)
            stretch = rec.placed_job(job, got[0], now)
            seq += 1
            heapq.heappush(departures, (now + job.duration * stretch, seq, got))
            queue.popleft()
            if queue:
                heapq.heappush(heads, (prio[queue[0]], shape))
            else:
                del queues[shape]
            if hints:
                hints.pop(shape, None)  # its head was placed: the hint was about that job
            handled += len(job.pods)
            if progress is not None and handled % 512 < len(job.pods):
                progress(handled)
    return sum(len(q) for q in queues.values())
