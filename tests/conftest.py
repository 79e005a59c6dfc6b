"""Shared fixtures and markers.

* ``gpu`` marker: the test needs a usable CUDA device. Skipped without one;
  ``--require-gpu`` turns that skip into a failure (run it on a GPU machine).
* ``slow`` marker: takes more than a few seconds.
* ``backend`` fixture: "numpy", "numba" (the compiled CPU scorer; BM25 only:
  skipped in the dense modules, which run on numpy or cupy), and "cupy" where
  a device can be used, so one test body checks every backend.
* ``data_dir`` fixture: the evaluation data, from ``GPUIR_DATA`` (default
  ``../shared/data`` beside the repository); tests that need it skip without it.
* ``locomo`` / ``oracle`` fixtures: LoCoMo and the LongMemEval oracle split, loaded
  from ``data_dir`` once per test module.
* ``beir_toy`` fixture: a three-document BEIR folder written under ``tmp_path``.
* ``GPUIR_TIERED_START=0`` for the whole session (and the processes it starts): a memory's "auto"
  searches wait for the compiled engine, so what they report does not depend on the order tests
  run in; ``tests/test_memory_warmup.py`` turns it back on to test the tiered start.
"""

from __future__ import annotations

import json
import os

# Tests never reach a model hub: everything loads from installed packages.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from pathlib import Path

import pytest

os.environ.setdefault("GPUIR_TIERED_START", "0")  # (see the module docstring)

from gpuir.datapath import data_dir as _data_dir
from gpuir.eval.datasets import load_locomo, load_longmemeval
from gpuir.gpu_info import diagnose


def pytest_addoption(parser):
    parser.addoption(
        "--require-gpu",
        action="store_true",
        default=False,
        help="fail (instead of skip) tests marked gpu when no CUDA device can be used",
    )


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is None:
        return
    usable, reason = diagnose()  # one line, the real reason (no driver, driver too old, no device, no CuPy)
    if usable:
        return
    if item.config.getoption("--require-gpu"):
        pytest.fail(f"--require-gpu given but no CUDA device can be used: {reason}")
    pytest.skip(f"no usable CUDA device: {reason}")


def _backends():
    return ["numpy", "numba", pytest.param("cupy", marks=pytest.mark.gpu)]


#: Test modules of the dense channel: its operations have numpy and cupy paths only.
_NOT_NUMBA = {"test_dense_index", "test_late_interaction"}


@pytest.fixture(params=_backends())
def backend(request):
    """Backend name: every test using it runs on NumPy, Numba and, with a device, on CuPy."""
    if request.param == "numba" and request.module.__name__.rsplit(".", 1)[-1] in _NOT_NUMBA:
        pytest.skip("numba is a BM25 scorer backend; the dense channel runs on numpy or cupy")
    return request.param


@pytest.fixture(scope="session")
def data_dir() -> Path:
    d = _data_dir()
    if not d.exists():
        pytest.skip(f"evaluation data not found at {d} (set GPUIR_DATA)")
    return d


@pytest.fixture(scope="module")
def locomo(data_dir):
    """LoCoMo (``locomo/locomo10.json``) as an :class:`~gpuir.eval.datasets.EvalDataset`."""
    return load_locomo(data_dir / "locomo" / "locomo10.json")


@pytest.fixture(scope="module")
def oracle(data_dir):
    """The LongMemEval oracle split (``longmemeval/longmemeval_oracle.json.gz``)."""
    return load_longmemeval(data_dir / "longmemeval" / "longmemeval_oracle.json.gz", split="oracle")


@pytest.fixture
def beir_toy(tmp_path) -> Path:
    """A toy BEIR folder ``tmp_path / "toy"``: 3 documents, 3 queries, ``qrels/test.tsv``.

    The qrels name an unknown document (``dX``) and an unknown query (``q9``), and
    q3 has only a grade-0 judgement (so it is not scored).
    """
    d = tmp_path / "toy"
    (d / "qrels").mkdir(parents=True)
    corpus = [
        {"_id": "d1", "title": "Cats", "text": "cats purr and sleep"},
        {"_id": "d2", "title": "", "text": "dogs bark loudly"},
        {"_id": "d3", "title": "Birds", "text": "birds sing in the morning"},
    ]
    (d / "corpus.jsonl").write_text("\n".join(json.dumps(c) for c in corpus) + "\n")
    (d / "queries.jsonl").write_text(
        "\n".join(json.dumps(q) for q in [{"_id": "q1", "text": "purring cats"},
                                          {"_id": "q2", "text": "barking dogs"},
                                          {"_id": "q3", "text": "nothing"}]) + "\n"
    )
    (d / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t2\nq2\td2\t1\nq2\tdX\t1\nq3\td3\t0\nq9\td1\t1\n"
    )
    return d
