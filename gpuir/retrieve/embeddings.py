"""Record embeddings keyed by record id, computed incrementally and saved beside a memory.

:class:`EmbeddingStore` encodes only the records it has not seen (in batches,
through the encoder's own on-disk cache), so a dense channel never re-encodes
the store when records are added.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)  # gpuir.retrieve.embeddings

__all__ = ["EmbeddingStore"]


class EmbeddingStore:
    """Passage vectors of records, one row per record id.

    Parameters
    ----------
    encoder : object with ``encode_passages(texts) -> ndarray (n, dim) float32``
        and ``encode_queries``; typically :class:`gpuir.dense.encoder.Encoder`.

    Attributes
    ----------
    vecs : ndarray, shape (n_rows, dim), float32, host
        Rows of deleted records stay until :meth:`compact`.
    row_of : dict str -> int
        Row of each live record id.
    """

    def __init__(self, encoder: Any):
        self.encoder = encoder
        self.vecs: np.ndarray | None = None
        self.row_of: dict[str, int] = {}
        self._ids: list[str] = []

    def __len__(self) -> int:
        return len(self.row_of)

    def ensure(self, ids: Sequence[str], texts: Sequence[str]) -> int:
        """Encode the records among ``ids`` that have no vector yet.

        Returns
        -------
        int: how many records were encoded.
        """
        todo = [(i, t) for i, t in zip(ids, texts) if i not in self.row_of]
        if not todo:
            return 0
        log.info("encoding %d records", len(todo))
        t0 = time.perf_counter()
        v = np.asarray(self.encoder.encode_passages([t for _, t in todo]), dtype=np.float32)
        log.info("encoded %d records in %.1f s", len(todo), time.perf_counter() - t0)
        if v.ndim != 2 or v.shape[0] != len(todo):
            raise ValueError(f"encoder returned shape {v.shape} for {len(todo)} passages")
        start = 0 if self.vecs is None else self.vecs.shape[0]
        self.vecs = v if self.vecs is None else np.concatenate([self.vecs, v])
        for j, (rid, _) in enumerate(todo):
            self.row_of[rid] = start + j
            self._ids.append(rid)
        return len(todo)

    def discard(self, ids: Sequence[str]) -> None:
        """Forget the vectors of these ids (deleted or updated records)."""
        for i in ids:
            self.row_of.pop(i, None)

    def rows(self, ids: Sequence[str]) -> np.ndarray:
        """Rows of ``ids`` (each must have a vector). Returns ndarray (n,), int64."""
        return np.fromiter((self.row_of[i] for i in ids), dtype=np.int64, count=len(ids))

    def compact(self) -> None:
        """Drop the rows of discarded ids."""
        if self.vecs is None:
            return
        keep = sorted(self.row_of.items(), key=lambda kv: kv[1])
        self.vecs = self.vecs[np.array([r for _, r in keep], dtype=np.int64)] if keep else None
        self.row_of = {rid: j for j, (rid, _) in enumerate(keep)}
        self._ids = [rid for rid, _ in keep]

    def save(self, folder: str | os.PathLike) -> None:
        """Write ``embeddings.npy`` and ``embedding_ids.json`` into ``folder``."""
        self.compact()
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        dim = 0 if self.vecs is None else self.vecs.shape[1]
        np.save(folder / "embeddings.npy", self.vecs if self.vecs is not None else np.zeros((0, dim), np.float32))
        (folder / "embedding_ids.json").write_text(json.dumps(self._ids), encoding="utf-8")

    def load(self, folder: str | os.PathLike) -> bool:
        """Read what :meth:`save` wrote; False when ``folder`` holds no embeddings."""
        folder = Path(folder)
        if not (folder / "embeddings.npy").exists():
            return False
        vecs = np.load(folder / "embeddings.npy")
        ids = json.loads((folder / "embedding_ids.json").read_text(encoding="utf-8"))
        if vecs.shape[0] != len(ids):
            raise ValueError(f"{folder}: {vecs.shape[0]} embeddings for {len(ids)} ids")
        self.vecs = vecs.astype(np.float32, copy=False) if len(ids) else None
        self._ids = list(ids)
        self.row_of = {rid: j for j, rid in enumerate(ids)}
        return True
