"""Column storage for records: strings as offsets + UTF-8 bytes, and append-only dictionaries.

* :class:`StrArray` keeps n strings in two NumPy arrays (``offsets`` (n+1,)
  int64 and ``data`` (B,) uint8): compact in memory, saved as two ``.npy``
  entries, gathered (:meth:`StrArray.take`) and concatenated without a Python
  loop over the strings. A concatenation keeps its parts' bytes where they are
  and joins them only when something asks for ``data`` (a save): a merge no
  longer copies every text it merges, and reading one string never joins.
* :class:`Interner` maps strings to integer codes and back. It only ever grows,
  so a code once given never changes meaning: every snapshot of a memory shares
  one interner per string field (and one for the terms) while the writer adds
  new values. The writer appends the value before publishing its code, so a
  reader that finds a code always finds its value.

Why not pyarrow: these two small classes are all the columnar machinery the
memory needs (fixed schema, NumPy arrays everywhere else, ``np.savez`` files);
pyarrow would add a ~100 MB dependency for string arrays alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise, repeat

import numpy as np


class StrArray(Sequence):
    """n strings stored as UTF-8 bytes plus offsets.

    Parameters
    ----------
    offsets : ndarray, shape (n + 1,), int64, host
        String i is ``data[offsets[i]:offsets[i + 1]]``; ``offsets[0] == 0``.
    data : ndarray, shape (B,), uint8, host
    """

    __slots__ = ("_chunks", "_data", "offsets")

    def __init__(self, offsets: np.ndarray, data: np.ndarray):
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self._data: np.ndarray | None = np.asarray(data, dtype=np.uint8)
        #: Unjoined bytes (a concatenation's): (byte start of each chunk (c + 1,) int64, c uint8 arrays), or None.
        self._chunks: tuple[np.ndarray, list[np.ndarray]] | None = None

    @property
    def data(self) -> np.ndarray:
        """ndarray (B,), uint8, host: every string's bytes (a concatenation's parts are joined on first use)."""
        data = self._data
        if data is None:  # (threads may race here: each joins the same bytes, and chunks stay until data is set)
            ch = self._chunks
            if ch is None:
                return self._data  # type: ignore[return-value]
            data = np.concatenate(ch[1]) if ch[1] else np.zeros(0, np.uint8)
            self._data = data
            self._chunks = None
        return data

    def _bytes_of(self, a: int, b: int) -> np.ndarray:
        """Bytes a:b, which lie in one string (so in one chunk), without joining the chunks."""
        ch = self._chunks
        if ch is None:
            return self.data[a:b]
        starts, parts = ch
        c = int(np.searchsorted(starts, a, side="right")) - 1
        c = min(c, len(parts) - 1)  # (an empty string at the very end)
        s0 = int(starts[c])
        return parts[c][a - s0: b - s0]

    @classmethod
    def from_list(cls, strings: Iterable[str]) -> StrArray:
        if isinstance(strings, list) and strings:
            joined = "".join(strings)  # (a non-str raises TypeError, as encode would)
            if joined.isascii():  # one byte per character: offsets from the lengths
                lens = np.fromiter(map(len, strings), dtype=np.int64, count=len(strings))
                data = np.frombuffer(joined.encode("ascii"), dtype=np.uint8).copy()
            else:
                enc = list(map(str.encode, strings))  # UTF-8
                lens = np.fromiter(map(len, enc), dtype=np.int64, count=len(enc))
                data = np.frombuffer(b"".join(enc), dtype=np.uint8).copy()
            offsets = np.zeros(len(strings) + 1, dtype=np.int64)
            np.cumsum(lens, out=offsets[1:])
            return cls(offsets, data)
        enc = [s.encode("utf-8") for s in strings]
        offsets = np.zeros(len(enc) + 1, dtype=np.int64)
        if enc:
            np.cumsum(np.fromiter((len(b) for b in enc), dtype=np.int64, count=len(enc)), out=offsets[1:])
        return cls(offsets, np.frombuffer(b"".join(enc), dtype=np.uint8).copy())

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"string {i} out of range [0, {len(self)})")
        return self._bytes_of(int(self.offsets[i]), int(self.offsets[i + 1])).tobytes().decode("utf-8")

    def get_many(self, rows: np.ndarray) -> list[str]:
        """The strings at ``rows`` (ndarray (m,), int, each in [0, n)), in that order: ``[self[r] for r in rows]``
        with two array reads for all of them instead of several NumPy calls per string (a search's hits)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= len(self)):
            raise IndexError(f"rows {int(rows.min())}..{int(rows.max())} out of range [0, {len(self)})")
        a = self.offsets[rows].tolist()
        b = self.offsets[rows + 1].tolist()
        ch = self._chunks
        if ch is None:
            mv = memoryview(self.data)  # (a memoryview's slice decodes without a NumPy view per string)
            return [str(mv[x:y], "utf-8") for x, y in zip(a, b)]
        starts, parts = ch
        c_arr = np.minimum(np.searchsorted(starts, np.asarray(a, np.int64), side="right") - 1, len(parts) - 1)
        mvs: dict[int, memoryview] = {}
        out = []
        for c, s0, x, y in zip(c_arr.tolist(), starts[c_arr].tolist(), a, b):
            m = mvs.get(c)
            if m is None:
                m = mvs[c] = memoryview(parts[c])
            out.append(str(m[x - s0: y - s0], "utf-8"))
        return out

    def tolist(self) -> list[str]:
        n = len(self)
        if n == 0:
            return []
        data = np.asarray(self.data)
        if n > 16 and not bool((data == 0).any()):
            # one decode and one split, in C: a NUL byte between the strings (none holds one)
            sep = np.insert(data, np.asarray(self.offsets[1:-1], dtype=np.int64), 0)
            return sep.tobytes().decode("utf-8").split("\0")
        raw = data.tobytes()
        off = self.offsets.tolist()
        return [raw[a:b].decode("utf-8") for a, b in pairwise(off)]

    def take(self, rows: np.ndarray) -> StrArray:
        """The strings at ``rows`` (ndarray (m,), int), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        starts = self.offsets[rows]
        lens = self.offsets[rows + 1] - starts
        off = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(lens, out=off[1:])
        # runs of consecutive rows are copied as byte slices (merges take long runs; a byte index per
        # byte would cost 8x the text)
        brk = np.flatnonzero(rows[1:] != rows[:-1] + 1) + 1 if rows.size else np.zeros(0, np.int64)
        if brk.size * 8 < rows.size:
            first = np.concatenate([[0], brk]) if rows.size else np.zeros(0, np.int64)
            last = np.concatenate([brk, [rows.size]]) if rows.size else np.zeros(0, np.int64)
            data = np.empty(int(off[-1]), dtype=np.uint8)
            src_a = self.offsets[rows[first]].tolist()
            src_b = self.offsets[rows[last - 1] + 1].tolist()
            dst = off[first].tolist()
            for a, b, d in zip(src_a, src_b, dst):
                data[d: d + b - a] = self.data[a:b]
            return StrArray(off, data)
        src = np.repeat(starts - off[:-1], lens) + np.arange(int(off[-1]), dtype=np.int64)
        return StrArray(off, self.data[src])

    @staticmethod
    def concat(parts: Sequence[StrArray]) -> StrArray:
        """The strings of ``parts``, in order. Their bytes are not copied (see the module docstring)."""
        if not parts:
            return StrArray(np.zeros(1, np.int64), np.zeros(0, np.uint8))
        shifts = np.cumsum([0] + [int(p.offsets[-1]) for p in parts[:-1]])
        off = np.concatenate([np.zeros(1, np.int64)] + [p.offsets[1:] + s for p, s in zip(parts, shifts)])
        starts: list[int] = []
        chunks: list[np.ndarray] = []
        for p, sh in zip(parts, shifts.tolist()):
            if p._chunks is None:
                if p._data is not None and p._data.size:
                    starts.append(sh)
                    chunks.append(p._data)
            else:
                st, ch = p._chunks
                starts.extend((st[:-1] + sh).tolist())
                chunks.extend(ch)
        out = StrArray(off, np.zeros(0, np.uint8))
        if len(chunks) > 1:
            out._data, out._chunks = None, (np.array(starts + [int(off[-1])], np.int64), chunks)
        elif chunks:
            out._data = chunks[0] if starts[0] == 0 and chunks[0].size == int(off[-1]) else np.concatenate(chunks)
        return out

    @property
    def nbytes(self) -> int:
        ch = self._chunks
        data = sum(c.nbytes for c in ch[1]) if ch is not None else self.data.nbytes
        return int(self.offsets.nbytes + data)


class TermStrings(Sequence):
    """The strings of some codes of an :class:`Interner`, in the codes' order: a read-only view.

    A segment's vocabulary as this view instead of a list of its own keeps no
    Python reference per term per segment (the garbage collector's full passes
    visit every reference a list holds).

    Parameters
    ----------
    codes : ndarray (V,), int64, host
    values : the interner's ``values`` list (append-only; shared)
    """

    __slots__ = ("codes", "values")

    def __init__(self, codes: np.ndarray, values: list[str]):
        self.codes = codes
        self.values = values

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return list(map(self.values.__getitem__, self.codes[i].tolist()))
        return self.values[int(self.codes[i])]

    def __iter__(self):
        return map(self.values.__getitem__, self.codes.tolist())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TermStrings({len(self)} terms)"


class Interner:
    """An append-only bijection between strings and codes 0, 1, 2, ...

    Attributes
    ----------
    values : list of str
        ``values[code]``.
    index : dict str -> int
    """

    __slots__ = ("index", "values")

    def __init__(self, values: Iterable[str] = ()):
        self.values: list[str] = []
        self.index: dict[str, int] = {}
        for v in values:
            self.code(v)

    def __len__(self) -> int:
        return len(self.values)

    def code(self, value: str) -> int:
        """The code of ``value``, adding it when new (writer only)."""
        c = self.index.get(value)
        if c is None:
            c = len(self.values)
            self.values.append(value)  # value first: a reader that sees the code finds it
            self.index[value] = c
        return c

    def codes(self, values: Sequence[str | None], dtype=np.int32) -> np.ndarray:
        """Codes of ``values`` (None -> -1), adding new ones (writer only).

        Returns
        -------
        ndarray, shape (len(values),), ``dtype``, host
        """
        index = self.index
        new = [v for v in dict.fromkeys(values) if v is not None and v not in index]  # each distinct value once
        if new:
            start = len(self.values)
            self.values.extend(new)  # values first: a reader that sees a code finds its value
            index.update(zip(new, range(start, start + len(new))))
        return np.fromiter(map(index.get, values, repeat(-1)), dtype=dtype, count=len(values))

    def codes_distinct(self, values: list[str]) -> np.ndarray:
        """Codes of ``values`` -- distinct strings, no None (a sorted vocabulary) -- adding new ones (writer
        only): one lookup each, the new ones added in bulk.

        Returns
        -------
        ndarray, shape (len(values),), int64, host
        """
        index = self.index
        n = len(values)
        if not index:
            self.values.extend(values)
            index.update(zip(values, range(n)))
            return np.arange(n, dtype=np.int64)
        codes = np.fromiter(map(index.get, values, repeat(-1)), dtype=np.int64, count=n)
        miss = np.flatnonzero(codes < 0)
        if miss.size:
            new = [values[i] for i in miss.tolist()]
            start = len(self.values)
            self.values.extend(new)  # values first: a reader that sees a code finds its value
            index.update(zip(new, range(start, start + len(new))))
            codes[miss] = np.arange(start, start + len(new), dtype=np.int64)
        return codes

    def lookup(self, value: str) -> int:
        """The code of ``value``, or -1 when it was never added."""
        return self.index.get(value, -1)

    def lookup_many(self, values: Sequence[str]) -> np.ndarray:
        """Codes of ``values`` (-1 for unknown ones): ndarray (len(values),), int64."""
        get = self.index.get
        return np.fromiter((get(v, -1) for v in values), dtype=np.int64, count=len(values))
