"""Memory directories: round trip, incremental saves, damaged files named, one writer,
crashes at every write step (fault injection) and a writer process killed at random moments."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _memory_oracle import Model, assert_same, random_query, random_record, random_where

from gpuir import Memory
from gpuir.memory import MemoryFormatError, ReadOnlyError, persist
from gpuir.memory.segfile import members_info
from gpuir.storage.dirlock import NotAGpuirDirError, StoreLockedError

TESTS = Path(__file__).resolve().parent


def _filled(n=120, seed=0, **kw):
    rng = np.random.default_rng(seed)
    m = Memory(partition_days=2, merge_factor=3, merge_min=8, **kw)
    recs = [random_record(rng, f"r{i}") for i in range(n)]
    m.add(recs[: n // 2])
    m.add(recs[n // 2:])
    return m, recs


def _same_search(a: Memory, b: Memory, seed=1):
    rng = np.random.default_rng(seed)
    qs = [random_query(rng) for _ in range(20)]
    for w in (None, random_where(rng)):
        ra, rb = a.search(qs, k=7, where=w), b.search(qs, k=7, where=w)
        np.testing.assert_array_equal(ra.seqs, rb.seqs)
        np.testing.assert_array_equal(ra.scores, rb.scores)
        assert [ra.ids(i) for i in range(len(qs))] == [rb.ids(i) for i in range(len(qs))]


def test_round_trip_and_read_only(tmp_path):
    m, _recs = _filled(method="bm25+", k1=1.5, b=0.3)
    m.delete(["r3", "r50"])
    m.save(tmp_path / "mem")
    assert (tmp_path / "mem" / ".gpuir").is_file()
    r = Memory.open(tmp_path / "mem", writer=False)  # readers need no lock, while the writer holds it
    assert len(r) == len(m) == 118 and r.params == m.params and r.window_ms == m.window_ms
    _same_search(m, r)
    assert r.get(["r4"]) == m.get(["r4"])
    with pytest.raises(ReadOnlyError, match="opened for reading"):
        r.add([{"id": "new", "text": "x"}])
    with pytest.raises(ReadOnlyError):
        r.delete(["r4"])
    m.close()


def test_save_writes_only_what_changed(tmp_path):
    m, _ = _filled()
    d = tmp_path / "mem"
    m.save(d)
    seg_files = {p.name: p.stat().st_mtime_ns for p in d.glob("seg-*.npz")}
    time.sleep(0.01)
    m.save(d)  # nothing changed: a new manifest, no segment or deletions file
    assert {p.name: p.stat().st_mtime_ns for p in d.glob("seg-*.npz")} == seg_files
    assert not list(d.glob("del-*"))
    m.delete(["r7"])  # one deletions file for one segment
    m.save(d)
    dels = list(d.glob("del-*.npy"))
    assert len(dels) == 1 and np.load(dels[0]).size == 1
    assert {p.name: p.stat().st_mtime_ns for p in d.glob("seg-*.npz")} == seg_files
    m.add([{"id": "n1", "text": "brand new words", "time": "2023-11-14T22:13:20Z"}])
    m.save(d)
    new = {p.name for p in d.glob("seg-*.npz")} - set(seg_files)
    assert len(new) == 1, "one new segment file for the new record"
    assert all(d.joinpath(n).stat().st_mtime_ns == t for n, t in seg_files.items() if d.joinpath(n).exists())
    man = json.loads((d / (d / "CURRENT").read_text().strip()).read_text())
    assert man["generation"] == 4 and man["n_records"] == len(m)
    m.close()
    _same_search(m, Memory.open(d, writer=False))


def test_garbage_collection_keeps_the_previous_commit(tmp_path):
    m, _ = _filled()
    d = tmp_path / "mem"
    m.save(d)
    first = persist.manifest_files(persist.read_manifest(d)[1])
    assert m.merge() > 0  # partitions with several segments become one
    m.save(d)
    replaced = first - persist.manifest_files(persist.read_manifest(d)[1])
    assert replaced and all((d / f).exists() for f in first), "the previous commit stays loadable for readers"
    m.add([{"id": "x", "text": "more"}])
    m.save(d)
    assert not any((d / f).exists() for f in replaced), "two commits later its unused files are gone"
    (d / "notes.txt").write_text("mine")
    m.save(d)
    assert (d / "notes.txt").read_text() == "mine", "only gpuir's own files are ever removed"
    m.close()


def _flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_damaged_segment_is_named(tmp_path):
    m, _ = _filled()
    d = tmp_path / "mem"
    m.save(d)
    m.close()
    seg = min(d.glob("seg-*.npz"))
    good = seg.read_bytes()
    info = members_info(seg)
    # a flipped byte in the postings (read on first use): open maps the file; the first search that
    # reads them fails, naming the file, before any result is computed from them
    _flip(seg, info["doc_ids"]["data_offset"] + 5)
    r = Memory.open(d, writer=False)
    with pytest.raises(MemoryFormatError, match=f"{seg.name}: damaged segment file .*doc_ids.*CRC-32 mismatch"):
        r.search([" ".join(f"w{i}" for i in range(40))], k=5)
    with pytest.raises(MemoryFormatError, match=f"{seg.name}: damaged file \\(checksum mismatch\\)"):
        r.verify()  # full verification (gpuir memory verify) reads every byte
    with pytest.raises(MemoryFormatError, match=f"{seg.name}: damaged file \\(checksum mismatch\\)"):
        Memory.open(d, verify="full")
    # a flipped byte in a column read at open: open fails, naming the file
    seg.write_bytes(good)
    _flip(seg, info["seqs"]["data_offset"] + 3)
    with pytest.raises(MemoryFormatError, match=f"{seg.name}: damaged segment file .*seqs.*CRC-32 mismatch"):
        Memory.open(d)
    seg.write_bytes(good)
    raw = bytearray(good)
    seg.write_bytes(bytes(raw[:100]))
    with pytest.raises(MemoryFormatError, match=f"{seg.name}: damaged file \\(size 100 bytes"):
        Memory.open(d, verify=False)
    seg.unlink()
    with pytest.raises(MemoryFormatError, match=f"{seg.name}: missing"):
        Memory.open(d)
    man = d / (d / "CURRENT").read_text().strip()
    text = man.read_text()
    assert '"next_seq": 120' in text
    man.write_text(text.replace('"next_seq": 120', '"next_seq": 121'))
    with pytest.raises(MemoryFormatError, match=f"{man.name}: damaged manifest \\(checksum mismatch\\)"):
        Memory.open(d)
    with pytest.raises(MemoryFormatError, match="no memory at"):
        Memory.open(tmp_path / "nothing")


def test_one_writer_per_directory(tmp_path):
    m, _ = _filled()
    d = tmp_path / "mem"
    m.save(d)  # m holds the lock until close
    with pytest.raises(StoreLockedError, match="locked by another writer"):
        Memory.open(d, lock_timeout=0.1)
    other = Memory()
    with pytest.raises(StoreLockedError):
        other.save(d, lock_timeout=0.1)
    Memory.open(d, writer=False).search("w1")  # readers are never blocked
    m.close()
    w2 = Memory.open(d, lock_timeout=0.1)
    w2.add([{"id": "late", "text": "w1"}])
    w2.save()
    w2.close()
    assert "late" in Memory.open(d, writer=False)


def test_directories_that_are_not_a_new_memory_are_refused(tmp_path):
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "data.csv").write_text("1,2")
    with pytest.raises(NotAGpuirDirError):
        Memory().save(tmp_path / "foreign")
    assert sorted(p.name for p in (tmp_path / "foreign").iterdir()) == ["data.csv"]
    m, _ = _filled()
    m.save(tmp_path / "mem")
    m.close()
    with pytest.raises(MemoryFormatError, match="already holds a memory"):
        Memory().save(tmp_path / "mem")


# --------------------------------------------------------------------------- crashes


def _state(d):
    """(live ids, search results) of the memory committed at ``d``."""
    r = Memory.open(d, writer=False)
    qs = ["w0 w1", "w2 w5 w5", "w9"]
    res = r.search(qs, k=50)
    return sorted(r._writer._ids), [res.ids(i) for i in range(3)], res.scores.tobytes()


@pytest.mark.parametrize("fail_at", range(10))
def test_crash_at_any_write_step_keeps_the_last_commit(tmp_path, monkeypatch, fail_at):
    """Fault injection: the save fails at its n-th file operation; the directory still opens at
    the previous commit (and a later save succeeds). Without a log (durability "none"): the commit
    protocol alone; with one, tests/test_memory_wal.py."""
    m, _ = _filled(durability="none")
    d = tmp_path / "mem"
    m.save(d)
    before = _state(d)
    m.delete(["r1", "r2", "r90"])
    m.add([{"id": "n1", "text": "w0 w1 fresh", "time": "2023-11-14T22:13:20Z"}, {"id": "n2", "text": "untimed w9"}])
    calls = {"n": 0}
    real_write, real_replace = persist._write_atomic, os.replace

    def boom():
        calls["n"] += 1
        if calls["n"] > fail_at:
            raise OSError("injected crash")

    def write(root, name, fn):
        boom()
        return real_write(root, name, fn)

    def replace(a, b):
        if Path(b).name == persist.CURRENT:
            boom()
        return real_replace(a, b)

    monkeypatch.setattr(persist, "_write_atomic", write)
    monkeypatch.setattr(persist.os, "replace", replace)
    try:
        m.save(d)
        crashed = False
    except OSError:
        crashed = True
    monkeypatch.undo()
    if crashed:
        assert _state(d) == before
    else:  # fewer file operations than fail_at: the save completed
        assert fail_at >= calls["n"] >= 4, "the save writes segments, deletions, manifest and CURRENT"
    assert not any(p.name.startswith(".tmp-") for p in d.iterdir()), "a failed write leaves no temporary"
    m.save(d)
    m.close()
    _same_search(m, Memory.open(d, writer=False))


KILL_WRITER = r"""
import sys
sys.path.insert(0, {tests!r})
import numpy as np
from _memory_oracle import random_record
from gpuir import Memory

path, seed = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(seed)
m = Memory(method="bm25l", partition_days=2, merge_factor=3, merge_min=16, durability="none")  # commits only
live, n = [], 0
for gen in range(1, 10_000):
    recs = [random_record(np.random.default_rng([seed, n + i]), f"r{{n + i}}") for i in range(40)]
    n += len(recs)
    m.add(recs)
    live += [r["id"] for r in recs]
    if gen % 3 == 0:
        gone = [live[int(i)] for i in rng.choice(len(live), size=15, replace=False)]
        m.delete(gone)
        live = [x for x in live if x not in set(gone)]
    print("pending", gen, " ".join(live), flush=True)
    m.save(path)
    print("committed", gen, flush=True)
"""


def _expected(seed, ids):
    model = Model(analyzer="default", method="bm25l", k1=1.2, b=0.75)
    model.add([random_record(np.random.default_rng([seed, int(i[1:])]), i) for i in ids])
    return model


@pytest.mark.slow
def test_killed_writer_leaves_the_last_commit(tmp_path):
    """A writer process killed (SIGKILL) at random moments: reopening gives exactly the last
    committed state (or the one being committed, if its CURRENT switch had happened), whose
    searches equal a fresh build over its records."""
    script = tmp_path / "writer.py"
    script.write_text(KILL_WRITER.format(tests=str(TESTS)))
    rng = np.random.default_rng(0)
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    seen_mid = 0
    for trial in range(5):
        d = tmp_path / f"mem{trial}"
        proc = subprocess.Popen([sys.executable, str(script), str(d), str(trial)], stdout=subprocess.PIPE,
                                text=True, env=env)
        lines: list[str] = []
        deadline = time.monotonic() + 30
        target = int(rng.integers(2, 12))  # kill after this many commits, plus a random moment
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.split())
            if line.startswith("committed") and int(line.split()[1]) >= target:
                time.sleep(float(rng.uniform(0, 0.05)))
                break
        proc.send_signal(signal.SIGKILL)
        rest = proc.communicate()[0]
        lines += [x.split() for x in rest.splitlines() if x.strip()]
        committed = [int(x[1]) for x in lines if x and x[0] == "committed"]
        pending = {int(x[1]): x[2:] for x in lines if x and x[0] == "pending"}
        last = max(committed)
        r = Memory.open(d, writer=False)
        gen = r._writer._gen
        assert gen in (last, last + 1), f"trial {trial}: reopened generation {gen}, last committed {last}"
        seen_mid += gen != last
        ids = pending[gen]
        assert sorted(r._writer._ids) == sorted(ids)
        model = _expected(trial, ids)
        qs = [random_query(rng) for _ in range(15)]
        for w in (None, random_where(rng)):
            want_ids, want_scores = model.search(qs, 10, where=w)
            assert_same(r.search(qs, k=10, where=w), want_ids, want_scores, f"trial {trial}")
        w = Memory.open(d, lock_timeout=5)  # the dead writer's lock is gone
        w.close()
