"""``CupyScorer`` end to end on the CPU, its kernels being the real ones.

:func:`real_kernels_installed` installs the fake ``cupy`` of
:mod:`gpuir.backends.kernel_model` (NumPy-backed device arrays, streams,
pinned buffers, a launch checker that parses the kernels' C signatures) and
replaces its kernels -- the NumPy model -- by the compiled ``kernels/*.cu``
bodies run by :mod:`cuda_host.harness`. So the scorer's host code, the launch
arguments it builds and the CUDA code all run, on any machine with g++::

    with small_blocks(), real_kernels_installed(schedule="reverse") as cp:
        gpu = CupyScorer(index, params)
        res = gpu.search(queries, k)        # every launch ran the real kernel

:func:`small_blocks` swaps the block sizes in ``gpuir.backends.kernels`` for
small ones (the kernels take them as template parameters), so a test index
spans many tiles and a block has few threads to emulate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from gpuir.backends import kernels as K

from .harness import HostModule, build


@contextlib.contextmanager
def small_blocks(tile_threads: int = 32, tile_docs: int = 64, select_threads: int = 64,
                 haystack_threads: int = 32, pack_threads: int = 32) -> Iterator[None]:
    """Scorers created inside launch these block sizes (and ``NAME_EXPRESSIONS`` lists them)."""
    saved = {n: getattr(K, n) for n in ("TILE_THREADS", "TILE_DOCS", "SELECT_THREADS", "HAYSTACK_THREADS",
                                        "PACK_THREADS", "NAME_EXPRESSIONS")}
    K.TILE_THREADS, K.TILE_DOCS, K.SELECT_THREADS = tile_threads, tile_docs, select_threads
    K.HAYSTACK_THREADS, K.PACK_THREADS = haystack_threads, pack_threads
    names = dict(K.NAME_EXPRESSIONS)
    names["bm25_score.cu"] = [f"tile_score<{tile_threads}, {tile_docs}>", f"tile_dense<{tile_threads}, {tile_docs}>",
                              f"haystack_score<{haystack_threads}>"]
    names["topk.cu"] = [f"select_topk<{select_threads}>", f"pack_candidates<{pack_threads}>", "decode_keys"]
    K.NAME_EXPRESSIONS = names
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(K, n, v)


@contextlib.contextmanager
def real_kernels_installed(schedule: str = "forward", seed: int = 0, sm_count: int = 4,
                           modules: dict[str, HostModule | tuple[HostModule, str]] | None = None,
                           **launch_kw: Any) -> Iterator[Any]:
    """Install a fake ``cupy`` whose kernels are the compiled ``kernels/*.cu``, run on the CPU.

    Parameters
    ----------
    schedule, seed : see :meth:`cuda_host.harness.HostModule.launch`
        How the threads and blocks of every launch interleave.
    sm_count : int
        ``MultiProcessorCount`` the fake device reports (the scorer sizes grids from it).
    modules : dict, optional
        Kernel file -> a built module to launch from (e.g. one holding more
        instantiations, or a variant with a planted bug), or (module, prefix)
        where prefix is prepended to the kernel names (``"variant::"`` for a
        variant compiled inside a namespace). Files not given are built on
        first use with ``NAME_EXPRESSIONS[file]``.
    **launch_kw
        Passed to every :meth:`~cuda_host.harness.HostModule.launch` (``poison``, ``timeout_s``...).

    Yields
    ------
    types.SimpleNamespace
        The fake ``cupy``; ``launches`` lists (name, grid, block, shared) of every launch.
    """
    from gpuir.backends import kernel_model as km

    with km.fake_cupy_installed(seed=seed, sm_count=sm_count) as cp:
        sigs = {**km.kernel_signatures("bm25_score.cu"), **km.kernel_signatures("topk.cu")}
        given = dict(modules or {})
        built: dict[tuple[str, tuple[str, ...]], HostModule] = {}

        def kernel(filename: str, name: str, device_id: Any = None):
            names = tuple(K.NAME_EXPRESSIONS[filename])
            if name not in names:
                raise KeyError(f"{name!r} is not instantiated in {filename}: add it to NAME_EXPRESSIONS")
            if filename in given:
                mod, pre = given[filename] if isinstance(given[filename], tuple) else (given[filename], "")
                full = pre + name
            else:
                if (filename, names) not in built:
                    built[filename, names] = build(filename, names)
                mod, full = built[filename, names], name

            def launch(grid, block, args, shared_mem=0):
                km.check_launch(sigs, name, grid, block, args, shared_mem)
                cp.launches.append((name, grid, block, shared_mem))
                mod.launch(full, grid, block, [km.as_host(a) for a in args], shared=shared_mem,
                           schedule=schedule, seed=seed, **launch_kw)

            return launch

        cp.kernel = kernel
        K.kernel = kernel  # restored by fake_cupy_installed
        yield cp


def small_names() -> dict[str, list[str]]:
    """``NAME_EXPRESSIONS`` under :func:`small_blocks` (defaults)."""
    with small_blocks():
        return {f: list(v) for f, v in K.NAME_EXPRESSIONS.items()}
