"""The compiled path of Memory.search (gpuir.backends.numba_segments, the contract's "numba" engine): every segment of a snapshot in one compiled
call, the snapshot's weights cached term by term. Each fast path is compared with the generic path (one
scorer call per segment) and with a fresh index over the live records (the oracle): one query and a batch,
the first search of a snapshot (weights computed per posting) and later ones (read from the cache), where
filters beside queries without one, many segments and the same records merged, newest-first scans, every
BM25 variant, tombstones."""

import numpy as np
import pytest
from _memory_oracle import Model, assert_same, random_query, random_record, random_where

from gpuir import Memory
from gpuir.backends import cpu_segments, use_engine
from gpuir.backends import numba_segments as segscan
from gpuir.bm25 import METHODS
from gpuir.memory import partitions, searcher

pytest.importorskip("numba")


@pytest.fixture(autouse=True)
def _every_segment_large(request, monkeypatch):
    """These memories hold segments of some tens of rows: the block-index path is what they test, so no
    segment counts as small here (test_small_segments_* test the small-segment path)."""
    if "small_segments" not in request.node.name:
        monkeypatch.setattr(segscan, "SMALL_ROWS", 0)


def _grown(method: str, seed: int, batches: int = 5, per: int = 40, deletes: bool = True,
           partition_days: float | None = 3):
    """A memory of many small segments (no merges) over several partitions, with tombstones, and its model."""
    rng = np.random.default_rng([seed, len(method)])
    m = Memory(method=method, partition_days=partition_days, merge_factor=64, merge_min=4, background_merges=False)
    model = Model(analyzer="default", method=method)
    for b in range(batches):
        recs = [random_record(rng, f"r{b}-{i}") for i in range(per)]
        m.add(recs)
        model.add(recs)
        if deletes:
            dead = [f"r{b}-{i}" for i in range(0, per, 9)]
            m.delete(dead)
            model.delete(dead)
    return m, model, rng


def _calls(monkeypatch) -> list[int]:
    """Counts the compiled path's calls (one entry per call: the number of queries it answered), whichever
    way they come: the whole-batch arrays of an unfiltered search, or per query (filters, modes)."""
    seen: list[int] = []
    real = segscan.search_compiled

    def counting(snap, view_ids, batch, k, threads=1):
        seen.append(batch.size)
        return real(snap, view_ids, batch, k, threads)

    monkeypatch.setattr(segscan, "search_compiled", counting)
    return seen


@pytest.mark.parametrize("method", METHODS)
def test_compiled_path_equals_generic_path_and_oracle(method, monkeypatch):
    m, model, rng = _grown(method, 1)
    assert len(m.snapshot().views) >= 8, "the test needs many segments"
    assert any(v.live is not None for v in m.snapshot().views), "and tombstones"
    qs = [random_query(rng) for _ in range(16)]
    calls = _calls(monkeypatch)
    for k in (1, 3, 10):
        ids, scores = model.search(qs, k)
        # a fresh snapshot: the first search computes weights per posting; the next ones read the cache
        m.add([{"id": f"fresh-{k}", "text": "w29 w28"}])
        model.add([{"id": f"fresh-{k}", "text": "w29 w28"}])
        ids, scores = model.search(qs, k)
        one = [m.search(q, k=k, backend="numba") for q in qs]  # the first is uncached, the rest cached
        for i, r in enumerate(one):
            assert_same(r, [ids[i]], scores[i:i + 1], f"{method} one query {i} k={k}")
        batch = m.search(qs, k=k, backend="numba")
        assert_same(batch, ids, scores, f"{method} batch k={k}")
        again = m.search(qs[:2], k=k, backend="numba")  # a small batch, cached
        assert_same(again, ids[:2], scores[:2], f"{method} small batch k={k}")
        with use_engine("numba", "numba-each"):
            n = len(calls)
            generic = m.search(qs, k=k, backend="numba")
            assert len(calls) == n, "the numba-each engine takes the per-segment path"
        assert_same(generic, ids, scores, f"{method} generic k={k}")
        np.testing.assert_array_equal(batch.seqs, generic.seqs)
        np.testing.assert_array_equal(batch.vidx, generic.vidx)
        np.testing.assert_array_equal(batch.rows, generic.rows)
    assert calls and max(calls) >= len(qs) - 4, "the compiled path answered the batches (queries with a term)"


def _kernel_counts(monkeypatch) -> list[np.ndarray]:
    """The counts array of each compiled call after it (column 1 is -2 for the rows answered all segments
    at once)."""
    seen: list[np.ndarray] = []
    real = cpu_segments.search_segments

    def spy(*a):
        out = real(*a)
        seen.append(a[-1].copy())
        return out

    monkeypatch.setattr(cpu_segments, "search_segments", spy)
    return seen


@pytest.mark.parametrize("method", METHODS)
def test_all_segments_at_once_equals_segment_by_segment(method, monkeypatch):
    """Dense unfiltered rows are searched over all segments at once (``union_row``): ids, scores and ties
    (sequence numbers, which do not follow the rows' order over the segments) equal the segment-by-segment
    path's and the oracle's, with tombstones, for every variant, one query at a time and in batches."""
    # one partition (the union's case), six segments of some 100 rows: dense rows in each
    m, model, rng = _grown(method, 3, batches=6, per=120, partition_days=None)
    views = m.snapshot().views
    assert len(views) >= 6 and any(v.live is not None for v in views)
    # common words (Zipfian records: w0 is in most of them) make dense rows; rare ones, sparse rows
    qs = [random_query(rng) for _ in range(24)] + ["w0 w1 w2", "w0 w0 w2 w5 w1", "w1 w3 w0 zzz", "the w0 w1 w2 w3"]
    seen = _kernel_counts(monkeypatch)
    for k in (1, 4, 10):
        ids, scores = model.search(qs, k)
        m.search(qs, k=k, backend="numba")  # the batch fills the snapshot's weights
        seen.clear()
        batch = m.search(qs, k=k, backend="numba")
        one = [m.search(q, k=k, backend="numba") for q in qs]
        union_rows = int(sum((c[:, 1] == -2).sum() for c in seen))
        if method in ("lucene", "atire", "bm25+"):  # (robertson's idf and bm25l's weights may be <= 0 for the
            # common words that make rows dense: those rows go segment by segment, and are compared all the same)
            assert union_rows >= 8, f"{method}: the dense rows went all segments at once ({union_rows})"
        assert_same(batch, ids, scores, f"{method} batch k={k}")
        for i, r in enumerate(one):
            assert_same(r, [ids[i]], scores[i:i + 1], f"{method} one query {i} k={k}")
        with monkeypatch.context() as mp:
            mp.setattr(segscan, "UNION", "never")
            seen.clear()
            apart = m.search(qs, k=k, backend="numba")
            assert not any((c[:, 1] == -2).any() for c in seen)
        for name in ("seqs", "scores", "vidx", "rows"):
            np.testing.assert_array_equal(getattr(batch, name), getattr(apart, name), err_msg=f"{method} {name}")


@pytest.mark.parametrize("method", METHODS)
def test_a_snapshot_searched_once_is_searched_all_at_once_without_a_cache(method, monkeypatch):
    """An agent's loop: add a record, ask one question. Each question is the first search of its snapshot
    (no weight cache: each weight computed from tf and length, bounds from the largest tf and smallest
    length), and its dense rows still go all segments at once: the same ids, scores and ties as the
    segment-by-segment path and the oracle, for every variant."""
    m, model, rng = _grown(method, 5, batches=6, per=120, partition_days=None)
    qs = [random_query(rng) for _ in range(12)] + ["w0 w1 w2", "w0 w0 w2 w5 w1", "the w0 w1 w2 w3"]
    seen = _kernel_counts(monkeypatch)
    union_rows = 0
    for i, q in enumerate(qs):
        rec = {"id": f"loop-{i}", "text": "w0 w3 w7"}
        m.add([rec])
        model.add([rec])
        ids, scores = model.search([q], 7)
        seen.clear()
        got = m.search(q, k=7, backend="numba")  # the snapshot's first search: uncached
        union_rows += int(sum((c[:, 1] == -2).sum() for c in seen))
        assert_same(got, ids, scores, f"{method} question {i}")
        with monkeypatch.context() as mp:
            mp.setattr(segscan, "UNION", "never")
            apart = m.search(q, k=7, backend="numba")
        for name in ("seqs", "scores", "vidx", "rows"):
            np.testing.assert_array_equal(getattr(got, name), getattr(apart, name), err_msg=f"{method} {name} {i}")
    if method in ("lucene", "atire", "bm25+"):  # (as above: robertson's and bm25l's rows may go one by one)
        assert union_rows >= 3, f"{method}: the uncached dense rows went all segments at once ({union_rows})"


def test_segments_of_several_partitions_go_one_by_one(monkeypatch):
    """Segments of several time partitions are searched segment by segment (one by one, those that cannot
    reach the k-th score are skipped); the same records in one partition, all at once."""
    seen = _kernel_counts(monkeypatch)
    qs = ["w0 w1 w2", "the w0 w1 w2 w3", "w0 w0 w2 w5 w1"]
    for days, want in ((3, False), (None, True)):
        m, model, _ = _grown("lucene", 4, batches=6, per=120, partition_days=days)
        assert (len({v.seg.partition for v in m.snapshot().views}) > 1) == (days is not None)
        m.search(qs, k=5, backend="numba")
        seen.clear()
        got = m.search(qs, k=5, backend="numba")
        ids, scores = model.search(qs, 5)
        assert_same(got, ids, scores, f"partition_days={days}")
        assert any((c[:, 1] == -2).any() for c in seen) == want, f"partition_days={days}"
        with monkeypatch.context() as mp:  # forced: the union over several partitions, the same results
            mp.setattr(segscan, "UNION", "always")
            seen.clear()
            forced = m.search(qs, k=5, backend="numba")
            assert any((c[:, 1] == -2).any() for c in seen)
        for name in ("seqs", "scores", "vidx", "rows"):
            np.testing.assert_array_equal(getattr(forced, name), getattr(got, name))


def test_all_segments_at_once_keeps_the_tie_rule_across_segments():
    """Equal scores in several segments: the lower sequence number first, whatever the segments' order.

    Identical records in every add make every hit tie; segments are searched largest first, so rows of
    later segments (lower sequence numbers there) come after rows with higher ones in the accumulator."""
    m = Memory(partition_days=None, merge_factor=64, merge_min=4, background_merges=False)
    for b in range(6):
        m.add([{"id": f"b{b}-{i}", "text": "apple pie" if i % 2 else "apple tart"} for i in range(3 + 2 * b)])
    assert len(m.snapshot().views) == 6
    for _ in range(2):  # uncached, then all segments at once
        r = m.search(["apple pie apple"], k=5, backend="numba")
    got = [h["id"] for h in r.hits(0)]
    ref = m.search(["apple pie apple"], k=5, backend="numpy")
    assert got == [h["id"] for h in ref.hits(0)]
    assert got == ["b0-1", "b1-1", "b1-3", "b2-1", "b2-3"]  # 'pie' rows, oldest first


@pytest.mark.parametrize("method", ["lucene", "bm25l", "bm25+"])
def test_compiled_many_segments_equals_merged(method):
    m, model, rng = _grown(method, 2, batches=6)
    qs = [random_query(rng) for _ in range(20)]
    ids, scores = model.search(qs, 10)
    before = m.search(qs, k=10, backend="numba")
    assert_same(before, ids, scores, f"{method} many segments")
    n_before = len(m.snapshot().views)
    m.merge()
    assert len(m.snapshot().views) < n_before
    for _ in range(2):  # uncached, then cached
        after = m.search(qs, k=10, backend="numba")
        assert_same(after, ids, scores, f"{method} merged")
        np.testing.assert_array_equal(before.seqs, after.seqs)
        np.testing.assert_array_equal(before.scores, after.scores)


def test_where_and_no_where_in_one_batch(monkeypatch):
    """Queries with and without a where in one batch all take the compiled path (a where as an allow-list per
    segment) and equal the oracle and the generic path (one scorer call per segment)."""
    m, model, rng = _grown("lucene", 3)
    qs = [random_query(rng) for _ in range(12)]
    ws = [random_where(rng) if i % 3 == 0 else None for i in range(12)]
    calls = _calls(monkeypatch)
    for _ in range(2):
        ids, scores = model.search(qs, 10, where=ws)
        res = m.search(qs, k=10, where=ws, backend="numba")
        assert_same(res, ids, scores, "mixed where")
        for mode in ("newest", "budgeted"):  # theta from newer partitions carried into the compiled call
            kw = {"max_partitions": 2} if mode == "budgeted" else {}
            got = m.search(qs, k=10, where=ws, backend="numba", mode=mode, ties="oldest", **kw)
            with use_engine("numba", "numba-each"):
                want = m.search(qs, k=10, where=ws, backend="numba", mode=mode, ties="oldest", **kw)
            np.testing.assert_array_equal(got.seqs, want.seqs, err_msg=mode)
            np.testing.assert_array_equal(got.scores, want.scores, err_msg=mode)
    assert calls and max(calls) > 8, "the queries with a where (4 of 12) went the compiled way too"


def test_cache_is_per_snapshot_and_filled_once_per_term(monkeypatch):
    """A term's weights are computed once per snapshot (later searches read them); a write makes a new
    snapshot whose first search computes weights per posting again, under the new statistics."""
    from gpuir.backends import cpu_segments

    m, model, _ = _grown("lucene", 4, deletes=False)
    fills: list[int] = []
    real = cpu_segments.fill_segments

    def counting(*a):
        done = real(*a)
        fills.append(int(done))
        return done

    monkeypatch.setattr(cpu_segments, "fill_segments", counting)
    q = "w0 w1 w2"
    first = m.search(q, k=5, backend="numba")
    assert fills == [], "a snapshot's first search does not fill (it may be the only one)"
    second = m.search(q, k=5, backend="numba")
    assert len(fills) == 1 and fills[0] > 0
    third = m.search(q, k=5, backend="numba")
    assert len(fills) == 1, "filled terms are never filled again (the call is skipped)"
    for r in (second, third):
        np.testing.assert_array_equal(r.seqs, first.seqs)
        np.testing.assert_array_equal(r.scores, first.scores)
    m.add([{"id": "new", "text": "w0 w0 w0 w1"}])
    model.add([{"id": "new", "text": "w0 w0 w0 w1"}])
    ids, scores = model.search([q], 5)
    n = len(fills)
    for _ in range(3):
        assert_same(m.search(q, k=5, backend="numba"), ids, scores, "after a write")
    assert len(fills) == n + 1 and fills[n] > 0, "the new snapshot filled its own cache, once"


def test_fill_weights_equal_the_kernels_weights():
    """The cached weights, per-term and per-block maxima and zero/negative flags equal what the kernels
    compute per posting (bm25l, whose weights may round below zero)."""
    from gpuir.backends import cpu_kernels, cpu_segments
    from gpuir.backends.numba_backend import NumbaScorer
    from gpuir.bm25 import BM25Params
    from gpuir.index.build import build_csr

    rng = np.random.default_rng(5)
    words = [f"t{i}" for i in range(40)]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 300)))) for _ in range(600)]
    csr = build_csr(texts, analyzer="default", progress=False)
    params = BM25Params(method="bm25l", k1=1.5, b=0.9, delta=0.5)
    sc = NumbaScorer(csr, params, threads=1)
    cache = segscan.new_cache(sc)
    V = csr.n_terms
    idf = rng.uniform(-0.2, 3.0, V).astype(np.float32)
    w0 = (idf * np.float32(0.3)).astype(np.float32)
    f = np.float32
    fp = np.array([f(1) - f(0.9), f(0.9), f(1.5), f(2.5), f(0.5), f(37.25)], np.float32)
    terms = np.arange(V, dtype=np.int64)[::2]
    done = cpu_segments.fill_weights(sc._ix, fp, 3, True, sc._blocks[0], sc._blocks[7], terms, idf[terms],
                                     w0[terms], *cache)
    assert done == int(sum(csr.offsets[t + 1] - csr.offsets[t] for t in terms))
    pre, blk_max, ub, zero, neg, filled = cache
    assert filled.sum() == terms.size and not filled[1]
    wt = (np.zeros(0, np.float32), fp, 3, True)
    for t in terms.tolist():
        a, b = int(csr.offsets[t]), int(csr.offsets[t + 1])
        want = np.empty(b - a, np.float32)
        cpu_kernels.weights_into(sc._ix, wt, t, idf[t], w0[t], want)
        np.testing.assert_array_equal(pre[a:b], want)
        assert ub[t] == float(want.max()) and zero[t] == (want.min() <= 0) and neg[t] == (want.min() < 0)
        for blk in range(int(sc._blocks[0][t]), int(sc._blocks[0][t + 1])):
            s = int(sc._blocks[7][blk])
            assert blk_max[blk] == want[s - a: s - a + 64].max()
    # filling again (even with other weights) computes nothing and rewrites nothing
    before = [c.copy() for c in cache]
    assert cpu_segments.fill_weights(sc._ix, fp, 3, True, sc._blocks[0], sc._blocks[7], terms, idf[terms] + 1,
                                     w0[terms], *cache) == 0
    for t in terms.tolist():
        a, b = int(csr.offsets[t]), int(csr.offsets[t + 1])
        np.testing.assert_array_equal(cache[0][a:b], before[0][a:b])
    for x, y in zip(before[2:], cache[2:]):
        np.testing.assert_array_equal(x[terms], y[terms])


def _block_index_reference(csr, bs):
    """The block index and term summaries computed with NumPy alone (an independent reference)."""
    offsets = np.asarray(csr.offsets, np.int64)
    doc_ids, tfs, dls = np.asarray(csr.doc_ids), np.asarray(csr.tfs), np.asarray(csr.doc_lens)
    N = max(csr.n_docs, 1)
    lens = np.diff(offsets)
    V = lens.size
    nblk = -(-lens // bs)
    blk_off = np.zeros(V + 1, np.int64)
    np.cumsum(nblk, out=blk_off[1:])
    term = np.repeat(np.arange(V, dtype=np.int64), nblk)
    start = offsets[term] + (np.arange(blk_off[-1], dtype=np.int64) - blk_off[term]) * bs
    end = np.minimum(start + bs, offsets[term + 1])
    blk_last = doc_ids[end - 1]
    blk_maxtf = np.maximum.reduceat(tfs, start) if start.size else np.zeros(0, np.int32)
    blk_mindl = np.minimum.reduceat(dls[doc_ids], start) if start.size else np.zeros(0, np.int32)
    shift = np.floor(np.log2(N / np.maximum(nblk, 1))).astype(np.int64).clip(0, 62)
    cells = ((N - 1) >> shift) + 1
    dir_off = np.zeros(V + 1, np.int64)
    np.cumsum(cells, out=dir_off[1:])
    dterm = np.repeat(np.arange(V, dtype=np.int64), cells)
    first_doc = (np.arange(dir_off[-1], dtype=np.int64) - dir_off[dterm]) << shift[dterm]
    blk_dir = np.searchsorted(term * (N + 1) + blk_last, dterm * (N + 1) + first_doc)
    summ = [np.zeros(V, np.int32) for _ in range(4)]
    nz = np.flatnonzero(lens > 0)
    if nz.size:
        dl = dls[doc_ids]
        summ[0][nz] = np.maximum.reduceat(tfs, offsets[nz])
        summ[1][nz] = np.minimum.reduceat(dl, offsets[nz])
        summ[2][nz] = np.minimum.reduceat(tfs, offsets[nz])
        summ[3][nz] = np.maximum.reduceat(dl, offsets[nz])
    return (blk_off, blk_last, blk_maxtf, blk_mindl, dir_off, shift, blk_dir, start), summ


@pytest.mark.parametrize("n_docs, vocab", [(1, 3), (50, 5), (3000, 200)])
def test_compiled_layout_equals_numpy_reference(n_docs, vocab):
    """The scorer's block index and term summaries, laid out in one compiled pass, equal NumPy's."""
    from gpuir.backends.cpu_maxscore import BLOCK
    from gpuir.backends.numba_backend import NumbaScorer
    from gpuir.bm25 import BM25Params
    from gpuir.index.build import build_csr

    rng = np.random.default_rng([n_docs, vocab])
    p = 1.0 / np.arange(1, vocab + 1)
    words = [f"v{i}" for i in range(vocab)]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 40)), p=p / p.sum())) for _ in range(n_docs)]
    csr = build_csr(texts, analyzer="default", progress=False)
    sc = NumbaScorer(csr, BM25Params(), threads=1)
    blocks, summ = _block_index_reference(csr, BLOCK)
    assert len(sc._blocks) == len(blocks)
    for i, (got, want) in enumerate(zip(sc._blocks, blocks)):
        np.testing.assert_array_equal(got, want, err_msg=f"block array {i}")
    for name, want in zip(("maxtf", "mindl", "mintf", "maxdl"), summ):
        np.testing.assert_array_equal(getattr(sc.summaries, name), want, err_msg=name)


@pytest.mark.parametrize("fault, message", [
    ("doc_range", "doc_ids out of range"), ("doc_negative", "doc_ids out of range"),
    ("tf", "a term frequency below 1"), ("order", "postings not strictly increasing within a term"),
    ("repeat", "postings not strictly increasing within a term")])
@pytest.mark.parametrize("where", [3, 40, 97])
@pytest.mark.parametrize("compiled", [True, False])
def test_check_postings_names_each_fault_wherever_it_lies(fault, message, where, compiled, monkeypatch):
    """The compiled pass finds the first bad posting; the NumPy checks then name it, in any chunk. Without
    the compiled engine (or while it starts in this process: gpuir.memory.warmup) the NumPy checks alone."""
    import threading

    from gpuir.memory import segments, warmup

    if compiled:
        pytest.importorskip("numba")
    ready = threading.Event()
    if compiled:
        ready.set()
    monkeypatch.setattr(warmup, "_ready", ready)
    monkeypatch.setattr(segments, "_CHUNK", 16)
    offsets = np.array([0, 30, 60, 100], np.int64)
    doc_ids = np.concatenate([np.arange(0, 60, 2), np.arange(1, 31), np.arange(40)]).astype(np.int32)
    tfs = np.ones(100, np.int32)
    segments.check_postings(offsets, doc_ids, tfs, 60)  # sound: no error (term boundaries go down)
    d, t = doc_ids.copy(), tfs.copy()
    if fault == "doc_range":
        d[where] = 60
    elif fault == "doc_negative":
        d[where] = -1
    elif fault == "tf":
        t[where] = 0
    elif fault == "order":
        d[where], d[where + 1] = d[where + 1], d[where]
    else:
        d[where + 1] = d[where]
    if fault in ("order", "repeat") and where + 1 in (30, 60):
        pytest.skip("a term boundary")
    with pytest.raises(ValueError, match=message):
        segments.check_postings(offsets, d, t, 60)


def test_term_slots_grow_over_searches_of_one_snapshot(monkeypatch):
    """Each snapshot locates a query term in every segment once (its slot); the slot table grows past its
    first size as later searches name new terms, and every search still equals the generic path."""
    rng = np.random.default_rng(11)
    vocab = [f"t{i:03d}" for i in range(400)]
    m = Memory(partition_days=None, merge_factor=64, background_merges=False)
    for b in range(9):  # nine segments, each with a different part of the vocabulary
        recs = [{"id": f"r{b}-{i}", "text": " ".join(rng.choice(vocab[b * 30: b * 30 + 150], size=6))}
                for i in range(30)]
        m.add(recs)
    assert len(m.snapshot().views) == 9
    qs = [" ".join(rng.choice(vocab, size=5, replace=False)) for _ in range(60)]  # ~250 distinct terms
    got = [m.search(q, k=5, backend="numba") for q in qs] + [m.search(qs, k=5, backend="numba")]
    state = m.snapshot().cached(("compiled",), segscan.SnapshotWeights)
    layout = next(iter(state.layouts.values()))
    assert len(layout.slot_of) > 64 and layout.locs.shape[0] >= len(layout.slot_of), "the table grew"
    for g, row in layout.slot_of.items():  # each slot holds the term's local id in each segment
        for j, seg in enumerate(layout.segs):
            want = np.flatnonzero(seg[1] == g)
            assert layout.locs[row, j] == (seg[2][want[0]] if want.size else -1)
    with use_engine("numba", "numba-each"):
        want = [m.search(q, k=5, backend="numba") for q in qs]
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(a.seqs, b.seqs, err_msg=f"query {i}")
        np.testing.assert_array_equal(a.scores, b.scores, err_msg=f"query {i}")
    np.testing.assert_array_equal(got[-1].seqs, np.concatenate([w.seqs for w in want]))
    np.testing.assert_array_equal(got[-1].scores, np.concatenate([w.scores for w in want]))


def test_filtered_searches_weigh_on_the_way_and_never_fill(monkeypatch):
    """Searches whose every query has a where never fill the snapshot's weight cache (a tenant's search reads
    its own rows only); they equal the generic path, and an unfiltered search then fills as before."""
    m, _model, rng = _grown("bm25+", 5)
    qs = [random_query(rng) for _ in range(10)]
    ws = [{"tenant": str(rng.choice(["acme", "globex", "initech"]))} for _ in qs]
    ws = [random_where(rng) | w for w in ws]
    snap = m.snapshot()
    for _ in range(3):  # the snapshot's first search, then later ones (which would fill)
        got = m.search(qs, k=5, where=ws, backend="numba")
        one = [m.search(q, k=5, where=w, backend="numba") for q, w in zip(qs, ws)]
        with use_engine("numba", "numba-each"):
            want = m.search(qs, k=5, where=ws, backend="numba")
        np.testing.assert_array_equal(got.seqs, want.seqs)
        np.testing.assert_array_equal(got.scores, want.scores)
        for i, r in enumerate(one):
            np.testing.assert_array_equal(r.seqs[0], want.seqs[i])
            np.testing.assert_array_equal(r.scores[0], want.scores[i])
    state = snap.cached(("compiled",), segscan.SnapshotWeights)
    assert all(not lay.filled for lay in state.layouts.values()), "filtered searches filled"
    m.search(qs, k=5, backend="numba")
    assert any(lay.filled for lay in state.layouts.values()), "an unfiltered batch fills"


@pytest.mark.parametrize("method", ["bm25+", "lucene"])
def test_a_batch_plans_each_query_as_it_alone_would(method):
    """plan_queries makes the batch's arrays once and hands each query views of them: each plan must equal
    the plan of its query alone (terms, codes, multiplicities, weights, C), for repeated terms, unknown
    terms, empty queries, and under a shard's statistics."""
    from gpuir.memory.search import plan_queries
    from gpuir.memory.termstats import TermStats, restate

    m, _, rng = _grown(method, 3, batches=2, deletes=False)
    snap = m.snapshot()
    qs = [random_query(rng) for _ in range(12)] + ["", "zzz-unknown", "w1 w1 w1 w2 zzz-unknown w2"]
    rng.shuffle(qs)
    stats = TermStats(n_docs=snap.n_docs + 50, total_len=int(snap.avgdl * (snap.n_docs + 50)),
                      df={t: 3 for q in qs for t in q.split()})
    for st in (None, stats):
        s2 = snap if st is None else restate(snap, st)
        batch = plan_queries(s2, qs, st)
        for q, p in zip(qs, batch):
            (alone,) = plan_queries(s2, [q], st)
            assert p.terms == alone.terms
            for a in ("gids", "mult", "idf", "w0"):
                assert np.array_equal(getattr(p, a), getattr(alone, a)), (q, a)
            assert p.const.tobytes() == alone.const.tobytes()
        assert any(len(p.terms) for p in batch) and any(p.empty for p in batch)
        assert any(int(p.mult.max(initial=0)) > 1 for p in batch), "a repeated term"


@pytest.mark.parametrize("method", ["lucene", "bm25l"])
def test_a_plain_question_is_one_call_whose_arrays_are_the_results(method, monkeypatch):
    """An unfiltered "exhaustive" batch (several partitions, tombstones, a query no record matches, k above N)
    takes partitions.scan_unfiltered -- one compiled call, no per-query hits -- and returns exactly what the
    general path returns: ids, scores, rows and the meta's postings read and partitions scanned."""
    m, model, rng = _grown(method, 7)
    assert len(m.snapshot().partitions) > 1
    qs = [random_query(rng) for _ in range(12)] + ["zzzunseen qqqnothing"]
    seen = []
    real = partitions.scan_unfiltered
    monkeypatch.setattr(searcher, "scan_unfiltered", lambda *a: seen.append(1) or real(*a))
    calls = _calls(monkeypatch)
    for k in (3, 10, 10_000):
        m.search(qs, k=k, backend="numba")  # (a snapshot's first search: weights per posting; then cached)
        n = len(calls)
        fast = m.search(qs, k=k, backend="numba")
        assert calls[n:] == [len(qs)], "one compiled call for the whole batch"
        with monkeypatch.context() as mp:
            mp.setattr(searcher, "scan_unfiltered", lambda *a: None)  # the general path: partitions.scan, hits per query
            general = m.search(qs, k=k, backend="numba")
        for a in ("seqs", "scores", "vidx", "rows"):
            np.testing.assert_array_equal(getattr(fast, a), getattr(general, a), err_msg=f"{a} k={k}")
        for key in ("postings_read", "partitions_scanned"):
            np.testing.assert_array_equal(fast.meta[key], general.meta[key], err_msg=f"{key} k={k}")
        assert fast.meta["partitions_scanned"][-1] == 0 and fast.ids(len(qs) - 1) == []
        ids, scores = model.search(qs, min(k, len(model.live)))
        assert_same(fast, ids, scores, f"{method} k={k}")
    assert seen, "the plain question went through scan_unfiltered"
    where = m.search(qs[:2], k=3, where={"role": "user"}, backend="numba")  # a filter: the general path
    assert where.meta["backend"] == "numba"


@pytest.mark.parametrize("method", METHODS)
def test_a_plain_batch_on_numpy_is_one_scorer_call_per_segment(method, monkeypatch):
    """Without the one compiled call ("numpy" here; "cupy" in tests/test_memory_gpu_host.py), an unfiltered
    "exhaustive" batch still skips the per-query objects: one scorer call per segment answers every query
    (the per-segment engine, gpuir.backends.segment_engines), and the merged arrays equal the general path's
    and a fresh index's."""
    from gpuir.backends.numpy_backend import NumpyScorer

    m, model, rng = _grown(method, 11)
    snap = m.snapshot()
    assert len(snap.partitions) > 1 and len(snap.views) > 3
    qs = [random_query(rng) for _ in range(12)] + ["zzzunseen qqqnothing"]
    calls: list[int] = []
    real = NumpyScorer.search_weighted
    monkeypatch.setattr(NumpyScorer, "search_weighted", lambda self, wq, *a, **kw: calls.append(wq.n_rows)
                        or real(self, wq, *a, **kw))
    for k in (3, 10, 10_000):
        del calls[:]
        fast = m.search(qs, k=k, backend="numpy")
        assert calls and max(calls) > 1 and len(calls) <= len(snap.views), calls
        with monkeypatch.context() as mp:
            mp.setattr(searcher, "scan_unfiltered", lambda *a: None)  # the general path: partitions.scan, hits per query
            general = m.search(qs, k=k, backend="numpy")
        for a in ("seqs", "scores", "vidx", "rows"):
            np.testing.assert_array_equal(getattr(fast, a), getattr(general, a), err_msg=f"{a} k={k}")
        np.testing.assert_array_equal(fast.meta["partitions_scanned"], general.meta["partitions_scanned"])
        assert (fast.meta["postings_read"] >= general.meta["postings_read"]).all()  # (no bound between segments)
        assert fast.meta["partitions_scanned"][-1] == 0 and fast.ids(len(qs) - 1) == []
        ids, scores = model.search(qs, min(k, len(model.live)))
        assert_same(fast, ids, scores, f"{method} k={k}")


def test_a_filter_every_record_passes_is_the_plain_question(monkeypatch):
    """A tenant's filter on a memory holding only that tenant, and the expiry of a search when nothing has
    expired, select every live record: the search takes the plain question's path (one compiled call, no
    allow-lists) and returns what the filtered search returns. Once another tenant's record, or an expired
    one, is in the memory, the filter is applied again (and hides them)."""
    rng = np.random.default_rng(31)
    m = Memory(partition_days=3, merge_factor=64, merge_min=4, background_merges=False)
    model = Model(analyzer="default", method="lucene")
    for b in range(4):
        recs = [{**random_record(rng, f"r{b}-{i}"), "tenant": "acme"} for i in range(40)]
        recs[0]["expires_at"] = "2999-01-01T00:00:00Z"  # (a search's expiry filter: nothing expired yet)
        m.add(recs)
        model.add(recs)
        m.delete([f"r{b}-5"])
        model.delete([f"r{b}-5"])
    qs = [random_query(rng) for _ in range(8)]
    seen = []
    real = partitions.scan_unfiltered
    monkeypatch.setattr(searcher, "scan_unfiltered", lambda *a: seen.append(1) or real(*a))

    def forced(where):  # the filter applied: the general path with allow-lists
        with monkeypatch.context() as mp:
            mp.setattr(searcher, "_vacuous_dropped", lambda snap, ws: ws)
            return m.search(qs, k=10, where=where, backend="numba")

    for where in ({"tenant": "acme"}, None):
        del seen[:]
        got = m.search(qs, k=10, where=where, backend="numba")
        assert seen, f"{where}: the plain question's path"
        want = forced(where)
        for a in ("seqs", "scores", "vidx", "rows"):
            np.testing.assert_array_equal(getattr(got, a), getattr(want, a), err_msg=f"{where} {a}")
        ids, scores = model.search(qs, 10)
        assert_same(got, ids, scores, f"{where}")

    other = [{"id": "other", "text": " ".join(qs[0].split()[:2]), "tenant": "zeta"}]
    m.add(other)
    model.add(other)
    del seen[:]
    got = m.search(qs, k=10, where={"tenant": "acme"}, backend="numba")
    assert not seen, "another tenant's record: the filter is applied"
    ids, scores = model.search(qs, 10, where={"tenant": "acme"})
    assert_same(got, ids, scores, "acme among others")
    m.add([{"id": "gone", "text": qs[1], "tenant": "acme", "expires_at": "2000-01-01T00:00:00Z"}])
    del seen[:]
    got = m.search(qs, k=10, backend="numba")
    assert not seen and "gone" not in got.ids(1), "an expired record: the search's expiry filter is applied"
    want = forced(None)
    for a in ("seqs", "scores", "vidx", "rows"):
        np.testing.assert_array_equal(getattr(got, a), getattr(want, a), err_msg=f"expired {a}")


@pytest.mark.parametrize("method", METHODS)
def test_small_segments_are_scored_without_setup_and_equal_the_block_path(method, monkeypatch):
    """An agent's loop (add one record, ask one question): every new one-record segment is small -- scored
    exhaustively, no scorer or block index made for it -- and the large segments' layout is the previous
    snapshot's (not rebuilt). Results equal the block-index path's (SMALL_ROWS = 0) and the oracle's bit for
    bit, with tombstones and filters, for every variant."""
    m, model, rng = _grown(method, 17, batches=3, per=60, partition_days=None)
    monkeypatch.setattr(segscan, "SMALL_ROWS", 40)  # the grown segments are large, the loop's are small
    made: list[int] = []
    real_init = segscan.SnapshotLayout.__init__

    def counting(self, *a, **kw):
        made.append(1)
        real_init(self, *a, **kw)

    monkeypatch.setattr(segscan.SnapshotLayout, "__init__", counting)
    m.search(random_query(rng), k=5, backend="numba")  # the large segments laid out once
    made.clear()
    for step in range(25):
        rec = random_record(rng, f"loop-{step}")
        m.add([rec])
        model.add([rec])
        if step % 10 == 9:
            dead = [f"loop-{step - 3}"]
            m.delete(dead)
            model.delete(dead)
        q = random_query(rng)
        w = random_where(rng) if step % 4 == 3 else None
        ids, scores = model.search([q], 10, where=[w])
        got = m.search(q, k=10, where=w, backend="numba")
        assert_same(got, ids, scores, f"{method} step {step}")
        with monkeypatch.context() as mp:
            mp.setattr(segscan, "SMALL_ROWS", 0)
            block = m.search(q, k=10, where=w, backend="numba")
        np.testing.assert_array_equal(got.seqs, block.seqs)
        np.testing.assert_array_equal(got.scores, block.scores)
        np.testing.assert_array_equal(got.vidx, block.vidx)
    snap = m.snapshot()
    small = [v.seg for v in snap.views if v.seg.n_docs <= 40]
    assert len(small) >= 5, "the loop left small segments"
    m2, _, rng2 = _grown(method, 18, batches=2, per=60, partition_days=None)
    m2.search(random_query(rng2), k=5, backend="numba")
    made.clear()
    for step in range(10):
        m2.add([random_record(rng2, f"l2-{step}")])
        m2.search(random_query(rng2), k=5, backend="numba")
    assert not made, "a one-record add rebuilt the large segments' layout"
    assert not any(key[0] == "scorer" for v in m2.snapshot().views if v.seg.n_docs <= 40 for key in v.seg.cache
                   if isinstance(key, tuple)), "a small segment got a scorer"


def test_new_segments_are_prepared_for_the_engine_before_any_search_meets_them(monkeypatch):
    """After a compiled search, a one-record add's segment has its small-segment row made in the add, and a
    merged segment its scorer, block index and tf keys made in the merge, with the layout of the merge's
    set of large segments -- before a search meets them; a batch's large segment is left to its first
    search (an add's latency is a write's)."""
    monkeypatch.setattr(segscan, "SMALL_ROWS", 8)
    m = Memory(partition_days=None, merge_factor=4, merge_min=2, background_merges=False)
    m.add([{"id": f"b{i}", "text": f"w{i % 7} w{i % 3} common"} for i in range(40)])
    big = m.snapshot().views[-1].seg
    assert not any(k[0] == "scorer" for k in big.cache), "not laid out before a search was served"
    m.search("common w1", k=3, backend="numba")
    seen = set()
    for i in range(20):
        m.add([{"id": f"a{i}", "text": f"w{i % 5} agent turn {i}"}])
        for v in m.snapshot().views:
            if v.seg.uid in seen:
                continue
            seen.add(v.seg.uid)
            if v.seg.n_docs <= 8:
                assert ("numba", "small") in v.seg.cache, f"add {i}: small segment {v.seg.uid} not prepared"
            else:
                assert ("numba", "tf_keys") in v.seg.cache, f"add {i}: merged segment {v.seg.uid} not prepared"
    assert any(v.seg.n_docs > 8 and v.seg is not big for v in m.snapshot().views), "a merge made a large segment"
    snap = m.snapshot()  # the merge's new set of large segments: its shared layout made by the merge, too
    order = segscan._large_first(snap, tuple(range(len(snap.views))))
    held = snap.views[order[0]].seg.cache.get(("numba", "layout"))
    assert held is not None and held[0] == tuple((id(snap.views[v].seg), id(snap.views[v].live)) for v in order)
    assert held[1].ptrs is not None, "and the segments' addresses for the union"
    m.add([{"id": f"c{i}", "text": "a batch of twenty"} for i in range(20)])
    newest = max(m.snapshot().views, key=lambda v: v.seg.uid).seg
    assert newest.n_docs == 20 and ("numba", "tf_keys") not in newest.cache, "a batch's layout waits for a search"
    r = m.search(["agent turn", "common w1"], k=5, backend="numba")
    ref = m.search(["agent turn", "common w1"], k=5, backend="numpy")
    np.testing.assert_array_equal(r.seqs, ref.seqs)
    np.testing.assert_array_equal(r.scores, ref.scores)
