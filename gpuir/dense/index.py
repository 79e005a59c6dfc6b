"""Dense vector index: exact inner product (NumPy / CuPy) or FAISS (flat, HNSW).

One :meth:`DenseIndex.search` for every kind, returning
:class:`~gpuir.results.SearchResults` with the per-query filters of
:mod:`gpuir.filters` (the same allow-lists as BM25) and the gpuir tie rule
(higher score, then lower document number).

=========  ==============================================================  ===========
kind       how                                                             exact?
=========  ==============================================================  ===========
exact      chunked matrix product + top-k on NumPy, or CuPy on the GPU      yes
flat       ``faiss.IndexFlatIP`` (filters through an ``IDSelectorBatch``)  yes (float32)
hnsw       ``faiss.IndexHNSWFlat`` with inner product (``M``, ``ef``)      approximate
=========  ==============================================================  ===========

Vectors are L2-normalised at build and query time unless ``normalize=False``,
so scores are cosine similarities. Every document is a candidate (unlike BM25):
rows are padded with -1 / -inf only when fewer than k documents pass the filter.
FAISS results are re-sorted by the tie rule, and a FAISS search is deepened
until it has returned every document tied with the k-th score, so the tie rule
(not FAISS) picks among them: ``flat`` returns the same ids as ``exact`` on
NumPy wherever the two compute the same float32 scores (FAISS's own inner
product may round a last bit differently from NumPy's matrix product, which can
only swap documents whose scores agree to about 1e-7).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._compat import optional_import
from ..backends import resolve_array_backend
from ..filters import allow_mask, normalize_filters
from ..results import SearchResults, padded_arrays
from ..topk import array_module as _xp
from ..topk import topk_pairs, topk_rows

__all__ = ["DenseIndex", "l2_normalize", "topk_rows"]


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm (zero rows left as they are). (n, d) float32, same device."""
    xp = _xp(x)
    n = xp.linalg.norm(x, axis=1, keepdims=True)
    return (x / xp.where(n > 0, n, 1)).astype(xp.float32)


class DenseIndex:
    """Inner-product search over document vectors.

    Parameters
    ----------
    vectors : ndarray, shape (N, d), float32
        Document vectors (document number = row).
    kind : {"exact", "flat", "hnsw"}, default "exact"
    backend : {"auto", "numpy", "numba", "cupy"}, default "auto"
        Device of the ``exact`` kind, resolved by
        :func:`gpuir.backends.resolve_array_backend` (``GPUIR_BACKEND``
        overrides ``auto``; "numba" runs on NumPy). FAISS kinds run on the CPU.
    normalize : bool, default True
        L2-normalise documents and queries (cosine similarity).
    ids : sequence of N str, optional
        User document ids, for string allow-lists in filters.
    hnsw_m : int, default 32
    ef_construction : int, default 200
    ef_search : int, default 128
    chunk_bytes : int, default 256 MiB
        Memory budget of one (queries x documents) score block of the exact kind.
    exact_below : int, default 4096
        FAISS kinds: a query whose allow-list has at most this many documents is
        answered exactly over those documents (pre-filtering), since a filtered
        HNSW walk can miss allowed documents when few are allowed.
    """

    def __init__(
        self,
        vectors: Any,
        kind: str = "exact",
        backend: str = "auto",
        normalize: bool = True,
        ids: Sequence[str] | None = None,
        hnsw_m: int = 32,
        ef_construction: int = 200,
        ef_search: int = 128,
        chunk_bytes: int = 256 << 20,
        exact_below: int = 4096,
    ):
        if kind not in ("exact", "flat", "hnsw"):
            raise ValueError(f"kind must be 'exact', 'flat' or 'hnsw', got {kind!r}")
        v = np.asarray(vectors.get() if hasattr(vectors, "get") else vectors, dtype=np.float32)
        if v.ndim != 2:
            raise ValueError(f"vectors must be (N, d), got shape {v.shape}")
        self.normalize = normalize
        self.vectors = l2_normalize(v) if normalize else np.ascontiguousarray(v)
        self.kind = kind
        self.n_docs, self.dim = self.vectors.shape
        self.doc_ids = list(ids) if ids is not None else None
        if self.doc_ids is not None and len(self.doc_ids) != self.n_docs:
            raise ValueError(f"{len(self.doc_ids)} ids for {self.n_docs} vectors")
        self._id_to_num: Mapping[str, int] | None = (
            {d: i for i, d in enumerate(self.doc_ids)} if self.doc_ids is not None else None
        )
        self.chunk_bytes = int(chunk_bytes)
        self.ef_search = int(ef_search)
        self.exact_below = int(exact_below)
        if kind == "exact":
            self.backend, self.backend_reason = resolve_array_backend(backend)
            self._dev = None
            if self.backend == "cupy":
                import cupy

                self._dev = cupy.asarray(self.vectors)
        else:
            self.backend, self.backend_reason = "faiss-cpu", "FAISS kinds run on the CPU"
            faiss = optional_import("faiss", "dense")
            if kind == "flat":
                self._faiss = faiss.IndexFlatIP(self.dim)
            else:
                self._faiss = faiss.IndexHNSWFlat(self.dim, int(hnsw_m), faiss.METRIC_INNER_PRODUCT)
                self._faiss.hnsw.efConstruction = int(ef_construction)
            if self.n_docs:
                self._faiss.add(self.vectors)

    def __len__(self) -> int:
        return self.n_docs

    def score_matrix(self, query_vecs: Any) -> np.ndarray:
        """Exact inner products of every document, (B, N) float32, host (for checks and fusion)."""
        q = self._queries(query_vecs)
        return q @ self.vectors.T

    def _queries(self, query_vecs: Any) -> np.ndarray:
        q = np.asarray(query_vecs.get() if hasattr(query_vecs, "get") else query_vecs, dtype=np.float32)
        if q.ndim == 1:
            q = q[None, :]
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise ValueError(f"query vectors must be (B, {self.dim}), got shape {q.shape}")
        return l2_normalize(q) if self.normalize else q

    def search(self, query_vecs: Any, k: int, filters: Any = None) -> SearchResults:
        """Top-k documents by inner product.

        Parameters
        ----------
        query_vecs : ndarray, shape (B, d) or (d,), float32 (host or CuPy)
        k : int
            Results per query (>= 1); may exceed the number of documents.
        filters : see :func:`gpuir.filters.normalize_filters`
            None, one mask / allow-list for all queries, or one per query.

        Returns
        -------
        SearchResults, ids (B, k) int64 and scores (B, k) float32 on the host;
        ``meta`` names the kind, backend and time.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        t0 = time.perf_counter()
        q = self._queries(query_vecs)
        B = q.shape[0]
        allow = normalize_filters(filters, B, self.n_docs, self._id_to_num)
        if self.kind == "exact":
            ids, sc = self._search_exact(q, k, allow)
        else:
            ids, sc = self._search_faiss(q, k, allow)
        res = SearchResults(ids, sc)
        res.meta.update(
            {"kind": self.kind, "backend": self.backend, "backend_reason": self.backend_reason,
             "search_s": time.perf_counter() - t0}
        )
        return res

    def _search_exact(self, q: np.ndarray, k: int, allow) -> tuple[np.ndarray, np.ndarray]:
        B, N = q.shape[0], self.n_docs
        ids, sc = padded_arrays(B, k)
        if N == 0 or B == 0:
            return ids, sc
        if self.backend == "cupy":
            import cupy as xp

            docs = self._dev
        else:
            xp, docs = np, self.vectors
        step = max(1, self.chunk_bytes // (4 * max(N, 1)))
        for b0 in range(0, B, step):
            b1 = min(B, b0 + step)
            qs = xp.asarray(q[b0:b1])
            S = qs @ docs.T  # (b, N) float32
            if allow is not None:
                S = xp.where(xp.asarray(allow_mask(allow[b0:b1], N)), S, -xp.inf)
            cid, csc = topk_rows(S, k)
            if xp is not np:
                cid, csc = cid.get(), csc.get()
            ids[b0:b1], sc[b0:b1] = cid, csc
        return ids, sc

    def _search_faiss(self, q: np.ndarray, k: int, allow) -> tuple[np.ndarray, np.ndarray]:
        faiss = optional_import("faiss", "dense")
        B = q.shape[0]
        ids, sc = padded_arrays(B, k)
        if self.n_docs == 0 or B == 0:
            return ids, sc

        def params(depth, sel=None):
            if self.kind == "hnsw":
                p = faiss.SearchParametersHNSW()
                p.efSearch = max(self.ef_search, depth)
            else:
                p = faiss.SearchParameters()
            if sel is not None:
                p.sel = sel
            return p

        if allow is None:
            groups = [(np.arange(B), None)]
        else:
            groups = []
            plain = [i for i in range(B) if allow[i] is None]
            if plain:
                groups.append((np.asarray(plain), None))
            for i in range(B):
                if allow[i] is not None:
                    groups.append((np.asarray([i]), allow[i]))
        for rows, al in groups:
            if al is not None and al.size == 0:
                continue
            if al is not None and al.size <= self.exact_below:
                # small allow-list: exact scores over the allowed documents (what a
                # filtered HNSW walk would approximate, and may miss)
                S = q[rows] @ self.vectors[al].T
                cid, csc = topk_rows(S, k, col_ids=al)
                ids[rows], sc[rows] = cid, csc
                continue
            sel = faiss.IDSelectorBatch(al) if al is not None else None
            avail = self.n_docs if al is None else int(al.size)
            kk = min(k, avail)
            depth = min(avail, kk + 1)  # one more: says whether a tie at the kk-th goes on
            D, I = self._faiss.search(q[rows], depth, params=params(depth, sel))
            for r, drow, irow in zip(rows.tolist(), D, I):
                ok = irow >= 0
                d, i = drow[ok], irow[ok].astype(np.int64)
                if kk < d.size == depth < avail and d[-1] == d[kk - 1]:
                    d, i = self._faiss_tied(q[r: r + 1], kk, avail, lambda depth, sel=sel: params(depth, sel))
                i, d = topk_pairs(i, d, k)
                ids[r, : i.size] = i
                sc[r, : d.size] = d
        return ids, sc

    def _faiss_tied(self, q1: np.ndarray, kk: int, avail: int, params) -> tuple[np.ndarray, np.ndarray]:
        """One query's FAISS hits, deepened until no document tied with the ``kk``-th is left out.

        FAISS returns some ``kk`` of the documents tied at the ``kk``-th score;
        asking for more until the last score returned is below the ``kk``-th
        (or every document is returned) gives all of them, so the tie rule
        (lower document number) picks exactly as the NumPy path does.

        Returns
        -------
        (scores, doc numbers) : ndarrays (m,), float32 / int64, host, m >= kk unless fewer exist.
        """
        depth = min(avail, 2 * (kk + 1))
        while True:
            D, I = self._faiss.search(q1, depth, params=params(depth))
            ok = I[0] >= 0
            d, i = D[0][ok], I[0][ok].astype(np.int64)
            if d.size < kk or depth >= avail or d[-1] < d[kk - 1]:
                return d, i
            depth = min(avail, depth * 2)
