"""Which record an id names, without a Python object per record.

A memory must answer "is this id live, and which record is it" for every
``add`` (ids must be new), ``update``, ``delete`` and ``get``. A dict from id to
sequence number costs about 130 bytes per record in Python objects, and
building it would make :meth:`gpuir.memory.Memory.open` read and hold every id
of a large memory. :class:`IdMap` keeps two parts:

* the ids added in this process, in a dict (id -> sequence number);
* every other live id as three arrays sorted by a 64-bit hash of the id
  (Python's ``hash``, fixed for the process): the hashes, the sequence numbers
  and a live flag -- 17 bytes per record, built at open one segment at a time.

A lookup in the arrays finds the entries with the id's hash and confirms each
by reading the id of that record back from its segment (``resolve``), so a hash
collision can never confuse two ids. When the dict grows past an eighth of the arrays
(and 65,536 entries; at most 131,072), it is folded into them (one merge of sorted arrays, inside
the ``add`` that crosses the line: O(records) copies, so the cap bounds that add's pause -- at 4.4M
records an eighth took 0.6 s of one add (``bench/bench_sharded.py``'s 5M run, session 37); 131,072
entries cost one fold about 0.1 s there, and all the folds of a 5M-record growth about 1 s in all).
Few Python objects also keep the cyclic garbage collector's full passes short:
their cost grows with every reference held in a Python container.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

_E64 = np.zeros(0, np.int64)


class IdMap:
    """Live record id -> sequence number (see the module docstring). Writer-side; readers call the
    lookups under the memory's commit lock.

    Parameters
    ----------
    resolve : callable(seqs ndarray (m,) int64 sorted unique, views) -> dict seq -> id
        The id of each live record among ``seqs`` in ``views`` (absent: not live).
    """

    fold_min = 65_536
    #: The dict is folded once it holds more than max(fold_min, min(arrays // 8, fold_max)) entries.
    fold_max = 131_072
    #: The 64-bit hash of an id (tests swap in a colliding one).
    hash = staticmethod(hash)

    def __init__(self, resolve: Callable[[np.ndarray, object], dict[int, str]]):
        # held weakly when a bound method: the map must not keep its memory alive (a memory's lock is
        # released when it is dropped)
        self._resolve_ref = weakref.WeakMethod(resolve) if hasattr(resolve, "__self__") else (lambda: resolve)
        self._recent: dict[str, int] = {}
        self._h = _E64  # sorted hashes
        self._s = _E64  # their sequence numbers
        self._live = np.zeros(0, bool)
        self._n_base = 0
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []  # loaded, not yet merged into the arrays

    # ------------------------------------------------------------------ building
    def load(self, ids: Sequence[str], seqs: np.ndarray) -> None:
        """Add ids known to be live and distinct from every other (a segment's, at open): arrays only.

        Loads are gathered and merged into the arrays once, before the next lookup or change.
        """
        if not len(ids):
            return
        h = np.fromiter(map(self.hash, ids), dtype=np.int64, count=len(ids))
        self._pending.append((h, np.array(seqs, dtype=np.int64)))

    def _settle(self) -> None:
        if self._pending:
            h = np.concatenate([p[0] for p in self._pending])
            s = np.concatenate([p[1] for p in self._pending])
            self._pending = []
            self._merge(h, s)

    def _resolve(self, seqs: np.ndarray, views) -> dict[int, str]:
        fn = self._resolve_ref()
        return {} if fn is None else fn(seqs, views)

    def _merge(self, h: np.ndarray, s: np.ndarray) -> None:
        """Insert (hash, seq) pairs into the sorted arrays: O(n) copies, dead entries dropped."""
        order = np.argsort(h, kind="stable")
        h, s = h[order], s[order]
        live = self._live
        h0, s0 = (self._h, self._s) if bool(live.all()) else (self._h[live], self._s[live])
        pos = np.searchsorted(h0, h, side="right")
        self._h, self._s = np.insert(h0, pos, h), np.insert(s0, pos, s)
        self._live = np.ones(self._h.size, bool)
        self._n_base = int(self._h.size)

    def _fold(self) -> None:
        """Move the dict's entries into the arrays."""
        ids = list(self._recent)
        seqs = np.fromiter(self._recent.values(), dtype=np.int64, count=len(ids))
        self._recent = {}
        self.load(ids, seqs)
        self._settle()

    def duplicates(self, views=None) -> list[str]:
        """Ids held by two live entries of the arrays (a damaged memory): equal hashes, confirmed."""
        self._settle()
        h = self._h[self._live]
        same = np.flatnonzero(h[1:] == h[:-1])
        if not same.size:
            return []
        s = self._s[self._live]
        seqs = np.unique(np.concatenate([s[same], s[same + 1]]))
        names = self._resolve(seqs, views)
        return sorted({names.get(int(a)) for a, b in zip(s[same].tolist(), s[same + 1].tolist())
                       if names.get(int(a)) is not None and names.get(int(a)) == names.get(int(b))})

    # ------------------------------------------------------------------ lookups
    def _base_lookup(self, ids: list[str], views) -> list[int | None]:
        """Sequence numbers of ``ids`` in the arrays (None: not there, or not live)."""
        self._settle()
        out: list[int | None] = [None] * len(ids)
        if not self._n_base or not ids:
            return out
        h = np.fromiter(map(self.hash, ids), dtype=np.int64, count=len(ids))
        lo = np.searchsorted(self._h, h, side="left")
        hi = np.searchsorted(self._h, h, side="right")
        cand: dict[int, list[int]] = {}
        for i in np.flatnonzero(hi > lo).tolist():
            seqs = [int(s) for s, ok in zip(self._s[lo[i]: hi[i]].tolist(), self._live[lo[i]: hi[i]].tolist()) if ok]
            if seqs:
                cand[i] = seqs
        if not cand:
            return out
        allseq = np.unique(np.fromiter((s for ss in cand.values() for s in ss), dtype=np.int64))
        names = self._resolve(allseq, views)
        for i, ss in cand.items():
            for s in ss:
                if names.get(s) == ids[i]:  # confirmed: not a hash collision
                    out[i] = s
                    break
        return out

    def get_many(self, ids: Sequence[str], views=None) -> list[int | None]:
        """The sequence number of each id (None where it names no live record)."""
        rec = self._recent
        out = [rec.get(i) for i in ids]
        miss = [j for j, s in enumerate(out) if s is None]
        self._settle()
        if miss and self._n_base:
            found = self._base_lookup([ids[j] for j in miss], views)
            for j, s in zip(miss, found):
                out[j] = s
        return out

    def get(self, rid: str, default=None, views=None):
        s = self.get_many([rid], views)[0]
        return default if s is None else s

    def __contains__(self, rid: object) -> bool:
        return isinstance(rid, str) and self.get(rid) is not None

    def __getitem__(self, rid: str) -> int:
        s = self.get(rid)
        if s is None:
            raise KeyError(rid)
        return s

    def __iter__(self):
        """Every live id (those of the arrays read back from their segments: slow, for tests and tools)."""
        yield from list(self._recent)
        self._settle()
        if self._n_base:
            names = self._resolve(np.unique(self._s[self._live]), None)
            yield from names.values()

    def __len__(self) -> int:
        return len(self._recent) + int(np.count_nonzero(self._live)) + sum(p[0].size for p in self._pending)

    # ------------------------------------------------------------------ changes (writer)
    def update(self, added: Mapping[str, int] | Iterable[tuple[str, int]]) -> None:
        """Ids now live (new ones, or the new versions of updated ones)."""
        self._recent.update(added)
        if len(self._recent) > max(self.fold_min, min(self._n_base // 8, self.fold_max)):
            self._fold()

    def remove(self, ids: Sequence[str], seqs: Sequence[int]) -> None:
        """Ids no longer live, with the sequence numbers :meth:`get_many` gave them."""
        self._settle()
        rest_h, rest_s = [], []
        rec = self._recent
        for rid, s in zip(ids, seqs):
            if rec.get(rid) == s:
                del rec[rid]
            else:
                rest_h.append(self.hash(rid))
                rest_s.append(int(s))
        if rest_h and self._n_base:
            h = np.asarray(rest_h, dtype=np.int64)
            lo = np.searchsorted(self._h, h, side="left")
            hi = np.searchsorted(self._h, h, side="right")
            for a, b, s in zip(lo.tolist(), hi.tolist(), rest_s):
                hit = np.flatnonzero(self._s[a:b] == s)
                self._live[a + hit] = False

    def nbytes(self) -> int:
        """Bytes of the arrays (the dict's entries are Python objects)."""
        self._settle()
        return int(self._h.nbytes + self._s.nbytes + self._live.nbytes)


def locate(views: Iterable, seqs: np.ndarray) -> list[tuple]:
    """(view, live rows) of the records with sequence numbers ``seqs`` (sorted) in ``views``.

    Where the writer and the searcher find a record once its id is resolved to a sequence number.

    Parameters
    ----------
    views : iterable of :class:`~gpuir.memory.segments.SegView`
    seqs : ndarray (n,), int64, host, sorted ascending, non-empty

    Returns
    -------
    list of (SegView, ndarray (m,), int64 rows of its live records among ``seqs``), views without one left out.
    """
    out = []
    for v in views:
        s = v.seg.seqs
        if not s.size or seqs[-1] < s[0] or seqs[0] > s[-1]:
            continue
        pos = np.minimum(np.searchsorted(s, seqs), s.size - 1)
        hit = s[pos] == seqs
        if hit.any():
            rows = pos[hit]
            if v.live is not None:
                rows = rows[v.live[rows]]
            if rows.size:
                out.append((v, rows))
    return out
