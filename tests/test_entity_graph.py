"""Entity extraction and the entity graph's hop scores, incremental updates and persistence."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from gpuir.retrieve.entity_graph import HOP_SCORES, EntityGraph, extract_entities, is_multi_hop_query


# ---------------------------------------------------------------- extraction
@pytest.mark.parametrize("text, speaker, expected", [
    ("Caroline: Hey Mel! I went to the Pride Parade in New York last May.", "Caroline",
     ["caroline", "mel", "pride parade", "new york"]),
    ('I loved "Becoming Nicole" by Amy Ellis Nutt. The Beatles rock.', None,
     ["becoming nicole", "amy ellis nutt", "beatles"]),
    ("What did Caroline's friend do at the Museum of Modern Art on Monday?", None,
     ["caroline", "museum of modern art"]),
    # sentence-initial single words are dropped unless capitals, possessive or repeated
    ("Thanks, Melanie! Painting looks like a great outlet. LGBTQ support group.", None,
     ["melanie", "lgbtq"]),
    ("Visiting New York. Jon's dog. Boston was great, I loved Boston.", None,
     ["new york", "jon", "boston"]),
    ("Keep going! Take care.", None, []),
    # stopwords, pronouns, days and months never start or join a span
    ("On Tuesday I met The Rolling Stones in March and What Remains.", None, ["rolling stones", "remains"]),
    ('We read "The Name of the Wind" with Dr. Smith.', None, ["name of the wind", "smith"]),
    ("", "Ann", ["ann"]),
    ("nothing capitalised here", None, []),
])
def test_extract_entities(text, speaker, expected):
    assert extract_entities(text, speaker) == expected


def test_extract_entities_bad_input():
    with pytest.raises(TypeError, match="text must be a str"):
        extract_entities(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="speaker"):
        extract_entities("x", 3)  # type: ignore[arg-type]


def test_is_multi_hop():
    assert is_multi_hop_query("What do Alice and Bob have in common?")
    assert is_multi_hop_query("How is Carol related to Acme Corp?")
    assert not is_multi_hop_query("Where did Alice go?")
    assert not is_multi_hop_query("what do they have in common")
    assert EntityGraph().is_multi_hop("Did Alice and Bob both visit Paris?")


# ---------------------------------------------------------------- hop scoring
# Entities of each record (worked out by hand from the rules above):
#  10: alice bob paris | 11: bob carol acme corp | 12: carol tokyo | 13: tokyo dave
#  14: dave erin | 15: (none) | 16: zed | 17: paris
HAND = {
    10: "We saw Alice and Bob in Paris.",
    11: "Then Bob visited Carol at Acme Corp.",
    12: "Yesterday Carol flew to Tokyo.",
    13: "In Tokyo we met Dave.",
    14: "We think Dave likes Erin.",
    15: "Nothing here mentions anyone.",
    16: "We saw Zed at home.",
    17: "So Paris was lovely.",
}


def _hand_graph(**kw) -> EntityGraph:
    g = EntityGraph(hub_fraction=None, **kw)
    seqs = np.array(sorted(HAND), np.int64)
    g.add(seqs, [HAND[s] for s in seqs], [None] * len(seqs))
    return g


def test_hand_built_hops():
    g = _hand_graph()
    assert g.n_records == 8
    assert g.n_entities == 9  # alice bob paris carol acme corp tokyo dave erin zed
    # from alice: hop 0 {alice} -> r10; hop 1 {bob, paris} -> r11, r17; hop 2 {carol, acme corp} -> r12;
    # hop 3 {tokyo} -> r13; erin/dave (hop 4) and zed never.
    expect = {10: 0, 11: 1, 17: 1, 12: 2, 13: 3}
    for max_hops in range(4):
        seqs, scores = g.score("Where did Alice go?", max_hops=max_hops)
        want = sorted(((s, h) for s, h in expect.items() if h <= max_hops), key=lambda x: (x[1], x[0]))
        assert seqs.tolist() == [s for s, _ in want]
        assert scores.tolist() == pytest.approx([HOP_SCORES[h] for _, h in want])
        assert seqs.dtype == np.int64 and scores.dtype == np.float32
    # two query entities: a record takes its best hop
    seqs, scores = g.score("Did Erin ever meet Bob?", max_hops=2)
    # erin: r14 (0); dave -> r13 (1); tokyo -> r12 (2). bob: r10, r11 (0); alice, paris, carol, acme -> r17 (1)
    assert dict(zip(seqs.tolist(), scores.tolist())) == pytest.approx(
        {10: 1.0, 11: 1.0, 14: 1.0, 13: 0.6, 17: 0.6, 12: 0.6})
    assert seqs.tolist() == [10, 11, 14, 12, 13, 17]
    assert g.entity_hops("Did Erin ever meet Bob?", 1) == {
        "erin": 0, "bob": 0, "dave": 1, "alice": 1, "paris": 1, "carol": 1, "acme corp": 1}


def test_depth_allowed_and_unknown():
    g = _hand_graph()
    seqs, _ = g.score("Where did Alice go?", max_hops=3, depth=2)
    assert seqs.tolist() == [10, 11]
    # the filter restricts the graph itself: paths run through admitted records only.
    # admitted {10, 11, 13, 15}: alice -> r10 (0); bob, paris via r10 -> r11 (1); carol, acme via r11 (2)
    # admit no further record (r12 is out), so tokyo and r13 stay unreached.
    seqs, scores = g.score("Where did Alice go?", max_hops=3, allowed=np.array([10, 11, 13, 15], np.int64))
    assert seqs.tolist() == [10, 11] and scores.tolist() == pytest.approx([1.0, 0.6])
    seqs, scores = g.score("Where did Alice go?", max_hops=3, allowed=np.array([11, 13, 15], np.int64))
    assert seqs.size == 0  # alice's only record is filtered out: nothing to expand from
    everything = np.array(sorted(HAND), np.int64)
    for mh in range(4):
        a, b = g.score("Did Erin ever meet Bob?", max_hops=mh), g.score("Did Erin ever meet Bob?", max_hops=mh,
                                                                          allowed=everything)
        assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
    seqs, _ = g.score("Where did Alice go?", allowed=np.zeros(0, np.int64))
    assert seqs.size == 0
    assert g.query_entities("Where is Quentin?") == []
    seqs, scores = g.score("Where is Quentin?")
    assert seqs.shape == (0,) and scores.shape == (0,) and scores.dtype == np.float32
    assert g.query_entities("where did alice meet acme corp") == ["alice", "acme corp"]
    assert g.score("Zed?", depth=0)[0].size == 0


def test_bad_arguments():
    g = _hand_graph()
    for bad in (4, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_hops"):
            g.score("Alice", max_hops=bad)
    with pytest.raises(ValueError, match="depth"):
        g.score("Alice", depth=-1)
    with pytest.raises(ValueError, match="one entry per record"):
        g.add(np.array([1, 2]), ["a"], [None, None])
    with pytest.raises(ValueError, match="1-D integer"):
        g.add(np.array([[1]]), ["a"], [None])
    with pytest.raises(ValueError, match="distinct"):
        g.add(np.array([1, 1]), ["a", "b"], [None, None])
    with pytest.raises(ValueError, match="allowed"):
        g.score("Alice", allowed=np.array([0.5]))
    with pytest.raises(ValueError, match="hub_mode"):
        EntityGraph(hub_mode="x")


def test_empty_graph(tmp_path):
    g = EntityGraph()
    assert g.n_records == 0 and g.n_entities == 0
    s, sc = g.score("Where did Alice go?", max_hops=3)
    assert s.size == 0 and sc.size == 0
    g.remove(np.array([1, 2], np.int64))  # unknown seqs: ignored
    g.save(tmp_path / "g")
    h = EntityGraph.load(tmp_path / "g")
    assert h.n_records == 0 and h.score("Alice")[0].size == 0


# ---------------------------------------------------------------- hubs
def _hub_graph(mode: str) -> EntityGraph:
    texts = [f"Sam: I had tea at number {i}." for i in range(26)]
    texts += ["Sam: We went to Rome.", "Sam: We saw Rome and Milan again.", "Sam: I found Milan fun.",
              "Sam: I love Oslo."]
    g = EntityGraph(hub_mode=mode)  # default hub rule: > 10% of records and >= 20 of them
    g.add(np.arange(len(texts), dtype=np.int64), texts, ["Sam"] * len(texts))
    return g


def test_hubs_are_not_expanded():
    g = _hub_graph("demote")
    # rome: r26, r27 (0); milan via r27 -> r28 (1); oslo is only co-mentioned through the hub sam: unreached
    seqs, scores = g.score("What about Rome?", max_hops=3)
    assert seqs.tolist() == [26, 27, 28] and scores.tolist() == pytest.approx([1.0, 1.0, 0.6])
    # demote: sam-only records count as hop 1 when the query also names a non-hub entity
    seqs, scores = g.score("What did Sam say about Rome?", max_hops=2, depth=1000)
    hop = dict(zip(seqs.tolist(), scores.tolist()))
    assert hop[26] == hop[27] == 1.0 and hop[28] == pytest.approx(0.6) and hop[0] == pytest.approx(0.6)
    assert len(hop) == 30
    # a query naming only the hub: every record at hop 0
    seqs, scores = g.score("What did Sam say?", depth=1000)
    assert len(seqs) == 30 and set(scores.tolist()) == {1.0}
    # plain: the hub stays at hop 0
    p = _hub_graph("plain")
    seqs, scores = p.score("What did Sam say about Rome?", depth=1000)
    assert set(scores.tolist()) == {1.0} and len(seqs) == 30


def test_hubs_counted_within_allowed():
    g = _hub_graph("demote")
    n = 300  # another conversation: sam falls to 30 / 330 < 10% of all records
    g.add(np.arange(100, 100 + n, dtype=np.int64), [f"Kim: I had soup number {i}." for i in range(n)], ["Kim"] * n)
    sam = np.arange(30, dtype=np.int64)
    seqs, scores = g.score("What about Rome?", max_hops=3, allowed=sam)
    assert seqs.tolist() == [26, 27, 28] and scores.tolist() == pytest.approx([1.0, 1.0, 0.6])
    # an entity only records outside the filter mention is unknown under it: sam is not demoted
    g.add(np.array([999], np.int64), ["Kim: We flew to Lima."], ["Kim"])
    seqs, scores = g.score("What did Sam say about Lima?", allowed=sam, depth=1000)
    assert len(seqs) == 30 and set(scores.tolist()) == {1.0}
    # unfiltered, sam is no hub (kim is): rome -> sam (hop 1) -> every sam record at 0.6
    seqs, scores = g.score("What about Rome?", max_hops=3, depth=1000)
    assert seqs.tolist()[:2] == [26, 27] and len(seqs) == 30 and scores.tolist()[2:] == pytest.approx([0.6] * 28)


# ---------------------------------------------------------------- incremental == scratch
NAMES = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy",
         "New York", "Acme Corp"]


def _random_text(rng) -> str:
    k = int(rng.integers(0, 4))
    names = [NAMES[i] for i in rng.choice(len(NAMES), size=k, replace=False)]
    return "We met " + " and ".join(names) + " today." if names else "We met nobody today."


def _reference_hops(recs: dict[int, str], query_ents: list[str], max_hops: int) -> dict[int, int]:
    """Plain-Python BFS over the co-mention graph (no hubs), independent of the sparse code."""
    ents = {s: set(extract_entities(t)) for s, t in recs.items()}
    adj: dict[str, set[str]] = {}
    for es in ents.values():
        for a, b in itertools.permutations(es, 2):
            adj.setdefault(a, set()).add(b)
    known = set().union(*ents.values()) if ents else set()
    level = {e: 0 for e in query_ents if e in known}
    frontier = set(level)
    for h in range(1, max_hops + 1):
        nxt = {b for a in frontier for b in adj.get(a, ())} - set(level)
        level.update({e: h for e in nxt})
        frontier = nxt
    out = {}
    for s, es in ents.items():
        hs = [level[e] for e in es if e in level]
        if hs:
            out[s] = min(hs)
    return out


def _graph_state(g: EntityGraph):
    g._flush()
    keys = g._keys
    A = g._A.tocoo()
    pairs = {(keys[i], keys[j]): int(v) for i, j, v in zip(A.row, A.col, A.data) if v}
    df = {keys[i]: int(v) for i, v in enumerate(g._df) if v}
    return pairs, df


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_incremental_equals_scratch(seed):
    rng = np.random.default_rng(seed)
    g = EntityGraph(hub_fraction=None, batch=3)
    live: dict[int, str] = {}
    next_seq = 0
    for _ in range(40):
        if live and rng.random() < 0.35:
            pool = np.array(sorted(live), np.int64)
            gone = rng.choice(pool, size=int(rng.integers(1, min(len(pool), 5) + 1)), replace=False)
            gone = np.concatenate([gone, [10_000 + next_seq]])  # plus an unknown seq
            g.remove(gone)
            for s in gone.tolist():
                live.pop(s, None)
        else:
            n = int(rng.integers(1, 6))
            seqs = list(range(next_seq, next_seq + n))
            next_seq += n
            if live and rng.random() < 0.3:  # upsert an existing record
                seqs[0] = int(rng.choice(sorted(live)))
            texts = [_random_text(rng) for _ in seqs]
            g.add(np.array(seqs, np.int64), texts, [None] * n)
            live.update(zip(seqs, texts))
        if rng.random() < 0.3:  # query between updates (flushes, builds the cached CSC)
            g.score("Where is Alice?")
    scratch = EntityGraph(hub_fraction=None)
    order = sorted(live)
    scratch.add(np.array(order, np.int64), [live[s] for s in order], [None] * len(order))
    assert g.n_records == scratch.n_records == len(live)
    assert g.n_entities == scratch.n_entities
    assert _graph_state(g) == _graph_state(scratch)
    for name in NAMES:
        q = f"What about {name}?"
        key = name.lower()
        for max_hops in range(4):
            a = g.score(q, max_hops=max_hops, depth=10_000)
            b = scratch.score(q, max_hops=max_hops, depth=10_000)
            assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
            ref = _reference_hops(live, [key], max_hops)
            assert dict(zip(a[0].tolist(), a[1].tolist())) == pytest.approx(
                {s: HOP_SCORES[h] for s, h in ref.items()})
            # a where filter: the graph of the admitted records only
            sub = np.sort(rng.choice(np.array(order, np.int64), size=len(order) // 2, replace=False))
            c = g.score(q, max_hops=max_hops, depth=10_000, allowed=sub)
            ref = _reference_hops({s: live[s] for s in sub.tolist()}, [key], max_hops)
            assert dict(zip(c[0].tolist(), c[1].tolist())) == pytest.approx(
                {s: HOP_SCORES[h] for s, h in ref.items()})


def test_remove_everything_then_add():
    g = _hand_graph(batch=2)
    g.remove(np.array(sorted(HAND), np.int64))
    assert g.n_records == 0 and g.n_entities == 0
    assert g.score("Where did Alice go?")[0].size == 0
    g.add(np.array([5], np.int64), ["We saw Alice in Paris."], [None])
    seqs, scores = g.score("Paris?", max_hops=1)  # "Paris?" alone: sentence-initial, not an entity
    assert seqs.size == 0
    seqs, scores = g.score("Is it in Paris?", max_hops=1)
    assert seqs.tolist() == [5] and scores.tolist() == [1.0]


# ---------------------------------------------------------------- persistence
def test_save_load_round_trip(tmp_path):
    g = _hand_graph(batch=2)
    g.remove(np.array([13], np.int64))
    g.add(np.array([20], np.int64), ["Ann: I saw Carol."], ["Ann"])
    g.save(tmp_path / "eg")
    h = EntityGraph.load(tmp_path / "eg")
    assert (h.n_records, h.n_entities) == (g.n_records, g.n_entities)
    assert _graph_state(h) == _graph_state(g)
    for q in ("Where did Alice go?", "Ann?", "Is Ann here?", "What did Erin do?"):
        for mh in range(4):
            a, b = g.score(q, max_hops=mh), h.score(q, max_hops=mh)
            assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
    # the loaded graph keeps updating
    h.add(np.array([21], np.int64), ["We met Alice and Ann."], [None])
    assert 21 in h.score("Is Ann here?")[0].tolist()
    assert sorted(p.name for p in (tmp_path / "eg").iterdir()) == ["entity_graph.json", "entity_graph.npz"]
    # a torn save is detected
    meta = tmp_path / "eg" / "entity_graph.json"
    doc = json.loads(meta.read_text())
    doc["npz_sha256"] = "0" * 64
    meta.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="does not match"):
        EntityGraph.load(tmp_path / "eg")
    with pytest.raises(FileNotFoundError, match="no entity graph"):
        EntityGraph.load(tmp_path / "nothing")


def test_threads_share_one_graph():
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(7)
    texts = [_random_text(rng) for _ in range(400)]
    g = EntityGraph(hub_fraction=None, batch=16)
    ref = EntityGraph(hub_fraction=None)
    ref.add(np.arange(400, dtype=np.int64), texts, [None] * 400)

    def add(i):  # 25 batches of 16, in any order, while other threads query
        g.add(np.arange(16 * i, 16 * i + 16, dtype=np.int64), texts[16 * i:16 * i + 16], [None] * 16)
        return g.score("What about Alice?", max_hops=2, depth=5)

    with ThreadPoolExecutor(4) as ex:
        list(ex.map(add, range(25)))
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda name: g.score(f"What about {name}?", max_hops=3, depth=10_000), NAMES * 3))
    for name, (s, sc) in zip(NAMES * 3, got):
        rs, rsc = ref.score(f"What about {name}?", max_hops=3, depth=10_000)
        assert s.tolist() == rs.tolist() and sc.tolist() == rsc.tolist()
