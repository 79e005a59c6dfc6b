"""Named Retriever configurations as evaluation methods: ``--method config`` and ``--method default``.

::

    gpuir eval locomo --method default                       # default_config()
    gpuir eval locomo --method config --config dense_hybrid  # gpuir/data/configs/dense_hybrid.json
    gpuir eval locomo --method config --config my.json       # any RetrieverConfig JSON file
    gpuir eval locomo --method config --config cascade --tune cascade.tau=0,0.05,0.1,0.2 \\
        --select-cost escalated --tolerance 0.005             # tau chosen by cross-validation

A configuration runs through :meth:`gpuir.retrieve.Retriever.search` over a memory
of the data set's turn records (:func:`gpuir.eval.retriever_methods.build_retriever`),
each question confined to its haystack by a ``where`` and asked at its own time
(``at``: LongMemEval's ``question_date``; LoCoMo has none, so the date of the
conversation's last session), ranking sessions.

**Tuned numbers** (``--tune PATH=V1,V2,...``, repeatable; ``PATH`` is a dotted path
into the configuration dict, list items by number: ``cascade.tau``,
``channels.1.weight``) are never set on the evaluation questions in-sample: every
combination runs, and :func:`gpuir.eval.selection.cv_select` picks one per fold
(leave-one-conversation-out on LoCoMo, stratified 5-fold by question type on
LongMemEval) on the other folds' questions; each question is answered by the
setting chosen without it. ``--select-cost escalated --tolerance T`` chooses the
cheapest setting (fewest escalations) within T of the best training mean (the
cascade's parity rule); ``--tune-by route`` (or ``category``) chooses per stratum
(per-question-type thresholds).
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import timezone
from pathlib import Path
from typing import Any

import numpy as np

from ..retrieve import RetrieverConfig, default_config
from .datasets import EvalDataset, EvalQuery
from .runner import Run, register_method

__all__ = ["CONFIG_DIR", "config_run", "load_named_config", "named_configs", "question_times", "set_path"]

#: Folder of the named configurations.
CONFIG_DIR = Path(__file__).resolve().parent.parent / "data" / "configs"

#: Extras a configuration section needs, for the error of a configuration this gpuir cannot run.
_SECTION_EXTRA = {"router": "routing", "cascade": "routing", "type_filter": "routing", "enrich": "routing"}


def named_configs() -> list[str]:
    """Names of the shipped configurations (``gpuir/data/configs/<name>.json``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def load_named_config(name: str | os.PathLike | RetrieverConfig | dict | None) -> RetrieverConfig:
    """A configuration by name (shipped), path (JSON file), dict or object; None or "default": default_config().

    Raises
    ------
    ValueError
        Unknown name (the message lists the shipped ones), unreadable JSON, or a
        configuration this version of :class:`RetrieverConfig` does not accept
        (the message names the file and the field).
    """
    if name is None or (isinstance(name, str) and name == "default"):
        return default_config()
    if isinstance(name, (RetrieverConfig, dict)):
        return RetrieverConfig.from_config(name)
    p = Path(name)
    if not p.suffix and not p.exists():
        p = CONFIG_DIR / f"{name}.json"
        if not p.exists():
            raise ValueError(f"no configuration named {str(name)!r}: choose one of {', '.join(named_configs())}, "
                             "or give a path to a RetrieverConfig JSON file")
    if not p.is_file():
        raise ValueError(f"configuration file not found: {p}")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not JSON ({e})") from None
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if not k.startswith("_")}  # "_comment" etc.
    try:
        return RetrieverConfig.from_config(data)
    except (ValueError, TypeError) as e:
        raise ValueError(f"configuration {p.name} does not load with this gpuir's RetrieverConfig: {e} "
                         "(the cascade, router, type_filter, enrich, parallel fields and the temporal / "
                         "entity channels come with issue 13's retriever)") from None


def set_path(cfg: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``cfg`` with ``path`` (dotted, list items by number) set to ``value``."""
    out = json.loads(json.dumps(cfg))
    node: Any = out
    parts = path.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            try:
                j = int(part)
                node[j]
            except (ValueError, IndexError):
                raise ValueError(f"--tune {path}: {part!r} is not an item number of a list of {len(node)}") from None
            if last:
                node[j] = value
            else:
                node = node[j]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                if node.get(part) is None:
                    node[part] = {}
                node = node[part]
        else:
            raise ValueError(f"--tune {path}: {part!r} is below a value, not a section")  # noqa: TRY004
    return out


def question_times(ds: EvalDataset, queries: Sequence[EvalQuery]) -> list[int | None]:
    """When each question is asked, epoch ms (UTC): ``q.date``, else the latest date of its haystack, else None."""
    idx = ds.doc_index
    out: list[int | None] = []
    for q in queries:
        dt = q.date
        if dt is None and q.candidates:
            dates = [ds.doc_dates[idx[d]] for d in q.candidates if d in idx and ds.doc_dates[idx[d]] is not None]
            hd = [d for d in (q.meta.get("haystack_dates") or []) if d is not None]
            dates = dates + hd
            dt = max(dates) if dates else None
        if dt is None:
            out.append(None)
        else:
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=timezone.utc)
            out.append(round(dt.timestamp() * 1000))
    return out


def _search_kwargs(r: Any, ats: list[int | None]) -> dict[str, Any]:
    """``at=`` for a Retriever.search that takes it (issue 13), else nothing."""
    try:
        params = inspect.signature(r.search).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return {}
    if "at" in params and any(a is not None for a in ats):
        now = int(time.time() * 1000)
        return {"at": [now if a is None else a for a in ats]}
    return {}


def _meta_rows(meta: dict[str, Any], B: int) -> dict[str, Any]:
    """Per-question decisions of a search's meta: escalated, route, widened (absent ones left out)."""
    out: dict[str, Any] = {}
    if meta.get("escalated") is not None:
        out["escalated"] = np.asarray(meta["escalated"], dtype=bool).reshape(B)
    if meta.get("route") is not None:
        out["route"] = [str(x) for x in meta["route"]]
    if meta.get("widened") is not None:
        out["widened"] = np.asarray(meta["widened"], dtype=bool).reshape(B)
    if meta.get("windows") is not None:
        out["window"] = np.array([w is not None for w in meta["windows"]], dtype=bool)
    return out


def config_search(ds: EvalDataset, queries: Sequence[EvalQuery], k: int, config: RetrieverConfig, *,
                  backend: str = "auto", batch_size: int = 256, progress: bool = False
                  ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Rank ``ds``'s sessions for ``queries`` with one configuration.

    Returns
    -------
    ranked : ndarray (B, k) int64, document numbers, -1 pads
    scores : ndarray (B, k) float32, -inf pads
    info : dict with ``decisions`` (per-question arrays: escalated, route, widened, window, when
        the retriever reports them), ``timings`` (summed stage seconds), ``backend``, ``memory``.
    """
    from .retriever_methods import build_retriever, haystack_wheres

    r = build_retriever(ds, config)
    texts, wheres, ats = [q.text for q in queries], haystack_wheres(ds, queries), question_times(ds, queries)
    B = len(texts)
    ranked = np.full((B, k), -1, np.int64)
    scores = np.full((B, k), -np.inf, np.float32)
    names, idx = r.catalog.session_names, ds.doc_index
    decisions: dict[str, list] = {}
    stage: dict[str, float] = {}
    backend_used = None
    starts = list(range(0, B, batch_size))
    bar = None
    if progress and len(starts) > 1:
        from tqdm.auto import tqdm

        bar = tqdm(total=B, desc="search", unit="q", file=sys.stderr)
    for s in starts:
        e = min(B, s + batch_size)
        res = r.search(texts[s:e], k=k, where=wheres[s:e], unit="session", backend=backend,
                       **_search_kwargs(r, ats[s:e]))
        for i, row in enumerate(res.numbers):
            for j, n in enumerate(row.tolist()[:k]):
                if n >= 0:
                    ranked[s + i, j] = idx[names[n]]
                    scores[s + i, j] = res.scores[i, j]
        for name, v in _meta_rows(res.meta, e - s).items():
            decisions.setdefault(name, []).extend(list(v))
        for st, sec in (res.meta.get("timings") or {}).items():
            stage[st] = stage.get(st, 0.0) + float(np.sum(sec))
        backend_used = res.meta.get("backend", backend_used)
        if bar is not None:
            bar.update(e - s)
    if bar is not None:
        bar.close()
    if backend_used is None:
        from ..backends import resolve_backend

        backend_used = resolve_backend(backend)[0]
    dec = {n: (np.array(v, dtype=bool) if n != "route" else list(v)) for n, v in decisions.items()}
    return ranked, scores, {"decisions": dec, "timings": stage, "backend": backend_used,
                            "memory": {"records": len(r.memory), "sessions": len(names)}}


def _decision_summary(dec: dict[str, Any], categories: Sequence[str] | None = None) -> dict[str, Any]:
    """Rates of the per-question decisions (and, given each question's category, the skip rate per category)."""
    out: dict[str, Any] = {}
    for n in ("escalated", "widened", "window"):
        if n in dec and len(dec[n]):
            out[f"{n}_rate"] = float(np.mean(dec[n]))
    if "escalated_rate" in out:
        out["skip_rate"] = 1.0 - out["escalated_rate"]
        if categories is not None and len(categories) == len(dec["escalated"]):
            cats = np.asarray(categories, dtype=object)
            esc = np.asarray(dec["escalated"], dtype=bool)
            out["skip_rate_by_category"] = {str(c): float(1.0 - esc[cats == c].mean())
                                            for c in sorted(set(cats.tolist()), key=str)}
    if "route" in dec:
        vals, cnt = np.unique(np.array(dec["route"], dtype=object).astype(str), return_counts=True)
        out["routes"] = {str(v): int(c) for v, c in zip(vals, cnt)}
    return out


def has_cascade(cfg: dict[str, Any] | None) -> bool:
    """Whether a configuration dict (or one of its router's routes) has a cascade.

    Without one, ``meta["escalated"]`` is all False although every channel ran, so the
    evaluation reports no skip rate for it.
    """
    if not cfg:
        return False
    if cfg.get("cascade"):
        return True
    router = cfg.get("router") or {}
    return any(has_cascade(r) for r in [*(router.get("routes") or {}).values(), router.get("default")])


def _parse_value(s: str) -> Any:
    try:
        return json.loads(s)
    except json.JSONDecodeError:
        return s


def parse_tune(specs: Sequence[str] | dict[str, Sequence[Any]] | None) -> dict[str, list[Any]]:
    """``["cascade.tau=0,0.1", ...]`` -> ``{"cascade.tau": [0, 0.1]}`` (values read as JSON where they parse)."""
    if not specs:
        return {}
    if isinstance(specs, dict):
        return {str(k): list(v) for k, v in specs.items()}
    out: dict[str, list[Any]] = {}
    for spec in specs:
        if "=" not in spec:
            raise ValueError(f"--tune takes PATH=V1,V2,..., got {spec!r}")
        path, vals = spec.split("=", 1)
        values = [_parse_value(v.strip()) for v in vals.split(",") if v.strip()]
        if not path or not values:
            raise ValueError(f"--tune takes PATH=V1,V2,..., got {spec!r}")
        out[path.strip()] = values
    return out


def config_run(ds: EvalDataset, queries: Sequence[EvalQuery], k: int, config: RetrieverConfig, *,
               backend: str = "auto", progress: bool = False, tune: Any = None, metric: str | None = None,
               select_cost: str | None = None, tolerance: float = 0.0, tune_by: str | None = None,
               cv: str = "auto") -> Run:
    """Run a configuration; with ``tune``, the cross-validated selection of the module docstring."""
    from .retriever_methods import per_query
    from .selection import cv_folds, cv_select

    t0 = time.perf_counter()
    grid = parse_tune(tune)
    base = dict(config) if isinstance(config, dict) else config.to_config()
    if not grid:
        ranked, scores, info = config_search(ds, queries, k, config, backend=backend, progress=progress)
        if not has_cascade(base):  # without a cascade every channel runs: no skip rate to report
            info["decisions"].pop("escalated", None)
        return Run(ranked, scores, {
            "backend": info["backend"], "retriever_config": base, "memory": info["memory"],
            "decisions": _decision_summary(info["decisions"], [q.category for q in queries]),
            "per_query_decisions": {n: (v.tolist() if isinstance(v, np.ndarray) else v)
                                    for n, v in info["decisions"].items()},
            "stage_seconds": info["timings"], "timings": {"total_s": time.perf_counter() - t0}})
    if select_cost not in (None, "escalated"):
        raise ValueError(f"--select-cost must be 'escalated', got {select_cost!r}")
    if tune_by not in (None, "route", "category"):
        raise ValueError(f"--tune-by must be 'route' or 'category', got {tune_by!r}")
    metric = metric or ("hit@1" if ds.name == "locomo" else "recall_all@5")
    paths = list(grid)
    settings = list(itertools.product(*(grid[p] for p in paths)))
    scored = np.array([q.scored for q in queries], dtype=bool)
    if scored.sum() < 2:
        raise ValueError("cross-validated tuning needs at least two scored questions")
    runs, per, cost, infos = {}, {}, {}, {}
    for st in settings:
        d = base
        for p, v in zip(paths, st):
            d = set_path(d, p, v)
        cfg = load_named_config(d)
        ranked, scores, info = config_search(ds, queries, k, cfg, backend=backend, progress=progress)
        runs[st], infos[st] = (ranked, scores), info
        per[st] = per_query(ds, queries, ranked, metric)[scored]
        if select_cost == "escalated":
            esc = info["decisions"].get("escalated")
            if esc is None:
                raise ValueError("--select-cost escalated: this configuration reports no escalation "
                                 "(meta['escalated']); it has no cascade")
            cost[st] = np.asarray(esc, dtype=np.float64)[scored]
    folds = cv_folds(queries, scheme=cv)
    by = None
    if tune_by == "category":
        by = np.array([q.category for q in queries], dtype=object)[scored]
    elif tune_by == "route":
        first = infos[settings[0]]["decisions"].get("route")
        if first is None:
            raise ValueError("--tune-by route: the configuration reports no route (meta['route'])")
        by = np.array(first, dtype=object)[scored]
    sel = cv_select(per, folds[scored], cost=cost or None, tolerance=tolerance, by=by)
    ranked = np.full((len(queries), k), -1, np.int64)
    scores = np.full((len(queries), k), -np.inf, np.float32)
    chosen = sel["chosen"]
    esc_all = np.zeros(len(queries), dtype=bool)
    has_esc = (has_cascade(base) or any(p.startswith("cascade") for p in paths)) and all("escalated" in infos[s]["decisions"] for s in settings)
    sc_rows = np.flatnonzero(scored)
    setting_of = {int(i): s for i, s in zip(sc_rows, sel["heldout_setting"])}
    for i, f in enumerate(folds.tolist()):
        s = setting_of.get(i)
        if s is None:  # unscored: the fold's choice (by stratum: the all-question choice)
            c = chosen.get(f, sel["best_overall"])
            s = c if not isinstance(c, dict) else next(iter(c.values()))
        ranked[i], scores[i] = runs[s][0][i], runs[s][1][i]
        if has_esc:
            esc_all[i] = infos[s]["decisions"]["escalated"][i]

    def named(s):
        return dict(zip(paths, s))

    def show(c):
        return {str(t): named(v) for t, v in c.items()} if isinstance(c, dict) else named(c)

    decisions = {"escalated": esc_all} if has_esc else {}
    return Run(ranked, scores, {
        "backend": infos[settings[0]]["backend"], "retriever_config": base, "memory": infos[settings[0]]["memory"],
        "tuned": {"grid": grid, "select_metric": metric, "cv": "leave-one-conversation-out" if ds.name == "locomo"
                  and cv == "auto" else cv, "tune_by": tune_by, "select_cost": select_cost, "tolerance": tolerance,
                  "chosen_per_fold": {str(f): show(c) for f, c in chosen.items()},
                  "heldout_mean": sel["mean"], "in_sample_choice": show(sel["best_overall"]),
                  "in_sample_mean": sel["best_overall_mean"], "n_settings": len(settings)},
        "decisions": _decision_summary(decisions, [q.category for q in queries]),
        "timings": {"total_s": time.perf_counter() - t0}})


def _args(p) -> None:
    g = p.add_argument_group("named configurations (--method config / default)")
    names = ", ".join(named_configs()) or "none shipped"
    g.add_argument("--config", metavar="NAME|PATH", default=None,
                   help=f"configuration of --method config: a shipped name ({names}) or a JSON file "
                        "(default: none; --method default runs default_config())")
    g.add_argument("--tune", metavar="PATH=V1,V2", action="append", default=None,
                   help="a configuration number chosen by cross-validation from these values, e.g. "
                        "cascade.tau=0,0.05,0.1 (repeatable; default: nothing tuned)")
    g.add_argument("--select-metric", default=None,
                   help="metric of --tune's selection (default: hit@1 on LoCoMo, recall_all@5 otherwise)")
    g.add_argument("--select-cost", default=None, choices=("escalated",),
                   help="with --tune: the cheapest setting within --tolerance of the best (default: the best)")
    g.add_argument("--tolerance", type=float, default=0.0,
                   help="allowed loss of the selection metric with --select-cost (default: %(default)s)")
    g.add_argument("--tune-by", default=None, choices=("route", "category"),
                   help="with --tune: choose per query type (the router's route, or the gold category) "
                        "(default: one choice for all)")
    g.add_argument("--cv", default="auto", choices=("auto", "group", "stratified"),
                   help="folds of --tune: leave one conversation out (group) or stratified 5-fold by "
                        "question type (default: %(default)s = group on LoCoMo, stratified on LongMemEval)")


def _from_args(a) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if getattr(a, "config", None) is not None:
        out["config"] = a.config
    if getattr(a, "tune", None):
        out["tune"] = list(a.tune)
        out["metric"] = getattr(a, "select_metric", None)
        out["select_cost"] = getattr(a, "select_cost", None)
        out["tolerance"] = float(getattr(a, "tolerance", 0.0) or 0.0)
        out["tune_by"] = getattr(a, "tune_by", None)
        out["cv"] = getattr(a, "cv", "auto")
    return out


@register_method("config", help="a named Retriever configuration (--config NAME|PATH; gpuir/data/configs)",
                 add_arguments=_args, from_args=_from_args)
def config_method(ds: EvalDataset, queries: Sequence[EvalQuery], k: int, *, backend: str = "auto",
                  progress: bool = False, config: Any = None, **options: Any) -> Run:
    """``--method config``: :func:`config_run` of :func:`load_named_config` (``config`` required)."""
    if config is None:
        raise ValueError(f"--method config needs --config NAME|PATH (shipped: {', '.join(named_configs())})")
    return config_run(ds, queries, k, load_named_config(config), backend=backend, progress=progress, **options)


@register_method("default", help="the shipped default configuration, default_config() (docs/retriever.md)",
                 add_arguments=_args, from_args=_from_args)
def default_method(ds: EvalDataset, queries: Sequence[EvalQuery], k: int, *, backend: str = "auto",
                   progress: bool = False, config: Any = None, **options: Any) -> Run:
    """``--method default``: :func:`default_config` (a ``--config`` is an error: use ``--method config``)."""
    if config is not None:
        raise ValueError("--method default runs default_config(); use --method config --config NAME to run another")
    return config_run(ds, queries, k, default_config(), backend=backend, progress=progress, **options)
