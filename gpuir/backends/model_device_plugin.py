"""A pytest plugin that runs tests marked ``gpu`` on the kernel model instead of a device.

``pytest -p gpuir.backends.model_device_plugin tests/test_cupy_backend.py``
installs the fake ``cupy`` of :mod:`gpuir.backends.kernel_model` before the
tests are collected and reports a usable (emulated) device, so the GPU tests'
own code -- their inputs, expectations and calls into ``CupyScorer`` -- runs
end to end without a GPU. It checks the tests, not the kernels: a pass here
says nothing about the CUDA code (``bench/gpu_verify.py --dry-run`` uses it).
"""

from __future__ import annotations

from . import kernel_model as _km

_ctx = _km.fake_cupy_installed(seed=0)
_ctx.__enter__()


def _usable() -> tuple[bool, str]:
    return True, "emulated device (kernel model)"


def _patch() -> None:
    import gpuir._compat as compat
    from gpuir import backends

    compat.cuda_device = _usable  # type: ignore[assignment]
    backends.cuda_device = _usable  # type: ignore[attr-defined]


_patch()


def pytest_configure(config):
    _patch()
    try:
        import conftest  # tests/conftest.py imported cuda_device by name

        conftest.cuda_device = _usable
    except ImportError:
        pass


def pytest_collection_modifyitems(session, config, items):
    import sys

    mod = sys.modules.get("conftest")
    if mod is not None:
        mod.cuda_device = _usable
