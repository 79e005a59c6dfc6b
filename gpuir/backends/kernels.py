"""Loading and compiling the CUDA kernels in ``kernels/*.cu``.

Each ``.cu`` file is read once as text, its ``#include "common.cuh"`` replaced
by the header's text (framed by ``#line`` directives so that compiler errors name
``kernels/common.cuh`` or ``kernels/<file>.cu`` and the right line), and compiled
as one ``cupy.RawModule(code=..., options=..., name_expressions=[...])`` per file:

* on first use (never at import), cached per device by :func:`functools.cache`
  keyed on the device id (see :func:`module`, :func:`kernel`);
* or, without any device, for an explicit architecture by :func:`compile_kernels`
  (NVRTC, falling back to ``nvcc -cubin``), which is what
  ``tests/test_kernels_compile.py`` runs for sm_80 and sm_90 on every test run,
  with each NVRTC of :data:`NVRTC_MAJORS` (CUDA 12 and 13: their register
  allocators differ) and with nvcc; :func:`resource_usage` reports registers,
  spills, stack and shared memory (``python -m gpuir.backends.kernels`` prints
  the table of docs/gpu.md).

Why not ``cupy.cuda.compiler.compile_using_nvrtc``: it asks the CUDA runtime for
the current device even when ``arch`` is given, so it fails on a machine with no
driver. ``cupy.cuda.nvrtc`` (the bare NVRTC bindings) needs no device, but binds
the one NVRTC CuPy loaded; ``nvrtc=12`` / ``nvrtc=13`` name a CUDA major and
load that ``libnvrtc.so.<major>`` itself (:mod:`gpuir.backends.nvrtc`).
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
#: Tiles per row scored first (``seed_tiles``; kernels/bm25_score.cu GPUIR_SEEDS).
SEED_TILES = 16
SELECT_THREADS = 512
SELECT_MAX_K = 4096
PACK_THREADS = 256
#: The design card's scatter kernels (kernels/scatter.cu): threads per block.
SCATTER_THREADS = 256

#: Kernel file -> the names to instantiate (templates spelled out).
NAME_EXPRESSIONS: dict[str, list[str]] = {
    "bm25_score.cu": [
        f"light_marks<{TILE_THREADS}, {TILE_DOCS}>",
        f"tile_bounds<{TILE_THREADS}, {TILE_DOCS}>",
        f"seed_tiles<{TILE_THREADS}>",
        f"sub_plan<{TILE_THREADS}, {TILE_DOCS}>",
        f"sub_score<{TILE_THREADS}, {TILE_DOCS}>",
        "seed_theta",
        f"tile_list<{TILE_THREADS}>",
        f"tile_dense<{TILE_THREADS}, {TILE_DOCS}>",
        f"haystack_score<{HAYSTACK_THREADS}>",
    ],
    "topk.cu": [f"select_topk<{SELECT_THREADS}>", f"pack_candidates<{PACK_THREADS}>", "decode_keys"],
    # The batched term-at-a-time scatter (gpuir/backends/cupy_scatter.py).
    "scatter.cu": [f"scatter_round<{SCATTER_THREADS}>", f"scatter_clip<{SCATTER_THREADS}>",
                   f"scatter_keys<{SCATTER_THREADS}>"],
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

#: The NVRTC major versions every kernel is compiled and resource-checked with,
#: without a device, on every test run: 12 (PyPI ``nvidia-cuda-nvrtc-cu12``) and
#: 13 (PyPI ``nvidia-cuda-nvrtc`` 13.x, the GPU machine's toolchain). ptxas
#: (inside NVRTC) allocates registers differently from one to the other.
NVRTC_MAJORS: tuple[int, ...] = (12, 13)

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
        try:
            mod.compile()  # compile now, so errors surface here and not at the first launch
        except Exception as e:
            note = toolchain_mismatch(*_cupy_nvrtc_and_driver())
            if note:
                raise KernelCompileError(f"kernels/{filename} failed to compile or load: {e}. {note}") from e
            raise
    return mod


def _cupy_nvrtc_and_driver() -> tuple[int | None, int | None]:
    """(CuPy's NVRTC major, the driver's CUDA version as 12040 etc.), None where unknown."""
    try:
        from cupy.cuda import nvrtc, runtime
    except ImportError:
        return None, None
    try:
        major = int(nvrtc.getVersion()[0])
    except Exception:  # noqa: BLE001 - libnvrtc not loadable
        major = None
    try:
        driver = int(runtime.driverGetVersion())
    except Exception:  # noqa: BLE001 - no driver
        driver = None
    return major, driver


def toolchain_mismatch(nvrtc_major: int | None, driver_version: int | None) -> str | None:
    """Why a kernel may not load: CuPy's NVRTC is newer than the driver's CUDA, else None.

    CuPy finds NVRTC through cuda-pathfinder, which prefers ``libnvrtc.so.13``
    when several are installed: with the ``dev`` extra (the CUDA 13 NVRTC for the
    compile checks) beside ``gpu`` (cupy-cuda12x), CuPy compiles with NVRTC 13,
    whose output a CUDA 12 driver may refuse.

    Parameters
    ----------
    nvrtc_major : int or None
        The major version of the NVRTC CuPy loaded.
    driver_version : int or None
        ``cudaDriverGetVersion``, e.g. 12040 for CUDA 12.4.
    """
    if nvrtc_major is None or not driver_version:
        return None
    if nvrtc_major <= driver_version // 1000:
        return None
    return (f"CuPy compiles with NVRTC {nvrtc_major} but the driver supports CUDA "
            f"{driver_version // 1000}.{driver_version % 1000 // 10}: on this machine uninstall the CUDA "
            f"{nvrtc_major} NVRTC (pip uninstall nvidia-cuda-nvrtc; the dev extra installs it for the "
            f"compile checks) so that CuPy finds its own, or update the driver")


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


def nvrtc_available(major: int | None = None) -> tuple[bool, str]:
    """Whether NVRTC can be loaded (no device needed), and its version or the reason.

    Parameters
    ----------
    major : int, optional
        A CUDA major version (12, 13): that ``libnvrtc.so.<major>``, loaded by
        :mod:`gpuir.backends.nvrtc`. Default: the NVRTC CuPy uses
        (``cupy.cuda.nvrtc``).
    """
    if major is not None:
        from . import nvrtc as _nvrtc

        return _nvrtc.available(int(major))
    try:
        from cupy.cuda import nvrtc

        major, minor = nvrtc.getVersion()
        return True, f"NVRTC {major}.{minor}"
    except Exception as e:  # noqa: BLE001 - CuPy missing, libnvrtc not found, ...
        return False, f"NVRTC cannot be loaded ({type(e).__name__}: {e})"


def _nvrtc_lib(major: int) -> Any:
    from . import nvrtc as _nvrtc

    try:
        return _nvrtc.load(int(major))
    except OSError as e:
        raise KernelCompileError(str(e)) from e


def _compile_with(filename: str, source: str, options: tuple[str, ...], ptx: bool,
                  nvrtc: int | None) -> tuple[bytes, str, dict[str, str]]:
    """One NVRTC compile of a kernel file -> (cubin or PTX, log, {name expression: lowered name}).

    ``nvrtc=None`` compiles with CuPy's NVRTC binding, else with ``libnvrtc.so.<nvrtc>``.
    """
    names = list(NAME_EXPRESSIONS.get(filename, ()))
    target = next((o for o in options if o.startswith("-arch=")), "")
    if nvrtc is not None:
        from .nvrtc import NVRTCError

        lib = _nvrtc_lib(nvrtc)
        try:
            return lib.compile(source, filename, options, names, ptx=ptx)
        except NVRTCError as e:
            ver = f"{lib.version[0]}.{lib.version[1]}"
            raise KernelCompileError(f"NVRTC {ver} failed on kernels/{filename} for {target} ({e}):\n{e.log}") from e
    from cupy.cuda import nvrtc as cnv

    prog = cnv.createProgram(source, filename, (), ())
    try:
        for expr in names:
            cnv.addNameExpression(prog, expr)
        try:
            cnv.compileProgram(prog, options)
        except cnv.NVRTCError as e:
            raise KernelCompileError(
                f"NVRTC failed on kernels/{filename} for {target}:\n{cnv.getProgramLog(prog)}") from e
        try:
            lowered = {expr: cnv.getLoweredName(prog, expr) for expr in names}
        except cnv.NVRTCError as e:  # an instantiation is missing
            raise KernelCompileError(f"kernels/{filename}: {e}\n{cnv.getProgramLog(prog)}") from e
        log_text = cnv.getProgramLog(prog)
        return (cnv.getPTX(prog) if ptx else cnv.getCUBIN(prog)), log_text, lowered
    finally:
        cnv.destroyProgram(prog)


def _compile_nvrtc(filename: str, source: str, arch: str, ptx: bool, nvrtc: int | None = None) -> bytes:
    """``source`` (kernels/<filename>, includes inlined) -> cubin or PTX for ``sm_<arch>``, with NVRTC.

    ``nvrtc``: a CUDA major (12, 13) to compile with that NVRTC; default CuPy's.
    """
    target = f"-arch={'compute' if ptx else 'sm'}_{arch}"
    out, _, _ = _compile_with(filename, source, (*OPTIONS, target, *CUPY_IMPLICIT_OPTIONS), ptx, nvrtc)
    return out


def _nvcc() -> str | None:
    return shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc") if os.access(p, os.X_OK)), None
    )


def _run_nvcc(filename: str, source: str, arch: str, ptx: bool, extra: tuple[str, ...] = ()) -> tuple[bytes, str]:
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
               "-ptx" if ptx else "-cubin", *extra, "-o", str(out), str(src)]
        r = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if r.returncode != 0:
            raise KernelCompileError(f"nvcc failed on kernels/{filename} for sm_{arch}:\n{r.stderr}{r.stdout}")
        return out.read_bytes(), r.stderr + r.stdout


def _compile_nvcc(filename: str, source: str, arch: str, ptx: bool) -> bytes:
    return _run_nvcc(filename, source, arch, ptx)[0]


def nvcc_version() -> str | None:
    """``"13.0"`` for the nvcc on PATH, or None without one."""
    nvcc = _nvcc()
    if nvcc is None:
        return None
    r = subprocess.run([nvcc, "--version"], check=False, capture_output=True, text=True)
    m = re.search(r"release (\d+\.\d+)", r.stdout)
    return m.group(1) if m else None


def compile_kernels(arch: str, ptx: bool = False, compiler: str = "auto",
                    nvrtc: int | None = None) -> dict[str, bytes]:
    """Compile every kernel file for an explicit GPU architecture, without a device.

    Parameters
    ----------
    arch : str
        ``"sm_80"``, ``"sm_90"``, ``"compute_90"`` or just ``"90"``.
    ptx : bool
        Emit PTX (``-arch=compute_XX``) instead of a cubin (``-arch=sm_XX``).
    compiler : {"auto", "nvrtc", "nvcc"}
        "auto" uses NVRTC and falls back to nvcc when NVRTC cannot be loaded.
    nvrtc : int, optional
        The CUDA major version of the NVRTC to use (12, 13; see
        :data:`NVRTC_MAJORS`). Default: CuPy's NVRTC.

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
    if nvrtc is not None and compiler == "nvcc":
        raise ValueError("nvrtc= names an NVRTC version: it does not apply to compiler='nvcc'")
    num = _arch_number(arch)
    ok, why = nvrtc_available(nvrtc)
    use_nvrtc = compiler == "nvrtc" or nvrtc is not None or (compiler == "auto" and ok)
    if use_nvrtc and not ok:
        raise KernelCompileError(why if nvrtc is not None else why + ": pip install nvidia-cuda-nvrtc-cu12")
    out = {}
    for f in kernel_files():
        src = load_source(f)
        out[f] = _compile_nvrtc(f, src, num, ptx, nvrtc) if use_nvrtc else _compile_nvcc(f, src, num, ptx)
    return out


_PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\d+)'")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_BARRIERS = re.compile(r"used (\d+) barriers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_report(log: str) -> dict[str, dict[str, int]]:
    """``ptxas -v`` output -> {mangled kernel name: registers, barriers, smem, stack, spill_stores, spill_loads}.

    The "Used" line's fields are read one by one: ptxas puts "N bytes
    cumulative stack size" between the barriers and the shared memory when a
    kernel has a stack frame.
    """
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
            b, sm = _PTXAS_BARRIERS.search(line), _PTXAS_SMEM.search(line)
            cur["barriers"] = int(b.group(1)) if b else 0
            cur["smem"] = int(sm.group(1)) if sm else 0
    return out


_MANGLED_TYPES = {"float": "f", "double": "d", "int": "i", "unsigned int": "j", "long long": "x",
                  "unsigned long long": "y"}


def _mangled_prefix(expr: str) -> str:
    """Start of the Itanium-mangled name of a kernel name expression: ``"tile_score<256, 4096>"`` ->
    ``"_Z10tile_scoreILi256ELi4096EE"``, ``"decode_keys"`` -> ``"_Z11decode_keys"`` (for nvcc's
    report, which has no lowered-name lookup)."""
    m = re.fullmatch(r"\s*(\w+)\s*(?:<(.*)>)?\s*", expr)
    if not m:
        raise ValueError(f"cannot mangle {expr!r}")
    name, args = m.group(1), m.group(2)
    out = f"_Z{len(name)}{name}"
    if args is None:
        return out
    parts = []
    for a in (x.strip() for x in args.split(",")):
        if re.fullmatch(r"-?\d+", a):
            parts.append(f"Li{a.replace('-', 'n')}E")
        elif a in _MANGLED_TYPES:
            parts.append(_MANGLED_TYPES[a])
        else:
            raise ValueError(f"cannot mangle the template argument {a!r} of {expr!r}")
    return f"{out}I{''.join(parts)}E"


#: Per-SM limits of the architectures the kernels are checked for (CUDA C Programming Guide, "Technical
#: Specifications per Compute Capability"): registers, register allocation unit (per warp), threads,
#: resident blocks, shared memory usable by blocks, shared memory the driver reserves per block.
SM_LIMITS: dict[str, dict[str, int]] = {
    "sm_80": {"regs": 65536, "reg_unit": 256, "threads": 2048, "blocks": 32, "smem": 164 * 1024, "smem_block": 1024},
    "sm_90": {"regs": 65536, "reg_unit": 256, "threads": 2048, "blocks": 32, "smem": 228 * 1024, "smem_block": 1024},
}


def blocks_per_sm(arch: str, registers: int, smem: int, threads: int) -> int:
    """Resident blocks per SM that a kernel's resources allow (what the occupancy calculator computes).

    Parameters
    ----------
    arch : str
        A key of :data:`SM_LIMITS`.
    registers, smem : int
        Registers per thread and static (+ dynamic) shared memory per block in bytes, as ptxas reports.
    threads : int
        Threads per block.

    Returns
    -------
    int
        min over the register, shared-memory, thread and block limits.
    """
    lim = SM_LIMITS[arch]
    warps = -(-threads // 32)
    per_warp = -(-max(1, registers) * 32 // lim["reg_unit"]) * lim["reg_unit"]
    by_regs = lim["regs"] // (per_warp * warps)
    by_smem = lim["smem"] // (smem + lim["smem_block"])
    return int(min(by_regs, by_smem, lim["threads"] // threads, lim["blocks"]))


def resource_usage(arch: str, filenames: list[str] | None = None, nvrtc: int | None = None,
                   compiler: str = "nvrtc") -> dict[str, dict[str, dict[str, int]]]:
    """Registers, spills, stack and static shared memory of every instantiated kernel, without a device.

    Compiles with ``-Xptxas=-v`` under the options CuPy really uses.

    Parameters
    ----------
    arch : str
        ``"sm_80"``, ``"sm_90"``, ...
    filenames : list of str, optional
        Default: every kernel file with name expressions.
    nvrtc : int, optional
        The CUDA major of the NVRTC to compile with (12, 13). Default: CuPy's
        NVRTC (the compiler ``cupy.RawModule`` uses at run time).
    compiler : {"nvrtc", "nvcc"}
        "nvcc": the nvcc on PATH (``-cubin -Xptxas -v``, the name expressions
        instantiated explicitly) instead of NVRTC.

    Returns
    -------
    dict
        ``{file: {name expression: {"registers", "barriers", "smem", "stack",
        "spill_stores", "spill_loads"}}}`` (bytes, except registers/barriers).

    Raises
    ------
    KernelCompileError
        A kernel does not compile, the compiler cannot be loaded, or a name
        expression is missing from the report.
    """
    if compiler not in ("nvrtc", "nvcc"):
        raise ValueError(f"compiler must be 'nvrtc' or 'nvcc', got {compiler!r}")
    num = _arch_number(arch)
    files = filenames if filenames is not None else [f for f in kernel_files() if f in NAME_EXPRESSIONS]
    report: dict[str, dict[str, dict[str, int]]] = {}
    for f in files:
        src = load_source(f)
        if compiler == "nvcc":
            _, text = _run_nvcc(f, src, num, False, ("-Xptxas", "-v"))
            parsed = parse_ptxas_report(text)
            lowered = {}
            for expr in NAME_EXPRESSIONS[f]:
                pre = _mangled_prefix(expr)
                hits = [k for k in parsed if k.startswith(pre) and ("<" in expr or not k[len(pre):].startswith("I"))]
                if len(hits) != 1:
                    raise KernelCompileError(f"nvcc's ptxas report of kernels/{f} has {len(hits)} entries for {expr}")
                lowered[expr] = hits[0]
        else:
            _, text, lowered = _compile_with(
                f, src, (*OPTIONS, f"-arch=sm_{num}", *CUPY_IMPLICIT_OPTIONS, "-Xptxas=-v"), False, nvrtc)
            parsed = parse_ptxas_report(text)
        try:
            report[f] = {expr: parsed[lowered[expr]] for expr in NAME_EXPRESSIONS[f]}
        except KeyError as e:
            raise KernelCompileError(f"no ptxas report for {e} in kernels/{f}:\n{text}") from e
    return report


def toolchains() -> list[tuple[str, dict[str, Any]]]:
    """The toolchains :func:`resource_table` measures: ``("NVRTC 12.9", {"nvrtc": 12})``, ...,
    ``("nvcc 13.0", {"compiler": "nvcc"})``; those that cannot be loaded are left out."""
    out = []
    for major in NVRTC_MAJORS:
        ok, _ = nvrtc_available(major)
        if ok:
            v = _nvrtc_lib(major).version
            out.append((f"NVRTC {v[0]}.{v[1]}", {"nvrtc": major}))
    v = nvcc_version()
    if v:
        out.append((f"nvcc {v}", {"compiler": "nvcc"}))
    return out


def resource_table(archs: tuple[str, ...] = ("sm_80", "sm_90")) -> str:
    """A markdown table of every instantiated kernel's resources, per architecture and toolchain.

    One row per (kernel, architecture); its static shared memory; then one
    column per toolchain of :func:`toolchains` holding "registers · stack
    frame (B) · spill stores / loads (B)". What docs/gpu.md shows;
    ``python -m gpuir.backends.kernels`` prints it.
    """
    chains = toolchains()
    measured = {(label, arch): resource_usage(arch, **kw) for label, kw in chains for arch in archs}
    rows = ["| kernel | arch | static smem (B) | " + " | ".join(label for label, _ in chains) + " |",
            "| --- | --- | ---: | " + " | ".join("---" for _ in chains) + " |"]
    for f in (f for f in kernel_files() if f in NAME_EXPRESSIONS):
        for expr in NAME_EXPRESSIONS[f]:
            for arch in archs:
                rs = [measured[label, arch][f][expr] for label, _ in chains]
                smem = " / ".join(dict.fromkeys(f"{r['smem']:,}" for r in rs))
                cells = [f"{r['registers']} · {r['stack']} · {r['spill_stores']} / {r['spill_loads']}" for r in rs]
                rows.append(f"| `{expr}` | {arch} | {smem} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m gpuir.backends.kernels
    print("registers · stack frame (B) · spill stores / loads (B), per toolchain (ptxas -v, CuPy's options)\n")
    print(resource_table())
