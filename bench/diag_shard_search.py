#!/usr/bin/env python
"""Why a shard's own search is slower than one ``Memory``'s on the same records (issue 38), in one process,
no Ray: each step between ``Memory.search`` and ``ShardServer.search`` timed alone, interleaved question by
question (p50 ms over ``--one`` tenant-confined questions, k=10).

* ``memory``: ``Memory.search`` of a memory built by ``add`` (the baseline);
* ``memory_stats``: the same memory searched with global statistics (``stats=``, versioned: the
  shard's restated snapshot) -- what statistics cost by themselves;
* ``shard_memory``: the shard's own memory (built by the shard's writes: given sequence numbers, its log,
  its checkpoints) searched plainly -- what the shard's segments cost by themselves;
* ``shard_memory_stats``: the shard's memory with the statistics the coordinator sends;
* ``shard_search``: :meth:`ShardServer.search` with the coordinator's request (``final``: the records in
  the answer) -- the shard's whole work.

Usage::

    python bench/diag_shard_search.py --records 200000 --one 300
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GPUIR_TIERED_START", "0")

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gpuir import Memory
from gpuir.cluster.shard import ShardServer, write_payload
from gpuir.cluster.sharded import memory_kwargs
from gpuir.memory.intake import to_batch
from gpuir.memory.termstats import TermStats


def pct(xs, q=50):
    return round(float(np.percentile(np.asarray(xs), q)), 3)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--queries", type=int, default=500)
    p.add_argument("--one", type=int, default=300)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--checkpoint-every", type=int, default=10_000)
    p.add_argument("--variants", default="memory,memory_stats,shard_memory,shard_memory_stats,shard_search")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    from bench_sharded import synthetic

    corpus = synthetic(args.records, args.queries)
    work = Path(tempfile.mkdtemp(prefix="gpuir-diag-"))
    mem = Memory()
    shard = ShardServer(work / "shard", create=memory_kwargs(mem.config()), checkpoint_every=args.checkpoint_every)
    t0 = time.perf_counter()
    seq = 0
    for wid, b in enumerate(corpus["batches"](args.batch), start=1):
        mem.add(b)
        batch = to_batch(b)
        shard.write(write_payload("add", wid, batch=batch, seqs=np.arange(seq, seq + len(b), dtype=np.int64)))
        seq += len(b)
    load_s = time.perf_counter() - t0
    smem = shard.memory
    info = {name: {k: m.info()[k] for k in ("records", "segments", "partitions")} for name, m in
            (("memory", mem), ("shard_memory", smem))}
    queries, wheres, k = corpus["queries"], corpus["wheres"], args.k
    an_terms = {}

    def gstats(q, version=1):
        from gpuir.memory.termstats import query_terms
        snap = mem._writer._snap
        terms = an_terms.get(q)
        if terms is None:
            terms = an_terms[q] = query_terms(snap, [q])
        ts = mem.term_stats([q])
        return TermStats(ts.n_docs, ts.total_len, dict(ts.df), version=version)

    fns = {
        "memory": lambda q, w: mem.search(q, k=k, where=w),
        "memory_stats": lambda q, w: mem.search(q, k=k, where=w, stats=gstats(q)),
        "shard_memory": lambda q, w: smem.search(q, k=k, where=w),
        "shard_memory_stats": lambda q, w: smem.search(q, k=k, where=w, stats=gstats(q)),
        "shard_search": lambda q, w: shard.search([q], k, [w], "exhaustive", [None], gstats(q), "auto", "oldest",
                                                  None, None, [True]),
        # the statistics without a version (what bench/profile_sharded_one.py's shard_inprocess sent): a new
        # restated snapshot per search, its caches (term weights, allow-lists) empty each time
        "shard_search_unversioned": lambda q, w: shard.search([q], k, [w], "exhaustive", [None], gstats(q, None),
                                                              "auto", "oldest", None, None, [True]),
    }
    names = args.variants.split(",")
    for i in range(10):
        for n in names:
            fns[n](queries[i], wheres[i])
    rng = np.random.default_rng(1)
    pick = rng.choice(len(queries), size=args.one, replace=True).tolist()
    t = {n: [] for n in names}
    same = True
    for j, i in enumerate(pick):
        q, w = queries[i], wheres[i]
        ref = None
        for n in names[j % len(names):] + names[:j % len(names)]:  # each variant first as often as the others
            t0 = time.perf_counter()
            r = fns[n](q, w)
            t[n].append((time.perf_counter() - t0) * 1e3)
            seqs = r["seqs"][0] if isinstance(r, dict) else r.seqs[0]
            seqs = seqs[seqs >= 0]
            if ref is None:
                ref = seqs
            else:
                same &= bool(np.array_equal(ref, seqs))
    res = {"records": args.records, "questions": len(pick), "load_s": round(load_s, 1), "info": info,
           "gc_counts": gc.get_count(), "same_seqs": same, "loadavg": os.getloadavg(),
           "affinity": sorted(os.sched_getaffinity(0)),
           "p50_ms": {n: pct(v) for n, v in t.items()}, "p90_ms": {n: pct(v, 90) for n, v in t.items()}}
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    shard.close()
    mem.close()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
