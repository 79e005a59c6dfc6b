"""The BM25 variants: idf and term-frequency components, shared by every backend.

The definitions follow bm25s (Lù, 2024), itself following Kamphuis et al.
(ECIR 2020), so that every variant can be checked against it:

=========  ======================================  ==============================================
method     idf(t)                                   tfc(tf, dl)  with  L = 1 - b + b * dl / avgdl
=========  ======================================  ==============================================
lucene     log(1 + (N - df + 0.5) / (df + 0.5))     tf / (tf + k1 * L)
robertson  log(max(1, (N - df + 0.5) / (df + 0.5))) tf / (tf + k1 * L)
atire      log(N / df)                              tf * (k1 + 1) / (tf + k1 * L)
bm25l      log((N + 1) / (df + 0.5))                (k1 + 1) * (c + delta) / (k1 + c + delta), c = tf / L
bm25+      log((N + 1) / df)                        tf * (k1 + 1) / (tf + k1 * L) + delta
=========  ======================================  ==============================================

``score(q, d) = sum over query tokens t of idf(t) * tfc(tf(t, d), |d|)``.

* **Repeated query terms count once per occurrence**: a query token that occurs
  r times contributes r times its weight (as in bm25s, and as Lucene's boolean
  query of repeated clauses does).
* For bm25l and bm25+, ``tfc(0) != 0``: a query term absent from a document still
  contributes ``idf * tfc(0)``. Backends compute this as
  ``sum_{t in q, t in d} [w(t, d) - w0(t)] + sum_{t in q} w0(t)`` with
  ``w0(t) = idf(t) * tfc(0)``, exactly as bm25s does; only documents that contain
  at least one query term are candidates for the top-k.
* Query tokens missing from the vocabulary are ignored.

Postings always store the raw integer tf; length normalisation happens here, once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from numbers import Real

import numpy as np

#: Method names, in the order of their integer codes (used by the CUDA kernels).
METHODS: tuple[str, ...] = ("lucene", "robertson", "atire", "bm25l", "bm25+")


#: Accepted range of k1. Inside it every posting weight, and every sum of them a
#: query can make, is a finite float32 for every variant: tfc <= k1 + 1 + delta,
#: idf <= log(N + 1) < 45, so a weight stays below ~1e8, far from float32's 3.4e38;
#: and k1 never underflows in float32 (which made 0/0 = NaN out of k1 = 1e-320).
K1_RANGE: tuple[float, float] = (1e-6, 1e6)
#: Largest accepted delta (bm25l, bm25+), for the same reason.
DELTA_MAX: float = 1e6


def _number(name: str, value: object, lo: float, hi: float) -> float:
    """``value`` as a float if it is a real number in [lo, hi]; a clear error otherwise."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    v = float(value)
    if not (lo <= v <= hi):  # also refuses NaN
        raise ValueError(f"{name} must lie in [{lo:g}, {hi:g}], got {value!r}")
    return v


@dataclass(frozen=True)
class BM25Params:
    """Parameters of a BM25 variant.

    Every accepted combination gives finite scores (tested for each variant at
    the ends of each range).

    Parameters
    ----------
    method : str
        One of :data:`METHODS`. Default ``"lucene"``.
    k1 : float
        Term-frequency saturation, in :data:`K1_RANGE` ([1e-6, 1e6]). Default 1.2.
    b : float
        Length normalisation, in [0, 1]. Default 0.75.
    delta : float
        Lower bound of a present term's contribution (bm25l, bm25+ only), in
        [0, :data:`DELTA_MAX`]. Default 0.5.

    Raises
    ------
    ValueError
        Unknown method, or a number outside its range (NaN and infinities included).
    TypeError
        A parameter that is not a real number (bools and strings included).
    """

    method: str = "lucene"
    k1: float = 1.2
    b: float = 0.75
    delta: float = 0.5

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(
                f"unknown BM25 method {self.method!r}: choose one of {', '.join(METHODS)}"
            )
        # stored as plain floats: hashable, comparable and JSON-able whatever number type came in
        object.__setattr__(self, "k1", _number("k1", self.k1, *K1_RANGE))
        object.__setattr__(self, "b", _number("b", self.b, 0.0, 1.0))
        object.__setattr__(self, "delta", _number("delta", self.delta, 0.0, DELTA_MAX))

    @property
    def code(self) -> int:
        """Integer code of the method, as the CUDA kernels take it."""
        return METHODS.index(self.method)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> BM25Params:
        """Parameters from a dict such as :meth:`to_dict` makes (missing keys take the defaults)."""
        if not isinstance(d, dict):
            raise TypeError(f"BM25 parameters must be a mapping, got {type(d).__name__}")
        return cls(**{k: d[k] for k in ("method", "k1", "b", "delta") if k in d})


def idf(df: np.ndarray, n_docs: int, method: str) -> np.ndarray:
    """Inverse document frequency of each term.

    Parameters
    ----------
    df : ndarray, shape (V,), integer, host
        Number of documents containing each term (>= 1 for every indexed term).
    n_docs : int
        Number of documents N.
    method : str
        One of :data:`METHODS`.

    Returns
    -------
    ndarray, shape (V,), float64, host
    """
    df = np.asarray(df, dtype=np.float64)
    n = float(n_docs)
    if df.size and df.min() > 0:  # (a search's terms, looked up per snapshot: nothing to guard, the same values)
        return _idf_expr(df, n, method)
    with np.errstate(divide="ignore"):
        out = _idf_expr(df, n, method)
    # bm25s leaves idf = 0 for a term with df = 0 (it cannot occur in an index).
    return np.where(df > 0, out, 0.0)


def _idf_expr(df: np.ndarray, n: float, method: str) -> np.ndarray:
    """:func:`idf`'s formula per method: ``df`` (V,) float64 -> (V,) float64 (host), df = 0 unguarded."""
    if method == "lucene":
        return np.log1p((n - df + 0.5) / (df + 0.5))
    if method == "robertson":
        return np.log(np.maximum(1.0, (n - df + 0.5) / (df + 0.5)))
    if method == "atire":
        return np.log(n / df)
    if method == "bm25l":
        return np.log((n + 1.0) / (df + 0.5))
    if method == "bm25+":
        return np.log((n + 1.0) / df)
    raise ValueError(f"unknown BM25 method {method!r}")


def tfc(tf: np.ndarray, doc_len: np.ndarray, avgdl: float, params: BM25Params) -> np.ndarray:
    """Term-frequency component of BM25.

    Parameters
    ----------
    tf : ndarray, shape (P,), integer or float, host
        Raw term frequencies (0 allowed: the absent-term value for bm25l/bm25+).
    doc_len : ndarray, shape (P,) or scalar, host
        Length in tokens of the document each tf belongs to.
    avgdl : float
        Mean document length over the collection (> 0).
    params : BM25Params

    Returns
    -------
    ndarray, shape (P,), float32, host
        Computed in float32, the precision the GPU kernels use.
    """
    f32 = np.float32
    tf = np.asarray(tf, dtype=f32)
    k1, b, delta = f32(params.k1), f32(params.b), f32(params.delta)
    norm = f32(1) - b + b * (np.asarray(doc_len, dtype=f32) / f32(avgdl))
    m = params.method
    if m in ("lucene", "robertson"):
        return tf / (k1 * norm + tf)
    if m == "atire":
        return (tf * (k1 + f32(1))) / (tf + k1 * norm)
    if m == "bm25l":
        c = tf / norm
        return ((k1 + f32(1)) * (c + delta)) / (k1 + c + delta)
    if m == "bm25+":
        return ((k1 + f32(1)) * tf) / (k1 * norm + tf) + delta
    raise ValueError(f"unknown BM25 method {m!r}")


def absent_weight(idf_values: np.ndarray, params: BM25Params) -> np.ndarray:
    """``w0(t) = idf(t) * tfc(0)``: what an absent query term contributes.

    Zero for lucene, robertson and atire.

    Parameters
    ----------
    idf_values : ndarray, shape (V,), float, host

    Returns
    -------
    ndarray, shape (V,), float32, host
    """
    t0 = tfc(np.zeros(1), np.ones(1), 1.0, params)[0]
    return (np.asarray(idf_values, dtype=np.float32) * t0).astype(np.float32)
