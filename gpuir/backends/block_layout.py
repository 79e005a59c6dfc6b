"""A segment's block index: what the compiled CPU engine lays out once per segment, made or read back.

:class:`~gpuir.backends.numba_backend.NumbaScorer` cuts each term's postings
into blocks of :data:`~gpuir.backends.cpu_maxscore.BLOCK` and keeps, per block,
its first posting, last document, largest tf and smallest document length, a
doc-space directory per term, and per term the (maxtf, mindl, mintf, maxdl)
summaries. No collection statistic enters any of it: it is fixed for the
segment's lifetime (:class:`BlockLayout`).

It is made by one compiled pass over the postings (:func:`lay_out_segment`,
:func:`gpuir.backends.cpu_segments.lay_out`) -- or read back: a memory saves
the arrays that pass computes with each segment's file (:func:`saved_arrays`,
members ``blk_*``) and maps them when the segment is opened
(:func:`from_saved`), so a fresh process does not lay its segments out again.
The rest (``blk_off``, ``shift``, ``dir_off``, ``starts``) follows from the
term offsets and is recomputed (:func:`block_shape`), which also checks every
saved directory entry against it: a saved layout never points a kernel outside
its term's blocks. Files without the members (older ones), or saved with
another block size or layout version, are laid out as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .batch_plan import TermSummaries

#: Version of the saved arrays' meaning; a file saved with another is laid out again.
LAYOUT_VERSION = 1
#: Names of the saved arrays in a segment file (see :func:`saved_arrays`).
SAVED = ("blk_layout", "blk_last", "blk_maxtf", "blk_mindl", "blk_dir", "blk_summ")


def read_only(a: np.ndarray, dtype) -> np.ndarray:
    """A read-only, C-contiguous ndarray view of ``a`` (a copy only when the dtype or layout differ).

    In-memory and memory-mapped (read-only) arrays then share one compiled
    specialisation of each kernel: numba types read-only arrays apart.
    """
    out = np.ascontiguousarray(np.asarray(a), dtype=dtype).view()
    out.flags.writeable = False
    return out


_ro = read_only


@dataclass(frozen=True)
class BlockLayout:
    """A segment's block index and term summaries (every array read-only, host).

    Attributes
    ----------
    blocks : tuple of 8 ndarrays
        blk_off : (V+1,) int64 -- term t's blocks are ``blk_off[t]:blk_off[t+1]``
        blk_last : (NB,) int32 -- document of a block's last posting
        blk_maxtf, blk_mindl : (NB,) int32 -- largest tf and smallest document length in the block
        dir_off : (V+1,) int64; dir_shift : (V,) int64; blk_dir : (ND,) int64
            Term t's first block whose last document is >= d is at most a step or two after
            ``blk_dir[dir_off[t] + (d >> dir_shift[t])]``: the directory cuts the document space in
            2**dir_shift[t]-sized cells, at least as many as the blocks.
        starts : (NB,) int64 -- position of a block's first posting
    summaries : TermSummaries
        (V,) int32 each: maxtf, mindl, mintf, maxdl (zeros for a term without postings).
    block : int
        Postings per block.
    """

    blocks: tuple[np.ndarray, ...]
    summaries: TermSummaries
    block: int


def block_shape(offsets: np.ndarray, n_docs: int, bs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The statistics-free shape of the block index, from the term offsets alone (NumPy).

    Parameters
    ----------
    offsets : ndarray (V+1,), int64
    n_docs : int
    bs : int -- postings per block

    Returns
    -------
    blk_off : (V+1,) int64; shift : (V,) int64; dir_off : (V+1,) int64; starts : (NB,) int64
        Each term's blocks, its directory's cell size (2**shift >= n_docs / blocks) and cells, and each
        block's first posting.
    """
    N = max(int(n_docs), 1)
    lens = np.diff(offsets)
    V = lens.size
    nblk = -(-lens // bs)
    blk_off = np.zeros(V + 1, dtype=np.int64)
    np.cumsum(nblk, out=blk_off[1:])
    shift = np.floor(np.log2(N / np.maximum(nblk, 1))).astype(np.int64).clip(0, 62)
    cells = ((N - 1) >> shift) + 1
    dir_off = np.zeros(V + 1, dtype=np.int64)
    np.cumsum(cells, out=dir_off[1:])
    NB = int(blk_off[-1])
    # block b of term t starts at offsets[t] + (b - blk_off[t]) * bs
    starts = np.arange(NB, dtype=np.int64) * bs
    starts += np.repeat(np.asarray(offsets[:-1], np.int64) - blk_off[:-1] * bs, nblk)
    return blk_off, shift, dir_off, starts


def lay_out_segment(offsets: np.ndarray, doc_ids: np.ndarray, tfs: np.ndarray, doc_lens: np.ndarray,
                    n_docs: int, bs: int | None = None) -> BlockLayout:
    """The block index and term summaries of a segment, in one compiled pass over its postings.

    Parameters
    ----------
    offsets : (V+1,) int64; doc_ids, tfs : (P,) int32; doc_lens : (n_docs,) int32 -- host (copied only when
        another dtype or not C-contiguous)
    bs : int, optional -- postings per block (default :data:`gpuir.backends.cpu_maxscore.BLOCK`)
    """
    from .cpu_maxscore import BLOCK
    from .cpu_segments import lay_out

    bs = BLOCK if bs is None else int(bs)
    # read-only views, as the scorer holds them: every caller shares one compiled specialisation
    offsets, doc_ids, tfs, doc_lens = (_ro(a, dt) for a, dt in ((offsets, np.int64), (doc_ids, np.int32),
                                                                (tfs, np.int32), (doc_lens, np.int32)))
    blk_off, shift, dir_off, _ = block_shape(offsets, n_docs, bs)
    V = blk_off.size - 1
    NB = int(blk_off[-1])
    summ = tuple(np.zeros(V, np.int32) for _ in range(4))
    blk_last, blk_maxtf, blk_mindl = (np.empty(NB, np.int32) for _ in range(3))
    starts = np.empty(NB, np.int64)
    blk_dir = np.empty(int(dir_off[-1]), np.int64)
    lay_out(offsets, doc_ids, tfs, doc_lens, bs, blk_off, shift, dir_off, summ, blk_last, blk_maxtf, blk_mindl,
            starts, blk_dir)
    blocks = (_ro(blk_off, np.int64), _ro(blk_last, np.int32), _ro(blk_maxtf, np.int32), _ro(blk_mindl, np.int32),
              _ro(dir_off, np.int64), _ro(shift, np.int64), _ro(blk_dir, np.int64), _ro(starts, np.int64))
    return BlockLayout(blocks, TermSummaries(*(_ro(a, np.int32) for a in summ)), bs)


def saved_arrays(layout: BlockLayout) -> dict[str, np.ndarray]:
    """What a segment file keeps of ``layout``: the arrays the compiled pass computes (``blk_*``).

    Returns
    -------
    dict name -> ndarray: ``blk_layout`` (2,) int64 (:data:`LAYOUT_VERSION`, block size), ``blk_last``,
    ``blk_maxtf``, ``blk_mindl`` (NB,) int32, ``blk_dir`` (ND,) int64, ``blk_summ`` (4, V) int32
    (maxtf, mindl, mintf, maxdl).
    """
    b, s = layout.blocks, layout.summaries
    return {"blk_layout": np.array([LAYOUT_VERSION, layout.block], np.int64), "blk_last": b[1], "blk_maxtf": b[2],
            "blk_mindl": b[3], "blk_dir": b[6], "blk_summ": np.stack([s.maxtf, s.mindl, s.mintf, s.maxdl])}


def from_saved(get: Callable[[str], np.ndarray], has: Callable[[str], bool], offsets: np.ndarray,
               n_docs: int, bs: int | None = None) -> BlockLayout | None:
    """The layout a segment file saved (:func:`saved_arrays`), or None when it holds none for ``bs``.

    Parameters
    ----------
    get : name -> ndarray (the file's member, checked against its CRC-32 by the caller's reader)
    has : name -> bool
    offsets : (V+1,) int64, host -- the segment's term offsets (already checked)
    n_docs : int
    bs : int, optional -- the block size wanted (default :data:`gpuir.backends.cpu_maxscore.BLOCK`)

    Returns
    -------
    BlockLayout, or None: no saved layout, or one of another version or block size (lay it out again).

    Raises
    ------
    ValueError
        The saved arrays do not fit the segment: a shape or dtype, a directory entry outside its
        term's blocks, a document outside [0, n_docs), a tf below 1 or a negative length.
    """
    if bs is None:
        from .cpu_maxscore import BLOCK

        bs = BLOCK
    if not all(has(n) for n in SAVED):
        return None
    meta = np.asarray(get("blk_layout"))
    if meta.shape != (2,) or meta.dtype.kind not in "iu":
        raise ValueError("array 'blk_layout' must hold (version, block size)")
    if int(meta[0]) != LAYOUT_VERSION or int(meta[1]) != bs:
        return None
    offsets = np.asarray(offsets, np.int64)
    blk_off, shift, dir_off, starts = block_shape(offsets, n_docs, bs)
    V, NB, ND = blk_off.size - 1, int(blk_off[-1]), int(dir_off[-1])
    arrs = {}
    for name, shp, dt in (("blk_last", (NB,), np.int32), ("blk_maxtf", (NB,), np.int32),
                          ("blk_mindl", (NB,), np.int32), ("blk_dir", (ND,), np.int64),
                          ("blk_summ", (4, V), np.int32)):
        a = get(name)
        if a.shape != shp or a.dtype != dt:
            raise ValueError(f"array {name!r} is {a.dtype}{list(a.shape)}, expected {np.dtype(dt)}{list(shp)}")
        arrs[name] = a
    last, mtf, mdl, bdir = arrs["blk_last"], arrs["blk_maxtf"], arrs["blk_mindl"], arrs["blk_dir"]
    if NB and (int(last.min()) < 0 or int(last.max()) >= max(n_docs, 1) or int(mtf.min()) < 1
               or int(mdl.min()) < 0):
        raise ValueError("saved blocks name a document outside the segment, a tf below 1 or a negative length")
    # every entry of term t within blk_off[t]..blk_off[t+1] <=> the whole directory never goes down,
    # each term's first entry >= blk_off[t] and its last <= blk_off[t+1] (each term has a cell)
    if ND and (bool(np.any(bdir[1:] < bdir[:-1])) or bool(np.any(bdir[dir_off[:-1]] < blk_off[:-1]))
               or bool(np.any(bdir[dir_off[1:] - 1] > blk_off[1:]))):
        raise ValueError("a saved directory entry lies outside its term's blocks")
    summ = arrs["blk_summ"]
    blocks = (_ro(blk_off, np.int64), _ro(last, np.int32), _ro(mtf, np.int32), _ro(mdl, np.int32),
              _ro(dir_off, np.int64), _ro(shift, np.int64), _ro(bdir, np.int64), _ro(starts, np.int64))
    return BlockLayout(blocks, TermSummaries(*(_ro(summ[i], np.int32) for i in range(4))), bs)
