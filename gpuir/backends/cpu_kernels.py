"""Compiled (Numba) kernels of the ``numba`` backend: shared pieces and the exhaustive search.

Everything here is a Numba ``nopython`` function compiled with ``nogil=True``
(Python threads run them at once) and ``cache=True`` (compiled once per
machine, then loaded from ``__pycache__``). ``fastmath`` is off on purpose:
float32 additions happen one by one in the order written, never reassociated,
vectorised or fused into FMAs, so that scores equal the NumPy reference's bit
for bit. The reference's arithmetic, which every kernel reproduces:

* a document's score adds its float32 posting weights (``posting_weights``)
  in ascending term id, starting from 0.0f; a query term occurring ``c``
  times adds ``w * float32(c)`` (the reference skips the product when c == 1;
  ``w * 1.0f == w`` exactly, so the kernels may multiply always); absent terms
  add nothing (adding +0.0 would change no bit either);
* bm25l / bm25+ add the query's float32 constant once at the end;
* the top k are ordered by score descending, then document ascending.

The pruned search lives in :mod:`gpuir.backends.cpu_maxscore`; this module
holds the exhaustive one (``prune=False`` and ``score_matrix``): **document at
a time**, one cursor per distinct query term, the next candidate being the
smallest current document; its weights are collected by term rank, then summed
in that order. **Filters leapfrog**: an allow-list is one more cursor that every
candidate must match, and cursors gallop to the next allowed document, so a
small allow-list costs about |allow| x terms x log(gap) steps whatever the
lists' lengths. Scratch is O(terms + k) per call; nothing per query is O(N).
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: nogil: searches from several Python threads run at once; cache: compile once per machine.
JIT = {"nogil": True, "cache": True}

#: Larger than any document number.
_END = np.int64(2**62)


@njit(**JIT)
def advance(ids, pos, end, target):
    """First position p in [pos, end) with ids[p] >= target, or end (galloping search)."""
    if pos >= end or ids[pos] >= target:
        return pos
    lo = pos  # ids[lo] < target
    step = 1
    hi = pos + 1
    while hi < end and ids[hi] < target:
        lo = hi
        step *= 2
        hi = lo + step
    hi = min(hi, end)
    while lo + 1 < hi:  # ids[lo] < target <= ids[hi] (or hi == end)
        mid = (lo + hi) >> 1
        if ids[mid] < target:
            lo = mid
        else:
            hi = mid
    return hi


@njit(**JIT)
def worse(sa, da, sb, db):
    """Whether (score sa, doc da) ranks below (sb, db): lower score, or equal score and higher doc."""
    return sa < sb or (sa == sb and da > db)


@njit(**JIT)
def sift_down(hs, hd, size, i):
    """Min-heap under :func:`worse` (the worst at the top) on (scores hs, docs hd): restore below i."""
    while True:
        c = 2 * i + 1
        if c >= size:
            return
        if c + 1 < size and worse(hs[c + 1], hd[c + 1], hs[c], hd[c]):
            c += 1
        if not worse(hs[c], hd[c], hs[i], hd[i]):
            return
        hs[i], hs[c] = hs[c], hs[i]
        hd[i], hd[c] = hd[c], hd[i]
        i = c


@njit(**JIT)
def sift_up(hs, hd, i):
    """The same heap: restore above i."""
    while i > 0:
        p = (i - 1) >> 1
        if not worse(hs[i], hd[i], hs[p], hd[p]):
            return
        hs[i], hs[p] = hs[p], hs[i]
        hd[i], hd[p] = hd[p], hd[i]
        i = p


@njit(**JIT)
def query_terms(q, offsets, tid, tmul):
    """Distinct terms of ``q`` with postings, ascending, and their counts; returns how many.

    ``tid`` (int64) and ``tmul`` (int64) receive them (capacity >= q.size).
    """
    n = q.size
    for i in range(n):
        tid[i] = q[i]
    gap = 1
    while gap * 3 + 1 < n:
        gap = gap * 3 + 1
    while gap > 0:  # Shell sort (insertion sort for short queries): cheap to compile, unlike np.sort
        for i in range(gap, n):
            v = tid[i]
            j = i
            while j >= gap and tid[j - gap] > v:
                tid[j] = tid[j - gap]
                j -= gap
            tid[j] = v
        gap //= 3
    T = 0
    i = 0
    while i < n:
        t = tid[i]
        c = 1
        while i + c < n and tid[i + c] == t:
            c += 1
        i += c
        if offsets[t + 1] > offsets[t]:  # a term without postings adds nothing anywhere
            tid[T] = t
            tmul[T] = c
            T += 1
    return T


@njit(**JIT)
def pop_sorted(hs, hd, size, out_ids, out_scores):
    """Empty the heap (hs, hd) of ``size`` entries into the rows, best first."""
    for m in range(size - 1, -1, -1):  # the worst goes to the last free place
        out_scores[m] = hs[0]
        out_ids[m] = hd[0]
        hs[0] = hs[m]
        hd[0] = hd[m]
        sift_down(hs, hd, m, 0)


@njit(**JIT)
def query_allow(allow_flat, a_lo, a_hi, i, noallow):
    """Query i's allow-list (``noallow``, empty, when it has none) and whether it allows nothing."""
    if a_lo[i] < 0:
        return noallow, False
    return allow_flat[a_lo[i]:a_hi[i]], a_hi[i] == a_lo[i]


@njit(**JIT)
def _daat(offsets, doc_ids, weights, q, const, has_const, allow, tid, tmul, pos, cur, contrib, hs, hd, dense):
    """Every candidate of one query, document at a time (see the module docstring).

    With ``dense.size == 0`` the best ``hs.size`` go to the heap (hs, hd);
    otherwise each candidate's score is written to ``dense[doc]``.
    Returns (results in the heap, postings read).
    """
    T = query_terms(q, offsets, tid, tmul)
    for r in range(T):
        t = tid[r]
        pos[r] = offsets[t]
        cur[r] = doc_ids[pos[r]]
        contrib[r] = np.float32(0.0)
    cap = hs.size
    size = 0
    read = 0
    na = allow.size
    ap = 0
    while T > 0:
        d = _END
        for r in range(T):
            d = min(d, cur[r])
        if d == _END:
            break
        if na > 0:  # leapfrog with the allow-list
            ap = advance(allow, ap, na, d)
            if ap == na:
                break
            a = allow[ap]
            if a != d:
                for r in range(T):
                    if cur[r] < a:
                        e = offsets[tid[r] + 1]
                        p = advance(doc_ids, pos[r], e, a)
                        pos[r] = p
                        cur[r] = doc_ids[p] if p < e else _END
                continue
        for r in range(T):
            if cur[r] == d:
                contrib[r] = weights[pos[r]] * np.float32(tmul[r])
                read += 1
                p = pos[r] + 1
                pos[r] = p
                cur[r] = doc_ids[p] if p < offsets[tid[r] + 1] else _END
        s = np.float32(0.0)
        for r in range(T):  # ascending term id, the reference's order
            s += contrib[r]
            contrib[r] = np.float32(0.0)
        if has_const:
            s = s + const
        if dense.size > 0:
            dense[d] = s
        elif size < cap:
            hs[size] = s
            hd[size] = d
            sift_up(hs, hd, size)
            size += 1
        elif s > hs[0]:  # d is above every document in the heap: a tie cannot win
            hs[0] = s
            hd[0] = d
            sift_down(hs, hd, size, 0)
    return size, read


@njit(**JIT)
def _scratch(q_off, rows):
    """Per-call scratch of :func:`_daat` for the longest query of ``rows``."""
    qmax = 1
    for j in range(rows.size):
        i = rows[j]
        qmax = max(qmax, q_off[i + 1] - q_off[i])
    return (np.empty(qmax, np.int64), np.empty(qmax, np.int64), np.empty(qmax, np.int64),
            np.empty(qmax, np.int64), np.zeros(qmax, np.float32))


@njit(**JIT)
def search_exhaustive(offsets, doc_ids, weights, n_docs, q_flat, q_off, consts, has_const,
                      allow_flat, a_lo, a_hi, k, rows, out_ids, out_scores, counts):
    """Top-k of the queries ``rows``, every candidate scored (document at a time).

    Parameters
    ----------
    offsets : (V+1,) int64; doc_ids : (P,) int32; weights : (P,) float32 -- the index and its weights
    n_docs : int -- N
    q_flat : (Q,) int64 -- every query's term ids, concatenated; q_off : (B+1,) int64 -- query i is
        q_flat[q_off[i]:q_off[i+1]]
    consts : (B,) float32 -- each query's bm25l/bm25+ constant, added when has_const
    allow_flat : (A,) int64; a_lo, a_hi : (B,) int64 -- query i's allow-list (sorted, unique) is
        allow_flat[a_lo[i]:a_hi[i]] when a_lo[i] >= 0, else it has none
    k : int; rows : (R,) int64 -- the queries to answer
    out_ids : (B, k) int64, out_scores : (B, k) float32 -- pre-filled with padding; rows are written
    counts : (B, 4) int64 -- counts[i, 0] receives the postings read
    """
    cap = min(k, max(n_docs, 1))
    tid, tmul, pos, cur, contrib = _scratch(q_off, rows)
    hs = np.empty(cap, np.float32)
    hd = np.empty(cap, np.int64)
    nodense = np.empty(0, np.float32)
    noallow = np.empty(0, np.int64)
    for j in range(rows.size):
        i = rows[j]
        allow, nothing = query_allow(allow_flat, a_lo, a_hi, i, noallow)
        if nothing:
            continue
        size, read = _daat(offsets, doc_ids, weights, q_flat[q_off[i]:q_off[i + 1]], consts[i], has_const,
                           allow, tid, tmul, pos, cur, contrib, hs, hd, nodense)
        counts[i, 0] = read
        pop_sorted(hs, hd, size, out_ids[i], out_scores[i])


@njit(**JIT)
def score_dense(offsets, doc_ids, weights, q_flat, q_off, consts, has_const, allow_flat, a_lo, a_hi, rows, out):
    """Every candidate's score of the queries ``rows``: ``out[i, doc] = score``.

    Arguments as :func:`search_exhaustive`; out : (B, N) float32, pre-filled with -inf.
    """
    tid, tmul, pos, cur, contrib = _scratch(q_off, rows)
    hs = np.empty(0, np.float32)
    hd = np.empty(0, np.int64)
    noallow = np.empty(0, np.int64)
    for j in range(rows.size):
        i = rows[j]
        allow, nothing = query_allow(allow_flat, a_lo, a_hi, i, noallow)
        if not nothing:
            _daat(offsets, doc_ids, weights, q_flat[q_off[i]:q_off[i + 1]], consts[i], has_const, allow,
                  tid, tmul, pos, cur, contrib, hs, hd, out[i])
