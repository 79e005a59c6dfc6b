"""The cascade: margins, triggers, escalated rows equal to the full configuration, the others to the
cheap one, only escalated queries encoded; threshold choice on a training fold."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from _retrieve_doubles import install

from gpuir import Memory, Retriever, RetrieverConfig
from gpuir.results import SearchResults
from gpuir.retrieve import choose_tau, choose_tau_per_type
from gpuir.retrieve.cascade import margins

TURNS = [
    ("t1", "s1", "Alice: I adopted a puppy last week"),
    ("t2", "s1", "Bob: what did you name the puppy"),
    ("t3", "s1", "Alice: his name is Biscuit"),
    ("t4", "s2", "Alice: my sister is moving to Berlin in June"),
    ("t5", "s2", "Bob: will you visit your sister in Berlin"),
    ("t6", "s3", "Bob: I started a pottery class"),
    ("t7", "s3", "Alice: pottery sounds relaxing, my sister likes it too"),
    ("t8", "s4", "Bob: Berlin pottery market in June was fun"),
]
QUERIES = ["puppy name Biscuit", "sister Berlin", "pottery", "June Berlin pottery sister", "when did Bob visit"]


class Encoder:
    """Hashed bag of words; records every query it encodes."""

    dim = 512

    def __init__(self):
        self.queries: list[str] = []

    def _enc(self, texts):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().replace(":", " ").replace(",", " ").split():
                out[i, zlib.crc32(w.encode()) % self.dim] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    def encode_passages(self, texts):
        return self._enc(texts)

    def encode_queries(self, texts):
        self.queries.extend(texts)
        return self._enc(texts)


def memory() -> Memory:
    m = Memory()
    m.add([{"id": i, "session": s, "text": t, "tenant": "a"} for i, s, t in TURNS])
    return m


CHEAP = [{"kind": "bm25_session", "weight": 0.5}, {"kind": "bm25_pool", "weight": 0.3, "pooling": "lse"}]
FULL = [*CHEAP, {"kind": "late", "weight": 0.2}]


def cfg(channels, **kw) -> RetrieverConfig:
    return RetrieverConfig.from_config({"channels": channels, "fusion": "z", **kw})


def test_margins_by_hand():
    r = SearchResults(np.array([[3, 1, -1], [2, -1, -1], [5, 6, 7], [1, 2, 3]]),
                      np.array([[4, 3, -np.inf], [2, -np.inf, -np.inf], [-2, -3, -4], [0, 0, 0]], np.float32))
    np.testing.assert_allclose(margins(r), [0.25, 0.0, 0.5, 0.0])


@pytest.mark.parametrize("unit", ["session", "record"])
def test_always_is_the_full_configuration_and_never_the_cheap_one(unit):
    m = memory()
    chans = CHEAP + [{"kind": "bm25", "weight": 0.2}] + FULL[2:] + [{"kind": "dense", "weight": 0.2}]
    full = Retriever(m, cfg(chans), encoder=Encoder())
    cheap = Retriever(m, cfg(CHEAP + [{"kind": "bm25", "weight": 0.2}]), encoder=Encoder())
    esc = {"escalate": ["late", "dense"]}
    for trig, ref in (("always", full), ("never", cheap)):
        enc = Encoder()
        r = Retriever(m, cfg(chans, cascade={**esc, "trigger": trig}), encoder=enc)
        got = r.search(QUERIES, k=4, unit=unit, backend="numpy")
        want = ref.search(QUERIES, k=4, unit=unit, backend="numpy")
        assert got.keys == want.keys, trig
        np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5)
        assert got.meta["escalated"].tolist() == [trig == "always"] * len(QUERIES)
        assert enc.queries == (QUERIES if trig == "always" else [])


def test_margin_trigger_escalates_exactly_the_low_margin_queries():
    m = memory()
    cheap = Retriever(m, cfg(CHEAP)).search(QUERIES, k=10, unit="session", backend="numpy")
    s = cheap.scores.astype(np.float64)
    marg = np.array([(s[i, 0] - s[i, 1]) / abs(s[i, 0]) if len(cheap.keys[i]) >= 2 else 0.0
                     for i in range(len(QUERIES))])
    tau = float(np.median(marg))
    want_esc = marg < tau
    assert 0 < want_esc.sum() < len(QUERIES)
    enc = Encoder()
    r = Retriever(m, cfg(FULL, cascade={"escalate": ["late"], "trigger": "margin", "tau": tau}), encoder=enc)
    got = r.search(QUERIES, k=3, unit="session", backend="numpy")
    assert got.meta["escalated"].tolist() == want_esc.tolist()
    np.testing.assert_allclose(got.meta["margins"], marg, rtol=1e-5)
    assert enc.queries == [q for q, e in zip(QUERIES, want_esc) if e]  # the dense work skipped for the others
    full = Retriever(m, cfg(FULL), encoder=Encoder()).search(QUERIES, k=3, unit="session", backend="numpy")
    for i in range(len(QUERIES)):
        ref = full if want_esc[i] else cheap
        assert got.ids(i) == ref.ids(i)[:3]
        np.testing.assert_allclose(got.scores[i], ref.scores[i][:3], rtol=1e-5)
    assert {"cascade_cheap", "fusion", "total"} <= set(got.meta["timings"])


def test_per_type_trigger_uses_the_classifier(monkeypatch):
    install(monkeypatch)
    m = memory()
    c = cfg(FULL, cascade={"escalate": ["late"], "trigger": "per_type", "tau": 0.0,
                           "per_type": {"temporal": math.inf}, "classifier": "regex"})
    got = Retriever(m, c, encoder=Encoder()).search(QUERIES, k=3, unit="session", backend="numpy")
    assert got.meta["escalated"].tolist() == [False, False, False, False, True]  # "when ..." is temporal


def test_choose_tau_max_skip_at_parity():
    m = [0.1, 0.5, 0.9, 0.3]
    cheap = [0, 1, 1, 0]
    full = [1, 1, 1, 1]
    got = choose_tau(m, cheap, full)
    assert got["tau"] == pytest.approx(0.4) and got["skip_rate"] == 0.5 and got["quality"] == 1.0
    loose = choose_tau(m, cheap, full, tolerance=0.25)
    assert loose["tau"] == pytest.approx(0.2) and loose["skip_rate"] == 0.75 and loose["quality"] == 0.75
    assert choose_tau(m, [0, 0, 0, 0], full)["tau"] == math.inf  # nothing can be skipped
    assert choose_tau(m, full, full)["tau"] == 0.0  # everything can
    per = choose_tau_per_type(m + [0.2, 0.6, 0.3], cheap + [0, 1, 1], full + [1, 1, 1], ["a"] * 4 + ["b"] * 3)
    # type b skips its margins 0.3 and 0.6 (tau 0.25); one threshold for all would stop at 0.4 (margin 0.3 of a)
    assert per["per_type"] == {"a": pytest.approx(0.4), "b": pytest.approx(0.25)}
    assert per["skip_rate"] == pytest.approx(4 / 7) and per["quality"] == 1.0
    assert per["tau"] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="one value per question"):
        choose_tau([0.1], [1, 0], [1, 1])
    with pytest.raises(ValueError, match="finite"):
        choose_tau([float("nan")], [1], [1])
