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


def small_blocks(tile_threads: int = 32, tile_docs: int = 64, select_threads: int = 64,
                 haystack_threads: int = 32, pack_threads: int = 32) -> contextlib.AbstractContextManager[None]:
    """Scorers created inside launch these block sizes (and ``NAME_EXPRESSIONS`` lists them)."""
    from gpuir.backends import kernel_model as km

    return km.small_kernels({"TILE_THREADS": tile_threads, "TILE_DOCS": tile_docs, "SELECT_THREADS": select_threads,
                             "HAYSTACK_THREADS": haystack_threads, "PACK_THREADS": pack_threads})


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
        sigs = {**km.kernel_signatures("bm25_score.cu"), **km.kernel_signatures("topk.cu"),
                **km.kernel_signatures("scatter.cu")}
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
                km._deferred(lambda: mod.launch(full, grid, block, [km.as_host(a) for a in args], shared=shared_mem,
                                                schedule=schedule, seed=seed, **launch_kw))  # recorded in a capture

            return launch

        cp.kernel = kernel
        K.kernel = kernel  # restored by fake_cupy_installed
        yield cp


def small_names() -> dict[str, list[str]]:
    """``NAME_EXPRESSIONS`` of the kernel files under :func:`small_blocks` (defaults)."""
    from gpuir.backends import kernel_model as km

    return {**K.NAME_EXPRESSIONS, **km.small_names()}
