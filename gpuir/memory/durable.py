"""A memory's own write-ahead log: every write on a directory is logged before the call returns.

A :class:`~gpuir.memory.Memory` bound to a directory (by :meth:`~gpuir.memory.Memory.save` or
:meth:`~gpuir.memory.Memory.open`) appends each ``add``, ``update`` / ``replace`` / ``upsert`` and
``delete`` to ``memory-wal-NNNNNNNN.log`` in that directory (the frames, checksums and recovery rules
of :mod:`gpuir.wal`) before it returns, and replays the log when the directory is opened again. What
"before it returns" means is the memory's ``durability``, modelled on SQLite's ``synchronous``:

============  ===========================================  =========================================
durability    a write has returned once its log frame is   it survives
============  ===========================================  =========================================
``"fsync"``   written and fsynced (group commit: writers    a crash of the process (``kill -9``, OOM)
(default)     waiting at once share one fsync)              and a power cut or kernel crash
``"flush"``   written to the operating system (no fsync)    a crash of the process; not a power cut
``"none"``    applied in memory only (no log)               nothing until :meth:`~Memory.save`
============  ===========================================  =========================================

**What is logged.** The operation *after* validation, as applied: an add's record columns (ids,
texts, fields, times as epoch ms) with their sequence numbers and vectors; an update's whole new
versions (``put``) with theirs; a delete's live ids. Replaying a frame therefore needs no encoder
and gives the same records, numbers and scores; expired records are purged again by the replay.

**Frames.** An add or a put is one binary payload (:func:`encode_op`, :func:`gpuir.wal.encode_binary`):
the sequence numbers, times, importances and vectors as NumPy bytes, each text column (ids, texts,
every string field) as one UTF-8 string, its values joined by NUL (or, where a value holds a NUL or
is None, with the length of each value), and only the metadata as JSON -- encoding 1,000 records costs a join and a copy instead of a JSON text of every value. A
delete is JSON. The frame checksums, torn-tail and damage rules are :mod:`gpuir.wal`'s, unchanged;
frames written as JSON by earlier versions (``"cols"``) replay as before.

**Checkpoints** (:meth:`~gpuir.memory.Memory.save`, called by the user, by ``close`` and by the
memory itself once the log holds :data:`CHECKPOINT_EVERY` records or :data:`CHECKPOINT_BYTES`) never hold the writer: under the
writer's lock they only take the snapshot to write and start a new log segment whose header names
the generation the save will commit (each attempt a new number); the files are written outside the
lock, and once the commit is durable the older segments are deleted. A crash anywhere leaves either
the old commit with every segment since it (replayed in order) or the new commit with the segments
after it: the acknowledged state either way.

**Replay** applies the operations in order, consecutive adds joined into one ``Memory.add`` (an
agent's one-record adds make one segment, not thousands; an id added again, or other vectors, start a
new one). **Readers** (``Memory.open(path, writer=False)``) replay the log too, without changing it, so they
see every write acknowledged before they opened.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import math
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..storage.files import fsync_dir
from ..wal import FORMATS, WALCorruptError, WriteAheadLog, encode_binary, encode_payload, read_segment
from ..wal import segments as wal_segments
from .records import RecordBatch

log = logging.getLogger("gpuir.memory")

#: The durability levels, weakest last (see the module docstring).
DURABILITY = ("fsync", "flush", "none")
#: Records logged since the last checkpoint that make the memory checkpoint itself (in the background). Large
#: enough that a batched import does not pay for checkpoints of segments its own merges soon replace
#: (bench/bench_durability.py: at 10,000 a 30,000-record import ran at 0.70 of "none", at this 0.93); a
#: crash replays at most this many records on open (a clean ``close`` checkpoints).
CHECKPOINT_EVERY = 100_000
#: ... or log bytes since the last checkpoint.
CHECKPOINT_BYTES = 128 << 20

__all__ = ["CHECKPOINT_EVERY", "DURABILITY", "MemoryClosedError", "MemoryLog", "batch_from_log",
           "batch_to_log", "check_durability", "concat_batches", "encode_op", "fold_service_log", "log_holds_writes", "op_parts",
           "op_records", "vectors_from_log", "vectors_to_log"]


class MemoryClosedError(ValueError):
    """A write (or save) to a memory after :meth:`~gpuir.memory.Memory.close`."""


def check_durability(durability: Any) -> str:
    """``durability`` checked (one of :data:`DURABILITY`)."""
    if durability not in DURABILITY:
        raise ValueError(f"durability must be one of {', '.join(repr(d) for d in DURABILITY)} "
                         f"(see gpuir.memory.durable), got {durability!r}")
    return durability


# ---------------------------------------------------------------------- payloads
def batch_to_log(batch: RecordBatch) -> dict[str, Any]:
    """The columns of ``batch`` as JSON values (its labels are not kept; NaN importance as null)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(batch):
        if f.name == "labels":
            continue
        v = getattr(batch, f.name)
        if isinstance(v, np.ndarray):
            if v.dtype.kind == "f":
                vals = [None if math.isnan(x) else x for x in v.tolist()]  # NaN -> null (strict JSON)
            else:
                vals = v.tolist()
            out[f.name] = {"dtype": v.dtype.str, "values": vals}
        else:
            out[f.name] = v
    return out


def batch_from_log(cols: dict[str, Any]) -> RecordBatch:
    """The :class:`RecordBatch` that :func:`batch_to_log` wrote."""
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(RecordBatch):
        if f.name not in cols:
            continue
        v = cols[f.name]
        if isinstance(v, dict) and set(v) == {"dtype", "values"}:
            dt = np.dtype(v["dtype"])
            vals = [np.nan if x is None else x for x in v["values"]] if dt.kind == "f" else v["values"]
            v = np.asarray(vals, dtype=dt)
        kw[f.name] = v
    return RecordBatch(**kw)


def vectors_to_log(vecs: dict[str, np.ndarray] | None) -> dict[str, Any] | None:
    """Vectors name -> (n, dim) array as base64 of their bytes, with dtype and shape."""
    if not vecs:
        return None
    return {n: {"dtype": a.dtype.str, "shape": list(a.shape),
                "data": base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")}
            for n, a in vecs.items()}


def vectors_from_log(obj: dict[str, Any] | None) -> dict[str, np.ndarray] | None:
    """The arrays :func:`vectors_to_log` wrote (bit for bit)."""
    if not obj:
        return None
    return {n: np.frombuffer(base64.b64decode(d["data"]), dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()
            for n, d in obj.items()}


_BATCH_FIELDS = ("ids", "texts", "strings", "time", "importance", "metadata", "labels")


_SEP = "\x00"


def _text_column(vals: list[Any]) -> tuple[str, list[bytes]]:
    """A column of str (or None) as raw sections: (kind, sections).

    Kind "s": the values joined by NUL, UTF-8 (no value holds a NUL, none is None: the usual case, one
    C-speed join and split). Kind "l": the lengths (int32, -1 for None) and the values joined, UTF-8.
    Raises TypeError (a value that is not a str) or UnicodeEncodeError (a lone surrogate)."""
    if None not in vals:
        joined = _SEP.join(vals)
        if joined.count(_SEP) == len(vals) - 1 or not vals:
            return "s", [joined.encode("utf-8")]
    lens = np.fromiter((-1 if v is None else len(v) for v in vals), dtype="<i4", count=len(vals))
    return "l", [lens.tobytes(), "".join(v for v in vals if v is not None).encode("utf-8")]


def _text_values(kind: str, sections: list[bytes], n: int) -> list[Any]:
    """The column :func:`_text_column` wrote (ValueError when it does not hold ``n`` values)."""
    if kind == "s":
        out = sections[0].decode("utf-8").split(_SEP) if n else []
        if len(out) != n:
            raise ValueError(f"a text column of {len(out)} values, expected {n}")
        return out
    if kind != "l":
        raise ValueError(f"an unknown text column kind {kind!r}")
    lens = np.frombuffer(sections[0], dtype="<i4")
    text = sections[1].decode("utf-8")
    if lens.size != n:
        raise ValueError(f"a text column of {lens.size} values, expected {n}")
    ends = np.cumsum(np.maximum(lens, 0), dtype=np.int64)
    if (ends[-1] if n else 0) != len(text):
        raise ValueError("a text column whose lengths do not match its text")
    starts = (ends - np.maximum(lens, 0)).tolist()
    vals: list[Any] = [text[a:b] for a, b in zip(starts, ends.tolist())]
    for i in np.flatnonzero(lens < 0).tolist():
        vals[i] = None
    return vals


def _encode_binary_op(op: dict[str, Any]) -> bytes:
    batch: RecordBatch = op["batch"]
    if tuple(f.name for f in dataclasses.fields(batch)) != _BATCH_FIELDS:
        raise TypeError("a record batch of other columns")  # (a later version's: its JSON form is written)
    n = len(batch.ids)
    seqs = np.ascontiguousarray(op["seqs"], dtype="<i8")
    tm = np.ascontiguousarray(batch.time)
    imp = np.ascontiguousarray(batch.importance)
    if seqs.shape != (n,) or tm.shape != (n,) or imp.shape != (n,) or len(batch.texts) != n:
        raise ValueError("columns of different lengths")
    blobs: list[Any] = [seqs, tm, imp]
    fields = list(batch.strings)
    kinds = []
    for col in (batch.ids, batch.texts, *(batch.strings[f] for f in fields)):
        kind, sections = _text_column(col)
        kinds.append(kind)
        blobs.extend(sections)
    vecs = []
    for name, a in (op.get("vectors") or {}).items():
        a = np.ascontiguousarray(a)
        vecs.append([name, a.dtype.str, list(a.shape)])
        blobs.append(a)
    meta = {"op": op["op"], "n": n, "dtypes": [tm.dtype.str, imp.dtype.str], "strings": fields, "text": kinds,
            "metadata": batch.metadata, "vectors": vecs}
    for k in ("at", "tag"):
        if k in op:
            meta[k] = op[k]
    return encode_binary(meta, blobs)


def _json_form(op: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in op.items() if k not in ("batch", "seqs", "vectors")}
    out["cols"] = batch_to_log(op["batch"])
    out["seqs"] = np.asarray(op["seqs"]).tolist()
    out["vectors"] = vectors_to_log(op.get("vectors"))
    return out


def encode_op(op: dict[str, Any]) -> bytes:
    """The payload of one memory log operation: an add or put (``"batch"``: a :class:`RecordBatch`, ``"seqs"``,
    ``"vectors"``) as a binary payload, anything else as JSON (:func:`gpuir.wal.encode_payload`).

    Raises
    ------
    ValueError
        Not encodable (a lone surrogate, NaN in metadata, a value that is not JSON).
    """
    if "batch" not in op:
        return encode_payload(op)
    try:
        return _encode_binary_op(op)
    except (TypeError, ValueError, OverflowError):
        return encode_payload(_json_form(op))  # (raises the error a value that cannot be logged deserves)


def op_parts(op: dict[str, Any]) -> tuple[RecordBatch, np.ndarray, dict[str, np.ndarray] | None]:
    """(batch, sequence numbers (n,) int64, vectors) of a logged add or put, binary or JSON (earlier versions).

    Raises
    ------
    ValueError
        A binary payload whose sections do not make the columns it names.
    """
    if "_blobs" not in op:
        return batch_from_log(op["cols"]), np.asarray(op["seqs"], dtype=np.int64), vectors_from_log(op.get("vectors"))
    b = op["_blobs"]
    n = int(op["n"])
    tdt, idt = (np.dtype(d) for d in op["dtypes"])
    seqs = np.frombuffer(b[0], dtype="<i8").astype(np.int64)
    tm = np.frombuffer(b[1], dtype=tdt).copy()
    imp = np.frombuffer(b[2], dtype=idt).copy()
    if seqs.size != n or tm.size != n or imp.size != n:
        raise ValueError(f"a logged {op['op']} of {n} records with columns of other lengths")
    cols, at = [], 3
    for kind in op["text"]:
        k = 1 if kind == "s" else 2
        cols.append(_text_values(kind, b[at:at + k], n))
        at += k
    if len(cols) != 2 + len(op["strings"]):
        raise ValueError(f"a logged {op['op']} whose text columns do not match its fields")
    ids, texts = cols[0], cols[1]
    strings = dict(zip(op["strings"], cols[2:]))
    vecs = {}
    for j, (name, dt, shape) in enumerate(op["vectors"]):
        vecs[name] = np.frombuffer(b[at + j], dtype=np.dtype(dt)).reshape(shape).copy()
    meta = op["metadata"]
    if len(meta) != n:
        raise ValueError(f"a logged {op['op']} of {n} records with {len(meta)} metadata")
    return (RecordBatch(ids=ids, texts=texts, strings=strings, time=tm, importance=imp, metadata=meta), seqs,
            vecs or None)


def concat_batches(batches: list[RecordBatch]) -> RecordBatch:
    """Record batches joined in order (each already validated)."""
    if len(batches) == 1:
        return batches[0]
    return RecordBatch(
        ids=[x for b in batches for x in b.ids], texts=[x for b in batches for x in b.texts],
        strings={f: [x for b in batches for x in b.strings[f]] for f in batches[0].strings},
        time=np.concatenate([b.time for b in batches]), importance=np.concatenate([b.importance for b in batches]),
        metadata=[x for b in batches for x in b.metadata])


def op_records(op: dict[str, Any]) -> int:
    """Records of one logged memory operation (add, put or delete; binary or JSON)."""
    if isinstance(op.get("n"), int):
        return op["n"]
    return len(op.get("ids") or op.get("seqs") or ())


def log_holds_writes(path: Path) -> bool:
    """Whether a memory log segment holds any operation (a damaged one counts as holding some)."""
    try:
        return bool(read_segment(path, allow_torn_tail=True, salvage=False, fmt=FORMATS["memory"]).ops)
    except (OSError, WALCorruptError):
        return True


# ---------------------------------------------------------------------- the log
class MemoryLog:
    """A memory's log: appends under the writer's lock, syncs after it (group commit), rotates at checkpoints.

    Parameters
    ----------
    root : the memory directory
    durability : "fsync" or "flush"
    """

    def __init__(self, root: Path, durability: str):
        self.wal = WriteAheadLog(Path(root), kind="memory")
        self.durability = durability
        self.failed: str | None = None  # why writes are refused (a failed fsync), else None
        self._ckpt_lock = threading.Lock()

    @property
    def ops(self) -> int:
        """Records logged since the last checkpoint."""
        return self.wal.ops

    def recover(self, generation: int, salvage: bool = False):
        """The operations to replay over the memory saved at ``generation`` (:meth:`WriteAheadLog.recover`)."""
        return self.wal.recover(generation, salvage=salvage)

    def start(self, generation: int) -> None:
        """Start the first segment of a memory just bound to its directory (base ``generation``)."""
        self.wal._start(self.wal.number + 1, generation)

    def write(self, op: dict[str, Any], n: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """Append one operation (``n`` records) without syncing; returns (mark to roll back to, end to sync).

        Raises
        ------
        OSError
            The write failed (rolled back: nothing of it is in the log).
        """
        if self.failed is not None:
            raise OSError(self.failed)
        mark = self.wal.write_payloads([encode_op(op)], n)
        return mark, self.wal.end

    def rollback(self, mark: tuple[int, int], n: int) -> None:
        """Remove an operation that could not be applied."""
        self.wal.rollback(mark, n)

    def sync(self, end: tuple[int, int]) -> None:
        """Wait until the log is durable up to ``end`` (durability "fsync"; "flush" returns at once).

        A failed fsync leaves the memory refusing writes: what the kernel failed to write may be
        lost, and only a reopen (replaying what the disk holds) tells what is there.
        """
        if self.durability != "fsync":
            return
        try:
            self.wal.sync(end)
        except OSError as e:
            self.failed = (f"the memory's log could not be synced ({e}): this write may not be durable and "
                           "the memory refuses further writes; close it and open the directory again")
            log.error("%s", self.failed)
            raise OSError(e.errno, self.failed) from e

    def due(self) -> bool:
        """Whether the log has grown enough for a checkpoint."""
        return self.wal.ops >= CHECKPOINT_EVERY or self.wal.bytes >= CHECKPOINT_BYTES

    def rotate(self, next_generation: int) -> list[Path]:
        """Start a segment for the save that will commit ``next_generation``; returns the older segments
        (deleted by :meth:`drop` once that save is durable)."""
        return self.wal.rotate(next_generation)

    def drop(self, paths: list[Path]) -> None:
        self.wal.drop(paths)

    def close(self) -> None:
        """Sync (whatever the durability: a clean close leaves nothing to chance) and close."""
        try:
            self.wal.close(sync=self.failed is None)
        except OSError as e:
            log.error("closing the memory's log: the final fsync failed (%s)", e)


# ---------------------------------------------------------------------- an older gpuir's service log
def fold_service_log(mem: Any, generation: int, apply: Any, salvage: bool = False) -> int:
    """Fold the log an older gpuir's service or shard kept beside the memory (``service-wal-*.log``) into
    ``mem``, once; returns the number of operations applied.

    Before this version the service and each shard of a sharded memory ran their memory without a log
    of their own and kept their own (:mod:`gpuir.wal`, kind "service"); now the memory's log is the one
    home of durability. Steps, each crash-safe: read the old log over ``generation`` (the memory's
    committed generation when it was opened; a torn tail is ignored, damage refused unless ``salvage``);
    apply its operations with ``apply(ops, salvaged)`` without logging them again; save the memory (the
    commit is the point where they become the memory's own); then delete the old segments (a salvaged,
    damaged one is set aside as ``*.log.damaged``, never deleted). A crash before the commit replays
    the old log again at the next start (nothing was logged twice); after it, the old segments are
    older than the memory's generation and are deleted then.

    Parameters
    ----------
    mem : IndexWriter
        The writer (:class:`~gpuir.memory.writer.IndexWriter`, a ``Memory``'s ``_writer``) of a memory
        opened as the writer of its directory.
    generation : int
        The memory's committed generation read before it was opened.
    apply : callable (ops: list of dict, salvaged: bool) -> Any
        Applies the old log's operations (the service's or the shard's format) to ``mem``.

    Raises
    ------
    WALCorruptError
        Damage to acknowledged writes in the old log (unless ``salvage``), or a memory whose own log
        was folded at open, leaving an old log behind it (never happens to a directory one gpuir wrote).
    """
    root = Path(mem._path)
    if not wal_segments(root, "service"):
        return 0
    old = WriteAheadLog(root, kind="service")
    rec = old.recover(generation, salvage=salvage, append=False)
    if rec.ops and mem._gen != generation:
        raise WALCorruptError(
            f"{root}: an older gpuir's log (service-wal-*.log) continues generation {generation}, but opening "
            f"the memory committed generation {mem._gen} (its own log was folded): the two logs cannot be "
            "ordered. Nothing of the old log was applied or deleted; restore the directory from a backup")
    if rec.ops:
        with mem._unlogged():
            apply(rec.ops, bool(rec.skipped))
    if rec.needs_checkpoint:
        mem.save()  # the old operations are the memory's own from this commit on
    left = [p for _, p in wal_segments(root, "service")]
    old.drop(left)
    fsync_dir(root)
    if rec.ops or left:
        log.info("%s: folded an older gpuir's service log (%d operation(s)) into the memory's generation %d and "
                 "deleted it: the memory's own log keeps every write from now on", root, len(rec.ops), mem._gen)
    return len(rec.ops)
