"""The memory's searches on the device in one pass (the cupy backend), through the segment-set engine.

Until the segment-set contract routes every backend (``gpuir/backends/contract.py``), the memory's
:class:`~gpuir.memory.search.SegmentEngine` hands its cupy searches here: the batch's plans become the
contract's query batch (global term codes, multiplicities, idf, ``w0`` and ``C`` under the snapshot's
statistics, per-view allow-lists of a ``where``), and
:class:`gpuir.backends.cupy_segments.CupySegmentsEngine` scores every searched segment in one device
pass and merges the top k on the device. :data:`ONE_PASS` False restores one scorer call per segment
(the tests compare both).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Serve the cupy backend's memory searches with the one-pass engine (False: one scorer call per segment).
ONE_PASS = True

_engine: Any = None
_lock = threading.Lock()


def engine() -> Any:
    """The process's :class:`~gpuir.backends.cupy_segments.CupySegmentsEngine` (made on first use)."""
    global _engine
    if _engine is None:
        with _lock:
            if _engine is None:
                from .cupy_segments import CupySegmentsEngine

                _engine = CupySegmentsEngine()
    return _engine


@dataclass
class _Batch:
    """The contract's QueryBatch fields the engine reads (host arrays)."""

    off: np.ndarray
    gids: np.ndarray
    mult: np.ndarray
    idf: np.ndarray
    w0: np.ndarray
    const: np.ndarray
    has_w0: bool
    theta: np.ndarray
    allow: list | None = None


def batch_of(plans: list, allow: list | None = None, theta: np.ndarray | None = None) -> _Batch:
    """The query batch of analysed plans (:class:`gpuir.memory.search.QueryPlan`)."""
    B = len(plans)
    lens = np.fromiter((len(p.terms) for p in plans), np.int64, B)
    off = np.zeros(B + 1, np.int64)
    np.cumsum(lens, out=off[1:])

    def cat(get, dt):
        parts = [np.asarray(get(p)) for p in plans if len(p.terms)]
        return np.concatenate(parts).astype(dt, copy=False) if parts else np.zeros(0, dt)

    return _Batch(off, cat(lambda p: p.gids, np.int64), cat(lambda p: p.mult, np.int64),
                  cat(lambda p: p.idf, np.float32), cat(lambda p: p.w0, np.float32),
                  np.array([p.const for p in plans], np.float32), bool(plans[0].has_w0) if plans else False,
                  np.full(B, -np.inf) if theta is None else theta, allow)


def _every_view(snap: Any) -> tuple[int, ...]:
    """The views the device pass always covers: all of the snapshot's, so one document space serves every
    search of a snapshot (a search of fewer views restricts its rows by an allow-list instead)."""
    return tuple(range(len(snap.views)))


_NONE = np.zeros(0, np.int64)


def _allow_lists(snap: Any, view_ids: tuple[int, ...], wheres: list) -> list | None:
    """Per query, its allowed rows in every view of the snapshot (None: all rows): the ``where`` rows in the
    searched views ``view_ids``, nothing in the others. One list per distinct ``where``."""
    every = _every_view(snap)
    subset = set(view_ids)
    whole = subset >= set(every)
    if whole and all(w is None for w in wheres):
        return None
    made: dict[int, list] = {}
    out = []
    for w in wheres:
        if w is None and whole:
            out.append(None)
            continue
        a = made.get(id(w))
        if a is None:
            a = made[id(w)] = [
                _NONE if vi not in subset else
                (np.arange(snap.views[vi].seg.n_docs, dtype=np.int64) if w is None else
                 np.asarray(w.rows(snap.views[vi], snap.dicts), np.int64))
                for vi in every]
        out.append(a)
    return out


def search_all(snap: Any, view_ids: tuple[int, ...], plans: list, k: int) -> tuple[np.ndarray, ...]:
    """Every plan over the views ``view_ids`` in one device pass: out_i (3, B, k) int64 (sequence number, view,
    row; -1 pads), out_f (B, k) float32 (-inf pads), counts (B, 1) int64 (postings read), host."""
    allow = _allow_lists(snap, view_ids, [None] * len(plans))
    h = engine().search(snap, _every_view(snap), batch_of(plans, allow), k)
    return np.stack([h.seqs, h.views, h.rows]), h.scores, h.postings[:, None]


def scan(snap: Any, view_ids: tuple[int, ...], jobs: list, k: int) -> dict[int, tuple[tuple | None, int]]:
    """Jobs (a plan, a ``where``) over the views ``view_ids`` in one device pass: qi -> ((seqs, scores, view
    positions, rows) of its hits, best first, or None when it has none; postings read).

    The pass covers the snapshot's whole row space (its one document space); rows outside ``view_ids`` or
    the job's ``where`` are masked out by allow-lists."""
    allow = _allow_lists(snap, view_ids, [j.where for j in jobs])
    h = engine().search(snap, _every_view(snap), batch_of([j.plan for j in jobs], allow), k)
    out = {}
    for i, j in enumerate(jobs):
        ok = h.seqs[i] >= 0
        hits = (h.seqs[i][ok], h.scores[i][ok], h.views[i][ok], h.rows[i][ok]) if ok.any() else None
        out[j.qi] = (hits, int(h.postings[i]))
    return out
