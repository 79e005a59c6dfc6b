"""Backend selection: ``"auto" | "numpy" | "cupy"``, overridable by ``GPUIR_BACKEND``.

"auto" picks CuPy only when a CUDA device can actually be used (not merely when
CuPy imports), and always says why it chose what it chose.
"""

from __future__ import annotations

import os

from .._compat import cuda_device
from ..bm25 import BM25Params
from ..index.csr import CSRIndex
from .base import CollectionStats, Scorer, topk_from_dense

BACKENDS = ("auto", "numpy", "cupy")

__all__ = ["BACKENDS", "CollectionStats", "Scorer", "make_scorer", "resolve_backend", "topk_from_dense"]


def resolve_backend(name: str | None = "auto") -> tuple[str, str]:
    """Resolve a backend request to a concrete backend, with the reason.

    Parameters
    ----------
    name : {"auto", "numpy", "cupy"} or None
        None means "auto". The environment variable ``GPUIR_BACKEND``, when set,
        overrides "auto" (an explicit "numpy" or "cupy" argument wins over it).

    Returns
    -------
    (backend, reason) : (str, str)

    Raises
    ------
    ValueError
        Unknown name, or "cupy" requested where no CUDA device can be used.
    """
    name = "auto" if name is None else str(name).lower()
    source = "requested"
    if name == "auto" and os.environ.get("GPUIR_BACKEND"):
        name = os.environ["GPUIR_BACKEND"].strip().lower()
        source = "GPUIR_BACKEND"
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} ({source}): choose one of {', '.join(BACKENDS)}")
    usable, why = cuda_device()
    if name == "numpy":
        return "numpy", f"numpy {source}" + ("" if source == "requested" else " via environment")
    if name == "cupy":
        if not usable:
            raise ValueError(
                f"backend 'cupy' was {source} but {why}. Fix: run on a machine with an NVIDIA "
                "GPU and install 'gpuir[gpu]' (CUDA 12) or 'gpuir[gpu-cuda13]', or use backend='numpy'"
            )
        return "cupy", f"cupy {source}: {why}"
    if usable:
        return "cupy", f"auto: {why}"
    return "numpy", f"auto: no GPU ({why})"


def make_scorer(backend: str, index: CSRIndex, params: BM25Params, **opts) -> Scorer:
    """A :class:`Scorer` of the concrete ``backend`` ("numpy" or "cupy")."""
    if backend == "numpy":
        from .numpy_backend import NumpyScorer

        return NumpyScorer(index, params, **opts)
    if backend == "cupy":
        from .cupy_backend import CupyScorer

        return CupyScorer(index, params, **opts)
    raise ValueError(f"make_scorer needs a concrete backend ('numpy' or 'cupy'), got {backend!r}")
