"""The library's remaining failures of issue 23 (item 7): a huge k allocates nothing k-sized in any API,
a stored analyzer pattern cannot hang a search, a manifest edited after it was written is refused,
clear messages for ``search(None)`` and for a 0/1 integer array meant as a mask, and ``Memory.add``
refusing integers beyond 64 bits and over-deep metadata.

Each case failed on the code before this change (noted per test).
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from gpuir import BM25Index, Memory
from gpuir.analysis import AnalyzerConfig, check_pattern_linear
from gpuir.index.storage import IndexFormatError, manifest_digest
from gpuir.memory import RecordError

DOCS = ["the budget meeting", "garden party budget", "coffee with the team", "a budget review"]


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_huge_k_allocates_nothing_k_sized_in_any_api():
    """Before: ``BM25Index.search(k=10**9)`` padded its result to k columns (16 GB for two queries)."""
    idx = BM25Index.build(DOCS, analyzer="plain")
    r = idx.search(["budget", "team"], k=10**9)
    assert r.shape == (2, 4) and (r.ids[1, 1:] == -1).all()
    assert _peak_bytes(lambda: idx.search(["budget", "team"], k=10**12)) < 50 << 20
    m = Memory()  # Memory.search clamps k to its live records too
    m.add([{"id": f"d{i}", "text": t} for i, t in enumerate(DOCS)])
    assert m.search(["budget", "team"], k=10**9).shape == (2, 4)
    assert _peak_bytes(lambda: m.search(["budget", "team"], k=10**12)) < 50 << 20
    m.delete(["d2"])
    assert m.search(["budget"], k=10**9).shape == (1, 3)
    from gpuir.retrieve import Retriever
    from gpuir.retrieve.config import ChannelConfig, RetrieverConfig

    retr = Retriever(m, RetrieverConfig(channels=[ChannelConfig("bm25", depth=50)], fusion=None))
    assert _peak_bytes(lambda: retr.search(["budget"], k=10**12)) < 50 << 20
    assert [h["id"] for h in retr.search(["budget"], k=10**9).hits(0)] == ["d0", "d3", "d1"]


def test_search_none_says_what_queries_must_be():
    """Before: ``TypeError: 'NoneType' object is not iterable``."""
    idx = BM25Index.build(DOCS, analyzer="plain")
    with pytest.raises(TypeError, match="queries must be a str or a sequence of str, got NoneType"):
        idx.search(None)


def test_a_0_1_integer_array_is_not_taken_for_document_numbers():
    """Before: ``np.array([1, 0, 0, 1])`` meant as a mask allowed documents 0 and 1 (the wrong ones)."""
    idx = BM25Index.build(DOCS, analyzer="plain")
    mask = np.array([1, 0, 0, 1])
    with pytest.raises(ValueError, match="looks like a mask"):
        idx.search(["budget"], filters=mask)
    got = idx.search(["budget"], filters=mask.astype(bool)).ids[0]
    assert sorted(got[got >= 0].tolist()) == [0, 3]
    got = idx.search(["budget"], filters=np.array([0, 1])).ids[0]  # document numbers stay numbers
    assert sorted(got[got >= 0].tolist()) == [0, 1]


@pytest.mark.parametrize("pattern", [r"(a+)+b", r"(?:\w*\s*)*$", r"(a|ab)*c", r"(\w)\1"])
def test_a_backtracking_token_pattern_is_refused(pattern):
    with pytest.raises(ValueError, match="exponential"):
        AnalyzerConfig(pattern=pattern)


@pytest.mark.parametrize("pattern", [r"\w+", r"(?u)\b\w\w+\b", r"[^,]+", r"[\w-]+"])
def test_linear_token_patterns_are_accepted(pattern):
    check_pattern_linear(pattern)
    AnalyzerConfig(pattern=pattern)


def _live_manifest(root: Path) -> Path:
    return root / (root / "CURRENT").read_text().strip() / "manifest.json"


def test_a_stored_backtracking_pattern_is_refused_at_load(tmp_path):
    """Before: a manifest's pattern ``(a+)+b`` was compiled as-is, and a search of 'aaaa...' hung 10 s."""
    BM25Index.build(DOCS, analyzer="plain").save(tmp_path / "idx")
    mp = _live_manifest(tmp_path / "idx")
    m = json.loads(mp.read_text())
    m["analyzer"]["pattern"] = r"(a+)+b"
    m["manifest_sha256"] = manifest_digest(m)  # as an attacker who knows the format would
    mp.write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match="exponential"):
        BM25Index.load(tmp_path / "idx")


def test_a_manifest_edited_after_it_was_written_is_refused(tmp_path):
    """Before: postings changed with the file checksums recomputed in the manifest loaded silently."""
    import hashlib

    BM25Index.build(DOCS, analyzer="plain").save(tmp_path / "idx")
    mp = _live_manifest(tmp_path / "idx")
    tfs = mp.parent / "tfs.npy"
    arr = np.load(tfs)
    arr[0] += 7
    np.save(tfs, arr)
    m = json.loads(mp.read_text())
    m["files"]["tfs.npy"]["sha256"] = hashlib.sha256(tfs.read_bytes()).hexdigest()
    mp.write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match="manifest's own checksum"):
        BM25Index.load(tmp_path / "idx")


def _tamper_postings(mp: Path) -> dict:
    """Change the postings' term frequencies and recompute their file checksum in the manifest (returned)."""
    import hashlib

    tfs = mp.parent / "tfs.npy"
    arr = np.load(tfs)
    arr[:] += 7
    np.save(tfs, arr)
    m = json.loads(mp.read_text())
    m["files"]["tfs.npy"]["sha256"] = hashlib.sha256(tfs.read_bytes()).hexdigest()
    return m


def test_a_manifest_without_its_own_checksum_is_refused(tmp_path):
    """Before (issue 36's audit): tampered postings, file checksums recomputed and ``manifest_sha256``
    deleted loaded, and the scores changed (0.1674 -> 0.3125). From format 3 the checksum is mandatory."""
    idx = BM25Index.build(DOCS, analyzer="plain")
    idx.save(tmp_path / "idx")
    want = idx.search(["budget"], k=1).scores[0, 0]
    mp = _live_manifest(tmp_path / "idx")
    assert json.loads(mp.read_text())["format_version"] == 3
    m = _tamper_postings(mp)
    del m["manifest_sha256"]
    mp.write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match="no checksum of its own"):
        BM25Index.load(tmp_path / "idx")
    m["format_version"] = 2  # what the field's absence meant before: an index saved before issue 23
    mp.write_text(json.dumps(m))
    tampered = BM25Index.load(tmp_path / "idx").search(["budget"], k=1).scores[0, 0]
    assert tampered != want, "an unkeyed checksum stops damage, not someone who can write the directory"


def test_a_version_2_manifest_without_its_own_checksum_still_loads(tmp_path):
    """Indexes saved before issue 23 (format 2) carry no manifest checksum and load as before; the next
    save rewrites them as format 3, with the checksum."""
    idx = BM25Index.build(DOCS, analyzer="plain")
    idx.save(tmp_path / "idx")
    mp = _live_manifest(tmp_path / "idx")
    m = json.loads(mp.read_text())
    del m["manifest_sha256"]
    m["format_version"] = 2
    mp.write_text(json.dumps(m))
    old = BM25Index.load(tmp_path / "idx")
    assert old.search(["budget"], k=1).ids[0, 0] == 0
    assert old.search(["budget"], k=1).scores[0, 0] == idx.search(["budget"], k=1).scores[0, 0]
    old.save(tmp_path / "idx")
    m = json.loads(_live_manifest(tmp_path / "idx").read_text())
    assert m["format_version"] == 3 and m["manifest_sha256"] == manifest_digest(m)


@pytest.mark.parametrize("meta,msg", [
    ({"n": 10 ** 400}, "64 bits"),
    ({"n": [-(2 ** 63) - 1]}, "64 bits"),
    (json.loads('{"a": ' * 300 + "1" + "}" * 300), "nested more than 32"),
    ("deep list", "nested more than 32"),
])
def test_memory_add_refuses_huge_integers_and_deep_metadata(meta, msg):
    """Before: a 400-digit integer was stored (and then broke filters); 5,000 levels raised RecursionError."""
    if meta == "deep list":  # 5,000 levels, built without recursion
        inner: list = []
        meta = {"a": inner}
        for _ in range(5000):
            inner.append([])
            inner = inner[0]
    m = Memory()
    with pytest.raises(RecordError, match=msg):
        m.add([{"id": "x", "text": "t", "metadata": meta}])
    assert len(m) == 0
    m.add([{"id": "y", "text": "t", "metadata": {"edge": [2 ** 63 - 1, -(2 ** 63)], "d": {"e": {"f": 1}}}}])
    assert m.get(["y"])[0]["metadata"]["edge"] == [2 ** 63 - 1, -(2 ** 63)]
