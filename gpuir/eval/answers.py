"""Retrieval-side answer metrics: is the gold *answer* in what was retrieved?

Ranking metrics ask whether the gold evidence session is ranked high; these ask
whether the retrieved text holds the answer a reader would need (as AgentIR
reports them):

* ``answer_substr@k``: 1 when the gold answer, normalised, occurs as a whole-word
  substring of one of the top-k retrieved texts, normalised; else 0.
* ``answer_recall@k``: the share of the gold answer's distinct normalised tokens
  found among the tokens of the top-k retrieved texts (token recall).

Normalisation is SQuAD's: lower case, punctuation removed, the articles
"a", "an", "the" removed, whitespace collapsed. Answers come from
``EvalQuery.meta["answer"]`` (LoCoMo ``answer``, or ``adversarial_answer`` for
adversarial items; LongMemEval ``answer``; integers are read as text). A question
without an answer, or whose answer normalises to nothing, gets NaN (left out of
the means).
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["ANSWER_METRICS", "answer_metrics", "answer_recall", "answer_substr", "normalize_answer"]

#: Names (without the cut-off) of the answer metrics.
ANSWER_METRICS: tuple[str, ...] = ("answer_substr", "answer_recall")

_PUNCT = re.compile("[" + re.escape(string.punctuation + "\u2018\u2019\u201c\u201d\u2013\u2014") + "]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: Any) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    s = str(text).lower()
    s = _PUNCT.sub(" ", s)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def answer_substr(answer: Any, texts: Sequence[str]) -> float:
    """1.0 when the normalised ``answer`` occurs, on word boundaries, in one of ``texts`` (normalised); NaN for no answer."""
    a = normalize_answer(answer) if answer is not None else ""
    if not a:
        return float("nan")
    needle = f" {a} "
    return float(any(needle in f" {normalize_answer(t)} " for t in texts))


def answer_recall(answer: Any, texts: Sequence[str]) -> float:
    """Share of the answer's distinct normalised tokens present in ``texts``' tokens; NaN for no answer."""
    toks = set(normalize_answer(answer).split()) if answer is not None else set()
    if not toks:
        return float("nan")
    seen: set[str] = set()
    for t in texts:
        seen.update(normalize_answer(t).split())
    return len(toks & seen) / len(toks)


def answer_metrics(ranked: np.ndarray, doc_texts: Sequence[str], answers: Sequence[Any],
                   cutoffs: Sequence[int] = (5,)) -> dict[str, np.ndarray]:
    """Answer metrics of a run.

    Parameters
    ----------
    ranked : ndarray, shape (B, k), int64, host
        Document numbers (positions in ``doc_texts``), best first; -1 pads.
    doc_texts : sequence of N str
    answers : sequence of B (str, number or None)
        Gold answer of each question (None: no answer).
    cutoffs : sequence of int
        The k of each ``@k`` (default 5).

    Returns
    -------
    dict name -> ndarray, shape (B,), float64
        ``answer_substr@k`` and ``answer_recall@k`` per cut-off; NaN for questions without an answer.
    """
    ranked = np.asarray(ranked)
    if ranked.ndim != 2 or ranked.shape[0] != len(answers):
        raise ValueError(f"ranked must be (B, k) with B = {len(answers)} answers, got shape {ranked.shape}")
    out: dict[str, np.ndarray] = {}
    norm_cache: dict[int, str] = {}

    def norm(d: int) -> str:
        if d not in norm_cache:
            norm_cache[d] = normalize_answer(doc_texts[d])
        return norm_cache[d]

    for c in cutoffs:
        c = int(c)
        if c < 1:
            raise ValueError(f"cut-offs must be positive, got {c}")
        sub = np.full(len(answers), np.nan)
        rec = np.full(len(answers), np.nan)
        for i, ans in enumerate(answers):
            a = normalize_answer(ans) if ans is not None else ""
            if not a:
                continue
            docs = [int(d) for d in ranked[i, :c] if d >= 0]
            texts = [norm(d) for d in docs]
            sub[i] = float(any(f" {a} " in f" {t} " for t in texts))
            toks = set(a.split())
            seen: set[str] = set()
            for t in texts:
                seen.update(t.split())
            rec[i] = len(toks & seen) / len(toks)
        out[f"answer_substr@{c}"] = sub
        out[f"answer_recall@{c}"] = rec
    return out
