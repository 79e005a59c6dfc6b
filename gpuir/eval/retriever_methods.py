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
analyzer, the second channel's pooling and the weight of a ``temporal`` channel
(:data:`TEMPORAL_WEIGHTS`, 0 = none): the selection that decides the default
configuration (issue 19). ``--alpha 0.75`` runs the default configuration's
first two weights as a user would.

Every ranking is the Retriever's own (``search_channels`` / ``fuse_channels`` /
``results``, or ``search``): the harness scores, pools and fuses nothing itself.
``--dense-mode early`` runs over a memory whose records are whole sessions
(:func:`session_records`) instead of turns.
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
from ..retrieve import POOLINGS, ChannelConfig, Retriever, RetrieverConfig, default_config
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

#: What the records of an evaluation memory are: the sessions' turns, or each session as one record.
RECORD_UNITS: tuple[str, ...] = ("turns", "sessions")


def session_records(ds: EvalDataset) -> list[dict[str, Any]]:
    """One record per session of ``ds`` (:func:`gpuir.eval.records.dataset_records`): the whole session text.

    A ``dense`` channel over these records is early dense retrieval (each session
    encoded as one passage, truncated at the encoder's max_seq_length).
    """
    if ds.unit != "session":
        raise ValueError(f"the retriever methods rank sessions: load {ds.name} with unit='session', not {ds.unit!r}")
    return dataset_records(ds)


def build_retriever(ds: EvalDataset, config: RetrieverConfig, records: str = "turns",
                    progress: bool = False) -> Retriever:
    """A memory of ``ds``'s records with a retriever of ``config``.

    Parameters
    ----------
    records : {"turns", "sessions"}
        The memory's records: each session's turns (:func:`session_turn_records`), or
        each session as one record (:func:`session_records`).
    progress : bool
        A progress bar while the retriever encodes records (dense channels).

    The memory is cached per data set, record unit and analyzer, the retriever per
    configuration (the last one of each), so a grid over poolings and weights
    indexes once per analyzer.
    """
    if records not in RECORD_UNITS:
        raise ValueError(f"records must be one of {', '.join(RECORD_UNITS)}, got {records!r}")
    dkey = (ds.name, ds.source, ds.n_docs, tuple(sorted(ds.options.items(), key=str)), records)
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
        recs = session_turn_records(ds) if records == "turns" else session_records(ds)
        for s in range(0, len(recs), 50_000):
            mem.add(recs[s: s + 50_000])
        _CACHE["memory"] = (ds, (dkey, repr(analyzer)), mem)
    r = Retriever(mem, config, encoder=_shared_encoder(config), progress=bool(progress))
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


def ranked_from_results(ds: EvalDataset, res: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Document numbers and scores of a session-unit :class:`~gpuir.retrieve.RetrieverResults`.

    Returns
    -------
    ranked : ndarray (B, k) int64, document numbers of ``ds`` (-1 pads)
    scores : ndarray (B, k) float32 (-inf pads)
    """
    idx = ds.doc_index
    ranked, scores = padded_arrays(len(res.keys), k)
    for i, keys in enumerate(res.keys):
        n = min(k, len(keys))
        ranked[i, :n] = [idx[s] for s in keys[:n]]
        scores[i, :n] = res.scores[i, :n]
    return ranked, scores


def _fused(ds: EvalDataset, r: Retriever, ran: dict[str, Any], k: int,
           weights: Sequence[float] | None) -> tuple[np.ndarray, np.ndarray]:
    """Fuse ``ran`` (the Retriever's :meth:`~gpuir.retrieve.Retriever.fuse_channels`) and rank ``ds``'s documents."""
    return ranked_from_results(ds, r.results(ran, r.fuse_channels(ran, k, weights=weights)), k)


def _without_extra(ran: dict[str, Any], n: int = 2) -> dict[str, Any]:
    """``ran`` (of :meth:`Retriever.search_channels`) restricted to its first ``n`` channels: the search of
    a configuration without the others (channels are independent; fusion sees only these)."""
    out = dict(ran)
    out["channels"], out["results"] = list(ran["channels"][:n]), list(ran["results"][:n])
    if ran.get("ran") is not None:
        out["ran"] = np.asarray(ran["ran"])[:, :n]
    out["timings"], out["notes"] = {}, []
    return out


def _row_subset(ran: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """``ran`` (of :meth:`Retriever.search_channels`) for the questions ``rows`` only.

    Fusion is per question (each over the channels that ran for it), so fusing the
    subset gives exactly those questions' rows of fusing the whole batch.
    """
    from ..results import SearchResults

    out = dict(ran)
    out["queries"] = [ran["queries"][i] for i in rows]
    out["results"] = [SearchResults(x.ids[rows], x.scores[rows]) for x in ran["results"]]
    if ran.get("ran") is not None:
        out["ran"] = np.asarray(ran["ran"])[rows]
    if isinstance(ran.get("where"), list):
        out["where"] = [ran["where"][i] for i in rows]
    out["records"] = None  # record hits of the whole batch: not this subset's
    out["timings"], out["notes"] = {}, []
    return out


def per_query(ds: EvalDataset, queries: Sequence[EvalQuery], ranked: np.ndarray, metric: str) -> np.ndarray:
    from .metrics import compute_metrics

    idx = ds.doc_index
    gold = [{idx.get(d, -2 - j): v for j, (d, v) in enumerate(q.gold.items())} for q in queries]
    name, cut = metric.split("@")
    return compute_metrics(ranked, gold, cutoffs=(int(cut),), metrics=(name,))[metric]


#: Poolings of the second channel tried by ``grid="full"``: (pooling, pool_k, lse_beta).
POOLING_GRID: tuple[tuple[str, int, float], ...] = (("max", 2, 1.0), ("topk", 2, 1.0), ("lse", 2, 1.0),
                                                    ("lse", 2, 0.3))
#: Weights of the ``temporal`` channel tried by ``grid="full"`` (0: no temporal channel), issue 19.
TEMPORAL_WEIGHTS: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5, 1.0)


def _with(config: RetrieverConfig, analyzer: Any, pooling: tuple[str, int, float],
          temporal: bool = False) -> RetrieverConfig:
    """``config``'s two BM25 channels with this analyzer and second-channel pooling (plus a temporal channel)."""
    d = config.to_config()
    d["analyzer"] = analyzer
    d["channels"] = [c for c in d["channels"] if c["kind"] != "temporal"]
    d["channels"][1].update(pooling=pooling[0], pool_k=pooling[1], lse_beta=pooling[2])
    if temporal:
        d["channels"].append(ChannelConfig("temporal", depth=100, weight=1.0).__dict__)
    return RetrieverConfig.from_config(d)


def _weights(config: RetrieverConfig, alpha: float | None) -> list[float] | None:
    """Fusion weights: ``(alpha, 1 - alpha)`` for the first two channels, the others as configured."""
    if alpha is None:
        return None
    return [float(alpha), 1.0 - float(alpha), *(c.weight for c in config.channels[2:])]


def retriever_run(ds: EvalDataset, queries: Sequence[EvalQuery], k: int, config: RetrieverConfig, *,
                  alpha: Any = "loco", backend: str = "auto", metric: str | None = None,
                  grid: str = "alpha", progress: bool | None = False, records: str = "turns",
                  temporal_weights: Sequence[float] | None = None) -> Run:
    """Rank ``ds``'s sessions for ``queries`` with a Retriever configuration.

    Every ranking is the Retriever's: :meth:`~gpuir.retrieve.Retriever.search_channels`
    once per configuration searched, :meth:`~gpuir.retrieve.Retriever.fuse_channels` per
    weight setting, each question confined to its haystack (:func:`haystack_wheres`) and
    asked at its own time (:func:`gpuir.eval.records.question_times`).

    Parameters
    ----------
    alpha : "loco", float or None
        "loco": the weight of the first of two channels chosen by cross-validation
        (module docstring); a float: weights ``(alpha, 1 - alpha)`` of the first two
        channels (any others as configured); None: the configuration's own weights.
    metric : str, optional
        Selection metric of "loco" (default ``hit@1`` on LoCoMo, ``recall_all@5`` otherwise).
    grid : {"alpha", "full"}
        What "loco" selects: alpha alone (on the configuration's analyzer and
        pooling), or every analyzer of :data:`gpuir.analysis.ANALYZERS` x the
        second channel's pooling (:data:`POOLING_GRID`) x alpha x the temporal
        channel's weight (``temporal_weights``; 0: no temporal channel) -- the
        selection that chose the default configuration, so its held-out figure is
        the honest one for it.
    records : {"turns", "sessions"}
        The memory's records (:func:`build_retriever`).
    temporal_weights : sequence of float, optional
        Weights of the temporal channel tried by ``grid="full"`` (default
        :data:`TEMPORAL_WEIGHTS`; ``(0,)``: the selection without a temporal channel).
    progress : bool or None
        A progress bar over the settings searched (None: on a terminal only).
    """
    from ..analysis import ANALYZERS
    from .records import question_times
    from .stats import leave_one_group_out

    t0 = time.perf_counter()
    texts, wheres = [q.text for q in queries], haystack_wheres(ds, queries)
    now = int(time.time() * 1000)
    ats = [now if a is None else a for a in question_times(ds, queries)]
    tw = tuple(float(w) for w in (TEMPORAL_WEIGHTS if temporal_weights is None else temporal_weights))
    if not tw or any(not np.isfinite(w) or w < 0 for w in tw):
        raise ValueError(f"temporal weights must be finite numbers >= 0, got {list(tw)}")
    if alpha != "loco" or grid == "alpha":
        configs = {(config.analyzer, None): config}
    elif grid == "full":
        with_t = any(w > 0 for w in tw)
        configs = {(an, pool): _with(config, an, pool, temporal=with_t) for an in ANALYZERS for pool in POOLING_GRID}
    else:
        raise ValueError(f"grid must be 'alpha' or 'full', got {grid!r}")

    def search(cfg: RetrieverConfig):
        r = build_retriever(ds, cfg, records=records, progress=bool(progress))
        return r, r.search_channels(texts, where=wheres, unit="session", backend=backend, at=ats)

    info: dict[str, Any] = {}
    if alpha != "loco":
        r, ran = search(config)
        ranked, scores = _fused(ds, r, ran, k, _weights(config, alpha))
        info = {"alpha": alpha}
    else:
        if len(config.channels) < 2:
            raise ValueError(f"--alpha loco weighs two channels; the configuration has {len(config.channels)}")
        metric = metric or ("hit@1" if ds.name == "locomo" else "recall_all@5")
        cut = int(metric.split("@")[1])
        scored = np.array([q.scored for q in queries], dtype=bool)
        groups = loco_folds(queries)
        per: dict[tuple, np.ndarray] = {}
        for key, cfg in progress_bar(configs.items(), total=len(configs), desc="fusion settings", unit="setting",
                                     enabled=progress):
            r, ran = search(cfg)
            extra = grid == "full" and len(cfg.channels) > 2
            base = _without_extra(ran) if extra else ran
            if extra:  # the questions the temporal channel ran for (a parsed window): only their fusion changes
                t_rows = np.flatnonzero(np.asarray(ran["ran"])[:, 2])
                t_ran, t_queries = _row_subset(ran, t_rows), [queries[i] for i in t_rows]
            for a in ALPHAS:
                # the selection needs the top `cut` only; the chosen settings are re-run at depth k below
                v0 = per_query(ds, queries, _fused(ds, r, base, cut, _weights(cfg, a)[:len(base["channels"])])[0],
                                metric)
                if grid != "full":
                    per[(*key, a, None)] = v0[scored]
                    continue
                for w in tw:
                    v = v0
                    if w > 0 and extra and t_rows.size:
                        v = v0.copy()
                        v[t_rows] = per_query(ds, t_queries, _fused(ds, r, t_ran, cut, [a, 1.0 - a, w])[0], metric)
                    per[(*key, a, w)] = v[scored]
        lo = leave_one_group_out(per, groups[scored])
        chosen = dict(lo["chosen"])
        ranked, scores = padded_arrays(len(queries), k)
        picks = [chosen.get(g, lo["best_overall"]) for g in groups.tolist()]  # unscored groups: the overall choice
        for key in sorted({s[:2] for s in picks}, key=repr):
            r, ran = search(configs[key])
            for s in sorted({s for s in picks if s[:2] == key}, key=repr):
                a, w = s[2], s[3]
                if w is None:
                    sub, wts = ran, _weights(configs[key], a)
                elif w == 0:
                    sub, wts = (_without_extra(ran) if len(configs[key].channels) > 2 else ran), [a, 1.0 - a]
                else:
                    sub, wts = ran, [a, 1.0 - a, w]
                rk, sc = _fused(ds, r, sub, k, wts)
                rows = [i for i, p in enumerate(picks) if p == s]
                ranked[rows], scores[rows] = rk[rows], sc[rows]

        def name(s):
            if grid == "alpha":
                return s[2]
            return {"analyzer": s[0], "pooling": list(s[1]), "alpha": s[2], "temporal_weight": s[3]}

        info = {"alpha": "loco", "grid": grid, "alpha_per_group": {str(g): name(s) for g, s in chosen.items()},
                "select_metric": metric, "heldout_mean": lo["mean"], "best_overall_alpha": name(lo["best_overall"]),
                "best_overall_mean_in_sample": lo["best_overall_mean"], "n_settings": len(per)}
        if grid == "full":
            info["temporal_weights"] = list(tw)
    rec = ran["records"]
    return Run(ranked, scores, {
        "backend": None if rec is None else rec.meta.get("backend"),
        "backend_reason": None if rec is None else rec.meta.get("backend_reason"),
        "retriever_config": config.to_config(), "records": records, **info,
        "memory": {"records": len(r.memory)},
        "timings": {"total_s": time.perf_counter() - t0}})


def _floats(s: str) -> list[float]:
    import argparse

    try:
        return [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


def retriever_arguments(p) -> None:
    g = p.add_argument_group("retriever methods (fusion, dense, late, rrf)")
    g.add_argument("--retriever-config", metavar="CONFIG.json", default=None,
                   help="a Retriever configuration (default: the LOCO-selected one, docs/retriever.md)")
    g.add_argument("--loco-grid", default=None, choices=("alpha", "full"),
                   help="what --alpha loco selects: alpha alone, or analyzer x pooling x alpha x temporal weight "
                        "(the selection that chose the default; default: full on LoCoMo, alpha elsewhere)")
    g.add_argument("--temporal-weights", type=_floats, default=None, metavar="W1,W2",
                   help="temporal channel weights tried by --loco-grid full, 0 = no temporal channel "
                        f"(default: {','.join(str(w) for w in TEMPORAL_WEIGHTS)}; 0 alone: the selection "
                        "without it)")
    g.add_argument("--encoder", default=None, metavar="NAME_OR_PATH",
                   help="sentence-transformers model name or folder of the dense channels (default: the shipped "
                        "all-MiniLM-L6-v2)")
    g.add_argument("--pooling", default=None, choices=POOLINGS,
                   help="pooling of turn scores to sessions: the second channel of fusion/rrf, or late "
                        "(default: the configuration's; late: max)")
    g.add_argument("--pool-k", type=int, default=3, help="turns averaged by topk pooling (default: 3)")
    g.add_argument("--lse-beta", type=float, default=10.0, help="lse pooling temperature (default: 10)")
    g.add_argument("--dense-mode", default=None, choices=("late", "early", "bm25_turn"),
                   help="second channel of fusion / rrf: dense late interaction over turns (late), dense over "
                        "sessions encoded whole (early) or turn BM25 pooled (bm25_turn) (default: fusion "
                        "bm25_turn, rrf late)")
    g.add_argument("--alpha", default=None,
                   help="weight of the first channel of fusion (the second gets 1 - alpha), a float or 'loco' "
                        "(leave-one-conversation-out; default)")
    g.add_argument("--fusion-norm", default=None, choices=("z", "minmax"),
                   help="fusion of --method fusion (default: z)")
    g.add_argument("--k-rrf", type=float, default=60.0, help="RRF constant of --method rrf (default: 60)")


def retriever_from_args(a) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if getattr(a, "retriever_config", None):
        out["config"] = a.retriever_config
    if getattr(a, "loco_grid", None):
        out["grid"] = a.loco_grid
    if getattr(a, "temporal_weights", None) is not None:
        out["temporal_weights"] = a.temporal_weights
    if getattr(a, "alpha", None) is not None:
        out["alpha"] = a.alpha if a.alpha == "loco" else _alpha(a.alpha)
    for name in ("pooling", "dense_mode", "fusion_norm", "encoder"):
        v = getattr(a, name, None)
        if v is not None:
            out[name] = v
    # --pool-k and --lse-beta have defaults: they count only with the pooling they set
    if out.get("pooling") == "topk" and getattr(a, "pool_k", None) is not None:
        out["pool_k"] = a.pool_k
    if out.get("pooling") == "lse" and getattr(a, "lse_beta", None) is not None:
        out["lse_beta"] = a.lse_beta
    if getattr(a, "k_rrf", 60.0) != 60.0:
        out["k_rrf"] = float(a.k_rrf)
    return out


def _alpha(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise ValueError(f"--alpha takes a number in [0, 1] or 'loco', got {s!r}") from None
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"--alpha takes a number in [0, 1] or 'loco', got {s!r}")
    return v


#: The second channel of each ``--dense-mode`` and the memory records it needs.
DENSE_MODES: dict[str, tuple[str, str]] = {"bm25_turn": ("bm25_pool", "turns"), "late": ("late", "turns"),
                                           "early": ("dense", "sessions")}


def config_from_options(config: Any = None, pooling: str | None = None, pool_k: int | None = None,
                        lse_beta: float | None = None, dense_mode: str | None = None,
                        fusion_norm: str | None = None, encoder: str | None = None) -> RetrieverConfig:
    """The configuration of ``--method fusion``: a file, else the default with the options applied."""
    if config is not None:
        return config if isinstance(config, RetrieverConfig) else RetrieverConfig.load(config)
    cfg = default_config().to_config()
    second = cfg["channels"][1]
    if dense_mode is not None:
        if dense_mode not in DENSE_MODES:
            raise ValueError(f"--dense-mode must be one of {', '.join(DENSE_MODES)}, got {dense_mode!r}")
        second["kind"] = DENSE_MODES[dense_mode][0]
    if pooling is not None:
        if pooling not in POOLINGS:
            raise ValueError(f"--method fusion pools with {', '.join(POOLINGS)}, not {pooling!r}")
        second["pooling"] = pooling
    if pool_k is not None:
        second["pool_k"] = int(pool_k)
    if lse_beta is not None:
        second["lse_beta"] = float(lse_beta)
    if fusion_norm is not None:
        cfg["fusion"] = fusion_norm
    if encoder is not None:
        cfg["encoder"] = encoder
    return RetrieverConfig.from_config(cfg)


def records_for(config: RetrieverConfig, dense_mode: str | None = None) -> str:
    """The memory records a configuration runs over: sessions for early dense (``--dense-mode early``), else turns."""
    return DENSE_MODES[dense_mode][1] if dense_mode is not None else "turns"


@register_method("fusion", help="Retriever over a memory of turn records: session BM25 + turn BM25 pooled, "
                 "z-score fusion, chosen by leave-one-conversation-out over analyzer x pooling x alpha x temporal "
                 "weight (--alpha 0.75: the first two channels' weights of the default configuration)",
                 add_arguments=retriever_arguments, from_args=retriever_from_args)
def fusion_method(ds: EvalDataset, queries: Sequence[EvalQuery], k: int, *, backend: str = "auto",
                  progress: bool = False, config: Any = None, alpha: Any = None, grid: str | None = None,
                  temporal_weights: Sequence[float] | None = None, **options: Any) -> Run:
    """Retriever fusion (module docstring); ``alpha`` None: "loco", or the file's own weights with ``config``.

    ``grid`` (of "loco"): default "full" on LoCoMo with the default configuration, else "alpha".
    """
    opts = {x: y for x, y in options.items() if x in ("pooling", "pool_k", "lse_beta", "dense_mode", "fusion_norm",
                                                      "encoder")}
    unknown = sorted(set(options) - set(opts) - {"k_rrf"})
    if unknown:
        raise ValueError(f"--method fusion does not take {', '.join(unknown)}")
    cfg = config_from_options(config, **opts)
    if alpha is None and config is None:
        alpha = "loco"
    if grid is None:
        grid = "full" if ds.name == "locomo" and config is None and not opts else "alpha"
    return retriever_run(ds, queries, k, cfg, alpha=alpha, backend=backend, grid=grid, progress=progress,
                         records=records_for(cfg, opts.get("dense_mode")), temporal_weights=temporal_weights)


__all__ += ["ChannelConfig", "build_retriever", "config_from_options", "fusion_method", "ranked_from_results",
            "records_for", "retriever_arguments", "retriever_from_args", "session_records"]
