"""The compiled memory path calls Numba's compiled functions directly (gpuir.backends.jitcall): typed once per
layout, then called without the dispatcher. That is only sound if every call passes arguments of exactly the
types the entry point was compiled for. These tests check every kind of call a memory makes -- one question and
a batch, first and later searches of a snapshot (weights computed or cached), where filters, tombstones, a
memory opened from disk (mapped, read-only arrays), a NumPy integer k, threads -- against the signature the
entry point was built from, and that the checker itself catches a changed type."""

import numpy as np
import pytest
from _memory_oracle import Model, assert_same, random_query, random_record, random_where

from gpuir import Memory
from gpuir.backends import jitcall
from gpuir.memory import segscan

numba = pytest.importorskip("numba")


@pytest.fixture
def checked(monkeypatch):
    """Every entry point the memory makes checks each call's argument types against its own signature."""
    calls: dict[str, int] = {}
    real = jitcall.entry_point

    def checking(fn, args):
        sig = jitcall.signature_of(args)
        ep = real(fn, args)
        name = getattr(fn, "py_func", fn).__name__

        def call(*a):
            got = jitcall.signature_of(a)
            assert got == sig, f"{name} called with other types than it was typed for:\n{got}\n!=\n{sig}"
            calls[name] = calls.get(name, 0) + 1
            return ep(*a)

        return call

    monkeypatch.setattr(segscan, "entry_point", checking)
    return calls


def _memory(rng, n=240, per=40, deletes=True):
    m = Memory(partition_days=3, merge_factor=64, merge_min=4, background_merges=False)
    model = Model(analyzer="default")
    for b in range(n // per):
        recs = [random_record(rng, f"r{b}-{i}") for i in range(per)]
        m.add(recs)
        model.add(recs)
        if deletes:
            dead = [f"r{b}-{i}" for i in range(0, per, 7)]
            m.delete(dead)
            model.delete(dead)
    return m, model


def _searches(m, model, rng):
    qs = [random_query(rng) for _ in range(12)]
    for k in (1, 10, np.int32(5), np.int64(3)):
        ids, scores = model.search(qs, int(k))
        assert_same(m.search(qs, k=k), ids, scores)  # a batch: fills the cache at once
        for i, q in enumerate(qs[:4]):  # one question at a time, first (weights computed) and later (cached)
            m.add([{"id": f"x{k}{i}", "text": "w1 w2"}])
            model.add([{"id": f"x{k}{i}", "text": "w1 w2"}])
            ids, scores = model.search([q], int(k))
            assert_same(m.search([q], k=k), ids, scores)
            assert_same(m.search([q], k=k), ids, scores)
    for _ in range(4):  # where filters (per-segment allow-lists), alone and beside unfiltered questions
        w = random_where(rng)
        q = random_query(rng)
        ids, scores = model.search([q], 5, where=w)
        assert_same(m.search([q], k=5, where=w), ids, scores)


def test_every_kind_of_call_passes_the_types_its_entry_point_was_typed_for(checked, tmp_path):
    rng = np.random.default_rng(7)
    m, model = _memory(rng)
    assert len(m.snapshot().views) >= 4 and any(v.live is not None for v in m.snapshot().views)
    _searches(m, model, rng)
    m.save(tmp_path / "m")
    m.close()
    opened = Memory.open(tmp_path / "m")  # mapped segments: read-only arrays, another layout type
    try:
        qs = [random_query(rng) for _ in range(6)]
        ids, scores = model.search(qs, 10)
        assert_same(opened.search(qs, k=10), ids, scores)
        assert_same(opened.search(qs[:1], k=10), *model.search(qs[:1], 10))
    finally:
        opened.close()
    # the checker saw every compiled function the memory calls, many times
    assert checked.get("search_segments", 0) >= 40, checked
    assert checked.get("fill_segments", 0) >= 5, checked
    assert checked.get("locate_terms", 0) >= 5, checked


def test_threads_share_a_layout_entry(checked):
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(11)
    m, model = _memory(rng, deletes=False)
    qs = [random_query(rng) for _ in range(32)]
    want = [model.search([q], 10) for q in qs]
    m.search(qs, k=10)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda q: m.search([q], k=10), qs))
    for g, (ids, scores) in zip(got, want):
        assert_same(g, ids, scores)
    assert checked["search_segments"] >= len(qs) // 2


def test_the_type_check_catches_a_changed_type():
    """The signature check above can fail: a NumPy int32 or a read-only array is another type."""
    a = np.zeros(4, np.int64)
    ro = a.view()
    ro.flags.writeable = False
    assert jitcall.signature_of((a, 3)) == jitcall.signature_of((np.ones(2, np.int64), 7))
    assert jitcall.signature_of((a, 3)) != jitcall.signature_of((a, np.int32(3)))
    assert jitcall.signature_of((a,)) != jitcall.signature_of((ro,))
