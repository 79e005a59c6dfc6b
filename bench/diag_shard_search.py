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

import gc
import os
import time

import _shard_diag as sd  # (first: the environment and sys.path, before Ray, NumPy and gpuir are imported)
import numpy as np

from gpuir.memory.termstats import TermStats


def main(argv=None) -> int:
    p = sd.parser(__doc__)
    p.add_argument("--checkpoint-every", type=int, default=10_000)
    p.add_argument("--variants", default="memory,memory_stats,shard_memory,shard_memory_stats,shard_search")
    args = sd.parse(p, argv, label=False)
    from bench_sharded import synthetic

    corpus = synthetic(args.records, args.queries)
    with sd.rig(corpus, args.batch, "gpuir-diag-", sharded=False, shard="shard",
                checkpoint_every=args.checkpoint_every) as rig:
        return _run(args, corpus, rig)


def _run(args, corpus, rig) -> int:
    """Time each variant on the filled memories; print (and write) the results."""
    mem, shard, load_s = rig.mem, rig.shard, rig.load_s
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
           "p50_ms": {n: sd.pct(v) for n, v in t.items()}, "p90_ms": {n: sd.pct(v, 90) for n, v in t.items()}}
    sd.emit(res, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
