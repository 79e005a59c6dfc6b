"""What GPU this machine has, for ``gpuir info`` and benchmark records.

:func:`gpu_report` asks NVML (the ``nvidia-ml-py`` package, imported as
``pynvml``) for each device's name, memory and the driver version, and CuPy
whether a device can actually be used. It never raises: when something is
missing, the report says what and why.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from ._compat import cuda_device, has_cupy

#: Whether every GPU path of this version has run clean on a GPU (``bench/gpu_verify.py`` green: test suite
#: under --require-gpu, sanitizers clean, bit-exact scale cases). Set to True only in the commit that adds
#: such a run's output to bench/results/, together with :data:`VERIFIED_SOURCES_SHA256`: a change to any
#: of :data:`VERIFIED_SOURCES` after that fails a test until a new device run is committed (or this is False).
GPU_PATH_VERIFIED = False
GPU_PATH_STATUS = (
    "NOT VERIFIED on a device since issue 35 (tile scoring without block barriers: sub_plan and sub_score "
    "replaced tile_score; a pool of graphs; large batches in pieces): its kernels are checked without a "
    "device only -- they compile spill-free with NVRTC 12 and 13 and nvcc 13 for sm_80 and sm_90, and their "
    "real bodies run on the CPU bit-exact with NumPy (tests/test_kernels_host.py, "
    "tests/test_gpu_host_emulation.py). Not run: the GPU tests, compute-sanitizer, timings. The previous "
    "kernels were VERIFIED on an NVIDIA H200 (bench/results/gpu_verify_NVIDIA_H200_20261127T072556_510.*, "
    "2026-11-27) and H100 (bench/results/gpu_verify_NVIDIA_H100_80GB_HBM3_*). Run `python bench/gpu_verify.py` "
    "on a GPU machine and commit its files to verify this version."
)
#: The sources the verification run exercised (repository paths; globs): the kernels and the host code that
#: compiles, launches and reads them.
VERIFIED_SOURCES = ("kernels/*.cu", "kernels/*.cuh", "gpuir/backends/cupy_backend.py", "gpuir/backends/kernels.py")
#: :func:`sources_sha256` of :data:`VERIFIED_SOURCES` at the verified commit.
VERIFIED_SOURCES_SHA256 = "df716734b14f24ab5e58818837ebc03689a0b35a0cb65c0cb0e59667a72a9932"


def sources_sha256(root: str | os.PathLike) -> str:
    """sha256 over :data:`VERIFIED_SOURCES` under ``root`` (a source tree): each file's path and bytes, sorted
    by path within each pattern; compared with :data:`VERIFIED_SOURCES_SHA256` by the tests."""
    import glob
    import hashlib

    h = hashlib.sha256()
    for pattern in VERIFIED_SOURCES:
        for rel in sorted(glob.glob(pattern, root_dir=root)):
            h.update(rel.encode() + b"\0")
            with open(os.path.join(root, rel), "rb") as f:
                h.update(f.read() + b"\0")
    return h.hexdigest()


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _nvml() -> dict[str, Any]:
    try:
        import pynvml
    except ImportError:
        return {"available": False, "reason": "nvidia-ml-py is not installed (pip install 'gpuir[gpu]')"}
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return {"available": False, "reason": f"NVML cannot be initialised: no NVIDIA driver? ({type(e).__name__}: {e})"}
    try:
        out: dict[str, Any] = {"available": True, "driver": _s(pynvml.nvmlSystemGetDriverVersion())}
        try:
            v = pynvml.nvmlSystemGetCudaDriverVersion()
            out["cuda_driver"] = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:  # noqa: BLE001, S110 - older drivers
            pass
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            d = {"index": i, "name": _s(pynvml.nvmlDeviceGetName(h)),
                 "memory_total_bytes": int(mem.total), "memory_free_bytes": int(mem.free)}
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                d["compute_capability"] = f"{major}.{minor}"
            except Exception:  # noqa: BLE001, S110
                pass
            devices.append(d)
        out["devices"] = devices
        if not devices:
            out["available"] = False
            out["reason"] = "NVML reports no NVIDIA device"
        return out
    except Exception as e:  # noqa: BLE001
        return {"available": False, "reason": f"NVML query failed ({type(e).__name__}: {e})"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001, S110
            pass


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _driver_cuda_version() -> int | None:
    """The CUDA version the installed NVIDIA driver supports (e.g. 12040), or None without a driver.

    Asks ``libcuda.so.1`` (the driver's user-space library) directly, so the
    answer does not depend on CuPy or on which CUDA runtime it was built for.
    """
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    v = ctypes.c_int(0)
    try:
        if lib.cuDriverGetVersion(ctypes.byref(v)) != 0:
            return None
    except AttributeError:
        return None
    return int(v.value) or None


def diagnose(raw: tuple[bool, str] | None = None) -> tuple[bool, str]:
    """Whether the cupy backend can run, and in one line the real reason when it cannot.

    Distinguishes, in this order: the GPU disabled by ``GPUIR_DISABLE_GPU``;
    CuPy not installed; no NVIDIA driver (``libcuda.so.1`` cannot be loaded);
    a driver too old for the CUDA runtime CuPy was built for; no device
    visible; anything else (the underlying error, shortened).

    Parameters
    ----------
    raw : (bool, str), optional
        What :func:`gpuir._compat.cuda_device` said (asked when not given).

    Returns
    -------
    (usable, reason) : (bool, str)
        ``reason`` is a single line that names what to do.
    """
    usable, reason = cuda_device() if raw is None else raw
    if usable:
        return True, reason
    if os.environ.get("GPUIR_DISABLE_GPU"):
        return False, "GPUIR_DISABLE_GPU is set"
    if not has_cupy():
        return False, ("CuPy is not installed: pip install 'gpuir[gpu]' (CUDA 12 driver) "
                       "or 'gpuir[gpu-cuda13]' (CUDA 13 driver)")
    drv = _driver_cuda_version()
    if drv is None:
        return False, ("no NVIDIA driver: libcuda.so.1 cannot be loaded (CuPy is installed; a GPU machine needs "
                       "the NVIDIA driver, a container needs `--gpus all`)")
    rt = None
    try:
        import cupy

        rt = int(cupy.cuda.runtime.runtimeGetVersion())
    except Exception:  # noqa: BLE001, S110 - keep going with what is known
        pass
    if "InsufficientDriver" in reason or (rt is not None and drv // 1000 < rt // 1000):
        have = _cuda_version(rt) if rt else "a newer CUDA"
        return False, (f"NVIDIA driver too old: it supports CUDA {_cuda_version(drv)}, CuPy's runtime is CUDA {have}; "
                       f"update the driver or install the CuPy wheel for CUDA {drv // 1000} "
                       "(gpuir[gpu]: CUDA 12, gpuir[gpu-cuda13]: CUDA 13)")
    if "NoDevice" in reason or "reports no CUDA device" in reason:
        return False, (f"no CUDA device visible (driver supports CUDA {_cuda_version(drv)}); "
                       "check CUDA_VISIBLE_DEVICES, or `--gpus all` in a container")
    return False, " ".join(reason.split())[:300]


def gpu_report() -> dict[str, Any]:
    """A JSON-ready description of the GPUs and whether gpuir can use one.

    Returns
    -------
    dict
        ``usable`` (bool) and ``reason`` (str): whether the cupy backend can run
        and why (not), in one line (:func:`diagnose`); ``detail``: the
        underlying message; ``cupy`` (version or None); ``nvrtc`` (whether kernels can
        be compiled, e.g. "NVRTC 12.9"); ``nvml``: ``available``, and either
        ``driver``, ``cuda_driver`` and ``devices`` (``name``,
        ``memory_total_bytes``, ``memory_free_bytes``, ``compute_capability``)
        or ``reason``; ``gpu_path``: ``verified`` (bool) and ``status`` (whether
        the kernels of this version have run on a GPU, see :data:`GPU_PATH_VERIFIED`).
    """
    raw = cuda_device()
    usable, reason = diagnose(raw)
    rep: dict[str, Any] = {"usable": usable, "reason": reason, "detail": raw[1], "cupy": None,
                           "gpu_path": {"verified": GPU_PATH_VERIFIED, "status": GPU_PATH_STATUS}}
    if has_cupy():
        import cupy

        rep["cupy"] = cupy.__version__
        from .backends.kernels import nvrtc_available

        rep["nvrtc"] = nvrtc_available()[1]
    rep["nvml"] = _nvml()
    return rep
