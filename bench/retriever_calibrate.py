"""Calibrate the Retriever's default configuration: its fused session score as a 0-1 relevance (issue 37).

The default configuration (:func:`gpuir.retrieve.config.default_config`: session
BM25 + turn BM25 pooled by log-sum-exp + the temporal channel, z-score fusion)
ranks LoCoMo's sessions for its 1,982 questions with evidence, each asked at its
own time and confined to its conversation (:func:`gpuir.eval.retriever_methods.retriever_run`,
the configuration's own weights). A logistic map from each top-10 session's fused
score to P(the session holds one of the question's evidence turns) is fitted
leave-one-conversation-out (each conversation's sessions scored by the map fitted
on the other nine); precision, hits kept and recall at the documented thresholds
on the held-out conversations, and the coefficients fitted on all ten, which
:mod:`gpuir.retrieve.relevance` ships.

Run::

    PYTHONPATH=$PWD python bench/retriever_calibrate.py --out bench/results/retriever_calibrate_locomo.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from gpuir.eval.datasets import load_locomo
from gpuir.eval.retriever_methods import retriever_run
from gpuir.retrieve.config import default_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hybrid_select import logistic, logistic_fit  # bench/ is not a package

THRESHOLDS = (0.1, 0.3, 0.5, 0.7)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results/retriever_calibrate_locomo.json")
    args = ap.parse_args(argv)
    t0 = time.time()
    ds = load_locomo(unit="session")
    qs = ds.scored_queries()
    run = retriever_run(ds, qs, 10, default_config(), alpha=None)
    gold = [{ds.doc_index[g] for g in q.gold if g in ds.doc_index} for q in qs]
    groups = np.array([q.group for q in qs], dtype=object)
    feats, y, qi = [], [], []
    for i in range(len(qs)):
        for j in range(run.ranked.shape[1]):
            if run.ranked[i, j] < 0:
                continue
            feats.append((float(run.scores[i, j]),))
            y.append(float(run.ranked[i, j] in gold[i]))
            qi.append(i)
    X, y, qi = np.array(feats), np.array(y), np.array(qi)
    pred = np.zeros(y.size)
    for c in sorted(set(groups.tolist())):
        te = groups[qi] == c
        pred[te] = logistic(X[te], logistic_fit(X[~te], y[~te])).astype(np.float32)
    w_all = logistic_fit(X, y)
    cal = {}
    for t in THRESHOLDS:
        sel = pred >= t
        cal[str(t)] = {"hits_kept": int(sel.sum()), "precision": round(float(y[sel].mean()), 4) if sel.any() else None,
                       "recall_of_evidence_sessions_in_top10": round(float(y[sel].sum() / max(y.sum(), 1)), 4),
                       "questions_with_a_kept_hit": int(np.unique(qi[sel]).size)}
    rel = []
    for lo in np.arange(0.0, 1.0, 0.1):
        b = (pred >= lo) & (pred < lo + 0.1 if lo < 0.85 else pred <= 1.0)
        if b.any():
            rel.append({"bin": [round(float(lo), 1), round(float(lo) + 0.1, 1)], "n": int(b.sum()),
                        "mean_predicted": round(float(pred[b].mean()), 4), "observed": round(float(y[b].mean()), 4)})
    out = {
        "what": __doc__.split("\n\n")[0],
        "command": "PYTHONPATH=$PWD python bench/retriever_calibrate.py --out " + args.out,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"host": "vm", "cpu_count": os.cpu_count(), "platform": platform.platform()},
        "configuration": default_config().to_config(), "unit": "session",
        "questions": len(qs), "hit@1_in_sample": round(float(np.mean([run.ranked[i, 0] in g
                                                                        for i, g in enumerate(gold)])), 4),
        "label": "the session holds one of the question's evidence turns",
        "features": ["fused score"], "fit": "logistic regression (Newton, l2 1e-3)",
        "heldout_leave_one_conversation_out": {"thresholds": cal, "brier": round(float(np.mean((pred - y) ** 2)), 5),
                                               "base_rate": round(float(y.mean()), 4), "reliability": rel},
        "coefficients_all_ten_conversations": [float(x) for x in w_all],
        "seconds": round(time.time() - t0, 1),
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"coef": out["coefficients_all_ten_conversations"], "cal": cal}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
