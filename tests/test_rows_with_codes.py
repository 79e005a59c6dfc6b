"""Segment.rows_with_codes: the rows holding any of some codes, looked up with keys of the column's dtype."""

import numpy as np

from gpuir import Memory


def _segment():
    mem = Memory()
    mem.add([{"id": f"r{i}", "text": f"note {i}", "tenant": f"t{i % 5}"} for i in range(200)])
    snap = mem.snapshot()
    return snap.views[0].seg, snap.dicts


def _want(seg, codes):
    col = seg.codes["tenant"]
    return np.flatnonzero(np.isin(col, np.asarray(codes, dtype=np.int64))).astype(np.int64)


def test_rows_with_codes_matches_a_scan():
    seg, dicts = _segment()
    assert seg.codes["tenant"].dtype == np.int32
    for codes in ([dicts["tenant"].lookup("t3")], [dicts["tenant"].lookup(t) for t in ("t4", "t0")], []):
        got = seg.rows_with_codes("tenant", np.asarray(codes, dtype=np.int64))
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, _want(seg, codes))


def test_codes_outside_the_columns_range_match_nothing():
    seg, dicts = _segment()
    t1 = dicts["tenant"].lookup("t1")
    for codes in ([2**40], [-(2**40)], [2**32 + t1]):  # (2**32 + t1 would wrap to t1 if merely cast)
        assert seg.rows_with_codes("tenant", np.asarray(codes, dtype=np.int64)).size == 0
    got = seg.rows_with_codes("tenant", np.asarray([2**40, t1], dtype=np.int64))
    np.testing.assert_array_equal(got, _want(seg, [t1]))
