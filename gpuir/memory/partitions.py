"""Time partitions and newest-first search (AgentIR's Algorithm 1), exact and recency-budgeted.

Records are partitioned by time: partition ``p = floor(time_ms / window_ms)``
(``window_ms`` = the memory's ``partition_days``, 7 days by default), records
without a time in a partition of their own, searched last. Every segment holds
records of one partition. A search scans partitions in one of three modes:

``exhaustive``
    every partition that can hold a match (a time-range ``where`` already skips
    the partitions it does not overlap);
``newest`` (exact)
    partitions newest first, stopping as soon as no older partition can change
    the top k. The result is identical to ``exhaustive`` (ids, float32 scores,
    order);
``budgeted``
    at most the newest ``K`` partitions (or the ``K`` covering an estimated share
    ``1 - eps`` of the relevant mass), with the exact early stop inside that budget.

The bound
---------
For a query with distinct terms t (multiplicities m_t) and a partition P, let
``B_P = C + sum_t m_t * max_{s in P} u(t, s)``, where ``u(t, s)`` is
:func:`~gpuir.backends.weights.weight_bound` of ``idf_t tfc(maxtf_s(t),
mindl_s(t)) - w0_t`` (widened, rounded up) over the segments s of P holding t
(:class:`~gpuir.memory.segments.Segment` keeps ``maxtf`` and ``mindl`` per term:
summaries no statistic changes) and ``C`` is the absent-term constant (zero
except bm25l/bm25+). Partitions
holding no query term get ``B_P = -inf``: they have no candidate.

*Claim.* Every record of P scores at most ``B_P`` up to float32 rounding.
*Proof sketch.* A record d of P scores ``C + sum_{t in d} m_t w(t, d)`` with
``w(t, d) = idf_t tfc(tf, |d|) - w0_t >= 0``. For every BM25 variant, tfc grows
with tf and (b >= 0) does not grow with the document length, so ``w(t, d) <=
u(t, s)`` for d's segment s, since ``tf <= maxtf_s(t)`` and ``|d| >= mindl_s(t)``;
summing over t (all terms non-negative, so terms absent from d only add slack)
gives the claim. Float32 evaluation can exceed the real value by a few units in
the last place per operation; a relative slack ``1e-5 + 2e-7 T`` (T query
terms) covers that with a wide margin (it must exceed ``(T + c) 2^-24``).

*Exact early stop.* Scan partitions P_1, P_2, ... newest first, keeping the
exact top k of what was scanned. Before scanning P_j, if k records are held and
the k-th best score s_k satisfies ``s_k > (1 + slack) max_{i >= j} B_{P_i}``
(strictly), stop. Every unscanned record scores strictly less than s_k, so it
can neither enter the top k nor tie with its k-th entry (a tie could reorder by
add order); the kept top k is the exhaustive top k, in the same order.
Partitions whose bound is -inf are skipped without reading anything. To keep
the per-partition overhead of a Python loop low, partitions are read in batches
of 1, 2, 4, ... (one vectorised pass per batch) and the test runs before each
batch; stopping less often never changes the result.

*Inside a batch* the same k-th score s_k is handed to each segment's scorer
(``theta``, :meth:`gpuir.backends.numba_backend.NumbaScorer.search`; scorers
without it ignore it): its MaxScore starts from s_k as the lower bound of the
score worth keeping, so lists whose bounds cannot lift a record to s_k are not
scanned, and records that cannot reach it are never scored. Exactness is
unchanged: every record that could reach (or tie) the k-th score is scored
exactly, and a segment may return fewer than k records, all >= s_k.

Recency budget and its trade-off
--------------------------------
AgentIR's Theorem 4.1: if the relevance mass of a query's answers decays
geometrically with partition age (newest = age 0), the share in partitions of
age >= K is at most ``rho^K`` for decay ``rho``, so the newest
``K(eps) = ceil(log eps / log rho)`` partitions hold at least ``1 - eps`` of
it, whatever the size of the memory: the work is O(log 1/eps) partitions. The
``budgeted`` mode scans at most ``K`` partitions (given, or ``K(eps)`` from
``epsilon`` and ``decay``), with the exact early stop inside that budget.
Trade-off: it is exact for answers in those K partitions and blind to older
ones, so its recall against exhaustive search is below 1 when a query's best
answers are older (a question about last year under a 4-week budget); the
benchmark reports its recall@10 against exhaustive search. The ``newest`` mode
is always exact, and fast when the newest partitions already hold k records
scoring above what the older ones could reach; on queries whose best answers
are old it degrades gracefully to an exhaustive scan.
"""

from __future__ import annotations

import math

import numpy as np

from ..backends.contract import weight_bound
from .search import Hits, Job, QueryPlan, top_k
from .segments import Segment
from .snapshot import Snapshot
from .where import Where

#: Search modes.
MODES = ("exhaustive", "newest", "budgeted")


def partition_keys(times: np.ndarray, window_ms: int | None, missing: int) -> list[int | None]:
    """The partition key of each time (ndarray (n,), int64): ``time // window``; None where missing.

    With ``window_ms`` None (no time partitioning) every record is in partition 0.
    """
    if window_ms is None:
        return [0] * int(times.size)
    keys = np.floor_divide(times, window_ms)
    return [None if t == missing else int(k) for t, k in zip(times.tolist(), keys.tolist())]


def budget_partitions(epsilon: float, decay: float) -> int:
    """``K(eps) = ceil(log eps / log rho)``: partitions holding ``1 - eps`` of a geometric recency mass.

    Raises
    ------
    ValueError
        ``epsilon`` outside (0, 1) or ``decay`` outside (0, 1).
    """
    if not (0.0 < float(epsilon) < 1.0):
        raise ValueError(f"epsilon must lie in (0, 1), got {epsilon!r}")
    if not (0.0 < float(decay) < 1.0):
        raise ValueError(f"decay must lie in (0, 1), got {decay!r}")
    return max(1, math.ceil(math.log(epsilon) / math.log(decay) - 1e-12))


def fit_decay(ages: np.ndarray) -> float:
    """Maximum-likelihood geometric decay ``rho = mean / (1 + mean)`` of partition ages (0 = newest).

    Parameters
    ----------
    ages : ndarray (n,), int: the age, in partitions, of the answer to each past query
    """
    a = np.asarray(ages, dtype=np.float64)
    if a.size == 0 or np.any(a < 0):
        raise ValueError("ages must be a non-empty array of non-negative partition ages")
    m = float(a.mean())
    return min(max(m / (1.0 + m), 1e-6), 1 - 1e-6)


def slack(plan: QueryPlan) -> float:
    """Relative slack of the bound comparisons (see the module docstring)."""
    return 1e-5 + 2e-7 * len(plan.terms)


def term_bounds(seg: Segment, lt: np.ndarray, plan: QueryPlan, sel: np.ndarray, snap: Snapshot) -> np.ndarray:
    """``u(t, s)`` of the module docstring for the local terms ``lt`` (plan terms ``sel``) of segment ``seg``.

    Returns
    -------
    ndarray (len(lt),), float64: an upper bound of each term's float32 posting weights in the segment
    (:func:`~gpuir.backends.weights.weight_bound`, valid for every avgdl)
    """
    return weight_bound(seg.maxtf[lt], seg.mindl[lt], plan.idf[sel], plan.w0[sel], snap.avgdl,
                        snap.params).astype(np.float64)


def partition_bound(snap: Snapshot, view_ids: tuple[int, ...], plan: QueryPlan) -> float:
    """``B_P`` of the module docstring (float64), before slack; -inf when P holds no query term."""
    T = len(plan.terms)
    best = np.full(T, -np.inf)
    for vi in view_ids:
        seg = snap.views[vi].seg
        lids = plan.local_terms(vi, seg)
        sel = lids >= 0
        if not sel.any():
            continue
        best[sel] = np.maximum(best[sel], term_bounds(seg, lids[sel], plan, sel, snap))
    have = best > -np.inf
    if not have.any():
        return -np.inf
    return float((best[have] * plan.mult[have]).sum()) + float(plan.const)


def scan_unfiltered(snap: Snapshot, engine, plans: list[QueryPlan], k: int) -> tuple[np.ndarray, ...] | None:
    """:func:`scan` in "exhaustive" mode of queries without a ``where``, as arrays: every query reads
    every partition, so the batch is one call over all the snapshot's segments
    (:meth:`gpuir.memory.search.SnapshotSearch.search_all`), its results kept as the engine leaves them.

    Returns
    -------
    (seqs, scores, vidx, rows) (B, k) each -- int64, float32, int64, int64, host; best first, padded with
    -1 (-inf for scores) -- then postings read and partitions scanned, (B,) int64 each; or None when
    no query has a term (then :func:`scan`).
    """
    parts = snap.partitions
    if not parts or all(p.empty for p in plans):
        return None
    vids = tuple(vi for _, vs in parts for vi in vs)  # (the order scan() gives them: the same layout)
    got = engine.search_all(vids, plans, k)
    scanned = np.array([0 if p.empty else len(parts) for p in plans], np.int64)
    return got.seqs, got.scores, got.views, got.rows, got.postings, scanned


def scan(snap: Snapshot, engine, plans: list[QueryPlan], wheres: list[Where | None], k: int, mode: str,
         max_partitions: int | None = None) -> list[tuple[Hits, int, int]]:
    """Search every query of the batch over the snapshot's partitions in ``mode``.

    Returns
    -------
    list of (Hits (top k), postings read, partitions scanned), one per query.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")
    parts = snap.partitions
    B = len(plans)
    res = [Hits() for _ in range(B)]
    read = [0] * B
    scanned = [0] * B
    # per query: the partitions (positions in `parts`) it may read, newest first
    allowed: list[list[int]] = []
    for p, w in zip(plans, wheres):
        a = [] if p.empty else [
            i for i, (key, _) in enumerate(parts) if w is None or w.may_match_partition(key, snap.window_ms)]
        if mode == "budgeted" and max_partitions is not None:
            a = a[:max_partitions]
        allowed.append(a)
    if mode == "exhaustive":  # every allowed partition at once: one pass per query, no bounds
        groups: dict[tuple[int, ...], list[int]] = {}
        for qi, a in enumerate(allowed):
            if a:
                groups.setdefault(tuple(a), []).append(qi)
        for a, qis in groups.items():
            vids = tuple(vi for i in a for vi in parts[i][1])
            for qi, (h, r) in engine.scan(vids, [Job(qi, plans[qi], wheres[qi]) for qi in qis], k).items():
                res[qi], read[qi], scanned[qi] = h, r, len(a)
        return [(res[i], read[i], scanned[i]) for i in range(B)]
    # newest first, one query at a time, in batches of 1, 2, 4, ... partitions: before each batch,
    # stop if the k-th score so far beats every remaining partition's bound; inside a batch, the
    # same k-th score is each segment scorer's theta (see the module docstring)
    for qi, a in enumerate(allowed):
        if not a:
            continue
        plan, sl = plans[qi], 1.0 + slack(plans[qi])
        bounds = [partition_bound(snap, parts[i][1], plan) for i in a]
        rest = np.maximum.accumulate(np.asarray(bounds[::-1]))[::-1]  # rest[j] = max(bounds[j:])
        pos, size = 0, 1
        while pos < len(a):
            if res[qi].kth(k) > rest[pos] * sl:  # nothing left can reach (or tie) the k-th score
                break
            batch = [i for i, bnd in zip(a[pos: pos + size], bounds[pos: pos + size]) if bnd > -np.inf]
            pos, size = pos + size, 2 * size
            if not batch:  # no query term there: no candidate
                continue
            vids = tuple(vi for i in batch for vi in parts[i][1])
            h, r = engine.scan(vids, [Job(qi, plan, wheres[qi], res[qi].kth(k))], k)[qi]
            res[qi] = top_k([res[qi], h], k)
            read[qi] += r
            scanned[qi] += len(batch)
    return [(res[i], read[i], scanned[i]) for i in range(B)]
