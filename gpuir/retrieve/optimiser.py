"""The query optimiser and fusion over what ran.

**What runs.** A channel whose signal is absent for a query is skipped for that
query: each channel says so itself (``Channel.applies``, :mod:`gpuir.retrieve.registry`):
``temporal`` when no time window was parsed from it, ``entity`` when it names no
entity the graph knows. Every other built-in channel runs for every query.
:func:`applies` gives the (B, C) mask.

**Fusion over what ran.** Each query is fused over the channels that ran for
it, and only those: the queries are grouped by the set of channels that ran,
and each group is fused with those channels (their configured weights), so a
candidate is never scored down (``missing="min"``) or left without an RRF term
by a channel that did not run. A channel that ran and returned nothing is a
channel that ran (it contributes as :mod:`gpuir.fusion` says). When one channel
ran, its own scores are the result, as for a one-channel configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..fusion import fuse
from ..results import SearchResults

__all__ = ["applies", "fuse_ran", "top_rows"]


def applies(chans: Sequence[Any], request: Any) -> np.ndarray:
    """Which channel runs for which query: each channel's own ``applies(request)`` (None: every query).

    Parameters
    ----------
    chans : sequence of C channels (:mod:`gpuir.retrieve.registry`)
    request : ChannelRequest
        The search's queries, windows, ... (``request.queries`` has B entries).

    Returns
    -------
    ndarray, shape (B, C), bool, host.
    """
    B = len(request.queries)
    out = np.ones((B, len(chans)), dtype=bool)
    for c, chan in enumerate(chans):
        fn = getattr(chan, "applies", None)
        got = None if fn is None else fn(request)
        if got is not None:
            got = np.asarray(got, dtype=bool).reshape(-1)
            if got.shape != (B,):
                raise ValueError(f"channel {chan.config.kind}: applies() returned {got.shape[0]} flags for {B} queries")
            out[:, c] = got
    return out


def top_rows(r: SearchResults, k: int) -> SearchResults:
    """The first ``k`` columns of ``r``, padded with -1 / -inf to exactly ``k``."""
    ids, sc = r.ids[:, :k], r.scores[:, :k]
    if ids.shape[1] < k:
        pad = k - ids.shape[1]
        ids = np.concatenate([ids, np.full((ids.shape[0], pad), -1, np.int64)], 1)
        sc = np.concatenate([sc, np.full((sc.shape[0], pad), -np.inf, np.float32)], 1)
    return SearchResults(ids.astype(np.int64), sc.astype(np.float32))


def _fuse(results: list[SearchResults], k: int, method: str, weights: list[float], missing: Any,
          k_rrf: float) -> SearchResults:
    kw: dict[str, Any] = {"weights": weights}
    if method in ("z", "minmax"):
        kw["missing"] = missing
    else:
        kw["k_rrf"] = k_rrf
    return fuse(results, k, method=method, **kw)


def fuse_ran(results: Sequence[SearchResults], ran: np.ndarray, k: int, method: str | None,
             weights: Sequence[float], missing: Any = "min", k_rrf: float = 60.0,
             notes: list[str] | None = None) -> SearchResults:
    """Fuse each query over the channels that ran for it (module docstring).

    Parameters
    ----------
    results : sequence of C SearchResults, each (B, k_c)
    ran : ndarray, shape (B, C), bool
    k : int
    method : str or None
        A fusion of :data:`gpuir.retrieve.config.FUSIONS` (None with a single channel).
    weights : sequence of C floats
    notes : list, optional
        Notes for ``meta["notes"]`` (none are added here).

    Returns
    -------
    SearchResults, (B, k), host.
    """
    notes = [] if notes is None else notes
    B = ran.shape[0]
    C = len(results)
    if ran.all() or C == 1:
        if C == 1:
            r = results[0]
            if not ran.all():
                keep = ran[:, 0]
                r = SearchResults(np.where(keep[:, None], r.ids, -1), np.where(keep[:, None], r.scores, -np.inf))
            return top_rows(r, k)
        return _fuse(list(results), k, method or "z", list(weights), missing, k_rrf)
    ids = np.full((B, k), -1, np.int64)
    sc = np.full((B, k), -np.inf, np.float32)
    patterns, group = np.unique(ran, axis=0, return_inverse=True)
    group = np.asarray(group).reshape(-1)
    for g, pat in enumerate(patterns):
        rows = np.flatnonzero(group == g)
        cs = np.flatnonzero(pat).tolist()
        if not cs:
            continue
        sub = [SearchResults(results[c].ids[rows], results[c].scores[rows]) for c in cs]
        if len(cs) == 1:
            f = top_rows(sub[0], k)
        else:
            f = _fuse(sub, k, method or "z", [float(weights[c]) for c in cs], missing, k_rrf)
        ids[rows], sc[rows] = f.ids, f.scores
    return SearchResults(ids, sc)
