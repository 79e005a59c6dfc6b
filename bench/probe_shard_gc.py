#!/usr/bin/env python
"""What one full pass of the cyclic garbage collector costs inside a shard actor's process.

A full pass holds the GIL and walks every container the process tracks; in a shard actor that is Ray's,
NumPy's and numba's objects, most of them loaded at start and never garbage. A shard actor (one that owns
its process, :class:`gpuir.cluster.shard.ShardServer` ``own_process``) moves them out of the passes once its
engine is warm (:func:`gpuir.memory.warmup.freeze_startup_heap`). This probe grows a one-shard
:class:`gpuir.ShardedMemory` over ``--records`` synthetic records (adds of ``--batch``), then, inside the
actor (Ray's ``__ray_call__``), times three full passes as the actor runs them (``as_started``), and three
with its frozen objects put back into the collector's care (``gc.unfreeze``: what every pass cost before),
then freezes them again.

Usage::

    python bench/probe_shard_gc.py --records 500000 --out bench/results/shard_gc_vm_s38.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _passes(self, unfreeze: bool) -> dict:
    """Run inside the actor: three timed full passes (after ``gc.unfreeze()`` when asked, frozen again after)."""
    import gc
    import time

    if unfreeze:
        gc.unfreeze()
    gc.collect()
    out = {"tracked": len(gc.get_objects()), "frozen": gc.get_freeze_count(), "full_pass_ms": []}
    for _ in range(3):
        t = time.perf_counter()
        gc.collect()
        out["full_pass_ms"].append((time.perf_counter() - t) * 1e3)
    if unfreeze:
        gc.freeze()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=500_000)
    p.add_argument("--batch", type=int, default=5_000)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    from gpuir.cluster import ShardedMemory
    from gpuir.synthetic import iter_records

    with tempfile.TemporaryDirectory(prefix="gpuir-probe-shard-gc-") as tmp:
        sm = ShardedMemory.create(Path(tmp) / "sm", shards=1, route="tenant", device="cpu")
        try:
            t0 = time.perf_counter()
            buf: list[dict] = []
            for chunk in iter_records(args.records, seed=0):
                buf.extend(chunk)
                while len(buf) >= args.batch:
                    sm.add(buf[:args.batch])
                    buf = buf[args.batch:]
            if buf:
                sm.add(buf)
            grow_s = time.perf_counter() - t0
            actor = sm._actors[0]
            res = {"as_started": ray.get(actor.__ray_call__.remote(_passes, False)),
                   "unfrozen": ray.get(actor.__ray_call__.remote(_passes, True)),
                   "records": len(sm), "grow_s": grow_s}
        finally:
            sm.close()
    res["machine"] = {"host": socket.gethostname(), "cores": os.cpu_count(), "python": platform.python_version()}
    res["command"] = "python bench/probe_shard_gc.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(json.dumps(res, indent=1))
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
