"""`RetrieverResults`: what a :class:`~gpuir.retrieve.Retriever` search returns (also the router's and the type filter's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["RetrieverResults"]


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
        """Query ``i``'s hits, best first: record dicts as :meth:`MemoryResults.hits` (``id``, ``score``, ``text``,
        the record's fields), or session dicts ``{"id", "session", "score", "records"}`` (``id`` is the session id)."""
        return self._hits(i)
