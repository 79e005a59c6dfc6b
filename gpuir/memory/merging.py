"""The writer's merges: a mixin of :class:`~gpuir.memory.writer.IndexWriter`, on its state and under its lock.

The tiered policy (:meth:`MergeScheduling._merge_policy`, see :mod:`gpuir.memory.writer`) chooses merges
inside each partition touched by a write and hands them to the merger's threads
(:mod:`gpuir.memory.merger`); a merge reads immutable segments outside every lock, lays its segment out for
the engine of the latest search, then commits under the writer's lock in a moment
(:meth:`MergeScheduling._commit_merge`: rows deleted meanwhile are tombstoned in the merged segment) and
publishes a new snapshot. :meth:`MergeScheduling.merge` compacts on demand.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np

from ..backends import engine_for
from .merger import MergeCancelled, MergeTask
from .segments import SegView, merge_segments
from .snapshot import Snapshot

log = logging.getLogger("gpuir.memory")


class MergeScheduling:
    """The merge policy and merge commits of :class:`~gpuir.memory.writer.IndexWriter` (whose state they change)."""

    def _tier(self, n: int) -> int:
        if n <= self.merge_min:
            return 0
        return math.ceil(math.log(n / self.merge_min, self.merge_factor) - 1e-9)

    def _merge_policy(self, partitions: set) -> None:
        """Choose merges in each partition of ``partitions`` (see the module docstring); nobody waits.

        Looks only at the segments of those partitions (and, when a newer
        partition appeared, at each older one once).
        """
        if self._merge_paused:
            return
        for key in partitions:
            self._plan(key)
        if self._newest is not None and self._newest != self._seal_checked:
            self._seal_checked = self._newest
            for key in [k for k in self._parts if k is not None and k < self._newest and k not in self._sealed]:
                self._plan(key)

    def _plan(self, key: Any) -> None:
        members = self._parts.get(key)
        if not members:
            return
        idle = [self._views[u] for u in members if u not in self._merging and u not in self._merge_skip]
        if (key is not None and self.window_ms is not None and self._newest is not None and key < self._newest
                and key not in self._sealed):
            # compact, once, a partition that stopped being the newest (when none of it is being merged)
            if len(idle) == len(members):
                if len(idle) > 1 or idle[0].live is not None:
                    self._schedule(key, idle, "seal")
                self._sealed.add(key)
            return
        tiers: dict[int, list[SegView]] = {}
        for v in idle:
            tiers.setdefault(self._tier(v.n_live), []).append(v)
        chosen: set[int] = set()
        for t in sorted(tiers):
            group = tiers[t]
            while len(group) >= self.merge_factor:
                take, group = group[: self.merge_factor], group[self.merge_factor:]
                self._schedule(key, take, "tier")
                chosen.update(v.seg.uid for v in take)
        for v in idle:  # a segment with more than a third of its rows deleted is rewritten alone
            if v.seg.uid not in chosen and 3 * (v.seg.n_docs - v.n_live) > v.seg.n_docs:
                self._schedule(key, [v], "purge")

    def _schedule(self, key: Any, views: list[SegView], reason: str) -> None:
        self._order.update()  # every input's terms keyed before a merge thread reads the keys
        task = MergeTask(key, list(views), self._next_uid, reason)
        self._next_uid += 1
        self._merging.update(task.uids)
        self._merger.submit(task)

    def _run_merge(self, task: MergeTask) -> None:
        """One merge (a background thread, or the writer inline): merge outside every lock, then commit."""
        hook = self._merger.hook
        published = None
        if hook is not None:
            hook("start", task)
        t0 = time.perf_counter()
        try:
            order = self._order
            keys = order.keys if order.ready else None  # (ready read first: it is set after the keys)
            seg = merge_segments(task.views, task.uid, task.key, self._terms, check=task.check, keys=keys)
        except MergeCancelled:
            self._merging.difference_update(task.uids)
            raise
        self._prepare(seg)
        dt = time.perf_counter() - t0
        if hook is not None:
            hook("merged", task)
        # the commit: wait for the writer's lock, unless the merger is stopped meanwhile (close() may be
        # waiting for this thread while holding the lock)
        while not self._write_lock.acquire(timeout=0.05):
            if task.cancelled:
                break
        else:
            try:
                if not task.cancelled:
                    self._commit_merge(task, seg)
                    self.merge_log.append((seg.n_docs, dt))
                    self._merge_policy({task.key})  # the merged segment may complete a group of the next tier
                    published = self._snap
                    return
            finally:
                self._write_lock.release()
                if published is not None:
                    self._warm(published)
        self._merging.difference_update(task.uids)  # abandoned: the inputs stay as they are

    def _prepare(self, seg, cheap: bool = False) -> None:
        """Lay ``seg`` out for the engine of the latest search (its scorer, a device copy) before it is
        published -- in the merge's thread for a merged segment, in the writer's call for an added one --
        so that the first search meeting it pays nothing for it (an agent adds a record, then asks: every
        add makes a segment, and every few adds a merge); ``cheap``: only what costs the writer little (a
        small segment's setup, not a batch's layout). Changes no result; a failure is logged and left to
        the first search (which would meet and report it)."""
        name = self._served_by
        if name is None:
            return
        try:
            engine_for(name).prepare(seg, self.params, cheap=cheap)
        except Exception:  # (a search repeats the work and reports what fails)
            log.debug("preparing merged segment %d for %s failed", seg.uid, name, exc_info=True)

    def _warm(self, snap: Snapshot) -> None:
        """What the searches of a merge's new snapshot share across its segments (the compiled engine's
        layout of its large segments), made here in the merge's thread, outside the writer's lock, with
        the engine of the latest search (:meth:`gpuir.backends.contract.SegmentEngine.warm`)."""
        name = self._served_by
        if name is None:
            return
        try:
            engine_for(name).warm(snap)
        except Exception:  # (a search repeats the work and reports what fails)
            log.debug("warming snapshot %d for %s failed", snap.version, name, exc_info=True)

    def _commit_merge(self, task: MergeTask, seg) -> None:
        """Replace the task's inputs by ``seg`` and publish (caller holds the write lock).

        Rows deleted (or replaced by an update) since the task was chosen are
        tombstoned in ``seg``: the merge read the inputs as they were then.
        """
        live = None
        for old in task.views:
            cur = self._views.get(old.seg.uid)
            if cur is old:
                continue
            was = np.ones(old.seg.n_docs, bool) if old.live is None else old.live
            now = np.zeros(old.seg.n_docs, bool) if cur is None else (
                np.ones(old.seg.n_docs, bool) if cur.live is None else cur.live)
            dead = np.flatnonzero(was & ~now)
            if dead.size:
                if live is None:
                    live = np.ones(seg.n_docs, dtype=bool)
                live[np.searchsorted(seg.seqs, old.seg.seqs[dead])] = False
        for uid in task.uids:
            self._drop(uid)
            self._merging.discard(uid)
        nv = SegView(seg, live)
        if nv.n_live:
            self._put(nv)
        self._publish()

    def _merge_failed(self, task: MergeTask) -> None:
        """A merge raised (logged by the merger): its segments stay, and are not chosen again automatically."""
        with self._write_lock:
            self._merging.difference_update(task.uids)
            self._merge_skip.update(task.uids)

    def wait_merges(self, timeout: float | None = None) -> bool:
        """Wait until no background merge is queued or running (a merge may schedule the next).

        See :meth:`gpuir.memory.Memory.wait_merges`.
        """
        return self._merger.drain(timeout)

    def merge_status(self) -> dict[str, Any]:
        """Background merges: queued or running, threads, done, failed (with messages)."""
        m = self._merger
        return {"pending": m.pending(), "threads": m.threads, "done": m.done, "failed": m.failed,
                "errors": list(m.errors[-10:]), "background": m.background}

    def merge(self, partition: Any = "all") -> int:
        """Merge on demand: each partition (or the one named) into one segment, tombstones purged.

        See :meth:`gpuir.memory.Memory.merge`.
        """
        with self._write_lock:
            self._check_writable()
            self._purge_expired()
            self._merge_paused += 1
        try:
            self._merger.drain()
            with self._write_lock:
                keys = list(self._parts)
                if partition != "all":
                    keys = [k for k in keys if k == partition]
                done = 0
                for key in keys:
                    views = [self._views[u] for u in self._parts.get(key, ())]
                    if len(views) > 1 or (views and views[0].live is not None):
                        t0 = time.perf_counter()
                        task = MergeTask(key, views, self._next_uid, "explicit")
                        self._next_uid += 1
                        self._order.update()
                        keys = self._order.keys if self._order.ready else None
                        seg = merge_segments(views, task.uid, key, self._terms, keys=keys)
                        self._commit_merge(task, seg)
                        self.merge_log.append((seg.n_docs, time.perf_counter() - t0))
                        done += 1
                self._merge_skip.clear()
                return done
        finally:
            with self._write_lock:
                self._merge_paused -= 1

    def _stop_merges(self) -> None:
        for task in self._merger.stop():
            self._merging.difference_update(task.uids)
