"""`Memory`: an agent memory that grows while serving, with exact global BM25.

:class:`Memory` is a facade over Lucene's split: an index writer
(:class:`~gpuir.memory.writer.IndexWriter`: the writer's lock and state, adds, updates, deletes, the
durable log, merges, saves; it publishes each change as a new immutable
:class:`~gpuir.memory.snapshot.Snapshot`) and a snapshot searcher
(:class:`~gpuir.memory.searcher.SnapshotSearcher`: search, vectors, get, list, count, history, on one
snapshot). Each public method checks the scope (:mod:`gpuir.memory.scope`) and hands its arguments to one
of the two; opening a directory: :mod:`gpuir.memory.load`. Writes, merges and saves:
:mod:`gpuir.memory.writer`.

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

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..bm25 import BM25Params
from . import bulk, listing, scope
from .commit import PendingSave
from .embeddings import Embedding
from .errors import ReadOnlyError, UnknownIdError, UnsavedWritesWarning
from .export import read_export
from .load import open_memory
from .search import MemoryResults
from .searcher import SnapshotSearcher, warm_compiled_engine
from .snapshot import Snapshot
from .termstats import TermStats
from .writer import IndexWriter

__all__ = ["Memory", "PendingSave", "ReadOnlyError", "UnknownIdError", "UnsavedWritesWarning", "warm_compiled_engine"]


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
        Keep each record's ``created_at`` and ``updated_at`` (:mod:`gpuir.memory.stamps`; default True):
        returned with hits, ``get`` and ``list``, usable in ``where`` and ``list(order_by=...)``. Saved
        with the memory; a directory saved without the setting (before it was the default) opens with
        False, as it was saved, and stamps none of its new writes either. (A record added without an id
        gets a UUIDv7 either way.)
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
                 record_times: bool = True, durability: str = "fsync", ranking: str = "bm25"):
        self._writer = IndexWriter(
            analyzer=analyzer, method=method, k1=k1, b=b, delta=delta, partition_days=partition_days,
            merge_factor=merge_factor, merge_min=merge_min, history_limit=history_limit,
            background_merges=background_merges, embeddings=embeddings, require_scope=require_scope,
            record_times=record_times, durability=durability, ranking=ranking)
        self._searcher = SnapshotSearcher(self._writer)
        #: The writer's re-entrant lock, which every write takes (a scope's check-then-write is one step: the
        #: protocol's ``_write_lock``, :class:`gpuir.memory.scope.Scope`).
        self._write_lock = self._writer._write_lock
        self._guard_scope = require_scope  # unscoped reads and writes refused, unless a caller that confines
        # every request lifted it (allow_unscoped)

    # ------------------------------------------------------------------ settings (the writer's)
    @property
    def params(self) -> BM25Params:
        """The BM25 variant and parameters."""
        return self._writer.params

    @property
    def analyzer_config(self) -> dict[str, Any]:
        """The analyzer's settings (what :class:`~gpuir.analysis.Analyzer` is made from)."""
        return self._writer.analyzer_config

    @property
    def window_ms(self) -> int | None:
        """Width of the time partitions in ms (None: no time partitions)."""
        return self._writer.window_ms

    @window_ms.setter
    def window_ms(self, value: int | None) -> None:  # (before the first add: a memory made to match another)
        self._writer.window_ms = value

    @property
    def merge_factor(self) -> int:
        """Segments of one size tier that trigger a merge."""
        return self._writer.merge_factor

    @property
    def merge_min(self) -> int:
        """Live records up to which a segment is in the smallest tier."""
        return self._writer.merge_min

    @property
    def merge_log(self) -> list[tuple[int, float]]:
        """(records merged, seconds) of every merge, for benchmarks (background merges do not pause the writer)."""
        return self._writer.merge_log

    # ------------------------------------------------------------------ state
    def config(self) -> dict[str, Any]:
        """The settings fixed at creation (saved in the manifest)."""
        return self._writer.config()

    def snapshot(self) -> Snapshot:
        """The current snapshot (what a search starting now sees)."""
        return self._writer._snap

    def __len__(self) -> int:
        return self._writer._snap.n_docs

    def len(self) -> int:
        """Number of live records."""
        return len(self)

    def __repr__(self) -> str:
        s = self._writer._snap
        path = self._writer._path
        return (f"Memory(records={s.n_docs}, segments={len(s.views)}, partitions={len(s.partitions)}, "
                f"{self.params}, path={str(path) if path else None})")

    def __contains__(self, rid: object) -> bool:
        return self._searcher.contains(rid)

    @property
    def next_seq(self) -> int:
        """The sequence number the next added record gets (one more than the last one used)."""
        return self._writer._next_seq

    @property
    def durability(self) -> str:
        """What a write has done when it returns (see :mod:`gpuir.memory.durable`)."""
        return self._writer._durability

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
        return self._writer.add(records, time_unit, vectors, seqs)

    def update(self, records: Iterable[Mapping[str, Any]], replace: bool = False,
               time_unit: str | None = None, seqs: Sequence[int] | np.ndarray | None = None,
               vectors: Mapping[str, Any] | None = None) -> int:
        """Change existing records (matched by id), keeping what the records given do not name; atomic.

        Each record given is an ``id`` and the fields to change: fields given
        replace the stored ones, a field given as None is removed, ``metadata``
        merges key by key (a key given as None is removed), everything else is
        kept (:mod:`gpuir.memory.updates`). ``replace=True`` replaces whole
        records instead (as :meth:`replace`). The versions replaced are kept in
        the record's history (:meth:`history`). ``seqs``: the sequence numbers
        of the records given, as in :meth:`add` (a record left as it was uses none).
        ``vectors``: the new versions' vectors of named embeddings, as in
        :meth:`add` (a row per record given, in order; a record left as it was
        ignores its row); without them a changed text is encoded by the
        embedding's encoder and an unchanged one keeps its stored vector.

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
        if self._guard_scope:
            scope.require("update")
        return self._writer.update(records, replace, time_unit, seqs, vectors)

    def replace(self, records: Iterable[Mapping[str, Any]], time_unit: str | None = None) -> int:
        """Replace existing records (matched by id) by the records given, whole; atomic. See :meth:`update`."""
        if self._guard_scope:
            scope.require("replace")
        return self._writer.replace(records, time_unit)

    def upsert(self, records: Iterable[Mapping[str, Any]], replace: bool = False,
               time_unit: str | None = None, seqs: Sequence[int] | np.ndarray | None = None,
               vectors: Mapping[str, Any] | None = None) -> int:
        """Update the records whose ids exist (merging, or replacing with ``replace``) and add the others; atomic.

        ``seqs`` and ``vectors``: the sequence numbers and the vectors of the records given, as in :meth:`update`.

        Returns
        -------
        int: the number of records added or changed (one left as it was counts 0).
        """
        if self._guard_scope:
            scope.require("upsert")
        return self._writer.upsert(records, replace, time_unit, seqs, vectors)

    def stored(self, ids: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
        """(ids, their records as stored) of live ids: the canonical form of :mod:`gpuir.memory.intake`
        (``time`` and ``expires_at`` as int epoch ms), read from the current snapshot; for writers that
        merge (the service). Raises KeyError for an id that is not live."""
        return self._writer.stored(ids)

    def purge_expired(self) -> int:
        """Delete every record whose ``expires_at`` has passed (every write does it first); returns how many."""
        return self._writer.purge_expired()

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
        return self._writer.delete(ids, missing_ok, keep_history)

    # ------------------------------------------------------------------ merges
    def wait_merges(self, timeout: float | None = None) -> bool:
        """Wait until no background merge is queued or running (a merge may schedule the next).

        Returns
        -------
        bool: False when ``timeout`` seconds passed first.
        """
        return self._writer.wait_merges(timeout)

    def merge_status(self) -> dict[str, Any]:
        """Background merges: queued or running, threads, done, failed (with messages)."""
        return self._writer.merge_status()

    def merge(self, partition: Any = "all") -> int:
        """Merge on demand: each partition (or the one named) into one segment, tombstones purged.

        Waits for the background merges first (and holds back new ones meanwhile).

        Returns
        -------
        int: the number of merges done.
        """
        return self._writer.merge(partition)

    def match_ids(self, where: Any = None, time_unit: str | None = None) -> list[str]:
        """The ids of the live records passing ``where`` (all without one), in add order: what
        ``delete(where=where)`` would delete now."""
        if self._guard_scope:
            scope.require("match_ids")
        return self._searcher.match_ids(where, time_unit)

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
        if self._writer._log is not None:
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
        return self._writer.stamp

    @property
    def require_scope(self) -> bool:
        """Whether unscoped reads and writes of records are refused (see :class:`Memory`)."""
        return self._writer._require_scope

    def allow_unscoped(self, allow: bool = True) -> None:
        """Let unscoped reads and writes through in this process, although the memory was made with
        ``require_scope=True`` (the setting saved stays): for a server that confines every request to
        its tenant itself, as the service does (:mod:`gpuir.service.store`)."""
        self._guard_scope = self._writer._require_scope and not allow

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
        return self._searcher.get(ids, missing_ok)

    def seqs_of(self, ids: Iterable[str], snapshot: Snapshot | None = None) -> list[int | None]:
        """The sequence number of each id, in the order given (None: no live record of ``snapshot`` has it).

        Parameters
        ----------
        ids : iterable of str
        snapshot : Snapshot, optional
            The state asked about (default: the current one); an id added, deleted or
            updated since a given snapshot reads as it reads now, then is checked live there.
        """
        return self._searcher.seqs_of(ids, snapshot)

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
        return self._searcher.list(where, order_by, descending, limit, cursor, time_unit)

    def count(self, where: Any = None, time_unit: str | None = None) -> int:
        """The number of records passing ``where`` (expired records excluded)."""
        if self._guard_scope:
            scope.require("count")
        return self._searcher.count(where, time_unit)

    def history(self, id: str) -> list[dict[str, Any]]:
        """The earlier versions of record ``id``, oldest first, as record dicts ([] when none; see
        :mod:`gpuir.memory.history`). The current version is :meth:`get`'s."""
        if self._guard_scope:
            scope.require("history")
        return self._searcher.history(id)

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
        return self._searcher.export(path, where, vectors, history, time_unit)

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
        return self._writer.import_(path, vectors, replace, check_config)

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
        return self._searcher.search(queries, k, where, backend, mode, max_partitions, epsilon, decay, snapshot,
                                     min_score, ties, order_by, time_unit, stats, ranking)

    def term_stats(self, queries: str | Sequence[str]) -> TermStats:
        """This memory's live N, total length and the df of the queries' analysed terms (a shard's report)."""
        return self._searcher.term_stats(queries)

    # ------------------------------------------------------------------ dense vectors
    @property
    def embeddings(self) -> dict[str, dict[str, Any]]:
        """The memory's named embeddings: name -> {"dim", "dtype", "model", "encoder" (whether one is attached)}."""
        return self._writer.embeddings

    def embedding(self, name: str | None = None) -> Embedding:
        """One named embedding of the memory: what encodes its records and text queries.

        The memory's own object (not a copy): an encoder attached later with
        :meth:`add_embedding` is the one it uses. A writer that keeps a second
        index of the same records (the service's per-tenant search memories)
        encodes through it, so that its vectors are exactly the memory's.

        Parameters
        ----------
        name : str, optional
            Which named embedding (default: the memory's only one).

        Returns
        -------
        gpuir.memory.embeddings.Embedding
            With ``name``, ``dim``, ``dtype`` and ``model``; ``encode(texts, what)`` gives passage
            vectors as the memory stores them ((n, dim), normalised, the storage dtype) and
            ``encode_queries(queries)`` query vectors as its searches use them ((B, dim) float32,
            normalised). Both load the recorded encoder (offline) when none is attached, and raise
            :class:`~gpuir.memory.embeddings.VectorError` when there is none.

        Raises
        ------
        VectorError
            The memory stores no vectors, has several and ``name`` is None, or has no embedding ``name``.

        Examples
        --------
        >>> m = Memory(embeddings={"bag": lambda texts: [[1.0, float(len(t))] for t in texts]})
        >>> emb = m.embedding()
        >>> emb.name, emb.encode(["four"], "example").shape
        ('bag', (1, 2))
        """
        return self._searcher.embedding(name)

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
        return self._writer.add_embedding(name, encoder, dtype)

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
        return self._searcher.search_vectors(queries, k, where, embedding, backend, method, snapshot, time_unit)

    def vectors(self, ids: Iterable[str], embedding: str | None = None) -> np.ndarray:
        """The stored vectors of live records: ndarray (len(ids), dim), the embedding's dtype, host.

        Raises
        ------
        UnknownIdError
            An id naming no live record.
        """
        if self._guard_scope:
            scope.require("vectors")
        return self._searcher.vectors(ids, embedding)

    # ------------------------------------------------------------------ info
    def info(self) -> dict[str, Any]:
        """Counts for people: records, tenants, segments, partitions, time span, deletions, settings."""
        return self._searcher.info()

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
        return self._writer.save(path, lock_timeout)

    def begin_save(self, path: str | os.PathLike | None = None, lock_timeout: float = 10.0,
                   on_snapshot: Any = None) -> PendingSave:
        """The first half of :meth:`save`, for a writer that keeps a log of its own (a shard, the service):
        under the writer's lock, take the snapshot to save and start the memory's next log segment, and
        call ``on_snapshot(generation)`` there (e.g. to rotate the caller's own log). Returns a
        :class:`PendingSave` whose ``finish()`` writes the files and commits, outside the writer's lock
        (writes go on meanwhile); no other save starts before it finishes. The arguments and errors are
        :meth:`save`'s."""
        return self._writer.begin_save(path, lock_timeout, on_snapshot)

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
        return open_memory(cls, path, writer, verify, lock_timeout, background_merges, embeddings, durability,
                           salvage)

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
        return self._writer.verify()

    @property
    def unsaved(self) -> int:
        """Records added, updated or deleted since the last :meth:`save` (or :meth:`open`)."""
        return self._writer._unsaved

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
        self._writer.close(discard_unsaved)

    def __enter__(self) -> Memory:  # noqa: PYI034
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Commit on a clean exit; on an exception, save nothing and warn with the count of unsaved writes.

        A memory without a directory (never saved, not opened) has nothing to commit.
        """
        w = self._writer
        if w._path is None or w._readonly:
            self.close()
            return
        if exc_type is None:
            try:
                if w._unsaved and not w._closed:
                    self.save()  # an error here propagates: the writes are not silently dropped
            finally:
                self.close(discard_unsaved=True)
            return
        if w._unsaved and w._log is None and not w._closed:
            w._warn_unsaved(f"left by {exc_type.__name__}")
        self.close(discard_unsaved=True)

    @property
    def path(self) -> Path | None:
        return self._writer._path
