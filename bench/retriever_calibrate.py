"""Calibrate the Retriever's default configuration: its fused session score as a 0-1 relevance (issue 37).

The default configuration (:func:`gpuir.retrieve.config.default_config`: session
BM25 + turn BM25 pooled by log-sum-exp + the temporal channel, z-score fusion)
ranks LoCoMo's sessions for its 1,982 questions with evidence, each asked at its
own time and confined to its conversation (:func:`gpuir.eval.retriever_methods.retriever_run`,
the configuration's own weights), and again in memories of 2 and 5 of its
conversation's sessions, once holding one of its evidence sessions and once none
(the answer not in the memory). A logistic map from
each top-10 session's fused score and the log of the records the question may
see to P(the session holds one of the question's evidence turns) is fitted
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

from gpuir import Memory, Retriever
from gpuir.eval.datasets import load_locomo
from gpuir.eval.records import dataset_records, question_times
from gpuir.eval.retriever_methods import retriever_run
from gpuir.retrieve.config import default_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hybrid_select import logistic, logistic_fit  # bench/ is not a package

THRESHOLDS = (0.1, 0.3, 0.5, 0.7)
SESSION_SIZES = (2, 5)  # memories of a few sessions (beside whole conversations of 19-32)


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
    turns = load_locomo(unit="turn")
    trecs = dataset_records(turns)
    by_session: dict[str, list[dict]] = {}
    for r in trecs:
        by_session.setdefault(r["session"], []).append(r)
    conv_sessions: dict[str, list[str]] = {}
    for sid in by_session:
        conv_sessions.setdefault(sid.split(":")[0], []).append(sid)
    at = question_times(ds, qs)
    gold_names = [{ds.doc_ids[g] for g in gs} for gs in gold]
    feats, y, qi, size_of = [], [], [], []
    # the whole conversation (one shared memory, each question confined to its tenant): n = its turns
    for i in range(len(qs)):
        n = sum(len(by_session[s_]) for s_ in conv_sessions[qs[i].group])
        for j in range(run.ranked.shape[1]):
            if run.ranked[i, j] < 0:
                continue
            feats.append((float(run.scores[i, j]), float(np.log(n))))
            y.append(float(run.ranked[i, j] in gold[i]))
            qi.append(i)
            size_of.append(0)
    # memories of a few sessions of the conversation, one holding an evidence session, each its own memory
    rng = np.random.default_rng(0)
    for size, holds in [(s_, h_) for s_ in SESSION_SIZES for h_ in (True, False)]:
        for i, q in enumerate(qs):
            others = [s_ for s_ in conv_sessions[q.group] if s_ not in gold_names[i]]
            if holds:  # one evidence session and others
                pick = sorted({min(gold_names[i]), *rng.choice(others, size - 1, replace=False).tolist()})
            else:  # the question's answer is not in this memory
                pick = sorted(rng.choice(others, size, replace=False).tolist())
            recs = [r for s_ in pick for r in by_session[s_]]
            m = Memory(analyzer=default_config().analyzer)
            m.add(recs)
            res = Retriever(m).search(q.text, k=10, unit="session", at=at[i])
            for sid, sc in zip(res.ids(0), res.scores[0].tolist()):
                feats.append((float(sc), float(np.log(len(recs)))))
                y.append(float(sid in gold_names[i]))
                qi.append(i)
                size_of.append(size if holds else -size)
        print(f"memories of {size} sessions ({'with' if holds else 'without'} evidence): {time.time() - t0:.0f} s",
              file=sys.stderr, flush=True)
    X, y, qi, size_of = np.array(feats), np.array(y), np.array(qi), np.array(size_of)
    pred = np.zeros(y.size)
    for c in sorted(set(groups.tolist())):
        te = groups[qi] == c
        pred[te] = logistic(X[te], logistic_fit(X[~te], y[~te])).astype(np.float32)
    w_all = logistic_fit(X, y)
    def at_thresholds(mask: np.ndarray) -> dict:
        out_ = {}
        for t in THRESHOLDS:
            sel = mask & (pred >= t)
            out_[str(t)] = {"hits_kept": int(sel.sum()),
                            "precision": round(float(y[sel].mean()), 4) if sel.any() else None,
                            "recall_of_evidence_sessions_in_top10": round(float(y[sel].sum() / max(y[mask].sum(), 1)),
                                                                          4)}
        return out_

    cal = {"all_sizes": at_thresholds(np.ones(y.size, bool)), "whole_conversation": at_thresholds(size_of == 0)}
    for size in SESSION_SIZES:
        cal[f"{size}_sessions"] = at_thresholds(size_of == size)
        cal[f"{size}_sessions_without_the_answer"] = {
            str(t): {"sessions_kept": int(((size_of == -size) & (pred >= t)).sum()),
                     "questions_with_a_kept_session": int(np.unique(qi[(size_of == -size) & (pred >= t)]).size)}
            for t in THRESHOLDS}
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
        "features": ["fused score", "log(records the question may see)"],
        "population": "each question's top 10 sessions: in its whole conversation (19-32 sessions, a shared memory, "
                      "the question confined to its tenant), and in memories of 2 and 5 of its conversation's "
                      "sessions, each its own memory, once holding one evidence session and once none",
        "fit": "logistic regression (Newton, l2 1e-3)",
        "heldout_leave_one_conversation_out": {"thresholds": cal, "brier": round(float(np.mean((pred - y) ** 2)), 5),
                                               "base_rate": round(float(y.mean()), 4), "reliability": rel},
        "coefficients_all_ten_conversations": [float(x) for x in w_all],
        "n_range (records the question may see; the library clamps n to it)": [float(np.exp(X[:, 1].min())),
                                                                              float(np.exp(X[:, 1].max()))],
        "seconds": round(time.time() - t0, 1),
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"coef": out["coefficients_all_ten_conversations"], "cal": cal}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
