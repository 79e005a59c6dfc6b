"""Evaluation methods that run :class:`gpuir.Retriever` over a data set turned into a memory.

``gpuir eval locomo --method fusion`` (and ``longmemeval``) builds a
:class:`~gpuir.memory.Memory` of **turn records** from the data set's sessions
(:func:`session_turn_records`: LoCoMo's turns, a line of a session elsewhere;
``session`` = the session's document id, ``tenant`` = the one question group
whose haystack holds it, :func:`gpuir.eval.records.document_tenants`), and
runs a :class:`~gpuir.retrieve.Retriever` configuration at ``unit="session"``, each question restricted to its haystack
by ``where`` (:func:`haystack_wheres`). The run ranks the data set's documents,
so the metrics are those of every other method.

``--alpha loco`` (the default) is the honest figure: for each conversation
(LoCoMo) or fold of questions (LongMemEval, 5 folds), the setting is chosen on
the *other* conversations' questions (:func:`gpuir.eval.stats.leave_one_group_out`)
and the held-out question is ranked with it. The setting is the weight
``alpha`` of the first channel (the second gets ``1 - alpha``; grid 0, 0.05,
..., 1) and, with ``--loco-grid full`` (the default on LoCoMo), also the
analyzer and the second channel's pooling: the selection that chose the default
configuration. ``--alpha 0.75`` runs the default configuration as a user would.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..memory import Memory
from ..progress import progress_bar
from ..results import padded_arrays
from ..retrieve import ChannelConfig, Retriever, RetrieverConfig, default_config
from .datasets import EvalDataset, EvalQuery, load_locomo
from .records import dataset_records, document_tenants, record_time
from .runner import Run, register_method

__all__ = ["haystack_wheres", "loco_folds", "retriever_run", "session_turn_records"]

ALPHAS: tuple[float, ...] = tuple(float(a) for a in np.round(np.arange(0.0, 1.0001, 0.05), 2))


def session_turn_records(ds: EvalDataset) -> list[dict[str, Any]]:
    """The turn records of ``ds``'s sessions, in document order.

    LoCoMo (loaded from its file): the loader's turns (:func:`gpuir.eval.records.dataset_records` of the
    turn-level data set: ids ``<sample_id>:D<n>:<t>``, session ``<sample_id>:S<n>``,
    the session's date as time), so the memory holds what a user adds, one record
    per turn (a few turns span several lines). Other data sets: one record per
    non-empty line of each session (``<doc id>#<line>``; LongMemEval turns are
    joined by newlines and have no ids of their own).
    """
    if ds.unit != "session":
        raise ValueError(f"the retriever methods rank sessions: load {ds.name} with unit='session', not {ds.unit!r}")
    if ds.name == "locomo" and ds.source and os.path.isfile(ds.source):
        opts = ds.options
        turns = load_locomo(ds.source, unit="turn", speakers=opts.get("speakers", True),
                            captions=opts.get("captions", False))
        return dataset_records(turns)
    tenants = document_tenants(ds)
    dates = _session_dates(ds)
    out = []
    for did, text, tenant, date in zip(ds.doc_ids, ds.doc_texts, tenants, dates):
        for j, line in enumerate(ln for ln in text.split("\n") if ln.strip()):
            rec: dict[str, Any] = {"id": f"{did}#{j}", "text": line, "session": did}
            if tenant is not None:
                rec["tenant"] = tenant
            if date is not None:
                rec["time"] = record_time(date)
            out.append(rec)
    return out


def _session_dates(ds: EvalDataset) -> list[Any]:
    """Each document's date: ``ds.doc_dates``, else (LongMemEval) its slot's date in the first haystack holding it."""
    out = list(ds.doc_dates)
    idx = ds.doc_index
    for q in ds.queries:
        hd = q.meta.get("haystack_dates")
        if not hd or q.candidates is None or len(hd) != len(q.candidates):
            continue
        for d, dt in zip(q.candidates, hd):
            i = idx.get(d)
            if i is not None and out[i] is None and dt is not None:
                out[i] = dt
    return out


def haystack_wheres(ds: EvalDataset, queries: Sequence[EvalQuery]) -> list[dict[str, Any] | None]:
    """Each question's haystack as a ``where``: its tenant when the tenant holds exactly the haystack, else its sessions."""
    tenants = document_tenants(ds)
    idx = ds.doc_index
    size: dict[str, int] = {}
    for t in tenants:
        if t is not None:
            size[t] = size.get(t, 0) + 1
    out: list[dict[str, Any] | None] = []
    for q in queries:
        if q.candidates is None:
            out.append(None)
            continue
        cands = sorted(set(q.candidates))
        ts = {tenants[idx[d]] for d in cands}
        if len(ts) == 1 and None not in ts and size[next(iter(ts))] == len(cands):
            out.append({"tenant": next(iter(ts))})
        else:
            out.append({"session": {"in": cands}})
    return out


def loco_folds(queries: Sequence[EvalQuery], max_groups: int = 20, folds: int = 5) -> np.ndarray:
    """Cross-validation group of each question: its conversation, or (more than ``max_groups`` groups) one of ``folds`` folds."""
    groups = [q.group for q in queries]
    uniq = sorted(set(groups))
    if len(uniq) <= max_groups:
        return np.array(groups, dtype=object)
    fold = {g: i % folds for i, g in enumerate(uniq)}
    return np.array([fold[g] for g in groups])


_CACHE: dict[tuple, Any] = {}


def build_retriever(ds: EvalDataset, config: RetrieverConfig) -> Retriever:
    """A memory of ``ds``'s turn records with a retriever of ``config``.

    The memory is cached per data set and analyzer, the retriever per
    configuration (the last one of each), so a grid over poolings and weights
    indexes once per analyzer.
    """
    dkey = (ds.name, ds.source, ds.n_docs, tuple(sorted(ds.options.items(), key=str)))
    analyzer = config.analyzer or "default"
    hit = _CACHE.get("retriever")
    if hit is not None and hit[0] is ds and hit[1] == (dkey, repr(config.to_config())):
        return hit[2]
    mem_hit = _CACHE.get("memory")
    if mem_hit is not None and mem_hit[0] is ds and mem_hit[1] == (dkey, repr(analyzer)):
        mem = mem_hit[2]
    else:
        _CACHE.clear()
        mem = Memory(analyzer=analyzer, partition_days=None)
        recs = session_turn_records(ds)
        for s in range(0, len(recs), 50_000):
            mem.add(recs[s: s + 50_000])
        _CACHE["memory"] = (ds, (dkey, repr(analyzer)), mem)
    r = Retriever(mem, config, encoder=_shared_encoder(config))
    _CACHE["retriever"] = (ds, (dkey, repr(config.to_config())), r)
    return r


_ENCODERS: dict[Any, Any] = {}


def _shared_encoder(config: RetrieverConfig) -> Any:
    """One encoder per model for every configuration evaluated in this process (None: no dense channel)."""
    if not getattr(config, "needs_encoder", False):
        return None
    if config.encoder not in _ENCODERS:
        from ..dense.encoder import Encoder

        _ENCODERS[config.encoder] = Encoder(config.encoder)
    return _ENCODERS[config.encoder]


def _ranked(ds: EvalDataset, r: Retriever, nums: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    names, idx = r.catalog.session_names, ds.doc_index
    ranked = np.where(nums >= 0, 0, -1).astype(np.int64)
    for i, row in enumerate(nums):
        for j, n in enumerate(row.tolist()):
            if n >= 0:
                ranked[i, j] = idx[names[n]]
    return ranked, np.where(nums >= 0, scores, -np.inf).astype(np.float32)


def per_query(ds: EvalDataset, queries: Sequence[EvalQuery], ranked: np.ndarray, metric: str) -> np.ndarray:
    from .metrics import compute_metrics

    idx = ds.doc_index
    gold = [{idx.get(d, -2 - j): v for j, (d, v) in enumerate(q.gold.items())} for q in queries]
    name, cut = metric.split("@")
    return compute_metrics(ranked, gold, cutoffs=(int(cut),), metrics=(name,))[metric]


#: Poolings of the second channel tried by ``grid="full"``: (pooling, pool_k, lse_beta).
POOLING_GRID: tuple[tuple[str, int, float], ...] = (("max", 2, 1.0), ("topk", 2, 1.0), ("lse", 2, 1.0),
                                                    ("lse", 2, 0.3))


def _with(config: RetrieverConfig, analyzer: Any, pooling: tuple[str, int, float]) -> RetrieverConfig:
    d = config.to_config()
    d["analyzer"] = analyzer
    d["channels"][1].update(pooling=pooling[0], pool_k=pooling[1], lse_beta=pooling[2])
    return RetrieverConfig.from_config(d)


def retriever_run(ds: EvalDataset, queries: Sequence[EvalQuery], k: int, config: RetrieverConfig, *,
                  alpha: Any = "loco", backend: str = "auto", metric: str | None = None,
                  grid: str = "alpha", progress: bool | None = False) -> Run:
    """Rank ``ds``'s sessions for ``queries`` with a Retriever configuration.

    Parameters
    ----------
    alpha : "loco", float or None
        "loco": the weight of the first of two channels chosen by cross-validation
        (module docstring); a float: weights ``(alpha, 1 - alpha)``; None: the
        configuration's own weights.
    metric : str, optional
        Selection metric of "loco" (default ``hit@1`` on LoCoMo, ``recall_all@5`` otherwise).
    grid : {"alpha", "full"}
        What "loco" selects: alpha alone (on the configuration's analyzer and
        pooling), or every analyzer of :data:`gpuir.analysis.ANALYZERS` x the
        second channel's pooling (:data:`POOLING_GRID`) x alpha -- the selection
        that chose the default configuration, so its held-out figure is the
        honest one for it.
    progress : bool or None
        A progress bar over the settings searched (None: on a terminal only).
    """
    from ..analysis import ANALYZERS
    from .stats import leave_one_group_out

    t0 = time.perf_counter()
    texts, wheres = [q.text for q in queries], haystack_wheres(ds, queries)
    if alpha != "loco" or grid == "alpha":
        configs = {(config.analyzer, None): config}
    elif grid == "full":
        configs = {(an, pool): _with(config, an, pool) for an in ANALYZERS for pool in POOLING_GRID}
    else:
        raise ValueError(f"grid must be 'alpha' or 'full', got {grid!r}")
    info: dict[str, Any] = {}
    if alpha != "loco":
        r = build_retriever(ds, config)
        ran = r.search_channels(texts, where=wheres, unit="session", backend=backend)
        w = None if alpha is None else (float(alpha), 1.0 - float(alpha))
        ranked, scores = _ranked(ds, r, *_arrays(r.fuse_channels(ran, k, weights=w)))
        info = {"alpha": alpha}
    else:
        if len(config.channels) != 2:
            raise ValueError(f"--alpha loco weighs two channels; the configuration has {len(config.channels)}")
        metric = metric or ("hit@1" if ds.name == "locomo" else "recall_all@5")
        scored = np.array([q.scored for q in queries], dtype=bool)
        groups = loco_folds(queries)
        runs, per = {}, {}
        ran = None
        for key, cfg in progress_bar(configs.items(), total=len(configs), desc="fusion settings", unit="setting",
                                     enabled=progress):
            r = build_retriever(ds, cfg)
            ran = r.search_channels(texts, where=wheres, unit="session", backend=backend)
            for a in ALPHAS:
                runs[(*key, a)] = _ranked(ds, r, *_arrays(r.fuse_channels(ran, k, weights=(a, 1.0 - a))))
                per[(*key, a)] = per_query(ds, queries, runs[(*key, a)][0], metric)[scored]
        lo = leave_one_group_out(per, groups[scored])
        chosen = dict(lo["chosen"])
        ranked, scores = padded_arrays(len(queries), k)
        for i, g in enumerate(groups.tolist()):
            s = chosen.get(g, lo["best_overall"])  # groups without scored questions: the overall choice
            ranked[i], scores[i] = runs[s][0][i], runs[s][1][i]

        def name(s):
            return s[-1] if grid == "alpha" else {"analyzer": s[0], "pooling": list(s[1]), "alpha": s[2]}

        info = {"alpha": "loco", "grid": grid, "alpha_per_group": {str(g): name(s) for g, s in chosen.items()},
                "select_metric": metric, "heldout_mean": lo["mean"], "best_overall_alpha": name(lo["best_overall"]),
                "best_overall_mean_in_sample": lo["best_overall_mean"], "n_settings": len(per)}
    rec = ran["records"] if ran is not None else None
    return Run(ranked, scores, {
        "backend": None if rec is None else rec.meta.get("backend"),
        "backend_reason": None if rec is None else rec.meta.get("backend_reason"),
        "retriever_config": config.to_config(), **info,
        "memory": {"records": len(r.memory), "sessions": len(r.catalog.session_names)},
        "timings": {"total_s": time.perf_counter() - t0}})


def _arrays(res) -> tuple[np.ndarray, np.ndarray]:
    return res.ids, res.scores


def _args(p) -> None:
    g = p.add_argument_group("retriever methods (fusion)")
    g.add_argument("--retriever-config", metavar="CONFIG.json", default=None,
                   help="a Retriever configuration (default: the LOCO-selected one, docs/retriever.md)")
    g.add_argument("--loco-grid", default=None, choices=("alpha", "full"),
                   help="what --alpha loco selects: alpha alone, or analyzer x pooling x alpha (the selection "
                        "that chose the default; default: full on LoCoMo, alpha elsewhere)")


def _from_args(a) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if getattr(a, "retriever_config", None):
        out["config"] = a.retriever_config
    if getattr(a, "loco_grid", None):
        out["grid"] = a.loco_grid
    if getattr(a, "alpha", None) is not None:
        out["alpha"] = a.alpha if a.alpha == "loco" else float(a.alpha)
    for name in ("pooling", "dense_mode", "fusion_norm"):
        v = getattr(a, name, None)
        if v is not None:
            out[name] = v
    # --pool-k and --lse-beta have defaults: they count only with the pooling they set
    if out.get("pooling") == "topk" and getattr(a, "pool_k", None) is not None:
        out["pool_k"] = a.pool_k
    if out.get("pooling") == "lse" and getattr(a, "lse_beta", None) is not None:
        out["lse_beta"] = a.lse_beta
    return out


def config_from_options(config: Any = None, pooling: str | None = None, pool_k: int | None = None,
                        lse_beta: float | None = None, dense_mode: str | None = None,
                        fusion_norm: str | None = None) -> RetrieverConfig:
    """The configuration of ``--method fusion``: a file, else the default with the options applied."""
    if config is not None:
        return config if isinstance(config, RetrieverConfig) else RetrieverConfig.load(config)
    cfg = default_config().to_config()
    second = cfg["channels"][1]
    if dense_mode not in (None, "bm25_turn", "late"):
        raise ValueError(f"--method fusion runs channels bm25_pool (--dense-mode bm25_turn) or late, not {dense_mode!r}")
    if dense_mode == "late":
        second["kind"] = "late"
    if pooling is not None:
        if pooling not in ("max", "topk", "lse"):
            raise ValueError(f"--method fusion pools with max, topk or lse, not {pooling!r}")
        second["pooling"] = pooling
    if pool_k is not None:
        second["pool_k"] = int(pool_k)
    if lse_beta is not None:
        second["lse_beta"] = float(lse_beta)
    if fusion_norm is not None:
        cfg["fusion"] = fusion_norm
    return RetrieverConfig.from_config(cfg)


@register_method("fusion", help="Retriever over a memory of turn records: session BM25 + turn BM25 max-pooled, "
                 "z-score fusion, alpha by leave-one-conversation-out (--alpha 0.6: the default configuration)",
                 add_arguments=_args, from_args=_from_args)
def fusion_method(ds: EvalDataset, queries: Sequence[EvalQuery], k: int, *, backend: str = "auto",
                  progress: bool = False, config: Any = None, alpha: Any = None, grid: str | None = None,
                  **options: Any) -> Run:
    """Retriever fusion (module docstring); ``alpha`` None: "loco", or the file's own weights with ``config``.

    ``grid`` (of "loco"): default "full" on LoCoMo with the default configuration, else "alpha".
    """
    cfg = config_from_options(config, **{x: y for x, y in options.items()
                                         if x in ("pooling", "pool_k", "lse_beta", "dense_mode", "fusion_norm")})
    if alpha is None and config is None:
        alpha = "loco"
    if grid is None:
        grid = "full" if ds.name == "locomo" and config is None and not options else "alpha"
    return retriever_run(ds, queries, k, cfg, alpha=alpha, backend=backend, grid=grid, progress=progress)


__all__ += ["ChannelConfig", "build_retriever", "config_from_options", "fusion_method"]
