"""``gpuir memory info`` of a sharded memory: the manifest and each shard, read from disk (no Ray needed).

Works while the memory is open elsewhere (a running ``gpuir serve``): every
shard's memory is opened for reading, and its write-ahead log is read without
changing it. A running memory's processes (node, pid, device) are in
:meth:`ShardedMemory.info <gpuir.cluster.ShardedMemory.info>` and the
service's ``/healthz``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..memory import Memory, persist
from ..memory.durable import op_records
from ..wal import FORMATS, WALCorruptError, read_segment, segments
from . import layout


def _pending(root: Path, generation: int) -> tuple[int, int]:
    """Operations and records in the shard's memory's log (and in an older gpuir's own shard log, folded at the
    shard's next start) not yet folded into its memory's ``generation``."""
    ops = recs = 0
    for kind in ("memory", "service"):
        segs = segments(root, kind)
        for i, (_, p) in enumerate(segs):
            try:
                r = read_segment(p, allow_torn_tail=i == len(segs) - 1, fmt=FORMATS[kind])
            except (WALCorruptError, OSError):
                continue  # the shard's own start reports damage, naming the byte
            if r.header and int(r.header.get("base_generation", 0)) < generation:
                continue
            for op in r.ops:
                ops += 1
                recs += op_records(op) if kind == "memory" else len(op.get("ids") or op["batch"]["ids"])
    return ops, recs


def describe(path: str | Path) -> dict[str, Any]:
    """The sharded memory at ``path``: settings, and per shard the saved records and the log's pending ones."""
    root = Path(path)
    m = layout.read_manifest(root)
    shards = []
    for i in range(int(m["shards"])):
        d = layout.shard_dir(root, i)
        info = Memory.open(d, writer=False).info()  # (a reader replays the log too: its counts include it)
        saved = persist.read_manifest(d)[1]
        ops, recs = _pending(d, int(saved["generation"]))
        shards.append({"shard": i, "path": str(d), "records_saved": int(saved["n_records"]), "segments": info["segments"],
                       "partitions": info["partitions"], "tenants": info["tenants"], "terms": info["terms"],
                       "generation": info["generation"], "log_operations": ops, "log_records": recs})
    return {"path": str(root), "sharded": True, "shards": int(m["shards"]), "route": m["route"],
            "created": m.get("created"), "options": m.get("options", {}),
            "records_saved": sum(s["records_saved"] for s in shards),
            "log_records": sum(s["log_records"] for s in shards), "shard_list": shards, **m["memory"]}


def running(path: str | Path, address: str | None = None) -> dict[str, Any]:
    """:meth:`ShardedMemory.info <gpuir.cluster.ShardedMemory.info>` of the memory at ``path``, its shards
    started on Ray for the purpose (and stopped again)."""
    from .sharded import ShardedMemory

    with ShardedMemory.open(path, address=address) as sm:
        return sm.info()


def _print_running(info: dict[str, Any]) -> None:
    print(f"sharded memory {info['path']} ({info['shards']} shards, route {info['route']}, {info['device']}; "
          f"Ray: {info['ray']['nodes']} node(s))")
    print(f"  records     {info['records']:,}, coordinator pid {info['coordinator']['pid']}")
    print("  shard      records  node          pid  device    backend  segments  path")
    for s in info["shard_list"]:
        node = (s["node"] or "-")[:12]
        print(f"  {s['shard']:>5}  {s['records']:>11,}  {node:<12}  {s['pid']:>5}  {s['device']:<8}  "
              f"{s['backend']:<7}  {s['segments']:>8,}  {s['path']}")


def cmd_info(args: argparse.Namespace) -> int:
    """Print :func:`describe` (``--start``: :func:`running`; ``--json``: as JSON)."""
    if getattr(args, "start", False):
        from ..storage.dirlock import StoreLockedError

        try:
            info = running(args.memory_dir, getattr(args, "ray_address", None))
        except StoreLockedError as e:
            print(f"gpuir memory info: {e}: the memory is open elsewhere (a running gpuir serve shows its shards "
                  "at /healthz with an operator key); leave --start out to read the shards from disk",
                  file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps(info, indent=1, default=str))
        else:
            _print_running(info)
        return 0
    info = describe(args.memory_dir)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"sharded memory {info['path']} ({info['shards']} shards, route {info['route']}, created {info['created']})")
    print(f"  records     {info['records_saved']:,} saved, {info['log_records']:,} more in the shards' logs")
    bm = info["bm25"]
    an = info["analyzer"].get("name") or json.dumps(info["analyzer"])
    print(f"  bm25        {bm['method']} k1={bm['k1']:g} b={bm['b']:g} delta={bm['delta']:g}, analyzer {an}")
    print("  shard  records(saved)  log records  segments  partitions  tenants  path")
    for s in info["shard_list"]:
        print(f"  {s['shard']:>5}  {s['records_saved']:>14,}  {s['log_records']:>11,}  {s['segments']:>8,}  "
              f"{s['partitions']:>10,}  {s['tenants']:>7,}  {s['path']}")
    print("  (a running memory's nodes, processes and devices: ShardedMemory.info() or the service's /healthz)")
    return 0
