"""Micro-batching: concurrent searches share one call to the scorer.

Each request's queries wait at most ``window_s`` (default 2 ms) for others;
then all waiting queries -- up to ``max_batch`` of them, from any number of
requests and tenants -- go to one ``search_fn(queries, k, wheres)`` call with
one ``where`` per query (each request's tenant forced into it), and the rows
are split back to their requests. A batch that reaches ``max_batch`` queries,
or ``max_terms`` query terms (the work of a call grows with its terms), runs at
once. The caller splits a request larger than that into several calls
(``gpuir.service.app``), so that the event loop serves others between them. The batch searches with the largest ``k`` of its requests and
each request keeps its first ``k`` hits: top-k is a prefix of top-K under the
engine's total order (higher score, then the earlier record), so the answer
equals the unbatched one.

Where the scorer runs is the caller's choice (``inline``). A scorer that
releases the GIL while it works (a GPU kernel, a dense model) runs in a worker
thread (``asyncio.to_thread``), so the event loop keeps accepting requests
meanwhile. A pure-Python/NumPy CPU scorer runs *inline*, on the event loop's
thread: it holds the GIL anyway, so a worker thread would not run beside the
loop, and every system call of the loop (a socket send or receive) would then
wait up to the interpreter's switch interval (5 ms) to take the GIL back -- the
"convoy" measured in ``docs/service.md``. Batches of different keys (retriever
configurations) are independent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from typing import Any

#: search_fn(queries, k, wheres) -> one list of hit dicts per query
SearchFn = Callable[[list[str], int, list[Any]], list[list[dict[str, Any]]]]


class _Pending:
    __slots__ = ("future", "inline", "k", "queries", "terms", "wheres")

    def __init__(self, queries: list[str], k: int, wheres: list[Any], future: asyncio.Future, inline: bool,
                 terms: int = 0):
        self.queries, self.k, self.wheres, self.future, self.inline = queries, k, wheres, future, inline
        self.terms = terms


class MicroBatcher:
    """Group concurrent searches into batched calls (use from one event loop).

    Parameters
    ----------
    window_s : float
        How long the first request of a batch waits for others (0: run when the loop is next idle).
    max_batch : int
        Most queries in one call (a request with more runs alone, whole).
    max_terms : int or None
        Most query terms in one call (a request with more runs alone, whole); None: no bound.
    on_batch : callable(n_queries, n_requests, seconds), optional
        Called after every batch (metrics, tests).
    """

    def __init__(self, window_s: float = 0.002, max_batch: int = 256, max_terms: int | None = None,
                 on_batch: Callable[[int, int, float], None] | None = None):
        if not window_s >= 0:
            raise ValueError(f"window_s must be >= 0, got {window_s!r}")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
        self.window_s = float(window_s)
        self.max_batch = max_batch
        self.max_terms = max_terms
        self.on_batch = on_batch
        self._terms: dict[Hashable, int] = {}
        self.batches = 0
        self._pending: dict[Hashable, list[_Pending]] = {}
        self._size: dict[Hashable, int] = {}
        self._timers: dict[Hashable, asyncio.TimerHandle] = {}

    async def search(self, key: Hashable, search_fn: SearchFn, queries: Sequence[str], k: int,
                     wheres: Sequence[Any], inline: bool = False, terms: int = 0) -> list[list[dict[str, Any]]]:
        """Hits of ``queries`` (one ``where`` each), batched with other callers of the same ``key``.

        ``inline``: run ``search_fn`` on the event loop's thread (a CPU scorer
        holding the GIL) rather than in a worker thread; give the same value for
        every call with the same ``key``. ``terms``: the queries' terms (counted
        against ``max_terms``).
        """
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        item = _Pending(list(queries), int(k), list(wheres), fut, bool(inline), int(terms))
        if len(item.queries) != len(item.wheres):
            raise ValueError(f"{len(item.queries)} queries but {len(item.wheres)} wheres")
        over_terms = self.max_terms is not None and self._terms.get(key, 0) + item.terms > self.max_terms
        if (self._size.get(key, 0) + len(item.queries) > self.max_batch or over_terms) and self._pending.get(key):
            self._flush(key, search_fn)  # this one would overflow the batch: send what waits first
        self._pending.setdefault(key, []).append(item)
        self._size[key] = self._size.get(key, 0) + len(item.queries)
        self._terms[key] = self._terms.get(key, 0) + item.terms
        if self._size[key] >= self.max_batch or (self.max_terms is not None and self._terms[key] >= self.max_terms):
            self._flush(key, search_fn)
        elif key not in self._timers:
            self._timers[key] = loop.call_later(self.window_s, self._flush, key, search_fn)
        return await fut

    def _flush(self, key: Hashable, search_fn: SearchFn) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        items = self._pending.pop(key, [])
        self._size.pop(key, None)
        self._terms.pop(key, None)
        if items:
            self.batches += 1
            asyncio.get_running_loop().create_task(self._run(items, search_fn))

    async def _run(self, items: list[_Pending], search_fn: SearchFn) -> None:
        queries = [q for it in items for q in it.queries]
        wheres = [w for it in items for w in it.wheres]
        k = max(it.k for it in items)
        loop = asyncio.get_running_loop()
        inline = items[0].inline
        t0 = loop.time()
        try:
            rows = await _call(inline, search_fn, queries, k, wheres)
        except Exception as e:  # noqa: BLE001 - handed to the waiting request
            if len(items) == 1:
                if not items[0].future.done():
                    items[0].future.set_exception(e)
                return
            # one request's bad input must not fail the others: run each alone
            for it in items:
                try:
                    res = await _call(inline, search_fn, it.queries, it.k, it.wheres)
                except Exception as e1:  # noqa: BLE001 - handed to the waiting request
                    if not it.future.done():
                        it.future.set_exception(e1)
                else:
                    if not it.future.done():
                        it.future.set_result(res)
            return
        if self.on_batch is not None:
            self.on_batch(len(queries), len(items), loop.time() - t0)
        pos = 0
        for it in items:
            n = len(it.queries)
            if not it.future.done():
                it.future.set_result([r[: it.k] for r in rows[pos:pos + n]])
            pos += n


async def _call(inline: bool, fn: SearchFn, queries: list[str], k: int, wheres: list[Any]):
    if inline:
        return fn(queries, k, wheres)
    return await asyncio.to_thread(fn, queries, k, wheres)
