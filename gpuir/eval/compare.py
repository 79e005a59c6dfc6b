"""Paired comparison of two evaluations of the same questions, overall and per category / question type.

Each row (overall, then each LoCoMo category or LongMemEval question type) gives,
per metric, the difference of means ``A - B`` with its 95% paired cluster-bootstrap
interval and a two-sided p-value: from the paired bootstrap
(:func:`gpuir.eval.stats.paired_bootstrap`) or the paired randomisation test
(:func:`gpuir.eval.stats.paired_randomization`, cluster sign flips). Clusters are
LoCoMo conversations (LongMemEval: each question its own), as in the intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .stats import paired_bootstrap, paired_randomization

__all__ = ["PAIRED_METRICS", "paired_metrics_for", "paired_rows", "paired_table"]

#: The metrics compared by default (issue 13's "must show").
PAIRED_METRICS: dict[str, tuple[str, ...]] = {
    "locomo": ("hit@1", "hit@5", "mrr", "answer_substr@5"),
    "longmemeval": ("recall_all@5", "ndcg@5", "answer_substr@5"),
}


def paired_metrics_for(dataset_name: str, per_query: dict[str, Any]) -> list[str]:
    """The default compared metrics of a data set that ``per_query`` holds."""
    key = "locomo" if dataset_name == "locomo" else "longmemeval" if dataset_name.startswith("longmemeval") else ""
    want = PAIRED_METRICS.get(key, ("ndcg@10", "recall@10", "mrr"))
    return [m for m in want if m in per_query]


def paired_rows(a: Any, b: Any, metrics: Sequence[str] | None = None, *, test: str = "bootstrap",
                n_boot: int = 10000, seed: int = 0) -> list[dict[str, Any]]:
    """Paired differences A - B per subset.

    Parameters
    ----------
    a, b : EvalResult
        Two evaluations of the same data set (same questions, same order).
    metrics : metric names (default :func:`paired_metrics_for`)
    test : {"bootstrap", "randomization"}
        Source of the p-value (the interval is always the paired bootstrap's).

    Returns
    -------
    list of dict: ``subset``, ``n``, and per metric ``{mean_a, mean_b, delta, lo, hi, p, wins, losses}``.
    """
    if test not in ("bootstrap", "randomization"):
        raise ValueError(f"test must be 'bootstrap' or 'randomization', got {test!r}")
    if [q.qid for q in a.queries] != [q.qid for q in b.queries]:
        raise ValueError("the two evaluations do not hold the same questions in the same order")
    metrics = list(metrics or paired_metrics_for(a.dataset.name, a.per_query))
    missing = [m for m in metrics if m not in a.per_query or m not in b.per_query]
    if missing:
        raise ValueError(f"metric(s) {', '.join(missing)} missing from one of the evaluations")
    scored = a.mask("scored") & b.mask("scored")
    cats = np.array([q.category for q in a.queries], dtype=object)
    groups = np.array([q.group for q in a.queries], dtype=object)
    subsets = [("overall", scored)] + [(c, scored & (cats == c)) for c in sorted(set(cats[scored].tolist()))]
    rows = []
    for name, sel in subsets:
        row: dict[str, Any] = {"subset": name, "n": int(sel.sum())}
        for m in metrics:
            va, vb = a.per_query[m][sel], b.per_query[m][sel]
            ok = ~(np.isnan(va) | np.isnan(vb))
            va, vb, g = va[ok], vb[ok], groups[sel][ok]
            r = paired_bootstrap(va, vb, g, n_boot=n_boot, seed=seed)
            if test == "randomization":
                r["p"] = paired_randomization(va, vb, g, n_perm=n_boot, seed=seed)["p"]
            r["mean_a"] = float(va.mean()) if va.size else float("nan")
            r["mean_b"] = float(vb.mean()) if vb.size else float("nan")
            r["test"] = test
            row[m] = r
        rows.append(row)
    return rows


def paired_table(rows: Sequence[dict[str, Any]], metrics: Sequence[str], fmt: str = "table") -> str:
    """Render :func:`paired_rows`: each cell ``A - B [lo, hi] p`` (csv: separate columns)."""
    from .tables import render

    if fmt == "csv":
        head = ["subset", "n"] + [f"{m}_{x}" for m in metrics for x in ("a", "b", "delta", "lo", "hi", "p")]
        body = [[r["subset"], str(r["n"])] + [f"{r[m][k]:.6f}" for m in metrics
                                              for k in ("mean_a", "mean_b", "delta", "lo", "hi", "p")] for r in rows]
        return render(head, body, "csv")

    def cell(r: dict[str, Any]) -> str:
        if not r["n"]:
            return "-"
        return f"{r['delta']:+.3f} [{r['lo']:+.3f},{r['hi']:+.3f}] p={r['p']:.3f}"

    head = ["subset", "n"] + [f"d {m}" for m in metrics]
    body = [[r["subset"], str(r["n"])] + [cell(r[m]) for m in metrics] for r in rows]
    return render(head, body, fmt, data=list(rows))
