"""The CuPy backend: one sealed segment on a CUDA device, statistics applied per search.

Results equal the NumPy reference's (:class:`~gpuir.backends.numpy_backend.NumpyScorer`)
bit for bit -- ids, float32 scores, tie order, padding -- on every run: each
posting's weight is computed on the device from its raw tf and document length
with the reference's float32 operations (:mod:`gpuir.backends.weights`), every
document's score is the same float32 additions in the same order (ascending term
id, see ``kernels/bm25_score.cu``), and selection is exact.

**Laid out once.** The constructor uploads the segment -- CSR lists, raw tf,
document lengths, and avgdl-independent summaries (max tf, min document length)
per term and per (long term, tile of 4,096 documents) -- and never re-weights
it: a store whose statistics change with every add (``gpuir.memory``) passes
them with each search (``stats=``, ``consts=``, ``live=``), and the segment's
device arrays stay as they are.

Per batch of B queries:

1. **Host prep, vectorised** (:func:`gpuir.backends.base.weigh_queries`,
   :func:`prepare_batch`): every row's distinct terms in ascending order, their
   multiplicities, float32 idf and absent-term weights, and the bm25l/bm25+
   constant C; allow-lists concatenated, range-checked and sorted; each filtered
   row sent to the tile path or the haystack path by the smaller estimated cost
   (:func:`choose_paths`).
2. **One host-to-device copy** of a chunk's inputs, from a pinned buffer, into
   device buffers reused across calls (:class:`_Workspace`, one per concurrent
   search, each with its own stream).
3. **Plan**: ``light_marks`` marks the tiles holding each row's short-list
   terms from their postings; ``tile_bounds`` computes every (row, tile) score
   bound from the summaries and the row's idf; ``seed_tiles`` picks each row's
   16 best-bound tiles.
4. **Score**: ``tile_score`` scores the seeds first, and their k-th best
   together (``select_topk`` on raw keys, ``seed_theta``) becomes the threshold;
   ``tile_list`` keeps the (row, tile) pairs whose bound still reaches it;
   ``tile_score`` scores them with persistent blocks, raising the threshold as
   it goes. In every visited tile only the 256-document sub-blocks whose bound
   reaches the threshold are read (``meta["blocks_scored"]`` /
   ``["blocks_skipped"]``), and only candidates that can still reach the top k
   are emitted. ``haystack_score`` scores rows with a small allow-list from a
   document-major copy of the segment (first, before the seeds' selection).
5. **Select**: ``select_topk`` (radix select + bitonic sort) for k <= 4096;
   above, ``pack_candidates`` + a device sort + ``decode_keys``.
6. **One device-to-host copy** of ids, scores, candidate counts, thresholds.
   A row whose candidates overflowed its slots is rerun with the threshold it
   reached, which bounds its candidates by the count it saw: the rerun fits.

Device memory: the segment (offsets int64, doc_ids int32, tfs int32: 8 bytes per
posting; document lengths, 4 bytes per document), the tile directory (28 bytes
per (long term, tile) and 4 per impact), the forward copy if used (8 bytes per
posting), and per row 8 x (candidate slots) + 20 x (tiles) + 20 k + 128 bytes. Batches are cut into
chunks that fit the memory budget; on an out-of-memory error the pool is freed
and the budget halved.

Concurrency: ``search`` may be called from many threads. Each call takes its
own workspace and stream from a pool, so concurrent searches overlap on the
device; the segment's arrays are read only.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._compat import cuda_device, device_unavailable
from ..bm25 import BM25Params
from ..index.csr import CSRIndex, check_postings_sorted
from ..results import SearchResults, empty_results
from . import kernels as K
from .base import CollectionStats, Scorer, WeightedQueries, check_queries, own_weighing, weigh_queries
from .batch_plan import weigh_static
from .weights import has_absent_weight, numpy_row_sums, term_weights

__all__ = ["CupyScorer", "build_directory", "candidate_slots", "check_allow", "check_queries", "choose_paths",
           "frontiers", "numpy_row_sums", "pack_summaries", "prepare_batch", "search_consts"]

_log = logging.getLogger("gpuir.backends.cupy")
_SCORE_FILE, _TOPK_FILE = "bm25_score.cu", "topk.cu"
_ELEMWISE_BLOCK = 256
_MAX_GRID = 1 << 20
_MAX_GRID_Y = 65535
ROW_FILTERED, ROW_OFF_TILES = 1, 2  # kernels/bm25_score.cu row_flags
PATH_NONE, PATH_TILES, PATH_HAYSTACK = 0, 1, 2
HAYSTACK_MODES = ("auto", "never", "always")
#: Light terms 0..LIGHT_BITS-1 of a row have their tiles marked from their postings (light_marks).
LIGHT_BITS = 64


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


# =============================================================================
# Host-side pieces, pure NumPy (tested without a device)
# =============================================================================
def pack_summaries(max_tf: np.ndarray, min_dl: np.ndarray, xp: Any = np) -> np.ndarray:
    """(tf, document length) pairs as the kernels read them (``common.cuh``: ``bound_of``).

    Parameters
    ----------
    max_tf, min_dl : ndarray (m,), integer
        A tf (0: no posting) and a document length.

    Returns
    -------
    ndarray (m,), uint32
        ``min(tf, 0xFFFF) | min(dl, 0xFFFF) << 16``; 0 for tf 0. A tf of 0xFFFF
        means "65,535 or more" (the kernel bounds it by tfc's limit); capping the
        length from above only lowers it, which raises the bound.
    """
    mt = xp.minimum(xp.asarray(max_tf).astype(xp.int64), 0xFFFF)
    md = xp.minimum(xp.asarray(min_dl).astype(xp.int64), 0xFFFF)
    return xp.where(mt > 0, mt | (md << 16), 0).astype(xp.uint32)


def running_max(v: Any, xp: Any = np) -> Any:
    """Inclusive running maximum of a 1-D array (NumPy's ``maximum.accumulate``; CuPy has none: a doubling scan)."""
    if xp is np:
        return np.maximum.accumulate(v)
    run = v.copy()
    step, n = 1, int(run.size)
    while step < n:
        run[step:] = xp.maximum(run[step:], run[:-step])
        step *= 2
    return run


def frontiers(blk: Any, tf: Any, dl: Any, n_blocks: int, xp: Any = np, blocks: bool = False) -> tuple[Any, Any]:
    """The impacts of each block: its (tf, document length) pairs that no other pair dominates.

    Every BM25 variant's weight grows with tf and shrinks with the document
    length, so a block's largest weight -- for any collection statistics -- is
    the weight of one of its non-dominated pairs (Lucene's "impacts"): the
    pairs (tf, dl) such that no posting of the block has tf' >= tf and
    dl' <= dl with one of them strict. The kernels bound a block by the largest
    ``bound_of`` over its impacts: as tight as a precomputed block maximum, and
    valid whatever N, df and avgdl the search brings.

    Parameters
    ----------
    blk : ndarray (m,), int64
        Block of each posting, in [0, n_blocks) (any order).
    tf, dl : ndarray (m,), integer
        The posting's tf and its document's length (capped at 0xFFFF as in :func:`pack_summaries`).
    xp : numpy or cupy

    blocks : bool
        Return each impact's block (int64 (n,), ascending) instead of the (n_blocks+1,) offsets:
        for many small blocks, most of them empty (:func:`sub_block_impacts`).

    Returns
    -------
    off : ndarray (n_blocks+1,), int64
        Block b's impacts are ``pairs[off[b]:off[b+1]]`` (none for an empty block).
        With ``blocks=True``: the block of each impact, int64 (n,), non-decreasing.
    pairs : ndarray (n,), uint32
        :func:`pack_summaries` of each impact, tf descending within a block.
    """
    if int(blk.size) == 0:
        return xp.zeros(0 if blocks else n_blocks + 1, xp.int64), xp.zeros(0, xp.uint32)
    t = xp.minimum(xp.asarray(tf).astype(xp.int64), 0xFFFF)
    d = xp.minimum(xp.asarray(dl).astype(xp.int64), 0xFFFF)
    comp = (xp.asarray(blk).astype(xp.int64) << 32) | ((0xFFFF - t) << 16) | d  # block asc, tf desc, dl asc
    del t, d
    comp = xp.sort(comp)
    key = comp >> 16
    first = xp.concatenate([xp.ones(1, bool), key[1:] != key[:-1]])  # the shortest document of each tf
    del key
    comp = comp[first]
    b, t, d = comp >> 32, 0xFFFF - ((comp >> 16) & 0xFFFF), comp & 0xFFFF
    del comp
    run = running_max((b << 17) | (0x1FFFF - d), xp)  # within a block: the shortest length so far
    prev = xp.concatenate([xp.full(1, -1, xp.int64), run[:-1]])
    keep = ((prev >> 17) != b) | ((0x1FFFF - (prev & 0x1FFFF)) > d)  # first of its block, or strictly shorter
    b, t, d = b[keep], t[keep], d[keep]
    if blocks:
        return b, (t | (d << 16)).astype(xp.uint32)
    off = xp.searchsorted(b, xp.arange(n_blocks + 1, dtype=xp.int64), side="left").astype(xp.int64)
    return off, (t | (d << 16)).astype(xp.uint32)


#: Sub-blocks per tile (``kernels/bm25_score.cu``: GPUIR_SUBS): each has its own impacts.
SUBS = 16
#: Most impacts a sub-block keeps (a 4-bit count); longer frontiers are merged into an upper bound.
SUB_MAX_IMPACTS = 15


def sub_block_impacts(sub: Any, tf: Any, dl: Any, n_cells: int, xp: Any = np) -> tuple[Any, Any, Any]:
    """The impacts of each (directory cell, sub-block), at most :data:`SUB_MAX_IMPACTS` each.

    Parameters
    ----------
    sub : ndarray (m,), int64
        ``cell * SUBS + s`` of each posting: its directory cell (row x n_tiles + tile) and the
        sub-block s (of ``tile / SUBS`` documents) of the tile holding its document.
    tf, dl : ndarray (m,), integer
        The posting's tf and its document's length.
    n_cells : int

    Returns
    -------
    off : ndarray (n_cells+1,), int64
        Cell c's impacts are ``pairs[off[c]:off[c+1]]``, sub-block by sub-block.
    cnt : ndarray (n_cells,), uint64
        Bits 4s..4s+3: the number of impacts of sub-block s (0: no posting there).
    pairs : ndarray (n,), uint32
        Packed (tf, length) pairs (:func:`pack_summaries`). A sub-block whose frontier is
        longer than :data:`SUB_MAX_IMPACTS` keeps its first 14 pairs (tf descending, so length
        descending too) and one pair (the 15th's tf, the last's length) that dominates the rest:
        its bound is still an upper bound of every posting of the sub-block.
    """
    b, pairs = frontiers(sub, tf, dl, 0, xp, blocks=True)
    if int(b.size) == 0:
        return xp.zeros(n_cells + 1, xp.int64), xp.zeros(max(n_cells, 1), xp.uint64), pairs
    first = xp.searchsorted(b, b, side="left")
    last = xp.searchsorted(b, b, side="right") - 1
    rank = xp.arange(b.size, dtype=xp.int64) - first
    cap = SUB_MAX_IMPACTS - 1
    merged = (rank == cap) & (last - first > cap)  # the pair that stands for ranks 14.. of its block
    pairs = xp.where(merged, (pairs & xp.uint32(0xFFFF)) | (pairs[last] & xp.uint32(0xFFFF0000)), pairs)
    keep = rank <= cap
    b, pairs = b[keep], pairs[keep].astype(xp.uint32)
    cell, s = b // SUBS, b % SUBS
    n = xp.minimum(xp.searchsorted(b, b, side="right") - xp.searchsorted(b, b, side="left"), SUB_MAX_IMPACTS)
    val = n.astype(xp.uint64) << (4 * s).astype(xp.uint64)
    head = xp.concatenate([xp.ones(1, bool), b[1:] != b[:-1]])  # one value per sub-block
    val = xp.where(head, val, xp.uint64(0))
    csum = xp.concatenate([xp.zeros(1, xp.uint64), xp.cumsum(val, dtype=xp.uint64)])
    off = xp.searchsorted(cell, xp.arange(n_cells + 1, dtype=xp.int64), side="left").astype(xp.int64)
    cnt = csum[off[1:]] - csum[off[:-1]]  # distinct nibbles: the sum is their bitwise or
    return off, cnt.astype(xp.uint64), pairs


#: Postings per chunk when building a directory (bounds the temporaries: ~40 bytes each).
DIRECTORY_CHUNK = 1 << 25


def build_directory(offsets: Any, doc_ids: Any, tfs: Any, doc_lens: Any, tile: int, n_tiles: int, min_df: int,
                    xp: Any = np) -> dict[str, Any]:
    """A segment's statistics-free summaries: impacts per term, and per (term with >= ``min_df`` postings, tile).

    Built with ``xp`` (NumPy on the host, CuPy on the device), over chunks of
    whole terms of at most :data:`DIRECTORY_CHUNK` postings (a term longer than
    that is a chunk of its own), so the temporaries stay bounded.

    Returns
    -------
    dict of xp arrays
        ``dir_row`` (V,) int32: row of each term in the directory, -1 for terms without one;
        ``dir_start`` (H*(n_tiles+1),) int32: row r, column j: index of term r's first
        posting in tile j (documents [j*tile, (j+1)*tile)), relative to ``offsets[t]``;
        column n_tiles is df; ``dir_imp_off`` (H*n_tiles+1,) int64 and ``dir_imp`` uint32: the
        impacts (:func:`frontiers`) of each (row, tile); ``term_imp_off`` (V+1,) int64 and
        ``term_imp`` uint32: the impacts of each light term's whole list (empty for directory terms);
        ``dir_sub_off`` (H*n_tiles+1,) int64, ``dir_sub_cnt`` (max(H*n_tiles, 1),) uint64 and
        ``dir_sub_imp`` uint32: the impacts of each (row, tile)'s :data:`SUBS` sub-blocks of
        ``tile / SUBS`` documents (:func:`sub_block_impacts`: 8 + 8 bytes per cell, 4 per impact);
        ``dir_sub_end`` (max(H*n_tiles, 1)*SUBS,) uint16: row r, tile j, sub-block s: the postings of
        term r in sub-blocks 0..s of tile j (so sub-block s's postings start at ``offsets[t] +
        dir_start[r, j] + dir_sub_end[cell, s-1]``, no search; 32 bytes per cell).
    """
    offsets_x = xp.asarray(offsets).astype(xp.int64)
    off_h = np.asarray(offsets.get() if hasattr(offsets, "get") and not isinstance(offsets, np.ndarray)
                       else offsets, np.int64)
    doc_ids = xp.asarray(doc_ids)
    tfs = xp.asarray(tfs)
    doc_lens = xp.asarray(doc_lens)
    V = off_h.size - 1
    df_h = np.diff(off_h)
    heavy_h = np.flatnonzero(df_h >= max(1, int(min_df)))
    H = heavy_h.size
    row_h = np.full(V, -1, np.int32)
    row_h[heavy_h] = np.arange(H, dtype=np.int32)
    dir_start = np.zeros((max(H, 1), n_tiles + 1), np.int32) if xp is np else xp.zeros((max(H, 1), n_tiles + 1),
                                                                                       xp.int32)
    dir_parts, dir_counts = [], xp.zeros(H * n_tiles + 1, xp.int64)
    sub_parts, sub_counts, sub_cnt = [], xp.zeros(H * n_tiles + 1, xp.int64), xp.zeros(max(H * n_tiles, 1), xp.uint64)
    # postings of each (row, tile, sub-block), scattered at the last posting of each run, summed up per cell below
    sub_end = xp.zeros(max(H * n_tiles, 1) * SUBS, xp.int32)
    if tile % SUBS:
        raise ValueError(f"a tile of {tile} documents does not split into {SUBS} sub-blocks")
    term_parts, term_counts = [], xp.zeros(V + 1, xp.int64)
    t0 = 0
    while t0 < V:  # chunks of whole terms
        t1 = int(np.searchsorted(off_h, off_h[t0] + DIRECTORY_CHUNK, side="right")) - 1
        t1 = min(max(t1, t0 + 1), V)
        p0, p1 = int(off_h[t0]), int(off_h[t1])
        if p1 > p0:
            pos = xp.arange(p0, p1, dtype=xp.int64)
            term_of = xp.searchsorted(offsets_x[t0:t1 + 1], pos, side="right").astype(xp.int64) - 1 + t0
            del pos
            d = doc_ids[p0:p1]
            tl = d.astype(xp.int64) // tile
            dl = doc_lens[d]
            row = xp.asarray(row_h[t0:t1])[term_of - t0]
            hv = row >= 0
            if bool(hv.any()):
                rows_here = heavy_h[(heavy_h >= t0) & (heavy_h < t1)]
                comp = term_of * (n_tiles + 1) + tl  # non-decreasing within the chunk
                grid = (xp.asarray(rows_here, dtype=xp.int64)[:, None] * (n_tiles + 1)
                        + xp.arange(n_tiles + 1, dtype=xp.int64)[None, :])
                st = xp.searchsorted(comp, grid.reshape(-1), side="left").reshape(rows_here.size, n_tiles + 1)
                st = st - (xp.asarray(off_h[rows_here]) - p0)[:, None]
                st[:, n_tiles] = xp.asarray(df_h[rows_here])
                dir_start[row_h[rows_here]] = st.astype(xp.int32)
                del comp, grid, st
                off, pairs = frontiers(row[hv].astype(xp.int64) * n_tiles + tl[hv], tfs[p0:p1][hv], dl[hv],
                                       H * n_tiles, xp)
                dir_counts[1:] += off[1:] - off[:-1]
                dir_parts.append(pairs)
                cell = row[hv].astype(xp.int64) * n_tiles + tl[hv]
                sb = (d[hv].astype(xp.int64) % tile) // (tile // SUBS)
                off, cnt, pairs = sub_block_impacts(cell * SUBS + sb, tfs[p0:p1][hv], dl[hv], H * n_tiles, xp)
                sub_counts[1:] += off[1:] - off[:-1]
                sub_cnt += cnt
                sub_parts.append(pairs)
                key = cell * SUBS + sb  # non-decreasing: terms ascending, documents ascending in a term
                last = xp.ones(key.size, dtype=bool)
                last[:-1] = key[1:] != key[:-1]
                at = xp.flatnonzero(last)
                sub_end[key[at]] = xp.diff(xp.concatenate([xp.zeros(1, at.dtype) - 1, at])).astype(xp.int32)
                del key, last, at
                del cell, sb, cnt
            lt = ~hv
            if bool(lt.any()):
                off, pairs = frontiers(term_of[lt], tfs[p0:p1][lt], dl[lt], V, xp)
                term_counts[1:] += off[1:] - off[:-1]
                term_parts.append(pairs)
            del term_of, d, tl, dl, row, hv
        t0 = t1
    # a block's impacts come from one chunk (whole terms per chunk): concatenating keeps them grouped by block
    dir_imp = xp.concatenate(dir_parts) if dir_parts else xp.zeros(0, xp.uint32)
    term_imp = xp.concatenate(term_parts) if term_parts else xp.zeros(0, xp.uint32)
    sub_imp = xp.concatenate(sub_parts) if sub_parts else xp.zeros(0, xp.uint32)
    # a cell's postings in sub-blocks 0..s (<= tile <= 65535: uint16), relative to the tile's first posting
    if tile > 65535:
        raise ValueError(f"a tile of {tile} documents does not fit the uint16 sub-block ends")
    sub_end = xp.cumsum(sub_end.reshape(-1, SUBS), axis=1).astype(xp.uint16).reshape(-1)
    return {"dir_sub_end": sub_end, "dir_sub_off": xp.cumsum(sub_counts).astype(xp.int64), "dir_sub_cnt": sub_cnt,
            "dir_sub_imp": _nzx(sub_imp, xp), "dir_row": xp.asarray(row_h), "dir_start": dir_start.reshape(-1).astype(xp.int32)
            if H else xp.zeros(n_tiles + 1, xp.int32), "dir_imp_off": xp.cumsum(dir_counts).astype(xp.int64),
            "dir_imp": _nzx(dir_imp, xp), "term_imp_off": xp.cumsum(term_counts).astype(xp.int64),
            "term_imp": _nzx(term_imp, xp)}


def _nzx(a: Any, xp: Any) -> Any:
    return a if int(a.size) else xp.zeros(1, a.dtype)


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
    qt_term: np.ndarray       # (T,) int32, ascending within a row, only terms with postings here
    qt_mult: np.ndarray       # (T,) float32 multiplicities
    qt_idf: np.ndarray        # (T,) float32 idf under the search's statistics
    qt_w0: np.ndarray         # (T,) float32 absent-term weights
    row_const: np.ndarray     # (R,) float32 C (bm25l/bm25+; 0 otherwise)
    filtered: np.ndarray      # (R,) bool
    allow_off: np.ndarray     # (R+1,) int64
    allow_docs: np.ndarray    # (A,) int32 sorted unique per row
    path: np.ndarray          # (R,) int8 PATH_*
    sumdf: np.ndarray         # (R,) int64 postings of the row's terms here
    rows: np.ndarray          # (R,) int64: positions of these rows in the caller's batch

    @property
    def n_rows(self) -> int:
        return self.rows.size

    def take(self, sel: np.ndarray) -> Batch:
        """The rows ``sel`` (ascending positions), offsets rebased, vectorised."""
        sel = np.asarray(sel, np.int64)
        qt_idx, qt_off = _take_ranges(self.qt_off, sel)
        a_idx, a_off = _take_ranges(self.allow_off, sel)
        return Batch(qt_off, self.qt_term[qt_idx], self.qt_mult[qt_idx], self.qt_idf[qt_idx], self.qt_w0[qt_idx],
                     self.row_const[sel], self.filtered[sel], a_off, self.allow_docs[a_idx], self.path[sel],
                     self.sumdf[sel], self.rows[sel])


def _take_ranges(off: np.ndarray, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lens = off[sel + 1] - off[sel]
    new = np.zeros(sel.size + 1, np.int64)
    np.cumsum(lens, out=new[1:])
    idx = np.repeat(off[sel] - new[:-1], lens) + np.arange(int(new[-1]), dtype=np.int64)
    return idx, new


def prepare_batch(wq: WeightedQueries, filtered: np.ndarray, allow_off: np.ndarray, allow_docs: np.ndarray, *,
                  df: np.ndarray, n_tiles: int, tile: int, postings_per_doc: float, haystack: str) -> Batch:
    """The device rows of a weighted batch: only terms with postings in this segment, and each row's path.

    Parameters
    ----------
    wq : WeightedQueries
        The batch under the search's statistics (:func:`gpuir.backends.base.weigh_queries`).
    filtered, allow_off, allow_docs : from :func:`check_allow`
    df : ndarray (V,), int64, host
        Postings of each term in this segment.
    """
    B = wq.n_rows
    prow = np.repeat(np.arange(B, dtype=np.int64), np.diff(wq.off))
    keep = df[wq.terms] > 0 if wq.terms.size else np.zeros(0, bool)
    prow, pterm = prow[keep], wq.terms[keep]
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
    return Batch(qt_off, pterm.astype(np.int32), wq.mult[keep].astype(np.float32), wq.idf[keep], wq.w0[keep],
                 wq.const.astype(np.float32), filtered, allow_off, allow_docs, path, sumdf,
                 np.arange(B, dtype=np.int64))


def candidate_slots(batch: Batch, k: int, n_docs: int, cap: int | None = None) -> np.ndarray:
    """Candidate slots of each row (int64 (R,)).

    Haystack rows: their allow-list size (one key per allowed document, no
    overflow). Tile rows: min(an upper bound on their candidates, ``cap``,
    default 4k + 16384); an overflow is detected and the row rerun with the
    threshold it reached. A tile's threshold is its own k-th best score, so a
    row whose top k is spread over many tiles emits many candidates: the
    scorer raises ``cap`` to what its memory budget allows (reruns cost a
    second pass; slots cost 8 bytes).
    """
    allow_len = np.diff(batch.allow_off)
    upper = np.minimum(batch.sumdf, n_docs)
    upper = np.where(batch.filtered, np.minimum(upper, allow_len), upper)
    slots = np.minimum(upper, 4 * k + 16384 if cap is None else max(int(cap), 4 * k + 16384))
    slots = np.where(batch.path == PATH_HAYSTACK, allow_len, slots)
    return np.where(batch.path == PATH_NONE, 0, slots).astype(np.int64)


def light_pairs(batch: Batch, dir_row: np.ndarray, df: np.ndarray) -> tuple[np.ndarray, ...]:
    """The (row, term) pairs whose tiles ``light_marks`` marks from their postings.

    Terms without a directory row ("light": short lists), at positions < :data:`LIGHT_BITS`
    in rows on the tile path.

    Returns
    -------
    lt_row, lt_term, lt_bit : ndarray (L,), int32, host
    lt_start : ndarray (L+1,), int64, host: prefix sum of the pairs' posting counts
    """
    R = batch.n_rows
    prow = np.repeat(np.arange(R, dtype=np.int64), np.diff(batch.qt_off))
    pos = np.arange(batch.qt_term.size, dtype=np.int64) - batch.qt_off[prow] if prow.size else prow
    sel = (dir_row[batch.qt_term] < 0) & (pos < LIGHT_BITS) & (batch.path[prow] == PATH_TILES) \
        if prow.size else np.zeros(0, bool)
    lt_term = batch.qt_term[sel].astype(np.int32)
    start = np.zeros(lt_term.size + 1, np.int64)
    np.cumsum(df[lt_term], out=start[1:])
    return prow[sel].astype(np.int32), lt_term, pos[sel].astype(np.int32), start


@dataclass(frozen=True)
class SearchConsts:
    """The float32 constants of one search's weight arithmetic, in the kernels' parameter order.

    ``one_minus_b`` and ``k1p1`` are float32 operations on float32 values, as
    :func:`gpuir.bm25.tfc` computes them.
    """

    method: np.int32
    k1: np.float32
    b: np.float32
    one_minus_b: np.float32
    k1p1: np.float32
    delta: np.float32
    avgdl: np.float32
    has_w0: np.int32

    def args(self) -> tuple:
        return (self.method, self.k1, self.b, self.one_minus_b, self.k1p1, self.delta, self.avgdl, self.has_w0)


def search_consts(params: BM25Params, avgdl: float) -> SearchConsts:
    f32 = np.float32
    k1, b = f32(params.k1), f32(params.b)
    return SearchConsts(np.int32(params.code), k1, b, f32(f32(1) - b), f32(k1 + f32(1)), f32(params.delta),
                        f32(avgdl), np.int32(has_absent_weight(params)))


def live_bits(live: np.ndarray, n_docs: int) -> np.ndarray:
    """A bool (N,) liveness mask as the kernels' bitmap: uint32 (ceil(N/32),), bit d of word d // 32."""
    live = np.asarray(live)
    if live.dtype != bool or live.shape != (n_docs,):
        raise ValueError(f"live must be a bool array of shape ({n_docs},), got {live.dtype} {live.shape}")
    packed = np.packbits(live, bitorder="little")
    out = np.zeros(-(-n_docs // 32) * 4, np.uint8)
    out[:packed.size] = packed
    return out.view(np.uint32)


# =============================================================================
# Device-side pieces
# =============================================================================
class _Timer:
    """Per-phase device time from CUDA events on the current stream (seconds); a no-op when off."""

    def __init__(self, cupy: Any, on: bool = True):
        self.cp = cupy
        self.on = on
        self.marks: list[tuple[str, Any, Any]] = []

    @contextlib.contextmanager
    def phase(self, name: str):
        if not self.on:
            yield
            return
        start = self.cp.cuda.Event()
        start.record()
        try:
            yield
        finally:
            end = self.cp.cuda.Event()
            end.record()
            self.marks.append((name, start, end))

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, a, b in self.marks:
            b.synchronize()
            out[name] = out.get(name, 0.0) + self.cp.cuda.get_elapsed_time(a, b) / 1e3
        return out


class _Workspace:
    """Device and pinned host buffers and a stream, reused across calls by one search at a time.

    One buffer holds a chunk's inputs, then its state (counts, thresholds,
    tiles scored, best tiles, the item count), then its outputs (ids, scores),
    each 8-byte aligned: the inputs and the state go up in ONE host-to-device
    copy of the prefix, the state and the outputs come back in ONE
    device-to-host copy of the suffix. Every byte copied back was either copied
    up or written by a kernel (compute-sanitizer initcheck stays quiet).
    Scratch arrays that never leave the device (bounds, marks, work items,
    candidates) are kept by name and grown on demand.
    """

    ALIGN = 8

    def __init__(self, cp: Any):
        self.cp = cp
        self.host: np.ndarray | None = None
        self._host_mem: Any = None
        self.dev: Any = None
        self._scratch: dict[str, Any] = {}
        self.stream = cp.cuda.Stream(non_blocking=True)
        #: Held while a graph's workspace is in use (a graph belongs to one workspace).
        self.lock = threading.Lock()

    def _grow(self, nbytes: int) -> None:
        cp = self.cp
        if self.dev is None or self.dev.size < nbytes:
            size = _next_pow2(max(nbytes, 1 << 16))
            self.dev = None
            self.dev = cp.empty(size, dtype=cp.uint8)
            self._host_mem = cp.cuda.alloc_pinned_memory(size)
            self.host = np.frombuffer(self._host_mem, np.uint8, size)

    def scratch(self, name: str, n: int, dtype: Any) -> Any:
        """A device array of at least n elements (never read before written, or zeroed by the caller)."""
        a = self._scratch.get(name)
        if a is None or a.size < max(n, 1):
            self._scratch[name] = None
            a = self._scratch[name] = self.cp.empty(_next_pow2(max(n, 1024)), dtype=dtype)
        return a

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

    def h2d(self, end: int, start: int = 0) -> None:
        """Copy staged bytes [start, end) up (not blocking)."""
        if end > start:
            self.dev[start:end].set(self.host[start:end], stream=self.stream)

    def d2h(self, start: int, end: int) -> None:
        """Copy bytes [start, end) back into the pinned buffer."""
        if end > start:  # not blocking: callers synchronize the stream (a graph capture may not)
            self.dev[start:end].get(out=self.host[start:end], stream=self.stream, blocking=False)

    def read(self, off: int, shape: tuple, dtype) -> np.ndarray:
        """A copy of what the last :meth:`d2h` brought back at ``off``."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        return self.host[off:off + n].view(dt).reshape(shape).copy()


#: Most candidate slots a row gets (8 bytes each).
MAX_SLOTS = 1 << 22
#: Batches of at most this many rows (after dropping rows with no candidate) run as a CUDA graph.
GRAPH_MAX_ROWS = 64
#: Per graph row: query terms, allow-list entries (more, or haystack rows, take the ordinary path).
GRAPH_TERMS_PER_ROW = 64
GRAPH_ALLOW_PER_ROW = 1 << 14
#: Large batches run as pieces of this many queries, two at a time (CupyScorer.pipeline_rows).
PIPELINE_ROWS = 256
#: Graph shapes a scorer keeps (least recently used dropped first).
GRAPH_CACHE = 16
#: Graphs of one shape a scorer captures at most: one per thread asking at once (each its own
#: workspace and stream), so concurrent questions do not wait behind one graph.
GRAPH_POOL = 8


@dataclass(frozen=True)
class _TermCache:
    """idf and w0 of every term under the scorer's own statistics, computed once (what
    :func:`~gpuir.backends.batch_plan.weigh_static` reads as ``static.pw``)."""

    stats: CollectionStats
    pw: Any


class _Graph:
    """One captured CUDA graph of the whole tile pipeline for a fixed shape, and its workspace.

    Shape: R rows (a power of two <= :data:`GRAPH_MAX_ROWS`), k, and the search's
    arithmetic constants (kernel arguments are baked into a graph). Inputs live
    at fixed places in a pinned buffer, padded to fixed capacities (padding rows
    have no terms and are off the tile path), so a search is: stage the inputs,
    one host-to-device copy, one graph launch (every kernel), one device-to-host
    copy, wait, read. CuPy refuses copies on a capturing stream, so the copies
    stay outside the graph. Replaces 8-10 kernel launches, each a Python call
    into CuPy, by one.
    """

    #: Candidate slots per row beyond 4k (rows that overflow are rerun the ordinary way).
    SLOTS_EXTRA = 1 << 17

    def __init__(self, scorer: CupyScorer, R: int, k: int, sc: SearchConsts, live: tuple[Any, np.int32]):
        cp = scorer._cp
        self.R, self.k = R, k
        self.T, self.A = GRAPH_TERMS_PER_ROW * R, GRAPH_ALLOW_PER_ROW * R
        self.slots = 4 * k + self.SLOTS_EXTRA
        self.ws = _Workspace(cp)
        self.live = live
        T, A = self.T, self.A
        specs_in = [(R + 1, np.int32), (T, np.int32), (T, np.float32), (T, np.float32), (T, np.float32),
                    (R, np.float32), (R, np.int32), (R + 1, np.int64), (A, np.int32), (R + 1, np.int64),
                    (T, np.int32), (T, np.int32), (T, np.int32), (T + 1, np.int64)]
        specs_state = [(R, np.int32), (R, np.uint32), (R, np.int32), (R, np.int32), (R, np.int32), (1, np.int32)]
        self.inputs = [np.zeros(n, dt) for n, dt in specs_in]
        self.state = [np.zeros(n, dt) for n, dt in specs_state]
        views, self.offs, self.h2d_end, self.state_start, self.total = self.ws.layout(
            self.inputs, self.state, [((R, k), np.int64), ((R, k), np.float32)])
        self.views = views
        cells = R * scorer.n_tiles
        ws = self.ws
        self.ukey = ws.scratch("ukey", cells, cp.uint32)
        self.lmask = ws.scratch("lmask", cells, cp.uint64)
        self.items = ws.scratch("items", cells, cp.uint64)
        self.seeds = ws.scratch("seeds", R * K.SEED_TILES, cp.uint64)
        self.sub_ub = ws.scratch("sub_ub", max(cells, R * K.SEED_TILES) * SUBS, cp.uint32)
        self.seedk = ws.scratch("seedk", R * k, cp.int64)[:R * k]
        self.cand = ws.scratch("cand", R * self.slots, cp.uint64)
        segs = scorer.select_segments(R, k, self.slots)
        self.segs = segs
        if segs > 1:
            self.part = ws.scratch("part", R * segs * k, cp.int64)[:R * segs * k].reshape(R * segs, k)
            self.part_off = cp.asarray(np.arange(R + 1, dtype=np.int64) * (segs * k))
            self.part_counts = cp.asarray(np.full(R, segs * k, np.int32))
        blocks = scorer.persistent_blocks()
        for f, names in ((_SCORE_FILE, K.NAME_EXPRESSIONS[_SCORE_FILE]), (_TOPK_FILE, K.NAME_EXPRESSIONS[_TOPK_FILE])):
            for name in names:  # load the modules now: a module load cannot happen inside a capture
                K.kernel(f, name, scorer.device_id)
        with ws.stream:
            ws.stream.synchronize()
            mode = getattr(cp.cuda.runtime, "streamCaptureModeRelaxed", 2)
            ws.stream.begin_capture(mode=mode)
            try:
                self._record(scorer, sc, blocks)
            finally:
                self.graph = ws.stream.end_capture()
        #: Times the graph ran.
        self.runs = 0

    def _record(self, scorer: CupyScorer, sc: SearchConsts, blocks: int) -> None:
        cp, R, k = scorer._cp, self.R, self.k
        TT, TD = scorer.tile_threads, scorer.tile_docs
        (qt_off, qt_term, qt_mult, qt_idf, qt_w0, row_const, row_flags, allow_off, allow_docs, cand_off, lt_row,
         lt_term, lt_bit, lt_start, counts, theta, tiles, b_scored, b_skipped, n_items, out_ids,
         out_scores) = self.views
        bm = sc.args()
        n_tiles = scorer.n_tiles
        self.lmask[:R * n_tiles].fill(0)
        scorer._launch(_SCORE_FILE, f"light_marks<{TT}, {TD}>", (2 * scorer.sm_count,), (TT,),
                       (scorer.d_offsets, scorer.d_doc_ids, lt_row, lt_term, lt_bit, lt_start, np.int32(self.T),
                        np.int32(n_tiles), self.lmask))
        scorer._plan(R, qt_off, qt_term, qt_mult, qt_idf, qt_w0, row_const, row_flags, allow_off, allow_docs,
                     self.lmask, self.ukey, self.seeds, bm)
        scorer._score_tiles(R, k, self.live, qt_off, qt_term, qt_mult, qt_idf, qt_w0, row_const, row_flags, allow_off,
                            allow_docs, self.ukey, self.seeds, self.items, n_items, theta, counts, tiles, b_scored,
                            b_skipped, cand_off, self.cand, self.seedk, bm, self.sub_ub)
        kpad = _next_pow2(k)
        sel, block = f"select_topk<{K.SELECT_THREADS}>", (K.SELECT_THREADS,)
        cand, off, cnt = self.cand, cand_off, counts
        if self.segs > 1:
            segs = self.segs
            scorer._launch(_TOPK_FILE, sel, (R * segs,), block,
                           (cand, off, cnt, theta, np.int32(scorer.doc_bits), np.int32(k), np.int32(kpad),
                            np.int32(segs), np.int32(1), self.part, out_scores), shared_mem=8 * kpad)
            cand, off, cnt = self.part.view(cp.uint64).reshape(-1), self.part_off, self.part_counts
        scorer._launch(_TOPK_FILE, sel, (R,), block,
                       (cand, off, cnt, theta, np.int32(scorer.doc_bits), np.int32(k), np.int32(kpad), np.int32(1),
                        np.int32(0), out_ids, out_scores), shared_mem=8 * kpad)

    def fits(self, b: Batch, n_light: int) -> bool:
        return (b.n_rows <= self.R and b.qt_term.size <= self.T and b.allow_docs.size <= self.A
                and n_light <= self.T and not (b.path == PATH_HAYSTACK).any())

    def run(self, scorer: CupyScorer, b: Batch, theta0: np.ndarray, stats: dict) -> tuple[np.ndarray, ...]:
        """Stage ``b`` (at most R rows), launch, wait: (ids, scores, counts, theta, tiles, slots), rows of b."""
        R, n, ws = self.R, b.n_rows, self.ws
        lt_row, lt_term, lt_bit, lt_start = light_pairs(b, scorer._dir_row, scorer._df)
        flags = (b.filtered.astype(np.int32) * ROW_FILTERED) | np.where(b.path != PATH_TILES, ROW_OFF_TILES, 0)
        pad_flags = np.full(R, ROW_OFF_TILES, np.int32)
        pad_flags[:n] = flags
        fill = [(0, _pad(b.qt_off, R + 1)), (1, b.qt_term), (2, b.qt_mult), (3, b.qt_idf), (4, b.qt_w0),
                (5, b.row_const), (6, pad_flags), (7, _pad(b.allow_off, R + 1)), (8, b.allow_docs),
                (9, np.arange(R + 1, dtype=np.int64) * self.slots), (10, lt_row), (11, lt_term), (12, lt_bit),
                (13, _pad(lt_start, self.T + 1))]
        for i, x in fill:
            o = self.offs[i]
            dt = self.inputs[i].dtype
            x = np.asarray(x, dt)
            ws.host[o:o + x.nbytes] = x.view(np.uint8).reshape(-1)
        st = self.offs[14]
        state = np.zeros(self.total - st, np.uint8)  # counts, theta, tiles, blocks, n_items: zeros, then theta0
        ws.host[st:self.offs[20]] = state[:self.offs[20] - st]
        th = np.zeros(R, np.uint32)
        th[:n] = theta0
        ws.host[self.offs[15]:self.offs[15] + 4 * R] = th.view(np.uint8)
        # only the bytes in use: the allow-list region (GRAPH_ALLOW_PER_ROW * 4 bytes a row) up to its entries
        used = self.offs[8] + -(-4 * int(b.allow_docs.size) // _Workspace.ALIGN) * _Workspace.ALIGN
        self.copied = used + self.h2d_end - self.offs[9]
        ws.h2d(used)
        ws.h2d(self.h2d_end, self.offs[9])
        self.graph.launch(ws.stream)
        ws.d2h(self.state_start, self.total)
        ws.stream.synchronize()
        self.runs += 1
        o = self.offs
        stats["tile_items"] += int(ws.read(o[19], (1,), np.int32)[0])
        stats["light_pairs"] += int(lt_term.size)
        stats["blocks_scored"] += int(ws.read(o[17], (R,), np.int32)[:n].sum())
        stats["blocks_skipped"] += int(ws.read(o[18], (R,), np.int32)[:n].sum())
        stats["graph_runs"] += 1
        return (ws.read(o[20], (R, self.k), np.int64)[:n], ws.read(o[21], (R, self.k), np.float32)[:n],
                ws.read(o[14], (R,), np.int32)[:n], ws.read(o[15], (R,), np.uint32)[:n],
                ws.read(o[16], (R,), np.int32)[:n], np.full(n, self.slots, np.int64))


def _pad(a: np.ndarray, n: int) -> np.ndarray:
    """``a`` extended to n entries by repeating its last value (offsets of empty padding rows)."""
    out = np.empty(n, a.dtype)
    out[:a.size] = a
    out[a.size:] = a[-1] if a.size else 0
    return out


class CupyScorer(Scorer):
    """BM25 over one sealed segment on a CUDA device through CuPy (see the module docstring).

    Parameters
    ----------
    index : CSRIndex
        Host arrays; laid out and uploaded to the device once, here.
    params : BM25Params
    stats : CollectionStats, optional
        Default statistics of searches that pass none; default the index's own.
    memory_budget_bytes : int, optional
        Device bytes the per-batch buffers may use. Default: ``memory_fraction``
        of the device memory free when the scorer is made (measured again after
        an out-of-memory error).
    memory_fraction : float
        Share of free device memory used when no budget is given, in (0, 1].
    device : int, optional
        CUDA device number; default the current CuPy device.
    haystack : {"auto", "never", "always"}
        Whether filtered rows may be scored from a forward (document-major) copy
        of the index: "auto" picks per row by estimated cost (the copy, 8
        bytes per posting, is built on first use), "never" keeps every row on
        the tile path, "always" sends every filtered row there.
    timing : bool
        Record per-phase device times with CUDA events (``meta["timings"]``); off
        by default, since events cost host time on every search.
    graphs : bool
        Run batches of at most :data:`GRAPH_MAX_ROWS` rows (an agent's query) as a
        captured CUDA graph (:class:`_Graph`), one per (rows bucket, k, statistics).

    Attributes
    ----------
    pipeline_rows : int
        A search of more queries than this runs as pieces of this many, two at a
        time, each on its own workspace and stream (:data:`PIPELINE_ROWS`; 0: one
        piece): one piece's host preparation and copies overlap the other's
        scoring. Rows are independent, so the results are the same.

    Raises
    ------
    RuntimeError
        No usable CUDA device (the message says how to fix it).
    ValueError
        A posting list that is not strictly increasing (the kernels rely on it).
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
        timing: bool = False,
        graphs: bool = True,
    ):
        super().__init__(index, params, stats)
        usable, why = cuda_device()
        if not usable:
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
        self.timing = bool(timing)
        self.pipeline_rows = PIPELINE_ROWS
        self.graphs = bool(graphs)
        self.graph_error: str | None = None
        self._graphs: dict[tuple, list[_Graph]] = {}
        self.device_id = cupy.cuda.Device().id if device is None else int(device)
        self.tile_threads, self.tile_docs = K.TILE_THREADS, K.TILE_DOCS
        N = index.n_docs
        self.n_tiles = max(1, -(-N // self.tile_docs))
        self.doc_bits = max(1, int(N - 1).bit_length()) if N > 0 else 1
        if N >= 2**31 - self.tile_docs:
            raise ValueError(f"the cupy backend handles fewer than 2^31 - {self.tile_docs} documents, got {N}")
        check_postings_sorted(index.offsets, index.doc_ids)  # the race-free accumulation relies on it
        #: int64 (V,), host: postings of each term in this segment.
        self._df = np.diff(np.asarray(index.offsets, np.int64))
        self._postings_per_doc = index.n_postings / max(1, N)
        #: Terms with at least this many postings get a tile-directory row.
        self.dir_min_df = max(64, 2 * self.n_tiles)
        t0 = time.perf_counter()
        with cupy.cuda.Device(self.device_id):
            a = cupy.asarray
            #: Device arrays, uploaded once: offsets (V+1,) int64, doc_ids (P,) int32, tfs (P,) int32,
            #: doc_lens (N,) int32, and the directory (:func:`build_directory`): dir_row (V,) int32,
            #: dir_start (H*(n_tiles+1),) int32, dir_imp_off (H*n_tiles+1,) int64, dir_imp uint32,
            #: term_imp_off (V+1,) int64, term_imp uint32, and per (row, tile) the impacts of its 16
            #: sub-blocks: dir_sub_off (H*n_tiles+1,) int64, dir_sub_cnt uint64, dir_sub_imp uint32.
            self.d_offsets = a(np.ascontiguousarray(index.offsets, dtype=np.int64))
            self.d_doc_ids = a(np.ascontiguousarray(index.doc_ids, dtype=np.int32))
            self.d_tfs = a(np.ascontiguousarray(index.tfs, dtype=np.int32))
            self.d_doc_lens = a(np.ascontiguousarray(index.doc_lens, dtype=np.int32))
            self.upload_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            #: Where the directory was built ("device", or "host" and why).
            self.directory_built = "host (no device sort)"
            d = None
            if hasattr(cupy, "sort"):  # the real CuPy: build the directory there (sorts of the postings)
                try:
                    d = build_directory(self.d_offsets, self.d_doc_ids, self.d_tfs, self.d_doc_lens, self.tile_docs,
                                        self.n_tiles, self.dir_min_df, xp=cupy)
                    self.directory_built = "device"
                except Exception as e:  # noqa: BLE001 - the host build is exact too; say why it was used
                    self.directory_built = f"host ({type(e).__name__}: {e})"
                    _log.warning("building the tile directory on the device failed (%s); building it on the host",
                                 self.directory_built)
                    cupy.get_default_memory_pool().free_all_blocks()
            if d is None:
                d = {n: a(x) for n, x in build_directory(index.offsets, index.doc_ids, index.tfs, index.doc_lens,
                                                          self.tile_docs, self.n_tiles, self.dir_min_df).items()}
            self.d_dir_row, self.d_dir_start = d["dir_row"], d["dir_start"]
            self.d_dir_imp_off, self.d_dir_imp = d["dir_imp_off"], d["dir_imp"]
            self.d_term_imp_off, self.d_term_imp = d["term_imp_off"], d["term_imp"]
            self.d_dir_sub_off, self.d_dir_sub_cnt, self.d_dir_sub_imp = (d["dir_sub_off"], d["dir_sub_cnt"],
                                                                          d["dir_sub_imp"])
            self.d_dir_sub_end = d["dir_sub_end"]
            self._no_live = a(np.ones(1, np.uint32))
            self._dummy_f32 = a(np.zeros(1, np.float32))  # select_topk's unused score output (raw keys)
            try:
                sms = int(cupy.cuda.Device(self.device_id).attributes["MultiProcessorCount"])
            except Exception:  # noqa: BLE001 - informational; 132 = H100 SXM
                sms = 132
            # the uploads' stream, not the device: cudaDeviceSynchronize is refused while another thread
            # captures a graph (bench/results/bench_memory_device_NVIDIA_H200_1part_s32_threads_not_kept.log)
            cupy.cuda.get_current_stream().synchronize()
        #: int32 (V,), host: each term's directory row (-1: a light term).
        self._dir_row = _host(self.d_dir_row)
        #: Seconds spent building the directory (on the device with CuPy).
        self.layout_s = time.perf_counter() - t1
        self.directory_bytes = int(sum(int(x.nbytes) for x in d.values()))
        #: Streaming multiprocessors of the device.
        self.sm_count = max(1, sms)
        #: Times the segment was uploaded (once, here; the tests count it).
        self.uploads = 1
        self._fwd: tuple[Any, Any, Any] | None = None
        self._live: tuple[Any, Any] = (None, None)  # (host mask, device bits)
        self._lock = threading.Lock()  # the pool, the forward copy, the live bits, the budget
        self._pool: list[_Workspace] = []
        self._persistent: int | None = None
        self._terms: _TermCache | None = None
        self._free_bytes: int | None = None
        self._device_name = self._name()

    def _name(self) -> str:
        try:
            props = self._cp.cuda.runtime.getDeviceProperties(self.device_id)
            n = props["name"]
            return n.decode() if isinstance(n, bytes) else str(n)
        except Exception:  # noqa: BLE001  # pragma: no cover - informational only
            return f"CUDA device {self.device_id}"

    # -- memory --------------------------------------------------------------------
    def budget_bytes(self, refresh: bool = False) -> int:
        """The byte budget for one chunk's buffers (free memory measured once, and after an OOM)."""
        if self.memory_budget_bytes is not None:
            return self.memory_budget_bytes
        cp = self._cp
        with self._lock:
            if self._free_bytes is None or refresh:
                with cp.cuda.Device(self.device_id):
                    free, _ = cp.cuda.runtime.memGetInfo()
                self._free_bytes = int(free + cp.get_default_memory_pool().free_bytes())
            return int(self.memory_fraction * self._free_bytes)

    def row_bytes(self, slots: np.ndarray, k: int, batch: Batch) -> np.ndarray:
        """Device bytes each row of ``batch`` needs (int64 (R,))."""
        per = (8 * slots + 12 * k + 96 + 16 * np.diff(batch.qt_off) + 4 * np.diff(batch.allow_off)
               + (84 * self.n_tiles + 8 * k + (8 + 64) * K.SEED_TILES) * (batch.path == PATH_TILES))
        if k > K.SELECT_MAX_K:
            per = per + 8 * (3 * slots + 2 * k)  # packed keys, sort buffers, decoded top keys
        return per.astype(np.int64)

    @staticmethod
    def _chunks(per_row: np.ndarray, budget: int) -> list[tuple[int, int]]:
        """Greedy contiguous chunks whose bytes fit the budget (at least one row, at most 65,535 each)."""
        out, s, R = [], 0, per_row.size
        csum = np.concatenate([[0], np.cumsum(per_row)])
        while s < R:
            e = int(np.searchsorted(csum, csum[s] + budget, "right")) - 1
            e = min(max(e, s + 1), s + _MAX_GRID_Y, R)
            out.append((s, e))
            s = e
        return out

    def _too_big(self, need: int, budget: int) -> MemoryError:
        return MemoryError(
            f"one query over {self.index.n_docs} documents needs {need} bytes of device memory but the "
            f"budget is {budget} bytes: pass a larger memory_budget_bytes (or memory_fraction) to the cupy "
            "scorer, free device memory, lower k, or use backend='numpy'")

    def _acquire(self) -> _Workspace:
        with self._lock:
            if self._pool:
                return self._pool.pop()
        with self._cp.cuda.Device(self.device_id):
            return _Workspace(self._cp)

    def _release(self, ws: _Workspace) -> None:
        with self._lock:
            if len(self._pool) < 8:
                self._pool.append(ws)

    # -- per-search device inputs -----------------------------------------------------
    def _live_bits(self, live: np.ndarray | None) -> tuple[Any, np.int32]:
        """(device live bitmap, has_live); uploaded again only when ``live`` is another array."""
        if live is None:
            return self._no_live, np.int32(0)
        with self._lock:
            host, dev = self._live
            if host is not live:
                bits = live_bits(live, self.index.n_docs)
                with self._cp.cuda.Device(self.device_id):
                    dev = self._cp.asarray(bits)
                self._live = (live, dev)
            return dev, np.int32(1)

    def _forward(self) -> tuple[Any, Any, Any]:
        """Device forward layout (fwd_off (N+1,) int64, fwd_terms (P,) int32, fwd_tfs (P,) int32).

        Built on the device on first use, from the uploaded posting lists: a
        sort of (doc, term) keys, so each document's terms are ascending.
        """
        with self._lock:
            if self._fwd is None:
                cp = self._cp
                N, P = self.index.n_docs, self.index.n_postings
                with cp.cuda.Device(self.device_id):
                    pos = cp.arange(P, dtype=cp.int64)
                    term_of = (cp.searchsorted(self.d_offsets, pos, side="right") - 1).astype(cp.uint64)
                    del pos
                    keys = (self.d_doc_ids.astype(cp.uint64) << cp.uint64(32)) | term_of
                    perm = cp.argsort(keys)
                    del keys
                    fwd_terms = term_of[perm].astype(cp.int32)
                    del term_of
                    fwd_tfs = self.d_tfs[perm]
                    del perm
                    fwd_off = cp.zeros(N + 1, dtype=cp.int64)
                    fwd_off[1:] = cp.cumsum(cp.bincount(self.d_doc_ids, minlength=N))
                    self._fwd = (fwd_off, cp.ascontiguousarray(fwd_terms), cp.ascontiguousarray(fwd_tfs))
            return self._fwd

    def persistent_blocks(self) -> int:
        """Blocks of ``sub_score`` that fit the device at once (occupancy API x SMs)."""
        if self._persistent is None:
            fn = K.kernel(_SCORE_FILE, f"sub_score<{self.tile_threads}, {self.tile_docs}>", self.device_id)
            per_sm = 2
            with contextlib.suppress(Exception):  # the fake device of the tests has no occupancy API
                ptr = getattr(fn, "kernel", fn).ptr
                per_sm = int(self._cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                    ptr, self.tile_threads, 0))
            self._persistent = max(1, per_sm) * self.sm_count
        return self._persistent

    def _term_cache(self) -> _TermCache:
        """idf and w0 of every term under the default statistics (computed on first use)."""
        c = self._terms
        if c is None:
            idf, w0 = term_weights(np.asarray(self.stats.df), self.stats.n_docs, self.params)
            pw = type("TermWeights", (), {})()
            pw.idf, pw.w0 = idf, w0
            c = self._terms = _TermCache(self.stats, pw)
        return c

    # -- host prep -------------------------------------------------------------------
    def prepare(self, queries: Sequence[Any], allow: Sequence[Any] | None, stats: CollectionStats | None = None,
                consts: np.ndarray | None = None, haystack: str | None = None) -> Batch:
        """Validate and prepare a batch on the host (no device call)."""
        st = self.search_stats(stats)
        if st is self.stats:  # the scorer's own statistics: idf and w0 from the cache, no batch machinery
            wq = own_weighing(queries, self, consts)  # (a static index's batch, weighed once for the contract)
            if wq is None:
                wq = weigh_static(queries, self._term_cache(), self.params, consts)
        else:
            wq = weigh_queries(queries, st, self.params, consts)
        filtered, allow_off, allow_docs = check_allow(allow, wq.n_rows, self.index.n_docs)
        return prepare_batch(wq, filtered, allow_off, allow_docs, df=self._df, n_tiles=self.n_tiles,
                             tile=self.tile_docs, postings_per_doc=self._postings_per_doc,
                             haystack=self.haystack if haystack is None else haystack)

    # -- device work -------------------------------------------------------------------
    def _launch(self, filename: str, name: str, grid, block, args, shared_mem: int = 0) -> None:
        fn = K.kernel(filename, name, self.device_id)
        if shared_mem:
            fn(grid, block, args, shared_mem=shared_mem)
        else:
            fn(grid, block, args)

    def _run_rows(self, ws: _Workspace, b: Batch, slots: np.ndarray, theta0: np.ndarray, k: int, sc: SearchConsts,
                  live: tuple[Any, np.int32], timer: _Timer, stats: dict) -> tuple[np.ndarray, ...]:
        """One chunk on the device: (ids (R,k), scores (R,k), counts (R,), theta (R,), tiles (R,))."""
        R = b.n_rows
        TT, TD = self.tile_threads, self.tile_docs
        flags = (b.filtered.astype(np.int32) * ROW_FILTERED) | np.where(b.path != PATH_TILES, ROW_OFF_TILES, 0)
        cand_off = np.zeros(R + 1, np.int64)
        np.cumsum(slots, out=cand_off[1:])
        hs = np.flatnonzero(b.path == PATH_HAYSTACK).astype(np.int32)
        hs_start = np.zeros(hs.size + 1, np.int64)
        np.cumsum(np.diff(b.allow_off)[hs], out=hs_start[1:])
        counts0 = np.where(b.path == PATH_HAYSTACK, np.diff(b.allow_off), 0).astype(np.int32)
        lt_row, lt_term, lt_bit, lt_start = light_pairs(b, self._dir_row, self._df)
        inputs = [b.qt_off.astype(np.int32), _nz(b.qt_term, np.int32), _nz(b.qt_mult, np.float32),
                  _nz(b.qt_idf, np.float32), _nz(b.qt_w0, np.float32), b.row_const.astype(np.float32),
                  flags.astype(np.int32), b.allow_off, _nz(b.allow_docs, np.int32), cand_off, _nz(hs, np.int32),
                  hs_start, _nz(lt_row, np.int32), _nz(lt_term, np.int32), _nz(lt_bit, np.int32), lt_start]
        state = [counts0, theta0.astype(np.uint32), np.zeros(R, np.int32), np.zeros(R, np.int32),
                 np.zeros(R, np.int32), np.zeros(1, np.int32)]
        outputs = [((R, k), np.int64), ((R, k), np.float32)]
        with timer.phase("h2d_s"):
            views, offs, h2d_end, state_start, total = ws.layout(inputs, state, outputs)
            ws.h2d(h2d_end)
        (qt_off, qt_term, qt_mult, qt_idf, qt_w0, row_const, row_flags, allow_off, allow_docs, d_cand_off, d_hs,
         d_hs_start, d_lt_row, d_lt_term, d_lt_bit, d_lt_start, counts, theta, tiles, b_scored, b_skipped, n_items,
         out_ids, out_scores) = views
        cand = ws.scratch("cand", int(cand_off[-1]), self._cp.uint64)
        live_dev, has_live = live
        bm = sc.args()
        n_tile_rows = int((b.path == PATH_TILES).sum())
        if hs.size:  # first: the seed selection below reads every row's written candidates
            with timer.phase("score_s"):
                fwd_off, fwd_terms, fwd_tfs = self._forward()
                n_hay = int(hs_start[-1])
                g = min(_MAX_GRID, max(1, -(-n_hay // K.HAYSTACK_THREADS)))
                self._launch(_SCORE_FILE, f"haystack_score<{K.HAYSTACK_THREADS}>", (g,), (K.HAYSTACK_THREADS,),
                             (fwd_off, fwd_terms, fwd_tfs, self.d_doc_lens, live_dev, has_live, qt_off, qt_term,
                              qt_mult, qt_idf, qt_w0, row_const, allow_off, allow_docs, d_hs, d_hs_start,
                              np.int32(hs.size), d_cand_off, cand, *bm))
        if n_tile_rows:
            cells = R * self.n_tiles
            ukey = ws.scratch("ukey", cells, self._cp.uint32)
            lmask = ws.scratch("lmask", cells, self._cp.uint64)
            items = ws.scratch("items", cells, self._cp.uint64)
            seeds = ws.scratch("seeds", R * K.SEED_TILES, self._cp.uint64)
            sub_ub = ws.scratch("sub_ub", max(cells, R * K.SEED_TILES) * SUBS, self._cp.uint32)
            seedk = ws.scratch("seedk", R * k, self._cp.int64)[:R * k] if k <= K.SELECT_MAX_K else None
            with timer.phase("plan_s"):
                if lt_term.size:
                    lmask[:cells].fill(0)
                    n_post = int(lt_start[-1])
                    g = min(_MAX_GRID, max(1, -(-n_post // TT)))
                    self._launch(_SCORE_FILE, f"light_marks<{TT}, {TD}>", (g,), (TT,),
                                 (self.d_offsets, self.d_doc_ids, d_lt_row, d_lt_term, d_lt_bit, d_lt_start,
                                  np.int32(lt_term.size), np.int32(self.n_tiles), lmask))
                self._plan(R, qt_off, qt_term, qt_mult, qt_idf, qt_w0, row_const, row_flags, allow_off, allow_docs,
                           lmask, ukey, seeds, bm)
            with timer.phase("score_s"):
                self._score_tiles(R, k, live, qt_off, qt_term, qt_mult, qt_idf, qt_w0, row_const, row_flags,
                                  allow_off, allow_docs, ukey, seeds, items, n_items, theta, counts, tiles, b_scored,
                                  b_skipped, d_cand_off, cand, seedk, bm, sub_ub)
        with timer.phase("topk_s"):
            self._select(ws, cand, d_cand_off, counts, theta, R, k, int(slots.max(initial=0)), out_ids, out_scores)
        with timer.phase("d2h_s"):
            ws.d2h(state_start, total)
        ws.stream.synchronize()
        o = offs[-8:]  # counts, theta, tiles, blocks scored, blocks skipped, n_items, ids, scores
        stats["haystack_rows"] += int(hs.size)
        stats["tile_items"] += int(ws.read(o[5], (1,), np.int32)[0])
        stats["light_pairs"] += int(lt_term.size)
        stats["blocks_scored"] += int(ws.read(o[3], (R,), np.int32).sum())
        stats["blocks_skipped"] += int(ws.read(o[4], (R,), np.int32).sum())
        return (ws.read(o[6], (R, k), np.int64), ws.read(o[7], (R, k), np.float32), ws.read(o[0], (R,), np.int32),
                ws.read(o[1], (R,), np.uint32), ws.read(o[2], (R,), np.int32))

    def _plan(self, R: int, qt_off, qt_term, qt_mult, qt_idf, qt_w0, row_const, row_flags, allow_off, allow_docs,
              lmask, ukey, seeds, bm: tuple) -> None:
        """tile_bounds (every (row, tile) bound key into ``ukey``), then seed_tiles (each row's best tiles)."""
        TT, TD = self.tile_threads, self.tile_docs
        self._launch(_SCORE_FILE, f"tile_bounds<{TT}, {TD}>", (-(-self.n_tiles // TT), R), (TT,),
                     (self.d_offsets, self.d_doc_ids, self.d_term_imp_off, self.d_term_imp, self.d_dir_row,
                      self.d_dir_start, self.d_dir_imp_off, self.d_dir_imp, np.int32(self.n_tiles),
                      np.int64(self.index.n_docs), qt_off, qt_term, qt_mult, qt_idf, qt_w0, row_const, row_flags,
                      allow_off, allow_docs, lmask, ukey, np.int32(R), *bm))
        self._launch(_SCORE_FILE, f"seed_tiles<{TT}>", (R,), (TT,), (ukey, np.int32(self.n_tiles), np.int32(R), seeds))

    def _score_tiles(self, R: int, k: int, live, qt_off, qt_term, qt_mult, qt_idf, qt_w0, row_const, row_flags,
                     allow_off, allow_docs, ukey, seeds, items, n_items, theta, counts, tiles, b_scored, b_skipped,
                     cand_off, cand, seedk, bm: tuple, sub_ub) -> None:
        """The seeds, their k-th best as the threshold, the list of tiles that can still matter, the list.

        Each stage is ``sub_plan`` (thread per (item, sub-block): the cut, into ``sub_ub``) then
        ``sub_score`` (warp per kept sub-block). ``seedk`` (R, k) int64 scratch, or None (k >
        SELECT_MAX_K: each sub-block's own k-th best only). ``sub_ub`` uint32 scratch of
        max(R * n_tiles, R * SEED_TILES) * 16. ``n_items`` must hold 0 and ``counts`` / ``theta`` /
        ``tiles`` / ``b_*`` their initial values.
        """
        TT, TD = self.tile_threads, self.tile_docs
        live_dev, has_live = live
        blocks = self.persistent_blocks()
        n_tiles, n_docs = np.int32(self.n_tiles), np.int64(self.index.n_docs)
        q_args = (qt_off, qt_term, qt_mult, qt_idf, qt_w0, row_const, row_flags, allow_off, allow_docs)
        plan_head = (self.d_offsets, self.d_doc_ids, self.d_dir_row, self.d_dir_sub_off, self.d_dir_sub_cnt,
                     self.d_dir_sub_imp, self.d_term_imp_off, self.d_term_imp, n_tiles, n_docs, *q_args, ukey, seeds,
                     items, n_items)
        score_head = (self.d_offsets, self.d_doc_ids, self.d_tfs, self.d_doc_lens, self.d_dir_row, self.d_dir_start,
                      self.d_dir_sub_end, n_tiles, n_docs, live_dev, has_live, *q_args, seeds, items, n_items)
        plan, score = f"sub_plan<{TT}, {TD}>", f"sub_score<{TT}, {TD}>"
        # the plan's grid: enough threads for every (item, sub-block) of the seeds; the list's count is on
        # the device, so its grid is the device's resident threads (the kernel strides over the rest)
        seed_threads = R * K.SEED_TILES * SUBS
        plan_blocks = max(1, min(-(-seed_threads // TT), 4 * self.sm_count))
        warps = TT // 32
        for mode, grid_plan, grid_score in ((0, plan_blocks, min(blocks, max(1, -(-seed_threads // warps)))),
                                            (1, 4 * self.sm_count, blocks)):
            if mode == 1:
                if self.n_tiles <= K.SEED_TILES:
                    break  # every tile with a posting was a seed: the list would be empty (a stage that cannot prune)
                if seedk is not None:  # the k-th best key the seeds emitted raises theta before the list is made
                    kpad = _next_pow2(k)
                    self._launch(_TOPK_FILE, f"select_topk<{K.SELECT_THREADS}>", (R,), (K.SELECT_THREADS,),
                                 (cand, cand_off, counts, theta, np.int32(self.doc_bits), np.int32(k),
                                  np.int32(kpad), np.int32(1), np.int32(1), seedk, self._dummy_f32),
                                 shared_mem=8 * kpad)
                    self._launch(_SCORE_FILE, "seed_theta", (-(-R // _ELEMWISE_BLOCK),), (_ELEMWISE_BLOCK,),
                                 (seedk, np.int32(k), np.int32(R), row_flags, theta))
                self._launch(_SCORE_FILE, f"tile_list<{TT}>", (-(-self.n_tiles // TT), R), (TT,),
                             (ukey, theta, n_tiles, np.int32(R), items, n_items))
            self._launch(_SCORE_FILE, plan, (grid_plan,), (TT,),
                         (*plan_head, np.int32(mode), theta, tiles, b_skipped, sub_ub, np.int32(R), *bm))
            self._launch(_SCORE_FILE, score, (grid_score,), (TT,),
                         (*score_head, np.int32(mode), sub_ub, theta, counts, b_scored, b_skipped, cand_off, cand,
                          np.int32(R), np.int32(k), *bm))

    def select_segments(self, R: int, k: int, width: int) -> int:
        """Blocks per row of the selection: 1, or up to 64 when a batch of fewer rows than SMs has many candidates.

        Each segment keeps at least 4 max(k, 256) candidate slots, so the
        second stage (segs x k keys per row) stays smaller than the first.
        """
        sms = self.sm_count
        if k > K.SELECT_MAX_K or 2 * R > sms:
            return 1
        return int(max(1, min(sms // R, width // (4 * max(k, 256)), 64)))

    def _select(self, ws: _Workspace, cand, cand_off, counts, theta, R: int, k: int, width: int, out_ids,
                out_scores) -> None:
        cp = self._cp
        if k <= K.SELECT_MAX_K:
            kpad = _next_pow2(k)
            name, block = f"select_topk<{K.SELECT_THREADS}>", (K.SELECT_THREADS,)
            segs = self.select_segments(R, k, width)
            if segs > 1:
                # Two stages: each of R x segs blocks keeps its segment's top k (raw keys), then one
                # block per row selects from those segs x k keys.
                part = ws.scratch("part", R * segs * k, cp.int64)[:R * segs * k].reshape(R * segs, k)
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

    def _search_rows(self, ws: _Workspace, batch: Batch, k: int, sc: SearchConsts, live, timer: _Timer, stats: dict,
                     ids: np.ndarray, out: np.ndarray, theta0: np.ndarray | None = None,
                     slots: np.ndarray | None = None, depth: int = 0) -> None:
        """Score ``batch`` chunk by chunk (OOM: halve the budget), rerun overflowing rows, fill ids/out."""
        cp = self._cp
        R = batch.n_rows
        if R == 0:
            return
        budget = self.budget_bytes()
        if slots is None:  # up to a quarter of the budget in candidate slots: fewer overflow reruns
            slots = candidate_slots(batch, k, self.index.n_docs, cap=min(budget // (32 * R), MAX_SLOTS))
        if theta0 is None:
            theta0 = np.zeros(R, np.uint32)
        per_row = self.row_bytes(slots, k, batch)
        if int(per_row.max()) > budget:
            raise self._too_big(int(per_row.max()), budget)
        chunks = self._chunks(per_row, budget)
        i = 0
        while i < len(chunks):
            s, e = chunks[i]
            sub = batch.take(np.arange(s, e))
            try:
                res = self._run_rows(ws, sub, slots[s:e], theta0[s:e], k, sc, live, timer, stats)
                oom = None
            except cp.cuda.memory.OutOfMemoryError as err:
                oom = str(err)
            if oom is not None:
                # Outside the except block: there the traceback still references the failed
                # chunk's device arrays, and free_all_blocks() could not give them back.
                ws._scratch.clear()
                cp.get_default_memory_pool().free_all_blocks()
                if e - s == 1:
                    raise MemoryError(
                        f"the GPU ran out of memory scoring even one query over {self.index.n_docs} documents "
                        f"({oom}). Fix: free device memory (other processes, CuPy's pool), lower k, pass a "
                        "smaller memory_budget_bytes/memory_fraction so other allocations fit, or use "
                        "backend='numpy'")
                budget = max(1, min(budget, self.budget_bytes(refresh=True)) // 2)
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
                self._search_rows(ws, sub.take(over), k, sc, live, timer, stats, ids, out, theta0=theta[over],
                                  slots=counts[over].astype(np.int64), depth=depth + 1)
            i += 1

    # -- small batches as CUDA graphs --------------------------------------------------
    def _graph_for(self, b: Batch, k: int, sc: SearchConsts, live: tuple[Any, np.int32]) -> _Graph | None:
        """A graph for this batch's shape whose workspace lock the caller now holds (release it with
        ``g.ws.lock.release()``), or None when the batch does not fit one.

        Each shape has a pool of up to :data:`GRAPH_POOL` graphs: a free one is taken, a new one is
        captured while the pool is not full, else the call waits for the least recently taken one.
        """
        R = b.n_rows
        if not 0 < R <= GRAPH_MAX_ROWS or k > K.SELECT_MAX_K or (b.path == PATH_HAYSTACK).any():
            return None
        Rb = _next_pow2(R)
        key = (Rb, k, sc, id(live[0]))
        n_light = int(((self._dir_row[b.qt_term] < 0) if b.qt_term.size else np.zeros(0, bool)).sum())
        wait: _Graph | None = None
        with self._lock:
            pool = self._graphs.pop(key, None)
            if pool is not None:
                self._graphs[key] = pool  # most recently used last
                if not pool[0].fits(b, n_light):
                    return None
                for g in pool:
                    if g.ws.lock.acquire(blocking=False):
                        pool.remove(g)
                        pool.append(g)  # least recently taken first
                        return g
                if len(pool) >= GRAPH_POOL:
                    wait = pool[0]
                    pool.remove(wait)
                    pool.append(wait)
        if wait is not None:
            wait.ws.lock.acquire()
            return wait
        if b.qt_term.size > GRAPH_TERMS_PER_ROW * Rb or b.allow_docs.size > GRAPH_ALLOW_PER_ROW * Rb:
            return None
        cells = Rb * self.n_tiles
        need = (84 * cells + 8 * Rb * (4 * k + _Graph.SLOTS_EXTRA) + 20 * Rb * k
                + (8 + 64) * K.SEED_TILES * Rb)
        if need > self.budget_bytes():
            return None
        try:
            with self._cp.cuda.Device(self.device_id):
                g = _Graph(self, Rb, k, sc, live)
        except self._cp.cuda.memory.OutOfMemoryError:
            self._cp.get_default_memory_pool().free_all_blocks()
            return None  # the ordinary path chunks to the memory there is
        except Exception as e:  # noqa: BLE001 - a graph is an optimisation: never let it fail a search
            self._graph_failed(e)
            return None
        if not g.fits(b, n_light):
            return None
        g.ws.lock.acquire()
        with self._lock:
            pool = self._graphs.setdefault(key, [])
            if len(pool) < GRAPH_POOL:  # (threads that captured at once: the pool keeps GRAPH_POOL, the rest
                pool.append(g)          # run once and are dropped)
            while len(self._graphs) > GRAPH_CACHE:
                self._graphs.pop(next(iter(self._graphs)))
        return g

    def _graph_failed(self, e: Exception) -> None:
        """Turn graphs off for this scorer, saying why (searches go on by the ordinary path)."""
        self.graphs = False
        #: Why CUDA graphs were turned off for this scorer (None while they work).
        self.graph_error = f"{type(e).__name__}: {e}"
        _log.warning("CUDA graphs turned off for this scorer (%s); small batches take the ordinary path",
                     self.graph_error)

    def _search_graph(self, g: _Graph, b: Batch, k: int, sc: SearchConsts, live, stats: dict, ids: np.ndarray,
                      out: np.ndarray) -> bool:
        """One graph launch for the batch (``g.ws.lock`` held, released here); rows whose candidates
        overflowed are rerun the ordinary way.

        Returns False (nothing written) when the graph failed to run: graphs are then off for this scorer.
        """
        try:
            r_ids, r_scores, counts, theta, tiles, slots = g.run(self, b, np.zeros(b.n_rows, np.uint32), stats)
        except Exception as e:  # noqa: BLE001 - see _graph_failed
            self._graph_failed(e)
            with self._lock:
                self._graphs.clear()
            return False
        finally:
            g.ws.lock.release()  # taken by _graph_for
        stats["n_chunks"] += 1
        stats["rows_per_chunk"] = max(stats["rows_per_chunk"], b.n_rows)
        stats["tiles_scored"] += int(tiles.sum())
        stats["candidates"] += int(np.minimum(counts, slots).sum())
        ids[b.rows] = r_ids
        out[b.rows] = r_scores
        over = np.flatnonzero(counts.astype(np.int64) > slots)
        if over.size:
            stats["overflow_rows"] += int(over.size)
            ws = self._acquire()
            try:
                with self._cp.cuda.Device(self.device_id), ws.stream:
                    self._search_rows(ws, b.take(over), k, sc, live, _Timer(self._cp, False), stats, ids, out,
                                      theta0=theta[over], slots=counts[over].astype(np.int64), depth=1)
            finally:
                self._release(ws)
        return True

    # -- the Scorer contract ----------------------------------------------------------
    def search(
        self,
        queries: Sequence[np.ndarray],
        k: int,
        allow: Sequence[np.ndarray | None] | None = None,
        *,
        stats: CollectionStats | None = None,
        consts: np.ndarray | None = None,
        live: np.ndarray | None = None,
    ) -> SearchResults:
        """Top-k of each query on the device (see :meth:`Scorer.search`).

        Returns
        -------
        SearchResults
            ids (B, k) int64 and scores (B, k) float32 on the host, equal to the
            NumPy reference's bit for bit. ``meta["timings"]``: ``prep_s`` (host
            prep) and ``total_s`` (wall clock); with ``timing=True`` also
            ``h2d_s``, ``plan_s``, ``score_s``, ``topk_s``, ``d2h_s`` (device time
            from CUDA events). Also ``n_chunks``, ``rows_per_chunk``,
            ``candidates``, ``tiles_scored``, ``tile_items``, ``blocks_scored``,
            ``blocks_skipped``, ``light_pairs``, ``overflow_rows``, ``haystack_rows``,
            ``n_tiles``.
        """
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        k = int(k)
        n_q = len(queries) if hasattr(queries, "__len__") else None
        if self.pipeline_rows and n_q is not None and n_q > self.pipeline_rows and not self.timing:
            return self._search_pieces(queries, k, allow, stats, consts, live)
        t0 = time.perf_counter()
        st = self.search_stats(stats)
        batch = self.prepare(queries, allow, st, consts)
        B = batch.n_rows
        prep_s = time.perf_counter() - t0
        res = empty_results(B, k)
        counters = {"n_chunks": 0, "rows_per_chunk": 0, "candidates": 0, "tiles_scored": 0, "tile_items": 0,
                    "light_pairs": 0, "overflow_rows": 0, "haystack_rows": 0, "oom_retries": 0, "graph_runs": 0,
                    "blocks_scored": 0, "blocks_skipped": 0}
        timings: dict[str, float] = {}
        live_sel = np.flatnonzero(batch.path != PATH_NONE)
        if live_sel.size and self.index.n_docs:
            cp = self._cp
            sc = search_consts(self.params, st.avgdl)
            lv = self._live_bits(live)
            sub = batch.take(live_sel)
            graph = self._graph_for(sub, k, sc, lv) if self.graphs and not self.timing else None
            if graph is None or not self._search_graph(graph, sub, k, sc, lv, counters, res.ids, res.scores):
                ws = self._acquire()
                try:
                    with cp.cuda.Device(self.device_id), ws.stream:
                        timer = _Timer(cp, self.timing)
                        self._search_rows(ws, sub, k, sc, lv, timer, counters, res.ids, res.scores)
                        timings = timer.totals()
                finally:
                    self._release(ws)
        timings["prep_s"] = prep_s
        timings["total_s"] = time.perf_counter() - t0
        res.meta = {"backend": "cupy", "device": self._device_name, "timings": timings, **counters,
                    "n_tiles": self.n_tiles, "persistent_blocks": self._persistent, "graph_error": self.graph_error}
        return res

    def _search_pieces(self, queries, k: int, allow, stats, consts, live) -> SearchResults:
        """:meth:`search` as pieces of :attr:`pipeline_rows` queries, two in flight: while one piece's
        kernels run on its workspace's stream, the other's host preparation and copies proceed on
        another workspace (issue 35, item 3). Every input is checked first, so bad input raises before
        any device work, naming the query as a whole-batch search would."""
        from concurrent.futures import ThreadPoolExecutor

        t0 = time.perf_counter()
        n = len(queries)
        st = self.search_stats(stats)
        check_queries(queries, self.index.n_terms)
        if allow is not None:
            check_allow(allow, n, self.index.n_docs)
        if consts is not None and np.asarray(consts).reshape(-1).shape != (n,):
            raise ValueError(f"consts must hold one float32 per query ({n}), got shape {np.shape(consts)}")
        step = self.pipeline_rows
        pieces = [(a, min(n, a + step)) for a in range(0, n, step)]
        res = empty_results(n, k)
        cs = None if consts is None else np.asarray(consts, np.float32).reshape(-1)

        def one(piece):
            a, b = piece
            r = self.search([queries[i] for i in range(a, b)], k, None if allow is None else list(allow[a:b]),
                            stats=st if stats is not None else None, consts=None if cs is None else cs[a:b],
                            live=live)
            res.ids[a:b] = r.ids
            res.scores[a:b] = r.scores
            return r.meta

        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="gpuir-piece") as ex:
            metas = list(ex.map(one, pieces))
        meta: dict[str, Any] = {"backend": "cupy", "device": self._device_name, "n_tiles": self.n_tiles,
                                "persistent_blocks": self._persistent, "graph_error": self.graph_error,
                                "pieces": len(pieces)}
        for m in metas:
            for f, v in m.items():
                if f in ("backend", "device", "n_tiles", "persistent_blocks", "graph_error", "timings"):
                    continue
                meta[f] = max(meta.get(f, 0), v) if f == "rows_per_chunk" else meta.get(f, 0) + v
        meta["timings"] = {"total_s": time.perf_counter() - t0,
                           "prep_s": float(sum(m["timings"].get("prep_s", 0.0) for m in metas))}
        res.meta = meta
        return res

    def score_matrix(
        self,
        queries: Sequence[np.ndarray],
        allow: Sequence[np.ndarray | None] | None = None,
        *,
        stats: CollectionStats | None = None,
        consts: np.ndarray | None = None,
        live: np.ndarray | None = None,
    ) -> np.ndarray:
        """Dense scores (B, N) float32 on the host; -inf for non-candidates (tile path only)."""
        st = self.search_stats(stats)
        batch = self.prepare(queries, allow, st, consts, haystack="never")
        B, N = batch.n_rows, self.index.n_docs
        rows_out = np.full((B, N), -np.inf, dtype=np.float32)
        if B == 0 or N == 0:
            return rows_out
        cp = self._cp
        sc = search_consts(self.params, st.avgdl)
        live_dev, has_live = self._live_bits(live)
        per_row = 4 * N + 64 + 16 * np.diff(batch.qt_off) + 4 * np.diff(batch.allow_off)
        budget = self.budget_bytes()
        if int(per_row.max()) > budget:
            raise self._too_big(int(per_row.max()), budget)
        ws = self._acquire()
        try:
            with cp.cuda.Device(self.device_id), ws.stream:
                for s, e in self._chunks(per_row.astype(np.int64), budget):
                    sub = batch.take(np.arange(s, e))
                    R = e - s
                    flags = sub.filtered.astype(np.int32) * ROW_FILTERED
                    inputs = [sub.qt_off.astype(np.int32), _nz(sub.qt_term, np.int32), _nz(sub.qt_mult, np.float32),
                              _nz(sub.qt_idf, np.float32), _nz(sub.qt_w0, np.float32),
                              sub.row_const.astype(np.float32), flags, sub.allow_off, _nz(sub.allow_docs, np.int32)]
                    views, _, h2d_end, _, _ = ws.layout(inputs, [], [])
                    ws.h2d(h2d_end)
                    qt_off, qt_term, qt_mult, qt_idf, qt_w0, row_const, row_flags, allow_off, allow_docs = views
                    dense = cp.empty((R, N), dtype=cp.float32)
                    self._launch(_SCORE_FILE, f"tile_dense<{self.tile_threads}, {self.tile_docs}>",
                                 (self.n_tiles, R), (self.tile_threads,),
                                 (self.d_offsets, self.d_doc_ids, self.d_tfs, self.d_doc_lens, self.d_dir_row,
                                  self.d_dir_start, np.int32(self.n_tiles), np.int64(N), live_dev, has_live, qt_off,
                                  qt_term, qt_mult, qt_idf, qt_w0, row_const, row_flags, allow_off, allow_docs, dense,
                                  np.int32(R), *sc.args()))
                    rows_out[s:e] = dense.get(stream=ws.stream)
                    del dense
                ws.stream.synchronize()
        finally:
            self._release(ws)
        return rows_out


def _host(a: Any) -> np.ndarray:
    """A device array's host copy (a NumPy array as it is)."""
    return np.asarray(a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a)


def _nz(a: np.ndarray, dtype) -> np.ndarray:
    """``a`` as ``dtype``, with one dummy element when empty (a kernel pointer must point somewhere)."""
    a = np.asarray(a, dtype=dtype)
    return a if a.size else np.zeros(1, dtype)
