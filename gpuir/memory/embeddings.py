"""Named embeddings of a memory: which vector columns its segments carry, and how records get them.

A memory may hold any number of named embeddings (``Memory(embeddings={"minilm":
encoder})``). Each is a column of every segment: one L2-normalised vector per
record, stored as float32 or float16 (``dtype``), written when the record is
added and carried by merges, tombstones, saves and opens with the rest of the
segment (segment file member ``vectors_<name>``, mapped on open).

A record's vector comes from the ``vectors=`` given to :meth:`Memory.add`
(one array per embedding, a row per record) or, when none is given, from the
embedding's encoder: the batch's texts are encoded once, in one call (the
encoder batches; :class:`gpuir.dense.encoder.Encoder` also caches on disk), then
normalised in float64 and cast to the storage dtype. An update that keeps a
record's text keeps its vector; a changed text is encoded again.

What an embedding may be given as (the value of ``embeddings={name: ...}``):

* an encoder object with ``encode_passages(texts)`` (and ``encode_queries`` for
  text queries), e.g. :class:`gpuir.dense.encoder.Encoder`;
* a callable ``texts -> array (n, d)`` (used for passages and queries);
* a model name or folder (str): a :class:`gpuir.dense.encoder.Encoder` of it;
* a dict ``{"encoder": one of the above or None, "dtype": "float32" | "float16"}``;
* None: vectors only through ``vectors=`` (and query vectors only).

The manifest records each embedding's name, dimension, dtype and model name
(the encoder object itself is not saved: pass it again to
:meth:`Memory.open`, or give vectors).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..backends.contract import VECTOR_DTYPES, normalize_rows

log = logging.getLogger("gpuir.memory")

__all__ = ["Embedding", "VectorError", "check_name", "parse_embeddings"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class VectorError(ValueError):
    """Vectors or an embedding given wrongly (the message says what to fix)."""


def check_name(name: Any) -> str:
    """An embedding name: 1-64 characters of letters, digits, ``_ . -`` (a file member name)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise VectorError(f"embedding names are 1-64 letters, digits, '_', '.' or '-' (starting with a letter or "
                          f"digit), got {name!r}")
    return name


class Embedding:
    """One named embedding of a memory.

    Attributes
    ----------
    name : str
    dtype : {"float32", "float16"}
        Storage dtype of the column.
    dim : int or None
        Vector dimension (None until the first vectors arrive).
    encoder : object or None
        Encodes passages (and queries); None: vectors must be given.
    model : str or None
        The encoder's model name, recorded in the manifest (informative).
    gpuir_model : str or None
        When the encoder is a :class:`gpuir.dense.encoder.Encoder`: its model (``"default"``: the
        shipped one), recorded in the manifest so that a memory opened without an encoder makes the
        same one (offline) the first time it must encode records or queries.
    """

    def __init__(self, name: str, encoder: Any = None, dtype: str = "float32", dim: int | None = None,
                 model: str | None = None, gpuir_model: str | None = None):
        self.name = check_name(name)
        if dtype not in VECTOR_DTYPES:
            raise VectorError(f"embedding {name!r}: dtype must be one of {', '.join(VECTOR_DTYPES)}, got {dtype!r}")
        self.dtype = dtype
        self.dim = None if dim is None else int(dim)
        self.gpuir_model = gpuir_model
        self.attach(encoder, model)

    def attach(self, encoder: Any, model: str | None = None) -> None:
        """Use ``encoder`` (see the module docstring) for later records and text queries."""
        self.encoder = _make_encoder(encoder)
        if model is not None or self.encoder is not None:
            self.model = model if model is not None else _model_name(self.encoder)
        elif not hasattr(self, "model"):
            self.model = None
        g = _gpuir_model(self.encoder)
        if g is not None:
            self.gpuir_model = g

    def _encoder(self) -> Any:
        if self.encoder is None and self.gpuir_model is not None:
            from ..dense.encoder import Encoder

            log.info("embedding %r: loading the gpuir encoder of %s (recorded in the manifest)", self.name,
                     self.gpuir_model)
            # no disk cache: the memory keeps its records' vectors, and a question is encoded as it is asked (a
            # cached vector, encoded in another batch, can differ in the last bits: scores would change on reopen)
            self.encoder = Encoder(None if self.gpuir_model == "default" else self.gpuir_model, cache=False)
        return self.encoder

    def to_dict(self) -> dict[str, Any]:
        out = {"dim": self.dim, "dtype": self.dtype, "model": self.model}
        if self.gpuir_model is not None:
            out["gpuir_model"] = self.gpuir_model
        return out

    def __repr__(self) -> str:
        return f"Embedding({self.name!r}, dim={self.dim}, dtype={self.dtype!r}, model={self.model!r})"

    # ------------------------------------------------------------------ vectors
    def check(self, vecs: Any, n: int, what: str) -> np.ndarray:
        """``vecs`` as n normalised rows of this embedding's dtype (its dimension fixed by the first vectors).

        Raises
        ------
        VectorError
            Not (n, dim), not finite numbers, or another dimension than the stored vectors'.
        """
        try:
            a = np.asarray(vecs.get() if hasattr(vecs, "get") else vecs, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise VectorError(f"{what}: vectors must be an array of numbers ({e})") from None
        if a.ndim != 2 or a.shape[0] != n:
            raise VectorError(f"{what}: vectors of embedding {self.name!r} must have shape ({n}, dim), one row per "
                              f"record, got {a.shape}")
        if self.dim is not None and a.shape[1] != self.dim:
            raise VectorError(f"{what}: embedding {self.name!r} holds {self.dim}-dimensional vectors, got "
                              f"{a.shape[1]}")
        if a.shape[1] < 1:
            raise VectorError(f"{what}: vectors of embedding {self.name!r} have no dimension")
        if not np.isfinite(a).all():
            raise VectorError(f"{what}: vectors of embedding {self.name!r} hold NaN or infinite values")
        if self.dim is None:
            self.dim = int(a.shape[1])
        return normalize_rows(a, self.dtype)

    def encode(self, texts: Sequence[str], what: str) -> np.ndarray:
        """Passage vectors of ``texts`` through the encoder, checked and normalised: (n, dim), the dtype."""
        if self._encoder() is None:
            raise VectorError(f"{what}: embedding {self.name!r} has no encoder here: pass vectors={{{self.name!r}: "
                              f"array (n, dim)}}, or give the encoder (Memory(embeddings={{{self.name!r}: encoder}}) "
                              f"or Memory.open(path, embeddings=...))")
        enc = self.encoder
        out = enc.encode_passages(list(texts)) if hasattr(enc, "encode_passages") else enc(list(texts))
        return self.check(out, len(texts), f"{what} (encoder of {self.name!r})")

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """Query vectors of ``queries`` (float32, normalised)."""
        if self._encoder() is None:
            raise VectorError(f"embedding {self.name!r} has no encoder here: search with query vectors, or give "
                              "the encoder (Memory(embeddings=...) or Memory.open(path, embeddings=...))")
        enc = self.encoder
        out = enc.encode_queries(list(queries)) if hasattr(enc, "encode_queries") else enc(list(queries))
        return self.queries(out)

    def queries(self, q: Any) -> np.ndarray:
        """Query vectors checked against this embedding and normalised: (B, dim) float32."""
        try:
            a = np.asarray(q.get() if hasattr(q, "get") else q, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise VectorError(f"query vectors must be an array of numbers ({e})") from None
        if a.ndim == 1:
            a = a[None, :]
        if a.ndim != 2:
            raise VectorError(f"query vectors must have shape (B, dim) or (dim,), got {a.shape}")
        if self.dim is not None and a.shape[1] != self.dim:
            raise VectorError(f"embedding {self.name!r} holds {self.dim}-dimensional vectors; the query vectors "
                              f"have {a.shape[1]}")
        if not np.isfinite(a).all():
            raise VectorError("query vectors hold NaN or infinite values")
        return normalize_rows(a, "float32")


def _make_encoder(enc: Any) -> Any:
    if isinstance(enc, str):
        from ..dense.encoder import Encoder

        return Encoder(enc)
    if enc is not None and not (hasattr(enc, "encode_passages") or callable(enc)):
        raise VectorError(f"an embedding's encoder must have encode_passages(texts), or be a callable texts -> "
                          f"array, a model name, or None; got {type(enc).__name__}")
    return enc


def _gpuir_model(enc: Any) -> str | None:
    """The model of a :class:`gpuir.dense.encoder.Encoder` (``"default"`` for the shipped one), else None."""
    if enc is None or type(enc).__module__ != "gpuir.dense.encoder":
        return None
    from ..dense.encoder import default_model_path

    name = getattr(enc, "model_name", None)
    if not isinstance(name, str):
        return None
    return "default" if name == str(default_model_path()) else name


def _model_name(enc: Any) -> str | None:
    if enc is None:
        return None
    for attr in ("model_name", "name"):
        v = getattr(enc, attr, None)
        if isinstance(v, str):
            return v
    return type(enc).__name__


def parse_embeddings(spec: Any) -> dict[str, Embedding]:
    """``embeddings=`` of :class:`Memory`: a mapping name -> encoder / model / dict / None (module docstring)."""
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise VectorError("embeddings must be a dict name -> encoder (or model name, or "
                          "{'encoder': ..., 'dtype': 'float16'}, or None)")
    out = {}
    for name, v in spec.items():
        if isinstance(v, Embedding):
            out[check_name(name)] = v
            continue
        if isinstance(v, Mapping):
            bad = set(v) - {"encoder", "dtype", "model"}
            if bad:
                raise VectorError(f"embedding {name!r}: unknown key(s) {sorted(bad)} (use encoder, dtype, model)")
            out[check_name(name)] = Embedding(name, v.get("encoder"), v.get("dtype", "float32"),
                                              model=v.get("model"))
        else:
            out[check_name(name)] = Embedding(name, v)
    return out
