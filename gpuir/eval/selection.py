"""Cross-validated selection of tuned numbers: the one home for every "chosen on the others" figure.

Anything tuned on the evaluation questions (a fusion weight, the cascade's
threshold ``tau``, per-question-type thresholds, a route table) is chosen by
cross-validation and reported on the held-out questions only:

* **LoCoMo**: leave-one-conversation-out (10 folds, each conversation held out
  once, the setting chosen on the other nine);
* **LongMemEval** (every question its own haystack): stratified k-fold (5 folds),
  stratified by question type, so every fold holds every type in proportion.

:func:`cv_folds` gives each question's fold, :func:`cv_select` does the selection
over a grid of candidate settings given their per-question metric, and returns
the held-out per-question values and the setting chosen for each fold.

Selection rules (``cv_select``):

* default: the setting with the best training mean (ties: the first in grid order);
* ``cost`` + ``tolerance`` (parity selection, e.g. the cascade's ``tau``): the
  cheapest setting (lowest mean training cost, e.g. the share of questions that
  escalate) whose training mean is within ``tolerance`` of the best training mean;
* ``by`` (per-stratum selection, e.g. per-question-type thresholds): the rule
  above applied separately to each stratum's training questions, so each fold
  chooses a table ``{stratum: setting}``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["cv_folds", "cv_select", "select_alpha_loco", "stratified_folds"]


def stratified_folds(strata: Sequence[Hashable] | np.ndarray, k: int = 5, seed: int = 0) -> np.ndarray:
    """Stratified k-fold assignment: each stratum's items dealt round-robin over the folds in a seeded shuffle.

    Parameters
    ----------
    strata : sequence of n labels
        The stratum of each item (e.g. LongMemEval's question type).
    k : int, >= 2
    seed : int

    Returns
    -------
    ndarray, shape (n,), int64, host
        Fold number in ``[0, k)`` of each item; within each stratum the fold
        sizes differ by at most one.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
        raise ValueError(f"k-fold needs k >= 2 folds, got {k!r}")
    labels = np.asarray(strata, dtype=object)
    n = labels.shape[0]
    if n < k:
        raise ValueError(f"{k}-fold cross-validation needs at least {k} items, got {n}")
    rng = np.random.default_rng(seed)
    fold = np.empty(n, dtype=np.int64)
    offset = 0
    for s in sorted(set(labels.tolist()), key=str):
        rows = np.flatnonzero(labels == s)
        rows = rows[rng.permutation(rows.size)]
        fold[rows] = (np.arange(rows.size) + offset) % k  # offset: small strata do not all land in fold 0
        offset = (offset + rows.size) % k
    return fold


def cv_folds(queries: Sequence[Any], scheme: str = "auto", k: int = 5, seed: int = 0) -> np.ndarray:
    """The cross-validation fold of each question.

    Parameters
    ----------
    queries : sequence of :class:`~gpuir.eval.datasets.EvalQuery`
    scheme : {"auto", "group", "stratified"}
        ``"group"``: one fold per ``q.group`` (LoCoMo: the conversation; leave one
        group out). ``"stratified"``: :func:`stratified_folds` by ``q.category``
        (LongMemEval: question type). ``"auto"``: ``"group"`` when there are
        between 2 and 20 groups, else ``"stratified"``.
    k, seed : folds and shuffle seed of the stratified scheme.

    Returns
    -------
    ndarray, shape (n,), object (group labels) or int64 (fold numbers)
    """
    groups = [q.group for q in queries]
    if scheme == "auto":
        scheme = "group" if 2 <= len(set(groups)) <= 20 else "stratified"
    if scheme == "group":
        return np.array(groups, dtype=object)
    if scheme == "stratified":
        return stratified_folds([q.category for q in queries], k=k, seed=seed)
    raise ValueError(f"scheme must be 'auto', 'group' or 'stratified', got {scheme!r}")


def _choose(M: np.ndarray, C: np.ndarray | None, train: np.ndarray, tolerance: float) -> int:
    """Index of the setting chosen on the training rows ``train`` of M (S, n) (and costs C)."""
    means = M[:, train].mean(axis=1)
    best = int(np.argmax(means))  # first maximum
    if C is None:
        return best
    ok = np.flatnonzero(means >= means[best] - tolerance - 1e-12)
    costs = C[ok][:, train].mean(axis=1)
    return int(ok[int(np.argmin(costs))])  # cheapest within tolerance; ties: grid order


def cv_select(
    scores: Mapping[Any, np.ndarray],
    folds: Sequence[Hashable] | np.ndarray,
    *,
    cost: Mapping[Any, np.ndarray] | None = None,
    tolerance: float = 0.0,
    by: Sequence[Hashable] | np.ndarray | None = None,
) -> dict[str, Any]:
    """Choose a setting on all folds but one, score the held-out fold with it, for every fold.

    Parameters
    ----------
    scores : mapping setting -> ndarray, shape (n,), float
        Per-question metric (higher is better) of each candidate setting, aligned
        across settings; settings are any hashable (a number, a tuple, a name).
    folds : sequence of n labels
        Fold of each question (:func:`cv_folds`); at least two distinct folds.
    cost : mapping setting -> ndarray, shape (n,), float, optional
        Per-question cost (e.g. 1.0 where the question escalated); with it the
        cheapest setting within ``tolerance`` of the best training mean is chosen.
    tolerance : float, >= 0
        Allowed loss of training mean against the best setting (with ``cost``).
    by : sequence of n labels, optional
        Stratum of each question (e.g. its predicted type): a setting is chosen
        per stratum, on that stratum's training questions (a stratum absent from
        a fold's training questions falls back to the choice over all of them).

    Returns
    -------
    dict with
        ``heldout`` : ndarray (n,), float64, each question scored by the setting chosen without its fold;
        ``heldout_setting`` : list of n settings, the one that scored each question;
        ``mean`` : float, mean of ``heldout``;
        ``chosen`` : dict fold -> setting (with ``by``: fold -> {stratum: setting});
        ``best_overall`` : the setting the rule picks on all questions (with ``by``: the table);
        ``best_overall_mean`` : float, its in-sample mean (optimistic: for comparison only);
        ``heldout_cost`` : ndarray (n,) of the chosen settings' costs (with ``cost``).
    """
    settings = list(scores)
    if not settings:
        raise ValueError("scores must hold at least one setting")
    M = np.stack([np.asarray(scores[s], dtype=np.float64) for s in settings])  # (S, n)
    if M.ndim != 2:
        raise ValueError("each setting's scores must be a 1-D array of one length")
    n = M.shape[1]
    if np.isnan(M).any():
        raise ValueError("scores hold NaN: pass only the scored questions")
    C = None
    if cost is not None:
        missing = [s for s in settings if s not in cost]
        if missing:
            raise ValueError(f"cost is missing setting(s) {missing[:3]}")
        C = np.stack([np.asarray(cost[s], dtype=np.float64) for s in settings])
        if C.shape != M.shape:
            raise ValueError(f"cost must have the shape of scores {M.shape}, got {C.shape}")
    if not (isinstance(tolerance, (int, float)) and tolerance >= 0):
        raise ValueError(f"tolerance must be a number >= 0, got {tolerance!r}")
    f = np.asarray(folds, dtype=object)
    if f.shape != (n,):
        raise ValueError(f"folds must have one label per question (shape ({n},)), got shape {f.shape}")
    fold_labels = sorted(set(f.tolist()), key=str)
    if len(fold_labels) < 2:
        raise ValueError("cross-validation needs at least two folds")
    strata = None
    if by is not None:
        strata = np.asarray(by, dtype=object)
        if strata.shape != (n,):
            raise ValueError(f"by must have one label per question (shape ({n},)), got shape {strata.shape}")
    heldout = np.empty(n, dtype=np.float64)
    hcost = np.empty(n, dtype=np.float64)
    hset: list[Any] = [None] * n
    chosen: dict[Any, Any] = {}

    def pick(train: np.ndarray, test: np.ndarray) -> Any:
        if strata is None:
            j = _choose(M, C, train, tolerance)
            heldout[test], hset_idx = M[j, test], j
            if C is not None:
                hcost[test] = C[j, test]
            for i in np.flatnonzero(test):
                hset[i] = settings[hset_idx]
            return settings[j]
        fallback = _choose(M, C, train, tolerance)
        table = {}
        for s in sorted(set(strata.tolist()), key=str):
            in_s = strata == s
            tr = train & in_s
            j = _choose(M, C, tr, tolerance) if tr.any() else fallback
            table[s] = settings[j]
            te = test & in_s
            heldout[te] = M[j, te]
            if C is not None:
                hcost[te] = C[j, te]
            for i in np.flatnonzero(te):
                hset[i] = settings[j]
        return table

    for g in fold_labels:
        test = f == g
        chosen[g.item() if hasattr(g, "item") else g] = pick(~test, test)
    # the same rule on all questions (in-sample, for comparison)
    saved = heldout.copy(), hcost.copy(), list(hset)
    everything = np.ones(n, dtype=bool)
    best = pick(everything, everything)
    best_mean = float(heldout.mean())
    heldout, hcost, hset = saved
    out = {"heldout": heldout, "heldout_setting": hset, "mean": float(heldout.mean()), "chosen": chosen,
           "best_overall": best, "best_overall_mean": best_mean}
    if C is not None:
        out["heldout_cost"] = hcost
    return out


def select_alpha_loco(metric: Any, groups: Sequence[Hashable] | np.ndarray, alphas: Sequence[float]) -> dict[str, Any]:
    """Choose a fusion weight by leave-one-group-out (e.g. leave-one-conversation-out): :func:`cv_select` over alphas.

    For each group g, the alpha maximising the mean per-query metric on all other
    groups is chosen (ties: the earlier alpha of the grid) and applied to g's
    queries, so no query's own label ever picks its alpha. With a single group the
    choice is made on all queries (in-sample).

    Parameters
    ----------
    metric : callable alpha -> ndarray, shape (Q,), float
        Per-query metric (e.g. Hit@1) of the fused run at that alpha.
    groups : sequence of Q hashables
        Group (conversation) of each query.
    alphas : sequence of float
        Grid.

    Returns
    -------
    dict with ``per_query`` (Q,) the held-out metric of every query,
    ``alpha_per_group`` {group: alpha}, ``curve`` (n_alphas, Q) the metric grid, ``alphas``.
    """
    alphas = [float(a) for a in alphas]
    curve = np.stack([np.asarray(metric(a), dtype=np.float64) for a in alphas])
    g = np.asarray(groups)
    labels = np.unique(g)
    if labels.size < 2:
        best = int(np.argmax(curve.mean(axis=1)))
        chosen = {x.item() if hasattr(x, "item") else x: alphas[best] for x in labels}
        return {"per_query": curve[best].copy(), "alpha_per_group": chosen, "curve": curve, "alphas": alphas}
    res = cv_select({j: curve[j] for j in range(len(alphas))}, g)
    chosen = {k.item() if hasattr(k, "item") else k: alphas[j] for k, j in res["chosen"].items()}
    return {"per_query": res["heldout"], "alpha_per_group": chosen, "curve": curve, "alphas": alphas}
