"""Workload profiles: what one data-parallel training step of a kind of model costs.

A placement's cost depends on what runs there: ResNet-50 hides almost all of its 100 MB
all-reduce behind its backward pass, a GPT-like model of 1.5 B parameters moves 6 GB a step
and waits for most of it. In pure data parallelism the bytes per FLOP are 1 / (3 x tokens per
GPU-step) whatever the model's size, so what makes a profile communication-heavy is its
gradient precision and how few tokens fit one GPU's step: an LLM's optimizer state leaves room
for a small micro-batch. Each profile is three numbers with a source (docs/jobtime.md):

* `grad_bytes`: bytes all-reduced per step (parameters x bytes per gradient element);
* `compute_s`: forward + backward + optimizer time of one step on one GPU;
* `overlap`: the share of `compute_s` that can hide communication (gputopo.jobtime.model.step_s).

The simulator gives each trace job one profile drawn from a mix (`PROFILE_MIXES`), by a hash
of the job id and the run's seed, so every policy sees the same job as the same model.

Pure: constants and functions of their arguments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gputopo.jobtime.model import validate_workload


@dataclass(frozen=True)
class Profile:
    """One kind of training job; see the module docstring for the three numbers."""

    name: str
    grad_bytes: float
    compute_s: float
    overlap: float
    source: str = ""

    def __post_init__(self) -> None:
        validate_workload(self.grad_bytes, self.compute_s, self.overlap)

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "grad_bytes": self.grad_bytes,
            "compute_s": self.compute_s,
            "overlap": self.overlap,
        }


#: Overlap of a transformer trained with DDP: fitted to Pollux's BERT placements (adaptdl
#: simulator/traces/bert/placements.csv, docs/jobtime.md), used for both transformer profiles.
TRANSFORMER_OVERLAP = 0.3
#: Overlap of a CNN: its backward pass, two thirds of the step (backward costs twice the
#: forward, the 6ND = 2ND + 4ND rule), produces the gradients while earlier layers still run.
CNN_OVERLAP = 2.0 / 3.0

PROFILES: Mapping[str, Profile] = MappingProxyType(
    {
        "cnn": Profile(
            "cnn",
            grad_bytes=25.6e6 * 4,  # ResNet-50: 25.6 M parameters, fp32 gradients
            compute_s=0.111,  # V100 SXM2, AMP, batch 128: 110.9 ms per iteration
            overlap=CNN_OVERLAP,
            source="ResNet-50 (He et al. 2016); step time: sandeepkumar-skb/pytorch_experiments",
        ),
        "encoder": Profile(
            "encoder",
            grad_bytes=335e6 * 4,  # BERT-large: 335 M parameters, fp32 gradients
            compute_s=0.053,  # 6 x 335e6 x 4096 tokens (8 x 512) / (312 TFLOP/s x 0.5)
            overlap=TRANSFORMER_OVERLAP,
            source="BERT-large (Devlin et al. 2019); 6ND FLOPs at 50 % of A100 peak (Megatron-LM, SC '21)",
        ),
        "llm": Profile(
            "llm",
            grad_bytes=1.5e9 * 4,  # GPT-2 XL class: 1.5 B parameters, fp32 gradients (DDP's default)
            compute_s=0.118,  # 6 x 1.5e9 x 2048 tokens / (312 TFLOP/s x 0.5)
            overlap=TRANSFORMER_OVERLAP,
            source="GPT-2 XL (Radford et al. 2019); micro-batch 2 x 1024 tokens, what 40 GB leave beside "
            "16 B/parameter of Adam state; 6ND FLOPs at 50 % of A100 peak (Megatron-LM, SC '21)",
        ),
    }
)

#: Mixes of profiles by name: shares of jobs. `default` follows Philly's finding that most of a
#: shared cluster's jobs are vision and language models of modest size (Jeon et al., ATC '19)
#: with a fifth LLM-scale jobs; `cnn` / `llm` are the comm-light and comm-heavy extremes.
PROFILE_MIXES: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {
        "default": MappingProxyType({"cnn": 0.4, "encoder": 0.4, "llm": 0.2}),
        "cnn": MappingProxyType({"cnn": 1.0}),
        "encoder": MappingProxyType({"encoder": 1.0}),
        "llm": MappingProxyType({"llm": 1.0}),
    }
)


def mix64(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of an integer, no state."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


class ProfileMix:
    """Assigns a profile to each job id: seeded, stateless, the same for every policy."""

    def __init__(self, shares: Mapping[str, float], seed: int = 0) -> None:
        items = [(name, float(v)) for name, v in shares.items() if v > 0]
        if not items:
            raise ValueError("a profile mix needs a positive share")
        for name, _ in items:
            if name not in PROFILES:
                raise ValueError(f"unknown profile {name!r} (known: {', '.join(PROFILES)})")
        total = sum(v for _, v in items)
        self.names = tuple(name for name, _ in items)
        bounds, acc = [], 0.0
        for _, v in items:
            acc += v / total
            bounds.append(acc)
        bounds[-1] = 1.0
        self._bounds = tuple(bounds)
        self._seed = mix64(seed)

    def profile_of(self, job_id: int) -> str:
        u = mix64(job_id ^ self._seed) / 2.0**64
        for name, bound in zip(self.names, self._bounds, strict=True):
            if u < bound:
                return name
        return self.names[-1]


# --------------------------------------------------------------------------- declared profiles

#: A pod (or its gang's group object) says what it trains: one of `PROFILES`' names...
PROFILE_ANNOTATION = "gputopo.io/profile"
#: ...or its own numbers: bytes all-reduced per step and compute seconds per step (both needed),
#: with the share of compute that hides communication (optional: `TRANSFORMER_OVERLAP`).
GRAD_BYTES_ANNOTATION = "gputopo.io/gradient-bytes"
COMPUTE_S_ANNOTATION = "gputopo.io/compute-seconds"
OVERLAP_ANNOTATION = "gputopo.io/overlap"
DECLARED_ANNOTATIONS = (PROFILE_ANNOTATION, GRAD_BYTES_ANNOTATION, COMPUTE_S_ANNOTATION, OVERLAP_ANNOTATION)


class ProfileError(ValueError):
    """A declared profile that cannot be used; the message names the annotation."""


def _number(annotations: Mapping[str, str], key: str) -> float:
    raw = annotations[key]
    try:
        value = float(raw) if isinstance(raw, str) and len(raw) <= 32 else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        shown = raw[:40] if isinstance(raw, str) else raw
        raise ProfileError(f"annotation {key} must be a number, got {shown!r}")
    return value


def declared_profile(annotations: Mapping[str, str]) -> Profile | None:
    """The profile a pod or group object declares in its annotations, None when it declares
    none; ProfileError when it declares one that cannot be used (a typo must not silently mean
    "the mix"). A name wins over numbers given beside it."""
    name = annotations.get(PROFILE_ANNOTATION)
    if name is not None:
        profile = PROFILES.get(name.strip().lower()) if isinstance(name, str) else None
        if profile is None:
            shown = name[:40] if isinstance(name, str) else name
            raise ProfileError(
                f"annotation {PROFILE_ANNOTATION} must be one of {', '.join(PROFILES)}, got {shown!r}"
            )
        return profile
    given = [k for k in (GRAD_BYTES_ANNOTATION, COMPUTE_S_ANNOTATION, OVERLAP_ANNOTATION) if k in annotations]
    if not given:
        return None
    if GRAD_BYTES_ANNOTATION not in annotations or COMPUTE_S_ANNOTATION not in annotations:
        raise ProfileError(
            f"a declared workload needs both {GRAD_BYTES_ANNOTATION} and {COMPUTE_S_ANNOTATION} "
            f"(or {PROFILE_ANNOTATION}); got only {', '.join(given)}"
        )
    grad = _number(annotations, GRAD_BYTES_ANNOTATION)
    compute = _number(annotations, COMPUTE_S_ANNOTATION)
    overlap = (
        _number(annotations, OVERLAP_ANNOTATION) if OVERLAP_ANNOTATION in annotations else TRANSFORMER_OVERLAP
    )
    try:
        return Profile("declared", grad, compute, overlap)
    except ValueError as e:
        raise ProfileError(f"declared workload: {e}") from None
