"""Loading and compiling the CUDA kernels in ``kernels/*.cu``.

Each ``.cu`` file is read once as text, its ``#include "common.cuh"`` replaced
by the header's text (framed by ``#line`` directives so that compiler errors name
``kernels/common.cuh`` or ``kernels/<file>.cu`` and the right line), and compiled
as one ``cupy.RawModule(code=..., options=..., name_expressions=[...])`` per file:

* on first use (never at import), cached per device by :func:`functools.cache`
  keyed on the device id (see :func:`module`, :func:`kernel`);
* or, without any device, for an explicit architecture by :func:`compile_kernels`
  (NVRTC, falling back to ``nvcc -cubin``), which is what
  ``tests/test_kernels_compile.py`` runs for sm_80 and sm_90 on every test run.

Why not ``cupy.cuda.compiler.compile_using_nvrtc``: it asks the CUDA runtime for
the current device even when ``arch`` is given, so it fails on a machine with no
driver. ``cupy.cuda.nvrtc`` (the bare NVRTC bindings, loaded from the
``nvidia-cuda-nvrtc-cu12`` wheel or the CUDA toolkit) needs no device.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from typing import Any


def _kernel_dir() -> Path:
    """Where the ``.cu`` sources are: ``GPUIR_KERNEL_DIR``, else the repository's
    ``kernels/`` (source tree, editable install), else ``<prefix>/share/gpuir/kernels``
    (a wheel install ships them there as data files; ``<prefix>`` is the install
    scheme's data path)."""
    env = os.environ.get("GPUIR_KERNEL_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2] / "kernels"
    if repo.is_dir():
        return repo
    return Path(sysconfig.get_path("data")) / "share" / "gpuir" / "kernels"


#: Directory of the kernel sources (see :func:`_kernel_dir`).
KERNEL_DIR = _kernel_dir()

#: Fused scoring (``tile_score``, ``tile_dense``): threads per block and
#: documents per tile (one float32 accumulator slot each in shared memory).
TILE_THREADS = 256
TILE_DOCS = 4096
#: Forward-layout (haystack) scoring: threads per block, one per allowed document.
HAYSTACK_THREADS = 256
#: Final selection (``select_topk``, one block per row) and the largest k it
#: serves (its shared sort buffer holds next_pow2(k) keys); larger k takes the
#: sort path (``pack_candidates`` + a device sort + ``decode_keys``).
SELECT_THREADS = 512
SELECT_MAX_K = 4096
PACK_THREADS = 256

#: Kernel file -> the names to instantiate (templates spelled out).
NAME_EXPRESSIONS: dict[str, list[str]] = {
    "bm25_score.cu": [
        f"light_marks<{TILE_THREADS}, {TILE_DOCS}>",
        f"tile_bounds<{TILE_THREADS}, {TILE_DOCS}>",
        f"tile_score<{TILE_THREADS}, {TILE_DOCS}>",
        f"tile_list<{TILE_THREADS}>",
        f"tile_dense<{TILE_THREADS}, {TILE_DOCS}>",
        f"haystack_score<{HAYSTACK_THREADS}>",
    ],
    "topk.cu": [f"select_topk<{SELECT_THREADS}>", f"pack_candidates<{PACK_THREADS}>", "decode_keys"],
    # Session pooling (gpuir/dense/late_interaction.py, loaded through load_module).
    "segment_reduce.cu": ["segment_reduce<float>", "segment_reduce<double>"],
}

#: Options for every compile. --fmad=false keeps BM25 arithmetic rounding as
#: NumPy's float32 does (the kernels also use __fadd_rn/__fmul_rn explicitly).
OPTIONS: tuple[str, ...] = ("-std=c++17", "--fmad=false")

#: Options ``cupy.RawModule`` appends after ours on every compile
#: (``cupy/cuda/compiler.py``, ``_compile_with_cache_cuda``): ``-ftz=true``
#: flushes float32 subnormals to zero, and being last it overrides any
#: ``-ftz=false`` of ours. :func:`compile_kernels` adds them too, so the binaries
#: the tests compile are the ones that run. BM25 operands and results are not
#: subnormal for sane parameters (idf, tfc and their products stay above
#: ~1e-20 or are exactly 0), so this changes no result; it would only for
#: absurd ones such as k1 < 1e-30.
CUPY_IMPLICIT_OPTIONS: tuple[str, ...] = ("-ftz=true",)

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


def kernel_files() -> list[str]:
    """Names of the kernel files that are compiled (``*.cu`` in :data:`KERNEL_DIR`)."""
    files = sorted(p.name for p in KERNEL_DIR.glob("*.cu"))
    if not files:
        raise FileNotFoundError(
            f"no kernel sources in {KERNEL_DIR}: set GPUIR_KERNEL_DIR to the repository's kernels/ folder"
        )
    return files


def load_source(filename: str) -> str:
    """Source of ``kernels/<filename>`` with its local includes inlined.

    The result starts with ``#line 1 "kernels/<filename>"``; each inlined header
    is framed by ``#line 1 "kernels/<header>"`` and a ``#line`` back to the
    including file, so compiler messages name the real file and line.
    """
    path = KERNEL_DIR / filename
    if not path.is_file():
        raise FileNotFoundError(f"kernel file {path} not found (is GPUIR_KERNEL_DIR right?)")
    return _inline(path, seen=set())


def _inline(path: Path, seen: set[Path]) -> str:
    seen = seen | {path}
    out = [f'#line 1 "kernels/{path.name}"']
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        m = _INCLUDE.match(line)
        if m:
            inc = (path.parent / m.group(1)).resolve()
            if not inc.is_file():
                raise FileNotFoundError(f"kernels/{path.name}:{lineno}: included file {m.group(1)} not found")
            if inc in seen:
                raise ValueError(f"kernels/{path.name}:{lineno}: recursive include of {m.group(1)}")
            out.append(_inline(inc, seen))
            out.append(f'#line {lineno + 1} "kernels/{path.name}"')
        else:
            out.append(line)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------
# On a device: one RawModule per file, per device.
# ---------------------------------------------------------------------------
@functools.cache
def _module(filename: str, device_id: int, names: tuple[str, ...]) -> Any:
    import cupy

    with cupy.cuda.Device(device_id):
        mod = cupy.RawModule(code=load_source(filename), options=OPTIONS, name_expressions=list(names))
        mod.compile()  # compile now, so errors surface here and not at the first launch
    return mod


def load_module(
    filename: str, name_expressions: list[str] | None = None, device_id: int | None = None
) -> Any:
    """The compiled ``cupy.RawModule`` of ``kernels/<filename>`` for a device.

    Compiled on first use and cached per (file, device, names).

    Parameters
    ----------
    filename : str
        E.g. ``"bm25_score.cu"``.
    name_expressions : list of str, optional
        Default: ``NAME_EXPRESSIONS[filename]``.
    device_id : int, optional
        Default: the current CuPy device.
    """
    import cupy

    if device_id is None:
        device_id = cupy.cuda.Device().id
    names = tuple(name_expressions if name_expressions is not None else NAME_EXPRESSIONS.get(filename, ()))
    return _module(filename, int(device_id), names)


#: Alias of :func:`load_module`.
module = load_module


def kernel(filename: str, name: str, device_id: int | None = None) -> Any:
    """One ``cupy.RawKernel`` by its name expression, e.g. ``"topk_rows<512>"``."""
    if name not in NAME_EXPRESSIONS.get(filename, ()):
        raise KeyError(f"{name!r} is not instantiated in {filename}: add it to NAME_EXPRESSIONS")
    return load_module(filename, device_id=device_id).get_function(name)


# ---------------------------------------------------------------------------
# Without a device: compile for an explicit architecture.
# ---------------------------------------------------------------------------
class KernelCompileError(RuntimeError):
    """A kernel file does not compile; the message holds the compiler log."""


def _arch_number(arch: str) -> str:
    m = re.fullmatch(r"(?:sm_|compute_)?(\d{2,3})[a-z]?", str(arch).strip())
    if not m:
        raise ValueError(f"arch must look like 'sm_80', 'compute_90' or '90', got {arch!r}")
    return m.group(1)


def nvrtc_available() -> tuple[bool, str]:
    """Whether NVRTC can be loaded (no device needed), and its version or the reason."""
    try:
        from cupy.cuda import nvrtc

        major, minor = nvrtc.getVersion()
        return True, f"NVRTC {major}.{minor}"
    except Exception as e:  # noqa: BLE001 - CuPy missing, libnvrtc not found, ...
        return False, f"NVRTC cannot be loaded ({type(e).__name__}: {e})"


def _compile_nvrtc(filename: str, source: str, arch: str, ptx: bool) -> bytes:
    from cupy.cuda import nvrtc

    target = f"-arch={'compute' if ptx else 'sm'}_{arch}"
    prog = nvrtc.createProgram(source, filename, (), ())
    try:
        for expr in NAME_EXPRESSIONS.get(filename, ()):
            nvrtc.addNameExpression(prog, expr)
        try:
            nvrtc.compileProgram(prog, (*OPTIONS, target, *CUPY_IMPLICIT_OPTIONS))
        except nvrtc.NVRTCError as e:
            log = nvrtc.getProgramLog(prog)
            raise KernelCompileError(f"NVRTC failed on kernels/{filename} for {target}:\n{log}") from e
        for expr in NAME_EXPRESSIONS.get(filename, ()):
            nvrtc.getLoweredName(prog, expr)  # raises if an instantiation is missing
        return nvrtc.getPTX(prog) if ptx else nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def _nvcc() -> str | None:
    return shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc") if os.access(p, os.X_OK)), None
    )


def _compile_nvcc(filename: str, source: str, arch: str, ptx: bool) -> bytes:
    nvcc = _nvcc()
    if nvcc is None:
        raise KernelCompileError(
            "neither NVRTC nor nvcc is available: pip install nvidia-cuda-nvrtc-cu12 "
            "(or install the CUDA toolkit)"
        )
    # nvcc only emits a kernel template that is used: instantiate the name
    # expressions explicitly, as NVRTC's addNameExpression does.
    inst = []
    for i, expr in enumerate(NAME_EXPRESSIONS.get(filename, ())):
        if "<" in expr:
            inst.append(f"static void* const gpuir_inst_{i} = (void*)&{expr};")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / filename
        src.write_text(source + "\n" + "\n".join(inst) + "\n", encoding="utf-8")
        out = Path(tmp) / ("out.ptx" if ptx else "out.cubin")
        cmd = [nvcc, *OPTIONS, *CUPY_IMPLICIT_OPTIONS, f"-arch={'compute' if ptx else 'sm'}_{arch}",
               "-ptx" if ptx else "-cubin", "-o", str(out), str(src)]
        r = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if r.returncode != 0:
            raise KernelCompileError(f"nvcc failed on kernels/{filename} for sm_{arch}:\n{r.stderr}{r.stdout}")
        return out.read_bytes()


def compile_kernels(arch: str, ptx: bool = False, compiler: str = "auto") -> dict[str, bytes]:
    """Compile every kernel file for an explicit GPU architecture, without a device.

    Parameters
    ----------
    arch : str
        ``"sm_80"``, ``"sm_90"``, ``"compute_90"`` or just ``"90"``.
    ptx : bool
        Emit PTX (``-arch=compute_XX``) instead of a cubin (``-arch=sm_XX``).
    compiler : {"auto", "nvrtc", "nvcc"}
        "auto" uses NVRTC and falls back to nvcc when NVRTC cannot be loaded.

    Returns
    -------
    dict
        Kernel file name -> compiled bytes (cubin or PTX), host.

    Raises
    ------
    KernelCompileError
        A kernel does not compile (the message holds the compiler log), or no
        compiler is available.
    """
    if compiler not in ("auto", "nvrtc", "nvcc"):
        raise ValueError(f"compiler must be 'auto', 'nvrtc' or 'nvcc', got {compiler!r}")
    num = _arch_number(arch)
    use_nvrtc = compiler == "nvrtc" or (compiler == "auto" and nvrtc_available()[0])
    if compiler == "nvrtc" and not nvrtc_available()[0]:
        raise KernelCompileError(nvrtc_available()[1] + ": pip install nvidia-cuda-nvrtc-cu12")
    out = {}
    for f in kernel_files():
        src = load_source(f)
        out[f] = (_compile_nvrtc if use_nvrtc else _compile_nvcc)(f, src, num, ptx)
    return out


_PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\d+)'")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


def parse_ptxas_report(log: str) -> dict[str, dict[str, int]]:
    """``ptxas -v`` output -> {mangled kernel name: registers, barriers, smem, stack, spill_stores, spill_loads}."""
    out: dict[str, dict[str, int]] = {}
    cur = None
    for line in log.splitlines():
        m = _PTXAS_ENTRY.search(line)
        if m:
            cur = out.setdefault(m.group(1), {"registers": 0, "barriers": 0, "smem": 0, "stack": 0,
                                              "spill_stores": 0, "spill_loads": 0})
            continue
        if cur is None:
            continue
        m = _PTXAS_FRAME.search(line)
        if m:
            cur["stack"], cur["spill_stores"], cur["spill_loads"] = map(int, m.groups())
            continue
        m = _PTXAS_USED.search(line)
        if m:
            cur["registers"] = int(m.group(1))
            cur["barriers"] = int(m.group(2) or 0)
            cur["smem"] = int(m.group(3) or 0)
    return out


def resource_usage(arch: str, filenames: list[str] | None = None) -> dict[str, dict[str, dict[str, int]]]:
    """Registers, spills, stack and static shared memory of every instantiated kernel, without a device.

    Compiles with NVRTC (the compiler CuPy uses at run time) and ``-Xptxas=-v``,
    under the options CuPy really uses.

    Returns
    -------
    dict
        ``{file: {name expression: {"registers", "barriers", "smem", "stack",
        "spill_stores", "spill_loads"}}}`` (bytes, except registers/barriers).
    """
    from cupy.cuda import nvrtc

    num = _arch_number(arch)
    files = filenames if filenames is not None else [f for f in kernel_files() if f in NAME_EXPRESSIONS]
    report: dict[str, dict[str, dict[str, int]]] = {}
    for f in files:
        prog = nvrtc.createProgram(load_source(f), f, (), ())
        try:
            for expr in NAME_EXPRESSIONS[f]:
                nvrtc.addNameExpression(prog, expr)
            try:
                nvrtc.compileProgram(prog, (*OPTIONS, f"-arch=sm_{num}", *CUPY_IMPLICIT_OPTIONS, "-Xptxas=-v"))
            except nvrtc.NVRTCError as e:
                raise KernelCompileError(f"NVRTC failed on kernels/{f}:\n{nvrtc.getProgramLog(prog)}") from e
            parsed = parse_ptxas_report(nvrtc.getProgramLog(prog))
            report[f] = {expr: parsed[nvrtc.getLoweredName(prog, expr)] for expr in NAME_EXPRESSIONS[f]}
        finally:
            nvrtc.destroyProgram(prog)
    return report
