"""Compiled (Numba) pruned search of the ``numba`` backend: MaxScore term at a time, exact.

One query (:func:`_query`), in two phases.

**Phase 1: term at a time, most valuable lists first.** Distinct query terms
are taken in decreasing order of their bound ``ub(t) * c`` (the largest weight
they can add); their posting lists are added into a per-thread float32
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
into blocks of :data:`BLOCK`, with each block's last document and largest
weight, and a directory over the document space that finds a document's block
in a step or two.

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

Per query, nothing is allocated: each thread has a workspace of N-sized
arrays (17 bytes per document), allocated once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .cpu_kernels import JIT, advance, pop_sorted, query_allow, query_terms, sift_down, sift_up, worse

#: Postings per block of the block index (block maxima, two-level probes).
BLOCK = 64
#: What finishing one survivor costs, per unscanned list, in postings scanned
#: (chosen by measurement on LongMemEval-S: 16 to 128 within 10%).
_PROBE = 32
#: When deciding to stop, survivors are counted on every _SAMPLE-th candidate (dense: block of 64).
_SAMPLE = 16


@njit(**JIT)
def _block_of(bix, t, d):
    """Block of term t's postings that would hold document d (the first whose last document
    is >= d), or -1 when d lies past the term's last document.

    ``bix`` is the block index (see :func:`search_pruned`): a doc-space
    directory gives a block at most a step or two before the answer.
    """
    blk_off, blk_last, _bmax, dir_off, dir_shift, blk_dir = bix
    b = blk_dir[dir_off[t] + (d >> dir_shift[t])]
    e = blk_off[t + 1]
    while b < e and blk_last[b] < d:
        b += 1
    return b if b < e else -1


@njit(**JIT)
def _probe(offsets, doc_ids, weights, bix, t, b, m, d):
    """Weight of term t (times m) in document d, searched in block b; -1 when d lacks t."""
    if b < 0:
        return np.float32(-1.0)
    lo = offsets[t] + (b - bix[0][t]) * BLOCK
    hi = min(lo + BLOCK, offsets[t + 1])
    while lo < hi:
        mid = (lo + hi) >> 1
        if doc_ids[mid] < d:
            lo = mid + 1
        else:
            hi = mid
    if doc_ids[lo] == d:  # lo < end: the block's last document is >= d
        w = weights[lo]
        if m != 1:
            w = w * m
        return w
    return np.float32(-1.0)


@njit(**JIT)
def _exact(offsets, doc_ids, weights, bix, tid, mul, T, d, contrib):
    """Score of document d: its weights in ascending term id, added to 0.0f one by one.

    ``contrib[r]`` holds term rank r's weight when already probed (0 if absent), or
    -1 when still to probe; every entry is left at -1.
    """
    s = np.float32(0.0)
    for r in range(T):
        w = contrib[r]
        if w < 0:
            t = tid[r]
            w = _probe(offsets, doc_ids, weights, bix, t, _block_of(bix, t, d), mul[r], d)
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
def _scan(doc_ids, weights, s, e, m, allow, acc, mode, touched, nt, mark, ph, pd, nh):
    """Add the postings s:e (weights times m) of one list into ``acc``.

    With an allow-list only allowed documents count: the list and the
    allow-list are intersected by leapfrogging (galloping on whichever is
    behind), so the shorter one sets the cost. ``mode`` says how touched
    documents are tracked: 0 not at all (dense mode: acc > 0 tells), 1 appended
    to ``touched`` on their first addition, branch-free (acc[d] was 0), 2 the
    same but checked with ``mark[d] & 1`` (zero weights make acc[d] == 0
    ambiguous). Every document whose partial score beats the heap's top is
    offered to it (:func:`_offer`).

    Returns (nt, nh, postings read).
    """
    kk = ph.size
    hmin = ph[0] if nh == kk else np.float32(-np.inf)
    na = allow.size
    if na == 0 and mode == 0:  # the common case, tight
        for p in range(s, e):
            d = doc_ids[p]
            v = acc[d] + weights[p] * m  # x * 1.0f == x: as the reference, which skips the product
            acc[d] = v
            if v > hmin:
                nh = _offer(mark, ph, pd, nh, d, v)
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
        c = acc[d]
        v = c + weights[p] * m
        acc[d] = v
        if mode == 1:
            touched[nt] = d
            nt += c == 0
        elif mode == 2 and c == 0 and (mark[d] & 1) == 0:
            mark[d] |= 1
            touched[nt] = d
            nt += 1
        if v > hmin:
            nh = _offer(mark, ph, pd, nh, d, v)
            if nh == kk:
                hmin = ph[0]
        read += 1
        p += 1
        if na > 0 and ap == na:
            break
    return nt, nh, read


@njit(**JIT)
def _select(acc, dense, touched, nt, thr, sdoc, part, stride):
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
def _merge_rest(offsets, doc_ids, weights, tid, mul, order, suf, n_scan, T, sdoc, part, n, lb, hi1, lo1, c0, ph, pd):
    """Add the unscanned lists' weights to the survivors (ascending documents), dropping those
    whose bound falls below lb; returns how many remain.

    Galloping cursors: a list costs about survivors x log(gap) steps. After each
    list the k-th best partial score among the survivors (a lower bound of the
    k-th best score: partial scores only grow) raises lb. ``ph, pd`` are scratch (k,).
    """
    kk = ph.size
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
                v = v + weights[p] * m
            if ((np.float64(v) + rem) * hi1 + c0) * hi1 >= lb:
                sdoc[keep] = d
                part[keep] = v
                keep += 1
        n = keep
        if n >= kk and i < T - 1:  # k-th best partial score: a min-heap of the k largest
            for j in range(kk):
                ph[j] = part[j]
                pd[j] = sdoc[j]
            for j in range(kk // 2 - 1, -1, -1):
                sift_down(ph, pd, kk, j)
            for j in range(kk, n):
                if part[j] > ph[0]:
                    ph[0] = part[j]
                    pd[0] = sdoc[j]
                    sift_down(ph, pd, kk, 0)
            lb = max(lb, (np.float64(ph[0]) * lo1 + c0) * lo1)
    return n


@njit(**JIT)
def _query(offsets, doc_ids, weights, ub, zero_w, bix, q, const, has_const, allow, slack, tid, tmul, mul,
           order, bnd, suf, contrib, acc, touched, sdoc, part, mark, ph, pd, hs, hd, counts):
    """Top k of one query into the heap (hs, hd) (see the module docstring); returns how many.

    ``counts`` (4,) int64 receives: postings read, documents touched (-1 when
    dense), survivors, survivors scored exactly.
    """
    T = query_terms(q, offsets, tid, tmul)
    if T == 0:
        return 0
    post_rest = 0
    any_zero = False
    for r in range(T):
        t = tid[r]
        bnd[r] = ub[t] * tmul[r]
        mul[r] = np.float32(tmul[r])
        contrib[r] = -1.0
        post_rest += offsets[t + 1] - offsets[t]
        any_zero = any_zero or zero_w[t]
        order[r] = r
    gap = 1
    while gap * 3 + 1 < T:
        gap = gap * 3 + 1
    while gap > 0:  # scan order: descending bound, then term id (Shell sort)
        for i in range(gap, T):
            r = order[i]
            j = i
            while j >= gap and (bnd[order[j - gap]] < bnd[r] or (bnd[order[j - gap]] == bnd[r] and order[j - gap] > r)):
                order[j] = order[j - gap]
                j -= gap
            order[j] = r
        gap //= 3
    suf[T] = 0.0
    for i in range(T - 1, -1, -1):
        suf[i] = suf[i + 1] + bnd[order[i]]
    N = acc.size
    dense = not any_zero and 2 * post_rest >= N
    hi1 = 1.0 + slack
    lo1 = 1.0 - slack
    c0 = np.float64(const) if has_const else 0.0
    kk = ph.size
    nh = 0
    nt = 0
    read = 0
    lb = -np.inf  # <= the k-th best final score
    n_scan = T
    mode = 0
    for i in range(T):
        r = order[i]
        t = tid[r]
        if not dense:
            mode = 2 if mode == 2 or zero_w[t] else 1
        nt, nh, got = _scan(doc_ids, weights, offsets[t], offsets[t + 1], mul[r], allow, acc, mode,
                            touched, nt, mark, ph, pd, nh)
        read += got
        post_rest -= offsets[t + 1] - offsets[t]
        if i == T - 1 or nh < kk:
            continue
        lb = max(lb, (np.float64(ph[0]) * lo1 + c0) * lo1)
        if (suf[i + 1] * hi1 + c0) * hi1 >= lb:
            continue  # an untouched document could still enter
        # survivors need ((partial + rest) hi1 + c0) hi1 >= lb: few enough to finish them instead?
        est = _select(acc, dense, touched, nt, (lb / hi1 - c0) / hi1 - suf[i + 1], sdoc, part, _SAMPLE)
        if est * (_PROBE * (T - i - 1) + _PROBE) < post_rest:
            n_scan = i + 1
            break
    rest = suf[n_scan]
    counts[0] = read
    counts[1] = -1 if dense else nt
    n = _select(acc, dense, touched, nt, (lb / hi1 - c0) / hi1 - rest, sdoc, part, 1)
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
        n = _merge_rest(offsets, doc_ids, weights, tid, mul, order, suf, n_scan, T, sdoc, part, n, lb, hi1, lo1, c0,
                        ph, pd)
        n_scan = T
        rest = 0.0
    # phase 2: survivors by descending partial score, exactly scored while they can enter;
    # part holds -partial, so that the heap's worst (its top) is the best partial score
    for j in range(n):
        part[j] = -part[j]
    for j in range(n // 2 - 1, -1, -1):
        sift_down(part, sdoc, n, j)
    cap = hs.size
    size = 0
    while n > 0:
        v = -np.float64(part[0])
        d = sdoc[0]
        if size == cap and ((v + rest) * hi1 + c0) * hi1 < hs[0]:
            break  # no survivor left can reach the k-th score ('<': a tie with a lower id could)
        n -= 1
        part[0] = part[n]
        sdoc[0] = sdoc[n]
        sift_down(part, sdoc, n, 0)
        if n_scan < T:
            if size == cap:  # block maxima of the unscanned lists: a cheap reason to drop d
                bm = v
                for i in range(n_scan, T):
                    r = order[i]
                    b = _block_of(bix, tid[r], d)
                    if b >= 0:
                        bm += np.float64(bix[2][b]) * tmul[r]
                if (bm * hi1 + c0) * hi1 < hs[0]:
                    continue
            ok = True
            for i in range(n_scan, T):  # their postings: exact weights, a tighter bound
                r = order[i]
                t = tid[r]
                w = _probe(offsets, doc_ids, weights, bix, t, _block_of(bix, t, d), mul[r], d)
                contrib[r] = max(w, np.float32(0.0))
                v += max(w, np.float32(0.0))
                if size == cap and ((v + suf[i + 1]) * hi1 + c0) * hi1 < hs[0]:
                    ok = False
                    break
            if not ok:
                for r in range(T):
                    contrib[r] = -1.0
                continue
        sc = _exact(offsets, doc_ids, weights, bix, tid, mul, T, d, contrib)
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


@njit(**JIT)
def search_pruned(offsets, doc_ids, weights, ub, zero_w, bix, q_flat, q_off, consts, has_const,
                  allow_flat, a_lo, a_hi, k, slack, rows, acc, touched, sdoc, part, mark,
                  out_ids, out_scores, counts):
    """Pruned top-k of the queries ``rows`` (see the module docstring).

    Parameters
    ----------
    offsets, doc_ids, weights, q_flat, q_off, consts, has_const, allow_flat, a_lo, a_hi, k, rows, out_ids,
    out_scores
        As :func:`gpuir.backends.cpu_kernels.search_exhaustive`.
    ub : (V,) float64 -- each term's largest weight
    zero_w : (V,) bool -- whether a term has a posting of weight 0
    bix : tuple -- the block index: blk_off (V+1,) int64 (term t's blocks are blk_off[t]:blk_off[t+1]),
        blk_last (NB,) int32 (a block's last document), blk_max (NB,) float32 (its largest weight),
        dir_off (V+1,) int64, dir_shift (V,) int64, blk_dir (ND,) int64 (term t's first block whose last
        document is >= d is at most a step or two after blk_dir[dir_off[t] + (d >> dir_shift[t])])
    slack : float -- relative slack of the bounds
    acc (N,) float32, touched (N,) int32, sdoc (N,) int32, part (N,) float32, mark (N,) uint8
        One thread's workspace; acc and mark are zero on entry and on return, the rest is scratch.
    counts : (B, 4) int64 -- receives each query's work (see :func:`_query`)
    """
    cap = min(k, max(acc.size, 1))
    qmax = 1
    for j in range(rows.size):
        i = rows[j]
        qmax = max(qmax, q_off[i + 1] - q_off[i])
    tid = np.empty(qmax, np.int64)
    tmul = np.empty(qmax, np.int64)
    mul = np.empty(qmax, np.float32)
    order = np.empty(qmax, np.int64)
    bnd = np.empty(qmax, np.float64)
    suf = np.empty(qmax + 1, np.float64)
    contrib = np.empty(qmax, np.float32)
    ph = np.empty(cap, np.float32)
    pd = np.empty(cap, np.int64)
    hs = np.empty(cap, np.float32)
    hd = np.empty(cap, np.int64)
    noallow = np.empty(0, np.int64)
    for j in range(rows.size):
        i = rows[j]
        allow, nothing = query_allow(allow_flat, a_lo, a_hi, i, noallow)
        if nothing:
            continue
        size = _query(offsets, doc_ids, weights, ub, zero_w, bix, q_flat[q_off[i]:q_off[i + 1]], consts[i],
                      has_const, allow, slack, tid, tmul, mul, order, bnd, suf, contrib, acc, touched, sdoc, part,
                      mark, ph, pd, hs, hd, counts[i])
        pop_sorted(hs, hd, size, out_ids[i], out_scores[i])
