"""`Memory`: an agent memory that grows while serving, with exact global BM25.

The writer (one thread at a time; one process at a time per directory) turns
every ``add`` into new immutable segments (one per time partition touched),
``delete`` into new live masks (tombstones), ``update`` into both; keeps the
global statistics (N, df, total length) of the live records; and publishes a
new :class:`~gpuir.memory.snapshot.Snapshot`. A tiered policy then chooses
merges inside each partition: when a partition holds ``merge_factor`` segments
of one size tier (tier 0 up to ``merge_min`` live records, tier j up to
``merge_min * merge_factor**j``), they become one; a segment with more than
a third of its rows deleted is rewritten alone. When records arrive in a newer
time partition, each older partition is compacted into one segment, once (an
agent's memory mostly grows at its newest end, so old partitions then hold one
segment each; late records for an old partition start new small segments,
merged by the tiers). :meth:`Memory.merge` compacts on demand. Merges purge
tombstones and never change a search result.

Merges run off the writer's path (:mod:`gpuir.memory.merger`): the policy hands
them to background threads and the writer returns. A merge reads immutable
segments outside every lock, then commits under the writer's lock in a moment:
records deleted or updated while it ran are tombstoned in the merged segment
(so no delete is lost), and it is published as a new snapshot (searches keep
the snapshot they started with). It reaches the directory only through the
next :meth:`Memory.save` (the normal atomic commit), so a crash during a merge
loses nothing. ``background_merges=False`` runs merges inside the writer's
call instead (deterministic); :meth:`Memory.wait_merges` waits for the
background ones; :meth:`Memory.close` stops them.

Searches run on the snapshot current when they start, from any number of
threads, and never wait for the writer.

Unknown ids: :meth:`Memory.delete` and :meth:`Memory.get` raise
:class:`UnknownIdError` naming them (nothing is deleted) unless
``missing_ok=True`` (then unknown ids are skipped, or returned as None by get).
:meth:`Memory.update` requires every id to exist and merges the fields given
into the stored record (:mod:`gpuir.memory.updates`); :meth:`Memory.add`
refuses ids that exist (use update, or upsert). An update re-adds the record:
it takes the place of the newest record in the add order, as a delete followed
by an add would. The versions an update replaces are kept in a bounded history
(:mod:`gpuir.memory.history`). Records past their ``expires_at`` are hidden at
once and purged by the next write (:mod:`gpuir.memory.expiry`). Listing and
counting: :mod:`gpuir.memory.listing`; export and import:
:mod:`gpuir.memory.export`. Times in: :mod:`gpuir.memory.timeutil` (a bare
number needs ``time_unit``); times out: ISO 8601 strings.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis import Analyzer
from ..backends import engine_for, resolve_backend, resolve_memory_backend
from ..bm25 import BM25Params
from ..storage.dirlock import WriterLock, check_path, claim_dir, is_claimed
from ..wal import WALCorruptError, read_log
from ..wal import segments as wal_segments
from . import bulk, listing, persist, scope, updates, warmup
from .builder import SegmentBuilder
from .columns import Interner
from .docfreq import DfLog
from .durable import (
    MemoryClosedError,
    MemoryLog,
    check_durability,
    concat_batches,
    log_holds_writes,
    op_parts,
    op_records,
)
from .embeddings import Embedding, VectorError, parse_embeddings
from .errors import UnknownIdError
from .expiry import cutoff, expired_rows, has_expiry, now_ms
from .export import check_config as check_export_config
from .export import read_export, write_export
from .history import History, canonical_entries
from .hitorder import by_time, newest_ties, threshold
from .hybrid import DEFAULT_EMBEDDING, check_ranking, hybrid_search
from .idmap import IdMap
from .intake import canonical_records, fold_expiry, to_batch
from .merger import MergeCancelled, Merger, MergeTask
from .partitions import partition_keys, scan, scan_unfiltered
from .persist import MemoryFormatError
from .records import MISSING_TIME, STRING_FIELDS, DuplicateIdError, RecordBatch, format_time, id_list, normalize_records
from .search import MemoryResults, make_engine, plan_queries
from .searchargs import check_search_args
from .segments import VECTORS_PREFIX, SegView, merge_segments, segment_arrays, segment_from_file
from .snapshot import Snapshot
from .termorder import TermOrder
from .termstats import TermStats, check_seqs, query_terms, restate, term_stats
from .timeutil import check_time_unit, public_record
from .vecsearch import check_method, search_snapshot
from .where import compile_wheres

DAY_MS = 86_400_000

log = logging.getLogger("gpuir.memory")


class UnsavedWritesWarning(UserWarning):
    """A memory bound to a directory was closed, or left a ``with`` block by an exception, with unsaved writes."""


class ReadOnlyError(ValueError):
    """A memory opened for reading was asked to change."""


class Memory:
    """Records with text and metadata, searchable with exact BM25 while they grow.

    Parameters
    ----------
    analyzer : analyzer name, config dict or Analyzer (see :data:`gpuir.analysis.ANALYZERS`)
    method, k1, b, delta : BM25 variant and parameters (see :class:`~gpuir.bm25.BM25Params`)
    partition_days : float or None
        Width of the time partitions in days (default 7); None: no time partitions.
    merge_factor : int
        Segments of one size tier that trigger a merge (>= 2).
    merge_min : int
        Live records up to which a segment is in the smallest tier (>= 1).
    history_limit : int
        Earlier versions kept per record (>= 0; see :mod:`gpuir.memory.history`).
    background_merges : bool
        Merge in background threads (default): no ``add`` waits for a merge.
        False: merges run inside the writer's call that triggers them.
    embeddings : dict name -> encoder, optional
        Named embeddings whose vectors every record carries (stored in the
        segments, searched by :meth:`search_vectors`): an encoder object
        (``encode_passages`` / ``encode_queries``), a callable ``texts -> array``,
        a model name, ``{"encoder": ..., "dtype": "float16"}``, or None (vectors
        given to :meth:`add`). See :mod:`gpuir.memory.embeddings`.
    durability : {"fsync", "flush", "none"}
        Once the memory is bound to a directory (:meth:`save`, :meth:`open`),
        what a write has done when it returns: logged and fsynced (default;
        survives a crash and a power cut), logged without fsync (survives a
        crash of the process, not a power cut), or nothing until the next
        :meth:`save` (no log). See :mod:`gpuir.memory.durable`.
    require_scope : bool
        Refuse every unscoped read and write of records (:class:`~gpuir.memory.scope.ScopeError`):
        a memory holding several tenants, used only through :meth:`scope`. Saved with the memory.
    record_times : bool
        Keep each record's ``created_at`` and ``updated_at`` (:mod:`gpuir.memory.stamps`): returned
        with hits, ``get`` and ``list``, usable in ``where`` and ``list(order_by=...)``. Saved with
        the memory. (A record added without an id gets a UUIDv7 either way.)
    ranking : {"bm25", "hybrid"}
        What :meth:`search` ranks by unless told otherwise: exact BM25 ("bm25", the default), or
        BM25 and the cosine of an embedding's stored vectors fused, hits scored by a calibrated
        relevance between 0 and 1 ("hybrid", :mod:`gpuir.memory.hybrid`: answers paraphrased
        questions). "hybrid" without ``embeddings`` stores an all-MiniLM-L6-v2 vector per record
        (``embeddings={"minilm": Encoder()}``, torch-free). Saved with the memory.

    Examples
    --------
    >>> from gpuir import Memory
    >>> m = Memory()
    >>> m.add([{"id": "t1", "text": "Caroline went to the support group", "tenant": "conv-26",
    ...         "time": "2023-05-08T13:56:00Z", "role": "user"}])
    1
    >>> m.search("support group", k=5, where={"tenant": "conv-26"}).hits(0)[0]["id"]
    't1'
    """

    #: One memory (:class:`gpuir.memory.protocol.MemoryAPI`); a ``ShardedMemory`` says True.
    sharded = False

    def __init__(self, analyzer: Any = "default", method: str = "lucene", k1: float = 1.2, b: float = 0.75,
                 delta: float = 0.5, partition_days: float | None = 7.0, merge_factor: int = 8,
                 merge_min: int = 1024, history_limit: int = 10, background_merges: bool = True,
                 embeddings: Mapping[str, Any] | None = None, require_scope: bool = False,
                 record_times: bool = False, durability: str = "fsync", ranking: str = "bm25"):
        self._durability = check_durability(durability)
        self._ranking = check_ranking(ranking)
        if ranking == "hybrid" and not embeddings:
            from ..dense.encoder import Encoder

            embeddings = {DEFAULT_EMBEDDING: Encoder(cache=False)}  # the memory keeps the vectors
        if not isinstance(require_scope, bool):
            raise TypeError(f"require_scope must be True or False, got {require_scope!r}")
        if not isinstance(record_times, bool):
            raise TypeError(f"record_times must be True or False, got {record_times!r}")
        self._record_times = record_times  # created_at / updated_at kept per record (gpuir.memory.stamps)
        self._require_scope = require_scope  # unscoped reads and writes of records refused (gpuir.memory.scope)
        self._guard_scope = require_scope  # ... unless a caller that confines every request lifted it
        self.params = BM25Params(method=method, k1=float(k1), b=float(b), delta=float(delta))
        self._analyzer = analyzer if isinstance(analyzer, Analyzer) else Analyzer(analyzer)
        self.analyzer_config = self._analyzer.config
        if partition_days is None:
            self.window_ms: int | None = None
        else:
            if isinstance(partition_days, bool) or not isinstance(partition_days, (int, float)) or not (
                    math.isfinite(partition_days) and partition_days > 0):
                raise ValueError(f"partition_days must be a positive number of days or None, got {partition_days!r}")
            self.window_ms = max(1, round(float(partition_days) * DAY_MS))
        if isinstance(merge_factor, bool) or not isinstance(merge_factor, int) or merge_factor < 2:
            raise ValueError(f"merge_factor must be an integer >= 2, got {merge_factor!r}")
        if isinstance(merge_min, bool) or not isinstance(merge_min, int) or merge_min < 1:
            raise ValueError(f"merge_min must be a positive integer, got {merge_min!r}")
        self.merge_factor = merge_factor
        self.merge_min = merge_min
        self._terms = Interner()
        self._dicts = {f: Interner() for f in STRING_FIELDS}
        self._dflog = DfLog()  # live document frequencies: the writer's dense array, a table per snapshot
        self._order = TermOrder(self._terms)  # each term's sort key (sorting with few string comparisons)
        self._builder = SegmentBuilder(self._analyzer, self._terms, self._order)
        self._n = 0
        self._total_len = 0
        self._ids = IdMap(self._resolve_ids)  # live id -> sequence number (no Python object per loaded record)
        self._next_seq = 0
        self._next_uid = 0
        self._views: dict[int, SegView] = {}  # uid -> view, every live segment
        self._parts: dict[Any, dict[int, None]] = {}  # partition key -> uids of its segments
        self._newest: int | None = None  # the newest timed partition key
        self._sealed: set = set()  # partitions compacted once they stopped being the newest
        self._seal_checked: int | None = None  # the newest key the seal check last ran for
        self._merging: set[int] = set()  # uids of segments in a queued or running merge
        self._merge_skip: set[int] = set()  # uids whose merge failed: not chosen again automatically
        self._merge_paused = 0
        self._version = 0
        self._write_lock = threading.RLock()
        self._commit_lock = threading.Lock()
        #: (records merged, seconds) of every merge, for benchmarks (background merges do not pause the writer).
        self.merge_log: list[tuple[int, float]] = []
        #: The engine of the latest compiled or device search (None: none yet, or NumPy): merges prepare
        #: their segments for it before publishing them (:meth:`gpuir.backends.contract.SegmentEngine.prepare`).
        self._served_by: str | None = None
        self._merger = Merger(self._run_merge, small_limit=self.merge_min * self.merge_factor ** 2,
                              background=bool(background_merges))
        self._path: Path | None = None
        self._lock: WriterLock | None = None
        self._readonly = False
        self._gen = 0  # generation of the manifest this memory last loaded or saved
        self._saved: dict[int, dict[str, Any]] = {}  # uid -> manifest entry on disk
        self._saved_views: dict[int, SegView] = {}  # uid -> the view whose deletions are on disk
        self._prev_files: set[str] = set()
        self._unsaved = 0  # records added, updated or deleted since the last save or open
        self._history = History(history_limit)
        self._expiring = False  # some record was given an expires_at (saved in the manifest; never reset)
        self._emb: dict[str, Embedding] = parse_embeddings(embeddings)  # every segment carries each one's column
        self._log: MemoryLog | None = None  # the directory's write-ahead log (gpuir.memory.durable)
        self._closed = False
        self._replaying = False  # applying the log's operations (open): nothing is logged again
        self._replay_at: int | None = None  # the logged time of the delete being replayed
        self._replayed = 0  # operations the directory's log replayed at open
        self._write_tag: Any = None  # a caller's tag (JSON) logged with each write while set (a shard's write id)
        self._last_tag: Any = None  # the tag of the last write (saved in the manifest, replayed from the log)
        self._tag_before: Any = None  # (restored when a tagged write is taken back)
        self._save_lock = threading.Lock()  # one save (checkpoint) at a time
        self._attempt_gen = 0  # the highest generation a save tried to commit (each attempt a new number)
        self._ckpt_thread: threading.Thread | None = None
        self._snap = self._snapshot()

    # ------------------------------------------------------------------ state
    def config(self) -> dict[str, Any]:
        """The settings fixed at creation (saved in the manifest)."""
        return {"analyzer": self.analyzer_config, "bm25": self.params.to_dict(),
                "partition_days": None if self.window_ms is None else self.window_ms / DAY_MS,
                "window_ms": self.window_ms, "merge_factor": self.merge_factor, "merge_min": self.merge_min,
                "history_limit": self._history.limit, "require_scope": self._require_scope,
                "record_times": self._record_times, **({"ranking": self._ranking} if self._ranking != "bm25" else {})}

    def _snapshot(self) -> Snapshot:
        self._version += 1
        df = self._dflog.publish(len(self._terms))  # O(terms changed), never a copy of every df
        snap = Snapshot(self._version, tuple(self._views.values()), self._n, self._total_len, df, self.params,
                        self.analyzer_config, self.window_ms, self._terms, self._dicts)
        snap.expiring = self._expiring  # no expires_at ever given: searches never look for expired rows
        return snap

    def _publish(self, added: Mapping[str, int] | None = None,
                 removed: tuple[Sequence[str], Sequence[int]] | None = None) -> None:
        snap = self._snapshot()
        with self._commit_lock:
            if removed is not None:
                self._ids.remove(*removed)
            if added:
                self._ids.update(added)
            self._snap = snap

    def _resolve_ids(self, seqs: np.ndarray, views=None) -> dict[int, str]:
        """The id of each live record among ``seqs`` (sorted) in ``views`` (default: the current snapshot's)."""
        views = self._snap.views if views is None else views
        out: dict[int, str] = {}
        for v, rows in self._locate(views, seqs):
            out.update(zip(v.seg.seqs[rows].tolist(), v.seg.ids.take(rows).tolist()))
        return out

    def snapshot(self) -> Snapshot:
        """The current snapshot (what a search starting now sees)."""
        return self._snap

    def __len__(self) -> int:
        return self._snap.n_docs

    def len(self) -> int:
        """Number of live records."""
        return len(self)

    def __repr__(self) -> str:
        s = self._snap
        return (f"Memory(records={s.n_docs}, segments={len(s.views)}, partitions={len(s.partitions)}, "
                f"{self.params}, path={str(self._path) if self._path else None})")

    def __contains__(self, rid: object) -> bool:
        if not isinstance(rid, str):
            return False
        with self._commit_lock:
            return self._ids.get(rid) is not None

    @property
    def next_seq(self) -> int:
        """The sequence number the next added record gets (one more than the last one used)."""
        return self._next_seq

    def _check_writable(self) -> None:
        if self._replaying:
            return
        if self._closed:
            where = f" at {self._path}" if self._path is not None else ""
            raise MemoryClosedError(f"the memory{where} was closed: it refuses writes and saves. Open the directory "
                                    "again with Memory.open(path) (or make a new Memory) to write")
        if self._readonly:
            raise ReadOnlyError(f"the memory at {self._path} was opened for reading: open it with "
                                "Memory.open(path, writer=True) to change it")
        if self._log is not None and self._log.failed is not None:
            raise OSError(self._log.failed)

    @property
    def durability(self) -> str:
        """What a write has done when it returns (see :mod:`gpuir.memory.durable`)."""
        return self._durability

    def _note_tag(self) -> None:
        """A write is being made (writer's lock held): it carries the caller's tag, if one is set."""
        if self._write_tag is not None and not self._replaying:
            self._tag_before, self._last_tag = self._last_tag, self._write_tag

    def _log_write(self, op: dict[str, Any], n: int):
        """Log ``op`` (writer's lock held) before it is applied; None when nothing is logged."""
        if self._log is None or self._replaying:
            return None
        if self._write_tag is not None:
            op["tag"] = self._write_tag
        return self._log.write(op, n)

    def _unlog(self, token, n: int) -> None:
        """Take back a logged operation that could not be applied (writer's lock held)."""
        if self._write_tag is not None and not self._replaying:
            self._last_tag = self._tag_before
        if token is not None:
            self._log.rollback(token[0], n)

    @contextlib.contextmanager
    def _tagged(self, tag: Any):
        """Log ``tag`` (a JSON value) with every write made inside (one writer: a shard's write id). The
        tag of the last write is kept across saves (in the manifest) and replays (:attr:`_last_tag`), so a
        caller can tell after a crash which of its writes the memory holds."""
        self._write_tag = tag
        try:
            yield
        finally:
            self._write_tag = None

    @contextlib.contextmanager
    def _unlogged(self):
        """Apply writes without logging them (an older log being folded in: a save must follow, and it is
        the save that makes them durable)."""
        self._replaying = True
        try:
            with scope.inside_scope():
                yield
        finally:
            self._replaying = False

    def _durable(self, token) -> None:
        """After the writer's lock is released: wait for the log's fsync (group commit), then checkpoint in the
        background when the log has grown enough."""
        if token is None:
            return
        log_ = self._log
        if log_ is None:  # closed meanwhile: close() synced the log
            return
        log_.sync(token[1])
        if log_.due() and (self._ckpt_thread is None or not self._ckpt_thread.is_alive()):
            with self._write_lock:
                if self._closed or (self._ckpt_thread is not None and self._ckpt_thread.is_alive()):
                    return
                self._ckpt_thread = threading.Thread(target=self._checkpoint, name="gpuir-memory-checkpoint",
                                                     daemon=True)
                self._ckpt_thread.start()

    def _checkpoint(self) -> None:
        try:
            self.save()
        except MemoryClosedError:
            pass
        except Exception as e:  # noqa: BLE001 - the log still holds every write; the next one retries
            log.warning("background checkpoint of %s failed (the log keeps every write): %s: %s", self._path,
                        type(e).__name__, e)

    def _replay(self, ops: list[dict[str, Any]]) -> int:
        """Apply the log's operations (open): the writes acknowledged after the last save. Returns their count."""
        self._replaying = True
        run: list[tuple[RecordBatch, np.ndarray, Any]] = []  # consecutive logged adds, replayed as one add
        in_run: set[str] = set()

        def flush() -> None:
            if run:
                vecs = run[0][2]
                self.add(concat_batches([b for b, _, _ in run]), seqs=np.concatenate([q for _, q, _ in run]),
                         vectors=None if vecs is None else {n: np.concatenate([v[n] for _, _, v in run])
                                                            for n in vecs})
                run.clear()
                in_run.clear()

        try:
            with scope.inside_scope():  # (the log replays the memory's own writes, scoped or not)
                for op in ops:
                    if op.get("op") != "add":
                        flush()
                        self._replay_one(op)
                        continue
                    if "tag" in op:
                        self._last_tag = op["tag"]
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
            self._replaying = False
        return len(ops)

    def _replay_one(self, op: dict[str, Any]) -> None:
        kind = op.get("op")
        if "tag" in op:
            self._last_tag = op["tag"]
        if kind == "add":
            batch, seqs, vecs = op_parts(op)
            self.add(batch, vectors=vecs, seqs=seqs)
        elif kind == "put":
            self._replay_at = op.get("at")
            try:
                batch, seqs, vecs = op_parts(op)
                self._write(batch, True, "ms", "upsert", seqs, vectors=vecs)
            finally:
                self._replay_at = None
        elif kind == "delete":
            self._replay_at = op.get("at")
            try:
                self.delete(op["ids"], missing_ok=True, keep_history=bool(op.get("keep_history")))
            finally:
                self._replay_at = None
        else:
            raise MemoryFormatError(f"{self._path}: the memory's log holds an unknown operation {kind!r}")

    # ------------------------------------------------------------------ writes
    def add(self, records: Iterable[Mapping[str, Any]], time_unit: str | None = None,
            vectors: Mapping[str, Any] | None = None, seqs: Sequence[int] | np.ndarray | None = None) -> int:
        """Add new records (an iterable of dicts; see :mod:`gpuir.memory.records`).

        Parameters
        ----------
        records : iterable of dict
        time_unit : {"s", "ms", "us", "ns"}, optional
            The unit of times given as bare numbers (a bare number without it is
            an error; see :mod:`gpuir.memory.timeutil`).
        vectors : dict name -> array (n, dim), optional
            The records' vectors of named embeddings, a row per record in the
            order given (normalised and stored in the embedding's dtype). An
            embedding of the memory not named here encodes the records' texts
            with its encoder (one batched call). Naming an embedding the memory
            does not have yet adds it (an empty memory only; see
            :meth:`add_embedding`).
        seqs : sequence of int, optional
            The records' sequence numbers (the tie order), strictly increasing and
            beyond every number used so far, when a sharded memory numbers them
            (:mod:`gpuir.memory.termstats`); default: the next ones.

        Returns
        -------
        int: the number of records added.

        Raises
        ------
        RecordError
            A malformed record, or an id that already exists (nothing is added).
        """
        if self._guard_scope:
            scope.require("add")
        with self._write_lock:
            self._check_writable()
            batch = records if isinstance(records, RecordBatch) else to_batch(
                records, time_unit, stamp=self.stamp)  # ids and times decided here
            if not len(batch):
                return 0
            self._purge_expired()
            self._note_expiry(batch)
            clash = [i for i, s in enumerate(self._ids.get_many(batch.ids)) if s is not None]
            if clash:
                raise DuplicateIdError(f"{batch.label(clash[0])}: the id already exists "
                                       f"({len(clash)} such record(s)); use update() to replace records",
                                       [batch.ids[i] for i in clash])
            vecs = self._batch_vectors(batch, vectors, "add")
            n = len(batch)
            given = check_seqs(seqs, n, self._next_seq)
            token = None
            self._note_tag()
            if self._log is not None and not self._replaying:
                if given is None:
                    given = np.arange(self._next_seq, self._next_seq + n, dtype=np.int64)
                token = self._log_write({"op": "add", "batch": batch, "seqs": given, "vectors": vecs}, n)
            try:
                added, parts = self._append(batch, given, vecs)
                self._publish(added=added)
            except BaseException:
                self._unlog(token, n)
                raise
            self._unsaved += n
            self._merge_policy(parts)
        self._durable(token)
        return n

    def update(self, records: Iterable[Mapping[str, Any]], replace: bool = False,
               time_unit: str | None = None, seqs: Sequence[int] | np.ndarray | None = None) -> int:
        """Change existing records (matched by id), keeping what the records given do not name; atomic.

        Each record given is an ``id`` and the fields to change: fields given
        replace the stored ones, a field given as None is removed, ``metadata``
        merges key by key (a key given as None is removed), everything else is
        kept (:mod:`gpuir.memory.updates`). ``replace=True`` replaces whole
        records instead (as :meth:`replace`). The versions replaced are kept in
        the record's history (:meth:`history`). ``seqs``: the sequence numbers
        of the records given, as in :meth:`add` (a record left as it was uses none).

        Returns
        -------
        int: the number of records changed (a record the update leaves as it was counts 0: it is not
        written, gets no new version and no new ``updated_at``).

        Raises
        ------
        RecordError
            A malformed record or merged result (nothing is changed).
        UnknownIdError
            An id that names no record (nothing is changed).
        """
        return self._write(records, replace, time_unit, "update", seqs)

    def replace(self, records: Iterable[Mapping[str, Any]], time_unit: str | None = None) -> int:
        """Replace existing records (matched by id) by the records given, whole; atomic. See :meth:`update`."""
        return self._write(records, True, time_unit, "replace")

    def upsert(self, records: Iterable[Mapping[str, Any]], replace: bool = False,
               time_unit: str | None = None, seqs: Sequence[int] | np.ndarray | None = None) -> int:
        """Update the records whose ids exist (merging, or replacing with ``replace``) and add the others; atomic.

        ``seqs``: the sequence numbers of the records given, as in :meth:`update`.

        Returns
        -------
        int: the number of records added or changed (one left as it was counts 0).
        """
        return self._write(records, replace, time_unit, "upsert", seqs)

    def _write(self, records: Any, replace: bool, time_unit: str | None, what: str,
               seqs: Sequence[int] | np.ndarray | None = None, vectors: Mapping[str, Any] | None = None) -> int:
        token = None
        if self._guard_scope:
            scope.require(what)
        with self._write_lock:
            self._check_writable()
            if isinstance(records, RecordBatch):  # validated columns: whole records
                records = [records.record(i) for i in range(len(records))]
                replace, time_unit = True, "ms"
            # (a replayed version carries its times already: never stamped again)
            patches = canonical_records(records, time_unit,
                                        stamp="update" if self._record_times and not self._replaying else None)
            ids = updates.check_ids(patches, what)
            if not ids:
                return 0
            given = check_seqs(seqs, len(ids), self._next_seq)
            self._purge_expired()
            seq_of = dict(zip(ids, self._ids.get_many(ids)))
            if what != "upsert":
                unknown = [rid for rid in ids if seq_of[rid] is None]
                if unknown:
                    raise UnknownIdError(unknown, what)
            current = dict(zip(*self.stored([rid for rid in ids if seq_of[rid] is not None])))
            new, labels, replaced, old = updates.plan(patches, current, replace)
            if not new:
                return 0
            batch = normalize_records(fold_expiry(new), labels=labels)
            self._note_expiry(batch)
            rseqs = [seq_of[rid] for rid in replaced]
            text_of = dict(zip(batch.ids, batch.texts))
            keep = {rid: seq_of[rid] for rid in replaced if current[rid].get("text") == text_of.get(rid)}
            vecs = self._batch_vectors(batch, vectors, what, keep)
            if given is not None and len(new) < len(ids):  # the records left as they were use no number
                given_of = dict(zip(ids, given.tolist()))
                given = np.asarray([given_of[r["id"]] for r in new], dtype=np.int64)
            n = len(new)
            at = now_ms() if self._replay_at is None else self._replay_at  # the history's time, logged with it
            self._note_tag()
            if self._log is not None and not self._replaying:
                if given is None:
                    given = np.arange(self._next_seq, self._next_seq + n, dtype=np.int64)
                token = self._log_write({"op": "put", "batch": batch, "seqs": given, "vectors": vecs, "at": at}, n)
            try:
                touched = self._remove(rseqs) if replaced else set()
                added, parts = self._append(batch, given, vecs)
                self._publish(added=added, removed=(replaced, rseqs) if replaced else None)  # removed first, then new
            except BaseException:
                self._unlog(token, n)
                raise
            self._history.push_updates(old, new, at)
            self._unsaved += n
            self._merge_policy(touched | parts)
        self._durable(token)
        return n

    # ------------------------------------------------------------------ vectors
    def _batch_vectors(self, batch: RecordBatch, given: Mapping[str, Any] | None, what: str,
                       keep: Mapping[str, int] | None = None) -> dict[str, np.ndarray] | None:
        """The vectors of ``batch``'s records for every embedding (writer; nothing is changed on error).

        ``given``: arrays from the caller; ``keep``: id -> sequence number of stored records whose
        text is unchanged (their stored vectors are kept as they are); the rest is encoded.
        """
        if given is not None and not isinstance(given, Mapping):
            raise VectorError(f"{what}: vectors must be a dict embedding name -> array (n, dim)")
        given = dict(given or {})
        new = [n for n in given if n not in self._emb]
        if new and (self._n or self._views):
            raise VectorError(f"{what}: the memory has no embedding {new[0]!r} (it has "
                              f"{sorted(self._emb) or 'none'}); add it with add_embedding({new[0]!r}, encoder) "
                              "first: its records need vectors too")
        embs = {**self._emb, **{nm: Embedding(nm) for nm in new}}
        if not embs:
            return None
        n = len(batch)
        out: dict[str, np.ndarray] = {}
        located: list[tuple[SegView, np.ndarray]] = []
        dest_of: dict[int, int] = {}
        if keep:
            row_of = {rid: i for i, rid in enumerate(batch.ids)}
            dest_of = {int(q): row_of[rid] for rid, q in keep.items()}
            located = self._locate(list(self._views.values()), np.asarray(sorted(dest_of), dtype=np.int64))
        for name, emb in embs.items():
            if name in given:
                out[name] = emb.check(given[name], n, what)
                continue
            if located and emb.dim is not None:
                arr = np.zeros((n, emb.dim), dtype=emb.dtype)
                done = np.zeros(n, dtype=bool)
                for v, r in located:  # unchanged texts: the stored vectors, bit for bit
                    dest = np.asarray([dest_of[int(q)] for q in v.seg.seqs[r].tolist()], dtype=np.int64)
                    arr[dest] = v.seg.vectors(name)[r]
                    done[dest] = True
                rest = np.flatnonzero(~done)
                if rest.size:
                    arr[rest] = emb.encode([batch.texts[i] for i in rest.tolist()], what)
                out[name] = arr
                continue
            out[name] = emb.encode(list(batch.texts), what)
        self._emb.update(embs)
        return out

    def stored(self, ids: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
        """(ids, their records as stored) of live ids: the canonical form of :mod:`gpuir.memory.intake`
        (``time`` and ``expires_at`` as int epoch ms), read from the current snapshot; for writers that
        merge (the service). Raises KeyError for an id that is not live."""
        with self._commit_lock:
            snap = self._snap
            seqs = self._ids.get_many(ids, snap.views)
        if not ids:
            return [], []
        missing = [rid for rid, s in zip(ids, seqs) if s is None]
        if missing:
            raise KeyError(missing[0])
        where: dict[int, tuple[int, int]] = {}
        pos_of = {id(v): i for i, v in enumerate(snap.views)}
        for v, rows in self._locate(snap.views, np.asarray(sorted(seqs), dtype=np.int64)):
            for r in rows.tolist():
                where[int(v.seg.seqs[r])] = (pos_of[id(v)], r)
        return ids, [snap.record(*where[q]) for q in seqs]

    def purge_expired(self) -> int:
        """Delete every record whose ``expires_at`` has passed (every write does it first); returns how many."""
        with self._write_lock:
            self._check_writable()
            return self._purge_expired()

    def _note_expiry(self, batch: RecordBatch) -> None:
        if not self._expiring and has_expiry(batch.metadata):
            self._expiring = True

    def _purge_expired(self) -> int:
        if not self._expiring:
            return 0
        now = now_ms()
        dead: list[str] = []
        dead_seqs: list[int] = []
        for v in self._views.values():
            rows = expired_rows(v, now)
            if rows.size:
                dead.extend(v.seg.ids.take(rows).tolist())
                dead_seqs.extend(v.seg.seqs[rows].tolist())
        if not dead:
            return 0
        touched = self._remove(dead_seqs)
        self._publish(removed=(dead, dead_seqs))
        self._history.drop(dead)
        self._unsaved += len(dead)
        log.info("purged %d expired record(s)", len(dead))
        self._merge_policy(touched)
        return len(dead)

    def delete(self, ids: Iterable[str] | None = None, missing_ok: bool = False, keep_history: bool = True,
               where: Any = None, time_unit: str | None = None) -> int:
        """Delete records by id, or every record passing ``where`` (tombstones, purged by later merges).

        Parameters
        ----------
        ids : iterable of str, optional
        keep_history : bool
            Keep the records' histories, with the deleted version as their last
            entry (event "delete"; the default); False: a deleted record's history goes with it.
        where : dict, optional
            Instead of ids: delete the records passing this filter (an empty one is
            refused: :meth:`reset` deletes everything). The filter is resolved to
            ids under the writer's lock and they are deleted as ids are
            (:mod:`gpuir.memory.bulk`).
        time_unit : {"s", "ms", "us", "ns"}, optional
            The unit of bare numbers given as times in ``where``.

        Returns
        -------
        int: the number of records deleted.

        Raises
        ------
        UnknownIdError
            Unless ``missing_ok``: ids naming no live record (nothing is deleted).
        """
        if self._guard_scope:
            scope.require("delete")
        if where is not None or ids is None:
            return bulk.delete_where(self, ids, where, keep_history, time_unit)
        with self._write_lock:
            self._check_writable()
            ids = list(dict.fromkeys(id_list(ids, "delete")))
            self._purge_expired()
            seq_of = self._ids.get_many(ids)
            unknown = [rid for rid, s in zip(ids, seq_of) if s is None]
            if unknown and not missing_ok:
                raise UnknownIdError(unknown, "delete")
            seqs = [s for s in seq_of if s is not None]
            ids = [rid for rid, s in zip(ids, seq_of) if s is not None]
            if not ids:
                return 0
            at = now_ms() if self._replay_at is None else self._replay_at  # the history's time, logged with it
            self._note_tag()
            token = self._log_write({"op": "delete", "ids": ids, "keep_history": bool(keep_history), "at": at},
                                    len(ids))
            try:
                versions = list(zip(*self.stored(ids))) if keep_history else None
                touched = self._remove(seqs)
                self._publish(removed=(ids, seqs))
            except BaseException:
                self._unlog(token, len(ids))
                raise
            if keep_history:
                for rid, version in versions:
                    self._history.push(rid, version, "delete", at)
            else:
                self._history.drop(ids)
            self._unsaved += len(ids)
            self._merge_policy(touched)
        self._durable(token)
        return len(ids)

    def _append(self, batch: RecordBatch, seqs: np.ndarray | None = None,
                vecs: dict[str, np.ndarray] | None = None) -> tuple[dict[str, int], set]:
        """Write segments for ``batch`` (with the records' vectors ``vecs``, name -> (n, dim); no publish);
        returns (id -> seq, partitions touched).

        ``seqs``: checked sequence numbers (:func:`~gpuir.memory.termstats.check_seqs`), default the next ones.
        """
        n = len(batch)
        if seqs is None:
            seqs = np.arange(self._next_seq, self._next_seq + n, dtype=np.int64)
        self._next_seq = int(seqs[-1]) + 1
        keys = partition_keys(batch.time, self.window_ms, MISSING_TIME)
        groups: dict[Any, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(key, []).append(i)
        for key, rows in groups.items():
            r = np.asarray(rows, dtype=np.int64)
            part_vecs = None if vecs is None else {
                nm: (a[r] if len(groups) > 1 else a) for nm, a in vecs.items()}
            seg = self._builder.build(self._next_uid, key, batch.take(r) if len(groups) > 1 else batch, seqs[r],
                                      self._dicts, part_vecs)
            self._next_uid += 1
            self._prepare(seg, cheap=True)
            self._dflog.add(seg.l2g, seg.df, unique=True)
            self._n += seg.n_docs
            self._total_len += seg.length
            self._put(SegView(seg))
            if key is not None and self.window_ms is not None and (self._newest is None or key > self._newest):
                self._newest = key
        return dict(zip(batch.ids, seqs.tolist())), set(groups)

    def _put(self, view: SegView) -> None:
        """Add a segment's view to the writer's state (no publish)."""
        uid = view.seg.uid
        self._views[uid] = view
        self._parts.setdefault(view.seg.partition, {})[uid] = None

    def _drop(self, uid: int) -> None:
        """Remove a segment from the writer's state (no publish)."""
        v = self._views.pop(uid, None)
        if v is not None:
            members = self._parts.get(v.seg.partition)
            if members is not None:
                members.pop(uid, None)
                if not members:
                    del self._parts[v.seg.partition]

    def _locate(self, views: Iterable[SegView], seqs: np.ndarray) -> list[tuple[SegView, np.ndarray]]:
        """(view, live rows) of the records with sequence numbers ``seqs`` (sorted) in ``views``."""
        out = []
        for v in views:
            s = v.seg.seqs
            if not s.size or seqs[-1] < s[0] or seqs[0] > s[-1]:
                continue
            pos = np.minimum(np.searchsorted(s, seqs), s.size - 1)
            hit = s[pos] == seqs
            if hit.any():
                rows = pos[hit]
                if v.live is not None:
                    rows = rows[v.live[rows]]
                if rows.size:
                    out.append((v, rows))
        return out

    def _remove(self, seq_list: Sequence[int]) -> set:
        """Tombstone the live records with these sequence numbers (no publish); returns the partitions touched."""
        seqs = np.sort(np.asarray(seq_list, dtype=np.int64))
        touched = set()
        for v, rows in self._locate(list(self._views.values()), seqs):
            seg = v.seg
            live = np.ones(seg.n_docs, dtype=bool) if v.live is None else v.live.copy()
            live[rows] = False
            texts = seg.texts
            for r in rows.tolist():  # global statistics: the deleted records' distinct terms and lengths
                g = self._terms.lookup_many(sorted(set(self._analyzer(texts[r]))))
                self._dflog.add(g, -1)
            self._n -= int(rows.size)
            self._total_len -= int(seg.csr.doc_lens[rows].sum(dtype=np.int64))
            nv = SegView(seg, live)
            if nv.n_live == 0:
                self._drop(seg.uid)
            else:
                self._views[seg.uid] = nv
            touched.add(seg.partition)
        return touched

    # ------------------------------------------------------------------ merges
    def _tier(self, n: int) -> int:
        if n <= self.merge_min:
            return 0
        return math.ceil(math.log(n / self.merge_min, self.merge_factor) - 1e-9)

    def _merge_policy(self, partitions: set) -> None:
        """Choose merges in each partition of ``partitions`` (see the module docstring); nobody waits.

        Looks only at the segments of those partitions (and, when a newer
        partition appeared, at each older one once).
        """
        if self._merge_paused:
            return
        for key in partitions:
            self._plan(key)
        if self._newest is not None and self._newest != self._seal_checked:
            self._seal_checked = self._newest
            for key in [k for k in self._parts if k is not None and k < self._newest and k not in self._sealed]:
                self._plan(key)

    def _plan(self, key: Any) -> None:
        members = self._parts.get(key)
        if not members:
            return
        idle = [self._views[u] for u in members if u not in self._merging and u not in self._merge_skip]
        if (key is not None and self.window_ms is not None and self._newest is not None and key < self._newest
                and key not in self._sealed):
            # compact, once, a partition that stopped being the newest (when none of it is being merged)
            if len(idle) == len(members):
                if len(idle) > 1 or idle[0].live is not None:
                    self._schedule(key, idle, "seal")
                self._sealed.add(key)
            return
        tiers: dict[int, list[SegView]] = {}
        for v in idle:
            tiers.setdefault(self._tier(v.n_live), []).append(v)
        chosen: set[int] = set()
        for t in sorted(tiers):
            group = tiers[t]
            while len(group) >= self.merge_factor:
                take, group = group[: self.merge_factor], group[self.merge_factor:]
                self._schedule(key, take, "tier")
                chosen.update(v.seg.uid for v in take)
        for v in idle:  # a segment with more than a third of its rows deleted is rewritten alone
            if v.seg.uid not in chosen and 3 * (v.seg.n_docs - v.n_live) > v.seg.n_docs:
                self._schedule(key, [v], "purge")

    def _schedule(self, key: Any, views: list[SegView], reason: str) -> None:
        self._order.update()  # every input's terms keyed before a merge thread reads the keys
        task = MergeTask(key, list(views), self._next_uid, reason)
        self._next_uid += 1
        self._merging.update(task.uids)
        self._merger.submit(task)

    def _run_merge(self, task: MergeTask) -> None:
        """One merge (a background thread, or the writer inline): merge outside every lock, then commit."""
        hook = self._merger.hook
        published = None
        if hook is not None:
            hook("start", task)
        t0 = time.perf_counter()
        try:
            order = self._order
            keys = order.keys if order.ready else None  # (ready read first: it is set after the keys)
            seg = merge_segments(task.views, task.uid, task.key, self._terms, check=task.check, keys=keys)
        except MergeCancelled:
            self._merging.difference_update(task.uids)
            raise
        self._prepare(seg)
        dt = time.perf_counter() - t0
        if hook is not None:
            hook("merged", task)
        # the commit: wait for the writer's lock, unless the merger is stopped meanwhile (close() may be
        # waiting for this thread while holding the lock)
        while not self._write_lock.acquire(timeout=0.05):
            if task.cancelled:
                break
        else:
            try:
                if not task.cancelled:
                    self._commit_merge(task, seg)
                    self.merge_log.append((seg.n_docs, dt))
                    self._merge_policy({task.key})  # the merged segment may complete a group of the next tier
                    published = self._snap
                    return
            finally:
                self._write_lock.release()
                if published is not None:
                    self._warm(published)
        self._merging.difference_update(task.uids)  # abandoned: the inputs stay as they are

    def _prepare(self, seg, cheap: bool = False) -> None:
        """Lay ``seg`` out for the engine of the latest search (its scorer, a device copy) before it is
        published -- in the merge's thread for a merged segment, in the writer's call for an added one --
        so that the first search meeting it pays nothing for it (an agent adds a record, then asks: every
        add makes a segment, and every few adds a merge); ``cheap``: only what costs the writer little (a
        small segment's setup, not a batch's layout). Changes no result; a failure is logged and left to
        the first search (which would meet and report it)."""
        name = self._served_by
        if name is None:
            return
        try:
            engine_for(name).prepare(seg, self.params, cheap=cheap)
        except Exception:  # (a search repeats the work and reports what fails)
            log.debug("preparing merged segment %d for %s failed", seg.uid, name, exc_info=True)

    def _warm(self, snap: Snapshot) -> None:
        """What the searches of a merge's new snapshot share across its segments (the compiled engine's
        layout of its large segments), made here in the merge's thread, outside the writer's lock, with
        the engine of the latest search (:meth:`gpuir.backends.contract.SegmentEngine.warm`)."""
        name = self._served_by
        if name is None:
            return
        try:
            engine_for(name).warm(snap)
        except Exception:  # (a search repeats the work and reports what fails)
            log.debug("warming snapshot %d for %s failed", snap.version, name, exc_info=True)

    def _commit_merge(self, task: MergeTask, seg) -> None:
        """Replace the task's inputs by ``seg`` and publish (caller holds the write lock).

        Rows deleted (or replaced by an update) since the task was chosen are
        tombstoned in ``seg``: the merge read the inputs as they were then.
        """
        live = None
        for old in task.views:
            cur = self._views.get(old.seg.uid)
            if cur is old:
                continue
            was = np.ones(old.seg.n_docs, bool) if old.live is None else old.live
            now = np.zeros(old.seg.n_docs, bool) if cur is None else (
                np.ones(old.seg.n_docs, bool) if cur.live is None else cur.live)
            dead = np.flatnonzero(was & ~now)
            if dead.size:
                if live is None:
                    live = np.ones(seg.n_docs, dtype=bool)
                live[np.searchsorted(seg.seqs, old.seg.seqs[dead])] = False
        for uid in task.uids:
            self._drop(uid)
            self._merging.discard(uid)
        nv = SegView(seg, live)
        if nv.n_live:
            self._put(nv)
        self._publish()

    def _merge_failed(self, task: MergeTask) -> None:
        """A merge raised (logged by the merger): its segments stay, and are not chosen again automatically."""
        with self._write_lock:
            self._merging.difference_update(task.uids)
            self._merge_skip.update(task.uids)

    def wait_merges(self, timeout: float | None = None) -> bool:
        """Wait until no background merge is queued or running (a merge may schedule the next).

        Returns
        -------
        bool: False when ``timeout`` seconds passed first.
        """
        return self._merger.drain(timeout)

    def merge_status(self) -> dict[str, Any]:
        """Background merges: queued or running, threads, done, failed (with messages)."""
        m = self._merger
        return {"pending": m.pending(), "threads": m.threads, "done": m.done, "failed": m.failed,
                "errors": list(m.errors[-10:]), "background": m.background}

    def merge(self, partition: Any = "all") -> int:
        """Merge on demand: each partition (or the one named) into one segment, tombstones purged.

        Waits for the background merges first (and holds back new ones meanwhile).

        Returns
        -------
        int: the number of merges done.
        """
        with self._write_lock:
            self._check_writable()
            self._purge_expired()
            self._merge_paused += 1
        try:
            self._merger.drain()
            with self._write_lock:
                keys = list(self._parts)
                if partition != "all":
                    keys = [k for k in keys if k == partition]
                done = 0
                for key in keys:
                    views = [self._views[u] for u in self._parts.get(key, ())]
                    if len(views) > 1 or (views and views[0].live is not None):
                        t0 = time.perf_counter()
                        task = MergeTask(key, views, self._next_uid, "explicit")
                        self._next_uid += 1
                        self._order.update()
                        keys = self._order.keys if self._order.ready else None
                        seg = merge_segments(views, task.uid, key, self._terms, keys=keys)
                        self._commit_merge(task, seg)
                        self.merge_log.append((seg.n_docs, time.perf_counter() - t0))
                        done += 1
                self._merge_skip.clear()
                return done
        finally:
            with self._write_lock:
                self._merge_paused -= 1

    def match_ids(self, where: Any = None, time_unit: str | None = None) -> list[str]:
        """The ids of the live records passing ``where`` (all without one), in add order: what
        ``delete(where=where)`` would delete now."""
        if self._guard_scope:
            scope.require("match_ids")
        snap = self._snap
        w = compile_wheres(where, 1, snap.dicts, time_unit, cutoff(snap))[0]
        return listing.ids_matching(snap, w)

    def reset(self, confirm: bool = False) -> int:
        """Delete every record, and every history kept after a delete; the settings stay.

        Every live id is deleted as :meth:`delete` deletes ids (one call, under
        the writer's lock); then the histories of records deleted earlier with
        ``keep_history=True`` are forgotten.

        Parameters
        ----------
        confirm : bool
            Must be True (a guard against a slip: nothing else asks).

        Returns
        -------
        int: the number of records deleted.
        """
        n = bulk.reset(self, confirm)
        if self._log is not None:
            self.save()  # the forgotten histories are no operation of the log: a save makes them durable
        return n

    def scope(self, tenant: str | None = None, agent: str | None = None, session: str | None = None
              ) -> scope.Scope:
        """A view confined to a tenant (and/or an agent, a session): every read and write stays inside it,
        and ids are the tenant's own (:mod:`gpuir.memory.scope`).

        Raises
        ------
        ValueError
            No field named, or an invalid tenant name.
        """
        return scope.Scope(self, tenant=tenant, agent=agent, session=session)

    @property
    def stamp(self) -> str:
        """How this memory's adds are stamped before they are applied (:func:`~gpuir.memory.intake.to_batch`'s
        ``stamp``): "add" (ids and times) with ``record_times``, else "id"."""
        return "add" if self._record_times else "id"

    @property
    def require_scope(self) -> bool:
        """Whether unscoped reads and writes of records are refused (see :class:`Memory`)."""
        return self._require_scope

    def allow_unscoped(self, allow: bool = True) -> None:
        """Let unscoped reads and writes through in this process, although the memory was made with
        ``require_scope=True`` (the setting saved stays): for a server that confines every request to
        its tenant itself, as the service does (:mod:`gpuir.service.store`)."""
        self._guard_scope = self._require_scope and not allow

    # ------------------------------------------------------------------ reads
    def get(self, ids: Iterable[str], missing_ok: bool = False) -> list[dict[str, Any] | None]:
        """The records with these ids, in the order given (``time`` and ``expires_at`` as ISO 8601 strings).

        A record past its ``expires_at`` is unknown.

        Raises
        ------
        UnknownIdError
            Unless ``missing_ok`` (then unknown ids give None).
        """
        if self._guard_scope:
            scope.require("get")
        ids = id_list(ids, "get")
        with self._commit_lock:
            snap = self._snap
            seq_of = self._ids.get_many(ids, snap.views)
        known = sorted({s for s in seq_of if s is not None})
        where: dict[int, tuple[int, int]] = {}
        if known:
            arr = np.asarray(known, dtype=np.int64)
            pos_of = {id(v): i for i, v in enumerate(snap.views)}
            for v, rows in self._locate(snap.views, arr):
                vi = pos_of[id(v)]
                for r in rows.tolist():
                    where[int(v.seg.seqs[r])] = (vi, r)
        recs = [None if s is None else snap.record(*where[s]) for s in seq_of]
        now = now_ms()
        recs = [None if r is None or r.get("expires_at", now + 1) <= now else r for r in recs]
        unknown = [i for i, r in zip(ids, recs) if r is None]
        if unknown and not missing_ok:
            raise UnknownIdError(unknown, "get")
        return [None if r is None else public_record(r) for r in recs]

    def seqs_of(self, ids: Iterable[str], snapshot: Snapshot | None = None) -> list[int | None]:
        """The sequence number of each id, in the order given (None: no live record of ``snapshot`` has it).

        Parameters
        ----------
        ids : iterable of str
        snapshot : Snapshot, optional
            The state asked about (default: the current one); an id added, deleted or
            updated since a given snapshot reads as it reads now, then is checked live there.
        """
        ids = id_list(ids, "seqs_of")
        with self._commit_lock:
            snap = self._snap if snapshot is None else snapshot
            seqs = self._ids.get_many(ids, snap.views)
        if snapshot is None or not ids:
            return seqs
        arr = np.asarray([-1 if s is None else s for s in seqs], dtype=np.int64)
        live = snapshot.locate(arr)[0] >= 0
        return [s if ok else None for s, ok in zip(seqs, live.tolist())]

    def list(self, where: Any = None, order_by: str = "seq", descending: bool = False, limit: int = 100,
             cursor: str | None = None, time_unit: str | None = None) -> listing.Page:
        """A page of the records passing ``where``, in a stable order, with a cursor for the next page.

        Parameters
        ----------
        where : dict or None
            A filter (:mod:`gpuir.memory.where`); a tenant there is a hard boundary.
        order_by : {"seq", "time", "created_at", "updated_at"}
            Add order, or time (records without a time last), or the times a memory with
            ``record_times`` keeps; see :mod:`gpuir.memory.listing`.
        descending : bool
            Newest (or latest-added) first.
        limit : int
            Records per page.
        cursor : str, optional
            ``page.cursor`` of the previous page (bound to this where, order_by and descending).
        time_unit : {"s", "ms", "us", "ns"}, optional
            The unit of bare numbers given as times in ``where``.

        Returns
        -------
        Page
            ``page.records`` (record dicts, times in ISO 8601) and ``page.cursor`` (None on the last page).
        """
        if self._guard_scope:
            scope.require("list")
        snap = self._snap
        w = compile_wheres(where, 1, snap.dicts, time_unit, cutoff(snap))[0]
        fp = listing.fingerprint(where, order_by, descending, time_unit)
        return listing.list_page(snap, w, fp, order_by, descending, limit, cursor)

    def count(self, where: Any = None, time_unit: str | None = None) -> int:
        """The number of records passing ``where`` (expired records excluded)."""
        if self._guard_scope:
            scope.require("count")
        snap = self._snap
        return listing.count(snap, compile_wheres(where, 1, snap.dicts, time_unit, cutoff(snap))[0])

    def history(self, id: str) -> list[dict[str, Any]]:
        """The earlier versions of record ``id``, oldest first, as record dicts ([] when none; see
        :mod:`gpuir.memory.history`). The current version is :meth:`get`'s."""
        if self._guard_scope:
            scope.require("history")
        if not isinstance(id, str):
            raise TypeError(f"history: the id must be a string, got {type(id).__name__}")
        return self._history.get(id)

    def export(self, path: str | os.PathLike, where: Any = None, vectors: Any = None, history: bool = True,
               time_unit: str | None = None) -> int:
        """Write the records (those passing ``where``; all by default) to a JSON-lines file, exactly.

        Parameters
        ----------
        path : the file (written atomically)
        where : dict, optional
            Export only these records (and only their histories).
        vectors : str, mapping id -> array, or an embedding store (``row_of``, ``vecs``), optional
            Written as each record's ``"vector"``; a str names one of the memory's embeddings (its
            stored vectors, written as float32).
        history : bool
            Write the records' histories too.

        Returns
        -------
        int: the number of records written. See :mod:`gpuir.memory.export` for the format.
        """
        snap = self._snap
        w = compile_wheres(where, 1, snap.dicts, time_unit, cutoff(snap))[0]
        seqs, _, vis, rows = listing._matches(snap, w)
        order = np.argsort(seqs, kind="stable")
        recs = [public_record(snap.record(int(vis[i]), int(rows[i]))) for i in order.tolist()]
        if isinstance(vectors, str):
            emb = self._embedding(vectors)
            col = {}
            for i in order.tolist():
                v = snap.views[int(vis[i])].seg.vectors(emb.name)[int(rows[i])]
                col[snap.views[int(vis[i])].seg.ids[int(rows[i])]] = np.asarray(v, np.float32)
            vectors = col
        hist = []
        if history:
            names = self._history.ids() if where is None else [r["id"] for r in recs if r["id"] in self._history]
            hist = [(rid, self._history.get(rid)) for rid in names]
        return write_export(path, {"config": self.config()}, recs, hist, vectors)

    def import_(self, path: str | os.PathLike, vectors: dict | None = None, replace: bool = False,
                check_config: bool = True) -> int:
        """Add the records of an export file (:meth:`export`), all or none, and their histories.

        Parameters
        ----------
        vectors : dict, optional
            Filled with id -> ndarray (dim,), float32 of the records that carry a vector.
        replace : bool
            Records whose ids exist replace them (default: an existing id is an error, nothing is added).
        check_config : bool
            Refuse a file exported from a memory with another analyzer or BM25 settings (whose scores differ).

        Returns
        -------
        int: the number of records imported.
        """
        header, recs, labels, vecs, hists = read_export(path)
        if check_config:
            check_export_config(path, header, self.config(), "Import into Memory.from_export(path), or pass check_config=False")
        canon = canonical_records(recs, None, labels=labels)
        with self._write_lock, scope.inside_scope():  # an import is of the whole memory, as export
            if replace:  # every record of the file is now as the file has it (unchanged ones included)
                self.upsert(canon, replace=True, time_unit="ms")
                n = len(canon)
            else:
                n = self.add(to_batch(canon, "ms", labels=labels, stamp=self.stamp))
            for rid, versions in hists:
                self._history.restore(rid, canonical_entries(versions))
        if hists and self._log is not None:
            self.save()  # the restored histories are not operations of the log: a save makes them durable
        if vectors is not None:
            vectors.update(vecs)
        return n

    @classmethod
    def from_export(cls, path: str | os.PathLike, vectors: dict | None = None) -> Memory:
        """A new memory with the settings of an export file, holding its records (see :meth:`import_`)."""
        header = read_export(path)[0]
        cfg = header.get("config") or {}
        bm = cfg.get("bm25", {})
        mem = cls(analyzer=cfg.get("analyzer", "default"), method=bm.get("method", "lucene"), k1=bm.get("k1", 1.2),
                  b=bm.get("b", 0.75), delta=bm.get("delta", 0.5), partition_days=cfg.get("partition_days", 7.0),
                  merge_factor=cfg.get("merge_factor", 8), merge_min=cfg.get("merge_min", 1024),
                  history_limit=cfg.get("history_limit", 10), require_scope=bool(cfg.get("require_scope", False)),
                  record_times=bool(cfg.get("record_times", False)))
        mem.import_(path, vectors=vectors)
        return mem

    def search(self, queries: str | Sequence[str], k: int = 10, where: Any = None, backend: str = "auto",
               mode: str = "exhaustive", max_partitions: int | None = None, epsilon: float | None = None,
               decay: float = 0.5, snapshot: Snapshot | None = None, min_score: float | None = None,
               ties: str | None = None, order_by: str = "score", time_unit: str | None = None,
               stats: TermStats | None = None, ranking: str | None = None) -> MemoryResults:
        """Top-k records of each query, with exact global BM25 (or hybrid: ``ranking``).

        Parameters
        ----------
        queries : str or sequence of B str
        k : int, >= 1
        where : None, dict, or a list of B (dict or None)
            Filters (see :mod:`gpuir.memory.where`); a tenant named there is a hard boundary.
        backend : {"auto", "numpy", "numba", "cupy"}
            The engine scoring each segment (:mod:`gpuir.memory.search`); "auto" is
            "numba" when it imports, GPU or not (the device path was slower on a memory's
            segments: :func:`gpuir.backends.resolve_memory_backend`), else "cupy" on a
            machine with a usable GPU, else "numpy".
        mode : {"exhaustive", "newest", "budgeted"}
            Partition scan (see :mod:`gpuir.memory.partitions`): "newest" returns
            exactly what "exhaustive" returns, reading less; "budgeted" reads at
            most ``max_partitions`` partitions (or ``K(epsilon, decay)``).
        max_partitions : int, optional
            Budget K of "budgeted".
        epsilon, decay : float, optional
            Budget by covered recency mass: ``K = ceil(log epsilon / log decay)``.
        snapshot : Snapshot, optional
            Search this snapshot instead of the current one.
        min_score : float, optional
            Drop hits scoring below it (see :mod:`gpuir.memory.hitorder`): a BM25 score, or with
            ``ranking="hybrid"`` a relevance between 0 and 1 (0.5: as likely relevant as not).
        ties : {"oldest", "newest"}, optional
            Order of equal scores: add order ("oldest", the default of "exhaustive"), or
            newest first by time, then add order ("newest", the default of "newest" and "budgeted").
        order_by : {"score", "time"}
            Return the top k by score ("score"), or the same k in time order ("time").
        time_unit : {"s", "ms", "us", "ns"}, optional
            The unit of bare numbers given as times in ``where``.
        stats : TermStats, optional
            Score with these statistics (N, total length, df of every query
            term) instead of the memory's own: this memory is one shard of a
            larger collection (:mod:`gpuir.memory.termstats`).
        ranking : {"bm25", "hybrid"}, optional
            Default: the memory's (``Memory(ranking=...)``, "bm25" unless set). "hybrid": BM25 and
            the cosine of the memory's embedding fused, each hit's score a calibrated relevance
            in [0, 1] (:mod:`gpuir.memory.hybrid`); it takes the exhaustive mode, score order and
            the default ties only.

        Returns
        -------
        MemoryResults
            ``hits(i)`` gives dicts with id, score, text and the record's fields (times in ISO 8601).
        """
        if self._guard_scope:
            scope.require("search")
        ranking = self._ranking if ranking is None else check_ranking(ranking)
        queries, k, ties, min_score, budget = check_search_args(
            queries, k, mode, max_partitions, epsilon, decay, min_score, ties, order_by, time_unit)
        if ranking == "hybrid":
            if mode != "exhaustive" or ties != "oldest" or order_by != "score" or stats is not None:
                raise ValueError("ranking='hybrid' searches every partition in score order (mode='exhaustive', "
                                 "ties='oldest', order_by='score', no stats); pass ranking='bm25' for the others")
            if len(self._emb) > 1 and DEFAULT_EMBEDDING not in self._emb:
                raise VectorError(f"ranking='hybrid' fuses BM25 with the embedding {DEFAULT_EMBEDDING!r}, or the "
                                  f"memory's only one; this memory has {', '.join(sorted(self._emb))}")
            snap = snapshot if snapshot is not None else self._snap
            return hybrid_search(self, self._embedding(None if DEFAULT_EMBEDDING not in self._emb
                                                       else DEFAULT_EMBEDDING), queries, k, where, backend, snap,
                                 min_score, time_unit, MemoryResults)
        tiered = warmup.tiered(backend)  # (the compiled engine still starting in this process: NumPy now)
        name, reason = ("numpy", warmup.REASON) if tiered else resolve_memory_backend(backend)
        snap = snapshot if snapshot is not None else self._snap
        if stats is not None:
            snap = restate(snap, stats)
        t0 = time.perf_counter()
        wheres = compile_wheres(where, len(queries), snap.dicts, time_unit, cutoff(snap))
        scan_wheres = _vacuous_dropped(snap, wheres)
        plans = plan_queries(snap, list(queries), stats)
        t1 = time.perf_counter()
        engine = make_engine(snap, name)
        k = min(k, max(snap.n_docs, 1))  # nothing is sized by a huge k: results are min(k, N) wide, as BM25Index's
        arrays = None
        if mode == "exhaustive" and ties != "newest" and min_score is None and order_by == "score" \
                and all(w is None for w in scan_wheres):  # the common question: one call, no per-query objects
            arrays = scan_unfiltered(snap, engine, plans, k)
        if arrays is None:
            arrays = self._scan_hits(snap, engine, plans, scan_wheres, k, mode, budget, ties, min_score, order_by)
        if name != "numpy":
            self._served_by = name
        if name == "numba":
            warmup.mark_ready()
        elif tiered:  # answered: now load the compiled engine (and lay out this snapshot for it)
            warmup.start(lambda: warm_compiled_engine(self, snap, queries[0]))
        seqs, scores, vidx, rows, read, scanned = arrays
        _check_tenants(snap, wheres, vidx, rows)
        return MemoryResults(seqs, scores, snap, vidx, rows, {
            "backend": name, "backend_reason": reason, "mode": mode, "max_partitions": budget,
            "postings_read": read, "partitions_scanned": scanned,
            "partitions": len(snap.partitions), "snapshot_version": snap.version, "ties": ties,
            "timings": {"analyze_s": t1 - t0, "search_s": time.perf_counter() - t1},
        })

    @staticmethod
    def _scan_hits(snap: Snapshot, engine, plans, wheres, k: int, mode: str, budget, ties: str,
                   min_score: float | None, order_by: str) -> tuple[np.ndarray, ...]:
        """:meth:`search`'s general path: each query's hits through :func:`~gpuir.memory.partitions.scan`
        (any mode and filter), then the edge rules (:mod:`gpuir.memory.hitorder`), as
        :func:`~gpuir.memory.partitions.scan_unfiltered`'s arrays."""
        out = scan(snap, engine, plans, wheres, k + 1 if ties == "newest" else k, mode, budget)
        if ties == "newest" or min_score is not None or order_by == "time":  # at the edge (gpuir.memory.hitorder)
            edged = []
            for i, (h, r, p) in enumerate(out):
                if ties == "newest":
                    h = newest_ties(h, k, snap, lambda n, i=i: scan(snap, engine, [plans[i]], [wheres[i]], n, mode,
                                                                        budget)[0][0])
                h = threshold(h, min_score)
                edged.append((by_time(h, snap) if order_by == "time" else h, r, p))
            out = edged
        B = len(plans)
        seqs = np.full((B, k), -1, dtype=np.int64)
        scores = np.full((B, k), -np.inf, dtype=np.float32)
        vidx = np.full((B, k), -1, dtype=np.int64)
        rows = np.full((B, k), -1, dtype=np.int64)
        for i, (h, _, _) in enumerate(out):
            m = len(h)
            seqs[i, :m], scores[i, :m], vidx[i, :m], rows[i, :m] = h.seqs, h.scores, h.vidx, h.rows
        return (seqs, scores, vidx, rows, np.array([r for _, r, _ in out], dtype=np.int64),
                np.array([p for _, _, p in out], dtype=np.int64))

    def term_stats(self, queries: str | Sequence[str]) -> TermStats:
        """This memory's live N, total length and the df of the queries' analysed terms (a shard's report)."""
        if isinstance(queries, str):
            queries = [queries]
        snap = self._snap
        return term_stats(snap, query_terms(snap, list(queries)))

    # ------------------------------------------------------------------ dense vectors
    @property
    def embeddings(self) -> dict[str, dict[str, Any]]:
        """The memory's named embeddings: name -> {"dim", "dtype", "model", "encoder" (whether one is attached)}."""
        return {n: {**e.to_dict(), "encoder": e.encoder is not None} for n, e in self._emb.items()}

    def add_embedding(self, name: str, encoder: Any = None, dtype: str = "float32") -> int:
        """Add a named embedding (or attach an encoder to an existing one).

        A new embedding's vectors are computed for every live record now (their
        texts encoded in one batched call), and each segment is replaced by a
        copy carrying the column (the next :meth:`save` writes the copies). For
        an existing embedding, ``encoder`` is attached (it encodes later
        records and text queries) and nothing is encoded.

        Parameters
        ----------
        name : str
        encoder : see :class:`Memory` ``embeddings``
        dtype : {"float32", "float16"}
            Storage dtype of a new embedding.

        Returns
        -------
        int: the number of records encoded.

        Raises
        ------
        VectorError
            A bad name or dtype, an existing embedding's other dtype, or records to encode without an encoder.
        """
        spec = parse_embeddings({name: {"encoder": encoder, "dtype": dtype}})[name]
        with self._write_lock:
            have = self._emb.get(name)
            if have is not None:
                if dtype != have.dtype:
                    raise VectorError(f"embedding {name!r} is stored as {have.dtype}, not {dtype}")
                if spec.encoder is not None:
                    have.attach(spec.encoder)
                return 0
            self._merge_paused += 1
        try:
            self._merger.drain()  # no merge holds segments that would miss the column
            with self._write_lock:
                views = list(self._views.values())
                rows = [v.live_rows() for v in views]
                texts = [t for v, r in zip(views, rows) for t in v.seg.texts.take(r).tolist()]
                vecs = spec.encode(texts, f"add_embedding({name!r})") if texts else None
                start = 0
                for v, r in zip(views, rows):
                    col = np.zeros((v.seg.n_docs, spec.dim or 0), dtype=spec.dtype)
                    col[r] = vecs[start: start + r.size]  # (deleted rows: zeros, never searched, purged by merges)
                    start += r.size
                    seg = v.seg.with_vectors(self._next_uid, {name: col})
                    self._next_uid += 1
                    self._drop(v.seg.uid)
                    self._put(SegView(seg, v.live))
                self._emb[name] = spec
                if texts and not self._readonly:
                    self._unsaved += len(texts)
                self._publish()
        finally:
            with self._write_lock:
                self._merge_paused -= 1
        if self._log is not None and not self._replaying:
            self.save()  # the log holds records, not re-encodings: a new embedding is made durable by a save
        return len(texts)

    def search_vectors(self, queries: Any, k: int = 10, where: Any = None, embedding: str | None = None,
                       backend: str = "auto", method: str = "exact", snapshot: Snapshot | None = None,
                       time_unit: str | None = None) -> MemoryResults:
        """Top-k records of each query by the cosine of its vector and the records' stored vectors; exact.

        Parameters
        ----------
        queries : ndarray, shape (B, dim) or (dim,), float; or str / sequence of B str
            Query vectors (normalised here), or texts encoded by the embedding's encoder.
        k : int, >= 1
            Results are min(k, live records) wide.
        where : None, dict, or a list of B (dict or None)
            The filters of :meth:`search` (:mod:`gpuir.memory.where`); a tenant there is a hard boundary.
        embedding : str, optional
            Which named embedding (default: the memory's only one).
        backend : {"auto", "numpy", "numba", "cupy"}
            The engine's dense path (:mod:`gpuir.backends.dense`): every backend returns the same ids
            and float32 scores (float64 accumulation, rounded once).
        method : {"exact", "faiss"}
            "faiss": FAISS candidates per large segment, scored again exactly (:mod:`gpuir.memory.vecsearch`).
        snapshot : Snapshot, optional
        time_unit : {"s", "ms", "us", "ns"}, optional

        Returns
        -------
        MemoryResults
            As :meth:`search`'s: ``hits(i)`` gives dicts with id, score (the cosine, float32), text
            and the record's fields; ties: higher score, then add order.
        """
        if self._guard_scope:
            scope.require("search_vectors")
        emb = self._embedding(embedding)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        check_method(method)
        check_time_unit(time_unit)
        t0 = time.perf_counter()
        if isinstance(queries, str) or (isinstance(queries, Sequence) and queries and
                                        all(isinstance(q, str) for q in queries)):
            q = emb.encode_queries([queries] if isinstance(queries, str) else list(queries))
        else:
            q = emb.queries(queries)
        t1 = time.perf_counter()
        name, reason = resolve_backend(backend)
        snap = snapshot if snapshot is not None else self._snap
        if any(emb.name not in v.seg.vector_names for v in snap.views):
            raise VectorError(f"this snapshot predates embedding {emb.name!r}: search the current one")
        wheres = compile_wheres(where, q.shape[0], snap.dicts, time_unit, cutoff(snap))
        k = min(int(k), max(snap.n_docs, 1))
        seqs, scores, vidx, rows = search_snapshot(snap, emb.name, q, k, wheres, name, method)
        _check_tenants(snap, wheres, vidx, rows)
        return MemoryResults(seqs, scores, snap, vidx, rows, {
            "backend": name, "backend_reason": reason, "mode": "dense", "method": method,
            "embedding": emb.name, "snapshot_version": snap.version, "ties": "oldest",
            "timings": {"encode_s": t1 - t0, "search_s": time.perf_counter() - t1},
        })

    def _embedding(self, name: str | None) -> Embedding:
        if not self._emb:
            raise VectorError("this memory stores no vectors: give Memory(embeddings={name: encoder}), "
                              "add_embedding(name, encoder), or add(records, vectors={name: array})")
        if name is None:
            if len(self._emb) > 1:
                raise VectorError(f"this memory has several embeddings ({', '.join(sorted(self._emb))}): "
                                  "name one with embedding=")
            return next(iter(self._emb.values()))
        emb = self._emb.get(name)
        if emb is None:
            raise VectorError(f"no embedding {name!r} in this memory (it has {', '.join(sorted(self._emb))})")
        return emb

    def vectors(self, ids: Iterable[str], embedding: str | None = None) -> np.ndarray:
        """The stored vectors of live records: ndarray (len(ids), dim), the embedding's dtype, host.

        Raises
        ------
        UnknownIdError
            An id naming no live record.
        """
        if self._guard_scope:
            scope.require("vectors")
        emb = self._embedding(embedding)
        ids = id_list(ids, "vectors")
        with self._commit_lock:
            snap = self._snap
            seq_of = self._ids.get_many(ids, snap.views)
        unknown = [i for i, q in zip(ids, seq_of) if q is None]
        if unknown:
            raise UnknownIdError(unknown, "vectors")
        out = np.zeros((len(ids), emb.dim or 0), dtype=emb.dtype)
        pos: dict[int, list[int]] = {}
        for i, q in enumerate(seq_of):
            pos.setdefault(int(q), []).append(i)
        for v, rows in self._locate(snap.views, np.asarray(sorted(pos), dtype=np.int64)):
            vec = v.seg.vectors(emb.name)
            for q, r in zip(v.seg.seqs[rows].tolist(), rows.tolist()):
                out[pos[q]] = vec[r]
        return out

    # ------------------------------------------------------------------ info
    def info(self) -> dict[str, Any]:
        """Counts for people: records, tenants, segments, partitions, time span, deletions, settings."""
        snap = self._snap
        tenants: dict[str, int] = {}
        tmin, tmax = None, None
        parts = []
        for key, vids in snap.partitions:
            n = sum(snap.views[i].n_live for i in vids)
            entry: dict[str, Any] = {"key": key, "records": n, "segments": len(vids)}
            if key is not None and self.window_ms is not None:
                entry["start"] = format_time(key * self.window_ms)
                entry["end"] = format_time((key + 1) * self.window_ms)
            parts.append(entry)
        for v in snap.views:
            rows = v.live_rows()
            c = v.seg.codes["tenant"][rows]
            u, cnt = np.unique(c, return_counts=True)
            for code, x in zip(u.tolist(), cnt.tolist()):
                name = "" if code < 0 else self._dicts["tenant"].values[code]
                tenants[name] = tenants.get(name, 0) + x
            t = v.seg.time[rows]
            t = t[t != MISSING_TIME]
            if t.size:
                tmin = int(t.min()) if tmin is None else min(tmin, int(t.min()))
                tmax = int(t.max()) if tmax is None else max(tmax, int(t.max()))
        no_tenant = tenants.pop("", 0)
        return {
            "path": str(self._path) if self._path else None,
            "records": snap.n_docs,
            "tenants": len(tenants),
            "records_without_tenant": no_tenant,
            "largest_tenants": dict(sorted(tenants.items(), key=lambda kv: (-kv[1], kv[0]))[:10]),
            "segments": len(snap.views),
            "deleted_not_purged": sum(v.seg.n_docs - v.n_live for v in snap.views),
            "partitions": len(snap.partitions),
            "partition_list": parts,
            "time_span": None if tmin is None else {"min": format_time(tmin), "max": format_time(tmax),
                                                    "min_ms": tmin, "max_ms": tmax},
            "terms": int(np.count_nonzero(snap.df)),
            "postings": sum(int(v.seg.df.sum()) for v in snap.views),
            "avgdl": snap.avgdl,
            "generation": self._gen,
            "embeddings": self.embeddings,
            **self.config(),
        }

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike | None = None, lock_timeout: float = 10.0) -> Path:
        """Commit the current state to a memory directory, writing only what changed.

        The first save to a directory claims it (it must be new, empty, or this
        memory's; a directory gpuir creates or claims is made 0700, and every
        file it writes is 0600) and takes its writer lock, held until
        :meth:`close`. A save never writes over, or garbage-collects, a
        directory whose commit is missing or damaged: it raises instead.

        Returns
        -------
        Path of the directory.

        Raises
        ------
        StoreLockedError
            Another writer holds the directory.
        StoreError
            The directory holds other files, or another memory.
        MemoryFormatError
            The directory holds a memory's files without a commit (``CURRENT``
            missing), its commit is damaged, or another writer changed it.
        """
        return self.begin_save(path, lock_timeout).finish()

    def begin_save(self, path: str | os.PathLike | None = None, lock_timeout: float = 10.0,
                   on_snapshot: Any = None) -> PendingSave:
        """The first half of :meth:`save`, for a writer that keeps a log of its own (a shard, the service):
        under the writer's lock, take the snapshot to save and start the memory's next log segment, and
        call ``on_snapshot(generation)`` there (e.g. to rotate the caller's own log). Returns a
        :class:`PendingSave` whose ``finish()`` writes the files and commits, outside the writer's lock
        (writes go on meanwhile); no other save starts before it finishes. The arguments and errors are
        :meth:`save`'s."""
        self._save_lock.acquire()  # one save at a time; released by PendingSave.finish
        try:
            with self._write_lock:
                self._check_writable()
                if path is None:
                    if self._path is None:
                        raise ValueError("this memory has no directory yet: call save(path)")
                    root = self._path
                else:
                    root = check_path(path)
                if root != self._path:
                    self._bind(root, lock_timeout)
                elif self._lock is None:  # (a writer memory always holds its lock until close)
                    lock = WriterLock(root, timeout=lock_timeout)
                    lock.__enter__()
                    self._lock = lock
                assert self._path is not None
                cur_name = self._check_commit(root)
                gen = max(self._gen, self._attempt_gen) + 1  # a failed attempt's number is never reused
                self._attempt_gen = gen
                job = PendingSave(self, root, self._snap, gen, self._history.freeze(), cur_name, self._unsaved, {
                    "config": self.config(), "next_seq": self._next_seq, "next_uid": self._next_uid,
                    "expiring": self._expiring, "embeddings": {n: e.to_dict() for n, e in self._emb.items()},
                    "log_tag": self._last_tag})
                if self._durability != "none":
                    if self._log is None:
                        self._log = MemoryLog(root, self._durability)
                        self._log.start(gen)
                    else:
                        job.older = self._log.rotate(gen)  # writes from here on go to the segment after this save
                if on_snapshot is not None:
                    on_snapshot(gen)
                return job
        except BaseException:
            self._history.changed = True
            self._save_lock.release()
            raise

    def _check_commit(self, root: Path) -> str | None:
        """The name of the commit a save builds on (None: none yet), checked before anything is written."""
        try:
            cur_name, cur = persist.read_manifest(root)
        except MemoryFormatError as e:
            if self._gen > 0:
                # the commit this memory built on is gone or damaged: writing (and collecting garbage)
                # now could destroy what a repair needs
                raise MemoryFormatError(f"{e}; refusing to save over it (nothing was written or deleted)") \
                    from None
            cur_name, cur = None, None
        if cur is not None and int(cur["generation"]) != self._gen:
            raise MemoryFormatError(f"{root} was changed by another writer since this memory loaded or saved "
                                    f"it (generation {cur['generation']}, expected {self._gen}): reopen it")
        return cur_name

    def _write_save(self, root: Path, snap: Snapshot, gen: int, history: History, state: dict[str, Any],
                    cur_name: str | None) -> None:
        """Write and commit generation ``gen`` of ``snap`` (outside the writer's lock; the save lock held)."""
        entries = []
        saved_views: dict[int, SegView] = {}
        for v in snap.views:
            seg = v.seg
            e = self._saved.get(seg.uid)
            if e is None:
                e = persist.write_segment(root, seg.uid, segment_arrays(seg, self._dicts))
                e = {"uid": seg.uid, "partition": seg.partition, "n_docs": seg.n_docs, **e, "deletes": None,
                     "length": seg.length, "time_min": seg.time_min, "time_max": seg.time_max}
            e = dict(e)
            if v.live is None:
                e["deletes"] = None
            elif self._saved_views.get(seg.uid) is not v:
                e["deletes"] = persist.write_deletes(root, seg.uid, gen, np.flatnonzero(~v.live))
            entries.append(e)
            saved_views[seg.uid] = v
        manifest = {"generation": gen, "config": state["config"], "next_seq": state["next_seq"],
                    "next_uid": state["next_uid"], "n_records": snap.n_docs, "segments": entries,
                    "history": history.save(root, gen), "expiring": state["expiring"]}
        if state["embeddings"]:  # (absent: a memory without vectors, as before)
            manifest["embeddings"] = state["embeddings"]
        if state.get("log_tag") is not None:  # (absent: no writer tags its writes)
            manifest["log_tag"] = state["log_tag"]
        name = persist.commit(root, manifest)
        self._saved = {e["uid"]: {k: x for k, x in e.items()} for e in entries}
        self._saved_views = saved_views
        keep = persist.manifest_files(manifest) | {name} | self._prev_files
        if cur_name:
            keep.add(cur_name)
        persist.collect_garbage(root, keep)
        self._prev_files = persist.manifest_files(manifest) | {name}

    def _bind(self, root: Path, lock_timeout: float) -> None:
        """Claim ``root`` for this memory (mode 0700) and take its writer lock."""
        claim_dir(root, "memory", mode=persist.DIR_MODE)
        lock = WriterLock(root, timeout=lock_timeout)
        lock.__enter__()
        try:
            if (root / persist.CURRENT).exists():
                raise MemoryFormatError(f"{root} already holds a memory: open it with Memory.open({str(root)!r})"
                                        " to change it, or save to a new directory")
            logs = wal_segments(root, "memory")  # a log left by a memory whose first commit never happened
            persist.check_not_orphaned(root, extra=[p.name for _, p in logs if log_holds_writes(p)])
            for _, p in logs:  # (headers only: nothing was acknowledged there)
                p.unlink()  # a damaged memory is never overwritten by a new one
        except BaseException:
            lock.__exit__(None, None, None)
            raise
        self._release_lock()  # (not close(): the merges go on; the writes are not dropped: this save writes them)
        if self._log is not None:  # the old directory keeps its commit and its log, complete
            self._log.close()
            self._log = None
        self._lock = lock
        self._path = root
        self._gen = 0
        self._saved, self._saved_views, self._prev_files = {}, {}, set()

    @classmethod
    def open(cls, path: str | os.PathLike, writer: bool = True, verify: bool | str = True,
             lock_timeout: float = 10.0, background_merges: bool = True,
             embeddings: Mapping[str, Any] | None = None, durability: str = "fsync",
             salvage: bool = False) -> Memory:
        """Open a memory directory by mapping its segment files.

        Only the manifests and the small columns are read at once (each
        segment's vocabulary, term offsets, sequence numbers and ids, the
        string fields' dictionaries, the deletions); the postings, lengths,
        texts, metadata and other columns are memory-mapped and read when a
        search or a read first needs them (see :mod:`gpuir.memory.segfile`), so
        the process grows with what it touches.

        Parameters
        ----------
        path : the directory
        writer : bool
            Take the directory's writer lock (held until :meth:`close`) so that
            this memory may change and save it. False opens it for reading only
            (any number of readers, while a writer works).
        verify : True, "full" or False
            True (default): check every file's size and structure now, and each
            part of a segment file's CRC-32 the first time it is read (a damaged
            part raises :class:`MemoryFormatError` naming the file, before its
            data is used). "full": also check every file's sha256 now (reads
            every byte once; what ``gpuir memory verify`` does). False: sizes
            and structure only.
        lock_timeout : float
            Seconds to wait for another writer.
        background_merges : bool
            See :class:`Memory`.
        embeddings : dict name -> encoder, optional
            Encoders of the stored embeddings (attached: they encode later
            records and text queries), or new embeddings (every record is
            encoded now; see :meth:`add_embedding`). The stored vectors are
            mapped like the other columns whether or not an encoder is given.
        durability : {"fsync", "flush", "none"}
            See :class:`Memory`. Whatever it is, the directory's log (the
            writes acknowledged since its last save) is replayed first; with
            "none" it is then folded into a save and no longer written.
        salvage : bool
            A writer only: start although the log is damaged, keeping every
            intact frame (each skipped byte range logged), fold them into a
            save at once and set the damaged segment aside. Without it, damage
            raises :class:`~gpuir.wal.WALCorruptError` naming the file and
            offset, and nothing is changed.

        Raises
        ------
        MemoryFormatError
            No memory there, or a damaged file (named).
        WALCorruptError
            Damage to acknowledged writes in the log (unless ``salvage``).
        StoreLockedError
            ``writer`` and another writer holds the lock.
        """
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
                    mem = cls._load(root, manifest, verify, background_merges)
                    ops = None if writer else read_log(root, mem._gen)  # a reader sees every acknowledged write
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
        mem._durability = durability
        mem._path = root
        mem._lock = lock
        mem._readonly = not writer
        mem._prev_files = persist.manifest_files(manifest) | {name}
        try:
            if ops:
                mem._replay(ops)
                mem._unsaved = 0
            if writer:
                mem._recover_log(salvage)
        except BaseException:
            mem.close(discard_unsaved=True)
            raise
        try:
            for ename, spec in parse_embeddings(embeddings).items():
                mem.add_embedding(ename, spec.encoder, spec.dtype if ename not in mem._emb else mem._emb[ename].dtype)
        except BaseException:
            mem.close(discard_unsaved=True)
            raise
        return mem

    @classmethod
    def _load(cls, root: Path, manifest: dict[str, Any], verify: bool | str, background_merges: bool) -> Memory:
        cfg = manifest.get("config", {})
        bm = cfg.get("bm25", {})
        try:
            mem = cls(analyzer=cfg.get("analyzer", "default"), method=bm.get("method", "lucene"),
                      k1=bm.get("k1", 1.2), b=bm.get("b", 0.75), delta=bm.get("delta", 0.5),
                      partition_days=cfg.get("partition_days"), merge_factor=cfg.get("merge_factor", 8),
                      merge_min=cfg.get("merge_min", 1024), history_limit=cfg.get("history_limit", 10),
                      background_merges=background_merges, require_scope=bool(cfg.get("require_scope", False)),
                      record_times=bool(cfg.get("record_times", False)), ranking=cfg.get("ranking", "bm25"))
        except (TypeError, ValueError) as e:
            raise MemoryFormatError(f"{root}: invalid settings in the manifest ({e})") from None
        mem.window_ms = cfg.get("window_ms", mem.window_ms)
        try:
            stored = manifest.get("embeddings") or {}
            mem._emb = {n: Embedding(n, None, d.get("dtype", "float32"), d.get("dim"), d.get("model"),
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
                seg = segment_from_file(src, int(e["uid"]), e["partition"], mem.analyzer_config, mem._terms,
                                        mem._dicts, length=e.get("length"), time_range=tr, error=damaged)
            except (ValueError, IndexError, KeyError) as err:
                raise damaged(err) from None
            if seg.n_docs != int(e.get("n_docs", seg.n_docs)):
                raise damaged(f"{seg.n_docs} records, the manifest says {e['n_docs']}")
            for n, emb in mem._emb.items():
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
            mem._put(v)
            mem._dflog.add(seg.l2g, v.live_df(), unique=True)
            mem._n += v.n_live
            mem._total_len += v.live_length()
            ids = seg.ids.tolist() if live is None else seg.ids.take(v.live_rows()).tolist()
            mem._ids.load(ids, seg.seqs if live is None else seg.seqs[live])  # hashes: no object per record kept
            del ids
            mem._saved[seg.uid] = {k: x for k, x in e.items()}
            mem._saved_views[seg.uid] = v
            key = seg.partition
            if key is not None and mem.window_ms is not None and (mem._newest is None or key > mem._newest):
                mem._newest = key
        dup = mem._ids.duplicates(list(mem._views.values()))
        if dup or len(mem._ids) != mem._n:
            raise MemoryFormatError(f"{root}: damaged memory (record ids are not unique: {dup[:3]})")
        mem._seal_checked = mem._newest  # older partitions: compacted when a newer one appears, as before
        mem._history.load(root, manifest.get("history"), verify)
        mem._expiring = bool(manifest.get("expiring", False))  # older memories had no expires_at
        mem._next_seq = int(manifest.get("next_seq", 0))
        mem._next_uid = int(manifest.get("next_uid", 0))
        mem._gen = int(manifest["generation"])
        mem._last_tag = manifest.get("log_tag")
        mem._dflog.reset(len(mem._terms))
        mem._publish()
        mem._order.build_in_background(mem._write_lock)  # keys of the loaded vocabulary, off the open's path
        return mem

    def _recover_log(self, salvage: bool) -> None:
        """Open (writer): replay the directory's log over the loaded commit, then append to it (or, with
        durability "none", fold it into a save and delete it)."""
        root = self._path
        mlog = MemoryLog(root, "flush" if self._durability == "none" else self._durability)
        t0 = time.perf_counter()
        rec = mlog.recover(self._gen, salvage=salvage)
        try:
            self._replay(rec.ops)
        except BaseException:
            mlog.wal.close()
            raise
        n = sum(op_records(op) for op in rec.ops)
        if rec.ops:
            log.info("%s: replayed %d logged operation(s) (%d records) in %.3f s", root, len(rec.ops), n,
                     time.perf_counter() - t0)
        self._attempt_gen = self._gen
        self._log = mlog
        self._replayed = len(rec.ops)
        self._unsaved = n
        mlog.wal.ops = n
        if rec.needs_checkpoint or (self._durability == "none" and (rec.ops or rec.torn)):
            self.save()  # a salvaged or old segment is never appended to; "none" keeps no log
        if self._durability == "none":
            self._log.close()
            self._log = None
            for _, p in wal_segments(root, "memory"):  # every operation is in the commit now
                p.unlink()

    def verify(self) -> dict[str, Any]:
        """Check every file of this memory's committed directory completely: sha256 and size of each file
        in the manifest, every part of every segment file (CRC-32 and structure). Reads every byte once.

        Returns
        -------
        dict: ``files`` checked, ``bytes`` read, ``generation``.

        Raises
        ------
        MemoryFormatError
            The first damaged file, named.
        """
        if self._path is None:
            raise ValueError("this memory has no directory: nothing to verify")
        return persist.verify_dir(self._path, self.analyzer_config)

    @property
    def unsaved(self) -> int:
        """Records added, updated or deleted since the last :meth:`save` (or :meth:`open`)."""
        return self._unsaved

    def _release_lock(self, discard_unsaved: bool = True) -> None:
        if self._lock is not None:
            if self._unsaved and not discard_unsaved:
                self._warn_unsaved("closed")
            self._lock.__exit__(None, None, None)
            self._lock = None

    def close(self, discard_unsaved: bool = False) -> None:
        """Stop the background merges, sync and close the log, and release the directory's writer lock.

        Queued merges are dropped and a running one is abandoned (its result is
        never published; its segments stay as they are, so nothing is lost);
        this returns when no merge thread is left. A background checkpoint in
        progress is waited for. Afterwards every write and save raises
        :class:`~gpuir.memory.durable.MemoryClosedError`; searches and reads of
        the last snapshot still work. Closing twice does nothing.

        With a log (durability "fsync" or "flush") every acknowledged write is
        in the directory already; closing folds the log into a save (a
        checkpoint: if it fails, the next :meth:`open` replays the log). With durability "none", closing a memory bound to a directory
        while it holds unsaved writes warns (:class:`UnsavedWritesWarning`,
        naming the count; also logged): they are not in the directory. Pass
        ``discard_unsaved=True`` when that is meant.
        """
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
        self._stop_merges()
        t = self._ckpt_thread
        if t is not None:
            t.join()
        if self._log is not None and self._log.ops and self._log.failed is None:
            self._closed = False  # (the final checkpoint is this memory's own last write)
            try:
                self.save()  # fold the log, as SQLite checkpoints its WAL when the last connection closes
            except Exception as e:  # noqa: BLE001 - every write is in the log still: the next open replays it
                log.warning("closing %s: the final checkpoint failed (the log keeps every write): %s: %s",
                            self._path, type(e).__name__, e)
            finally:
                self._closed = True
        with self._save_lock, self._write_lock:
            if self._log is not None:
                self._log.close()
                self._log = None
                discard_unsaved = True  # every write is in the log
            self._release_lock(discard_unsaved)

    def _stop_merges(self) -> None:
        for task in self._merger.stop():
            self._merging.difference_update(task.uids)

    def _warn_unsaved(self, how: str) -> None:
        msg = (f"the memory at {self._path} was {how} with {self._unsaved} unsaved write(s) (records added, "
               "updated or deleted since the last save): they are not in the directory. Call save() to keep "
               "them, or close(discard_unsaved=True) to drop them knowingly")
        log.warning("%s", msg)
        warnings.warn(msg, UnsavedWritesWarning, stacklevel=3)

    def __enter__(self) -> Memory:  # noqa: PYI034
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Commit on a clean exit; on an exception, save nothing and warn with the count of unsaved writes.

        A memory without a directory (never saved, not opened) has nothing to commit.
        """
        if self._path is None or self._readonly:
            self.close()
            return
        if exc_type is None:
            try:
                if self._unsaved and not self._closed:
                    self.save()  # an error here propagates: the writes are not silently dropped
            finally:
                self.close(discard_unsaved=True)
            return
        if self._unsaved and self._log is None and not self._closed:
            self._warn_unsaved(f"left by {exc_type.__name__}")
        self.close(discard_unsaved=True)

    def __del__(self):  # pragma: no cover - best effort
        with contextlib.suppress(Exception):
            if self._log is not None:
                self._log.close()  # every write is in it
                self._log = None
            elif self._lock is not None and self._unsaved:
                self._warn_unsaved("garbage-collected")
            if not sys.is_finalizing():  # at exit the daemon merge threads may be frozen holding the merger's lock
                self._merger.stop(timeout=0)
            self._release_lock(discard_unsaved=True)

    @property
    def path(self) -> Path | None:
        return self._path



class PendingSave:
    """A save whose snapshot is taken (:meth:`Memory.begin_save`); :meth:`finish` writes and commits it."""

    def __init__(self, mem: Memory, root: Path, snap: Snapshot, gen: int, history: History, cur_name: str | None,
                 unsaved: int, state: dict[str, Any]):
        self.mem, self.root, self.snap, self.generation = mem, root, snap, gen
        self.history, self.cur_name, self.unsaved, self.state = history, cur_name, unsaved, state
        self.older: list[Path] = []  # the memory's log segments this save folds
        self._done = False

    def finish(self) -> Path:
        """Write the files and commit (outside the writer's lock); delete the log segments folded. Returns the
        directory. Raises what the save raised (nothing of the commit then: the next save retries)."""
        if self._done:
            raise RuntimeError("this save has finished already")
        self._done = True
        mem = self.mem
        try:
            try:
                mem._write_save(self.root, self.snap, self.generation, self.history, self.state, self.cur_name)
            except BaseException:
                mem._history.changed = True  # written again by the next save
                raise
            with mem._write_lock:
                mem._gen = self.generation
                mem._unsaved -= self.unsaved
                mem._history.adopt(self.history)
            if self.older and mem._log is not None:
                mem._log.drop(self.older)
            return self.root
        finally:
            mem._save_lock.release()


def warm_compiled_engine(memory: Memory | None = None, snapshot: Snapshot | None = None, query: str = "") -> None:
    """Load the compiled engine in this process: numba, then the functions a memory's searches call
    (from numba's cache), through searches of a tiny two-segment memory (:mod:`gpuir.memory.warmup`); then,
    given a ``memory`` and its ``snapshot``, search ``query`` there through the compiled engine, which makes
    each segment's compiled scorer and the snapshot's scan state (once per segment and process, and per
    snapshot: the first compiled search would otherwise pay them, 0.9 s for the 43 segments of 5M records)."""
    from ..backends import contract

    contract.first_bad_posting(np.zeros(2, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32), 0)
    m = Memory(partition_days=None)
    try:
        m.add([{"id": "w1", "text": "warm the compiled engine", "session": "s"},
               {"id": "w2", "text": "the engine loads once per process"}])
        m.add([{"id": "w3", "text": "searches wait for nothing"}, {"id": "w4", "text": "the engine again"}])
        for qs in (["engine"], ["compiled engine", "loads once"]):
            m.search(qs, k=2, backend="numba")
            m.search(qs, k=2, backend="numba", where={"session": "s"})
    finally:
        m.close()
    if memory is not None:  # (twice: a snapshot's second compiled search fills its weight caches)
        for _ in range(2):
            memory.search([query or "warm"], k=10, backend="numba", snapshot=snapshot)


def _vacuous_dropped(snap: Snapshot, wheres: list) -> list:
    """``wheres`` with None for each filter that every live record of ``snap`` passes
    (:meth:`~gpuir.memory.where.Where.passes_all`: then the search is the plain question's), decided once
    per snapshot and filter (only a filter of a tenant and an expiry can pass everything; such a filter is
    hashable by value)."""
    if all(w is None for w in wheres):
        return wheres
    seen: dict[int, bool] = {}
    out = []
    for w in wheres:
        if w is not None:
            v = seen.get(id(w))
            if v is None:
                if w.root is not None:
                    v = False
                elif w.expire is not None:  # decided at this instant: kept per snapshot, it would add an
                    v = w.passes_all(snap.views, snap.dicts)  # entry per millisecond searched (never freed)
                else:
                    v = snap.cached(("passes_all", w), lambda w=w: w.passes_all(snap.views, snap.dicts))
                seen[id(w)] = v
            if v:
                w = None
        out.append(w)
    return out


def _check_tenants(snap: Snapshot, wheres, vidx: np.ndarray, rows: np.ndarray) -> None:
    """Defence in depth: a search naming a tenant returns only that tenant's records."""
    for i, w in enumerate(wheres):
        if w is None or w.tenant is None:
            continue
        want = snap.dicts["tenant"].lookup(w.tenant)
        for v, r in zip(vidx[i].tolist(), rows[i].tolist()):
            if v >= 0 and (want < 0 or int(snap.views[v].seg.codes["tenant"][r]) != want):
                raise RuntimeError(f"internal error: a search confined to tenant {w.tenant!r} found another "
                                   "tenant's record; refusing to return it")
