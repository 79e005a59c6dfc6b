"""Backend selection without a GPU: explicit cupy fails with the fix, auto picks the CPU scorer and says why."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpuir._compat import cuda_device
from gpuir.backends import make_scorer, numba_available, resolve_backend

NO_GPU = not cuda_device()[0]
needs_no_gpu = pytest.mark.skipif(not NO_GPU, reason="this machine has a usable GPU")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("GPUIR_BACKEND", raising=False)


@pytest.fixture
def tiny_index():
    from gpuir.engine import BM25Index

    return BM25Index.build(["alpha beta", "beta gamma", "gamma delta alpha"], progress=False)


@needs_no_gpu
def test_explicit_cupy_without_device_says_the_fix():
    with pytest.raises(ValueError) as ei:
        resolve_backend("cupy")
    msg = str(ei.value)
    assert "cupy" in msg and "gpuir[gpu]" in msg and "numpy" in msg


@needs_no_gpu
def test_search_with_cupy_without_device_raises(tiny_index):
    with pytest.raises(ValueError, match="gpuir\\[gpu\\]"):
        tiny_index.search("alpha", k=2, backend="cupy")


@needs_no_gpu
def test_cupy_scorer_constructor_without_device_says_the_fix(tiny_index):
    with pytest.raises(RuntimeError, match="backend='numpy'"):
        make_scorer("cupy", tiny_index.csr, tiny_index.params)


@needs_no_gpu
def test_auto_picks_the_cpu_scorer_and_says_why(tiny_index):
    name, reason = resolve_backend("auto")
    # the compiled scorer when numba imports, else the NumPy one
    assert name == ("numba" if numba_available()[0] else "numpy")
    assert name in reason or "NumPy" in reason
    assert "no GPU" in reason or "no CUDA" in reason or "GPUIR_DISABLE_GPU" in reason
    res = tiny_index.search("alpha", k=2)
    assert res.meta["backend"] == name
    assert res.meta["backend_reason"] == reason


def test_a_memorys_auto_takes_the_compiled_engine_even_with_a_gpu(monkeypatch):
    """On a GPU machine the static index's auto is the GPU, a memory's is numba (measured faster there:
    docs/gpu.md); cupy stays the memory's when asked for, through GPUIR_BACKEND, or without numba."""
    from gpuir import Memory, backends
    from gpuir.backends import resolve_memory_backend

    pytest.importorskip("numba")
    monkeypatch.delenv("GPUIR_BACKEND", raising=False)
    monkeypatch.setattr(backends, "cuda_device", lambda: (True, "CUDA device 0: a test GPU"))
    assert resolve_backend("auto")[0] == "cupy"
    name, reason = resolve_memory_backend("auto")
    assert name == "numba" and "not the GPU" in reason and "a test GPU" in reason
    assert resolve_memory_backend(None)[0] == "numba"
    assert resolve_memory_backend("cupy")[0] == "cupy" and resolve_memory_backend("numpy")[0] == "numpy"
    m = Memory()
    m.add([{"id": "a", "text": "support group"}, {"id": "b", "text": "group"}])
    res = m.search("support group")
    assert res.meta["backend"] == "numba" and res.meta["backend_reason"] == reason and res.ids(0) == ["a", "b"]
    monkeypatch.setenv("GPUIR_BACKEND", "cupy")
    assert resolve_memory_backend("auto")[0] == "cupy"
    monkeypatch.delenv("GPUIR_BACKEND")
    monkeypatch.setattr(backends, "numba_available", lambda: (False, "numba is not installed (test)"))
    assert resolve_memory_backend("auto")[0] == "cupy"
    monkeypatch.setattr(backends, "cuda_device", lambda: (False, "no GPU (test)"))
    assert resolve_memory_backend("auto")[0] == "numpy"


def test_env_override_numpy(monkeypatch, tiny_index):
    monkeypatch.setenv("GPUIR_BACKEND", "numpy")
    name, reason = resolve_backend("auto")
    assert name == "numpy" and "GPUIR_BACKEND" in reason
    assert tiny_index.search("alpha", k=2).meta["backend"] == "numpy"


@needs_no_gpu
def test_env_override_cupy_without_device(monkeypatch):
    monkeypatch.setenv("GPUIR_BACKEND", "cupy")
    with pytest.raises(ValueError, match="GPUIR_BACKEND"):
        resolve_backend("auto")
    # An explicit argument wins over the environment.
    assert resolve_backend("numpy")[0] == "numpy"


def test_env_override_unknown(monkeypatch):
    monkeypatch.setenv("GPUIR_BACKEND", "tpu")
    with pytest.raises(ValueError, match="auto, numpy, numba, cupy"):
        resolve_backend("auto")


def test_unknown_backend_argument():
    with pytest.raises(ValueError, match="choose one of"):
        resolve_backend("cuda")


def test_gpu_report_never_raises():
    from gpuir.gpu_info import gpu_report

    rep = gpu_report()
    assert isinstance(rep["usable"], bool) and rep["reason"]
    assert isinstance(rep["gpu_path"]["verified"], bool) and "gpu_verify.py" in rep["gpu_path"]["status"]
    assert "nvml" in rep and isinstance(rep["nvml"]["available"], bool)
    if not rep["nvml"]["available"]:
        assert rep["nvml"]["reason"]


def test_the_gpu_path_is_called_verified_only_for_the_sources_that_ran():
    """`gpuir info` calls the GPU path verified only while the kernels and their host code are the ones the
    committed device run exercised: changing any of them fails here until a new run is committed (or the
    flag is set back to False), and the runs the status names are in bench/results/."""
    import re
    from pathlib import Path

    from gpuir import gpu_info

    root = Path(__file__).resolve().parents[1]
    status = gpu_info.GPU_PATH_STATUS
    for stem in re.findall(r"bench/results/(gpu_verify_[A-Za-z0-9_]+)", status):
        assert list((root / "bench" / "results").glob(stem + "*.jsonl")), f"{stem} is named but not committed"
    if gpu_info.GPU_PATH_VERIFIED:
        assert status.startswith("VERIFIED")
        (run,) = re.findall(r"bench/results/(gpu_verify_[A-Za-z0-9_]+)\.\*", status)
        res = [json.loads(line) for line in (root / "bench" / "results" / f"{run}.jsonl").read_text().splitlines()]
        done = {e["step"]: e["result"] for e in res if e.get("done")}
        for step in ("tests", "timings_small", "scale", "racecheck", "memcheck", "synccheck", "initcheck"):
            assert done[step]["ok"], f"{run}: step {step} did not pass"
        assert gpu_info.sources_sha256(root) == gpu_info.VERIFIED_SOURCES_SHA256, (
            "kernels/ or the CuPy backend changed since the verified device run: run bench/gpu_verify.py on a GPU "
            "and commit its files, or set GPU_PATH_VERIFIED = False and say what has not run")
    else:
        assert not status.startswith("VERIFIED")


@needs_no_gpu
def test_parity_cli_exits_2_without_gpu(tmp_path, tiny_index, capsys):
    from gpuir.cli import main

    tiny_index.save(tmp_path / "idx")
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": "1", "text": "alpha"}\n')
    assert main(["parity", str(tmp_path / "idx"), "--queries", str(q)]) == 2
    assert "no GPU" in capsys.readouterr().err


@needs_no_gpu
def test_parity_report_raises_without_gpu(tiny_index):
    from gpuir.parity import NoGPUError, parity_report

    with pytest.raises(NoGPUError, match="GPU"):
        parity_report(tiny_index, ["alpha"], k=2)


def test_topk_agree_is_tie_aware():
    from gpuir.parity import topk_agree

    s = np.array([[3.0, 2.0, 1.0]], np.float32)
    # Same top-k except documents tied at the k-th score: agree.
    assert topk_agree(np.array([[5, 7, 9]]), s, np.array([[5, 7, 8]]), s)[0]
    # A difference above the k-th score: disagree.
    assert not topk_agree(np.array([[5, 7, 9]]), s, np.array([[5, 6, 9]]), s)[0]
    # Different numbers of hits: disagree.
    ids2 = np.array([[5, 7, -1]])
    s2 = np.array([[3.0, 2.0, -np.inf]], np.float32)
    assert not topk_agree(np.array([[5, 7, 9]]), s, ids2, s2)[0]
    # Scores off by more than float32 tolerance: disagree.
    assert not topk_agree(np.array([[5, 7, 9]]), s, np.array([[5, 7, 9]]), s + 0.01)[0]
    # Float32 rounding: agree.
    assert topk_agree(np.array([[5, 7, 9]]), s, np.array([[5, 7, 9]]), s * np.float32(1 + 1e-7))[0]


def test_auto_without_a_driver_does_not_import_cupy():
    """On a Linux machine without the NVIDIA driver, resolving "auto" never imports CuPy (0.2-0.4 s saved on
    every fresh process's first search): the driver library is asked first."""
    import subprocess
    import sys

    from gpuir._compat import no_driver_library

    if not no_driver_library():
        pytest.skip("this machine has the NVIDIA driver library")
    code = ("import sys; from gpuir.backends import resolve_backend; name, why = resolve_backend('auto'); "
            "print(name, 'cupy' in sys.modules, why)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    name, imported, why = out.stdout.split(" ", 2)
    assert name in ("numba", "numpy")
    assert imported == "False", "CuPy was imported to find that there is no driver"
    assert "libcuda.so.1" in why or "CuPy is not installed" in why
