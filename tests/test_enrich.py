"""Storage-time vocabulary enrichment (bridge terms) for the lexical index."""

from __future__ import annotations

import json

import pytest

from gpuir.retrieve.enrich import enrich_text, enrichment_terms, load_table


def test_shipped_table_loads():
    t = load_table("bridges")
    assert len(t) >= 300
    assert "outdoor activity" in t["hiking"]
    assert "pet" in t["adopted"]
    assert "purchase" in t["bought"]
    assert all(k == k.lower() and " " not in k for k in t)
    assert all(isinstance(v, list) and v for v in t.values())
    t["hiking"].append("x")  # a copy: the next load is unaffected
    assert "x" not in load_table("bridges")["hiking"]


def test_terms_appended_once_each():
    text = "We hiked, then went camping and hiking again; I adopted a puppy and a kitten."
    out = enrich_text(text)
    assert out.startswith(text)
    tail = out[len(text):].split("\n")[-1]
    assert tail.count("outdoor activity") == 1
    assert tail.count("pet") == 1 and tail.count("animal") == 1
    assert enrichment_terms(text) == ["outdoor activity", "pet", "animal"]


def test_unchanged_without_triggers_and_terms_already_present():
    assert enrich_text("The quarterly report is due on Friday.") == "The quarterly report is due on Friday."
    # "pet" is in the text already: only "animal" is added
    assert enrichment_terms("My pet dog is old.") == ["animal"]
    # a query term itself is never altered: the original text stays a prefix, word for word
    q = "Bought a new laptop"
    assert enrich_text(q).split("\n")[0] == q


def test_custom_table_and_errors(tmp_path):
    assert enrich_text("I like kayaks", {"kayaks": ["boat", "boat"]}) == "I like kayaks\nboat"
    with pytest.raises(ValueError, match="no enrichment table"):
        load_table("nosuch")
    with pytest.raises(TypeError, match="must be a str"):
        enrich_text(None)
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"groups": [{"bridges": ["b"], "words": ["two words"]}]}))
    with pytest.raises(ValueError, match="one lowercase token"):
        load_table(str(p))
    p.write_text(json.dumps({"groups": [{"bridges": ["vehicle"], "words": ["car"]}]}))
    assert load_table(str(p)) == {"car": ["vehicle"]}
