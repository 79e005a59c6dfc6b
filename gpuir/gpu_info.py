"""What GPU this machine has, for ``gpuir info`` and benchmark records.

:func:`gpu_report` asks NVML (the ``nvidia-ml-py`` package, imported as
``pynvml``) for each device's name, memory and the driver version, and CuPy
whether a device can actually be used. It never raises: when something is
missing, the report says what and why.
"""

from __future__ import annotations

from typing import Any

from ._compat import cuda_device, has_cupy

#: Whether the CUDA kernels of this version have been run and verified on a GPU
#: (``bench/gpu_verify.py`` green: test suite under --require-gpu, sanitizers
#: clean, bit-exact scale cases). Set to True only in the commit that adds that
#: run's output to bench/results/.
GPU_PATH_VERIFIED = False
GPU_PATH_STATUS = (
    "UNVERIFIED: the fused GPU kernels (tile scoring, haystack scoring, selection) have been compiled for "
    "sm_80/sm_90 and run on the CPU (kernel model and host emulation of the real kernel bodies, bit-exact "
    "with NumPy), but never on a GPU. Run `python bench/gpu_verify.py` on a GPU machine before trusting them."
)


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


def gpu_report() -> dict[str, Any]:
    """A JSON-ready description of the GPUs and whether gpuir can use one.

    Returns
    -------
    dict
        ``usable`` (bool) and ``reason`` (str): whether the cupy backend can run
        and why (not); ``cupy`` (version or None); ``nvrtc`` (whether kernels can
        be compiled, e.g. "NVRTC 12.9"); ``nvml``: ``available``, and either
        ``driver``, ``cuda_driver`` and ``devices`` (``name``,
        ``memory_total_bytes``, ``memory_free_bytes``, ``compute_capability``)
        or ``reason``; ``gpu_path``: ``verified`` (bool) and ``status`` (whether
        the kernels of this version have run on a GPU, see :data:`GPU_PATH_VERIFIED`).
    """
    usable, reason = cuda_device()
    rep: dict[str, Any] = {"usable": usable, "reason": reason, "cupy": None,
                           "gpu_path": {"verified": GPU_PATH_VERIFIED, "status": GPU_PATH_STATUS}}
    if has_cupy():
        import cupy

        rep["cupy"] = cupy.__version__
        from .backends.kernels import nvrtc_available

        rep["nvrtc"] = nvrtc_available()[1]
    rep["nvml"] = _nvml()
    return rep
