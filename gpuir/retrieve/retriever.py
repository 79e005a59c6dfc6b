"""`Retriever`: channels over a :class:`~gpuir.memory.Memory`, fused, with record or session results.

::

    from gpuir import Memory, Retriever
    r = Retriever(memory)                       # the default configuration
    res = r.search(["where did Caroline go?"], k=5, where={"tenant": "conv-26"}, unit="session")
    res.hits(0)   # [{"session": ..., "score": ..., "records": [best record hits]}, ...]

Records added to the memory after the retriever was built are picked up on
the next search (only they are read, and only they are encoded for the dense
channels).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..fusion import fuse
from ..memory import Memory
from ..results import SearchResults
from .catalog import Catalog
from .channels import run_channel
from .config import ChannelConfig, RetrieverConfig, default_config
from .embeddings import EmbeddingStore

__all__ = ["UNITS", "Retriever", "RetrieverResults"]

UNITS: tuple[str, ...] = ("record", "session")


@dataclass
class RetrieverResults:
    """Top-k records or sessions of a batch of queries.

    Attributes
    ----------
    unit : {"record", "session"}
    keys : list of B lists of str
        Record ids (``unit="record"``) or session ids, best first.
    scores : ndarray, shape (B, k), float32, host
        -inf pads.
    numbers : ndarray, shape (B, k), int64
        Record sequence numbers or session numbers (-1 pads).
    meta : dict
        ``config``, ``channels`` (each channel's SearchResults), ``backend``.
    """

    unit: str
    keys: list[list[str]]
    scores: np.ndarray
    numbers: np.ndarray
    _hits: Any
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.keys)

    def ids(self, i: int) -> list[str]:
        """Record or session ids of query ``i``, best first."""
        return list(self.keys[i])

    def hits(self, i: int) -> list[dict[str, Any]]:
        """Query ``i``'s hits: record dicts as :meth:`MemoryResults.hits`, or ``{"session", "score", "records"}``."""
        return self._hits(i)


class Retriever:
    """Channels over a memory, fused (see :mod:`gpuir.retrieve`).

    Parameters
    ----------
    memory : Memory
    config : RetrieverConfig, dict or None
        None: :func:`~gpuir.retrieve.config.default_config`.
    encoder : object, optional
        For dense channels: an encoder with ``encode_queries`` / ``encode_passages``
        (default: :class:`gpuir.dense.encoder.Encoder` of ``config.encoder``).
    progress : bool
        A progress bar while records are encoded (encoders with ``show_progress``).
    """

    def __init__(self, memory: Memory, config: RetrieverConfig | dict | None = None, encoder: Any = None,
                 progress: bool = False):
        if not isinstance(memory, Memory):
            raise TypeError(f"Retriever needs a gpuir.Memory, got {type(memory).__name__}")
        self.memory = memory
        self.config = default_config() if config is None else RetrieverConfig.from_config(config)
        self.catalog = Catalog(memory, with_sessions=any(c.kind == "bm25_session" for c in self.config.channels),
                               analyzer=self.config.analyzer)
        self._encoder = encoder
        self.progress = progress
        self.embeddings: EmbeddingStore | None = None
        if self.config.needs_encoder:
            self.embeddings = EmbeddingStore(self.encoder)
        self.sync()

    # ------------------------------------------------------------------ configuration
    def to_config(self) -> dict[str, Any]:
        """The configuration as a JSON-serialisable dict."""
        return self.config.to_config()

    @classmethod
    def from_config(cls, memory: Memory, config: dict | RetrieverConfig | str | os.PathLike,
                    encoder: Any = None) -> Retriever:
        """A retriever over ``memory`` from a configuration dict, object or JSON file."""
        if isinstance(config, (str, os.PathLike)):
            config = RetrieverConfig.load(config)
        return cls(memory, config, encoder=encoder)

    @property
    def encoder(self):
        if self._encoder is None:
            from ..dense.encoder import Encoder

            self._encoder = Encoder(self.config.encoder)
        return self._encoder

    # ------------------------------------------------------------------ persistence
    @staticmethod
    def folder_of(memory_path: str | os.PathLike) -> Path:
        """Where a retriever of the memory at ``memory_path`` is saved: ``<memory dir>.retriever``."""
        p = Path(memory_path)
        return p.with_name(p.name + ".retriever")

    def save(self, folder: str | os.PathLike | None = None) -> Path:
        """Save the configuration (``retriever.json``) and the embeddings beside the memory.

        Parameters
        ----------
        folder : optional
            Default :meth:`folder_of` the memory's directory (the memory must have been saved).
        """
        if folder is None:
            if self.memory.path is None:
                raise ValueError("the memory has no directory yet: save it first, or pass folder=")
            folder = self.folder_of(self.memory.path)
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.config.save(folder / "retriever.json")
        if self.embeddings is not None:
            self.embeddings.save(folder)
        return folder

    @classmethod
    def open(cls, memory: Memory, folder: str | os.PathLike | None = None, encoder: Any = None) -> Retriever:
        """The retriever saved beside ``memory`` (embeddings reused, not re-encoded)."""
        if folder is None:
            if memory.path is None:
                raise ValueError("the memory has no directory: pass folder=")
            folder = cls.folder_of(memory.path)
        folder = Path(folder)
        if not (folder / "retriever.json").exists():
            raise FileNotFoundError(f"{folder}: no retriever.json (save a Retriever there first)")
        config = RetrieverConfig.load(folder / "retriever.json")
        self = cls.__new__(cls)
        self.memory, self.config, self._encoder, self.progress = memory, config, encoder, False
        self.catalog = Catalog(memory, with_sessions=any(c.kind == "bm25_session" for c in config.channels),
                               analyzer=config.analyzer)
        self.embeddings = None
        if config.needs_encoder:
            self.embeddings = EmbeddingStore(self.encoder)
            self.embeddings.load(folder)
        self.sync()
        return self

    # ------------------------------------------------------------------ growth
    def sync(self):
        """Catch up with records added or deleted since the last call; returns the snapshot."""
        snap = self.catalog.sync()
        if self.embeddings is not None:
            cat = self.catalog
            if cat.removed:
                self.embeddings.discard(cat.removed)
            missing = [rid for rid in cat.seq_of if rid not in self.embeddings.row_of]
            if missing:
                enc = self.embeddings.encoder
                shown = getattr(enc, "show_progress", None)
                if shown is not None:
                    enc.show_progress = self.progress
                try:
                    self.embeddings.ensure(missing, [cat.text_of[r] for r in missing])
                finally:
                    if shown is not None:
                        enc.show_progress = shown
        return snap

    # ------------------------------------------------------------------ search
    def channels_for(self, unit: str) -> list[ChannelConfig]:
        """The channels a search of ``unit`` runs.

        ``unit="session"``: every channel; record channels are max-pooled to
        sessions. ``unit="record"``: the record channels; a configuration without
        any searches records with exact BM25 alone (the hits of ``Memory.search``).
        """
        if unit == "session":
            return list(self.config.channels)
        rec = [c for c in self.config.channels if c.unit == "record"]
        return rec or [ChannelConfig("bm25", depth=100)]

    def search_channels(self, queries: str | Sequence[str], where: Any = None, unit: str = "record",
                        backend: str = "auto") -> dict[str, Any]:
        """Run the channels of ``unit`` (no fusion): what :meth:`fuse_channels` fuses.

        Returns
        -------
        dict with ``queries``, ``unit``, ``channels`` (list of ChannelConfig),
        ``results`` (list of SearchResults over record or session numbers),
        ``records`` (the record-level MemoryResults of a BM25 channel, or None),
        ``snapshot``.
        """
        if isinstance(queries, str):
            queries = [queries]
        queries = list(queries)
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {unit!r}")
        snap = self.sync()
        chans = self.channels_for(unit)
        qvecs = None
        if any(c.dense for c in chans):
            qvecs = np.asarray(self.encoder.encode_queries(queries), dtype=np.float32)
        results, records = [], None
        for ch in chans:
            res, extra = run_channel(ch, self.catalog, snap, queries, where, backend, qvecs, self.embeddings)
            if unit == "session" and ch.unit == "record":
                from .channels import pool_rows

                sess = np.where(res.ids >= 0, self.catalog.seq_session[np.maximum(res.ids, 0)], -1)
                res = pool_rows(sess, res.scores, "max", 1, 1.0, ch.depth)
            if extra is not None and records is None:
                records = extra
            results.append(res)
        return {"queries": queries, "unit": unit, "channels": chans, "results": results, "records": records,
                "snapshot": snap, "where": where, "backend": backend}

    def fuse_channels(self, ran: dict[str, Any], k: int, weights: Sequence[float] | None = None) -> SearchResults:
        """Fuse what :meth:`search_channels` returned (``weights`` override the configured ones).

        Returns
        -------
        SearchResults, (B, k), over record or session numbers.
        """
        cfg = self.config
        chans, results = ran["channels"], ran["results"]
        w = list(weights) if weights is not None else [c.weight for c in chans]
        if len(results) == 1:
            r = results[0]
            ids, sc = r.ids[:, :k], r.scores[:, :k]
            if ids.shape[1] < k:
                pad = k - ids.shape[1]
                ids = np.concatenate([ids, np.full((ids.shape[0], pad), -1, np.int64)], 1)
                sc = np.concatenate([sc, np.full((sc.shape[0], pad), -np.inf, np.float32)], 1)
            return SearchResults(ids, sc)
        method = cfg.fusion or "z"
        kw: dict[str, Any] = {"weights": w}
        if method in ("z", "minmax"):
            kw["missing"] = cfg.missing
        else:
            kw["k_rrf"] = cfg.k_rrf
        return fuse(results, k, method=method, **kw)

    def search(self, queries: str | Sequence[str], k: int = 10, where: Any = None, unit: str = "record",
               backend: str = "auto") -> RetrieverResults:
        """Top-k records or sessions of each query.

        Parameters
        ----------
        queries : str or sequence of B str
        k : int, >= 1
        where : None, dict, or list of B (dict or None); see :mod:`gpuir.memory.where`
        unit : {"record", "session"}
        backend : {"auto", "numpy", "cupy"}
            BM25 scoring device (as :meth:`Memory.search`).

        Returns
        -------
        RetrieverResults
        """
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        ran = self.search_channels(queries, where=where, unit=unit, backend=backend)
        fused = self.fuse_channels(ran, int(k))
        return self.results(ran, fused)

    def results(self, ran: dict[str, Any], fused: SearchResults) -> RetrieverResults:
        """Wrap fused numbers into :class:`RetrieverResults` (ids, hits)."""
        cat, unit = self.catalog, ran["unit"]
        keys = []
        for row in fused.ids:
            ok = row[row >= 0].tolist()
            keys.append([cat.id_of_seq[n] for n in ok] if unit == "record" else [cat.session_names[n] for n in ok])
        meta = {"config": self.to_config(), "unit": unit, "channels": {c.kind: r for c, r in
                                                                        zip(ran["channels"], ran["results"])}}
        if ran["records"] is not None:
            meta["backend"] = ran["records"].meta.get("backend")
        memory, n_best = self.memory, self.config.session_records
        records = ran["records"]

        def record_hits(i: int) -> list[dict[str, Any]]:
            got = memory.get(keys[i], missing_ok=True)
            out = []
            for rec, s in zip(got, fused.scores[i].tolist()):
                if rec is not None:
                    out.append({"id": rec.pop("id"), "score": float(s), **rec})
            return out

        def session_hits(i: int) -> list[dict[str, Any]]:
            best: dict[str, list[dict[str, Any]]] = {}
            if n_best and keys[i]:
                rec_hits = records.hits(i) if records is not None else self.memory.search(
                    ran["queries"][i], k=100, where=_row_where(ran["where"], i), backend=ran["backend"]).hits(0)
                for h in rec_hits:
                    sess = cat.session_of.get(h["id"])
                    if sess is not None and len(best.setdefault(sess, [])) < n_best:
                        best[sess].append(h)
            return [{"session": s, "score": float(sc), "records": best.get(s, [])}
                    for s, sc in zip(keys[i], fused.scores[i].tolist())]

        return RetrieverResults(unit, keys, fused.scores.astype(np.float32), fused.ids.astype(np.int64),
                                record_hits if unit == "record" else session_hits, meta)


def _row_where(where: Any, i: int) -> Any:
    return where[i] if isinstance(where, list) else where
