"""Retrieval-side answer metrics on hand-made examples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuir.eval.answers import answer_metrics, answer_recall, answer_substr, normalize_answer


def test_normalize_answer():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffel tower"
    assert normalize_answer(2022) == "2022"
    assert normalize_answer("An apple, a day") == "apple day"


def test_substring_on_word_boundaries():
    texts = ["Caroline: I went to the LGBTQ support group on 7 May 2023.", "Mel: nice"]
    assert answer_substr("7 May 2023", texts) == 1.0
    assert answer_substr("May", ["Mayhem at the zoo"]) == 0.0  # not inside a word
    assert answer_substr("support group", ["a supportgroup"]) == 0.0
    assert math.isnan(answer_substr(None, texts)) and math.isnan(answer_substr("!!", texts))


def test_token_recall():
    assert answer_recall("red blue green", ["Red is nice", "and green too"]) == pytest.approx(2 / 3)
    assert answer_recall("the cat", ["no"]) == 0.0
    assert math.isnan(answer_recall("", ["x"]))


def test_answer_metrics_of_a_run():
    docs = ["alpha beta", "gamma delta", "the answer is paris", "x", "y", "z"]
    ranked = np.array([[2, 0, -1, -1, -1, -1, -1],   # answer doc first
                       [3, 4, 5, 0, 1, 2, -1],       # answer doc at rank 6: outside the top 5
                       [0, 1, -1, -1, -1, -1, -1]])
    out = answer_metrics(ranked, docs, ["Paris", "paris", None], cutoffs=(5, 10))
    np.testing.assert_array_equal(out["answer_substr@5"][:2], [1.0, 0.0])
    np.testing.assert_array_equal(out["answer_substr@10"][:2], [1.0, 1.0])
    assert np.isnan(out["answer_substr@5"][2]) and np.isnan(out["answer_recall@5"][2])
    out = answer_metrics(ranked, docs, ["beta gamma", "gamma", None])
    assert out["answer_recall@5"][0] == 0.5 and out["answer_recall@5"][1] == 1.0
    with pytest.raises(ValueError, match="answers"):
        answer_metrics(ranked, docs, ["a"])


def test_evaluate_reports_answer_metrics_over_questions_with_answers():
    from gpuir.eval.datasets import EvalDataset, EvalQuery
    from gpuir.eval.runner import evaluate

    docs = ["the cat sat on the mat", "dogs bark at the mailman", "paris is the capital of france"]
    qs = [EvalQuery("q0", "where did the cat sit", {"d0": 1}, "g0", "a", meta={"answer": "on the mat"}),
          EvalQuery("q1", "who do dogs bark at", {"d1": 1}, "g1", "a", meta={"answer": "the postman"}),
          EvalQuery("q2", "capital of france", {"d2": 1}, "g2", "b", meta={"answer": None})]
    ds = EvalDataset("toy", "document", ["d0", "d1", "d2"], docs, [None] * 3, qs)
    res = evaluate(ds, "bm25", k=3, n_boot=50)
    sub = res.per_query["answer_substr@5"]
    assert sub[0] == 1.0 and sub[1] == 0.0 and np.isnan(sub[2])
    assert res.per_query["answer_recall@5"][1] == 0.0  # "postman" appears in no document ("the" is an article)
    s = res.summary()
    assert s["overall"]["answer_substr@5"]["n"] == 2 and s["overall"]["answer_substr@5"]["mean"] == 0.5
    assert s["by_category"]["b"]["answer_substr@5"]["n"] == 0 and s["overall"]["hit@1"]["n"] == 3
    assert "-" in res.table(["hit@1", "answer_substr@5"])  # category b: no answer, an empty cell
