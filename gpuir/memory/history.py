"""A bounded history of each record's earlier versions.

Every change that replaces a record (``update``, ``replace``, ``upsert`` of an
existing id) first keeps the version it replaces; :meth:`Memory.history
<gpuir.memory.Memory.history>` lists them, oldest first, as record dicts. At
most ``limit`` versions are kept per record (the oldest are dropped first;
``limit=0`` keeps none). ``delete`` removes a record's history with it, unless
``keep_history=True``: then the deleted version is kept as the history's last
entry, and the history stays readable by id (a later ``add`` of the same id
continues it).

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
from .timeutil import public_record

__all__ = ["History"]


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

    def push(self, rid: str, version: dict[str, Any]) -> None:
        """Keep ``version`` (a canonical record dict) as ``rid``'s newest earlier version."""
        if self.limit == 0:
            return
        vs = self._versions.setdefault(rid, [])
        vs.append(version)
        if len(vs) > self.limit:
            del vs[: len(vs) - self.limit]
        self.changed = True

    def drop(self, ids: Iterable[str]) -> None:
        """Forget the histories of ``ids``."""
        for rid in ids:
            if self._versions.pop(rid, None) is not None:
                self.changed = True

    def get(self, rid: str) -> list[dict[str, Any]]:
        """``rid``'s earlier versions, oldest first, as record dicts (times in ISO 8601); [] when none."""
        return [public_record(copy.deepcopy(v)) for v in self._versions.get(rid, ())]

    def canonical(self, rid: str) -> list[dict[str, Any]]:
        """``rid``'s earlier versions in the canonical form (times as int epoch ms), oldest first."""
        return copy.deepcopy(self._versions.get(rid, []))

    def ids(self) -> list[str]:
        """Ids with a history, in the order their histories began."""
        return list(self._versions)

    def restore(self, rid: str, versions: list[dict[str, Any]]) -> None:
        """Set ``rid``'s history (canonical versions, oldest first), as an import does."""
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
