"""A memory sharded over Ray actors, with exact global BM25 (the optional extra ``gpuir[ray]``).

:class:`ShardedMemory` has the :class:`~gpuir.memory.Memory` API; its shards are
Ray actors (one per GPU, or per CPU worker), each owning a memory directory
behind a write-ahead log. See ``docs/scaling.md``. Importing this package does
not import Ray (only creating or opening a sharded memory does).
"""

from .layout import is_sharded
from .sharded import ShardedMemory, ShardedResults, ShardFailedError, ShardUnavailableError

__all__ = ["ShardFailedError", "ShardUnavailableError", "ShardedMemory", "ShardedResults", "is_sharded"]
