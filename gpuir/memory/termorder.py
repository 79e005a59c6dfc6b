"""The string order of a memory's terms as integer ranks, kept current as terms arrive.

A segment's vocabulary is sorted by string (ascending term order is the order
in which a fresh index adds a document's weights, so exactness depends on it).
Every new segment (one per ``add``) and every merge therefore sorts a set of
terms by string. :class:`TermOrder` does the string work once per term: it
gives every term code a 64-bit *rank* with ``rank[a] < rank[b]`` exactly when
``values[a] < values[b]``, so sorting any set of codes by string is
``codes[np.argsort(rank[codes])]``: NumPy, no string comparison.

New terms get ranks between their neighbours' (ranks are spaced ``GAP`` apart
at first); only when two neighbours leave no room is every rank renumbered
(O(vocabulary) in NumPy, rarely). The writer calls :meth:`TermOrder.update`
after adding terms (one sort of the new terms, then a binary search and an
insertion each into a blocked sorted list). Ranks of ranked codes never change
in a given :attr:`TermOrder.rank` array: growing or renumbering makes a new
array, so a merge thread that took :attr:`TermOrder.rank` may keep reading it.

A memory opened from disk brings its whole vocabulary at once: ranking it
(one sort of every term) runs in a background thread (:meth:`TermOrder.build_in_background`);
until it is installed :attr:`TermOrder.ready` is False, and segments and merges
sort their vocabularies by string instead (the same order, more slowly).
"""

from __future__ import annotations

import bisect
import logging
import threading
from array import array

import numpy as np

from .columns import Interner

log = logging.getLogger("gpuir.memory")

#: Initial spacing of ranks (room for 2**31 terms in int64, and many insertions between two).
GAP = 1 << 32


class _SortedBlocks:
    """A sorted list of strings (with each one's code) kept in blocks: finding a place and inserting cost
    O(log n + block); the codes in string order come out as one array."""

    B = 1024

    def __init__(self):
        self.blocks: list[list[str]] = []
        self.codes: list[array] = []  # int64 per block, parallel to blocks (no Python object per code)
        self.maxes: list[str] = []
        self.n = 0

    def insert_neighbours(self, s: str, code: int) -> tuple[str | None, str | None]:
        """Insert ``s`` (not an item yet); returns the items just below and above it."""
        if not self.blocks:
            self.blocks.append([s])
            self.codes.append(array("q", [code]))
            self.maxes.append(s)
            self.n = 1
            return None, None
        i = min(bisect.bisect_left(self.maxes, s), len(self.blocks) - 1)
        b = self.blocks[i]
        j = bisect.bisect_left(b, s)
        pred = b[j - 1] if j > 0 else (self.maxes[i - 1] if i > 0 else None)
        succ = b[j] if j < len(b) else (self.blocks[i + 1][0] if i + 1 < len(self.blocks) else None)
        b.insert(j, s)
        self.codes[i].insert(j, code)
        self.n += 1
        if j == len(b) - 1:
            self.maxes[i] = s
        if len(b) > 2 * self.B:
            c = self.codes[i]
            self.blocks[i: i + 1] = [b[: self.B], b[self.B:]]
            self.codes[i: i + 1] = [c[: self.B], c[self.B:]]
            self.maxes[i: i + 1] = [b[self.B - 1], b[-1]]
        return pred, succ

    def extend_sorted(self, items: list[str], codes: np.ndarray) -> None:
        """Append ``items`` (sorted, all above every item) with their codes (a bulk load)."""
        for a in range(0, len(items), self.B):
            blk = items[a: a + self.B]
            self.blocks.append(blk)
            self.codes.append(array("q", np.asarray(codes[a: a + self.B], dtype=np.int64).tobytes()))
            self.maxes.append(blk[-1])
        self.n += len(items)

    def all_codes(self) -> np.ndarray:
        """Every code in string order: ndarray (n,), int64."""
        if not self.codes:
            return np.zeros(0, np.int64)
        return np.concatenate([np.frombuffer(c, dtype=np.int64) for c in self.codes])


class TermOrder:
    """Integer ranks in string order for the codes of an :class:`Interner` (writer updates; anyone reads).

    Attributes
    ----------
    rank : ndarray (>= n,), int64, host
        ``rank[code]`` for every ranked code (the first :attr:`n`).
    n : int
        Codes ranked so far: 0 .. n-1.
    ready : bool
        False while a background build of the ranks is running (nothing may be read then).
    """

    def __init__(self, terms: Interner):
        self.terms = terms
        self._sorted = _SortedBlocks()  # every ranked term
        self.rank = np.zeros(1024, dtype=np.int64)
        self.n = 0
        self.ready = True
        #: Full renumberings so far (for tests).
        self.renumbered = 0
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ a whole vocabulary at once
    def build_in_background(self, lock) -> None:
        """Rank every code the interner holds now in a background thread, then install the result under
        ``lock`` (the writer's lock) and rank what was added meanwhile. Until then :attr:`ready` is False."""
        n0 = len(self.terms.values)
        if n0 == 0 or self.n:
            return
        self.ready = False

        def build():
            try:
                vals = self.terms.values[:n0]  # append-only: a prefix never changes
                order = sorted(range(n0), key=vals.__getitem__)  # (per-segment runs: mostly merging)
                blocks = _SortedBlocks()
                codes = np.asarray(order, dtype=np.int64)
                blocks.extend_sorted([vals[i] for i in order], codes)
                rank = np.zeros(max(1024, 2 * n0), dtype=np.int64)
                rank[codes] = (np.arange(n0, dtype=np.int64) + 1) * GAP
                with lock:
                    self._sorted, self.rank, self.n = blocks, rank, n0
                    self.ready = True
                    self.update()
            except Exception as e:  # noqa: BLE001 - the memory keeps sorting by string
                log.error("ranking the vocabulary in the background failed (%s: %s); vocabularies are sorted "
                          "by string instead", type(e).__name__, e)

        self._thread = threading.Thread(target=build, name="gpuir-term-order", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a background build (tests); returns :attr:`ready`."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.ready

    # ------------------------------------------------------------------ new terms
    def update(self) -> None:
        """Rank every code the interner holds that is not ranked yet (writer only; nothing while not ready).

        Costs O(k log k) for k new terms (plus, rarely, a renumbering of all in NumPy).
        """
        if not self.ready:
            return
        vals = self.terms.values
        total = len(vals)
        if total == self.n:
            return
        new = vals[self.n: total]
        order = sorted(range(len(new)), key=new.__getitem__)
        new_sorted = [new[i] for i in order]
        new_codes = np.arange(self.n, total, dtype=np.int64)[np.asarray(order, dtype=np.int64)]
        rank = self.rank
        if rank.size < total:
            grown = np.zeros(max(total, 2 * rank.size), dtype=np.int64)
            grown[: self.n] = rank[: self.n]
            rank = grown
        blocks = self._sorted
        index = self.terms.index
        if blocks.n == 0:  # the first terms: evenly spaced
            rank[new_codes] = (np.arange(len(new_sorted), dtype=np.int64) + 1) * GAP
            blocks.extend_sorted(new_sorted, new_codes)
            self.rank, self.n = rank, total
            return
        # each new term's neighbours among the ranked terms; terms sharing them are spread over their gap
        m = len(new_sorted)
        left = np.zeros(m, dtype=np.int64)
        right = np.zeros(m, dtype=np.int64)
        group = np.zeros(m, dtype=np.int64)
        g = -1
        prev = None
        for i, (s, c) in enumerate(zip(new_sorted, new_codes.tolist())):  # ascending: each placed, then the next
            pred, succ = blocks.insert_neighbours(s, c)
            if i > 0 and pred == prev:  # no ranked term between the previous new one and this one
                group[i], left[i], right[i] = g, left[i - 1], right[i - 1]
            else:
                g += 1
                group[i] = g
                left[i] = rank[index[pred]] if pred is not None else 0
                right[i] = rank[index[succ]] if succ is not None else -1
            prev = s
        starts = np.flatnonzero(np.concatenate(([True], group[1:] != group[:-1])))
        glen = np.diff(np.append(starts, m))
        k = np.arange(m, dtype=np.int64) - np.repeat(starts, glen) + 1  # 1-based place in its group
        size = np.repeat(glen, glen)
        right = np.where(right < 0, left + (size + 1) * GAP, right)  # after the last term: fresh room
        width = right - left
        if bool(np.all(width > size)):
            rank[new_codes] = left + (width // (size + 1)) * k
        else:  # no room between two neighbours: renumber everything (a new array; old readers keep theirs)
            all_codes = blocks.all_codes()
            rank = np.zeros(max(rank.size, total), dtype=np.int64)
            rank[all_codes] = (np.arange(all_codes.size, dtype=np.int64) + 1) * GAP
            self.renumbered += 1
        self.rank, self.n = rank, total

    def sort_codes(self, codes: np.ndarray) -> np.ndarray:
        """``codes`` (distinct, ranked) in ascending string order: ndarray, int64."""
        codes = np.asarray(codes, dtype=np.int64)
        return codes[np.argsort(self.rank[codes], kind="stable")]
