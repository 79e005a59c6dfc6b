"""The shipped default's LoCoMo Hit@1, scored without the evaluation harness (issue 19, "Must show").

``bench/locomo_independent.py`` reads ``locomo10.json`` itself, builds the memory, asks
``Retriever.search`` and scores Hit@1 from the hits and the gold evidence with code of its own
(no ``gpuir.eval``). The figure must reach 0.72, and ``gpuir eval locomo --method default``
must rank the same top session for every question and report the same Hit@1.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "locomo_independent.py"


def _scorer():
    spec = importlib.util.spec_from_file_location("locomo_independent", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_scorer_imports_nothing_of_the_harness():
    src = BENCH.read_text(encoding="utf-8")
    assert "gpuir.eval" not in src.replace("(no gpuir.eval", "").replace("(no ``gpuir.eval``)", "").replace(
        "no code with ``gpuir.eval``", "")


def test_scorer_reads_gold_from_the_file(tmp_path):
    """Hand-made two-session conversation: evidence ids of existing turns make the gold, others do not."""
    mod = _scorer()
    data = [{"sample_id": "c1", "conversation": {
        "speaker_a": "A", "speaker_b": "B",
        "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "I adopted a puppy"}],
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_2": [{"speaker": "B", "dia_id": "D2:1", "text": "Berlin is lovely"},
                      {"speaker": "A", "dia_id": "D2:2", "text": "my sister moves there"}],
        "session_2_date_time": "10:00 am on 9 June, 2023",
        "session_3_date_time": "10:00 am on 1 July, 2024"},  # a date key without a session
        "qa": [{"question": "where does the sister move?", "evidence": ["D2:2; D9:1"], "category": 4},
               {"question": "no usable evidence", "evidence": ["D7:3"], "category": 1}]}]
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    records, questions = mod.read_locomo(path)
    assert [r["id"] for r in records] == ["c1:D1:1", "c1:D2:1", "c1:D2:2"]
    assert records[2]["text"] == "A: my sister moves there" and records[2]["session"] == "c1:S2"
    assert [q["gold"] for q in questions] == [{"c1:S2"}, set()]
    assert questions[0]["at"] == 1686304800000  # 9 June 2023 10:00 UTC, the last session (not the dangling key)
    ranked = mod.top_sessions(records, questions, k=2, backend="numpy")
    assert ranked[0][0] == "c1:S2"
    np.testing.assert_array_equal(mod.hit_at(ranked, questions, 1), [1.0])  # the unscored question is left out


@pytest.fixture(scope="module")
def independent(data_dir):
    mod = _scorer()
    records, questions = mod.read_locomo(data_dir / "locomo" / "locomo10.json")
    ranked = mod.top_sessions(records, questions, k=1, backend="numpy")
    return mod, questions, ranked


def test_default_hit1_at_least_072_scored_independently(independent):
    mod, questions, ranked = independent
    h1 = mod.hit_at(ranked, questions, 1)
    assert h1.size == 1982
    assert h1.mean() >= 0.72


def test_eval_default_agrees_with_the_independent_scorer(independent, data_dir, tmp_path):
    from gpuir.cli import main

    mod, questions, ranked = independent
    run, rep = tmp_path / "run.trec", tmp_path / "report.json"
    rc = main(["eval", "locomo", "--data", str(data_dir / "locomo" / "locomo10.json"), "--method", "default",
               "-k", "1", "--backend", "numpy", "--n-boot", "10", "--no-progress", "--run", str(run),
               "--out", str(rep)])
    assert rc == 0
    top = {}
    for line in run.read_text(encoding="utf-8").splitlines():
        qid, _, doc, rank, _, _ = line.split()
        if rank == "1":
            top[qid] = doc
    assert {q["qid"]: r[0] for q, r in zip(questions, ranked) if r} == top
    report = json.loads(rep.read_text(encoding="utf-8"))
    assert report["overall"]["hit@1"]["mean"] == pytest.approx(mod.hit_at(ranked, questions, 1).mean(),
                                                                          abs=1e-12)
