"""GPU/CPU parity: does the cupy backend return what the NumPy reference returns?

The cupy backend is designed to return the reference's results bit for bit
(same float32 additions in the same order, exact selection): ``exact_share``
should be 1.0 and every score difference 0. The tolerant measures below stay,
to say how far apart the backends are when they are not exact.

:func:`parity_report` runs both backends on one :class:`~gpuir.engine.BM25Index`
and reports

* ``exact_share``: share of queries whose ids and float32 scores are identical
  (scores compared up to the sign of zero);

* ``max_abs_dscore_topk``: the largest |score difference| rank by rank over the
  returned top-k (rank-wise, so a swap between tied documents costs nothing);
* ``max_abs_dscore_dense``: the largest |difference| over the dense (B, N) rows
  where both backends have a candidate, and ``candidate_mismatches``: entries
  that are a candidate (finite) in one backend and not the other (should be 0);
* ``topk_agree_share``: share of queries whose top-k agree **up to ties**
  (:func:`topk_agree`): same number of hits, same scores rank by rank within
  float32 tolerance, and the same set of documents among those scoring above the
  k-th score (plus tolerance) -- only documents tied with the k-th may differ;
* with qrels: nDCG@10 and Recall@100 of each backend and their differences
  (via :mod:`gpuir.metrics_core`, exponential gain as trec_eval).

The CLI is ``gpuir parity INDEX_DIR --queries Q.jsonl [-k 100] [--qrels QRELS.tsv]``;
it exits 2 with a message when no GPU can be used.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: Tolerance for "equal scores" between float32 backends.
RTOL, ATOL = 1e-5, 1e-6


from .backends import DeviceUnavailable
from .qrels import read_qrels

#: The parity check needs a usable CUDA device: the one "device unavailable" error.
NoGPUError = DeviceUnavailable


def topk_agree(
    ids_a: np.ndarray, scores_a: np.ndarray, ids_b: np.ndarray, scores_b: np.ndarray,
    rtol: float = RTOL, atol: float = ATOL,
) -> np.ndarray:
    """Whether two top-k results agree up to ties, per query.

    Parameters
    ----------
    ids_a, ids_b : ndarray, shape (B, k), int64, host
        Document numbers best first, -1 padding.
    scores_a, scores_b : ndarray, shape (B, k), float32, host
        Matching scores, -inf padding.
    rtol, atol : float
        Scores within ``atol + rtol * |s|`` count as equal.

    Returns
    -------
    ndarray, shape (B,), bool, host
    """
    ids_a, ids_b = np.asarray(ids_a), np.asarray(ids_b)
    sa, sb = np.asarray(scores_a, np.float64), np.asarray(scores_b, np.float64)
    if ids_a.shape != ids_b.shape or sa.shape != ids_a.shape or sb.shape != ids_b.shape:
        raise ValueError(f"results must have one shape, got {ids_a.shape} and {ids_b.shape}")
    out = np.zeros(ids_a.shape[0], dtype=bool)
    for i in range(ids_a.shape[0]):
        ma, mb = ids_a[i] >= 0, ids_b[i] >= 0
        n = int(ma.sum())
        if n != int(mb.sum()):
            continue
        if n == 0:
            out[i] = True
            continue
        ra, rb = sa[i][:n], sb[i][:n]
        if not np.allclose(ra, rb, rtol=rtol, atol=atol):
            continue
        kth = min(ra[-1], rb[-1])
        tol = atol + rtol * abs(kth)
        hi_a = set(ids_a[i][:n][ra > kth + tol].tolist())
        hi_b = set(ids_b[i][:n][rb > kth + tol].tolist())
        out[i] = hi_a == hi_b
    return out


def exact_rows(ids_a: np.ndarray, scores_a: np.ndarray, ids_b: np.ndarray, scores_b: np.ndarray) -> np.ndarray:
    """Per query: identical ids and identical float32 scores (up to the sign of zero).

    Parameters
    ----------
    ids_a, ids_b : ndarray, shape (B, k), int64, host
    scores_a, scores_b : ndarray, shape (B, k), float32, host

    Returns
    -------
    ndarray, shape (B,), bool, host
    """
    mag = np.uint32(0x7FFFFFFF)
    sa = np.ascontiguousarray(scores_a, np.float32).view(np.uint32) & mag
    sb = np.ascontiguousarray(scores_b, np.float32).view(np.uint32) & mag
    return np.all(np.asarray(ids_a) == np.asarray(ids_b), axis=1) & np.all(sa == sb, axis=1)


def _gold(index: Any, qids: Sequence[str], qrels: Mapping[str, Mapping[str, int]]) -> list[dict[int, int]]:
    id_to_num = index.id_to_num
    gold = []
    for q in qids:
        g: dict[int, int] = {}
        unknown = -2
        for doc, rel in qrels.get(q, {}).items():
            if doc in id_to_num:
                g[id_to_num[doc]] = int(rel)
            else:  # judged but not indexed: still counts as a relevant document
                g[unknown] = int(rel)
                unknown -= 1
        gold.append(g)
    return gold


def parity_report(
    index: Any,
    queries: list[str],
    k: int = 100,
    qrels: dict | None = None,
    query_ids: Sequence[str] | None = None,
    dense_rows_bytes: int = 256 << 20,
    **cupy_opts: Any,
) -> dict[str, Any]:
    """Compare the numpy and cupy backends on one index.

    Parameters
    ----------
    index : gpuir.engine.BM25Index
    queries : list of str
        Query texts.
    k : int
        Results per query (>= 1).
    qrels : dict, optional
        ``{query_id: {doc_id: grade}}``; query ids are ``query_ids`` (default
        "0", "1", ...), doc ids the index's user ids.
    query_ids : sequence of str, optional
    dense_rows_bytes : int
        Host bytes per batch of dense rows compared (the dense check costs
        B x N x 4 bytes per backend, so it goes in batches).
    **cupy_opts
        Passed to :class:`~gpuir.backends.cupy_backend.CupyScorer`
        (e.g. ``memory_budget_bytes``).

    Returns
    -------
    dict
        See the module docstring; also ``n_queries``, ``k``, ``device`` and
        ``timings`` of both backends.

    Raises
    ------
    NoGPUError
        No usable CUDA device (the message says why).
    """
    from ._compat import cuda_device
    from .backends import device_unavailable, make_scorer
    from .metrics_core import ndcg_at_k, recall_at_k, relevance_matrix

    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    usable, why = cuda_device()
    if not usable:
        raise device_unavailable(
            "the parity check compares the cupy backend with numpy", why,
            "Run it on a machine with an NVIDIA GPU and 'gpuir[gpu]' installed",
        )
    if query_ids is not None and len(query_ids) != len(queries):
        raise ValueError(f"query_ids has {len(query_ids)} entries for {len(queries)} queries")
    qids = [str(q) for q in query_ids] if query_ids is not None else [str(i) for i in range(len(queries))]
    terms = index.query_terms(queries)
    ref = make_scorer("numpy", index.csr, index.params)
    gpu = make_scorer("cupy", index.csr, index.params, **cupy_opts)
    r_np = ref.search(terms, int(k))
    r_cp = gpu.search(terms, int(k))
    both = (r_np.ids >= 0) & (r_cp.ids >= 0)
    d_topk = float(np.max(np.abs(r_np.scores[both] - r_cp.scores[both]), initial=0.0))
    agree = topk_agree(r_np.ids, r_np.scores, r_cp.ids, r_cp.scores)
    exact = exact_rows(r_np.ids, r_np.scores, r_cp.ids, r_cp.scores)

    N = max(1, index.csr.n_docs)
    step = max(1, int(dense_rows_bytes) // (4 * N))
    d_dense, mismatches = 0.0, 0
    for s in range(0, len(terms), step):
        a = ref.score_matrix(terms[s : s + step])
        b = gpu.score_matrix(terms[s : s + step])
        fa, fb = np.isfinite(a), np.isfinite(b)
        mismatches += int(np.count_nonzero(fa != fb))
        m = fa & fb
        if m.any():
            d_dense = max(d_dense, float(np.max(np.abs(a[m].astype(np.float64) - b[m]))))

    rep: dict[str, Any] = {
        "n_queries": len(queries),
        "k": int(k),
        "device": r_cp.meta.get("device"),
        "max_abs_dscore_topk": d_topk,
        "max_abs_dscore_dense": d_dense,
        "candidate_mismatches": mismatches,
        "exact_share": float(exact.mean()) if exact.size else 1.0,
        "topk_agree_share": float(agree.mean()) if agree.size else 1.0,
        "disagreeing_queries": [qids[i] for i in np.flatnonzero(~agree)[:20].tolist()],
        "timings": {"numpy": r_np.meta.get("timings"), "cupy": r_cp.meta.get("timings")},
    }
    if qrels is not None:
        gold = _gold(index, qids, qrels)
        scored = [i for i, g in enumerate(gold) if any(v >= 1 for v in g.values())]
        if scored:
            g = [gold[i] for i in scored]

            def ndcg10_recall100(ids):
                rel, ideal = relevance_matrix(ids, g)
                if rel.shape[1] < 100:  # cut-offs beyond k: padding counts as non-relevant
                    rel = np.pad(rel, ((0, 0), (0, 100 - rel.shape[1])))
                return {"ndcg@10": ndcg_at_k(rel, ideal, 10), "recall@100": recall_at_k(rel, ideal, 100)}

            m_np, m_cp = ndcg10_recall100(r_np.ids[scored]), ndcg10_recall100(r_cp.ids[scored])
            for name in ("ndcg@10", "recall@100"):
                a, b = float(m_np[name].mean()), float(m_cp[name].mean())
                rep[name] = {"numpy": a, "cupy": b, "delta": b - a}
        rep["n_queries_judged"] = len(scored)
        if k < 100:
            rep["note"] = f"recall@100 computed on k={k} results"
    return rep


# -- CLI ------------------------------------------------------------------------------
def _cmd_parity(args: argparse.Namespace) -> int:
    from ._compat import cuda_device
    from .engine import BM25Index
    from .jsonl import read_jsonl

    usable, why = cuda_device()
    if not usable:
        print(f"gpuir parity: no GPU can be used: {why}. The parity check compares the cupy "
              "backend with numpy; run it on a machine with an NVIDIA GPU and 'gpuir[gpu]'.",
              file=sys.stderr)
        return 2
    if args.k < 1:
        raise ValueError(f"-k must be a positive integer, got {args.k}")
    index = BM25Index.load(args.index_dir)
    qids, texts = [], []
    for _, obj in read_jsonl(args.queries, {"id": (str, int), "text": str}):
        qids.append(str(obj["id"]))
        texts.append(obj["text"])
    qrels = read_qrels(args.qrels) if args.qrels else None
    try:
        rep = parity_report(index, texts, k=args.k, qrels=qrels, query_ids=qids)
    except NoGPUError as e:
        print(f"gpuir parity: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rep, indent=2))
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``gpuir parity`` to the ``gpuir`` parser's subparsers."""
    p = subparsers.add_parser(
        "parity", help="compare the cupy backend with the numpy reference on an index (needs a GPU)",
        description="Compare the cupy backend with the NumPy reference on one saved index: the share of\n"
                    "queries with identical ids and float32 scores (should be 1.0), the largest score\n"
                    "differences, top-k agreement up to ties, and with --qrels nDCG@10 and Recall@100\n"
                    "of both. Exits 2 when no GPU can be used.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("index_dir", metavar="INDEX_DIR", help="an index saved by 'gpuir index'")
    p.add_argument("--queries", required=True, help='queries, JSON lines {"id": ..., "text": ...}')
    p.add_argument("-k", type=int, default=100, help="results per query (default: %(default)s)")
    p.add_argument("--qrels", default=None, help="qrels, TREC 4-column or BEIR 3-column TSV (default: none, no quality metrics)")
    p.set_defaults(func=_cmd_parity)
    return p
