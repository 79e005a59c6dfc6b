"""Saving a memory: a mixin of :class:`~gpuir.memory.writer.IndexWriter` (the atomic commit, and close).

A save takes the snapshot to save and starts the log's next segment under the writer's lock
(:meth:`Commits.begin_save`), then writes only what changed and commits outside it
(:class:`PendingSave`, :meth:`Commits._write_save`; the files: :mod:`gpuir.memory.persist`). The first
save to a directory claims it and takes its writer lock (:meth:`Commits._bind`), held until
:meth:`Commits.close`. Opening a directory: :mod:`gpuir.memory.load`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..storage.dirlock import WriterLock, check_path, claim_dir
from ..wal import segments as wal_segments
from . import persist
from .durable import MemoryLog, log_holds_writes
from .errors import UnsavedWritesWarning
from .history import History
from .persist import MemoryFormatError
from .segments import SegView, segment_arrays
from .snapshot import Snapshot

log = logging.getLogger("gpuir.memory")


class Commits:
    """Save and close of :class:`~gpuir.memory.writer.IndexWriter` (whose state they read and set)."""

    def save(self, path: str | os.PathLike | None = None, lock_timeout: float = 10.0) -> Path:
        """Commit the current state to a memory directory, writing only what changed.

        See :meth:`gpuir.memory.Memory.save`.
        """
        return self.begin_save(path, lock_timeout).finish()

    def begin_save(self, path: str | os.PathLike | None = None, lock_timeout: float = 10.0,
                   on_snapshot: Any = None) -> PendingSave:
        """See :meth:`gpuir.memory.Memory.begin_save` (the snapshot and the log's rotation under the writer's
        lock; the files written by the returned :class:`PendingSave`, outside it)."""
        self._save_lock.acquire()  # one save at a time; released by PendingSave.finish
        try:
            with self._write_lock:
                self._check_writable()
                if path is None:
                    if self._path is None:
                        raise ValueError("this memory has no directory yet: call save(path)")
                    root = self._path
                else:
                    root = check_path(path)
                if root != self._path:
                    self._bind(root, lock_timeout)
                elif self._lock is None:  # (a writer memory always holds its lock until close)
                    lock = WriterLock(root, timeout=lock_timeout)
                    lock.__enter__()
                    self._lock = lock
                assert self._path is not None
                cur_name = self._check_commit(root)
                gen = max(self._gen, self._attempt_gen) + 1  # a failed attempt's number is never reused
                self._attempt_gen = gen
                job = PendingSave(self, root, self._snap, gen, self._history.freeze(), cur_name, self._unsaved, {
                    "config": self.config(), "next_seq": self._next_seq, "next_uid": self._next_uid,
                    "expiring": self._expiring, "embeddings": {n: e.to_dict() for n, e in self._emb.items()},
                    "log_tag": self._last_tag})
                if self._durability != "none":
                    if self._log is None:
                        self._log = MemoryLog(root, self._durability)
                        self._log.start(gen)
                    else:
                        job.older = self._log.rotate(gen)  # writes from here on go to the segment after this save
                if on_snapshot is not None:
                    on_snapshot(gen)
                return job
        except BaseException:
            self._history.changed = True
            self._save_lock.release()
            raise

    def _check_commit(self, root: Path) -> str | None:
        """The name of the commit a save builds on (None: none yet), checked before anything is written."""
        try:
            cur_name, cur = persist.read_manifest(root)
        except MemoryFormatError as e:
            if self._gen > 0:
                # the commit this memory built on is gone or damaged: writing (and collecting garbage)
                # now could destroy what a repair needs
                raise MemoryFormatError(f"{e}; refusing to save over it (nothing was written or deleted)") \
                    from None
            cur_name, cur = None, None
        if cur is not None and int(cur["generation"]) != self._gen:
            raise MemoryFormatError(f"{root} was changed by another writer since this memory loaded or saved "
                                    f"it (generation {cur['generation']}, expected {self._gen}): reopen it")
        return cur_name

    def _write_save(self, root: Path, snap: Snapshot, gen: int, history: History, state: dict[str, Any],
                    cur_name: str | None) -> None:
        """Write and commit generation ``gen`` of ``snap`` (outside the writer's lock; the save lock held)."""
        entries = []
        saved_views: dict[int, SegView] = {}
        for v in snap.views:
            seg = v.seg
            e = self._saved.get(seg.uid)
            if e is None:
                e = persist.write_segment(root, seg.uid, segment_arrays(seg, self._dicts))
                e = {"uid": seg.uid, "partition": seg.partition, "n_docs": seg.n_docs, **e, "deletes": None,
                     "length": seg.length, "time_min": seg.time_min, "time_max": seg.time_max}
            e = dict(e)
            if v.live is None:
                e["deletes"] = None
            elif self._saved_views.get(seg.uid) is not v:
                e["deletes"] = persist.write_deletes(root, seg.uid, gen, np.flatnonzero(~v.live))
            entries.append(e)
            saved_views[seg.uid] = v
        manifest = {"generation": gen, "config": state["config"], "next_seq": state["next_seq"],
                    "next_uid": state["next_uid"], "n_records": snap.n_docs, "segments": entries,
                    "history": history.save(root, gen), "expiring": state["expiring"]}
        if state["embeddings"]:  # (absent: a memory without vectors, as before)
            manifest["embeddings"] = state["embeddings"]
        if state.get("log_tag") is not None:  # (absent: no writer tags its writes)
            manifest["log_tag"] = state["log_tag"]
        name = persist.commit(root, manifest)
        self._saved = {e["uid"]: {k: x for k, x in e.items()} for e in entries}
        self._saved_views = saved_views
        keep = persist.manifest_files(manifest) | {name} | self._prev_files
        if cur_name:
            keep.add(cur_name)
        persist.collect_garbage(root, keep)
        self._prev_files = persist.manifest_files(manifest) | {name}

    def _bind(self, root: Path, lock_timeout: float) -> None:
        """Claim ``root`` for this memory (mode 0700) and take its writer lock."""
        claim_dir(root, "memory", mode=persist.DIR_MODE)
        lock = WriterLock(root, timeout=lock_timeout)
        lock.__enter__()
        try:
            if (root / persist.CURRENT).exists():
                raise MemoryFormatError(f"{root} already holds a memory: open it with Memory.open({str(root)!r})"
                                        " to change it, or save to a new directory")
            logs = wal_segments(root, "memory")  # a log left by a memory whose first commit never happened
            persist.check_not_orphaned(root, extra=[p.name for _, p in logs if log_holds_writes(p)])
            for _, p in logs:  # (headers only: nothing was acknowledged there)
                p.unlink()  # a damaged memory is never overwritten by a new one
        except BaseException:
            lock.__exit__(None, None, None)
            raise
        self._release_lock()  # (not close(): the merges go on; the writes are not dropped: this save writes them)
        if self._log is not None:  # the old directory keeps its commit and its log, complete
            self._log.close()
            self._log = None
        self._lock = lock
        self._path = root
        self._gen = 0
        self._saved, self._saved_views, self._prev_files = {}, {}, set()

    def verify(self) -> dict[str, Any]:
        """Check every file of this memory's committed directory completely: sha256 and size of each file
        in the manifest, every part of every segment file (CRC-32 and structure). Reads every byte once.

        See :meth:`gpuir.memory.Memory.verify`.
        """
        if self._path is None:
            raise ValueError("this memory has no directory: nothing to verify")
        return persist.verify_dir(self._path, self.analyzer_config)

    def _release_lock(self, discard_unsaved: bool = True) -> None:
        if self._lock is not None:
            if self._unsaved and not discard_unsaved:
                self._warn_unsaved("closed")
            self._lock.__exit__(None, None, None)
            self._lock = None

    def close(self, discard_unsaved: bool = False) -> None:
        """Stop the background merges, sync and close the log, and release the directory's writer lock.

        See :meth:`gpuir.memory.Memory.close`.
        """
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
        self._stop_merges()
        t = self._ckpt_thread
        if t is not None:
            t.join()
        if self._log is not None and self._log.ops and self._log.failed is None:
            self._closed = False  # (the final checkpoint is this memory's own last write)
            try:
                self.save()  # fold the log, as SQLite checkpoints its WAL when the last connection closes
            except Exception as e:  # noqa: BLE001 - every write is in the log still: the next open replays it
                log.warning("closing %s: the final checkpoint failed (the log keeps every write): %s: %s",
                            self._path, type(e).__name__, e)
            finally:
                self._closed = True
        with self._save_lock, self._write_lock:
            if self._log is not None:
                self._log.close()
                self._log = None
                discard_unsaved = True  # every write is in the log
            self._release_lock(discard_unsaved)

    def _warn_unsaved(self, how: str) -> None:
        msg = (f"the memory at {self._path} was {how} with {self._unsaved} unsaved write(s) (records added, "
               "updated or deleted since the last save): they are not in the directory. Call save() to keep "
               "them, or close(discard_unsaved=True) to drop them knowingly")
        log.warning("%s", msg)
        warnings.warn(msg, UnsavedWritesWarning, stacklevel=3)

    def __del__(self):  # pragma: no cover - best effort
        with contextlib.suppress(Exception):
            if self._log is not None:
                self._log.close()  # every write is in it
                self._log = None
            elif self._lock is not None and self._unsaved:
                self._warn_unsaved("garbage-collected")
            if not sys.is_finalizing():  # at exit the daemon merge threads may be frozen holding the merger's lock
                self._merger.stop(timeout=0)
            self._release_lock(discard_unsaved=True)


class PendingSave:
    """A save whose snapshot is taken (:meth:`Memory.begin_save`); :meth:`finish` writes and commits it.

    ``mem`` is the memory's :class:`~gpuir.memory.writer.IndexWriter`.
    """

    def __init__(self, mem: Any, root: Path, snap: Snapshot, gen: int, history: History, cur_name: str | None,
                 unsaved: int, state: dict[str, Any]):
        self.mem, self.root, self.snap, self.generation = mem, root, snap, gen
        self.history, self.cur_name, self.unsaved, self.state = history, cur_name, unsaved, state
        self.older: list[Path] = []  # the memory's log segments this save folds
        self._done = False

    def finish(self) -> Path:
        """Write the files and commit (outside the writer's lock); delete the log segments folded. Returns the
        directory. Raises what the save raised (nothing of the commit then: the next save retries)."""
        if self._done:
            raise RuntimeError("this save has finished already")
        self._done = True
        mem = self.mem
        try:
            try:
                mem._write_save(self.root, self.snap, self.generation, self.history, self.state, self.cur_name)
            except BaseException:
                mem._history.changed = True  # written again by the next save
                raise
            with mem._write_lock:
                mem._gen = self.generation
                mem._unsaved -= self.unsaved
                mem._history.adopt(self.history)
            if self.older and mem._log is not None:
                mem._log.drop(self.older)
            return self.root
        finally:
            mem._save_lock.release()
