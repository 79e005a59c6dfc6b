"""Loaders: LoCoMo quirks, LongMemEval (oracle, plus one S check), BEIR format."""

from __future__ import annotations

import json
from datetime import datetime

import numpy as np
import pytest

from gpuir.eval.datasets import (
    load,
    load_beir,
    load_locomo,
    load_longmemeval,
    parse_locomo_date,
    parse_longmemeval_date,
    split_evidence,
)

# ----------------------------------------------------------------------------- LoCoMo


def test_locomo_counts(locomo):
    st = locomo.stats
    assert st["conversations"] == 10
    assert st["sessions"] == 272 == locomo.n_docs
    assert st["turns"] == 5882
    assert st["qa_items"] == 1986 == len(locomo.queries)
    assert st["qa_per_category"] == {
        "multi-hop": 282, "temporal": 321, "open-domain": 96, "single-hop": 841, "adversarial": 446
    }
    # 4 empty evidence lists -> no gold; nothing else loses all its gold
    assert st["empty_evidence"] == 4
    assert st["no_gold"] == 4
    scored = locomo.scored_queries()
    assert len(scored) == 1982
    assert st["scored_per_category"]["open-domain"] == 92


def test_locomo_ids_and_dates(locomo):
    q0 = locomo.queries[0]
    assert q0.qid == "conv-26:q0" and q0.category == "temporal"
    assert q0.gold == {"conv-26:S1": 1}
    assert locomo.doc_ids[0] == "conv-26:S1"
    # conv-26 has date keys up to 35 but 19 sessions: iterate sessions, not dates
    conv26 = [d for d in locomo.doc_ids if d.startswith("conv-26:")]
    assert len(conv26) == 19 and conv26[-1] == "conv-26:S19"
    assert locomo.stats["unused_date_keys"] == 16
    assert locomo.doc_dates[0] == datetime(2023, 5, 8, 13, 56)
    assert all(d is not None for d in locomo.doc_dates)
    # questions see only their own conversation
    assert set(q0.candidates) == set(conv26)
    # adversarial items without an 'answer' keep their adversarial_answer
    adv = [q for q in locomo.queries if q.category == "adversarial"]
    assert len(adv) == 446 and all(q.meta["answer"] is not None for q in adv)


def test_locomo_multi_id_strings_resolve_to_every_session(locomo):
    by = {q.qid: q for q in locomo.queries}
    assert set(by["conv-26:q37"].gold) == {"conv-26:S8", "conv-26:S9"}  # "D8:6; D9:17"
    assert set(by["conv-49:q31"].gold) == {"conv-49:S9", "conv-49:S4"}  # "D9:1 D4:4 D4:6"
    assert set(by["conv-49:q38"].gold) == {"conv-49:S22", "conv-49:S9"}
    assert set(by["conv-49:q46"].gold) == {"conv-49:S21", "conv-49:S11"}
    assert locomo.stats["multi_id_strings"] == 4


def test_locomo_malformed_ids_skipped_and_counted(locomo):
    st = locomo.stats
    assert st["malformed_ids"] == 2  # "D", "D:11:26"
    assert st["unknown_turn_ids"] == 2  # "D10:19", "D4:36"
    assert st["noncanonical_ids"] == 1  # "D30:05" -> D30:5, which exists
    assert sorted(st["skipped_ids"]) == sorted(
        ["conv-42:q58:D10:19", "conv-42:q88:D", "conv-43:q18:D:11:26", "conv-47:q38:D4:36"]
    )
    by = {q.qid: q for q in locomo.queries}
    assert by["conv-42:q88"].gold == {"conv-42:S1": 1}  # ["D1:18", "D", "D1:20"]
    assert "conv-43:S11" not in by["conv-43:q18"].gold
    assert by["conv-50:q69"].gold == {"conv-50:S30": 1}
    assert by["conv-50:q69"].scored


def test_locomo_turn_unit_and_options(data_dir):
    p = data_dir / "locomo" / "locomo10.json"
    t = load_locomo(p, unit="turn")
    assert t.n_docs == 5882 and t.doc_ids[2] == "conv-26:D1:3"
    assert t.queries[0].gold == {"conv-26:D1:3": 1}
    assert len(t.scored_queries()) == 1982
    by = {q.qid: q for q in t.queries}
    assert set(by["conv-49:q31"].gold) == {"conv-49:D9:1", "conv-49:D4:4", "conv-49:D4:6"}
    s = load_locomo(p, speakers=False, categories=[1, 2, 3, "single-hop"])
    assert len(s.scored_queries()) == 1982 - 446
    assert not s.doc_texts[0].startswith("Caroline:")
    with pytest.raises(ValueError, match="unknown LoCoMo category"):
        load_locomo(p, categories=["nope"])
    with pytest.raises(ValueError, match="unit"):
        load_locomo(p, unit="word")


def test_locomo_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="--data"):
        load_locomo(tmp_path / "missing.json")
    bad = tmp_path / "x.json"
    bad.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="does not look like LoCoMo"):
        load_locomo(bad)


def test_helpers():
    assert split_evidence(["D8:6; D9:17", "D1:1"]) == ["D8:6", "D9:17", "D1:1"]
    assert parse_locomo_date("1:56 pm on 8 May, 2023") == datetime(2023, 5, 8, 13, 56)
    assert parse_locomo_date("garbage") is None
    assert parse_longmemeval_date("2023/05/30 (Tue) 23:40") == datetime(2023, 5, 30, 23, 40)


# ----------------------------------------------------------------------------- LongMemEval


def test_longmemeval_oracle(oracle):
    st = oracle.stats
    assert st["questions"] == 500 and st["abstention"] == 30
    assert st["questions_per_type"] == {
        "temporal-reasoning": 133, "multi-session": 133, "knowledge-update": 78,
        "single-session-user": 70, "single-session-assistant": 56, "single-session-preference": 30,
    }
    assert len(oracle.scored_queries()) == 470
    assert all(q.abstention and not q.scored for q in oracle.queries if q.qid.endswith("_abs"))
    assert st["session_slots"] == 948 and oracle.n_docs == 940  # shared ids de-duplicated
    assert st["duplicate_session_slots"] == 8
    q = oracle.queries[0]
    assert set(q.gold) <= set(q.candidates) and all(g.startswith("answer_") for g in q.gold)
    assert isinstance(q.date, datetime)
    assert len(q.meta["haystack_dates"]) == len(q.candidates)
    # abstention questions can be scored on request
    inc = load_longmemeval(oracle.source, split="oracle", include_abstention=True, cache=False)
    assert len(inc.scored_queries()) == 500


def test_longmemeval_roles_and_filters(oracle):
    allr = load_longmemeval(oracle.source, split="oracle", roles="all", cache=False)
    assert allr.doc_ids == oracle.doc_ids
    assert all(len(a) >= len(u) for a, u in zip(allr.doc_texts, oracle.doc_texts))
    f = oracle.candidate_filters()
    assert len(f) == 500 and all(isinstance(x, np.ndarray) and x.dtype == np.int64 for x in f)
    assert [oracle.doc_ids[i] for i in f[0]] == sorted(oracle.queries[0].candidates, key=oracle.doc_index.get)
    # cache: same object for the same file and options
    assert load_longmemeval(oracle.source, split="oracle") is load_longmemeval(oracle.source, split="oracle")


def test_longmemeval_conflicting_session_ids(tmp_path):
    items = [
        {"question_id": "a", "question": "q?", "question_type": "multi-session", "answer": "x",
         "haystack_session_ids": ["s1", "answer_1"], "haystack_dates": ["2023/05/30 (Tue) 23:40"] * 2,
         "haystack_sessions": [[{"role": "user", "content": "hello"}], [{"role": "user", "content": "x"}]],
         "answer_session_ids": ["answer_1"]},
        {"question_id": "b_abs", "question": "q?", "question_type": "multi-session", "answer": "x",
         "haystack_session_ids": ["s1"], "haystack_dates": ["2023/05/30 (Tue) 23:40"],
         "haystack_sessions": [[{"role": "user", "content": "different"}]],
         "answer_session_ids": ["answer_9"]},
    ]
    p = tmp_path / "lme.json"
    p.write_text(json.dumps(items))
    with pytest.raises(ValueError, match="different content"):
        load_longmemeval(p, cache=False)
    items[1]["haystack_sessions"][0][0]["content"] = "hello"
    p.write_text(json.dumps(items))
    ds = load_longmemeval(p, cache=False)
    assert ds.n_docs == 2 and ds.stats["gold_not_in_haystack"] == 1
    assert [q.scored for q in ds.queries] == [True, False]
    bad = tmp_path / "bad.json"
    bad.write_text("[{}]")
    with pytest.raises(ValueError, match="does not look like LongMemEval"):
        load_longmemeval(bad, cache=False)


def test_longmemeval_s_counts(lme_s):
    """One check on the 499-question S file (loaded once per session, see conftest-free fixture below)."""
    st = lme_s.stats
    assert st["questions"] == 499 and st["abstention"] == 30
    assert st["session_slots"] == 23806 and lme_s.n_docs == 19167
    assert st["gold_not_in_haystack"] == 0
    assert len(lme_s.scored_queries()) == 469
    assert 38 <= min(len(q.candidates) for q in lme_s.queries)
    assert max(len(q.candidates) for q in lme_s.queries) <= 62


@pytest.fixture(scope="session")
def lme_s(data_dir):
    return load_longmemeval(data_dir / "longmemeval" / "longmemeval_s_cleaned_499.json.gz", split="s")


# ----------------------------------------------------------------------------- BEIR


def test_beir_loader(tmp_path, beir_toy):
    d = beir_toy
    ds = load_beir(d)
    assert ds.doc_ids == ["d1", "d2", "d3"] and ds.doc_texts[0] == "Cats cats purr and sleep"
    assert [q.qid for q in ds.queries] == ["q1", "q2", "q3"]
    assert ds.queries[0].gold == {"d1": 2}
    assert [q.scored for q in ds.queries] == [True, True, False]
    assert ds.stats["qrels_unknown_docs"] == 1 and ds.stats["qrels_unknown_queries"] == 1
    assert ds.candidate_filters() is None
    assert load("beir", d).n_docs == 3
    with pytest.raises(FileNotFoundError, match="available splits: test"):
        load_beir(d, split="dev")
    with pytest.raises(FileNotFoundError, match="BEIR folder not found"):
        load_beir(tmp_path / "nope")
