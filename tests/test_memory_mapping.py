"""Memory.open maps segment files: only manifests and small columns are read at open, the rest on first
use (checked then); files are ordinary .npz with aligned arrays; older files still open; `gpuir memory
verify` reads every byte."""

from __future__ import annotations

import json
import mmap

import numpy as np
import pytest
from _memory_oracle import random_query, random_record

from gpuir import Memory
from gpuir.cli import main as cli_main
from gpuir.memory import MemoryFormatError, persist
from gpuir.memory.segfile import ALIGN, MappedNpz, members_info
from gpuir.memory.segments import segment_arrays

LAZY = ("csr", "texts", "meta", "codes", "time", "importance", "maxtf")


def _memory(tmp_path, n=300, deletes=(), seed=0):
    rng = np.random.default_rng(seed)
    m = Memory(partition_days=3, merge_factor=3, merge_min=16, background_merges=False)
    recs = [random_record(rng, f"r{i}") for i in range(n)]
    for a in range(0, n, 50):
        m.add(recs[a: a + 50])
    if deletes:
        m.delete(list(deletes))
    d = tmp_path / "mem"
    m.save(d)
    return m, d


def _same(a: Memory, b: Memory, seed=1, where=None):
    rng = np.random.default_rng(seed)
    qs = [random_query(rng) for _ in range(30)]
    ra, rb = a.search(qs, k=8, where=where), b.search(qs, k=8, where=where)
    np.testing.assert_array_equal(ra.seqs, rb.seqs)
    np.testing.assert_array_equal(ra.scores, rb.scores)
    assert [ra.hits(i) for i in range(len(qs))] == [rb.hits(i) for i in range(len(qs))]


def test_segment_files_are_npz_with_aligned_arrays(tmp_path):
    m, d = _memory(tmp_path)
    for seg in d.glob("seg-*.npz"):
        info = members_info(seg)
        assert info and all(v["data_offset"] % ALIGN == 0 for v in info.values()), "every array aligned"
        with np.load(seg) as z:  # an ordinary .npz: numpy (and older gpuir) read it
            uid = int(seg.stem.split("-")[1])
            want = segment_arrays(next(v.seg for v in m.snapshot().views if v.seg.uid == uid), m._writer._dicts)
            assert set(z.files) == set(want)
            for k, a in want.items():
                np.testing.assert_array_equal(z[k], a, err_msg=k)
    m.close()


def test_open_reads_only_small_columns_and_maps_the_rest(tmp_path):
    m, d = _memory(tmp_path)
    m.close()
    r = Memory.open(d, writer=False)
    segs = [v.seg for v in r.snapshot().views]
    assert segs and all(s.loaded == [] for s in segs), "nothing but the small columns was read at open"
    # a search reads the postings of the segments holding its terms -- mapped, not copied
    res = r.search("w1", k=3)
    touched = [s for s in segs if "csr" in s.loaded]
    assert touched and all(s.csr.doc_ids.base is not None for s in touched)
    base = touched[0].csr.doc_ids.base
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    assert isinstance(base, mmap.mmap), "postings are a view of the file's mapping"
    assert all("texts" not in s.loaded for s in segs), "texts are read only for hits"
    hits = res.hits(0)
    assert hits and any("texts" in s.loaded for s in segs)
    _same(m, r)
    _same(m, r, where={"tenant": "acme"})
    assert r.info()["records"] == len(m)


def test_a_segment_with_deletions_reads_its_postings_at_open(tmp_path):
    """The live document frequencies of a segment with tombstones need its postings (documented)."""
    m, d = _memory(tmp_path, deletes=["r3", "r7", "r290"])
    m.close()
    r = Memory.open(d, writer=False)
    for v in r.snapshot().views:
        assert ("csr" in v.seg.loaded) == (v.live is not None)
    _same(m, r)


def test_files_written_by_np_savez_still_open(tmp_path, monkeypatch):
    """Segment files of older gpuir (np.savez: unaligned arrays, no per-term bounds, no layout digest)."""

    def old_write(root, uid, arrays):
        arrays = {k: v for k, v in arrays.items() if k not in ("maxtf", "mindl")}
        return persist._write_atomic(root, persist.segment_name(uid), lambda f: np.savez(f, **arrays))

    monkeypatch.setattr(persist, "write_segment", old_write)
    m, d = _memory(tmp_path, deletes=["r5"])
    m.close()
    monkeypatch.undo()
    r = Memory.open(d)
    _same(m, r)
    _same(m, r, where={"role": "user"})
    assert all(a.flags.aligned for v in r.snapshot().views for a in (v.seg.csr.doc_ids, v.seg.csr.tfs))
    r.add([{"id": "new", "text": "w1 w2"}])  # and they are merged and saved in the new form
    r.merge()
    r.save()
    r.close()
    current = [d / e["file"] for e in persist.read_manifest(d)[1]["segments"]]
    assert all(v["data_offset"] % ALIGN == 0 for seg in current for v in members_info(seg).values())


def test_damage_to_the_zip_layout_is_found_at_open(tmp_path):
    m, d = _memory(tmp_path)
    m.close()
    seg = max(d.glob("seg-*.npz"))
    raw = bytearray(seg.read_bytes())
    raw[-40] ^= 0x01  # in the zip's end records: no array's data
    seg.write_bytes(bytes(raw))
    with pytest.raises(MemoryFormatError, match=f"{seg.name}: damaged segment file"):
        Memory.open(d)


def test_crc_checks_happen_once_per_array(tmp_path, monkeypatch):
    m, d = _memory(tmp_path)
    m.close()
    calls = []
    real = MappedNpz.verify

    def counting(self, name):
        calls.append((id(self), name, name in self._checked))
        return real(self, name)

    monkeypatch.setattr(MappedNpz, "verify", counting)
    r = Memory.open(d, writer=False)
    at_open = {c[1] for c in calls}
    assert "seqs" in at_open and "doc_ids" not in at_open and "text_data" not in at_open
    for _ in range(3):
        r.search(["w1 w2 w3", "w4"], k=5).hits(0)
    first_use = {c[1] for c in calls} - at_open
    assert {"doc_ids", "tfs", "text_data"} <= first_use, "the rest is checked when first read"
    checked = [(f, n) for f, n, again in calls if not again]
    assert len(checked) == len(set(checked)) and not any(again for *_, again in calls), "once per array"


def test_verify_reads_every_byte(tmp_path, capsys):
    m, d = _memory(tmp_path, deletes=["r1"])
    m.close()
    assert cli_main(["memory", "verify", str(d), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["segments"] == len(list(d.glob("seg-*.npz"))) and out["files"] >= out["segments"] + 1
    r = Memory.open(d, writer=False)
    assert r.verify()["generation"] == out["generation"]
    seg = min(d.glob("seg-*.npz"))
    info = members_info(seg)
    raw = bytearray(seg.read_bytes())
    raw[info["text_data"]["data_offset"]] ^= 0x20  # a text byte: no search reads it before a hit
    seg.write_bytes(bytes(raw))
    assert cli_main(["memory", "verify", str(d)]) == 2
    err = capsys.readouterr().err
    assert seg.name in err and "checksum mismatch" in err and "Traceback" not in err


def test_the_recent_ids_fold_into_the_arrays_at_a_capped_size(monkeypatch):
    """The dict of recent ids folds once it outgrows min(an eighth of the arrays, fold_max) (and fold_min):
    a large memory's fold, inside one add, copies O(records) and must not wait for an eighth of millions."""
    from gpuir.memory.idmap import IdMap

    monkeypatch.setattr(IdMap, "fold_min", 4)
    monkeypatch.setattr(IdMap, "fold_max", 16)
    names = lambda seqs, views: {int(s): f"b{s}" if s < 1000 else f"n{s - 1000}" for s in seqs}
    m = IdMap(names)
    m.load([f"b{i}" for i in range(1000)], np.arange(1000))  # an eighth of the arrays: 125 > fold_max
    assert m.get_many(["b1"]) == [1]  # (a lookup merges what was loaded into the arrays)
    m.update({f"n{i}": 1000 + i for i in range(16)})
    assert len(m._recent) == 16, "at the cap: not yet folded"
    m.update({"n16": 1016})
    assert not m._recent, "past the cap: folded into the arrays"
    assert m.get_many(["n3", "n16", "b999", "zz"]) == [1003, 1016, 999, None]


@pytest.mark.parametrize("fold_min", [4, 65_536])
def test_ids_of_an_opened_memory_are_found_without_a_dict_and_collisions_are_told_apart(tmp_path, monkeypatch,
                                                                                        fold_min):
    """Loaded ids live as sorted 64-bit hashes, each hit confirmed against the segment: with a hash that
    collides on purpose every operation still tells ids apart."""
    from _memory_oracle import Model, assert_same

    from gpuir.memory.idmap import IdMap
    from gpuir.memory.records import RecordError
    from gpuir.memory.store import UnknownIdError

    monkeypatch.setattr(IdMap, "hash", staticmethod(lambda s: len(s) % 3))  # three hash values for all ids
    monkeypatch.setattr(IdMap, "fold_min", fold_min)
    m, d = _memory(tmp_path, n=120, deletes=["r3"])
    m.close()
    model = Model()
    rng = np.random.default_rng(0)
    recs = {r["id"]: r for r in (random_record(rng, f"r{i}") for i in range(120))}
    del recs["r3"]
    model.add(list(recs.values()))
    r = Memory.open(d)
    assert r._writer._ids.nbytes() > 0 and not r._writer._ids._recent, "loaded ids are in the arrays, not a dict"
    assert len(r) == 119 and "r7" in r and "r3" not in r and "r999" not in r and 7 not in r
    assert [x["id"] for x in r.get(["r10", "r1", "r100"])] == ["r10", "r1", "r100"]
    with pytest.raises(RecordError, match="already exists"):
        r.add([{"id": "r11", "text": "dup"}])
    with pytest.raises(UnknownIdError):
        r.delete(["r3"])
    r.add([{"id": f"n{i}", "text": f"w{i} w1"} for i in range(6)])
    model.add([{"id": f"n{i}", "text": f"w{i} w1"} for i in range(6)])
    r.delete(["r10", "n2", "r1"])
    model.delete(["r10", "n2", "r1"])
    new = [{"id": "r100", "text": "w5 w6 w7"}, {"id": "n3", "text": "w2"}, {"id": "r11", "text": "w9 w9"}]
    r.update(new)
    model.update(new)
    assert sorted(r._writer._ids) == sorted(model.live)
    assert r.get(["r10", "r1"], missing_ok=True) == [None, None]
    qs = [random_query(rng) for _ in range(20)]
    ids, scores = model.search(qs, 10)
    assert_same(r.search(qs, k=10), ids, scores)
    r.save()
    r.close()
    again = Memory.open(d, writer=False)
    assert sorted(again._writer._ids) == sorted(model.live)
    assert_same(again.search(qs, k=10), ids, scores)


def test_an_id_stored_twice_is_a_damaged_memory(tmp_path):
    m, d = _memory(tmp_path, n=60)
    m.close()
    _, man = persist.read_manifest(d)
    segs = man["segments"]
    assert len(segs) >= 2
    segs.append(dict(segs[0], uid=10_000))  # the same file listed twice: every id of it twice
    man = dict(man, generation=man["generation"] + 1)
    persist.commit(d, {k: v for k, v in man.items() if k not in ("sha256", "format", "format_version")})
    with pytest.raises(MemoryFormatError, match="not unique"):
        Memory.open(d)
