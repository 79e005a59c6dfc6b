"""The coordinator's exact global statistics, kept from the shards' deltas (no Ray needed).

One memory's BM25 statistics are N, the total length of the live records and
each term's df. A sharded memory keeps them at the coordinator, *per shard*:
every write's answer carries the shard's change (``dn``, ``dlen``, the df change
of each term that changed; :func:`gpuir.cluster.shard.stats_delta`), and a
shard whose state is in doubt (it died during a write) is re-read whole
(:meth:`GlobalStats.replace`). The global figures are the sums. Per shard they
also tell which shards hold any of a query's terms (the others are not asked)
and which time partitions each shard holds (the ``budgeted`` mode's global
partition budget).

Cost: one int64 per (shard, term) and one per term globally, plus the
vocabulary's strings once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..memory.columns import Interner
from ..memory.termstats import TermStats


class GlobalStats:
    """Statistics of every shard, by the coordinator's term codes.

    Attributes
    ----------
    vocab : Interner
        Every term any shard ever reported (append-only).
    df : ndarray, shape (S, V), int64, host
        Live df of each term on each shard (columns beyond ``len(vocab)`` are 0).
    total : ndarray, shape (V,), int64, host
        ``df.sum(axis=0)``, kept in step.
    n, length : list of int, length S
        Live records and their total length on each shard.
    partitions : list of list, length S
        Each shard's time-partition keys, newest first (None last).
    """

    def __init__(self, shards: int):
        self.vocab = Interner()
        self.df = np.zeros((shards, 1024), dtype=np.int64)
        self.total = np.zeros(1024, dtype=np.int64)
        self.n = [0] * shards
        self.length = [0] * shards
        self.partitions: list[list[Any]] = [[] for _ in range(shards)]

    @property
    def shards(self) -> int:
        return len(self.n)

    @property
    def n_docs(self) -> int:
        """Global N."""
        return sum(self.n)

    @property
    def total_len(self) -> int:
        """Global total length."""
        return sum(self.length)

    def _codes(self, terms: Sequence[str]) -> np.ndarray:
        codes = self.vocab.codes(terms, dtype=np.int64)
        if len(self.vocab) > self.total.size:
            size = max(len(self.vocab), 2 * self.total.size)
            df = np.zeros((self.shards, size), dtype=np.int64)
            df[:, : self.total.size] = self.df
            total = np.zeros(size, dtype=np.int64)
            total[: self.total.size] = self.total
            self.df, self.total = df, total
        return codes

    def apply(self, s: int, reply: dict[str, Any]) -> None:
        """Add one write's change on shard ``s`` (a shard's write answer)."""
        self.n[s] += int(reply["dn"])
        self.length[s] += int(reply["dlen"])
        if reply["terms"]:
            codes = self._codes(reply["terms"])  # distinct terms
            d = np.asarray(reply["ddf"], dtype=np.int64)
            self.df[s, codes] += d
            self.total[codes] += d
        self.partitions[s] = list(reply["partitions"])

    def replace(self, s: int, sync: dict[str, Any]) -> None:
        """Set shard ``s``'s statistics from a full report (:meth:`ShardServer.sync`)."""
        codes = self._codes(sync["terms"])
        self.total -= self.df[s]
        self.df[s] = 0
        self.df[s, codes] = np.asarray(sync["df"], dtype=np.int64)
        self.total += self.df[s]
        self.n[s] = int(sync["n"])
        self.length[s] = int(sync["len"])
        self.partitions[s] = list(sync["partitions"])

    def lookup(self, terms: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Global and per-shard df of ``terms`` (0 for terms never seen).

        Returns
        -------
        total : ndarray (T,), int64
        per_shard : ndarray (S, T), int64
        """
        codes = self.vocab.lookup_many(list(terms))
        ok = codes >= 0
        total = np.zeros(codes.size, np.int64)
        per = np.zeros((self.shards, codes.size), np.int64)
        total[ok] = self.total[codes[ok]]
        per[:, ok] = self.df[:, codes[ok]]
        return total, per

    def term_stats(self, terms: Sequence[str], df: np.ndarray | None = None) -> TermStats:
        """Global statistics of ``terms`` (``df``: their global df when already looked up)."""
        if df is None:
            df = self.lookup(terms)[0]
        return TermStats(self.n_docs, self.total_len, dict(zip(terms, df.tolist())))

    def nbytes(self) -> int:
        """Bytes of the df arrays (the vocabulary's strings not counted)."""
        return int(self.df.nbytes + self.total.nbytes)
