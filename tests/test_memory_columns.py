"""gpuir.memory.columns.StrArray: a concatenation keeps its parts' bytes unjoined (merges copy no text) and
reads, gathers, lists and saves exactly what a joined array holds."""

import numpy as np

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
        assert got.tolist() == flat
        assert np.array_equal(got.offsets, joined.offsets) and np.array_equal(got.data, joined.data)


def test_reading_strings_does_not_join_the_parts_and_saving_does():
    parts = [StrArray.from_list([f"text {i} of part {p}" for i in range(100)]) for p in range(8)]
    got = StrArray.concat([StrArray.concat(parts[:4]), StrArray.concat(parts[4:])])
    assert got._chunks is not None and len(got._chunks[1]) == 8, "no bytes copied: the parts' arrays, flattened"
    assert all(c is p.data for c, p in zip(got._chunks[1], parts))
    assert got[0] == "text 0 of part 0" and got[799] == "text 99 of part 7" and got[450] == "text 50 of part 4"
    assert got._chunks is not None, "reading one string never joins"
    data = got.data  # what a save writes
    assert got._chunks is None and data.size == sum(p.data.size for p in parts)
