"""Guarantees of the index directory (docs/guarantees.md, "Storage"), one test per promise.

In-process tests: ownership of the directory, one writer across threads, readers
that survive re-saves, old indexes, malformed manifests, file-system errors.
The multi-process and kill -9 versions are in ``test_faults.py``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from _helpers import random_corpus

from gpuir import BM25Index, IndexFormatError
from gpuir.analysis import AnalyzerConfig
from gpuir.index import storage
from gpuir.index.storage import manifest_digest
from gpuir.storage import dirlock

QUERIES = ["w1 w2", "w30 w0", "w7"]


@pytest.fixture(scope="module")
def small():
    return BM25Index.build(random_corpus(120, 60, seed=5), ids=[f"d{i}" for i in range(120)], analyzer="plain")


def answers(idx: BM25Index):
    r = idx.search(QUERIES, k=5, backend="numpy")
    return r.ids.tolist(), r.scores.tolist()


# -- ownership: gpuir writes only into its own directories and deletes only what it created


def test_index_into_a_folder_of_user_files_is_refused_and_deletes_nothing(small, tmp_path):
    ud = tmp_path / "ud"
    (ud / "v-notes").mkdir(parents=True)
    (ud / "v-notes" / "thesis.tex").write_text("years of work")
    (ud / ".tmp-v-draft").mkdir()
    (ud / ".tmp-v-draft" / "a.txt").write_text("keep")
    with pytest.raises(dirlock.NotAGpuirDirError, match="not empty and was not created by gpuir"):
        small.save(ud)
    assert (ud / "v-notes" / "thesis.tex").read_text() == "years of work"
    assert (ud / ".tmp-v-draft" / "a.txt").read_text() == "keep"
    assert sorted(p.name for p in ud.iterdir()) == [".tmp-v-draft", "v-notes"]


def test_user_files_put_into_an_index_are_never_deleted(small, tmp_path):
    ix = tmp_path / "ix"
    small.save(ix)
    (ix / "v-notes").mkdir()
    (ix / "v-notes" / "thesis.tex").write_text("years of work")
    (ix / ".tmp-v-mine").mkdir()
    (ix / "notes.txt").write_text("mine")
    for _ in range(3):
        small.save(ix)
    assert (ix / "v-notes" / "thesis.tex").read_text() == "years of work"
    assert (ix / ".tmp-v-mine").is_dir() and (ix / "notes.txt").read_text() == "mine"
    assert answers(BM25Index.load(ix)) == answers(small)


@pytest.mark.parametrize("path", ["", "   "])
def test_empty_path_is_a_clear_error(small, path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(dirlock.StoreError, match="empty"):
        small.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_path_below_a_regular_file_is_a_clear_error(small, tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(dirlock.StoreError, match="not a directory"):
        small.save(tmp_path / "f" / "sub")
    with pytest.raises(dirlock.StoreError, match="not a directory"):
        small.save(tmp_path / "f")
    with pytest.raises(IndexFormatError):
        BM25Index.load(tmp_path / "f" / "sub")
    assert (tmp_path / "f").read_text() == "x"


def test_an_empty_existing_folder_is_adopted_and_marked(small, tmp_path):
    (tmp_path / "e").mkdir()
    small.save(tmp_path / "e")
    assert dirlock.is_claimed(tmp_path / "e")
    assert answers(BM25Index.load(tmp_path / "e")) == answers(small)


def test_a_memory_store_is_not_overwritten_by_an_index(small, tmp_path):
    dirlock.claim_dir(tmp_path / "m", "memory")
    with pytest.raises(dirlock.StoreError, match="memory store"):
        small.save(tmp_path / "m")


# -- one writer: concurrent saves are serialised and never corrupt


def test_a_second_writer_waits_then_fails_with_a_clear_message(small, tmp_path):
    ix = tmp_path / "ix"
    small.save(ix)
    with dirlock.WriterLock(ix, timeout=5), pytest.raises(dirlock.StoreLockedError, match="locked by another writer"):
        small.save(ix, lock_timeout=0.2)
    small.save(ix, lock_timeout=0.2)  # free again


# -- readers survive writers


def test_a_loaded_index_keeps_answering_after_its_version_is_retired(tmp_path):
    ix = tmp_path / "ix"
    a = BM25Index.build(random_corpus(300, 80, seed=1), analyzer="plain")
    b = BM25Index.build(random_corpus(200, 80, seed=2), analyzer="plain", method="atire")
    a.save(ix)
    loaded = [BM25Index.load(ix, mmap=True), BM25Index.load(ix, mmap=False)]
    first = os.listdir(ix)
    for _ in range(4):  # the first version is retired after two more saves
        b.save(ix)
    assert not {n for n in first if n.startswith("v-")} & set(os.listdir(ix))
    for idx in loaded:
        assert answers(idx) == answers(a)
    assert answers(BM25Index.load(ix)) == answers(b)


def test_a_version_being_loaded_is_not_retired(small, tmp_path):
    """A reader's lease on a version keeps writers from deleting it until the lease ends."""
    ix = tmp_path / "ix"
    small.save(ix)
    vdir = ix / (ix / "CURRENT").read_text().strip()
    with storage.lease_version(vdir):
        for _ in range(3):
            small.save(ix)
        assert vdir.is_dir()
    small.save(ix)
    assert not vdir.exists()


def _version_dirs(root: Path) -> list[str]:
    """Complete and half-written version folders of an index directory."""
    return sorted(p.name for p in root.iterdir() if p.is_dir() and (p.name.startswith("v-")
                                                                    or p.name.startswith(".tmp-v-")))


def test_disk_space_is_two_versions_between_saves_and_a_readers_one_more_during_a_save(small, tmp_path, monkeypatch):
    """docs/guarantees.md, "Disk space": between saves the live version and the previous one; during a save
    the live one, the new one, and any version a reader is loading."""
    ix = tmp_path / "ix"
    between = []
    for _ in range(4):
        small.save(ix)
        between.append(len(_version_dirs(ix)))
    assert between == [1, 2, 2, 2]
    during: list[list[str]] = []
    real = storage.fsync_dir

    def spy(p):  # called at each step of a save: the new folder written, renamed, CURRENT moved
        during.append(_version_dirs(ix))
        real(p)

    monkeypatch.setattr(storage, "fsync_dir", spy)
    live = (ix / "CURRENT").read_text().strip()
    small.save(ix)
    assert during and max(len(d) for d in during) == 2, during  # the previous one was retired first
    assert any(live in d and any(x.startswith(".tmp-") for x in d) for d in during), "the live one and the new"
    previous, live = live, (ix / "CURRENT").read_text().strip()
    during.clear()
    with storage.lease_version(ix / previous):  # a reader loading the previous version keeps it
        small.save(ix)
        assert max(len(d) for d in during) == 3 and (ix / previous).is_dir()
        assert len(_version_dirs(ix)) == 3
    small.save(ix)
    assert len(_version_dirs(ix)) == 2 and not (ix / previous).exists()


# -- old indexes


def write_v1_index(idx: BM25Index, root: Path) -> None:
    """The directory layout of format version 1 (gpuir 0.1), written without gpuir's storage code."""
    name = "v-20240101T000000-0123abcd"
    vdir = root / name
    vdir.mkdir(parents=True)
    files = {}
    for a, dt in (("offsets", "int64"), ("doc_ids", "int32"), ("tfs", "int32"), ("doc_lens", "int32")):
        arr = np.ascontiguousarray(getattr(idx.csr, a), dtype=dt)
        np.save(vdir / f"{a}.npy", arr)
        files[f"{a}.npy"] = {"shape": list(arr.shape), "dtype": dt,
                             "sha256": hashlib.sha256((vdir / f"{a}.npy").read_bytes()).hexdigest()}
    (vdir / "vocab.txt").write_bytes(("\n".join(idx.csr.vocab) + "\n").encode())
    (vdir / "ids.json").write_bytes(json.dumps(idx.csr.ids).encode())
    for f in ("vocab.txt", "ids.json"):
        files[f] = {"sha256": hashlib.sha256((vdir / f).read_bytes()).hexdigest()}
    manifest = {"format": "gpuir-csr", "format_version": 1, "n_docs": idx.n_docs, "n_terms": idx.csr.n_terms,
                "n_postings": idx.csr.n_postings, "analyzer": idx.csr.analyzer, "files": files,
                "bm25": idx.params.to_dict()}
    (vdir / "manifest.json").write_text(json.dumps(manifest))
    (root / "CURRENT").write_text(name + "\n")


def test_a_format_1_index_loads_and_can_be_resaved(small, tmp_path):
    ix = tmp_path / "old"
    write_v1_index(small, ix)
    assert answers(BM25Index.load(ix)) == answers(small)
    other = small.with_params(method="bm25+")
    other.save(ix)  # adopted: it holds nothing but gpuir's own entries
    assert answers(BM25Index.load(ix)) == answers(other)
    assert dirlock.is_claimed(ix)


def test_a_format_1_lookalike_with_user_files_is_not_adopted(small, tmp_path):
    ix = tmp_path / "old"
    write_v1_index(small, ix)
    (ix / "thesis.tex").write_text("mine")
    with pytest.raises(dirlock.NotAGpuirDirError):
        small.save(ix)
    assert (ix / "thesis.tex").read_text() == "mine"
    assert answers(BM25Index.load(ix)) == answers(small)


# -- any token round-trips


def test_tokens_holding_newlines_round_trip(tmp_path):
    cfg = AnalyzerConfig(pattern=r"[^,]+", lowercase=False, stopwords=None, stemmer=None, normalize=None)
    docs = ["a\nb,c", "c,\n,x\r\ny", "a\nb,a\nb,z\u2028w", "\ud800,plain"]
    idx = BM25Index.build(docs, analyzer=cfg.__dict__)
    idx.save(tmp_path / "ix")
    back = BM25Index.load(tmp_path / "ix")
    assert back.csr.vocab == idx.csr.vocab and "a\nb" in back.csr.vocab
    for q in ("a\nb", "\n", "x\r\ny", "z\u2028w", "\ud800"):
        r1, r2 = idx.search(q, k=4), back.search(q, k=4)
        assert r1.ids.tolist() == r2.ids.tolist() and r1.ids[0, 0] >= 0


def test_ids_that_are_not_utf8_encodable_round_trip(tmp_path):
    idx = BM25Index.build(["a b", "b c"], ids=["\ud800", "é\n"], analyzer="plain")
    idx.save(tmp_path / "ix")
    assert BM25Index.load(tmp_path / "ix").ids == ["\ud800", "é\n"]


# -- malformed manifests are clear errors


def _manifest(ix: Path) -> Path:
    return ix / (ix / "CURRENT").read_text().strip() / "manifest.json"


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda m: [m], "must be a JSON object"),
        (lambda m: {**m, "files": []}, '"files"'),
        (lambda m: {**m, "files": {**m["files"], "tfs.npy": "x"}}, "tfs.npy"),
        (lambda m: {**m, "files": {**m["files"], "tfs.npy": {"sha256": 5}}}, "tfs.npy"),
        (lambda m: {**m, "analyzer": "porter!"}, "analyzer"),
        (lambda m: {**m, "analyzer": {"pattern": "("}}, "analyzer"),
        (lambda m: {**m, "bm25": {"k1": "big"}}, "bm25"),
        (lambda m: {**m, "bm25": {"k1": -1}}, "bm25"),
        (lambda m: {**m, "bm25": [1]}, "bm25"),
        (lambda m: {**m, "format_version": "2"}, "format version"),
    ],
)
def test_a_manifest_of_the_wrong_shape_is_a_clear_error(small, tmp_path, mutate, message):
    ix = tmp_path / "ix"
    small.save(ix)
    mp = _manifest(ix)
    m = mutate(json.loads(mp.read_text()))
    if isinstance(m, dict):  # the manifest's own checksum recomputed: the shape check is what is tested
        m["manifest_sha256"] = manifest_digest(m)
    mp.write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match=message):
        BM25Index.load(ix)


def test_a_deeply_nested_manifest_is_a_clear_error(small, tmp_path):
    ix = tmp_path / "ix"
    small.save(ix)
    _manifest(ix).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(IndexFormatError, match="manifest.json"):
        BM25Index.load(ix)


def test_ids_of_the_wrong_shape_are_a_clear_error(small, tmp_path):
    ix = tmp_path / "ix"
    small.save(ix)
    vdir = _manifest(ix).parent
    (vdir / "ids.json").write_text(json.dumps(list(range(small.n_docs))))
    with pytest.raises(IndexFormatError, match="ids.json"):
        BM25Index.load(ix, verify=False)


# -- file-system errors: a clear error, the old index intact, no partial files


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT])
@pytest.mark.parametrize("after", [0, 3, 6])
def test_a_file_system_error_during_save_keeps_the_old_index(small, tmp_path, monkeypatch, err, after):
    ix = tmp_path / "ix"
    small.save(ix)
    before = sorted(os.listdir(ix))
    real = storage._write_file
    calls = {"n": 0}

    def failing(path, data):
        calls["n"] += 1
        if calls["n"] > after:
            raise OSError(err, os.strerror(err), str(path))
        return real(path, data)

    monkeypatch.setattr(storage, "_write_file", failing)
    with pytest.raises(storage.StoreWriteError, match=os.strerror(err)):
        small.with_params(method="atire").save(ix)
    monkeypatch.undo()
    assert sorted(os.listdir(ix)) == before
    assert answers(BM25Index.load(ix)) == answers(small)
