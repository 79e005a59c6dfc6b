"""Making a :class:`~gpuir.backends.base.Scorer` of a concrete backend (re-exported by :mod:`gpuir.backends`)."""

from __future__ import annotations

from ..bm25 import BM25Params
from ..index.csr import CSRIndex
from .base import Scorer


def make_scorer(backend: str, index: CSRIndex, params: BM25Params, **opts) -> Scorer:
    """A :class:`Scorer` of the concrete ``backend`` ("numpy", "numba" or "cupy").

    ``opts`` go to the scorer: ``stats=`` (every backend), ``prune=`` (numpy,
    numba), ``threads=`` and ``layout=`` (numba); ``kernel="scatter"`` (cupy) takes
    the design card's exhaustive scatter kernel (:mod:`gpuir.backends.cupy_scatter`)
    instead of the pruned tiles (``kernel="tiles"``, the default).
    """
    if backend == "numpy":
        from .numpy_backend import NumpyScorer

        return NumpyScorer(index, params, **opts)
    if backend == "numba":
        from .numba_backend import NumbaScorer

        return NumbaScorer(index, params, **opts)
    if backend == "cupy":
        kernel = opts.pop("kernel", "tiles")
        if kernel == "scatter":
            from .cupy_scatter import ScatterScorer

            return ScatterScorer(index, params, **opts)
        if kernel != "tiles":
            raise ValueError(f"kernel must be 'tiles' or 'scatter' for the cupy backend, got {kernel!r}")
        from .cupy_backend import CupyScorer

        return CupyScorer(index, params, **opts)
    raise ValueError(f"make_scorer needs a concrete backend ('numpy', 'numba' or 'cupy'), got {backend!r}")
