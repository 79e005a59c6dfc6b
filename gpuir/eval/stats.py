"""Uncertainty and model selection: cluster bootstrap, paired bootstrap, leave-one-group-out.

Questions of one LoCoMo conversation share a speaker pair and a history, so
they are not independent: the bootstrap resamples whole **clusters**
(conversations for LoCoMo; each LongMemEval question is its own cluster, which
makes it the ordinary bootstrap). The statistic is the mean over all questions
of the resampled clusters (a ratio estimator), so large conversations weigh
what they weigh in the point estimate.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def _clusters(n: int, clusters: Sequence[Hashable] | np.ndarray | None) -> tuple[np.ndarray, int]:
    if clusters is None:
        return np.arange(n, dtype=np.int64), n
    c = np.asarray(clusters)
    if c.shape != (n,):
        raise ValueError(f"clusters must have one label per value (shape ({n},)), got shape {c.shape}")
    _, codes = np.unique(c, return_inverse=True)
    return codes.astype(np.int64), int(codes.max()) + 1 if n else 0


def _paired(a, b, clusters) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-question differences ``a - b`` (float64, shape (n,)) and their cluster codes."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be 1-D arrays of one shape, got {a.shape} and {b.shape}")
    d = a - b
    codes, C = _clusters(d.size, clusters)
    return d, codes, C


def _cluster_weights(n_clusters: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """How often each cluster is drawn in each replicate: ndarray (n_boot, C), float64."""
    return rng.multinomial(n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=n_boot).astype(np.float64)


@dataclass(frozen=True)
class Interval:
    """A point estimate and its bootstrap percentile interval."""

    mean: float
    lo: float
    hi: float
    n: int
    n_clusters: int

    def to_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "lo": self.lo, "hi": self.hi, "n": self.n, "n_clusters": self.n_clusters}


def bootstrap_ci(
    values: np.ndarray,
    clusters: Sequence[Hashable] | np.ndarray | None = None,
    n_boot: int = 10000,
    alpha: float = 0.05,
    seed: int = 0,
) -> Interval:
    """Cluster bootstrap percentile interval of a mean.

    Parameters
    ----------
    values : ndarray, shape (n,), float
        Per-question metric values.
    clusters : sequence of n labels, optional
        Cluster of each value (e.g. the LoCoMo conversation); default: every value its own.
    n_boot : int
        Bootstrap replicates.
    alpha : float
        1 - coverage (0.05 gives a 95% interval).
    seed : int

    Returns
    -------
    Interval
        ``mean`` of all values, ``lo`` and ``hi`` the alpha/2 and 1 - alpha/2
        quantiles of the replicate means; nan for no values.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {v.shape}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    n = v.size
    codes, C = _clusters(n, clusters)
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0, 0)
    sums = np.bincount(codes, weights=v, minlength=C)
    counts = np.bincount(codes, minlength=C).astype(np.float64)
    w = _cluster_weights(C, n_boot, np.random.default_rng(seed))
    reps = (w @ sums) / (w @ counts)
    lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
    return Interval(float(v.mean()), float(lo), float(hi), int(n), int(C))


def bootstrap_table(
    values: Mapping[str, np.ndarray],
    clusters: Sequence[Hashable] | np.ndarray | None = None,
    n_boot: int = 10000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict[str, Interval]:
    """:func:`bootstrap_ci` of several metrics on the same questions, sharing the resamples.

    Parameters
    ----------
    values : mapping name -> ndarray, shape (n,), float
        Aligned per-question values of each metric.
    clusters, n_boot, alpha, seed : see :func:`bootstrap_ci`

    Returns
    -------
    dict name -> Interval
    """
    names = list(values)
    if not names:
        return {}
    V = np.stack([np.asarray(values[m], dtype=np.float64) for m in names], axis=1)  # (n, M)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    n = V.shape[0]
    codes, C = _clusters(n, clusters)
    if n == 0:
        nan = float("nan")
        return {m: Interval(nan, nan, nan, 0, 0) for m in names}
    sums = np.stack([np.bincount(codes, weights=V[:, j], minlength=C) for j in range(V.shape[1])], axis=1)
    counts = np.bincount(codes, minlength=C).astype(np.float64)
    w = _cluster_weights(C, n_boot, np.random.default_rng(seed))
    reps = (w @ sums) / (w @ counts)[:, None]  # (n_boot, M)
    q = np.quantile(reps, [alpha / 2, 1 - alpha / 2], axis=0)
    means = V.mean(axis=0)
    return {m: Interval(float(means[j]), float(q[0, j]), float(q[1, j]), int(n), int(C)) for j, m in enumerate(names)}


def paired_bootstrap(
    a: np.ndarray,
    b: np.ndarray,
    clusters: Sequence[Hashable] | np.ndarray | None = None,
    n_boot: int = 10000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict[str, float]:
    """Paired (cluster) bootstrap test of mean(a) - mean(b) on the same questions.

    The p-value is two-sided, from the replicate differences shifted to the
    null (mean zero): ``p = (1 + #{|d* - d| >= |d|}) / (1 + n_boot)``.

    Parameters
    ----------
    a, b : ndarray, shape (n,), float
        The two systems' per-question values, aligned.
    clusters : sequence of n labels, optional
    n_boot, alpha, seed : see :func:`bootstrap_ci`

    Returns
    -------
    dict with ``delta`` (mean(a) - mean(b)), ``lo``, ``hi`` (percentile interval
    of the difference), ``p``, ``n``, ``n_clusters``, ``wins``, ``losses`` (questions).
    """
    d, codes, C = _paired(a, b, clusters)
    n = d.size
    if n == 0:
        nan = float("nan")
        return {"delta": nan, "lo": nan, "hi": nan, "p": nan, "n": 0, "n_clusters": 0, "wins": 0, "losses": 0}
    sums = np.bincount(codes, weights=d, minlength=C)
    counts = np.bincount(codes, minlength=C).astype(np.float64)
    w = _cluster_weights(C, n_boot, np.random.default_rng(seed))
    reps = (w @ sums) / (w @ counts)
    delta = float(d.mean())
    lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
    extreme = np.abs(reps - delta) >= abs(delta) - 1e-15
    p = float((1 + extreme.sum()) / (1 + n_boot)) if delta != 0 else 1.0
    return {
        "delta": delta, "lo": float(lo), "hi": float(hi), "p": p, "n": int(n), "n_clusters": int(C),
        "wins": int((d > 0).sum()), "losses": int((d < 0).sum()),
    }


def paired_randomization(
    a: np.ndarray,
    b: np.ndarray,
    clusters: Sequence[Hashable] | np.ndarray | None = None,
    n_perm: int = 10000,
    seed: int = 0,
) -> dict[str, float]:
    """Paired randomisation (sign-flip) test of mean(a) - mean(b), flipping whole clusters.

    Under the null the two systems are exchangeable on every question, so each
    cluster's summed difference is equally likely to have either sign. The
    p-value is two-sided: ``p = (1 + #{|d*| >= |d|}) / (1 + n_perm)``.

    Parameters
    ----------
    a, b : ndarray, shape (n,), float
        The two systems' per-question values, aligned.
    clusters : sequence of n labels, optional
        Default: every question its own cluster.
    n_perm : int
    seed : int

    Returns
    -------
    dict with ``delta``, ``p``, ``n``, ``n_clusters``.
    """
    d, codes, C = _paired(a, b, clusters)
    n = d.size
    if n == 0:
        return {"delta": float("nan"), "p": float("nan"), "n": 0, "n_clusters": 0}
    sums = np.bincount(codes, weights=d, minlength=C)
    rng = np.random.default_rng(seed)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(n_perm, C))
    reps = (signs @ sums) / n
    delta = float(d.mean())
    p = float((1 + (np.abs(reps) >= abs(delta) - 1e-15).sum()) / (1 + n_perm)) if delta != 0 else 1.0
    return {"delta": delta, "p": p, "n": int(n), "n_clusters": int(C)}


def leave_one_group_out(
    scores: Mapping[Any, np.ndarray],
    groups: Sequence[Hashable] | np.ndarray,
) -> dict[str, Any]:
    """Leave-one-conversation-out selection of a hyperparameter (:func:`gpuir.eval.selection.cv_select`).

    For each group g, pick the setting with the best mean over the questions
    of all *other* groups (ties: the first setting in ``scores`` order), then
    score g's questions with it. The held-out mean is an honest estimate of
    "tune on the other conversations, deploy on this one".

    Parameters
    ----------
    scores : mapping setting -> ndarray, shape (n,), float
        Per-question metric of each candidate setting, aligned across settings.
    groups : sequence of n labels
        Group (conversation) of each question.

    Returns
    -------
    dict with
        ``heldout`` : ndarray (n,), float64, each question scored by the setting chosen without its group;
        ``mean`` : float, mean of ``heldout``;
        ``chosen`` : dict group -> setting;
        ``best_overall`` : the setting with the best mean on all questions (for comparison);
        ``best_overall_mean`` : float, its in-sample mean (optimistic).
    """
    from .selection import cv_select  # the one home of cross-validated selection

    if len(set(np.asarray(groups, dtype=object).tolist())) < 2:
        raise ValueError("leave-one-group-out needs at least two groups")
    r = cv_select(scores, groups)
    return {k: r[k] for k in ("heldout", "mean", "chosen", "best_overall", "best_overall_mean")}


__all__ = ["Interval", "bootstrap_ci", "bootstrap_table", "leave_one_group_out", "paired_bootstrap",
           "paired_randomization"]
