"""Tensor x data parallel LLM jobs in the job-time model: where the tensor-parallel groups sit
decides the step time, because their all-reduces run on the critical path of every layer.

A job of t x d GPUs is d replicas of the model, each split t ways by tensor parallelism
(Megatron-LM: Shoeybi et al. 2019; Narayanan et al., SC '21). Per step:

* **tensor-parallel traffic** inside each group: each transformer layer all-reduces its
  activations twice in the forward pass and twice in the backward pass, b·s·h elements each
  (Narayanan et al., SC '21, §3.3: "a total communication of 8bsh((t-1)/t) per layer per device
  for each microbatch"). It runs at the bandwidth of the slowest hop the group spans: NVLink
  inside a node, multi-node NVLink (MNNVL) inside an NVL72 domain (the accelerator level), the
  network when the group straddles NVLink domains. It is not overlapped: the next GEMM needs it
  (SC '21 §5.4.3; the Ultra-Scale Playbook: "it directly adds to the critical path").
* **data-parallel traffic** across replicas: each GPU all-reduces its shard of the gradients
  (parameters / t) with the GPUs of the same tensor-parallel rank in the other replicas, as
  gputopo.jobtime.model prices a data-parallel job: a ring over the replicas, hidden behind
  `overlap` of the compute. The t rings of a node share its NICs.
* **compute**: one replica's step on one GPU, divided by t (the model has no GEMM-efficiency
  loss at high t; docs/jobtime.md says where that shows).

Pure: functions of their arguments only; docs/jobtime.md lists each constant's source and puts
each published point beside the model's answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from gputopo.jobtime.model import (
    JobTimeError,
    Nics,
    best_busbw_gbps,
    comm_s,
    inter_busbw_gbps,
    nics_used,
    oversubscription,
    validate_workload,
)
from gputopo.network.levels import ACCELERATOR, HOSTNAME
from gputopo.node.allocator import Allocator
from gputopo.node.topology import Topology

#: All-reduces per transformer layer and step of one micro-batch: two in the forward pass (after
#: the attention and the MLP blocks), two in the backward pass (Narayanan et al., SC '21, §2.3
#: and §3.3; Shoeybi et al. 2019, Figure 4). Activation recomputation would add the forward's
#: two again; it is not modelled.
TP_ALLREDUCES_PER_LAYER = 4
#: Bytes of one activation element: bf16 / fp16 (mixed-precision training, SC '21 §4).
ACTIVATION_BYTES = 2
#: Bytes all-reduced per parameter in the data-parallel step: fp32 gradients (Megatron-LM's
#: default main-grad accumulation; the `llm` profile's reading for PyTorch DDP).
GRADIENT_BYTES_PER_PARAMETER = 4
#: Achieved FLOP/s of one GPU the preset profiles' compute assumes: 50 % of an A100's
#: 312 TFLOP/s (SC '21, Table 1: 44-52 % of peak), as the data-parallel profiles do.
PRESET_GPU_FLOPS = 0.5 * 312e12
#: Largest tensor- or data-parallel size a question may name.
MAX_PARALLEL = 4096


@dataclass(frozen=True)
class ParallelProfile:
    """A tensor x data parallel training job: the model's shape and one replica's step.

    `tokens` is what one replica processes per step (micro-batch x sequence x micro-batches);
    `compute_s` is that step's forward + backward + optimizer time on one GPU (the replica's
    GPUs each take compute_s / t); `overlap` is the share of that per-GPU compute that hides
    the data-parallel all-reduce."""

    name: str
    params: float
    layers: int
    hidden: int
    tokens: int
    compute_s: float
    tensor_parallel: int
    overlap: float = 0.3
    source: str = ""

    def __post_init__(self) -> None:
        for what, value in (("layers", self.layers), ("hidden", self.hidden), ("tokens", self.tokens)):
            if not (isinstance(value, int) and 1 <= value <= 10**9):
                raise JobTimeError(f"{what} must be an integer 1..1e9, got {value!r}")
        if not (isinstance(self.tensor_parallel, int) and 1 <= self.tensor_parallel <= MAX_PARALLEL):
            raise JobTimeError(
                f"tensor-parallel size must be 1..{MAX_PARALLEL}, got {self.tensor_parallel!r}"
            )
        if not (math.isfinite(self.params) and 0 < self.params <= 1e14):
            raise JobTimeError(f"parameters must be > 0 and at most 1e14, got {self.params!r}")
        validate_workload(self.grad_bytes, self.compute_s, self.overlap)
        if self.tp_bytes > 1e18:
            raise JobTimeError("tensor-parallel bytes per step above 1e18: check layers, hidden and tokens")

    @property
    def grad_bytes(self) -> float:
        """Bytes of the whole model's gradients (each GPU all-reduces 1/t of them)."""
        return self.params * GRADIENT_BYTES_PER_PARAMETER

    @property
    def tp_bytes(self) -> float:
        """Bytes of one tensor-parallel all-reduce summed over the step's micro-batches (b·s·h
        activations per micro-batch); each layer runs `TP_ALLREDUCES_PER_LAYER` of them."""
        return float(self.tokens) * self.hidden * ACTIVATION_BYTES

    def with_tensor_parallel(self, t: int) -> ParallelProfile:
        return ParallelProfile(
            self.name,
            self.params,
            self.layers,
            self.hidden,
            self.tokens,
            self.compute_s,
            t,
            self.overlap,
            self.source,
        )

    def with_overlap(self, overlap: float) -> ParallelProfile:
        return ParallelProfile(
            self.name,
            self.params,
            self.layers,
            self.hidden,
            self.tokens,
            self.compute_s,
            self.tensor_parallel,
            overlap,
            self.source,
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "params": self.params,
            "layers": self.layers,
            "hidden": self.hidden,
            "tokens": self.tokens,
            "compute_s": self.compute_s,
            "tensor_parallel": self.tensor_parallel,
            "overlap": self.overlap,
        }


def _preset(
    name: str, params: float, layers: int, hidden: int, tokens: int, t: int, source: str
) -> ParallelProfile:
    return ParallelProfile(
        name, params, layers, hidden, tokens, 6.0 * params * tokens / PRESET_GPU_FLOPS, t, 0.3, source
    )


#: Preset tensor x data parallel profiles (`gputopo step-time --tp-profile`). Compute: 6ND
#: FLOPs at `PRESET_GPU_FLOPS`; overlap: the transformer profiles' 0.3.
PARALLEL_PROFILES: Mapping[str, ParallelProfile] = MappingProxyType(
    {
        "gpt-13b": _preset(
            "gpt-13b",
            13e9,
            40,
            5120,
            16 * 2048,
            8,
            "GPT-3 13B shape (Brown et al. 2020, Table 2.1: 40 layers, d_model 5120); t = 8 as SC '21 Takeaway #1",
        ),
        "llama-70b": _preset(
            "llama-70b",
            70e9,
            80,
            8192,
            8 * 4096,
            8,
            "Llama 2 70B shape (Touvron et al. 2023: 80 layers, hidden 8192, 4096-token sequences); t = 8",
        ),
    }
)


@dataclass(frozen=True)
class ParallelStepTime:
    """The model's answer for a tensor x data parallel job in one placement."""

    tensor_parallel: int
    data_parallel: int
    compute_s: float  # per GPU
    overlap_s: float  # of that compute, what hides the data-parallel all-reduce
    tp_busbw_gbps: float
    tp_comm_s: float
    dp_busbw_gbps: float
    dp_comm_s: float
    step_s: float
    straddling_groups: int
    inside_tp_busbw_gbps: float  # the same groups inside one NVLink domain
    inside_step_s: float
    ideal_busbw_gbps: float  # every GPU in one NVLink domain
    ideal_step_s: float

    @property
    def dp_exposed_s(self) -> float:
        return max(0.0, self.dp_comm_s - self.overlap_s)

    @property
    def straddle_slowdown(self) -> float:
        """Step time over the same placement with every tensor-parallel group inside one
        NVLink domain: what splitting the groups costs."""
        return self.step_s / self.inside_step_s if self.inside_step_s > 0 else 1.0

    @property
    def slowdown(self) -> float:
        return self.step_s / self.ideal_step_s if self.ideal_step_s > 0 else 1.0

    def to_dict(self) -> dict[str, object]:
        def bw(v: float) -> float | None:
            return None if math.isinf(v) else round(v, 3)

        return {
            "tensor_parallel": self.tensor_parallel,
            "data_parallel": self.data_parallel,
            "compute_s": self.compute_s,
            "tp_busbw_gbps": bw(self.tp_busbw_gbps),
            "tp_comm_s": self.tp_comm_s,
            "dp_busbw_gbps": bw(self.dp_busbw_gbps),
            "dp_comm_s": self.dp_comm_s,
            "dp_exposed_s": self.dp_exposed_s,
            "step_s": self.step_s,
            "straddling_groups": self.straddling_groups,
            "inside_tp_busbw_gbps": bw(self.inside_tp_busbw_gbps),
            "inside_step_s": self.inside_step_s,
            "straddle_slowdown": self.straddle_slowdown,
            "ideal_busbw_gbps": bw(self.ideal_busbw_gbps),
            "ideal_step_s": self.ideal_step_s,
            "slowdown": self.slowdown,
        }


def tp_groups(gpus_per_node: Sequence[int], t: int) -> list[list[int]]:
    """The tensor-parallel groups of a job laid out rank by rank over its nodes (Megatron-LM's
    order: a group's ranks are adjacent, so groups fill a node before the next): for each group,
    its GPUs on each node it spans."""
    groups: list[list[int]] = []
    current: list[int] = []
    left = t
    for g in gpus_per_node:
        while g > 0:
            take = min(g, left)
            current.append(take)
            g -= take
            left -= take
            if left == 0:
                groups.append(current)
                current, left = [], t
    if current:
        raise JobTimeError(f"{sum(gpus_per_node)} GPUs do not split into groups of {t}")
    return groups


def parallel_step_time(
    topology: Topology,
    gpus_per_node: Sequence[int],
    level: str | None,
    nics: Nics,
    profile: ParallelProfile,
    *,
    allocator: Allocator | None = None,
    table: Mapping[str, float] | None = None,
) -> ParallelStepTime:
    """One tensor x data parallel job on nodes of one server model (`gpus_per_node[i]` of its
    GPUs on node i, the nodes spanning `level`, each with `nics`); d = total GPUs / t.

    Raises JobTimeError for a count the server cannot hold or GPUs that do not split into
    groups of t."""
    n = topology.n
    if not gpus_per_node or any(not 1 <= g <= n for g in gpus_per_node):
        raise JobTimeError(f"GPUs per node must be 1..{n} on {topology.name}, got {list(gpus_per_node)}")
    if len(gpus_per_node) > 1 and level == HOSTNAME:
        raise JobTimeError("a job on several nodes spans more than one node's level")
    t = profile.tensor_parallel
    total = sum(gpus_per_node)
    if total % t:
        raise JobTimeError(f"{total} GPUs do not split into tensor-parallel groups of {t}")
    d = total // t
    alloc = allocator if allocator is not None else Allocator(topology)
    cache: dict[int, float] = {}

    def best(size: int) -> float:
        if size not in cache:
            cache[size] = best_busbw_gbps(alloc, size)
        return cache[size]

    # tensor parallel: the slowest group sets the pace (every layer waits for every group's
    # all-reduce through the data-parallel step's barrier)
    groups = tp_groups(gpus_per_node, t)
    tp_bw = math.inf
    straddling = 0
    for parts in groups:
        bw = min(best(g) for g in parts)
        if len(parts) > 1:
            straddling += 1
            hop = (
                best(2)
                if level == ACCELERATOR
                else inter_busbw_gbps([(g, n, nics) for g in parts], level, table=table)
            )
            bw = min(bw, hop)
        tp_bw = min(tp_bw, bw)
    inside_tp_bw = best(min(t, n))

    # data parallel: t rings of d GPUs, one per tensor-parallel rank
    dp_bw = math.inf
    if d > 1:
        if len(gpus_per_node) == 1 or level == ACCELERATOR:
            dp_bw = best(2)
        else:
            # a node's NICs carry every ring that passes through it: min(g, t) of them
            share = min(nics.node_gbytes(nics_used(g, n, nics)) / min(g, t) for g in gpus_per_node)
            dp_bw = min(best(2), share / oversubscription(level, table))
    ideal_bw = best(min(n, max(2, total)))

    compute = profile.compute_s / t
    grad = profile.grad_bytes / t

    def tp_comm(bw: float) -> float:
        return TP_ALLREDUCES_PER_LAYER * profile.layers * comm_s(profile.tp_bytes, t, bw)

    def step(tp_bw_: float, dp_bw_: float) -> tuple[float, float, float]:
        tp = tp_comm(tp_bw_)
        dp = comm_s(grad, d, dp_bw_)
        return tp, dp, compute + tp + max(0.0, dp - profile.overlap * compute)

    tp_s, dp_s, step_s_ = step(tp_bw, dp_bw)
    inside = step(inside_tp_bw, dp_bw)[2]
    ideal = step(ideal_bw if t > 1 else math.inf, ideal_bw if d > 1 else math.inf)[2]
    return ParallelStepTime(
        t,
        d,
        compute,
        profile.overlap * compute,
        tp_bw if t > 1 else math.inf,
        tp_s,
        dp_bw,
        dp_s,
        step_s_,
        straddling,
        inside_tp_bw if t > 1 else math.inf,
        inside,
        ideal_bw,
        ideal,
    )
