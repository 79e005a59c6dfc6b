"""The index writer of a memory: one object owns everything a write changes (Lucene's ``IndexWriter``).

:class:`IndexWriter` holds the writer's lock and the state under it -- the live segments and their
partitions, the global statistics, the id map, the history, the durable log, the merges -- and
publishes each change as a new immutable :class:`~gpuir.memory.snapshot.Snapshot`, which
:class:`~gpuir.memory.searcher.SnapshotSearcher` reads; :class:`~gpuir.memory.store.Memory` is the
facade over the two. Its methods live in four modules by concern, all on this one object:

* here: the state, publishing a snapshot, adds, updates, deletes, the expiry purge, records' vectors;
* :mod:`gpuir.memory.writelog` (:class:`~gpuir.memory.writelog.WriteLog`): the durable log's glue --
  log before applying, take back, wait for the fsync, checkpoint in the background;
* :mod:`gpuir.memory.merging` (:class:`~gpuir.memory.merging.MergeScheduling`): the tiered merge policy
  and a merge's commit;
* :mod:`gpuir.memory.commit` (:class:`~gpuir.memory.commit.Commits`): save (the atomic commit) and close.
  Opening a directory (the commit loaded, the log replayed): :mod:`gpuir.memory.load`.

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
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis import Analyzer
from ..bm25 import BM25Params
from ..storage.dirlock import WriterLock
from . import scope, updates
from .builder import SegmentBuilder
from .columns import Interner
from .commit import Commits
from .docfreq import DfLog
from .durable import MemoryClosedError, MemoryLog, check_durability
from .embeddings import Embedding, VectorError, parse_embeddings
from .errors import ReadOnlyError, UnknownIdError
from .expiry import expired_rows, has_expiry, now_ms
from .export import check_config as check_export_config
from .export import read_export
from .history import History, canonical_entries
from .hybrid import DEFAULT_EMBEDDING, check_ranking
from .idmap import IdMap, locate
from .intake import canonical_records, fold_expiry, to_batch
from .merger import Merger
from .merging import MergeScheduling
from .partitions import partition_keys
from .records import MISSING_TIME, STRING_FIELDS, DuplicateIdError, RecordBatch, id_list, normalize_records
from .segments import SegView
from .snapshot import Snapshot
from .termorder import TermOrder
from .termstats import check_seqs
from .writelog import WriteLog

DAY_MS = 86_400_000

log = logging.getLogger("gpuir.memory")


def _rows_of_new(vectors: Mapping[str, Any] | None, ids: list[str], new: list[dict[str, Any]], what: str
                 ) -> dict[str, Any] | None:
    """``vectors`` given a row per record of a put (``ids``, in order), cut to the records it writes (``new``,
    in order: a record left as it was is not written, and its row is dropped)."""
    if vectors is None:
        return None
    if not isinstance(vectors, Mapping):
        raise VectorError(f"{what}: vectors must be a dict embedding name -> array (n, dim)")
    if len(new) == len(ids):
        return dict(vectors)
    row_of = {rid: i for i, rid in enumerate(ids)}
    rows = np.asarray([row_of[r["id"]] for r in new], dtype=np.int64)
    out = {}
    for name, a in vectors.items():
        a = np.asarray(a.get() if hasattr(a, "get") else a)
        if a.ndim != 2 or a.shape[0] != len(ids):
            raise VectorError(f"{what}: vectors of embedding {name!r} must have shape ({len(ids)}, dim), one row "
                              f"per record, got {a.shape}")
        out[name] = a[rows]
    return out


class IndexWriter(WriteLog, MergeScheduling, Commits):
    """A memory's writer: its state, the writer's lock (``_write_lock``, re-entrant) and the commit lock
    (``_commit_lock``: the current snapshot and the id map change together under it), and every change.

    Made by :class:`~gpuir.memory.store.Memory` with the memory's arguments (the same names, checked here);
    the public methods are the memory's writes, without the scope check (the facade's), documented there.
    Readers take the published snapshot, ``_snap``, and read nothing else of the writer but the id map
    (under the commit lock), the embeddings, the history and the settings.
    """

    def __init__(self, analyzer: Any = "default", method: str = "lucene", k1: float = 1.2, b: float = 0.75,
                 delta: float = 0.5, partition_days: float | None = 7.0, merge_factor: int = 8,
                 merge_min: int = 1024, history_limit: int = 10, background_merges: bool = True,
                 embeddings: Mapping[str, Any] | None = None, require_scope: bool = False,
                 record_times: bool = True, durability: str = "fsync", ranking: str = "bm25"):
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
        for v, rows in locate(views, seqs):
            out.update(zip(v.seg.seqs[rows].tolist(), v.seg.ids.take(rows).tolist()))
        return out

    def snapshot(self) -> Snapshot:
        """The current snapshot (what a search starting now sees)."""
        return self._snap

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

    # ------------------------------------------------------------------ writes
    def add(self, records: Iterable[Mapping[str, Any]], time_unit: str | None = None,
            vectors: Mapping[str, Any] | None = None, seqs: Sequence[int] | np.ndarray | None = None) -> int:
        """Add new records (an iterable of dicts; see :mod:`gpuir.memory.records`).

        See :meth:`gpuir.memory.Memory.add`.
        """
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
               time_unit: str | None = None, seqs: Sequence[int] | np.ndarray | None = None,
               vectors: Mapping[str, Any] | None = None) -> int:
        """Change existing records (matched by id), keeping what the records given do not name; atomic.

        See :meth:`gpuir.memory.Memory.update`.
        """
        return self._write(records, replace, time_unit, "update", seqs, vectors)

    def replace(self, records: Iterable[Mapping[str, Any]], time_unit: str | None = None) -> int:
        """Replace existing records (matched by id) by the records given, whole; atomic. See :meth:`update`."""
        return self._write(records, True, time_unit, "replace")

    def upsert(self, records: Iterable[Mapping[str, Any]], replace: bool = False,
               time_unit: str | None = None, seqs: Sequence[int] | np.ndarray | None = None,
               vectors: Mapping[str, Any] | None = None) -> int:
        """Update the records whose ids exist (merging, or replacing with ``replace``) and add the others; atomic.

        See :meth:`gpuir.memory.Memory.upsert`.
        """
        return self._write(records, replace, time_unit, "upsert", seqs, vectors)

    def _write(self, records: Any, replace: bool, time_unit: str | None, what: str,
               seqs: Sequence[int] | np.ndarray | None = None, vectors: Mapping[str, Any] | None = None) -> int:
        token = None
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
            vectors = _rows_of_new(vectors, ids, new, what)
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
            located = locate(list(self._views.values()), np.asarray(sorted(dest_of), dtype=np.int64))
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
        for v, rows in locate(snap.views, np.asarray(sorted(seqs), dtype=np.int64)):
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

    def delete(self, ids: Iterable[str], missing_ok: bool = False, keep_history: bool = True) -> int:
        """Delete records by id (tombstones, purged by later merges); by ``where``: the facade's
        (:func:`gpuir.memory.bulk.delete_where`, which deletes the ids it finds through the memory's delete).

        See :meth:`gpuir.memory.Memory.delete`.
        """
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

    def _remove(self, seq_list: Sequence[int]) -> set:
        """Tombstone the live records with these sequence numbers (no publish); returns the partitions touched."""
        seqs = np.sort(np.asarray(seq_list, dtype=np.int64))
        touched = set()
        for v, rows in locate(list(self._views.values()), seqs):
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

    def import_(self, path: str | os.PathLike, vectors: dict | None = None, replace: bool = False,
                check_config: bool = True) -> int:
        """Add the records of an export file (:meth:`export`), all or none, and their histories.

        See :meth:`gpuir.memory.Memory.import_`.
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

    @property
    def stamp(self) -> str:
        """How this memory's adds are stamped before they are applied (:func:`~gpuir.memory.intake.to_batch`'s
        ``stamp``): "add" (ids and times) with ``record_times``, else "id"."""
        return "add" if self._record_times else "id"

    @property
    def embeddings(self) -> dict[str, dict[str, Any]]:
        """The memory's named embeddings: name -> {"dim", "dtype", "model", "encoder" (whether one is attached)}."""
        return {n: {**e.to_dict(), "encoder": e.encoder is not None} for n, e in self._emb.items()}

    def add_embedding(self, name: str, encoder: Any = None, dtype: str = "float32") -> int:
        """Add a named embedding (or attach an encoder to an existing one).

        See :meth:`gpuir.memory.Memory.add_embedding`.
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

    @property
    def unsaved(self) -> int:
        """Records added, updated or deleted since the last :meth:`save` (or :meth:`open`)."""
        return self._unsaved

    @property
    def path(self) -> Path | None:
        return self._path
