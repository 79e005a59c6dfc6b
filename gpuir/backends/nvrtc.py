"""A chosen NVRTC major version (``libnvrtc.so.12``, ``libnvrtc.so.13``, ...) through ctypes.

The kernels are checked with more than one CUDA toolchain on every test run,
without a device: the CUDA 12 NVRTC (PyPI ``nvidia-cuda-nvrtc-cu12``) and the
CUDA 13 NVRTC (PyPI ``nvidia-cuda-nvrtc`` 13.x), because the register
allocator (ptxas, inside NVRTC) differs between them and a kernel that is
spill-free with one can spill with the other. Why a ctypes binding and not a
package:

* ``cupy.cuda.nvrtc`` binds the ONE NVRTC CuPy loaded (through
  cuda-pathfinder, which prefers ``libnvrtc.so.13`` when both wheels are
  installed), so it cannot compile the same source with 12 and 13 in one process;
* ``cuda-bindings`` (``cuda.bindings.nvrtc``) is built per CUDA major: one
  version of it is installed at a time, and it too loads one library.

The binding covers the nine calls a compile check needs (Version,
CreateProgram, AddNameExpression, CompileProgram, GetProgramLog(Size),
GetLoweredName, GetCUBIN(Size), GetPTX(Size), DestroyProgram, GetErrorString);
the signatures are NVRTC's stable C API, the same in CUDA 11, 12 and 13.

Where a library is looked for (:func:`find_library`), first hit wins:
``GPUIR_NVRTC<N>`` (a path to ``libnvrtc.so.<N>``), the pip wheels in
``sys.path`` (``nvidia/cuda_nvrtc/lib`` for 12, ``nvidia/cu<N>/lib`` for 13+),
``CUDA_PATH`` / ``CUDA_HOME`` and ``/usr/local/cuda*`` (``lib64``/``lib``),
then the dynamic loader's own search (``ldconfig``, ``LD_LIBRARY_PATH``). A
library is accepted only if ``nvrtcVersion`` reports the asked major.
Linux only (other systems keep ``cupy.cuda.nvrtc``).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("gpuir.backends.nvrtc")

__all__ = ["NVRTC", "NVRTCError", "available", "find_library", "load"]


class NVRTCError(RuntimeError):
    """An NVRTC call failed; ``log`` holds the program log when there is one."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


def _candidates(major: int) -> list[str]:
    name = f"libnvrtc.so.{major}"
    out: list[str] = []
    env = os.environ.get(f"GPUIR_NVRTC{major}")
    if env:
        out.append(env)
    sub = "nvidia/cuda_nvrtc/lib" if major == 12 else f"nvidia/cu{major}/lib"
    for entry in sys.path:
        if entry and os.path.isdir(entry):
            out.append(os.path.join(entry, sub, name))
    roots = [os.environ.get(v) for v in ("CUDA_PATH", "CUDA_HOME")]
    roots += sorted(glob.glob(f"/usr/local/cuda-{major}*"), reverse=True) + ["/usr/local/cuda"]
    for root in filter(None, roots):
        out += [os.path.join(root, "lib64", name), os.path.join(root, "lib", name)]
    return [p for p in dict.fromkeys(out) if os.path.isfile(p)] + [name]  # bare name: the loader's search


class NVRTC:
    """One loaded ``libnvrtc.so.<major>``.

    Parameters
    ----------
    path : str
        File of the library (or a bare soname for the dynamic loader).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        self._lib = lib
        P, I, S, C = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p
        CC = ctypes.POINTER(ctypes.c_char_p)
        for fname, args in {
            "nvrtcVersion": [ctypes.POINTER(I), ctypes.POINTER(I)],
            "nvrtcCreateProgram": [ctypes.POINTER(P), C, C, I, CC, CC],
            "nvrtcAddNameExpression": [P, C],
            "nvrtcCompileProgram": [P, I, CC],
            "nvrtcGetProgramLogSize": [P, ctypes.POINTER(S)],
            "nvrtcGetProgramLog": [P, ctypes.c_char_p],
            "nvrtcGetLoweredName": [P, C, ctypes.POINTER(C)],
            "nvrtcGetCUBINSize": [P, ctypes.POINTER(S)],
            "nvrtcGetCUBIN": [P, ctypes.c_char_p],
            "nvrtcGetPTXSize": [P, ctypes.POINTER(S)],
            "nvrtcGetPTX": [P, ctypes.c_char_p],
            "nvrtcDestroyProgram": [ctypes.POINTER(P)],
        }.items():
            fn = getattr(lib, fname)
            fn.argtypes, fn.restype = args, I
        lib.nvrtcGetErrorString.argtypes, lib.nvrtcGetErrorString.restype = [I], C
        major, minor = I(), I()
        self._check(lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version: tuple[int, int] = (major.value, minor.value)
        # NVRTC dlopens libnvrtc-builtins.so.<major>.<minor> by name at compile
        # time; a wheel's copy beside it is not on the loader's path (13's
        # $ORIGIN runpath does not cover a dlopen from inside the library).
        # Loading the sibling first makes that dlopen find it by its soname.
        if os.sep in path:
            sib = Path(path).resolve().parent / f"libnvrtc-builtins.so.{major.value}.{minor.value}"
            if sib.is_file():
                self._builtins = ctypes.CDLL(str(sib))

    def __repr__(self) -> str:
        return f"NVRTC({self.version[0]}.{self.version[1]}, {self.path!r})"

    def _check(self, rc: int, call: str, prog: ctypes.c_void_p | None = None) -> None:
        if rc != 0:
            msg = self._lib.nvrtcGetErrorString(rc).decode(errors="replace")
            raise NVRTCError(f"{call}: {msg}", self._log(prog) if prog is not None else "")

    def _log(self, prog: ctypes.c_void_p) -> str:
        n = ctypes.c_size_t()
        if self._lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n)) != 0:
            return ""
        buf = ctypes.create_string_buffer(n.value)
        self._lib.nvrtcGetProgramLog(prog, buf)
        return buf.value.decode(errors="replace")

    def compile(
        self, source: str, name: str, options: Sequence[str], name_expressions: Sequence[str] = (),
        ptx: bool = False,
    ) -> tuple[bytes, str, dict[str, str]]:
        """Compile one translation unit.

        Parameters
        ----------
        source : str
            The CUDA C++ text (no ``#include`` of files: inline them first).
        name : str
            The program's name, as compiler messages show it.
        options : sequence of str
            NVRTC options, e.g. ``("-std=c++17", "-arch=sm_90", "-Xptxas=-v")``.
        name_expressions : sequence of str
            Kernels (templates spelled out) to instantiate and look up.
        ptx : bool
            Return the PTX instead of the cubin (then ``-arch=compute_XX`` is
            the right option; with ``-arch=sm_XX`` NVRTC 12+ gives no PTX).

        Returns
        -------
        tuple
            (cubin or PTX bytes, the program log, {name expression: lowered
            (mangled) name}).

        Raises
        ------
        NVRTCError
            Compilation failed (``.log`` holds the compiler's messages), or a
            name expression was not instantiated.
        """
        lib = self._lib
        prog = ctypes.c_void_p()
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
                    "nvrtcCreateProgram")
        try:
            for expr in name_expressions:
                self._check(lib.nvrtcAddNameExpression(prog, expr.encode()), "nvrtcAddNameExpression", prog)
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            rc = lib.nvrtcCompileProgram(prog, len(options), opts)
            text = self._log(prog)
            if rc != 0:
                msg = lib.nvrtcGetErrorString(rc).decode(errors="replace")
                raise NVRTCError(f"nvrtcCompileProgram: {msg}", text)
            lowered = {}
            for expr in name_expressions:
                out = ctypes.c_char_p()
                self._check(lib.nvrtcGetLoweredName(prog, expr.encode(), ctypes.byref(out)),
                            f"nvrtcGetLoweredName({expr})", prog)
                lowered[expr] = out.value.decode()
            size = ctypes.c_size_t()
            get_size, get = (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX) if ptx else (lib.nvrtcGetCUBINSize,
                                                                                 lib.nvrtcGetCUBIN)
            self._check(get_size(prog, ctypes.byref(size)), get_size.__name__, prog)
            buf = ctypes.create_string_buffer(size.value)
            self._check(get(prog, buf), get.__name__, prog)
            data = buf.raw[: size.value]
            if ptx:
                data = data.rstrip(b"\0")
            return data, text, lowered
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


def find_library(major: int) -> str | None:
    """Path (or soname) of a loadable ``libnvrtc.so.<major>`` reporting that major, or None."""
    return _load(int(major))[0]


@functools.cache
def _load(major: int) -> tuple[str | None, NVRTC | None, str]:
    return _find(major)


def _find(major: int) -> tuple[str | None, NVRTC | None, str]:
    """(path, library, "") of the first candidate reporting ``major``, else (None, None, why)."""
    if not sys.platform.startswith("linux"):
        return None, None, f"the ctypes NVRTC loader is Linux-only (platform {sys.platform})"
    tried = []
    for path in _candidates(major):
        try:
            lib = NVRTC(path)
        except (OSError, AttributeError, NVRTCError) as e:
            tried.append(f"{path}: {type(e).__name__}: {e}")
            continue
        if lib.version[0] != major:
            tried.append(f"{path}: reports NVRTC {lib.version[0]}.{lib.version[1]}")
            continue
        log.debug("NVRTC %d.%d from %s", *lib.version, path)
        return path, lib, ""
    return None, None, f"libnvrtc.so.{major} not found or not loadable (tried: {'; '.join(tried)})"


def load(major: int) -> NVRTC:
    """The NVRTC of a CUDA major version, loaded once per process.

    Raises
    ------
    OSError
        No loadable ``libnvrtc.so.<major>``; the message says where it looked
        and which wheel to install.
    """
    _, lib, why = _load(int(major))
    if lib is None:
        wheel = "nvidia-cuda-nvrtc-cu12" if int(major) == 12 else f"'nvidia-cuda-nvrtc=={major}.*'"
        raise OSError(f"{why}: pip install {wheel}")
    return lib


def available(major: int) -> tuple[bool, str]:
    """Whether NVRTC ``major`` loads, and ``"NVRTC 13.0 (path)"`` or the reason it does not."""
    try:
        lib = load(major)
    except OSError as e:
        return False, str(e)
    return True, f"NVRTC {lib.version[0]}.{lib.version[1]} ({Path(lib.path).name if os.sep in lib.path else lib.path})"
