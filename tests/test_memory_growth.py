"""Growth at the speed of analysis: the pieces that keep an add at its analysis plus a small constant are
each checked against a plain reference -- the persistent builder against building a segment from scratch,
merges against a segment built from the live records, term ranks against string sorting, the per-snapshot
df tables against the dense array -- and the add path is shown to do no per-add O(vocabulary) copy and
to plan merges only in the partitions it touched."""

from __future__ import annotations

import numpy as np
import pytest
from _memory_oracle import random_record

from gpuir import Memory
from gpuir.analysis import Analyzer
from gpuir.memory import docfreq, termorder
from gpuir.memory.builder import SegmentBuilder
from gpuir.memory.columns import Interner
from gpuir.memory.docfreq import DfLog, DfTable
from gpuir.memory.records import STRING_FIELDS, normalize_records
from gpuir.memory.segments import SegView, build_segment, merge_segments
from gpuir.memory.termorder import TermOrder
from gpuir.memory.writer import IndexWriter

TEXTS = [
    "Caroline went to the LGBTQ support group yesterday",
    "the the the support",
    "",
    "Ünïcödé wörds and ÜNÏCÖDÉ again; naïve café",
    "numbers 2023 and 3.14 and x1 y2",
    "stop words only: the a an of",
    "running runners ran runs",
]


def _batches(seed: int, n_batches: int):
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(60)] + ["support", "running", "café", "naïve", "x" * 40]
    out, nid = [], 0
    for _ in range(n_batches):
        recs = []
        for _ in range(int(rng.integers(1, 40))):
            n = int(rng.integers(0, 12))
            text = " ".join(rng.choice(words, size=n)) if rng.random() < 0.8 else str(rng.choice(TEXTS))
            rec = random_record(rng, f"r{nid}")
            rec["text"] = text
            recs.append(rec)
            nid += 1
        out.append(recs)
    return out


def _arrays(seg):
    c = seg.csr
    return {"offsets": c.offsets, "doc_ids": c.doc_ids, "tfs": c.tfs, "doc_lens": c.doc_lens,
            "seqs": seg.seqs, "time": seg.time, "importance": seg.importance, "df": seg.df,
            "maxtf": seg.maxtf, "mindl": seg.mindl}


def _same_segment(a, b, what, terms=None, dicts=None):
    """Equal segments; ``terms``/``dicts``: the two memories' interners (codes compared as the strings)."""
    assert a.csr.vocab == b.csr.vocab, what
    if terms is not None:
        assert [terms[0].values[g] for g in a.l2g] == a.csr.vocab == [terms[1].values[g] for g in b.l2g], what
    for f in STRING_FIELDS:
        da, db = (dicts or ({f: None for f in STRING_FIELDS},) * 2)
        va = [None if c < 0 else (da[f].values[c] if da[f] else c) for c in a.codes[f].tolist()]
        vb = [None if c < 0 else (db[f].values[c] if db[f] else c) for c in b.codes[f].tolist()]
        assert va == vb, f"{what}: {f}"
    assert a.ids.tolist() == b.ids.tolist() and a.texts.tolist() == b.texts.tolist(), what
    assert a.meta.tolist() == b.meta.tolist() and a.length == b.length and a.n_docs == b.n_docs, what
    assert (a.time_min, a.time_max) == (b.time_min, b.time_max), what
    for k, x in _arrays(a).items():
        np.testing.assert_array_equal(x, _arrays(b)[k], err_msg=f"{what}: {k}")


@pytest.mark.parametrize("analyzer", ["default", "bm25s"])
def test_the_persistent_builder_equals_a_fresh_build(analyzer):
    an = Analyzer(analyzer)
    t1, t2 = Interner(), Interner()
    d1 = {f: Interner() for f in STRING_FIELDS}
    d2 = {f: Interner() for f in STRING_FIELDS}
    builder = SegmentBuilder(an, t1)
    assert builder.compiled
    seq = 0
    for i, recs in enumerate(_batches(1, 25)):
        batch = normalize_records(recs)
        seqs = np.arange(seq, seq + len(batch), dtype=np.int64)
        seq += len(batch)
        got = builder.build(i, None, batch, seqs, d1)
        want = build_segment(i, None, batch, seqs, an, t2, d2)
        assert sorted(t1.values) == sorted(t2.values)  # the same terms (coded in another order)
        _same_segment(got, want, f"batch {i}", (t1, t2), (d1, d2))


def _live_build(views, uid, analyzer, terms, dicts):
    """The reference: a segment built from scratch from the live records of ``views`` in sequence order."""
    rows = []
    for v in views:
        for r in v.live_rows().tolist():
            rows.append((int(v.seg.seqs[r]), v.seg.record(r, dicts)))
    rows.sort(key=lambda x: x[0])
    batch = normalize_records([rec for _, rec in rows])
    return build_segment(uid, None, batch, np.array([s for s, _ in rows], np.int64), analyzer, terms, dicts)


@pytest.mark.parametrize("with_rank", [True, False])
def test_merges_equal_a_segment_built_from_the_live_records(with_rank):
    an = Analyzer("default")
    terms = Interner()
    dicts = {f: Interner() for f in STRING_FIELDS}
    order = TermOrder(terms)
    builder = SegmentBuilder(an, terms, order)
    rng = np.random.default_rng(3)
    batches = _batches(2, 9)
    seqs_all = rng.permutation(sum(len(b) for b in batches))  # interleaved sequence numbers across inputs
    views, pos = [], 0
    for i, recs in enumerate(batches):
        batch = normalize_records(recs)
        s = np.sort(seqs_all[pos: pos + len(batch)]).astype(np.int64)
        pos += len(batch)
        seg = builder.build(i, None, batch, s, dicts)
        live = rng.random(seg.n_docs) < 0.8 if i % 2 else None  # tombstones in half of them
        views.append(SegView(seg, live))
    order.update()
    for group in (views[:2], views[2:5], views, [views[1]], [views[0]]):
        got = merge_segments(group, 100, None, terms, keys=order.keys if with_rank else None)
        t2 = Interner(terms.values)
        want = _live_build(group, 100, an, t2, dicts)
        _same_segment(got, want, f"merge of {[v.seg.uid for v in group]}", (terms, t2), (dicts, dicts))
    # consecutive, tombstone-free inputs take the scatter path (no sort): the same result
    plain = [SegView(v.seg) for v in views]
    consecutive = []
    for i, v in enumerate(plain):
        s = v.seg
        consecutive.append(SegView(type(s)(s.uid, None, s.csr, np.arange(i * 1000, i * 1000 + s.n_docs, dtype=np.int64),
                                           s.texts, s.meta, s.codes, s.time, s.importance, s.l2g)))
    got = merge_segments(consecutive, 101, None, terms, keys=order.keys if with_rank else None)
    t2 = Interner(terms.values)
    _same_segment(got, _live_build(consecutive, 101, an, t2, dicts), "consecutive inputs", (terms, t2),
                  (dicts, dicts))
    # consecutive, some with tombstones: the filtered scatter
    mixed = [SegView(v.seg, rng.random(v.seg.n_docs) < 0.7 if i % 3 == 0 else None)
             for i, v in enumerate(consecutive)]
    got = merge_segments(mixed[::-1], 102, None, terms, keys=order.keys if with_rank else None)  # any input order
    t2 = Interner(terms.values)
    _same_segment(got, _live_build(mixed, 102, an, t2, dicts), "consecutive inputs, tombstones", (terms, t2),
                  (dicts, dicts))


def test_term_keys_order_codes_as_strings(monkeypatch):
    rng = np.random.default_rng(4)
    for key_bytes in (termorder.KEY_BYTES, 2):  # short keys: most terms tie on their prefix, sorted by string
        monkeypatch.setattr(termorder, "KEY_BYTES", key_bytes)
        monkeypatch.setattr(termorder, "_KEY", np.dtype(f"S{key_bytes}"))
        terms = Interner()
        order = TermOrder(terms)
        for step in range(40):
            # multi-byte characters (a key may end inside one), a prefix of another term, NUL-free
            alpha = "ab" if step % 3 == 0 else "abcxyzé\u20ac\U0001f600"
            for _ in range(int(rng.integers(0, 60))):
                terms.code("".join(rng.choice(list(alpha), size=int(rng.integers(1, 12)))))
            old_keys = order.keys
            old_n = order.n
            snapshot = old_keys[:old_n].copy()
            order.update()
            want = sorted(range(len(terms)), key=terms.values.__getitem__)
            assert order.sort_codes(np.arange(len(terms))).tolist() == want, f"{key_bytes} bytes, step {step}"
            sub = rng.permutation(len(terms))[: max(1, len(terms) // 3)]
            assert order.sort_codes(sub).tolist() == sorted(sub.tolist(), key=terms.values.__getitem__)
            assert np.array_equal(old_keys[:old_n], snapshot), "a reader's key array never changes"


def test_df_tables_equal_the_dense_frequencies():
    rng = np.random.default_rng(5)
    log = DfLog()
    dense = np.zeros(0, np.int64)
    tables = []
    for step in range(300):
        size = int(min(20 + 15 * step, 3000))
        if dense.size < size:
            dense = np.concatenate([dense, np.zeros(size - dense.size, np.int64)])
        codes = rng.integers(0, size, int(rng.integers(0, 40)))
        deltas = rng.integers(-1, 3, codes.size)
        np.add.at(dense, codes, deltas)
        log.add(codes, deltas)
        t = log.publish(size)
        tables.append((t, dense[:size].copy()))
        assert len(t.runs) <= 2 * int(np.log2(step + 2)) + 2, "a logarithmic number of runs"
    for t, want in tables[::7]:  # every table still answers for its own moment
        np.testing.assert_array_equal(np.asarray(t), want)
        g = rng.integers(0, t.size, 50)
        np.testing.assert_array_equal(t[g], want[g])
        assert t[int(g[0])] == want[g[0]] and t.shape == (want.size,)
    assert log.folds < 60, "a fresh base only now and then, not per publication"
    assert log.publish(tables[-1][0].size) is tables[-1][0], "nothing changed: the same table"


def test_adds_copy_no_whole_df_and_plan_merges_only_where_they_wrote(monkeypatch):
    m = Memory(partition_days=1, merge_factor=4, merge_min=8, background_merges=False)
    rng = np.random.default_rng(6)
    day = 86_400_000
    t0 = 1_700_000_000_000
    nid = 0
    for p in range(30):  # 30 days, a few segments each
        for _ in range(3):
            recs = [random_record(rng, f"r{nid + i}") for i in range(5)]
            for r in recs:
                r["time"] = t0 + p * day + 1000
            nid += len(recs)
            m.add(recs, time_unit="ms")
    copies = []
    real_fold = DfTable.__init__

    def watch(self, base, runs=(), size=None):
        copies.append(base.size)
        real_fold(self, base, runs, size)

    tiers = []
    real_tier = IndexWriter._tier

    def count_tier(self, n):
        tiers.append(n)
        return real_tier(self, n)

    monkeypatch.setattr(docfreq.DfTable, "__init__", watch)
    monkeypatch.setattr(IndexWriter, "_tier", count_tier)
    newest = t0 + 29 * day + 5000
    folds0 = m._writer._dflog.folds
    bases = set()
    for _ in range(20):
        recs = [random_record(rng, f"r{nid + i}") for i in range(5)]
        for r in recs:
            r["time"] = newest
        nid += len(recs)
        m.add(recs, time_unit="ms")
        bases.add(id(m.snapshot().df.base))
    newest_segments = len(m._writer._parts[max(k for k in m._writer._parts if k is not None)])
    assert len(tiers) <= 20 * (newest_segments + 4), "only the touched partition's segments are looked at"
    assert m._writer._dflog.folds - folds0 <= 3 and len(bases) <= 4, "snapshots share the df base; no per-add copy"


def test_an_opened_memory_ranks_its_vocabulary_off_the_open_path(tmp_path):
    """Opening does not sort the vocabulary: a background thread does, and until its ranks are installed
    segments and merges sort by string -- the same order, so the same results."""
    from _memory_oracle import Model, assert_same, random_query

    rng = np.random.default_rng(7)
    m = Memory(partition_days=None, merge_factor=2, merge_min=8, background_merges=False)
    model = Model()
    recs = [random_record(rng, f"r{i}") for i in range(60)]
    for a in range(0, 60, 20):
        m.add(recs[a: a + 20])
    model.add(recs)
    m.save(tmp_path / "mem")
    m.close()
    qs = [random_query(rng) for _ in range(20)]
    for simulate_building in (True, False):
        r = Memory.open(tmp_path / "mem", background_merges=False)
        assert r._writer._order.wait(60), "the background build finished"
        codes = np.arange(len(r._writer._terms))
        assert r._writer._order.sort_codes(codes).tolist() == sorted(codes.tolist(), key=r._writer._terms.values.__getitem__)
        if simulate_building:
            r._writer._order.ready = False  # as while the build runs: string sorts, no ranks
        more = [random_record(rng, f"s{i}-{simulate_building}") for i in range(30)]
        for a in range(0, 30, 10):
            r.add(more[a: a + 10])  # new segments, and merges of old and new ones
        model.add(more)
        ids, scores = model.search(qs, 10)
        assert_same(r.search(qs, k=10), ids, scores, f"building={simulate_building}")
        r._writer._order.ready = True
        r._writer._order.update()  # what the installation does for terms added meanwhile
        assert r._writer._order.n == len(r._writer._terms)
        r.merge()
        assert_same(r.search(qs, k=10), ids, scores, f"building={simulate_building}, merged")
        r.save()
        r.close()
