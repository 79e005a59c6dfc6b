"""Which shard owns a record, and which shards a search must ask (no Ray needed).

Placement is a stable hash (BLAKE2b, 64 bits, of the UTF-8 key) modulo the
number of shards -- the same in every process and on every machine (Python's
``hash`` of a string is salted per process, so it cannot place anything):

* ``route="tenant"``: the key is the record's tenant, so every record of a
  tenant lives on one shard and a search confined to a tenant asks that shard
  only (the agent case). Records without a tenant are placed by their id.
* ``route="id"``: the key is the record's id (one large shared corpus, spread
  evenly); a search asks every shard that holds one of its terms, or, when its
  ``where`` names ids, only their owners.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from ..memory.where import And, Cond, Or, Where


def shard_of(key: str, shards: int) -> int:
    """The shard of a routing key: ``blake2b_64(key) mod shards``."""
    h = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(h, "little") % shards


def owners(ids: Sequence[str], tenants: Sequence[str | None] | None, route: str, shards: int) -> list[int]:
    """The owning shard of each record (``tenants``: each record's tenant, or None)."""
    if route == "tenant" and tenants is not None:
        return [shard_of(t if t is not None else i, shards) for i, t in zip(ids, tenants)]
    return [shard_of(i, shards) for i in ids]


def _ids_of(node: Any) -> set[str] | None:
    """The ids a filter node confines matches to (None: any id)."""
    if isinstance(node, Cond):
        if node.field == "id" and node.op == "eq" and isinstance(node.value, str):
            return {node.value}
        if node.field == "id" and node.op == "in":
            return {v for v in node.value if isinstance(v, str)}
        return None
    if isinstance(node, And):  # every child must hold: each that names ids narrows the set
        out: set[str] | None = None
        for c in node.children:
            got = _ids_of(c)
            if got is not None:
                out = got if out is None else out & got
        return out
    if isinstance(node, Or):  # some child holds: confined only when every child names ids
        parts = [_ids_of(c) for c in node.children]
        if parts and all(p is not None for p in parts):
            return set().union(*parts)  # type: ignore[arg-type]
        return None
    return None  # Not, or anything else: no confinement


def where_ids(w: Where | None) -> set[str] | None:
    """The ids a compiled ``where`` confines a search to (``id`` equality or membership, under
    ``$and``/``$or``), or None."""
    if w is None:
        return None
    return _ids_of(w.root)


def search_targets(w: Where | None, route: str, shards: int) -> list[int]:
    """The shards that can hold a match of a search under ``w`` (before looking at its terms)."""
    if route == "tenant" and w is not None and w.tenant is not None:
        # a tenant's records are on its shard; records without a tenant never match a tenant condition
        return [shard_of(w.tenant, shards)]
    ids = where_ids(w)
    if route == "id" and ids is not None:
        return sorted({shard_of(i, shards) for i in ids})
    return list(range(shards))
