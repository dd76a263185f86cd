"""An immutable mapping made of a shared base and the few entries replaced since.

The sidecar hands out a new mapping of every node whenever one node changes (a snapshot's
nodes, a build's node classes), and a caller may keep an older one (prioritize scores on the
views of its own call, outside the lock). Copying a 60,000-entry dict for each change costs
~1 ms, and freeing the copy it replaces as much again: more than the filter it serves. A
`Layered` mapping shares its base with its predecessor and holds only the replaced entries,
so one node's change costs one entry; the base is copied once the replacements grow past a
fraction of it (amortised: a few entries a change). Only replacements are layered: an
addition or a removal folds at once, so the iteration order is always the base's, as a dict
updated in place would give (node order decides ties downstream).
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, Mapping, ValuesView
from typing import Generic, TypeVar, overload

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")

#: replacements beyond this fraction of the base (plus a constant) fold into a new base
FOLD_FRACTION = 32
FOLD_MIN = 64


class Layered(Mapping[K, V], Generic[K, V]):
    """`base` (never mutated: shared) with `delta`'s entries in place of its own (every key of
    `delta` is a key of `base`)."""

    __slots__ = ("_base", "_delta")

    def __init__(self, base: dict[K, V], delta: dict[K, V] | None = None) -> None:
        self._base = base
        self._delta: dict[K, V] = delta or {}

    @classmethod
    def of(cls, items: Mapping[K, V]) -> Layered[K, V]:
        """A Layered holding a copy of `items` (the copy is the one O(n) step)."""
        return cls(dict(items))

    def parts(self) -> tuple[dict[K, V], dict[K, V]]:
        """(base, delta) for hot loops: `delta.get(k) or base.get(k)` when values are truthy."""
        return self._base, self._delta

    def flat(self) -> dict[K, V]:
        """A plain dict of the same entries: the base itself when nothing is replaced (do not
        mutate it), else a new one."""
        if not self._delta:
            return self._base
        out = self._base.copy()
        out.update(self._delta)
        return out

    def replace(self, changes: Mapping[K, V], removed: Iterable[K] = ()) -> Layered[K, V]:
        """A new mapping: this one with `changes` set and `removed` gone. Replacements of
        existing keys are layered; an addition, a removal or too many replacements fold."""
        removed = [k for k in removed if k in self]
        base, delta = self._base, self._delta
        if not removed and all(k in base for k in changes):
            merged = {**delta, **changes} if delta else dict(changes)
            if len(merged) <= len(base) // FOLD_FRACTION + FOLD_MIN:
                return Layered(base, merged)
        out = self.flat()
        if out is base:
            out = base.copy()
        out.update(changes)
        for k in removed:
            if k not in changes:
                del out[k]
        return Layered(out)

    def __getitem__(self, key: K) -> V:
        delta = self._delta
        if delta and key in delta:
            return delta[key]
        return self._base[key]

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V | D, /) -> V | D: ...
    def get(self, key: K, default: object = None) -> object:
        delta = self._delta
        if delta:
            hit = delta.get(key, _MISS)
            if hit is not _MISS:
                return hit
        return self._base.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._base

    def __iter__(self) -> Iterator[K]:
        return iter(self._base)

    def __len__(self) -> int:
        return len(self._base)

    def items(self) -> ItemsView[K, V]:
        return self.flat().items() if self._delta else self._base.items()

    def values(self) -> ValuesView[V]:
        return self.flat().values() if self._delta else self._base.values()

    __hash__ = object.__hash__  # compared and cached by identity, as the dicts it stands for

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())


_MISS = object()
