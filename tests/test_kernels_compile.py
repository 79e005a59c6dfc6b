"""Every kernel file compiles for sm_80 and sm_90, on every run, without a GPU.

Uses NVRTC through ``cupy.cuda.nvrtc`` (the nvidia-cuda-nvrtc-cu12 wheel), which
needs no device or driver; the nvcc fallback is checked too where nvcc exists.
A syntax error in any ``kernels/*.cu`` file fails ``test_compiles``; the
``broken`` tests show that a broken kernel is reported with its file and line.
"""

from __future__ import annotations

import shutil

import pytest

from gpuir.backends import kernels as K

ARCHS = ("sm_80", "sm_90")

pytestmark = pytest.mark.skipif(
    not K.nvrtc_available()[0] and K._nvcc() is None,
    reason="neither NVRTC nor nvcc available: pip install nvidia-cuda-nvrtc-cu12",
)


def _files():
    return K.kernel_files()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("filename", _files())
def test_compiles(filename, arch):
    src = K.load_source(filename)
    compile_fn = K._compile_nvrtc if K.nvrtc_available()[0] else K._compile_nvcc
    out = compile_fn(filename, src, arch.split("_")[1], False)
    assert isinstance(out, bytes) and len(out) > 1000
    assert out[:4] == b"\x7fELF"  # a cubin is an ELF image


def test_compile_kernels_covers_every_file():
    # Our own files must be in the registry, so their templates get instantiated.
    files = set(_files())
    assert {"bm25_score.cu", "topk.cu"} <= files
    assert {"bm25_score.cu", "topk.cu"} <= set(K.NAME_EXPRESSIONS)
    out = K.compile_kernels("compute_90", ptx=True)
    assert set(out) == files
    assert all(b".target sm_90" in v for v in out.values())


def test_ptx_output():
    src = K.load_source("topk.cu")
    ptx = K._compile_nvrtc("topk.cu", src, "80", True) if K.nvrtc_available()[0] else \
        K._compile_nvcc("topk.cu", src, "80", True)
    text = ptx.decode(errors="replace")
    assert ".target sm_80" in text and "select_topk" in text


def test_source_has_line_directives_and_inlines_header():
    src = K.load_source("bm25_score.cu")
    assert src.startswith('#line 1 "kernels/bm25_score.cu"')
    assert '#line 1 "kernels/common.cuh"' in src
    assert not any(ln.lstrip().startswith("#include") for ln in src.splitlines())
    assert "float_to_ordered" in src  # from the header


@pytest.mark.skipif(K._nvcc() is None, reason="nvcc not installed")
def test_nvcc_fallback_compiles():
    src = K.load_source("topk.cu")
    out = K._compile_nvcc("topk.cu", src, "90", False)
    assert out[:4] == b"\x7fELF"


def _broken_dir(tmp_path, filename, bad_line):
    d = tmp_path / "kernels"
    d.mkdir()
    for p in K.KERNEL_DIR.iterdir():
        if p.suffix in (".cu", ".cuh"):
            shutil.copy(p, d / p.name)
    lines = (d / filename).read_text().splitlines()
    # Break the first line of code after the include (a real statement).
    idx = next(i for i, ln in enumerate(lines) if ln.startswith(("template", "__global__")))
    lines.insert(idx, bad_line)
    (d / filename).write_text("\n".join(lines) + "\n")
    return d, idx + 1


@pytest.mark.parametrize("compiler", ["nvrtc", "nvcc"])
def test_broken_kernel_fails_with_file_and_line(tmp_path, monkeypatch, compiler):
    if compiler == "nvrtc" and not K.nvrtc_available()[0]:
        pytest.skip("NVRTC not available")
    if compiler == "nvcc" and K._nvcc() is None:
        pytest.skip("nvcc not installed")
    d, lineno = _broken_dir(tmp_path, "topk.cu", "int this is not C++;")
    monkeypatch.setattr(K, "KERNEL_DIR", d)
    fn = K._compile_nvrtc if compiler == "nvrtc" else K._compile_nvcc
    with pytest.raises(K.KernelCompileError) as ei:
        fn("topk.cu", K.load_source("topk.cu"), "80", False)
    msg = str(ei.value)
    assert "kernels/topk.cu" in msg
    assert f"({lineno})" in msg or f":{lineno}:" in msg or f"({lineno}):" in msg


def test_broken_kernel_fails_compile_kernels(tmp_path, monkeypatch):
    d, _ = _broken_dir(tmp_path, "bm25_score.cu", "__global__ void oops( { }")
    monkeypatch.setattr(K, "KERNEL_DIR", d)
    with pytest.raises(K.KernelCompileError, match="bm25_score.cu"):
        K.compile_kernels("sm_80")


def test_missing_instantiation_fails(monkeypatch):
    if not K.nvrtc_available()[0]:
        pytest.skip("NVRTC not available")
    names = dict(K.NAME_EXPRESSIONS)
    names["topk.cu"] = [*names["topk.cu"], "select_topk<100>"]  # 2048 % 100 != 0: static_assert
    monkeypatch.setattr(K, "NAME_EXPRESSIONS", names)
    with pytest.raises(K.KernelCompileError):
        K._compile_nvrtc("topk.cu", K.load_source("topk.cu"), "80", False)


def test_bad_arch_message():
    with pytest.raises(ValueError, match="sm_80"):
        K.compile_kernels("ampere")


@pytest.mark.parametrize("filename", ["bm25_score.cu", "topk.cu"])
def test_no_fma_contraction_in_ptx(filename):
    """Float arithmetic stays separate round-to-nearest ops (as NumPy's float32), under
    the options CuPy really compiles with (ours plus its implicit -ftz=true)."""
    import re

    src = K.load_source(filename)
    fn = K._compile_nvrtc if K.nvrtc_available()[0] else K._compile_nvcc
    ptx = fn(filename, src, "90", True).decode(errors="replace")
    assert not re.search(r"\b(fma|mad)\.[a-z0-9.]*f32", ptx), "a float multiply-add was contracted"
    ops = re.findall(r"^\s*(?:@%p\d+\s+)?((?:add|sub|mul|div|rcp)\.[a-z0-9.]*f32)", ptx, flags=re.MULTILINE)
    if filename == "bm25_score.cu":
        assert any(op.startswith("add.rn") for op in ops) and any(op.startswith("mul.rn") for op in ops)
        # Weights are computed per search: the one approximate operation is the float reciprocal
        # estimate that common.cuh's recip_f64 refines in double (div_rn is then exact, tested
        # against IEEE division); no div.rn.f32, whose slow-path call spills registers.
        approx = {op for op in ops if ".rn" not in op}
        assert approx <= {"div.approx.ftz.f32", "div.approx.f32", "div.full.ftz.f32"}, sorted(approx)
        assert not any(op.startswith("div.rn") for op in ops), sorted(set(ops))
        return
    assert all(".rn" in op for op in ops), sorted(set(ops))


def test_fmad_false_reaches_both_compilers(monkeypatch):
    assert "--fmad=false" in K.OPTIONS
    seen = {}

    class R:
        returncode = 1
        stderr = stdout = "stop"

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        return R()

    monkeypatch.setattr(K.subprocess, "run", fake_run)
    monkeypatch.setattr(K, "_nvcc", lambda: "/usr/bin/nvcc")
    with pytest.raises(K.KernelCompileError):
        K._compile_nvcc("topk.cu", "x", "80", False)
    assert "--fmad=false" in seen["cmd"] and "-ftz=true" in seen["cmd"]


def test_kernel_sources_travel_with_a_wheel(tmp_path):
    """A non-editable install finds the kernels: the wheel carries them as data files."""
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(repo), "-w", str(tmp_path)],
        capture_output=True, text=True, check=False,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {r.stderr[-300:]}")
    (whl,) = tmp_path.glob("gpuir-*.whl")
    names = {Path(n).name for n in zipfile.ZipFile(whl).namelist() if "/share/gpuir/kernels/" in n}
    expected = {p.name for p in (repo / "kernels").iterdir() if p.suffix in (".cu", ".cuh")}
    assert expected and names == expected


def test_kernel_dir_override(monkeypatch, tmp_path):
    from gpuir.backends import kernels as K

    monkeypatch.setenv("GPUIR_KERNEL_DIR", str(tmp_path))
    assert K._kernel_dir() == tmp_path
    monkeypatch.delenv("GPUIR_KERNEL_DIR")
    assert (K._kernel_dir() / "topk.cu").is_file()


# ---------------------------------------------------------------------------
# Resource report (ptxas -v through NVRTC, the compiler CuPy uses at run time)
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module", params=ARCHS)
def resources(request):
    if not K.nvrtc_available()[0]:
        pytest.skip("NVRTC not available")
    return request.param, K.resource_usage(request.param)


def test_no_spills_and_resources_fit(resources):
    """Every kernel: no spills, no stack, registers and static shared memory that let its blocks run."""
    from gpuir.backends.kernel_model import STATIC_SMEM, template_args

    arch, rep = resources
    seen = set()
    for kernels in rep.values():
        for name, r in kernels.items():
            seen.add(name)
            assert r["spill_stores"] == 0 and r["spill_loads"] == 0, (arch, name, r)
            assert r["stack"] == 0, (arch, name, r)
            threads = (template_args(name) or [256])[0]
            if not name.startswith("segment_reduce"):
                assert r["registers"] * threads <= 65536, (arch, name, r)  # one block fits an SM's registers
            assert r["smem"] <= 48 * 1024, (arch, name, r)
    assert set(K.NAME_EXPRESSIONS["bm25_score.cu"]) | set(K.NAME_EXPRESSIONS["topk.cu"]) <= seen
    # The fake cupy's launch check budgets select_topk's static shared memory: keep it true.
    assert rep["topk.cu"][f"select_topk<{K.SELECT_THREADS}>"]["smem"] == STATIC_SMEM["select_topk"]
    # tile_score keeps at least 2 blocks per SM by registers and 4 by shared memory (228 KiB on sm_90/sm_80 ~164).
    ts = rep["bm25_score.cu"][f"tile_score<{K.TILE_THREADS}, {K.TILE_DOCS}>"]
    assert ts["registers"] * K.TILE_THREADS * 2 <= 65536
    assert 4 * ts["smem"] <= 164 * 1024


def test_ptxas_report_parser():
    log = """ptxas info    : Compiling entry function '_Z3fooi' for 'sm_90'
ptxas info    : Function properties for _Z3fooi
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function '_Z3bari' for 'sm_90'
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers
"""
    r = K.parse_ptxas_report(log)
    assert r["_Z3fooi"] == {"registers": 255, "barriers": 1, "smem": 1024, "stack": 8,
                            "spill_stores": 4, "spill_loads": 12}
    assert r["_Z3bari"]["registers"] == 10 and r["_Z3bari"]["smem"] == 0
