"""A memory's hybrid ranking: its BM25 and a stored embedding's cosine, fused; scores as calibrated relevance.

``Memory(ranking="hybrid")`` (or ``search(..., ranking="hybrid")`` on a memory
with an embedding) answers a question that shares no word with the record it
needs ("where does Alice live?" -> "I moved to Berlin"), which BM25 alone
cannot. What :meth:`gpuir.Memory.search` then does for each question:

1. the memory's BM25 top :data:`DEPTH` (``ranking="bm25"``, exact, the same
   ``where``) and the exact cosine top :data:`DEPTH` of the stored vectors
   (:meth:`gpuir.Memory.search_vectors`; the question is encoded by the
   embedding's encoder), both from one snapshot;
2. the two lists fused by :func:`gpuir.fusion.fuse` (the one fusion of gpuir;
   method :data:`FUSION`, BM25 weight :data:`ALPHA`), top k;
3. each hit's **score is its relevance**: a calibrated probability, between 0
   and 1, that the hit is a record the question needs -- a logistic map
   (:data:`RELEVANCE`) of the hit's cosine, its fused score and the log of the
   number of records the question may see (the memory's live records, or those
   its ``where`` allows: in a memory of five records the best hit is likelier
   the one needed than in one of five thousand), made non-increasing down the
   list (a hit never scores above one ranked before it). ``min_score`` is on this scale: ``min_score=0.5`` keeps the hits at
   least as likely relevant as not.

How the numbers were chosen (``bench/hybrid_select.py``, results in
``bench/results/hybrid_select_locomo.json``): on LoCoMo's 5,882 turns as
records (one tenant per conversation) and its 1,982 questions with evidence,
leave-one-conversation-out over a small grid (z-score or reciprocal-rank
fusion, the BM25 weight, the candidate depth): among the settings that lose
no more than 0.01 of BM25's overall record and session Hit@1 on the training
conversations, the best on the training questions that share no content word
with their evidence turns. The relevance map was fitted on the top 10 hits
of that setting in memories of several sizes (each question's whole
conversation, 369 to 689 turns, and random subsets of 3, 10, 30 and 100 of
them, each a memory of its own, once holding one of its evidence turns and
once none), label "the hit is one of the question's evidence turns";
its precision at the documented thresholds, measured on held-out
conversations, is in ``docs/memory.md``. It is calibrated for the shipped
all-MiniLM-L6-v2 (:class:`gpuir.dense.encoder.Encoder`) on conversational
records; with another encoder the scale is still 0-1 and monotone, but not
calibrated.

``ranking="bm25"`` is the memory's search as it always was: exact BM25
scores, bit for bit on every engine.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..fusion import fuse
from ..results import SearchResults

__all__ = ["ALPHA", "DEFAULT_EMBEDDING", "DEPTH", "FUSION", "N_RANGE", "RANKINGS", "RELEVANCE", "check_ranking",
           "hybrid_search", "relevance"]

#: What :meth:`gpuir.Memory.search` ranks by: BM25 alone, or BM25 and the embedding fused.
RANKINGS = ("bm25", "hybrid")
#: The embedding ``Memory(ranking="hybrid")`` creates when given none (the torch-free all-MiniLM-L6-v2).
DEFAULT_EMBEDDING = "minilm"
#: Fusion of the two lists (:func:`gpuir.fusion.fuse` method), chosen held out (module docstring).
FUSION = "z"
#: Weight of the BM25 list (the cosine list's is ``1 - ALPHA``).
ALPHA = 0.6
#: Candidates taken from each list (at least k).
DEPTH = 20
#: Logistic map to relevance: ``1 / (1 + exp(-(b0 + b1 * cosine + b2 * fused + b3 * log(n))))``, ``n`` the
#: records the question may see (its ``where``), fitted on LoCoMo (module docstring).
RELEVANCE = (-3.9651, 4.7936, 1.2616, -0.4858)
#: The memory sizes the map was fitted on: ``n`` is clamped to this range (the nearest size calibrated).
N_RANGE = (3.0, 689.0)


def check_ranking(ranking: Any) -> str:
    """``ranking`` checked: one of :data:`RANKINGS`."""
    if ranking not in RANKINGS:
        raise ValueError(f"ranking must be one of {', '.join(map(repr, RANKINGS))}, got {ranking!r}")
    return ranking


def relevance(cosine: np.ndarray, fused: np.ndarray, n: np.ndarray,
              coef: tuple[float, float, float, float] = RELEVANCE,
              n_range: tuple[float, float] = N_RANGE) -> np.ndarray:
    """Calibrated relevance of ranked hits, non-increasing along each row.

    Parameters
    ----------
    cosine : ndarray, shape (B, k), float
        Each hit's cosine with the question (NaN at padding).
    fused : ndarray, shape (B, k), float
        Each hit's fused score, rows in rank order (NaN at padding).
    n : ndarray, shape (B,), int or float
        How many records each question may see, clamped to ``n_range``.
    coef : (b0, b1, b2, b3)
        Logistic coefficients (:data:`RELEVANCE`).
    n_range : (low, high)
        The sizes calibrated (:data:`N_RANGE`).

    Returns
    -------
    ndarray, shape (B, k), float64
        In (0, 1); NaN at padding; each row's running minimum of the logistic map.
    """
    b0, b1, b2, b3 = (float(c) for c in coef)
    logn = np.log(np.clip(np.asarray(n, np.float64), *n_range)).reshape(-1, 1)
    z = b0 + b1 * np.asarray(cosine, np.float64) + b2 * np.asarray(fused, np.float64) + b3 * logn
    p = 1.0 / (1.0 + np.exp(-np.clip(z, -500.0, 500.0)))
    pad = np.isnan(p)
    out = np.minimum.accumulate(np.where(pad, np.inf, p), axis=1)
    return np.where(pad, np.nan, out)


def _channel(res) -> SearchResults:
    """A MemoryResults as a fusion channel over sequence numbers (add order: the tie rule's order)."""
    ids = res.seqs.astype(np.int64)
    return SearchResults(ids, np.where(ids >= 0, res.scores, -np.inf).astype(np.float32))


def hybrid_search(mem: Any, emb: Any, queries: list[str], k: int, where: Any, backend: str, snap: Any,
                  min_score: float | None, time_unit: str | None, results_cls: Any) -> Any:
    """:meth:`gpuir.Memory.search` with ``ranking="hybrid"`` (module docstring).

    Parameters
    ----------
    mem : gpuir.Memory
    emb : gpuir.memory.embeddings.Embedding
        The embedding whose stored vectors are searched (its encoder encodes the questions).
    queries : list of B str
    k : int, >= 1
    where, backend, time_unit : as :meth:`gpuir.Memory.search`
    snap : Snapshot
        The one state both lists are read from.
    min_score : float in [0, 1] or None
        Drop hits whose relevance is below it.
    results_cls : type
        :class:`gpuir.memory.search.MemoryResults`.

    Returns
    -------
    MemoryResults
        ``seqs`` (B, k) int64 in fused order (-1 pads), ``scores`` (B, k) float32 relevance (-inf pads),
        ``meta["ranking"] == "hybrid"``, ``meta["fusion"]`` the settings.
    """
    if min_score is not None and not 0.0 <= min_score <= 1.0:
        raise ValueError(f"min_score is a relevance between 0 and 1 with ranking='hybrid', got {min_score}")
    B = len(queries)
    kk = min(k, max(snap.n_docs, 1))  # nothing is sized by a huge k
    depth = max(DEPTH, kk)
    lex = mem.search(queries, k=depth, where=where, backend=backend, snapshot=snap, time_unit=time_unit,
                     ranking="bm25")
    qv = emb.encode_queries(queries)  # (B, dim) float32, normalised
    den = mem.search_vectors(qv, k=depth, where=where, embedding=emb.name, backend=backend, snapshot=snap,
                             time_unit=time_unit)
    seqs = np.full((B, kk), -1, np.int64)
    scores = np.full((B, kk), -np.inf, np.float32)
    vidx = np.full((B, kk), -1, np.int64)
    rows = np.full((B, kk), -1, np.int64)
    meta = {"ranking": "hybrid", "embedding": emb.name, "score": "relevance",
            "fusion": {"method": FUSION, "alpha": ALPHA, "depth": depth, "relevance": list(RELEVANCE)},
            "backend": lex.meta.get("backend"), "backend_reason": lex.meta.get("backend_reason"),
            "snapshot_version": snap.version, "ties": "fused order"}
    if snap.n_docs == 0 or not ((lex.seqs >= 0).any() or (den.seqs >= 0).any()):
        return results_cls(seqs, scores, snap, vidx, rows, meta)
    fused = fuse([_channel(lex), _channel(den)], kk, method=FUSION, alpha=ALPHA)
    w = min(kk, fused.ids.shape[1])
    fid = fused.ids[:, :w]
    cos = np.full((B, w), np.nan)
    fsc = np.where(fid >= 0, fused.scores[:, :w].astype(np.float64), np.nan)
    q64 = np.asarray(qv, np.float64)
    for b in range(B):
        at: dict[int, tuple[int, int]] = {}
        cos_of: dict[int, float] = {}
        for res in (lex, den):
            ok = res.seqs[b] >= 0
            at.update(zip(res.seqs[b][ok].tolist(), zip(res.vidx[b][ok].tolist(), res.rows[b][ok].tolist())))
        okd = den.seqs[b] >= 0
        cos_of.update(zip(den.seqs[b][okd].tolist(), den.scores[b][okd].astype(np.float64).tolist()))
        for j, s in enumerate(fid[b].tolist()):
            if s < 0:
                continue
            v, r = at[s]
            seqs[b, j], vidx[b, j], rows[b, j] = s, v, r
            c = cos_of.get(s)
            if c is None:  # a BM25 hit outside the cosine list: its cosine from the stored vector
                vec = np.asarray(snap.views[v].seg.vectors(emb.name)[r], np.float64)
                c = float(np.float32(vec @ q64[b]))
            cos[b, j] = c
    wl = where if isinstance(where, list) else [where] * B
    seen = np.array([mem.count(x, time_unit=time_unit) for x in wl], np.float64)  # what each question may see
    rel = relevance(cos, fsc, seen).astype(np.float32)  # the scores returned; min_score compares with them
    keep = ~np.isnan(rel)
    if min_score is not None:
        keep &= rel.astype(np.float64) >= min_score
    scores[:, :w] = np.where(keep, rel, -np.inf)
    seqs[:, :w] = np.where(keep, seqs[:, :w], -1)
    vidx[:, :w] = np.where(keep, vidx[:, :w], -1)
    rows[:, :w] = np.where(keep, rows[:, :w], -1)
    return results_cls(seqs, scores, snap, vidx, rows, meta)
