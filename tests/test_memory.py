"""Memory API: records in and out, validation errors naming the record, unknown ids, where
filters and their errors, the tenant boundary, merges, one engine under every backend (a sealed segment's
scorer built once, never re-weighted)."""

from datetime import date, datetime, timezone

import numpy as np
import pytest
from _helpers import without_times
from _memory_oracle import Model, assert_same, grow_both, random_query, random_record, random_where

from gpuir import Memory
from gpuir.backends import use_engine
from gpuir.bm25 import METHODS
from gpuir.memory import RecordError, UnknownIdError, WhereError, budget_partitions, fit_decay, format_time

REC = {"id": "a1", "text": "Caroline went to the support group", "session": "S1", "role": "user",
       "agent": "bot", "tenant": "conv-26", "time": "2023-05-08T13:56:00Z", "importance": 0.5, "type": "event",
       "metadata": {"speaker": "Caroline", "turn": 3, "tags": ["a", "b"]}}


def test_records_round_trip_every_field_and_time_form():
    m = Memory()
    recs = [
        REC,
        {"id": "a2", "text": "only text"},
        {"id": "a3", "text": "naive time", "time": "2023-05-08 13:56:00"},
        {"id": "a4", "text": "a datetime", "time": datetime(2023, 5, 8, 15, 56, tzinfo=timezone.utc)},
        {"id": "a5", "text": "a date", "time": date(2023, 5, 8)},
        {"id": "a6", "text": "an offset and milliseconds", "time": "2023-05-08T15:56:00.250+02:00", "importance": 2},
    ]
    assert m.add(recs) == 6 and len(m) == 6 and m.len() == 6
    got = m.get(["a1", "a2", "a3", "a4", "a5", "a6"])
    t = "2023-05-08T13:56:00+00:00"  # times come back as ISO 8601 UTC, whatever form they were given in
    assert without_times(got[0]) == {**REC, "time": t}  # (and the times the memory keeps: test_memory_record_times)
    assert without_times(got[1]) == {"id": "a2", "text": "only text"}  # absent fields stay absent
    assert got[2]["time"] == t and got[3]["time"] == "2023-05-08T15:56:00+00:00"
    assert got[4]["time"] == "2023-05-08T00:00:00+00:00"
    assert got[5]["time"] == "2023-05-08T13:56:00.250+00:00" and got[5]["importance"] == 2.0
    assert format_time(1683554160000) == t
    # every time read back is the same instant: adding the returned records elsewhere stores the same times
    m2 = Memory()
    m2.add(got)
    assert m2.get([r["id"] for r in got]) == got


@pytest.mark.parametrize("bad, message", [
    ("not a dict", "record 1 is a str"),
    ({"id": ["l"], "text": "x"}, "record 1: 'id' must be a non-empty string, got list"),
    ({"id": 7, "text": "x"}, "'id' must be a non-empty string, got int 7"),
    ({"id": "", "text": "x"}, "'id' must be a non-empty string"),
    ({"id": "b", "text": None}, "record 1 (id 'b'): 'text' must be a string, got missing"),
    ({"id": "b", "text": 5}, "record 1 (id 'b'): 'text' must be a string, got int"),
    ({"id": "b", "text": "x", "role": "bot"}, "role 'bot' is not one of user, assistant, tool, system"),
    ({"id": "b", "text": "x", "tenant": 3}, "'tenant' must be a string, got int 3"),
    ({"id": "b", "text": "x", "time": 1.7e9}, "is the bare number 1700000000.0: give its unit"),
    ({"id": "b", "text": "x", "time": 1715176560}, "is the bare number 1715176560: give its unit"),
    ({"id": "b", "text": "x", "time": datetime(2024, 5, 8, 13, 56)}, "is a naive datetime"),
    ({"id": "b", "text": "x", "time": "yesterday"}, "is not an ISO 8601 date or time"),
    ({"id": "b", "text": "x", "time": True}, "got True"),
    ({"id": "b", "text": "x", "expires_at": 5}, "'expires_at' is the bare number 5"),
    ({"id": "b", "text": "x", "metadata": {"\u0000expires_at": 1}}, "is reserved"),
    ({"id": "b", "text": "x", "importance": "high"}, "'importance' must be a number, got str"),
    ({"id": "b", "text": "x", "importance": float("nan")}, "must be a finite number"),
    ({"id": "b", "text": "x", "metadata": ["a"]}, "'metadata' must be a JSON object (dict), got list"),
    ({"id": "b", "text": "x", "metadata": {"s": {1, 2}}}, "'metadata' is not JSON-serialisable"),
    ({"id": "b", "text": "x", "metadata": {1: "a"}}, "metadata keys must be strings"),
    ({"id": "b", "text": "x", "speaker": "Ann"}, "unknown field 'speaker'"),
    ({"id": "a0", "text": "x"}, "record 1 (id 'a0'): id 'a0' occurs twice in this batch (also record 0)"),
])
def test_malformed_record_is_a_clear_error_naming_it(bad, message):
    m = Memory()
    with pytest.raises(RecordError, match=None) as ei:
        m.add([{"id": "a0", "text": "fine"}, bad])
    assert message in str(ei.value)
    assert len(m) == 0, "nothing of a bad batch is added"


def test_existing_ids_unknown_ids_and_missing_ok():
    m = Memory()
    m.add([{"id": "x", "text": "alpha beta"}, {"id": "y", "text": "beta gamma"}])
    with pytest.raises(RecordError, match="record 0 \\(id 'x'\\): the id already exists"):
        m.add([{"id": "x", "text": "again"}])
    with pytest.raises(UnknownIdError, match="delete: 2 unknown id\\(s\\): 'nope', 'nada'") as ei:
        m.delete(["x", "nope", "nada"])
    assert ei.value.ids == ["nope", "nada"] and len(m) == 2, "an unknown id deletes nothing"
    assert m.delete(["x", "nope"], missing_ok=True) == 1 and len(m) == 1
    assert m.delete(["x"], missing_ok=True) == 0
    with pytest.raises(UnknownIdError, match="get: 1 unknown id"):
        m.get(["x"])
    assert [without_times(r) for r in m.get(["x", "y"], missing_ok=True)] == [None, {"id": "y", "text": "beta gamma"}]
    with pytest.raises(UnknownIdError, match="update"):
        m.update([{"id": "x", "text": "gone"}])
    with pytest.raises(TypeError, match="ids must be strings"):
        m.delete([3])


def test_update_replaces_and_moves_to_the_end_of_the_add_order():
    m = Memory()
    m.add([{"id": "p", "text": "same words", "tenant": "t"}, {"id": "q", "text": "same words"}])
    assert m.search("same").ids(0) == ["p", "q"]  # a tie: add order
    m.update([{"id": "p", "text": "same words", "tenant": "u"}])
    assert m.search("same").ids(0) == ["q", "p"]
    assert m.get(["p"])[0]["tenant"] == "u"


def test_hits_carry_id_score_text_and_fields():
    m = Memory()
    m.add([REC, {"id": "z", "text": "unrelated"}])
    res = m.search(["support group", "nothing matches"], k=3)
    h = res.hits(0)
    assert len(h) == 1 and list(h[0]) == ["id", "score", "text", "session", "role", "agent", "tenant", "time",
                                          "importance", "type", "metadata", "created_at", "updated_at"]
    assert h[0]["id"] == "a1" and h[0]["score"] == float(res.scores[0, 0]) > 0
    assert h[0]["metadata"] == REC["metadata"] and h[0]["time"] == "2023-05-08T13:56:00+00:00"
    assert res.hits(1) == [] and res.seqs[1].tolist() == [-1, -1]  # k=3 clamped to the 2 records
    assert np.isneginf(res.scores[1]).all()


def test_bad_search_arguments():
    m = Memory()
    m.add([REC])
    for k in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="k must be a positive integer"):
            m.search("x", k=k)
    with pytest.raises(TypeError, match="query 1 is a int"):
        m.search(["ok", 3])
    with pytest.raises(ValueError, match="unknown mode"):
        m.search("x", mode="fast")
    with pytest.raises(ValueError, match="needs max_partitions"):
        m.search("x", mode="budgeted")
    with pytest.raises(ValueError, match="unknown backend"):
        m.search("x", backend="tpu")


@pytest.mark.parametrize("where, message", [
    ({"speaker": "Ann"}, "unknown field 'speaker'"),
    ({"text": None}, "every record has an text; null never matches"),
    ({"role": {"like": "u"}}, "unknown operator 'like'"),
    ({"role": ["user"]}, 'for membership write {"in": [...]}'),
    ({"role": {"gte": "a"}}, "role takes equality and membership only"),
    ({"role": "bot"}, "role 'bot' is not one of"),
    ({"id": {"exists": False}}, "every record has an id"),
    ({"time": {"gte": "last week"}}, "not an ISO 8601"),
    ({"time": {"gte": 1715176560}}, "is the bare number 1715176560: give its unit"),
    ({"time": {"contains": "2024"}}, "'contains' applies to strings and lists"),
    ({"importance": {"contains": 1}}, "'contains' applies to strings and lists"),
    ({"metadata.a": {"exists": "yes"}}, '"exists" takes true or false'),
    ({"$or": {"role": "user"}}, "$or takes a non-empty list of filters"),
    ({"$or": []}, "$or takes a non-empty list of filters"),
    ({"$not": [{"role": "user"}]}, "$not takes one filter"),
    ({"$xor": [{"role": "user"}]}, "unknown logical operator '$xor'"),
    ({"$and": [{}]}, "is an empty filter"),
    ({"metadata.a": {"eq": 1, "$eq": 2}}, "operator 'eq' given twice"),
    ({"importance": {"gt": "high"}}, "importance values are finite numbers"),
    ({"session": 3}, "session values are strings"),
    ({"metadata": "x"}, "takes a non-empty dict"),
    ({"metadata.": 1}, "needs a key after each dot"),
    ({"metadata.a..b": 1}, "needs a key after each dot"),
    ({"metadata.turn": {"gt": True}}, "a range needs a number or a string"),
    ({"metadata.tags": ["a"]}, "a list is ambiguous"),
    ({"role": {}}, "an empty condition"),
    ({"role": {"in": "user"}}, '"in" takes a list'),
    ("tenant=acme", "where must be None, a dict, or a list"),
    ([{"role": "user"}], "where has 1 entries for 2 queries"),
])
def test_malformed_where_is_a_clear_error(where, message):
    m = Memory()
    m.add([REC])
    with pytest.raises(WhereError) as ei:
        m.search(["a", "b"], where=where)
    assert message in str(ei.value)


@pytest.mark.parametrize("tenant", [{"in": ["acme", "globex"]}, {"gte": "a"}, None, ["acme"], 3, {"eq": None}])
def test_tenant_must_be_exactly_one_string(tenant):
    m = Memory()
    m.add([REC])
    with pytest.raises(WhereError, match="tenant is a hard boundary"):
        m.search("group", where={"tenant": tenant})


def test_tenant_isolation_against_wheres_that_try_to_widen():
    rng = np.random.default_rng(5)
    m = Memory(partition_days=1)
    recs = [random_record(rng, f"r{i}") for i in range(400)]
    for r in recs[::3]:  # records of other tenants that claim to be "acme" everywhere else
        if r.get("tenant") != "acme":
            r["metadata"] = {"tenant": "acme", "speaker": "Ann"}
            r["agent"] = "acme"
            r["session"] = "acme"
    m.add(recs)
    tenant_of = {r["id"]: r.get("tenant") for r in recs}
    widen = [
        {"tenant": "acme"},
        {"tenant": "acme", "metadata.tenant": "acme"},
        {"tenant": "acme", "agent": {"in": ["acme", "agent0", "agent1", "agent2"]}},
        {"tenant": "acme", "session": "acme"},
        {"tenant": "acme", "role": {"in": ["user", "assistant", "tool", "system"]}, "time": {"gte": "1970-01-01"}},
        {"tenant": {"eq": "acme"}, "metadata": {"speaker": {"in": ["Ann", "Bob", "Cy"]}}},
    ]
    queries = [random_query(rng) for _ in range(40)]
    found = 0
    for w in widen:
        for mode in ("exhaustive", "newest"):
            res = m.search(queries, k=50, where=w, mode=mode)
            for i in range(len(queries)):
                ids = res.ids(i)
                found += len(ids)
                assert all(tenant_of[x] == "acme" for x in ids), (w, ids)
    assert found > 100, "the filters must not be vacuous"
    # per-query wheres: each query stays in its own tenant
    res = m.search(queries[:4], k=50, where=[{"tenant": "acme"}, None, {"tenant": "globex"}, {"tenant": "nobody"}])
    assert {tenant_of[x] for x in res.ids(0)} == {"acme"}
    assert {tenant_of[x] for x in res.ids(2)} == {"globex"}
    assert res.ids(3) == []
    assert len({tenant_of[x] for x in res.ids(1)}) > 1


def test_tenant_check_refuses_to_return_a_leak(monkeypatch):
    """Defence in depth: were a filter ever wrong, the search fails rather than leak a record."""
    from gpuir.memory import where as where_mod

    m = Memory()
    m.add([{"id": "a", "text": "secret plans", "tenant": "acme"},
           {"id": "b", "text": "secret plans", "tenant": "globex"}])
    monkeypatch.setattr(where_mod.Where, "mask", lambda self, view, dicts: np.ones(view.seg.n_docs, bool))
    monkeypatch.setattr(where_mod.Where, "rows", lambda self, view, dicts: np.arange(view.seg.n_docs, dtype=np.int64))
    with pytest.raises(RuntimeError, match="refusing to return it"):
        m.search("secret", where={"tenant": "acme"})


def test_where_semantics_on_every_field_kind():
    m = Memory(partition_days=None)
    rng = np.random.default_rng(11)
    recs = [random_record(rng, f"r{i}") for i in range(300)]
    m.add(recs)
    model = Model(analyzer="default", method="lucene", k1=1.2, b=0.75)
    model.add(recs)
    queries = [random_query(rng) for _ in range(30)]
    wheres = [random_where(rng) for _ in range(30)] + [
        {"metadata.flag": False}, {"metadata.n": 2}, {"metadata.n": 2.0}, {"metadata.speaker": {"lt": "B"}},
        {"metadata.missing": None}, {"importance": None}, {"time": None}, {"type": {"in": ["fact", None]}},
        {"id": {"in": ["r1", "r2", "r3", "nope"]}}, {"role": {"in": []}},
    ]
    for w in wheres:
        ids, scores = model.search(queries, 10, where=w)
        assert_same(m.search(queries, k=10, where=w), ids, scores, f"where={w}")


@pytest.mark.parametrize("background", [True, False])
def test_merge_policy_bounds_segments_and_purges_tombstones(background):
    m = Memory(partition_days=None, merge_factor=4, merge_min=8, background_merges=background)
    rng = np.random.default_rng(2)
    for i in range(60):
        m.add([random_record(rng, f"r{i}-{j}") for j in range(3)])
        assert m.wait_merges(timeout=60)
        assert len(m.snapshot().views) <= 3 * 3 + 1, "tiers of at most merge_factor - 1 segments"
    assert m.merge_log, "the tiered policy merged"
    m.delete([f"r{i}-0" for i in range(60)])
    before = [r for r in m.search(["w0 w1 w2"], k=20).ids(0)]
    assert m.merge() >= 1
    snap = m.snapshot()
    assert len(snap.views) == 1 and snap.views[0].live is None and len(m) == 120
    assert m.search(["w0 w1 w2"], k=20).ids(0) == before


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire", "bm25l", "bm25+"])
def test_numba_and_numpy_engines_equal_the_fresh_index_bit_for_bit(method, monkeypatch):
    """Every backend scores segments through its scorer with the snapshot's statistics per search:
    exact for all five variants (the bm25l/bm25+ constant included), with tombstones and filters."""
    pytest.importorskip("numba")
    rng = np.random.default_rng([3, len(method)])
    m = Memory(method=method, partition_days=1, merge_factor=3, merge_min=4)
    model = Model(analyzer="default", method=method)
    for batch in range(4):
        grow_both(m, model, rng, batch, 60, 7)
        assert any(v.live is not None for v in m.snapshot().views), "tombstones are searched, not purged"
        qs = [random_query(rng) for _ in range(12)]
        ws = [random_where(rng) if i % 2 else None for i in range(12)]
        for k in (1, 10):
            ids, scores = model.search(qs, k, where=ws)
            for backend in ("numpy", "numba", "auto"):
                for mode in ("exhaustive", "newest"):
                    res = m.search(qs, k=k, where=ws, backend=backend, mode=mode, ties="oldest")
                    assert_same(res, ids, scores, f"{method} {backend} {mode} k={k}")
            # the contract's entry (term ids + the snapshot's CollectionStats) gives the same
            # and so does one scorer call per segment (the batch weighed once, or term ids + stats)
            for backend, name in (("numpy", "numpy-stats"), ("numba", "numba-stats"), ("numba", "numba-each")):
                with use_engine(backend, name):
                    res = m.search(qs, k=k, where=ws, backend=backend, mode="newest", ties="oldest")
                assert_same(res, ids, scores, f"{method} {name} k={k}")


def test_auto_serves_the_memory_with_the_compiled_engine(monkeypatch):
    pytest.importorskip("numba")
    monkeypatch.delenv("GPUIR_BACKEND", raising=False)
    monkeypatch.setattr("gpuir.backends.cuda_device", lambda: (False, "no GPU (test)"))
    m = Memory(partition_days=None)
    m.add([{"id": "a", "text": "support group"}, {"id": "b", "text": "group"}])
    res = m.search("support group")
    assert res.meta["backend"] == "numba" and res.ids(0) == ["a", "b"]


def test_sealed_segment_scorer_is_built_once_and_never_reweighted(monkeypatch):
    """A segment is laid out once for its lifetime: later adds and deletes change the statistics every
    search applies, never the segment's scorer (counted: constructions and whole-segment weightings)."""
    pytest.importorskip("numba")
    import gpuir.backends.batch_plan as bp
    import gpuir.backends.numba_segments as ns
    import gpuir.backends.segment_engines as msearch

    monkeypatch.setattr(ns, "SMALL_ROWS", 0)  # (40-record segments: through the scorer path, not the small one)

    built: list[tuple[str, int]] = []
    weighed: list[int] = []
    real_make, real_pw = msearch.make_scorer, bp.posting_weights

    def counting_make(backend, index, params, **opts):
        built.append((backend, id(index)))
        return real_make(backend, index, params, **opts)

    def counting_pw(index, params, stats=None):  # the model's fresh indexes weigh theirs: counted apart
        weighed.append(id(index))
        return real_pw(index, params, stats)

    monkeypatch.setattr(msearch, "make_scorer", counting_make)
    monkeypatch.setattr(bp, "posting_weights", counting_pw)
    rng = np.random.default_rng(11)
    m = Memory(method="bm25+", partition_days=None, merge_factor=100, merge_min=10**6)  # no merges
    model = Model(analyzer="default", method="bm25+")
    first = None
    seg_csrs: set[int] = set()
    qs = [random_query(rng) for _ in range(8)]
    for step in range(6):
        recs = [random_record(rng, f"r{step}-{i}") for i in range(40)]
        m.add(recs)
        model.add(recs)
        if step == 3:
            m.delete([f"r0-{i}" for i in range(10)])
            model.delete([f"r0-{i}" for i in range(10)])
        ids, scores = model.search(qs, 10)
        for backend in ("numba", "numpy"):
            assert_same(m.search(qs, k=10, backend=backend), ids, scores, f"step {step} {backend}")
        seg0 = m.snapshot().views[0].seg
        if first is None:
            first = seg0.cache[("scorer", "numba", m.params)]
        assert seg0.cache[("scorer", "numba", m.params)] is first, "the first segment's scorer is never rebuilt"
        segs = [v.seg for v in m.snapshot().views]
        seg_csrs |= {id(sg.csr) for sg in segs}
        assert len(segs) == step + 1
        # one construction per (segment, backend), ever (the reference model's own indexes build scorers too,
        # through the same contract since BM25Index searches through it: counted apart)
        mine = {id(s.csr) for s in segs}
        assert sorted(x for x in built if x[1] in mine) == sorted((b, id(s.csr)) for s in segs for b in ("numba", "numpy"))
    assert weighed and not seg_csrs & set(weighed), \
        "no segment's postings were weighted as a whole: statistics apply per search"
    # the statistics did change under the first segment's scorer: its records' scores moved
    assert first.stats.n_docs == 40 and m.snapshot().n_docs == 230


def test_budget_helpers():
    assert budget_partitions(0.1, 0.5) == 4  # 0.5^4 = 0.0625 <= 0.1 < 0.125
    assert budget_partitions(0.25, 0.5) == 2
    assert fit_decay(np.array([0, 0, 1, 3])) == pytest.approx(1.0 / 2.0)
    for eps, rho in ((0, 0.5), (1, 0.5), (0.1, 1.0), (0.1, 0)):
        with pytest.raises(ValueError):
            budget_partitions(eps, rho)
    with pytest.raises(ValueError):
        fit_decay(np.array([]))


def test_memory_settings_are_checked():
    with pytest.raises(ValueError, match="partition_days"):
        Memory(partition_days=0)
    with pytest.raises(ValueError, match="merge_factor"):
        Memory(merge_factor=1)
    with pytest.raises(ValueError, match="unknown BM25 method"):
        Memory(method="bm26")
    with pytest.raises(ValueError, match="unknown analyzer"):
        Memory(analyzer="klingon")


@pytest.mark.gpu
@pytest.mark.parametrize("method", METHODS)
def test_cupy_backend_searches_segments_with_global_statistics(method):
    """On a GPU: the memory's segments searched by CupyScorer (statistics, C and tombstones per search)
    equal the NumPy engine's and a fresh index's bit for bit, every variant (one engine, one contract)."""
    rng = np.random.default_rng([4, METHODS.index(method)])
    m = Memory(method=method, partition_days=1, merge_factor=3, merge_min=4)
    model = Model(analyzer="default", method=method)
    recs = [random_record(rng, f"r{i}") for i in range(200)]
    m.add(recs)
    model.add(recs)
    dead = [f"r{i}" for i in range(0, 200, 9)]
    m.delete(dead)
    model.delete(dead)
    qs = [random_query(rng) for _ in range(20)]
    ws = [random_where(rng) if i % 2 else None for i in range(20)]
    # each mode with its own default tie rule ("newest" breaks ties newest first), and the recency mode
    # under the sequence rule too
    for mode, ties in (("exhaustive", None), ("newest", None), ("newest", "oldest")):
        ids, scores = model.search(qs, 10, where=ws, ties=ties or ("newest" if mode == "newest" else "oldest"))
        got = m.search(qs, k=10, where=ws, backend="cupy", mode=mode, ties=ties)
        assert got.meta["backend"] == "cupy"
        assert_same(got, ids, scores, f"cupy {method} {mode} ties={ties}")
