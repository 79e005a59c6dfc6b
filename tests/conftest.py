"""Shared fixtures and markers.

* ``gpu`` marker: the test needs a usable CUDA device. Skipped without one;
  ``--require-gpu`` turns that skip into a failure (run it on a GPU machine).
* ``slow`` marker: takes more than a few seconds.
* ``backend`` fixture: "numpy", and "cupy" where a device can be used, so one
  test body checks both backends.
* ``data_dir`` fixture: the evaluation data, from ``GPUIR_DATA`` (default
  ``../shared/data`` beside the repository); tests that need it skip without it.
"""

from __future__ import annotations

import os

# Tests never reach a model hub: everything loads from installed packages.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from pathlib import Path

import pytest

from gpuir._compat import cuda_device
from gpuir.datapath import data_dir as _data_dir


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
    usable, reason = cuda_device()
    if usable:
        return
    if item.config.getoption("--require-gpu"):
        pytest.fail(f"--require-gpu given but no CUDA device can be used: {reason}")
    pytest.skip(f"no usable CUDA device: {reason}")


def _backends():
    return ["numpy", pytest.param("cupy", marks=pytest.mark.gpu)]


@pytest.fixture(params=_backends())
def backend(request):
    """Backend name: every test using it runs on NumPy and, with a device, on CuPy."""
    return request.param


@pytest.fixture(scope="session")
def data_dir() -> Path:
    d = _data_dir()
    if not d.exists():
        pytest.skip(f"evaluation data not found at {d} (set GPUIR_DATA)")
    return d
