"""Cross-validated selection (gpuir.eval.selection): folds, the best / cheapest / per-stratum rules."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from gpuir.eval.selection import cv_folds, cv_select, stratified_folds
from gpuir.eval.stats import leave_one_group_out


def test_stratified_folds_balance_each_stratum():
    strata = ["a"] * 10 + ["b"] * 7 + ["c"] * 3
    f = stratified_folds(strata, k=5, seed=1)
    assert f.shape == (20,) and set(f.tolist()) <= set(range(5))
    for s in "abc":
        counts = Counter(f[np.array(strata) == s].tolist())
        sizes = [counts.get(i, 0) for i in range(5)]
        assert max(sizes) - min(sizes) <= 1, (s, sizes)
    sizes = Counter(f.tolist())
    assert max(sizes.values()) - min(sizes.values()) <= 1  # small strata spread over folds, not all in fold 0
    np.testing.assert_array_equal(f, stratified_folds(strata, k=5, seed=1))  # seeded
    with pytest.raises(ValueError, match="k >= 2"):
        stratified_folds(strata, k=1)
    with pytest.raises(ValueError, match="at least 5"):
        stratified_folds(["a"] * 3, k=5)


def test_cv_folds_schemes():
    q = [SimpleNamespace(group=f"c{i % 3}", category="x" if i % 2 else "y") for i in range(12)]
    assert cv_folds(q).tolist() == [f"c{i % 3}" for i in range(12)]  # <= 20 groups: leave one group out
    many = [SimpleNamespace(group=f"q{i}", category="x" if i % 2 else "y") for i in range(40)]
    f = cv_folds(many)
    assert set(f.tolist()) == set(range(5))  # > 20 groups: stratified 5-fold
    with pytest.raises(ValueError, match="scheme"):
        cv_folds(q, scheme="nope")


def test_cv_select_best_matches_leave_one_group_out():
    groups = np.repeat(["c1", "c2", "c3"], 4)
    s = {"A": np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], float),
         "B": np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0], float)}
    r = cv_select(s, groups)
    # by hand: held out c1 -> B (7/8 vs 4/8); c2 -> A; c3 -> tie 4/8 -> first (A)
    assert r["chosen"] == {"c1": "B", "c2": "A", "c3": "A"}
    np.testing.assert_array_equal(r["heldout"], [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    assert r["heldout_setting"] == ["B"] * 4 + ["A"] * 8
    lo = leave_one_group_out(s, groups)
    assert lo["chosen"] == r["chosen"] and lo["mean"] == r["mean"]


def test_cv_select_cheapest_within_tolerance():
    folds = np.repeat([0, 1], 4)
    # tau grid: "lo" escalates every question and scores 1.0; "hi" escalates none and scores 0.75
    s = {"lo": np.ones(8), "hi": np.array([1, 1, 1, 0, 1, 1, 1, 0], float)}
    cost = {"lo": np.ones(8), "hi": np.zeros(8)}
    strict = cv_select(s, folds, cost=cost, tolerance=0.0)
    assert strict["chosen"] == {0: "lo", 1: "lo"} and strict["mean"] == 1.0
    loose = cv_select(s, folds, cost=cost, tolerance=0.3)
    assert loose["chosen"] == {0: "hi", 1: "hi"} and loose["mean"] == 0.75
    assert loose["heldout_cost"].sum() == 0
    with pytest.raises(ValueError, match="cost must have the shape"):
        cv_select(s, folds, cost={"lo": np.ones(3), "hi": np.ones(3)})


def test_cv_select_per_stratum_table():
    folds = np.array([0, 0, 1, 1, 0, 0, 1, 1])
    by = np.array(["t", "t", "t", "t", "u", "u", "u", "u"])
    # "x" is right on type t, "y" on type u
    s = {"x": np.array([1, 1, 1, 1, 0, 0, 0, 0], float), "y": np.array([0, 0, 0, 0, 1, 1, 1, 1], float)}
    r = cv_select(s, folds, by=by)
    assert r["chosen"] == {0: {"t": "x", "u": "y"}, 1: {"t": "x", "u": "y"}}
    assert r["mean"] == 1.0
    assert cv_select(s, folds)["mean"] == 0.5  # one choice for all cannot be right on both types


def test_cv_select_rejects_bad_input():
    with pytest.raises(ValueError, match="two folds"):
        cv_select({"a": np.ones(3)}, [0, 0, 0])
    with pytest.raises(ValueError, match="NaN"):
        cv_select({"a": np.array([1.0, np.nan])}, [0, 1])
    with pytest.raises(ValueError, match="one label per question"):
        cv_select({"a": np.ones(3)}, [0, 1])
