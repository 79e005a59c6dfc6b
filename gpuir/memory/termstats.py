"""Statistics from outside: a memory that holds one part (a shard) of a larger collection.

A sharded memory (:mod:`gpuir.cluster`) keeps part of the records in each of
several :class:`~gpuir.memory.Memory` objects. For a search to return what
*one* memory holding every record returns -- the same ids, the same float32
scores bit for bit, the same ties -- each part must score with the statistics
of the whole collection, and break ties by the whole collection's add order.
Three small hooks allow it; nothing else of the memory changes:

* **Report** (:func:`term_stats`, :meth:`Memory.term_stats
  <gpuir.memory.Memory.term_stats>`): a part's live N, total document length
  and the df of given terms. The sum over the parts is the whole collection's.
* **Apply** (:func:`restate`, ``Memory.search(..., stats=TermStats)``): the
  snapshot's records under the whole collection's N, total length (so avgdl is
  ``total / N`` in float64, as :attr:`Snapshot.avgdl
  <gpuir.memory.snapshot.Snapshot.avgdl>` computes it for one memory) and the
  df of the query terms; :func:`~gpuir.memory.search.plan_queries` takes the
  bm25l/bm25+ constant ``C`` over *every* query term with a global df > 0,
  including terms this part has never seen (one memory holding all records
  would count them). The engine then scores each record of the part exactly as
  one memory would.
* **Order** (``Memory.add(records, seqs=...)``, ``Memory.update(records,
  seqs=...)``): sequence numbers given by the caller (strictly increasing,
  beyond every number the memory used), so the part's add order is the global
  one and a merge of the parts' hits by (score descending, sequence ascending)
  is the one memory's order.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .snapshot import Snapshot, thread_analyzer


@dataclass(frozen=True)
class TermStats:
    """Collection statistics: N, the total length of the live records, and the df of some terms.

    Attributes
    ----------
    n_docs : int
        N, live records.
    total_len : int
        Sum of their document lengths (tokens).
    df : dict str -> int
        Live document frequency of each term (terms left out count as 0).
    version : int, optional
        The collection's state these statistics describe, when the sender numbers
        its states (a sharded memory's coordinator: its write counter). Two
        ``TermStats`` with the same version must agree on N, total length and every
        term's df: a shard then reuses one restated snapshot, with everything it
        caches, for every search of that state (:func:`restate`).
    """

    n_docs: int
    total_len: int
    df: Mapping[str, int] = field(default_factory=dict)
    version: int | None = None

    @property
    def avgdl(self) -> float:
        """The mean document length exactly as :attr:`Snapshot.avgdl <gpuir.memory.snapshot.Snapshot.avgdl>`."""
        if self.n_docs == 0:
            return 1.0
        m = self.total_len / self.n_docs
        return m if m > 0 else 1.0

    def __add__(self, other: TermStats) -> TermStats:
        """The statistics of two disjoint parts together (df summed term by term)."""
        df = dict(self.df)
        for t, d in other.df.items():
            df[t] = df.get(t, 0) + int(d)
        return TermStats(self.n_docs + other.n_docs, self.total_len + other.total_len, df)

    def check(self) -> None:
        """Raise ValueError unless these are statistics of some collection (0 <= df <= N, N >= 0)."""
        if self.n_docs < 0 or self.total_len < 0:
            raise ValueError(f"statistics with N={self.n_docs} and total length={self.total_len}: both must be >= 0")
        bad = [t for t, d in self.df.items() if not 0 <= d <= self.n_docs]
        if bad:
            raise ValueError(f"df of {bad[0]!r} is {self.df[bad[0]]}, outside [0, N={self.n_docs}]")


def query_terms(snap: Snapshot, queries: Sequence[str]) -> list[str]:
    """The distinct analysed terms of ``queries`` (the memory's analyzer), ascending."""
    an = thread_analyzer(snap.analyzer_config)
    out: set[str] = set()
    for q in queries:
        out.update(an(q))
    return sorted(out)


def term_stats(snap: Snapshot, terms: Iterable[str]) -> TermStats:
    """This snapshot's live N, total length and the df of ``terms`` (0 for terms it does not hold)."""
    terms = list(terms)
    codes = snap.terms.lookup_many(terms)
    G = snap.df.shape[0]
    ok = (codes >= 0) & (codes < G)
    df = np.zeros(len(terms), dtype=np.int64)
    df[ok] = snap.df[codes[ok]]
    return TermStats(snap.n_docs, snap.total_len, dict(zip(terms, df.tolist())))


def restate(snap: Snapshot, stats: TermStats) -> Snapshot:
    """The records of ``snap`` under the statistics ``stats`` (a new snapshot sharing the segments).

    Its N and total length are ``stats``'s; its df holds ``stats.df`` at the
    terms this memory knows and 0 elsewhere: only the query terms are ever
    weighed, and a search must name every one of its terms in ``stats``.
    """
    stats.check()
    if stats.version is None:
        out = _restated(snap, stats.n_docs, stats.total_len)
    else:  # one restated snapshot per state of the collection: its caches (term weights, filters) are reused
        holder = snap.cached("restated", dict)
        key = (stats.version, stats.n_docs, stats.total_len)
        with _restate_lock:
            cur = holder.get("latest")
            if cur is None or cur[0] != key:  # only the newest state is kept
                cur = holder["latest"] = (key, _restated(snap, stats.n_docs, stats.total_len))
        out = cur[1]
    if stats.df:  # this search's terms (the same values for every search of one version)
        G = snap.df.shape[0]
        terms = list(stats.df)
        codes = snap.terms.lookup_many(terms)
        ok = (codes >= 0) & (codes < G)
        vals = np.fromiter((stats.df[t] for t in terms), dtype=np.int64, count=len(terms))
        out.df[codes[ok]] = vals[ok]
    return out


_restate_lock = threading.Lock()


def _restated(snap: Snapshot, n_docs: int, total_len: int) -> Snapshot:
    df = np.zeros(snap.df.shape[0], dtype=np.int64)  # calloc'ed: untouched pages cost nothing
    out = Snapshot(snap.version, snap.views, n_docs, total_len, df, snap.params, snap.analyzer_config,
                   snap.window_ms, snap.terms, snap.dicts)
    if hasattr(snap, "expiring"):  # no expires_at ever given: the search need not look for expired rows
        out.expiring = snap.expiring
    return out


def check_seqs(seqs: object, n: int, next_seq: int) -> np.ndarray | None:
    """Caller-given sequence numbers of ``n`` records as ndarray (n,), int64, or None (the memory numbers them).

    Raises
    ------
    ValueError
        Not ``n`` integers, not strictly increasing, or not beyond ``next_seq - 1``.
    """
    if seqs is None:
        return None
    s = np.asarray(seqs)
    if s.shape != (n,) or (n and s.dtype.kind not in "iu"):
        raise ValueError(f"seqs must hold one integer per record ({n}), got {s.dtype} {s.shape}")
    s = s.astype(np.int64, copy=False)
    if n and (s[0] < next_seq or np.any(np.diff(s) <= 0)):
        raise ValueError(f"seqs must increase strictly and start at or after {next_seq} (the memory's next "
                         f"sequence number), got {s[:3].tolist()}...")
    return s
