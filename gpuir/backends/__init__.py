"""Backend selection: ``"auto" | "numpy" | "numba" | "cupy"``, overridable by ``GPUIR_BACKEND``.

"auto" picks CuPy only when a CUDA device can actually be used (not merely when
CuPy imports); otherwise the compiled CPU backend (Numba) when numba imports,
else NumPy -- and always says why it chose what it chose. NumPy is the
reference every other backend equals bit for bit.

This module is the one home of backend resolution: BM25 scorers use
:func:`resolve_backend`; dense work (the dense index, turn pooling, the encoder
side of a channel) uses :func:`resolve_array_backend`, which follows it and maps
"numba" (a BM25 scorer) to the NumPy path. An explicit "numpy" never imports
CuPy. Every path that needs a GPU and has none raises :class:`DeviceUnavailable`.

It also chooses the engine of the segment-set contract (:mod:`gpuir.backends.contract`) by name:
:func:`segment_engine`, :func:`engine_for` (the engine serving a concrete backend, :data:`ROUTES`) and
:func:`use_engine` (another engine for a backend inside a ``with`` block, as tests and benchmarks compare them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .._compat import DeviceUnavailable, cuda_device, device_unavailable, numba_available
from . import contract
from .base import CollectionStats, Scorer, topk_from_dense
from .contract import SegmentEngine
from .scorers import make_scorer

BACKENDS = ("auto", "numpy", "numba", "cupy")

__all__ = [
    "BACKENDS", "ENGINES", "ROUTES", "CollectionStats", "DeviceUnavailable", "Scorer", "SegmentEngine",
    "device_unavailable", "engine_for", "make_scorer", "numba_available", "resolve_array_backend", "resolve_backend",
    "resolve_memory_backend", "segment_engine", "topk_from_dense", "torch_device", "use_engine",
]

def resolve_backend(name: str | None = "auto") -> tuple[str, str]:
    """Resolve a backend request to a concrete backend, with the reason.

    Parameters
    ----------
    name : {"auto", "numpy", "numba", "cupy"} or None
        None means "auto". The environment variable ``GPUIR_BACKEND``, when set,
        overrides "auto" (an explicit backend argument wins over it).

    Returns
    -------
    (backend, reason) : (str, str)

    Raises
    ------
    ValueError
        Unknown name, or "numba" requested where numba does not import.
    DeviceUnavailable
        "cupy" requested where no CUDA device can be used.
    """
    name = "auto" if name is None else str(name).lower()
    source = "requested"
    if name == "auto" and os.environ.get("GPUIR_BACKEND"):
        name = os.environ["GPUIR_BACKEND"].strip().lower()
        source = "GPUIR_BACKEND"
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} ({source}): choose one of {', '.join(BACKENDS)}")
    via = "" if source == "requested" else " via environment"
    if name == "numpy":
        return "numpy", f"numpy {source}{via}"
    if name == "numba":
        ok, why = numba_available()
        if not ok:
            raise ValueError(
                f"backend 'numba' was {source} but {why}. Fix: pip install 'gpuir[cpu]' "
                "(numba ships wheels for Linux, macOS and Windows), or use backend='numpy'"
            )
        return "numba", f"numba {source}{via}: compiled CPU scorer ({why})"
    usable, why = cuda_device()
    if name == "cupy":
        if not usable:
            raise device_unavailable(f"backend 'cupy' was {source}", why)
        return "cupy", f"cupy {source}: {why}"
    if usable:
        return "cupy", f"auto: {why}"
    ok, nwhy = numba_available()
    if ok:
        return "numba", f"auto: no GPU ({why}); compiled CPU scorer, {nwhy}"
    return "numpy", f"auto: no GPU ({why}) and {nwhy}: NumPy scorer (pip install 'gpuir[cpu]' for the faster one)"


#: Where the memory's "auto" prefers the compiled CPU engine to the device, and why (docs/gpu.md, "The memory
#: on the device"): on an NVIDIA H200 with 16 CPU cores, 1M records in one partition (9 segments),
#: ``Memory.search`` answered one question in 0.59 ms with numba against 6.4 ms with cupy, and a batch of
#: 1,024 at 7,961 against 2,024 queries/s (bench/results/bench_memory_device_NVIDIA_H200_*.json): the device
#: path made one scorer call per segment, each with the host cost of a whole search. Session 33 replaced it by
#: one device pass over all segments (gpuir/backends/cupy_segments.py), verified without a device only: this
#: stays True until ``bench/gpu_verify.py``'s memory step measures the crossover on a device.
MEMORY_AUTO_PREFERS_CPU = True


def resolve_memory_backend(name: str | None = "auto") -> tuple[str, str]:
    """:func:`resolve_backend` for a memory's lexical search: "auto" takes the compiled CPU engine when numba
    imports, even with a GPU (:data:`MEMORY_AUTO_PREFERS_CPU`); "cupy", asked for or through
    ``GPUIR_BACKEND``, still runs the memory's segments on the device.

    Returns
    -------
    (backend, reason) : (str, str)
    """
    auto = (name is None or str(name).lower() == "auto") and not os.environ.get("GPUIR_BACKEND")
    if auto and MEMORY_AUTO_PREFERS_CPU:
        usable, why = cuda_device()
        ok, nwhy = numba_available()
        if usable and ok:
            return "numba", (f"auto: the memory's compiled CPU engine ({nwhy}), not the GPU ({why}): the device "
                             "path called a scorer per segment and was 4-21x slower at 1M records "
                             "(bench/results/bench_memory_device_NVIDIA_H200_*.json; its one-pass engine is not "
                             "measured on a device yet, docs/gpu.md); "
                             "backend='cupy' still uses it")
    return resolve_backend(name)


def _is_device_array(a: Any) -> bool:
    return a is not None and type(a).__module__.startswith("cupy")


def resolve_array_backend(name: str | None = "auto", values: Any = None) -> tuple[str, str]:
    """The device of dense array work (vector search, turn pooling): "numpy" or "cupy", with the reason.

    Follows :func:`resolve_backend` (``GPUIR_BACKEND`` overrides "auto"; an
    explicit "numpy" never imports CuPy), with two rules of its own:

    * "numba" (requested, from the environment, or chosen by "auto" on a machine
      without a GPU) maps to "numpy": the compiled backend is a BM25 scorer, and
      dense matrix products and pooling run on NumPy on the CPU;
    * under "auto" without ``GPUIR_BACKEND``, ``values`` already on the device
      (a CuPy array) selects "cupy".

    Parameters
    ----------
    name : {"auto", "numpy", "numba", "cupy"} or None
    values : array, optional
        The input of the work, NumPy (host) or CuPy (device).

    Returns
    -------
    (backend, reason) : ("numpy" | "cupy", str)

    Raises
    ------
    ValueError
        Unknown name.
    DeviceUnavailable
        "cupy" requested where no CUDA device can be used.
    """
    name = "auto" if name is None else str(name).lower()
    if name == "numba":  # explicit: never needs numba to import, dense work is NumPy
        return "numpy", "numba requested: dense work runs on NumPy on the CPU"
    if name == "auto" and not os.environ.get("GPUIR_BACKEND") and _is_device_array(values):
        return "cupy", "auto: the input is already on the device"
    if name == "auto" and os.environ.get("GPUIR_BACKEND", "").strip().lower() == "numba":
        return "numpy", "numba via GPUIR_BACKEND: dense work runs on NumPy on the CPU"
    backend, reason = resolve_backend(name)
    if backend == "numba":
        return "numpy", f"{reason}; dense work runs on NumPy on the CPU"
    return backend, reason


def torch_device(name: str | None = "auto") -> str:
    """The torch device of the encoder under the same backend request: "cpu" or "cuda".

    "numpy" and "numba" (requested, or through ``GPUIR_BACKEND`` under "auto")
    and ``GPUIR_DISABLE_GPU`` mean the CPU; "cupy" means "cuda" (torch then
    reports it when no device can be used); "auto" is "cuda" when torch sees a
    device. Never imports CuPy; imports torch only under "auto".
    """
    name = "auto" if name is None else str(name).lower()
    if name == "auto" and os.environ.get("GPUIR_BACKEND"):
        name = os.environ["GPUIR_BACKEND"].strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")
    if name in ("numpy", "numba") or os.environ.get("GPUIR_DISABLE_GPU"):
        return "cpu"
    if name == "cupy":
        return "cuda"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# --------------------------------------------------------------------------- segment engines (the contract)

#: The engines :func:`segment_engine` knows without registration (:mod:`gpuir.backends.contract`).
ENGINES = ("numpy", "numba", "cupy", "numpy-stats", "numba-each", "numba-stats", "cupy-each", "cupy-stats")

#: The engine that serves each concrete backend's segment searches (:func:`engine_for`).
ROUTES: dict[str, str] = {"numpy": "numpy", "numba": "numba", "cupy": "cupy"}


def _builtin_engine(name: str) -> SegmentEngine:
    if name == "numba":
        from .numba_segments import NumbaSegmentsEngine

        return NumbaSegmentsEngine()
    if name == "cupy":  # one device pass over every searched segment (gpuir.backends.cupy_segments)
        from . import devicesearch

        return devicesearch.engine()
    from .segment_engines import PerSegmentEngine

    backend, _, how = name.partition("-")
    return PerSegmentEngine(name, backend, weighted=how != "stats")


def segment_engine(name: str) -> SegmentEngine:
    """The engine of the segment-set contract called ``name`` (:data:`ENGINES`, or one
    :func:`gpuir.backends.contract.register_engine` added).

    Raises
    ------
    ValueError
        An unknown name.
    """
    if name not in ENGINES and name not in contract.registered_names():
        raise ValueError(f"unknown segment engine {name!r}: choose one of "
                         f"{', '.join(sorted(set(ENGINES) | set(contract.registered_names())))}")
    got = contract.registered(name, _builtin_engine)
    assert got is not None
    return got


def engine_for(backend: str) -> SegmentEngine:
    """The engine serving the concrete ``backend`` ("numpy", "numba" or "cupy"): :data:`ROUTES`."""
    name = ROUTES.get(backend)
    if name is None:
        raise ValueError(f"no segment engine for backend {backend!r}: choose one of {', '.join(ROUTES)}")
    if name == "cupy":
        from . import devicesearch

        if not devicesearch.ONE_PASS:  # one scorer call per segment (the path before the one-pass engine)
            name = "cupy-each"
    return segment_engine(name)


@contextmanager
def use_engine(backend: str, name: str) -> Iterator[SegmentEngine]:
    """Route ``backend``'s segment searches to the engine ``name`` inside a ``with`` block (tests and
    benchmarks compare engines this way: ``with use_engine("numba", "numba-each"): ...``). Process-wide."""
    if backend not in ROUTES:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(ROUTES)}")
    got = segment_engine(name)  # (an unknown name fails here)
    old = ROUTES[backend]
    ROUTES[backend] = name
    try:
        yield got
    finally:
        ROUTES[backend] = old
