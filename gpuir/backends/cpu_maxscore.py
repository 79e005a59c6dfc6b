"""Compiled (Numba) pruned search of the ``numba`` backend: MaxScore term at a time, exact.

One query (:func:`_query`), in two phases.

**Phase 1: term at a time, most valuable lists first.** Distinct query terms
are taken in decreasing order of their bound ``ub(t) * c`` (at least the largest
weight they can add: the exact maximum under a static index's cached weights,
else :func:`bound64` -- :func:`~gpuir.backends.weights.weight_bound`'s formula
and slack in float64 -- of the term's largest tf and shortest document under
the search's statistics); their posting lists are added into a per-thread float32
accumulator. A min-heap of k *distinct* documents' partial scores bounds the
k-th best score from below (partial scores only grow: weights are
non-negative; the scorer does not prune otherwise): ``lb``. After each list,
if the bounds of the lists left cannot lift a document that none of the
scanned lists holds to ``lb``, no such document can enter the top k
(**MaxScore**, Turtle & Flood 1995); the scan stops there when the touched
documents that still can (the *survivors*, counted on a sample) cost less to
finish than the lists left cost to scan.

**Phase 2: finish the survivors, exactly.** Each survivor's missing weights
come from the unscanned lists; the best are then scored exactly -- their
weights looked up again and added in ascending term id from 0.0f, as the
reference does -- into the top-k heap, best bound first, until no bound
reaches the k-th exact score. Ties go by document number, as in the reference.

Two regimes, chosen per query:

* **dense** (the lists hold at least N/2 postings, e.g. natural-language
  questions with common words): nothing tracks the touched documents;
  survivors come from one pass over the accumulator (64 documents at a time,
  a vectorised count skipping blocks without any), which also resets it, in
  document order, so the unscanned lists are merged in with galloping cursors
  (about survivors x log(gap) steps a list), the k-th best partial score
  raising ``lb`` after each;
* **sparse** (short lists: identifiers, rare words): touched documents are
  listed on their first addition (branch-free); survivors, best partial score
  first, probe the unscanned lists' block maxima, then their postings, and are
  dropped as soon as their bound falls short.

Probes use a **block index** (:meth:`NumbaScorer._block_index`): postings cut
into blocks of :data:`BLOCK`, with each block's last document, its largest tf
and its smallest document length (summaries no statistic changes, laid out
once), and a directory over the document space that finds a document's block
in a step or two. A block's bound is :func:`block_bound`: its largest cached
weight under a static index's own statistics, else the bound of
:func:`~gpuir.backends.weights.weight_bound` computed in float64 with the
search's idf and avgdl (the same formula and slack; it is >= every float32
weight of the block, tested).

Bounds are computed in float64 with a relative slack ``s`` above the rounding
error of any float32 sum of the query's weights, plus the bm25l/bm25+ constant
``c0``: a document whose weights sum to ``x`` (float64) scores at most
``((x (1 + s)) + c0)(1 + s)`` and, for the lower bound, at least
``((x (1 - s)) + c0)(1 - s)``. So pruning never drops a document the
exhaustive search keeps: pruned and exhaustive results are identical (tested).

Filters: a list and the allow-list are intersected by leapfrogging (galloping
on whichever is behind), so a private haystack of a few hundred records costs
about |allow| x terms x log(gap) steps, whatever the lists' lengths: it is
scored from the allowed records, not from the posting lists.

Tombstones (``live[d] == False``) are skipped as postings are read: a deleted
document is never touched, so never a candidate. A row whose weights may be
negative (bm25l only, when a term's :func:`floor64` is not > 0; or a static
cache holding a negative weight) is scored exhaustively
(:func:`gpuir.backends.cpu_kernels.exhaustive_row`): the bounds assume weights >= 0.

Per query, nothing is allocated: each thread has a workspace of N-sized
arrays (17 bytes per document), allocated once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .cpu_kernels import (
    JIT,
    advance,
    exhaustive_row,
    pop_sorted,
    query_allow,
    scratch,
    sift_down,
    sift_up,
    weight,
    worse,
)

#: Postings per block of the block index (block maxima, two-level probes).
BLOCK = 64
#: What finishing one survivor costs, per unscanned list, in postings scanned
#: (chosen by measurement on LongMemEval-S: 16 to 128 within 10%).
PROBE_COST = 32
#: When deciding to stop, survivors are counted on every SAMPLE_STRIDE-th candidate (dense: block of 64).
SAMPLE_STRIDE = 16


@njit(**JIT)
def block_of(bix, t, d):
    """Block of term t's postings that would hold document d (the first whose last document
    is >= d), or -1 when d lies past the term's last document.

    ``bix`` is the block index (see :func:`search_pruned`): a doc-space
    directory gives a block at most a step or two before the answer.
    """
    blk_off, blk_last, dir_off, dir_shift, blk_dir = bix[0], bix[1], bix[5], bix[6], bix[7]
    b = blk_dir[dir_off[t] + (d >> dir_shift[t])]
    e = blk_off[t + 1]
    while b < e and blk_last[b] < d:
        b += 1
    return b if b < e else -1


@njit(**JIT)
def _tfc64(tf, dl, bp, method):
    """BM25's tfc(tf, dl) in float64 (``bp`` = k1, b, delta, float32(avgdl), slack)."""
    k1, bb, delta, avgdl = bp[0], bp[1], bp[2], bp[3]
    norm = (1.0 - bb) + bb * (dl / avgdl)
    if method <= 1:
        return tf / (k1 * norm + tf)
    if method == 2:
        return tf * (k1 + 1.0) / (tf + k1 * norm)
    if method == 3:
        c = tf / max(norm, 1e-300)
        return (k1 + 1.0) * (c + delta) / (k1 + c + delta)
    return (k1 + 1.0) * tf / (k1 * norm + tf) + delta


@njit(**JIT)
def bound64(maxtf, mindl, bp, method, has_w0, idf, w0):
    """:func:`gpuir.backends.weights.weight_bound` in float64 (before its float32 round-up): >= every
    float32 weight of postings with tf <= maxtf and length >= mindl, and >= 0; 0 when maxtf is 0."""
    if maxtf <= 0:
        return 0.0
    sl = bp[4]
    i64 = np.float64(idf)
    w = i64 * _tfc64(np.float64(maxtf), np.float64(mindl), bp, method)
    if has_w0:
        w -= np.float64(w0)
    w = w * (1.0 + sl) + sl * abs(i64) * (bp[0] + 1.0 + bp[2])
    return max(w, 0.0)


@njit(**JIT)
def floor64(mintf, maxdl, bp, method, has_w0, idf, w0):
    """:func:`gpuir.backends.weights.weight_floor` (float64): <= every float32 weight of postings with
    tf >= mintf and length <= maxdl; > 0 proves them all > 0."""
    sl = bp[4]
    i64 = np.float64(idf)
    w = i64 * _tfc64(np.float64(max(mintf, 0)), np.float64(maxdl), bp, method)
    if has_w0:
        w -= np.float64(w0)
    return w * (1.0 - sl) - sl * abs(i64) * (bp[0] + 1.0 + bp[2])


@njit(**JIT)
def block_bound(bix, bp, method, has_w0, b, idf, w0):
    """An upper bound (float64, >= 0) of every float32 weight in block b of a term with weights (idf, w0).

    The block's largest cached weight when the index's own statistics apply
    (``bix[2]`` not empty); otherwise :func:`bound64` of the block's largest tf
    and smallest length. ``bp`` (5,) float64 = ``k1, b, delta, float32(avgdl), slack``.
    """
    bmax = bix[2]
    if bmax.size != 0:
        return np.float64(bmax[b])
    return bound64(bix[3][b], bix[4][b], bp, method, has_w0, idf, w0)


@njit(**JIT)
def probe_weight(ix, wt, bix, t, b, m, d, idf, w0):
    """Weight of term t (times m) in document d, searched in block b; -1 when d lacks t."""
    if b < 0:
        return np.float32(-1.0)
    offsets, doc_ids, tfs, dls = ix
    lo = offsets[t] + (b - bix[0][t]) * BLOCK
    hi = min(lo + BLOCK, offsets[t + 1])
    while lo < hi:
        mid = (lo + hi) >> 1
        if doc_ids[mid] < d:
            lo = mid + 1
        else:
            hi = mid
    if doc_ids[lo] == d:  # lo < end: the block's last document is >= d
        w = weight(wt[0], tfs, dls, wt[1], wt[2], wt[3], lo, d, idf, w0)
        if m != 1:
            w = w * m
        return w
    return np.float32(-1.0)


@njit(**JIT)
def _exact(ix, wt, bix, tid, mul, tidf, tw0, T, d, contrib):
    """Score of document d: its weights in ascending term id, added to 0.0f one by one.

    ``contrib[r]`` holds term rank r's weight when already probed (0 if absent), or
    -1 when still to probe; every entry is left at -1.
    """
    s = np.float32(0.0)
    for r in range(T):
        w = contrib[r]
        if w < 0:
            t = tid[r]
            w = probe_weight(ix, wt, bix, t, block_of(bix, t, d), mul[r], d, tidf[r], tw0[r])
        if w >= 0:
            s += w
        contrib[r] = -1.0
    return s


@njit(**JIT)
def _offer(mark, ph, pd, nh, d, v):
    """Offer document d with partial score v to the heap of the k best partial scores.

    ``ph, pd`` is a min-heap of k *distinct* documents (``mark[d] & 2`` marks
    members) holding lower bounds of their scores, so its top bounds the k-th
    best score from below. A member whose score grew is updated in place when k
    is small, else keeps its older (lower) value. Returns the new heap size.
    """
    kk = ph.size
    if mark[d] & 2:
        if kk <= 64:
            for j in range(nh):
                if pd[j] == d:
                    ph[j] = v
                    sift_down(ph, pd, nh, j)
                    break
        return nh
    if nh < kk:
        ph[nh] = v
        pd[nh] = d
        sift_up(ph, pd, nh)
        mark[d] |= 2
        return nh + 1
    mark[pd[0]] &= 1
    ph[0] = v
    pd[0] = d
    mark[d] |= 2
    sift_down(ph, pd, nh, 0)
    return nh


@njit(**JIT)
def scan_list(ix, wt, live, s, e, m, idf, w0, allow, acc, mode, touched, nt, mark, ph, pd, nh, base):
    """Add the postings s:e (weights times m) of one list into ``acc``.

    With an allow-list only allowed documents count: the list and the
    allow-list are intersected by leapfrogging (galloping on whichever is
    behind), so the shorter one sets the cost; without one, only live
    documents count (``live`` empty: all). ``acc`` and ``live`` are indexed by the list's
    document ids; ``touched``, ``mark`` and the heap by ``base`` plus them (0 for one index; a
    segment's first row in a snapshot-wide workspace otherwise). ``mode`` says how touched
    documents are tracked: 0 not at all (dense mode: acc > 0 tells), 1 appended
    to ``touched`` on their first addition, branch-free (acc[d] was 0), 2 the
    same but checked with ``mark[d] & 1`` (zero weights make acc[d] == 0
    ambiguous). Every document whose partial score beats the heap's top is
    offered to it (:func:`_offer`).

    Returns (nt, nh, postings read).
    """
    doc_ids, tfs, dls = ix[1], ix[2], ix[3]
    pre, fp, method, has_w0 = wt
    kk = ph.size
    hmin = ph[0] if nh == kk else np.float32(-np.inf)
    na = allow.size
    nl = live.size
    if na == 0 and mode == 0 and nl == 0:  # the common case, tight
        if pre.size != 0:
            for p in range(s, e):
                d = doc_ids[p]
                v = acc[d] + pre[p] * m  # x * 1.0f == x: as the reference, which skips the product
                acc[d] = v
                if v > hmin:
                    nh = _offer(mark, ph, pd, nh, base + d, v)
                    if nh == kk:
                        hmin = ph[0]
        else:
            for p in range(s, e):
                d = doc_ids[p]
                v = acc[d] + weight(pre, tfs, dls, fp, method, has_w0, p, d, idf, w0) * m
                acc[d] = v
                if v > hmin:
                    nh = _offer(mark, ph, pd, nh, base + d, v)
                    if nh == kk:
                        hmin = ph[0]
        return nt, nh, e - s
    ap = 0
    p = s
    read = 0
    while p < e:
        d = doc_ids[p]
        if na > 0:
            a = allow[ap]
            if a != d:
                if a < d:
                    ap = advance(allow, ap, na, d)
                    if ap == na:
                        break
                else:
                    p = advance(doc_ids, p, e, a)
                continue
            ap += 1
        elif nl > 0 and not live[d]:
            p += 1
            continue
        c = acc[d]
        v = c + weight(pre, tfs, dls, fp, method, has_w0, p, d, idf, w0) * m
        acc[d] = v
        if mode == 1:
            touched[nt] = base + d
            nt += c == 0
        elif mode == 2 and c == 0 and (mark[base + d] & 1) == 0:
            mark[base + d] |= 1
            touched[nt] = base + d
            nt += 1
        if v > hmin:
            nh = _offer(mark, ph, pd, nh, base + d, v)
            if nh == kk:
                hmin = ph[0]
        read += 1
        p += 1
        if na > 0 and ap == na:
            break
    return nt, nh, read


@njit(**JIT)
def select_survivors(acc, dense, touched, nt, thr, sdoc, part, stride):
    """Documents whose partial score is >= thr into (sdoc, part); returns how many.

    Dense: every document (touched ones have acc > 0), in ascending order, and
    ``acc`` is reset on the way. Otherwise the touched ones, in touch order.
    With ``stride`` > 1 only every stride-th (dense: block of 64 documents) is
    looked at and nothing is written: the count times stride estimates the full
    count.
    """
    n = 0
    if dense:
        thr = max(thr, 1e-300)  # acc > 0 marks the touched documents
        lim = np.float32(thr)  # the smallest float32 >= thr
        if np.float64(lim) < thr:
            lim = np.nextafter(lim, np.float32(np.inf))
        N = acc.size
        nb = N // 64
        if stride > 1:  # every stride-th block of 64: a few cache lines, not all
            for b in range(0, nb, stride):
                blk = acc[b * 64:b * 64 + 64]
                for j in range(64):
                    n += blk[j] >= lim
            return n * stride
        for b in range(nb + 1):  # 64 at a time: a vectorised count skips most blocks
            base = b * 64
            blk = acc[base:min(base + 64, N)]
            c = 0
            for j in range(blk.size):
                c += blk[j] >= lim
            if c:
                for j in range(blk.size):
                    v = blk[j]
                    sdoc[n] = base + j
                    part[n] = v
                    n += v >= lim
            for j in range(blk.size):  # reset on the way
                blk[j] = np.float32(0.0)
        return n
    if stride > 1:
        for j in range(0, nt, stride):
            n += np.float64(acc[touched[j]]) >= thr
        return n * stride
    for j in range(nt):
        d = touched[j]
        v = acc[d]
        sdoc[n] = d
        part[n] = v
        n += np.float64(v) >= thr
    return n


@njit(**JIT)
def _merge_rest(ix, wt, tid, mul, tidf, tw0, order, suf, n_scan, T, sdoc, part, n, lb, hi1, lo1, c0, ph, pd):
    """Add the unscanned lists' weights to the survivors (ascending documents), dropping those
    whose bound falls below lb; returns how many remain.

    Galloping cursors: a list costs about survivors x log(gap) steps. After each
    list the k-th best partial score among the survivors (a lower bound of the
    k-th best score: partial scores only grow) raises lb. ``ph, pd`` are scratch (k,).
    """
    offsets, doc_ids, tfs, dls = ix
    pre, fp, method, has_w0 = wt
    for i in range(n_scan, T):
        r = order[i]
        t = tid[r]
        e = offsets[t + 1]
        m = mul[r]
        p = offsets[t]
        rem = suf[i + 1]
        keep = 0
        for j in range(n):
            d = sdoc[j]
            p = advance(doc_ids, p, e, d)
            v = part[j]
            if p < e and doc_ids[p] == d:
                v = v + weight(pre, tfs, dls, fp, method, has_w0, p, d, tidf[r], tw0[r]) * m
            if ((np.float64(v) + rem) * hi1 + c0) * hi1 >= lb:
                sdoc[keep] = d
                part[keep] = v
                keep += 1
        n = keep
        if i < T - 1:
            lb = raise_lb(sdoc, part, n, lb, lo1, c0, ph, pd)
    return n


@njit(**JIT)
def heap_by_partial(part, sdoc, n):
    """The n survivors (sdoc, part) as a heap whose top is the best partial score: ``part`` then holds
    -partial (a min-heap's top is its least value)."""
    for j in range(n):
        part[j] = -part[j]
    for j in range(n // 2 - 1, -1, -1):
        sift_down(part, sdoc, n, j)


@njit(**JIT)
def raise_lb(sdoc, part, n, lb, lo1, c0, ph, pd):
    """``lb`` raised to the lower bound of the k-th best of the n partial scores ``part`` (k = ph.size;
    partial scores only grow), when there are at least k; ``ph, pd`` are scratch (k,)."""
    kk = ph.size
    if n < kk:
        return lb
    for j in range(kk):  # a min-heap of the k largest
        ph[j] = part[j]
        pd[j] = sdoc[j]
    for j in range(kk // 2 - 1, -1, -1):
        sift_down(ph, pd, kk, j)
    for j in range(kk, n):
        if part[j] > ph[0]:
            ph[0] = part[j]
            pd[0] = sdoc[j]
            sift_down(ph, pd, kk, 0)
    return max(lb, (np.float64(ph[0]) * lo1 + c0) * lo1)


@njit(**JIT)
def scan_order(bnd, order, suf, T):
    """The scan order of T terms with bounds ``bnd`` (T,) float64 into ``order`` (T,) int64: descending
    bound, then term rank (a Shell sort: T is small); ``suf[i]`` (T + 1,) float64 = the bounds of
    order[i:] summed."""
    for r in range(T):
        order[r] = r
    gap = 1
    while gap * 3 + 1 < T:
        gap = gap * 3 + 1
    while gap > 0:
        for i2 in range(gap, T):
            r = order[i2]
            j = i2
            while j >= gap and (bnd[order[j - gap]] < bnd[r] or (bnd[order[j - gap]] == bnd[r] and order[j - gap] > r)):
                order[j] = order[j - gap]
                j -= gap
            order[j] = r
        gap //= 3
    suf[T] = 0.0
    for i2 in range(T - 1, -1, -1):
        suf[i2] = suf[i2 + 1] + bnd[order[i2]]


@njit(**JIT)
def _query(ix, wt, live, bix, bp, qs, tb, i, theta, allow, slack, tid, tmul, mul, tidf, tw0, tub, tzero,
           order, bnd, suf, contrib, acc, touched, sdoc, part, mark, ph, pd, hs, hd, counts):
    """Top k of batch row i into the heap (hs, hd) (see the module docstring); returns how many,
    or -1 when the row must be scored without pruning (a bm25l weight may round below 0).

    ``theta`` (float64, -inf: none) is a known lower bound of the k-th best score
    the caller will keep: documents scoring below it are not wanted (the result
    may then hold fewer than k). ``counts`` (4,) int64 receives: postings read,
    documents touched (-1 when dense), survivors, survivors scored exactly.
    """
    offsets = ix[0]
    method, has_w0 = wt[2], wt[3]
    ub_v, zero_v, maxtf, mindl, mintf, maxdl = tb[0], tb[1], tb[2], tb[3], tb[4], tb[5]
    q_off = qs[0]
    T = 0
    for j in range(q_off[i], q_off[i + 1]):  # the row's terms with postings here (ascending)
        t = qs[1][j]
        if offsets[t + 1] > offsets[t]:
            tid[T] = t
            tmul[T] = qs[2][j]
            idf = qs[3][j]
            w0 = qs[4][j]
            tidf[T] = idf
            tw0[T] = w0
            if ub_v.size != 0:  # the static cache: exact maxima
                tub[T] = ub_v[t]
                tzero[T] = zero_v[t]
            else:  # from the term's summaries under this search's statistics
                tub[T] = bound64(maxtf[t], mindl[t], bp, method, has_w0, idf, w0)
                z = floor64(mintf[t], maxdl[t], bp, method, has_w0, idf, w0) <= 0.0
                if z and method == 3:
                    return -1
                tzero[T] = z
            T += 1
    if T == 0:
        return 0
    const = qs[5][i]
    has_const = has_w0
    post_rest = 0
    any_zero = False
    for r in range(T):
        t = tid[r]
        bnd[r] = tub[r] * tmul[r]
        mul[r] = np.float32(tmul[r])
        contrib[r] = -1.0
        post_rest += offsets[t + 1] - offsets[t]
        any_zero = any_zero or tzero[r]
    scan_order(bnd, order, suf, T)
    N = acc.size
    dense = not any_zero and 2 * post_rest >= N
    hi1 = 1.0 + slack
    lo1 = 1.0 - slack
    c0 = np.float64(const) if has_const else 0.0
    kk = ph.size
    nh = 0
    nt = 0
    read = 0
    lb = theta  # <= the k-th best final score worth keeping
    n_scan = T
    mode = 0
    for i2 in range(T):
        r = order[i2]
        t = tid[r]
        if not dense:
            mode = 2 if mode == 2 or tzero[r] else 1
        nt, nh, got = scan_list(ix, wt, live, offsets[t], offsets[t + 1], mul[r], tidf[r], tw0[r], allow, acc, mode,
                            touched, nt, mark, ph, pd, nh, 0)
        read += got
        post_rest -= offsets[t + 1] - offsets[t]
        if i2 == T - 1:
            continue
        if nh == kk:
            lb = max(lb, (np.float64(ph[0]) * lo1 + c0) * lo1)
        if lb == -np.inf or (suf[i2 + 1] * hi1 + c0) * hi1 >= lb:
            continue  # an untouched document could still enter
        # survivors need ((partial + rest) hi1 + c0) hi1 >= lb: few enough to finish them instead?
        est = select_survivors(acc, dense, touched, nt, (lb / hi1 - c0) / hi1 - suf[i2 + 1], sdoc, part, SAMPLE_STRIDE)
        if est * (PROBE_COST * (T - i2 - 1) + PROBE_COST) < post_rest:
            n_scan = i2 + 1
            break
    rest = suf[n_scan]
    counts[0] = read
    counts[1] = -1 if dense else nt
    n = select_survivors(acc, dense, touched, nt, (lb / hi1 - c0) / hi1 - rest, sdoc, part, 1)
    if not dense:  # reset the workspace
        for j in range(nt):
            acc[touched[j]] = np.float32(0.0)
        if mode == 2:
            for j in range(nt):
                mark[touched[j]] = 0
    for j in range(nh):
        mark[pd[j]] = 0
    counts[2] = n
    if dense and n_scan < T:
        n = _merge_rest(ix, wt, tid, mul, tidf, tw0, order, suf, n_scan, T, sdoc, part, n, lb, hi1, lo1, c0, ph, pd)
        n_scan = T
        rest = 0.0
    # phase 2: survivors by descending partial score, exactly scored while they can enter
    heap_by_partial(part, sdoc, n)
    cap = hs.size
    size = 0
    while n > 0:
        v = -np.float64(part[0])
        d = sdoc[0]
        if ((v + rest) * hi1 + c0) * hi1 < (hs[0] if size == cap else lb):
            break  # no survivor left can reach the k-th score ('<': a tie with a lower id could)
        n -= 1
        part[0] = part[n]
        sdoc[0] = sdoc[n]
        sift_down(part, sdoc, n, 0)
        if n_scan < T:
            floor = hs[0] if size == cap else lb
            if floor > -np.inf:  # block bounds of the unscanned lists: a cheap reason to drop d
                bm = v
                for i2 in range(n_scan, T):
                    r = order[i2]
                    b = block_of(bix, tid[r], d)
                    if b >= 0:
                        bm += block_bound(bix, bp, method, has_w0, b, tidf[r], tw0[r]) * tmul[r]
                if (bm * hi1 + c0) * hi1 < floor:
                    continue
            ok = True
            for i2 in range(n_scan, T):  # their postings: exact weights, a tighter bound
                r = order[i2]
                t = tid[r]
                w = probe_weight(ix, wt, bix, t, block_of(bix, t, d), mul[r], d, tidf[r], tw0[r])
                contrib[r] = max(w, np.float32(0.0))
                v += max(w, np.float32(0.0))
                if ((v + suf[i2 + 1]) * hi1 + c0) * hi1 < (hs[0] if size == cap else lb):
                    ok = False
                    break
            if not ok:
                for r in range(T):
                    contrib[r] = -1.0
                continue
        sc = _exact(ix, wt, bix, tid, mul, tidf, tw0, T, d, contrib)
        counts[3] += 1
        if has_const:
            sc = sc + const
        if size < cap:
            hs[size] = sc
            hd[size] = d
            sift_up(hs, hd, size)
            size += 1
        elif worse(hs[0], hd[0], sc, d):
            hs[0] = sc
            hd[0] = d
            sift_down(hs, hd, size, 0)
    return size


#: :func:`_query` for other compiled callers (``gpuir.backends.cpu_segments``): one row's pruned search.
query_row = _query


@njit(**JIT)
def search_pruned(ix, wt, live, bix, bp, qs, tb, thetas, allow_flat, a_lo, a_hi, k, slack, rows, acc, touched, sdoc,
                  part, mark, out_ids, out_scores, counts):
    """Pruned top-k of the batch rows ``rows`` (see the module docstring).

    Parameters
    ----------
    ix, wt, qs : tuples (see :mod:`gpuir.backends.cpu_kernels`)
    live, allow_flat, a_lo, a_hi, k, rows, out_ids, out_scores
        As :func:`gpuir.backends.cpu_kernels.search_exhaustive`.
    bix : tuple -- the block index: blk_off (V+1,) int64 (term t's blocks are blk_off[t]:blk_off[t+1]),
        blk_last (NB,) int32 (a block's last document), blk_max (NB,) float32 (its largest cached
        weight) or (0,) (no cache: bounds from the summaries), blk_maxtf (NB,) int32, blk_mindl (NB,)
        int32 (largest tf, smallest document length), dir_off (V+1,) int64, dir_shift (V,) int64,
        blk_dir (ND,) int64 (term t's first block whose last document is >= d is at most a step or
        two after blk_dir[dir_off[t] + (d >> dir_shift[t])])
    bp : (5,) float64 -- k1, b, delta, float32(avgdl), bound slack (:func:`bound64`)
    tb : tuple -- the term bounds: ub (V,) float64 and zero (V,) bool of the static cache (exact
        maxima; a weight <= 0), or both (0,) (then from the summaries maxtf, mindl, mintf, maxdl
        (V,) int32, :func:`bound64` / :func:`floor64`); then ``negative`` (bool: a cached weight < 0,
        every row is scored without pruning)
    thetas : (B,) float64 -- each row's known lower bound of the scores worth keeping (-inf: none)
    slack : float -- relative slack of the bounds
    acc (N,) float32, touched (N,) int32, sdoc (N,) int32, part (N,) float32, mark (N,) uint8
        One thread's workspace; acc and mark are zero on entry and on return, the rest is scratch.
    counts : (B, 4) int64 -- receives each row's work (see :func:`_query`)
    """
    cap = min(k, max(acc.size, 1))
    q_off = qs[0]
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
    ph = np.empty(cap, np.float32)
    pd = np.empty(cap, np.int64)
    hs = np.empty(cap, np.float32)
    hd = np.empty(cap, np.int64)
    noallow = np.empty(0, np.int64)
    nodense = np.empty(0, np.float32)
    scr = scratch(q_off, rows)
    negative = tb[6]
    for j in range(rows.size):
        i = rows[j]
        allow, nothing = query_allow(allow_flat, a_lo, a_hi, i, noallow)
        if nothing:
            continue
        size = -1
        if not negative:
            size = _query(ix, wt, live, bix, bp, qs, tb, i, thetas[i], allow, slack, tid, tmul, mul, tidf, tw0, tub,
                          tzero, order, bnd, suf, contrib, acc, touched, sdoc, part, mark, ph, pd, hs, hd, counts[i])
        if size < 0:  # no pruning for this row
            size, read = exhaustive_row(ix, wt, live, qs, i, allow, scr, hs, hd, nodense)
            counts[i, 0] = read
            counts[i, 3] = -1
        pop_sorted(hs, hd, size, out_ids[i], out_scores[i])
