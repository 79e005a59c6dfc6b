"""The memory on the cupy backend in ONE device pass over all its segments (issue 34 item 2).

:mod:`gpuir.backends.devicesearch` hands the memory's cupy searches to
:class:`gpuir.backends.cupy_segments.CupySegmentsEngine` (the scatter kernel over the snapshot's
segments as one document space). Checked on the kernel model (the fake cupy) and on the real kernel
bodies run on the CPU (tests/cuda_host), for all five variants, while the memory grows, deletes and
merges: results equal the numpy engine's and a fresh index's bit for bit; a batch is one scoring pass
whatever the number of segments, with one copy of the results back; a segment is uploaded once.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
from _memory_oracle import Model, assert_same, grow_both, random_query, random_where

import gpuir.backends.cupy_scatter as cs
from gpuir import Memory
from gpuir.backends import cupy_segments as cseg
from gpuir.backends import devicesearch
from gpuir.backends import kernel_model as km
from gpuir.bm25 import METHODS


@contextlib.contextmanager
def device(kind: str, monkeypatch):
    from gpuir import backends
    from gpuir.backends import cupy_backend as cb

    monkeypatch.setattr(cs, "MIN_WIDTH", 64)
    with contextlib.ExitStack() as st:
        if kind == "model":
            st.enter_context(km.small_kernels())
            cp = st.enter_context(km.fake_cupy_installed(sm_count=4))
        else:
            cuda_host = pytest.importorskip("cuda_host")
            if cuda_host.find_compiler()[0] is None:
                pytest.skip(f"no C++20 compiler for the host emulation: {cuda_host.find_compiler()[1]}")
            from cuda_host.device import real_kernels_installed, small_blocks

            st.enter_context(small_blocks())
            cp = st.enter_context(real_kernels_installed(schedule="random", sm_count=4))
        monkeypatch.setattr(backends, "cuda_device", cb.cuda_device)  # the emulated device, for "cupy"
        cseg.SPACES.clear()
        cseg.UPLOADS.clear()
        yield cp
        cseg.SPACES.clear()


def _same_arrays(a, b, what):
    for at in ("seqs", "scores", "vidx", "rows"):
        x, y = getattr(a, at), getattr(b, at)
        if at == "scores":
            x, y = x.view(np.uint32), y.view(np.uint32)
        np.testing.assert_array_equal(x, y, err_msg=f"{what}: {at}")


def _grow_and_compare(m, model, rng, qs, ws, steps, searches):
    for step in range(steps):
        grow_both(m, model, rng, step, 60, 5)
        for where, ties, mode in searches:
            w = ws if where else None
            a = m.search(qs, k=10, where=w, backend="numpy", mode=mode, ties=ties)
            b = m.search(qs, k=10, where=w, backend="cupy", mode=mode, ties=ties)
            assert b.meta["backend"] == "cupy"
            _same_arrays(a, b, f"step {step} where={where} ties={ties} mode={mode}")
            ids, scores = model.search(qs, 10, where=w, ties=ties)
            assert_same(b, ids, scores, f"step {step} where={where} ties={ties} mode={mode}")


@pytest.mark.parametrize("method", METHODS)
def test_model_equals_numpy_and_a_fresh_index_while_growing(method, monkeypatch):
    rng = np.random.default_rng([31, len(method)])
    m = Memory(method=method, partition_days=1, merge_factor=4, merge_min=2, background_merges=False)
    model = Model(analyzer="default", method=method)
    qs = [random_query(rng) for _ in range(9)] + ["zzzunseen qqqnothing"]
    ws = [random_where(rng) if i % 3 == 1 else None for i in range(10)]
    searches = [(False, "oldest", "exhaustive"), (True, "oldest", "exhaustive"), (False, "newest", "newest"),
                (True, "newest", "exhaustive")]
    with device("model", monkeypatch):
        if method in ("atire", "bm25+"):  # and in several windows and row groups
            monkeypatch.setattr(devicesearch.engine(), "budget_bytes", 6_000)
        _grow_and_compare(m, model, rng, qs, ws, 4, searches)
        # merges happened (fewer views than segments ever made), and each segment was uploaded once
        assert len(m.snapshot().views) < len(cseg.UPLOADS)
        assert set(cseg.UPLOADS.values()) == {1}, cseg.UPLOADS


def test_a_segment_is_uploaded_when_it_appears_not_when_first_searched(monkeypatch):
    """A memory served on the device uploads each new segment -- of an add, of a merge -- when it appears
    (``SegmentEngine.prepare``), before any search meets it, and only once; results stay the reference's."""
    rng = np.random.default_rng(43)
    m = Memory(partition_days=None, merge_factor=4, merge_min=2, background_merges=False)
    model = Model(analyzer="default")
    with device("model", monkeypatch):
        grow_both(m, model, rng, 0, 20, 5)
        m.search("w0 w1", k=5, backend="cupy")  # the memory is now served on the device
        cseg.UPLOADS.clear()
        merged = False
        for step in range(1, 8):
            before = {v.seg.uid for v in m.snapshot().views}
            grow_both(m, model, rng, step, 7, 8)
            new = {v.seg.uid for v in m.snapshot().views} - before
            assert new and all(cseg.UPLOADS[u] == 1 for u in new), (step, new, dict(cseg.UPLOADS))
            merged = merged or any(m.snapshot().views[i].seg.n_docs > 7 for i in range(len(m.snapshot().views))
                                   if m.snapshot().views[i].seg.uid in new)
        assert merged, "a merge made a segment in the loop"
        qs = [random_query(rng) for _ in range(5)]
        got = m.search(qs, k=10, backend="cupy")
        ids, scores = model.search(qs, 10)
        assert_same(got, ids, scores, "after the uploads")
        assert set(cseg.UPLOADS.values()) == {1}, cseg.UPLOADS


@pytest.mark.parametrize("method", METHODS)
def test_real_kernels_equal_numpy_and_a_fresh_index_while_growing(method, monkeypatch):
    rng = np.random.default_rng([37, len(method)])
    m = Memory(method=method, partition_days=1, merge_factor=4, merge_min=2, background_merges=False)
    model = Model(analyzer="default", method=method)
    qs = [random_query(rng) for _ in range(6)]
    ws = [random_where(rng) if i % 2 == 1 else None for i in range(6)]
    with device("real", monkeypatch):
        # a small device budget: the snapshot's row space is scored in several windows and row groups
        monkeypatch.setattr(devicesearch.engine(), "budget_bytes", 6_000)
        _grow_and_compare(m, model, rng, qs, ws, 3, [(False, "oldest", "exhaustive"), (True, "newest", "exhaustive")])
        assert set(cseg.UPLOADS.values()) == {1}, cseg.UPLOADS


def test_one_scoring_pass_per_batch_whatever_the_segments(monkeypatch):
    """An unfiltered batch: one engine call, one scoring pass (rounds = the longest query's terms, not
    segments x terms), and one copy of the results back to the host, with 1 or many segments."""
    rng = np.random.default_rng(41)
    m = Memory(method="bm25+", partition_days=1, merge_factor=100, merge_min=10**6, background_merges=False)
    model = Model(analyzer="default", method="bm25+")
    qs = [random_query(rng) for _ in range(12)]
    eng = devicesearch.engine()
    calls = []
    real = type(eng).search
    monkeypatch.setattr(type(eng), "search", lambda self, *a, **kw: calls.append(1) or real(self, *a, **kw))
    gets = []
    real_get = km.DevArray.get
    monkeypatch.setattr(km.DevArray, "get", lambda self, *a, **kw: gets.append(self.shape) or real_get(self, *a, **kw))
    seen_views = set()
    with device("model", monkeypatch) as cp:
        for step in range(5):
            grow_both(m, model, rng, step, 40, 7)
            n_views = len(m.snapshot().views)
            seen_views.add(n_views)
            del calls[:], gets[:], cp.launches[:]
            res = m.search(qs, k=10, backend="cupy")
            assert len(calls) == 1 and eng.last_stats.passes == 1
            rounds = sum(1 for n, *_ in cp.launches if n.startswith("scatter_round"))
            longest = max(len(set(q.split())) for q in qs)
            assert 1 <= rounds <= longest, (rounds, longest, n_views)
            assert len(gets) == 2, gets  # ids and scores, once, whatever n_views
            ids, scores = model.search(qs, 10)
            assert_same(res, ids, scores, f"step {step}")
    assert max(seen_views) >= 5 and min(seen_views) < max(seen_views)


def test_a_search_sees_exactly_its_snapshot_while_another_thread_writes(monkeypatch):
    """Searches on cupy while a writer adds, deletes and merges: each result equals the numpy engine's over the
    very snapshot the search saw (MemoryResults.snapshot)."""
    from gpuir.memory.partitions import scan_unfiltered
    from gpuir.memory.search import make_engine, plan_queries

    rng = np.random.default_rng(43)
    m = Memory(method="bm25l", partition_days=1, merge_factor=4, merge_min=2, background_merges=False)
    model = Model(analyzer="default", method="bm25l")
    grow_both(m, model, rng, 0, 50, 6)
    qs = [random_query(rng) for _ in range(8)]
    stop = threading.Event()
    errors = []

    def writer():
        wrng = np.random.default_rng(44)
        step = 1
        try:
            while not stop.is_set() and step < 40:
                grow_both(m, Model(analyzer="default", method="bm25l"), wrng, step, 10, 4)
                step += 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with device("model", monkeypatch):
        t = threading.Thread(target=writer)
        t.start()
        try:
            versions = set()
            for _ in range(12):
                res = m.search(qs, k=8, backend="cupy")
                snap = res.snapshot
                versions.add(snap.version)
                ref = scan_unfiltered(snap, make_engine(snap, "numpy"), plan_queries(snap, qs), res.seqs.shape[1])
                np.testing.assert_array_equal(res.seqs, ref[0])
                np.testing.assert_array_equal(res.scores.view(np.uint32), ref[1].view(np.uint32))
        finally:
            stop.set()
            t.join()
    assert not errors, errors
    assert len(versions) > 1  # the memory really changed under the searches


def test_the_per_segment_path_stays_available(monkeypatch):
    """ONE_PASS off: one scorer call per segment (the path before), the same results."""
    rng = np.random.default_rng(47)
    m = Memory(method="lucene", partition_days=1, merge_factor=100, merge_min=10**6, background_merges=False)
    model = Model(analyzer="default", method="lucene")
    qs = [random_query(rng) for _ in range(6)]
    with device("model", monkeypatch):
        grow_both(m, model, rng, 0, 50, 6)
        grow_both(m, model, rng, 1, 50, 6)
        one = m.search(qs, k=10, backend="cupy")
        monkeypatch.setattr(devicesearch, "ONE_PASS", False)
        each = m.search(qs, k=10, backend="cupy")
        assert len(cseg.SPACES) == 1  # only the one-pass search built a document space
    _same_arrays(one, each, "one pass vs per segment")


# ---------------------------------------------------------------------------------------------------------
# Threads (issue 34 item 5)
# ---------------------------------------------------------------------------------------------------------
def test_a_scorer_builds_while_another_thread_captures_a_graph():
    """The H200 failure (bench/results/bench_memory_device_NVIDIA_H200_1part_s32_threads_not_kept.log): a
    CupyScorer made while another thread captured a graph died in cudaDeviceSynchronize. The fake device
    refuses a device-wide sync during any capture, as CUDA does; the scorer now syncs only its stream."""
    from _helpers import random_index

    from gpuir.backends.cupy_backend import CupyScorer
    from gpuir.backends.numpy_backend import NumpyScorer
    from gpuir.bm25 import BM25Params

    idx = random_index(300, 40, seed=3, heavy_df=200)
    with km.small_kernels(), km.fake_cupy_installed(sm_count=4) as cp:
        began, built = threading.Event(), threading.Event()
        out = {}

        def capture():
            s = cp.cuda.Stream(non_blocking=True)
            s.begin_capture()
            began.set()
            built.wait(30)
            s.end_capture()

        t = threading.Thread(target=capture)
        t.start()
        began.wait(30)
        try:
            with pytest.raises(RuntimeError, match="capturing"):  # the rule the fake device enforces
                cp.cuda.Device().synchronize()
            out["scorer"] = CupyScorer(idx, BM25Params())  # built during the other thread's capture
        finally:
            built.set()
            t.join()
        q = [np.array([1, 2, 3]), np.array([5])]
        res, ref = out["scorer"].search(q, 5), NumpyScorer(idx, BM25Params()).search(q, 5)
        np.testing.assert_array_equal(res.ids, ref.ids)


def test_concurrent_single_questions_each_get_a_graph(monkeypatch):
    """Threads asking single questions of one scorer at once: a graph in use is taken out of the pool, so
    a second thread captures (or reuses) another rather than queueing on the first one's lock."""
    from _helpers import random_index

    from gpuir.backends import cupy_backend as cb
    from gpuir.backends.numpy_backend import NumpyScorer
    from gpuir.bm25 import BM25Params

    idx = random_index(300, 40, seed=5, heavy_df=200)
    with km.small_kernels(), km.fake_cupy_installed(sm_count=4):
        sc = cb.CupyScorer(idx, BM25Params())
        ref = NumpyScorer(idx, BM25Params())
        inside, release = threading.Event(), threading.Event()
        real_run = cb._Graph.run
        first = []

        def run(self, *a, **kw):
            if not first:  # the first search holds its graph until the second has run
                first.append(self)
                inside.set()
                release.wait(30)
            return real_run(self, *a, **kw)

        monkeypatch.setattr(cb._Graph, "run", run)
        q = [np.array([1, 2])]
        res = {}
        t = threading.Thread(target=lambda: res.setdefault("a", sc.search(q, 5)))
        t.start()
        inside.wait(30)
        res["b"] = sc.search(q, 5)  # would block on the first graph's lock before the pool
        release.set()
        t.join()
        for r in res.values():
            np.testing.assert_array_equal(r.ids, ref.search(q, 5).ids)
            assert r.meta["graph_runs"] == 1
        idle = [g for gs in sc._graphs.values() for g in gs]
        assert len(idle) == 2 and first[0] in idle  # two graphs of one shape, both back in the pool


def test_a_merged_away_segment_releases_its_device_copy(monkeypatch):
    """Device copies live in the segment's cache and the kept document spaces: once merges replace a segment
    and newer spaces are made, nothing holds its device arrays."""
    import gc
    import weakref

    rng = np.random.default_rng(53)
    m = Memory(method="lucene", partition_days=None, merge_factor=3, merge_min=2, background_merges=False)
    model = Model(analyzer="default", method="lucene")
    qs = [random_query(rng) for _ in range(4)]
    with device("model", monkeypatch):
        grow_both(m, model, rng, 0, 30, 5)
        m.search(qs, k=5, backend="cupy")
        first = {v.seg.uid: weakref.ref(v.seg.cache[("cupy", "device_segment")].doc_ids) for v in m.snapshot().views}
        for step in range(1, 8):  # more segments, merged together
            grow_both(m, model, rng, step, 30, 5)
            m.search(qs, k=5, backend="cupy")
        m.merge()
        for _ in range(cseg.SPACES_KEPT):
            m.search(qs, k=5, backend="cupy")
        live_uids = {v.seg.uid for v in m.snapshot().views}
        assert len(cseg.SPACES) <= cseg.SPACES_KEPT
        gc.collect()
        merged_away = [u for u in first if u not in live_uids]
        assert merged_away, "the test needs a segment merged away"
        assert all(first[u]() is None for u in merged_away), "a merged-away segment's device copy is still held"


def test_one_document_space_serves_every_search_of_a_snapshot(monkeypatch):
    """Recency-ordered scans (a few partitions at a time) and filtered searches of one snapshot share its one
    document space: rows outside the searched partitions are masked, not a new concatenation per subset."""
    rng = np.random.default_rng(59)
    m = Memory(method="bm25l", partition_days=1, merge_factor=100, merge_min=10**6, background_merges=False)
    model = Model(analyzer="default", method="bm25l")
    qs = [random_query(rng) for _ in range(6)]
    ws = [random_where(rng) if i % 2 else None for i in range(6)]
    with device("model", monkeypatch):
        for step in range(3):
            grow_both(m, model, rng, step, 50, 6)
        assert len(m.snapshot().partitions) > 3
        for mode, ties in (("newest", "newest"), ("exhaustive", "oldest"), ("budgeted", None)):
            kw = {"max_partitions": 2} if mode == "budgeted" else {}
            a = m.search(qs, k=7, where=ws, backend="numpy", mode=mode, ties=ties, **kw)
            b = m.search(qs, k=7, where=ws, backend="cupy", mode=mode, ties=ties, **kw)
            _same_arrays(a, b, mode)
        assert len(cseg.SPACES) == 1
        (space,) = cseg.SPACES.values()
        assert [s.uid for s in space.segs] == [v.seg.uid for v in m.snapshot().views]


def test_registers_as_the_contracts_cupy_engine(monkeypatch):
    """Once gpuir/backends/contract.py is present (issue 34's one contract), register() makes this engine the
    contract's "cupy" engine, and it answers the contract's QueryBatch like the numpy engine does."""
    contract = pytest.importorskip("gpuir.backends.contract")
    from gpuir.memory.search import plan_queries

    rng = np.random.default_rng(61)
    m = Memory(method="bm25+", partition_days=1, merge_factor=100, merge_min=10**6, background_merges=False)
    model = Model(analyzer="default", method="bm25+")
    with device("model", monkeypatch):
        grow_both(m, model, rng, 0, 60, 5)
        grow_both(m, model, rng, 1, 60, 5)
        from gpuir import backends

        get = getattr(backends, "segment_engine", None) or contract.engine  # (the contract's lookup by name)
        saved = dict(contract._registry)
        try:
            assert cseg.register()
            eng = get("cupy")
            assert isinstance(eng, cseg.CupySegmentsEngine)
            snap = m.snapshot()
            plans = plan_queries(snap, [random_query(rng) for _ in range(5)])
            b = devicesearch.batch_of(plans)
            batch = contract.QueryBatch(b.off, b.gids, b.mult, b.idf, b.w0, b.const, b.has_w0, b.theta)
            vids = tuple(range(len(snap.views)))
            got, want = eng.search(snap, vids, batch, 7), get("numpy").search(snap, vids, batch, 7)
            for a in ("seqs", "views", "rows"):
                np.testing.assert_array_equal(getattr(got, a), getattr(want, a), err_msg=a)
            np.testing.assert_array_equal(got.scores.view(np.uint32), want.scores.view(np.uint32))
        finally:
            contract._registry.clear()
            contract._registry.update(saved)
            contract._instances.pop("cupy", None)
