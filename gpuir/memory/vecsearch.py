"""Dense search over a snapshot's stored vectors: per segment the engine's dense path, then one top-k.

For each segment view of the snapshot, the rows a query may see are its
``where`` mask (:meth:`gpuir.memory.where.Where.mask`: live, not expired, the
tenant, the filter) or, without a filter, the view's live rows; the segment's
vector column of the embedding and the query vectors go to
:func:`gpuir.backends.dense.dense_topk` (exact: float64 accumulation rounded to
float32, the same scores on every backend), and the per-segment top-k lists
are merged under the tie rule (higher score, then lower sequence number). A
query that may see few of a segment's rows (a tenant of a shared memory)
scores only those, gathered in row order.
Rows are in sequence order inside a segment, so the result equals a brute-force
ranking of every allowed live record.

``method="faiss"`` (for large memories, when ``faiss`` is installed) asks a
FAISS index per segment and embedding (``IndexFlatIP``, built on first use and
kept with the segment) for candidates -- ``k`` plus a margin of
:data:`FAISS_MARGIN` per query -- and scores them again exactly; segments
smaller than :data:`FAISS_MIN_ROWS` are searched exactly. It returns what the exact path returns
except where FAISS's float32 arithmetic leaves a record out of the margin
(records whose exact scores agree with the k-th to about 1e-6).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backends.contract import dense_scores, dense_topk, device_arrays
from ..topk import topk_order
from .snapshot import Snapshot

__all__ = ["DENSE_METHODS", "search_snapshot"]

#: ``method`` of :meth:`gpuir.Memory.search_vectors`.
DENSE_METHODS = ("exact", "faiss")
#: A query allowed fewer than 1/SPARSE_FRACTION of a segment's rows scores only those rows.
SPARSE_FRACTION = 8
#: ``method="faiss"``: segments with fewer records are searched exactly.
FAISS_MIN_ROWS = 50_000
#: ``method="faiss"``: candidates asked of FAISS beyond k, per query and segment.
FAISS_MARGIN = 32


def _allow(snap: Snapshot, vi: int, wheres: list) -> np.ndarray | None:
    """Allowed rows of view ``vi`` per query: ndarray (B, n) bool, or None when every row is allowed."""
    view = snap.views[vi]
    if all(w is None for w in wheres):
        return view.live
    n = view.seg.n_docs
    live = np.ones(n, bool) if view.live is None else view.live
    return np.stack([live if w is None else w.mask(view, snap.dicts) for w in wheres])


def _device_vectors(seg, name: str):
    """The segment's column of ``name`` on the GPU (uploaded once, kept with the segment)."""
    key = ("dense_device", name)
    dev = seg.cache.get(key)
    if dev is None:
        dev = seg.cache[key] = device_arrays().asarray(seg.vectors(name))
    return dev


def _faiss_index(seg, name: str):
    key = ("dense_faiss", name)
    idx = seg.cache.get(key)
    if idx is None:
        import faiss

        v = np.ascontiguousarray(seg.vectors(name), dtype=np.float32)
        idx = faiss.IndexFlatIP(v.shape[1])
        idx.add(v)
        seg.cache[key] = idx
    return idx


def _faiss_topk(seg, name: str, q: np.ndarray, k: int, allow: np.ndarray | None, margin: int,
                backend: str) -> tuple[np.ndarray, np.ndarray]:
    """Candidates from FAISS, scored again exactly (float64 accumulation), top-k with the tie rule."""
    import faiss

    B, n = q.shape[0], seg.n_docs
    kk = min(k, n)
    rows = np.full((B, kk), -1, np.int64)
    sc = np.full((B, kk), -np.inf, np.float32)
    idx = _faiss_index(seg, name)
    vecs = seg.vectors(name)
    for b in range(B):
        a = None if allow is None else (allow if allow.ndim == 1 else allow[b])
        avail = n if a is None else int(np.count_nonzero(a))
        if avail == 0:
            continue
        depth = min(avail, kk + margin)
        params = faiss.SearchParameters()
        if a is not None:
            params.sel = faiss.IDSelectorBatch(np.flatnonzero(a).astype(np.int64))
        _, I = idx.search(q[b: b + 1], depth, params=params)
        cand = np.unique(I[0][I[0] >= 0]).astype(np.int64)
        exact = dense_scores(q[b: b + 1], vecs[cand], "numpy" if backend == "cupy" else backend)[0]
        order = topk_order(cand, exact, kk)
        rows[b, : order.size], sc[b, : order.size] = cand[order], exact[order]
    return rows, sc


def _exact_topk(q: np.ndarray, vecs: Any, k: int, allow: np.ndarray | None,
                backend: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`dense_topk` of one segment; a query allowed few of its rows (a tenant of a shared memory)
    scores only those (gathered in row order, so the tie rule is unchanged)."""
    n = int(vecs.shape[0])
    if allow is None or allow.ndim == 1:
        return dense_topk(q, vecs, k, allow, backend)
    counts = allow.sum(axis=1)
    sparse = counts * SPARSE_FRACTION < n
    if not sparse.any():
        return dense_topk(q, vecs, k, allow, backend)
    B = q.shape[0]
    kk = max(1, min(k, n))
    rows = np.full((B, kk), -1, np.int64)
    sc = np.full((B, kk), -np.inf, np.float32)
    dense_q = np.flatnonzero(~sparse)
    if dense_q.size:
        r, s = dense_topk(q[dense_q], vecs, k, allow[dense_q], backend)
        rows[dense_q, : r.shape[1]], sc[dense_q, : s.shape[1]] = r, s
    for b in np.flatnonzero(sparse & (counts > 0)).tolist():
        sel = np.flatnonzero(allow[b])
        sub = vecs[device_arrays().asarray(sel)] if backend == "cupy" else vecs[sel]
        r, s = dense_topk(q[b: b + 1], sub, k, None, backend)
        ok = r[0] >= 0
        m = int(ok.sum())
        rows[b, :m], sc[b, :m] = sel[r[0][ok]], s[0][ok]
    return rows, sc


def search_snapshot(snap: Snapshot, name: str, queries: np.ndarray, k: int, wheres: list, backend: str,
                    method: str = "exact", faiss_margin: int | None = None,
                    faiss_min_rows: int | None = None) -> tuple[np.ndarray, ...]:
    """Top-k live records of each query vector by inner product with embedding ``name``.

    Parameters
    ----------
    snap : Snapshot
    name : str
        The embedding; every segment of the snapshot carries its column.
    queries : ndarray, shape (B, dim), float32, host (normalised)
    k : int, >= 1 (the caller clamps it to the live records)
    wheres : list of B compiled filters (:class:`gpuir.memory.where.Where` or None)
    backend : {"numpy", "numba", "cupy"}
    method : {"exact", "faiss"}

    Returns
    -------
    (seqs, scores, vidx, rows) : ndarrays, shape (B, k): int64 / float32 / int64 / int64, host;
    -1 / -inf / -1 / -1 padding.
    """
    B = queries.shape[0]
    faiss_margin = FAISS_MARGIN if faiss_margin is None else faiss_margin
    faiss_min_rows = FAISS_MIN_ROWS if faiss_min_rows is None else faiss_min_rows
    cand_s, cand_v, cand_r, cand_sc = [], [], [], []
    for vi, view in enumerate(snap.views):
        seg = view.seg
        allow = _allow(snap, vi, wheres)
        if allow is not None and not allow.any():
            continue
        if method == "faiss" and seg.n_docs >= faiss_min_rows:
            r, s = _faiss_topk(seg, name, queries, k, allow, faiss_margin, backend)
        else:
            vecs = _device_vectors(seg, name) if backend == "cupy" else seg.vectors(name)
            r, s = _exact_topk(queries, vecs, k, allow, backend)
        ok = r >= 0
        cand_s.append(np.where(ok, seg.seqs[np.maximum(r, 0)], -1))
        cand_v.append(np.where(ok, vi, -1))
        cand_r.append(r)
        cand_sc.append(s)
    seqs = np.full((B, k), -1, np.int64)
    scores = np.full((B, k), -np.inf, np.float32)
    vidx = np.full((B, k), -1, np.int64)
    rows = np.full((B, k), -1, np.int64)
    if not cand_s:
        return seqs, scores, vidx, rows
    S, V, R, SC = (np.concatenate(x, axis=1) for x in (cand_s, cand_v, cand_r, cand_sc))
    for b in range(B):
        ok = np.flatnonzero(S[b] >= 0)
        order = ok[topk_order(S[b][ok], SC[b][ok], k)]
        m = order.size
        seqs[b, :m], scores[b, :m], vidx[b, :m], rows[b, :m] = S[b][order], SC[b][order], V[b][order], R[b][order]
    return seqs, scores, vidx, rows


def check_method(method: Any) -> str:
    if method not in DENSE_METHODS:
        raise ValueError(f"method must be one of {', '.join(repr(m) for m in DENSE_METHODS)}, got {method!r}")
    return method
