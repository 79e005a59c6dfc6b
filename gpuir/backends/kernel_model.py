"""A step-by-step NumPy model of the CUDA kernels, and a fake ``cupy`` that runs it.

Nothing here touches a GPU. Two uses:

* **The model** mirrors ``kernels/bm25_score.cu`` and ``kernels/topk.cu``
  operation by operation: tiles, one term per round in ascending term id, the
  float32 tile bounds and the skip test, each row's 16 seed tiles and their
  joint k-th best as the threshold, the float32 sub-block bounds and the
  sub-block cut, the running per-row threshold (tile bound L from two histogram
  passes, ``atomicMax``), candidate emission with a capacity and a counter
  that keeps counting, the haystack (forward-layout) scoring and the radix
  select with its early exits, gather and sentinel slots. Blocks of
  ``tile_score`` run as interleaved generators that yield wherever the kernel
  touches global state another block may change (the threshold read before the
  skip test and before the cut, the publish/read before emission, the
  emission itself), and a
  seeded scheduler picks which block moves next -- so tests cover many orders
  in which a GPU could run them. tests/test_kernel_logic.py checks the model
  against :class:`~gpuir.backends.numpy_backend.NumpyScorer` bit for bit.
* **The fake cupy** (:func:`make_fake_cupy`, :func:`fake_cupy_installed`)
  stands in for the ``cupy`` module: NumPy-backed device arrays, pinned
  buffers, streams and events, and kernels that are the model. Every launch is
  checked against the kernel's C signature parsed from the ``.cu`` text (array
  dtypes and contiguity, the exact NumPy scalar type of each scalar -- CuPy
  passes a Python int as int64 and a float as float64, which an ``int`` or
  ``float`` parameter would misread --, block size = the template's THREADS,
  grid limits, shared memory). ``cupy.empty`` returns garbage (0xFF bytes), so a
  kernel input the host forgot to initialise shows up. It drives
  :class:`~gpuir.backends.cupy_backend.CupyScorer`'s host code end to end in
  the tests and in ``bench/gpu_verify.py --dry-run``.

What this cannot check: the CUDA code of the kernel bodies (the model is a
second implementation of the same algorithm), races, barriers and the memory
model. The host emulation of the real kernel bodies (a C++ shim) and a GPU
run (``bench/gpu_verify.py``) settle those.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import re
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import kernels as K

U32, U64, F32 = np.uint32, np.uint64, np.float32
RADIX_BITS = 11
BINS = 1 << RADIX_BITS
EMPTY_SLOT = 0x7FC00001
ROW_FILTERED, ROW_OFF_TILES = 1, 2
STATIC_SMEM_LIMIT = 48 * 1024
SUBS = 16  # sub-blocks per tile (GPUIR_SUBS)
SEEDS = K.SEED_TILES  # tiles per row scored first (GPUIR_SEEDS)


# =============================================================================
# common.cuh
# =============================================================================
def float_to_ordered(f) -> np.ndarray:
    """common.cuh ``float_to_ordered``, vectorised: ndarray uint32."""
    u = np.atleast_1d(np.asarray(f, dtype=F32)).view(U32).copy()
    u[u == U32(0x80000000)] = 0  # -0.0 -> +0.0
    nan = (u & U32(0x7FFFFFFF)) > U32(0x7F800000)
    out = np.where((u & U32(0x80000000)) != 0, ~u, u | U32(0x80000000)).astype(U32)
    out[nan] = 0
    return out


def ordered_to_float(k) -> np.ndarray:
    k = np.asarray(k, dtype=U32)
    u = np.where((k & U32(0x80000000)) != 0, k & U32(0x7FFFFFFF), ~k).astype(U32)
    return u.view(F32)


def key_from_ordered(skey, doc) -> np.ndarray:
    doc = np.asarray(doc, dtype=np.int64)
    return (np.asarray(skey, dtype=U32).astype(U64) << U64(32)) | (~doc.astype(U32)).astype(U64)


def composite_key(score, doc) -> np.ndarray:
    return key_from_ordered(float_to_ordered(score), doc)


def key_doc(key) -> np.ndarray:
    return (~(np.asarray(key, U64) & U64(0xFFFFFFFF)).astype(U32)).astype(np.int64)


def key_score(key) -> np.ndarray:
    return ordered_to_float((np.asarray(key, U64) >> U64(32)).astype(U32))


def scaled(w, m):
    """common.cuh ``scaled``: w, times m when m != 1 (float32)."""
    return w if F32(m) == F32(1) else (np.asarray(w, F32) * F32(m)).astype(F32)


def radix_passes(doc_bits: int) -> int:
    return 3 + -(-doc_bits // RADIX_BITS)


def radix_digit(p: int, doc_bits: int) -> tuple[int, int]:
    """(shift, width) of pass p, as common.cuh ``radix_digit``."""
    if p < 2:
        return 64 - RADIX_BITS * (p + 1), RADIX_BITS
    if p == 2:
        return 32, 64 - 2 * RADIX_BITS - 32
    top = doc_bits - RADIX_BITS * (p - 3)
    shift = top - RADIX_BITS if top > RADIX_BITS else 0
    return shift, top - shift


def find_bin(hist: np.ndarray, krem: int) -> tuple[int, int, int] | None:
    """common.cuh ``find_bin``: (bin, count above it, its count) of the krem-th largest, or None."""
    h_desc = np.asarray(hist, dtype=np.int64)[::-1]
    cum = np.concatenate([[0], np.cumsum(h_desc)[:-1]])
    hit = np.flatnonzero((cum < krem) & (krem <= cum + h_desc))
    if hit.size == 0:
        return None
    assert hit.size == 1, "exactly one bin holds the krem-th element"
    r = int(hit[0])
    return hist.size - 1 - r, int(cum[r]), int(h_desc[r])


def next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


# =============================================================================
# bm25_score.cu
# =============================================================================
def _params(a: dict):
    """The BM25Params whose float32 constants the launch carries (method code, k1, b, delta)."""
    from ..bm25 import METHODS, BM25Params

    return BM25Params(method=METHODS[int(a["method"])], k1=float(a["k1"]), b=float(a["b"]), delta=float(a["delta"]))


def _weights(a: dict, p0: int, p1: int, u: int) -> np.ndarray:
    """bm25_weight of postings [p0, p1) for query term u: gpuir.backends.weights.weights_of (the reference)."""
    from .weights import weights_of

    d = a["doc_ids"][p0:p1]
    return weights_of(a["tfs"][p0:p1], a["doc_lens"][d], F32(a["qt_idf"][u]), F32(a["qt_w0"][u]), float(a["avgdl"]),
                      _params(a))


def _bound(a: dict, summ: int, u: int) -> np.float32:
    """bound_of: gpuir.backends.weights.weight_bound of an unpacked impact (tf 0xFFFF = unbounded)."""
    from .weights import weight_bound

    mtf, mdl = summ & 0xFFFF, summ >> 16
    if mtf == 0:
        return F32(0)
    mtf = 2**31 - 1 if mtf == 0xFFFF else mtf
    return F32(weight_bound(np.array([mtf]), np.array([mdl]), np.array([a["qt_idf"][u]], F32),
                            np.array([a["qt_w0"][u]], F32), float(a["avgdl"]), _params(a))[0])


def _range(a: dict, t: int, j: int, base: int, end: int) -> tuple[int, int]:
    """term_ranges: the posting sub-range [lo, hi) of term t in tile j."""
    n_tiles = int(a["n_tiles"])
    o0, o1 = int(a["offsets"][t]), int(a["offsets"][t + 1])
    r = int(a["dir_row"][t])
    if r >= 0:
        st = a["dir_start"][r * (n_tiles + 1):]
        return o0 + int(st[j]), o0 + int(st[j + 1])
    lst = a["doc_ids"][o0:o1]
    return o0 + int(np.searchsorted(lst, base, "left")), o0 + int(np.searchsorted(lst, end, "left"))


def _allowed(a: dict, q: int, base: int, end: int) -> np.ndarray | None:
    """load_allow: the tile's allow mask, or None when nothing is allowed."""
    lst = a["allow_docs"][int(a["allow_off"][q]):int(a["allow_off"][q + 1])]
    a0, a1 = np.searchsorted(lst, [base, end], "left")
    if a0 == a1:
        return None
    mask = np.zeros(int(a["TILE"]), dtype=bool)
    mask[lst[a0:a1] - base] = True
    return mask


def _live(a: dict, docs: np.ndarray) -> np.ndarray:
    """The live bit of each document (all True when has_live = 0)."""
    if not int(a["has_live"]):
        return np.ones(docs.size, bool)
    words = a["live"].astype(np.uint32)
    return ((words[docs >> 5] >> (docs & 31).astype(np.uint32)) & 1).astype(bool)


def _accumulate(a: dict, q: int, j: int, base: int, end: int, allowed: np.ndarray | None, keep: int = 0xFFFF):
    """accumulate_tile: (touched bool (TILE,), sums float32 (TILE,)), one term per round, ascending.

    Only documents of the sub-blocks whose bit is set in ``keep`` are read.
    """
    tile = int(a["TILE"])
    kept = ((keep >> (np.arange(tile) // (tile // SUBS))) & 1).astype(bool)
    acc = np.zeros(tile, F32)
    touched = np.zeros(tile, bool)
    for u in range(int(a["qt_off"][q]), int(a["qt_off"][q + 1])):
        lo, hi = _range(a, int(a["qt_term"][u]), j, base, end)
        if hi == lo:
            continue
        d = a["doc_ids"][lo:hi].astype(np.int64)
        w = _weights(a, lo, hi, u)
        ok = _live(a, d) & kept[d - base]
        if allowed is not None:
            ok &= allowed[d - base]
        d, w = d[ok] - base, w[ok]
        acc[d] = acc[d] + scaled(w, a["qt_mult"][u])  # a document at most once per round
        touched[d] = True
    return touched, acc


def _finalize(a: dict, q: int, touched: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """Final ordered score keys (0 = no candidate), uint32 (TILE,)."""
    s = acc + F32(a["row_const"][q]) if int(a["has_w0"]) else acc
    return np.where(touched, float_to_ordered(s.astype(F32)), U32(0)).astype(U32)


def model_light_marks(a: dict, grid: tuple[int, ...]) -> None:
    n_tiles, tile = int(a["n_tiles"]), int(a["TILE"])
    lmask = a["lmask"]
    for h in range(int(a["n_lt"])):
        t = int(a["lt_term"][h])
        d = a["doc_ids"][int(a["offsets"][t]):int(a["offsets"][t + 1])].astype(np.int64)
        cells = int(a["lt_row"][h]) * n_tiles + np.unique(d // tile)
        lmask[cells] |= U64(1) << U64(int(a["lt_bit"][h]))


def model_tile_bounds(a: dict, grid: tuple[int, ...]) -> None:
    n_tiles, tile, n_docs = int(a["n_tiles"]), int(a["TILE"]), int(a["n_docs"])
    for q in range(int(a["n_rows"])):
        flags = int(a["row_flags"][q])
        t0, t1 = int(a["qt_off"][q]), int(a["qt_off"][q + 1])
        for j in range(n_tiles):
            key = 0
            base, end = j * tile, min(j * tile + tile, n_docs)
            if not flags & ROW_OFF_TILES and t1 > t0 and (not flags & ROW_FILTERED or _allowed(a, q, base, end)
                                                          is not None):
                bound, anyp = F32(0), False
                for u in range(t0, t1):
                    t = int(a["qt_term"][u])
                    r = int(a["dir_row"][t])
                    if r >= 0:
                        i0, i1 = int(a["dir_imp_off"][r * n_tiles + j]), int(a["dir_imp_off"][r * n_tiles + j + 1])
                        if i0 == i1:
                            continue
                        imp = a["dir_imp"][i0:i1]
                    else:
                        i = u - t0
                        if i < 64:
                            present = bool((int(a["lmask"][q * n_tiles + j]) >> i) & 1)
                        else:
                            lo, hi = _range(a, t, j, base, end)
                            present = hi > lo
                        if not present:
                            continue
                        imp = a["term_imp"][int(a["term_imp_off"][t]):int(a["term_imp_off"][t + 1])]
                    anyp = True
                    bt = max([_bound(a, int(x), u) for x in imp.tolist()], default=F32(0))
                    bound = F32(bound + F32(scaled(bt, a["qt_mult"][u])))
                if anyp:
                    if int(a["has_w0"]):
                        bound = F32(bound + F32(a["row_const"][q]))
                    key = int(float_to_ordered(np.array([bound], F32))[0])
            a["ukey"][q * n_tiles + j] = key


def model_seed_tiles(a: dict, grid: tuple[int, ...]) -> None:
    """seed_tiles: each row's SEEDS largest (key << 32 | ~tile) with key > 0, descending, 0-padded."""
    n_tiles, S = int(a["n_tiles"]), SEEDS
    for q in range(int(a["n_rows"])):
        u = a["ukey"][q * n_tiles:(q + 1) * n_tiles].astype(np.int64)
        j = np.flatnonzero(u)
        packed = np.sort((u[j].astype(U64) << U64(32)) | (~j.astype(np.int64) & 0xFFFFFFFF).astype(U64))[::-1][:S]
        out = np.zeros(S, U64)
        out[:packed.size] = packed
        a["seeds"][q * S:(q + 1) * S] = out


def model_seed_theta(a: dict, grid: tuple[int, ...]) -> None:
    k = int(a["k"])
    for q in range(int(a["n_rows"])):
        if int(a["row_flags"][q]) & ROW_OFF_TILES:
            continue
        key = int(a["top"][q * k + k - 1]) & (2**64 - 1)  # the raw key's bits
        if key:
            a["theta"][q] = max(int(a["theta"][q]), key >> 32)


def _nibble_prefix(w: int, s: int) -> int:
    return sum((w >> (4 * h)) & 15 for h in range(s))


def _item(a: dict, it: int) -> tuple[int, int, int]:
    """(q, j, U) of work item ``it``: a seed (mode 0; U its high word, 0 = no seed) or a list item (U = ukey)."""
    n_tiles = int(a["n_tiles"])
    if int(a["mode"]) == 0:
        seed = int(a["seeds"][it])
        return it // SEEDS, (~seed) & 0xFFFFFFFF, seed >> 32
    item = int(a["items"][it])
    q, j = item >> 32, item & 0xFFFFFFFF
    return q, j, int(a["ukey"][q * n_tiles + j]) if "ukey" in a else 0


def _n_work(a: dict) -> int:
    return int(a["n_rows"]) * SEEDS if int(a["mode"]) == 0 else int(a["n_items"][0])


def _sub_bound(a: dict, q: int, j: int, s: int, sbase: int, send: int) -> tuple[np.float32, bool]:
    """sub_plan's bound of sub-block s of tile j: (float32 ub [+ C], whether a query term has a posting there)."""
    n_tiles = int(a["n_tiles"])
    ub, pres = F32(0), False
    for u in range(int(a["qt_off"][q]), int(a["qt_off"][q + 1])):
        t = int(a["qt_term"][u])
        r = int(a["dir_row"][t])
        if r >= 0:
            cell = r * n_tiles + j
            w = int(a["dir_sub_cnt"][cell])
            h0 = int(a["dir_sub_off"][cell]) + _nibble_prefix(w, s)
            imp = a["dir_sub_imp"][h0:h0 + ((w >> (4 * s)) & 15)]
        else:
            lst = a["doc_ids"][int(a["offsets"][t]):int(a["offsets"][t + 1])]
            p = int(np.searchsorted(lst, sbase, "left"))
            here = p < lst.size and int(lst[p]) < send
            imp = a["term_imp"][int(a["term_imp_off"][t]):int(a["term_imp_off"][t + 1])] if here else imp_empty
        if imp.size == 0:
            continue
        pres = True
        bb = max(_bound(a, int(x), u) for x in imp.tolist())
        ub = F32(ub + F32(scaled(bb, a["qt_mult"][u])))
    if int(a["has_w0"]):
        ub = F32(ub + F32(a["row_const"][q]))
    return ub, pres


imp_empty = np.zeros(0, U32)


def model_sub_plan(a: dict, grid: tuple[int, ...]) -> None:
    """sub_plan: sub_ub[it * SUBS + s] = key(ub) of each kept sub-block, 0 for a cut one."""
    n_tiles, tile, n_docs = int(a["n_tiles"]), int(a["TILE"]), int(a["n_docs"])
    sub = tile // SUBS
    for it in range(_n_work(a)):
        q, j, u = _item(a, it)
        if int(a["mode"]) == 0 and u:
            a["ukey"][q * n_tiles + j] = 0  # a seed is never listed again
        th = int(a["theta"][q]) if u else 0
        for s in range(SUBS):
            key = 0
            if u and u >= th:
                if s == 0:
                    a["tiles_scored"][q] += 1
                sbase = j * tile + s * sub
                send = min(sbase + sub, n_docs)
                ok = sbase < n_docs
                if ok and int(a["row_flags"][q]) & ROW_FILTERED:
                    lst = a["allow_docs"][int(a["allow_off"][q]):int(a["allow_off"][q + 1])]
                    p = int(np.searchsorted(lst, sbase, "left"))
                    ok = p < lst.size and int(lst[p]) < send
                if ok:
                    ub, pres = _sub_bound(a, q, j, s, sbase, send)
                    if pres:
                        kk = int(float_to_ordered(ub)[0])
                        if kk >= th:
                            key = kk
                        else:
                            a["blocks_skipped"][q] += 1
            a["sub_ub"][it * SUBS + s] = key


def _sub_range(a: dict, t: int, j: int, s: int, sbase: int, send: int) -> tuple[int, int]:
    """sub_score: term t's postings [lo, hi) in sub-block s of tile j (the directory's ends, or two searches)."""
    n_tiles = int(a["n_tiles"])
    o0, o1 = int(a["offsets"][t]), int(a["offsets"][t + 1])
    r = int(a["dir_row"][t])
    if r >= 0:
        cell = r * n_tiles + j
        e = a["dir_sub_end"]
        e0 = int(e[cell * SUBS + s - 1]) if s > 0 else 0
        lo = o0 + int(a["dir_start"][r * (n_tiles + 1) + j]) + e0
        return lo, lo + int(e[cell * SUBS + s]) - e0
    lst = a["doc_ids"][o0:o1]
    return o0 + int(np.searchsorted(lst, sbase, "left")), o0 + int(np.searchsorted(lst, send, "left"))


def _sub_accumulate(a: dict, q: int, j: int, s: int, sbase: int, send: int, ok: np.ndarray):
    """sub_score's rounds: (touched bool (SUB,), sums float32 (SUB,)), one term per round, ascending.

    ``ok`` bool (SUB,): the slots not BLOCKED (live, allowed, inside the collection).
    """
    sub = ok.size
    acc = np.zeros(sub, F32)
    touched = np.zeros(sub, bool)
    for u in range(int(a["qt_off"][q]), int(a["qt_off"][q + 1])):
        lo, hi = _sub_range(a, int(a["qt_term"][u]), j, s, sbase, send)
        if hi == lo:
            continue
        d = a["doc_ids"][lo:hi].astype(np.int64) - sbase
        w = _weights(a, lo, hi, u)
        keep = ok[d]
        d, w = d[keep], w[keep]
        acc[d] = acc[d] + scaled(w, a["qt_mult"][u])  # a document at most once per round
        touched[d] = True
    return touched, acc


def _sub_item(a: dict, g: int) -> Iterator[None]:
    """One (item, sub-block) warp of sub_score, yielding where other warps may interleave."""
    ubk = int(a["sub_ub"][g])
    if ubk == 0:
        return
    it, s = divmod(g, SUBS)
    q, j, _ = _item(a, it)
    tile, k, n_docs = int(a["TILE"]), int(a["k"]), int(a["n_docs"])
    sub = tile // SUBS
    yield  # theta is read for the cut
    theta = a["theta"]
    if ubk < int(theta[q]):
        a["blocks_skipped"][q] += 1
        return
    a["blocks_scored"][q] += 1
    sbase = j * tile + s * sub
    send = min(sbase + sub, n_docs)
    docs = np.arange(sbase, sbase + sub)
    ok = (docs < send) & _live(a, np.minimum(docs, max(n_docs - 1, 0)))
    if int(a["row_flags"][q]) & ROW_FILTERED:
        lst = a["allow_docs"][int(a["allow_off"][q]):int(a["allow_off"][q + 1])]
        allowed = np.zeros(sub, bool)
        inb = lst[(lst >= sbase) & (lst < send)]
        allowed[inb - sbase] = True
        ok &= allowed
    touched, acc = _sub_accumulate(a, q, j, s, sbase, send, ok)
    sc = acc + F32(a["row_const"][q]) if int(a["has_w0"]) else acc
    keys = np.where(touched, float_to_ordered(sc.astype(F32)), U32(0)).astype(U32)
    lb = 0
    if int(touched.sum()) >= k:
        lb = int(np.sort(keys[touched])[::-1][k - 1])  # the exact k-th largest key
    yield  # theta is raised and read for the emission
    old = int(theta[q])
    if lb:
        theta[q] = max(old, lb)
    thr = max(old, lb)
    sel = np.flatnonzero(touched & (keys >= U32(thr)))
    if sel.size == 0:
        return
    yield  # candidates are emitted
    c0, c1 = int(a["cand_off"][q]), int(a["cand_off"][q + 1])
    first = int(a["counts"][q])
    a["counts"][q] = first + sel.size
    slots = first + np.arange(sel.size)
    fit = slots < c1 - c0
    a["cand"][c0 + slots[fit]] = key_from_ordered(keys[sel[fit]], sbase + sel[fit])


def _sub_warp(a: dict, w: int, n_warps: int) -> Iterator[None]:
    for g in range(w, _n_work(a) * SUBS, n_warps):
        yield from _sub_item(a, g)


def model_sub_score(a: dict, grid: tuple[int, ...], rng: np.random.Generator | None = None,
                    warps_per_block: int = 1) -> None:
    """sub_score over ``grid[0]`` persistent blocks of ``warps_per_block`` warps, interleaved by ``rng``."""
    n = grid[0] * warps_per_block
    warps = [_sub_warp(a, w, n) for w in range(n)]
    if rng is None:
        for b in warps:
            for _ in b:
                pass
        return
    live = list(warps)
    while live:
        i = int(rng.integers(len(live)))
        try:
            next(live[i])
        except StopIteration:
            live.pop(i)


def model_tile_list(a: dict, grid: tuple[int, ...]) -> None:
    n_tiles = int(a["n_tiles"])
    n = int(a["n_items"][0])
    for q in range(int(a["n_rows"])):
        for j in range(n_tiles):
            u = int(a["ukey"][q * n_tiles + j])
            if u != 0 and u >= int(a["theta"][q]):
                a["items"][n] = (q << 32) | j
                n += 1
    a["n_items"][0] = n


def model_tile_dense(a: dict, grid: tuple[int, ...]) -> None:
    tile, n_docs = int(a["TILE"]), int(a["n_docs"])
    out = a["out"].reshape(-1)
    for q in range(min(grid[1], int(a["n_rows"]))):
        t0, t1 = int(a["qt_off"][q]), int(a["qt_off"][q + 1])
        filt = int(a["row_flags"][q]) & ROW_FILTERED
        for j in range(min(grid[0], int(a["n_tiles"]))):
            base = j * tile
            end = min(base + tile, n_docs)
            touched = np.zeros(tile, bool)
            acc = np.zeros(tile, F32)
            allowed = _allowed(a, q, base, end) if filt else None
            if t1 > t0 and (allowed is not None or not filt):
                touched, acc = _accumulate(a, q, j, base, end, allowed)
            s = acc + F32(a["row_const"][q]) if int(a["has_w0"]) else acc
            row = np.where(touched, s, F32(-np.inf)).astype(F32)
            out[q * n_docs + base: q * n_docs + end] = row[: end - base]


def model_haystack_score(a: dict, grid: tuple[int, ...]) -> None:
    from .weights import weights_of

    fwd_off, fwd_terms, fwd_tfs = a["fwd_off"], a["fwd_terms"], a["fwd_tfs"]
    n_docs = fwd_off.size - 1
    doc_of = np.repeat(np.arange(n_docs, dtype=np.int64), np.diff(fwd_off))
    fkey = doc_of * (1 << 32) + fwd_terms.astype(np.int64)  # ascending: doc-major, terms ascending
    params = _params(a)
    for h in range(int(a["n_hs"])):
        row = int(a["hs_rows"][h])
        n = int(a["hs_start"][h + 1] - a["hs_start"][h])
        docs = a["allow_docs"][int(a["allow_off"][row]): int(a["allow_off"][row]) + n].astype(np.int64)
        acc = np.zeros(n, F32)
        hit = np.zeros(n, bool)
        for u in range(int(a["qt_off"][row]), int(a["qt_off"][row + 1])):
            want = docs * (1 << 32) + int(a["qt_term"][u])
            pos = np.minimum(np.searchsorted(fkey, want), fkey.size - 1)
            found = (fkey[pos] == want) if fkey.size else np.zeros(n, bool)
            w = weights_of(fwd_tfs[pos[found]], a["doc_lens"][docs[found]], F32(a["qt_idf"][u]),
                           F32(a["qt_w0"][u]), float(a["avgdl"]), params)
            acc[found] = acc[found] + scaled(w, a["qt_mult"][u])
            hit |= found
        hit &= _live(a, docs)
        s = acc + F32(a["row_const"][row]) if int(a["has_w0"]) else acc
        keys = np.where(hit, composite_key(s.astype(F32), docs), U64(0))
        c0 = int(a["cand_off"][row])
        a["cand"][c0:c0 + n] = keys


def model_select_row(keys: np.ndarray, theta: int, k: int, doc_bits: int):
    """select_topk for one row: (ids (k,) int64, scores (k,) float32), sentinel-padded."""
    top = model_select_keys(keys, theta, k, doc_bits)
    ids = np.where(top > 0, key_doc(top), -1)
    scores = np.where(top > 0, key_score(top), F32(-np.inf)).astype(F32)
    return ids, scores


def model_select_keys(keys: np.ndarray, theta: int, k: int, doc_bits: int) -> np.ndarray:
    """select_topk's sorted shared buffer for one row: the k largest valid keys, descending, 0-padded."""
    keys = np.asarray(keys, dtype=U64)
    kpad = next_pow2(k)
    assert kpad <= K.SELECT_MAX_K
    valid = keys[(keys != 0) & ((keys >> U64(32)).astype(U32) >= U32(theta))]
    prefix, mask, krem = U64(0), U64(0), k
    for p in range(radix_passes(doc_bits)):
        shift, width = radix_digit(p, doc_bits)
        nb, dmask = 1 << width, U64((1 << width) - 1)
        sel = valid[(valid & mask) == prefix]
        hist = np.bincount(((sel >> U64(shift)) & dmask).astype(np.int64), minlength=nb)
        if p == 0 and int(hist.sum()) <= krem:
            break  # take every valid key: prefix = mask = 0
        b, above, cnt = find_bin(hist, krem)
        prefix |= U64(b) << U64(shift)
        mask |= dmask << U64(shift)
        krem -= above
        if cnt == krem:
            break
    gathered = valid[(valid & mask) >= prefix]
    assert gathered.size == min(k, valid.size), "gather must find exactly min(k, valid) keys"
    sbuf = np.zeros(kpad, dtype=U64)  # every slot the sentinel before any read
    sbuf[: gathered.size] = gathered
    return np.sort(sbuf)[::-1][:k]


def model_select_topk(a: dict, grid: tuple[int, ...]) -> None:
    k, segs = int(a["k"]), int(a["segs"])
    assert int(a["kpad"]) == next_pow2(k) and segs >= 1
    ids = a["out_ids"].reshape(-1, k)
    out = None if int(a["raw_keys"]) else a["out_scores"].reshape(-1, k)
    for ob in range(grid[0]):
        r = ob // segs
        c0, c1 = int(a["cand_off"][r]), int(a["cand_off"][r + 1])
        n = max(0, min(int(a["counts"][r]), c1 - c0))
        seg_len = -(-n // segs)
        s0 = min((ob % segs) * seg_len, n)
        n = min(n - s0, seg_len)
        keys = a["cand"][c0 + s0:c0 + s0 + n]
        if out is None:  # raw keys: the segment's top k, sentinel-padded, as int64 bits
            ids[ob] = model_select_keys(keys, int(a["theta"][r]), k, int(a["doc_bits"])).view(np.int64)
        else:
            ids[ob], out[ob] = model_select_row(keys, int(a["theta"][r]), k, int(a["doc_bits"]))


def model_pack_candidates(a: dict, grid: tuple[int, ...]) -> None:
    width = int(a["width"])
    out = a["out"].reshape(-1)
    for r in range(grid[1]):
        c0, c1 = int(a["cand_off"][r]), int(a["cand_off"][r + 1])
        n = min(int(a["counts"][r]), c1 - c0)
        keys = a["cand"][c0:c0 + n]
        ok = (keys != 0) & ((keys >> U64(32)).astype(U32) >= U32(a["theta"][r]))
        out[r * width: r * width + n] = np.where(ok, keys, U64(0))


def model_decode_keys(a: dict, grid: tuple[int, ...]) -> None:
    n = int(a["n"])
    kk = a["keys"].reshape(-1)[:n]
    a["ids"].reshape(-1)[:n] = np.where(kk > 0, key_doc(kk), -1)
    a["out"].reshape(-1)[:n] = np.where(kk > 0, key_score(kk), F32(-np.inf))


# =============================================================================
# scatter.cu (the design card's kernel)
# =============================================================================
def model_scatter_round(a: dict, grid: tuple[int, ...]) -> None:
    """One round: each span's postings add scaled(w, mult) into acc (at most one add per slot), touched set."""
    from .weights import weights_of

    n, width, words, doc0 = int(a["n_spans"]), int(a["width"]), int(a["words"]), int(a["doc0"])
    acc, touched = a["acc"], a["touched"]
    slots = []
    for s in range(n):
        p0 = int(a["sp_start"][s])
        p1 = p0 + int(a["sp_cum"][s + 1] - a["sp_cum"][s])
        g = int(a["sp_base"][s]) + a["doc_ids"][p0:p1].astype(np.int64)
        d = g - doc0
        ok = (d >= 0) & (d < width)
        if int(a["has_weights"]):
            w = a["weights"][p0:p1]
        else:
            w = weights_of(a["tfs"][p0:p1], a["doc_lens"][g], F32(a["sp_idf"][s]), F32(a["sp_w0"][s]),
                           float(a["avgdl"]), _params(a))
        w = np.asarray(scaled(np.asarray(w, F32), a["sp_mult"][s]), F32)[ok]
        r, d = int(a["sp_row"][s]), d[ok]
        slots.append(r * width + d)
        acc[r * width + d] = (acc[r * width + d] + w).astype(F32)
        np.bitwise_or.at(touched, r * words + (d >> 5), (U32(1) << (d & 31).astype(U32)).astype(U32))
    allslots = np.concatenate(slots) if slots else np.zeros(0, np.int64)
    assert np.unique(allslots).size == allslots.size, "a slot added twice in one round"


def model_scatter_clip(a: dict, grid: tuple[int, ...]) -> None:
    """Each span cut to the window: its first posting there and its count."""
    doc0, width = int(a["doc0"]), int(a["width"])
    for s in range(int(a["n_spans"])):
        p0 = int(a["sp_start"][s])
        p1 = p0 + int(a["sp_cum"][s + 1] - a["sp_cum"][s])
        rows = a["doc_ids"][p0:p1].astype(np.int64) + int(a["sp_base"][s])
        lo, hi = np.searchsorted(rows, doc0), np.searchsorted(rows, doc0 + width)
        a["out_start"][s], a["out_len"][s] = p0 + lo, hi - lo


def model_scatter_keys(a: dict, grid: tuple[int, ...]) -> None:
    """Every slot of the window: its composite key, or the sentinel 0."""
    width, words, doc0 = int(a["width"]), int(a["words"]), int(a["doc0"])
    d = np.arange(width, dtype=np.int64)
    g = doc0 + d
    for r in range(grid[1]):
        ok = ((a["touched"][r * words + (d >> 5)] >> (d & 31).astype(U32)) & U32(1)).astype(bool)
        gi = np.where(ok, g, 0)  # the kernel reads the bitmaps only for touched slots (rows < N)
        if int(a["has_live"]):
            ok &= ((a["live"][gi >> 5] >> (gi & 31).astype(U32)) & U32(1)).astype(bool)
        ar = int(a["row_allow"][r])
        if ar >= 0:
            aw = int(a["allow_words"])
            ok &= ((a["allow"].reshape(-1)[ar * aw + (gi >> 5)] >> (gi & 31).astype(U32)) & U32(1)).astype(bool)
        s = a["acc"][r * width: (r + 1) * width].astype(F32)
        if int(a["has_w0"]):
            s = (s + F32(a["row_const"][r])).astype(F32)
        doc = a["row_key"][np.where(ok, g, 0)].astype(np.int64) if int(a["has_key"]) else g
        a["keys"][r * width: (r + 1) * width] = np.where(ok, composite_key(s, np.where(ok, doc, 0)), U64(0))


MODELS: dict[str, Callable[..., None]] = {
    "light_marks": model_light_marks, "tile_bounds": model_tile_bounds, "tile_list": model_tile_list,
    "seed_tiles": model_seed_tiles, "seed_theta": model_seed_theta,
    "sub_plan": model_sub_plan, "tile_dense": model_tile_dense, "haystack_score": model_haystack_score,
    "select_topk": model_select_topk, "pack_candidates": model_pack_candidates, "decode_keys": model_decode_keys,
    "scatter_round": model_scatter_round, "scatter_clip": model_scatter_clip, "scatter_keys": model_scatter_keys,
}


# =============================================================================
# Kernel signatures, parsed from the .cu text, and launch checks
# =============================================================================
_CTYPES = {
    "int": np.int32, "long long": np.int64, "unsigned int": np.uint32, "unsigned short": np.uint16,
    "unsigned long long": np.uint64, "float": np.float32, "double": np.float64,
}


def strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", " ", src)


def kernel_signatures(filename: str) -> dict[str, list[tuple[str, type, bool, bool]]]:
    """``{kernel: [(param, numpy scalar type, is_pointer, is_const), ...]}`` of a .cu file."""
    src = strip_comments(K.load_source(filename)).replace("\\\n", " ")
    for name, body in re.findall(r"^\s*#\s*define\s+(GPUIR_\w+_PARAMS)\s+(.*)$", src, flags=re.MULTILINE):
        src = re.sub(rf"\b{name}\b(?!\s+int)", body.strip(), src)  # expand the parameter-list macros
    out = {}
    pat = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)\s*\{")
    for m in pat.finditer(src):
        params = []
        for p in m.group(2).split(","):
            is_const = re.search(r"\bconst\b", p.split("*")[0]) is not None
            p = " ".join(re.sub(r"\b(const|__restrict__)\b", " ", p).split())
            is_ptr = "*" in p
            *ty, name = p.replace("*", " ").split()
            params.append((name, _CTYPES[" ".join(ty)], is_ptr, is_const))
        out[m.group(1)] = params
    return out


#: Static shared memory of each kernel (bytes), as ptxas reports it; the launch
#: check adds the dynamic part. Kept equal to the compiled value by
#: tests/test_kernels_compile.py.
STATIC_SMEM = {"select_topk": 4 * BINS + 4 * 32 + 4 * 4}


class LaunchError(AssertionError):
    """A launch CuPy would make does not match the kernel's C signature."""


def template_args(name: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", name.split("<", 1)[1])] if "<" in name else []


def check_launch(sigs: dict, name: str, grid, block, args, shared_mem: int = 0) -> None:
    """What CuPy would pass must be exactly what the kernel signature declares."""
    base = name.split("<")[0]
    sig = sigs[base]
    if len(args) != len(sig):
        raise LaunchError(f"{name}: {len(args)} arguments for {len(sig)} parameters")
    for a, (pname, ty, is_ptr, _) in zip(args, sig):
        if is_ptr:
            if not isinstance(a, DevArray):
                raise LaunchError(f"{name}.{pname}: expected a device array, got {type(a).__name__}")
            if a.dtype != np.dtype(ty) or not a.flags.c_contiguous:
                raise LaunchError(f"{name}.{pname}: expected contiguous {np.dtype(ty)}, got {a.dtype} "
                                  f"(contiguous={a.flags.c_contiguous})")
        elif type(a) is not ty:
            raise LaunchError(f"{name}.{pname}: expected numpy.{ty.__name__}, got {type(a).__name__} "
                              "(CuPy passes Python int as int64 and float as float64)")
    if not (1 <= len(grid) <= 3 and 1 <= len(block) <= 3):
        raise LaunchError(f"{name}: grid {grid} / block {block}")
    if not (1 <= grid[0] <= 2**31 - 1 and all(1 <= g <= 65535 for g in grid[1:])):
        raise LaunchError(f"{name}: grid {grid} outside CUDA's limits")
    if int(np.prod(block)) > 1024:
        raise LaunchError(f"{name}: block {block} has more than 1024 threads")
    tmpl = template_args(name)
    if tmpl and block != (tmpl[0],):
        raise LaunchError(f"{name}: block {block} but the kernel strides by its THREADS = {tmpl[0]}")
    if base == "select_topk":
        kpad = int(args[6])
        if shared_mem != 8 * kpad or shared_mem + STATIC_SMEM[base] > STATIC_SMEM_LIMIT:
            raise LaunchError(f"{name}: shared_mem {shared_mem} for kpad {kpad}")
    elif shared_mem != 0:
        raise LaunchError(f"{name}: no dynamic shared memory expected, got {shared_mem}")


# =============================================================================
# The fake cupy
# =============================================================================
class _Capture(threading.local):
    """While a fake stream captures a graph: the operations recorded so far (run later, by the graph).

    Per thread, as CuPy's current stream is: the scorer captures on its own workspace's stream in
    relaxed mode, so another thread's copies and launches (on its own stream) go on meanwhile, and
    never into this graph.
    """

    ops: list[Callable[[], None]] | None = None


_CAPTURE = _Capture()
#: Streams capturing a graph now, in any thread (the fake device refuses a device-wide sync meanwhile).
_ACTIVE = [0]
_ACTIVE_LOCK = threading.Lock()


def _deferred(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` now, or record it when this thread's stream is capturing a graph (as CUDA does with stream
    work)."""
    ops = _CAPTURE.ops
    if ops is not None:
        ops.append(fn)
        return None
    return fn()


class DevArray(np.ndarray):
    """A 'device' array: a NumPy array with CuPy's ``get`` / ``set`` / ``fill`` (recorded during a capture)."""

    def get(self, stream=None, out=None, blocking=True, **_):
        if _CAPTURE.ops is not None:  # as CuPy: memory.pyx refuses copies on a capturing stream
            raise RuntimeError("the current stream is capturing, so D2H transfers are disallowed")
        if out is not None:
            if out.shape != self.shape or out.dtype != self.dtype:
                raise ValueError("get(out=...) needs the array's shape and dtype")
            np.copyto(out, self.view(np.ndarray))
            return out
        return np.array(self, copy=True).view(np.ndarray)

    def fill(self, value):
        return _deferred(lambda: np.ndarray.fill(self, value))

    def set(self, arr, stream=None):
        if _CAPTURE.ops is not None:  # as CuPy: memory.pyx refuses copies on a capturing stream
            raise RuntimeError("the current stream is capturing, so H2D transfers are disallowed")
        arr = np.asarray(arr)
        if arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError(f"set: shape/dtype {arr.shape}/{arr.dtype} for {self.shape}/{self.dtype}")
        np.copyto(self.view(np.ndarray), arr)


def _dev(a) -> DevArray:
    return np.array(a, copy=True).view(DevArray)


def _garbage(shape, dtype) -> DevArray:
    """cupy.empty: uninitialised memory (here 0xFF bytes: NaN, -1, huge), never zeros."""
    a = np.empty(shape, dtype)
    a.view(np.uint8)[...] = 0xFF
    return a.view(DevArray)


class FakeOOM(Exception):
    """Stands in for ``cupy.cuda.memory.OutOfMemoryError``."""


def _wrap(fn):
    def call(*args, **kw):
        args = [np.asarray(a).view(np.ndarray) if isinstance(a, DevArray) else a for a in args]
        r = fn(*args, **kw)
        return r.view(DevArray) if isinstance(r, np.ndarray) else r

    return call


def make_fake_cupy(oom_if: Callable[[str, tuple], bool] | None = None, seed: int | None = 0,
                   sm_count: int = 4, runner: Callable[..., None] | None = None) -> types.SimpleNamespace:
    """A stand-in for the ``cupy`` module whose kernels are the model (or ``runner``).

    Parameters
    ----------
    oom_if : callable (kernel name, args) -> bool, optional
        Raise the fake out-of-memory error from launches where it returns True.
    seed : int or None
        Seeds the scheduler that interleaves tile_score's blocks (None: blocks in order).
    sm_count : int
        Reported ``MultiProcessorCount`` (the scorer sizes its grids from it).
    runner : callable, optional
        ``runner(filename, name, grid, block, host_args, shared_mem)`` runs a
        launch instead of the model (e.g. the real kernel bodies compiled for
        the host, tests/cuda_host); ``host_args`` are NumPy arrays and scalars.
    """
    cp = types.SimpleNamespace(__version__="none (fake cupy: kernel model)")
    # importlib.util.find_spec("cupy") (gpuir._compat.cuda_device) raises on a module without a spec
    cp.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    for nm in ("float32", "float64", "uint32", "int32", "int64", "uint64", "uint8"):
        setattr(cp, nm, getattr(np, nm))
    cp.ndarray = DevArray
    cp.asarray = _dev
    cp.zeros = lambda shape, dtype=float: np.zeros(shape, dtype).view(DevArray)
    cp.empty = lambda shape, dtype=float: _garbage(shape, dtype)
    cp.full = lambda shape, v, dtype=float: np.full(shape, v, dtype).view(DevArray)
    cp.ascontiguousarray = lambda a: np.ascontiguousarray(a).view(DevArray)
    for nm in ("arange", "searchsorted", "argsort", "bincount", "cumsum", "concatenate", "maximum"):
        setattr(cp, nm, _wrap(getattr(np, nm)))
    rng = None if seed is None else np.random.default_rng(seed)

    class Event:
        def record(self, stream=None):
            pass

        def synchronize(self):
            pass

    class _Context:  # usable in `with`, synchronize() is a no-op: the model runs synchronously
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def synchronize(self):
            pass

    class Graph:
        """A captured sequence of stream operations, replayed by ``launch``."""

        def __init__(self, ops):
            self.ops = ops

        def launch(self, stream=None):
            cp.graph_launches += 1
            for op in self.ops:
                op()

    class Stream(_Context):
        def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
            pass

        def begin_capture(self, mode=None):
            if _CAPTURE.ops is not None:
                raise RuntimeError("a capture is already running")
            _CAPTURE.ops = []
            with _ACTIVE_LOCK:
                _ACTIVE[0] += 1

        def end_capture(self):
            ops, _CAPTURE.ops = _CAPTURE.ops, None
            with _ACTIVE_LOCK:
                _ACTIVE[0] -= 1
            cp.graph_captures += 1
            return Graph(ops)

    class Device(_Context):
        def __init__(self, i=0):
            self.id = int(i)
            self.attributes = {"MultiProcessorCount": sm_count}

        def synchronize(self):
            # as CUDA: a device-wide synchronisation is refused while any stream of the device is
            # capturing, whatever thread captures and in whatever capture mode
            if _ACTIVE[0]:
                raise RuntimeError("cudaErrorStreamCaptureUnsupported: operation not permitted when stream is "
                                   "capturing")

    class Pool:
        def free_all_blocks(self):
            cp.freed += 1

        def free_bytes(self):
            return 0

    cp.freed = 0
    cp.graph_launches = cp.graph_captures = 0
    cp.cuda = types.SimpleNamespace(
        Event=Event, Stream=Stream, Device=Device, get_elapsed_time=lambda a, b: 0.0,
        get_current_stream=lambda: Stream(),
        alloc_pinned_memory=lambda n: bytearray(max(1, int(n))),
        set_allocator=lambda alloc=None: None, set_pinned_memory_allocator=lambda alloc=None: None,
        memory=types.SimpleNamespace(OutOfMemoryError=FakeOOM),
        runtime=types.SimpleNamespace(memGetInfo=lambda: (8 << 30, 16 << 30),
                                      getDeviceProperties=lambda i: {"name": b"Emulated (kernel model)"}),
    )
    pool = Pool()
    cp.get_default_memory_pool = lambda: pool
    cp.launches = []
    sigs = {**kernel_signatures("bm25_score.cu"), **kernel_signatures("topk.cu"), **kernel_signatures("scatter.cu")}

    def kernel(filename, name, device_id=None):
        if name not in K.NAME_EXPRESSIONS[filename]:
            raise KeyError(f"{name!r} is not instantiated in {filename}")

        def launch(grid, block, args, shared_mem=0):
            check_launch(sigs, name, grid, block, args, shared_mem)
            cp.launches.append((name, grid, block, shared_mem))
            if oom_if is not None and oom_if(name, args):
                raise FakeOOM(f"emulated OOM in {name}")
            return _deferred(lambda: run(grid, block, args, shared_mem))

        def run(grid, block, args, shared_mem):
            base = name.split("<")[0]
            if runner is not None:
                runner(filename, name, grid, block, [as_host(v) for v in args], shared_mem)
                return
            names = [p[0] for p in sigs[base]]
            a = {n: (np.asarray(v).view(np.ndarray) if isinstance(v, DevArray) else v) for n, v in zip(names, args)}
            for n, (_, _, is_ptr, is_const) in zip(names, sigs[base]):
                if is_ptr and is_const:  # a const parameter cannot be written: the model would raise
                    a[n] = a[n].view()
                    a[n].flags.writeable = False
            tmpl = template_args(name)
            if base in ("sub_plan", "sub_score", "tile_dense", "tile_bounds", "light_marks"):
                a["TILE"] = tmpl[1]
            if base == "sub_score":
                model_sub_score(a, grid, rng, max(1, block[0] // 32))
            else:
                MODELS[base](a, grid)

        return launch

    cp.kernel = kernel
    return cp


@contextlib.contextmanager
def fake_cupy_installed(**kw) -> Iterator[types.SimpleNamespace]:
    """Install :func:`make_fake_cupy` as ``cupy`` for the cupy backend, then restore.

    Yields the fake module (its ``launches`` list records every launch).
    """
    from . import cupy_backend as cb

    cp = make_fake_cupy(**kw)
    saved = (sys.modules.get("cupy"), cb.cuda_device, K.kernel)
    sys.modules["cupy"] = cp  # type: ignore[assignment]
    cb.cuda_device = lambda: (True, "emulated device (kernel model)")
    K.kernel = cp.kernel
    try:
        yield cp
    finally:
        if saved[0] is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = saved[0]
        cb.cuda_device, K.kernel = saved[1], saved[2]


def as_host(x: Any) -> Any:
    return np.asarray(x).view(np.ndarray) if isinstance(x, DevArray) else x


#: Instantiations :func:`small_tiles` uses: small blocks and tiles, so that
#: small test indexes span many tiles and the host emulation stays quick.
SMALL = {"TILE_THREADS": 32, "TILE_DOCS": 64, "HAYSTACK_THREADS": 32, "SELECT_THREADS": 64, "PACK_THREADS": 32,
         "SCATTER_THREADS": 32}


def small_names(v: dict[str, int] | None = None) -> dict[str, list[str]]:
    """The kernel files' name expressions under the block sizes ``v`` (default :data:`SMALL`)."""
    v = SMALL if v is None else v
    return {
        "bm25_score.cu": [f"light_marks<{v['TILE_THREADS']}, {v['TILE_DOCS']}>",
                          f"tile_bounds<{v['TILE_THREADS']}, {v['TILE_DOCS']}>",
                          f"seed_tiles<{v['TILE_THREADS']}>",
                          f"sub_plan<{v['TILE_THREADS']}, {v['TILE_DOCS']}>",
                          f"sub_score<{v['TILE_THREADS']}, {v['TILE_DOCS']}>",
                          "seed_theta",
                          f"tile_list<{v['TILE_THREADS']}>",
                          f"tile_dense<{v['TILE_THREADS']}, {v['TILE_DOCS']}>",
                          f"haystack_score<{v['HAYSTACK_THREADS']}>"],
        "topk.cu": [f"select_topk<{v['SELECT_THREADS']}>", f"pack_candidates<{v['PACK_THREADS']}>", "decode_keys"],
        "scatter.cu": [f"scatter_round<{v['SCATTER_THREADS']}>", f"scatter_clip<{v['SCATTER_THREADS']}>",
                       f"scatter_keys<{v['SCATTER_THREADS']}>"],
    }


@contextlib.contextmanager
def small_kernels(v: dict[str, int] | None = None) -> Iterator[None]:
    """Scorers created inside launch the block sizes ``v`` (keys of :data:`SMALL`; missing keys default to it).

    ``NAME_EXPRESSIONS`` lists the matching instantiations meanwhile; everything is restored on exit.
    """
    v = {**SMALL, **(v or {})}
    saved = {n: getattr(K, n) for n in v} | {"NAME_EXPRESSIONS": K.NAME_EXPRESSIONS}
    for n, x in v.items():
        setattr(K, n, x)
    K.NAME_EXPRESSIONS = {**K.NAME_EXPRESSIONS, **small_names(v)}
    try:
        yield
    finally:
        for n, x in saved.items():
            setattr(K, n, x)


def small_tiles(threads: int = 32, docs: int = 64) -> contextlib.AbstractContextManager[None]:
    """Scorers created inside use small instantiations (:data:`SMALL`, with ``threads`` / ``docs`` per tile)."""
    return small_kernels({"TILE_THREADS": threads, "TILE_DOCS": docs})
