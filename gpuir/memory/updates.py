"""Updates that keep what they do not name: merging a partial record into the stored one.

:meth:`Memory.update <gpuir.memory.Memory.update>` takes partial records (an
``id`` and the fields to change) and merges each into the stored record:

* a field given with a value replaces the stored one;
* a field given as ``None`` is removed (``text`` cannot be removed);
* ``metadata`` merges key by key: a key given with a value is set, a key
  given as ``None`` is removed, keys not given are kept (``"metadata": None``
  removes all of them); the merge is one level deep (a nested object given
  replaces the stored one);
* fields not given are kept as they are.

``replace=True`` (or :meth:`Memory.replace <gpuir.memory.Memory.replace>`)
replaces the whole record with the one given (which then needs ``text``).
:meth:`Memory.upsert <gpuir.memory.Memory.upsert>` updates the ids that exist
and adds the others (which need ``text``). A record whose merged version equals
the stored one is left alone (not re-indexed, no history entry, no new
``updated_at``; the call counts it 0); a changed one is re-written as one new row
(its text analysed again) with a new ``updated_at`` and its ``created_at`` kept
(:mod:`gpuir.memory.stamps`), and moves to the end of the add order, as a delete
followed by an add would. **Why it moves:** the add order is the memory's tie
order (equal scores rank the earlier-added record first, bit for bit across
engines) and sequence numbers only grow, so the new version takes the next one;
``list(order_by="created_at")`` keeps each record's place through its updates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .records import RecordError

__all__ = ["check_ids", "merge_record", "plan"]


def check_ids(patches: list[dict[str, Any]], what: str) -> list[str]:
    """The ids of ``patches``, each a non-empty string, none twice (else :class:`RecordError` naming it)."""
    ids: list[str] = []
    seen: dict[str, int] = {}
    for i, p in enumerate(patches):
        rid = p.get("id")
        if not isinstance(rid, str) or not rid:
            got = "missing" if rid is None else f"{type(rid).__name__} {rid!r}"
            raise RecordError(f"{what}: record {i}: 'id' must be a non-empty string naming the record, got {got}")
        if rid in seen:
            raise RecordError(f"{what}: record {i} (id {rid!r}): the id occurs twice in this batch (also record "
                              f"{seen[rid]})")
        seen[rid] = i
        ids.append(rid)
    return ids


def merge_record(current: Mapping[str, Any], patch: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``patch`` merged into ``current`` (both canonical record dicts; see the module docstring)."""
    out = dict(current)
    for k, v in patch.items():
        if k == "id":
            continue
        if k == "metadata":
            if v is None:
                out.pop("metadata", None)
            elif isinstance(v, Mapping):
                meta = dict(out.get("metadata") or {})
                for mk, mv in v.items():
                    if mv is None:
                        meta.pop(mk, None)
                    else:
                        meta[mk] = mv
                if meta:
                    out["metadata"] = meta
                else:
                    out.pop("metadata", None)
            else:
                out["metadata"] = v  # the record check names the problem
        elif v is None:
            if k == "text":
                raise RecordError(f"{where}: 'text' cannot be removed (give a new text, or delete the record)")
            out.pop(k, None)
        else:
            out[k] = v
    return out


def _same(new: dict[str, Any], cur: dict[str, Any]) -> bool:
    """Whether two canonical versions hold the same record (``updated_at`` aside: it is the change's stamp)."""
    if len(new) - ("updated_at" in new) != len(cur) - ("updated_at" in cur):
        return False
    return all(k == "updated_at" or (k in cur and cur[k] == v) for k, v in new.items())


def plan(patches: list[dict[str, Any]], current: dict[str, dict[str, Any]], replace: bool
         ) -> tuple[list[dict[str, Any]], list[str], list[str], list[tuple[str, dict[str, Any]]]]:
    """What a put of ``patches`` writes, given the stored versions ``current`` (id -> canonical record).

    Returns
    -------
    records : the new versions to write (canonical), in the order given
    labels : how errors name each of them ("record <position in the call>")
    replaced : ids whose stored version is replaced
    old : (id, stored version) of each replaced record, for the history
    """
    records, labels, replaced, old = [], [], [], []
    for i, p in enumerate(patches):
        rid = p["id"]
        cur = current.get(rid)
        label = f"record {i}"
        if cur is None:  # a new record (upsert): added now
            new = dict(p)
            if new.get("created_at") is None and new.get("updated_at") is not None:
                new["created_at"] = new["updated_at"]
            records.append(new)
            labels.append(label)
            continue
        new = dict(p) if replace else merge_record(cur, p, f"{label} (id {rid!r})")
        if replace:
            new = {k: v for k, v in new.items() if v is not None}
            if "created_at" not in new and cur.get("created_at") is not None:
                new["created_at"] = cur["created_at"]  # a replaced record was still added when it was
        if _same(new, cur):  # nothing changes: nothing is written (no new version, no new updated_at)
            continue
        records.append(new)
        labels.append(label)
        replaced.append(rid)
        old.append((rid, cur))
    return records, labels, replaced, old
