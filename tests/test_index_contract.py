"""BM25Index is a one-segment snapshot searched through the segment-set contract (issue 34, item 1).

* ``BM25Index.search`` reaches scoring only through the engine serving its backend (a registered engine
  counts the calls, and what it returns is what the user gets);
* the index's segment set is a complete segment set: engines that know nothing of its own statistics
  (the ``-stats`` engines, the compiled segment driver) return the static path's ids and score bits for
  every BM25 variant, with ``where``, masks and allow-lists, k above N, empty and unknown queries;
* the static path returns what the scorer it wraps returns when called directly (ids, score bits, meta).
"""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import random_corpus

from gpuir import METHODS, BM25Index
from gpuir.backends import contract, numba_available, segment_engine, use_engine
from gpuir.backends.contract import SegmentEngine, SegmentHits

BACKENDS = ["numpy"] + (["numba"] if numba_available()[0] else [])
U32 = np.uint32


def _bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(U32)


def _same(a, b, what=""):
    assert np.array_equal(np.asarray(a.ids), np.asarray(b.ids)), what
    assert np.array_equal(_bits(a.scores), _bits(b.scores)), what


@pytest.fixture
def registry(monkeypatch):
    """Engines registered inside a test are forgotten after it."""
    monkeypatch.setattr(contract, "_registry", dict(contract._registry))
    monkeypatch.setattr(contract, "_instances", dict(contract._instances))
    return contract


class Counting(SegmentEngine):
    """An engine that counts its calls and hands them to another."""

    def __init__(self, inner: SegmentEngine):
        self.inner = inner
        self.name, self.backend = "test-counting", inner.backend
        self.calls: list[tuple[int, int, tuple]] = []

    def search(self, segset, view_ids, batch, k):
        self.calls.append((batch.size, k, tuple(view_ids)))
        return self.inner.search(segset, view_ids, batch, k)


def _index(method="lucene", n=300, seed=3):
    texts = random_corpus(n, 40, seed=seed)
    return BM25Index.build(texts, ids=[f"d{i}" for i in range(n)], analyzer="plain", method=method), texts


def _queries(texts, n=12, seed=5):
    rng = np.random.default_rng(seed)
    words = sorted({w for t in texts for w in t.split()})
    qs = [" ".join(rng.choice(words, size=int(rng.integers(1, 6)))) for _ in range(n)]
    return qs + ["", "nosuchword", f"{words[0]} {words[0]} {words[1]}"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_search_reaches_scoring_only_through_the_engine(backend, registry):
    idx, texts = _index()
    qs = _queries(texts)
    plain = idx.search(qs, k=7, backend=backend)
    registry.register_engine("test-counting", lambda: Counting(segment_engine(backend)))
    with use_engine(backend, "test-counting") as eng:
        got = idx.search(qs, k=7, backend=backend)
        idx.search(qs[0], k=3, backend=backend, where={"id": {"in": ["d1", "d2"]}})
    assert eng.calls == [(len(qs), 7, (0,)), (1, 3, (0,))]
    _same(plain, got, backend)
    assert got.meta["backend"] == backend
    assert got.hits(0) == plain.hits(0) and got.ids(0) == plain.ids(0)


def test_an_engine_factory_may_make_the_engine_it_wraps(registry):
    """A registered factory that asks for a built-in engine not made yet gets it (the registry's lock is
    re-entrant; a plain lock hung here)."""
    import threading

    registry._instances.pop("numpy-stats", None)
    registry.register_engine("test-counting", lambda: Counting(segment_engine("numpy-stats")))
    got = []
    t = threading.Thread(target=lambda: got.append(segment_engine("test-counting")), daemon=True)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "the registry deadlocked"
    assert isinstance(got[0], Counting) and got[0].inner is segment_engine("numpy-stats")


@pytest.mark.parametrize("backend", BACKENDS)
def test_what_the_engine_returns_is_what_the_user_gets(backend, registry):
    """No scorer is called beside the engine: an engine answering one fixed hit is the whole answer."""

    class Fixed(SegmentEngine):
        name, backend_ = "test-fixed", backend

        def search(self, segset, view_ids, batch, k):
            out = SegmentHits.empty(batch.size, k)
            out.seqs[:, 0] = out.rows[:, 0] = 4
            out.views[:, 0] = 0
            out.scores[:, 0] = 2.5
            return out

    idx, texts = _index()
    registry.register_engine("test-fixed", Fixed)
    with use_engine(backend, "test-fixed"):
        res = idx.search(_queries(texts)[:3], k=5, backend=backend)
    assert np.asarray(res.ids).tolist() == [[4, -1, -1, -1, -1]] * 3
    assert res.scores[:, 0].tolist() == [2.5] * 3 and np.isneginf(res.scores[:, 1:]).all()
    assert res.hits(2) == [{"id": "d4", "score": 2.5}]
    assert res.meta["backend"] == backend and "analyze_s" in res.meta["timings"]


def _filters(idx, n_queries):
    rng = np.random.default_rng(9)
    mask = rng.random(idx.n_docs) < 0.3
    some = [f"d{i}" for i in rng.choice(idx.n_docs, 40, replace=False)]
    per_query = [None if i % 3 else {"id": {"in": some[: 5 + i]}} for i in range(n_queries)]
    return [
        {"where": None},
        {"where": {"id": {"in": some}}},
        {"where": {"id": {"nin": some}}},
        {"where": per_query},
        {"filters": mask},
        {"filters": [None if i % 2 else np.flatnonzero(mask)[: 3 + i] for i in range(n_queries)]},
    ]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_engines_without_the_static_path_return_the_same_bits(method, backend):
    """The ``-stats`` engine searches the index's set as any set (statistics per segment, no static cache)."""
    idx, texts = _index(method)
    qs = _queries(texts)
    for kw in _filters(idx, len(qs)):
        for k in (1, 10, idx.n_docs + 50):
            want = idx.search(qs, k=k, backend=backend, **kw)
            with use_engine(backend, f"{backend}-stats"):
                got = idx.search(qs, k=k, backend=backend, **kw)
            _same(want, got, f"{method} {backend} {kw} k={k}")
            assert "postings_rows" not in got.meta  # (the generic path ran: no scorer meta passed on)
            assert np.isneginf(got.scores[np.asarray(got.ids) < 0]).all()


@pytest.mark.skipif(not numba_available()[0], reason="numba does not import")
@pytest.mark.parametrize("method", METHODS)
def test_the_compiled_segment_driver_reads_the_index_set_alike(method):
    """The memory's compiled driver (block index and small-segment paths) over the index's one segment."""
    from gpuir.backends import numba_segments

    for n in (40, 300):  # a small segment (scored without a block index), a large one
        idx, texts = _index(method, n=n, seed=n)
        qs = _queries(texts)
        segset = idx.segment_set()
        for kw in _filters(idx, len(qs))[:4]:
            want = idx.search(qs, k=8, backend="numpy", **kw)
            from gpuir.filters import where_to_filters

            allow = where_to_filters(kw["where"], len(qs), idx.n_docs, idx.id_to_num) if kw["where"] else None
            batch = segset.batch(idx.query_terms(qs), allow)
            for _ in range(2):  # the snapshot's first search, then its cached weights
                out_i, out_f, _ = numba_segments.search_compiled(segset, (0,), batch, 8)
                assert np.array_equal(out_i[0], np.asarray(want.ids)), (method, n, kw)
                assert np.array_equal(_bits(out_f), _bits(want.scores)), (method, n, kw)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_static_path_is_the_scorers(method, backend):
    """Through the contract, the scorer's own path: the bits and the meta of calling it directly (the path
    BM25Index.search took before it went through the contract)."""
    idx, texts = _index(method)
    qs = _queries(texts)
    terms = idx.query_terms(qs)
    rng = np.random.default_rng(2)
    allow = [None if i % 2 else np.sort(rng.choice(idx.n_docs, 60, replace=False)) for i in range(len(qs))]
    for al in (None, allow):
        direct = idx.scorer(backend).search(terms, 9, al)
        got = idx.search(qs, k=9, backend=backend, filters=al)
        _same(direct, got, f"{method} {backend}")
        assert set(direct.meta) | {"backend_reason"} == set(got.meta)
        assert np.array_equal(direct.meta["postings_rows"], got.meta["postings_rows"])
    assert idx.scorer(backend) is idx.segment_set().scorer(backend)  # one scorer, one layout


@pytest.mark.parametrize("method", METHODS)
def test_cupy_through_the_contract_on_the_real_kernel_bodies(method, registry, monkeypatch):
    """BM25Index.search(backend="cupy") goes through the cupy engine to the tile scorer, run on the real
    kernel bodies on the CPU (``tests/cuda_host``): the NumPy reference's ids and score bits."""
    cuda_host = pytest.importorskip("cuda_host")
    if cuda_host.find_compiler()[0] is None:
        pytest.skip(f"no C++20 compiler for the host emulation: {cuda_host.find_compiler()[1]}")
    from cuda_host.device import real_kernels_installed, small_blocks

    from gpuir import backends
    from gpuir.backends import cupy_backend as cb

    idx, texts = _index(method, n=400, seed=8)
    qs = _queries(texts, n=6)
    kws = [{"where": None}, {"where": {"id": {"in": [f"d{i}" for i in range(0, 400, 3)]}}}]
    want = [idx.search(qs, k=8, backend="numpy", **kw) for kw in kws]
    with small_blocks(), real_kernels_installed(schedule="forward"):
        monkeypatch.setattr(backends, "cuda_device", cb.cuda_device)  # the emulated device, for "cupy"
        inner = segment_engine("cupy")
        registry.register_engine("test-counting", lambda: Counting(inner))
        with use_engine("cupy", "test-counting") as eng:
            got = [idx.search(qs, k=8, backend="cupy", **kw) for kw in kws]
        assert isinstance(idx.scorer("cupy"), cb.CupyScorer)
    assert eng.calls == [(len(qs), 8, (0,))] * 2
    for w, g in zip(want, got):
        assert g.meta["backend"] == "cupy" and "prep_s" in g.meta["timings"]  # the tile scorer's meta
        assert np.array_equal(np.asarray(w.ids), np.asarray(g.ids)), method
        # (up to the sign of zero, as the kernel tests compare)
        assert np.array_equal(_bits(w.scores) & U32(0x7FFFFFFF), _bits(g.scores) & U32(0x7FFFFFFF)), method
