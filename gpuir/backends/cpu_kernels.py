"""Compiled (Numba) kernels of the ``numba`` backend: shared pieces and the exhaustive search.

Everything here is a Numba ``nopython`` function compiled with ``nogil=True``
(Python threads run them at once) and ``cache=True`` (compiled once per
machine, then loaded from ``__pycache__``). ``fastmath`` is off on purpose:
float32 operations happen one by one in the order written, never reassociated,
vectorised, contracted into FMAs or widened to float64, so that scores equal the
NumPy reference's bit for bit (tested on adversarial parameters). The
reference's arithmetic, which every kernel reproduces:

* a posting's weight is :func:`weight`: either read from the static cache
  (``pre``, :func:`~gpuir.backends.weights.posting_weights` under the scorer's
  own statistics) or computed from its raw tf and its document's length with
  the search's idf, absent-term weight and avgdl -- exactly the float32
  operations of :func:`gpuir.backends.weights.weights_of`;
* a document's score adds its float32 posting weights in ascending term id,
  starting from 0.0f; a query term occurring ``c`` times adds
  ``w * float32(c)`` (the reference skips the product when c == 1;
  ``w * 1.0f == w`` exactly, so the kernels may multiply always); absent terms
  add nothing (adding +0.0 would change no bit either);
* bm25l / bm25+ add the query's float32 constant once at the end;
* the top k are ordered by score descending, then document ascending;
* documents with ``live[d] == False`` (tombstones) are never candidates.

Arguments travel in a few tuples (numba compiles one specialisation per
combination of their types; every array is read-only and C-contiguous):

``ix = (offsets, doc_ids, tfs, dls)``
    the segment: offsets (V+1,) int64, doc_ids (P,) int32, tfs (P,) int32, dls (N,) int32.
``wt = (pre, fp, method, has_w0)``
    the weights: pre (P,) float32 or (0,) (compute them); fp (6,) float32 =
    ``1 - b, b, k1, k1 + 1, delta, float32(avgdl)``, or those 6 followed by a table of the
    weights' tf part (:func:`tfc_table`: ``ix``'s tfs then hold each posting's key in it,
    :func:`tf_keys`); method (int, :data:`gpuir.bm25.METHODS` code); has_w0 (bool).
``qs = (q_off, q_term, q_mult, q_idf, q_w0, consts)``
    the batch (:class:`~gpuir.backends.base.WeightedQueries`): row i's distinct terms are
    ``q_off[i]:q_off[i+1]`` of q_term (B+1 / T int64, ascending within a row), with
    multiplicities q_mult (T,) int64, idf and w0 (T,) float32; consts (B,) float32.

The pruned search lives in :mod:`gpuir.backends.cpu_maxscore`; this module
holds the exhaustive one (``prune=False``, ``score_matrix`` and the rows that
must not be pruned): **document at a time**, one cursor per distinct query
term, the next candidate being the smallest current document; its weights are
collected by term rank, then summed in that order. **Filters leapfrog**: an
allow-list is one more cursor that every candidate must match, and cursors
gallop to the next allowed document, so a small allow-list costs about
|allow| x terms x log(gap) steps whatever the lists' lengths. Scratch is
O(terms + k) per call; nothing per query is O(N).
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


#: The tf-part table of :func:`tfc_table`: tf below TABLE_TF, lengths below TABLE_DL (LongMemEval-S's turns:
#: 98.5% of the postings have tf <= 8, 99.1% are in documents shorter than 512 tokens). 4,608 float32
#: values (18 KB, in the first-level cache), made in some 10 us per snapshot. With each posting's key in
#: it (:func:`tf_keys`, once per segment: read in posting order, where a document's length is a random
#: read), a snapshot searched once (an agent's memory after each add) weighs nearly every posting it
#: reads with one table read and one product, as a cached weight costs one read.
TABLE_TF = 9
TABLE_DL = 512


@njit(**JIT)
def tf_keys(doc_ids, tfs, dls):
    """Each posting's key in the tf-part table: ``tf * TABLE_DL + dl`` when tf < TABLE_TF and its document's
    length dl < TABLE_DL, else ``-tf`` (the weight then computes the tf part from tf and ``dls``).

    Parameters
    ----------
    doc_ids (P,) int32, tfs (P,) int32, dls (N,) int32 -- a segment's postings and lengths (host)

    Returns
    -------
    (P,) int32: an ``ix``'s tf slot for :func:`weight` with a table in ``fp``
    """
    out = np.empty(tfs.size, np.int32)
    for p in range(tfs.size):
        tf = tfs[p]
        dl = dls[doc_ids[p]]
        out[p] = tf * TABLE_DL + dl if tf < TABLE_TF and dl < TABLE_DL else -tf
    return out


@njit(error_model="numpy", **JIT)
def tfc_table(fp6, method):
    """``fp6`` (6,) float32 followed by ``TABLE_TF, TABLE_DL`` and the tf part of the weight of every tf
    below TABLE_TF and length below TABLE_DL (row-major by tf): an ``fp`` for :func:`weight` that looks the
    tf part up instead of computing it. Each entry is :func:`weight`'s product with idf 1 (``1.0f * t == t``)
    of the same :func:`tf_part` and the same length norm: the same operations, so the same bits (the norm
    made once per length and the formula's branch outside the inner loop: some 4 us, against 20 for
    :func:`weight` per entry). (A division by zero gives inf or nan, as NumPy's, instead of
    raising: the table holds entries no posting has, e.g. tf 0.)

    Returns
    -------
    (8 + TABLE_TF * TABLE_DL,) float32
    """
    out = np.empty(8 + TABLE_TF * TABLE_DL, np.float32)
    out[:6] = fp6
    out[6] = TABLE_TF
    out[7] = TABLE_DL
    norm = np.empty(TABLE_DL, np.float32)
    for dl in range(TABLE_DL):
        norm[dl] = fp6[0] + fp6[1] * (np.float32(dl) / fp6[5])
    one = np.float32(1.0)
    for tf in range(TABLE_TF):
        x = np.float32(tf)
        row = out[8 + tf * TABLE_DL:8 + (tf + 1) * TABLE_DL]
        for dl in range(TABLE_DL):
            row[dl] = one * tf_part(x, norm[dl], fp6, method)
    return out


@njit(**JIT)
def weight(pre, tfs, dls, fp, method, has_w0, p, d, idf, w0):
    """The float32 weight of posting p (document d) of a term with weights (idf, w0).

    ``pre[p]`` when the weights are cached; otherwise ``idf`` times the tf part, minus
    ``w0`` for bm25l / bm25+: the operations of :func:`gpuir.backends.weights.weights_of`, in their order,
    in float32. When ``fp`` holds the tf-part table (:func:`tfc_table`), ``tfs`` holds each posting's key
    in it (:func:`tf_keys`) and the tf part is read there (the same bits).
    """
    if pre.size != 0:
        return pre[p]
    c = tfs[p]
    if fp.size > 8:
        if c >= 0:
            w = idf * fp[8 + c]
            if has_w0:
                w = w - w0
            return w
        c = -c
    t = tf_part(np.float32(c), fp[0] + fp[1] * (np.float32(dls[d]) / fp[5]), fp, method)
    w = idf * t
    if has_w0:
        w = w - w0
    return w


@njit(inline="always", **JIT)
def tf_part(tf, norm, fp, method):
    """The tf part of a weight (float32): tf (float32), the length norm ``fp[0] + fp[1] * (dl / fp[5])``
    (float32), the variant's formula. Inlined where it is called (:func:`weight`, :func:`tfc_table`): one home
    for the formula, no call in the postings' loop."""
    k1 = fp[2]
    if method <= 1:  # lucene, robertson
        return tf / (k1 * norm + tf)
    if method == 2:  # atire
        return (tf * fp[3]) / (tf + k1 * norm)
    if method == 3:  # bm25l
        c2 = tf / norm
        return (fp[3] * (c2 + fp[4])) / (k1 + c2 + fp[4])
    return (fp[3] * tf) / (k1 * norm + tf) + fp[4]  # bm25+


@njit(**JIT)
def weights_into(ix, wt, t, idf, w0, out):
    """Every posting weight of term t into ``out`` (for tests: the kernels' arithmetic, exposed)."""
    offsets, doc_ids, tfs, dls = ix
    pre, fp, method, has_w0 = wt
    s = offsets[t]
    for p in range(s, offsets[t + 1]):
        out[p - s] = weight(pre, tfs, dls, fp, method, has_w0, p, doc_ids[p], idf, w0)


@njit(**JIT)
def row_terms(offsets, qs, i, tid, tmul, tidf, tw0):
    """Row i's distinct terms that have postings here (ascending), with their counts and weights;
    returns how many. ``tid``, ``tmul`` (int64), ``tidf``, ``tw0`` (float32) have room for them."""
    q_off, q_term, q_mult, q_idf, q_w0 = qs[0], qs[1], qs[2], qs[3], qs[4]
    T = 0
    for j in range(q_off[i], q_off[i + 1]):
        t = q_term[j]
        if offsets[t + 1] > offsets[t]:  # a term without postings adds nothing here
            tid[T] = t
            tmul[T] = q_mult[j]
            tidf[T] = q_idf[j]
            tw0[T] = q_w0[j]
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
def _daat(ix, wt, live, T, tid, tmul, tidf, tw0, const, has_const, allow, pos, cur, contrib, hs, hd, dense):
    """Every candidate of one query (its T terms in tid...), document at a time (see the module docstring).

    With ``dense.size == 0`` the best ``hs.size`` go to the heap (hs, hd);
    otherwise each candidate's score is written to ``dense[doc]``.
    Returns (results in the heap, postings read).
    """
    offsets, doc_ids, tfs, dls = ix
    pre, fp, method, has_w0 = wt
    for r in range(T):
        t = tid[r]
        pos[r] = offsets[t]
        cur[r] = doc_ids[pos[r]]
        contrib[r] = np.float32(0.0)
    cap = hs.size
    size = 0
    read = 0
    na = allow.size
    nl = live.size
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
        ok = nl == 0 or live[d]
        for r in range(T):
            if cur[r] == d:
                if ok:
                    contrib[r] = weight(pre, tfs, dls, fp, method, has_w0, pos[r], d, tidf[r], tw0[r]) * \
                        np.float32(tmul[r])
                    read += 1
                p = pos[r] + 1
                pos[r] = p
                cur[r] = doc_ids[p] if p < offsets[tid[r] + 1] else _END
        if not ok:  # a deleted document: never a candidate
            continue
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
def scratch(q_off, rows):
    """Per-call scratch of :func:`_daat` for the longest row of ``rows``:
    tid, tmul, pos, cur (int64), tidf, tw0, contrib (float32)."""
    qmax = 1
    for j in range(rows.size):
        i = rows[j]
        qmax = max(qmax, q_off[i + 1] - q_off[i])
    return (np.empty(qmax, np.int64), np.empty(qmax, np.int64), np.empty(qmax, np.int64),
            np.empty(qmax, np.int64), np.empty(qmax, np.float32), np.empty(qmax, np.float32),
            np.zeros(qmax, np.float32))


@njit(**JIT)
def exhaustive_row(ix, wt, live, qs, i, allow, scr, hs, hd, dense):
    """Row i of the batch scored document at a time (:func:`_daat`); returns (heap size, postings read)."""
    tid, tmul, pos, cur, tidf, tw0, contrib = scr
    T = row_terms(ix[0], qs, i, tid, tmul, tidf, tw0)
    return _daat(ix, wt, live, T, tid, tmul, tidf, tw0, qs[5][i], wt[3], allow, pos, cur, contrib, hs, hd, dense)


@njit(**JIT)
def search_exhaustive(ix, wt, live, qs, allow_flat, a_lo, a_hi, k, rows, out_ids, out_scores, counts):
    """Top-k of the batch rows ``rows``, every candidate scored (document at a time).

    Parameters
    ----------
    ix, wt, qs : tuples (see the module docstring)
    live : (N,) bool, or (0,): every document live
    allow_flat : (A,) int64; a_lo, a_hi : (B,) int64 -- row i's allow-list (sorted, unique) is
        allow_flat[a_lo[i]:a_hi[i]] when a_lo[i] >= 0, else it has none
    k : int; rows : (R,) int64 -- the rows to answer
    out_ids : (B, k) int64, out_scores : (B, k) float32 -- pre-filled with padding; rows are written
    counts : (B, 4) int64 -- counts[i, 0] receives the postings read
    """
    n_docs = ix[3].size
    cap = min(k, max(n_docs, 1))
    scr = scratch(qs[0], rows)
    hs = np.empty(cap, np.float32)
    hd = np.empty(cap, np.int64)
    nodense = np.empty(0, np.float32)
    noallow = np.empty(0, np.int64)
    for j in range(rows.size):
        i = rows[j]
        allow, nothing = query_allow(allow_flat, a_lo, a_hi, i, noallow)
        if nothing:
            continue
        size, read = exhaustive_row(ix, wt, live, qs, i, allow, scr, hs, hd, nodense)
        counts[i, 0] = read
        pop_sorted(hs, hd, size, out_ids[i], out_scores[i])


@njit(**JIT)
def score_dense(ix, wt, live, qs, allow_flat, a_lo, a_hi, rows, out):
    """Every candidate's score of the batch rows ``rows``: ``out[i, doc] = score``.

    Arguments as :func:`search_exhaustive`; out : (B, N) float32, pre-filled with -inf.
    """
    scr = scratch(qs[0], rows)
    hs = np.empty(0, np.float32)
    hd = np.empty(0, np.int64)
    noallow = np.empty(0, np.int64)
    for j in range(rows.size):
        i = rows[j]
        allow, nothing = query_allow(allow_flat, a_lo, a_hi, i, noallow)
        if not nothing:
            exhaustive_row(ix, wt, live, qs, i, allow, scr, hs, hd, out[i])
