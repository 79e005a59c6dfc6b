"""The string order of a memory's terms as integer ranks, kept current as terms arrive.

A segment's vocabulary is sorted by string (ascending term order is the order
in which a fresh index adds a document's weights, so exactness depends on it).
Every new segment (one per ``add``) and every merge therefore sorts a set of
terms by string. :class:`TermOrder` does the string work once per term: it
gives every term code a 64-bit *rank* with ``rank[a] < rank[b]`` exactly when
``values[a] < values[b]``, so sorting any set of codes by string is
``codes[np.argsort(rank[codes])]``: NumPy, no string comparison.

New terms get ranks between their neighbours' (ranks are spaced ``GAP`` apart
at first); only when two neighbours leave no room is every rank renumbered,
O(vocabulary), rarely. The writer calls :meth:`TermOrder.update` after adding
terms (one sort of the new terms, a binary search each among the ranked ones,
and one merge of sorted lists). Ranks of ranked codes never change in a given
:attr:`TermOrder.rank` array: growing or renumbering makes a new array, so a
merge thread that took :attr:`TermOrder.rank` may keep reading it.
"""

from __future__ import annotations

import bisect

import numpy as np

from .columns import Interner

#: Initial spacing of ranks (room for 2**31 terms in int64, and many insertions between two).
GAP = 1 << 32


class _SortedBlocks:
    """A sorted list of strings kept in blocks: finding a place and inserting cost O(log n + block)."""

    B = 1024

    def __init__(self):
        self.blocks: list[list[str]] = []
        self.maxes: list[str] = []
        self.n = 0

    def insert_neighbours(self, s: str) -> tuple[str | None, str | None]:
        """Insert ``s`` (not an item yet); returns the items just below and above it."""
        if not self.blocks:
            self.insert(s)
            return None, None
        i = min(bisect.bisect_left(self.maxes, s), len(self.blocks) - 1)
        b = self.blocks[i]
        j = bisect.bisect_left(b, s)
        pred = b[j - 1] if j > 0 else (self.maxes[i - 1] if i > 0 else None)
        succ = b[j] if j < len(b) else (self.blocks[i + 1][0] if i + 1 < len(self.blocks) else None)
        b.insert(j, s)
        self.n += 1
        if j == len(b) - 1:
            self.maxes[i] = s
        if len(b) > 2 * self.B:
            self.blocks[i: i + 1] = [b[: self.B], b[self.B:]]
            self.maxes[i: i + 1] = [b[self.B - 1], b[-1]]
        return pred, succ

    def neighbours(self, s: str) -> tuple[str | None, str | None]:
        """The largest item below ``s`` and the smallest above it (``s`` itself is not an item)."""
        i = bisect.bisect_left(self.maxes, s)
        if i == len(self.blocks):
            return (self.maxes[-1] if self.blocks else None), None
        b = self.blocks[i]
        j = bisect.bisect_left(b, s)
        pred = b[j - 1] if j > 0 else (self.maxes[i - 1] if i > 0 else None)
        return pred, b[j]

    def insert(self, s: str) -> None:
        if not self.blocks:
            self.blocks.append([s])
            self.maxes.append(s)
            self.n = 1
            return
        i = min(bisect.bisect_left(self.maxes, s), len(self.blocks) - 1)
        b = self.blocks[i]
        bisect.insort(b, s)
        self.maxes[i] = b[-1]
        self.n += 1
        if len(b) > 2 * self.B:
            self.blocks[i: i + 1] = [b[: self.B], b[self.B:]]
            self.maxes[i: i + 1] = [b[self.B - 1], b[-1]]

    def extend_sorted(self, items: list[str]) -> None:
        """Append ``items``, sorted and all above every item (a bulk load)."""
        for a in range(0, len(items), self.B):
            blk = items[a: a + self.B]
            self.blocks.append(blk)
            self.maxes.append(blk[-1])
        self.n += len(items)

    def __iter__(self):
        for b in self.blocks:
            yield from b


class TermOrder:
    """Integer ranks in string order for the codes of an :class:`Interner` (writer updates; anyone reads).

    Attributes
    ----------
    rank : ndarray (>= n,), int64, host
        ``rank[code]`` for every ranked code (the first :attr:`n`).
    n : int
        Codes ranked so far: 0 .. n-1.
    """

    def __init__(self, terms: Interner):
        self.terms = terms
        self._sorted = _SortedBlocks()  # every ranked term
        self.rank = np.zeros(1024, dtype=np.int64)
        self.n = 0
        #: Full renumberings so far (for tests).
        self.renumbered = 0

    def update(self) -> None:
        """Rank every code the interner holds that is not ranked yet (writer only).

        Costs O(k log k) for k new terms (plus, rarely, a renumbering of all).
        """
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
            blocks.extend_sorted(new_sorted)
            self.rank, self.n = rank, total
            return
        # each new term's neighbours among the ranked terms; terms sharing them are spread over their gap
        m = len(new_sorted)
        left = np.zeros(m, dtype=np.int64)
        right = np.zeros(m, dtype=np.int64)
        group = np.zeros(m, dtype=np.int64)
        g = -1
        prev = None
        for i, s in enumerate(new_sorted):  # ascending: each is inserted before the next is placed
            pred, succ = blocks.insert_neighbours(s)
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
        ok = bool(np.all(width > size))
        if ok:
            rank[new_codes] = left + (width // (size + 1)) * k
        else:  # no room between two neighbours: renumber everything (a new array; old readers keep theirs)
            all_codes = np.fromiter(map(index.__getitem__, blocks), dtype=np.int64, count=blocks.n)
            rank = np.zeros(max(rank.size, total), dtype=np.int64)
            rank[all_codes] = (np.arange(blocks.n, dtype=np.int64) + 1) * GAP
            self.renumbered += 1
        self.rank, self.n = rank, total

    def sort_codes(self, codes: np.ndarray) -> np.ndarray:
        """``codes`` (distinct, ranked) in ascending string order: ndarray, int64."""
        codes = np.asarray(codes, dtype=np.int64)
        return codes[np.argsort(self.rank[codes], kind="stable")]
