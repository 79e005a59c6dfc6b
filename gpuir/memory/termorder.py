"""The string order of a memory's terms through fixed-width byte keys, kept current as terms arrive.

A segment's vocabulary is sorted by string (ascending term order is the order
in which a fresh index adds a document's weights, so exactness depends on it).
Every new segment (one per ``add``) and every merge therefore sorts a set of
terms by string. :class:`TermOrder` does the string work once per term, as it
arrives: it keeps for every term code a **key**, the first :data:`KEY_BYTES`
bytes of the term's UTF-8 encoding (a NumPy ``S`` array). UTF-8 byte order is
code-point order, which is Python's string order, so sorting codes by their
keys (NumPy, no Python string comparison) orders them as strings, except among
terms whose keys are equal (both at least :data:`KEY_BYTES` bytes long, with
the same prefix): those few runs are sorted again by string
(:func:`sort_codes`). The result is exactly ``sorted(codes, key=string)``
(tested against it).

A new term costs one encoding, in a vectorised step per :meth:`TermOrder.update`;
nothing is ever renumbered or inserted in order (an earlier design kept integer
ranks in a sorted list: a Python insertion per new term, a third of a memory's
growth cost beyond analysis). Keys of known codes never change, so a merge
thread that took :attr:`TermOrder.keys` may keep reading it while the writer
adds terms (a grown array is a new array).

A memory opened from disk brings its whole vocabulary at once: its keys are
computed in a background thread (:meth:`TermOrder.build_in_background`); until
they are installed :attr:`TermOrder.ready` is False, and segments and merges
sort their vocabularies by string instead (the same order, more slowly).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import numpy as np

from .columns import Interner

log = logging.getLogger("gpuir.memory")

#: Bytes of each term's UTF-8 encoding kept as its sort key (terms sharing this prefix are compared as strings).
KEY_BYTES = 16
_KEY = np.dtype(f"S{KEY_BYTES}")


def term_keys(values: Sequence[str]) -> np.ndarray:
    """The sort keys of some terms: ndarray (n,), ``S16``, host (UTF-8, lone surrogates passed through).

    NumPy compares ``S`` values as bytes, ignoring trailing NUL bytes: a key shorter than 16 bytes
    sorts before every longer key it prefixes, as its string does.
    """
    return np.array([s.encode("utf-8", "surrogatepass")[:KEY_BYTES] for s in values], dtype=_KEY)


def sort_codes(keys: np.ndarray, values: Sequence[str], codes: np.ndarray) -> np.ndarray:
    """``codes`` (distinct) in ascending string order of ``values[code]``: ndarray, int64.

    Parameters
    ----------
    keys : ndarray (>= max(codes) + 1,), S16, host
        :func:`term_keys` of every code in ``codes``.
    values : sequence of str
        The terms, by code (read only for codes whose keys tie).
    codes : ndarray (m,), integer, host
    """
    codes = np.asarray(codes, dtype=np.int64)
    if codes.size < 2:
        return codes.copy()
    # the 16 key bytes as two big-endian integers: integer order is byte order, and sorting integers is
    # several times cheaper than comparing byte strings; sort by the first 8, then the groups that tie there
    # (keys of up to 16 bytes, NUL-padded to 16: the order of NumPy's byte strings)
    k = keys[codes]
    if k.dtype.itemsize > 16:
        order = np.argsort(k, kind="stable")
        out, ks = codes[order], k[order]
        tie = ks[1:] == ks[:-1]
    else:
        kv = np.ascontiguousarray(k if k.dtype.itemsize == 16 else k.astype("S16")).view(">u8").reshape(-1, 2)
        hi, lo = kv[:, 0].astype(np.uint64), kv[:, 1].astype(np.uint64)
        order = np.argsort(hi)
        hs = hi[order]
        tie_hi = hs[1:] == hs[:-1]
        if tie_hi.any():  # the members of tied groups, re-sorted by (hi, lo) into the same positions
            at = np.flatnonzero(np.concatenate(([False], tie_hi)) | np.concatenate((tie_hi, [False])))
            sub = order[at]
            order[at] = sub[np.lexsort((lo[sub], hi[sub]))]
        out = codes[order]
        hs, ls = hi[order], lo[order]
        tie = (hs[1:] == hs[:-1]) & (ls[1:] == ls[:-1])
    if tie.any():  # runs of equal keys: terms of at least KEY_BYTES bytes with one prefix, ordered as strings
        edges = np.flatnonzero(np.diff(np.concatenate(([False], tie, [False])).astype(np.int8)))
        for a, b in zip(edges[0::2].tolist(), (edges[1::2] + 1).tolist()):
            run = out[a:b].tolist()
            run.sort(key=values.__getitem__)
            out[a:b] = run
    return out


class TermOrder:
    """Sort keys in string order for the codes of an :class:`Interner` (writer updates; anyone reads).

    Attributes
    ----------
    keys : ndarray (>= n,), S16, host
        ``keys[code]`` for every code seen so far (the first :attr:`n`): :func:`term_keys`.
    n : int
        Codes with a key so far: 0 .. n-1.
    ready : bool
        False while a background build of the keys is running (nothing may be read then).
    """

    def __init__(self, terms: Interner):
        self.terms = terms
        self.keys = np.zeros(1024, dtype=_KEY)
        self.n = 0
        self.ready = True
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ a whole vocabulary at once
    def build_in_background(self, lock) -> None:
        """Key every code the interner holds now in a background thread, then install the result under
        ``lock`` (the writer's lock) and key what was added meanwhile. Until then :attr:`ready` is False."""
        n0 = len(self.terms.values)
        if n0 == 0 or self.n:
            return
        self.ready = False

        def build():
            try:
                keys = np.zeros(max(1024, 2 * n0), dtype=_KEY)
                keys[:n0] = term_keys(self.terms.values[:n0])  # append-only: a prefix never changes
                with lock:
                    self.keys, self.n = keys, n0
                    self.ready = True
                    self.update()
            except Exception as e:  # noqa: BLE001 - the memory keeps sorting by string
                log.error("keying the vocabulary in the background failed (%s: %s); vocabularies are sorted "
                          "by string instead", type(e).__name__, e)

        self._thread = threading.Thread(target=build, name="gpuir-term-order", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a background build (tests); returns :attr:`ready`."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.ready

    # ------------------------------------------------------------------ new terms
    def update(self) -> None:
        """Key every code the interner holds that has no key yet (writer only; nothing while not ready).

        Costs one encoding per new term.
        """
        if not self.ready:
            return
        vals = self.terms.values
        total = len(vals)
        if total == self.n:
            return
        keys = self.keys
        if keys.size < total:
            grown = np.zeros(max(total, 2 * keys.size), dtype=_KEY)
            grown[: self.n] = keys[: self.n]
            keys = grown
        keys[self.n: total] = term_keys(vals[self.n: total])
        self.keys, self.n = keys, total

    def sort_codes(self, codes: np.ndarray) -> np.ndarray:
        """``codes`` (distinct, keyed) in ascending string order: ndarray, int64."""
        return sort_codes(self.keys, self.terms.values, codes)
