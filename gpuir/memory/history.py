"""A bounded history of each record's earlier versions, each with the event that ended it and its time.

Every change that replaces a record (``update``, ``replace``, ``upsert`` of an
existing id; one that changes nothing is no change) first keeps the version it
replaces; a ``delete`` keeps the deleted version (unless
``keep_history=False``: then the record's history goes with it). The history
outlives the delete: it stays readable by id (a later ``add`` of the same id
continues it). :meth:`Memory.history <gpuir.memory.Memory.history>` lists the
entries oldest first: each is the version as it was (a record dict, its
``created_at`` saying when the record was added and its ``updated_at`` when
this version was written) with two more keys,

* ``event``: what ended the version, ``"update"`` or ``"delete"``;
* ``event_time``: when (ISO 8601; for an update, the new version's ``updated_at``
  in a memory with ``record_times``, decided before the update was applied).

So the add is the oldest entry's ``created_at`` (or the record's own, when it
was never changed), every later change is an entry. At most ``limit`` entries
are kept per record (the oldest are dropped first; ``limit=0`` keeps none).
Entries saved by an older gpuir have no ``event``: they read as updates with
no ``event_time``.

Versions are kept in the canonical record form (times as int epoch ms, see
:mod:`gpuir.memory.intake`) and saved with the memory: ``history-<gen>.jsonl``
in its directory, one line ``{"id": ..., "versions": [...]}`` per record,
written when the history changed since the last save, named with its sha256
and size in the manifest, and checked when loaded.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import persist
from .persist import MemoryFormatError
from .records import format_time
from .timeutil import public_record

__all__ = ["EVENT_KEYS", "History", "canonical_entries", "split_events"]

#: The keys a history entry has beside the version's record fields.
EVENT_KEYS = ("event", "event_time")


def _public(entry: dict[str, Any]) -> dict[str, Any]:
    at = entry.get("event_time")
    entry.setdefault("event", "update")
    entry["event_time"] = None if at is None else format_time(at) if not isinstance(at, str) else at
    return public_record(entry)


def canonical_entries(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """History entries read back (an export's: times as ISO 8601) in the canonical form (int epoch ms)."""
    from .intake import canonical_records
    from .timeutil import parse_time

    versions, events = split_events(entries)
    out = []
    for v, e in zip(canonical_records(versions, None), events):
        at = e.get("event_time")
        out.append({**v, "event": e.get("event", "update"),
                    "event_time": None if at is None else parse_time(at, "history event_time", "ms")})
    return out


def split_events(entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the versions as records, their event keys) of history entries read back (an export's)."""
    versions, events = [], []
    for e in entries:
        versions.append({k: v for k, v in e.items() if k not in EVENT_KEYS})
        events.append({k: e[k] for k in EVENT_KEYS if k in e})
    return versions, events


class History:
    """Earlier versions of records, per id, at most ``limit`` each.

    Parameters
    ----------
    limit : int, >= 0
    """

    def __init__(self, limit: int = 10):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"history_limit must be a non-negative integer, got {limit!r}")
        self.limit = limit
        self._versions: dict[str, list[dict[str, Any]]] = {}
        self.changed = False  # since the last save
        self._entry: dict[str, Any] | None = None  # the manifest entry of the file on disk

    def __len__(self) -> int:
        return len(self._versions)

    def __contains__(self, rid: object) -> bool:
        return rid in self._versions

    def push(self, rid: str, version: dict[str, Any], event: str = "update", at: int | None = None) -> None:
        """Keep ``version`` (a canonical record dict) as ``rid``'s newest earlier version, ended by
        ``event`` ("update" or "delete") at ``at`` (epoch ms)."""
        if self.limit == 0:
            return
        vs = self._versions.setdefault(rid, [])
        vs.append({**version, "event": event, "event_time": at})
        if len(vs) > self.limit:
            del vs[: len(vs) - self.limit]
        self.changed = True

    def drop(self, ids: Iterable[str]) -> None:
        """Forget the histories of ``ids``."""
        for rid in ids:
            if self._versions.pop(rid, None) is not None:
                self.changed = True

    def push_updates(self, old: list[tuple[str, dict[str, Any]]], new: list[dict[str, Any]],
                     now: int | None = None) -> None:
        """Keep the versions an update replaced (``old``: (id, version)), each ended at the ``updated_at``
        of its new version among ``new`` (canonical records), or at ``now`` (epoch ms; default the clock:
        a memory without record_times; a replayed update passes the time its log frame holds)."""
        at = {r["id"]: r.get("updated_at") for r in new}
        for rid, version in old:
            t = at.get(rid)
            if t is None:
                if now is None:
                    from .expiry import now_ms

                    now = now_ms()
                t = now
            self.push(rid, version, "update", t)

    def get(self, rid: str) -> list[dict[str, Any]]:
        """``rid``'s history entries, oldest first (see the module docstring; times in ISO 8601); [] when none."""
        return [_public(copy.deepcopy(v)) for v in self._versions.get(rid, ())]

    def last(self, rid: str) -> dict[str, Any] | None:
        """``rid``'s newest entry (canonical), or None."""
        vs = self._versions.get(rid)
        return copy.deepcopy(vs[-1]) if vs else None

    def canonical(self, rid: str) -> list[dict[str, Any]]:
        """``rid``'s earlier versions in the canonical form (times as int epoch ms), oldest first."""
        return copy.deepcopy(self._versions.get(rid, []))

    def ids(self) -> list[str]:
        """Ids with a history, in the order their histories began."""
        return list(self._versions)

    def restore(self, rid: str, versions: list[dict[str, Any]]) -> None:
        """Set ``rid``'s history (canonical entries, oldest first: :func:`split_events` and back), as an
        import does."""
        if versions and self.limit:
            self._versions[rid] = [dict(v) for v in versions[-self.limit:]]
            self.changed = True

    # ------------------------------------------------------------------ files
    def freeze(self) -> History:
        """A copy to save while writers go on changing this one (the writer's lock held): the lists are
        copied, the versions (never changed in place) shared. This history counts as saved from now
        on; a save that fails marks it changed again."""
        h = History.__new__(History)
        h.limit = self.limit
        h._versions = {rid: list(vs) for rid, vs in self._versions.items()}
        h.changed = self.changed
        h._entry = self._entry
        self.changed = False
        return h

    def adopt(self, saved: History) -> None:
        """After ``saved`` (from :meth:`freeze`) was written: its file is this history's file on disk."""
        self._entry = saved._entry

    # ------------------------------------------------------------------ files
    def save(self, root: Path, gen: int) -> dict[str, Any] | None:
        """The manifest entry of the history file for commit ``gen``, writing the file when it changed."""
        if not self._versions:
            self._entry, self.changed = None, False
            return None
        if self.changed or self._entry is None or not (root / self._entry["file"]).is_file():
            lines = [json.dumps({"id": rid, "versions": vs}, ensure_ascii=False, sort_keys=True,
                                separators=(",", ":")) for rid, vs in self._versions.items()]
            data = ("\n".join(lines) + "\n").encode("utf-8")
            self._entry = persist._write_atomic(root, f"history-{gen:08d}.jsonl", lambda f: f.write(data))
            self._entry["records"] = len(lines)
            self.changed = False
        return dict(self._entry)

    def load(self, root: Path, entry: dict[str, Any] | None, verify: bool = True) -> None:
        """Read the history file a manifest names (None: no history)."""
        self._versions, self._entry, self.changed = {}, None, False
        if not entry:
            return
        p = persist._check_file(root, entry, verify)
        try:
            for n, line in enumerate(p.read_text("utf-8").splitlines(), 1):
                if not line:
                    continue
                obj = json.loads(line)
                if not isinstance(obj, dict) or not isinstance(obj.get("id"), str) or not isinstance(
                        obj.get("versions"), list):
                    raise ValueError(f"line {n} is not an {{id, versions}} object")  # noqa: TRY004 - reported as damage
                self._versions[obj["id"]] = obj["versions"][-self.limit:] if self.limit else []
        except (ValueError, UnicodeDecodeError) as e:
            raise MemoryFormatError(f"{p}: damaged history file ({e})") from None
        self._versions = {k: v for k, v in self._versions.items() if v}
        self._entry = dict(entry)
