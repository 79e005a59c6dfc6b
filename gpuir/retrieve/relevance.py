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
  fusion), ``unit="session"``: label "the session holds one of the question's
  evidence turns", LoCoMo's 1,982 questions with evidence, top 10 sessions each,
  fitted leave-one-conversation-out (``bench/retriever_calibrate.py``,
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

__all__ = ["CALIBRATED", "calibration", "check_min_relevance", "relevance_of"]

#: unit -> logistic coefficients (b0, b1) of ``1 / (1 + exp(-(b0 + b1 * fused)))`` for the default configuration.
CALIBRATED: dict[str, tuple[float, float]] = {"session": (-4.5819, 1.7426)}


def _scoring(cfg: dict[str, Any]) -> dict[str, Any]:
    """What decides the fused scores (the parallel flag does not)."""
    return {k: v for k, v in cfg.items() if k != "parallel"}


def calibration(config: RetrieverConfig, unit: str) -> tuple[float, float] | None:
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


def relevance_of(scores: np.ndarray, coef: tuple[float, float]) -> np.ndarray:
    """Relevance of fused scores: ndarray (B, k) float32, NaN at padding (-inf scores).

    Increasing in the score (``b1 > 0``), so each row stays in order.
    """
    b0, b1 = coef
    s = np.asarray(scores, np.float64)
    z = np.clip(b0 + b1 * np.where(np.isfinite(s), s, 0.0), -500.0, 500.0)
    return np.where(np.isfinite(s), 1.0 / (1.0 + np.exp(-z)), np.nan).astype(np.float32)
