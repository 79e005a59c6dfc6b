"""A Retriever's scores as a calibrated relevance from 0 to 1, where a configuration has been calibrated.

A fused score has no fixed scale (z-scores summed with weights, reciprocal
ranks, ...). For the configurations calibrated here, :meth:`Retriever.search`
also gives each hit a **relevance**: the probability that the hit is what the
question needs, a logistic map of its fused score fitted held out on LoCoMo;
``search(..., min_score=x)`` keeps the hits whose relevance is at least ``x``
(``res.meta["relevance"]``: (B, k) float32, in the order of the hits). A hit's
``score`` stays the fused score.

Calibrated (:data:`CALIBRATED`):

* the default configuration (:func:`gpuir.retrieve.config.default_config`:
  session BM25 + turn BM25 pooled by log-sum-exp + the temporal channel, z-score
  fusion), ``unit="session"``: a logistic map of the fused score and the log of
  the number of records the question may see; label "the session holds one of
  the question's evidence turns", LoCoMo's 1,982 questions with evidence, top 10
  sessions each, asked of their whole conversation and of memories of 2 and 5 of
  its sessions (one holding an evidence session), fitted leave-one-conversation-out (``bench/retriever_calibrate.py``,
  ``bench/results/retriever_calibrate_locomo.json``; held-out precision in
  ``docs/retriever.md``).

Any other configuration or unit has no relevance, and ``min_score`` is refused
there with a message (per-channel ``ChannelConfig(min_score=...)`` filters raw
channel scores). For records, :meth:`gpuir.Memory.search` with
``ranking="hybrid"`` scores every hit by a calibrated relevance
(:mod:`gpuir.memory.hybrid`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .config import RetrieverConfig, default_config

__all__ = ["CALIBRATED", "N_RANGE", "calibration", "check_min_relevance", "relevance_of"]

#: unit -> logistic coefficients (b0, b1, b2) of ``1 / (1 + exp(-(b0 + b1 * fused + b2 * log(n))))`` for the
#: default configuration, ``n`` the records the question may see (the memory's, or its ``where``'s).
CALIBRATED: dict[str, tuple[float, float, float]] = {"session": (1.8054, 1.8711, -1.0521)}
#: unit -> the memory sizes (records) the map was fitted on: ``n`` is clamped to this range.
N_RANGE: dict[str, tuple[float, float]] = {"session": (23.0, 689.0)}


def _scoring(cfg: dict[str, Any]) -> dict[str, Any]:
    """What decides the fused scores (the parallel flag does not)."""
    return {k: v for k, v in cfg.items() if k != "parallel"}


def calibration(config: RetrieverConfig, unit: str) -> tuple[float, float, float] | None:
    """The relevance map of ``config`` at ``unit``, or None where it was not calibrated."""
    if unit not in CALIBRATED:
        return None
    if _scoring(config.to_config()) != _scoring(default_config().to_config()):
        return None
    return CALIBRATED[unit]


def check_min_relevance(min_score: Any) -> float | None:
    """``min_score`` of :meth:`Retriever.search`: None or a number in [0, 1]."""
    if min_score is None:
        return None
    if isinstance(min_score, bool) or not isinstance(min_score, (int, float, np.integer, np.floating)) or not (
            math.isfinite(float(min_score)) and 0.0 <= float(min_score) <= 1.0):
        raise ValueError(f"min_score is a relevance between 0 and 1, got {min_score!r}")
    return float(min_score)


def relevance_of(scores: np.ndarray, n: np.ndarray, coef: tuple[float, float, float],
                 n_range: tuple[float, float] = (1.0, np.inf)) -> np.ndarray:
    """Relevance of fused scores.

    Parameters
    ----------
    scores : ndarray, shape (B, k), float; -inf pads
    n : ndarray, shape (B,): the records each question may see, clamped to ``n_range``
    coef : (b0, b1, b2), :data:`CALIBRATED`
    n_range : (low, high), :data:`N_RANGE`

    Returns
    -------
    ndarray, shape (B, k), float32, NaN at padding; increasing in the score (``b1 > 0``), so each row
    stays in order.
    """
    b0, b1, b2 = coef
    s = np.asarray(scores, np.float64)
    logn = np.log(np.clip(np.asarray(n, np.float64), *n_range)).reshape(-1, 1)
    z = np.clip(b0 + b1 * np.where(np.isfinite(s), s, 0.0) + b2 * logn, -500.0, 500.0)
    return np.where(np.isfinite(s), 1.0 / (1.0 + np.exp(-z)), np.nan).astype(np.float32)
