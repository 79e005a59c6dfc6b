"""A BM25 search's arguments, checked in one place for every memory that searches.

:meth:`gpuir.memory.Memory.search` and :meth:`gpuir.cluster.ShardedMemory.search`
take the same arguments and must refuse the same mistakes with the same
messages (a sharded memory checks them before any shard is asked).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from .hitorder import HIT_ORDERS, check_min_score, resolve_ties
from .partitions import MODES, budget_partitions
from .timeutil import check_time_unit

__all__ = ["SearchArgs", "check_search_args"]


class SearchArgs(NamedTuple):
    """The checked arguments: ``queries`` as a list of str, ``k`` an int, ``ties`` resolved for the mode,
    ``min_score`` a float or None, ``budget`` the partitions a budgeted scan reads (None: every one)."""

    queries: list[str]
    k: int
    ties: str
    min_score: float | None
    budget: int | None


def check_search_args(queries: Any, k: Any, mode: str, max_partitions: Any, epsilon: float | None, decay: float,
                      min_score: Any, ties: str | None, order_by: str, time_unit: str | None) -> SearchArgs:
    """Check a search's arguments (see :meth:`gpuir.memory.Memory.search`); raise TypeError/ValueError naming
    what to fix."""
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, Sequence):
        raise TypeError(f"queries must be a str or a sequence of str, got {type(queries).__name__}")
    bad = [i for i, q in enumerate(queries) if not isinstance(q, str)]
    if bad:
        raise TypeError(f"query {bad[0]} is a {type(queries[bad[0]]).__name__}; queries must be str")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")
    ties = resolve_ties(ties, mode)
    min_score = check_min_score(min_score)
    if order_by not in HIT_ORDERS:
        raise ValueError(f"order_by must be one of {', '.join(repr(o) for o in HIT_ORDERS)}, got {order_by!r}")
    check_time_unit(time_unit)
    budget = None
    if mode == "budgeted":
        if max_partitions is not None:
            if isinstance(max_partitions, bool) or not isinstance(max_partitions, int) or max_partitions < 1:
                raise ValueError(f"max_partitions must be a positive integer, got {max_partitions!r}")
            budget = max_partitions
        elif epsilon is not None:
            budget = budget_partitions(epsilon, decay)
        else:
            raise ValueError("mode 'budgeted' needs max_partitions=K or epsilon (with decay)")
    return SearchArgs(list(queries), int(k), ties, min_score, budget)
