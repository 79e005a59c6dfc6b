"""Run the CUDA kernels of ``kernels/*.cu`` on the CPU, for tests.

The real kernel bodies are compiled as C++ (``g++ -std=c++20 -O1 -pthread``)
together with ``cuda_host_shim.h``, which supplies the CUDA execution model:
one ``std::thread`` per CUDA thread of a block, blocks one after another, a
block barrier for ``__syncthreads``, a per-warp exchange for the warp
intrinsics, ``std::atomic_ref`` for atomics (see the header's comment and
``docs/gpu.md``, "Running the kernels on the CPU"). Device pointers are host
pointers, so a kernel reads and writes NumPy arrays::

    mod = build("topk.cu", ["topk_rows<64>"])
    mod.launch("topk_rows<64>", grid=(B,), block=(64,), shared=8 * kpad,
               args=[scores, touched, row_const, np.int64(N), ...])

* :func:`build` generates one translation unit (shim + the kernel file with
  ``common.cuh`` inlined by :func:`gpuir.backends.kernels.load_source` + a table
  of ``extern "C"`` launch wrappers for the requested template instantiations),
  compiles it into a shared library cached under :func:`cache_dir` (keyed by a
  hash of every input and flag) and loads it with ctypes.
* Each kernel's parameter types come from the compiled function type, so
  :meth:`HostModule.launch` checks every argument: arrays must have the exact
  dtype, be C-contiguous and, for non-const pointers, writeable; NumPy scalars
  must have the exact type (CuPy would pass a mismatched one bit for bit).
* By default every array is copied into a buffer with guard bytes on both
  sides: a kernel that writes out of bounds raises :class:`KernelError`.
  ``sanitize=True`` builds with AddressSanitizer and UBSan instead (reads out of
  bounds too); such a library loads only in a process started by
  :func:`run_sanitized`.
* ``schedule`` picks how the threads of a block interleave: ``"forward"``,
  ``"reverse"``, ``"random"`` (one CUDA thread at a time, switching at
  barriers: deterministic, exposes missing barriers) or ``"parallel"``.

Errors a GPU would hide or hang on (deadlock, ``__syncthreads`` in divergent
code, a warp intrinsic with an exited or missing lane, a write out of bounds)
raise :class:`KernelError` with the thread ids and source positions involved.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuir.backends import kernels as K

HERE = Path(__file__).resolve().parent
SHIM = HERE / "cuda_host_shim.h"
LINKER_SCRIPT = HERE / "shared_memory.ld"
REPO = HERE.parents[1]

#: Thread interleavings of :meth:`HostModule.launch` (the shim's ``Schedule`` codes).
SCHEDULES = {"parallel": 0, "forward": 1, "reverse": 2, "random": 3}
#: Flags of every build. -ffp-contract=off: no multiply-add contracted into an
#: FMA, so float32 arithmetic rounds operation by operation, as with --fmad=false.
FLAGS = ("-std=c++20", "-O1", "-pthread", "-fPIC", "-shared", "-ffp-contract=off", "-fdata-sections",
         "-fvisibility=hidden", "-fno-gnu-unique")
#: Added for ``sanitize=True``.
SANITIZE_FLAGS = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g1")
#: Bytes of guard on each side of an array argument, and their value.
GUARD = 512
GUARD_BYTE = 0xA7
#: Dynamic shared memory a launch may request (a kernel needs an opt-in for more).
MAX_SHARED = 48 * 1024

_PROBE = r"""
#include <atomic>
#include <source_location>
#include <thread>
#include <type_traits>
int main() {
    float f = 0.0f;
    std::atomic_ref<float>(f).fetch_add(1.0f);
    std::thread t([] {});
    t.join();
    return std::source_location::current().line() > 0 && std::is_same_v<std::type_identity_t<int>, int> ? 0 : 1;
}
"""


class HostBuildError(RuntimeError):
    """A kernel file does not compile for the host; the message holds the compiler log."""


class KernelError(RuntimeError):
    """A kernel failed on the host: deadlock, divergent barrier, partial warp, out-of-bounds write."""


# =============================================================================
# Compiler and cache
# =============================================================================
@functools.cache
def find_compiler() -> tuple[str | None, str]:
    """A C++20 compiler that builds the shim.

    Tries ``$GPUIR_HOST_CXX``, ``$CXX``, ``g++``, ``clang++`` in this order.

    Returns
    -------
    tuple
        ``(path, version line)``, or ``(None, reason)`` when none works.
    """
    tried = []
    for cand in (os.environ.get("GPUIR_HOST_CXX"), os.environ.get("CXX"), "g++", "clang++"):
        path = shutil.which(cand) if cand else None
        if not path or path in (t[0] for t in tried):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "probe.cpp"
            src.write_text(_PROBE)
            r = subprocess.run([path, "-std=c++20", "-pthread", "-o", str(Path(tmp) / "probe"), str(src)],
                               capture_output=True, text=True, check=False)
        if r.returncode == 0:
            ver = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout
            return path, ver.splitlines()[0] if ver else path
        tried.append((path, (r.stderr or r.stdout).strip().splitlines()[-1:]))
    if not tried:
        return None, "no C++ compiler found (set GPUIR_HOST_CXX or CXX, or install g++ >= 11)"
    return None, "no C++20 compiler (std::atomic_ref, <source_location>): " + "; ".join(f"{p}: {e}" for p, e in tried)


def cache_dir() -> Path:
    """Where built libraries are kept: ``$GPUIR_CUDA_HOST_CACHE``, else a per-user temp folder."""
    env = os.environ.get("GPUIR_CUDA_HOST_CACHE")
    d = Path(env) if env else Path(tempfile.gettempdir()) / f"gpuir-cuda-host-{os.getuid()}"
    d.mkdir(parents=True, exist_ok=True)
    return d


# =============================================================================
# Kernel signatures
# =============================================================================
@dataclass(frozen=True)
class Param:
    """One kernel parameter, from the compiled function type.

    Attributes
    ----------
    name : str
        Its name in the source (``"arg<i>"`` when it cannot be parsed).
    pointer : bool
        A pointer (an array argument) or a scalar.
    const : bool
        Pointer to const (the kernel only reads the array).
    code : str
        NumPy dtype string of the (pointed-to) type: ``"i4"``, ``"f8"``...;
        ``"V<n>"`` for another type of n bytes, ``"P"`` for a pointer.
    """

    name: str
    pointer: bool
    const: bool
    code: str

    @property
    def dtype(self) -> np.dtype | None:
        """The NumPy dtype, or None for a type NumPy has no scalar for."""
        return None if self.code[0] in "VP" else np.dtype(self.code)

    def describe(self) -> str:
        ty = self.code if self.dtype is None else self.dtype.name
        return f"{self.name} ({'const ' if self.const else ''}{ty}{' *' if self.pointer else ''})"


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", " ", src)


def param_names(source: str, kernel: str) -> list[str] | None:
    """Parameter names of ``__global__ ... kernel(...)`` in a source, or None if not found."""
    src = _strip_comments(source)
    pat = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?" + re.escape(kernel) + r"\s*\(([^)]*)\)")
    m = pat.search(src)
    if not m:
        return None
    names = []
    for p in m.group(1).split(","):
        words = re.findall(r"[A-Za-z_]\w*", p)
        if not words:
            return None
        names.append(words[-1])
    return names


# =============================================================================
# Building
# =============================================================================
def _table(names: Sequence[str]) -> str:
    lines = ['#line 1 "<gpuir_host launch table>"', "namespace gpuir_host_table {"]
    for i, n in enumerate(names):
        lines.append(f"static void k{i}(void** a) {{ ::gpuir_host::invoke(&{n}, a); }}")
        lines.append(f"static std::string s{i}() {{ return ::gpuir_host::signature(&{n}); }}")
    lines.append("static const ::gpuir_host::KernelEntry entries[] = {")
    lines += [f'    {{"{n}", &k{i}, &s{i}}},' for i, n in enumerate(names)]
    lines.append("};")
    lines.append("}  // namespace gpuir_host_table")
    lines.append(r"""
#define GPUIR_HOST_API extern "C" __attribute__((visibility("default")))
GPUIR_HOST_API int gpuir_host_count() {
    return int(sizeof(gpuir_host_table::entries) / sizeof(gpuir_host_table::entries[0]));
}
GPUIR_HOST_API const char* gpuir_host_name(int i) { return gpuir_host_table::entries[i].name; }
GPUIR_HOST_API int gpuir_host_signature(int i, char* buf, unsigned long long n) {
    return ::gpuir_host::copy_out(gpuir_host_table::entries[i].signature(), buf, n);
}
GPUIR_HOST_API unsigned long long gpuir_host_static_shared_bytes() {
    return __gpuir_shared_start ? (unsigned long long)(__gpuir_shared_end - __gpuir_shared_start) : 0ull;
}
GPUIR_HOST_API int gpuir_host_launch(int i, const unsigned* grid, const unsigned* block, unsigned long long shared,
                                     void** args, int schedule, unsigned long long seed, int poison,
                                     double timeout_s, char* err, unsigned long long errlen) {
    return ::gpuir_host::launch(gpuir_host_table::entries[i], grid, block, shared, args, schedule, seed, poison,
                                timeout_s, err, errlen);
}
""")
    return "\n".join(lines) + "\n"


def build(
    kernel: str,
    names: Sequence[str],
    *,
    source: str | None = None,
    defines: dict[str, Any] | None = None,
    cuda_arch: int | None = 800,
    sanitize: bool = False,
    load: bool = True,
) -> HostModule | Path:
    """Compile kernel instantiations for the host (cached) and load them.

    Parameters
    ----------
    kernel : str
        A file of ``kernels/`` (``"topk.cu"``), read with ``common.cuh`` inlined
        as the GPU build reads it; with ``source``, only a label for messages.
    names : sequence of str
        Kernels to expose, as NVRTC name expressions: ``"topk_rows<64>"``,
        ``"bm25_score<0, 32, 2>"``, ``"finalize_dense"``.
    source : str, optional
        Kernel source to compile instead of the file (e.g. a test kernel);
        ``#include "common.cuh"`` finds ``kernels/``.
    defines : dict, optional
        ``#define NAME VALUE`` lines put before the source.
    cuda_arch : int or None
        Value of ``__CUDA_ARCH__`` (so the device branches of common.cuh run);
        None leaves it undefined (the host branches run).
    sanitize : bool
        Build with AddressSanitizer + UBSan (load only under :func:`run_sanitized`).
    load : bool
        False: only compile (fill the cache, e.g. several builds in parallel
        threads) and return the library's path.

    Returns
    -------
    HostModule, or Path with ``load=False``

    Raises
    ------
    HostBuildError
        No C++20 compiler, or the source does not compile (message: the log).
    """
    cxx, version = find_compiler()
    if cxx is None:
        raise HostBuildError(version)
    if not names:
        raise ValueError("names: give at least one kernel name expression, e.g. 'topk_rows<64>'")
    text = source if source is not None else K.load_source(kernel)
    m = re.search(r"^(?!\s*#).*\bextern\s+__shared__\b.*$", _strip_comments(text), flags=re.MULTILINE)
    if m:
        raise HostBuildError(
            f"{kernel}: `{m.group(0).strip()}`: the host build supports dynamic shared memory only through "
            "GPUIR_EXTERN_SHARED(type, name) (kernels/common.cuh), not a raw `extern __shared__`"
        )
    head = [f"// generated by tests/cuda_host/harness.py for {kernel}",
            f"#define GPUIR_HOST_CUDA_ARCH {int(cuda_arch) if cuda_arch else 0}"]
    head += [f"#define {k} {v}" for k, v in (defines or {}).items()]
    head.append(f'#include "{SHIM}"')
    if source is not None:
        text = f'#line 1 "{kernel}"\n{text}'
    tu = "\n".join(head) + "\n" + text + "\n" + _table(names)
    flags = (*FLAGS, *(SANITIZE_FLAGS if sanitize else ()), f"-I{K.KERNEL_DIR}", f"-Wl,-T,{LINKER_SCRIPT}")
    key = hashlib.sha256("\0".join([version, *flags, SHIM.read_text(), LINKER_SCRIPT.read_text(), tu]).encode())
    out = cache_dir() / key.hexdigest()[:24]
    lib = out / "kernels.so"
    if not lib.exists():
        out.mkdir(parents=True, exist_ok=True)
        cpp = out / "kernels.cpp"
        cpp.write_text(tu)
        tmp = out / f"kernels.so.{os.getpid()}.tmp"
        cmd = [cxx, *flags, "-o", str(tmp), str(cpp)]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
        if r.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise HostBuildError(f"the host build of {kernel} failed ({' '.join(cmd)}):\n{r.stderr}{r.stdout}")
        os.replace(tmp, lib)
    return HostModule(lib, kernel, text, sanitize) if load else lib


# =============================================================================
# Launching
# =============================================================================
def _sanitizer_loaded() -> bool:
    return hasattr(ctypes.CDLL(None), "__asan_init")


@dataclass
class _Kernel:
    index: int
    name: str
    params: list[Param]


class HostModule:
    """The compiled kernels of one :func:`build`; launch them with :meth:`launch`."""

    def __init__(self, path: Path, label: str, source: str, sanitize: bool):
        self.path, self.label, self.sanitize = path, label, sanitize
        if sanitize and not _sanitizer_loaded():
            raise RuntimeError(
                f"{path} is built with AddressSanitizer: it loads only in a process whose sanitizer runtime "
                "comes first; run the code with run_sanitized()"
            )
        self._lib = lib = ctypes.CDLL(str(path))
        lib.gpuir_host_name.restype = ctypes.c_char_p
        lib.gpuir_host_static_shared_bytes.restype = ctypes.c_ulonglong
        lib.gpuir_host_launch.argtypes = [
            ctypes.c_int, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint), ctypes.c_ulonglong,
            ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_ulonglong, ctypes.c_int, ctypes.c_double,
            ctypes.c_char_p, ctypes.c_ulonglong,
        ]
        lib.gpuir_host_signature.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_ulonglong]
        #: Name expression -> kernel (index and parameters).
        self.kernels: dict[str, _Kernel] = {}
        for i in range(lib.gpuir_host_count()):
            name = lib.gpuir_host_name(i).decode()
            buf = ctypes.create_string_buffer(4096)
            lib.gpuir_host_signature(i, buf, len(buf))
            codes = [c for c in buf.value.decode().split(",") if c]
            pnames = param_names(source, name.split("<")[0].strip())
            if pnames is None or len(pnames) != len(codes):
                pnames = [f"arg{j}" for j in range(len(codes))]
            params = []
            for pn, c in zip(pnames, codes):
                kind, code = c.split(":")
                params.append(Param(pn, kind.startswith("p"), kind == "pc", code))
            self.kernels[name] = _Kernel(i, name, params)
        #: Bytes of all static ``__shared__`` variables of the library (every kernel's).
        self.static_shared_bytes = int(lib.gpuir_host_static_shared_bytes())

    def launch(
        self,
        name: str,
        grid: Sequence[int] | int,
        block: Sequence[int] | int,
        args: Sequence[Any],
        shared: int = 0,
        *,
        schedule: str = "forward",
        seed: int = 0,
        poison: int | str | None = "random",
        guard: bool | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        """Run a kernel over a grid, on the CPU, writing into the array arguments.

        Parameters
        ----------
        name : str
            A name expression given to :func:`build`.
        grid, block : int or sequence of 1-3 ints
            Launch dimensions (block: at most 1024 threads).
        args : sequence
            One per kernel parameter: a C-contiguous ndarray of the exact dtype
            (or None, a null pointer) for a pointer; a NumPy scalar of the exact
            type, or a Python int / float, for a scalar.
        shared : int
            Bytes of dynamic shared memory (``GPUIR_EXTERN_SHARED``), <= 48 KiB.
        schedule : {"forward", "reverse", "random", "parallel"}
            Serial schedules run one CUDA thread at a time, switching at barriers
            and warp intrinsics, to the lowest / highest / a random runnable
            thread id, and blocks in the same order; "parallel" runs every
            thread of a block at once (blocks in order).
        seed : int
            Seeds the random schedule and the poison bytes.
        poison : "random", int or None
            What fills shared memory before each block: random bytes, one byte
            value, or nothing (the previous block's values stay).
        guard : bool, optional
            Copy arrays into buffers with guard bytes and check them afterwards
            (default: True unless built with ``sanitize``, where ASan checks).
        timeout_s : float
            Fail when no thread makes progress for this long.

        Raises
        ------
        TypeError, ValueError
            Arguments that do not match the kernel's parameters, a bad launch
            configuration.
        KernelError
            The kernel failed (the message says how, where and which threads).
        """
        if name not in self.kernels:
            raise KeyError(f"{name!r} is not built in {self.label}: pass it to build() (have: {sorted(self.kernels)})")
        k = self.kernels[name]
        g3, b3 = _dims(grid, "grid"), _dims(block, "block")
        if b3[0] > 1024 or b3[1] > 1024 or b3[2] > 64 or b3[0] * b3[1] * b3[2] > 1024:
            raise ValueError(f"block {b3}: at most 1024 threads (x, y <= 1024, z <= 64)")
        if g3[0] > 2**31 - 1 or g3[1] > 65535 or g3[2] > 65535:
            raise ValueError(f"grid {g3}: x <= 2^31 - 1, y and z <= 65535")
        if not 0 <= int(shared) <= MAX_SHARED:
            raise ValueError(f"shared={shared}: dynamic shared memory must be in [0, {MAX_SHARED}] bytes")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {schedule!r}")
        if poison == "random":
            poison_code = 256
        elif poison is None or poison is False:
            poison_code = -1
        elif isinstance(poison, int) and 0 <= poison <= 255:
            poison_code = int(poison)
        else:
            raise ValueError(f"poison must be 'random', a byte value or None, got {poison!r}")
        if len(args) != len(k.params):
            sig = ", ".join(p.describe() for p in k.params)
            raise TypeError(f"{name} takes {len(k.params)} arguments ({sig}), got {len(args)}")
        guard = (not self.sanitize) if guard is None else guard
        keep: list[Any] = []
        argv = (ctypes.c_void_p * max(1, len(args)))()
        guarded: list[tuple[Param, int, np.ndarray, np.ndarray]] = []
        for j, (a, p) in enumerate(zip(args, k.params)):
            if p.pointer:
                ptr = self._pointer(name, j, p, a, guard, guarded)
                cell = np.array([ptr], dtype=np.uintp)
            else:
                cell = _scalar(name, j, p, a)
            keep.append(cell)
            argv[j] = cell.ctypes.data
        err = ctypes.create_string_buffer(16384)
        gd, bd = (ctypes.c_uint * 3)(*g3), (ctypes.c_uint * 3)(*b3)
        rc = self._lib.gpuir_host_launch(k.index, gd, bd, int(shared), argv, SCHEDULES[schedule],
                                         int(seed) & (2**64 - 1), poison_code, float(timeout_s), err, len(err))
        problems = []
        for p, j, orig, buf in guarded:
            n = orig.nbytes
            bad = np.flatnonzero(np.concatenate([buf[:GUARD], buf[GUARD + n:]]) != GUARD_BYTE)
            if bad.size:
                off = np.where(bad < GUARD, bad - GUARD, bad - GUARD + n)
                problems.append(f"wrote {bad.size} byte(s) outside argument {j}, {p.describe()} of {n} bytes: "
                                f"bytes {_runs(off)} (relative to its start)")
            body = buf[GUARD:GUARD + n]
            if p.const:
                if not np.array_equal(body, orig.reshape(-1).view(np.uint8)):
                    problems.append(f"modified the const argument {j}, {p.describe()}")
            else:
                orig.reshape(-1).view(np.uint8)[...] = body
        if rc != 0:
            raise KernelError(f"{self.label}: {err.value.decode(errors='replace')}")
        if problems:
            raise KernelError(f"{self.label}: {name} " + "; ".join(problems))

    def _pointer(self, name, j, p, a, guard, guarded) -> int:
        if a is None:
            return 0
        what = f"{name}: argument {j}, {p.describe()}"
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{what}: expected a NumPy array or None, got {type(a).__name__}")
        if p.code == "P":
            raise TypeError(f"{what}: pointer-to-pointer parameters are not supported by the harness")
        if p.dtype is not None and a.dtype != p.dtype:
            raise TypeError(f"{what}: expected dtype {p.dtype}, got {a.dtype}")
        if p.dtype is None and p.code != "V0" and a.nbytes % int(p.code[1:]):
            raise TypeError(f"{what}: {a.nbytes} bytes is not a whole number of {p.code[1:]}-byte elements")
        if not a.flags.c_contiguous or not a.flags.aligned:
            raise TypeError(f"{what}: the array must be C-contiguous and aligned")
        if not p.const and not a.flags.writeable:
            raise TypeError(f"{what}: the kernel may write to it but the array is read-only")
        if not guard:
            return a.ctypes.data
        n = a.nbytes
        raw = np.empty(n + 2 * GUARD + 64, dtype=np.uint8)
        off = (-raw.ctypes.data) % 64
        buf = raw[off:off + n + 2 * GUARD]
        buf[:GUARD] = GUARD_BYTE
        buf[GUARD + n:] = GUARD_BYTE
        buf[GUARD:GUARD + n] = a.reshape(-1).view(np.uint8)
        guarded.append((p, j, a, buf))
        return buf.ctypes.data + GUARD


def _runs(x: np.ndarray) -> str:
    """Sorted ints as half-open runs: ``[-3, 0), [400, 404)``."""
    cuts = np.flatnonzero(np.diff(x) != 1) + 1
    return ", ".join(f"[{int(r[0])}, {int(r[-1]) + 1})" for r in np.split(x, cuts))


def _dims(v: Sequence[int] | int, what: str) -> tuple[int, int, int]:
    t = (int(v),) if np.isscalar(v) else tuple(int(x) for x in v)
    if not 1 <= len(t) <= 3 or min(t) < 1:
        raise ValueError(f"{what} must be 1 to 3 positive ints, got {v!r}")
    return (t + (1, 1))[:3]


def _scalar(name: str, j: int, p: Param, a: Any) -> np.ndarray:
    what = f"{name}: argument {j}, {p.describe()}"
    dt = p.dtype
    if dt is None:
        raise TypeError(f"{what}: the harness passes only arithmetic scalars by value")
    if isinstance(a, np.generic):
        if a.dtype != dt:
            raise TypeError(f"{what}: got numpy.{a.dtype.name}; pass numpy.{dt.name} "
                            "(CuPy would pass the value's bytes unconverted)")
        return np.array([a], dtype=dt)
    if isinstance(a, bool) or not isinstance(a, (int, float)):
        raise TypeError(f"{what}: expected a NumPy scalar or a Python number, got {type(a).__name__}")
    if isinstance(a, int):
        if dt.kind not in "iu":
            raise TypeError(f"{what}: got a Python int for a floating-point parameter")
        info = np.iinfo(dt)
        if not info.min <= a <= info.max:
            raise ValueError(f"{what}: {a} does not fit")
    elif dt.kind != "f":
        raise TypeError(f"{what}: got a Python float for an integer parameter")
    return np.array([a], dtype=dt)


# =============================================================================
# Sanitized runs
# =============================================================================
def sanitizer_env() -> dict[str, str] | None:
    """Environment for a Python process that can load ``sanitize=True`` builds, or None.

    The AddressSanitizer runtime must be the first library of the process, so it
    is preloaded (``LD_PRELOAD``); leak detection is off (CPython's own
    allocations would be reported).
    """
    cxx, _ = find_compiler()
    if cxx is None:
        return None
    r = subprocess.run([cxx, "-print-file-name=libasan.so"], capture_output=True, text=True, check=False)
    lib = r.stdout.strip()
    if r.returncode != 0 or not os.path.isabs(lib) or not os.path.exists(lib):
        return None
    env = dict(os.environ)
    env["LD_PRELOAD"] = lib
    env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=0:exitcode=23"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1:exitcode=23"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), str(REPO), env.get("PYTHONPATH", "")])
    return env


def run_sanitized(code: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    """Run Python ``code`` in a process that can load sanitized builds.

    ``from cuda_host import harness`` works in it. Returns the completed process
    (``returncode`` 23 and an ``AddressSanitizer`` / ``runtime error`` report in
    ``stderr`` when a sanitizer caught something).
    """
    env = sanitizer_env()
    if env is None:
        raise HostBuildError("the compiler has no AddressSanitizer runtime (libasan.so)")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
