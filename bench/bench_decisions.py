"""Per-query decisions, measured: quality and wall-clock latency of named Retriever configurations.

    python bench/bench_decisions.py                                   # LoCoMo, every configuration that loads
    python bench/bench_decisions.py --datasets locomo,longmemeval --configs current_best,dense_hybrid,cascade
    python bench/bench_decisions.py --n-single 0 --machine cpu2       # time every question one at a time
    python bench/bench_decisions.py --replot bench/results/decisions_cpu2.json   # redraw the plot only

For each configuration of ``gpuir/data/configs`` (``--configs``) and data set:

* **quality**: every question in one evaluation (``gpuir eval <ds> --method config``):
  LoCoMo Hit@1 / Hit@5 / MRR, LongMemEval recall_all@5 / nDCG@5, AnswerSubstr@5, per
  category / question type, 95% cluster-bootstrap intervals, and a paired bootstrap
  test against ``current_best``;
* **tuned numbers** (``SWEEPS``: the cascade's ``tau``): every value is run; the
  quality and latency of each is a point of the Pareto curve, and the held-out
  figure is cross-validated (:func:`gpuir.eval.selection.cv_select`: leave one
  conversation out on LoCoMo, stratified 5-fold on LongMemEval; the cheapest
  ``tau`` within ``--tolerance`` of the best training Hit@1 / recall_all@5);
* **latency**, measured on the wall clock (:func:`gpuir.eval.latency.measure_latency`):
  batch of 1 (p50, p99, mean; by path, skip vs escalate, when the search reports
  ``meta["escalated"]``; by stage from ``meta["timings"]``) and batched
  (``--batch``; amortised = wall time / questions). The query encoder runs without
  its on-disk cache while timing, so dense channels pay for encoding every question.

Writes ``bench/results/decisions_<machine>.json`` and ``docs/img/decisions_pareto.png``
(quality against amortised batched latency). A configuration this gpuir cannot
load yet (fields of issue 13 not merged) is listed under ``skipped`` with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuir.eval import runner
from gpuir.eval.compare import paired_metrics_for, paired_rows
from gpuir.eval.config_methods import has_cascade, load_named_config, named_configs, question_times, set_path
from gpuir.eval.latency import measure_latency
from gpuir.eval.selection import cv_folds, cv_select
from gpuir.progress import progress_bar, show_progress

#: Values swept for tuned numbers, per configuration: path -> values.
SWEEPS: dict[str, dict[str, list[Any]]] = {
    "cascade": {"cascade.tau": [0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0]},
    "all": {"cascade.tau": [0.0, 0.05, 0.1, 0.2, 0.3, 1.0]},
    "temporal": {"channels.2.weight": [0.1, 0.25, 0.5, 1.0]},
    "entity": {"channels.2.weight": [0.1, 0.25, 0.5, 1.0]},
}
#: Configurations whose sweep is also selected per query type (a threshold table).
PER_TYPE = {"cascade"}
#: The headline quality metric of each data set (the Pareto plot's y axis, the selection metric).
HEADLINE = {"locomo": "hit@1", "longmemeval": "recall_all@5"}


def machine_name() -> str:
    """``cpu<cores>``, or the GPU's name when CuPy can use one."""
    try:
        from gpuir._compat import cuda_device

        ok, why = cuda_device()
        if ok:
            return "gpu-" + "".join(c if c.isalnum() else "-" for c in why.split("(")[0].strip()).strip("-").lower()
    except Exception:  # noqa: BLE001, S110 - any failure means "no GPU"
        pass
    return f"cpu{os.cpu_count()}"


def load(name: str, subset: int = 0, seed: int = 0):
    """The data set; with ``subset`` (LongMemEval), a seeded random sample of that many scored questions.

    The sample's memory holds only its questions' haystack sessions (so that a dense channel
    encodes only those records); BM25's collection statistics then come from those sessions,
    for the baseline as for every configuration compared with it.
    """
    import dataclasses as dc

    from gpuir.eval.datasets import load_locomo, load_longmemeval

    ds = load_locomo() if name == "locomo" else load_longmemeval(split="s")
    if not subset or name == "locomo":
        return ds
    scored = [i for i, q in enumerate(ds.queries) if q.scored]
    if subset >= len(scored):
        return ds
    pick = sorted(np.random.default_rng(seed).choice(scored, size=subset, replace=False).tolist())
    qs = [ds.queries[i] for i in pick]
    keep = sorted({ds.doc_index[d] for q in qs for d in q.candidates})
    return dc.replace(ds, doc_ids=[ds.doc_ids[i] for i in keep], doc_texts=[ds.doc_texts[i] for i in keep],
                      doc_dates=[ds.doc_dates[i] for i in keep], queries=qs, _doc_index=None,
                      options={**ds.options, "subset": subset, "subset_seed": seed},
                      stats={**ds.stats, "subset_qids": [q.qid for q in qs]})


def variants(name: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(setting, config dict) of a configuration: one, or one per sweep value."""
    base = load_named_config(name).to_config()
    sweep = SWEEPS.get(name)
    if not sweep:
        return [({}, base)]
    out = []
    for path, values in sweep.items():
        for v in values:
            out.append(({path: v}, set_path(base, path, v)))
    return out


def summary(res, cols: list[str]) -> dict[str, Any]:
    s = res.summary()
    return {"overall": {c: s["overall"][c] for c in cols if c in s["overall"]},
            "by_category": {cat: {c: blk[c] for c in cols if c in blk} for cat, blk in s["by_category"].items()}}


def bench_one(ds, name: str, setting: dict[str, Any], cfg: dict[str, Any], args, rng) -> tuple[Any, dict]:
    from gpuir.eval.retriever_methods import build_retriever, haystack_wheres

    t0 = time.perf_counter()
    res = runner.evaluate(ds, "config", k=100, backend=args.backend, progress=False, n_boot=args.n_boot,
                          config=cfg)
    t_eval = time.perf_counter() - t0
    from gpuir.retrieve import RetrieverConfig

    r = build_retriever(ds, RetrieverConfig.from_config(cfg))
    from gpuir.dense.encoder import Encoder

    # time query encoding, not cache look-ups: every retriever that encodes (a router's routes too) gets an
    # encoder without the on-disk cache (record embeddings are already in memory)
    for rr in [r] + list((getattr(r, "router", None) and r.router.routes.values()) or []):
        if getattr(rr.config, "needs_encoder", False) and hasattr(rr, "_encoder"):
            rr._encoder = Encoder(rr.config.encoder, cache=False)
    qs = list(ds.queries)
    texts = [q.text for q in qs]
    wheres = haystack_wheres(ds, qs)
    import inspect

    at = question_times(ds, qs) if "at" in inspect.signature(r.search).parameters else None
    cols = paired_metrics_for(ds.name, res.per_query)
    row = {"config": name, "setting": setting, "retriever_config": cfg, "quality": summary(res, cols),
           "decisions": res.run.meta.get("decisions", {}), "backend": res.run.meta.get("backend"),
           "latency": None, "eval_seconds": t_eval}
    if args.no_latency:
        return res, row
    n_single = len(qs) if not args.n_single else min(args.n_single, len(qs))
    single = np.sort(rng.choice(len(qs), size=n_single, replace=False)) if n_single < len(qs) else None
    row["latency"] = measure_latency(r, texts, k=10, where=wheres, at=at, unit="session", backend=args.backend,
                                     batch_size=args.batch, single=single, progress=args.progress,
                                     paths=has_cascade(cfg))
    row["load_average"] = os.getloadavg()
    return res, row


def show(c: Any) -> dict[str, Any]:
    """A chosen setting (tuple of (path, json)) or a per-type table of them, as a plain dict."""
    if isinstance(c, dict):
        return {str(t): show(v) for t, v in c.items()}
    return {p: json.loads(v) for p, v in c}


def st_key(setting: dict[str, Any]) -> tuple:
    """Hashable key of a setting dict."""
    return tuple((k, json.dumps(v)) for k, v in setting.items())


def heldout_result(res_of: dict[Any, Any], sel: dict[str, Any], qs_all) -> Any:
    """An EvalResult whose every metric is, per question, that of the setting chosen without its fold."""
    first = next(iter(res_of.values()))
    scored_rows = np.flatnonzero(first.mask("scored"))
    setting_of = {int(i): s for i, s in zip(scored_rows, sel["heldout_setting"])}
    base_key = next(iter(res_of))
    pq = {}
    for m, v in first.per_query.items():
        out = np.array(v, dtype=np.float64, copy=True)
        for i in range(len(out)):
            out[i] = res_of[setting_of.get(i, base_key)].per_query[m][i]
        pq[m] = out
    return dataclasses.replace(first, per_query=pq, timings={}, _summary=None)


def skip_by_category(sel: dict[str, Any], queries) -> dict[str, float] | None:
    """Held-out skip rate overall and per category (from the chosen settings' escalations)."""
    if "heldout_cost" not in sel:
        return None
    qs = [q for q in queries if q.scored]
    cats = np.array([q.category for q in qs], dtype=object)
    esc = np.asarray(sel["heldout_cost"], dtype=np.float64)
    out = {"overall": float(1 - esc.mean())}
    for c in sorted(set(cats.tolist())):
        out[str(c)] = float(1 - esc[cats == c].mean())
    return out


#: Candidates of the cross-validated route table: (configuration, setting) of runs already made.
ROUTE_CANDIDATES = [("current_best", ()), ("dense_hybrid", ()), ("enrich", ()), ("type_filter", ()),
                    ("temporal", (("channels.2.weight", "0.25"),)), ("entity", (("channels.2.weight", "0.25"),))]


def route_table_cv(ds, key: str, results_of: dict[Any, Any], baseline, args) -> dict[str, Any]:
    """A route table (query type -> configuration) chosen per fold, scored on the held-out fold.

    LoCoMo: the regex classifier's types, leave one conversation out. LongMemEval: the
    TF-IDF + logistic-regression classifier refitted on each training fold (the shipped one saw
    every LongMemEval question), predicting the held-out fold's types; the table is chosen on
    the training questions by their gold types.
    """
    from gpuir.eval.stats import bootstrap_ci, paired_bootstrap
    from gpuir.retrieve.query_types import QueryTypeClassifier, regex_query_type, to_query_type

    cands = [(n, s) for n, s in ROUTE_CANDIDATES if (n, s) in results_of]
    if len(cands) < 2:
        return {"skipped": "fewer than two candidate configurations ran"}
    metric = HEADLINE[key]
    qs = [q for q in ds.queries if q.scored]
    sc = results_of[cands[0]].mask("scored")
    M = {c: results_of[c].per_query[metric][sc] for c in cands}
    folds = cv_folds(qs)
    if key == "locomo":
        types = np.array([regex_query_type(q.text) for q in qs], dtype=object)
        sel = cv_select(M, folds, by=types)
        hset = sel["heldout_setting"]
        chosen = {str(f): {t: c[0] for t, c in tab.items()} for f, tab in sel["chosen"].items()}
        clf = "regex"
        acc = None
    else:
        gold = np.array([to_query_type(q.category) for q in qs], dtype=object)
        texts = [q.text for q in qs]
        hset = [None] * len(qs)
        chosen, correct = {}, 0
        for f in sorted(set(folds.tolist()), key=str):
            test = folds == f
            train = ~test
            model = QueryTypeClassifier.fit([texts[i] for i in np.flatnonzero(train)], list(gold[train]),
                                            provenance={"dataset": "longmemeval_s", "fold": str(f), "held_out": True})
            pred = np.array(model.predict([texts[i] for i in np.flatnonzero(test)]), dtype=object)
            correct += int((pred == gold[test]).sum())
            Mt = np.stack([M[c] for c in cands])
            tab = {}
            for t in sorted(set(gold.tolist())):
                tr = train & (gold == t)
                j = int(np.argmax(Mt[:, tr].mean(axis=1))) if tr.any() else int(np.argmax(Mt[:, train].mean(axis=1)))
                tab[t] = cands[j]
            fb = cands[int(np.argmax(Mt[:, train].mean(axis=1)))]
            for i, p in zip(np.flatnonzero(test), pred):
                hset[i] = tab.get(p, fb)
            chosen[str(f)] = {t: c[0] for t, c in tab.items()}
        heldout = np.array([M[c][i] for i, c in enumerate(hset)])
        sel = {"heldout": heldout, "heldout_setting": hset}
        clf = "TF-IDF + logistic regression, refitted on each training fold"
        acc = correct / len(qs)
    ho_res = heldout_result({c: results_of[c] for c in cands}, sel, ds.queries)
    cols = paired_metrics_for(ds.name, ho_res.per_query)
    groups = [q.group for q in qs]
    out = {"candidates": [c[0] for c in cands], "classifier": clf, "heldout_type_accuracy": acc,
           "chosen_per_fold": chosen, "metric": metric,
           "heldout": bootstrap_ci(ho_res.per_query[metric][sc], groups, n_boot=args.n_boot).to_dict(),
           "quality": summary(ho_res, cols),
           "scheme": "leave-one-conversation-out" if key == "locomo" else "stratified 5-fold by type"}
    if baseline is not None:
        out["paired_vs_current_best"] = paired_bootstrap(ho_res.per_query[metric][sc],
                                                         baseline.per_query[metric][sc], groups, n_boot=args.n_boot)
        out["paired_rows_vs_current_best"] = paired_rows(ho_res, baseline, cols, n_boot=args.n_boot)
    return out


def pareto_plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dsets = [d for d in results if any(r.get("latency") for r in results[d]["rows"])]
    if not dsets:
        return
    fig, axes = plt.subplots(1, len(dsets), figsize=(6.2 * len(dsets), 4.4), squeeze=False)
    for ax, d in zip(axes[0], dsets):
        metric = HEADLINE[d]
        pts = []
        for row in results[d]["rows"]:
            if not row.get("latency"):
                continue
            x = row["latency"]["batched"]["amortised_ms"]
            iv = row["quality"]["overall"][metric]
            y = iv["mean"]
            lab = row["config"] + ("".join(f" {k.split('.')[-1]}={v}" for k, v in row["setting"].items()))
            pts.append((x, y, lab, row["config"]))
            ax.errorbar([x], [y], yerr=[[y - iv["lo"]], [iv["hi"] - y]], fmt="none", ecolor="0.6", lw=0.8,
                        capsize=2)
        names = sorted({p[3] for p in pts})
        cmap = plt.get_cmap("tab10")
        for i, n in enumerate(names):
            sel = sorted([p for p in pts if p[3] == n])
            ax.plot([p[0] for p in sel], [p[1] for p in sel], "o-" if len(sel) > 1 else "o", color=cmap(i % 10),
                    label=n)
            for p in sel:
                ax.annotate(p[2].replace(n, "").strip() or n, (p[0], p[1]), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
        front, best = [], -np.inf
        for p in sorted(pts):
            if p[1] > best:
                front.append(p)
                best = p[1]
        ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=0.8, label="Pareto front")
        for cv in results[d].get("cv", {}).values():
            if cv.get("amortised_ms") is None:
                continue
            ax.errorbar([cv["amortised_ms"]], [cv["heldout"]["mean"]],
                        yerr=[[cv["heldout"]["mean"] - cv["heldout"]["lo"]], [cv["heldout"]["hi"] - cv["heldout"]["mean"]]],
                        fmt="*", ms=12, color="k", label=f"{cv['config']} held out")
        ax.set_xscale("log")
        ax.set_xlabel(f"amortised latency, ms/question (batches of {results[d]['batch']}, measured)")
        ax.set_ylabel(f"{metric}, 95% cluster-bootstrap interval")
        ax.set_title(f"{d}: quality vs latency ({results[d]['machine']})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


ORDER = ["current_best", "dense_hybrid", "cascade", "cascade_per_type", "router", "route_table", "temporal", "entity", "type_filter",
         "enrich", "all"]


def _iv(d: dict[str, Any] | None, ci: bool = True) -> str:
    if not d or d.get("mean") is None:
        return "-"
    return f"{d['mean']:.3f}" + (f" [{d['lo']:.3f}, {d['hi']:.3f}]" if ci else "")


def _p(p: float) -> str:
    return " < 0.001" if p < 0.001 else f" = {p:.3f}"


def _delta(d: dict[str, Any] | None) -> str:
    if not d:
        return "-"
    p = d["p"]
    ps = "p < 0.001" if p < 0.001 else f"p = {p:.3f}"
    return f"{d['delta']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}], {ps}"


def headline_rows(block: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per configuration: its held-out figures (tuned ones from ``cv``), paired rows, how tuned."""
    out = []
    plain = {r["config"]: r for r in block["rows"] if not r["setting"]}
    for name in ORDER:
        if name == "route_table":
            rt = block.get("route_table")
            if rt and "quality" in rt:
                out.append({"name": "router, route table by CV", "quality": rt["quality"],
                            "paired": rt.get("paired_rows_vs_current_best"),
                            "tuned": f"route table over {{{', '.join(rt['candidates'])}}} per type ({rt['classifier']})"})
            continue
        if name in block.get("cv", {}):
            cv = block["cv"][name]
            ch = sorted({json.dumps(v, sort_keys=True) for v in cv["chosen_per_fold"].values()})
            out.append({"name": name, "quality": cv["quality"], "paired": cv.get("paired_rows_vs_current_best"),
                        "tuned": "; ".join(f"{p} over {v}" for p, v in cv["grid"].items()) + f" -> folds chose {', '.join(ch)}",
                        "skip": cv.get("skip_rate_by_category")})
        elif name in plain:
            r = plain[name]
            out.append({"name": name, "quality": r["quality"], "paired": r.get("paired_vs_current_best"),
                        "tuned": "nothing tuned" if name != "current_best" else "selected on LoCoMo by LOCO earlier",
                        "skip": (r.get("decisions") or {}).get("skip_rate_by_category")})
    return out


def markdown(report: dict[str, Any]) -> str:
    """The results tables of docs/decisions.md from a results file."""
    lines: list[str] = []
    for key, block in report["datasets"].items():
        hr = headline_rows(block)
        if not hr:
            continue
        mets = list(hr[0]["quality"]["overall"])
        lines += [f"### {key}: overall, held out, paired against current_best", "",
                  "| configuration | " + " | ".join(mets) + " | " + " | ".join(f"Δ {m}" for m in mets) + " |",
                  "| --- " * (1 + 2 * len(mets)) + "|"]
        for h in hr:
            ov = h["quality"]["overall"]
            prow = (h["paired"] or [{}])[0]
            lines.append(f"| `{h['name']}` | " + " | ".join(_iv(ov.get(m)) for m in mets) + " | "
                         + " | ".join(_delta(prow.get(m)) if h["name"] != "current_best" else "-" for m in mets) + " |")
        lines += ["", "Tuned numbers: " + "; ".join(f"`{h['name']}`: {h['tuned']}" for h in hr), ""]
        cats = list(hr[0]["quality"]["by_category"])
        for m in mets[:2]:
            lines += [f"### {key}: {m} per category (value, Δ vs current_best, p)", "",
                      "| configuration | " + " | ".join(f"{c} (n={hr[0]['quality']['by_category'][c][m]['n']})"
                                                       for c in cats) + " |", "| --- " * (1 + len(cats)) + "|"]
            for h in hr:
                cells = []
                for c in cats:
                    v = h["quality"]["by_category"][c].get(m)
                    pr = next((r for r in (h["paired"] or []) if r["subset"] == c), None)
                    d = pr.get(m) if pr else None
                    cells.append(_iv(v, ci=False) + ("" if not d or h["name"] == "current_best" else
                                                     f" ({d['delta']:+.3f}, p{_p(d['p'])})"))
                lines.append(f"| `{h['name']}` | " + " | ".join(cells) + " |")
            lines.append("")
        lat = [r for r in block["rows"] if r.get("latency")]
        if lat:
            lines += [f"### {key}: measured wall-clock latency (ms per question)", "",
                      ("| configuration | skip rate | batch of 1: p50 / p99 / mean | skip path p50 / p99 / mean | "
                       "escalate path p50 / p99 / mean | batched: amortised (batch p50 / p99) | batched skip-only / "
                       "escalate-only amortised | load avg |"), "| --- " * 8 + "|"]

            def f3(d):
                return "-" if not d or not d.get("n") else f"{d['p50_ms']:.2f} / {d['p99_ms']:.2f} / {d['mean_ms']:.2f}"

            for r in lat:
                L = r["latency"]
                b1, bt = L["batch1"], L["batched"]
                sk = "-" if L.get("skip_rate") is None else f"{L['skip_rate']:.3f}"
                lab = r["config"] + "".join(f" {k.split('.')[-1]}={v}" for k, v in r["setting"].items())
                split = "-"
                if "skip" in bt:
                    split = " / ".join("-" if not bt[p].get("n") else f"{bt[p]['amortised_ms']:.2f} (n={bt[p]['n']})"
                                       for p in ("skip", "escalate"))
                la = r.get("load_average")
                lines.append(f"| `{lab}` | {sk} | {f3(b1['all'])} | {f3(b1.get('skip'))} | {f3(b1.get('escalate'))} | "
                             f"{bt['amortised_ms']:.2f} ({bt['per_query']['p50_ms']:.0f} / {bt['per_query']['p99_ms']:.0f}) | "
                             f"{split} | {'-' if not la else f'{la[0]:.2f}'} |")
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="locomo", help="comma-separated: locomo, longmemeval (default: %(default)s)")
    ap.add_argument("--configs", default=None,
                    help=f"comma-separated configuration names (default: all of {', '.join(named_configs())})")
    ap.add_argument("--backend", default="auto", help="BM25 backend (default: %(default)s)")
    ap.add_argument("--batch", type=int, default=64, help="questions per batched call (default: %(default)s)")
    ap.add_argument("--n-single", type=int, default=400,
                    help="questions timed one at a time, a seeded sample; 0: all (default: %(default)s)")
    ap.add_argument("--n-boot", type=int, default=2000, help="bootstrap replicates (default: %(default)s)")
    ap.add_argument("--tolerance", type=float, default=0.005,
                    help="cascade selection: allowed loss of the headline metric (default: %(default)s)")
    ap.add_argument("--machine", default=None, help="name in the output file (default: cpu<cores> or the GPU)")
    ap.add_argument("--out", default=None, help="JSON (default: bench/results/decisions_<machine>.json)")
    ap.add_argument("--plot", default=str(REPO / "docs/img/decisions_pareto.png"), help="(default: %(default)s)")
    ap.add_argument("--progress", action="store_true", default=None, help="progress bars (default: on a terminal)")
    ap.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    ap.add_argument("--no-route-table", dest="route_table", action="store_false",
                    help="skip the cross-validated route table (default: chosen from the runs made)")
    ap.add_argument("--no-latency", action="store_true", help="quality only, no timing (default: time every run)")
    ap.add_argument("--out-partial", action="store_true", help="write the JSON after each data set (default: at the end)")
    ap.add_argument("--subset", type=int, default=0,
                    help="LongMemEval: a seeded random subset of this many questions (0: all; default: %(default)s)")
    ap.add_argument("--replot", metavar="DECISIONS.json", default=None,
                    help="only redraw the plot from a results file (default: run the benchmark)")
    ap.add_argument("--markdown", metavar="DECISIONS.json", default=None,
                    help="only print the results tables of a results file as Markdown (default: run the benchmark)")
    args = ap.parse_args(argv)
    args.progress = show_progress(args.progress)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0
    if args.replot:
        pareto_plot(json.loads(Path(args.replot).read_text())["datasets"], Path(args.plot))
        print(f"-> {args.plot}", file=sys.stderr)
        return 0
    machine = args.machine or machine_name()
    out_path = Path(args.out or REPO / f"bench/results/decisions_{machine}.json")
    names = args.configs.split(",") if args.configs else named_configs()
    results: dict[str, Any] = {}
    t_start = time.perf_counter()
    for dname in args.datasets.split(","):
        if dname not in HEADLINE:
            ap.error(f"unknown data set {dname!r}: locomo or longmemeval")
        ds = load(dname, args.subset)
        key = "locomo" if dname == "locomo" else "longmemeval"
        block: dict[str, Any] = {"machine": machine, "batch": args.batch, "rows": [], "skipped": {}, "paired": {},
                                 "cv": {}}
        baseline = None
        results_of: dict[Any, Any] = {}
        heldout_of: dict[str, Any] = {}
        order = ["current_best"] + [n for n in names if n != "current_best"]
        for name in progress_bar(order, desc=f"{dname} configurations", unit="config", enabled=args.progress):
            if name != "current_best" and name not in names:
                continue
            try:
                vs = variants(name)
            except ValueError as e:
                block["skipped"][name] = str(e)
                print(f"[{dname}] skip {name}: {e}", file=sys.stderr, flush=True)
                continue
            per, cost, runs = {}, {}, {}
            for setting, cfg in vs:
                print(f"[{dname}] {name} {setting or ''} ...", file=sys.stderr, flush=True)
                try:
                    res, row = bench_one(ds, name, setting, cfg, args, np.random.default_rng(0))
                except (ValueError, ImportError) as e:
                    block["skipped"][name] = f"{type(e).__name__}: {e}"
                    print(f"[{dname}] skip {name}: {e}", file=sys.stderr, flush=True)
                    break
                if name == "current_best":
                    baseline = res
                elif baseline is not None:
                    pm = paired_metrics_for(ds.name, res.per_query)
                    row["paired_vs_current_best"] = paired_rows(res, baseline, pm, n_boot=args.n_boot)
                block["rows"].append(row)
                lat = row["latency"]
                print(f"[{dname}] {name} {setting or ''}: {HEADLINE[key]} "
                      f"{row['quality']['overall'][HEADLINE[key]]['mean']:.3f}" + ("" if not lat else
                      f", batch-1 p50 {lat['batch1']['all']['p50_ms']:.2f} ms p99 "
                      f"{lat['batch1']['all']['p99_ms']:.2f} ms, amortised {lat['batched']['amortised_ms']:.2f} ms"),
                      file=sys.stderr, flush=True)
                results_of[(name, st_key(setting))] = res
                sc = res.mask("scored")
                st = st_key(setting)
                per[st] = res.per_query[HEADLINE[key]][sc]
                dec = res.run.meta.get("per_query_decisions", {})
                if "escalated" in dec and has_cascade(cfg):
                    cost[st] = np.asarray(dec["escalated"], dtype=np.float64)[sc]
                runs[st] = row
            if len(per) > 1:  # a sweep: the held-out (cross-validated) choice
                qs = [q for q in ds.queries if q.scored]
                selections = [(name, None)]
                if name in PER_TYPE:  # per-query-type thresholds: the regex type (no training on these questions)
                    from gpuir.retrieve.query_types import regex_query_type

                    selections.append((name + "_per_type", np.array([regex_query_type(q.text) for q in qs], object)))
                for cv_name, by in selections:
                    qs = [q for q in ds.queries if q.scored]
                    folds = cv_folds(qs)
                    sel = cv_select(per, folds, cost=cost if len(cost) == len(per) else None, tolerance=args.tolerance,
                                    by=by)
                    from gpuir.eval.stats import bootstrap_ci

                    groups = [q.group for q in qs]
                    ho = bootstrap_ci(sel["heldout"], groups, n_boot=args.n_boot).to_dict()
                    paired = None
                    if baseline is not None:  # held-out figure against the current best, paired
                        from gpuir.eval.stats import paired_bootstrap

                        base_v = baseline.per_query[HEADLINE[key]][baseline.mask("scored")]
                        paired = paired_bootstrap(sel["heldout"], base_v, groups, n_boot=args.n_boot)
                    ho_res = heldout_result({s: results_of[(name, s)] for s in per}, sel, qs_all=ds.queries)
                    cols = paired_metrics_for(ds.name, ho_res.per_query)
                    ho_quality = summary(ho_res, cols)
                    ho_paired = paired_rows(ho_res, baseline, cols, n_boot=args.n_boot) if baseline is not None else None
                    heldout_of[cv_name] = ho_res
                    # latency of the held-out choice: measured when every fold chose the same setting
                    chosen = set(sel["heldout_setting"])
                    am = None
                    if len(chosen) == 1 and runs[next(iter(chosen))].get("latency"):
                        am = runs[next(iter(chosen))]["latency"]["batched"]["amortised_ms"]
                    block["cv"][cv_name] = {
                        "config": cv_name, "base_config": name, "metric": HEADLINE[key], "heldout": ho,
                        "skip_rate_heldout": (None if "heldout_cost" not in sel else 1 - float(sel["heldout_cost"].mean())),
                        "chosen_per_fold": {str(f): show(c) for f, c in sel["chosen"].items()},
                        "in_sample_choice": show(sel["best_overall"]), "in_sample_mean": sel["best_overall_mean"],
                        "per_type": by is not None,
                        "amortised_ms": am, "tolerance": args.tolerance, "paired_vs_current_best": paired,
                        "grid": {p: v for p, v in SWEEPS[name].items()}, "quality": ho_quality,
                        "paired_rows_vs_current_best": ho_paired,
                        "skip_rate_by_category": skip_by_category(sel, ds.queries),
                        "scheme": "leave-one-conversation-out" if key == "locomo" else "stratified 5-fold by type"}
        if args.route_table:
            block["route_table"] = route_table_cv(ds, key, results_of, baseline, args)
        results[key] = block
        if args.out_partial:
            runner.save_json({"machine": runner.machine_info(), "machine_name": machine, "args": vars(args),
                              "datasets": results}, out_path)
    report = {"machine": runner.machine_info(), "machine_name": machine, "seconds": time.perf_counter() - t_start,
              "args": vars(args), "datasets": results}
    runner.save_json(report, out_path)
    print(f"-> {out_path}", file=sys.stderr)
    if args.plot:
        pareto_plot(results, Path(args.plot))
        print(f"-> {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
