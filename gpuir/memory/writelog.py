"""The writer's half of the durable log (:mod:`gpuir.memory.durable`): a mixin of
:class:`~gpuir.memory.writer.IndexWriter`, on its state and under its lock.

Every write is logged before it is applied (:meth:`WriteLog._log_write`) and taken back when it could not
be applied (:meth:`WriteLog._unlog`); after the writer's lock is released the write waits for the log's
fsync (group commit) and a checkpoint starts in the background when the log has grown enough
(:meth:`WriteLog._durable`). A caller's tag (a shard's write id) is logged with each write made inside
:meth:`WriteLog._tagged`; writes made inside :meth:`WriteLog._unlogged` (a log being replayed or folded
in) are not logged again. The replay at open: :mod:`gpuir.memory.load`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from . import scope
from .durable import MemoryClosedError

log = logging.getLogger("gpuir.memory")


class WriteLog:
    """The durable-log glue of :class:`~gpuir.memory.writer.IndexWriter` (whose state it reads and sets)."""

    def _note_tag(self) -> None:
        """A write is being made (writer's lock held): it carries the caller's tag, if one is set."""
        if self._write_tag is not None and not self._replaying:
            self._tag_before, self._last_tag = self._last_tag, self._write_tag

    def _log_write(self, op: dict[str, Any], n: int):
        """Log ``op`` (writer's lock held) before it is applied; None when nothing is logged."""
        if self._log is None or self._replaying:
            return None
        if self._write_tag is not None:
            op["tag"] = self._write_tag
        return self._log.write(op, n)

    def _unlog(self, token, n: int) -> None:
        """Take back a logged operation that could not be applied (writer's lock held)."""
        if self._write_tag is not None and not self._replaying:
            self._last_tag = self._tag_before
        if token is not None:
            self._log.rollback(token[0], n)

    @contextlib.contextmanager
    def _tagged(self, tag: Any):
        """Log ``tag`` (a JSON value) with every write made inside (one writer: a shard's write id). The
        tag of the last write is kept across saves (in the manifest) and replays (:attr:`_last_tag`), so a
        caller can tell after a crash which of its writes the memory holds."""
        self._write_tag = tag
        try:
            yield
        finally:
            self._write_tag = None

    @contextlib.contextmanager
    def _unlogged(self):
        """Apply writes without logging them (an older log being folded in: a save must follow, and it is
        the save that makes them durable)."""
        self._replaying = True
        try:
            with scope.inside_scope():
                yield
        finally:
            self._replaying = False

    def _durable(self, token) -> None:
        """After the writer's lock is released: wait for the log's fsync (group commit), then checkpoint in the
        background when the log has grown enough."""
        if token is None:
            return
        log_ = self._log
        if log_ is None:  # closed meanwhile: close() synced the log
            return
        log_.sync(token[1])
        if log_.due() and (self._ckpt_thread is None or not self._ckpt_thread.is_alive()):
            with self._write_lock:
                if self._closed or (self._ckpt_thread is not None and self._ckpt_thread.is_alive()):
                    return
                self._ckpt_thread = threading.Thread(target=self._checkpoint, name="gpuir-memory-checkpoint",
                                                     daemon=True)
                self._ckpt_thread.start()

    def _checkpoint(self) -> None:
        try:
            self.save()
        except MemoryClosedError:
            pass
        except Exception as e:  # noqa: BLE001 - the log still holds every write; the next one retries
            log.warning("background checkpoint of %s failed (the log keeps every write): %s: %s", self._path,
                        type(e).__name__, e)
