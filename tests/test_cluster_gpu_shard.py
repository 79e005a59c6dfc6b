"""A shard per GPU, without a device: shards serving with the CuPy engine (``ShardServer(backend="cupy")``, what
a GPU shard actor runs, gpuir.cluster.runtime.start_shard) run the real kernel bodies on the CPU
(``tests/cuda_host``), behind the coordinator's query-then-fetch (in-process shards, no Ray): every answer
equals one Memory's on the NumPy engine (ids, hits, float32 score bits up to the sign of zero). The Ray side
(the actor asks for ``num_gpus=1``) is checked in tests/test_memory_protocol.py."""

from __future__ import annotations

import numpy as np
import pytest
from test_cluster_merge import in_process, records

from gpuir import Memory

cuda_host = pytest.importorskip("cuda_host")
if cuda_host.find_compiler()[0] is None:
    pytest.skip(f"no C++20 compiler for the host emulation: {cuda_host.find_compiler()[1]}", allow_module_level=True)

from cuda_host.device import real_kernels_installed, small_blocks

U32 = np.uint32


@pytest.mark.parametrize("route", ["id", "tenant"])
def test_cupy_shards_on_the_kernel_model_equal_one_memory(tmp_path, monkeypatch, route):
    from gpuir import backends
    from gpuir.backends import cupy_backend as cb

    rng = np.random.default_rng(24)
    recs = records(240, rng)
    one = Memory(record_times=False, partition_days=14)
    sm, _ = in_process(tmp_path, monkeypatch, 2, route, backend="cupy", partition_days=14)
    from gpuir.backends import cupy_segments as cs

    used: list[int] = []
    real = cb.CupyScorer.search
    monkeypatch.setattr(cb.CupyScorer, "search", lambda self, queries, *a, **kw: used.append(len(queries))
                        or real(self, queries, *a, **kw))
    real_pass = cs.CupySegmentsEngine.search  # the memory's one device pass (the "cupy" route of the contract)
    monkeypatch.setattr(cs.CupySegmentsEngine, "search", lambda self, segset, view_ids, batch, k:
                        used.append(batch.size) or real_pass(self, segset, view_ids, batch, k))
    qs = ["walk lake", "paint group support", "dog dog trip", "music camp book", "nothing"]
    try:
        with small_blocks(), real_kernels_installed(schedule="forward"):
            monkeypatch.setattr(backends, "cuda_device", cb.cuda_device)  # the emulated device, for "cupy"
            for i in range(0, len(recs), 80):
                sm.add(recs[i:i + 80])
                one.add(recs[i:i + 80])
            sm.delete([r["id"] for r in recs[::13]])
            one.delete([r["id"] for r in recs[::13]])
            for kw in ({}, {"where": [{"tenant": t} for t in "abcda"]}, {"ties": "newest"}):
                want = one.search(qs, k=7, backend="numpy", **kw)
                got = sm.search(qs, k=7, **kw)  # "auto": each shard's own engine, CuPy
                assert np.array_equal(got.seqs, want.seqs), kw
                gb = np.asarray(got.scores, np.float32).view(U32) & U32(0x7FFFFFFF)
                wb = np.asarray(want.scores, np.float32).view(U32) & U32(0x7FFFFFFF)
                assert np.array_equal(gb, wb), kw
                assert [got.ids(i) for i in range(len(qs))] == [want.ids(i) for i in range(len(qs))]
        assert used, "no search ran on the CuPy engine"
    finally:
        sm.close()
