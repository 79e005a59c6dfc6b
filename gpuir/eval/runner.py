"""Evaluate a retrieval method on a data set: one batch, per-query metrics, run file, report.

A **method** turns a data set and its questions into a ranked run of document
numbers. Methods live in a registry, :data:`EVAL_METHODS`, so new ones (dense, late
interaction, fusion...) plug in with :func:`register_method` and show up in the
CLI (``gpuir eval ... --method NAME``) without touching the runner::

    @register_method("mine", help="my retriever", add_arguments=..., from_args=...)
    def _mine(ds, queries, k, *, backend="auto", progress=False, **options) -> Run: ...

Every question is answered in one batch against one index over the whole
collection; a question's private haystack (its LoCoMo conversation, its
LongMemEval sessions) is a per-query filter (``EvalDataset.candidate_filters``),
never an index of its own.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..results import padded_arrays
from .datasets import EvalDataset, EvalQuery
from .metrics import METRICS, compute_metrics
from .stats import bootstrap_ci, bootstrap_table

log = logging.getLogger(__name__)  # gpuir.eval.runner

# --------------------------------------------------------------------------- method registry


@dataclass
class Run:
    """A ranked run over an :class:`EvalDataset`.

    Attributes
    ----------
    ranked : ndarray, shape (B, k), int64
        Document numbers (positions in ``ds.doc_ids``), best first; -1 pads.
    scores : ndarray, shape (B, k), float32
        Scores matching ``ranked``; -inf at padding.
    meta : dict
        What made it: backend, timings, parameters.
    """

    ranked: np.ndarray
    scores: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)


#: Signature of a method: ``fn(ds, queries, k, *, backend, progress, **options) -> Run``.
MethodFn = Callable[..., Run]


@dataclass
class MethodSpec:
    """A registered method.

    Attributes
    ----------
    name : str
    fn : callable
        ``fn(ds: EvalDataset, queries: list[EvalQuery], k: int, *, backend: str,
        progress: bool, **options) -> Run``. It must honour ``q.candidates`` (return
        only documents of each question's haystack).
    help : str
    add_arguments : callable(argparse parser) or None
        Adds the method's own CLI options to ``gpuir eval <dataset>``; option names
        must not clash with other methods' (prefix them, e.g. ``--dense-model``).
    from_args : callable(argparse.Namespace) -> dict, or None
        The method's options from parsed CLI arguments.
    """

    name: str
    fn: MethodFn
    help: str = ""
    add_arguments: Callable[[Any], None] | None = None
    from_args: Callable[[Any], dict[str, Any]] | None = None


EVAL_METHODS: dict[str, MethodSpec] = {}

#: Modules imported (when installed) before methods are listed, so methods that
#: live elsewhere (dense, late interaction, fusion) register themselves.
#: dense, late, rrf, agent_rrf, hybrid-fusion (dense rows); memory (Memory BM25); fusion (Retriever);
#: config, default (named Retriever configurations)
METHOD_MODULES: tuple[str, ...] = (
    "gpuir.eval.hybrid_methods", "gpuir.eval.memory_methods", "gpuir.eval.retriever_methods",
    "gpuir.eval.config_methods")


def load_method_modules() -> None:
    """Import every module of :data:`METHOD_MODULES` that exists (each registers its methods)."""
    import importlib
    import importlib.util

    for mod in METHOD_MODULES:
        try:
            found = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            found = False
        if found:
            importlib.import_module(mod)


def register_method(
    name: str,
    *,
    help: str = "",
    add_arguments: Callable[[Any], None] | None = None,
    from_args: Callable[[Any], dict[str, Any]] | None = None,
) -> Callable[[MethodFn], MethodFn]:
    """Decorator registering ``fn`` as evaluation method ``name`` (see :class:`MethodSpec`)."""

    def deco(fn: MethodFn) -> MethodFn:
        EVAL_METHODS[name] = MethodSpec(name, fn, help, add_arguments, from_args)
        return fn

    return deco


def get_method(name: str) -> MethodSpec:
    """The registered method ``name`` (ValueError naming the choices otherwise)."""
    if name not in EVAL_METHODS:
        load_method_modules()
    if name not in EVAL_METHODS:
        raise ValueError(f"unknown method {name!r}: choose one of {', '.join(sorted(EVAL_METHODS))}")
    return EVAL_METHODS[name]


# --------------------------------------------------------------------------- BM25

_INDEX_CACHE: dict[tuple, Any] = {}


def bm25_index(ds: EvalDataset, analyzer: Any = "default", progress: bool = False):
    """The BM25 index of ``ds`` under ``analyzer``, built once per (data set, analyzer) and cached.

    Returns
    -------
    gpuir.engine.BM25Index
        Document numbers equal positions in ``ds.doc_ids``.
    """
    from gpuir.analysis import Analyzer
    from gpuir.engine import BM25Index

    akey = json.dumps(Analyzer(analyzer).config, sort_keys=True)
    key = (id(ds), ds.n_docs, akey)
    if key not in _INDEX_CACHE:
        if len(_INDEX_CACHE) >= 8:
            _INDEX_CACHE.pop(next(iter(_INDEX_CACHE)))
        idx = BM25Index.build(ds.doc_texts, ids=ds.doc_ids, analyzer=analyzer, progress=progress)
        _INDEX_CACHE[key] = (ds, idx)  # keep ds alive so id(ds) stays unique
    return _INDEX_CACHE[key][1]


def _bm25_args(p) -> None:
    from gpuir.analysis import ANALYZERS
    from gpuir.bm25 import METHODS as BM25_METHODS

    g = p.add_argument_group("bm25 method")
    g.add_argument("--analyzer", default="default", choices=sorted(ANALYZERS), help="default: %(default)s")
    g.add_argument("--bm25-variant", default="lucene", choices=BM25_METHODS, help="default: %(default)s")
    g.add_argument("--k1", type=float, default=1.2, help="default: %(default)s")
    g.add_argument("--b", type=float, default=0.75, help="default: %(default)s")
    g.add_argument("--delta", type=float, default=0.5, help="bm25l / bm25+ only; default: %(default)s")


#: The options of the BM25 methods (bm25, memory, ...), for ``add_arguments``.
bm25_arguments = _bm25_args


def _bm25_from_args(a) -> dict[str, Any]:
    return {"analyzer": a.analyzer, "variant": a.bm25_variant, "k1": a.k1, "b": a.b, "delta": a.delta}


#: The BM25 options read back (``from_args`` of the BM25 methods).
bm25_from_args = _bm25_from_args


@register_method("bm25", help="gpuir BM25 (sparse)", add_arguments=_bm25_args, from_args=_bm25_from_args)
def bm25_method(
    ds: EvalDataset,
    queries: Sequence[EvalQuery],
    k: int,
    *,
    backend: str = "auto",
    progress: bool = False,
    analyzer: Any = "default",
    variant: str = "lucene",
    k1: float = 1.2,
    b: float = 0.75,
    delta: float = 0.5,
    batch_size: int = 1024,
) -> Run:
    """BM25 over the whole collection, each question filtered to its candidates, in batches."""
    t0 = time.perf_counter()
    base = bm25_index(ds, analyzer, progress=progress)
    t_index = time.perf_counter() - t0
    idx = base.with_params(method=variant, k1=float(k1), b=float(b), delta=float(delta))
    filters = ds.candidate_filters(queries)
    texts = [q.text for q in queries]
    ranked, scores, meta = [], [], {}
    t1 = time.perf_counter()
    starts = range(0, len(texts), batch_size)
    bar = None
    if progress and len(texts) > batch_size:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(texts), desc="search", unit="q", file=sys.stderr)
    for s in starts:
        f = None if filters is None else filters[s : s + batch_size]
        res = idx.search(texts[s : s + batch_size], k=k, filters=f, backend=backend)
        ranked.append(res.ids)
        scores.append(res.scores)
        meta = res.meta
        if bar is not None:
            bar.update(len(res))
    if bar is not None:
        bar.close()
    t_search = time.perf_counter() - t1
    if not texts:
        ranked, scores = [np.zeros((0, k), np.int64)], [np.zeros((0, k), np.float32)]
    return Run(
        ranked=np.concatenate(ranked).astype(np.int64, copy=False),
        scores=np.concatenate(scores).astype(np.float32, copy=False),
        meta={
            "backend": meta.get("backend"),
            "backend_reason": meta.get("backend_reason"),
            "analyzer": base.analyzer.config,
            "bm25": idx.params.to_dict(),
            "index": {"n_docs": base.n_docs, "n_terms": base.csr.n_terms, "n_postings": base.csr.n_postings},
            "timings": {"index_s": t_index, "search_s": t_search},
        },
    )


def haystack_groups(queries: Sequence[EvalQuery], progress: bool, desc: str, unit: str
                    ) -> list[tuple[tuple[str, ...] | None, list[int]]]:
    """Query rows grouped by candidate set (LoCoMo: conversation; LongMemEval: question haystack).

    Returns
    -------
    list of (candidate doc ids or None for all, row numbers), wrapped in a progress bar when asked.
    """
    groups: dict[tuple[str, ...] | None, list[int]] = {}
    for i, q in enumerate(queries):
        groups.setdefault(q.candidates, []).append(i)
    items = list(groups.items())
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, desc=desc, unit=unit, file=sys.stderr)
    return items


@register_method(
    "bm25-private",
    help="BM25 with one index per haystack (idf from the question's own sessions), as the "
    "benchmarks' own scripts do; for comparison only, slower",
    add_arguments=_bm25_args,
    from_args=_bm25_from_args,
)
def bm25_private_method(
    ds: EvalDataset,
    queries: Sequence[EvalQuery],
    k: int,
    *,
    backend: str = "auto",
    progress: bool = False,
    analyzer: Any = "default",
    variant: str = "lucene",
    k1: float = 1.2,
    b: float = 0.75,
    delta: float = 0.5,
) -> Run:
    """BM25 with a separate index per distinct candidate set (LoCoMo: per conversation;
    LongMemEval: per question). Statistics (idf, avgdl) come from that haystack only."""
    from gpuir.engine import BM25Index

    t0 = time.perf_counter()
    B = len(queries)
    ranked, scores = padded_arrays(B, k)
    idx = ds.doc_index
    meta: dict[str, Any] = {}
    items = haystack_groups(queries, progress, "haystacks", "index")
    for cands, qi in items:
        nums = np.arange(ds.n_docs) if cands is None else np.fromiter((idx[d] for d in cands), np.int64)
        sub = BM25Index.build([ds.doc_texts[n] for n in nums], analyzer=analyzer, method=variant,
                              k1=float(k1), b=float(b), delta=float(delta), progress=False)
        r = sub.search([queries[i].text for i in qi], k=k, backend=backend)
        w = r.ids.shape[1]  # min(k, haystack size): the index clamps k to its documents
        ranked[qi, :w] = np.where(r.ids >= 0, nums[np.maximum(r.ids, 0)], -1)
        scores[qi, :w] = r.scores
        meta = r.meta
    return Run(ranked, scores, {
        "backend": meta.get("backend"), "backend_reason": meta.get("backend_reason"),
        "n_indexes": len(items), "timings": {"search_s": time.perf_counter() - t0},
    })


# --------------------------------------------------------------------------- evaluation


@dataclass
class EvalResult:
    """Everything one evaluation produced.

    Attributes
    ----------
    dataset : EvalDataset
    method : str
    options : dict
        The method's options.
    queries : list of EvalQuery
        All evaluated questions (scored or not), in run order.
    run : Run
    per_query : dict of name -> ndarray, shape (B,), float64
        Metric of each question; nan where the question has no gold.
    cutoffs : tuple of int
    k : int
        Run depth.
    timings : dict
    """

    dataset: EvalDataset
    method: str
    options: dict[str, Any]
    queries: list[EvalQuery]
    run: Run
    per_query: dict[str, np.ndarray]
    cutoffs: tuple[int, ...]
    k: int
    timings: dict[str, float] = field(default_factory=dict)
    n_boot: int = 10000
    seed: int = 0
    _summary: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def qids(self) -> list[str]:
        return [q.qid for q in self.queries]

    def mask(self, which: str = "scored") -> np.ndarray:
        """Boolean (B,) mask: ``"scored"``, ``"abstention"`` (not scored, reported apart) or ``"gold"``."""
        if which == "scored":
            return np.array([q.scored for q in self.queries], dtype=bool)
        if which == "abstention":
            return np.array([q.abstention and not q.scored and bool(q.gold) for q in self.queries], dtype=bool)
        if which == "gold":
            return np.array([bool(q.gold) for q in self.queries], dtype=bool)
        raise ValueError(f"unknown mask {which!r}")

    def _block(self, sel: np.ndarray) -> dict[str, Any]:
        groups = np.array([q.group for q in self.queries])[sel]
        full = {m: v[sel] for m, v in self.per_query.items() if not np.isnan(v[sel]).any()}
        tab = bootstrap_table(full, groups, n_boot=self.n_boot, seed=self.seed)
        out = {m: iv.to_dict() for m, iv in tab.items()}
        for m, v in self.per_query.items():  # metrics some questions lack (answer metrics): over those that have it
            if m not in out:
                ok = ~np.isnan(v[sel])
                out[m] = bootstrap_ci(v[sel][ok], groups[ok], n_boot=self.n_boot, seed=self.seed).to_dict()
        return {m: out[m] for m in self.per_query}

    def summary(self) -> dict[str, Any]:
        """Means with 95% cluster-bootstrap intervals: overall, per category, and apart.

        Returns
        -------
        dict with ``overall`` {metric: {mean, lo, hi, n, n_clusters}},
        ``by_category`` {category: {...}}, ``apart`` {"abstention": {...}} when any.
        """
        if self._summary is None:
            t0 = time.perf_counter()
            scored = self.mask("scored")
            cats = np.array([q.category for q in self.queries])
            out: dict[str, Any] = {"overall": self._block(scored), "by_category": {}}
            for c in sorted(set(cats[scored].tolist())):
                out["by_category"][c] = self._block(scored & (cats == c))
            ab = self.mask("abstention")
            if ab.any():
                out["apart"] = {"abstention": self._block(ab)}
            self.timings["bootstrap_s"] = time.perf_counter() - t0
            self._summary = out
        return self._summary

    def report(self, per_query: bool = True) -> dict[str, Any]:
        """The JSON report: data set, method, options, summary, timings, machine, per-question values."""
        s = self.summary()
        rep = {
            "dataset": self.dataset.summary(),
            "method": self.method,
            "options": self.options,
            "run_meta": self.run.meta,
            "k": self.k,
            "cutoffs": list(self.cutoffs),
            "n_scored": int(self.mask("scored").sum()),
            "bootstrap": {"n_boot": self.n_boot, "seed": self.seed, "level": 0.95,
                          "clusters": "conversation" if self.dataset.name == "locomo" else "question"},
            **s,
            "timings": self.timings,
            "machine": machine_info(),
        }
        rep["dataset"].pop("skipped_ids", None)
        if per_query:
            rep["per_query"] = {
                "qid": self.qids,
                "category": [q.category for q in self.queries],
                "group": [q.group for q in self.queries],
                "scored": [bool(q.scored) for q in self.queries],
                **{m: [None if np.isnan(x) else round(float(x), 6) for x in v] for m, v in self.per_query.items()},
            }
        return rep

    def table(self, columns: Sequence[str] | None = None, fmt: str = "table") -> str:
        """Overall and per category, each cell ``mean [lo, hi]`` (:mod:`gpuir.eval.tables`).

        Parameters
        ----------
        columns : metric names (default :func:`default_columns`)
        fmt : {"table", "markdown", "csv", "json"}
            ``"table"`` fits 100 columns (metric columns split into blocks when
            needed); ``"csv"`` gives each metric three columns (mean, lo, hi);
            ``"json"`` the summary blocks themselves.
        """
        from .tables import interval_cell, render

        s = self.summary()
        cols = [c for c in (columns or default_columns(self.dataset.name, self.per_query))]
        unknown = [c for c in cols if c not in self.per_query]
        if unknown:
            raise ValueError(f"unknown column(s) {', '.join(unknown)}; available: {', '.join(self.per_query)}")
        rows: list[tuple[str, dict]] = [("overall", s["overall"])]
        rows += [(c, v) for c, v in s["by_category"].items()]
        rows += [(f"({c}, apart)", v) for c, v in s.get("apart", {}).items()]

        def n_of(blk: dict) -> str:
            return str(next(iter(blk.values()))["n"] if blk else 0)

        if fmt == "csv":
            head = ["subset", "n"] + [f"{c}_{x}" for c in cols for x in ("mean", "lo", "hi")]
            body = [[name, n_of(blk)] + [("" if blk.get(c) is None or not blk[c]["n"] else f"{blk[c][x]:.6f}")
                                         for c in cols for x in ("mean", "lo", "hi")] for name, blk in rows]
            return render(head, body, "csv")
        head = ["subset", "n"] + cols
        body = [[name, n_of(blk)] + [interval_cell(blk.get(c)) for c in cols] for name, blk in rows]
        data = {name: {c: blk.get(c) for c in cols} for name, blk in rows} if fmt == "json" else None
        return render(head, body, fmt, data=data)

    def write_run(self, path: str | os.PathLike, tag: str | None = None) -> None:
        """Write the run in TREC format: ``qid Q0 docid rank score tag``, every question.

        Ranks follow gpuir's order (score descending, then document number); trec_eval
        re-sorts equal scores by document id descending, so on ties its numbers can
        differ slightly from the report's.
        """
        tag = tag or f"gpuir-{self.method}"
        ids = self.dataset.doc_ids
        with open(path, "w", encoding="utf-8") as f:
            for qi, q in enumerate(self.queries):
                for r, (d, sc) in enumerate(zip(self.run.ranked[qi], self.run.scores[qi]), start=1):
                    if d < 0:
                        break
                    f.write(f"{q.qid} Q0 {ids[d]} {r} {float(sc):.6f} {tag}\n")

    def write_qrels(self, path: str | os.PathLike) -> None:
        """Write the gold of every question with gold in TREC qrels format (``qid 0 docid grade``)."""
        with open(path, "w", encoding="utf-8") as f:
            for q in self.queries:
                f.writelines(f"{q.qid} 0 {d} {g}\n" for d, g in q.gold.items())


def default_columns(dataset_name: str, per_query: dict[str, Any]) -> list[str]:
    """The metrics the CLI table shows for a data set."""
    if dataset_name == "locomo":
        want = ["hit@1", "hit@3", "hit@5", "hit@10", "mrr", "ndcg@5", "answer_substr@5", "answer_recall@5"]
    elif dataset_name.startswith("longmemeval"):
        want = ["recall_any@5", "recall@5", "recall_all@5", "recall@10", "recall_all@10", "ndcg@5", "mrr",
                "answer_substr@5", "answer_recall@5"]
    else:
        want = ["ndcg@10", "recall@10", "recall@100", "mrr"]
    return [w for w in want if w in per_query]


def evaluate(
    ds: EvalDataset,
    method: str = "bm25",
    *,
    k: int = 100,
    cutoffs: Sequence[int] = (1, 3, 5, 10),
    metrics: Sequence[str] = METRICS,
    backend: str = "auto",
    progress: bool = False,
    n_boot: int = 10000,
    seed: int = 0,
    **options: Any,
) -> EvalResult:
    """Run ``method`` on every question of ``ds`` in one batch and score it.

    Parameters
    ----------
    ds : EvalDataset
    method : str
        A name in :data:`EVAL_METHODS`.
    k : int
        Run depth (results per question); MRR is computed over it. Default 100,
        deeper than any LoCoMo conversation or LongMemEval haystack.
    cutoffs : sequence of int
        Cut-offs of the @k metrics.
    metrics : sequence of str
        Metric families (see :data:`gpuir.eval.metrics.METRICS`).
    backend : {"auto", "numpy", "cupy"}
    progress : bool
        Progress bars on stderr.
    n_boot, seed : bootstrap replicates and seed for the intervals.
    **options
        The method's options (for bm25: analyzer, variant, k1, b, delta).

    Returns
    -------
    EvalResult
        Questions without gold get nan metrics and are never scored.
    """
    spec = get_method(method)
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    cutoffs = tuple(int(c) for c in cutoffs)
    if not cutoffs or min(cutoffs) < 1:
        raise ValueError(f"cutoffs must be positive integers, got {cutoffs}")
    queries = list(ds.queries)
    t0 = time.perf_counter()
    log.info("running method %s on %s: %d questions over %d %ss", method, ds.name, len(queries), ds.n_docs, ds.unit)
    run = spec.fn(ds, queries, int(k), backend=backend, progress=progress, **options)
    t_method = time.perf_counter() - t0
    log.info("method %s ran in %.1f s", method, t_method)
    B, width = run.ranked.shape if run.ranked.ndim == 2 else (None, None)
    if B == len(queries) and width is not None and width < int(k) and run.scores.shape == run.ranked.shape:
        # a search clamps k to the collection (BM25Index.search): pad the run to k columns here
        ranked = np.full((B, int(k)), -1, np.int64)
        scores = np.full((B, int(k)), -np.inf, np.float32)
        ranked[:, :width], scores[:, :width] = run.ranked, run.scores
        run.ranked, run.scores = ranked, scores
    if run.ranked.shape != (len(queries), int(k)):
        raise ValueError(
            f"method {method!r} returned a run of shape {run.ranked.shape}, expected {(len(queries), int(k))}"
        )
    t1 = time.perf_counter()
    idx = ds.doc_index
    gold = []
    for q in queries:
        g = {}
        for j, (d, r) in enumerate(q.gold.items()):
            g[idx.get(d, -2 - j)] = r  # a gold doc missing from the collection still counts
        gold.append(g)
    pq = compute_metrics(run.ranked, gold, cutoffs=cutoffs, metrics=metrics)
    has_gold = np.array([bool(q.gold) for q in queries], dtype=bool)
    for v in pq.values():
        v[~has_gold] = np.nan
    answers = [q.meta.get("answer") for q in queries]
    if any(a is not None for a in answers):  # retrieval-side answer metrics (gpuir.eval.answers)
        from .answers import answer_metrics

        for name, v in answer_metrics(run.ranked, ds.doc_texts, answers, cutoffs=(5,)).items():
            v[~has_gold] = np.nan
            pq[name] = v
    timings = {"method_s": t_method, **run.meta.get("timings", {}), "metrics_s": time.perf_counter() - t1}
    return EvalResult(
        dataset=ds, method=method, options=dict(options), queries=queries, run=run, per_query=pq,
        cutoffs=cutoffs, k=int(k), timings=timings, n_boot=n_boot, seed=seed,
    )


# --------------------------------------------------------------------------- ablation


#: Analyzers of the ablation: name -> what it changes from "default".
ABLATION_ANALYZERS: dict[str, str] = {
    "default": "Snowball English stemmer, Lucene's 33 stopwords",
    "nostem": "no stemming",
    "nostop": "no stopwords",
    "plain": "neither",
    "porter": "Porter stemmer",
    "en-large": "NLTK's 179 stopwords",
    "bm25s": "bm25s tokeniser (tokens of 2+ chars, no NFKC)",
}


def ablation(
    ds: EvalDataset,
    *,
    analyzers: Sequence[str] = tuple(ABLATION_ANALYZERS),
    k1s: Sequence[float] = (0.9, 1.2, 1.5),
    bs: Sequence[float] = (0.4, 0.75),
    k: int = 100,
    cutoffs: Sequence[int] = (1, 3, 5, 10),
    backend: str = "auto",
    select_metric: str | None = None,
    progress: bool = False,
    n_boot: int = 2000,
) -> dict[str, Any]:
    """BM25 over the grid analyzers x k1 x b, one index per analyzer.

    Parameters
    ----------
    ds : EvalDataset
    analyzers, k1s, bs : the grid
    select_metric : str, optional
        Metric for leave-one-group-out selection over the grid (LoCoMo: one
        conversation held out at a time). Default ``hit@1`` for LoCoMo,
        ``recall_all@5`` otherwise.

    Returns
    -------
    dict with ``rows`` (one per setting: analyzer, k1, b, summary of every metric
    with intervals), ``loco`` (held-out selection result; LoCoMo only) and ``dataset``.
    """
    from .stats import leave_one_group_out

    metric = select_metric or ("hit@1" if ds.name == "locomo" else "recall_all@5")
    rows = []
    per_setting: dict[str, np.ndarray] = {}
    scored_mask = None
    groups = None
    for an in analyzers:
        for k1 in k1s:
            for b in bs:
                t0 = time.perf_counter()
                res = evaluate(ds, "bm25", k=k, cutoffs=cutoffs, backend=backend, progress=progress,
                               n_boot=n_boot, analyzer=an, k1=k1, b=b)
                s = res.summary()
                cols = default_columns(ds.name, res.per_query)
                rows.append({"analyzer": an, "k1": k1, "b": b, "overall": s["overall"],
                             "by_category": {c: {m: v[m] for m in cols} for c, v in s["by_category"].items()},
                             "seconds": time.perf_counter() - t0})
                scored_mask = res.mask("scored")
                groups = [q.group for q, m in zip(res.queries, scored_mask) if m]
                per_setting[f"{an} k1={k1} b={b}"] = res.per_query[metric][scored_mask]
    out: dict[str, Any] = {"dataset": ds.summary(), "select_metric": metric, "rows": rows,
                           "machine": machine_info()}
    out["dataset"].pop("skipped_ids", None)
    if groups is not None and len(set(groups)) >= 2 and len(set(groups)) <= 50:
        lo = leave_one_group_out(per_setting, groups)
        ci = bootstrap_ci(lo["heldout"], groups, n_boot=n_boot)
        out["loco"] = {"metric": metric, "heldout_mean": lo["mean"], "heldout_ci": ci.to_dict(),
                       "chosen": lo["chosen"], "best_overall": lo["best_overall"],
                       "best_overall_mean": lo["best_overall_mean"]}
    return out


# --------------------------------------------------------------------------- misc


def machine_info() -> dict[str, Any]:
    """CPU model, cores, Python and NumPy versions (for reports)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "platform": platform.platform()}


def save_json(obj: Any, path: str | os.PathLike) -> None:
    """Write ``obj`` as indented JSON (numpy scalars and arrays converted)."""

    def default(o):
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
        return str(o)

    def clean(o):
        if isinstance(o, float) and not np.isfinite(o):
            return None
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o

    raw: list[str] = []

    def compact(o):
        # long lists of scalars (per-question values) on one line each
        if isinstance(o, dict):
            return {k: compact(v) for k, v in o.items()}
        if isinstance(o, list):
            if len(o) > 16 and all(v is None or isinstance(v, (str, int, float, bool)) for v in o):
                raw.append(json.dumps(o, allow_nan=False))
                return f"\x00RAW{len(raw) - 1}\x00"
            return [compact(v) for v in o]
        return o

    text = json.dumps(compact(clean(json.loads(json.dumps(obj, default=default)))), indent=1, allow_nan=False)
    text = re.sub(r'"\\u0000RAW(\d+)\\u0000"', lambda m: raw[int(m.group(1))], text)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")


__all__ = [
    "ABLATION_ANALYZERS",
    "EVAL_METHODS",
    "EvalResult",
    "MethodSpec",
    "Run",
    "ablation",
    "bm25_index",
    "bm25_method",
    "default_columns",
    "evaluate",
    "get_method",
    "machine_info",
    "register_method",
    "save_json",
]
