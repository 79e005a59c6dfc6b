"""Agent memory: records with text and metadata that grow while serving, with exact global BM25.

``Memory`` (:mod:`gpuir.memory.store`) over immutable CSR segments
(:mod:`~gpuir.memory.segments`) with tombstones, time partitions and
newest-first search (:mod:`~gpuir.memory.partitions`), the ``where`` filter
language with a hard tenant boundary (:mod:`~gpuir.memory.where`), scopes that
confine reads and writes to a tenant with per-tenant ids
(:mod:`~gpuir.memory.scope`), deletes by filter (:mod:`~gpuir.memory.bulk`), updates that
merge and a bounded history (:mod:`~gpuir.memory.updates`,
:mod:`~gpuir.memory.history`), listing with stable cursors and exact export
(:mod:`~gpuir.memory.listing`, :mod:`~gpuir.memory.export`), times parsed once
(:mod:`~gpuir.memory.timeutil`), expiry (:mod:`~gpuir.memory.expiry`),
snapshots for concurrent readers (:mod:`~gpuir.memory.snapshot`), and
checksummed, incrementally saved directories (:mod:`~gpuir.memory.persist`).
See ``docs/memory.md`` and ``docs/api.md``.
"""

from .durable import DURABILITY, MemoryClosedError
from .listing import Page
from .partitions import MODES, budget_partitions, fit_decay
from .persist import MemoryFormatError
from .records import FIELDS, ROLES, DuplicateIdError, RecordError, format_time, to_epoch_ms
from .scope import Scope, ScopeError
from .search import MemoryResults
from .snapshot import Snapshot
from .store import Memory, ReadOnlyError, UnknownIdError, UnsavedWritesWarning
from .termstats import TermStats
from .timeutil import parse_time
from .where import WhereError

__all__ = [
    "DURABILITY",
    "FIELDS",
    "MODES",
    "ROLES",
    "DuplicateIdError",
    "Memory",
    "MemoryClosedError",
    "MemoryFormatError",
    "MemoryResults",
    "Page",
    "ReadOnlyError",
    "RecordError",
    "Scope",
    "ScopeError",
    "Snapshot",
    "TermStats",
    "UnknownIdError",
    "UnsavedWritesWarning",
    "WhereError",
    "budget_partitions",
    "fit_decay",
    "format_time",
    "parse_time",
    "to_epoch_ms",
]
