#!/usr/bin/env python
"""Modelled (query, tile) work of the GPU scorer at NQ scale, before and after the plan-then-score design.

    python bench/model_visits.py                      # 2.7M documents, 256 queries of each kind, k = 10 and 100
    python bench/model_visits.py --n-docs 300000 --queries 64   # quicker

No device: the counts come from NumPy over the same synthetic corpus the
device verification uses (``bench/gpu_verify.py``'s Zipf generator) and the
scorer's own directory (``gpuir.backends.cupy_backend.build_directory``,
impacts per (long term, tile of 4,096 documents)). Per query and k:

* **before** (the first GPU design, issue 11): every (query, tile) cell runs the
  bound step inside the scoring kernel (3 barriers and a serial sum), and the
  tiles whose exact block-max bound reaches the running threshold are scored;
  the scored count is not modelled here (its threads race for the threshold),
  the device measured it (``bench/results/gpu_verify_*_20261126T133243_*``).
* **after**: ``tile_bounds`` computes every cell's bound from the impacts in a
  barrier-free kernel; the row's best tile is scored first; only the cells whose
  bound reaches the seeded threshold (the k-th best score in that tile) become
  work items.
* **ideal**: the tiles that hold at least one document scoring at least the
  query's final k-th best score -- what any exact tile-level method must visit.
* **seeded** (the next design's inputs): the S best-bound tiles (S = 1, 4, 16,
  64) are scored first and their k-th best score is the threshold; then the
  tiles whose bound reaches it are read whole (tile cut), or only their
  256-document blocks whose bound (the sum of each query term's exact largest
  weight in the block) reaches it (sub-block cut). S = 0 stands for the final
  k-th score known from the start: the best either cut can do.

Bytes are the query terms' postings in the visited tiles (doc id, tf and the
document length gathered: 12 bytes each) against the postings floor (every
posting of the query terms once, 8 bytes: doc id and tf). Two query sets: the
device run's (2-6 tokens of a random document, often all frequent terms) and
one whose queries each hold a rare term (df < N / 2,000), closer to questions.
Writes ``bench/results/model_visits_<machine>.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_verify import make_index, make_queries

from gpuir.backends.cupy_backend import build_directory
from gpuir.backends.weights import term_weights, weight_bound, weights_of
from gpuir.bm25 import BM25Params

TILE = 4096
SUB = 256  # the finer block of the modelled sub-block cut
SUBS = TILE // SUB
SEEDS = (1, 4, 16, 64, 0)  # 0: the final threshold known in advance (a bound on any cut)


def rare_queries(tok_off, tok, df, n_docs, n, seed):
    """n queries: 1-4 tokens of a random document that holds a rare term (df < N/2000), plus that term."""
    rng = np.random.default_rng(seed + 5)
    rare = df < max(2, n_docs // 2000)
    out = []
    while len(out) < n:
        d = int(rng.integers(0, tok_off.size - 1))
        toks = tok[tok_off[d]:tok_off[d + 1]]
        r = toks[rare[toks]]
        if r.size == 0:
            continue
        others = rng.choice(toks, size=min(toks.size, int(rng.integers(1, 5))), replace=False)
        out.append(np.unique(np.append(others, r[0])).astype(np.int64))
    return out


def unpack(pairs):
    tf = (pairs & 0xFFFF).astype(np.int64)
    tf[tf == 0xFFFF] = 2**31 - 1
    return tf, (pairs >> 16).astype(np.int64)


def model_query(idx, d, n_tiles, q, ks, params, stats):
    """Per k: (cells, after items, ideal tiles, bytes after, bytes ideal, bytes floor) of one query."""
    terms = np.unique(q)
    df_all = np.diff(idx.offsets)
    terms = terms[df_all[terms] > 0]
    if terms.size == 0:
        return None
    idf, w0 = term_weights(df_all[terms], idx.n_docs, params)
    U = np.zeros(n_tiles)
    post_tile = np.zeros(n_tiles, np.int64)  # postings of the query's terms per tile
    acc = np.zeros(idx.n_docs, np.float32)
    touched = np.zeros(idx.n_docs, bool)
    n_sub = -(-idx.n_docs // SUB)
    U_sub = np.zeros(n_sub)
    post_sub = np.zeros(n_sub, np.int64)
    for i, t in enumerate(terms.tolist()):
        s, e = int(idx.offsets[t]), int(idx.offsets[t + 1])
        docs = idx.doc_ids[s:e]
        w = weights_of(idx.tfs[s:e], idx.doc_lens[docs], idf[i], w0[i], stats, params)
        acc[docs] += w
        touched[docs] = True
        sb = docs // SUB  # doc ids ascend: each sub-block's postings are one run
        starts = np.flatnonzero(np.r_[True, sb[1:] != sb[:-1]])
        U_sub[sb[starts]] += np.maximum.reduceat(w.astype(np.float64), starts)
        post_sub += np.bincount(sb, minlength=n_sub)
        tl = docs // TILE
        post_tile += np.bincount(tl, minlength=n_tiles)
        r = int(d["dir_row"][t])
        if r >= 0:
            off = d["dir_imp_off"][r * n_tiles:(r + 1) * n_tiles + 1]
            pairs = d["dir_imp"][off[0]:off[-1]]
            tf, dl = unpack(pairs)
            b = weight_bound(tf, dl, np.full(tf.size, idf[i]), np.full(tf.size, w0[i]), stats, params)
            cnt = np.diff(off)
            has = np.flatnonzero(cnt > 0)
            U[has] += np.maximum.reduceat(b.astype(np.float64), (off[:-1] - off[0])[has])
        else:
            pairs = d["term_imp"][d["term_imp_off"][t]:d["term_imp_off"][t + 1]]
            tf, dl = unpack(pairs)
            b = float(weight_bound(tf, dl, np.full(tf.size, idf[i]), np.full(tf.size, w0[i]), stats,
                                   params).max())
            U[np.unique(tl)] += b
    cand = np.flatnonzero(touched)
    scores = acc[cand]
    ctile = cand // TILE
    floor = 8 * int(post_tile.sum())
    cells = int((post_tile > 0).sum())
    seed = int(np.argmax(np.where(post_tile > 0, U, -1.0)))
    order = np.argsort(-np.where(post_tile > 0, U, -1.0), kind="stable")  # tiles, best bound first
    out = {}
    for k in ks:
        in_seed = scores[ctile == seed]
        theta = float(np.sort(in_seed)[-k]) if in_seed.size >= k else 0.0
        after = (U >= theta * (1 - 1e-6)) & (post_tile > 0)
        after[seed] = True
        sk = float(np.sort(scores)[-k]) if scores.size >= k else -np.inf
        ideal = np.zeros(n_tiles, bool)
        ideal[np.unique(ctile[scores >= sk])] = True
        row = [cells, int(after.sum()), int(ideal.sum()), 12 * int(post_tile[after].sum()),
               12 * int(post_tile[ideal].sum()), floor]
        for n_seed in SEEDS:  # the threshold from the n best-bound tiles scored first, then a tile or sub-block cut
            if n_seed == 0:  # the final k-th score as the threshold from the start: the cut's best case
                seeds, th = order[:0], (sk if np.isfinite(sk) else 0.0)
            else:
                seeds = order[:n_seed]
                seeds = seeds[post_tile[seeds] > 0]
                sc = scores[np.isin(ctile, seeds)]
                th = float(np.sort(sc)[-k]) if sc.size >= k else 0.0
            keep = (U >= th * (1 - 1e-6)) & (post_tile > 0)
            keep[seeds] = True
            keep_sub = (U_sub >= th * (1 - 1e-6)) & (post_sub > 0) & np.repeat(keep, SUBS)[:U_sub.size]
            keep_sub[np.isin(np.arange(U_sub.size) // SUBS, seeds)] = True
            row += [int(keep.sum()), 12 * int(post_tile[keep].sum()), 12 * int(post_sub[keep_sub].sum())]
        out[k] = tuple(row)
    return out


SEED_TILES = 16  # the built seed (gpuir.backends.kernels.SEED_TILES)


def _key(x):
    """Ordered uint32 keys of float32 scores (kernel_model.float_to_ordered), as int64."""
    from gpuir.backends.kernel_model import float_to_ordered

    return float_to_ordered(np.asarray(x, np.float32)).astype(np.int64)


def _kth_key(keys, k):
    """The k-th largest key, 0 when there are fewer than k."""
    return int(np.partition(keys, keys.size - k)[keys.size - k]) if keys.size >= k else 0


def _tile_l(keys, k):
    """tile_score's tile bound L: the k-th best key truncated to bits 31..10 (0 with fewer than k)."""
    return (_kth_key(keys, k) >> 10) << 10


def built_query(idx, d, n_tiles, q, ks, params, avgdl):
    """What the built kernels' planning does for one query, per k: before (one seed tile, tile cut) and after.

    Mirrors ``kernels/bm25_score.cu`` decision by decision, with NumPy: float32 tile bounds U (each
    present term's largest impact bound, summed in term order) and their keys; scores as the
    reference adds them. **before**: the best tile seeds theta with its own L; the tiles with
    key(U) >= theta are read whole. **after**: the 16 best tiles (key(U) desc, lower tile first) are
    read whole (their sub-block cut runs against theta = 0: the seeds start together), theta = the
    k-th best key of the seeds' documents (select_topk over their emitted keys, seed_theta); the
    other tiles with key(U) >= theta are listed, and in each only the sub-blocks whose bound
    (each present term's largest sub-block impact bound, or a light term's whole-list bound,
    summed in term order) reaches theta are read -- with theta held at the seed's value
    ("pessimistic": every list item at once, as when the device's blocks take them together) or
    raised by each tile's L in tile order ("sequential": one block taking the list in order).
    """
    from gpuir.backends.cupy_backend import SUBS

    terms = np.unique(q)
    df_all = np.diff(idx.offsets)
    terms = terms[df_all[terms] > 0]
    if terms.size == 0:
        return None
    N = idx.n_docs
    sub = TILE // SUBS
    n_sub = n_tiles * SUBS
    idf, w0 = term_weights(df_all[terms], N, params)
    U = np.zeros(n_tiles, np.float32)
    present = np.zeros(n_tiles, bool)
    UB = np.zeros(n_sub, np.float32)
    post_tile = np.zeros(n_tiles, np.int64)
    post_sub = np.zeros(n_sub, np.int64)
    acc = np.zeros(N, np.float32)
    touched = np.zeros(N, bool)
    nterm_tile = np.zeros(n_tiles, np.int64)  # query terms with a posting in each tile / sub-block
    nterm_sub = np.zeros(n_sub, np.int64)
    for i, t in enumerate(terms.tolist()):
        s, e = int(idx.offsets[t]), int(idx.offsets[t + 1])
        docs = idx.doc_ids[s:e].astype(np.int64)
        w = weights_of(idx.tfs[s:e], idx.doc_lens[docs], idf[i], w0[i], avgdl, params)
        acc[docs] = acc[docs] + w
        touched[docs] = True
        tl, sb = docs // TILE, docs // sub
        cnt_tile = np.bincount(tl, minlength=n_tiles)
        post_tile += cnt_tile
        nterm_tile += cnt_tile > 0
        cnt_sub = np.bincount(sb, minlength=n_sub)
        post_sub += cnt_sub
        nterm_sub += cnt_sub > 0
        bt = np.zeros(n_tiles, np.float32)
        bs = np.zeros(n_sub, np.float32)
        r = int(d["dir_row"][t])
        if r >= 0:
            off = d["dir_imp_off"][r * n_tiles:(r + 1) * n_tiles + 1]
            tf, dl = unpack(d["dir_imp"][off[0]:off[-1]])
            b = weight_bound(tf, dl, np.full(tf.size, idf[i]), np.full(tf.size, w0[i]), avgdl, params)
            has = np.flatnonzero(np.diff(off) > 0)
            bt[has] = np.maximum.reduceat(b, (off[:-1] - off[0])[has])
            cells = slice(r * n_tiles, (r + 1) * n_tiles)
            words = d["dir_sub_cnt"][cells].astype(np.uint64)
            n_imp = ((words[:, None] >> (4 * np.arange(SUBS, dtype=np.uint64))[None, :]) & np.uint64(15))
            n_imp = n_imp.astype(np.int64).reshape(-1)  # per sub-block of the term's row, in order
            s0, s1 = int(d["dir_sub_off"][r * n_tiles]), int(d["dir_sub_off"][(r + 1) * n_tiles])
            tf, dl = unpack(d["dir_sub_imp"][s0:s1])
            b = weight_bound(tf, dl, np.full(tf.size, idf[i]), np.full(tf.size, w0[i]), avgdl, params)
            starts = np.concatenate([[0], np.cumsum(n_imp)[:-1]])
            hs = np.flatnonzero(n_imp > 0)
            bs[hs] = np.maximum.reduceat(b, starts[hs])
        else:
            pairs = d["term_imp"][d["term_imp_off"][t]:d["term_imp_off"][t + 1]]
            tf, dl = unpack(pairs)
            b = np.float32(weight_bound(tf, dl, np.full(tf.size, idf[i]), np.full(tf.size, w0[i]), avgdl,
                                        params).max())
            bt[np.unique(tl)] = b
            bs[np.unique(sb)] = b
        present |= bt > 0
        U = (U + bt).astype(np.float32)  # term order, float32, as the kernels add
        UB = (UB + bs).astype(np.float32)
    ukey = np.where(post_tile > 0, _key(U), 0)
    ubkey = np.where(post_sub > 0, _key(UB), 0)
    cand = np.flatnonzero(touched)
    ckey = _key(acc[cand])
    ctile = cand // TILE
    floor = 8 * int(post_tile.sum())
    order = np.lexsort((np.arange(n_tiles), -ukey))
    order = order[ukey[order] > 0]
    tstart = np.searchsorted(ctile, np.arange(n_tiles + 1))  # cand ascends: each tile's candidates are a run
    tile_docs = [ckey[tstart[j]:tstart[j + 1]] for j in range(n_tiles)]
    csub = (cand % TILE) // sub
    out = {}
    for k in ks:
        sk = _kth_key(ckey, k)
        row = {"floor": floor, "cells": int((post_tile > 0).sum())}
        # before: one seed tile, tile cut
        seed = order[:1]
        theta = _tile_l(tile_docs[seed[0]], k) if seed.size else 0
        vis = (ukey >= max(theta, 1)) | np.isin(np.arange(n_tiles), seed)
        row["before_tiles"] = int(vis.sum())
        row["before_bytes"] = 12 * int(post_tile[vis].sum())
        # after: 16 seeds read whole, theta = their k-th best, list with the sub-block cut
        seeds = order[:SEED_TILES]
        in_seed = np.zeros(n_tiles, bool)
        in_seed[seeds] = True
        theta = _kth_key(ckey[in_seed[ctile]], k)
        theta = max([theta] + [_tile_l(tile_docs[j], k) for j in seeds])
        listed = (ukey >= max(theta, 1)) & ~in_seed
        sub_tile = np.repeat(np.arange(n_tiles), SUBS)
        has_post = post_sub > 0
        seed_subs = in_seed[sub_tile] & has_post
        row["after_tiles"] = int(in_seed.sum() + listed.sum())
        row["after_list_items"] = int(listed.sum())
        for mode in ("pessimistic", "sequential", "final"):
            if mode == "pessimistic":
                th_sub = np.full(n_sub, theta)
            elif mode == "final":  # the final k-th score from the start: the best these bounds allow
                th_sub = np.full(n_sub, sk)
            else:
                th_tile = np.full(n_tiles, theta)
                th = theta
                for j in np.flatnonzero(listed):  # tile order, theta raised by each tile's own L
                    th_tile[j] = th
                    if ukey[j] < th:
                        continue
                    kept = (ubkey[j * SUBS:(j + 1) * SUBS] >= th)
                    sc = tile_docs[j]
                    if sc.size:
                        th = max(th, _tile_l(sc[kept[csub[tstart[j]:tstart[j + 1]]]], k))
                th_sub = np.repeat(th_tile, SUBS)
                vis_tiles = listed & (ukey >= th_tile)
            lst = listed if mode != "sequential" else vis_tiles
            kept = lst[sub_tile] & has_post & (ubkey >= th_sub)
            skipped = lst[sub_tile] & has_post & ~kept
            row[f"after_{mode}_bytes"] = 12 * int(post_sub[seed_subs | kept].sum())
            row[f"after_{mode}_blocks_scored"] = int((seed_subs | kept).sum())
            row[f"after_{mode}_blocks_skipped"] = int(skipped.sum())
            row[f"after_{mode}_tiles"] = int(in_seed.sum() + lst.sum())
            if mode == "pessimistic":
                row.update(visit_costs(terms.size, in_seed | lst, seed_subs | kept, nterm_tile, nterm_sub, post_sub,
                                       np.bincount(ctile, minlength=n_tiles),
                                       np.bincount(cand // sub, minlength=n_sub), k))
        row["ideal_tiles"] = int(np.unique(ctile[ckey >= sk]).size) if sk else 0
        out[k] = row
    return out


def visit_costs(nt, vis_tiles, kept_subs, nterm_tile, nterm_sub, post_sub, cand_tile, cand_sub, k) -> dict:
    """Modelled per-visit work of the old ``tile_score`` (block per tile) and the new ``sub_plan`` +
    ``sub_score`` (warp per kept sub-block) for one query, counted from the kernels' code paths.

    old, per visited tile (``vis_tiles``; nb = ceil(nt / 16) term batches): block barriers
    1 (item) + 3 nb + 1 (sub-block bounds and cut) + 3 nb + (terms present: one per round) (the
    rounds) + 4 (keys, candidate count) + 11 when the tile has >= k candidates (two histogram
    passes) + 1 (threshold); passes over the 4,096 slots: EMPTY, keys, emission, + the second
    histogram pass; binary searches (``sub_ranges``): 15 per (term, call), once for the bounds and
    again for the rounds when nt > 16. new, per kept sub-block: no block barrier; __syncwarp 2 +
    (terms present); passes over its 256 slots: EMPTY, keys, count, emission (L's 32 steps run on
    registers); no search for a directory term. Bytes: 12 per posting read (doc id, tf, the
    document length gathered) in the kept sub-blocks, the same in both (both cut to the same
    sub-blocks at a fixed theta), plus the directory reads: old 8 per (present term, tile) for the
    range and 4 per search step (log2 of the run, 15 a term and call); new 8 per (present term,
    sub-block) (dir_start + two uint16 ends + the offsets word amortised).
    """
    sub_tile = np.repeat(np.arange(vis_tiles.size), SUBS)
    nb = -(-nt // 16)
    v = np.flatnonzero(vis_tiles)
    kept_in_vis = kept_subs & vis_tiles[sub_tile]
    r_t = nterm_tile[v]
    big = cand_tile[v] >= k
    old_barriers = int(((1 + 3 * nb + 1) + (3 * nb + r_t) + 4 + 11 * big + 1).sum())
    old_passes = int((3 + big).sum())
    run = np.maximum(1, post_sub.reshape(-1, SUBS)[v].sum(axis=1) // np.maximum(1, r_t))
    steps = np.ceil(np.log2(run + 1)).astype(np.int64)
    calls = 1 + (nt > 16)
    old_searches = int((15 * r_t * calls).sum())
    old_dir_bytes = int((8 * r_t + 4 * 15 * r_t * calls * steps).sum())
    ks = np.flatnonzero(kept_in_vis)
    new_syncwarps = int((2 + nterm_sub[ks]).sum())
    new_passes = 4 * ks.size
    new_dir_bytes = int(8 * nterm_sub[ks].sum())
    posting_bytes = 12 * int(post_sub[ks].sum())
    return {"cost_tiles": int(v.size), "cost_subs": int(ks.size), "old_block_barriers": old_barriers,
            "old_slot_passes_4096": old_passes, "old_slots_touched": 4096 * old_passes,
            "old_searches": old_searches, "old_bytes": posting_bytes + old_dir_bytes,
            "new_block_barriers": 0, "new_syncwarps": new_syncwarps, "new_slot_passes_256": new_passes,
            "new_slots_touched": 256 * new_passes, "new_searches": 0, "new_bytes": posting_bytes + new_dir_bytes,
            "posting_bytes": posting_bytes, "new_l_searches": int((cand_sub[ks] >= k).sum())}


def main_built(a, idx, d, n_tiles, sets, params) -> dict:
    result = {"machine": {"node": platform.node() or "machine", "cpu": platform.processor() or platform.machine(),
                          "python": sys.version.split()[0]},
              "what": "the built planning (kernels/bm25_score.cu), modelled with NumPy; bytes = 12 per posting read",
              "n_docs": idx.n_docs, "n_tiles": n_tiles, "tile": TILE, "sub_block": TILE // 16,
              "seed_tiles": SEED_TILES, "queries_per_set": a.queries, "sets": {}}
    for name, qs in sets.items():
        rows = {k: [] for k in a.k}
        for q in qs:
            r = built_query(idx, d, n_tiles, q, a.k, params, idx.avgdl)
            if r:
                for k in a.k:
                    rows[k].append(r[k])
        result["sets"][name] = {}
        for k in a.k:
            tot = {f: int(sum(r[f] for r in rows[k])) for f in rows[k][0]}
            tot["queries"] = len(rows[k])
            for f in list(tot):
                if f.endswith("_bytes"):
                    tot[f.replace("_bytes", "_over_floor")] = tot[f] / tot["floor"]
            result["sets"][name][str(k)] = tot
    return result



def _write(result: dict, out_dir: str, stem: str) -> Path:
    """``result`` as ``<out_dir>/<stem>_<machine>.json``; returns the path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}_{platform.node() or 'machine'}.json"
    path.write_text(json.dumps(result, indent=1))
    return path

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-docs", type=int, default=2_700_000)
    p.add_argument("--queries", type=int, default=256, help="queries of each kind")
    p.add_argument("-k", type=int, nargs="+", default=[10, 100])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument("--built", action="store_true",
                   help="count what the built planning does, before and after the sub-block design "
                        "(writes model_visits_built_<machine>.json)")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    idx, tok_off, tok = make_index(a.n_docs, a.seed, np)
    n_tiles = -(-idx.n_docs // TILE)
    d = build_directory(idx.offsets, idx.doc_ids, idx.tfs, idx.doc_lens, TILE, n_tiles, max(64, 2 * n_tiles))
    print(f"corpus and directory: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    params = BM25Params()
    avgdl = idx.avgdl
    sets = {"document tokens (the device run's)": make_queries(tok_off, tok, idx.n_terms, a.queries, a.seed),
            "with a rare term": rare_queries(tok_off, tok, np.diff(idx.offsets), idx.n_docs, a.queries, a.seed)}
    if a.built:
        res = main_built(a, idx, d, n_tiles, sets, params)
        path = _write(res, a.out, "model_visits_built")
        print("| queries | k | tiles before | bytes / floor before | tiles after | blocks scored / skipped "
              "| bytes / floor after (theta of the seed) | after, theta rising in tile order | after, final theta |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, per_k in res["sets"].items():
            for k, v in per_k.items():
                print(f"| {name} | {k} | {v['before_tiles']:,} | {v['before_over_floor']:.2f} | "
                      f"{v['after_pessimistic_tiles']:,} | {v['after_pessimistic_blocks_scored']:,} / "
                      f"{v['after_pessimistic_blocks_skipped']:,} | {v['after_pessimistic_over_floor']:.2f} | "
                      f"{v['after_sequential_over_floor']:.2f} | {v['after_final_over_floor']:.2f} |")
        print()
        print("| queries | k | tiles visited | sub-blocks kept | block barriers / tile, old -> new "
              "| slots touched / tile, old -> new | searches / tile, old -> new | bytes / tile, old -> new |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, per_k in res["sets"].items():
            for k, v in per_k.items():
                t = max(1, v["cost_tiles"])
                print(f"| {name} | {k} | {v['cost_tiles']:,} | {v['cost_subs']:,} | "
                      f"{v['old_block_barriers'] / t:.1f} -> 0 (+ {v['new_syncwarps'] / t:.1f} __syncwarp) | "
                      f"{v['old_slots_touched'] / t:,.0f} -> {v['new_slots_touched'] / t:,.0f} | "
                      f"{v['old_searches'] / t:.0f} -> 0 | {v['old_bytes'] / t:,.0f} -> {v['new_bytes'] / t:,.0f} |")
        print(f"wrote {path}", file=sys.stderr)
        return 0
    result = {"machine": {"cpu": platform.processor() or platform.machine(), "python": sys.version.split()[0]},
              "n_docs": idx.n_docs, "n_tiles": n_tiles, "tile": TILE, "queries_per_set": a.queries, "sets": {}}
    for name, qs in sets.items():
        rows = {k: [] for k in a.k}
        for q in qs:
            r = model_query(idx, d, n_tiles, q, a.k, params, avgdl)
            if r:
                for k in a.k:
                    rows[k].append(r[k])
        result["sets"][name] = {}
        for k in a.k:
            m = np.array(rows[k], np.float64)
            tot = m.sum(axis=0)
            cells, after, ideal, b_after, b_ideal, floor = tot[:6]
            v = result["sets"][name][str(k)] = {
                "queries": int(m.shape[0]), "cells_before": int(n_tiles * m.shape[0]), "cells_with_postings":
                int(cells), "items_after": int(after), "tiles_ideal": int(ideal), "bytes_after": int(b_after),
                "bytes_ideal": int(b_ideal), "bytes_floor": int(floor),
                "after_bytes_over_floor": float(b_after / floor), "ideal_bytes_over_floor": float(b_ideal / floor),
                "seeded": {}}
            for j, n_seed in enumerate(SEEDS):
                items, b_tile, b_sub = tot[6 + 3 * j: 9 + 3 * j]
                v["seeded"][str(n_seed)] = {"tiles": int(items), "tile_bytes_over_floor": float(b_tile / floor),
                                            f"sub{SUB}_bytes_over_floor": float(b_sub / floor)}
    path = _write(result, a.out, "model_visits")
    print("| queries | k | cells before (bound step in the scorer) | cells with postings | items after | ideal tiles "
          "| bytes after / floor | ideal / floor |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, per_k in result["sets"].items():
        for k, v in per_k.items():
            print(f"| {name} | {k} | {v['cells_before']:,} | {v['cells_with_postings']:,} | {v['items_after']:,} | "
                  f"{v['tiles_ideal']:,} | {v['after_bytes_over_floor']:.2f} | {v['ideal_bytes_over_floor']:.2f} |")
    print()
    print(f"| queries | k | best-bound tiles scored first | tiles then visited | bytes / floor, tile cut "
          f"| bytes / floor, {SUB}-document sub-block cut |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, per_k in result["sets"].items():
        for k, v in per_k.items():
            for n_seed, r in v["seeded"].items():
                seeded = "none: final k-th score given" if n_seed == "0" else n_seed
                print(f"| {name} | {k} | {seeded} | {r['tiles']:,} | {r['tile_bytes_over_floor']:.2f} | "
                      f"{r[f'sub{SUB}_bytes_over_floor']:.3f} |")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
