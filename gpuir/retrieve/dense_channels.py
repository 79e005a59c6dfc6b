"""What the ``dense`` and ``late`` channels (:mod:`gpuir.retrieve.channels`) search: the memory's own stored vectors.

The record vectors live in the memory (:mod:`gpuir.memory.embeddings`: a
vector column per named embedding in every segment, written when records are
added, merged, tombstoned, saved and mapped with them). The retriever keeps no
copy: :class:`MemoryEmbedding` makes sure the memory carries the embedding of
the configuration's encoder (named by :func:`embedding_name`; the first
retriever over a memory encodes its records once, in one batched call, and
attaches the encoder so that every later ``Memory.add`` encodes its records),
and both channels search it through :meth:`gpuir.Memory.search_vectors` -- the
engine's one dense path, exact, with the search's ``where`` and tenant
boundary and the snapshot every channel of the search reads.

* ``dense``: the top ``depth`` records by cosine (record sequence numbers).
* ``late``: late interaction over sessions. A session is a bag of its records'
  vectors (its "multi-vector" representation: the records are the session's
  tokens); a session's score pools the query's cosine with each of its
  records (``max`` -- MaxSim --, mean of the top ``pool_k``, or log-sum-exp at
  ``lse_beta``). Every allowed record is scored (exact pooling), and the top
  ``depth`` sessions are returned. No token-level vectors are stored: at agent
  memory scale a record (a turn, a fact) is already the unit a MaxSim over
  sessions needs, and a second per-token column would multiply the memory's
  size by the tokens per record.

At ``unit="record"`` a configuration whose only dense channel is ``late`` runs
it as ``dense`` (the records' own cosines, not pooled): see
:meth:`gpuir.retrieve.Retriever.channels_for`.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..results import SearchResults
from .registry import ChannelContext, ChannelRequest
from .wheres import row_where

__all__ = ["DEFAULT_EMBEDDING", "MemoryEmbedding", "as_results", "embedding_name", "search_records"]

#: The embedding name of the shipped encoder (``RetrieverConfig.encoder`` None).
DEFAULT_EMBEDDING = "all-MiniLM-L6-v2"


def embedding_name(encoder: str | None) -> str:
    """The memory embedding a configuration's encoder writes and reads.

    The encoder's model name (a folder: its last part), reduced to the
    characters an embedding name may hold; None: :data:`DEFAULT_EMBEDDING`.
    Retrievers with the same encoder share one embedding (records encoded once).
    """
    if not encoder:
        return DEFAULT_EMBEDDING
    base = re.split(r"[\\/]", str(encoder).rstrip("/\\"))[-1] or "encoder"
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", base).lstrip("_.-")[:64]
    return name or "encoder"


class MemoryEmbedding:
    """The shared resource of the dense channels: the memory's embedding of the configuration's encoder.

    Made once per retriever (:meth:`ChannelContext.resource`); on creation the
    memory gains the embedding (encoding its live records once) or, when it has
    it already (saved with it, or added by another retriever), only gets the
    encoder attached -- nothing is encoded again. It holds no vectors of its
    own, so ``sync``, ``save`` and ``open`` have nothing to do: the vectors are
    saved and opened with the memory's segments.

    Attributes
    ----------
    name : str
        The memory's embedding (:func:`embedding_name`).
    encoded : int
        Records encoded when this retriever was set up.
    """

    def __init__(self, context: ChannelContext):
        self.context = context
        self.name = embedding_name(getattr(context.config, "encoder", None))
        enc = context.encoder
        shown = getattr(enc, "show_progress", None)
        if shown is not None:
            enc.show_progress = context.progress
        try:
            self.encoded = context.memory.add_embedding(self.name, enc)
        finally:
            if shown is not None:
                enc.show_progress = shown

    def sync(self, change: Any) -> None:
        """Nothing: the memory encodes the records added to it (the encoder is attached)."""

    def save(self, folder: Any) -> None:
        """Nothing: the vectors are saved with the memory."""

    def open(self, folder: Any) -> None:
        """Nothing: the vectors are mapped with the memory."""


def search_records(context: ChannelContext, name: str, request: ChannelRequest, where: Any, n: int,
            k_of: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per query (sequence numbers, cosines) of its top ``k_of(i)`` allowed records, best first.

    ``where`` may give a query ``False`` (no candidates: an empty row).
    """
    mem, snap, qv = context.memory, request.snapshot, request.vectors()
    empty = (np.zeros(0, np.int64), np.zeros(0, np.float32))
    out = [empty] * n
    keep = [i for i in range(n) if row_where(where, i) is not False]
    if not keep or snap.n_docs == 0:
        return out
    groups: dict[int, list[int]] = {}
    for i in keep:
        groups.setdefault(int(k_of(i)), []).append(i)
    for k, rows in groups.items():
        ws = [row_where(where, i) for i in rows]
        r = mem.search_vectors(qv[rows], k=max(1, k), where=ws, embedding=name, backend=request.backend,
                               snapshot=snap)
        for j, i in enumerate(rows):
            ok = r.seqs[j] >= 0
            out[i] = (r.seqs[j][ok], r.scores[j][ok])
    return out


def as_results(rows: list[tuple[np.ndarray, np.ndarray]], depth: int) -> SearchResults:
    width = max([min(depth, s.size) for s, _ in rows] + [1])
    ids = np.full((len(rows), width), -1, np.int64)
    sc = np.full((len(rows), width), -np.inf, np.float32)
    for i, (s, v) in enumerate(rows):
        m = min(width, s.size)
        ids[i, :m], sc[i, :m] = s[:m], v[:m]
    return SearchResults(ids, sc)
