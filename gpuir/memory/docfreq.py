"""Document frequencies per snapshot without copying them on every write.

Every snapshot needs the live document frequency ``df`` of every term, fixed
for its lifetime, while the writer keeps changing them. Copying the whole
array per write costs O(vocabulary) per ``add``. Here a snapshot's frequencies
are a :class:`DfTable`: an immutable dense *base* array shared by many
snapshots plus a few sorted sparse *runs* of changes made since the base was
taken. A write adds one run holding only the terms it changed; runs of similar
size are merged (so there are O(log) of them, like a log-structured merge
tree), and once the runs together hold a quarter of the base's size the writer
takes a fresh base from its own dense array (one copy, amortised over the
writes since the last). The cost per write is proportional to the terms it
changed, and reading a term costs one binary search per run.
"""

from __future__ import annotations

import numpy as np

_EMPTY = np.zeros(0, np.int64)


def _compact(keys: np.ndarray, vals: np.ndarray, runs: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Sum ``vals`` per key: sorted unique keys and their non-zero sums (ndarrays, int64).

    ``runs``: ``keys`` is two sorted runs one after the other (a merge sort's single pass then);
    otherwise any order (the order of equal keys does not change a sum, so any sort will do)."""
    if keys.size == 0:
        return _EMPTY, _EMPTY
    order = np.argsort(keys, kind="stable" if runs else None)
    k, v = keys[order], vals[order]
    starts = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))
    k, v = k[starts], np.add.reduceat(v, starts)
    nz = v != 0
    return k[nz], v[nz]


class DfTable:
    """The document frequencies of one snapshot (immutable).

    Indexing with an int or an integer array returns int64 frequencies
    (``table[gids]``, as with an ndarray); ``np.asarray(table)`` gives the dense
    array (built on demand).

    Attributes
    ----------
    base : ndarray (B,), int64, host, read-only
    runs : tuple of (keys, deltas) ndarrays (m,), int64; keys sorted and unique
    size : int
        G, the number of term codes this snapshot knows (codes >= G are not its terms).
    """

    __slots__ = ("base", "runs", "size")

    def __init__(self, base: np.ndarray, runs: tuple = (), size: int | None = None):
        self.base = base
        self.runs = runs
        self.size = int(base.size if size is None else size)

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    @property
    def ndim(self) -> int:
        return 1

    def __len__(self) -> int:
        return self.size

    def n_run_entries(self) -> int:
        return sum(int(k.size) for k, _ in self.runs)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return np.asarray(self)[idx]
        scalar = np.ndim(idx) == 0
        g = np.asarray(idx, dtype=np.int64).reshape(-1)
        hi = -1
        if g.size:  # (few numpy calls: a question's terms are looked up once per snapshot, on its search path)
            lo, hi = int(g.min()), int(g.max())
            if lo < -self.size or hi >= self.size:
                raise IndexError(f"term code out of range [0, {self.size})")
            if lo < 0:
                g = np.where(g < 0, g + self.size, g)
                hi = int(g.max())
        B = self.base.size
        if hi < B:  # every code in the base (the common case)
            out = self.base[g]
        else:
            inb = g < B
            out = np.zeros(g.size, dtype=np.int64)
            out[inb] = self.base[g[inb]]
        for keys, vals in self.runs:
            m = keys.size
            if m == 0:
                continue
            pos = keys.searchsorted(g)
            np.minimum(pos, m - 1, out=pos)
            hit = keys[pos] == g
            if hit.any():
                out[hit] += vals[pos[hit]]
        if scalar:
            return int(out[0])
        return out.reshape(np.shape(idx))

    def __array__(self, dtype=None, copy=None):
        dense = np.zeros(self.size, dtype=np.int64)
        b = min(self.base.size, self.size)
        dense[:b] = self.base[:b]
        for keys, vals in self.runs:
            np.add.at(dense, keys, vals)
        return dense if dtype is None else dense.astype(dtype)

    def __repr__(self) -> str:
        return f"DfTable(size={self.size}, base={self.base.size}, runs={[int(k.size) for k, _ in self.runs]})"


class DfLog:
    """The writer's side: the dense truth, the changes since the last publication, the current table.

    Parameters
    ----------
    fold_fraction : float
        A new base is taken when the runs hold more than this fraction of the
        vocabulary (plus :attr:`min_fold` entries).
    """

    min_fold = 4096

    def __init__(self, fold_fraction: float = 0.25):
        self.dense = np.zeros(1024, dtype=np.int64)  # writer-owned, changed in place
        self.fold_fraction = fold_fraction
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self.table = DfTable(_EMPTY.copy(), (), 0)
        #: Fresh bases taken (for tests and benchmarks).
        self.folds = 0

    def _grow(self, size: int) -> None:
        if size > self.dense.size:
            new = np.zeros(max(size, 2 * self.dense.size), dtype=np.int64)
            new[: self.dense.size] = self.dense
            self.dense = new

    def add(self, codes: np.ndarray, deltas: np.ndarray | int, unique: bool = False) -> None:
        """``df[codes] += deltas`` (deltas an int or an array like codes; codes may repeat unless ``unique``)."""
        codes = np.asarray(codes, dtype=np.int64)
        if codes.size == 0:
            return
        self._grow(int(codes.max()) + 1)
        d = np.broadcast_to(np.asarray(deltas, dtype=np.int64), codes.shape)
        if unique:
            self.dense[codes] += d
        else:
            np.add.at(self.dense, codes, d)
        self._pending.append((codes, np.array(d)))

    def publish(self, size: int) -> DfTable:
        """The table of the current frequencies over ``size`` term codes (unchanged object when nothing changed)."""
        t = self.table
        if not self._pending and size == t.size:
            return t
        self._grow(size)
        keys = np.concatenate([k for k, _ in self._pending]) if self._pending else _EMPTY
        vals = np.concatenate([v for _, v in self._pending]) if self._pending else _EMPTY
        self._pending = []
        run = _compact(keys, vals)
        runs = list(t.runs) + ([run] if run[0].size else [])
        while len(runs) >= 2 and runs[-2][0].size <= 2 * runs[-1][0].size:  # merge runs of similar size
            b = runs.pop()
            a = runs.pop()
            runs.append(_compact(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]), runs=True))
        if sum(int(k.size) for k, _ in runs) > self.fold_fraction * size + self.min_fold or t.base.size == 0 and runs:
            base = self.dense[:size].copy()
            base.flags.writeable = False
            self.table = DfTable(base, (), size)
            self.folds += 1
        else:
            self.table = DfTable(t.base, tuple(runs), size)
        return self.table

    def reset(self, size: int) -> DfTable:
        """A fresh base from the dense array (after loading)."""
        self._pending = []
        self._grow(size)
        base = self.dense[:size].copy()
        base.flags.writeable = False
        self.table = DfTable(base, (), size)
        return self.table
