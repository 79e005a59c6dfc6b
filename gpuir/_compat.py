"""Optional imports, checked lazily: nothing heavy happens at import time.

``has_cupy()`` answers "is CuPy importable"; ``cuda_device()`` answers "can a CUDA
device actually be used", with the reason when it cannot. The two differ: CuPy
imports fine on a machine without a GPU, and only device calls fail there.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import importlib.util
import os
import sys
from types import ModuleType


def optional_import(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"{module} is not installed: pip install 'gpuir[{extra}]' ({e})"
        ) from e


@functools.cache
def has_cupy() -> bool:
    """True when some CuPy wheel (cupy-cuda12x, cupy-cuda13x, ...) imports."""
    try:
        importlib.import_module("cupy")
        return True
    except Exception:  # noqa: BLE001 - a broken CuPy wheel raises anything at import (OSError, RuntimeError, ...)
        return False


@functools.cache
def no_driver_library() -> bool:
    """True on Linux when the NVIDIA driver's user-space library (``libcuda.so.1``) cannot be loaded:
    no CUDA device can be used, whatever CuPy says (asked without importing CuPy)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    return False


@functools.cache
def cuda_device() -> tuple[bool, str]:
    """Whether a CUDA device can be used through CuPy, and why (not).

    Returns
    -------
    (usable, reason) : (bool, str)
        ``reason`` names the device when usable, else says what is missing.
    """
    if os.environ.get("GPUIR_DISABLE_GPU"):
        return False, "GPUIR_DISABLE_GPU is set"
    if importlib.util.find_spec("cupy") is None or not (no_driver_library() or has_cupy()):
        return False, "CuPy is not installed (pip install 'gpuir[gpu]', or 'gpuir[gpu-cuda13]')"
    if no_driver_library():  # asked before importing CuPy: a CPU machine does not pay for the import (0.2-0.4 s)
        return False, ("CuPy is installed but there is no NVIDIA driver (libcuda.so.1 cannot be loaded; a GPU "
                       "machine needs the driver, a container `--gpus all`)")
    import cupy

    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - CUDA driver missing, no device, ...: said in the reason
        return False, f"CuPy is installed but no CUDA device can be used ({type(e).__name__}: {e})"
    if n < 1:
        return False, "CuPy is installed but reports no CUDA device"
    try:
        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        cupy.zeros(1).sum()  # a real allocation and launch
    except Exception as e:  # noqa: BLE001 - whatever the device raises makes it unusable: said in the reason
        return False, f"a CUDA device is visible but unusable ({type(e).__name__}: {e})"
    return True, f"CUDA device 0: {name}"


class MissingExtra(ImportError):
    """An optional extra is not installed.

    Parameters
    ----------
    extra : str
        The extra that installs what is missing (``pip install 'gpuir[<extra>]'``).
    what : str
        What needs it (a feature, a module).
    """

    def __init__(self, extra: str, what: str):
        self.extra, self.what = extra, what
        super().__init__(f"{what} needs the {extra} extra: pip install 'gpuir[{extra}]'")

    def __reduce__(self):  # picklable with its two arguments
        return (type(self), (self.extra, self.what))


_GPU_FIX = ("Fix: run on a machine with an NVIDIA GPU and install 'gpuir[gpu]' (CUDA 12) or "
            "'gpuir[gpu-cuda13]', or use backend='numpy'")


class DeviceUnavailable(RuntimeError, ValueError):
    """A path that needs a usable CUDA device has none; the one-line message says why and the fix.

    A :class:`RuntimeError`; also a :class:`ValueError`, because resolving
    ``backend="cupy"`` without a device raised ValueError before this type
    existed (callers catching either keep working).
    """


def device_unavailable(what: str, why: str, fix: str = _GPU_FIX) -> DeviceUnavailable:
    """The :class:`DeviceUnavailable` for ``what`` (e.g. "backend 'cupy' was requested"), one line."""
    return DeviceUnavailable(" ".join(f"{what} but {why}. {fix}".split()))


@functools.cache
def numba_available() -> tuple[bool, str]:
    """Whether numba imports (the compiled CPU backend can run), with the reason when not."""
    try:
        import numba
    except Exception as e:  # noqa: BLE001 - any import failure means: not usable
        return False, f"numba does not import ({type(e).__name__}: {e})"
    return True, f"numba {numba.__version__}"
