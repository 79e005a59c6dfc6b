"""Entity-graph diagnostic on LoCoMo: how close are the gold turns to the question's entities?

    python bench/entity_graph_locomo.py [--out bench/results/entity_graph_locomo.json]

One :class:`gpuir.retrieve.entity_graph.EntityGraph` per conversation, built from
its turn records (speaker from the record's metadata, seq = turn number in the
conversation). For every scored question, per category:

* ``with_entities``: share of questions with at least one entity the graph knows;
  ``with_non_hub_entities``: ... one that is not a hub (not a speaker, in practice);
  ``questions_with_non_hub_entities``: the figures below on those questions only;
* ``gold_within_hop``: share whose best gold turn is within hop 0, 1, 2, 3 of the
  question's entities (any gold turn counts; no entities = not within);
* ``candidates_within_hop``: mean number of turns within hop 0, 1, 2 (how much
  of the conversation each hop level admits; a conversation has ~590 turns);
* ``hit@k``: the entity channel alone, ranked by hop score with ties by seq asc
  (conversation order; no BM25 tie-break), ``max_hops`` 3 for questions
  :meth:`EntityGraph.is_multi_hop` flags and 2 otherwise, 95% cluster-bootstrap
  intervals over conversations.

Timings: extraction over all turns; graph build (add + flush); the ranked
``score`` call per question (depth 10), alone.

Three hub treatments are reported side by side: ``demote`` (the default, chosen
before measuring), ``plain`` and ``no_hubs``. Nothing here is tuned: it is a
diagnostic of the entity channel, in-sample only in the sense that the rules were
written while looking at LoCoMo turns (the list of common capitalised words).
"""

from __future__ import annotations

import argparse
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gpuir.eval.datasets import load_locomo
from gpuir.eval.records import locomo_records
from gpuir.eval.runner import machine_info, save_json
from gpuir.eval.stats import bootstrap_ci
from gpuir.retrieve.entity_graph import HOP_SCORES, EntityGraph, extract_entities

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "demote": {"hub_mode": "demote"},
    "plain": {"hub_mode": "plain"},
    "no_hubs": {"hub_fraction": None},
}
CUTOFFS = (1, 5, 10)
HOP_OF = {round(s, 4): h for h, s in enumerate(HOP_SCORES)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "bench/results/entity_graph_locomo.json"))
    args = ap.parse_args()

    recs = locomo_records(unit="turn")
    ds = load_locomo(unit="turn")
    by_conv: dict[str, list[dict]] = defaultdict(list)
    for r in recs:
        by_conv[r["tenant"]].append(r)

    # extraction speed (one pass over every turn, single thread)
    t0 = time.perf_counter()
    n_ents = sum(len(extract_entities(r["text"], r["metadata"]["speaker"])) for r in recs)
    t_extract = time.perf_counter() - t0

    # one graph over every conversation, each question filtered to its own (what a shared memory does)
    t0 = time.perf_counter()
    shared = EntityGraph()
    shared.add(np.arange(len(recs), dtype=np.int64), [r["text"] for r in recs],
               [r["metadata"]["speaker"] or None for r in recs])
    shared.n_entities  # noqa: B018 - forces the flush into the timing
    shared_build_s = time.perf_counter() - t0
    shared_seq = {r["id"]: i for i, r in enumerate(recs)}
    shared_calls = {"n": 0, "s": 0.0, "mismatches": 0}

    rows: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    build_s = {v: 0.0 for v in VARIANTS}
    query_s = {v: 0.0 for v in VARIANTS}
    graph_sizes = {}
    queries = [q for q in ds.queries if q.scored]
    for conv, crecs in tqdm(sorted(by_conv.items()), desc="conversations", disable=None):
        seq_of = {r["id"]: i for i, r in enumerate(crecs)}
        seqs = np.arange(len(crecs), dtype=np.int64)
        texts = [r["text"] for r in crecs]
        speakers = [r["metadata"]["speaker"] or None for r in crecs]
        cq = [q for q in queries if q.group == conv]
        for name, kw in VARIANTS.items():
            t0 = time.perf_counter()
            g = EntityGraph(**kw)
            g.add(seqs, texts, speakers)
            g.n_entities  # noqa: B018 - forces the flush into the timing
            build_s[name] += time.perf_counter() - t0
            if name == "demote":
                hubs = [g._keys[i] for i in np.flatnonzero(g._hubs())]
                graph_sizes[conv] = {"turns": g.n_records, "entities": g.n_entities, "hubs": hubs}
            for q in cq:
                gold = [seq_of[d] for d in q.gold if d in seq_of]
                ents = g.query_entities(q.text)
                hub_mask = g._hubs()
                n_specific = sum(1 for e in ents if not hub_mask[g._key_id[e]])
                s_all, sc_all = g.score(q.text, max_hops=3, depth=len(crecs))
                hop = {int(s): HOP_OF[round(float(c), 4)] for s, c in zip(s_all, sc_all)}
                gold_hop = min((hop[s] for s in gold if s in hop), default=None)
                n_within = [int(sum(1 for h in hop.values() if h <= k)) for k in range(3)]
                multi = g.is_multi_hop(q.text)
                t1 = time.perf_counter()
                top, top_sc = g.score(q.text, max_hops=3 if multi else 2, depth=max(CUTOFFS))
                query_s[name] += time.perf_counter() - t1
                top = top.tolist()
                if name == "demote":
                    allowed = np.array([shared_seq[r["id"]] for r in crecs], np.int64)
                    t1 = time.perf_counter()
                    s2, sc2 = shared.score(q.text, allowed=allowed, max_hops=3 if multi else 2,
                                           depth=max(CUTOFFS))
                    shared_calls["s"] += time.perf_counter() - t1
                    shared_calls["n"] += 1
                    shared_calls["mismatches"] += int((s2 - allowed[0]).tolist() != top
                                                      or sc2.tolist() != top_sc.tolist())
                rows[name].append({
                    "conv": conv, "category": q.category, "n_entities": len(ents), "n_specific": n_specific, "multi_hop": multi,
                    "gold_hop": gold_hop, "n_within": n_within,
                    **{f"hit@{k}": float(any(s in gold for s in top[:k])) for k in CUTOFFS},
                })

    def block(rs: list[dict]) -> dict:
        conv = [r["conv"] for r in rs]
        out = {
            "n": len(rs),
            "with_entities": float(np.mean([r["n_entities"] > 0 for r in rs])),
            "with_non_hub_entities": float(np.mean([r["n_specific"] > 0 for r in rs])),
            "flagged_multi_hop": float(np.mean([r["multi_hop"] for r in rs])),
            "gold_within_hop": {str(h): float(np.mean([r["gold_hop"] is not None and r["gold_hop"] <= h
                                                       for r in rs])) for h in range(4)},
            "candidates_within_hop": {str(h): float(np.mean([r["n_within"][h] for r in rs])) for h in range(3)},
        }
        sp_rs = [r for r in rs if r["n_specific"] > 0]
        out["questions_with_non_hub_entities"] = {
            "n": len(sp_rs),
            "gold_within_hop": {str(h): float(np.mean([r["gold_hop"] is not None and r["gold_hop"] <= h
                                                       for r in sp_rs])) if sp_rs else None for h in range(4)},
            "candidates_within_hop": {str(h): float(np.mean([r["n_within"][h] for r in sp_rs])) if sp_rs else None
                                      for h in range(3)},
            **{f"hit@{k}": float(np.mean([r[f"hit@{k}"] for r in sp_rs])) if sp_rs else None for k in CUTOFFS},
        }
        for k in CUTOFFS:
            v = np.array([r[f"hit@{k}"] for r in rs])
            out[f"hit@{k}"] = bootstrap_ci(v, conv, n_boot=2000).to_dict()
        return out

    results = {}
    for name, rs in rows.items():
        cats = sorted({r["category"] for r in rs})
        results[name] = {"overall": block(rs), "by_category": {c: block([r for r in rs if r["category"] == c])
                                                               for c in cats}}
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    out = {
        "what": "LoCoMo turn-level entity-graph diagnostic (one graph per conversation); nothing tuned",
        "command": "python bench/entity_graph_locomo.py",
        "commit": commit,
        "machine": machine_info(),
        "hop_scores": list(HOP_SCORES),
        "n_turns": len(recs),
        "n_questions": len(queries),
        "extraction": {"records_per_s": len(recs) / t_extract, "entities_per_turn": n_ents / len(recs),
                       "seconds": t_extract},
        "build_records_per_s": {v: len(recs) / s for v, s in build_s.items()},
        "ms_per_score_call": {v: 1000 * s / len(queries) for v, s in query_s.items()},
        "shared_graph": {
            "what": "one graph over all 10 conversations, each question filtered (allowed) to its own turns",
            "build_records_per_s": len(recs) / shared_build_s,
            "ms_per_filtered_score_call": 1000 * shared_calls["s"] / max(shared_calls["n"], 1),
            "questions_differing_from_per_conversation_graph": shared_calls["mismatches"],
        },
        "graphs": graph_sizes,
        "variants": results,
    }
    save_json(out, args.out)
    print(f"extraction: {out['extraction']['records_per_s']:.0f} turns/s, "
          f"{out['extraction']['entities_per_turn']:.2f} entities/turn")
    print(f"shared graph, filtered per conversation: {out['shared_graph']['ms_per_filtered_score_call']:.2f} ms "
          f"per call, {shared_calls['mismatches']} questions differ from the per-conversation graphs")
    for name, res in results.items():
        print(f"\n== {name}  (build {out['build_records_per_s'][name]:.0f} turns/s, "
              f"{out['ms_per_score_call'][name]:.2f} ms per score call)")
        print(f"{'category':<13}{'n':>5}{'ents':>7}{'<=0':>7}{'<=1':>7}{'<=2':>7}{'<=3':>7}"
              f"{'cand0':>7}{'cand1':>7}{'cand2':>7}{'H@1':>7}{'H@5':>7}{'H@10':>7}")
        for c, b in [("overall", res["overall"]), *res["by_category"].items()]:
            w, cw = b["gold_within_hop"], b["candidates_within_hop"]
            print(f"{c:<13}{b['n']:>5}{b['with_entities']:>7.3f}" + "".join(f"{w[str(h)]:>7.3f}" for h in range(4))
                  + "".join(f"{cw[str(h)]:>7.0f}" for h in range(3))
                  + "".join(f"{b[f'hit@{k}']['mean']:>7.3f}" for k in CUTOFFS))
        print("questions naming a non-hub entity:")
        for c, b in [("overall", res["overall"]), *res["by_category"].items()]:
            x = b["questions_with_non_hub_entities"]
            if not x["n"]:
                continue
            w, cw = x["gold_within_hop"], x["candidates_within_hop"]
            print(f"{c:<13}{x['n']:>5}{'':>7}" + "".join(f"{w[str(h)]:>7.3f}" for h in range(4))
                  + "".join(f"{cw[str(h)]:>7.0f}" for h in range(3))
                  + "".join(f"{x[f'hit@{k}']:>7.3f}" for k in CUTOFFS))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
