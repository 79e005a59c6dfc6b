"""kernels/segment_reduce.cu compiles for sm_80 and sm_90 with NVRTC, no device needed."""

from __future__ import annotations

import pytest

from gpuir.dense.late_interaction import compile_segment_reduce, kernel_source


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_compiles(arch):
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    cubin = compile_segment_reduce(arch)
    assert isinstance(cubin, bytes) and cubin[:4] == b"\x7fELF"


def test_source_names_its_file():
    assert kernel_source().startswith('#line 1 "kernels/segment_reduce.cu"')
