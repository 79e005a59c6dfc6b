"""Persistence: round trip, mmap, atomic replacement, clear errors on corruption."""

import json
import os

import numpy as np
import pytest
from _helpers import random_corpus

from gpuir import BM25Index, IndexFormatError
from gpuir.index import storage


@pytest.fixture
def index():
    return BM25Index.build(random_corpus(200, 80, seed=4), ids=[f"doc-{i}" for i in range(200)],
                           analyzer="porter", method="bm25l", k1=1.5, b=0.4)


def test_round_trip(index, tmp_path):
    index.save(tmp_path / "ix")
    for mmap in (True, False):
        back = BM25Index.load(tmp_path / "ix", mmap=mmap)
        assert back.params == index.params and back.ids == index.ids
        assert back.analyzer.cfg == index.analyzer.cfg and back.csr.vocab == index.csr.vocab
        for f in ("offsets", "doc_ids", "tfs", "doc_lens"):
            np.testing.assert_array_equal(getattr(back.csr, f), getattr(index.csr, f))
        q = ["w1 w2", "w30"]
        a, b = index.search(q, k=5), back.search(q, k=5)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.scores, b.scores)
    assert isinstance(BM25Index.load(tmp_path / "ix").csr.doc_ids, np.memmap)


def test_manifest_records_what_matters(index, tmp_path):
    vdir = storage.save_index(index.csr, tmp_path / "ix", extra={"bm25": index.params.to_dict()})
    m = json.loads((vdir / "manifest.json").read_text())
    assert m["format_version"] == storage.FORMAT_VERSION
    assert m["analyzer"]["stemmer"] == "porter" and m["bm25"]["method"] == "bm25l"
    assert m["files"]["doc_ids.npy"]["shape"] == [index.csr.n_postings]
    assert len(m["files"]["tfs.npy"]["sha256"]) == 64


def test_resave_replaces_and_cleans_up(index, tmp_path):
    index.save(tmp_path / "ix")
    first = _live(tmp_path)
    index.with_params(method="atire").save(tmp_path / "ix")
    assert BM25Index.load(tmp_path / "ix").params.method == "atire"
    index.with_params(method="bm25+").save(tmp_path / "ix")
    assert BM25Index.load(tmp_path / "ix").params.method == "bm25+"
    # the previous version is kept until the next save, older ones are retired
    versions = [p for p in (tmp_path / "ix").iterdir() if p.name.startswith("v-")]
    assert len(versions) == 2 and _live(tmp_path) in versions and first not in versions


def test_interrupted_save_leaves_previous_index_loadable(index, tmp_path, monkeypatch):
    index.save(tmp_path / "ix")
    before = BM25Index.load(tmp_path / "ix").search("w1", k=5)
    real_save = np.save
    calls = {"n": 0}

    def dying_save(*a, **kw):  # the process "dies" after writing two arrays
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_save(*a, **kw)

    monkeypatch.setattr(np, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        index.with_params(method="atire").save(tmp_path / "ix")
    monkeypatch.undo()
    back = BM25Index.load(tmp_path / "ix")
    assert back.params == index.params
    np.testing.assert_array_equal(back.search("w1", k=5).ids, before.ids)
    assert not [p for p in (tmp_path / "ix").iterdir() if p.name.startswith(".tmp")]


def test_missing_directory(tmp_path):
    with pytest.raises(IndexFormatError, match="does not exist"):
        BM25Index.load(tmp_path / "nope")


def test_not_an_index(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(IndexFormatError, match="CURRENT"):
        BM25Index.load(tmp_path / "x")


def _live(tmp_path):
    return tmp_path / "ix" / (tmp_path / "ix" / "CURRENT").read_text().strip()


def test_corrupt_array_is_named(index, tmp_path):
    index.save(tmp_path / "ix")
    p = _live(tmp_path) / "tfs.npy"
    data = bytearray(p.read_bytes())
    data[-1] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match=r"tfs\.npy: checksum mismatch"):
        BM25Index.load(tmp_path / "ix")


def test_truncated_and_missing_files_are_named(index, tmp_path):
    index.save(tmp_path / "ix")
    live = _live(tmp_path)
    os.remove(live / "vocab.json")
    with pytest.raises(IndexFormatError, match=r"vocab\.json: missing"):
        BM25Index.load(tmp_path / "ix")
    (live / "doc_ids.npy").write_bytes(b"garbage")
    with pytest.raises(IndexFormatError, match=r"doc_ids\.npy"):
        BM25Index.load(tmp_path / "ix", verify=False)


def test_incompatible_version(index, tmp_path):
    index.save(tmp_path / "ix")
    m = _live(tmp_path) / "manifest.json"
    d = json.loads(m.read_text())
    d["format_version"] = 999
    m.write_text(json.dumps(d))
    with pytest.raises(IndexFormatError, match="format version 999"):
        BM25Index.load(tmp_path / "ix")
    m.write_text("{not json")
    with pytest.raises(IndexFormatError, match="not valid JSON"):
        BM25Index.load(tmp_path / "ix")
