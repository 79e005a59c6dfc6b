"""gpuir.Retriever over a Memory: configuration, channels against independent oracles, growth, persistence."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import zlib

import numpy as np
import pytest
from _helpers import without_times

from gpuir import Memory, Retriever, RetrieverConfig
from gpuir.retrieve import ChannelConfig, default_config

TURNS = [
    ("t1", "s1", "ta", "Alice: I adopted a puppy last week"),
    ("t2", "s1", "ta", "Bob: what did you name the puppy"),
    ("t3", "s1", "ta", "Alice: his name is Biscuit"),
    ("t4", "s2", "ta", "Alice: my sister is moving to Berlin in June"),
    ("t5", "s2", "ta", "Bob: will you visit your sister in Berlin"),
    ("t6", "s3", "ta", "Bob: I started a pottery class"),
    ("t7", "s3", "ta", "Alice: pottery sounds relaxing, my sister likes it too"),
    ("u1", "s9", "tb", "Carol: my puppy Biscuit and my sister in Berlin"),
]


def records(rows=TURNS):
    return [{"id": i, "text": t, "session": s, "tenant": n, "role": "user" if i != "t2" else "assistant"}
            for i, s, n, t in rows]


def memory(rows=TURNS) -> Memory:
    m = Memory()
    m.add(records(rows))
    return m


class CountingEncoder:
    """Deterministic bag-of-words vectors (hashed words, L2-normalised); counts every text encoded."""

    dim = 4096

    def __init__(self):
        self.passages: list[str] = []
        self.queries: list[str] = []

    def _enc(self, texts):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().replace(":", " ").replace(",", " ").split():
                out[i, zlib.crc32(w.encode()) % self.dim] += 1.0
        n = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(n > 0, n, 1)

    def encode_passages(self, texts):
        self.passages.extend(texts)
        return self._enc(texts)

    def encode_queries(self, texts):
        self.queries.extend(texts)
        return self._enc(texts)


# --------------------------------------------------------------------------- configuration


def test_config_round_trip_and_json(tmp_path):
    cfg = RetrieverConfig(channels=[ChannelConfig("bm25_session", depth=7, weight=0.3),
                                    ChannelConfig("late", pooling="topk", pool_k=2, weight=0.7)], fusion="minmax")
    d = cfg.to_config()
    assert json.loads(json.dumps(d)) == d
    assert RetrieverConfig.from_config(d) == cfg
    assert RetrieverConfig.load(cfg.save(tmp_path / "c.json")) == cfg
    # the default is the LOCO-selected configuration (issue 19): en-large, z-score, session BM25 0.75 +
    # turn BM25 lse 0.25 + the temporal channel 0.5
    dd = default_config()
    assert dd.fusion == "z" and dd.analyzer == "en-large"
    assert [(c.kind, c.weight, c.pooling, c.lse_beta) for c in dd.channels] == [
        ("bm25_session", 0.75, "max", 1.0), ("bm25_pool", 0.25, "lse", 1.0), ("temporal", 0.5, "max", 1.0)]


@pytest.mark.parametrize("bad, msg", [
    ({"channels": []}, "at least one channel"),
    ({"channels": [{"kind": "nope"}]}, "unknown channel kind"),
    ({"channels": [{"kind": "bm25", "depth": 0}]}, "depth"),
    ({"channels": [{"kind": "bm25_pool", "pooling": "mean"}]}, "pooling"),
    ({"channels": [{"kind": "bm25"}, {"kind": "dense"}], "fusion": None}, "exactly one channel"),
    ({"channels": [{"kind": "bm25"}], "fusion": "borda"}, "unknown fusion"),
    ({"channels": [{"kind": "bm25"}], "alpha": 0.5}, "unknown key"),
    ({"channels": [{"kind": "bm25"}], "analyzer": "klingon"}, "analyzer"),
    ({"channels": [{"kind": "bm25", "wieght": 1}]}, "unknown key"),
])
def test_config_errors(bad, msg):
    with pytest.raises(ValueError, match=msg):
        RetrieverConfig.from_config(bad)


def test_bad_search_arguments():
    r = Retriever(memory())
    with pytest.raises(ValueError, match="unit"):
        r.search("puppy", unit="conversation")
    with pytest.raises(ValueError, match="k must"):
        r.search("puppy", k=0)
    with pytest.raises(TypeError, match="Memory"):
        Retriever(["not a memory"])


# --------------------------------------------------------------------------- channels vs oracles


def test_record_unit_has_the_hits_of_memory_search():
    m = memory()
    own = RetrieverConfig(channels=[ChannelConfig("bm25_session")], fusion=None)  # the memory's analyzer
    large = Memory(analyzer="en-large")
    large.add(records())
    for r, ref_mem in ((Retriever(m, own), m), (Retriever(m), large)):  # default config: en-large analyzer
        for where in (None, {"tenant": "ta"}, {"tenant": "ta", "role": "user"}):
            got = r.search(["puppy name", "sister Berlin you"], k=4, where=where, backend="numpy")
            ref = ref_mem.search(["puppy name", "sister Berlin you"], k=4, where=where, backend="numpy")
            for i in range(2):
                if ref_mem is m:  # the same records: their times too
                    assert got.hits(i) == ref.hits(i)
                else:  # another memory stamped its own copies' times, a millisecond apart at most
                    assert [without_times(h) for h in got.hits(i)] == [without_times(h) for h in ref.hits(i)]


def test_default_record_unit_keeps_bm25_beside_the_temporal_channel():
    """The default's only record channel (temporal) runs for time questions alone: record searches also run
    exact BM25, so a question without a time gets Memory.search's hits and one with a time gets both channels."""
    m = Memory(analyzer="en-large")
    day = 86_400_000
    m.add([{"id": "a", "text": "the garden", "session": "s1", "tenant": "u", "time": 10 * day},
           {"id": "b", "text": "the garden was green", "session": "s1", "tenant": "u", "time": 10 * day},
           {"id": "new", "text": "we sat in the garden with friends", "session": "s2", "tenant": "u", "time": 41 * day},
           {"id": "c", "text": "we sat in the garden with friends and tea all afternoon long", "session": "s1",
            "tenant": "u", "time": 12 * day},
           {"id": "other", "text": "a film about trains", "session": "s2", "tenant": "u", "time": 41 * day}],
          time_unit="ms")
    r = Retriever(m)
    assert [c.config.kind for c in r.channels_for("record")] == ["bm25", "temporal"]
    plain = r.search("garden", k=5, where={"tenant": "u"}, backend="numpy", at=42 * day)
    assert plain.hits(0) == m.search("garden", k=5, where={"tenant": "u"}, backend="numpy").hits(0)
    assert plain.meta["ran"].tolist() == [[True, False]] and plain.ids(0) == ["a", "b", "new", "c"]
    timed = r.search("the garden yesterday", k=5, where={"tenant": "u"}, backend="numpy", at=42 * day)
    assert timed.meta["ran"].tolist() == [[True, True]] and timed.meta["windows"][0] is not None
    # yesterday's records join the candidates and yesterday's garden record moves up past b
    assert timed.ids(0)[:3] == ["a", "new", "b"] and "other" in timed.ids(0)


def _bm25_session_oracle(rows, query):
    """Session BM25 (Lucene idf, k1 1.2, b 0.75) computed here from the joined session texts."""
    from gpuir.analysis import Analyzer

    an = Analyzer("default")
    docs: dict[str, list[str]] = {}
    for _, s, _, t in rows:
        docs.setdefault(s, []).extend(an.tokens(t) if hasattr(an, "tokens") else an(t))
    N = len(docs)
    avg = sum(len(d) for d in docs.values()) / N
    q = an.tokens(query) if hasattr(an, "tokens") else an(query)
    out = {}
    for s, toks in docs.items():
        sc = 0.0
        for term in set(q):
            tf = toks.count(term)
            if tf == 0:
                continue
            df = sum(term in d for d in docs.values())
            idf = math.log(1 + (N - df + 0.5) / (df + 0.5))
            sc += idf * tf / (tf + 1.2 * (1 - 0.75 + 0.75 * len(toks) / avg))
        if sc > 0:
            out[s] = sc
    return out


def test_bm25_session_scores_a_session_as_one_document():
    cfg = RetrieverConfig(channels=[ChannelConfig("bm25_session")], fusion=None)
    r = Retriever(memory(), cfg)
    res = r.search(["sister Berlin puppy"], k=5, unit="session", backend="numpy")
    want = _bm25_session_oracle(TURNS, "sister Berlin puppy")
    got = {h["session"]: h["score"] for h in res.hits(0)}
    assert got.keys() == want.keys()
    for s, v in want.items():
        assert got[s] == pytest.approx(v, rel=1e-5)
    order = sorted(want, key=lambda s: (-want[s], s))
    assert res.ids(0) == order


@pytest.mark.parametrize("pooling, pool_k, beta", [("max", 2, 1.0), ("topk", 2, 1.0), ("lse", 2, 0.5)])
def test_bm25_pool_matches_pooling_by_hand(pooling, pool_k, beta):
    m = memory()
    cfg = RetrieverConfig(channels=[ChannelConfig("bm25_pool", depth=50, pooling=pooling, pool_k=pool_k,
                                                  lse_beta=beta)], fusion=None)
    res = Retriever(m, cfg).search(["sister puppy pottery"], k=5, where={"tenant": "ta"}, unit="session",
                                   backend="numpy")
    per: dict[str, list[float]] = {}
    for h in m.search("sister puppy pottery", k=50, where={"tenant": "ta"}, backend="numpy").hits(0):
        per.setdefault(h["session"], []).append(h["score"])
    if pooling == "max":
        want = {s: max(v) for s, v in per.items()}
    elif pooling == "topk":
        want = {s: float(np.mean(sorted(v, reverse=True)[:pool_k])) for s, v in per.items()}
    else:
        want = {s: math.log(sum(math.exp(beta * x) for x in v)) / beta for s, v in per.items()}
    got = {h["session"]: h["score"] for h in res.hits(0)}
    assert set(got) == set(want) == {"s1", "s2", "s3"}
    for s in want:
        assert got[s] == pytest.approx(want[s], rel=1e-5)
    # session hits carry their best records, best first, from that session only
    for h in res.hits(0):
        assert h["records"] and all(x["session"] == h["session"] for x in h["records"])
        assert [x["score"] for x in h["records"]] == sorted((x["score"] for x in h["records"]), reverse=True)


@pytest.mark.parametrize("kind", ["dense", "late"])
def test_dense_channels_match_cosines_by_hand(kind):
    enc = CountingEncoder()
    cfg = RetrieverConfig(channels=[ChannelConfig(kind, depth=3, pooling="max")], fusion=None)
    r = Retriever(memory(), cfg, encoder=enc)
    unit = "record" if kind == "dense" else "session"
    res = r.search(["my sister in Berlin"], k=3, where={"tenant": "ta"}, unit=unit, backend="numpy")
    ta = [t for t in TURNS if t[2] == "ta"]
    q = CountingEncoder()._enc(["my sister in Berlin"])[0]
    cos = {i: float(CountingEncoder()._enc([t])[0] @ q) for i, _, _, t in ta}
    if kind == "late":
        cos = {s: max(cos[i] for i, s2, _, _ in ta if s2 == s) for s in dict.fromkeys(t[1] for t in ta)}
    want = sorted(cos, key=lambda x: -cos[x])[:3]
    assert res.ids(0) == want
    np.testing.assert_allclose(res.scores[0], [cos[x] for x in want], rtol=1e-5)


def test_default_fusion_is_z_of_the_two_channels():
    """The fused score is 0.75 z(session BM25) + 0.25 z(turn lse), computed here from the channels' own scores."""
    m = memory()
    r = Retriever(m)
    res = r.search(["sister Berlin puppy"], k=5, where={"tenant": "ta"}, unit="session", backend="numpy")
    ch = {c: {r.catalog.session_names[n]: s for n, s in zip(v.ids[0].tolist(), v.scores[0].tolist()) if n >= 0}
          for c, v in res.meta["channels"].items()}
    assert set(ch["bm25_session"]) == {"s1", "s2", "s3"}

    def z(d):
        v = np.array(list(d.values()), np.float64)
        return {k: (x - v.mean()) / v.std() for k, x in d.items()}

    za, zb = z(ch["bm25_session"]), z(ch["bm25_pool"])
    want = {s: 0.75 * za[s] + 0.25 * zb[s] for s in za}
    got = {h["session"]: h["score"] for h in res.hits(0)}
    assert got.keys() == want.keys()
    for s, v in want.items():
        assert got[s] == pytest.approx(v, abs=1e-5)


def test_tenant_is_a_boundary_for_every_channel():
    enc = CountingEncoder()
    cfg = RetrieverConfig(channels=[ChannelConfig("bm25_session"), ChannelConfig("bm25_pool"),
                                    ChannelConfig("late"), ChannelConfig("dense"), ChannelConfig("bm25")],
                          fusion="rrf")
    r = Retriever(memory(), cfg, encoder=enc)
    for unit in ("session", "record"):
        res = r.search(["puppy Biscuit sister Berlin"], k=10, where={"tenant": "tb"}, unit=unit, backend="numpy")
        assert res.ids(0) == (["s9"] if unit == "session" else ["u1"])
    # a non-tenant filter narrows sessions to those with a passing record
    res = r.search(["puppy"], k=10, where={"tenant": "ta", "role": "assistant"}, unit="session", backend="numpy")
    assert res.ids(0) == ["s1"]
    # per-query filters, one of which allows no record at all
    res = r.search(["puppy", "puppy", "sister"], k=10, where=[{"tenant": "ta", "role": "system"}, None,
                                                              {"tenant": "ta", "session": "s3"}],
                   unit="session", backend="numpy")
    assert res.ids(0) == [] and res.hits(0) == [] and np.all(res.scores[0] == -np.inf)
    assert {"s1", "s9"} <= set(res.ids(1)) and res.ids(2) == ["s3"]


# --------------------------------------------------------------------------- growth and persistence


def test_growth_found_by_every_channel_without_re_encoding(tmp_path):
    enc = CountingEncoder()
    m = memory()
    kinds = ["bm25", "bm25_session", "bm25_pool", "dense", "late"]
    rs = {k: Retriever(m, RetrieverConfig(channels=[ChannelConfig(k)], fusion=None), encoder=enc) for k in kinds}
    n0 = len(enc.passages)
    assert n0 == len(TURNS)  # the memory holds the vectors: two dense retrievers share them, encoded once
    m.add([{"id": "n1", "text": "Alice: the kayak trip to Norway was cold", "session": "s4", "tenant": "ta"}])
    m.add([{"id": "n2", "text": "Bob: kayak rental in Oslo", "session": "s1", "tenant": "ta"}])
    for k, r in rs.items():
        unit = "record" if k in ("bm25", "dense") else "session"
        res = r.search(["kayak Norway"], k=1, where={"tenant": "ta"}, unit=unit, backend="numpy")
        assert res.ids(0) == (["n1"] if unit == "record" else ["s4"]), k
    assert sorted(enc.passages[n0:]) == sorted(["Alice: the kayak trip to Norway was cold",
                                                "Bob: kayak rental in Oslo"])  # encoded by the memory's add
    # a deletion is seen too, and nothing is encoded again
    m.delete(["n1"])
    for k, r in rs.items():
        unit = "record" if k in ("bm25", "dense") else "session"
        got = r.search(["kayak Norway"], k=3, where={"tenant": "ta"}, unit=unit, backend="numpy").ids(0)
        assert "n1" not in got and "s4" not in got, k
    assert len(enc.passages) == n0 + 2


def test_save_and_open_beside_the_memory(tmp_path):
    enc = CountingEncoder()
    m = memory()
    cfg = RetrieverConfig(channels=[ChannelConfig("bm25_session", weight=0.5), ChannelConfig("late", weight=0.5)])
    r = Retriever(m, cfg, encoder=enc)
    m.save(tmp_path / "mem")
    folder = r.save()
    assert folder == tmp_path / "mem.retriever"
    before = r.search(["puppy name"], k=3, where={"tenant": "ta"}, unit="session", backend="numpy")
    m.close()
    m2 = Memory.open(tmp_path / "mem")
    enc2 = CountingEncoder()
    r2 = Retriever.open(m2, encoder=enc2)
    assert r2.config == cfg and enc2.passages == []  # embeddings came from disk
    after = r2.search(["puppy name"], k=3, where={"tenant": "ta"}, unit="session", backend="numpy")
    assert after.ids(0) == before.ids(0)
    np.testing.assert_allclose(after.scores, before.scores, rtol=1e-6)
    m2.close()
    with pytest.raises(FileNotFoundError, match="retriever.json"):
        Retriever.open(Memory(), folder=tmp_path / "nowhere")


# --------------------------------------------------------------------------- layering


_IMPORTS = ("import sys\n"
            "import gpuir, gpuir.memory, gpuir.retrieve\n"
            "from gpuir import Memory, Retriever\n"
            "m = Memory(); m.add([{'id': 'a', 'text': 'hello world', 'session': 's'}])\n"
            "r = Retriever(m)\n")
_CHECK = ("bad = [x for x in sys.modules if x.startswith(('gpuir.eval', 'cupy', 'torch'))]\n"
          "print(bad[:5]); sys.exit(1 if bad else 0)")


def test_imports_load_neither_eval_nor_cupy():
    p = subprocess.run([sys.executable, "-c", _IMPORTS + _CHECK], check=False, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_numpy_search_does_not_load_cupy():
    code = _IMPORTS + "r.search('hello', unit='session', backend='numpy').hits(0)\n" + _CHECK
    p = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_library_never_imports_eval():
    """No module of gpuir outside gpuir/eval imports gpuir.eval (it is a client of the library)."""
    import ast
    from pathlib import Path

    import gpuir

    root = Path(gpuir.__file__).parent
    offenders = []
    for f in root.rglob("*.py"):
        rel = f.relative_to(root)
        if rel.parts[0] == "eval":
            continue
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:  # resolve relative imports against the module's package
                    pkg = ["gpuir", *rel.parts[:-1]][: len(rel.parts) - node.level + 1]
                    mod = ".".join(pkg + ([mod] if mod else []))
                names = [mod] + [f"{mod}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n == "gpuir.eval" or n.startswith("gpuir.eval.") for n in names):
                offenders.append(str(rel))
    assert offenders == [], f"modules importing gpuir.eval: {sorted(set(offenders))}"


# --------------------------------------------------------------------------- CLI


def test_memory_search_cli_with_config_and_session_unit(tmp_path, capsys):
    from gpuir.cli import main

    recs = tmp_path / "r.jsonl"
    recs.write_text("".join(json.dumps(r) + "\n" for r in records()), encoding="utf-8")
    assert main(["memory", "add", str(tmp_path / "mem"), str(recs)]) == 0
    capsys.readouterr()
    args = ["memory", "search", str(tmp_path / "mem"), "--query", "sister Berlin", "-k", "2", "--where",
            '{"tenant": "ta"}', "--backend", "numpy"]
    assert main([*args, "--unit", "session"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert [h["session"] for h in hits] == ["s2", "s3"] and hits[0]["records"][0]["session"] == "s2"
    cfg = RetrieverConfig(channels=[ChannelConfig("bm25_pool", pooling="topk", pool_k=2)], fusion=None)
    cfg.save(tmp_path / "c.json")
    assert main([*args, "--unit", "session", "--config", str(tmp_path / "c.json"), "--format", "trec"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[2] for ln in lines] == ["s2", "s3"]
    # a retriever saved beside the memory is used when no --config is given
    m = Memory.open(tmp_path / "mem", writer=False)
    one = RetrieverConfig(channels=[ChannelConfig("bm25_pool", depth=1)], fusion=None)  # one session at most
    Retriever(m, one).save(tmp_path / "mem.retriever")
    m.close()
    assert main([*args, "--unit", "session", "--format", "trec"]) == 0
    assert [ln.split()[2] for ln in capsys.readouterr().out.splitlines()] == ["s2"]
    # bad input: a clear message, exit 2
    (tmp_path / "bad.json").write_text('{"channels": [{"kind": "bm26"}]}', encoding="utf-8")
    assert main([*args, "--config", str(tmp_path / "bad.json")]) == 2
    assert "unknown channel kind" in capsys.readouterr().err
