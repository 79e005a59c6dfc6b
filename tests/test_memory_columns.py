"""gpuir.memory.columns.StrArray: a concatenation keeps its parts' bytes unjoined (merges copy no text) and
reads, gathers, lists and saves exactly what a joined array holds."""

import numpy as np
import pytest

from gpuir.memory.columns import StrArray

WORDS = ["", "a", "héllo", "x" * 50, "日本語", "zz", "\N{SNOWMAN}"]


def _random_parts(rng) -> list[list[str]]:
    return [[WORDS[i] for i in rng.integers(0, len(WORDS), int(rng.integers(0, 7)))]
            for _ in range(int(rng.integers(1, 6)))]


def test_a_concatenation_reads_as_the_joined_strings_without_joining():
    rng = np.random.default_rng(7)
    for _ in range(300):
        lists = _random_parts(rng)
        parts = [StrArray.from_list(p) for p in lists]
        if len(parts) > 2 and rng.random() < 0.5:  # a concatenation of concatenations (merges of merges)
            parts = [StrArray.concat(parts[:2])] + parts[2:]
        flat = [s for p in lists for s in p]
        joined = StrArray.from_list(flat)
        got = StrArray.concat(parts)
        assert len(got) == len(flat)
        assert [got[i] for i in range(len(got))] == flat
        assert got[-1:] == flat[-1:] and got[0:3] == flat[0:3]
        assert got.nbytes == joined.nbytes
        rows = rng.integers(0, len(flat), 5) if flat else np.zeros(0, np.int64)
        assert got.take(rows).tolist() == [flat[r] for r in rows]
        assert got.get_many(rows) == [flat[r] for r in rows]
        assert got.get_many(np.arange(len(flat))[::-1]) == flat[::-1]
        assert got.tolist() == flat
        assert np.array_equal(got.offsets, joined.offsets) and np.array_equal(got.data, joined.data)


def test_reading_strings_does_not_join_the_parts_and_saving_does():
    parts = [StrArray.from_list([f"text {i} of part {p}" for i in range(100)]) for p in range(8)]
    got = StrArray.concat([StrArray.concat(parts[:4]), StrArray.concat(parts[4:])])
    assert got._chunks is not None and len(got._chunks[1]) == 8, "no bytes copied: the parts' arrays, flattened"
    assert all(c is p.data for c, p in zip(got._chunks[1], parts))
    assert got[0] == "text 0 of part 0" and got[799] == "text 99 of part 7" and got[450] == "text 50 of part 4"
    assert got._chunks is not None, "reading one string never joins"
    assert got.get_many(np.array([799, 0, 450, 450])) == ["text 99 of part 7", "text 0 of part 0",
                                                         "text 50 of part 4", "text 50 of part 4"]
    assert got._chunks is not None, "reading many strings never joins"
    for bad in ([800], [-1]):
        with pytest.raises(IndexError, match="out of range"):
            got.get_many(np.array(bad))
    data = got.data  # what a save writes
    assert got._chunks is None and data.size == sum(p.data.size for p in parts)


def test_a_segments_records_are_its_record_of_each_row():
    """Segment.records (a search's hits, fetched column by column) gives exactly Segment.record per row, on
    added and merged segments, with absent fields, metadata, times and unicode."""
    from gpuir import Memory

    rng = np.random.default_rng(3)
    mem = Memory(merge_factor=2, merge_min=4, background_merges=False)
    for i in range(40):
        rec = {"id": f"r{i}", "text": f"{WORDS[i % len(WORDS)]} turn {i}"}
        if i % 3:
            rec["session"] = f"s{i % 4}"
        if i % 4 == 1:
            rec["role"] = "user"
        if i % 5:
            rec["metadata"] = {"k": i, "w": WORDS[i % len(WORDS)]}
        if i % 2:
            rec["time"] = f"2024-05-{1 + i % 28:02d}T10:{i:02d}:00+00:00"
            rec["importance"] = i / 40
        mem.add([rec])
    snap = mem.snapshot()
    assert any(v.seg.n_docs > 1 for v in snap.views), "some merged segments"
    for v in snap.views:
        rows = rng.permutation(v.seg.n_docs)
        assert v.seg.records(rows, snap.dicts) == [v.seg.record(int(r), snap.dicts) for r in rows]
    pairs = [(vi, r) for vi, v in enumerate(snap.views) for r in range(v.seg.n_docs)]
    order = rng.permutation(len(pairs))
    vis, rows = [pairs[j][0] for j in order], [pairs[j][1] for j in order]
    assert snap.records(vis, rows) == [snap.record(a, b) for a, b in zip(vis, rows)]
    mem.close()


def test_a_record_with_every_field_lists_them_in_record_fields_order():
    """make_record builds its dict in RECORD_FIELDS order (no reordering pass): a record holding every field,
    expiry and record times included, comes back with its keys in exactly that order."""
    from gpuir import Memory
    from gpuir.memory.records import RECORD_FIELDS

    mem = Memory(record_times=True) if "record_times" in Memory.__init__.__code__.co_varnames else Memory()
    rec = {"id": "a", "text": "every field", "session": "s", "role": "user", "agent": "ag", "tenant": "t",
           "time": "2024-05-01T10:00:00+00:00", "importance": 0.5, "type": "fact", "metadata": {"k": 1},
           "expires_at": "2999-01-01T00:00:00+00:00"}
    mem.add([rec])
    got = mem.get(["a"])[0]
    assert [f for f in RECORD_FIELDS if f in got] == list(got), list(got)
    assert set(rec) <= set(got) and {"created_at", "updated_at"} <= set(got)
    hit = mem.search("every field", k=1, where={"tenant": "t"}).hits(0)[0]
    assert [f for f in ("id", "score") + RECORD_FIELDS[1:] if f in hit] == list(hit), list(hit)
    mem.close()
