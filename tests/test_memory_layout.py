"""The compiled scorer's block index is saved with each segment file and read back on open (not laid out
again); files without it (older ones) still open and search identically; a saved layout that does not fit
its segment is a damaged file, named."""

from __future__ import annotations

import numpy as np
import pytest
from _memory_oracle import random_query, random_record

pytest.importorskip("numba")

from gpuir import Memory
from gpuir.backends import block_layout
from gpuir.backends.cpu_maxscore import BLOCK
from gpuir.backends.segment_engines import segment_scorer
from gpuir.memory import MemoryFormatError
from gpuir.memory.segfile import MappedNpz
from gpuir.memory.segments import Segment

METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")



@pytest.fixture(autouse=True)
def _every_segment_large():
    """These memories hold segments of some tens of rows; what is tested is the block index their numba
    scorers lay out (and their files save), so no segment counts as small here. (Not through monkeypatch:
    tests here undo theirs midway.)"""
    from gpuir.backends import numba_segments

    old, numba_segments.SMALL_ROWS = numba_segments.SMALL_ROWS, 0
    yield
    numba_segments.SMALL_ROWS = old

def _grown(method="lucene", n=400, seed=0) -> Memory:
    rng = np.random.default_rng(seed)
    m = Memory(method=method, partition_days=3, merge_factor=3, merge_min=16, background_merges=False)
    recs = [random_record(rng, f"r{i}") for i in range(n)]
    for a in range(0, n, 40):
        m.add(recs[a: a + 40])
    m.delete([f"r{i}" for i in range(0, n, 7)])
    return m


def _queries(seed=1, n=40):
    rng = np.random.default_rng(seed)
    return [random_query(rng) for _ in range(n)]


def _same(a, b, qs, k=8):
    ra, rb = a.search(qs, k=k), b.search(qs, k=k)
    assert ra.meta["backend"] == rb.meta["backend"] == "numba"
    np.testing.assert_array_equal(ra.seqs, rb.seqs)
    np.testing.assert_array_equal(ra.scores, rb.scores)  # float32, bit for bit
    for i in range(len(qs)):  # one question at a time too (the compiled path's single-query branch)
        x, y = a.search(qs[i], k=k), b.search(qs[i], k=k)
        np.testing.assert_array_equal(x.seqs, y.seqs)
        np.testing.assert_array_equal(x.scores, y.scores)


def _count_lay_outs(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = block_layout.lay_out_segment

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(block_layout, "lay_out_segment", counted)
    from gpuir.backends import numba_backend

    monkeypatch.setattr(numba_backend, "lay_out_segment", counted)
    return calls


def _equal_layouts(got: block_layout.BlockLayout, want: block_layout.BlockLayout) -> None:
    assert got.block == want.block == BLOCK
    assert len(got.blocks) == len(want.blocks) == 8
    for i, (x, y) in enumerate(zip(got.blocks, want.blocks)):
        assert x.dtype == y.dtype, i
        np.testing.assert_array_equal(x, y, err_msg=f"block array {i}")
    for name in ("maxtf", "mindl", "mintf", "maxdl"):
        np.testing.assert_array_equal(getattr(got.summaries, name), getattr(want.summaries, name), err_msg=name)


def _fresh_layout(seg: Segment) -> block_layout.BlockLayout:
    csr = seg.csr
    return block_layout.lay_out_segment(np.asarray(csr.offsets, np.int64), np.asarray(csr.doc_ids, np.int32),
                                        np.asarray(csr.tfs, np.int32), np.asarray(csr.doc_lens, np.int32),
                                        seg.n_docs)


def test_saved_layout_equals_a_recomputed_one_and_opening_lays_nothing_out(tmp_path, monkeypatch):
    m = _grown()
    qs = _queries()
    m.search(qs[:3], k=5)  # some segments' scorers exist (their layouts are saved), others are laid out at save
    m.save(tmp_path / "mem")
    assert len(m.snapshot().views) > 2
    calls = _count_lay_outs(monkeypatch)
    o = Memory.open(tmp_path / "mem", writer=False)
    for v in o.snapshot().views:
        names = MappedNpz(tmp_path / "mem" / f"seg-{v.seg.uid:08d}.npz").names
        assert set(block_layout.SAVED) <= set(names)
        saved = v.seg.saved_layout()
        assert saved is not None
        _equal_layouts(saved, _fresh_layout(v.seg))
    calls.clear()
    _same(o, m, qs)
    for v in o.snapshot().views:  # the scorers the searches made hold the file's layout
        sc = segment_scorer(v.seg, "numba", o.snapshot().params)
        assert sc.layout is v.seg.saved_layout()
    assert calls == [], "a segment opened from a file with a saved layout is not laid out again"
    o.close()
    m.close()


@pytest.mark.parametrize("method", METHODS)
def test_old_directory_without_layout_opens_and_searches_identically(tmp_path, monkeypatch, method):
    m = _grown(method)
    with monkeypatch.context() as mp:  # the writer before the layout was saved: no blk_* members
        mp.setattr(Segment, "layout_arrays", lambda self: {})
        m.save(tmp_path / "old")
    m.save(tmp_path / "new")
    for seg in (tmp_path / "old").glob("seg-*.npz"):
        assert not any(n.startswith("blk_") for n in MappedNpz(seg).names)
    calls = _count_lay_outs(monkeypatch)
    old = Memory.open(tmp_path / "old", writer=False)
    new = Memory.open(tmp_path / "new", writer=False)
    assert all(v.seg.saved_layout() is None for v in old.snapshot().views)
    qs = _queries(seed=3)
    _same(old, m, qs)
    assert len(calls) == len(old.snapshot().views), "each old segment is laid out, once"
    _same(new, old, qs)
    assert len(calls) == len(old.snapshot().views), "the new files' segments are not"
    for o in (old, new):
        o.close()
    m.close()


def test_old_segments_stay_readable_and_merged_ones_gain_a_layout(tmp_path, monkeypatch):
    m = _grown()
    with monkeypatch.context() as mp:
        mp.setattr(Segment, "layout_arrays", lambda self: {})
        m.save(tmp_path / "mem")
    m.close()
    old_uids = {int(p.stem.split("-")[1]) for p in (tmp_path / "mem").glob("seg-*.npz")}
    o = Memory.open(tmp_path / "mem", background_merges=False)  # the writer of an old directory
    o.add([{"id": "new1", "text": "a record added after the upgrade"}])
    assert o.merge() > 0
    o.save()
    p = Memory.open(tmp_path / "mem", writer=False)
    fresh = [v.seg for v in p.snapshot().views if v.seg.uid not in old_uids]
    assert fresh and all(s.saved_layout() is not None for s in fresh), "segments written now hold a layout"
    assert all(v.seg.saved_layout() is None for v in p.snapshot().views if v.seg.uid in old_uids)
    _same(p, o, _queries(seed=5) + ["a record added after the upgrade"])
    p.close()
    o.close()


def test_layout_saved_for_another_block_size_or_version_is_laid_out_again(tmp_path):
    m = _grown(n=120)
    m.save(tmp_path / "mem")
    seg = m.snapshot().views[0].seg
    path = tmp_path / "mem" / f"seg-{seg.uid:08d}.npz"
    z = MappedNpz(path)
    off, n = z.array("offsets"), seg.n_docs
    assert block_layout.from_saved(z.array, z.__contains__, off, n, bs=BLOCK) is not None
    assert block_layout.from_saved(z.array, z.__contains__, off, n, bs=BLOCK * 2) is None
    arrs = dict(z.read_all())
    arrs["blk_layout"] = np.array([block_layout.LAYOUT_VERSION + 1, BLOCK], np.int64)
    assert block_layout.from_saved(arrs.__getitem__, arrs.__contains__, off, n) is None
    del arrs["blk_dir"]
    assert block_layout.from_saved(arrs.__getitem__, arrs.__contains__, off, n) is None
    m.close()


@pytest.mark.parametrize("fault, message", [
    ("dir_out", "directory entry lies outside"), ("dir_before", "directory entry lies outside"),
    ("last", "document outside the segment"), ("tf", "tf below 1"), ("shape", "blk_maxtf"),
    ("meta", "blk_layout")])
def test_a_saved_layout_that_does_not_fit_is_a_damaged_file(tmp_path, monkeypatch, fault, message):
    """A file whose bytes pass their CRC-32 but whose layout would send a kernel astray (a faulty writer)."""
    m = _grown(n=120)
    real = block_layout.saved_arrays

    def faulty(layout):
        out = {k: np.array(v) for k, v in real(layout).items()}
        if fault == "dir_out":
            out["blk_dir"][-1] = layout.blocks[0][-1] + 1
        elif fault == "dir_before":
            out["blk_dir"][-1] = -1
        elif fault == "last":
            out["blk_last"][0] = 1 << 30
        elif fault == "tf":
            out["blk_maxtf"][0] = 0
        elif fault == "shape":
            out["blk_maxtf"] = out["blk_maxtf"][:-1]
        else:
            out["blk_layout"] = np.array([1.0, 2.0, 3.0])
        return out

    monkeypatch.setattr(block_layout, "saved_arrays", faulty)
    m.save(tmp_path / "mem")
    m.close()
    monkeypatch.undo()
    o = Memory.open(tmp_path / "mem", writer=False)  # the layout is read when a scorer is made: at search
    with pytest.raises(MemoryFormatError, match=rf"seg-\d+\.npz: damaged segment file \(.*{message}"):
        o.search("w1 w2 w3 w4 w5", k=3)
    o.close()


def test_damaged_layout_bytes_are_found_by_their_checksum(tmp_path):
    m = _grown(n=120)
    m.save(tmp_path / "mem")
    m.close()
    seg = next((tmp_path / "mem").glob("seg-*.npz"))
    mz = MappedNpz(seg)
    start = mz._members["blk_dir"].data_off
    del mz
    raw = bytearray(seg.read_bytes())
    raw[start] ^= 0xFF
    seg.write_bytes(bytes(raw))
    o = Memory.open(tmp_path / "mem", writer=False)
    with pytest.raises(MemoryFormatError, match=r"damaged segment file .*blk_dir.*CRC-32"):
        o.search("w1 w2 w3 w4 w5", k=3)
    o.close()


def test_segment_files_without_numba_hold_no_layout(tmp_path, monkeypatch):
    import gpuir._compat as compat

    m = Memory(background_merges=False)
    m.add([{"id": "a", "text": "one two three"}, {"id": "b", "text": "two three four"}])
    monkeypatch.setattr(compat, "numba_available", lambda: (False, "numba does not import (test)"))
    m.save(tmp_path / "np")  # (no search ran: no compiled scorer holds a layout to reuse)
    for seg in (tmp_path / "np").glob("seg-*.npz"):
        assert not any(n.startswith("blk_") for n in MappedNpz(seg).names)
    m.close()
    monkeypatch.undo()
    o = Memory.open(tmp_path / "np", writer=False)
    assert o.search("three", k=2).ids(0) == ["a", "b"]
    o.close()
