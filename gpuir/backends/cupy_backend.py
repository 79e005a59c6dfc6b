"""The CuPy backend: fused tile scoring, exact selection, haystack scoring on a CUDA device.

Results equal the NumPy reference's (:class:`~gpuir.backends.numpy_backend.NumpyScorer`)
bit for bit -- ids, float32 scores, tie order, padding -- on every run: every
document's score is the same float32 additions in the same order (ascending
term id, see ``kernels/bm25_score.cu``), and selection is exact.

Per batch of B queries:

1. **Host prep, vectorised** (:func:`prepare_batch`; no Python loop per query
   beyond reading the inputs): one ``np.unique`` over (row, term) keys gives
   every row's distinct terms in ascending order and their multiplicities; the
   bm25l/bm25+ row constants are summed exactly as NumPy sums them
   (:func:`numpy_row_sums`); allow-lists are concatenated, range-checked and
   sorted; each filtered row is sent to the tile path or the haystack path by
   the smaller estimated cost (:func:`choose_paths`).
2. **One pinned host-to-device copy** of all of a chunk's inputs, into
   device buffers reused across calls (:class:`_Workspace`).
3. **Score.** ``tile_score`` (grid: stripes of document tiles x query groups)
   accumulates each (row, tile) in shared memory, skips tiles whose exact
   float32 upper bound (per-term block maxima) is below the row's running
   threshold, and emits only candidates that can still reach the top k.
   ``haystack_score`` scores rows with a small allow-list from a document-major
   (forward) copy of the index, O(allowed documents), built on first use.
4. **Select.** ``select_topk`` (radix select + bitonic sort, one block per row)
   for k <= 4096; above, ``pack_candidates`` + a device sort + ``decode_keys``.
5. **One device-to-host copy** of ids, scores, candidate counts, thresholds.
   A row whose candidates overflowed its slots (possible only when the
   threshold rises late) is rerun with the threshold it reached, which bounds
   its candidates by the count it saw: the rerun fits (see the kernel header).

Device memory: the index (offsets int64, doc_ids int32, posting weights
float32: 8 bytes per posting), the block-max directory (8 bytes per (long
term, tile)), the forward copy if used (12 bytes per posting), and per row
8 x (candidate slots) + 12 k bytes: O(B k + candidates), independent of N.
Batches are cut into chunks that fit the memory budget; on an out-of-memory
error the pool is freed and the budget halved.

Concurrency: ``search`` may be called from many threads; the host prep runs
in parallel, the device section (workspace, stream) is serialised by a lock.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._compat import cuda_device
from ..bm25 import BM25Params
from ..index.csr import CSRIndex, check_postings_sorted
from ..results import SearchResults, empty_results
from . import kernels as K
from .base import CollectionStats, Scorer
from .weights import posting_weights

_SCORE_FILE, _TOPK_FILE = "bm25_score.cu", "topk.cu"
_ELEMWISE_BLOCK = 256
_MAX_GRID = 1 << 20
_MAX_GRID_Y = 65535
ROW_FILTERED, ROW_OFF_TILES = 1, 2  # kernels/bm25_score.cu row_flags
PATH_NONE, PATH_TILES, PATH_HAYSTACK = 0, 1, 2
HAYSTACK_MODES = ("auto", "never", "always")


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


# =============================================================================
# Host-side pieces, pure NumPy (tested without a device)
# =============================================================================
def _pairwise_sum_f32(m: np.ndarray) -> np.ndarray:
    """NumPy's float32 pairwise summation of each row of ``m`` (R, n), vectorised over rows.

    The order of ``numpy.add.reduce`` on a contiguous float32 row
    (``pairwise_sum`` in NumPy's loops): n < 8 sequential from -0.0; n <= 128
    eight interleaved accumulators combined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))
    then the remainder in order; larger n split in halves (a multiple of 8).
    """
    R, n = m.shape
    f = np.float32
    if n < 8:
        res = np.full(R, -0.0, f)
        for i in range(n):
            res = (res + m[:, i]).astype(f)
        return res
    if n <= 128:
        r = m[:, :8].astype(f, copy=True)
        i = 8
        stop = n - n % 8
        while i < stop:
            r = (r + m[:, i:i + 8]).astype(f)
            i += 8
        res = (((r[:, 0] + r[:, 1]) + (r[:, 2] + r[:, 3])) + ((r[:, 4] + r[:, 5]) + (r[:, 6] + r[:, 7]))).astype(f)
        for j in range(stop, n):
            res = (res + m[:, j]).astype(f)
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return (_pairwise_sum_f32(m[:, :n2]) + _pairwise_sum_f32(m[:, n2:])).astype(f)


def numpy_row_sums(values: np.ndarray, row_off: np.ndarray) -> np.ndarray:
    """Per-row float32 sums, bit for bit as ``values[a:b].sum(dtype=np.float32)`` would give.

    Parameters
    ----------
    values : ndarray (n,), float32, host
    row_off : ndarray (R+1,), int64, host
        Row r owns ``values[row_off[r]:row_off[r+1]]``.

    Returns
    -------
    ndarray (R,), float32, host
        Rows are grouped by length and each group summed in NumPy's order
        (:func:`_pairwise_sum_f32`), so the cost is a few vectorised passes.
    """
    lens = np.diff(row_off)
    out = np.zeros(lens.size, np.float32)
    for L in np.unique(lens[lens > 0]).tolist():
        rows = np.flatnonzero(lens == L)
        idx = row_off[rows][:, None] + np.arange(L)[None, :]
        out[rows] = _pairwise_sum_f32(values[idx])
    return out


def build_tile_directory(offsets: np.ndarray, doc_ids: np.ndarray, weights: np.ndarray, tile: int, n_tiles: int,
                         min_df: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Block-max directory of the terms with at least ``min_df`` postings (tiles of ``tile`` documents).

    Returns
    -------
    dir_row : ndarray (V,), int32, host
        Row of each term in the directory, -1 for terms without one.
    dir_start : ndarray (H * (n_tiles + 1),), int32, host
        Row r, column j: index of term r's first posting in tile j (documents
        [j*tile, (j+1)*tile)), relative to ``offsets[t]``; column n_tiles is df.
    dir_max : ndarray (H * n_tiles,), float32, host
        Row r, column j: max(0, largest weight of the term's postings in tile j).
    """
    offsets = np.asarray(offsets, np.int64)
    V = offsets.size - 1
    df = np.diff(offsets)
    heavy = np.flatnonzero(df >= max(1, int(min_df)))
    dir_row = np.full(V, -1, np.int32)
    dir_row[heavy] = np.arange(heavy.size, dtype=np.int32)
    return dir_row, *_directory_rows(offsets, doc_ids, weights, tile, heavy, n_tiles)


def _directory_rows(offsets, doc_ids, weights, tile, heavy, n_tiles):
    H = heavy.size
    dir_start = np.zeros((max(H, 1), n_tiles + 1), np.int32)
    dir_max = np.zeros((max(H, 1), n_tiles), np.float32)
    # Chunks of terms keep the temporaries to ~2^24 postings.
    h = 0
    while h < H:
        e = h + 1
        tot = int(offsets[heavy[h] + 1] - offsets[heavy[h]])
        while e < H and tot + int(offsets[heavy[e] + 1] - offsets[heavy[e]]) <= (1 << 24):
            tot += int(offsets[heavy[e] + 1] - offsets[heavy[e]])
            e += 1
        terms = heavy[h:e]
        lens = offsets[terms + 1] - offsets[terms]
        first = np.repeat(offsets[terms] - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
        idx = first + np.arange(int(lens.sum()), dtype=np.int64)
        row = np.repeat(np.arange(terms.size, dtype=np.int64), lens)
        tl = doc_ids[idx].astype(np.int64) // tile
        comp = row * (n_tiles + 1) + tl  # non-decreasing: postings are doc-sorted within a term
        grid = (np.arange(terms.size, dtype=np.int64)[:, None] * (n_tiles + 1) + np.arange(n_tiles + 1)[None, :])
        row_begin = np.concatenate([[0], np.cumsum(lens)[:-1]])
        dir_start[h:e] = np.searchsorted(comp, grid.ravel(), "left").reshape(terms.size, n_tiles + 1) \
            - row_begin[:, None]
        dir_start[h:e, n_tiles] = lens
        seg = row * n_tiles + tl
        starts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])
        mx = np.maximum.reduceat(weights[idx], starts)
        blk = dir_max[h:e].reshape(-1)
        blk[seg[starts]] = np.maximum(mx, 0)
        dir_max[h:e] = blk.reshape(terms.size, n_tiles)
        h = e
    return dir_start.reshape(-1), dir_max.reshape(-1)


def check_queries(queries: Sequence[Any], n_terms: int) -> tuple[np.ndarray, np.ndarray]:
    """Validate a batch of queries and concatenate them.

    Returns
    -------
    flat : ndarray (T,), int64, host
        All term ids, query after query.
    lens : ndarray (B,), int64, host

    Raises
    ------
    TypeError / ValueError
        Naming the first bad query and what to fix.
    """
    B = len(queries)
    try:
        arrs = [np.asarray(q) for q in queries]
    except Exception as e:  # noqa: BLE001 - ragged nested lists and the like
        raise TypeError(f"queries must be 1-D arrays of integer term ids ({e})") from None
    lens = np.fromiter((a.size for a in arrs), np.int64, B)
    ok = all(a.ndim == 1 and (a.size == 0 or a.dtype.kind in "iu") for a in arrs)
    if not ok:
        for i, a in enumerate(arrs):
            if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
                raise TypeError(f"query {i} must be a 1-D array of integer term ids, got {a.dtype} {a.shape}")
    nonempty = [a for a in arrs if a.size]
    flat = np.concatenate(nonempty).astype(np.int64, copy=False) if nonempty else np.zeros(0, np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= n_terms):
        bad = int(np.flatnonzero((flat < 0) | (flat >= n_terms))[0])
        i = int(np.searchsorted(np.cumsum(lens), bad, "right"))
        raise ValueError(f"query {i} has term ids outside [0, {n_terms}): analyse queries with the "
                         "index's own vocabulary (BM25Index.query_terms)")
    return flat, lens


def check_allow(allow: Sequence[Any] | None, n_queries: int, n_docs: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate, range-check and normalise per-query allow-lists.

    Returns
    -------
    filtered : ndarray (B,), bool, host
    allow_off : ndarray (B+1,), int64, host
    allow_docs : ndarray (A,), int32, host
        Row q's allowed documents, sorted and unique (an unsorted list or one
        with repeats is sorted and de-duplicated here).

    Raises
    ------
    TypeError / ValueError
        A list that is not 1-D integers, a boolean mask (use
        :func:`gpuir.filters.normalize_filters`), or a document number outside
        [0, N): never silently wrong, never an out-of-bounds write on the device.
    """
    filtered = np.zeros(n_queries, bool)
    if allow is None:
        return filtered, np.zeros(n_queries + 1, np.int64), np.zeros(0, np.int32)
    if len(allow) != n_queries:
        raise ValueError(f"allow has {len(allow)} entries for {n_queries} queries: give one per query")
    arrs = []
    lens = np.zeros(n_queries, np.int64)
    for i, a in enumerate(allow):
        if a is None:
            continue
        a = np.asarray(a)
        if a.ndim != 1 or a.dtype == bool or (a.size and a.dtype.kind not in "iu"):
            raise TypeError(
                f"allow-list of query {i} must be a 1-D array of document numbers (int), got {a.dtype} "
                f"{a.shape}; turn masks and id lists into allow-lists with gpuir.filters.normalize_filters")
        filtered[i] = True
        lens[i] = a.size
        if a.size:
            arrs.append(a)
    flat = np.concatenate(arrs).astype(np.int64, copy=False) if arrs else np.zeros(0, np.int64)
    off = np.zeros(n_queries + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    if flat.size and (flat.min() < 0 or flat.max() >= n_docs):
        bad = int(np.flatnonzero((flat < 0) | (flat >= n_docs))[0])
        i = int(np.searchsorted(off, bad, "right") - 1)
        raise ValueError(
            f"allow-list of query {i} has document numbers outside [0, {n_docs}) (e.g. {int(flat[bad])}): "
            "allow-lists hold document numbers of this index")
    if flat.size > 1:
        row = np.repeat(np.arange(n_queries, dtype=np.int64), lens)
        same_row = row[1:] == row[:-1]
        if np.any(same_row & (flat[1:] <= flat[:-1])):  # unsorted or repeated: normalise
            key = np.unique(row * n_docs + flat)
            row, flat = key // n_docs, key % n_docs
            lens = np.bincount(row, minlength=n_queries).astype(np.int64)
            np.cumsum(lens, out=off[1:])
    return filtered, off, flat.astype(np.int32)


def choose_paths(has_pairs: np.ndarray, filtered: np.ndarray, allow_len: np.ndarray, tiles_touched: np.ndarray,
                 n_terms_row: np.ndarray, sumdf: np.ndarray, n_tiles: int, tile: int, postings_per_doc: float,
                 mode: str) -> np.ndarray:
    """Path of each row: PATH_NONE (no candidate possible), PATH_TILES or PATH_HAYSTACK.

    A filtered row goes to the haystack path when its estimated cost there,
    ``allowed docs x (4 + terms x (1 + log2(1 + postings per doc)))`` (binary
    searches in each allowed document's forward list), is below the tile
    path's, ``tiles touched x (tile/8 + 16 x terms) + postings of its terms in
    those tiles`` (fixed work per tile plus the postings read). So a private
    haystack spread over the collection costs O(haystack), while a tenant whose
    records are contiguous (few tiles) stays on the tile path.
    ``mode`` "never" / "always" force the choice for filtered rows.
    """
    path = np.where(has_pairs, PATH_TILES, PATH_NONE).astype(np.int8)
    path[filtered & (allow_len == 0)] = PATH_NONE
    cand = (path == PATH_TILES) & filtered
    if mode == "never" or not cand.any():
        return path
    if mode == "always":
        path[cand] = PATH_HAYSTACK
        return path
    nt = n_terms_row.astype(np.float64)
    cost_hay = allow_len * (4.0 + nt * (1.0 + math.log2(1.0 + postings_per_doc)))
    cost_tile = tiles_touched * (tile / 8.0 + 16.0 * nt) + sumdf * (tiles_touched / max(1, n_tiles))
    path[cand & (cost_hay < cost_tile)] = PATH_HAYSTACK
    return path


@dataclass
class Batch:
    """Host arrays of a batch of R rows (see :func:`prepare_batch`). Offsets are row-major."""

    qt_off: np.ndarray        # (R+1,) int64: row q's terms are qt_term[qt_off[q]:qt_off[q+1]]
    qt_term: np.ndarray       # (T,) int32, ascending within a row, only terms with postings
    qt_mult: np.ndarray       # (T,) float32 multiplicities
    row_const: np.ndarray     # (R,) float32, bm25l/bm25+ absent-term sum (0 otherwise)
    filtered: np.ndarray      # (R,) bool
    allow_off: np.ndarray     # (R+1,) int64
    allow_docs: np.ndarray    # (A,) int32 sorted unique per row
    path: np.ndarray          # (R,) int8 PATH_*
    sumdf: np.ndarray         # (R,) int64 postings of the row's terms
    rows: np.ndarray          # (R,) int64: positions of these rows in the caller's batch

    @property
    def n_rows(self) -> int:
        return self.rows.size

    def take(self, sel: np.ndarray) -> Batch:
        """The rows ``sel`` (ascending positions), offsets rebased, vectorised."""
        sel = np.asarray(sel, np.int64)
        qt_idx, qt_off = _take_ranges(self.qt_off, sel)
        a_idx, a_off = _take_ranges(self.allow_off, sel)
        return Batch(qt_off, self.qt_term[qt_idx], self.qt_mult[qt_idx], self.row_const[sel], self.filtered[sel],
                     a_off, self.allow_docs[a_idx], self.path[sel], self.sumdf[sel], self.rows[sel])


def _take_ranges(off: np.ndarray, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lens = off[sel + 1] - off[sel]
    new = np.zeros(sel.size + 1, np.int64)
    np.cumsum(lens, out=new[1:])
    idx = np.repeat(off[sel] - new[:-1], lens) + np.arange(int(new[-1]), dtype=np.int64)
    return idx, new


def prepare_batch(flat: np.ndarray, lens: np.ndarray, filtered: np.ndarray, allow_off: np.ndarray,
                  allow_docs: np.ndarray, *, n_terms: int, df: np.ndarray, w0: np.ndarray, has_w0: bool,
                  n_tiles: int, tile: int, postings_per_doc: float, haystack: str) -> Batch:
    """Every row's distinct terms, multiplicities, row constant and path, vectorised.

    Parameters
    ----------
    flat, lens : from :func:`check_queries`
    filtered, allow_off, allow_docs : from :func:`check_allow`
    n_terms : int
        V.
    df : ndarray (V,), int64, host
        Postings of each term in this index.
    w0 : ndarray (V,), float32, host
        Absent-term weights.
    """
    B = lens.size
    row = np.repeat(np.arange(B, dtype=np.int64), lens)
    key, mult = np.unique(row * n_terms + flat, return_counts=True)  # sorted by (row, term)
    prow, pterm = key // n_terms, key % n_terms
    row_const = np.zeros(B, np.float32)
    if has_w0 and key.size:
        # As the reference: np.float32((w0[terms] * mult).sum(dtype=np.float32)) per row.
        prod = (w0[pterm] * mult).astype(np.float32)
        off_all = np.zeros(B + 1, np.int64)
        np.cumsum(np.bincount(prow, minlength=B), out=off_all[1:])
        row_const = numpy_row_sums(prod, off_all)
    keep = df[pterm] > 0
    prow, pterm, mult = prow[keep], pterm[keep], mult[keep]
    qt_off = np.zeros(B + 1, np.int64)
    np.cumsum(np.bincount(prow, minlength=B), out=qt_off[1:])
    nt = np.diff(qt_off)
    sumdf = np.bincount(prow, weights=df[pterm], minlength=B).astype(np.int64)
    allow_len = np.diff(allow_off)
    tiles_touched = np.zeros(B, np.int64)
    if allow_docs.size:
        tl = allow_docs.astype(np.int64) // tile
        arow = np.repeat(np.arange(B, dtype=np.int64), allow_len)
        new_tile = np.r_[True, (tl[1:] != tl[:-1]) | (arow[1:] != arow[:-1])]
        tiles_touched = np.bincount(arow[new_tile], minlength=B).astype(np.int64)
    path = choose_paths(nt > 0, filtered, allow_len, tiles_touched, nt, sumdf, n_tiles, tile,
                        postings_per_doc, haystack)
    return Batch(qt_off, pterm.astype(np.int32), mult.astype(np.float32), row_const, filtered,
                 allow_off, allow_docs, path, sumdf, np.arange(B, dtype=np.int64))


def candidate_slots(batch: Batch, k: int, stripes: int, n_docs: int) -> np.ndarray:
    """Candidate slots of each row (int64 (R,)).

    Haystack rows: their allow-list size (one key per allowed document, no
    overflow). Tile rows: min(upper bound on their candidates, what the first
    wave of ``stripes`` blocks may emit before the threshold rises, twice over);
    an overflow is detected and rerun (see the module docstring).
    """
    allow_len = np.diff(batch.allow_off)
    upper = np.minimum(batch.sumdf, n_docs)
    upper = np.where(batch.filtered, np.minimum(upper, allow_len), upper)
    slots = np.minimum(upper, 2 * (stripes + 1) * (k + 32) + 1024)
    slots = np.where(batch.path == PATH_HAYSTACK, allow_len, slots)
    return np.where(batch.path == PATH_NONE, 0, slots).astype(np.int64)


# =============================================================================
# Device-side pieces
# =============================================================================
class _Timer:
    """Per-phase device time from CUDA events on the current stream (seconds)."""

    def __init__(self, cupy: Any):
        self.cp = cupy
        self.marks: list[tuple[str, Any, Any]] = []

    def phase(self, name: str):
        cp, marks = self.cp, self.marks

        class _Ctx:
            def __enter__(self_inner):
                self_inner.start = cp.cuda.Event()
                self_inner.start.record()

            def __exit__(self_inner, *exc):
                end = cp.cuda.Event()
                end.record()
                marks.append((name, self_inner.start, end))
                return False

        return _Ctx()

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, a, b in self.marks:
            b.synchronize()
            out[name] = out.get(name, 0.0) + self.cp.cuda.get_elapsed_time(a, b) / 1e3
        return out


class _Workspace:
    """Device and pinned host buffers reused across calls (used under the scorer's lock).

    One buffer holds a chunk's inputs, then its state (counts, thresholds,
    tiles scored), then its outputs (ids, scores), each 8-byte aligned: the
    inputs and the state go up in ONE host-to-device copy of the prefix (up to
    the first output, padding included), the state and the outputs come back in
    ONE device-to-host copy of the suffix. Every byte copied back was either
    copied up or written by a kernel (compute-sanitizer initcheck stays quiet).
    """

    ALIGN = 8

    def __init__(self, cp: Any):
        self.cp = cp
        self.host: np.ndarray | None = None
        self._host_mem: Any = None
        self.dev: Any = None
        self.cand: Any = None

    def _grow(self, nbytes: int) -> None:
        cp = self.cp
        if self.dev is None or self.dev.size < nbytes:
            size = _next_pow2(max(nbytes, 1 << 16))
            self.dev = None
            self.dev = cp.empty(size, dtype=cp.uint8)
            self._host_mem = cp.cuda.alloc_pinned_memory(size)
            self.host = np.frombuffer(self._host_mem, np.uint8, size)

    def candidates(self, n: int) -> Any:
        """A device uint64 array of at least n elements (never read before written)."""
        if self.cand is None or self.cand.size < max(n, 1):
            self.cand = None
            self.cand = self.cp.empty(_next_pow2(max(n, 1024)), dtype=self.cp.uint64)
        return self.cand

    def layout(self, inputs: list[np.ndarray], state: list[np.ndarray], outputs: list[tuple[tuple, Any]]):
        """Stage inputs and state in the pinned buffer; device views of inputs, state and outputs.

        Returns
        -------
        views : list of device arrays, one per input, state array and output
        offs : list of int, their byte offsets in the buffers
        h2d_end : int, end of the inputs and state (the host-to-device range is [0, h2d_end))
        state_start : int, start of the state (the device-to-host range is [state_start, total))
        total : int
        """
        specs = [(x.shape, x.dtype) for x in inputs + state] + [(shape, np.dtype(dt)) for shape, dt in outputs]
        offs, pos = [], 0
        for shape, dt in specs:
            pos = -(-pos // self.ALIGN) * self.ALIGN
            offs.append(pos)
            pos += int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        total = pos
        self._grow(total)
        staged = inputs + state
        h2d_end = offs[len(staged)] if outputs else (offs[-1] + staged[-1].nbytes if staged else 0)
        state_start = offs[len(inputs)] if state else total
        for x, o in zip(staged, offs):
            self.host[o:o + x.nbytes] = np.ascontiguousarray(x).view(np.uint8).reshape(-1)
        views = []
        for (shape, dt), o in zip(specs, offs):
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            views.append(self.dev[o:o + n].view(dt).reshape(shape))
        return views, offs, h2d_end, state_start, total

    def h2d(self, end: int) -> None:
        if end:
            self.dev[:end].set(self.host[:end])

    def d2h(self, start: int, end: int) -> None:
        """Copy bytes [start, end) back into the pinned buffer."""
        if end > start:
            self.dev[start:end].get(out=self.host[start:end])

    def read(self, off: int, shape: tuple, dtype) -> np.ndarray:
        """A copy of what the last :meth:`d2h` brought back at ``off``."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        return self.host[off:off + n].view(dt).reshape(shape).copy()


class CupyScorer(Scorer):
    """BM25 on a CUDA device through CuPy (see the module docstring).

    Parameters
    ----------
    index : CSRIndex
        Host arrays; uploaded to the device once, here.
    params : BM25Params
    stats : CollectionStats, optional
        Whole-collection statistics the posting weights are computed from
        (segmented stores); default the index's own.
    memory_budget_bytes : int, optional
        Device bytes the per-batch buffers may use. Default: ``memory_fraction``
        of the free device memory at each search.
    memory_fraction : float
        Share of free device memory used when no budget is given, in (0, 1].
    device : int, optional
        CUDA device number; default the current CuPy device.
    haystack : {"auto", "never", "always"}
        Whether filtered rows may be scored from a forward (document-major) copy
        of the index: "auto" picks per row by estimated cost (the copy, 12
        bytes per posting, is built on first use), "never" keeps every row on
        the tile path, "always" sends every filtered row there.

    Raises
    ------
    RuntimeError
        No usable CUDA device (the message says how to fix it).
    """

    name = "cupy"

    def __init__(
        self,
        index: CSRIndex,
        params: BM25Params,
        stats: CollectionStats | None = None,
        memory_budget_bytes: int | None = None,
        memory_fraction: float = 0.5,
        device: int | None = None,
        haystack: str = "auto",
    ):
        super().__init__(index, params, stats)
        usable, why = cuda_device()
        if not usable:
            from . import device_unavailable

            raise device_unavailable("the cupy backend needs a usable CUDA device", why)
        if memory_budget_bytes is not None and (
            not isinstance(memory_budget_bytes, (int, np.integer)) or isinstance(memory_budget_bytes, bool)
            or memory_budget_bytes <= 0
        ):
            raise ValueError(
                f"memory_budget_bytes must be a positive int (bytes) or None, got {memory_budget_bytes!r}"
            )
        if not (0.0 < float(memory_fraction) <= 1.0):
            raise ValueError(f"memory_fraction must lie in (0, 1], got {memory_fraction!r}")
        if haystack not in HAYSTACK_MODES:
            raise ValueError(f"haystack must be one of {', '.join(HAYSTACK_MODES)}, got {haystack!r}")
        import cupy

        self._cp = cupy
        self.memory_budget_bytes = None if memory_budget_bytes is None else int(memory_budget_bytes)
        self.memory_fraction = float(memory_fraction)
        self.haystack = haystack
        self.device_id = cupy.cuda.Device().id if device is None else int(device)
        self.tile_threads, self.tile_docs = K.TILE_THREADS, K.TILE_DOCS
        N, P = index.n_docs, index.n_postings
        self.n_tiles = max(1, -(-N // self.tile_docs))
        self.doc_bits = max(1, int(N - 1).bit_length()) if N > 0 else 1
        if N >= 2**31 - self.tile_docs:
            raise ValueError(f"the cupy backend handles fewer than 2^31 - {self.tile_docs} documents, got {N}")
        check_postings_sorted(index.offsets, index.doc_ids)  # the race-free accumulation relies on it
        pw = posting_weights(index, params, self.stats)
        #: float32 (V,), host: absent-term weight (non-zero for bm25l/bm25+ only).
        self.w0 = pw.w0
        self.has_w0 = pw.has_w0
        #: int64 (V,), host: postings of each term in this index.
        self._df = np.diff(np.asarray(index.offsets, np.int64))
        self._postings_per_doc = P / max(1, N)
        #: Terms with at least this many postings get a block-max directory row.
        self.dir_min_df = max(64, 2 * self.n_tiles)
        dir_row, dir_start, dir_max = build_tile_directory(index.offsets, np.asarray(index.doc_ids), pw.weights,
                                                           self.tile_docs, self.n_tiles, self.dir_min_df)
        t0 = time.perf_counter()
        with cupy.cuda.Device(self.device_id):
            a = cupy.asarray
            #: Device arrays: offsets (V+1,) int64, doc_ids (P,) int32, weights (P,) float32,
            #: term_ub (V,) float32, dir_row (V,) int32, dir_start (H*(n_tiles+1),) int32,
            #: dir_max (H*n_tiles,) float32.
            self.d_offsets = a(np.ascontiguousarray(index.offsets, dtype=np.int64))
            self.d_doc_ids = a(np.ascontiguousarray(index.doc_ids, dtype=np.int32))
            self.d_weights = a(np.ascontiguousarray(pw.weights, dtype=np.float32))
            self.d_term_ub = a(np.maximum(pw.ub, 0.0).astype(np.float32))
            self.d_dir_row = a(dir_row)
            self.d_dir_start = a(dir_start)
            self.d_dir_max = a(dir_max)
            self._stream = cupy.cuda.Stream(non_blocking=True)
            try:
                sms = int(cupy.cuda.Device(self.device_id).attributes["MultiProcessorCount"])
            except Exception:  # noqa: BLE001 - informational; 132 = H100 SXM
                sms = 132
            cupy.cuda.Device().synchronize()
        #: Blocks tile_score aims to keep resident (8 per SM).
        self.target_blocks = 8 * max(1, sms)
        #: Seconds spent uploading the index.
        self.upload_s = time.perf_counter() - t0
        self.directory_bytes = int(dir_start.nbytes + dir_max.nbytes)
        self._fwd: tuple[Any, Any, Any] | None = None
        self._lock = threading.Lock()
        self._ws = _Workspace(cupy)
        self._device_name = self._name()

    def _name(self) -> str:
        try:
            props = self._cp.cuda.runtime.getDeviceProperties(self.device_id)
            n = props["name"]
            return n.decode() if isinstance(n, bytes) else str(n)
        except Exception:  # noqa: BLE001  # pragma: no cover - informational only
            return f"CUDA device {self.device_id}"

    # -- memory --------------------------------------------------------------------
    def budget_bytes(self) -> int:
        """The byte budget for one chunk's buffers, now."""
        if self.memory_budget_bytes is not None:
            return self.memory_budget_bytes
        cp = self._cp
        with cp.cuda.Device(self.device_id):
            free, _ = cp.cuda.runtime.memGetInfo()
        pool = cp.get_default_memory_pool()
        return int(self.memory_fraction * (free + pool.free_bytes()))

    def row_bytes(self, slots: np.ndarray, k: int, batch: Batch) -> np.ndarray:
        """Device bytes each row of ``batch`` needs (int64 (R,))."""
        per = 8 * slots + 12 * k + 64 + 8 * np.diff(batch.qt_off) + 4 * np.diff(batch.allow_off)
        if k > K.SELECT_MAX_K:
            per = per + 8 * (3 * slots + 2 * k)  # packed keys, sort buffers, decoded top keys
        return per.astype(np.int64)

    @staticmethod
    def _chunks(per_row: np.ndarray, budget: int) -> list[tuple[int, int]]:
        """Greedy contiguous chunks whose bytes fit the budget (at least one row each)."""
        out, s, R = [], 0, per_row.size
        csum = np.concatenate([[0], np.cumsum(per_row)])
        while s < R:
            e = int(np.searchsorted(csum, csum[s] + budget, "right")) - 1
            e = max(e, s + 1)
            out.append((s, min(e, R)))
            s = min(e, R)
        return out

    def _too_big(self, need: int, budget: int) -> MemoryError:
        return MemoryError(
            f"one query over {self.index.n_docs} documents needs {need} bytes of device memory but the "
            f"budget is {budget} bytes: pass a larger memory_budget_bytes (or memory_fraction) to the cupy "
            "scorer, free device memory, lower k, or use backend='numpy'")

    # -- forward layout --------------------------------------------------------------
    def _forward(self) -> tuple[Any, Any, Any]:
        """Device forward layout (fwd_off (N+1,) int64, fwd_terms (P,) int32, fwd_weights (P,) float32).

        Built on the device on first use, from the uploaded posting lists: a
        sort of (doc, term) keys, so each document's terms are ascending.
        """
        if self._fwd is None:
            cp = self._cp
            N, P = self.index.n_docs, self.index.n_postings
            pos = cp.arange(P, dtype=cp.int64)
            term_of = (cp.searchsorted(self.d_offsets, pos, side="right") - 1).astype(cp.uint64)
            del pos
            keys = (self.d_doc_ids.astype(cp.uint64) << cp.uint64(32)) | term_of
            perm = cp.argsort(keys)
            del keys
            fwd_terms = term_of[perm].astype(cp.int32)
            del term_of
            fwd_w = self.d_weights[perm]
            del perm
            fwd_off = cp.zeros(N + 1, dtype=cp.int64)
            fwd_off[1:] = cp.cumsum(cp.bincount(self.d_doc_ids, minlength=N))
            self._fwd = (fwd_off, cp.ascontiguousarray(fwd_terms), cp.ascontiguousarray(fwd_w))
        return self._fwd

    # -- host prep -------------------------------------------------------------------
    def stripes(self, n_tile_rows: int) -> int:
        """Stripes S of tile_score's grid: enough blocks to fill the device, at most n_tiles."""
        return max(1, min(self.n_tiles, -(-self.target_blocks // max(1, n_tile_rows))))

    def prepare(self, queries: Sequence[Any], allow: Sequence[Any] | None, haystack: str | None = None) -> Batch:
        """Validate and prepare a batch on the host (no device call)."""
        flat, lens = check_queries(queries, self.index.n_terms)
        filtered, allow_off, allow_docs = check_allow(allow, lens.size, self.index.n_docs)
        return prepare_batch(flat, lens, filtered, allow_off, allow_docs, n_terms=self.index.n_terms,
                             df=self._df, w0=self.w0, has_w0=self.has_w0, n_tiles=self.n_tiles,
                             tile=self.tile_docs, postings_per_doc=self._postings_per_doc,
                             haystack=self.haystack if haystack is None else haystack)

    # -- device work -------------------------------------------------------------------
    def _launch(self, filename: str, name: str, grid, block, args, shared_mem: int = 0) -> None:
        fn = K.kernel(filename, name, self.device_id)
        if shared_mem:
            fn(grid, block, args, shared_mem=shared_mem)
        else:
            fn(grid, block, args)

    def _run_rows(self, b: Batch, slots: np.ndarray, theta0: np.ndarray, k: int, stripes: int,
                  timer: _Timer, stats: dict) -> tuple[np.ndarray, ...]:
        """One chunk on the device: (ids (R,k), scores (R,k), counts (R,), theta (R,), tiles (R,))."""
        ws = self._ws
        R = b.n_rows
        flags = (b.filtered.astype(np.int32) * ROW_FILTERED) | np.where(b.path != PATH_TILES, ROW_OFF_TILES, 0)
        cand_off = np.zeros(R + 1, np.int64)
        np.cumsum(slots, out=cand_off[1:])
        hs = np.flatnonzero(b.path == PATH_HAYSTACK).astype(np.int32)
        hs_start = np.zeros(hs.size + 1, np.int64)
        np.cumsum(np.diff(b.allow_off)[hs], out=hs_start[1:])
        counts0 = np.where(b.path == PATH_HAYSTACK, np.diff(b.allow_off), 0).astype(np.int32)
        inputs = [b.qt_off.astype(np.int32), _nz(b.qt_term, np.int32), _nz(b.qt_mult, np.float32),
                  b.row_const.astype(np.float32), flags.astype(np.int32), b.allow_off,
                  _nz(b.allow_docs, np.int32), cand_off, _nz(hs, np.int32), hs_start]
        state = [counts0, theta0.astype(np.uint32), np.zeros(R, np.int32)]
        outputs = [((R, k), np.int64), ((R, k), np.float32)]
        with timer.phase("h2d_s"):
            views, offs, h2d_end, state_start, total = ws.layout(inputs, state, outputs)
            ws.h2d(h2d_end)
        (qt_off, qt_term, qt_mult, row_const, row_flags, allow_off, allow_docs, d_cand_off, d_hs,
         d_hs_start, counts, theta, tiles, out_ids, out_scores) = views
        cand = ws.candidates(int(cand_off[-1]))
        has_w0 = np.int32(self.has_w0)
        with timer.phase("score_s"):
            n_tile_rows = int((b.path == PATH_TILES).sum())
            if n_tile_rows:
                group = max(1, -(-R // _MAX_GRID_Y))
                grid = (stripes, -(-R // group))
                self._launch(_SCORE_FILE, f"tile_score<{self.tile_threads}, {self.tile_docs}>", grid,
                             (self.tile_threads,),
                             (self.d_offsets, self.d_doc_ids, self.d_weights, self.d_term_ub, self.d_dir_row,
                              self.d_dir_start, self.d_dir_max, np.int32(self.n_tiles), np.int64(self.index.n_docs),
                              qt_off, qt_term, qt_mult, row_const, has_w0, row_flags, allow_off, allow_docs,
                              theta, counts, tiles, d_cand_off, cand, np.int32(R), np.int32(group), np.int32(k)))
            if hs.size:
                fwd_off, fwd_terms, fwd_w = self._forward()
                n_items = int(hs_start[-1])
                g = min(_MAX_GRID, max(1, -(-n_items // K.HAYSTACK_THREADS)))
                self._launch(_SCORE_FILE, f"haystack_score<{K.HAYSTACK_THREADS}>", (g,), (K.HAYSTACK_THREADS,),
                             (fwd_off, fwd_terms, fwd_w, qt_off, qt_term, qt_mult, row_const, has_w0,
                              allow_off, allow_docs, d_hs, d_hs_start, np.int32(hs.size), d_cand_off, cand))
        with timer.phase("topk_s"):
            self._select(cand, d_cand_off, counts, theta, R, k, int(slots.max(initial=0)), out_ids, out_scores)
        with timer.phase("d2h_s"):
            ws.d2h(state_start, total)
        o = offs[-5:]
        stats["haystack_rows"] += int(hs.size)
        return (ws.read(o[3], (R, k), np.int64), ws.read(o[4], (R, k), np.float32), ws.read(o[0], (R,), np.int32),
                ws.read(o[1], (R,), np.uint32), ws.read(o[2], (R,), np.int32))

    def select_segments(self, R: int, k: int, width: int) -> int:
        """Blocks per row of the selection: 1, or up to 64 when a batch of fewer rows than SMs has many candidates.

        Each segment keeps at least 4 max(k, 256) candidate slots, so the
        second stage (segs x k keys per row) stays smaller than the first.
        """
        sms = max(1, self.target_blocks // 8)
        if k > K.SELECT_MAX_K or 2 * R > sms:
            return 1
        return int(max(1, min(sms // R, width // (4 * max(k, 256)), 64)))

    def _select(self, cand, cand_off, counts, theta, R: int, k: int, width: int, out_ids, out_scores) -> None:
        cp = self._cp
        if k <= K.SELECT_MAX_K:
            kpad = _next_pow2(k)
            name, block = f"select_topk<{K.SELECT_THREADS}>", (K.SELECT_THREADS,)
            segs = self.select_segments(R, k, width)
            if segs > 1:
                # Two stages: each of R x segs blocks keeps its segment's top k (raw keys), then one
                # block per row selects from those segs x k keys.
                part = cp.empty((R * segs, k), dtype=cp.int64)
                self._launch(_TOPK_FILE, name, (R * segs,), block,
                             (cand, cand_off, counts, theta, np.int32(self.doc_bits), np.int32(k), np.int32(kpad),
                              np.int32(segs), np.int32(1), part, out_scores), shared_mem=8 * kpad)
                cand = part.view(cp.uint64).reshape(-1)
                cand_off = cp.arange(R + 1, dtype=cp.int64) * np.int64(segs * k)
                counts = cp.full(R, segs * k, dtype=cp.int32)
            self._launch(_TOPK_FILE, name, (R,), block,
                         (cand, cand_off, counts, theta, np.int32(self.doc_bits), np.int32(k), np.int32(kpad),
                          np.int32(1), np.int32(0), out_ids, out_scores), shared_mem=8 * kpad)
            return
        # k > SELECT_MAX_K: pack each row's valid keys, sort rows on the device, decode the top k.
        width = max(width, 1)
        top = cp.zeros((R, k), dtype=cp.uint64)
        for s in range(0, R, _MAX_GRID_Y):
            e = min(R, s + _MAX_GRID_Y)
            packed = cp.zeros((e - s, width), dtype=cp.uint64)
            gx = min(_MAX_GRID, max(1, -(-width // K.PACK_THREADS)))
            self._launch(_TOPK_FILE, f"pack_candidates<{K.PACK_THREADS}>", (gx, e - s), (K.PACK_THREADS,),
                         (cand, cand_off[s:], counts[s:], theta[s:], np.int64(width), packed))
            packed.sort(axis=-1)
            kk = min(k, width)
            top[s:e, :kk] = packed[:, ::-1][:, :kk]
            del packed
        n = R * k
        self._launch(_TOPK_FILE, "decode_keys", (min(_MAX_GRID, max(1, -(-n // _ELEMWISE_BLOCK))),),
                     (_ELEMWISE_BLOCK,), (top, np.int64(n), out_ids, out_scores))

    def _search_rows(self, batch: Batch, k: int, timer: _Timer, stats: dict, ids: np.ndarray, out: np.ndarray,
                     theta0: np.ndarray | None = None, slots: np.ndarray | None = None, depth: int = 0) -> None:
        """Score ``batch`` chunk by chunk (OOM: halve the budget), rerun overflowing rows, fill ids/out."""
        cp = self._cp
        R = batch.n_rows
        if R == 0:
            return
        if slots is None:
            slots = candidate_slots(batch, k, stats["stripes"], self.index.n_docs)
        if theta0 is None:
            theta0 = np.zeros(R, np.uint32)
        per_row = self.row_bytes(slots, k, batch)
        budget = self.budget_bytes()
        if int(per_row.max()) > budget:
            raise self._too_big(int(per_row.max()), budget)
        chunks = self._chunks(per_row, budget)
        i = 0
        while i < len(chunks):
            s, e = chunks[i]
            sub = batch.take(np.arange(s, e))
            try:
                res = self._run_rows(sub, slots[s:e], theta0[s:e], k, stats["stripes"], timer, stats)
                oom = None
            except cp.cuda.memory.OutOfMemoryError as err:
                oom = str(err)
            if oom is not None:
                # Outside the except block: there the traceback still references the failed
                # chunk's device arrays, and free_all_blocks() could not give them back.
                cp.get_default_memory_pool().free_all_blocks()
                if e - s == 1:
                    raise MemoryError(
                        f"the GPU ran out of memory scoring even one query over {self.index.n_docs} documents "
                        f"({oom}). Fix: free device memory (other processes, CuPy's pool), lower k, pass a "
                        "smaller memory_budget_bytes/memory_fraction so other allocations fit, or use "
                        "backend='numpy'")
                budget = max(1, budget // 2)
                chunks[i:] = self._chunks(per_row[s:], budget)
                chunks[i:] = [(a + s, c + s) for a, c in chunks[i:]]
                stats["oom_retries"] += 1
                continue
            r_ids, r_scores, counts, theta, tiles = res
            stats["n_chunks"] += 1
            stats["rows_per_chunk"] = max(stats["rows_per_chunk"], e - s)
            stats["tiles_scored"] += int(tiles.sum())
            stats["candidates"] += int(np.minimum(counts, slots[s:e]).sum())
            over = np.flatnonzero(counts.astype(np.int64) > slots[s:e])
            rows = sub.rows
            ids[rows] = r_ids
            out[rows] = r_scores
            if over.size:
                if depth >= 2:
                    raise AssertionError("candidate overflow after a rerun with the final threshold")
                stats["overflow_rows"] += int(over.size)
                self._search_rows(sub.take(over), k, timer, stats, ids, out, theta0=theta[over],
                                  slots=counts[over].astype(np.int64), depth=depth + 1)
            i += 1

    # -- the Scorer contract ----------------------------------------------------------
    def search(
        self,
        queries: Sequence[np.ndarray],
        k: int,
        allow: Sequence[np.ndarray | None] | None = None,
    ) -> SearchResults:
        """Top-k of each query on the device (see :meth:`Scorer.search`).

        Returns
        -------
        SearchResults
            ids (B, k) int64 and scores (B, k) float32 on the host, equal to the
            NumPy reference's bit for bit. ``meta["timings"]``: ``prep_s`` (host
            prep, wall clock), ``h2d_s``, ``score_s``, ``topk_s``, ``d2h_s``
            (device time from CUDA events), ``total_s`` (wall clock); also
            ``n_chunks``, ``rows_per_chunk``, ``candidates``, ``tiles_scored``,
            ``overflow_rows``, ``haystack_rows``, ``stripes``.
        """
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        k = int(k)
        t0 = time.perf_counter()
        batch = self.prepare(queries, allow)
        B = batch.n_rows
        prep_s = time.perf_counter() - t0
        res = empty_results(B, k)
        stats = {"n_chunks": 0, "rows_per_chunk": 0, "candidates": 0, "tiles_scored": 0, "overflow_rows": 0,
                 "haystack_rows": 0, "oom_retries": 0,
                 "stripes": self.stripes(int((batch.path == PATH_TILES).sum()))}
        timings: dict[str, float] = {}
        live = np.flatnonzero(batch.path != PATH_NONE)
        if live.size and self.index.n_docs:
            cp = self._cp
            timer = _Timer(cp)
            sub = batch.take(live)
            with self._lock, cp.cuda.Device(self.device_id), self._stream:
                self._search_rows(sub, k, timer, stats, res.ids, res.scores)
                self._stream.synchronize()
                timings = timer.totals()
        timings["prep_s"] = prep_s
        timings["total_s"] = time.perf_counter() - t0
        res.meta = {"backend": "cupy", "device": self._device_name, "timings": timings, **stats,
                    "n_tiles": self.n_tiles}
        return res

    def score_matrix(
        self,
        queries: Sequence[np.ndarray],
        allow: Sequence[np.ndarray | None] | None = None,
    ) -> np.ndarray:
        """Dense scores (B, N) float32 on the host; -inf for non-candidates (tile path only)."""
        batch = self.prepare(queries, allow, haystack="never")
        B, N = batch.n_rows, self.index.n_docs
        rows_out = np.full((B, N), -np.inf, dtype=np.float32)
        if B == 0 or N == 0:
            return rows_out
        cp = self._cp
        per_row = 4 * N + 64 + 8 * np.diff(batch.qt_off) + 4 * np.diff(batch.allow_off)
        budget = self.budget_bytes()
        if int(per_row.max()) > budget:
            raise self._too_big(int(per_row.max()), budget)
        with self._lock, cp.cuda.Device(self.device_id), self._stream:
            for s, e in self._chunks(per_row.astype(np.int64), budget):
                for s2 in range(s, e, _MAX_GRID_Y):
                    e2 = min(e, s2 + _MAX_GRID_Y)
                    sub = batch.take(np.arange(s2, e2))
                    R = e2 - s2
                    flags = sub.filtered.astype(np.int32) * ROW_FILTERED
                    inputs = [sub.qt_off.astype(np.int32), _nz(sub.qt_term, np.int32), _nz(sub.qt_mult, np.float32),
                              sub.row_const.astype(np.float32), flags, sub.allow_off, _nz(sub.allow_docs, np.int32)]
                    views, _, h2d_end, _, _ = self._ws.layout(inputs, [], [])
                    self._ws.h2d(h2d_end)
                    qt_off, qt_term, qt_mult, row_const, row_flags, allow_off, allow_docs = views
                    dense = cp.empty((R, N), dtype=cp.float32)
                    self._launch(_SCORE_FILE, f"tile_dense<{self.tile_threads}, {self.tile_docs}>",
                                 (self.n_tiles, R), (self.tile_threads,),
                                 (self.d_offsets, self.d_doc_ids, self.d_weights, self.d_term_ub, self.d_dir_row,
                                  self.d_dir_start, self.d_dir_max, np.int32(self.n_tiles), np.int64(N),
                                  qt_off, qt_term, qt_mult, row_const, np.int32(self.has_w0), row_flags,
                                  allow_off, allow_docs, dense, np.int32(R)))
                    rows_out[s2:e2] = dense.get()
                    del dense
            self._stream.synchronize()
        return rows_out


def _nz(a: np.ndarray, dtype) -> np.ndarray:
    """``a`` as ``dtype``, with one dummy element when empty (a kernel pointer must point somewhere)."""
    a = np.asarray(a, dtype=dtype)
    return a if a.size else np.zeros(1, dtype)
