"""Merges off the writer's path: a small scheduler of background merge threads.

The memory's merge policy (:mod:`gpuir.memory.merging`) decides *what* to merge
and hands each decision to a :class:`Merger` as a :class:`MergeTask`; nobody
waits for it. The merger runs tasks in background threads, smallest first:

* one worker takes any task;
* while that worker is busy with a *large* task (more than ``small_limit``
  records), a second worker takes the small ones, so a large merge (seconds)
  never holds back the small merges that keep the number of segments bounded.

At most two merge threads run at once, and at most one large merge. Threads
start when there is work and end when there is none (a memory that does not
merge holds no thread). A task's work is done by the ``run`` callable the
memory gives (it merges outside every lock and then commits under the
writer's lock, briefly); an exception there is logged and counted, never
raised into a writer.

With ``background=False`` tasks run at once, in the thread that submits them
(the writer, inside its call): the old, deterministic behaviour.

Tests make races deterministic with :attr:`Merger.hook`: a callable
``hook(event, task)`` the workers call at ``"start"`` (before merging),
``"merged"`` (merged, before the commit), ``"done"`` (after the commit or the
failure) and ``"released"`` (the worker is free again); a hook may block on an
event the test controls.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gpuir.memory")


class MergeCancelled(Exception):
    """Raised inside a merge whose task was cancelled (the memory was closed): its result is abandoned."""


class MergeTask:
    """One merge: these segment views of one partition become one segment.

    Attributes
    ----------
    key : partition key
    views : list of SegView, as the policy saw them
    uid : int
        The merged segment's uid (reserved when the task was made).
    n_records : int
        Live records of the inputs (the task's size).
    reason : str
        ``"tier"``, ``"seal"``, ``"purge"`` or ``"explicit"``.
    """

    __slots__ = ("cancelled", "key", "n_records", "reason", "uid", "views")

    def __init__(self, key: Any, views: list, uid: int, reason: str):
        self.key = key
        self.views = views
        self.uid = uid
        self.n_records = sum(v.n_live for v in views)
        self.reason = reason
        self.cancelled = False

    def check(self) -> None:
        """Raise :class:`MergeCancelled` when the task was cancelled (called between a merge's steps)."""
        if self.cancelled:
            raise MergeCancelled(repr(self))

    @property
    def uids(self) -> list[int]:
        return [v.seg.uid for v in self.views]

    def __repr__(self) -> str:
        return (f"MergeTask(partition={self.key!r}, segments={self.uids}, records={self.n_records}, "
                f"uid={self.uid}, reason={self.reason!r})")


class Merger:
    """Runs :class:`MergeTask` s in background threads (see the module docstring).

    Parameters
    ----------
    run : callable(task) -> None
        Does one task (held weakly when it is a bound method, so the merger
        does not keep its memory alive).
    small_limit : int
        Tasks of at most this many records are small.
    background : bool
        False: run each task at once in the submitting thread.
    """

    max_threads = 2

    def __init__(self, run: Callable[[MergeTask], None], small_limit: int, background: bool = True):
        self._run_ref = weakref.WeakMethod(run) if hasattr(run, "__self__") else (lambda: run)
        self.small_limit = int(small_limit)
        self.background = background
        self._cv = threading.Condition()
        self._heap: list[tuple[int, int, MergeTask]] = []
        self._order = itertools.count()
        self._workers: dict[threading.Thread, MergeTask | None] = {}
        self._inline = False
        self._stopping = False
        #: Called as hook(event, task) by the workers (tests).
        self.hook: Callable[[str, MergeTask], None] | None = None
        #: Set when :meth:`stop` has cancelled the tasks (before it waits for the threads): for tests.
        self.stop_requested = threading.Event()
        #: Tasks done, failed (exceptions logged), dropped by stop().
        self.done = 0
        self.failed = 0
        self.dropped = 0
        self.errors: list[str] = []

    # ------------------------------------------------------------------ state
    def pending(self) -> int:
        """Tasks queued or running."""
        with self._cv:
            return len(self._heap) + sum(1 for t in self._workers.values() if t is not None)

    @property
    def threads(self) -> int:
        with self._cv:
            return len(self._workers)

    def _large(self, task: MergeTask) -> bool:
        return task.n_records > self.small_limit

    # ------------------------------------------------------------------ submit
    def submit(self, task: MergeTask) -> None:
        """Queue ``task``; returns at once (or, without background threads, after running it)."""
        with self._cv:
            self._stopping = False
            self.stop_requested.clear()
            heapq.heappush(self._heap, (task.n_records, next(self._order), task))
            if self.background:
                self._spawn()
                return
            if self._inline:  # a task submitted while one runs inline: the outer loop takes it
                return
            self._inline = True
        try:
            while True:
                with self._cv:
                    if not self._heap:
                        return
                    task = heapq.heappop(self._heap)[2]
                self._do(task)
        finally:
            with self._cv:
                self._inline = False
                self._cv.notify_all()

    def _eligible(self, me: threading.Thread | None) -> MergeTask | None:
        """The smallest queued task this worker may take (caller holds the lock), removed from the queue."""
        big_busy = any(t is not None and self._large(t) for th, t in self._workers.items() if th is not me)
        for i, (_, _, task) in enumerate(sorted(self._heap)):
            if big_busy and self._large(task):
                continue
            self._heap.remove(next(e for e in self._heap if e[2] is task))
            heapq.heapify(self._heap)
            return task
        return None

    def _spawn(self) -> None:
        """Start a worker if one is needed and allowed (caller holds the lock)."""
        if not self._heap or len(self._workers) >= self.max_threads:
            return
        if self._workers:
            busy = [t for t in self._workers.values() if t is not None]
            idle = len(self._workers) - len(busy)
            # an idle worker will take the task; a second one only beside a large merge, for small tasks
            if idle or not any(self._large(t) for t in busy) or all(self._large(e[2]) for e in self._heap):
                return
        th = threading.Thread(target=self._worker, name="gpuir-merge", daemon=True)
        self._workers[th] = None
        th.start()

    def _worker(self) -> None:
        me = threading.current_thread()
        try:
            while True:
                with self._cv:
                    task = None if self._stopping else self._eligible(me)
                    if task is None:
                        return
                    self._workers[me] = task
                    self._spawn()  # a large task taken: small ones may need the second worker
                try:
                    self._do(task)
                finally:
                    with self._cv:
                        self._workers[me] = None
                        self._cv.notify_all()
                    if self.hook is not None:
                        self.hook("released", task)
        finally:
            with self._cv:
                self._workers.pop(me, None)
                self._spawn()  # tasks this worker could not take (a large one beside another)
                self._cv.notify_all()

    def _do(self, task: MergeTask) -> None:
        run = self._run_ref()
        try:
            if run is None:  # the memory is gone
                return
            run(task)
            self.done += 1
        except MergeCancelled:
            pass
        except Exception as e:  # noqa: BLE001 - logged and counted: a merge never raises into a writer
            self.failed += 1
            self.errors.append(f"{task!r}: {type(e).__name__}: {e}")
            log.error("background merge failed (its segments stay as they are): %r: %s: %s", task,
                      type(e).__name__, e)
            failed = getattr(run, "__self__", None)
            if failed is not None:
                failed._merge_failed(task)
        finally:
            if self.hook is not None:
                self.hook("done", task)

    # ------------------------------------------------------------------ waiting, stopping
    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no task is queued or running; returns False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._heap and not any(self._workers.values())
                                     and not self._inline, timeout)

    def stop(self, timeout: float | None = None) -> list[MergeTask]:
        """Drop queued tasks (returned), cancel running ones (they abandon their result), join the threads.

        The merger starts again at the next :meth:`submit`. With a ``timeout``,
        the merger's lock is waited for at most that long too (at least 0.1 s):
        at interpreter exit a daemon worker may be frozen holding it, and a
        finaliser must not wait forever (nothing is lost: merges only rewrite
        what the memory already holds); then nothing is stopped and [] returned.
        """
        if not self._cv.acquire(timeout=-1 if timeout is None else max(timeout, 0.1)):
            log.debug("merger busy; not stopped (interpreter exit?)")
            return []
        try:
            self._stopping = True
            dropped = [e[2] for e in self._heap]
            self._heap.clear()
            for t in dropped + [t for t in self._workers.values() if t is not None]:
                t.cancelled = True  # a running task abandons its result
            self.dropped += len(dropped)
            threads = list(self._workers)
            self.stop_requested.set()
        finally:
            self._cv.release()
        me = threading.current_thread()
        for th in threads:
            if th is not me:
                th.join(timeout)
        return dropped
