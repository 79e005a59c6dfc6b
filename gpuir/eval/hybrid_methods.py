"""The dense-row evaluation methods: ``dense``, ``late``, ``rrf``, ``agent_rrf`` and ``hybrid-fusion``.

Each channel is a dense score row per question over the data set's documents
(``(B, N)`` float32, -inf outside the question's haystack), cached per data
set and question list; fusion runs over the rows (:mod:`gpuir.fusion`). These
methods cover what the :class:`gpuir.Retriever`-based ``fusion`` method
(:mod:`gpuir.eval.retriever_methods`) does not run: early dense retrieval (a
session encoded whole) and agent-aware RRF with per-haystack dates. They
moved here from ``gpuir/hybrid.py`` (evaluation code lives in ``gpuir/eval``).

Channels
--------
* ``bm25``: session-level BM25 (:func:`gpuir.eval.runner.bm25_index`).
* ``dense``: the session text encoded as one passage ("early": truncated at the
  encoder's max_seq_length, 256 word pieces for MiniLM).
* ``late``: every turn encoded; session score = pooling of its turns' cosine
  similarities (:mod:`gpuir.dense.late_interaction`).
* ``bm25_turn``: turn-level BM25 pooled per session.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..dense.encoder import get_encoder
from ..fusion import fuse
from ..results import SearchResults, padded_arrays

#: The second channel and fusion of ``hybrid-fusion`` when not given.
DEFAULT_FUSION: dict[str, Any] = {"fusion": "z", "dense_mode": "bm25_turn", "pooling": "max", "alpha": 0.6}


def split_turns(text: str, skip_first_line: bool = False) -> list[str]:
    """Turns of a session text whose turns are joined by newlines (non-empty lines).

    Parameters
    ----------
    text : str
    skip_first_line : bool
        Drop the first line (a date header).

    Returns
    -------
    list of str (possibly empty)
    """
    lines = text.split("\n")
    if skip_first_line:
        lines = lines[1:]
    return [ln for ln in lines if ln.strip()]




def _days(dt) -> float:
    return float("nan") if dt is None else dt.timestamp() / 86400.0


def dataset_turns(ds) -> tuple[list[str], np.ndarray]:
    """Turns of every document of an evaluation data set, and each turn's document.

    LoCoMo sessions hold one turn per line (``"speaker: text"``; the date line,
    when the loader was asked for dates, is dropped). LongMemEval sessions hold
    the chosen roles' turns joined by newlines, and a turn may itself span lines:
    there the units are the non-empty lines (a finer split than turns).

    Returns
    -------
    turn_texts : list of T str
    turn_doc : ndarray, shape (T,), int64
        Document number of each turn.
    """
    skip = bool(getattr(ds, "options", {}).get("dates")) and ds.name == "locomo"
    per = [split_turns(t, skip_first_line=skip) for t in ds.doc_texts]
    return [t for ts in per for t in ts], np.repeat(np.arange(len(per)), [len(ts) for ts in per]).astype(np.int64)


class _Channels:
    """Cache of channel score rows for the evaluation methods, per (data set, questions).

    Keys name the data set by ``id(ds)`` and the questions by their ids; each
    entry also holds the data set itself, so its ``id`` cannot be reused by
    another object while the entry lives (at most 16 entries).
    """

    def __init__(self):
        self.store: dict[tuple, tuple[Any, Any]] = {}

    def get(self, key, make, ds=None):
        hit = self.store.get(key)
        if hit is not None and (ds is None or hit[0] is ds):
            return hit[1]
        if len(self.store) > 16:
            self.store.pop(next(iter(self.store)))
        value = make()
        self.store[key] = (ds, value)
        return value


def _qkey(queries) -> tuple:
    """The identity of a list of questions (their ids, in order)."""
    return tuple(getattr(q, "qid", q) for q in queries)


_CACHE = _Channels()


def _needed_docs(ds, queries) -> np.ndarray:
    filters = ds.candidate_filters(queries)
    if filters is None or any(f is None for f in filters):
        return np.arange(ds.n_docs)
    return np.unique(np.concatenate(filters))


def _mask_rows(M: np.ndarray, filters) -> np.ndarray:
    if filters is None:
        return M
    out = np.full_like(M, -np.inf)
    for i, f in enumerate(filters):
        if f is None:
            out[i] = M[i]
        else:
            out[i, f] = M[i, f]
    return out


def bm25_rows(ds, queries, *, backend="auto", analyzer="default", k1=1.2, b=0.75, progress=False):
    """Session-level BM25 score rows (B, N) float32, -inf outside each question's haystack."""
    from .runner import bm25_index

    def make():
        idx = bm25_index(ds, analyzer, progress=progress).with_params(k1=float(k1), b=float(b))
        filters = ds.candidate_filters(queries)
        t0 = time.perf_counter()
        sc = idx.scorer(backend)
        rows = []
        for s in range(0, len(queries), 256):
            terms = idx.query_terms([q.text for q in queries[s: s + 256]])
            rows.append(sc.score_matrix(terms, None if filters is None else filters[s: s + 256]))
        M = np.concatenate(rows) if rows else np.zeros((0, ds.n_docs), np.float32)
        return M, time.perf_counter() - t0

    return _CACHE.get(("bm25", id(ds), _qkey(queries), analyzer, k1, b, backend), make, ds)


def _encoder_rows(ds, queries, encoder, progress):
    enc = get_encoder(encoder)
    enc.show_progress = bool(progress)
    t0 = time.perf_counter()
    q = enc.encode_queries([x.text for x in queries])
    return enc, q, time.perf_counter() - t0


def dense_rows(ds, queries, *, encoder=None, backend="auto", progress=False):
    """Early dense rows: cosine of the question with each session text encoded whole. (B, N) float32."""

    def make():
        enc, q, tq = _encoder_rows(ds, queries, encoder, progress)
        need = _needed_docs(ds, queries)
        t0 = time.perf_counter()
        vecs = enc.encode_passages([ds.doc_texts[i] for i in need])
        te = time.perf_counter() - t0
        t0 = time.perf_counter()
        M = np.full((len(queries), ds.n_docs), -np.inf, np.float32)
        M[:, need] = q @ vecs.T
        M = _mask_rows(M, ds.candidate_filters(queries))
        return M, {"encode_queries_s": tq, "encode_docs_s": te, "score_s": time.perf_counter() - t0,
                   "encoder": enc.model_name, "n_encoded_docs": int(need.size)}

    return _CACHE.get(("dense", id(ds), _qkey(queries), encoder), make, ds)


def turn_vectors(ds, queries, *, encoder=None, progress=False):
    """Turn vectors of the sessions the questions can see, and the turn -> session map."""

    def make():
        enc = get_encoder(encoder)
        enc.show_progress = bool(progress)
        texts, doc = dataset_turns(ds)
        need = _needed_docs(ds, queries)
        keep = np.isin(doc, need)
        texts = [t for t, k in zip(texts, keep) if k]
        doc = doc[keep]
        t0 = time.perf_counter()
        vecs = enc.encode_passages(texts)
        return vecs, doc, time.perf_counter() - t0

    return _CACHE.get(("turns", id(ds), _qkey(queries), encoder), make, ds)


def late_rows(ds, queries, *, encoder=None, pooling="max", pool_k=3, beta=10.0, backend="auto", progress=False):
    """Late-interaction rows: turn similarities pooled per session. (B, N) float32, -inf outside haystacks."""
    from ..backends import resolve_array_backend
    from ..dense.late_interaction import segment_reduce, segments_from_labels

    def sims():
        _enc, q, tq = _encoder_rows(ds, queries, encoder, progress)
        vecs, doc, te = turn_vectors(ds, queries, encoder=encoder, progress=progress)
        return q, vecs, doc, tq, te

    q, vecs, doc, tq, te = _CACHE.get(("sims", id(ds), _qkey(queries), encoder), sims, ds)

    def make():
        be, _ = resolve_array_backend(backend, q)
        order, offsets = segments_from_labels(doc)
        offsets = np.concatenate([offsets, np.full(ds.n_docs + 1 - offsets.size, offsets[-1], np.int64)])
        v = vecs[order]
        t_score = t_pool = 0.0
        rows = []
        step = max(1, (64 << 20) // (4 * max(1, v.shape[0])))
        for s in range(0, len(queries), step):
            t0 = time.perf_counter()
            S = q[s: s + step] @ v.T
            t1 = time.perf_counter()
            P = segment_reduce(S, offsets, pooling, pool_k=pool_k, beta=beta, backend=be)
            rows.append(P.get() if hasattr(P, "get") else P)
            t_score += t1 - t0
            t_pool += time.perf_counter() - t1
        M = np.concatenate(rows).astype(np.float32)
        M = _mask_rows(M, ds.candidate_filters(queries))
        return M, {"encode_queries_s": tq, "encode_turns_s": te, "score_s": t_score, "pool_s": t_pool,
                   "encoder": get_encoder(encoder).model_name, "n_turns": int(v.shape[0]), "pooling": pooling,
                   "pool_backend": be}

    return _CACHE.get(("late", id(ds), _qkey(queries), encoder, pooling, pool_k, beta, backend), make, ds)


def _rows_to_run(M: np.ndarray, k: int, meta: dict):
    from ..backends.base import topk_from_dense
    from .runner import Run

    r = topk_from_dense(M, k)
    return Run(r.ids, r.scores, meta)


def bm25_turn_rows(ds, queries, *, pooling="max", pool_k=2, beta=1.0, backend="auto", analyzer="default"):
    """BM25 turn-level late interaction rows: each session scored by its best turns under BM25.

    A BM25 index over the turns (:func:`dataset_turns`) scores every turn of the
    question's haystack; :func:`gpuir.dense.late_interaction.bm25_turn_late_interaction`
    pools them per session. (B, N) float32, -inf outside haystacks and for
    sessions without any matching turn.
    """
    from ..dense.late_interaction import bm25_turn_late_interaction
    from ..engine import BM25Index

    def index():
        texts, doc = dataset_turns(ds)
        t0 = time.perf_counter()
        idx = BM25Index.build(texts, analyzer=analyzer, progress=False)
        return idx, doc, time.perf_counter() - t0

    idx, doc, t_index = _CACHE.get(("turn_index", id(ds), analyzer), index, ds)

    def make():
        filters = ds.candidate_filters(queries)
        t0 = time.perf_counter()
        sc = idx.scorer(backend)
        rows = []
        for s in range(0, len(queries), 256):
            sub = queries[s: s + 256]
            allow = None
            if filters is not None:
                allow = [None if f is None else np.flatnonzero(np.isin(doc, f)) for f in filters[s: s + 256]]
            T = sc.score_matrix(idx.query_terms([q.text for q in sub]), allow)
            rows.append(T)
        T = np.concatenate(rows)
        t1 = time.perf_counter()
        P = bm25_turn_late_interaction(T, doc, n_sessions=ds.n_docs, op=pooling, pool_k=pool_k, beta=beta)
        P = _mask_rows(P, filters)
        return P, {"bm25_turn_index_s": t_index, "bm25_turn_score_s": t1 - t0,
                   "pool_s": time.perf_counter() - t1, "pooling": pooling, "n_turns": int(doc.size)}

    return _CACHE.get(("bm25_turn", id(ds), _qkey(queries), pooling, pool_k, beta, backend, analyzer), make, ds)


def _dense_channel(ds, queries, dense_mode, encoder, pooling, pool_k, beta, backend, progress):
    if dense_mode == "bm25_turn":
        return bm25_turn_rows(ds, queries, pooling=pooling, pool_k=pool_k, beta=beta, backend=backend)
    if dense_mode == "early":
        return dense_rows(ds, queries, encoder=encoder, backend=backend, progress=progress)
    return late_rows(ds, queries, encoder=encoder, pooling=pooling, pool_k=pool_k, beta=beta,
                     backend=backend, progress=progress)


def _query_days(ds, queries) -> np.ndarray:
    return np.array([_days(q.date) for q in queries], dtype=np.float64)


def _doc_days(ds, queries) -> tuple[np.ndarray | None, list[np.ndarray] | None]:
    """Document times in days: one per document (LoCoMo) or per question and haystack slot (LongMemEval)."""
    if any(d is not None for d in ds.doc_dates):
        return np.array([_days(d) for d in ds.doc_dates]), None
    per_q = []
    idx = ds.doc_index
    for q in queries:
        t = np.full(ds.n_docs, np.nan)
        hd = q.meta.get("haystack_dates")
        if hd and q.candidates:
            for d, dt in zip(q.candidates, hd):
                t[idx[d]] = _days(dt)
        per_q.append(t)
    return None, per_q


def fuse_rows(method: str, bm25: np.ndarray, dense: np.ndarray, k: int, *, alpha=0.5, ds=None, queries=None,
              tau=30.0, recency=0.005, k_rrf=60.0, missing="min") -> SearchResults:
    """Fuse BM25 and dense rows with a named method; agent_rrf takes times from the data set."""
    if method in ("z", "minmax"):
        return fuse([bm25, dense], k, method=method, alpha=alpha, missing=missing)
    if method in ("rrf", "weighted_rrf"):
        return fuse([bm25, dense], k, method=method, k_rrf=k_rrf)
    if method == "agent_rrf":
        qt = _query_days(ds, queries)
        shared, per_q = _doc_days(ds, queries)
        if shared is not None:
            return fuse([bm25, dense], k, method="agent_rrf", doc_times=shared, query_times=qt,
                        recency_weight=recency, tau=tau, k_rrf=k_rrf)
        out_ids, out_sc = [], []
        # times differ per question (LongMemEval): one fusion call per question
        for i in range(len(queries)):
            r = fuse([bm25[i: i + 1], dense[i: i + 1]], k, method="agent_rrf", doc_times=per_q[i],
                     query_times=qt[i: i + 1], recency_weight=recency, tau=tau, k_rrf=k_rrf)
            out_ids.append(r.ids)
            out_sc.append(r.scores)
        return SearchResults(np.concatenate(out_ids), np.concatenate(out_sc))
    raise ValueError(f"unknown fusion {method!r}")


def _per_query_metric(ds, queries, ranked: np.ndarray, metric: str) -> np.ndarray:
    from .metrics import compute_metrics

    idx = ds.doc_index
    gold = [{idx.get(d, -2 - j): r for j, (d, r) in enumerate(q.gold.items())} for q in queries]
    cut = int(metric.split("@")[1]) if "@" in metric else 10
    pq = compute_metrics(ranked, gold, cutoffs=(cut,), metrics=(metric.split("@")[0],))
    v = pq[metric]
    scored = np.array([q.scored for q in queries])
    return np.where(scored, v, np.nan)


def loco_alpha_run(ds, queries, bm25, dense, k, method="z", alphas=None, metric=None, missing="min"):
    """Fuse with alpha chosen per held-out group (leave-one-conversation-out) on the other groups' questions.

    Returns
    -------
    (SearchResults, dict) -- the run, and ``alpha_per_group`` plus the grid.
    """
    from .stats import leave_one_group_out

    alphas = list(alphas if alphas is not None else np.round(np.arange(0.0, 1.0001, 0.05), 2))
    metric = metric or ("hit@1" if ds.name == "locomo" else "recall_all@5")
    runs = {a: fuse_rows(method, bm25, dense, k, alpha=a, missing=missing) for a in alphas}
    scored = np.array([q.scored for q in queries])
    groups = np.array([q.group for q in queries])
    per = {a: _per_query_metric(ds, queries, runs[a].ids, metric)[scored] for a in alphas}
    lo = leave_one_group_out(per, groups[scored])
    chosen = dict(lo["chosen"])
    ids, sc = padded_arrays(len(queries), k)
    default = lo["best_overall"]
    for i, g in enumerate(groups):
        a = chosen.get(g, default)  # unscored questions' groups: the overall choice (never scored)
        ids[i], sc[i] = runs[a].ids[i], runs[a].scores[i]
    return SearchResults(ids, sc), {"alpha_per_group": chosen, "alphas": alphas, "select_metric": metric,
                                    "heldout_mean": lo["mean"]}


# --------------------------------------------------------------------------- registration


def _dense_args(p) -> None:
    g = p.add_argument_group("dense / late / fusion methods")
    g.add_argument("--encoder", default=None, metavar="NAME_OR_PATH",
                   help="sentence-transformers model name or folder (default: the shipped all-MiniLM-L6-v2)")
    g.add_argument("--pooling", default=None, choices=("max", "mean", "topk", "lse", "lme"),
                   help="late-interaction pooling (default: max)")
    g.add_argument("--pool-k", type=int, default=3, help="turns averaged by topk pooling (default: 3)")
    g.add_argument("--lse-beta", type=float, default=10.0, help="lse/lme temperature (default: 10)")
    g.add_argument("--dense-mode", default=None, choices=("late", "early", "bm25_turn"),
                   help="second channel of the fusion methods: dense late interaction, dense early "
                        "(session encoded whole) or BM25 turn-level late interaction "
                        "(default: fusion bm25_turn, rrf/agent_rrf late)")
    g.add_argument("--alpha", default=None,
                   help="BM25 weight of z/min-max fusion, a float or 'loco' (leave-one-conversation-out); "
                        "for agent_rrf: the recency weight (default 0.005)")
    g.add_argument("--fusion-norm", default=None, choices=("z", "minmax"), help="fusion method's normalisation (default z)")
    g.add_argument("--tau-days", type=float, default=30.0, help="agent_rrf recency decay in days (default 30)")
    g.add_argument("--k-rrf", type=float, default=60.0, help="RRF constant (default 60)")


def _dense_from_args(a) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, key in (("encoder", "encoder"), ("pooling", "pooling"), ("dense_mode", "dense_mode"),
                      ("fusion_norm", "norm")):
        v = getattr(a, name, None)
        if v is not None:
            out[key] = v
    if getattr(a, "alpha", None) is not None:
        out["alpha"] = a.alpha if a.alpha == "loco" else float(a.alpha)
    out["pool_k"] = a.pool_k
    out["beta"] = a.lse_beta
    out["tau"] = a.tau_days
    out["k_rrf"] = a.k_rrf
    return out


def _register() -> None:
    try:
        from .runner import Run, register_method
    except ImportError:  # pragma: no cover - the harness is optional
        return

    common = {"add_arguments": _dense_args, "from_args": _dense_from_args}

    @register_method("dense", help="dense retrieval: each session encoded whole (early)", **common)
    def dense_method(ds, queries, k, *, backend="auto", progress=False, encoder=None, **_):
        t0 = time.perf_counter()
        M, meta = dense_rows(ds, queries, encoder=encoder, backend=backend, progress=progress)
        return _rows_to_run(M, k, {"timings": {**{x: y for x, y in meta.items() if x.endswith("_s")},
                                               "total_s": time.perf_counter() - t0},
                                   "encoder": meta["encoder"], "backend": "numpy"})

    @register_method("late", help="dense late interaction: turn similarities pooled per session", **common)
    def late_method(ds, queries, k, *, backend="auto", progress=False, encoder=None, pooling="max",
                    pool_k=3, beta=10.0, **_):
        t0 = time.perf_counter()
        M, meta = late_rows(ds, queries, encoder=encoder, pooling=pooling, pool_k=pool_k, beta=beta,
                            backend=backend, progress=progress)
        return _rows_to_run(M, k, {"timings": {**{x: y for x, y in meta.items() if x.endswith("_s")},
                                               "total_s": time.perf_counter() - t0},
                                   **{x: y for x, y in meta.items() if not x.endswith("_s")}})

    def _fused(name, ds, queries, k, backend, progress, encoder, pooling, pool_k, beta, dense_mode, alpha,
               norm, tau, k_rrf):
        t0 = time.perf_counter()
        B, tb = bm25_rows(ds, queries, backend=backend, progress=progress)
        D, meta = _dense_channel(ds, queries, dense_mode, encoder, pooling, pool_k, beta, backend, progress)
        t1 = time.perf_counter()
        info: dict[str, Any] = {}
        if name == "fusion":
            if alpha == "loco":
                res, info = loco_alpha_run(ds, queries, B, D, k, method=norm)
            else:
                res = fuse_rows(norm, B, D, k, alpha=float(alpha))
        elif name == "agent_rrf":
            res = fuse_rows("agent_rrf", B, D, k, ds=ds, queries=queries, tau=tau,
                            recency=0.005 if alpha is None else float(alpha), k_rrf=k_rrf)
        else:
            res = fuse_rows("rrf", B, D, k, k_rrf=k_rrf)
        t_f = time.perf_counter() - t1
        timings = {"bm25_score_s": tb, **{x: y for x, y in meta.items() if x.endswith("_s")},
                   "fusion_s": t_f, "total_s": time.perf_counter() - t0}
        from ..backends import resolve_backend

        be, why = resolve_backend(backend)
        return Run(res.ids, res.scores, {
            "backend": be, "backend_reason": f"BM25 channel: {why}; fusion on the host",
            "timings": timings, "fusion": name if name != "fusion" else norm, "alpha": alpha,
            "dense_mode": dense_mode, **info, **{x: y for x, y in meta.items() if not x.endswith("_s")}})

    @register_method("hybrid-fusion", help="BM25 + a second channel over dense score rows (early dense too); "
                     "the Retriever-based fusion method replaces it", **common)
    def fusion_method(ds, queries, k, *, backend="auto", progress=False, encoder=None,
                      pooling=DEFAULT_FUSION["pooling"], pool_k=3, beta=10.0,
                      dense_mode=DEFAULT_FUSION["dense_mode"], alpha=DEFAULT_FUSION["alpha"],
                      norm=DEFAULT_FUSION["fusion"], tau=30.0, k_rrf=60.0, **_):
        return _fused("fusion", ds, queries, k, backend, progress, encoder, pooling, pool_k, beta, dense_mode,
                      alpha, norm, tau, k_rrf)

    @register_method("rrf", help="BM25 + dense, reciprocal rank fusion (k=60)", **common)
    def rrf_method(ds, queries, k, *, backend="auto", progress=False, encoder=None, pooling="max", pool_k=3,
                   beta=10.0, dense_mode="late", tau=30.0, k_rrf=60.0, **_):
        return _fused("rrf", ds, queries, k, backend, progress, encoder, pooling, pool_k, beta, dense_mode,
                      None, "z", tau, k_rrf)

    @register_method("agent_rrf", help="RRF + recency bonus alpha*exp(-dt/tau) (alpha=0.005, tau=30 days)",
                     **common)
    def agent_rrf_method(ds, queries, k, *, backend="auto", progress=False, encoder=None, pooling="max",
                         pool_k=3, beta=10.0, dense_mode="late", alpha=None, tau=30.0, k_rrf=60.0, **_):
        return _fused("agent_rrf", ds, queries, k, backend, progress, encoder, pooling, pool_k, beta,
                      dense_mode, alpha, "z", tau, k_rrf)


_register()
