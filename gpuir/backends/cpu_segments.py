"""Compiled (Numba) search of many segments in one call, and the per-search weight cache.

A store made of segments (:mod:`gpuir.memory`) scores every segment with the
statistics of the whole live collection. Two things make that as fast as a
static index's search:

**A weight cache per search statistics** (:func:`fill_weights`). A static index
reads each posting's weight from a cache made once; a segment searched under a
store's statistics would compute it per posting (a division and a random read
of the document's length). The statistics of a store's snapshot do not change
while it is searched, so the weights of the postings its queries read are
computed once per (snapshot, segment) -- term by term, on first use, with the
kernels' own :func:`~gpuir.backends.cpu_kernels.weight` (the same float32
operations, so the same bits) -- together with each term's exact largest weight,
each block's largest weight and whether a weight is <= 0 or < 0. A search then
runs the static path of :mod:`gpuir.backends.cpu_maxscore` on them: the same
arithmetic read from memory, the same exact bounds. Filling a term never
rewrites a filled one, so searches reading filled terms may run while another
thread fills others (fills are serialised by the caller).

**All segments in one call** (:func:`search_segments`). Each query visits the
segments in the order given (largest first), maps its global term codes to each
segment's local ids (found once per snapshot and term, :func:`locate_terms`), runs the
pruned search of :func:`gpuir.backends.cpu_maxscore.query_row` with the k-th best
score found so far as its ``theta``, and merges the segment's hits into one
top-k heap ordered by score descending, then sequence number ascending -- the
memory's tie rule. No Python runs between segments.

**Or all segments as one** (:func:`union_row`). A row dense in every segment
(its lists hold at least half as many postings as the segment has rows) with
no filter is searched over the concatenation of the segments, as over one
merged segment, with cached weights or without (a snapshot searched once): rows numbered segment after segment, each term's list the
concatenation of its pieces, one accumulator, one heap of partial scores, the
terms' bounds their largest weight in any segment. It reads and finishes what a
merged segment would; the exact scores are the same float32 sums (a document's
weights in ascending term order), so are the results (tested against the
segment-by-segment path and the reference).

A segment is a tuple (see :func:`search_segments`); the store builds the list
of its snapshot's segments once per snapshot.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.typed import List

from . import raw_views as rv
from .cpu_kernels import JIT, advance, exhaustive_row, pop_sorted, sift_down, sift_up, weight
from .cpu_maxscore import (
    PROBE_COST,
    SAMPLE_STRIDE,
    block_of,
    bound64,
    floor64,
    heap_by_partial,
    probe_weight,
    query_row,
    raise_lb,
    scan_list,
    scan_order,
    select_survivors,
)


@njit(**JIT)
def fill_weights(ix, fp, method, has_w0, blk_off, starts, terms, idfs, w0s, pre, blk_max, ub, zero, neg, filled):
    """Fill the weight cache for local terms ``terms`` (weights ``idfs``, ``w0s``) not filled yet.

    Parameters
    ----------
    ix : (offsets, doc_ids, tfs, dls) of the segment
    fp, method, has_w0 : the weight parameters (see :mod:`gpuir.backends.cpu_kernels`)
    blk_off : (V+1,) int64, starts : (NB,) int64 -- the block index (term t's blocks, each block's first posting)
    terms : (m,) int64 local term ids (-1: skip); idfs, w0s : (m,) float32
    pre : (P,) float32; blk_max : (NB,) float32; ub : (V,) float64; zero, neg, filled : (V,) bool
        The cache: a term's entries are written once, then ``filled[t]`` is set.

    Returns
    -------
    int: postings whose weight was computed
    """
    offsets, doc_ids, tfs, dls = ix
    nopre = pre[:0]
    done = 0
    for j in range(terms.size):
        t = terms[j]
        if t < 0 or filled[t]:
            continue
        idf = idfs[j]
        w0 = w0s[j]
        s, e = offsets[t], offsets[t + 1]
        mx = np.float32(-np.inf)
        mn = np.float32(np.inf)
        for p in range(s, e):
            w = weight(nopre, tfs, dls, fp, method, has_w0, p, doc_ids[p], idf, w0)
            pre[p] = w
            mx = max(mx, w)
            mn = min(mn, w)
        for b in range(blk_off[t], blk_off[t + 1]):
            be = starts[b + 1] if b + 1 < starts.size else e
            be = min(be, e)
            m = pre[starts[b]]
            for p in range(starts[b] + 1, be):
                m = max(m, pre[p])
            blk_max[b] = m
        ub[t] = np.float64(mx) if e > s else 0.0
        zero[t] = e > s and mn <= 0
        neg[t] = e > s and mn < 0
        filled[t] = True
        done += e - s
    return done


@njit(**JIT)
def lay_out(offsets, doc_ids, tfs, dls, bs, blk_off, shift, dir_off, summ, blk_last, blk_maxtf, blk_mindl, starts,
            blk_dir):
    """A segment's statistics-free layout in one pass over its postings (what a scorer builds once).

    Fills, per term t: ``summ`` = (maxtf, mindl, mintf, maxdl) (V,) int32 (zeros for a term without
    postings; lengths are the documents' ``dls``); per block of ``bs`` postings (term t's blocks are
    ``blk_off[t]:blk_off[t+1]``): its first posting ``starts`` (int64), last document ``blk_last``,
    largest tf ``blk_maxtf`` and smallest length ``blk_mindl`` (int32); and the directory ``blk_dir``
    (int64): entry ``dir_off[t] + c`` is term t's first block whose last document is >= ``c << shift[t]``
    (``blk_off[t+1]`` when none is). See :meth:`gpuir.backends.numba_backend.NumbaScorer._block_index`.
    """
    maxtf, mindl, mintf, maxdl = summ
    V = offsets.size - 1
    for t in range(V):  # one pass over the postings: block and term summaries together
        s, e = offsets[t], offsets[t + 1]
        b = blk_off[t]
        for p0 in range(s, e, bs):
            p1 = min(p0 + bs, e)
            starts[b] = p0
            blk_last[b] = doc_ids[p1 - 1]
            hi_tf = tfs[p0]
            lo_tf = hi_tf
            lo_dl = dls[doc_ids[p0]]
            hi_dl = lo_dl
            for p in range(p0 + 1, p1):
                tf = tfs[p]
                dl = dls[doc_ids[p]]
                hi_tf = max(hi_tf, tf)
                lo_tf = min(lo_tf, tf)
                lo_dl = min(lo_dl, dl)
                hi_dl = max(hi_dl, dl)
            blk_maxtf[b] = hi_tf
            blk_mindl[b] = lo_dl
            if p0 == s:
                maxtf[t], mindl[t], mintf[t], maxdl[t] = hi_tf, lo_dl, lo_tf, hi_dl
            else:
                maxtf[t] = max(maxtf[t], hi_tf)
                mindl[t] = min(mindl[t], lo_dl)
                mintf[t] = min(mintf[t], lo_tf)
                maxdl[t] = max(maxdl[t], hi_dl)
            b += 1
        b = blk_off[t]
        be = blk_off[t + 1]
        sh = shift[t]
        d0 = dir_off[t]
        for c in range(dir_off[t + 1] - d0):
            fd = c << sh
            while b < be and blk_last[b] < fd:
                b += 1
            blk_dir[d0 + c] = b


@njit(**JIT)
def first_bad_posting(offsets, doc_ids, tfs, n_docs):
    """The first posting p that breaks a segment's rules -- its document outside [0, n_docs), its tf
    below 1, or the next posting of its term not at a larger document -- or -1 (one pass, for the
    check made when a segment's postings are first read: :func:`gpuir.memory.segments.check_postings`)."""
    V = offsets.size - 1
    for t in range(V):
        prev = -1
        for p in range(offsets[t], offsets[t + 1]):
            d = doc_ids[p]
            if d < 0 or d >= n_docs or tfs[p] < 1 or d <= prev:
                return p
            prev = d
    return -1


@njit(**JIT)
def _local_terms(g_sorted, g_order, gids, out):
    """Local ids of global codes ``gids`` into ``out`` (-1 where absent); the codes' order is kept."""
    n = g_sorted.size
    for j in range(gids.size):
        g = gids[j]
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) >> 1
            if g_sorted[mid] < g:
                lo = mid + 1
            else:
                hi = mid
        out[j] = g_order[lo] if lo < n and g_sorted[lo] == g else -1


@njit(**JIT)
def locate_terms(segs, gids, locs, row0):
    """Local ids of the global codes ``gids`` in every segment of ``segs`` (-1 where absent), into rows
    ``row0 ..`` of ``locs`` ((S, len(segs)) int64: one row per term, one column per segment, so that a
    search reads a term's ids in every segment from one or two cache lines instead of a binary search
    per segment)."""
    loc = np.empty(gids.size, np.int64)
    j = 0
    for s in segs:  # an explicit counter: the loop runs in numba over a typed list
        _local_terms(s[1], s[2], gids, loc)
        for r in range(gids.size):
            locs[row0 + r, j] = loc[r]
        j += 1  # noqa: SIM113


@njit(**JIT)
def fill_segments(segs, fp, method, has_w0, gids, idfs, w0s):
    """:func:`fill_weights` of every segment of ``segs`` for the global term codes ``gids`` (distinct).

    Returns the postings whose weight was computed.
    """
    loc = np.empty(gids.size, np.int64)
    done = 0
    for s in segs:
        g_sorted, g_order, ix, bix, cache = s[1], s[2], s[4], s[5], s[8]
        _local_terms(g_sorted, g_order, gids, loc)
        done += fill_weights(ix, fp, method, has_w0, bix[0], s[9], loc, idfs, w0s, cache[0], cache[1], cache[2],
                             cache[3], cache[4], cache[5])
    return done


@njit(**JIT)
def segment_list(first):
    """A typed list holding the segment tuple ``first`` (see :func:`search_segments`).

    Made in compiled code, so that the list's methods for the segment tuple's type are compiled
    with this function and cached on disk with it: a typed list filled from Python compiles them
    in every new process (about a second), which was most of a fresh process's first search.
    """
    out = List()
    out.append(first)
    return out


@njit(**JIT)
def segment_list_append(segs, seg):
    """Append the segment tuple ``seg`` to ``segs`` (a :func:`segment_list`), in compiled code."""
    segs.append(seg)


@njit(**JIT)
def _worse_seq(sa, qa, sb, qb):
    """(score sa, seq qa) ranks below (sb, qb): lower score, or equal score and later sequence number."""
    return sa < sb or (sa == sb and qa > qb)


@njit(**JIT)
def _g_sift_down(hs, hq, hv, hr, size, i):
    while True:
        c = 2 * i + 1
        if c >= size:
            return
        if c + 1 < size and _worse_seq(hs[c + 1], hq[c + 1], hs[c], hq[c]):
            c += 1
        if not _worse_seq(hs[c], hq[c], hs[i], hq[i]):
            return
        hs[i], hs[c] = hs[c], hs[i]
        hq[i], hq[c] = hq[c], hq[i]
        hv[i], hv[c] = hv[c], hv[i]
        hr[i], hr[c] = hr[c], hr[i]
        i = c


@njit(**JIT)
def _g_sift_up(hs, hq, hv, hr, i):
    while i > 0:
        p = (i - 1) >> 1
        if not _worse_seq(hs[i], hq[i], hs[p], hq[p]):
            return
        hs[i], hs[p] = hs[p], hs[i]
        hq[i], hq[p] = hq[p], hq[i]
        hv[i], hv[p] = hv[p], hv[i]
        hr[i], hr[p] = hr[p], hr[i]
        i = p


@njit(**JIT)
def _segment_at(bases, d):
    """The segment holding snapshot row d: s with bases[s] <= d < bases[s + 1] (a binary search)."""
    lo, hi = 0, bases.size - 2
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if bases[mid] <= d:
            lo = mid
        else:
            hi = mid - 1
    return lo


#: The arrays :func:`union_row` reads of each segment, the columns of :func:`pointer_rows`'s table (an
#: address and a length each), with the dtypes it reads them as.
UNION_COLUMNS = (("offsets", np.int64), ("doc_ids", np.int32), ("pre", np.float32), ("live", np.bool_),
                 ("ub", np.float64), ("zero", np.bool_), ("neg", np.bool_), ("seqs", np.int64),
                 ("blk_off", np.int64), ("blk_last", np.int32), ("dir_off", np.int64), ("dir_shift", np.int64),
                 ("blk_dir", np.int64), ("tfs", np.int32), ("doc_lens", np.int32), ("maxtf", np.int32),
                 ("mindl", np.int32), ("mintf", np.int32), ("maxdl", np.int32), ("blk_maxtf", np.int32),
                 ("blk_mindl", np.int32))
_NCOL = 2 * len(UNION_COLUMNS)


@njit(**JIT)
def _put(table, i, j, a):
    table[i, 2 * j] = a.ctypes.data if a.size else 0
    table[i, 2 * j + 1] = a.size


@njit(**JIT)
def pointer_rows(segs):
    """Each segment's :data:`UNION_COLUMNS` by address and length, read from the segment list ``segs``
    (which keeps the arrays alive: the table is valid while it is).

    Returns
    -------
    (S, 2 * len(UNION_COLUMNS)) int64
    """
    table = np.zeros((len(segs), _NCOL), np.int64)
    for i, s in enumerate(segs):
        ix, bix, summ, cache = s[4], s[5], s[6], s[8]
        _put(table, i, 0, ix[0])
        _put(table, i, 1, ix[1])
        _put(table, i, 2, cache[0])
        _put(table, i, 3, s[7])
        _put(table, i, 4, cache[2])
        _put(table, i, 5, cache[3])
        _put(table, i, 6, cache[4])
        _put(table, i, 7, s[3])
        _put(table, i, 8, bix[0])
        _put(table, i, 9, bix[1])
        _put(table, i, 10, bix[5])
        _put(table, i, 11, bix[6])
        _put(table, i, 12, bix[7])
        _put(table, i, 13, ix[2])
        _put(table, i, 14, ix[3])
        _put(table, i, 15, summ[0])
        _put(table, i, 16, summ[1])
        _put(table, i, 17, summ[2])
        _put(table, i, 18, summ[3])
        _put(table, i, 19, bix[3])
        _put(table, i, 20, bix[4])
    return table


@njit(**JIT)
def _lists(ptrs, s):
    """Segment s's ``ix`` (offsets, doc_ids, tfs, doc_lens) and its cached weights ``pre`` ((0,) when
    uncached: the weights are then computed from tf and length, :func:`~gpuir.backends.cpu_kernels.weight`)."""
    return ((rv.i64(ptrs[s, 0], ptrs[s, 1]), rv.i32(ptrs[s, 2], ptrs[s, 3]), rv.i32(ptrs[s, 26], ptrs[s, 27]),
             rv.i32(ptrs[s, 28], ptrs[s, 29])), rv.f32(ptrs[s, 4], ptrs[s, 5]))


@njit(**JIT)
def union_row(ptrs, vis, bases, tloc, T, q_mult, q_idf, q_w0, const, fp, bp, method, has_w0, cached, theta, slack, order,
              bnd, suf, mul, acc, touched, sdoc, part, mark, ph, pd, gs, gq, gv, gr, cnt):
    """Top k of one row over every segment at once, as over one merged segment: the dense regime of
    :func:`gpuir.backends.cpu_maxscore.query_row` with the snapshot's rows numbered segment after
    segment (segment s's row d is ``bases[s] + d``), each term's list the concatenation of its pieces.

    Terms are scanned in the order of their largest weight in any segment, into one accumulator
    over all rows; the k-th best partial score over all rows bounds the lists left, as in one index,
    so a snapshot of many segments reads and finishes what one merged segment would (segment by
    segment, each segment's search starts from the k-th score of those before it: lower bounds,
    more survivors). No filter (the caller checks).

    ``cached``: the weights, the terms' largest weights and the blocks' are read from the segments'
    caches (:func:`fill_weights`); otherwise each weight is computed from its posting's tf and length (the
    same float32 operations: the same bits) and the bounds come from the terms' and blocks' largest tf and
    smallest length (:func:`~gpuir.backends.cpu_maxscore.bound64`): a snapshot searched once -- an agent's
    memory after each add -- is searched all at once too, without filling a cache.

    Parameters
    ----------
    ptrs : (S, 2 * len(UNION_COLUMNS)) int64 -- each segment's arrays (:data:`UNION_COLUMNS`), by address
        (:func:`pointer_rows`); vis : (S,) int64 -- their views' positions
    bases : (S + 1,) int64 -- their first rows
    tloc : (T, S) int64 -- each term's local id in each segment (-1: absent), terms ascending
    q_mult (T,) int64, q_idf (T,) float32, q_w0 (T,) float32; const : float32 -- the row's terms and constant
    fp (6,) float32, bp (5,) float64, method, has_w0 -- the weights' and bounds' parameters (:func:`search_segments`)
    acc, touched, sdoc, part, mark : the workspace over ``bases[S]`` rows (zero on entry and on return)
    ph, pd : (k,) scratch; gs, gq, gv, gr : (k,) the row's empty top-k heap (score, sequence number,
        view, row), filled here
    cnt : (4,) int64 -- postings read, -1, survivors, rescored

    Returns
    -------
    int: hits in the heap, or -1 when the row is not dense in every segment (its lists hold fewer
    postings than half a segment's rows) or a weight may be <= 0: the caller searches it segment by
    segment.
    """
    S = vis.size
    post = 0
    for r in range(T):
        bnd[r] = 0.0
        mul[r] = np.float32(q_mult[r])
    for s in range(S):
        offsets = rv.i64(ptrs[s, 0], ptrs[s, 1])
        here = 0
        if cached:
            ub = rv.f64(ptrs[s, 8], ptrs[s, 9])
            zero = rv.u8(ptrs[s, 10], ptrs[s, 11])
            neg = rv.u8(ptrs[s, 12], ptrs[s, 13])
            for r in range(T):
                t = tloc[r, s]
                if t >= 0:
                    if zero[t] or neg[t]:  # a weight <= 0: acc > 0 does not mark the touched rows
                        return -1
                    bnd[r] = max(bnd[r], ub[t])
                    here += offsets[t + 1] - offsets[t]
        else:
            maxtf, mindl = rv.i32(ptrs[s, 30], ptrs[s, 31]), rv.i32(ptrs[s, 32], ptrs[s, 33])
            mintf, maxdl = rv.i32(ptrs[s, 34], ptrs[s, 35]), rv.i32(ptrs[s, 36], ptrs[s, 37])
            for r in range(T):
                t = tloc[r, s]
                if t >= 0:
                    if floor64(mintf[t], maxdl[t], bp, method, has_w0, q_idf[r], q_w0[r]) <= 0.0:
                        return -1  # a weight may be <= 0 (as above)
                    bnd[r] = max(bnd[r], bound64(maxtf[t], mindl[t], bp, method, has_w0, q_idf[r], q_w0[r]))
                    here += offsets[t + 1] - offsets[t]
        if 2 * here < bases[s + 1] - bases[s]:
            # sparse in this segment: alone, it would track its few touched rows (and may be skipped
            # whole), where the accumulator's passes here would read every row
            return -1
        post += here
    for r in range(T):
        bnd[r] *= q_mult[r]
    scan_order(bnd, order, suf, T)
    hi1 = 1.0 + slack
    lo1 = 1.0 - slack
    c0 = np.float64(const) if has_w0 else 0.0
    kk = ph.size
    nh = 0
    read = 0
    lb = theta
    n_scan = T
    noallow = np.empty(0, np.int64)
    for i2 in range(T):
        r = order[i2]
        for s in range(S):  # the first line of each piece, asked for ahead of its scan
            t = tloc[r, s]
            if t >= 0:
                lo = rv.i64(ptrs[s, 0], ptrs[s, 1])[t]
                rv.prefetch(ptrs[s, 2] + 4 * lo)
                rv.prefetch(ptrs[s, 4] + 4 * lo)
        for s in range(S):
            t = tloc[r, s]
            if t >= 0:
                ix, pre = _lists(ptrs, s)
                live = rv.u8(ptrs[s, 6], ptrs[s, 7])
                b0 = bases[s]
                lo, hi = ix[0][t], ix[0][t + 1]
                _nt, nh, got = scan_list(ix, (pre, fp, method, has_w0), live, lo, hi, mul[r], q_idf[r], q_w0[r],
                                    noallow, acc[b0:bases[s + 1]], 0, touched, 0, mark, ph, pd, nh, b0)
                read += got
                post -= hi - lo
        if i2 == T - 1:
            continue
        if nh == kk:
            lb = max(lb, (np.float64(ph[0]) * lo1 + c0) * lo1)
        if lb == -np.inf or (suf[i2 + 1] * hi1 + c0) * hi1 >= lb:
            continue  # an untouched row could still enter
        est = select_survivors(acc, True, touched, 0, (lb / hi1 - c0) / hi1 - suf[i2 + 1], sdoc, part,
                               SAMPLE_STRIDE)
        if est * (PROBE_COST * (T - i2 - 1) + PROBE_COST) < post:
            n_scan = i2 + 1
            break
    n = select_survivors(acc, True, touched, 0, (lb / hi1 - c0) / hi1 - suf[n_scan], sdoc, part, 1)  # (resets acc)
    for j in range(nh):
        mark[pd[j]] = 0
    cnt[0] = read
    cnt[1] = -1
    cnt[2] = n
    for i in range(n_scan, T):  # the lists left, merged into the survivors (ascending rows)
        r = order[i]
        m = mul[r]
        rem = suf[i + 1]
        keep = 0
        s = -1
        nxt = np.int64(0)
        p = np.int64(0)
        e = np.int64(0)
        b0 = np.int64(0)
        ix, pre = _lists(ptrs, 0)
        for j in range(n):
            d = sdoc[j]
            while d >= nxt:  # the next segment: its piece of the list
                s += 1
                b0 = bases[s]
                nxt = bases[s + 1]
                t = tloc[r, s]
                p = e = np.int64(0)
                if t >= 0:
                    ix, pre = _lists(ptrs, s)
                    p, e = ix[0][t], ix[0][t + 1]
            v = part[j]
            if p < e:
                dl = d - b0
                p = advance(ix[1], p, e, dl)
                if p < e and ix[1][p] == dl:
                    v = v + weight(pre, ix[2], ix[3], fp, method, has_w0, p, dl, q_idf[r], q_w0[r]) * m
            if ((np.float64(v) + rem) * hi1 + c0) * hi1 >= lb:
                sdoc[keep] = d
                part[keep] = v
                keep += 1
        n = keep
        if i < T - 1:
            lb = raise_lb(sdoc, part, n, lb, lo1, c0, ph, pd)
    # the survivors by descending partial score, scored exactly while they can enter: weights in
    # ascending term order, added to 0.0f
    heap_by_partial(part, sdoc, n)
    cap = gs.size
    size = 0
    while n > 0:
        v = -np.float64(part[0])
        d = sdoc[0]
        if (v * hi1 + c0) * hi1 < (np.float64(gs[0]) if size == cap else lb):
            break  # no survivor left can reach the k-th score ('<': a tie with a lower sequence number could)
        n -= 1
        part[0] = part[n]
        sdoc[0] = sdoc[n]
        sift_down(part, sdoc, n, 0)
        s = _segment_at(bases, d)
        ix, pre = _lists(ptrs, s)
        blast = rv.i32(ptrs[s, 18], ptrs[s, 19])
        bix = (rv.i64(ptrs[s, 16], ptrs[s, 17]), blast, pre, rv.i32(ptrs[s, 38], ptrs[s, 39]),
               rv.i32(ptrs[s, 40], ptrs[s, 41]), rv.i64(ptrs[s, 20], ptrs[s, 21]),
               rv.i64(ptrs[s, 22], ptrs[s, 23]), rv.i64(ptrs[s, 24], ptrs[s, 25]))  # (block bounds not read)
        wt = (pre, fp, method, has_w0)
        dl = d - bases[s]
        sc = np.float32(0.0)
        for r in range(T):
            t = tloc[r, s]
            if t >= 0:
                w = probe_weight(ix, wt, bix, t, block_of(bix, t, dl), mul[r], dl, q_idf[r], q_w0[r])
                if w >= 0:
                    sc += w
        cnt[3] += 1
        if has_w0:
            sc = sc + const
        q = rv.i64(ptrs[s, 14], ptrs[s, 15])[dl]
        if size < cap:
            gs[size] = sc
            gq[size] = q
            gv[size] = vis[s]
            gr[size] = dl
            _g_sift_up(gs, gq, gv, gr, size)
            size += 1
        elif _worse_seq(gs[0], gq[0], sc, q):
            gs[0] = sc
            gq[0] = q
            gv[0] = vis[s]
            gr[0] = dl
            _g_sift_down(gs, gq, gv, gr, size, 0)
    return size


@njit(**JIT)
def search_segments(segs, ptrs, vis, locs, par, fp, method, has_w0, cached, union, k, B, qi, qf, filt, a_off, allow_flat, r0,
                    r1, ws, out_i, out_f, counts):
    """Top-k of the batch rows ``r0:r1`` over every segment of ``segs`` (see the module docstring).

    The arguments are packed into few arrays: each one costs the call a conversion.

    Parameters
    ----------
    segs : typed list of segment tuples ``(vi, g_sorted, g_order, seqs, ix, bix, summ, live, cache, starts)``:
        vi (int64, the view's position in the snapshot), g_sorted (V,) int64 (the segment's global
        term codes, ascending), g_order (V,) int64 (the local id of each), seqs (N,) int64,
        ix and bix as :func:`gpuir.backends.cpu_maxscore.search_pruned` (bix[2], the block maxima,
        empty: the cache's are used when ``cached``), summ = (maxtf, mindl, mintf, maxdl) (V,) int32,
        live (N,) bool or (0,), cache = (pre, blk_max, ub, zero, neg, filled) (:func:`fill_weights`),
        starts (NB,) int64 (each block's first posting)
    ptrs, vis : the same segments' arrays by address and their views' positions, as :func:`union_row`
        takes them (used for the rows it answers: dense, unfiltered, ``cached``)
    locs : (S, len(segs)) int64
        Term slots: row ``q_slot`` holds a query term's local id in each segment (-1: absent),
        :func:`locate_terms`.
    par : (11 + B,) float64
        ``fp`` (6 float32 values: 1 - b, b, k1, k1 + 1, delta, float32(avgdl)), ``bp`` (5: k1, b, delta,
        float32(avgdl), bound slack; :func:`gpuir.backends.cpu_maxscore.bound64`), then each row's
        theta (a known lower bound of the k-th score worth keeping; -inf: none)
    fp : float32 -- ``par``'s first 6 values as float32, or those followed by the tf-part table
        (:func:`~gpuir.backends.cpu_kernels.tfc_table`): the weights' parameters
    method : int; has_w0 : bool -- the BM25 variant
    cached : bool -- read the weights from each segment's cache (filled for every row's terms)
    union : bool -- answer the rows :func:`union_row` can answer (cached, unfiltered, dense, several
        segments, a workspace over all their rows) over all segments at once; the others, segment by segment
    k : int; B : int -- rows in the batch
    qi : (B + 1 + 2T,) int64 -- row offsets (B+1), then each row's distinct terms' slots in ``locs`` (T,
        ascending in the terms' string order, hence in every segment's local ids), then their multiplicities
    qf : (2T + B,) float32 -- the terms' idf, then their w0, then the rows' constants C
    filt : (B,) bool -- the rows with a filter (a ``where``)
    a_off : (B, len(segs) + 1) int64, allow_flat : (A,) int64 -- row i's allowed rows of segment j are
        ``allow_flat[a_off[i, j]:a_off[i, j + 1]]`` (ascending, live; none: the segment is skipped) when
        ``filt[i]``; lists and allow-lists are intersected by leapfrogging, as a static index's filters
    r0, r1 : int -- the rows to answer
    ws : (17 N,) uint8 -- the workspace of :func:`~gpuir.backends.cpu_maxscore.search_pruned` (acc, touched,
        sdoc, part as 4-byte arrays, then mark) for N documents, N >= the largest segment's; zero on entry
        and on return
    out_i : (3, B, k) int64 -- sequence number, view position and row of each hit (pre-filled with -1)
    out_f : (B, k) float32 -- its score (pre-filled with -inf)
    counts : (B, 4) int64 -- postings read, documents touched (-1: dense; -2: dense, all segments at once),
        survivors, rescored (summed over segments)
    """
    bp = par[6:11]
    thetas = par[11:]
    q_off = qi[:B + 1]
    T_all = q_off[B]
    q_slot = qi[B + 1:B + 1 + T_all]
    q_mult = qi[B + 1 + T_all:B + 1 + 2 * T_all]
    q_idf = qf[:T_all]
    q_w0 = qf[T_all:2 * T_all]
    consts = qf[2 * T_all:]
    Nw = ws.size // 17
    acc = ws[:4 * Nw].view(np.float32)
    touched = ws[4 * Nw:8 * Nw].view(np.int32)
    sdoc = ws[8 * Nw:12 * Nw].view(np.int32)
    part = ws[12 * Nw:16 * Nw].view(np.float32)
    mark = ws[16 * Nw:17 * Nw]
    out_seq, out_vi, out_row = out_i[0], out_i[1], out_i[2]
    out_score = out_f
    rows = np.arange(r0, r1)
    qmax = 1
    for j in range(rows.size):
        i = rows[j]
        qmax = max(qmax, q_off[i + 1] - q_off[i])
    tid = np.empty(qmax, np.int64)
    tmul = np.empty(qmax, np.int64)
    mul = np.empty(qmax, np.float32)
    tidf = np.empty(qmax, np.float32)
    tw0 = np.empty(qmax, np.float32)
    tub = np.empty(qmax, np.float64)
    tzero = np.empty(qmax, np.bool_)
    order = np.empty(qmax, np.int64)
    bnd = np.empty(qmax, np.float64)
    suf = np.empty(qmax + 1, np.float64)
    contrib = np.empty(qmax, np.float32)
    loc = np.empty(qmax, np.int64)
    l_off = np.zeros(2, np.int64)
    l_term = np.empty(qmax, np.int64)
    l_mult = np.empty(qmax, np.int64)
    l_idf = np.empty(qmax, np.float32)
    l_w0 = np.empty(qmax, np.float32)
    l_const = np.empty(1, np.float32)
    ph = np.empty(k, np.float32)
    pd = np.empty(k, np.int64)
    hs = np.empty(k, np.float32)
    hd = np.empty(k, np.int64)
    cnt = np.zeros(4, np.int64)
    noallow = allow_flat[0:0]
    nodense = np.empty(0, np.float32)
    nof32 = np.empty(0, np.float32)
    nof64 = np.empty(0, np.float64)
    nobool = np.empty(0, np.bool_)
    scr = (np.empty(qmax, np.int64), np.empty(qmax, np.int64), np.empty(qmax, np.int64),
           np.empty(qmax, np.int64), np.empty(qmax, np.float32), np.empty(qmax, np.float32),
           np.zeros(qmax, np.float32))
    R = rows.size
    gS = np.empty((R, k), np.float32)  # each row's top-k heap over the segments seen so far
    gQ = np.empty((R, k), np.int64)
    gV = np.empty((R, k), np.int64)
    gR = np.empty((R, k), np.int64)
    sizes = np.zeros(R, np.int64)
    S = len(segs)
    done = np.zeros(R, np.bool_)
    union = union and S > 1 and ptrs.shape[0] == S
    bases = np.zeros(S + 1, np.int64)
    if union:
        for s2 in range(S):
            bases[s2 + 1] = bases[s2] + ptrs[s2, 15]  # (rows: the length of seqs)
    if union and Nw >= bases[S]:  # dense unfiltered rows: all segments at once (union_row)
        tloc = np.empty((qmax, S), np.int64)
        for j in range(R):
            i = rows[j]
            a, b = q_off[i], q_off[i + 1]
            nq = b - a
            if nq == 0 or filt[i]:
                continue
            for r in range(nq):
                for s2 in range(S):
                    tloc[r, s2] = locs[q_slot[a + r], s2]
            for c in range(4):
                cnt[c] = 0
            n = union_row(ptrs, vis, bases, tloc, nq, q_mult[a:b], q_idf[a:b], q_w0[a:b], consts[i], fp, bp, method,
                          has_w0, cached, thetas[i], _slack(nq), order, bnd, suf, mul, acc[:bases[S]], touched, sdoc,
                          part, mark, ph, pd, gS[j], gQ[j], gV[j], gR[j], cnt)
            if n >= 0:
                sizes[j] = n
                done[j] = True
                for c in range(4):
                    counts[i, c] = cnt[c]
                counts[i, 1] = -2
    si = -1
    for s in segs:  # segment by segment (its arrays stay in cache across the rows), rows within
        si += 1
        vi, seqs, ix, bix0, summ, live, cache = s[0], s[3], s[4], s[5], s[6], s[7], s[8]
        N = ix[3].size
        cap = min(k, max(N, 1))
        for j in range(R):
            i = rows[j]
            a, b = q_off[i], q_off[i + 1]
            nq = b - a
            if nq == 0 or done[j]:
                continue
            gs, gq, gv, gr = gS[j], gQ[j], gV[j], gR[j]
            size = sizes[j]
            for r in range(nq):
                loc[r] = locs[q_slot[a + r], si]
            T = 0
            neg = False
            for r in range(nq):
                t = loc[r]
                if t >= 0:
                    l_term[T] = t
                    l_mult[T] = q_mult[a + r]
                    l_idf[T] = q_idf[a + r]
                    l_w0[T] = q_w0[a + r]
                    if cached:
                        neg = neg or cache[4][t]
                    T += 1
            if T == 0:
                continue
            al = noallow
            if filt[i]:
                lo, hi = a_off[i, si], a_off[i, si + 1]
                if hi == lo:  # the filter allows nothing here
                    continue
                al = allow_flat[lo:hi]
            theta = thetas[i]
            if size == k and np.float64(gs[0]) > theta:
                theta = np.float64(gs[0])
            if theta > -np.inf and not neg:  # the segment's best possible score below theta: nothing to read
                sl = _slack(nq)
                hi1 = 1.0 + sl
                top = 0.0
                for r in range(T):
                    t = l_term[r]
                    if cached:
                        u = cache[2][t]
                    else:
                        u = bound64(summ[0][t], summ[1][t], bp, method, has_w0, l_idf[r], l_w0[r])
                    top += max(u, 0.0) * l_mult[r]
                c0 = np.float64(consts[i]) if has_w0 else 0.0
                if (top * hi1 + c0) * hi1 < theta:
                    continue
            l_off[1] = T
            l_const[0] = consts[i]
            qs = (l_off, l_term[:T], l_mult[:T], l_idf[:T], l_w0[:T], l_const)
            if cached:
                wt = (cache[0], fp, method, has_w0)
                bix = (bix0[0], bix0[1], cache[1], bix0[3], bix0[4], bix0[5], bix0[6], bix0[7])
                tb = (cache[2], cache[3], summ[0], summ[1], summ[2], summ[3], neg)
            else:
                wt = (nof32, fp, method, has_w0)
                bix = (bix0[0], bix0[1], nof32, bix0[3], bix0[4], bix0[5], bix0[6], bix0[7])
                tb = (nof64, nobool, summ[0], summ[1], summ[2], summ[3], False)
            for c in range(4):
                cnt[c] = 0
            n = -1
            if not neg:
                n = query_row(ix, wt, live, bix, bp, qs, tb, 0, theta, al, _slack(nq), tid, tmul, mul, tidf, tw0,
                           tub, tzero, order, bnd, suf, contrib, acc[:N], touched[:N], sdoc[:N], part[:N],
                           mark[:N], ph[:cap], pd[:cap], hs[:cap], hd[:cap], cnt)
            if n < 0:  # no pruning for this row here (a weight may be < 0)
                n, read = exhaustive_row(ix, wt, live, qs, 0, al, scr, hs[:cap], hd[:cap], nodense)
                cnt[0] = read
                cnt[3] = -1
            for c in range(4):
                if cnt[c] > 0:
                    counts[i, c] += cnt[c]
            for m in range(n):  # into the row's heap, by (score, sequence number)
                sc = hs[m]
                q = seqs[hd[m]]
                if size < k:
                    gs[size] = sc
                    gq[size] = q
                    gv[size] = vi
                    gr[size] = hd[m]
                    _g_sift_up(gs, gq, gv, gr, size)
                    size += 1
                elif _worse_seq(gs[0], gq[0], sc, q):
                    gs[0] = sc
                    gq[0] = q
                    gv[0] = vi
                    gr[0] = hd[m]
                    _g_sift_down(gs, gq, gv, gr, size, 0)
            sizes[j] = size
    for j in range(R):
        i = rows[j]
        gs, gq, gv, gr = gS[j], gQ[j], gV[j], gR[j]
        for m in range(sizes[j] - 1, -1, -1):  # best first
            out_score[i, m] = gs[0]
            out_seq[i, m] = gq[0]
            out_vi[i, m] = gv[0]
            out_row[i, m] = gr[0]
            gs[0] = gs[m]
            gq[0] = gq[m]
            gv[0] = gv[m]
            gr[0] = gr[m]
            _g_sift_down(gs, gq, gv, gr, m, 0)


#: The arrays :func:`search_small` reads of each small segment, an address and a length each.
SMALL_COLUMNS = (("g_sorted", np.int64), ("g_order", np.int64), ("seqs", np.int64), ("offsets", np.int64),
                 ("doc_ids", np.int32), ("tfs", np.int32), ("doc_lens", np.int32), ("live", np.bool_))


@njit(**JIT)
def search_small(small, pos0, par, method, has_w0, k, B, off, gids, mult, idf, w0, consts, filt, a_off, allow_flat,
                 out_i, out_f, counts):
    """Merge every small segment's candidates of rows ``0:B``, each scored exhaustively (document at a time,
    no block index, :func:`~gpuir.backends.cpu_kernels.exhaustive_row`: the same float32 operations), into
    the rows' top k ``out_i`` / ``out_f`` (best first, -1 / -inf padded, as :func:`search_segments` leaves
    them), by (score descending, sequence number ascending).

    Parameters
    ----------
    small : (S, 2 * len(SMALL_COLUMNS)) int64 -- each small segment's :data:`SMALL_COLUMNS` by address and
        length (:mod:`gpuir.backends.raw_views`: no typed list to make per snapshot; the caller keeps the
        arrays alive): its global codes ascending, the local id of each, its sequence numbers, offsets,
        doc_ids, tfs, doc lengths, and its tombstones (empty: every row live)
    pos0 : int -- the hits of small segment j get view slot ``pos0 + j`` in ``out_i[1]``
    par : as :func:`search_segments` (fp first)
    off (B + 1,) int64, gids, mult (T,) int64, idf, w0 (T,) float32, consts (B,) float32 -- each row's terms
        as global codes (ascending term strings), with their multiplicities and weights, and its C
    filt (B,) bool, a_off (B, len(small) + 1) int64, allow_flat (A,) int64 -- allow-lists as :func:`search_segments`
    counts : (B, 4) int64 -- postings read are added to column 0
    """
    fp = par[:6].astype(np.float32)
    qmax = 1
    for i in range(B):
        qmax = max(qmax, off[i + 1] - off[i])
    loc = np.empty(qmax, np.int64)
    l_off = np.zeros(2, np.int64)
    l_term = np.empty(qmax, np.int64)
    l_mult = np.empty(qmax, np.int64)
    l_idf = np.empty(qmax, np.float32)
    l_w0 = np.empty(qmax, np.float32)
    l_const = np.empty(1, np.float32)
    scr = (np.empty(qmax, np.int64), np.empty(qmax, np.int64), np.empty(qmax, np.int64),
           np.empty(qmax, np.int64), np.empty(qmax, np.float32), np.empty(qmax, np.float32),
           np.zeros(qmax, np.float32))
    hs = np.empty(k, np.float32)
    hd = np.empty(k, np.int64)
    gs = np.empty(k, np.float32)
    gq = np.empty(k, np.int64)
    gv = np.empty(k, np.int64)
    gr = np.empty(k, np.int64)
    nof32 = np.empty(0, np.float32)
    noallow = allow_flat[0:0]
    nodense = np.empty(0, np.float32)
    wt = (nof32, fp, method, has_w0)
    for i in range(B):
        a, b = off[i], off[i + 1]
        nq = b - a
        if nq == 0:
            continue
        size = 0
        for m in range(k):  # the row's hits so far, into a heap
            if out_i[0, i, m] < 0:
                break
            gs[size] = out_f[i, m]
            gq[size] = out_i[0, i, m]
            gv[size] = out_i[1, i, m]
            gr[size] = out_i[2, i, m]
            _g_sift_up(gs, gq, gv, gr, size)
            size += 1
        for si in range(small.shape[0]):
            p = small[si]
            g_sorted, g_order, seqs = rv.i64(p[0], p[1]), rv.i64(p[2], p[3]), rv.i64(p[4], p[5])
            ix = (rv.i64(p[6], p[7]), rv.i32(p[8], p[9]), rv.i32(p[10], p[11]), rv.i32(p[12], p[13]))
            live = rv.u8(p[14], p[15])
            _local_terms(g_sorted, g_order, gids[a:b], loc[:nq])
            T = 0
            for r in range(nq):
                t = loc[r]
                if t >= 0:
                    l_term[T] = t
                    l_mult[T] = mult[a + r]
                    l_idf[T] = idf[a + r]
                    l_w0[T] = w0[a + r]
                    T += 1
            if T == 0:
                continue
            al = noallow
            if filt[i]:
                lo, hi = a_off[i, si], a_off[i, si + 1]
                if hi == lo:
                    continue
                al = allow_flat[lo:hi]
            l_off[1] = T
            l_const[0] = consts[i]
            qs = (l_off, l_term[:T], l_mult[:T], l_idf[:T], l_w0[:T], l_const)
            cap = min(k, max(ix[3].size, 1))
            n, read = exhaustive_row(ix, wt, live, qs, 0, al, scr, hs[:cap], hd[:cap], nodense)
            counts[i, 0] += read
            for m in range(n):
                sc = hs[m]
                q = seqs[hd[m]]
                if size < k:
                    gs[size] = sc
                    gq[size] = q
                    gv[size] = pos0 + si
                    gr[size] = hd[m]
                    _g_sift_up(gs, gq, gv, gr, size)
                    size += 1
                elif _worse_seq(gs[0], gq[0], sc, q):
                    gs[0] = sc
                    gq[0] = q
                    gv[0] = pos0 + si
                    gr[0] = hd[m]
                    _g_sift_down(gs, gq, gv, gr, size, 0)
        for m in range(size - 1, -1, -1):  # best first
            out_f[i, m] = gs[0]
            out_i[0, i, m] = gq[0]
            out_i[1, i, m] = gv[0]
            out_i[2, i, m] = gr[0]
            gs[0] = gs[m]
            gq[0] = gq[m]
            gv[0] = gv[m]
            gr[0] = gr[m]
            _g_sift_down(gs, gq, gv, gr, m, 0)


@njit(**JIT)
def _slack(T):
    """The pruning slack of a row of T distinct terms (:meth:`NumbaScorer._slack`)."""
    return 1e-5 + (T + 2) * 2.0**-23


__all__ = ["fill_segments", "fill_weights", "locate_terms", "pointer_rows", "pop_sorted", "search_segments", "search_small", "sift_down", "sift_up"]
