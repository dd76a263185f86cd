"""Two DRA peers for the simulator: kube-scheduler's own allocator over two kinds of ResourceSlices.

With Dynamic Resource Allocation (`resource.k8s.io/v1`) no device plugin is asked for a preferred
allocation: kube-scheduler's allocator takes, for each request of a claim, the first devices in
slice order that match the request's class and are still free (first fit; issue 21's study on
kube-scheduler 1.35/1.36 saw nothing else). What it gives therefore depends only on what the
node's driver publishes, and these two peers differ only there:

`dra-first-fit` — NVIDIA's DRA driver (`gpu.nvidia.com`): one device per GPU, listed by index,
with per-GPU attributes (index, uuid, productName, pcieRoot) and nothing that names the
NVLink-best sets. A k-GPU pod's claim (`count: k` of the GPU class) gets the first k free GPUs in
slice order — the lowest free indices. (On a DGX-1 with GPU 0 taken, a 4-GPU claim gets 1,2,3,4.)

`dra-gputopo-sets` — gputopo's DRA mode (gputopo/node/draslices.py): per set size 2/4/8/16 one device
per good GPU set over shared per-GPU counters, in the exact allocator's order, republished when
use changes that order. A k-GPU pod whose k is a published size asks for one device of the
`nvlink-k` class and gets the first set device, in published order, whose GPUs are all free;
other sizes (1, 3, 5…) use the GPU class with `count: k`: the first k free GPU devices in
gputopo's GPU order (free ones as the allocator ranks them for one GPU). The publication is
modelled fresh (the daemon republishes on every use change), and it is the real one
(`draslices.choose_sets`: which sets exist depends on the topology alone, every set of a node
of up to 16 GPUs since issue 30; use only reorders them). With a smaller `max_sets` a node whose
free sets of that size were all cut refuses the claim here as kube-scheduler would.

Node choice is the same for both and for kubelet-default: kube-scheduler's least-allocated spread;
gangs member by member, all or nothing. Only the in-node choice differs, so the rows isolate
what the slices' contents are worth.
"""

from __future__ import annotations

from collections.abc import Iterable

from gputopo.node.allocator import AllocationError, Allocator, Choice
from gputopo.node.draslices import DEFAULT_SIZES, MAX_SETS_PER_SIZE, choose_sets, gpu_order
from gputopo.node.policies.baselines import CachedPolicy, mask_indices

#: Cached answers per policy object before the cache is cleared (bounded memory).
_CACHE_LIMIT = 200_000


class DraFirstFit(CachedPolicy):
    """kube-scheduler's allocator over per-GPU devices listed by index: the must-include GPUs,
    then the lowest free indices (a `GpuPolicy`, scored by the exact allocator)."""

    name = "dra-first-fit"

    def __init__(self, allocator: Allocator) -> None:
        super().__init__(allocator.topology, allocator)

    def _answer(self, free_mask: int, must_mask: int, size: int) -> Choice:
        picked = must_mask
        for i in mask_indices(free_mask & ~must_mask, self._n)[: size - must_mask.bit_count()]:
            picked |= 1 << i
        return self._exact.score_masks(picked, free_mask)


class DraGputopoSets:
    """kube-scheduler's allocator over gputopo's slices: the first free set device of the pod's
    size in published order (published from the node's state now), else first fit over the GPU
    devices for sizes no set class serves. AllocationError when the published sets of that size
    hold no free one (the claim stays pending on this node)."""

    name = "dra-gputopo-sets"

    def __init__(
        self,
        allocator: Allocator,
        sizes: Iterable[int] = DEFAULT_SIZES,
        max_sets: int = MAX_SETS_PER_SIZE,
    ) -> None:
        self._exact = allocator
        self._n = allocator.n
        self._sizes = frozenset(sizes)
        self._max_sets = max_sets
        self._first_fit = DraFirstFit(allocator)
        self._cache: dict[tuple[int, int], Choice | None] = {}

    @property
    def exact(self) -> Allocator:
        return self._exact

    def choose(self, free: Iterable[int], size: int, must: Iterable[int] = ()) -> Choice:
        free_mask, must_mask = self._exact.validate(free, size, must)
        if must_mask:
            return self._first_fit.choose(
                mask_indices(free_mask, self._n), size, mask_indices(must_mask, self._n)
            )
        if size not in self._sizes or size > self._n:
            return self._gpu_devices(free_mask, size)
        key = (free_mask, size)
        if key in self._cache:
            hit = self._cache[key]
        else:
            hit = self._published_first(free_mask, size)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = hit
        if hit is None:
            raise AllocationError(f"no published {size}-GPU set device is free")
        return hit

    def _gpu_devices(self, free_mask: int, size: int) -> Choice:
        """A claim of `count: size` GPU devices: the first `size` free ones in the published GPU
        order (free ones first, as the allocator ranks them for one GPU)."""
        key = (free_mask, -size)
        hit = self._cache.get(key)
        if hit is None:
            order = gpu_order(self._exact, range(self._n), mask_indices(free_mask, self._n))
            picked = sum(1 << i for i in [i for i in order if free_mask >> i & 1][:size])
            hit = self._exact.score_masks(picked, free_mask)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def _published_first(self, free_mask: int, size: int) -> Choice | None:
        free = mask_indices(free_mask, self._n)
        published = choose_sets(self._exact, range(self._n), free, size, self._max_sets)
        for s in published:
            mask = sum(1 << i for i in s.gpus)
            if mask & free_mask == mask:
                return self._exact.score_masks(mask, free_mask)
        return None
