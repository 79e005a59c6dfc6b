"""The synthetic agent-memory generator: determinism, shapes, gold, recency, invariants."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpuir.synthetic import CHUNK_RECORDS, ROLES, SyntheticMemory, generate, iter_texts

N = 30_000
Q = 400


@pytest.fixture(scope="module")
def mem() -> SyntheticMemory:
    return generate(N, n_queries=Q, seed=7)


def test_sizes_and_dtypes(mem):
    assert len(mem.ids) == len(mem.texts) == N
    assert len(set(mem.ids)) == N
    for name, dtype in [
        ("roles", np.int8), ("sessions", np.int32), ("agents", np.int32),
        ("times", np.float64), ("importance", np.float32), ("turns", np.int32),
    ]:
        arr = getattr(mem, name)
        assert arr.shape == (N,) and arr.dtype == dtype, name
    assert len(mem.queries) == len(mem.query_ids) == len(mem.gold) == Q
    assert mem.query_agents.shape == mem.query_times.shape == mem.query_targets.shape == (Q,)
    assert all(g.dtype == np.int64 and 1 <= g.size <= 3 for g in mem.gold)
    assert all(isinstance(t, str) and t for t in mem.texts)
    assert all(q.strip() for q in mem.queries)
    assert 0.0 <= mem.importance.min() and mem.importance.max() <= 1.0


def test_deterministic_and_seed_sensitive(mem):
    again = generate(N, n_queries=Q, seed=7)
    assert again.texts == mem.texts and again.queries == mem.queries
    assert np.array_equal(again.times, mem.times) and np.array_equal(again.roles, mem.roles)
    assert all(np.array_equal(a, b) for a, b in zip(again.gold, mem.gold))
    other = generate(N, n_queries=Q, seed=8)
    assert other.texts != mem.texts and other.queries != mem.queries


def test_iter_texts_streams_the_same_texts():
    n = CHUNK_RECORDS + 500  # two chunks
    chunks = list(iter_texts(n, seed=3))
    assert len(chunks) == 2 and len(chunks[0]) == CHUNK_RECORDS
    assert list(itertools.chain.from_iterable(chunks)) == generate(n, n_queries=5, seed=3).texts


def test_gold_records_contain_the_identifier_and_nothing_else_does(mem):
    where: dict[str, list[int]] = {}
    wanted = set(mem.query_identifiers)
    for i, t in enumerate(mem.texts):
        for tok in t.split():
            if tok in wanted:
                where.setdefault(tok, []).append(i)
    for qi in range(Q):
        ident = mem.query_identifiers[qi]
        gold = mem.gold[qi].tolist()
        assert where[ident] == gold, f"query {qi}: {ident} occurs in {where[ident]}, gold {gold}"
        assert int(mem.query_targets[qi]) in gold
        # A gold block lies inside one session, in consecutive turns.
        assert len(set(mem.sessions[gold].tolist())) == 1
        assert gold == list(range(gold[0], gold[0] + len(gold)))
        assert mem.query_agents[qi] == mem.agents[gold[0]]
        in_query = ident.lower() in mem.queries[qi].lower().split()
        assert in_query == bool(mem.query_has_identifier[qi])


def test_queries_are_noisy_but_mostly_keyed(mem):
    share = mem.query_has_identifier.mean()
    assert 0.75 < share < 0.95  # the identifier is dropped from ~15% of queries


def test_recency_bias(mem):
    t0, t1 = mem.times.min(), mem.times.max()
    recent_records = (mem.times >= mem.recent_cutoff).mean()
    assert 0.15 < recent_records < 0.25  # ~20% of records are "recent"
    recent_q = (mem.times[mem.query_targets] >= mem.recent_cutoff).mean()
    assert 0.72 < recent_q < 0.88  # but ~80% of the queries target them
    assert np.array_equal(mem.query_recent, mem.times[mem.query_targets] >= mem.recent_cutoff)
    assert np.all(mem.query_times > t1) and t1 - t0 > 100 * 86400


def test_roles_and_time_order(mem):
    starts = np.flatnonzero(np.diff(mem.sessions, prepend=-1) != 0)
    assert np.all(np.diff(mem.sessions) >= 0)  # sessions are contiguous
    assert np.all(mem.turns[starts] == 0)
    assert np.all(mem.roles[starts] == ROLES.index("user"))
    same = np.diff(mem.sessions) == 0
    assert np.all(np.diff(mem.times)[same] > 0)  # strictly increasing within a session
    assert np.all(np.diff(mem.turns)[same] == 1)
    counts = np.bincount(mem.roles, minlength=3) / N
    assert np.all(counts > 0.1)  # all three roles are common
    # Each session belongs to one agent.
    first = mem.agents[starts]
    assert np.array_equal(mem.agents, np.repeat(first, np.diff(np.append(starts, N))))


def test_text_statistics(mem):
    toks = " ".join(mem.texts[:5000]).split()
    assert toks.count("the") / len(toks) > 0.03  # stopwords are present
    _words, counts = np.unique(toks, return_counts=True)
    top = np.sort(counts)[::-1]
    assert top[0] > 20 * top[min(1000, top.size - 1)]  # Zipfian head


def test_errors_say_what_to_fix():
    with pytest.raises(ValueError, match="n_records"):
        generate(0)
    with pytest.raises(ValueError, match="n_queries"):
        generate(10, n_queries=-1)
    with pytest.raises(ValueError, match="n_agents"):
        generate(10, n_agents=0)
    assert generate(50, n_queries=0).queries == []
