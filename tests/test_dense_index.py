"""DenseIndex: exact (NumPy / CuPy) and FAISS kinds behind one search, with filters and ties."""

from __future__ import annotations

import numpy as np
import pytest

from gpuir.backends.base import topk_from_dense
from gpuir.dense.index import DenseIndex, topk_rows


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    docs = rng.normal(size=(700, 24)).astype(np.float32)
    docs[600:610] = docs[0]  # exact duplicates: ties
    q = rng.normal(size=(11, 24)).astype(np.float32)
    q[3] = docs[0]
    return docs, q


def reference(docs, q, k, allow=None):
    d = docs / np.linalg.norm(docs, axis=1, keepdims=True)
    qq = q / np.linalg.norm(q, axis=1, keepdims=True)
    s = (qq.astype(np.float64) @ d.T.astype(np.float64)).astype(np.float32)
    s = (qq @ d.T).astype(np.float32)
    if allow is not None:
        for i, a in enumerate(allow):
            if a is not None:
                m = np.full(s.shape[1], -np.inf, np.float32)
                m[a] = s[i, a]
                s[i] = m
    return topk_from_dense(s, k)


@pytest.mark.parametrize("k", [1, 10, 800])
def test_exact_matches_reference(backend, data, k):
    docs, q = data
    ix = DenseIndex(docs, backend=backend)
    got = ix.search(q, k)
    ref = reference(docs, q, k)
    np.testing.assert_allclose(got.scores, ref.scores, rtol=1e-5, atol=1e-6)
    if backend == "numpy":
        np.testing.assert_array_equal(got.ids, ref.ids)
    assert got.meta["backend"] == backend
    # duplicates of doc 0 tie for query 3: lower doc number first
    if k >= 11:
        assert got.ids[3, :11].tolist() == [0] + list(range(600, 610))
    if k == 800:
        assert (got.ids[:, 700:] == -1).all() and np.isneginf(got.scores[:, 700:]).all()


@pytest.mark.parametrize("kind", ["exact", "flat", "hnsw"])
def test_filters(kind, data):
    docs, q = data
    allow = [np.array([5, 1, 3]), None, np.array([], np.int64), np.arange(0, 700, 2)] + [None] * 7
    ix = DenseIndex(docs, kind=kind, backend="numpy")
    got = ix.search(q, 5, filters=allow)
    ref = reference(docs, q, 5, [a if a is None else np.unique(a) for a in allow])
    np.testing.assert_array_equal(got.ids[[0, 2, 3]], ref.ids[[0, 2, 3]])
    assert got.ids[0, 3:].tolist() == [-1, -1] and (got.ids[2] == -1).all()
    assert set(got.ids[3].tolist()) <= set(range(0, 700, 2))
    if kind != "hnsw":
        np.testing.assert_array_equal(got.ids, ref.ids)
    # boolean mask for all queries; string ids
    mask = np.zeros(700, bool)
    mask[10:20] = True
    got = ix.search(q, 3, filters=mask)
    assert ((got.ids >= 10) & (got.ids < 20)).all()
    ix2 = DenseIndex(docs[:4], kind=kind, backend="numpy", ids=["a", "b", "c", "d"])
    got = ix2.search(docs[:1], 2, filters=[np.array(["c", "a"])])
    assert got.ids.tolist() == [[0, 2]]


def test_flat_and_hnsw_agree_with_exact(data):
    docs, q = data
    ref = DenseIndex(docs, backend="numpy").search(q, 10)
    flat = DenseIndex(docs, kind="flat").search(q, 10)
    np.testing.assert_allclose(flat.scores, ref.scores, rtol=1e-5, atol=1e-6)
    hnsw = DenseIndex(docs, kind="hnsw", ef_search=256).search(q, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(hnsw.ids.tolist(), ref.ids.tolist())])
    assert recall >= 0.9


def test_errors(data):
    docs, q = data
    with pytest.raises(ValueError):
        DenseIndex(docs, kind="ivf")
    ix = DenseIndex(docs, backend="numpy")
    with pytest.raises(ValueError):
        ix.search(q[:, :5], 3)
    with pytest.raises(ValueError):
        ix.search(q, 0)
    with pytest.raises(ValueError):
        ix.search(q, 3, filters=[None])


def test_topk_rows_ties_and_inf():
    s = np.array([[1.0, 3.0, 3.0, -np.inf, 2.0]], np.float32)
    ids, _ = topk_rows(s, 4)
    assert ids.tolist() == [[1, 2, 4, 0]]
    ids, _sc = topk_rows(s, 6)
    assert ids.tolist() == [[1, 2, 4, 0, -1, -1]]
    ids, _ = topk_rows(s, 1)
    assert ids.tolist() == [[1]]


def test_numba_backend_request_runs_dense_work_on_numpy(monkeypatch):
    """GPUIR_BACKEND=numba (the compiled BM25 scorer) must not break the dense channel: it runs on NumPy."""
    from gpuir.backends import resolve_array_backend

    monkeypatch.setenv("GPUIR_BACKEND", "numba")
    assert resolve_array_backend("auto")[0] == "numpy"
    assert resolve_array_backend("auto", np.zeros(3, np.float32))[0] == "numpy"
    assert DenseIndex(np.eye(3, dtype=np.float32)).backend == "numpy"
    monkeypatch.delenv("GPUIR_BACKEND")
    assert resolve_array_backend("numba")[0] == "numpy"
    monkeypatch.setenv("GPUIR_BACKEND", "tpu")
    with pytest.raises(ValueError, match="choose one of"):
        resolve_array_backend("auto")
    with pytest.raises(ValueError):
        DenseIndex(np.eye(3, dtype=np.float32))


def test_explicit_numpy_never_imports_cupy():
    """backend='numpy' resolves without importing CuPy (a fresh interpreter shows it)."""
    import subprocess
    import sys

    code = ("import sys; from gpuir.dense import DenseIndex, segment_reduce; import numpy as np; "
            "DenseIndex(np.eye(3, dtype=np.float32), backend='numpy').search(np.eye(3, dtype=np.float32), 2); "
            "segment_reduce(np.ones((1, 2)), np.array([0, 2]), backend='numpy'); "
            "print('cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cupy_without_device_raises_device_unavailable(monkeypatch):
    from gpuir import backends
    from gpuir.backends import DeviceUnavailable

    monkeypatch.delenv("GPUIR_BACKEND", raising=False)
    monkeypatch.setattr(backends, "cuda_device", lambda: (False, "no driver here"))
    with pytest.raises(DeviceUnavailable, match="no driver here") as ei:
        DenseIndex(np.eye(3, dtype=np.float32), backend="cupy")
    assert "\n" not in str(ei.value) and "backend='numpy'" in str(ei.value)
    from gpuir.dense import segment_reduce

    with pytest.raises(DeviceUnavailable):
        segment_reduce(np.ones((1, 2)), np.array([0, 2]), backend="cupy")


def same_but_rounding(got, ref) -> None:
    """``got``'s ids are ``ref``'s, except that documents whose scores agree to float32 rounding may change
    places: a matrix product may round a last bit differently for two equal vectors (OpenBLAS does, by
    their rows' places in its blocks: doc 0 against its duplicates 600-609 in ``data``) and FAISS's for
    none (the module docstring's contract)."""
    np.testing.assert_allclose(got.scores, ref.scores, rtol=1e-5, atol=1e-6)
    swapped = got.ids != ref.ids
    if swapped.any():
        i, j = np.nonzero(swapped)
        assert np.abs(ref.scores[i, j] - got.scores[i, j]).max() <= 1e-6
        assert all(sorted(a) == sorted(b) for a, b in zip(got.ids.tolist(), ref.ids.tolist()))


@pytest.mark.parametrize("k", [1, 5, 11, 12, 800])
def test_flat_faiss_same_ids_as_numpy_under_the_tie_rule(data, k):
    """IndexFlatIP (exact) gives the NumPy path's ids, also where many documents tie at the k-th score."""
    pytest.importorskip("faiss")
    docs, q = data
    ref = DenseIndex(docs, backend="numpy").search(q, k)
    flat = DenseIndex(docs, kind="flat").search(q, k)
    same_but_rounding(flat, ref)
    if k in (5, 11):  # query 3 equals doc 0, which has 10 duplicates: the lowest numbers win
        assert flat.ids[3, :k].tolist() == ([0] + list(range(600, 610)))[:k]
    # ties also through a filter (IDSelectorBatch, above the exact_below cut)
    allow = [np.arange(0, 700, 1)] + [None] * 10
    got = DenseIndex(docs, kind="flat", exact_below=10).search(q, k, filters=allow)
    same_but_rounding(got, ref)
