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

from ..memory.where import Where


def shard_of(key: str, shards: int) -> int:
    """The shard of a routing key: ``blake2b_64(key) mod shards``."""
    h = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(h, "little") % shards


def owners(ids: Sequence[str], tenants: Sequence[str | None] | None, route: str, shards: int) -> list[int]:
    """The owning shard of each record (``tenants``: each record's tenant, or None)."""
    if route == "tenant" and tenants is not None:
        return [shard_of(t if t is not None else i, shards) for i, t in zip(ids, tenants)]
    return [shard_of(i, shards) for i in ids]


def where_ids(w: Where | None) -> set[str] | None:
    """The ids a compiled ``where`` confines a search to (its ``id`` equality or membership), or None."""
    if w is None:
        return None
    out: set[str] | None = None
    for c in w.conds:
        if c.field != "id":
            continue
        for op in ("eq", "in"):  # conditions AND: each narrows the set
            if op in c.ops:
                vals = {v for v in c.ops[op] if isinstance(v, str)}
                out = vals if out is None else out & vals
    return out


def search_targets(w: Where | None, route: str, shards: int) -> list[int]:
    """The shards that can hold a match of a search under ``w`` (before looking at its terms)."""
    if route == "tenant" and w is not None and w.tenant is not None:
        # a tenant's records are on its shard; records without a tenant never match a tenant condition
        return [shard_of(w.tenant, shards)]
    ids = where_ids(w)
    if route == "id" and ids is not None:
        return sorted({shard_of(i, shards) for i in ids})
    return list(range(shards))
