"""What the channels need to know about a memory's records, kept in step with it.

:class:`Catalog` follows a :class:`~gpuir.memory.Memory` by snapshot version:
on :meth:`Catalog.sync` it reads only the records added since the last sync
(the rows past the largest sequence number it has seen: sequence numbers only
grow and each segment's are ascending, so nothing re-reads or re-sorts every
live record), and forgets deleted ones (found with one NumPy membership test,
only when the live count says some held record is gone), maps each record to its session, numbers sessions
in order of first appearance, and keeps a second memory of **session
documents** (a session's record texts, in add order, joined by newlines) for
the ``bm25_session`` channel, rewriting only the sessions that changed.

A record without a ``session`` is a session of its own, named by its id.

With an ``analyzer`` other than the memory's, or with vocabulary enrichment
(``enrich``), the catalog also keeps a **record index**: a memory of the same
records (every field, so ``where`` filters work unchanged) analysed with it, and
with ``enrich`` each text replaced by ``enrich_text(text)``
(:mod:`gpuir.retrieve.enrich`), for the record BM25 channels. The session
documents are enriched too (they are lexical); :attr:`Catalog.text_of` keeps the
raw texts, which the embeddings and the hits use.

It also keeps what the temporal, entity and type-filter channels need: each
record's time (:attr:`time_of_seq`), speaker (``metadata.speaker``), type (its
``type`` field, else ``record_type(text)`` when ``with_types``), and each
session's start time (the earliest time of its records).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np

from ..memory import Memory
from ..memory.expiry import cutoff
from ..memory.records import MISSING_TIME
from ..memory.where import compile_wheres

__all__ = ["Catalog"]


class Catalog:
    """Record -> session maps and the session-document memory of one memory.

    Attributes
    ----------
    seq_session : ndarray, shape (max seq + 1,), int64
        Session number of each record sequence number (-1: not live / unknown).
    session_names : list of str
        Session id of each session number (first appearance order).
    """

    def __init__(self, memory: Memory, with_sessions: bool = True, analyzer: Any = None, enrich: str | None = None,
                 with_types: bool = False):
        from ..analysis import Analyzer

        self.memory = memory
        self.with_sessions = with_sessions
        self.enrich = enrich
        self.with_types = with_types
        self._enrich_fn = None
        if enrich is not None:
            from .enrich import enrich_text

            self._enrich_fn = lambda t: enrich_text(t, enrich)
        self._record_type = None
        if with_types:
            from .query_types import record_type

            self._record_type = record_type
        self.analyzer_config = memory.analyzer_config if analyzer is None else Analyzer(analyzer).config
        own = self.analyzer_config == memory.analyzer_config and enrich is None
        #: the memory the record BM25 channels search (the memory itself, or a copy with the analyzer)
        self.records: Memory = memory if own else self._new_memory()
        self.version = -1
        self.seq_session = np.full(0, -1, dtype=np.int64)
        self.session_names: list[str] = []
        self.session_num: dict[str, int] = {}
        self.seq_of: dict[str, int] = {}  # live record id -> seq
        self.id_of_seq: dict[int, str] = {}
        self.text_of: dict[str, str] = {}
        self.session_of: dict[str, str] = {}
        self.members: dict[str, dict[int, str]] = {}  # session -> {seq: record id}
        self.tenant_of: dict[str, str | None] = {}
        #: epoch ms of each record sequence number (MISSING_TIME: none / not live)
        self.time_of_seq = np.full(0, MISSING_TIME, dtype=np.int64)
        self.session_start: dict[str, int] = {}  # session -> earliest record time (sessions with a time)
        self.speaker_of: dict[str, str | None] = {}  # record id -> metadata.speaker
        self.type_of: dict[str, str] = {}  # record id -> type (with_types)
        self.sessions: Memory | None = None
        self._lock = threading.Lock()
        self.added: list[str] = []  # ids added by the last sync (for the embeddings)
        self.removed: list[str] = []
        self.removed_seqs: list[int] = []  # their sequence numbers (for the entity graph)
        # record index seq -> memory seq (the index numbers its records in add order, as every memory does)
        self._mem_seq_of_index = np.full(0, -1, dtype=np.int64)
        self._index_next = 0
        self._max_seq = -1  # the largest sequence number read so far

    # ------------------------------------------------------------------ sync
    def sync(self):
        """Catch up with the memory's current snapshot; returns that snapshot."""
        with self._lock:
            snap = self.memory.snapshot()
            if snap.version == self.version:
                self.added, self.removed, self.removed_seqs = [], [], []
                return snap
            new = self._new_records(snap)
            n_gone = len(self.seq_of) + len(new) - len(snap)  # held records no longer live
            removed: list[str] = []
            if n_gone > 0:  # only then are the held records checked against the live ones (NumPy, no sort)
                live_seqs = np.concatenate([v.seg.seqs[v.live_rows()] for v in snap.views] or
                                           [np.zeros(0, np.int64)])
                held = np.fromiter(self.seq_of.values(), np.int64, len(self.seq_of))
                gone = set(held[~np.isin(held, live_seqs)].tolist())
                removed = [rid for rid, s in self.seq_of.items() if s in gone]
            if removed and self.records is not self.memory:
                self.records.delete(removed)
            touched: set[str] = set()
            removed_seq_list = [self.seq_of[rid] for rid in removed]
            for rid in removed:
                s = self.seq_of.pop(rid)
                self.id_of_seq.pop(s, None)
                sess = self.session_of.pop(rid)
                self.text_of.pop(rid, None)
                self.members[sess].pop(s, None)
                self.seq_session[s] = -1
                self.time_of_seq[s] = MISSING_TIME
                self.speaker_of.pop(rid, None)
                self.type_of.pop(rid, None)
                touched.add(sess)
            added, copies = [], []
            top = new[-1][0] + 1 if new else 0
            if top > self.seq_session.size:
                grown = np.full(max(top, 2 * self.seq_session.size), -1, dtype=np.int64)
                grown[: self.seq_session.size] = self.seq_session
                self.seq_session = grown
                times = np.full(grown.size, MISSING_TIME, dtype=np.int64)
                times[: self.time_of_seq.size] = self.time_of_seq
                self.time_of_seq = times
            if new:
                self._max_seq = max(self._max_seq, new[-1][0])
            for s, vi, row in new:
                if s in self.id_of_seq:
                    continue
                rec = snap.record(vi, row)
                rid = rec["id"]
                sess = rec.get("session") or rid
                if sess not in self.session_num:
                    self.session_num[sess] = len(self.session_names)
                    self.session_names.append(sess)
                    self.members[sess] = {}
                    self.tenant_of[sess] = rec.get("tenant")
                elif self.tenant_of.get(sess) != rec.get("tenant"):
                    self.tenant_of[sess] = None  # mixed tenants: the session document has no tenant
                self.seq_of[rid] = s
                self.id_of_seq[s] = rid
                self.text_of[rid] = rec["text"]
                self.session_of[rid] = sess
                self.members[sess][s] = rid
                self.seq_session[s] = self.session_num[sess]
                t = rec.get("time")
                if t is not None and t != MISSING_TIME:
                    self.time_of_seq[s] = t
                    if sess not in self.session_start or t < self.session_start[sess]:
                        self.session_start[sess] = t
                meta = rec.get("metadata")
                self.speaker_of[rid] = meta.get("speaker") if isinstance(meta, dict) else None
                if self._record_type is not None:
                    self.type_of[rid] = rec.get("type") or self._record_type(rec["text"])
                touched.add(sess)
                added.append(rid)
                if self.records is not self.memory:
                    copies.append(rec if self._enrich_fn is None else {**rec, "text": self._enrich_fn(rec["text"])})
            if copies:
                self.records.add(copies, time_unit="ms")  # read back from the memory: times in epoch ms
                end = self._index_next + len(copies)
                if end > self._mem_seq_of_index.size:
                    grown = np.full(max(end, 2 * self._mem_seq_of_index.size), -1, dtype=np.int64)
                    grown[: self._mem_seq_of_index.size] = self._mem_seq_of_index
                    self._mem_seq_of_index = grown
                self._mem_seq_of_index[self._index_next: end] = [self.seq_of[c["id"]] for c in copies]
                self._index_next = end
            if self.with_sessions:
                self._rewrite_sessions(touched)
            self.removed_seqs = [int(s) for s in removed_seq_list]
            self.added, self.removed = added, removed
            self.version = snap.version
            return snap

    def _new_records(self, snap) -> list[tuple[int, int, int]]:
        """(seq, view position, row) of the live records added since the last sync, in add order.

        Sequence numbers only grow and each segment's are ascending, so only the
        rows past the largest sequence number seen are read (never every live record).
        """
        out: list[tuple[int, int, int]] = []
        for vi, v in enumerate(snap.views):
            seqs = v.seg.seqs
            start = int(np.searchsorted(seqs, self._max_seq, side="right"))
            if start >= seqs.size:
                continue
            rows = np.arange(start, seqs.size, dtype=np.int64)
            if v.live is not None:
                rows = rows[v.live[rows]]
            out.extend(zip(seqs[rows].tolist(), [vi] * rows.size, rows.tolist()))
        out.sort()
        return out

    def keep_sessions(self) -> None:
        """Keep the session-document memory (the ``bm25_session`` channel asks for it); idempotent."""
        with self._lock:
            if self.with_sessions:
                return
            self.with_sessions = True
            if self.members:  # already synced: write every session now
                self._rewrite_sessions(set(self.members))

    def _new_memory(self) -> Memory:
        p = self.memory.params
        return Memory(analyzer=self.analyzer_config, method=p.method, k1=p.k1, b=p.b, delta=p.delta,
                      partition_days=None)

    def record_seqs(self, res) -> np.ndarray:
        """Memory sequence numbers of a search of :attr:`records` (``(B, k)`` int64, -1 pads)."""
        seqs = res.seqs.astype(np.int64)
        if self.records is self.memory:
            return seqs
        return np.where(seqs >= 0, self._mem_seq_of_index[np.maximum(seqs, 0)], -1)

    def _rewrite_sessions(self, touched: set[str]) -> None:
        if self.sessions is None:
            self.sessions = self._new_memory()
        old = [s for s in touched if s in self.sessions]
        if old:
            self.sessions.delete(old)
        docs = []
        for sess in sorted(touched, key=self.session_num.__getitem__):
            mem = self.members.get(sess)
            if not mem:
                continue
            lexical = self._enrich_fn or (lambda t: t)
            text = "\n".join(lexical(self.text_of[mem[s]]) for s in sorted(mem))
            doc: dict[str, Any] = {"id": sess, "text": text}
            if self.tenant_of.get(sess) is not None:
                doc["tenant"] = self.tenant_of[sess]
            docs.append(doc)
        if docs:
            self.sessions.add(docs)

    def session_times(self, tenant: str | None, before_ms: int | None = None) -> list[int]:
        """Sorted start times (epoch ms) of the sessions of ``tenant`` (None: every session).

        A session's start is its earliest record time; sessions without times are
        left out, and with ``before_ms`` only sessions that started before it are kept.
        """
        out = [t for s, t in self.session_start.items()
               if (tenant is None or self.tenant_of.get(s) == tenant) and self.members.get(s)
               and (before_ms is None or t < before_ms)]
        return sorted(out)

    # ------------------------------------------------------------------ filters
    def allowed_seqs(self, snap, where: Any, n_queries: int) -> list[np.ndarray | None]:
        """Sequence numbers of the live records each query's ``where`` allows (None: all).

        Uses the memory's own compiled filters (:mod:`gpuir.memory.where`), so
        every channel filters exactly as :meth:`Memory.search` does.
        """
        if isinstance(where, list):
            if len(where) != n_queries:
                compile_wheres(where, n_queries, snap.dicts)  # raises the memory's own message
            per = where
        else:
            per = [where] * n_queries
        out: list[np.ndarray | None] = []
        cache: dict[str, np.ndarray | None] = {}  # one mask per distinct filter (e.g. per tenant)
        expire = cutoff(snap)  # records past their expires_at are hidden from every channel
        for raw in per:
            key = json.dumps(raw, sort_keys=True, default=repr)
            if key not in cache:
                w = compile_wheres(raw, 1, snap.dicts, expire=expire)[0]
                if w is None:
                    cache[key] = None
                else:
                    parts = [v.seg.seqs[w.mask(v, snap.dicts)] for v in snap.views]
                    cache[key] = np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
            out.append(cache[key])
        return out

    def session_wheres(self, snap, where: Any, n_queries: int) -> Any:
        """The ``where`` of the session-document memory matching a record ``where``.

        A session passes when any of its records passes. ``None`` and a
        tenant-only filter carry over as they are; otherwise the sessions are
        listed by id (a query whose filter allows no record gets ``False``).
        """
        if where is None:
            return None
        per = where if isinstance(where, list) else [where] * n_queries
        if all(w is None or (isinstance(w, dict) and set(w) <= {"tenant"}) for w in per):
            return where
        allowed = self.allowed_seqs(snap, where, n_queries)
        out: list[Any] = []
        for w, a in zip(per, allowed):
            if a is None:
                out.append(None)
                continue
            nums = np.unique(self.seq_session[a])
            nums = nums[nums >= 0]
            if nums.size == 0:
                out.append(False)
                continue
            cond: dict[str, Any] = {"id": {"in": [self.session_names[j] for j in nums.tolist()]}}
            if isinstance(w, dict) and "tenant" in w:
                cond["tenant"] = w["tenant"]
            out.append(cond)
        return out
