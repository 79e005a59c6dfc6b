"""Opening a memory directory: the commit mapped, then the log replayed (:meth:`gpuir.memory.Memory.open`).

:func:`load_commit` makes a memory of the manifest's settings and fills its
:class:`~gpuir.memory.writer.IndexWriter` with the committed segments (mapped, not read: see
:mod:`gpuir.memory.segfile`), the id map, the statistics and the history; :func:`open_memory` takes the
directory's writer lock (a writer), replays the directory's log over the commit
(:func:`recover_log`, through the memory's own add and delete; a reader replays it in memory) and attaches the
encoders given. Saving: :mod:`gpuir.memory.commit`; the files: :mod:`gpuir.memory.persist`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..storage.dirlock import WriterLock, check_path, is_claimed
from ..wal import WALCorruptError, read_log
from ..wal import segments as wal_segments
from . import persist, scope
from .durable import MemoryLog, check_durability, concat_batches, op_parts, op_records
from .embeddings import Embedding, parse_embeddings
from .persist import MemoryFormatError
from .records import RecordBatch
from .segments import VECTORS_PREFIX, SegView, segment_from_file

log = logging.getLogger("gpuir.memory")


def open_memory(cls: type, path: str | os.PathLike, writer: bool, verify: bool | str, lock_timeout: float,
                background_merges: bool, embeddings: Mapping[str, Any] | None, durability: str, salvage: bool) -> Any:
    """:meth:`Memory.open <gpuir.memory.Memory.open>`, whose arguments it takes (``cls``: the memory class
    made, :class:`~gpuir.memory.store.Memory`); returns the memory."""
    check_durability(durability)
    if verify not in (True, False, "full", "lazy"):
        raise ValueError(f"verify must be True, 'full' or False, got {verify!r}")
    root = check_path(path)
    if writer and root.is_dir() and not is_claimed(root):
        persist.read_manifest(root)  # the right error: not a memory
        raise MemoryFormatError(f"{root} has no gpuir marker; it is not a memory directory")
    lock = None
    if writer and root.is_dir():
        lock = WriterLock(root, timeout=lock_timeout)
        lock.__enter__()
    try:
        for attempt in range(5):
            name, manifest = persist.read_manifest(root)
            try:
                mem = load_commit(cls, root, manifest, verify, background_merges)
                ops = None if writer else read_log(root, mem._writer._gen)  # a reader sees every acknowledged write
                break
            except (FileNotFoundError, WALCorruptError) as e:  # a writer committed and cleaned up meanwhile
                if isinstance(e, WALCorruptError) and persist.read_manifest(root)[0] == name:
                    raise
                if persist.read_manifest(root)[0] == name or attempt == 4:
                    raise MemoryFormatError(f"{e.filename}: missing (named by {root / name})") from None
    except BaseException:
        if lock is not None:
            lock.__exit__(None, None, None)
        raise
    w = mem._writer
    w._durability = durability
    w._path = root
    w._lock = lock
    w._readonly = not writer
    w._prev_files = persist.manifest_files(manifest) | {name}
    try:
        if ops:
            replay(mem, ops)
            w._unsaved = 0
        if writer:
            recover_log(mem, salvage)
    except BaseException:
        mem.close(discard_unsaved=True)
        raise
    try:
        for ename, spec in parse_embeddings(embeddings).items():
            mem.add_embedding(ename, spec.encoder, spec.dtype if ename not in w._emb else w._emb[ename].dtype)
    except BaseException:
        mem.close(discard_unsaved=True)
        raise
    return mem


def load_commit(cls: type, root: Path, manifest: dict[str, Any], verify: bool | str, background_merges: bool) -> Any:
    """A memory (of class ``cls``) holding the commit ``manifest`` of directory ``root``: its settings, segments
    (mapped), id map, statistics and history; not yet bound to the directory (:func:`open_memory` binds it)."""
    cfg = manifest.get("config", {})
    bm = cfg.get("bm25", {})
    try:
        mem = cls(analyzer=cfg.get("analyzer", "default"), method=bm.get("method", "lucene"),
                  k1=bm.get("k1", 1.2), b=bm.get("b", 0.75), delta=bm.get("delta", 0.5),
                  partition_days=cfg.get("partition_days"), merge_factor=cfg.get("merge_factor", 8),
                  merge_min=cfg.get("merge_min", 1024), history_limit=cfg.get("history_limit", 10),
                  background_merges=background_merges, require_scope=bool(cfg.get("require_scope", False)),
                  # a manifest without record_times was saved before times were the default: its records
                  # have none, and its new writes get none either (no record "added now" beside untimed ones)
                  record_times=bool(cfg.get("record_times", False)), ranking=cfg.get("ranking", "bm25"))
    except (TypeError, ValueError) as e:
        raise MemoryFormatError(f"{root}: invalid settings in the manifest ({e})") from None
    w = mem._writer
    w.window_ms = cfg.get("window_ms", w.window_ms)
    try:
        stored = manifest.get("embeddings") or {}
        w._emb = {n: Embedding(n, None, d.get("dtype", "float32"), d.get("dim"), d.get("model"),
                               d.get("gpuir_model")) for n, d in stored.items()}
    except (TypeError, ValueError, AttributeError) as e:
        raise MemoryFormatError(f"{root}: invalid embeddings in the manifest ({e})") from None
    for e in manifest.get("segments", []):
        src = persist.open_segment(root, e, verify)
        path = root / e["file"]

        def damaged(err, path=path):
            return MemoryFormatError(f"{path}: damaged segment file ({err})")

        tr = (e["time_min"], e["time_max"]) if "time_min" in e and "time_max" in e else None
        try:
            seg = segment_from_file(src, int(e["uid"]), e["partition"], w.analyzer_config, w._terms,
                                    w._dicts, length=e.get("length"), time_range=tr, error=damaged)
        except (ValueError, IndexError, KeyError) as err:
            raise damaged(err) from None
        if seg.n_docs != int(e.get("n_docs", seg.n_docs)):
            raise damaged(f"{seg.n_docs} records, the manifest says {e['n_docs']}")
        for n, emb in w._emb.items():
            if n not in seg.vector_names:
                raise damaged(f"no vectors of embedding {n!r}, which the manifest lists")
            shp = src.shape(VECTORS_PREFIX + n)
            if tuple(shp) != (seg.n_docs, emb.dim):
                raise damaged(f"vectors of embedding {n!r} have shape {tuple(shp)}, expected "
                              f"({seg.n_docs}, {emb.dim})")
        live = None
        if e.get("deletes"):
            dead = persist.read_deletes(root, e["deletes"], seg.n_docs, verify)
            live = np.ones(seg.n_docs, dtype=bool)
            live[dead] = False
        v = SegView(seg, live)
        if v.n_live == 0:
            continue
        w._put(v)
        w._dflog.add(seg.l2g, v.live_df(), unique=True)
        w._n += v.n_live
        w._total_len += v.live_length()
        ids = seg.ids.tolist() if live is None else seg.ids.take(v.live_rows()).tolist()
        w._ids.load(ids, seg.seqs if live is None else seg.seqs[live])  # hashes: no object per record kept
        del ids
        w._saved[seg.uid] = {k: x for k, x in e.items()}
        w._saved_views[seg.uid] = v
        key = seg.partition
        if key is not None and w.window_ms is not None and (w._newest is None or key > w._newest):
            w._newest = key
    dup = w._ids.duplicates(list(w._views.values()))
    if dup or len(w._ids) != w._n:
        raise MemoryFormatError(f"{root}: damaged memory (record ids are not unique: {dup[:3]})")
    w._seal_checked = w._newest  # older partitions: compacted when a newer one appears, as before
    w._history.load(root, manifest.get("history"), verify)
    w._expiring = bool(manifest.get("expiring", False))  # older memories had no expires_at
    w._next_seq = int(manifest.get("next_seq", 0))
    w._next_uid = int(manifest.get("next_uid", 0))
    w._gen = int(manifest["generation"])
    w._last_tag = manifest.get("log_tag")
    w._dflog.reset(len(w._terms))
    w._publish()
    w._order.build_in_background(w._write_lock)  # keys of the loaded vocabulary, off the open's path
    return mem


def replay(mem: Any, ops: list[dict[str, Any]]) -> int:
    """Apply the log's operations to ``mem`` (open): the writes acknowledged after the last save, through
    its own add and delete (the facade's, as its callers' were). Returns their count."""
    w = mem._writer
    w._replaying = True
    run: list[tuple[RecordBatch, np.ndarray, Any]] = []  # consecutive logged adds, replayed as one add
    in_run: set[str] = set()

    def flush() -> None:
        if run:
            vecs = run[0][2]
            mem.add(concat_batches([b for b, _, _ in run]), seqs=np.concatenate([q for _, q, _ in run]),
                    vectors=None if vecs is None else {n: np.concatenate([v[n] for _, _, v in run])
                                                       for n in vecs})
            run.clear()
            in_run.clear()

    try:
        with scope.inside_scope():  # (the log replays the memory's own writes, scoped or not)
            for op in ops:
                if op.get("op") != "add":
                    flush()
                    replay_one(mem, op)
                    continue
                if "tag" in op:
                    w._last_tag = op["tag"]
                batch, seqs, vecs = op_parts(op)
                # an agent's one-record adds replay as one add (one segment): the same records, numbers
                # and scores; an id added again (expired meanwhile) or other vectors start a new one
                if run and (in_run.intersection(batch.ids) or (vecs is None) != (run[0][2] is None)
                            or (vecs is not None and set(vecs) != set(run[0][2]))):
                    flush()
                run.append((batch, seqs, vecs))
                in_run.update(batch.ids)
            flush()
    finally:
        w._replaying = False
    return len(ops)


def replay_one(mem: Any, op: dict[str, Any]) -> None:
    """Apply one logged operation (not an add joined with others) to ``mem``."""
    w = mem._writer
    kind = op.get("op")
    if "tag" in op:
        w._last_tag = op["tag"]
    if kind == "add":
        batch, seqs, vecs = op_parts(op)
        mem.add(batch, vectors=vecs, seqs=seqs)
    elif kind == "put":
        w._replay_at = op.get("at")
        try:
            batch, seqs, vecs = op_parts(op)
            w._write(batch, True, "ms", "upsert", seqs, vectors=vecs)
        finally:
            w._replay_at = None
    elif kind == "delete":
        w._replay_at = op.get("at")
        try:
            mem.delete(op["ids"], missing_ok=True, keep_history=bool(op.get("keep_history")))
        finally:
            w._replay_at = None
    else:
        raise MemoryFormatError(f"{w._path}: the memory's log holds an unknown operation {kind!r}")


def recover_log(mem: Any, salvage: bool) -> None:
    """Open (writer): replay the directory's log over ``mem``'s loaded commit, then append to it (or, with
    durability "none", fold it into a save and delete it)."""
    w = mem._writer
    root = w._path
    mlog = MemoryLog(root, "flush" if w._durability == "none" else w._durability)
    t0 = time.perf_counter()
    rec = mlog.recover(w._gen, salvage=salvage)
    try:
        replay(mem, rec.ops)
    except BaseException:
        mlog.wal.close()
        raise
    n = sum(op_records(op) for op in rec.ops)
    if rec.ops:
        log.info("%s: replayed %d logged operation(s) (%d records) in %.3f s", root, len(rec.ops), n,
                 time.perf_counter() - t0)
    w._attempt_gen = w._gen
    w._log = mlog
    w._replayed = len(rec.ops)
    w._unsaved = n
    mlog.wal.ops = n
    if rec.needs_checkpoint or (w._durability == "none" and (rec.ops or rec.torn)):
        mem.save()  # a salvaged or old segment is never appended to; "none" keeps no log
    if w._durability == "none":
        w._log.close()
        w._log = None
        for _, p in wal_segments(root, "memory"):  # every operation is in the commit now
            p.unlink()
