"""A memory directory never silently empties, and ``with Memory.open(d) as m`` never silently drops writes.

Issue 23 (item 2) and issue 22 (item 2). Each test failed on the code before this change.
"""

from __future__ import annotations

import gc
import os
import stat
import warnings

import pytest

import gpuir.memory
from gpuir.memory import Memory, MemoryFormatError, persist


def _recs(n, start=0):
    return [{"id": f"r{i}", "text": f"record number {i} about topic{i % 3}", "tenant": "t"}
            for i in range(start, start + n)]


def _saved(tmp_path, n=5):
    d = tmp_path / "mem"
    m = Memory()
    m.add(_recs(n))
    m.save(d)
    m.close()
    return d


def _files(d):
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and not p.name.startswith(".gpuir")}


# ---------------------------------------------------------------------- a missing CURRENT is damage, not emptiness
def test_open_without_current_but_with_segments_names_the_damage(tmp_path):
    d = _saved(tmp_path)
    manifest = (d / "CURRENT").read_text().strip()
    (d / "CURRENT").unlink()
    with pytest.raises(MemoryFormatError, match=f"CURRENT is missing.*damaged, not empty.*{manifest}"):
        Memory.open(d)
    with pytest.raises(MemoryFormatError, match="damaged, not empty"):
        Memory.open(d, writer=False)


def test_a_new_memory_is_never_saved_over_segments_without_current(tmp_path):
    """Before: the save committed an empty memory and collected the old segments."""
    d = _saved(tmp_path)
    (d / "CURRENT").unlink()
    before = _files(d)
    m = Memory()
    m.add(_recs(1, 100))
    with pytest.raises(MemoryFormatError, match="damaged, not empty"):
        m.save(d)
    assert _files(d) == before
    m.close(discard_unsaved=True)


def test_save_refuses_when_the_commit_vanished_under_the_writer(tmp_path):
    d = _saved(tmp_path)
    m = Memory.open(d)
    (d / "CURRENT").unlink()
    m.add(_recs(2, 50))
    before = _files(d)
    with pytest.raises(MemoryFormatError, match="refusing to save over it"):
        m.save()
    assert _files(d) == before  # nothing written, nothing collected
    m.close(discard_unsaved=True)


def test_cli_add_into_a_directory_without_current_is_exit_2_and_deletes_nothing(tmp_path, capsys):
    import json

    from gpuir.cli import main

    d = _saved(tmp_path)
    (d / "CURRENT").unlink()
    before = _files(d)
    recs = tmp_path / "r.jsonl"
    recs.write_text("\n".join(json.dumps(r) for r in _recs(2, 100)) + "\n")
    assert main(["memory", "add", str(d), str(recs)]) == 2
    assert "damaged, not empty" in capsys.readouterr().err
    assert _files(d) == before


def test_an_interrupted_first_save_of_an_empty_memory_does_not_block_the_next(tmp_path):
    d = tmp_path / "mem"
    Memory().save(d)
    (d / "CURRENT").unlink()  # as if the first commit never happened: only an empty manifest is left
    (left,) = persist.state_files(d)
    assert left.startswith("manifest-"), "only the empty memory's manifest is there"
    with pytest.raises(MemoryFormatError, match="CURRENT is missing") as e:  # absent, not damaged
        Memory.open(d)
    assert "restore it" not in str(e.value)
    m = Memory()
    m.add(_recs(3))
    m.save(d)  # nothing to lose there: accepted
    m.close()
    r = Memory.open(d, writer=False)
    assert len(r) == 3 and r.get(["r2"])[0]["text"] == "record number 2 about topic2"
    # the exception is for an empty memory's manifest only: one that holds records blocks the next save
    d2 = _saved(tmp_path / "two", 4)
    (d2 / "CURRENT").unlink()
    for f in persist.state_files(d2):
        if not f.startswith("manifest-"):
            (d2 / f).unlink()  # even without its segments, the manifest names records that are lost
    before = _files(d2)
    with pytest.raises(MemoryFormatError, match="restore it"):
        Memory().save(d2)
    assert _files(d2) == before


# ---------------------------------------------------------------------- the context manager
def test_the_context_manager_commits_on_a_clean_exit(tmp_path):
    """Before: the write was dropped on exit without a word."""
    d = _saved(tmp_path)
    with Memory.open(d) as m:
        m.add(_recs(3, 10))
        m.delete(["r0"])
        assert m.unsaved == 4
    assert m.unsaved == 0
    r = Memory.open(d, writer=False)
    assert len(r) == 7 and "r12" in r and "r0" not in r
    with Memory.open(d) as m2:  # the lock was released
        assert len(m2) == 7


def test_an_exception_in_the_block_saves_nothing_and_warns_with_the_count(tmp_path, caplog):
    d = _saved(tmp_path)
    m = Memory.open(d, durability="none")  # (with a log, the default, the writes are in the log: no warning)
    before = _files(d)
    with pytest.warns(gpuir.memory.UnsavedWritesWarning, match="2 unsaved write"):  # noqa: PT031, SIM117
        with pytest.raises(RuntimeError, match="boom"), m:
            m.add(_recs(2, 10))
            raise RuntimeError("boom")
    assert "2 unsaved write" in caplog.text  # also logged (logger gpuir.memory)
    assert _files(d) == before
    Memory.open(d).close()  # the lock was released


def test_close_and_garbage_collection_warn_about_unsaved_writes(tmp_path):
    d = _saved(tmp_path)
    m = Memory.open(d, durability="none")
    m.add(_recs(1, 10))
    with pytest.warns(gpuir.memory.UnsavedWritesWarning, match="closed with 1 unsaved write") as caught:  # noqa: PT031
        m.close()
        m.close()  # closing twice warns once
    assert len([w for w in caught if issubclass(w.category, gpuir.memory.UnsavedWritesWarning)]) == 1
    m = Memory.open(d, durability="none")
    m.update([{"id": "r1", "text": "changed", "tenant": "t"}])
    with pytest.warns(gpuir.memory.UnsavedWritesWarning, match="garbage-collected with 1 unsaved write"):  # noqa: PT031
        del m
        gc.collect()
    m = Memory.open(d, durability="none")
    m.add(_recs(1, 20))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.close(discard_unsaved=True)  # dropped knowingly: no warning


def test_a_failed_commit_on_exit_raises(tmp_path, monkeypatch):
    d = _saved(tmp_path)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(persist, "commit", full)
    with pytest.raises(OSError, match="No space"), Memory.open(d, durability="none") as m:
        m.add(_recs(1, 10))
    monkeypatch.undo()
    assert len(Memory.open(d, writer=False)) == 5
    Memory.open(d).close()  # the lock was released
    monkeypatch.setattr(persist, "commit", full)
    with pytest.raises(OSError, match="No space"), Memory.open(d) as m:  # the default keeps a log
        m.add(_recs(1, 10))
    monkeypatch.undo()
    assert len(Memory.open(d, writer=False)) == 6  # the add was acknowledged: it is in the log
    Memory.open(d).close()  # the lock was released


def test_no_warning_where_nothing_is_dropped(tmp_path):
    d = _saved(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Memory() as m:  # no directory: nothing to commit
            m.add(_recs(2))
        with Memory.open(d, writer=False) as r:
            assert len(r) == 5
        m = Memory.open(d)
        m.add(_recs(1, 30))
        m.save()
        m.close()
        del m
        gc.collect()


# ---------------------------------------------------------------------- files at rest
def test_memory_files_are_0600_and_its_directory_0700_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        d = _saved(tmp_path, 10)
        m = Memory.open(d)
        m.delete(["r1"])
        m.save()
        m.close()
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in d.iterdir() if not p.name.startswith(".gpuir")}
    assert any(n.startswith("del-") for n in modes) and any(n.startswith("seg-") for n in modes)
    assert modes == {n: 0o600 for n in modes}
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
