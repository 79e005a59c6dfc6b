"""What the channels need to know about a memory's records beyond its own columns, kept in step with it.

:class:`Catalog` follows a :class:`~gpuir.memory.Memory` by snapshot version
and holds **no copy of the records**: ids, texts, times, speakers, tenants and
sessions are read from the snapshot's own columns
(:meth:`Snapshot.strings <gpuir.memory.snapshot.Snapshot.strings>`,
:meth:`Snapshot.times <gpuir.memory.snapshot.Snapshot.times>`: one binary search
per segment for many records at once) when a channel or a hit needs them. What
it keeps is what the memory does not hold:

* the **session numbering**: sessions numbered in order of first appearance
  (:attr:`Catalog.session_names`, :attr:`Catalog.session_num`), each record's
  session number (:attr:`Catalog.seq_session`, a NumPy array by sequence
  number, -1 where no live record), and per session its live records' sequence
  numbers, its start (the earliest time of its records) and its tenant;
* the **session documents** (a session's record texts, in add order, joined by
  newlines) in a second memory for the ``bm25_session`` channel, rewriting only
  the sessions that changed;
* with an ``analyzer`` other than the memory's, or with vocabulary enrichment
  (``enrich``), a **record index**: a memory of the same records (every field, so
  ``where`` filters work unchanged) analysed with it, with ``enrich`` each text
  replaced by ``enrich_text(text)`` (:mod:`gpuir.retrieve.enrich`), for the record
  BM25 channels (the session documents are enriched too; hits and embeddings use
  the memory's raw texts);
* with ``with_types``, each record's type (its ``type`` field, else
  ``record_type(text)``) as a small code by sequence number, computed once when
  the record is read.

A record without a ``session`` is a session of its own, named by its id.

On :meth:`Catalog.sync` it reads only the records added since the last sync (the
rows past the largest sequence number it has seen: sequence numbers only grow
and each segment's are ascending), and finds deleted ones only in the segments
whose view changed since the previous snapshot (a deletion or a merge makes a
new view; an unchanged view has lost nothing), so nothing re-reads or re-sorts
every live record on a version change. An update is a deletion and an addition
(a new sequence number), so a changed text or time is read from the memory like
any new record.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..memory import Memory
from ..memory.expiry import cutoff
from ..memory.records import MISSING_TIME
from ..memory.where import compile_wheres

__all__ = ["Catalog"]

_E64 = np.zeros(0, np.int64)


class Catalog:
    """Session numbering and session documents of one memory (its records are read from its snapshots).

    Attributes
    ----------
    snapshot : Snapshot or None
        The memory's snapshot of the last :meth:`sync` (what the record views below read).
    seq_session : ndarray, shape (>= max seq + 1,), int64, host
        Session number of each record sequence number (-1: no live record).
    session_names : list of str
        Session id of each session number (first appearance order).
    session_num : dict str -> int
        Session number of each session id.
    seq_of, id_of_seq, text_of, session_of, speaker_of, type_of, members : read-only mappings
        Views of the last synced snapshot (nothing copied): id -> sequence number,
        sequence number -> id, id -> text, id -> session, id -> ``metadata.speaker``,
        id -> type (``with_types``), session -> its records' sequence numbers (add order).
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
        self.snapshot = None
        self.seq_session = np.full(0, -1, dtype=np.int64)
        self.session_names: list[str] = []
        self.session_num: dict[str, int] = {}
        # per session number: live member sequence numbers (ascending), tenant (None: none or mixed), start
        self._members: list[np.ndarray] = []
        self._tenant: list[str | None] = []
        self._start: list[int] = []  # earliest record time, MISSING_TIME: none
        self._n_held = 0
        # record types (with_types): a code per sequence number (-1: none), and the names of the codes
        self._type_code = np.full(0, -1, dtype=np.int16)
        self._type_names: list[str] = []
        self.sessions: Memory | None = None
        self._lock = threading.Lock()
        self.added: list[str] = []  # ids added by the last sync (for the channels' own state)
        self.added_seqs: list[int] = []  # their sequence numbers
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
                self.added, self.added_seqs, self.removed, self.removed_seqs = [], [], [], []
                return snap
            prev = self.snapshot
            new = self._new_seqs(snap)
            gone = _E64
            if prev is not None and self._n_held + new.size > snap.n_docs:  # some held record is gone
                gone = self._gone_seqs(prev, snap)
            removed = prev.strings("id", gone) if gone.size else []
            if removed and self.records is not self.memory:
                self.records.delete(removed)
            shrunk = np.unique(self.seq_session[gone]) if gone.size else _E64
            self.seq_session[gone] = -1
            if self._type_code.size:
                self._type_code[gone[gone < self._type_code.size]] = -1
            for num in shrunk.tolist():
                self._members[num] = self._members[num][self.seq_session[self._members[num]] >= 0]
            self._n_held -= int(gone.size)
            self._grow(int(new[-1]) + 1 if new.size else 0)
            grown = self._read_new(snap, new)
            if new.size:
                self._max_seq = max(self._max_seq, int(new[-1]))
            self._refresh_sessions(snap, shrunk.tolist())
            touched = sorted(set(shrunk.tolist()) | set(grown))
            if self.with_sessions:
                self._rewrite_sessions(snap, touched)
            self.removed, self.removed_seqs = list(removed), gone.tolist()
            self.version, self.snapshot = snap.version, snap
            return snap

    def _new_seqs(self, snap) -> np.ndarray:
        """Sequence numbers of the live records added since the last sync, ascending: ndarray (m,), int64.

        Sequence numbers only grow and each segment's are ascending, so only the
        rows past the largest sequence number seen are read (never every live record).
        """
        parts = []
        for v in snap.views:
            seqs = v.seg.seqs
            start = int(np.searchsorted(seqs, self._max_seq, side="right"))
            if start >= seqs.size:
                continue
            rows = np.arange(start, seqs.size, dtype=np.int64)
            if v.live is not None:
                rows = rows[v.live[rows]]
            parts.append(seqs[rows])
        return np.sort(np.concatenate(parts)) if parts else _E64

    def _gone_seqs(self, prev, snap) -> np.ndarray:
        """Sequence numbers live in ``prev`` and not in ``snap``, ascending (only changed views are read)."""
        same = {id(v) for v in snap.views}
        cand = [v.seg.seqs[v.live_rows()] for v in prev.views if id(v) not in same]
        if not cand:
            return _E64
        c = np.concatenate(cand)
        return np.sort(c[snap.locate(c)[0] < 0])

    def _grow(self, top: int) -> None:
        if top > self.seq_session.size:
            grown = np.full(max(top, 2 * self.seq_session.size), -1, dtype=np.int64)
            grown[: self.seq_session.size] = self.seq_session
            self.seq_session = grown
            if self._record_type is not None:
                codes = np.full(grown.size, -1, dtype=np.int16)
                codes[: self._type_code.size] = self._type_code
                self._type_code = codes

    def _read_new(self, snap, new: np.ndarray) -> list[int]:
        """Number the sessions of the new records (``new``: ascending seqs); returns the session numbers grown."""
        self.added, self.added_seqs = [], []
        if not new.size:
            return []
        ids = snap.strings("id", new)
        sess = snap.strings("session", new)
        tenants = snap.strings("tenant", new)
        times = snap.times(new)
        nums = np.empty(new.size, dtype=np.int64)
        grown: dict[int, list[int]] = {}
        for j, (rid, s, t) in enumerate(zip(ids, sess, tenants)):
            name = s or rid
            num = self.session_num.get(name)
            if num is None:
                num = self.session_num[name] = len(self.session_names)
                self.session_names.append(name)
                self._members.append(_E64)
                self._tenant.append(t)
                self._start.append(MISSING_TIME)
            elif not self._members[num].size and num not in grown:  # a session emptied earlier: anew
                self._tenant[num], self._start[num] = t, MISSING_TIME
            elif self._tenant[num] != t:
                self._tenant[num] = None  # mixed tenants: the session document has no tenant
            nums[j] = num
            grown.setdefault(num, []).append(j)
        self.seq_session[new] = nums
        for num, js in grown.items():
            at = np.asarray(js, dtype=np.int64)
            self._members[num] = np.concatenate([self._members[num], new[at]])
            t = times[at]
            t = t[t != MISSING_TIME]
            if t.size and (self._start[num] == MISSING_TIME or int(t.min()) < self._start[num]):
                self._start[num] = int(t.min())
        self._n_held += int(new.size)
        texts = None
        if self._record_type is not None:
            texts = snap.strings("text", new)
            types = snap.strings("type", new)
            codes = np.empty(new.size, dtype=np.int16)
            for j, (ty, text) in enumerate(zip(types, texts)):
                codes[j] = self._type_number(ty or self._record_type(text))
            self._type_code[new] = codes
        if self.records is not self.memory:
            vi, rows = snap.locate(new)
            copies = snap.records(vi.tolist(), rows.tolist())
            if self._enrich_fn is not None:
                copies = [{**rec, "text": self._enrich_fn(rec["text"])} for rec in copies]
            self.records.add(copies, time_unit="ms")  # read back from the memory: times in epoch ms
            end = self._index_next + len(copies)
            if end > self._mem_seq_of_index.size:
                idx = np.full(max(end, 2 * self._mem_seq_of_index.size), -1, dtype=np.int64)
                idx[: self._mem_seq_of_index.size] = self._mem_seq_of_index
                self._mem_seq_of_index = idx
            self._mem_seq_of_index[self._index_next: end] = new
            self._index_next = end
        self.added, self.added_seqs = list(ids), new.tolist()
        return list(grown)

    def _type_number(self, name: str) -> int:
        try:
            return self._type_names.index(name)
        except ValueError:
            self._type_names.append(name)
            return len(self._type_names) - 1

    def _refresh_sessions(self, snap, shrunk: list[int]) -> None:
        """Tenant and start of the sessions that lost records, read again from their live records."""
        if not shrunk:
            return
        mems = [self._members[num] for num in shrunk]
        every = np.concatenate(mems)  # one read of the columns for every session
        tenants, times = iter(snap.strings("tenant", every)), snap.times(every)
        at = 0
        for num, mem in zip(shrunk, mems):
            ten = {next(tenants) for _ in range(mem.size)}
            self._tenant[num] = ten.pop() if len(ten) == 1 else None
            t = times[at: at + mem.size]
            at += mem.size
            t = t[t != MISSING_TIME]
            self._start[num] = int(t.min()) if t.size else MISSING_TIME

    def keep_sessions(self) -> None:
        """Keep the session-document memory (the ``bm25_session`` channel asks for it); idempotent."""
        with self._lock:
            if self.with_sessions:
                return
            self.with_sessions = True
            if self.snapshot is not None:  # already synced: write every session now
                self._rewrite_sessions(self.snapshot, list(range(len(self.session_names))))

    def _new_memory(self) -> Memory:
        p = self.memory.params
        return Memory(analyzer=self.analyzer_config, method=p.method, k1=p.k1, b=p.b, delta=p.delta,
                      partition_days=None, history_limit=0,  # derived documents: rewritten, never looked back on
                      record_times=False)  # (a record's times, where it has them, are the memory's: copied as given)

    def record_seqs(self, res) -> np.ndarray:
        """Memory sequence numbers of a search of :attr:`records` (``(B, k)`` int64, -1 pads)."""
        seqs = res.seqs.astype(np.int64)
        if self.records is self.memory:
            return seqs
        return np.where(seqs >= 0, self._mem_seq_of_index[np.maximum(seqs, 0)], -1)

    def _rewrite_sessions(self, snap, touched: list[int]) -> None:
        if self.sessions is None:
            self.sessions = self._new_memory()
        names = [self.session_names[n] for n in touched]
        old = [s for s in names if s in self.sessions]
        if old:
            self.sessions.delete(old)
        lexical = self._enrich_fn or (lambda t: t)
        mems = [self._members[num] for num in touched]
        texts = iter(snap.strings("text", np.concatenate(mems)) if mems else [])  # one read for every session
        docs = []
        for num, sess, mem in zip(touched, names, mems):
            part = [next(texts) for _ in range(mem.size)]
            if not mem.size:
                continue
            text = "\n".join(lexical(t) for t in part)
            doc: dict[str, Any] = {"id": sess, "text": text}
            if self._tenant[num] is not None:
                doc["tenant"] = self._tenant[num]
            docs.append(doc)
        if docs:
            self.sessions.add(docs)

    def session_times(self, tenant: str | None, before_ms: int | None = None) -> list[int]:
        """Sorted start times (epoch ms) of the sessions of ``tenant`` (None: every session).

        A session's start is the earliest time of its live records; sessions without
        times are left out, and with ``before_ms`` only sessions that started before it are kept.
        """
        out = [t for t, ten, mem in zip(self._start, self._tenant, self._members)
               if t != MISSING_TIME and mem.size and (tenant is None or ten == tenant)
               and (before_ms is None or t < before_ms)]
        return sorted(out)

    # ------------------------------------------------------------------ reading the memory's columns
    def holds(self, seqs: np.ndarray) -> np.ndarray:
        """Whether each sequence number is a live record of the last synced snapshot: ndarray (m,), bool."""
        seqs = np.asarray(seqs, dtype=np.int64)
        ok = (seqs >= 0) & (seqs < self.seq_session.size)
        ok[ok] = self.seq_session[seqs[ok]] >= 0
        return ok

    def held_seqs(self) -> np.ndarray:
        """Sequence numbers of every live record of the last synced snapshot, ascending: ndarray, int64."""
        return np.flatnonzero(self.seq_session >= 0).astype(np.int64)

    def numbers(self, keys: list[str], unit: str) -> list[int | None]:
        """Record sequence numbers (``unit="record"``: ``keys`` are record ids) or session numbers of ``keys``
        (None: not held)."""
        out: list[int | None] = [None] * len(keys)
        at = [j for j, k in enumerate(keys) if isinstance(k, str)]  # anything else names nothing held
        if unit == "record":
            if at and self.snapshot is not None:
                for j, s in zip(at, self.memory.seqs_of([keys[j] for j in at], snapshot=self.snapshot)):
                    out[j] = s
            return out
        for j in at:
            out[j] = self.session_num.get(keys[j])
        return out

    def speakers(self, snap, seqs: np.ndarray) -> list[str | None]:
        """``metadata.speaker`` of the records with sequence numbers ``seqs`` (None: none)."""
        out: list[str | None] = []
        for meta in snap.strings("metadata", seqs):
            obj = json.loads(meta) if meta else None
            out.append(obj.get("speaker") if isinstance(obj, dict) else None)
        return out

    def seqs_of_type(self, name: str) -> np.ndarray:
        """Sequence numbers of the live records of type ``name`` (``with_types``), ascending."""
        if name not in self._type_names:
            return _E64
        return np.flatnonzero(self._type_code == self._type_names.index(name)).astype(np.int64)

    def ids_of_type(self, name: str) -> list[str]:
        """Ids of the live records of type ``name`` (``with_types``), in add order."""
        seqs = self.seqs_of_type(name)
        return self.snapshot.strings("id", seqs) if seqs.size else []

    @property
    def seq_of(self) -> Mapping[str, int]:
        return _View(self, "seq")

    @property
    def id_of_seq(self) -> Mapping[int, str]:
        return _View(self, "id")

    @property
    def text_of(self) -> Mapping[str, str]:
        return _View(self, "text")

    @property
    def session_of(self) -> Mapping[str, str]:
        return _View(self, "session")

    @property
    def speaker_of(self) -> Mapping[str, str | None]:
        return _View(self, "speaker")

    @property
    def type_of(self) -> Mapping[str, str]:
        return _View(self, "type")

    @property
    def members(self) -> Mapping[str, list[int]]:
        return _Members(self)

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


class _View(Mapping):
    """A read-only view of one column of the catalog's last synced snapshot, keyed by record id
    (``kind="id"``: by sequence number). Nothing is copied: every read goes to the memory's columns."""

    __slots__ = ("cat", "kind")

    def __init__(self, cat: Catalog, kind: str):
        self.cat, self.kind = cat, kind

    def _seq(self, key: Any) -> int | None:
        if self.kind == "id":
            ok = isinstance(key, (int, np.integer)) and not isinstance(key, bool) and bool(self.cat.holds([key])[0])
            return int(key) if ok else None
        if not isinstance(key, str):
            return None
        s = self.cat.numbers([key], "record")[0]
        return s if s is not None else self._scan(key)

    def _scan(self, key: str) -> int | None:
        """The id's sequence number in the snapshot when the memory no longer has it (deleted or updated
        since the last sync): a scan of the snapshot's id columns (slow path, e.g. comparing two syncs)."""
        snap = self.cat.snapshot
        if snap is None:
            return None
        for v in snap.views:
            ids = v.seg.ids.tolist()
            for r in (i for i, x in enumerate(ids) if x == key):
                if v.live is None or v.live[r]:
                    return int(v.seg.seqs[r])
        return None

    def __getitem__(self, key: Any) -> Any:
        s = self._seq(key)
        if s is None or (self.kind == "type" and not self.cat.with_types):
            raise KeyError(key)
        return self._values(np.asarray([s], dtype=np.int64))[0]

    def _values(self, seqs: np.ndarray) -> list[Any]:
        cat, snap, kind = self.cat, self.cat.snapshot, self.kind
        if kind == "seq":
            return seqs.tolist()
        if kind in ("id", "text"):
            return snap.strings(kind, seqs)
        if kind == "session":
            return [cat.session_names[n] for n in cat.seq_session[seqs].tolist()]
        if kind == "speaker":
            return cat.speakers(snap, seqs)
        return [cat._type_names[c] for c in cat._type_code[seqs].tolist()]  # type

    def _keys(self, seqs: np.ndarray) -> list[Any]:
        return seqs.tolist() if self.kind == "id" else self.cat.snapshot.strings("id", seqs)

    def __iter__(self) -> Iterator[Any]:
        if self.cat.snapshot is None or (self.kind == "type" and not self.cat.with_types):
            return iter(())
        return iter(self._keys(self.cat.held_seqs()))

    def __len__(self) -> int:
        return 0 if self.kind == "type" and not self.cat.with_types else self.cat._n_held

    def items(self):  # one vectorised read of the keys and one of the values
        if self.cat.snapshot is None or (self.kind == "type" and not self.cat.with_types):
            return []
        seqs = self.cat.held_seqs()
        return list(zip(self._keys(seqs), self._values(seqs)))

    def values(self):
        return [v for _, v in self.items()]

    def __repr__(self) -> str:
        return f"<catalog {self.kind} view of {len(self)} records>"


class _Members(Mapping):
    """Session id -> its live records' sequence numbers (add order), read-only."""

    __slots__ = ("cat",)

    def __init__(self, cat: Catalog):
        self.cat = cat

    def __getitem__(self, name: str) -> list[int]:
        num = self.cat.session_num.get(name)
        if num is None:
            raise KeyError(name)
        return self.cat._members[num].tolist()

    def __iter__(self) -> Iterator[str]:
        return iter(self.cat.session_names)

    def __len__(self) -> int:
        return len(self.cat.session_names)
