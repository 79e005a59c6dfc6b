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

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..memory import Memory
from ..results import SearchResults
from .anchors import resolve_at
from .cascade import Cascade
from .catalog import Catalog
from .channels import drop_below, pool_rows, ranked_rows
from .config import ChannelConfig, RetrieverConfig, default_config
from .fanout import run_jobs, stage_names
from .optimiser import applies, fuse_ran
from .registry import UNITS, Change, ChannelContext, ChannelRequest, channel_kind
from .relevance import N_RANGE as RELEVANCE_N_RANGE
from .relevance import calibration, check_min_relevance, relevance_of
from .results import RetrieverResults
from .router import Router
from .temporal import may_name_time, parse_time_window
from .typefilter import search_with_widening
from .wheres import row_where

log = logging.getLogger(__name__)  # gpuir.retrieve.retriever

__all__ = ["UNITS", "Retriever", "RetrieverResults"]

#: Record channels that run only for the queries with their signal (a parsed time window, a known entity).
CONDITIONAL: frozenset[str] = frozenset({"temporal", "entity"})


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
        self.sync()

    def _setup(self, folder: Path | None = None) -> None:
        """Catalog, channels (from the registry), router and cascade of the configuration (nothing synced yet)."""
        cfg = self.config
        self._sync_lock = threading.RLock()
        routed = cfg.router is not None
        # with a router the routes hold the indexes; the outer catalog only follows the memory
        self.catalog = Catalog(self.memory, with_sessions=False, analyzer=None if routed else cfg.analyzer,
                               enrich=None if routed else cfg.enrich,
                               with_types=not routed and cfg.type_filter is not None)
        self.context = ChannelContext(self.memory, self.catalog, cfg, lambda: self.encoder, self.progress)
        #: one channel object per configured channel (``config.channels``), made by the registry's factories
        self.channels = [] if routed else [self.make_channel(c) for c in cfg.channels]
        self._exact_bm25 = None
        self._record_channels: list[Any] | None = None
        self.router = None
        if routed:
            self.router = Router(self.memory, cfg, self._route, folder=folder)
        self.cascade = None if cfg.cascade is None else Cascade(cfg.cascade)

    def make_channel(self, config: ChannelConfig):
        """A channel object of ``config`` (its kind's registered factory, sharing this retriever's context)."""
        return channel_kind(config.kind).factory(config, self.context)

    def _route(self, config: RetrieverConfig, folder: Path | None) -> Retriever:
        """One route of the router: the saved one in ``folder`` when there is one, else a new retriever."""
        if folder is not None and (Path(folder) / "retriever.json").exists():
            route = Retriever.open(self.memory, folder, encoder=self._encoder)
            if route.config != config:
                raise ValueError(f"{folder}: the saved route is not the configuration's route")
            return route
        return Retriever(self.memory, config, encoder=self._encoder, progress=self.progress)

    def _parts(self) -> list[Any]:
        """What holds state: the shared resources, then the channels (each synced, saved and opened)."""
        return [*self.context.resources.values(), *self.channels]

    @property
    def embedding(self) -> str | None:
        """The memory embedding the dense channels search (its vectors are the memory's), or None."""
        res = self.context.resources.get("embeddings")
        return None if res is None else res.name

    @property
    def graph(self):
        """The entity graph of the ``entity`` channel, or None."""
        res = self.context.resources.get("entity_graph")
        return None if res is None else res.graph

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
        """Save the configuration (``retriever.json``) and the channels' state (the entity graph) beside the memory.

        The dense channels' vectors are the memory's: they are saved by ``Memory.save``.

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
        for part in self._parts():
            part.save(folder)
        if self.router is not None:
            self.router.save(folder)
        return folder

    @classmethod
    def open(cls, memory: Memory, folder: str | os.PathLike | None = None, encoder: Any = None) -> Retriever:
        """The retriever saved beside ``memory`` (the memory's stored vectors reused, not re-encoded)."""
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
        for part in self._parts():
            part.open(folder)
        self.sync()
        return self

    # ------------------------------------------------------------------ growth
    def sync(self):
        """Catch up with records added or deleted since the last call; returns the snapshot."""
        with self._sync_lock:  # the catalog's added / removed lists are read by this thread only
            return self._sync()

    def _sync(self):
        cat = self.catalog
        snap = cat.sync()
        change = Change(cat.added, cat.removed, cat.removed_seqs, cat, snap, cat.added_seqs)
        for part in self._parts():
            part.sync(change)
        return snap

    # ------------------------------------------------------------------ search
    def channels_for(self, unit: str) -> list[Any]:
        """The channel objects a search of ``unit`` runs (each with its ``config``).

        ``unit="session"``: every channel; record channels are max-pooled to
        sessions. ``unit="record"``: the record channels, and a ``late`` channel
        (without a ``dense`` one) runs as ``dense`` -- the same cosines of the
        records, not pooled -- with its weight; when the configuration has no
        record channel, its session BM25 channels (``bm25_session``,
        ``bm25_pool``) run as one record ``bm25`` beside it (depth 100, the first
        one's weight). A configuration with none of these searches records with
        exact BM25 alone (the hits of ``Memory.search``); a session configuration
        whose record channels all run only for some queries (``temporal``,
        ``entity``: the default has ``temporal``) searches exact BM25 beside them,
        so that a query without a time or an entity still gets the BM25 hits. A
        configuration of record channels only runs exactly those.
        """
        if unit == "session":
            return list(self.channels)
        if self._record_channels is None:
            rec = [c for c in self.channels if c.config.unit == "record"]
            kinds = {c.config.kind for c in rec}
            late = [c for c in self.channels if c.config.kind == "late"]
            extra = []
            if late and "dense" not in kinds:
                lc = late[0].config
                extra.append(self.make_channel(ChannelConfig("dense", depth=lc.depth, weight=lc.weight,
                                                             min_score=lc.min_score)))
                if not rec:
                    bm = [c for c in self.channels if c.config.kind in ("bm25_session", "bm25_pool")]
                    if bm:
                        extra.insert(0, self.make_channel(ChannelConfig("bm25", depth=100, weight=bm[0].config.weight)))
            chans = rec + extra
            if all(c.config.kind in CONDITIONAL for c in chans) and (
                    not chans or any(c.config.unit == "session" for c in self.channels)):
                chans = [self.exact_bm25(), *chans]
            self._record_channels = chans
        return list(self._record_channels)

    def exact_bm25(self):
        """The exact record BM25 channel (depth 100) searched when no record channel is configured."""
        if self._exact_bm25 is None:
            self._exact_bm25 = self.make_channel(ChannelConfig("bm25", depth=100))
        return self._exact_bm25

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
        return self.run_channels(self.channels_for(unit), queries, where, unit, backend, anchors, snap)

    def windows(self, queries: Sequence[str], where: Any, anchors: np.ndarray) -> list[Any]:
        """Each query's parsed time window (:func:`gpuir.retrieve.temporal.parse_time_window`), or None.

        Relative expressions are anchored at ``anchors[i]`` (epoch ms); "since we last
        talked" sees the start times of the sessions of the query's tenant that began before it.
        """
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

    def run_channels(self, chans: Sequence[Any], queries: list[str], where: Any, unit: str, backend: str,
                     anchors: np.ndarray, snap, windows: list[Any] | None = None) -> dict[str, Any]:
        """Run the channel objects ``chans`` for ``queries`` (fan-out, the optimiser's skips), unfused.

        Parameters
        ----------
        chans : list of channels (from :meth:`channels_for` or :meth:`make_channel`)
        where : None, dict, or list of B (dict or None)
        anchors : ndarray, shape (B,), int64 (epoch ms)
        snap : the snapshot of :meth:`sync`
        windows : list of B (TimeWindow or None), optional
            Parsed here when a channel needs them and they are not given.

        Returns
        -------
        dict as :meth:`search_channels`.
        """
        timings: dict[str, float] = {}
        B = len(queries)
        if windows is None:
            windows = [None] * B
            if any(getattr(c, "needs_windows", False) for c in chans):
                t0 = time.perf_counter()
                windows = self.windows(queries, where, anchors)
                timings["time_parse"] = time.perf_counter() - t0
        lock, box = threading.Lock(), {}

        def qvecs():
            with lock:
                if "q" not in box:
                    t0 = time.perf_counter()
                    box["q"] = np.asarray(self.encoder.encode_queries(queries), dtype=np.float32)
                    box["s"] = time.perf_counter() - t0
                return box["q"]

        request = ChannelRequest(queries, where, anchors, backend, snap, self.catalog, unit, windows, qvecs)
        mask = applies(chans, request)
        cat = self.catalog

        def job(j: int, chan: Any):
            ch = chan.config

            def run():
                out = chan.search(queries, ch.depth, where, anchors, request)
                if not isinstance(out, SearchResults):  # B lists of (id, score): a plug-in channel
                    allowed = cat.allowed_seqs(snap, where, B) if where is not None else [None] * B
                    out = ranked_rows(out, ch.unit, cat, allowed, ch.depth)
                res = drop_below(out, ch.min_score)
                if unit == "session" and ch.unit == "record":
                    sess = np.where(res.ids >= 0, cat.seq_session[np.maximum(res.ids, 0)], -1)
                    res = pool_rows(sess, res.scores, "max", 1, 1.0, ch.depth)
                if not mask[:, j].all():  # a skipped query's row is empty whatever the channel returned
                    keep = mask[:, j][:, None]
                    res = SearchResults(np.where(keep, res.ids, -1), np.where(keep, res.scores, -np.inf))
                return res
            return run

        if any(getattr(c, "needs_encoder", False) and mask[:, j].any() for j, c in enumerate(chans)):
            qvecs()  # in this thread: the encoder's SQLite cache may be used only by the thread that opened it
        results, secs = run_jobs([job(j, c) for j, c in enumerate(chans)], parallel=self.config.parallel)
        timings.update(zip(stage_names([c.config.kind for c in chans]), secs))
        if "s" in box:
            timings["encode_queries"] = box["s"]
        return {"queries": queries, "unit": unit, "channels": [c.config for c in chans], "results": results,
                "records": next((request.offered[id(c)] for c in chans if id(c) in request.offered), None), "snapshot": snap, "where": where, "backend": backend,
                "ran": mask, "windows": windows, "anchors": anchors, "timings": timings}

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
               backend: str = "auto", at: Any = None, min_score: float | None = None) -> RetrieverResults:
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
        min_score : float in [0, 1], optional
            Keep the hits whose calibrated relevance is at least this (:mod:`gpuir.retrieve.relevance`:
            the default configuration's sessions; refused where the configuration is not calibrated).

        Returns
        -------
        RetrieverResults
            With a calibrated configuration, ``meta["relevance"]``: (B, k) float32, each hit's
            relevance (NaN pads).
        """
        min_score = check_min_relevance(min_score)
        coef = calibration(self.config, unit) if unit in UNITS else None
        if min_score is not None and coef is None:
            raise ValueError(f"min_score is a calibrated relevance (0 to 1), and this configuration has none at "
                             f"unit={unit!r} (calibrated: the default configuration's sessions, "
                             "gpuir.retrieve.relevance); filter channels with ChannelConfig(min_score=...), or use "
                             "Memory.search(ranking='hybrid', min_score=...) for records")
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
            res = search_with_widening(self.search_fused, self.sync, self.catalog.ids_of_type,
                                       self.config.type_filter["min_results"], queries, int(k), where, unit,
                                       backend, anchors)
        else:
            res = self.search_fused(queries, int(k), where, unit, backend, anchors)
        res.meta["timings"]["total"] = time.perf_counter() - t0
        log.debug("searched %d queries (k=%d, unit=%s) in %.4f s: %s", len(queries), k, unit,
                  res.meta["timings"]["total"], {s: round(v, 4) for s, v in res.meta["timings"].items()})
        if res.meta.get("config") is None:
            res.meta["config"] = self.to_config()
        if coef is not None:
            wl = where if isinstance(where, list) else [where] * len(queries)
            seen = np.array([self.memory.count(w) for w in wl], np.float64)  # what each question may see
            res = with_relevance(res, relevance_of(res.scores, seen, coef, RELEVANCE_N_RANGE[unit]), min_score)
        return res

    def search_fused(self, queries: list[str], k: int, where: Any, unit: str, backend: str,
                     anchors: np.ndarray) -> RetrieverResults:
        """One search without router or type filter: the cascade when configured, else every channel, fused.

        What the type filter wraps (:mod:`gpuir.retrieve.typefilter`); ``anchors`` as
        :func:`gpuir.retrieve.anchors.resolve_at` returns them.
        """
        snap = self.sync()
        if self.cascade is not None:
            ran, fused, escalated = self.cascade.run(self, queries, k, where, unit, backend, anchors, snap)
        else:
            ran = self.run_channels(self.channels_for(unit), queries, where, unit, backend, anchors, snap)
            fused = self.fuse_channels(ran, k)
            escalated = np.zeros(len(queries), bool)
        res = self.results(ran, fused)
        res.meta["escalated"] = escalated
        if "margins" in ran:
            res.meta["margins"] = ran["margins"]
        return res

    def results(self, ran: dict[str, Any], fused: SearchResults) -> RetrieverResults:
        """Wrap fused numbers into :class:`RetrieverResults` (ids, hits).

        Record ids are read from the snapshot every channel read; for sessions, the
        record search that lists each session's best records runs here
        (:meth:`session_records`), so ``hits()`` only reads and formats.
        """
        cat, unit, snap = self.catalog, ran["unit"], ran["snapshot"]
        found = [row[row >= 0] for row in fused.ids]
        if unit == "record":  # one read of the id column for every row
            every = iter(snap.strings("id", np.concatenate(found)) if found else [])
            keys = [[next(every) for _ in range(ok.size)] for ok in found]
        else:
            keys = [[cat.session_names[n] for n in ok.tolist()] for ok in found]
        B = len(ran["queries"])
        meta = {"config": self.to_config(), "unit": unit,
                "channels": {c.kind: r for c, r in zip(ran["channels"], ran["results"])},
                "ran": ran.get("ran"), "timings": dict(ran.get("timings", {})),
                "escalated": np.zeros(B, bool), "route": ["default"] * B, "widened": np.zeros(B, bool),
                "windows": list(ran.get("windows") or [None] * B), "notes": list(ran.get("notes", []))}
        if ran["records"] is not None:
            meta["backend"] = ran["records"].meta.get("backend")
        memory = self.memory

        def record_hits(i: int) -> list[dict[str, Any]]:
            got = memory.get(keys[i], missing_ok=True)  # the memory's own records: raw text, never enriched
            out = []
            for rec, s in zip(got, fused.scores[i].tolist()):
                if rec is not None:
                    out.append({"id": rec.pop("id"), "score": float(s), **rec})
            return out

        if unit == "record":
            return RetrieverResults(unit, keys, fused.scores.astype(np.float32), fused.ids.astype(np.int64),
                                    record_hits, meta)
        n_best = self.config.session_records
        records, row_of = self.session_records(ran, keys)
        seqs = None if records is None else cat.record_seqs(records)

        def session_hits(i: int) -> list[dict[str, Any]]:
            best: dict[str, list[dict[str, Any]]] = {}
            j = row_of.get(i)
            if j is not None:
                hit_seqs = seqs[j][seqs[j] >= 0]
                raw = snap.strings("text", hit_seqs) if cat.enrich is not None else None
                for n, h in enumerate(records.hits(j)):
                    sess = h.get("session") or h["id"]
                    if len(best.setdefault(sess, [])) < n_best:
                        if raw is not None:
                            h = {**h, "text": raw[n]}  # the raw text, not the enriched index's
                        best[sess].append(h)
            return [{"id": s, "session": s, "score": float(sc), "records": best.get(s, [])}
                    for s, sc in zip(keys[i], fused.scores[i].tolist())]

        return RetrieverResults(unit, keys, fused.scores.astype(np.float32), fused.ids.astype(np.int64),
                                session_hits, meta)

    def session_records(self, ran: dict[str, Any], keys: list[list[str]]) -> tuple[Any, dict[int, int]]:
        """The record hits a session search lists under each session (its best ``config.session_records``).

        They are the record BM25 hits of the search: the first record BM25 channel's, or,
        when none ran, those of one batched :meth:`Memory.search` at depth 100 on the
        search's snapshot, run here, during the search (``hits()`` never searches).

        Returns
        -------
        (MemoryResults or None, dict query -> its row there); queries without hit
        sessions, or without candidates (``where`` False), have no row.
        """
        B = len(ran["queries"])
        if not self.config.session_records:
            return None, {}
        if ran["records"] is not None:
            return ran["records"], {i: i for i in range(B) if keys[i]}
        where = ran["where"]
        rows = [i for i in range(B) if keys[i] and _row_where(where, i) is not False]
        if not rows:
            return None, {}
        res = self.memory.search([ran["queries"][i] for i in rows], k=100,
                                 where=[_row_where(where, i) for i in rows] if where is not None else None,
                                 backend=ran["backend"], snapshot=ran["snapshot"])
        return res, {i: j for j, i in enumerate(rows)}


def with_relevance(res: RetrieverResults, rel: np.ndarray, min_score: float | None) -> RetrieverResults:
    """``res`` with each hit's relevance ``rel`` (B, k) float32 (NaN pads) as ``meta["relevance"]``, and without
    the hits below ``min_score`` (a suffix of each row: relevance increases with the score)."""
    if min_score is not None:
        for i in range(len(res.keys)):
            m = int(np.count_nonzero(rel[i] >= min_score))
            res.keys[i] = res.keys[i][:m]  # hits(i) reads keys[i]: the dropped hits are gone there too
            res.scores[i, m:] = -np.inf
            res.numbers[i, m:] = -1
            rel[i, m:] = np.nan
    res.meta["relevance"] = rel
    return res


def _row_where(where: Any, i: int) -> Any:
    return where[i] if isinstance(where, list) else where


def _query_list(queries: str | Sequence[str]) -> list[str]:
    if isinstance(queries, str):
        return [queries]
    return list(queries)
