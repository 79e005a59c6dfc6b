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

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..memory import Memory
from ..results import SearchResults
from .anchors import resolve_at
from .catalog import Catalog
from .channels import pool_rows, run_channel
from .config import ChannelConfig, RetrieverConfig, default_config
from .embeddings import EmbeddingStore
from .fanout import run_jobs, stage_names
from .optimiser import applies, fuse_ran
from .wheres import row_where

log = logging.getLogger(__name__)  # gpuir.retrieve.retriever

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
        ``config``, ``channels`` (each channel's SearchResults), ``backend``,
        ``timings`` ({stage: seconds}, wall clock: each channel, ``fusion``, ``total``, and
        ``cascade_cheap`` / ``cascade_escalate``, ``widen``, ``route`` where they ran),
        ``ran`` (ndarray (B, C) bool: which channel ran for which query),
        ``escalated`` (ndarray (B,) bool), ``route`` (list of B str), ``widened`` (ndarray (B,) bool),
        ``windows`` (list of B TimeWindow or None), ``notes`` (list of str); with a cascade
        ``margins`` (ndarray (B,) float64, the cheap fusion's top-1/top-2 margin).
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
        self._encoder = encoder
        self.progress = progress
        self._setup()
        if self.config.needs_encoder and self.router is None:
            self.embeddings = EmbeddingStore(self.encoder)
        self.sync()

    def _setup(self, folder: Path | None = None) -> None:
        """Catalog, entity graph, router and classifiers of the configuration (no embeddings yet)."""
        cfg = self.config
        self._sync_lock = threading.RLock()
        self.embeddings: EmbeddingStore | None = None
        self.graph = None
        self._graph_seqs: set[int] = set()
        if cfg.router is not None:  # the routes hold the indexes; the outer catalog only follows the memory
            self.catalog = Catalog(self.memory, with_sessions=False)
        else:
            self.catalog = Catalog(self.memory, with_sessions=any(c.kind == "bm25_session" for c in cfg.channels),
                                   analyzer=cfg.analyzer, enrich=cfg.enrich, with_types=cfg.type_filter is not None)
        if cfg.router is None and any(c.kind == "entity" for c in cfg.channels):
            from .entity_graph import EntityGraph

            self.graph = EntityGraph()
        self.router = None
        if cfg.router is not None:
            from .router import Router

            self.router = Router(self.memory, cfg, encoder=self._encoder, progress=self.progress, folder=folder)
        self._cascade_classifier = None

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
    def needs_encoder(self) -> bool:
        return self.config.needs_encoder

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
        if self.graph is not None:
            self.graph.save(folder / "entity_graph")
            (folder / "entity_graph_seqs.json").write_text(json.dumps(sorted(self._graph_seqs)), encoding="utf-8")
        if self.router is not None:
            self.router.save(folder)
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
        self._setup(folder)
        if config.needs_encoder and self.router is None:
            self.embeddings = EmbeddingStore(self.encoder)
            self.embeddings.load(folder)
        if self.graph is not None and (folder / "entity_graph").exists():
            self.graph = type(self.graph).load(folder / "entity_graph")
            held = folder / "entity_graph_seqs.json"
            self._graph_seqs = set(json.loads(held.read_text(encoding="utf-8"))) if held.exists() else set()
        self.sync()
        return self

    # ------------------------------------------------------------------ growth
    def sync(self):
        """Catch up with records added or deleted since the last call; returns the snapshot."""
        with self._sync_lock:  # the catalog's added / removed lists are read by this thread only
            return self._sync()

    def _sync(self):
        snap = self.catalog.sync()
        if self.graph is not None:
            self._sync_graph()
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

    def _sync_graph(self) -> None:
        """Bring the entity graph in step with the catalog: only added / removed records are touched."""
        cat, g = self.catalog, self.graph
        gone = [s for s in cat.removed_seqs if s in self._graph_seqs]
        if len(self._graph_seqs) > len(cat.seq_of) + len(gone):  # after open: records deleted meanwhile
            gone += sorted(self._graph_seqs - set(cat.seq_of.values()) - set(gone))
        if gone:
            g.remove(np.asarray(gone, dtype=np.int64))
            self._graph_seqs.difference_update(gone)
        new = [rid for rid in cat.added if cat.seq_of[rid] not in self._graph_seqs]
        if new:
            seqs = np.asarray([cat.seq_of[r] for r in new], dtype=np.int64)
            g.add(seqs, [cat.text_of[r] for r in new], [cat.speaker_of.get(r) for r in new])
            self._graph_seqs.update(seqs.tolist())

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
                        backend: str = "auto", at: Any = None) -> dict[str, Any]:
        """Run the channels of ``unit`` (no fusion): what :meth:`fuse_channels` fuses.

        Returns
        -------
        dict with ``queries``, ``unit``, ``channels`` (list of ChannelConfig),
        ``results`` (list of SearchResults over record or session numbers),
        ``ran`` (ndarray (B, C) bool: the optimiser's mask, rows of skipped channels empty),
        ``windows`` (list of B TimeWindow or None), ``timings``,
        ``records`` (the record-level MemoryResults of a BM25 channel, or None),
        ``snapshot``.
        """
        queries = _query_list(queries)
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {unit!r}")
        anchors = resolve_at(at, len(queries))
        if self.router is not None:
            raise ValueError("this configuration routes every query (router): use search(), or search_channels() "
                             "of one route (retriever.router.routes[name])")
        snap = self.sync()
        return self._run(self.channels_for(unit), queries, where, unit, backend, anchors, snap)

    def windows(self, queries: Sequence[str], where: Any, anchors: np.ndarray) -> list[Any]:
        """Each query's parsed time window (:func:`gpuir.retrieve.temporal.parse_time_window`), or None.

        Relative expressions are anchored at ``anchors[i]`` (epoch ms); "since we last
        talked" sees the start times of the sessions of the query's tenant that began before it.
        """
        from .temporal import may_name_time, parse_time_window  # lazily: dateparser is the routing extra

        out = []
        for i, q in enumerate(queries):
            if not may_name_time(q):  # most questions: no session scan, no parse
                out.append(None)
                continue
            w = row_where(where, i)
            tenant = w.get("tenant") if isinstance(w, dict) else None
            if isinstance(tenant, dict):
                tenant = tenant.get("eq")
            times = self.catalog.session_times(tenant, before_ms=int(anchors[i]))
            out.append(parse_time_window(q, int(anchors[i]), times))
        return out

    def _run(self, chans: list[ChannelConfig], queries: list[str], where: Any, unit: str, backend: str,
             anchors: np.ndarray, snap, windows: list[Any] | None = None) -> dict[str, Any]:
        """Run ``chans`` for ``queries`` (fan-out, the optimiser's skips), unfused."""
        timings: dict[str, float] = {}
        B = len(queries)
        if windows is None:
            windows = [None] * B
            if any(c.kind == "temporal" for c in chans):
                t0 = time.perf_counter()
                windows = self.windows(queries, where, anchors)
                timings["time_parse"] = time.perf_counter() - t0
        mask = applies(chans, queries, windows, self.graph)
        lock, box = threading.Lock(), {}

        def qvecs():
            with lock:
                if "q" not in box:
                    t0 = time.perf_counter()
                    box["q"] = np.asarray(self.encoder.encode_queries(queries), dtype=np.float32)
                    box["s"] = time.perf_counter() - t0
                return box["q"]

        def job(j: int, ch: ChannelConfig):
            def run():
                res, extra = run_channel(ch, self.catalog, snap, queries, where, backend,
                                         qvecs() if ch.dense else None, self.embeddings, windows=windows,
                                         graph=self.graph, applies=mask[:, j])
                if unit == "session" and ch.unit == "record":
                    sess = np.where(res.ids >= 0, self.catalog.seq_session[np.maximum(res.ids, 0)], -1)
                    res = pool_rows(sess, res.scores, "max", 1, 1.0, ch.depth)
                if not mask[:, j].all():  # a skipped query's row is empty whatever the channel returned
                    keep = mask[:, j][:, None]
                    res = SearchResults(np.where(keep, res.ids, -1), np.where(keep, res.scores, -np.inf))
                return res, extra
            return run

        if any(ch.dense and mask[:, j].any() for j, ch in enumerate(chans)):
            qvecs()  # in this thread: the encoder's SQLite cache may be used only by the thread that opened it
        outs, secs = run_jobs([job(j, ch) for j, ch in enumerate(chans)], parallel=self.config.parallel)
        timings.update(zip(stage_names([c.kind for c in chans]), secs))
        if "s" in box:
            timings["encode_queries"] = box["s"]
        results = [r for r, _ in outs]
        records = next((x for _, x in outs if x is not None), None)
        return {"queries": queries, "unit": unit, "channels": chans, "results": results, "records": records,
                "snapshot": snap, "where": where, "backend": backend, "ran": mask, "windows": windows,
                "anchors": anchors, "timings": timings}

    def fuse_channels(self, ran: dict[str, Any], k: int, weights: Sequence[float] | None = None) -> SearchResults:
        """Fuse what :meth:`search_channels` returned (``weights`` override the configured ones).

        Each query is fused over the channels that ran for it (:mod:`gpuir.retrieve.optimiser`).

        Returns
        -------
        SearchResults, (B, k), over record or session numbers.
        """
        cfg = self.config
        chans, results = ran["channels"], ran["results"]
        w = list(weights) if weights is not None else [c.weight for c in chans]
        mask = ran.get("ran")
        if mask is None:
            mask = np.ones((len(results[0].ids) if results else 0, len(results)), bool)
        notes = ran.setdefault("notes", [])
        t0 = time.perf_counter()
        out = fuse_ran(results, mask, int(k), cfg.fusion, w, cfg.missing, cfg.k_rrf, notes)
        ran.setdefault("timings", {})["fusion"] = ran.get("timings", {}).get("fusion", 0.0) + time.perf_counter() - t0
        return out

    def search(self, queries: str | Sequence[str], k: int = 10, where: Any = None, unit: str = "record",
               backend: str = "auto", at: Any = None) -> RetrieverResults:
        """Top-k records or sessions of each query.

        Parameters
        ----------
        queries : str or sequence of B str
        k : int, >= 1
        where : None, dict, or list of B (dict or None); see :mod:`gpuir.memory.where`
        unit : {"record", "session"}
        backend : {"auto", "numpy", "cupy"}
            BM25 scoring device (as :meth:`Memory.search`).
        at : None, int (epoch ms), ISO-8601 str, datetime, or a list of B of them
            When each question is asked (the temporal channel's anchor); None: now.

        Returns
        -------
        RetrieverResults
        """
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        k = min(int(k), max(len(self.memory), 1))  # nothing is sized by a huge k (at most one hit per record)
        queries = _query_list(queries)
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {unit!r}")
        anchors = resolve_at(at, len(queries))
        t0 = time.perf_counter()
        if self.router is not None:
            res = self.router.search(queries, int(k), where, unit, backend, anchors)
        elif self.config.type_filter is not None:
            from .typefilter import search_with_widening

            res = search_with_widening(self, queries, int(k), where, unit, backend, anchors)
        else:
            res = self._search_core(queries, int(k), where, unit, backend, anchors)
        res.meta["timings"]["total"] = time.perf_counter() - t0
        log.debug("searched %d queries (k=%d, unit=%s) in %.4f s: %s", len(queries), k, unit,
                  res.meta["timings"]["total"], {s: round(v, 4) for s, v in res.meta["timings"].items()})
        if res.meta.get("config") is None:
            res.meta["config"] = self.to_config()
        return res

    def _search_core(self, queries: list[str], k: int, where: Any, unit: str, backend: str,
                     anchors: np.ndarray) -> RetrieverResults:
        """One search without router or type filter: the cascade when configured, else every channel."""
        snap = self.sync()
        if self.config.cascade is not None:
            from .cascade import run_cascade

            ran, fused, escalated = run_cascade(self, queries, k, where, unit, backend, anchors, snap)
        else:
            ran = self._run(self.channels_for(unit), queries, where, unit, backend, anchors, snap)
            fused = self.fuse_channels(ran, k)
            escalated = np.zeros(len(queries), bool)
        res = self.results(ran, fused)
        res.meta["escalated"] = escalated
        if "margins" in ran:
            res.meta["margins"] = ran["margins"]
        return res

    def results(self, ran: dict[str, Any], fused: SearchResults) -> RetrieverResults:
        """Wrap fused numbers into :class:`RetrieverResults` (ids, hits)."""
        cat, unit = self.catalog, ran["unit"]
        keys = []
        for row in fused.ids:
            ok = row[row >= 0].tolist()
            keys.append([cat.id_of_seq[n] for n in ok] if unit == "record" else [cat.session_names[n] for n in ok])
        B = len(ran["queries"])
        meta = {"config": self.to_config(), "unit": unit,
                "channels": {c.kind: r for c, r in zip(ran["channels"], ran["results"])},
                "ran": ran.get("ran"), "timings": dict(ran.get("timings", {})),
                "escalated": np.zeros(B, bool), "route": ["default"] * B, "widened": np.zeros(B, bool),
                "windows": list(ran.get("windows") or [None] * B), "notes": list(ran.get("notes", []))}
        if ran["records"] is not None:
            meta["backend"] = ran["records"].meta.get("backend")
        memory, n_best = self.memory, self.config.session_records
        records = ran["records"]

        def record_hits(i: int) -> list[dict[str, Any]]:
            got = memory.get(keys[i], missing_ok=True)  # the memory's own records: raw text, never enriched
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
                        if cat.enrich is not None and h["id"] in cat.text_of:
                            h = {**h, "text": cat.text_of[h["id"]]}  # the raw text, not the enriched index's
                        best[sess].append(h)
            return [{"session": s, "score": float(sc), "records": best.get(s, [])}
                    for s, sc in zip(keys[i], fused.scores[i].tolist())]

        return RetrieverResults(unit, keys, fused.scores.astype(np.float32), fused.ids.astype(np.int64),
                                record_hits if unit == "record" else session_hits, meta)


def _row_where(where: Any, i: int) -> Any:
    return where[i] if isinstance(where, list) else where


def _query_list(queries: str | Sequence[str]) -> list[str]:
    if isinstance(queries, str):
        return [queries]
    return list(queries)
