"""Jobs as the simulator sees them, and the embedded workload generator.

A job is one pod, or a gang of pods when it needs more than one node. Traces record GPUs and
nodes per job; the simulator turns a job of more than 8 GPUs into a gang of 8-GPU pods (the
last one takes the remainder), because every multi-node job of the Helios trace uses exactly 8
GPUs per node. A job of at most 8 GPUs is one pod even when the trace spread it over several
nodes (Philly's scheduler did that; the request itself fits one 8-GPU server).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

#: GPUs per pod of a multi-node job.
GANG_POD_GPUS = 8

#: GPU-job sizes of the Helios excerpt (traces/helios-excerpt-15k/README.md, "num_gpu, all jobs").
HELIOS_SIZE_COUNTS: tuple[tuple[int, int], ...] = (
    (1, 5939),
    (2, 544),
    (3, 14),
    (4, 647),
    (5, 2),
    (6, 9),
    (7, 19),
    (8, 2382),
    (16, 579),
    (24, 112),
    (32, 246),
    (40, 59),
    (48, 104),
    (56, 24),
    (64, 4),
    (72, 11),
    (80, 42),
    (88, 7),
    (96, 3),
    (104, 1),
    (112, 4),
    (120, 2),
    (128, 12),
    (136, 5),
    (144, 9),
    (152, 3),
    (160, 13),
)
#: Duration (median s, p90 s) by job size from the same README; sizes not listed use "all".
HELIOS_DURATION: Mapping[str, tuple[float, float]] = MappingProxyType(
    {
        "1": (405.0, 11376.0),
        "8": (162.0, 34858.0),
        "16": (518.0, 70238.0),
        "32+": (251.0, 122892.0),
        "all": (277.0, 18376.0),
    }
)
#: Longest job of the excerpt; the log-normal tail is cut there.
HELIOS_MAX_DURATION = 1_964_673.0
#: Pod run time (median s, p90 s) by GPU count of the Alibaba openb default list
#: (traces/alibaba-gpu-v2023/README.md, "Timing"), for the lists that carry no times.
ALIBABA_RUNTIME: Mapping[int, tuple[float, float]] = MappingProxyType(
    {
        1: (655.0, 7240.0),
        2: (2267.0, 27368.0),
        4: (542.0, 23925.0),
        8: (553.0, 101998.0),
    }
)
ALIBABA_MAX_RUNTIME = 12_537_496.0
_Z90 = 1.2815515655446004  # standard normal 90th percentile


@dataclass(frozen=True, slots=True)
class Job:
    """One unit of work: `pods` lists the GPUs of each pod (one entry = a single pod)."""

    id: int
    submit: float  # seconds
    duration: float  # seconds at an ideal placement; math.inf = never leaves (fill mode)
    pods: tuple[int, ...]
    #: Thousandths of one GPU the job's pod takes when GPUs are shared (`simulate --gpu-sharing`):
    #: below 1000 only for a single 1-GPU pod (an openb pod with `gpu_milli < 1000`; no trace has
    #: fractional multi-GPU pods or gang members, so one figure per job suffices). Whole = 1000;
    #: without sharing every policy reads `pods` alone and this is never looked at.
    milli: int = 1000

    def __post_init__(self) -> None:
        if self.milli != 1000 and (self.pods != (1,) or not 0 < self.milli < 1000):
            raise ValueError(f"a share of {self.milli} milli-GPUs needs a single 1-GPU pod, got {self.pods}")

    @property
    def gpus(self) -> int:
        return sum(self.pods)

    @property
    def demand_milli(self) -> int:
        """What the job asks for in milli-GPUs: its share when fractional, else 1000 per GPU."""
        return self.milli if self.milli < 1000 else 1000 * sum(self.pods)

    @property
    def is_gang(self) -> bool:
        return len(self.pods) > 1


def pods_for(num_gpu: int) -> tuple[int, ...]:
    """Pod shapes of a job of `num_gpu` GPUs (see the module docstring); () for CPU-only jobs."""
    if num_gpu <= 0:
        return ()
    if num_gpu <= GANG_POD_GPUS:
        return (num_gpu,)
    full, rest = divmod(num_gpu, GANG_POD_GPUS)
    return (GANG_POD_GPUS,) * full + ((rest,) if rest else ())


def _duration_class(size: int) -> str:
    if size == 1:
        return "1"
    if size == 8:
        return "8"
    if 9 <= size <= 16:
        return "16"
    if size > 16:
        return "32+"
    return "all"


def generate(
    pods: int,
    *,
    capacity_gpus: int,
    load: float,
    rng: np.random.Generator,
    max_gpus: int | None = None,
) -> list[Job]:
    """Jobs totalling at least `pods` pods: Helios GPU-job sizes, log-normal durations matched to
    Helios medians and 90th percentiles per size, Poisson arrivals scaled so that the offered
    load (GPU-seconds per second over `capacity_gpus`) is `load`. Sizes above `max_gpus` are
    dropped from the distribution so every job can fit the cluster."""
    if pods <= 0:
        raise ValueError("pods must be positive")
    if not load > 0 or capacity_gpus <= 0:
        raise ValueError("load and capacity must be positive")
    table = [(s, c) for s, c in HELIOS_SIZE_COUNTS if max_gpus is None or s <= max_gpus]
    sizes = np.array([s for s, _ in table])
    probs = np.array([c for _, c in table], dtype=float)
    probs /= probs.sum()
    shapes: list[tuple[int, ...]] = []
    durations: list[float] = []
    total = 0
    while total < pods:
        size = int(rng.choice(sizes, p=probs))
        duration = _lognormal(*HELIOS_DURATION[_duration_class(size)], HELIOS_MAX_DURATION, rng)
        shape = pods_for(size)
        shapes.append(shape)
        durations.append(duration)
        total += len(shape)
    return _poisson(shapes, durations, capacity_gpus, load, rng)


def _lognormal(median: float, p90: float, cap: float, rng: np.random.Generator) -> float:
    sigma = math.log(p90 / median) / _Z90
    return float(min(cap, max(1.0, median * math.exp(sigma * rng.standard_normal()))))


def _poisson(
    shapes: list[tuple[int, ...]],
    durations: list[float],
    capacity_gpus: int,
    load: float,
    rng: np.random.Generator,
) -> list[Job]:
    """Poisson arrivals whose offered load (GPU-seconds per second / capacity) is `load`."""
    work = sum(sum(s) * d for s, d in zip(shapes, durations, strict=True))
    mean_gap = work / (len(shapes) * load * capacity_gpus)
    gaps = rng.exponential(mean_gap, size=len(shapes))
    submit = np.cumsum(gaps) - gaps[0]
    return [
        Job(id=i, submit=float(submit[i]), duration=durations[i], pods=shapes[i]) for i in range(len(shapes))
    ]


def at_cluster_speed(jobs: list[Job], stretch: Callable[[Job], float]) -> tuple[list[Job], float]:
    """The same arrivals, spread out so that their offered load counts each job's work at the
    speed it has on this cluster (`stretch`: its time there over its ideal time; the
    simulator's `JobTimer.typical_stretch`) instead of at its ideal. Returns the jobs and the
    factor k = the jobs' work at that speed / their ideal work, by which every gap grew.

    Why: `generate` and `timed_arrivals` size the gaps from ideal GPU-seconds, and a job's
    ideal is the best server of the cluster. On a cluster where most servers are PCIe boxes
    with one NIC, encoder and LLM jobs run about 5x that ideal under every policy, so "load
    0.5" offered some 2.5 clusters' worth of work and no queue ever drained. Scaling every
    gap by k is the same Poisson process with a mean gap k times longer (the draws are
    unchanged), so sizes and durations stay those of the seed."""
    ideal = sum(j.gpus * j.duration for j in jobs)
    if not jobs or not ideal > 0:
        return jobs, 1.0
    factor = sum(j.gpus * j.duration * stretch(j) for j in jobs) / ideal
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"cluster speed factor must be positive and finite, got {factor}")
    return [replace(j, submit=j.submit * factor) for j in jobs], factor


def offered_load(jobs: list[Job], capacity_gpus: int, stretch: Callable[[Job], float]) -> float:
    """The load a timed job list offers: its work at the speed `stretch` gives each job, in
    GPU-seconds, per second of its arrival span, over `capacity_gpus`. Above 1 no policy can
    keep up and queues grow for the whole replay (inf: every job arrives at once)."""
    timed = [j for j in jobs if math.isfinite(j.duration)]
    if not timed or capacity_gpus <= 0:
        return 0.0
    span = max(j.submit for j in timed) - min(j.submit for j in timed)
    work = sum(j.gpus * j.duration * stretch(j) for j in timed)
    return work / (span * capacity_gpus) if span > 0 else math.inf


def timed_arrivals(
    jobs: list[Job], *, capacity_gpus: int, load: float, rng: np.random.Generator
) -> list[Job]:
    """Times for an untimed pod list, in its (already shuffled) order: log-normal run times
    matched per GPU count to the Alibaba default list's medians and 90th percentiles (the
    nearest listed count for others), Poisson arrivals at offered load `load`."""
    if not jobs:
        raise ValueError("no jobs to time")
    if not load > 0 or capacity_gpus <= 0:
        raise ValueError("load and capacity must be positive")
    listed = sorted(ALIBABA_RUNTIME)
    durations = []
    for job in jobs:
        nearest = min(listed, key=lambda k: (abs(k - job.gpus), k))
        durations.append(_lognormal(*ALIBABA_RUNTIME[nearest], ALIBABA_MAX_RUNTIME, rng))
    timed = _poisson([j.pods for j in jobs], durations, capacity_gpus, load, rng)
    return [
        Job(id=j.id, submit=t.submit, duration=t.duration, pods=j.pods, milli=j.milli)
        for j, t in zip(jobs, timed, strict=True)
    ]
