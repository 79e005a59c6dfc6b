"""Late-interaction pooling: NumPy reference vs brute force, and the CUDA kernel vs NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuir.dense.late_interaction import (
    POOLING_OPS,
    bm25_turn_late_interaction,
    late_interaction_scores,
    pool_turn_scores,
    segment_reduce,
    segment_reduce_numpy,
    segments_from_labels,
)
from gpuir.results import SearchResults


def brute(values, offsets, op, k, beta):
    B, S = values.shape[0], len(offsets) - 1
    out = np.full((B, S), -np.inf)
    for b in range(B):
        for s in range(S):
            v = [float(x) for x in values[b, offsets[s]: offsets[s + 1]]]
            if not v:
                continue
            if op == "mean":
                out[b, s] = sum(v) / len(v)
            elif op == "max":
                out[b, s] = max(v)
            elif op == "topk":
                top = sorted(v, reverse=True)[: min(k, len(v))]
                out[b, s] = sum(top) / len(top)
            elif op == "lse":
                out[b, s] = math.log(sum(math.exp(beta * x) for x in v)) / beta
            else:
                out[b, s] = math.log(sum(math.exp(beta * x) for x in v) / len(v)) / beta
    return out


def test_hand_values():
    x = np.array([[1, 2, 3, 4, 5.0]], np.float32)
    o = np.array([0, 2, 2, 5])
    assert segment_reduce_numpy(x, o, "mean").tolist() == [[1.5, -np.inf, 4.0]]
    assert segment_reduce_numpy(x, o, "max").tolist() == [[2.0, -np.inf, 5.0]]
    assert segment_reduce_numpy(x, o, "topk", pool_k=2).tolist() == [[1.5, -np.inf, 4.5]]
    lse = segment_reduce_numpy(x, o, "lse", beta=1.0)
    assert lse[0, 0] == pytest.approx(math.log(math.e + math.e**2), rel=1e-6)
    lme = segment_reduce_numpy(x, o, "lme", beta=1.0)
    assert lme[0, 2] == pytest.approx(math.log((math.e**3 + math.e**4 + math.e**5) / 3), rel=1e-6)


@pytest.mark.parametrize("op", POOLING_OPS)
def test_reference_matches_brute_force(op):
    rng = np.random.default_rng(1)
    lens = [3, 0, 1, 7, 2, 0, 5]
    o = np.concatenate([[0], np.cumsum(lens)])
    v = rng.normal(size=(4, o[-1])).astype(np.float32)
    v[:, 3:6] = 0.5  # ties inside a segment
    np.testing.assert_allclose(segment_reduce_numpy(v, o, op, pool_k=3, beta=5.0), brute(v, o, op, 3, 5.0), rtol=1e-5)


def test_lse_limits_and_stability():
    v = np.array([[100.0, 99.0, 98.0]], np.float32)  # exp(beta*v) overflows without the max shift
    o = np.array([0, 3])
    assert np.isfinite(segment_reduce_numpy(v, o, "lse", beta=50.0)).all()
    big = segment_reduce_numpy(v, o, "lme", beta=1e4)
    assert big[0, 0] == pytest.approx(100.0, abs=1e-3)


def test_bad_arguments():
    v = np.zeros((1, 2), np.float32)
    with pytest.raises(ValueError):
        segment_reduce_numpy(v, np.array([0, 2]), "median")
    with pytest.raises(ValueError):
        segment_reduce_numpy(v, np.array([0, 3]), "max")
    with pytest.raises(ValueError):
        segment_reduce_numpy(v, np.array([0, 2]), "lse", beta=0)


def test_segments_from_labels_and_pooling_any_order():
    lab = [2, 0, 2, 1, 0]
    order, offs = segments_from_labels(lab)
    assert offs.tolist() == [0, 2, 3, 5]
    assert order.tolist() == [1, 4, 3, 0, 2]
    s = np.array([[1.0, 5.0, 3.0, 2.0, 4.0]], np.float32)
    assert pool_turn_scores(s, lab, "max", backend="numpy").tolist() == [[5.0, 2.0, 3.0]]
    assert pool_turn_scores(s, lab, "mean", backend="numpy").tolist() == [[4.5, 2.0, 2.0]]


@pytest.mark.parametrize("op", POOLING_OPS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backend_parity(backend, op, dtype):
    """The kernel (cupy) against the NumPy reference; several blocks, big and empty segments."""
    rng = np.random.default_rng(2)
    lens = rng.integers(0, 40, size=300)
    lens[5] = 1000  # longer than a block
    lens[7] = 0
    o = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    v = rng.normal(size=(9, o[-1])).astype(dtype)
    v[:, 100:140] = dtype(0.25)  # ties
    ref = segment_reduce_numpy(v, o, op, pool_k=4, beta=8.0)
    got = segment_reduce(v, o, op, pool_k=4, beta=8.0, backend=backend)
    if backend == "cupy":
        assert type(got).__module__.startswith("cupy")
        got = got.get()
    assert got.dtype == dtype
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol)
    for kk in (1, 1000):  # k = 1 and k larger than any segment
        if op == "topk":
            np.testing.assert_allclose(
                np.asarray(segment_reduce(v, o, op, pool_k=kk, backend=backend).get()
                           if backend == "cupy" else segment_reduce(v, o, op, pool_k=kk, backend=backend)),
                segment_reduce_numpy(v, o, op, pool_k=kk), rtol=rtol, atol=rtol,
            )


def test_late_interaction_scores(backend):
    rng = np.random.default_rng(3)
    q = rng.normal(size=(5, 8)).astype(np.float32)
    t = rng.normal(size=(30, 8)).astype(np.float32)
    lab = rng.integers(0, 6, size=30)
    lab[:6] = np.arange(6)
    got = late_interaction_scores(q, t, lab, "max", backend=backend)
    exp = np.stack([[max(q[b] @ t[j] for j in range(30) if lab[j] == s) for s in range(6)] for b in range(5)])
    np.testing.assert_allclose(got, exp, rtol=1e-5)
    # mean pooling equals the inner product with the mean turn vector (early pooling)
    mean = late_interaction_scores(q, t, lab, "mean", backend=backend)
    centroids = np.stack([t[lab == s].mean(0) for s in range(6)])
    np.testing.assert_allclose(mean, q @ centroids.T, rtol=1e-4, atol=1e-5)


def test_bm25_turn_late_interaction():
    # 5 turns in 3 sessions; session 2 has no matching turn
    lab = [0, 0, 1, 1, 2]
    dense = np.array([[2.0, -np.inf, 1.0, 3.0, -np.inf]], np.float32)
    got = bm25_turn_late_interaction(dense, lab, op="max")
    assert got.tolist() == [[2.0, 3.0, -np.inf]]
    got = bm25_turn_late_interaction(dense, lab, op="mean")
    assert got.tolist() == [[1.0, 2.0, -np.inf]]  # unmatched turn counts as 0
    lst = SearchResults(np.array([[3, 0, 2, -1]]), np.array([[3.0, 2.0, 1.0, -np.inf]], np.float32))
    got = bm25_turn_late_interaction(lst, lab, n_sessions=4, op="topk", pool_k=2)
    assert got.tolist() == [[1.0, 2.0, -np.inf, -np.inf]]


def test_k_is_a_deprecated_spelling_of_pool_k():
    """``pool_k`` (turns averaged) is the name; ``k=`` still works, with a DeprecationWarning."""
    x = np.array([[1.0, 2.0, 4.0, 5.0]], np.float32)
    o = np.array([0, 4])
    want = segment_reduce_numpy(x, o, "topk", pool_k=2)
    assert want.tolist() == [[4.5]]
    with pytest.warns(DeprecationWarning, match="pool_k"):
        assert segment_reduce_numpy(x, o, "topk", k=2).tolist() == [[4.5]]
    with pytest.warns(DeprecationWarning, match="pool_k"):
        assert segment_reduce(x, o, "topk", k=2, backend="numpy").tolist() == [[4.5]]


def test_kernel_compiled_through_the_one_loader(monkeypatch):
    """segment_reduce.cu is compiled by gpuir.backends.kernels with its options (not a RawModule of its own)."""
    from gpuir.backends import kernels as K
    from gpuir.dense import late_interaction as L

    seen = {}

    def fake(filename, source, arch, ptx):
        seen.update(filename=filename, arch=arch, source=source)
        return b"\x7fELF-fake"

    monkeypatch.setattr(K, "_compile_nvrtc", fake)
    assert L.compile_segment_reduce("sm_90") == b"\x7fELF-fake"
    assert seen["filename"] == "segment_reduce.cu" and seen["arch"] == "90"
    assert seen["source"] == K.load_source("segment_reduce.cu")
    assert "segment_reduce.cu" in K.NAME_EXPRESSIONS
    import inspect

    assert "RawModule" not in inspect.getsource(L)
