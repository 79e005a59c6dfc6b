"""Each channel's rank and contribution to a fused hit (a search with ``"explain": true`` and a ``config``).

Every fusion a configuration may name (:data:`gpuir.retrieve.config.FUSIONS`:
z, minmax, rrf, weighted_rrf, score_rrf) is a weighted sum over channels, so a
channel's contribution to a candidate is the fusion run with that channel's
weight and every other weight 0, over the same channel lists (the same
normalisation, the same missing-value fill): the contributions of a hit add up
to its fused score. A channel that did not run for the query (the optimiser's
skips: ``temporal`` without a time in the question, ...) has rank and
contribution None. A configuration with a router, a cascade or a type filter
(whose hits come from several fusions), or with one channel, is not explained:
its hits carry no ``channels``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..fusion import fuse
from ..results import SearchResults

__all__ = ["channel_contributions"]


def channel_contributions(retriever: Any, res: Any, i: int) -> dict[str, dict[str, dict[str, Any]]] | None:
    """``{record id: {channel kind: {"rank", "contribution"}}}`` for query ``i`` of a record search.

    Parameters
    ----------
    retriever : Retriever
        The retriever that answered ``res``.
    res : RetrieverResults
        Its answer (``unit="record"``).
    i : int
        The query's row.

    Returns
    -------
    dict, or None when the configuration's hits cannot be split by channel (module docstring).
    ``rank`` is 1-based (None: the channel did not return the record); ``contribution`` a float.
    """
    cfg = retriever.config
    if (res.unit != "record" or retriever.router is not None or retriever.cascade is not None
            or cfg.type_filter is not None or cfg.fusion is None):
        return None
    chans = retriever.channels_for("record")
    kinds = [c.config.kind for c in chans]
    got = res.meta.get("channels") or {}
    if len(chans) < 2 or len(set(kinds)) != len(kinds) or any(k not in got for k in kinds):
        return None
    ran = res.meta.get("ran")
    row = np.ones(len(chans), bool) if ran is None else np.asarray(ran)[i].astype(bool)
    idx = np.flatnonzero(row).tolist()
    number_of = {key: int(n) for key, n in zip(res.keys[i], np.asarray(res.numbers[i]).tolist())}
    out: dict[str, dict[str, dict[str, Any]]] = {key: {k: {"rank": None, "contribution": None} for k in kinds}
                                                 for key in number_of}
    if not idx:
        return out
    sub = [SearchResults(got[kinds[c]].ids[i:i + 1], got[kinds[c]].scores[i:i + 1]) for c in idx]
    weights = [float(chans[c].config.weight) for c in idx]
    kw: dict[str, Any] = {"missing": cfg.missing} if cfg.fusion in ("z", "minmax") else {"k_rrf": cfg.k_rrf}
    for p, c in enumerate(idx):
        if len(idx) == 1:  # one channel ran: the fused list is that channel's own
            ids = np.asarray(sub[0].ids[0])
            col_of = {int(n): j for j, n in enumerate(ids.tolist()) if n >= 0}
            for key, n in number_of.items():
                j = col_of.get(n)
                out[key][kinds[c]] = {"rank": None if j is None else j + 1,
                                      "contribution": None if j is None else float(sub[0].scores[0][j])}
            break
        w = [0.0] * len(idx)
        w[p] = weights[p]
        _, cand, fused = fuse(sub, 1, method=cfg.fusion, weights=w, return_candidates=True, **kw)
        ids = np.asarray(cand.ids[0])
        col_of = {int(n): j for j, n in enumerate(ids.tolist()) if n >= 0}
        ranks = np.asarray(cand.ranks[p][0])
        vals = np.asarray(fused[0], dtype=np.float64)
        for key, n in number_of.items():
            j = col_of.get(n)
            if j is None:
                continue
            r = ranks[j]
            out[key][kinds[c]] = {"rank": int(r) if np.isfinite(r) else None, "contribution": float(vals[j])}
    return out
