"""Cluster bootstrap, paired bootstrap, leave-one-group-out selection."""

from __future__ import annotations

import numpy as np
import pytest

from gpuir.eval.stats import bootstrap_ci, bootstrap_table, leave_one_group_out, paired_bootstrap


def test_bootstrap_ci_iid_matches_normal_approximation():
    rng = np.random.default_rng(0)
    v = (rng.random(2000) < 0.6).astype(float)
    iv = bootstrap_ci(v, n_boot=4000, seed=1)
    se = np.sqrt(v.mean() * (1 - v.mean()) / v.size)
    assert iv.mean == pytest.approx(v.mean())
    assert iv.lo == pytest.approx(v.mean() - 1.96 * se, abs=0.006)
    assert iv.hi == pytest.approx(v.mean() + 1.96 * se, abs=0.006)
    assert iv.n == 2000 and iv.n_clusters == 2000


def test_cluster_bootstrap_is_wider_for_correlated_clusters():
    rng = np.random.default_rng(3)
    # 10 clusters of 200 questions; cluster means differ a lot
    groups = np.repeat(np.arange(10), 200)
    p = rng.uniform(0.2, 0.9, size=10)[groups]
    v = (rng.random(groups.size) < p).astype(float)
    iid = bootstrap_ci(v, n_boot=3000)
    clu = bootstrap_ci(v, groups, n_boot=3000)
    assert clu.n_clusters == 10
    assert (clu.hi - clu.lo) > 2 * (iid.hi - iid.lo)
    # deterministic for a seed; table agrees with the single-metric version
    assert bootstrap_ci(v, groups, n_boot=3000) == clu
    tab = bootstrap_table({"a": v, "b": 1 - v}, groups, n_boot=3000)
    assert tab["a"] == clu
    assert tab["b"].mean == pytest.approx(1 - clu.mean)


def test_bootstrap_edge_cases():
    iv = bootstrap_ci(np.array([]))
    assert iv.n == 0 and np.isnan(iv.mean)
    const = bootstrap_ci(np.ones(50), np.arange(50) % 5)
    assert const.lo == const.hi == const.mean == 1.0
    with pytest.raises(ValueError, match="one label per value"):
        bootstrap_ci(np.ones(3), [0, 1])
    with pytest.raises(ValueError, match="alpha"):
        bootstrap_ci(np.ones(3), alpha=1.5)


def test_paired_bootstrap():
    rng = np.random.default_rng(7)
    base = (rng.random(1000) < 0.5).astype(float)
    better = np.where(rng.random(1000) < 0.15, 1.0, base)
    r = paired_bootstrap(better, base, n_boot=4000)
    assert r["delta"] > 0 and r["lo"] > 0 and r["p"] < 0.001
    assert r["wins"] > 0 and r["losses"] == 0
    same = paired_bootstrap(base, base)
    assert same["delta"] == 0 and same["p"] == 1.0
    noise = np.where(rng.random(1000) < 0.5, base, 1 - base)
    flip = paired_bootstrap(noise, base, n_boot=4000)
    assert flip["lo"] < flip["delta"] < flip["hi"]
    # clusters make the test more conservative when clusters share a shift
    g = np.arange(1000) // 100
    shift = np.where(np.isin(g, [0, 1]), 1.0, 0.0)
    a = np.clip(base + shift * (rng.random(1000) < 0.4), 0, 1)
    p_iid = paired_bootstrap(a, base, n_boot=4000)["p"]
    p_clu = paired_bootstrap(a, base, g, n_boot=4000)["p"]
    assert p_clu > p_iid
    with pytest.raises(ValueError, match="one shape"):
        paired_bootstrap(np.ones(3), np.ones(4))


def test_leave_one_group_out():
    groups = np.repeat(["c1", "c2", "c3"], 4)
    s = {
        "A": np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], float),  # mean 8/12
        "B": np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0], float),  # mean 7/12
    }
    r = leave_one_group_out(s, groups)
    # holding out c1: A on c2+c3 = 4/8, B = 7/8 -> B; c2: A 8/8 vs B 3/8 -> A; c3: A 4/8, B 4/8 -> tie -> A
    assert r["chosen"] == {"c1": "B", "c2": "A", "c3": "A"}
    np.testing.assert_array_equal(r["heldout"], [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    assert r["mean"] == pytest.approx(4 / 12)
    assert r["best_overall"] == "A" and r["best_overall_mean"] == pytest.approx(8 / 12)
    with pytest.raises(ValueError, match="two groups"):
        leave_one_group_out(s, ["c"] * 12)
