"""`ShardedMemory`: the :class:`~gpuir.memory.Memory` API over Ray actors, exact across shards.

The coordinator (this object, in the caller's process) owns the directory's
lock and talks to one actor per shard (:class:`~gpuir.cluster.shard.ShardServer`,
a ``Memory`` directory behind a write-ahead log).

**Exact.** Every search returns what one ``Memory`` holding the same records,
added in the same order, returns: the same ids, the same float32 scores bit for
bit, the same order. Three things make it so:

* *Global statistics.* The coordinator keeps every shard's N, total length and
  df (:class:`~gpuir.cluster.globalstats.GlobalStats`), updated from each
  write's answer (the shard's change). A search sends each asked shard the
  global N, total length and the global df of its query terms
  (:class:`~gpuir.memory.termstats.TermStats`, a few bytes per term); the
  shard scores with them (``Memory.search(stats=...)``), including the
  bm25l/bm25+ constant over terms it does not hold.
* *Global sequence numbers.* The coordinator numbers every added (or updated)
  record in call order and the shard's memory keeps that number as its own
  sequence number, so each shard's tie order is the global add order, and the
  shards' top-k lists merge by (score descending, sequence ascending) into the
  one memory's top k.
* *Budgets over global partitions.* ``mode="budgeted"`` reads the newest K time
  partitions *of the whole memory*: the coordinator knows each shard's
  partitions and tells each shard how many of its own fall inside.

**Fan-out.** A query goes only to shards that can hold a match: with
``route="tenant"`` a ``where`` naming a tenant asks that tenant's shard only;
with ``route="id"`` a ``where`` naming ids asks their owners only; and a shard
holding none of the query's terms is never asked. Each asked shard gets the
batch's queries for it in one call.

**Transport.** Searches and fetches of a shard on this process's node go over the shard's direct
channel (:mod:`gpuir.cluster.fastpath`: a Unix socket, a fraction of a Ray actor call's round trip);
when it breaks (the shard died) the call is asked over Ray, which waits for the restart. Everything
else is a Ray actor call.

**Durable.** A write returns once every owning shard has logged it (``fsync``)
and applied it. A shard that dies during a write is restarted by Ray
(``max_restarts``) from its directory and log; the coordinator waits for it
(``restart_timeout``), resends the write (the write id makes a logged write
count once) and re-reads the shard's statistics. A search that meets a dead
shard waits for the restart and asks again, or raises
:class:`ShardUnavailableError`; it never returns a partial answer.

**Consistent.** Writes hold the coordinator exclusively and searches share it,
so a search sees every shard at one state and the statistics of that state.

**BM25 only** (:data:`NO_HYBRID`). ``search(..., ranking="hybrid")`` is
refused: the shards store no vectors (no embeddings: the write payloads carry
none, and there is no vector search to merge), and the hybrid ranking needs
every record's stored vector. Everything else it needs would be exact on the
coordinator as it is for BM25 -- the global BM25 top list, how many records
each question may see (``count``), the fusion and the relevance map -- so
hybrid over shards needs vectors in the shards first: an encoder on the
coordinator, encoding each write's batch in one call as one memory does (a
MiniLM vector depends in its last bits on the batch it was encoded in, up to
1e-7 here, so shards encoding their own parts of a batch would not give one
memory's scores), vectors in the write payloads (and for the records an update
moves), each shard's memory created with the embedding, an exact cosine top
list per shard merged by (score, add order), and the stored vectors of the
fused hits fetched from their shards.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..memory import Memory, RecordError, UnknownIdError, bulk, updates
from ..memory import scope as _scope
from ..memory.durable import check_durability
from ..memory.history import canonical_entries
from ..memory.hitorder import merge_topk
from ..memory.hybrid import check_ranking
from ..memory.intake import canonical_records, fold_expiry, to_batch
from ..memory.records import MISSING_TIME, RecordBatch, id_list, normalize_records
from ..memory.searchargs import check_search_args
from ..memory.snapshot import thread_analyzer
from ..memory.termstats import TermStats
from ..memory.where import compile_wheres
from ..storage.dirlock import WriterLock, check_path, claim_dir
from . import layout, runtime
from .globalstats import GlobalStats
from .routing import owners, search_targets, shard_of
from .shard import write_payload

log = logging.getLogger("gpuir.cluster")

#: Why a sharded memory refuses ``ranking="hybrid"`` (module docstring, "BM25 only"); callers add what to do.
NO_HYBRID = ("a sharded memory ranks by BM25 only: its shards store no vectors (a sharded memory keeps no "
             "embeddings, and has no vector search to merge), and the hybrid ranking needs every record's stored "
             "vector -- the rest of it (global BM25, the records each question may see, the fusion) would be exact "
             "on the coordinator; the vectors are what is missing")

#: Memory settings a sharded memory passes to each shard's ``Memory``.
MEMORY_OPTIONS = ("analyzer", "method", "k1", "b", "delta", "partition_days", "merge_factor", "merge_min")


class ShardUnavailableError(RuntimeError):
    """A shard did not answer in time (dead and not restarted, or hung): nothing partial was returned."""


class ShardFailedError(RuntimeError):
    """A shard stopped accepting writes after an internal error (restart it: its log holds every write)."""


def memory_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    """``Memory(**kwargs)`` arguments from a ``Memory.config()`` dict."""
    bm = config["bm25"]
    return {"analyzer": config["analyzer"], "method": bm["method"], "k1": bm["k1"], "b": bm["b"],
            "delta": bm["delta"], "partition_days": config["partition_days"], "merge_factor": config["merge_factor"],
            "merge_min": config["merge_min"], "record_times": False}  # (a sharded memory keeps no record times)


class _RWLock:
    """Many readers or one writer (writers are not starved: a waiting writer stops new readers)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting = 0

    @contextmanager
    def reading(self):
        with self._cond:
            while self._writer or self._waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def writing(self):
        with self._cond:
            self._waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


@dataclass
class Merged:
    """Each question's final top k, merged from the shards' answers (:func:`merge_answers`).

    Attributes
    ----------
    seqs : ndarray, shape (B, k), int64, host
        Global sequence numbers, -1 pads.
    scores : ndarray, shape (B, k), float32, host
        -inf pads.
    seq, score, group, shard, row, record_of : ndarrays, shape (n,), host
        The n hits kept, question by question in final order: sequence number (int64),
        score (float32), question, the shard that holds it, the question's row in
        that shard's answer, and its index in that answer's inline records (-1: to fetch).
    """

    seqs: np.ndarray
    scores: np.ndarray
    seq: np.ndarray
    score: np.ndarray
    group: np.ndarray
    shard: np.ndarray
    row: np.ndarray
    record_of: np.ndarray


def merge_answers(B: int, k: int, asked: Mapping[int, Sequence[int]], got: Mapping[int, Mapping[str, Any]],
                  ties: str = "oldest", order_by: str = "score") -> Merged:
    """Merge the shards' query-phase answers into each question's top k, vectorised (one sort for the batch).

    Parameters
    ----------
    B, k : int
        Questions in the batch; the width of the result (already min(k, N)).
    asked : dict shard -> the questions asked of it (positions in the batch), in the order sent
    got : dict shard -> its answer (:meth:`ShardServer.search <gpuir.cluster.shard.ShardServer.search>`):
        ``seqs`` (b, k') int64, ``scores`` (b, k') float32, ``times`` (b, k') int64, ``records`` {row: hits}
        for the rows asked of that shard alone
    ties, order_by : the tie rule and the order of the kept hits (:mod:`gpuir.memory.hitorder`)

    Returns
    -------
    Merged
    """
    sq, sc, tm, grp, sh, rw, col = [], [], [], [], [], [], []
    for s, qis in asked.items():
        a = got[s]
        ok = a["seqs"] >= 0
        r, c = np.nonzero(ok)
        sq.append(a["seqs"][ok])
        sc.append(a["scores"][ok])
        tm.append(a["times"][ok])
        grp.append(np.asarray(qis, dtype=np.int64)[r])
        sh.append(np.full(r.size, s, dtype=np.int64))
        rw.append(r)
        col.append(c)

    def cat(xs: list[np.ndarray], dtype) -> np.ndarray:
        return np.concatenate(xs).astype(dtype, copy=False) if xs else np.zeros(0, dtype)

    seq, score, times = cat(sq, np.int64), cat(sc, np.float32), cat(tm, np.int64)
    group, shard, row, column = cat(grp, np.int64), cat(sh, np.int64), cat(rw, np.int64), cat(col, np.int64)
    keep, place = merge_topk(seq, score, times, group, k, ties, order_by)
    seqs = np.full((B, k), -1, dtype=np.int64)
    scores = np.full((B, k), -np.inf, dtype=np.float32)
    seqs[group[keep], place] = seq[keep]
    scores[group[keep], place] = score[keep]
    inline = np.zeros(keep.size, dtype=bool)
    if keep.size:
        for s in asked:
            recs = got[s].get("records") or {}
            if recs:
                rows = np.fromiter(recs.keys(), dtype=np.int64, count=len(recs))
                inline |= (shard[keep] == s) & np.isin(row[keep], rows)
    record_of = np.where(inline, column[keep], -1)
    return Merged(seqs, scores, seq[keep], score[keep], group[keep], shard[keep], row[keep], record_of)


@dataclass
class ShardedResults:
    """Top-k records of a batch of queries over a sharded memory.

    Attributes
    ----------
    seqs : ndarray, shape (B, k), int64, host
        Global sequence number (add order) of each hit, best first; -1 pads.
    scores : ndarray, shape (B, k), float32, host
        -inf at padding.
    meta : dict
        ``shards_asked`` (list of B lists of shard numbers), ``timings``.
    """

    seqs: np.ndarray
    scores: np.ndarray
    _hits: list[list[dict[str, Any]]]  # each question's records as stored (canonical), best first
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.seqs.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return self.seqs.shape  # type: ignore[return-value]

    def ids(self, i: int) -> list[str]:
        """Record ids of query ``i``'s hits, best first."""
        return [h["id"] for h in self._hits[i]]

    def hits(self, i: int) -> list[dict[str, Any]]:
        """Query ``i``'s hits, best first: dicts with ``id``, ``score``, ``text`` and the record's fields
        (``time`` and ``expires_at`` as ISO 8601 strings), formatted when asked for, as
        :meth:`MemoryResults.hits <gpuir.memory.MemoryResults.hits>` does."""
        from ..memory.timeutil import public_record

        out = []
        for rec, s in zip(self._hits[i], self.scores[i].tolist()):
            r = public_record(dict(rec))
            out.append({"id": r.pop("id"), "score": float(s), **r})
        return out


class ShardedMemory:
    """Records spread over Ray actors, searchable with exact global BM25 (see the module docstring).

    Make one with :meth:`create` or :meth:`open`; close it with :meth:`close`
    (or a ``with`` block).

    Examples
    --------
    >>> from gpuir.cluster import ShardedMemory                       # doctest: +SKIP
    >>> with ShardedMemory.create("/tmp/mem", shards=2) as m:          # doctest: +SKIP
    ...     m.add([{"id": "t1", "text": "Caroline went to the support group", "tenant": "conv-26"}])
    ...     m.search("support group", k=5, where={"tenant": "conv-26"}).ids(0)
    ['t1']
    """

    #: A sharded memory (:class:`gpuir.memory.protocol.MemoryAPI`): ``info()`` holds ``shard_list``.
    sharded = True
    #: How the service stamps adds before logging them (``Memory.stamp``): ids only -- a sharded memory keeps
    #: no record times (issue 36's ``record_times`` is a single memory's option for now).
    stamp = "id"

    def __init__(self, root: Path, manifest: dict[str, Any], lock: WriterLock, started_ray: bool,
                 restart_timeout: float, call_timeout: float):
        self._path = root
        self.manifest = manifest
        self.route: str = manifest["route"]
        self.n_shards: int = int(manifest["shards"])
        self._config: dict[str, Any] = manifest["memory"]
        self._window_ms = self._config.get("window_ms")
        self._lock = lock
        self._started_ray = started_ray
        self.restart_timeout = float(restart_timeout)
        self.call_timeout = float(call_timeout)
        self._ray = runtime.require_ray()
        self._actors: list[Any] = []
        self._stats = GlobalStats(self.n_shards)
        self._owner: dict[str, int] | None = {} if self.route == "tenant" else None
        self._next_seq = 0
        self._next_wid = 1
        self._rw = _RWLock()
        #: Every write takes it (re-entrant) before the exclusive side of ``_rw``: a scope's check-then-write
        #: (gpuir.memory.scope.Scope) holds it across its reads, as with one Memory's writer lock.
        self._write_lock = threading.RLock()
        self._require_scope = bool(self._config.get("require_scope", False))
        self._guard_scope = self._require_scope
        self._closed = False
        #: Test hook: the fault the next write asks of its first shard ("kill_after_log", "kill_after_apply").
        self._fault: str | None = None
        #: Reads (search, fetch) of a shard on this node go over its direct channel (gpuir.cluster.fastpath);
        #: False: every call over Ray (benchmarks compare the two).
        self.fast_path = os.environ.get("GPUIR_SHARD_FASTPATH", "1") != "0"
        self._fast: dict[int, Any] = {}  # shard -> FastClient (or None: not on this node)
        self._fast_lock = threading.Lock()
        #: Bytes sent for statistics: writes' deltas received, searches' statistics sent (for benchmarks).
        self.exchange = {"write_delta_bytes": 0, "writes": 0, "search_stats_bytes": 0, "search_calls": 0}

    # ------------------------------------------------------------------ making one
    @classmethod
    def create(cls, path: str | os.PathLike, shards: int = 2, route: str = "tenant", address: str | None = None, *,
               device: str = "auto", checkpoint_every: int = 10_000, max_restarts: int = -1,
               restart_timeout: float = 120.0, call_timeout: float = 600.0, lock_timeout: float = 10.0,
               durability: str = "fsync", require_scope: bool = False, **memory_options: Any) -> ShardedMemory:
        """Create a sharded memory in a new (or empty) directory and start its shards.

        Parameters
        ----------
        path : the directory (created; must be new or empty)
        shards : int
            Number of shards (fixed for the memory's life).
        route : {"tenant", "id"}
            Place records by a hash of their tenant (a tenant's search asks one
            shard) or of their id (see :mod:`gpuir.cluster.routing`).
        address : None, "auto" or "HOST:PORT"
            None starts a local Ray runtime on loopback (see :mod:`gpuir.cluster.runtime`).
        device : {"auto", "gpu", "cpu"}
            "gpu": one GPU per shard (``num_gpus=1``; the engine's "auto" then
            picks CuPy); "auto": GPUs when the runtime has one per shard, else CPU workers.
        checkpoint_every : int
            Logged records after which a shard folds its memory's log (a save).
        durability : {"fsync", "flush", "none"}
            What a write has done on each owning shard when it returns: the level of
            the shard's memory's log (:mod:`gpuir.memory.durable`; kept for the memory's life).
        max_restarts : int
            Restarts Ray makes of a dead shard (-1: without limit).
        restart_timeout : float
            Seconds a call waits for a dead shard to come back before :class:`ShardUnavailableError`.
        call_timeout : float
            Seconds any one shard call may take.
        lock_timeout : float
            Seconds to wait for the directory's (or a shard's) writer lock.
        require_scope : bool
            Refuse every unscoped read and write of records (:class:`~gpuir.memory.scope.ScopeError`), as
            ``Memory(require_scope=True)``: the memory is then used through :meth:`scope`. Saved in the
            manifest (the coordinator enforces it; the shards' memories do not hold it).
        **memory_options
            ``Memory`` settings: analyzer, method, k1, b, delta, partition_days, merge_factor, merge_min.
        """
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards must be a positive integer, got {shards!r}")
        if route not in layout.ROUTES:
            raise ValueError(f"route must be one of {', '.join(layout.ROUTES)}, got {route!r}")
        bad = [k for k in memory_options if k not in MEMORY_OPTIONS]
        if bad:
            raise TypeError(f"unknown option {bad[0]!r}: the memory options are {', '.join(MEMORY_OPTIONS)}")
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be a positive integer, got {checkpoint_every!r}")
        config = Memory(**memory_options, require_scope=require_scope,
                        record_times=False).config()  # checks the settings (no record times: see ``stamp``)
        check_durability(durability)
        runtime.require_ray()
        root = claim_dir(check_path(path), layout.KIND, mode=0o700)
        lock = WriterLock(root, timeout=lock_timeout)
        lock.__enter__()
        try:
            if layout.is_sharded(root):
                raise layout.MemoryFormatError(f"{root} already holds a sharded memory: open it with "
                                               f"ShardedMemory.open({str(root)!r})")
            stray = sorted(p.name for p in root.iterdir() if not p.name.startswith(".gpuir"))
            if stray:
                raise layout.MemoryFormatError(
                    f"{root} holds {', '.join(stray[:3])} but no {layout.MANIFEST} (an interrupted create?): "
                    "nothing was changed; remove what is there or choose another directory")
            for i in range(shards):  # every shard's memory exists (generation 1) before any actor starts
                m = Memory(**memory_kwargs(config))
                m.save(layout.shard_dir(root, i), lock_timeout=lock_timeout)
                m.close()
            options = {"device": device, "checkpoint_every": checkpoint_every, "max_restarts": max_restarts,
                       "durability": durability}
            manifest = layout.write_manifest(root, shards, route, config, options)
        except BaseException:
            lock.__exit__(None, None, None)
            raise
        return cls._start(root, manifest, lock, address, restart_timeout, call_timeout, lock_timeout)

    @classmethod
    def open(cls, path: str | os.PathLike, address: str | None = None, *, restart_timeout: float = 120.0,
             call_timeout: float = 600.0, lock_timeout: float = 10.0) -> ShardedMemory:
        """Open a sharded memory (in this or a new Ray runtime): shards reopen and replay their logs.

        Raises
        ------
        MemoryFormatError
            No sharded memory there, a damaged manifest, or a shard that cannot start (named).
        StoreLockedError
            Another ShardedMemory has the directory open.
        """
        runtime.require_ray()
        root = check_path(path)
        manifest = layout.read_manifest(root)
        lock = WriterLock(root, timeout=lock_timeout)
        lock.__enter__()
        return cls._start(root, manifest, lock, address, restart_timeout, call_timeout, lock_timeout)

    @classmethod
    def _start(cls, root: Path, manifest: dict[str, Any], lock: WriterLock, address: str | None,
               restart_timeout: float, call_timeout: float, lock_timeout: float) -> ShardedMemory:
        started = False
        self = None
        try:
            started = runtime.connect(address)
            self = cls(root, manifest, lock, started, restart_timeout, call_timeout)
            opts = manifest.get("options", {})
            S = self.n_shards
            device = opts.get("device", "auto")
            gpus = runtime.cluster_gpus()
            if device == "gpu" and gpus < S:
                raise ValueError(f"device='gpu' needs one GPU per shard ({S}), the Ray runtime has {gpus}: "
                                 "use fewer shards, more GPUs, or device='cpu'")
            gpu = device == "gpu" or (device == "auto" and gpus >= S)
            cpus = min(1.0, runtime.cluster_cpus() / S)
            self.device = "gpu" if gpu else "cpu"
            self._attach([runtime.start_shard(layout.shard_dir(root, i), i, int(opts.get("checkpoint_every", 10_000)),
                                              gpu, cpus, int(opts.get("max_restarts", -1)), lock_timeout,
                                              opts.get("durability", "fsync"))
                          for i in range(S)])
            log.info("sharded memory %s: %d shards (%s, route %s), %d records", root, S, self.device, self.route,
                     len(self))
            return self
        except BaseException:
            if self is not None:
                self._stop_actors()
            lock.__exit__(None, None, None)
            if started:
                runtime.require_ray().shutdown()
            raise

    def _attach(self, actors: list[Any]) -> None:
        """Take the shards' actor handles and read their state (statistics, counters, ids)."""
        self._actors = list(actors)
        syncs = self._gather({s: (lambda s=s: self._actors[s].sync.remote(self.route == "tenant"))
                              for s in range(self.n_shards)}, what="start")
        for s, sy in syncs.items():
            self._take_sync(s, sy)
        self._next_seq = max([sy["next_seq"] for sy in syncs.values()], default=0)
        self._next_wid = max([sy["last_wid"] for sy in syncs.values()], default=0) + 1
        self._drop_stale_copies(syncs)

    def _drop_stale_copies(self, syncs: dict[int, dict[str, Any]]) -> None:
        """Delete the older copy of a record found on two shards (a tenant move cut short by a crash)."""
        if self._owner is None:
            return
        best: dict[str, tuple[int, int]] = {}
        stale: dict[int, list[str]] = {}
        for s, sy in syncs.items():
            for rid, q in zip(sy.get("ids", ()), sy.get("seqs", ())):
                if rid in best:
                    q0, s0 = best[rid]
                    loser = s if q < q0 else s0
                    stale.setdefault(loser, []).append(rid)
                    if q > q0:
                        best[rid] = (q, s)
                else:
                    best[rid] = (q, s)
        if not stale:
            return
        log.warning("sharded memory %s: %d record(s) found on two shards (a tenant move cut short); "
                    "deleting the older copies", self._path, sum(len(g) for g in stale.values()))
        wid = self._wid()
        self._write({s: write_payload("delete", wid, ids=g) for s, g in stale.items()})
        for rid, (_, s) in best.items():
            self._owner[rid] = s

    def _take_sync(self, s: int, sy: dict[str, Any]) -> None:
        self._stats.replace(s, sy)
        if self._owner is not None and "ids" in sy:
            for rid in [r for r, o in self._owner.items() if o == s]:
                del self._owner[rid]
            for rid in sy["ids"]:
                self._owner[rid] = s

    # ------------------------------------------------------------------ calls
    def _shard_error(self, s: int, e: BaseException, what: str) -> ShardUnavailableError:
        return ShardUnavailableError(
            f"shard {s} ({layout.shard_dir(self._path, s)}) did not answer ({what}): {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}. Nothing partial was returned; its log holds every "
            "acknowledged write (reopen the memory once the cause is fixed)")

    def _wait_ready(self, s: int, what: str) -> None:
        """Wait until shard ``s`` answers again (Ray restarts it), at most ``restart_timeout`` seconds."""
        ray = self._ray
        deadline = time.monotonic() + self.restart_timeout
        died = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._shard_error(s, TimeoutError(f"not back after {self.restart_timeout:g} s"), what)
            try:
                ray.get(self._actors[s].ping.remote(), timeout=left)
                return
            except ray.exceptions.ActorUnavailableError:  # restarting: calls wait for it, or fail at once
                time.sleep(0.05)
            except ray.exceptions.ActorDiedError as e:  # dead for good (or just noticed): a few tries
                died += 1
                if died > 3:
                    raise self._shard_error(s, e, what) from None
                time.sleep(0.2)
            except ray.exceptions.GetTimeoutError as e:
                raise self._shard_error(s, e, what) from None

    def _gather(self, calls: dict[int, Any], what: str) -> dict[int, Any]:
        """Run one idempotent call per shard at once; a shard that died is waited for and asked again (up to
        twice, as a write is resent: a shard may die again while it restarts)."""
        ray = self._ray
        refs = {s: f() for s, f in calls.items()}
        out: dict[int, Any] = {}
        for s, ref in refs.items():
            for attempt in range(3):
                try:
                    out[s] = ray.get(ref, timeout=self.call_timeout)
                    break
                except ray.exceptions.RayActorError as e:
                    if attempt == 2:
                        raise self._shard_error(s, e, what) from None
                    log.warning("shard %d died during %s; waiting for its restart", s, what)
                    self._wait_ready(s, what)
                    ref = calls[s]()
                except ray.exceptions.GetTimeoutError as e:
                    raise self._shard_error(s, e, what) from None
        return out

    def _fast_client(self, s: int) -> Any:
        """Shard ``s``'s direct channel (:mod:`gpuir.cluster.fastpath`), None when it runs on another node
        (or the channel is off); asked for over Ray once per life of the shard's process."""
        if not self.fast_path:
            return None
        c = self._fast.get(s, False)
        if c is None or (c is not False and not c.broken):
            return c
        from .fastpath import FastClient

        with self._fast_lock:
            c = self._fast.get(s, False)
            if c is None or (c is not False and not c.broken):
                return c
            ray = self._ray
            try:
                node, path, token = ray.get(self._actors[s].fast_address.remote(), timeout=self.call_timeout)
                here = ray.get_runtime_context().get_node_id()
            except Exception as e:  # noqa: BLE001 - (a shard restarting, a runtime without it): asked over Ray
                log.debug("shard %d: no direct channel (%s: %s)", s, type(e).__name__, e)
                return None  # asked again next time
            c = FastClient(path, token, self.call_timeout) if node is not None and node == here and os.path.exists(
                path) else None
            self._fast[s] = c
            return c

    def _read(self, method: str, args_of: dict[int, tuple], what: str | None = None) -> dict[int, Any]:
        """``method(*args)`` on each shard at once (reads: ``search``, ``fetch``): over a shard's direct
        channel when it has one, else (or when the channel fails: the shard died) over Ray, which waits for
        the shard's restart and asks again (:meth:`_gather`)."""
        what = what or method
        slow: dict[int, tuple] = {}
        sent: dict[int, tuple[Any, Any]] = {}
        from .fastpath import ChannelBroken

        for s, args in args_of.items():
            try:
                c = self._fast_client(s)
                if c is not None:
                    sent[s] = (c, c.start(method, args))
                    continue
            except ChannelBroken:  # asked again over Ray below
                pass
            slow[s] = args
        refs = {s: (lambda s=s, a=a: getattr(self._actors[s], method).remote(*a)) for s, a in slow.items()}
        out: dict[int, Any] = {}
        for s, (c, sock) in sent.items():
            try:
                out[s] = c.finish(sock)
            except ChannelBroken:
                log.warning("shard %d's direct channel closed during %s; asking over Ray", s, what)
                refs[s] = (lambda s=s, a=args_of[s]: getattr(self._actors[s], method).remote(*a))
            except TimeoutError as e:
                raise self._shard_error(s, e, what) from None
        if refs:
            out.update(self._gather(refs, what))
        return out

    def _write(self, parts: dict[int, bytes]) -> dict[int, dict[str, Any]]:
        """Send one write's payload to each owning shard; returns their answers (errors raised).

        A shard that dies is waited for; the write is resent with the same write
        id (counted once) and the shard's statistics are read again whole.
        """
        ray = self._ray
        fault, self._fault = self._fault, None
        refs = {s: self._actors[s].write.remote(p, fault if i == 0 else None) for i, (s, p) in enumerate(parts.items())}
        answers: dict[int, dict[str, Any]] = {}
        failed: list[tuple[int, BaseException]] = []
        for s, ref in refs.items():
            try:
                ans = ray.get(ref, timeout=self.call_timeout)
            except ray.exceptions.RayActorError:
                log.warning("shard %d died during a write; waiting for its restart, then resending it", s)
                try:
                    for attempt in range(3):
                        self._wait_ready(s, "write")
                        try:
                            ans = ray.get(self._actors[s].write.remote(parts[s]), timeout=self.call_timeout)
                            break
                        except ray.exceptions.RayActorError:
                            if attempt == 2:
                                raise
                    sy = self._gather({s: lambda s=s: self._actors[s].sync.remote(self.route == "tenant")}, "resync")
                    self._take_sync(s, sy[s])
                    ans = dict(ans, resynced=True)
                except Exception as e:  # noqa: BLE001 - reported below, after the other shards' answers
                    failed.append((s, e))
                    continue
            except ray.exceptions.GetTimeoutError as e:
                failed.append((s, e))
                continue
            answers[s] = ans
        errors = [(s, a["error"]) for s, a in answers.items() if "error" in a]
        for s, a in answers.items():
            if "error" not in a and not a.get("resynced") and not a.get("replayed"):
                self._stats.apply(s, a)
            if "error" not in a:
                self.exchange["write_delta_bytes"] += 16 + sum(len(t.encode()) + 8 for t in a.get("terms", ()))
        self.exchange["writes"] += 1
        if failed:
            s, e = failed[0]
            done = sorted(s2 for s2, a in answers.items() if "error" not in a)
            err = self._shard_error(s, e, "write")
            raise ShardUnavailableError(f"{err} The write is durable on shard(s) {done or 'none'}; on shard {s} it "
                                        "may or may not be: check its records with get() once it is back") from None
        if errors:
            s, (kind, msg, ids) = errors[0]
            if kind == "exists":
                raise RecordError(msg)
            if kind == "unknown":
                raise UnknownIdError(list(ids), msg)
            if kind == "failed":
                raise ShardFailedError(msg)
            raise ValueError(msg)
        return answers

    def _wid(self) -> int:
        w = self._next_wid
        self._next_wid += 1
        return w

    # ------------------------------------------------------------------ routing
    def _owners_of_batch(self, batch: RecordBatch) -> list[int]:
        return owners(batch.ids, batch.strings["tenant"], self.route, self.n_shards)

    def _owner_of_id(self, rid: str) -> int | None:
        if self._owner is not None:
            return self._owner.get(rid)
        return shard_of(rid, self.n_shards)

    def _present(self, ids: list[str]) -> dict[str, int]:
        """id -> owning shard of the ids that name live records (asks the owners with ``route="id"``)."""
        if self._owner is not None:
            return {rid: self._owner[rid] for rid in ids if rid in self._owner}
        groups: dict[int, list[str]] = {}
        for rid in ids:
            groups.setdefault(shard_of(rid, self.n_shards), []).append(rid)
        got = self._gather({s: (lambda s=s, g=g: self._actors[s].has.remote(g)) for s, g in groups.items()}, "lookup")
        return {rid: s for s, g in groups.items() for rid, ok in zip(g, got[s]) if ok}

    # ------------------------------------------------------------------ writes
    def add(self, records: Iterable[Mapping[str, Any]] | RecordBatch, time_unit: str | None = None,
            vectors: Mapping[str, Any] | None = None) -> int:
        """Add new records (see :meth:`Memory.add <gpuir.memory.Memory.add>`); atomic for the batch.

        Returns once every owning shard has logged (``fsync``) and applied them.

        Raises
        ------
        RecordError
            A malformed record, or an id that already exists (nothing is added).
        ScopeError
            A memory made with ``require_scope=True``, used without a scope.
        ShardUnavailableError
            An owning shard did not come back (the message says where the write is durable).
        """
        self._guard("add")
        if vectors:
            raise ValueError("a sharded memory keeps no embeddings: add records without vectors")
        batch = records if isinstance(records, RecordBatch) else to_batch(records, time_unit)
        n = len(batch)
        if not n:
            return 0
        with self._write_lock, self._rw.writing():
            self._check_open()
            own = self._owners_of_batch(batch)
            groups: dict[int, list[int]] = {}
            for i, s in enumerate(own):
                groups.setdefault(s, []).append(i)
            if self._owner is not None or len(groups) > 1:  # one shard checks its ids itself, atomically
                clash = self._present(list(batch.ids))
                if clash:
                    first = next(i for i, rid in enumerate(batch.ids) if rid in clash)
                    raise RecordError(f"{batch.label(first)}: the id already exists ({len(clash)} such record(s)); "
                                      "use update() to replace records")
            seqs = np.arange(self._next_seq, self._next_seq + n, dtype=np.int64)
            parts = self._encode("add", batch, seqs, groups)
            self._next_seq += n
            self._write(parts)
            if self._owner is not None:
                for s, rows in groups.items():
                    for i in rows:
                        self._owner[batch.ids[i]] = s
            return n

    def _encode(self, op: str, batch: RecordBatch, seqs: np.ndarray, groups: dict[int, list[int]]) -> dict[int, bytes]:
        """Each shard's log payload (every one encoded before anything is sent: a record the log cannot hold
        fails the whole call, nothing written)."""
        parts = {}
        wid = self._wid()
        for s, rows in groups.items():
            sub = batch if len(groups) == 1 else batch.take(rows)
            try:
                parts[s] = write_payload(op, wid, batch=sub, seqs=seqs[rows])
            except (ValueError, TypeError) as e:
                raise RecordError(f"a record cannot be written to the log: {e}") from None
        return parts

    def update(self, records: Iterable[Mapping[str, Any]] | RecordBatch, replace: bool = False,
               time_unit: str | None = None) -> int:
        """Change existing records, keeping what the records given do not name (see :meth:`Memory.update
        <gpuir.memory.Memory.update>` and :mod:`gpuir.memory.updates`); atomic.

        The coordinator reads the stored versions from their shards, merges the
        records given into them, and writes the changed ones as whole new versions
        (each takes the newest place in the add order; a record left as it was is
        not written). With ``route="tenant"``, a record whose tenant changes moves
        to its new tenant's shard (deleted from one shard, added to the other; its
        history stays behind on the old shard, where the new one does not read it).

        Returns
        -------
        int: the number of records changed (one left as it was counts 0, as in :meth:`Memory.update`).

        Raises
        ------
        RecordError, UnknownIdError
            A malformed record or merged result; an id naming no record (nothing is changed).
        """
        return self._put(records, replace, time_unit, "update")

    def replace(self, records: Iterable[Mapping[str, Any]], time_unit: str | None = None) -> int:
        """Replace existing records (matched by id) by the records given, whole (see :meth:`update`)."""
        return self._put(records, True, time_unit, "replace")

    def upsert(self, records: Iterable[Mapping[str, Any]], replace: bool = False, time_unit: str | None = None) -> int:
        """Update the records whose ids exist (merging, or replacing with ``replace``) and add the others."""
        return self._put(records, replace, time_unit, "upsert")

    def _put(self, records: Any, replace: bool, time_unit: str | None, what: str) -> int:
        self._guard(what)
        if isinstance(records, RecordBatch):  # validated columns: whole records
            records = [records.record(i) for i in range(len(records))]
            replace, time_unit = True, "ms"
        patches = canonical_records(records, time_unit)
        ids = updates.check_ids(patches, what)
        if not ids:
            return 0
        with self._write_lock, self._rw.writing():
            self._check_open()
            groups_old: dict[int, list[str]] = {}  # where each id can live: its owner (tenant map or id hash)
            for rid in ids:
                s_old = self._owner_of_id(rid)
                if s_old is not None:
                    groups_old.setdefault(s_old, []).append(rid)
            got = self._gather({s: (lambda s=s, g=g: self._actors[s].stored.remote(g)) for s, g in groups_old.items()},
                               "read for update")
            current = {rid: rec for s in got for rid, rec in got[s].items()}
            have = {rid: s for s in got for rid in got[s]}
            if what != "upsert":
                unknown = [rid for rid in ids if rid not in have]
                if unknown:
                    raise UnknownIdError(unknown, what)
            new, labels, replaced, _ = updates.plan(patches, current, replace)
            if not new:  # nothing changes (as Memory.update: 0)
                return 0
            batch = normalize_records(fold_expiry(new), labels=labels)
            n = len(batch)
            own = self._owners_of_batch(batch)
            groups: dict[int, list[int]] = {}
            for i, s in enumerate(own):
                groups.setdefault(s, []).append(i)
            was = {rid: have[rid] for rid in replaced}
            moved: dict[int, list[str]] = {}  # old shard -> ids whose tenant moved them (route "tenant")
            for rid, s_new in zip(batch.ids, own):
                if rid in was and was[rid] != s_new:
                    moved.setdefault(was[rid], []).append(rid)
            seqs = np.arange(self._next_seq, self._next_seq + n, dtype=np.int64)
            # a moved record is added on its new shard (an upsert there) before its old version is deleted:
            # a crash between the two leaves both versions, never neither; the next open keeps the newer
            parts = self._encode("upsert" if moved or what == "upsert" else "update", batch, seqs, groups)
            self._next_seq += n
            self._write(parts)
            if moved:
                wid = self._wid()
                self._write({s: write_payload("delete", wid, ids=g) for s, g in moved.items()})
            if self._owner is not None:
                for rid, s in zip(batch.ids, own):
                    self._owner[rid] = s
            return n  # the records changed (as Memory.update: one left as it was counts 0)

    def import_(self, path: str | os.PathLike, vectors: dict | None = None, replace: bool = False,
                check_config: bool = True) -> int:
        """Add the records of an export file (:meth:`Memory.export <gpuir.memory.Memory.export>`'s format),
        all or none, and their histories (see :meth:`Memory.import_ <gpuir.memory.Memory.import_>`).

        The records are written as one add (or, with ``replace``, one upsert): durable
        in the shards' logs when this returns. The histories go to the shards holding
        their records, each of which then checkpoints (histories are kept in a
        memory's files, not in the log).

        Parameters
        ----------
        vectors : dict, optional
            Filled with id -> ndarray (dim,), float32 of the records that carry a vector
            (a sharded memory keeps no embeddings).
        replace : bool
            Records whose ids exist replace them (default: an existing id is an error, nothing is added).
        check_config : bool
            Refuse a file exported from a memory with another analyzer or BM25 settings.

        Returns
        -------
        int: the number of records imported.
        """
        from ..memory.export import check_config as check_export_config
        from ..memory.export import read_export

        header, recs, labels, vecs, hists = read_export(path)
        if check_config:
            check_export_config(path, header, self.config(), "Pass check_config=False to import it anyway")
        canon = canonical_records(recs, None, labels=labels)
        with self._write_lock, _scope.inside_scope():  # an import is of the whole memory (as Memory.import_)
            return self._import(canon, labels, vecs, hists, vectors, replace)

    def _import(self, canon: list[dict[str, Any]], labels: list[str], vecs: dict, hists: list, vectors: dict | None,
                replace: bool) -> int:
        if replace:  # every record of the file is now as the file has it (as Memory.import_: unchanged ones count)
            self.upsert(canon, replace=True, time_unit="ms")
            n = len(canon)
        else:
            n = self.add(to_batch(canon, "ms", labels=labels))
        if hists:
            with self._rw.writing():
                self._check_open()
                groups: dict[int, list[tuple[str, list[dict[str, Any]]]]] = {}
                for rid, versions in hists:
                    s = self._owner_of_id(rid)
                    if s is not None:
                        groups.setdefault(s, []).append((rid, canonical_entries(versions)))
                self._gather({s: (lambda s=s, g=g: self._actors[s].restore_history.remote(g))
                              for s, g in groups.items()}, "import histories")
        if vectors is not None:
            vectors.update(vecs)
        return n

    def merge(self, partition: Any = "all") -> int:
        """Merge on demand on every shard (see :meth:`Memory.merge <gpuir.memory.Memory.merge>`); returns the
        merges done. Live records and statistics do not change."""
        with self._rw.reading():  # merges change no live record: searches may go on
            self._check_open()
            got = self._gather({s: (lambda s=s: self._actors[s].merge.remote(partition))
                                for s in range(self.n_shards)}, "merge")
        return sum(got.values())

    def purge_expired(self) -> int:
        """Delete, on every shard, the records whose ``expires_at`` has passed; returns how many."""
        with self._rw.reading():
            self._check_open()
            ids = self._gather({s: (lambda s=s: self._actors[s].expired.remote()) for s in range(self.n_shards)},
                               "purge")
        dead = [rid for g in ids.values() for rid in g]
        with _scope.inside_scope():  # upkeep of the whole memory (as Memory.purge_expired)
            return self.delete(dead, missing_ok=True) if dead else 0

    def delete(self, ids: Iterable[str] | None = None, missing_ok: bool = False, keep_history: bool = True,
               where: Any = None, time_unit: str | None = None) -> int:
        """Delete records by id, or every record passing ``where`` (see :meth:`Memory.delete
        <gpuir.memory.Memory.delete>` and :mod:`gpuir.memory.bulk`).

        ``keep_history`` (the default, as in ``Memory.delete``) keeps each record's history on its shard,
        the deleted version last; False drops it. ``where`` is resolved to the ids of the live records
        passing it on the shards that can hold them (:meth:`match_ids`, under the writer's lock), which
        are then deleted as ids are: one write.

        Raises
        ------
        UnknownIdError
            Unless ``missing_ok``: ids naming no live record (nothing is deleted).
        TypeError, WhereError
            Both ids and ``where``, or neither; an empty or malformed ``where`` (``reset`` deletes everything).
        """
        self._guard("delete")
        if where is not None or ids is None:
            bulk.check_delete_where(ids, where)
            with self._write_lock:  # no write between the match and the delete
                found = self._match(where, time_unit)
                return self.delete(found, missing_ok=True, keep_history=keep_history) if found else 0
        ids = id_list(ids, "delete")
        if not ids:
            return 0
        with self._write_lock, self._rw.writing():
            self._check_open()
            uniq = list(dict.fromkeys(ids))
            if self._owner is not None:  # route "tenant": the coordinator knows every id's shard
                present = {rid: self._owner[rid] for rid in uniq if rid in self._owner}
                if len(present) < len(uniq) and not missing_ok:
                    raise UnknownIdError([rid for rid in uniq if rid not in present], "delete")
                sent_ok = False  # the shards hold every id sent: one missing is an error, not skipped
            else:
                present = {rid: shard_of(rid, self.n_shards) for rid in uniq}
                if len(set(present.values())) == 1:
                    sent_ok = missing_ok  # one shard: it refuses unknown ids itself, atomically
                else:
                    if not missing_ok:
                        have = self._present(uniq)
                        if len(have) < len(uniq):
                            raise UnknownIdError([rid for rid in uniq if rid not in have], "delete")
                    sent_ok = True
            groups: dict[int, list[str]] = {}
            for rid, s in present.items():
                groups.setdefault(s, []).append(rid)
            if not groups:
                return 0
            wid = self._wid()
            answers = self._write({s: write_payload("delete", wid, ids=g, missing_ok=sent_ok, keep_history=keep_history)
                                   for s, g in groups.items()})
            if self._owner is not None:
                for g in groups.values():
                    for rid in g:
                        self._owner.pop(rid, None)
            # a write answered after a restart ("replayed"/"resynced") had its ids checked by then: all of them
            return sum(len(groups[s]) if a.get("replayed") or a.get("resynced") else int(a["n"])
                       for s, a in answers.items())

    # ------------------------------------------------------------------ scopes, bulk deletes
    def _guard(self, what: str) -> None:
        if self._guard_scope:
            _scope.require(what)

    def scope(self, tenant: str | None = None, agent: str | None = None,
              session: str | None = None) -> _scope.Scope:
        """A view confined to a tenant (and/or an agent, a session): every read and write stays inside it,
        and ids are the tenant's own, exactly as :meth:`Memory.scope <gpuir.memory.Memory.scope>`'s
        (:mod:`gpuir.memory.scope`; the same class, over this memory's protocol).

        With ``route="tenant"`` a tenant's scope reads and writes its tenant's shard only.
        """
        return _scope.Scope(self, tenant=tenant, agent=agent, session=session)

    @property
    def require_scope(self) -> bool:
        """Whether unscoped reads and writes of records are refused (``create(require_scope=True)``)."""
        return self._require_scope

    def allow_unscoped(self, allow: bool = True) -> None:
        """Let unscoped reads and writes through in this process (see :meth:`Memory.allow_unscoped
        <gpuir.memory.Memory.allow_unscoped>`); the setting saved stays."""
        self._guard_scope = self._require_scope and not allow

    def _match(self, where: Any, time_unit: str | None) -> list[str]:
        """The ids of the live records passing ``where`` (all without one), in the global add order."""
        w = compile_wheres(where, 1, {}, time_unit)[0]  # a malformed where fails before any shard is asked
        targets = search_targets(w, self.route, self.n_shards)
        with self._rw.reading():
            self._check_open()
            got = self._gather({s: (lambda s=s: self._actors[s].match.remote(where, time_unit)) for s in targets},
                               "match")
        if len(got) == 1:
            return list(next(iter(got.values()))[0])
        ids = [rid for s in got for rid in got[s][0]]
        seqs = np.concatenate([np.asarray(got[s][1], dtype=np.int64) for s in got]) if got else np.zeros(0, np.int64)
        return [ids[i] for i in np.argsort(seqs, kind="stable").tolist()]

    def match_ids(self, where: Any = None, time_unit: str | None = None) -> list[str]:
        """The ids of the live records passing ``where`` (all without one), in add order: what
        ``delete(where=where)`` would delete now (see :meth:`Memory.match_ids <gpuir.memory.Memory.match_ids>`)."""
        self._guard("match_ids")
        return self._match(where, time_unit)

    def reset(self, confirm: bool = False) -> int:
        """Delete every record, and every history kept after a delete; the settings stay (see
        :meth:`Memory.reset <gpuir.memory.Memory.reset>`).

        Every live id is deleted as :meth:`delete` deletes ids (one write, logged by
        each shard), then each shard forgets its kept histories and checkpoints.

        Parameters
        ----------
        confirm : bool
            Must be True.

        Returns
        -------
        int: the number of records deleted.
        """
        bulk.check_reset(confirm)
        with self._write_lock, _scope.inside_scope():  # a reset is of the whole memory (require_scope allows it)
            self._check_open()
            found = self._match(None, None)
            n = self.delete(found, missing_ok=True, keep_history=False) if found else 0
            with self._rw.writing():
                self._gather({s: (lambda s=s: self._actors[s].forget_histories.remote())
                              for s in range(self.n_shards)}, "reset")
            return n

    def _by_owner(self, ids: Iterable[str]) -> dict[int, list[str]]:
        """The distinct ids grouped by the shard that can hold each (ids no shard holds are left out)."""
        groups: dict[int, list[str]] = {}
        for rid in dict.fromkeys(ids):
            s = self._owner_of_id(rid)
            if s is not None:
                groups.setdefault(s, []).append(rid)
        return groups

    def seqs_of(self, ids: Iterable[str]) -> list[int | None]:
        """The global sequence number of each id, in the order given (None: no live record has it); see
        :meth:`Memory.seqs_of <gpuir.memory.Memory.seqs_of>`."""
        ids = id_list(ids, "seqs_of")
        with self._rw.reading():
            self._check_open()
            groups = self._by_owner(ids)
            got = self._gather({s: (lambda s=s, g=g: self._actors[s].seqs_of.remote(g)) for s, g in groups.items()},
                               "lookup")
        seq = {rid: q for s, g in groups.items() for rid, q in zip(g, got[s]) if q is not None}
        return [seq.get(rid) for rid in ids]

    def stored(self, ids: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
        """(ids, their records as stored: canonical, times in epoch ms) of live ids; KeyError for an id that
        is not live (see :meth:`Memory.stored <gpuir.memory.Memory.stored>`)."""
        ids = list(ids)
        if not ids:
            return [], []
        with self._rw.reading():
            self._check_open()
            groups = self._by_owner(ids)
            got = self._gather({s: (lambda s=s, g=g: self._actors[s].stored.remote(g)) for s, g in groups.items()},
                               "read")
        found = {rid: rec for s in got for rid, rec in got[s].items()}
        missing = [rid for rid in ids if rid not in found]
        if missing:
            raise KeyError(missing[0])
        return ids, [found[rid] for rid in ids]

    # ------------------------------------------------------------------ reads
    def get(self, ids: Iterable[str], missing_ok: bool = False) -> list[dict[str, Any] | None]:
        """The records with these ids, in the order given (see :meth:`Memory.get <gpuir.memory.Memory.get>`)."""
        self._guard("get")
        ids = id_list(ids, "get")
        with self._rw.reading():
            self._check_open()
            groups = self._by_owner(ids)
            got = self._gather({s: (lambda s=s, g=g: self._actors[s].get.remote(g)) for s, g in groups.items()}, "get")
        found = {rid: rec for s, g in groups.items() for rid, rec in zip(g, got[s]) if rec is not None}
        unknown = [rid for rid in ids if rid not in found]
        if unknown and not missing_ok:  # as Memory.get: an id given twice is named twice
            raise UnknownIdError(unknown, "get")
        return [dict(found[rid]) if rid in found else None for rid in ids]

    def contains(self, ids: Iterable[str]) -> list[bool]:
        """Whether each id names a live record (one call per owning shard with ``route="id"``)."""
        ids = id_list(ids, "contains")
        with self._rw.reading():
            self._check_open()
            present = self._present(list(dict.fromkeys(ids)))
        return [rid in present for rid in ids]

    def tenants(self) -> set[str]:
        """The tenants holding live records."""
        with self._rw.reading():
            self._check_open()
            got = self._gather({s: (lambda s=s: self._actors[s].tenants.remote()) for s in range(self.n_shards)},
                               "tenants")
        return {t for names in got.values() for t in names}

    def history(self, id: str) -> list[dict[str, Any]]:
        """A record's earlier versions, oldest first (see :meth:`Memory.history <gpuir.memory.Memory.history>`)."""
        self._guard("history")
        with self._rw.reading():
            self._check_open()
            s = self._owner_of_id(id)
            if s is not None:
                return self._gather({s: lambda: self._actors[s].history.remote(id)}, "history")[s]
            # a deleted record (route "tenant": no owner now) whose history was kept: on one shard
            got = self._gather({s: (lambda s=s: self._actors[s].history.remote(id)) for s in range(self.n_shards)},
                               "history")
            return next((h for _, h in sorted(got.items()) if h), [])

    def _one_shard(self, where: Any, time_unit: str | None, what: str) -> int:
        w = compile_wheres(where, 1, {}, time_unit)[0]
        targets = search_targets(w, self.route, self.n_shards)
        if len(targets) != 1:
            raise ValueError(f"{what} on a sharded memory reads one shard: give a where naming one tenant "
                             "(route 'tenant') or ids on one shard (route 'id')")
        return targets[0]

    def list(self, where: Any = None, order_by: str = "seq", descending: bool = False, limit: int = 100,
             cursor: str | None = None, time_unit: str | None = None) -> Any:
        """A page of records, with the cursor for the next (see :meth:`Memory.list <gpuir.memory.Memory.list>`):
        the page and the cursor one ``Memory`` holding the same records gives.

        From the one shard ``where`` confines them to (a tenant with ``route="tenant"``), else from every
        shard that can hold them: each answers its first ``limit`` records after the cursor with their
        sort keys (global: sequence numbers are the add order), merged by
        :func:`gpuir.memory.listing.merge_pages`.
        """
        from ..memory import listing

        self._guard("list")
        w = compile_wheres(where, 1, {}, time_unit)[0]  # refusals as Memory.list's, before any shard is asked
        fp = listing.fingerprint(where, order_by, descending, time_unit)
        listing.check_list_args(fp, order_by, limit, cursor)
        targets = search_targets(w, self.route, self.n_shards)
        args = (where, order_by, descending, limit, cursor, time_unit)
        with self._rw.reading():
            self._check_open()
            if len(targets) == 1:
                s = targets[0]
                return self._gather({s: lambda: self._actors[s].list.remote(*args)}, "list")[s]
            got = self._gather({s: (lambda s=s: self._actors[s].list_keyed.remote(*args)) for s in targets}, "list")
        return listing.merge_pages([got[s] for s in targets], fp, limit)

    def export(self, path: str | os.PathLike, where: Any = None, history: bool = True,
               time_unit: str | None = None) -> int:
        """Write the records passing ``where`` to a JSON-lines file (:meth:`Memory.export
        <gpuir.memory.Memory.export>`'s format), from the one shard ``where`` confines them to; else ValueError.

        Returns
        -------
        int: the number of records written.
        """
        with self._rw.reading():
            self._check_open()
            s = self._one_shard(where, time_unit, "an export")
            n, data = self._gather({s: lambda: self._actors[s].export.remote(where, history, time_unit)}, "export")[s]
        out = Path(path)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, out)
        return n

    def count(self, where: Any = None, time_unit: str | None = None) -> int:
        """How many live records pass ``where`` (summed over the shards that can hold them)."""
        self._guard("count")
        with self._rw.reading():
            self._check_open()
            w = compile_wheres(where, 1, {}, time_unit)[0]
            targets = search_targets(w, self.route, self.n_shards)
            got = self._gather({s: (lambda s=s: self._actors[s].count.remote(where, time_unit)) for s in targets},
                               "count")
        return sum(got.values())

    def __contains__(self, rid: object) -> bool:
        if not isinstance(rid, str):
            return False
        if self._owner is not None:
            return rid in self._owner
        return bool(self._present([rid]))

    def __len__(self) -> int:
        return self._stats.n_docs

    def len(self) -> int:
        """Number of live records."""
        return len(self)

    def __repr__(self) -> str:
        return (f"ShardedMemory(records={len(self)}, shards={self.n_shards}, route={self.route!r}, "
                f"path={self._path!s})")

    @property
    def path(self) -> Path:
        return self._path

    def config(self) -> dict[str, Any]:
        """The memory settings every shard uses."""
        return dict(self._config)

    def stats(self, queries: str | Sequence[str] = ()) -> TermStats:
        """The global statistics: N, total length and the df of the queries' terms."""
        if isinstance(queries, str):
            queries = [queries]
        an = thread_analyzer(self._config["analyzer"])
        terms = sorted({t for q in queries for t in an(q)})
        with self._rw.reading():
            return self._stats.term_stats(terms)

    def search(self, queries: str | Sequence[str], k: int = 10, where: Any = None, backend: str = "auto",
               mode: str = "exhaustive", max_partitions: int | None = None, epsilon: float | None = None,
               decay: float = 0.5, min_score: float | None = None, ties: str | None = None,
               order_by: str = "score", time_unit: str | None = None, ranking: str | None = None) -> ShardedResults:
        """Top-k records of each query, exactly as one :class:`~gpuir.memory.Memory` would return them.

        Parameters are :meth:`Memory.search <gpuir.memory.Memory.search>`'s
        (``backend`` is each shard's engine: "auto" is the shard's own, CuPy on a shard
        with a GPU of its own, else :func:`gpuir.backends.resolve_memory_backend`'s;
        ``ranking``: None or "bm25", the only one; "hybrid" raises ValueError, :data:`NO_HYBRID`).

        Query then fetch: each asked shard answers its questions' top k under the
        tie rule as arrays (sequence numbers, float32 scores, times), one call per
        shard for the batch; the coordinator merges them under the same rule
        (:func:`merge_answers`, :func:`gpuir.memory.hitorder.merge_topk`), so the k
        kept are the one memory's k (``ties="newest"`` included), orders them by
        time when ``order_by="time"``, and reads the records of those k only (in
        the search's answer for a question asked of one shard; else one ``fetch``
        call per shard holding some: ``meta["fetch_calls"]``).

        Raises
        ------
        ShardUnavailableError
            A shard that must be asked did not answer (nothing partial is returned).
        """
        self._guard("search")
        if ranking is not None and check_ranking(ranking) != "bm25":
            raise ValueError(f"{NO_HYBRID}: search with ranking='bm25' (or none), or use one Memory(ranking='hybrid')")
        t0 = time.perf_counter()
        queries, k, ties, min_score, budget = check_search_args(
            queries, k, mode, max_partitions, epsilon, decay, min_score, ties, order_by, time_unit)
        B = len(queries)
        wheres = compile_wheres(where, B, {}, time_unit)  # checked here: a malformed where fails before any shard is asked
        raw = [None] * B if where is None else ([where] * B if isinstance(where, Mapping) else list(where))
        an = thread_analyzer(self._config["analyzer"])
        qterms = [sorted(set(an(q))) for q in queries]
        allterms = sorted({t for ts in qterms for t in ts})
        pos = {t: i for i, t in enumerate(allterms)}
        t1 = time.perf_counter()
        with self._rw.reading():
            self._check_open()
            st = self._stats
            k = min(k, max(st.n_docs, 1))  # results are min(k, N) wide, as one Memory's
            gdf, per = st.lookup(allterms)
            gkeys = None
            if budget is not None:
                ks = {key for p in st.partitions for key in p}
                gkeys = sorted((x for x in ks if x is not None), reverse=True) + ([None] if None in ks else [])
            asked: dict[int, list[int]] = {}
            budgets: dict[int, list[int | None]] = {}
            targets_of: list[list[int]] = []
            for qi in range(B):
                idx = np.asarray([pos[t] for t in qterms[qi]], dtype=np.int64)
                targets: list[int] = []
                if idx.size and (gdf[idx] > 0).any():
                    cand = search_targets(wheres[qi], self.route, self.n_shards)
                    targets = [s for s in cand if (per[s, idx] > 0).any()]
                    if gkeys is not None:
                        w = wheres[qi]
                        allowed = {x for x in [x for x in gkeys if w is None or w.may_match_partition(
                            x, self._window_ms)][:budget]}
                        counts = {s: sum(1 for x in st.partitions[s] if x in allowed) for s in targets}
                        targets = [s for s in targets if counts[s]]
                for s in targets:
                    asked.setdefault(s, []).append(qi)
                    budgets.setdefault(s, []).append(counts[s] if gkeys is not None else None)
                targets_of.append(targets)
            calls = {}
            for s, qis in asked.items():
                terms = sorted({t for qi in qis for t in qterms[qi]})
                # version: the state (writes so far); a shard reuses its restated snapshot for that state
                ts = TermStats(st.n_docs, st.total_len, {t: int(gdf[pos[t]]) for t in terms}, version=self._next_wid)
                self.exchange["search_stats_bytes"] += 16 + sum(len(t.encode()) + 8 for t in terms)
                self.exchange["search_calls"] += 1
                final = [len(targets_of[qi]) == 1 for qi in qis]  # asked alone: its top k is the answer
                calls[s] = ([queries[i] for i in qis], k, [raw[i] for i in qis], mode, budgets[s], ts, backend, ties,
                            min_score, time_unit, final)
            t2 = time.perf_counter()
            got = self._read("search", calls)
            t3 = time.perf_counter()
            seqs, scores, hits, fetched = self._merge_fetch(B, k, asked, got, ties, order_by)
        return ShardedResults(seqs, scores, hits, {
            "shards_asked": targets_of, "mode": mode, "max_partitions": budget, "ties": ties,
            "fetch_calls": fetched,
            "timings": {"plan_s": t2 - t0, "shards_s": t3 - t2, "merge_s": time.perf_counter() - t3,
                        "analyze_s": t1 - t0}})

    def _merge_fetch(self, B: int, k: int, asked: dict[int, list[int]], got: dict[int, dict[str, Any]], ties: str,
                     order_by: str) -> tuple[np.ndarray, np.ndarray, list[list[dict[str, Any]]], int]:
        """The merge (:func:`merge_answers`) and the fetch phase: the records of the final k of each question,
        from the answers' inline records or one ``fetch`` call per shard holding the others."""
        if order_by == "score" and all(len(got[s]["records"]) == len(qis) for s, qis in asked.items()):
            # every question asked of one shard (its rows are final, best first, records inline): no merge
            seqs = np.full((B, k), -1, dtype=np.int64)
            scores = np.full((B, k), -np.inf, dtype=np.float32)
            hits: list[list[dict[str, Any]]] = [[] for _ in range(B)]
            for s, qis in asked.items():
                a = got[s]
                w = min(k, a["seqs"].shape[1])
                at = np.asarray(qis, dtype=np.int64)
                seqs[at, :w], scores[at, :w] = a["seqs"][:, :w], a["scores"][:, :w]
                for j, q in enumerate(qis):
                    hits[q] = a["records"][j]
            return seqs, scores, hits, 0
        for s in asked:  # the final questions' times travel in their records (the shard skips the array)
            recs_of = got[s].get("records") or {}
            if recs_of:
                t = got[s]["times"] = np.array(got[s]["times"], dtype=np.int64)  # (a copy: it may be read-only)
                for j, rs in recs_of.items():
                    t[j, :len(rs)] = [r.get("time", MISSING_TIME) for r in rs]
        m = merge_answers(B, k, asked, got, ties, order_by)
        need: dict[int, list[int]] = {}
        for j in np.flatnonzero(m.record_of < 0).tolist():
            need.setdefault(int(m.shard[j]), []).append(j)
        recs: list[dict[str, Any] | None] = [None] * m.seq.size
        for j in np.flatnonzero(m.record_of >= 0).tolist():
            s, row = int(m.shard[j]), int(m.row[j])
            recs[j] = got[s]["records"][row][int(m.record_of[j])]
        if need:
            out = self._read("fetch", {s: (m.seq[js],) for s, js in need.items()})
            for s, js in need.items():
                for j, rec in zip(js, out[s]):
                    if rec is None:  # pragma: no cover - the read lock keeps every shard at one state
                        raise RuntimeError(f"shard {s} no longer holds record {int(m.seq[j])} found by the search")
                    recs[j] = rec
        hits = [[] for _ in range(B)]
        for j, q in enumerate(m.group.tolist()):
            hits[q].append(recs[j])
        return m.seqs, m.scores, hits, len(need)

    # ------------------------------------------------------------------ info, save, close
    def info(self) -> dict[str, Any]:
        """The memory and each shard: records, node, pid, device, log, restarts seen."""
        with self._rw.reading():
            self._check_open()
            shard_infos = self._gather({s: (lambda s=s: self._actors[s].info.remote()) for s in range(self.n_shards)},
                                       "info")
            st = self._stats
            out = {"path": str(self._path), "sharded": True, "route": self.route, "shards": self.n_shards,
                   "device": self.device, "records": st.n_docs, "total_length": st.total_len,
                   "avgdl": TermStats(st.n_docs, st.total_len).avgdl,
                   "terms": int(np.count_nonzero(st.total[: len(st.vocab)])),
                   "coordinator": {"pid": os.getpid(), "vocabulary": len(st.vocab), "stats_bytes": st.nbytes(),
                                   "id_map": None if self._owner is None else len(self._owner),
                                   "next_seq": self._next_seq, "exchange": dict(self.exchange)},
                   "ray": {"started_here": self._started_ray, "nodes": len(self._ray.nodes())},
                   "shard_list": [shard_infos[s] for s in range(self.n_shards)], **self._config}
        return out

    def save(self) -> Path:
        """Checkpoint every shard (fold its log into its memory's files); returns the directory.

        Not needed for durability (every acknowledged write is in a shard's
        log); it makes the next start replay less.
        """
        with self._write_lock, self._rw.writing():
            self._check_open()
            self._gather({s: (lambda s=s: self._actors[s].checkpoint.remote()) for s in range(self.n_shards)}, "save")
        return self._path

    def close(self) -> None:
        """Checkpoint every shard, stop the actors, release the directory (and stop a runtime started here)."""
        if self._closed:
            return
        with self._write_lock, self._rw.writing():
            self._closed = True
            try:
                refs = {s: self._actors[s].close.remote() for s in range(self.n_shards)}
                for s, ref in refs.items():
                    try:
                        self._ray.get(ref, timeout=self.call_timeout)
                    except Exception as e:  # noqa: BLE001 - its log holds every acknowledged write: nothing is lost
                        log.warning("shard %d could not checkpoint at close (%s: %s); its log keeps every "
                                    "acknowledged write for the next open", s, type(e).__name__, e)
            finally:
                self._stop_actors()
                self._lock.__exit__(None, None, None)
                if self._started_ray:
                    self._ray.shutdown()

    def _stop_actors(self) -> None:
        for c in list(self._fast.values()):
            if c:
                c.close()
        self._fast = {}
        for a in self._actors:
            with contextlib.suppress(Exception):  # already gone
                self._ray.kill(a, no_restart=True)
        self._actors = []

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"the sharded memory at {self._path} is closed: open it again")

    def kill_shard(self, s: int) -> int:
        """SIGKILL shard ``s``'s process (for tests and drills: Ray restarts it); returns the pid killed."""
        import signal

        self._wait_ready(s, "kill")  # a shard still restarting answers nothing yet
        pid = self._ray.get(self._actors[s].ping.remote(), timeout=self.call_timeout)
        os.kill(pid, signal.SIGKILL)
        return pid

    def __enter__(self) -> ShardedMemory:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.close()

