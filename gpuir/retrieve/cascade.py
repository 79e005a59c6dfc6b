"""Cascade: the cheap channels first, the escalation channels only for queries whose trigger fires.

Configuration (``RetrieverConfig.cascade``)::

    {"escalate": ["dense", "late"],     # channel kinds run only when triggered
     "trigger": "margin",               # "margin" | "per_type" | "always" | "never"
     "tau": 0.1,                        # margin threshold (the fallback of per_type)
     "per_type": {"temporal": 0.2},     # per query type (classifier's type)
     "classifier": "regex"}             # or a QueryTypeClassifier config

Every query runs the cheap channels (those whose kind is not in ``escalate``),
fused over what ran (:mod:`gpuir.retrieve.optimiser`). Its **margin** is
``(s1 - s2) / |s1|`` of the top two fused cheap scores (0 when fewer than two
hits, or when ``s1`` is 0); it is >= 0. The trigger fires when

* ``margin``: ``margin < tau``;
* ``per_type``: ``margin < per_type.get(type, tau)``, the type from the classifier;
* ``always`` / ``never``: for every / no query.

An escalated query runs the escalation channels too and is fused over all the
channels that ran for it, which is exactly what the configuration without the
cascade returns (tested); a query that is not escalated returns the cheap
fusion. ``meta["escalated"]`` says which. With ``unit="record"`` and no cheap
record channel, the cheap channel is exact record BM25 (as for a configuration
without record channels).

:func:`choose_tau` / :func:`choose_tau_per_type` pick thresholds from labelled
questions. **They must be given the training fold only** (e.g. the other
conversations under leave-one-conversation-out): a threshold chosen on the
questions it is then evaluated on is an in-sample figure.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..results import SearchResults
from .classify import QueryClassifier
from .optimiser import fuse_ran
from .wheres import rows_where

__all__ = ["Cascade", "choose_tau", "choose_tau_per_type", "margins", "triggered"]


def margins(fused: SearchResults) -> np.ndarray:
    """Relative top-1/top-2 margin of each row: ``(s1 - s2) / |s1|``.

    Parameters
    ----------
    fused : SearchResults, (B, k), k >= 2 for a meaningful margin

    Returns
    -------
    ndarray, shape (B,), float64, host: 0 where a row has fewer than two hits or s1 == 0.
    """
    B = fused.ids.shape[0]
    out = np.zeros(B, np.float64)
    if fused.ids.shape[1] < 2:
        return out
    s1 = fused.scores[:, 0].astype(np.float64)
    s2 = fused.scores[:, 1].astype(np.float64)
    ok = (fused.ids[:, 1] >= 0) & np.isfinite(s1) & np.isfinite(s2) & (s1 != 0)
    out[ok] = (s1[ok] - s2[ok]) / np.abs(s1[ok])
    return out


def triggered(cascade: dict[str, Any], queries: Sequence[str], margin: np.ndarray,
              classifier: Any = None) -> np.ndarray:
    """Whether the trigger fires for each query (module docstring).

    Parameters
    ----------
    cascade : dict (a validated ``RetrieverConfig.cascade``)
    margin : ndarray, shape (B,), float64
    classifier : QueryClassifier, optional
        Needed by ``per_type``.

    Returns
    -------
    ndarray, shape (B,), bool.
    """
    trig = cascade["trigger"]
    B = len(queries)
    if trig == "always":
        return np.ones(B, bool)
    if trig == "never":
        return np.zeros(B, bool)
    if trig == "margin":
        return margin < cascade["tau"]
    types = classifier.types(queries)
    taus = np.array([cascade["per_type"].get(t, cascade["tau"]) for t in types], np.float64)
    return margin < taus


def _expand(r: SearchResults, rows: np.ndarray, B: int) -> SearchResults:
    ids = np.full((B, r.ids.shape[1]), -1, np.int64)
    sc = np.full((B, r.ids.shape[1]), -np.inf, np.float32)
    ids[rows], sc[rows] = r.ids, r.scores
    return SearchResults(ids, sc)


class Cascade:
    """The cascade of a configuration (its validated ``RetrieverConfig.cascade``) and its query classifier.

    It composes over a retriever's public search interface: ``config``,
    ``channels_for``, ``exact_bm25``, ``windows`` and ``run_channels``.
    """

    def __init__(self, spec: dict[str, Any]):
        self.spec = spec
        self._classifier: QueryClassifier | None = None

    @property
    def classifier(self) -> QueryClassifier:
        """The query-type classifier of the ``per_type`` trigger (made on first use)."""
        if self._classifier is None:
            self._classifier = QueryClassifier(self.spec["classifier"])
        return self._classifier

    def run(self, retriever, queries: list[str], k: int, where: Any, unit: str, backend: str, anchors: np.ndarray,
            snap) -> tuple[dict[str, Any], SearchResults, np.ndarray]:
        """The cascaded search of ``retriever``.

        Returns
        -------
        (ran, fused, escalated): ``ran`` as :meth:`Retriever.search_channels` (escalation
        channels' rows empty for queries not escalated), ``fused`` SearchResults (B, k),
        ``escalated`` ndarray (B,) bool.
        """
        cfg = retriever.config
        casc = self.spec
        esc_kinds = set(casc["escalate"])
        chans = retriever.channels_for(unit)
        cheap = [c for c in chans if c.config.kind not in esc_kinds]
        expensive = [c for c in chans if c.config.kind in esc_kinds]
        if not cheap:
            cheap = [retriever.exact_bm25()]
            chans = cheap + expensive
        B = len(queries)
        windows = None
        if any(getattr(c, "needs_windows", False) for c in chans):
            windows = retriever.windows(queries, where, anchors)
        t0 = time.perf_counter()
        ran = retriever.run_channels(cheap, queries, where, unit, backend, anchors, snap, windows=windows)
        notes: list[str] = []
        cheap_fused = fuse_ran(ran["results"], ran["ran"], max(k, 2), cfg.fusion, [c.config.weight for c in cheap],
                               cfg.missing, cfg.k_rrf, notes)
        margin = margins(cheap_fused)
        classifier = self.classifier if casc["trigger"] == "per_type" else None
        fire = triggered(casc, queries, margin, classifier) if expensive else np.zeros(B, bool)
        timings = dict(ran["timings"])
        timings["cascade_cheap"] = time.perf_counter() - t0
        results = {id(c): r for c, r in zip(cheap, ran["results"])}
        masks = {id(c): ran["ran"][:, j] for j, c in enumerate(cheap)}
        rows = np.flatnonzero(fire)
        for c in expensive:
            results[id(c)] = SearchResults(np.full((B, 1), -1, np.int64), np.full((B, 1), -np.inf, np.float32))
            masks[id(c)] = np.zeros(B, bool)
        if rows.size:
            t1 = time.perf_counter()
            sub = retriever.run_channels(expensive, [queries[i] for i in rows], rows_where(where, rows.tolist()), unit,
                                         backend, anchors[rows], snap,
                                         windows=None if windows is None else [windows[i] for i in rows])
            for j, c in enumerate(expensive):
                results[id(c)] = _expand(sub["results"][j], rows, B)
                masks[id(c)][rows] = sub["ran"][:, j]
            timings.update(sub["timings"])
            timings["cascade_escalate"] = time.perf_counter() - t1
        full = {**ran, "channels": [c.config for c in chans], "results": [results[id(c)] for c in chans],
                "ran": np.stack([masks[id(c)] for c in chans], axis=1), "timings": timings, "notes": notes,
                "windows": windows if windows is not None else [None] * B, "margins": margin}
        t2 = time.perf_counter()
        fused = fuse_ran(full["results"], full["ran"], k, cfg.fusion, [c.config.weight for c in chans], cfg.missing,
                         cfg.k_rrf, notes)
        timings["fusion"] = time.perf_counter() - t2
        return full, fused, fire


# ---------------------------------------------------------------------------- choosing thresholds


def _as_arrays(margin, q_cheap, q_full) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    m = np.asarray(margin, np.float64).reshape(-1)
    a = np.asarray(q_cheap, np.float64).reshape(-1)
    b = np.asarray(q_full, np.float64).reshape(-1)
    if not (m.size == a.size == b.size) or m.size == 0:
        raise ValueError(f"margins, quality_cheap and quality_full need one value per question each, got "
                         f"{m.size}, {a.size}, {b.size}")
    if not (np.isfinite(m).all() and np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("margins and qualities must be finite numbers")
    return m, a, b


def choose_tau(margin: Sequence[float], quality_cheap: Sequence[float], quality_full: Sequence[float],
               tolerance: float = 0.0) -> dict[str, float]:
    """The margin threshold that skips the most queries at quality parity, **on a training fold**.

    A query is escalated when its margin is below ``tau``; a skipped query scores
    ``quality_cheap``, an escalated one ``quality_full``. Among the thresholds
    ``tau`` (0: skip every query; the midpoints between consecutive distinct
    margins; ``inf``: escalate every query), the one with the highest skip rate
    whose mean quality is at least ``mean(quality_full) - tolerance`` is chosen
    (ties: the larger tau). Give it the training questions only (inside the
    cross-validation); applied to the questions it was chosen on, its figures are in-sample.

    Parameters
    ----------
    margin : sequence of n float
        Each training question's cheap-fusion margin (:func:`margins`).
    quality_cheap, quality_full : sequence of n float
        Each question's quality (e.g. Hit@1, recall_all@5) with the cheap
        channels only and with every channel.
    tolerance : float
        Allowed drop of mean quality (0: parity).

    Returns
    -------
    dict with ``tau`` (float, possibly inf), ``skip_rate``, ``quality`` (mean at tau), ``quality_full``.
    """
    m, a, b = _as_arrays(margin, quality_cheap, quality_full)
    u = np.unique(m)
    taus = [0.0] + [float((x + y) / 2) for x, y in itertools.pairwise(u)] + [math.inf]
    target = b.mean() - float(tolerance)
    best = None
    for tau in taus:
        skip = m >= tau
        q = float(np.where(skip, a, b).mean())
        rate = float(skip.mean())
        if q >= target - 1e-12 and (best is None or rate > best["skip_rate"] or
                                    (rate == best["skip_rate"] and tau > best["tau"])):
            best = {"tau": tau, "skip_rate": rate, "quality": q, "quality_full": float(b.mean())}
    assert best is not None  # tau = inf escalates everything: quality_full, always feasible
    return best


def choose_tau_per_type(margin: Sequence[float], quality_cheap: Sequence[float], quality_full: Sequence[float],
                        types: Sequence[str], tolerance: float = 0.0) -> dict[str, Any]:
    """A threshold per query type (:func:`choose_tau` within each type), **on a training fold**.

    Parity is required within each type, so it holds overall. Give it the
    training questions only, as :func:`choose_tau`.

    Returns
    -------
    dict with ``per_type`` ({type: tau}), ``tau`` (the threshold chosen on all
    questions, the fallback for types not seen in training), ``skip_rate``, ``quality``.
    """
    m, a, b = _as_arrays(margin, quality_cheap, quality_full)
    t = np.asarray(list(types), dtype=object)
    if t.size != m.size:
        raise ValueError(f"types has {t.size} entries for {m.size} questions")
    per: dict[str, float] = {}
    skip = np.zeros(m.size, bool)
    for ty in sorted(set(t.tolist())):
        sel = t == ty
        per[ty] = choose_tau(m[sel], a[sel], b[sel], tolerance)["tau"]
        skip[sel] = m[sel] >= per[ty]
    overall = choose_tau(m, a, b, tolerance)
    return {"per_type": per, "tau": overall["tau"], "skip_rate": float(skip.mean()),
            "quality": float(np.where(skip, a, b).mean()), "quality_full": float(b.mean())}
