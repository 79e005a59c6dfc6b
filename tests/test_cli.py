"""The CLI: the documented forms, outputs, and exit codes (0 ok, 2 bad input, 1 internal)."""

import json
import subprocess
import sys

import pytest

from gpuir.cli import main


def run(*args):
    return subprocess.run([sys.executable, "-m", "gpuir", *map(str, args)], capture_output=True, text=True, check=False)


@pytest.fixture
def corpus(tmp_path):
    p = tmp_path / "corpus.jsonl"
    rows = [
        {"id": "d1", "text": "Alice booked a flight to Paris"},
        {"id": "d2", "text": "Bob fixed the login bug ERR-4412"},
        {"id": 3, "text": "Alice met Bob in Paris for dinner"},
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return p


@pytest.fixture
def index_dir(corpus, tmp_path):
    assert main(["index", str(corpus), str(tmp_path / "ix")]) == 0
    return tmp_path / "ix"


def test_index_and_search_jsonl(index_dir, capsys):
    assert main(["search", str(index_dir), "--query", "paris alice", "-k", "5"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    row = json.loads(lines[0])
    assert row["query_id"] == "0"
    assert [h["id"] for h in row["hits"]][:2] in (["d1", "3"], ["3", "d1"])
    assert all(isinstance(h["score"], float) for h in row["hits"])


def test_search_queries_file_trec(index_dir, tmp_path, capsys):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"id": "q1", "text": "login bug"}) + "\n" + json.dumps({"id": 2, "text": "the"}) + "\n")
    assert main(["search", str(index_dir), "--queries", str(q), "--format", "trec"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == [lines[0]] and lines[0].split()[:4] == ["q1", "Q0", "d2", "1"] and lines[0].endswith(" gpuir")


def test_stopword_query_gives_empty_hits_exit_0(index_dir, capsys):
    assert main(["search", str(index_dir), "--query", "the a of"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"] == []


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"id": "x"}', 'line 2: missing field "text"'),
        ('{"id": "x", "text": 5}', 'line 2: field "text" must be str'),
        ('{"id": "x", "text": "ok"', "line 2: invalid JSON"),
        ('["id", "text"]', "line 2: expected a JSON object"),
        ('{"text": "no id"}', 'line 2: missing field "id"'),
    ],
)
def test_bad_corpus_lines_exit_2_naming_the_line(tmp_path, line, message):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"id": "a", "text": "fine"}\n' + line + "\n")
    r = run("index", p, tmp_path / "ix")
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "bad.jsonl" in r.stderr
    assert not (tmp_path / "ix" / "CURRENT").exists()


def test_custom_fields(tmp_path, capsys):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"key": "a", "body": "hello world"}) + "\n")
    assert main(["index", str(p), str(tmp_path / "ix"), "--id-field", "key", "--text-field", "body",
                 "--analyzer", "plain", "--method", "bm25+", "--k1", "0.9", "--b", "0.4"]) == 0
    assert main(["search", str(tmp_path / "ix"), "--query", "hello"]) == 0
    assert json.loads(capsys.readouterr().out)["hits"][0]["id"] == "a"


def test_empty_corpus_exit_2(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("")
    r = run("index", p, tmp_path / "ix")
    assert r.returncode == 2 and "empty" in r.stderr


def test_missing_and_corrupt_index_exit_2(tmp_path, index_dir):
    r = run("search", tmp_path / "nope", "--query", "x")
    assert r.returncode == 2 and "does not exist" in r.stderr
    live = index_dir / (index_dir / "CURRENT").read_text().strip()
    (live / "doc_lens.npy").write_bytes(b"\x00" * 10)
    r = run("search", index_dir, "--query", "x")
    assert r.returncode == 2 and "doc_lens.npy" in r.stderr


def test_bad_k_and_missing_queries_file_exit_2(index_dir, tmp_path):
    r = run("search", index_dir, "--query", "x", "-k", "0")
    assert r.returncode == 2 and "-k must be a positive integer" in r.stderr
    r = run("search", index_dir, "--queries", tmp_path / "none.jsonl")
    assert r.returncode == 2 and "no such file" in r.stderr


def test_cupy_without_gpu_exit_2_with_fix(index_dir):
    from gpuir._compat import cuda_device

    if cuda_device()[0]:
        pytest.skip("a GPU is usable here")
    r = run("search", index_dir, "--query", "x", "--backend", "cupy")
    assert r.returncode == 2 and "backend='numpy'" in r.stderr


def test_info_names_backends_and_auto_choice():
    r = run("info", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["backends"]["numpy"]["usable"] is True
    import importlib.util

    assert info["backends"]["numba"]["usable"] is (importlib.util.find_spec("numba") is not None)
    assert info["auto"]["backend"] in ("numpy", "numba", "cupy") and info["auto"]["reason"]
    assert info["memory_auto"]["backend"] in ("numpy", "numba", "cupy") and info["memory_auto"]["reason"]
    r = run("info")
    assert r.returncode == 0 and "auto picks:" in r.stdout and "a memory's auto picks:" in r.stdout


def test_internal_error_exit_1(monkeypatch, index_dir, capsys):
    import gpuir.engine

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(gpuir.engine.BM25Index, "search", boom)
    assert main(["search", str(index_dir), "--query", "x"]) == 1
    assert "internal error" in capsys.readouterr().err


def test_gpuir_entry_point_exists():
    import shutil

    exe = shutil.which("gpuir") or (sys.prefix + "/bin/gpuir")
    r = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and "gpuir" in r.stdout


def test_missing_extra_exits_2_with_the_pip_line(monkeypatch, index_dir, capsys):
    import gpuir.cli

    def needs_dense(args):
        raise ModuleNotFoundError("No module named 'tokenizers'", name="tokenizers")

    monkeypatch.setattr(gpuir.cli, "_cmd_search", needs_dense)
    assert main(["search", str(index_dir), "--query", "x"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'gpuir[dense]'" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

    def unknown(args):
        raise ModuleNotFoundError("No module named 'nowhere'", name="nowhere")

    monkeypatch.setattr(gpuir.cli, "_cmd_search", unknown)
    assert main(["search", str(index_dir), "--query", "x"]) == 1  # not an extra: an internal error
    assert "internal error" in capsys.readouterr().err


def _diag(monkeypatch, *, cupy=True, driver=None, runtime=12090, raw="CuPy is installed but no CUDA device can "
          "be used (CUDARuntimeError: cudaErrorInsufficientDriver: CUDA driver version is insufficient)"):
    import gpuir.gpu_info as gi

    monkeypatch.delenv("GPUIR_DISABLE_GPU", raising=False)
    monkeypatch.setattr(gi, "has_cupy", lambda: cupy)
    monkeypatch.setattr(gi, "_driver_cuda_version", lambda: driver)
    if cupy:
        import cupy as cp

        monkeypatch.setattr(cp.cuda.runtime, "runtimeGetVersion", lambda: runtime)
    usable, why = gi.diagnose((False, raw))
    assert usable is False and "\n" not in why
    return why


def test_info_names_the_real_reason_in_one_line(monkeypatch):
    pytest.importorskip("cupy")
    assert "no NVIDIA driver" in _diag(monkeypatch, driver=None)
    why = _diag(monkeypatch, driver=11080)
    assert "driver too old" in why and "CUDA 11.8" in why and "CUDA 12.9" in why
    why = _diag(monkeypatch, driver=12040, raw="CuPy is installed but no CUDA device can be used "
                "(CUDARuntimeError: cudaErrorNoDevice: no CUDA-capable device is detected)")
    assert "no CUDA device visible" in why and "too old" not in why
    why = _diag(monkeypatch, driver=12040, raw="CuPy is installed but reports no CUDA device")
    assert why.startswith("no CUDA device visible")


def test_info_without_cupy(monkeypatch):
    why = _diag(monkeypatch, cupy=False, raw="CuPy is not installed")
    assert why.startswith("CuPy is not installed") and "pip install 'gpuir[gpu]'" in why


def test_info_on_this_machine_is_one_line_per_backend():
    r = run("info")
    assert r.returncode == 0, r.stderr
    cupy_line = next(line for line in r.stdout.splitlines() if line.strip().startswith("cupy"))
    from gpuir.gpu_info import _driver_cuda_version

    if _driver_cuda_version() is None:  # e.g. the development machines: CuPy installed, no driver at all
        assert "no NVIDIA driver" in cupy_line and "insufficient" not in r.stdout


def test_demo_runs_small_and_names_its_backend(capsys):
    assert main(["demo", "--records", "500", "--queries", "20", "--backend", "numpy"]) == 0
    out = capsys.readouterr().out
    assert "backend: numpy" in out and "Recall@10 against the generator's gold" in out
    assert main(["demo", "--records", "0"]) == 2
    assert "must all be positive" in capsys.readouterr().err
