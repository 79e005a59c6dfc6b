"""One shard: a :class:`~gpuir.memory.Memory` directory with the memory's own write-ahead log (what each Ray
actor runs).

:class:`ShardServer` is plain Python (no Ray import): the coordinator
(:class:`~gpuir.cluster.ShardedMemory`) runs one per shard as a Ray actor, and
tests drive it directly too.

**Writes** arrive as encoded payloads (JSON bytes, made and checked by the
coordinator): ``{"op": "add" | "update" | "upsert", "wid", "batch": columns,
"seqs"}`` (an update's or upsert's batch holds whole new versions, merged by
the coordinator) or ``{"op": "delete", "wid", "ids"}``. A write is validated
against the memory (an added id that exists, an updated or deleted id that
does not: an error value, nothing logged), then applied to the memory, which
logs it before the call returns (:mod:`gpuir.memory.durable`: ``memory-wal-*.log``,
at the shard's ``durability``, default ``"fsync"``) -- the shard keeps no log of
its own -- and only then answered: the answer is the acknowledgement, so every
acknowledged write is on disk. The answer carries the write's change to the
shard's statistics (N, total length, df of the terms that changed) for the
coordinator's global statistics.

**Write ids.** Every write carries the coordinator's write id (``wid``,
increasing). The memory logs it with the write (its log frames carry the
caller's tag) and keeps the last one in each save's manifest, so a write resent
after the shard died mid-call is recognised: ``wid <= last_wid`` means "logged,
hence applied after the restart", and the answer says ``replayed`` instead of
applying it twice.

**Restart.** The constructor opens the memory, which replays its log over the
committed state (a torn tail that was never acknowledged is dropped, damage to
acknowledged frames refuses to start, naming the file and byte), and serves. A
shard killed at any moment (SIGKILL included) comes back with every
acknowledged write. A shard directory written by an older gpuir, whose shards
kept their own log (``service-wal-*.log``) and ``cluster-shard.json``, is
folded once: the old log is applied and saved, then deleted
(:func:`gpuir.memory.durable.fold_service_log`).

**Checkpoints** (every ``checkpoint_every`` logged records, on :meth:`save`, on
:meth:`close`): a save of the memory, which folds its log. The one a write starts runs in a thread of
the shard, one at a time: that write answers at once.

**Searches** take the global statistics (:class:`~gpuir.memory.termstats.TermStats`)
and run on the memory's current snapshot, any number at once
(:meth:`Memory.search <gpuir.memory.Memory.search>` never waits for the writer).
They are query-then-fetch: :meth:`ShardServer.search` answers each question's top
k as three arrays (sequence numbers, float32 scores, times), the coordinator
merges every shard's arrays, and :meth:`ShardServer.fetch` reads the records of
the final k only. A question asked of this shard alone gets its records in the
search's answer (its top k is the answer: no fetch call).
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..memory import Memory, persist
from ..memory.durable import check_durability, fold_service_log
from ..memory.hitorder import hit_times
from ..memory.records import MISSING_TIME, STRING_FIELDS, RecordBatch
from ..memory.searcher import warm_compiled_engine
from ..memory.snapshot import Snapshot
from ..memory.termstats import TermStats
from ..memory.warmup import freeze_startup_heap
from ..wal import encode_payload

log = logging.getLogger("gpuir.cluster.shard")

#: The small state file of an older gpuir's shard (its last write id; read, no longer written).
STATE_FILE = "cluster-shard.json"


# --------------------------------------------------------------------------- payloads


def batch_columns(batch: RecordBatch) -> dict[str, Any]:
    """A validated record batch as JSON-ready columns (the log's form of an add)."""
    return {"ids": batch.ids, "texts": batch.texts, "strings": batch.strings, "time": batch.time.tolist(),
            "importance": [None if math.isnan(x) else x for x in batch.importance.tolist()],
            "metadata": batch.metadata}


def batch_from_columns(cols: dict[str, Any]) -> RecordBatch:
    """The record batch of :func:`batch_columns`' output (validated before it was logged)."""
    return RecordBatch(
        ids=list(cols["ids"]), texts=list(cols["texts"]),
        strings={f: list(cols["strings"][f]) for f in STRING_FIELDS},
        time=np.asarray(cols["time"], dtype=np.int64),
        importance=np.asarray([math.nan if x is None else x for x in cols["importance"]], dtype=np.float64),
        metadata=list(cols["metadata"]))


def concat_batches(batches: list[RecordBatch]) -> RecordBatch:
    """Record batches joined in order."""
    if len(batches) == 1:
        return batches[0]
    return RecordBatch(
        ids=[x for b in batches for x in b.ids], texts=[x for b in batches for x in b.texts],
        strings={f: [x for b in batches for x in b.strings[f]] for f in STRING_FIELDS},
        time=np.concatenate([b.time for b in batches]), importance=np.concatenate([b.importance for b in batches]),
        metadata=[x for b in batches for x in b.metadata])


def write_payload(op: str, wid: int, *, batch: RecordBatch | None = None, seqs: np.ndarray | None = None,
                  ids: list[str] | None = None, missing_ok: bool = False, keep_history: bool = False) -> bytes:
    """The log payload of one shard write (raises ValueError when a record cannot be logged)."""
    if op in ("add", "update", "upsert"):
        assert batch is not None and seqs is not None
        body = {"op": op, "wid": int(wid), "batch": batch_columns(batch), "seqs": [int(s) for s in seqs]}
    elif op == "delete":
        body = {"op": "delete", "wid": int(wid), "ids": list(ids or []), "missing_ok": bool(missing_ok)}
        if keep_history:
            body["keep_history"] = True
    else:
        raise ValueError(f"unknown shard operation {op!r}")
    return encode_payload(body)


# --------------------------------------------------------------------------- statistics


def partition_keys(snap: Snapshot) -> list[int | None]:
    """The snapshot's time-partition keys, newest first (None, the untimed records, last)."""
    return [key for key, _ in snap.partitions]


def stats_delta(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """How the live statistics changed from ``before`` to ``after`` (one write).

    Only terms of segments that appeared or disappeared between the two can
    change df (a segment whose tombstones changed is a new view), so only those
    are compared.

    Returns
    -------
    dict: ``dn``, ``dlen`` (ints), ``terms`` (list of str), ``ddf`` (ndarray (T,), int64: df change of each term)
    """
    old = {id(v) for v in before.views}
    new = {id(v) for v in after.views}
    parts = [v.seg.l2g for v in after.views if id(v) not in old] + [v.seg.l2g for v in before.views if id(v) not in new]
    codes = np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
    g0 = before.df.shape[0]
    b = np.zeros(codes.size, np.int64)
    inside = codes < g0
    b[inside] = before.df[codes[inside]]
    d = after.df[codes] - b
    nz = np.flatnonzero(d)
    vals = after.terms.values
    return {"dn": after.n_docs - before.n_docs, "dlen": after.total_len - before.total_len,
            "terms": [vals[int(c)] for c in codes[nz]], "ddf": d[nz]}


# --------------------------------------------------------------------------- the shard


def _warm_compiled(freeze: bool = False) -> None:
    """Load the compiled engine's builder and search in this process
    (:func:`gpuir.memory.searcher.warm_compiled_engine`: numba's import, its registries, each function from
    its cache; 1.6-1.8 s on the development VM), in a thread started as the shard opens: otherwise the
    shard's first ``add`` pays it, and at 5M records that was the longest add of the run
    (``bench/bench_sharded.py``, session 37). A write that comes meanwhile waits only for what is still
    loading; a failure is logged and left to the first write or search, which meets it. ``freeze``: then
    move what the process holds out of the collector's passes (a shard actor's own process,
    :func:`gpuir.memory.warmup.freeze_startup_heap`)."""
    try:
        warm_compiled_engine()
    except Exception:  # a warm-up: the first real call reports what fails
        log.debug("warming the compiled engine failed", exc_info=True)
    if freeze:
        freeze_startup_heap()


class ShardServer:
    """One shard's memory and log (see the module docstring).

    Parameters
    ----------
    root : the shard's memory directory
    index : int
        The shard's number (for messages and :meth:`info`).
    create : dict, optional
        Memory settings (``Memory(**create)``): create the memory when the
        directory holds none yet. A directory holding a memory's files without
        its commit is refused (never overwritten).
    checkpoint_every : int
        Logged records after which the log is folded into the memory.
    lock_timeout : float
        Seconds to wait for the directory's writer lock (a restarted shard may
        meet its predecessor's lock for a moment).
    backend : {"auto", "numpy", "numba", "cupy"}
        The engine of a search that asks for "auto": a shard given a GPU of its
        own (:func:`gpuir.cluster.runtime.start_shard`) serves with "cupy".
    durability : {"fsync", "flush", "none"}
        The memory's durability (:mod:`gpuir.memory.durable`): what a write has done when the
        shard answers it. Default ``"fsync"``.
    own_process : bool
        The shard has its process to itself (a Ray actor, :func:`gpuir.cluster.runtime.start_shard`):
        once the compiled engine is loaded, everything the process holds then -- Ray's, NumPy's and
        numba's objects (about 160,000 containers), and the memory as opened -- leaves the cyclic
        collector's passes (:func:`gpuir.memory.warmup.freeze_startup_heap`): a full pass of a shard of
        500,000 records walked 182,000 objects in 80 ms. The memory's objects are still freed when
        dropped (reference counting); only cyclic garbage among them would stay, and a memory's writes,
        merges, searches and saves make none but a few closures. Default False: a shard in a process of
        its caller's (tests) never freezes that process's heap.
    """

    def __init__(self, root: str | os.PathLike, index: int = 0, create: dict[str, Any] | None = None,
                 checkpoint_every: int = 10_000, lock_timeout: float = 60.0, backend: str = "auto",
                 durability: str = "fsync", own_process: bool = False):
        t0 = time.perf_counter()
        self.backend = str(backend)
        self.root = Path(root)
        self.index = int(index)
        self.checkpoint_every = int(checkpoint_every)
        self.durability = check_durability(durability)
        self._lock = threading.RLock()
        self.failed: str | None = None
        self.checkpoints = 0
        self._background: threading.Thread | None = None  # the checkpoint a write started, while it runs
        self._closing = False
        if create is not None and not (self.root / persist.CURRENT).exists():
            mem = Memory(**{**create, "durability": self.durability})
            mem.save(self.root, lock_timeout=lock_timeout)  # claims the directory; refuses an orphaned memory
            gen = None
        else:
            gen = int(persist.read_manifest(self.root)[1]["generation"])
            # the memory replays its own log (every acknowledged write) as it opens
            mem = Memory.open(self.root, writer=True, lock_timeout=lock_timeout, durability=self.durability)
        self.memory = mem
        try:
            self.last_wid = max(self._read_state(), self._memory_wid())
            self.replayed = mem._writer._replayed
            if gen is not None:  # an older gpuir's own shard log: applied once, saved, then deleted
                self.replayed += fold_service_log(mem._writer, gen, lambda ops, _salvaged: self._replay(ops))
        except BaseException:
            mem.close(discard_unsaved=True)
            raise
        self.started_s = time.perf_counter() - t0
        log.info("shard %d: %s opened with %d records (%d logged operations replayed) in %.2f s", self.index,
                 self.root, len(mem), self.replayed, self.started_s)
        if self.backend in ("auto", "numba"):
            threading.Thread(target=_warm_compiled, args=(own_process,), name="gpuir-shard-warm",
                             daemon=True).start()
        elif own_process:
            freeze_startup_heap()

    # ------------------------------------------------------------------ state
    def _memory_wid(self) -> int:
        """The last write id the memory holds (logged with its write, kept in each save's manifest)."""
        tag = self.memory._writer._last_tag
        return int(tag.get("wid", 0)) if isinstance(tag, dict) else 0

    def _read_state(self) -> int:
        """The last write id of an older gpuir's shard, from its state file (0: none)."""
        p = self.root / STATE_FILE
        if not p.exists():
            return 0
        try:
            st = json.loads(p.read_text(encoding="utf-8"))
            return int(st["last_wid"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise persist.MemoryFormatError(f"{p}: damaged shard state ({e}); restore it from a backup") from None

    def _replay(self, ops: list[dict[str, Any]]) -> int:
        """Apply an older gpuir's shard log in order (consecutive adds as one ``Memory.add``), each write
        under its write id."""
        mem = self.memory
        run: list[tuple[RecordBatch, list[int]]] = []

        def flush() -> None:
            if run:
                mem.add(concat_batches([b for b, _ in run]), seqs=np.concatenate([s for _, s in run]))
                run.clear()

        for op in ops:
            wid = int(op.get("wid", 0))
            self.last_wid = max(self.last_wid, wid)
            kind = op.get("op")
            if kind == "add":
                run.append((batch_from_columns(op["batch"]), np.asarray(op["seqs"], dtype=np.int64)))
                continue
            flush()
            if kind == "update":
                mem.update(batch_from_columns(op["batch"]), seqs=op["seqs"])
            elif kind == "upsert":
                mem.upsert(batch_from_columns(op["batch"]), seqs=op["seqs"])
            elif kind == "delete":
                mem.delete(op["ids"], missing_ok=True, keep_history=bool(op.get("keep_history", False)))
            else:
                raise persist.MemoryFormatError(f"{self.root}: unknown operation in the shard's log: {kind!r}")
        flush()
        mem._writer._last_tag = {"wid": self.last_wid}  # saved by the fold's commit, with the operations
        return len(ops)

    # ------------------------------------------------------------------ writes
    def write(self, payload: bytes, fault: str | None = None) -> dict[str, Any]:
        """Validate, apply (the memory logs it, with its write id, before it returns) and answer one write
        (see the module docstring).

        Returns
        -------
        dict
            ``{"n", "dn", "dlen", "terms", "ddf", "partitions", "next_seq"}``;
            ``{"replayed": True}`` for a write already logged; ``{"error": (kind, message, ids)}``
            for a write refused (nothing was logged).
        """
        with self._lock:
            if self.failed is not None:
                return {"error": ("failed", self.failed, None)}
            op = json.loads(payload)
            wid = int(op["wid"])
            if wid <= self.last_wid:
                return {"replayed": True}
            mem = self.memory
            kind = op["op"]
            if kind in ("add", "update", "upsert"):
                batch = batch_from_columns(op["batch"])
                seqs = np.asarray(op["seqs"], dtype=np.int64)
                if kind == "add":
                    clash = [rid for rid in batch.ids if rid in mem]
                    if clash:
                        msg = f"{len(clash)} id(s) already exist, e.g. {clash[0]!r}: use update() to replace records"
                        return {"error": ("exists", msg, clash)}
                elif kind == "update":
                    unknown = [rid for rid in batch.ids if rid not in mem]
                    if unknown:
                        return {"error": ("unknown", "update", unknown)}
                n = len(batch)
            elif kind == "delete":
                want = list(dict.fromkeys(op["ids"]))
                ids = [rid for rid in want if rid in mem]
                if len(ids) < len(want) and not op.get("missing_ok", False):
                    return {"error": ("unknown", "delete", [rid for rid in want if rid not in mem])}
                n = len(ids)
                if not n:  # nothing to do: nothing logged
                    return {"n": 0, "dn": 0, "dlen": 0, "terms": [], "ddf": np.zeros(0, np.int64),
                            "partitions": partition_keys(mem.snapshot()), "next_seq": mem.next_seq}
            else:
                return {"error": ("invalid", f"unknown operation {kind!r}", None)}
            before = mem.snapshot()
            try:
                with mem._writer._tagged({"wid": wid}):  # logged with the write: a resent wid is known after a restart
                    if kind == "add":
                        mem.add(batch, seqs=seqs)
                    elif kind == "update":
                        mem.update(batch, seqs=seqs)
                    elif kind == "upsert":
                        mem.upsert(batch, seqs=seqs)
                    else:
                        mem.delete(ids, keep_history=bool(op.get("keep_history", False)))
            except BaseException as e:  # validated above, so an internal failure (or a failed log): stop writing
                why = mem._writer._log.failed if mem._writer._log is not None else None
                if why is None and isinstance(e, OSError):
                    # the log's append failed and was rolled back: nothing of this write is stored
                    return {"error": ("failed", (f"shard {self.index} could not log the write ({e}): nothing of "
                                                "it was stored"), None)}
                self.failed = (f"shard {self.index} stopped accepting writes after an internal error "
                               f"({type(e).__name__}: {e}); restart it (its memory's log holds every acknowledged "
                               "write)")
                log.error("%s", self.failed)
                raise
            self.last_wid = wid
            if fault == "kill_after_log":  # tests: die once the write is durable, before answering
                os.kill(os.getpid(), signal.SIGKILL)
            after = mem.snapshot()
            reply = {"n": n, **stats_delta(before, after), "partitions": partition_keys(after),
                     "next_seq": mem.next_seq}
            if self.pending_records >= self.checkpoint_every:
                self._checkpoint_in_background()
            if fault == "kill_after_apply":  # tests: die after applying, before answering
                os.kill(os.getpid(), signal.SIGKILL)
            return reply

    @property
    def pending_records(self) -> int:
        """Records in the memory's log not yet folded by a save (durability "none": records not yet saved)."""
        mlog = self.memory._writer._log
        return int(self.memory.unsaved) if mlog is None else int(mlog.ops)

    def _checkpoint_in_background(self) -> None:
        """Start a checkpoint in a thread of its own unless one runs (caller holds the shard's lock): the
        write that crossed ``checkpoint_every`` answers at once. It used to wait for the whole save -- the
        files of every segment made since the last one -- and the coordinator's next write with it: at 5M
        records the longest add through one shard took 1.8 s (``bench/bench_sharded.py``, session 37)."""
        t = self._background
        if self._closing or (t is not None and t.is_alive()):
            return
        self._background = threading.Thread(target=self._background_checkpoint, daemon=True,
                                            name=f"gpuir-shard-{self.index}-checkpoint")
        self._background.start()

    def _background_checkpoint(self) -> None:
        try:
            self.checkpoint(background=True)
        except Exception as e:  # noqa: BLE001 - the log still holds everything; the next write tries again
            log.warning("shard %d: checkpoint failed, will retry: %s: %s", self.index, type(e).__name__, e)

    def wait_checkpoint(self, timeout: float | None = None) -> bool:
        """Wait for the checkpoint a write started in the background, if one runs; False on timeout."""
        t = self._background
        if t is not None:
            t.join(timeout)
            return not t.is_alive()
        return True

    def checkpoint(self, force: bool = False, background: bool = False) -> int:
        """Fold the memory's log into its files (a save); returns the generation.

        Writes wait only for the snapshot: under the shard's lock the memory takes its snapshot and
        starts a log segment whose header names the generation this save will commit
        (:meth:`Memory.begin_save`); the files are written and committed outside the lock, then the
        memory deletes the older segments. A crash before the commit replays the old segments and the
        new one, in order; a failed save leaves them for the next (:mod:`gpuir.memory.durable`). One save
        runs at a time (the memory's): a checkpoint asked while a write's background checkpoint runs
        starts after it. ``background``: the thread a write started (it does nothing once the shard closes).
        """
        with self._lock:
            gen = int(persist.read_manifest(self.root)[1]["generation"])
            if (background and self._closing) or (not force and not self.pending_records
                                                  and not self.memory.unsaved):
                return gen
            job = self.memory.begin_save()
        job.finish()  # writes go on meanwhile (into the new segment)
        self.checkpoints += 1
        return job.generation

    save = checkpoint

    def close(self) -> None:
        """Checkpoint and release the directory (the shard serves nothing afterwards)."""
        with self._lock:
            self._closing = True  # no write starts a background checkpoint from here on
        self.wait_checkpoint()
        with self._lock:
            try:
                if self.failed is None:
                    self.checkpoint()
            finally:
                fast = getattr(self, "_fast", None)
                if fast is not None:
                    fast.close()
                self.memory.close(discard_unsaved=True)  # what was not saved is in the memory's log

    # ------------------------------------------------------------------ reads
    def ping(self) -> int:
        """The shard's process id (answers once the shard serves)."""
        return os.getpid()

    def fast_address(self) -> tuple[str | None, str, bytes]:
        """(Ray node id, socket path, token) of this shard's direct channel for ``search`` and ``fetch``
        (:mod:`gpuir.cluster.fastpath`), opened on the first ask."""
        from .fastpath import FastServer

        with self._lock:
            if getattr(self, "_fast", None) is None:
                self._fast = FastServer(lambda name, args: getattr(self, name)(*args))
        node = None
        try:
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        except ImportError:  # pragma: no cover - a shard run without Ray (tests)
            pass
        return node, self._fast.path, self._fast.token

    def sync(self, with_ids: bool = False) -> dict[str, Any]:
        """Everything the coordinator derives from this shard: full statistics, partitions, counters, ids."""
        with self._lock:
            snap = self.memory.snapshot()
            nz = np.flatnonzero(snap.df)
            vals = snap.terms.values
            out: dict[str, Any] = {
                "n": snap.n_docs, "len": snap.total_len, "terms": [vals[int(c)] for c in nz],
                "df": snap.df[nz].astype(np.int64), "partitions": partition_keys(snap),
                "next_seq": self.memory.next_seq, "last_wid": self.last_wid}
            if with_ids:
                out["ids"] = [rid for v in snap.views for rid in v.seg.ids.take(v.live_rows()).tolist()]
                out["seqs"] = [int(q) for v in snap.views for q in v.seg.seqs[v.live_rows()].tolist()]
            return out

    def has(self, ids: list[str]) -> list[bool]:
        """Whether each id names a live record here."""
        mem = self.memory
        return [rid in mem for rid in ids]

    def seqs_of(self, ids: list[str]) -> list[int | None]:
        """``Memory.seqs_of``: each id's sequence number here (None: no live record)."""
        return self.memory.seqs_of(ids)

    def match(self, where: Any, time_unit: str | None) -> tuple[list[str], np.ndarray]:
        """The ids of the live records here passing ``where`` (``Memory.match_ids``: a delete by ``where``
        deletes them), in add order, and their sequence numbers: ndarray (n,), int64."""
        ids = self.memory.match_ids(where, time_unit)
        return ids, np.asarray(self.memory.seqs_of(ids) if ids else [], dtype=np.int64)

    def forget_histories(self) -> int:
        """Drop every history kept here (a reset's last step), then checkpoint: durable when this returns
        (the log holds records, not histories). Returns how many records' histories were dropped."""
        with self._lock:
            with self.memory._write_lock:
                ids = self.memory._writer._history.ids()
                self.memory._writer._history.drop(ids)
                self.memory._writer._unsaved += 1  # the checkpoint below saves even when the log is empty
            self.checkpoint(force=True)
            return len(ids)

    def tenants(self) -> list[str]:
        """The tenants holding live records here."""
        snap = self.memory.snapshot()
        codes = set()
        for v in snap.views:
            codes.update(np.unique(v.seg.codes["tenant"][v.live_rows()]).tolist())
        vals = snap.dicts["tenant"].values
        return sorted(vals[c] for c in codes if c >= 0)

    def get(self, ids: list[str]) -> list[dict[str, Any] | None]:
        """The records with these ids (None where unknown)."""
        return self.memory.get(ids, missing_ok=True)

    def stored(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        """id -> the record as stored (canonical: times in epoch ms) of the ids live here (for merging updates)."""
        mem = self.memory
        live = [rid for rid in ids if rid in mem]
        return dict(zip(*mem.stored(live)))

    def expired(self) -> list[str]:
        """Ids of the live records here whose ``expires_at`` has passed (the coordinator deletes them)."""
        from ..memory.expiry import expired_rows, now_ms

        snap, now = self.memory.snapshot(), now_ms()
        out: list[str] = []
        for v in snap.views:
            rows = expired_rows(v, now)
            if rows.size:
                out.extend(v.seg.ids.take(rows).tolist())
        return out

    def history(self, rid: str) -> list[dict[str, Any]]:
        """The earlier versions of a record held here, oldest first."""
        return self.memory.history(rid)

    def restore_history(self, hists: list[tuple[str, list[dict[str, Any]]]]) -> int:
        """Give records their histories (an import's; canonical versions), then checkpoint: the histories are
        durable in the memory's files when this returns (the memory's log holds records, not histories)."""
        with self._lock:
            with self.memory._write_lock:
                for rid, versions in hists:
                    self.memory._writer._history.restore(rid, versions)
                self.memory._writer._unsaved += 1  # the checkpoint below saves even when the log is empty
            self.checkpoint(force=True)  # (outside the memory's writer lock: a save takes its own locks first)
            return len(hists)

    def merge(self, partition: Any = "all") -> int:
        """``Memory.merge`` of this shard's memory (live records and statistics unchanged); the merges done."""
        with self._lock:
            return self.memory.merge(partition)

    def list(self, *args: Any) -> Any:
        """``Memory.list`` of this shard's memory."""
        return self.memory.list(*args)

    def list_keyed(self, where: Any, order_by: str, descending: bool, limit: int, cursor: str | None,
                   time_unit: str | None) -> Any:
        """``Memory.list`` of this shard's memory with each record's sort key (``Page.keys``): a part of a
        listing over several shards (:func:`gpuir.memory.listing.merge_pages`)."""
        from ..memory import listing
        from ..memory.expiry import cutoff
        from ..memory.where import compile_wheres

        snap = self.memory.snapshot()
        w = compile_wheres(where, 1, snap.dicts, time_unit, cutoff(snap))[0]
        fp = listing.fingerprint(where, order_by, descending, time_unit)
        return listing.list_page(snap, w, fp, order_by, descending, limit, cursor, with_keys=True)

    def export(self, where: Any, history: bool, time_unit: str | None) -> tuple[int, bytes]:
        """``Memory.export`` of this shard's memory: (records written, the file's bytes)."""
        import tempfile

        fd, tmp = tempfile.mkstemp(prefix="gpuir-shard-export-", suffix=".jsonl")
        os.close(fd)
        try:
            n = self.memory.export(tmp, where=where, history=history, time_unit=time_unit)
            return n, Path(tmp).read_bytes()
        finally:
            os.unlink(tmp)

    def count(self, where: Any, time_unit: str | None) -> int:
        """``Memory.count`` of this shard's memory."""
        return self.memory.count(where, time_unit)

    def search(self, queries: list[str], k: int, wheres: list[Any], mode: str, budgets: list[int | None],
               stats: TermStats, backend: str = "auto", ties: str = "oldest", min_score: float | None = None,
               time_unit: str | None = None, final: list[bool] | None = None) -> dict[str, Any]:
        """Each query's top k here under the global ``stats`` and the tie rule ``ties``, as arrays (the query
        phase of query-then-fetch: no record is read, except for the queries marked ``final``).

        Parameters
        ----------
        final : list of bool, optional
            Per query: this shard is the only one asked, so its top k is the answer
            and the hits' records come back in the same call (no fetch phase).

        Returns
        -------
        dict
            ``seqs`` (b, k') int64 (-1 pads), ``scores`` (b, k') float32 (-inf pads),
            ``times`` (b, k') int64 epoch ms (MISSING_TIME when untimed or padding, and on the rows of
            the final queries, whose records carry their times), host arrays, each row best first
            (k' = min(k, this shard's records), at least 1);
            ``records``: {query position: its hits' records as stored (``Snapshot.record``: canonical,
            times in epoch ms, no score; the coordinator formats them when they are read)} for the
            final queries.
        """
        B = len(queries)
        backend = self.backend if backend == "auto" else backend
        res_of: dict[int | None, tuple[list[int], Any]] = {}
        groups: dict[int | None, list[int]] = {}
        for i, b in enumerate(budgets):
            groups.setdefault(b, []).append(i)
        width = 1
        for b, idx in groups.items():
            res = self.memory.search([queries[i] for i in idx], k=k, where=[wheres[i] for i in idx],
                                     backend=backend, mode=mode, max_partitions=b, stats=stats, ties=ties,
                                     min_score=min_score, time_unit=time_unit)
            res_of[b] = (idx, res)
            width = max(width, res.seqs.shape[1])
        seqs = np.full((B, width), -1, dtype=np.int64)
        scores = np.full((B, width), -np.inf, dtype=np.float32)
        times = np.full((B, width), MISSING_TIME, dtype=np.int64)
        records: dict[int, list[dict[str, Any]]] = {}
        for idx, res in res_of.values():
            at = np.asarray(idx, dtype=np.int64)
            w = res.seqs.shape[1]
            seqs[at, :w], scores[at, :w] = res.seqs, res.scores
            fin = np.asarray([final is not None and bool(final[i]) for i in idx], dtype=bool)
            ok = (res.seqs >= 0) & ~fin[:, None]
            if ok.any():
                tw = np.full(res.seqs.shape, MISSING_TIME, dtype=np.int64)
                tw[ok] = hit_times(res.snapshot, res.vidx[ok], res.rows[ok])
                times[at, :w] = tw
            snap = res.snapshot
            for j in np.flatnonzero(fin).tolist():
                okj = res.seqs[j] >= 0
                records[idx[j]] = [snap.record(v, r) for v, r in zip(res.vidx[j][okj].tolist(),
                                                                     res.rows[j][okj].tolist())]
        return {"seqs": seqs, "scores": scores, "times": times, "records": records}

    def fetch(self, seqs: Any) -> list[dict[str, Any] | None]:
        """The records with these sequence numbers (the fetch phase of query-then-fetch).

        Parameters
        ----------
        seqs : ndarray, shape (m,), int64, host

        Returns
        -------
        list of m dicts, the records as stored (``id``, ``text`` and the record's fields: canonical, times
        in epoch ms; the coordinator formats them when they are read), None where ``seqs[i]`` is no live
        record here.
        """
        snap = self.memory.snapshot()
        vi, rows = snap.locate(np.asarray(seqs, dtype=np.int64))
        return [None if v < 0 else snap.record(v, r) for v, r in zip(vi.tolist(), rows.tolist())]

    def term_stats(self, queries: list[str]) -> TermStats:
        """This shard's live N, total length and the df of the queries' terms (a DFS phase's report)."""
        return self.memory.term_stats(queries)

    def info(self) -> dict[str, Any]:
        """Counts, the process and the device of this shard."""
        from ..backends import resolve_memory_backend

        mem = self.memory
        snap = mem.snapshot()
        try:
            backend, reason = resolve_memory_backend(self.backend)
        except ValueError as e:  # pragma: no cover - an unusable forced backend
            backend, reason = "unavailable", str(e)
        node, gpus = None, []
        try:  # inside a Ray actor: the node and the GPUs Ray gave it
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
                gpus = [str(g) for g in ray.get_gpu_ids()]
        except ImportError:  # pragma: no cover - a shard run without Ray (tests)
            pass
        return {"shard": self.index, "path": str(self.root), "records": snap.n_docs, "segments": len(snap.views),
                "partitions": len(snap.partitions), "terms": int(np.count_nonzero(snap.df)),
                "node": node, "pid": os.getpid(), "device": f"cuda:{','.join(gpus)}" if gpus else "cpu",
                "backend": backend, "backend_reason": reason, "wal_pending_records": self.pending_records,
                "replayed_operations": self.replayed, "checkpoints": self.checkpoints,
                "open_s": round(self.started_s, 3), "failed": self.failed,
                "gc_frozen_objects": gc.get_freeze_count()}
