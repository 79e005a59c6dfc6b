"""Query types: one label set for LoCoMo and LongMemEval, rule-based classifiers, and a
TF-IDF + logistic-regression classifier saved as plain JSON.

Label set
---------
Both benchmarks label their questions, with different names. gpuir routes on **one**
label set, :data:`QUERY_TYPES`, and maps each benchmark's labels onto it
(:data:`LOCOMO_TO_TYPE`, :data:`LONGMEMEVAL_TO_TYPE`):

=================  =================================  =============================
type               LoCoMo category                    LongMemEval question_type
=================  =================================  =============================
``temporal``       temporal (2)                       temporal-reasoning
``multi_hop``      multi-hop (1)                      multi-session
``single_hop``     single-hop (4), adversarial (5)    single-session-user
``assistant``      --                                 single-session-assistant
``preference``     --                                 single-session-preference
``knowledge_update`` --                               knowledge-update
``open_domain``    open-domain (3)                    --
=================  =================================  =============================

LongMemEval's six types map one-to-one, so a classifier trained on them loses nothing.
LoCoMo's adversarial questions ask about something never said, worded like any
single-hop question: nothing in the question tells them apart, so they are
``single_hop`` (a classifier can still be trained on the raw five categories; see
``gpuir.eval.routers``).

Functions
---------
* :func:`regex_query_type`: an ordered list of regular expressions in the spirit of
  SelRoute's classifier (first match wins; ``single_hop`` otherwise). The rules were
  written by hand from a few sample questions, not fitted to the labelled sets.
* :func:`type_hint`: ``"preference"`` / ``"event"`` / ``"fact"`` / None, the kind of
  record a question asks about (for the type filter).
* :func:`record_type`: ``"preference"`` / ``"event"`` / ``"fact"`` of a stored text
  (used at ``add`` time when a record carries no ``type``).
* :class:`QueryTypeClassifier`: TF-IDF over word 1-2-grams (+ optionally the encoder's
  query embedding) -> multinomial logistic regression. ``to_config`` stores the
  vocabulary, idf, coefficients and intercepts as lists; ``from_config`` rebuilds a
  classifier whose ``predict_proba`` is bit-identical. scikit-learn (extra
  ``routing``) is imported only when a classifier is fitted or used.

See ``docs/routing.md``.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._compat import MissingExtra

__all__ = [
    "HINTS",
    "LOCOMO_TO_TYPE",
    "LONGMEMEVAL_TO_TYPE",
    "QUERY_TYPES",
    "QUERY_TYPE_DOCS",
    "REGEX_RULES",
    "QueryTypeClassifier",
    "record_type",
    "regex_query_type",
    "to_query_type",
    "type_hint",
]

#: What each query type means (the keys are :data:`QUERY_TYPES`, in order).
QUERY_TYPE_DOCS: dict[str, str] = {
    "temporal": "asks when something happened, how long ago or between two events, or their order",
    "multi_hop": "combines several facts or sessions: counts, totals, comparisons, what two things share",
    "single_hop": "one fact the user (or a speaker) stated once",
    "assistant": "recalls what the assistant said in an earlier conversation",
    "preference": "asks for a suggestion that should follow the user's stated preferences",
    "knowledge_update": "asks for the current value of something that changed over time",
    "open_domain": "asks for an inference or judgement beyond what was said (would / likely / might)",
}

#: The query types, in a fixed order.
QUERY_TYPES: tuple[str, ...] = tuple(QUERY_TYPE_DOCS)

#: LoCoMo category name (``gpuir.eval.datasets.LOCOMO_CATEGORIES``) -> query type.
LOCOMO_TO_TYPE: dict[str, str] = {
    "multi-hop": "multi_hop",
    "temporal": "temporal",
    "open-domain": "open_domain",
    "single-hop": "single_hop",
    "adversarial": "single_hop",
}

#: LongMemEval ``question_type`` -> query type (one-to-one).
LONGMEMEVAL_TO_TYPE: dict[str, str] = {
    "single-session-user": "single_hop",
    "single-session-assistant": "assistant",
    "single-session-preference": "preference",
    "multi-session": "multi_hop",
    "temporal-reasoning": "temporal",
    "knowledge-update": "knowledge_update",
}

#: Record / hint kinds for the type filter.
HINTS: tuple[str, ...] = ("preference", "event", "fact")


def to_query_type(label: str) -> str:
    """Map a LoCoMo category or LongMemEval question type (or a query type) to a query type.

    Raises
    ------
    ValueError
        For a label of neither benchmark.
    """
    if label in QUERY_TYPE_DOCS:
        return label
    if label in LOCOMO_TO_TYPE:
        return LOCOMO_TO_TYPE[label]
    if label in LONGMEMEVAL_TO_TYPE:
        return LONGMEMEVAL_TO_TYPE[label]
    raise ValueError(
        f"unknown question label {label!r}: expected one of {list(QUERY_TYPES)}, a LoCoMo category "
        f"{list(LOCOMO_TO_TYPE)} or a LongMemEval type {list(LONGMEMEVAL_TO_TYPE)}"
    )


# --------------------------------------------------------------------------- regex rules

_I = re.IGNORECASE

#: (query type, pattern), tried in order; the first match decides. ``single_hop`` otherwise.
REGEX_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # The assistant's own earlier answer.
    ("assistant", re.compile(
        r"\byou (?:had )?(?:mentioned|said|suggested|recommended|told|gave|provided|listed|shared|"
        r"explained|described|wrote|came up with|helped)\b|\bremind me\b|"
        r"\b(?:our|the) (?:previous|last|earlier|past) (?:conversation|chat|discussion|session)\b|"
        r"\bwhat did you\b", _I)),
    # Advice that should follow the user's tastes.
    ("preference", re.compile(
        r"\b(?:any|some|give me|got any) (?:\w+ )?(?:tips|suggestions|advice|recommendations|ideas)\b|"
        r"\bcan you (?:recommend|suggest)\b|\b(?:recommend|suggest) (?:some|a|an|any)\b|"
        r"\bwhat should i\b|\bshould i (?:try|get|buy|watch|read|make|cook|bake|wear)\b|"
        r"\bi'?m (?:thinking of|thinking about|looking for|planning to|trying to decide)\b|"
        r"\bi'?ve been (?:feeling|thinking|struggling)\b|\bany (?:good|recommended)\b", _I)),
    # Dates, durations, order of events.
    ("temporal", re.compile(
        r"^\s*when\b|\bwhat (?:date|day|month|year|time|week)\b|\bwhich (?:date|day|month|year|week)\b|"
        r"\bhow (?:long|many (?:days|weeks|months|years|hours|minutes))\b|\bhow long ago\b|\bago\b|"
        r"\b(?:first|earlier|later|before|after|since|order|most recently|last time)\b.*\?|"
        r"\bin (?:january|february|march|april|may|june|july|august|september|october|november|"
        r"december|\d{4})\b|\b(?:yesterday|last (?:week|month|year|weekend|saturday|sunday|monday|"
        r"tuesday|wednesday|thursday|friday))\b", _I)),
    # The current value of something that changes.
    ("knowledge_update", re.compile(
        r"\b(?:currently|current|now|still|latest|anymore|at the moment|these days|so far|"
        r"up to date|recently|new)\b", _I)),
    # Counting, totals, comparisons, things in common.
    ("multi_hop", re.compile(
        r"\bhow many\b|\bhow much (?:total|in total|altogether|more|less)\b|\b(?:in )?total\b|"
        r"\baltogether\b|\bcombined\b|\bboth\b|\bin common\b|\bdifferent\b|\beach\b|\bacross\b|"
        r"\bwhat (?:are|were) (?:some|all)\b|\b(?:and|or) \w+ (?:both|each)\b|\bcompared?\b", _I)),
    # Inference beyond what was said.
    ("open_domain", re.compile(
        r"^\s*(?:would|could|might|is it likely|does it seem|do you think)\b|\blikely\b|"
        r"\bprobably\b|\bwhat might\b|\bwould \w+ (?:be|have|want|enjoy|like|consider|pursue)\b|"
        r"\bif \w+ (?:had|were|was)\b", _I)),
)


def regex_query_type(query: str) -> str:
    """Query type of ``query`` by the ordered rules of :data:`REGEX_RULES`.

    Parameters
    ----------
    query : str

    Returns
    -------
    str
        One of :data:`QUERY_TYPES`; ``"single_hop"`` when no rule matches.
    """
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    for label, pat in REGEX_RULES:
        if pat.search(query):
            return label
    return "single_hop"


# --------------------------------------------------------------------------- type hints

_HINT_PREFERENCE = re.compile(
    r"\b(?:favou?rite|prefer(?:s|red|ence|ences)?|likes?|dislikes?|enjoys?|loves?|hates?|"
    r"into|fan of|tastes?|recommend\w*|suggest\w*|tips|advice|ideas)\b", _I)
_HINT_EVENT = re.compile(
    r"^\s*when\b|\bwhat happened\b|\b(?:did|have) (?:i|we|you|he|she|they|\w+) "
    r"(?:go|went|visit|attend|meet|buy|get|travel|take|start|finish|move|adopt|celebrate|join|"
    r"win|lose|see|watch|do)\b|\b(?:went|visited|attended|met|bought|travel(?:l)?ed|trip|"
    r"vacation|concert|party|wedding|event|meeting|ago|yesterday|last (?:week|weekend|month|"
    r"year|time))\b", _I)
_HINT_FACT = re.compile(
    r"^\s*(?:what|who|where|which|whose|how (?:much|many|old|often|far|tall)|is|are|do|does)\b", _I)


def type_hint(query: str) -> str | None:
    """The kind of record a question asks about, for the type filter.

    Rules, first match wins: ``"preference"`` (likes, favourites, advice), ``"event"``
    (when / what happened / did X go ...), ``"fact"`` (a wh-question or yes/no question
    about a stated attribute), else None (no hint: do not filter).

    Parameters
    ----------
    query : str

    Returns
    -------
    {"preference", "event", "fact"} or None
    """
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    if _HINT_PREFERENCE.search(query):
        return "preference"
    if _HINT_EVENT.search(query):
        return "event"
    if _HINT_FACT.search(query):
        return "fact"
    return None


_REC_PREFERENCE = re.compile(
    r"\b(?:i|we)(?:'m| am| are|'re)? (?:really |totally |absolutely |just |also |kind of |"
    r"do(?:n't| not) )?(?:love|like|enjoy|prefer|hate|dislike|adore|can't stand|cannot stand|"
    r"am into|'m into|am a (?:big |huge )?fan of|'m a (?:big |huge )?fan of)\b|"
    r"\bmy (?:absolute )?favou?rite\b|\b(?:i|we) (?:tend to|usually|always|never) \w+\b|"
    r"\bi'?m (?:allergic|vegetarian|vegan)\b|\bnot a fan of\b", _I)
_REC_EVENT = re.compile(
    r"\b(?:yesterday|today|tonight|last (?:night|week|weekend|month|year|time|summer|winter|"
    r"spring|fall)|this (?:morning|afternoon|evening|week|weekend)|\d+ (?:days?|weeks?|months?|"
    r"years?) ago|ago|on (?:monday|tuesday|wednesday|thursday|friday|saturday|sunday))\b|"
    r"\b(?:went|visited|attended|met|bought|adopted|started|finished|celebrated|travel(?:l)?ed|"
    r"moved|joined|won|lost|graduated|married|got|took|saw|watched|ran|hiked|signed up|"
    r"booked|completed|received|made|had)\b", _I)


def record_type(text: str) -> str:
    """Kind of a stored text: ``"preference"``, ``"event"`` or ``"fact"`` (rule-based).

    A stated like / dislike / habit is a preference; a past action or a dated happening
    is an event; anything else is a fact.

    Parameters
    ----------
    text : str

    Returns
    -------
    {"preference", "event", "fact"}
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if _REC_PREFERENCE.search(text):
        return "preference"
    if _REC_EVENT.search(text):
        return "event"
    return "fact"


# --------------------------------------------------------------------------- classifier

_VECTORIZER_PARAMS: dict[str, Any] = {
    "ngram_range": [1, 2],
    "lowercase": True,
    "sublinear_tf": True,
    "min_df": 1,
    "token_pattern": r"(?u)\b\w+\b",  # keep one-letter words ("I" matters here)
}
_C_GRID: tuple[float, ...] = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0)


def _sklearn(what: str):
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
    except ImportError as e:
        raise MissingExtra("routing", what) from e
    return TfidfVectorizer, LogisticRegression


def _one_thread():
    """BLAS limited to one thread: these problems are small, and oversubscribed BLAS
    threads made a fit 20x slower on a busy machine."""
    try:
        from threadpoolctl import threadpool_limits  # a scikit-learn dependency
    except ImportError:  # pragma: no cover
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(limits=1)


def _make_vectorizer(params: dict[str, Any], vocabulary: Sequence[str] | None = None):
    TfidfVectorizer, _ = _sklearn("QueryTypeClassifier")
    kw = dict(params)
    kw["ngram_range"] = tuple(kw["ngram_range"])
    if vocabulary is not None:
        kw["vocabulary"] = {t: i for i, t in enumerate(vocabulary)}
    return TfidfVectorizer(**kw)


def _as_embeddings(embeddings: Any, n: int, dim: int | None) -> np.ndarray | None:
    if embeddings is None:
        if dim:
            raise ValueError(
                f"this classifier was fitted with {dim}-dim query embeddings: pass embeddings= "
                "(the encoder's query embeddings, shape (B, dim))"
            )
        return None
    e = np.asarray(embeddings, dtype=np.float64)
    if e.ndim != 2 or e.shape[0] != n:
        raise ValueError(f"embeddings must have shape ({n}, dim), got {e.shape}")
    if dim is not None and e.shape[1] != dim:
        if dim == 0:
            raise ValueError("this classifier was fitted without embeddings: pass embeddings=None")
        raise ValueError(f"embeddings must have {dim} columns, got {e.shape[1]}")
    if not np.isfinite(e).all():
        raise ValueError("embeddings contain NaN or infinity")
    return e


class QueryTypeClassifier:
    """TF-IDF (word 1-2-grams) + multinomial logistic regression over query types.

    Optionally the encoder's query embedding (dense, shape (B, d)) is concatenated to the
    TF-IDF features. Build with :meth:`fit` or :meth:`from_config`.

    Attributes
    ----------
    classes : list of str
        Class labels, sorted; the columns of :meth:`predict_proba`.
    provenance : dict
        What it was trained on: dataset, split, n, labels, date, folds, ...
    C : float
        Inverse regularisation strength used.
    embedding_dim : int
        Width of the dense features (0: TF-IDF only).
    """

    def __init__(self, vectorizer, vocabulary: list[str], idf: np.ndarray, coef: np.ndarray,
                 intercept: np.ndarray, classes: list[str], provenance: dict, C: float,
                 embedding_dim: int, vectorizer_params: dict[str, Any]):
        self._vec = vectorizer
        self.vocabulary = vocabulary
        self.idf = idf
        self.coef = coef            # (n_rows, n_features) float64; n_rows = 1 for two classes
        self.intercept = intercept  # (n_rows,) float64
        self.classes = classes
        self.provenance = provenance
        self.C = C
        self.embedding_dim = embedding_dim
        self.vectorizer_params = vectorizer_params

    # ------------------------------------------------------------------ fitting
    @classmethod
    def fit(cls, texts: Sequence[str], labels: Sequence[str], provenance: dict,
            embeddings: np.ndarray | None = None, C: float | str = "cv",
            seed: int = 0) -> QueryTypeClassifier:
        """Fit on labelled questions.

        Parameters
        ----------
        texts : sequence of str, length n
        labels : sequence of str, length n
            At least two distinct labels.
        provenance : dict
            Stored in the configuration (dataset, split, n, labels, date, folds ...);
            ``n``, ``labels``, ``date`` and ``C`` are filled in when missing.
        embeddings : ndarray, shape (n, d), optional
            Query embeddings (any float dtype, host memory) appended to the features.
        C : float or "cv"
            Inverse regularisation; ``"cv"`` picks it from a grid by stratified 3-fold
            cross-validation on ``texts`` (accuracy; ties: the smaller C).
        seed : int
            Seed of the inner folds.
        """
        _, LogisticRegression = _sklearn("QueryTypeClassifier.fit")
        texts = list(texts)
        labels = [str(x) for x in labels]
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be strings")
        if len(texts) != len(labels):
            raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
        classes = sorted(set(labels))
        if len(classes) < 2:
            raise ValueError(f"need at least two distinct labels to fit, got {classes}")
        if not isinstance(provenance, dict):
            raise TypeError("provenance must be a dict (dataset, split, n, labels, date, folds)")
        emb = _as_embeddings(embeddings, len(texts), None)
        if not (C == "cv" or (isinstance(C, (int, float)) and C > 0)):
            raise ValueError(f"C must be a positive number or 'cv', got {C!r}")
        with _one_thread():
            if C == "cv":
                C = cls._select_C(texts, labels, emb, seed)
            C = float(C)
            vec = _make_vectorizer(_VECTORIZER_PARAMS)
            X = cls._stack(vec.fit_transform(texts), emb)
            lr = LogisticRegression(C=C, max_iter=5000)
            lr.fit(X, labels)
        prov = dict(provenance)
        prov.setdefault("n", len(texts))
        prov.setdefault("labels", {c: labels.count(c) for c in classes})
        prov.setdefault("date", _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"))
        prov["C"] = C
        vocab = [None] * len(vec.vocabulary_)
        for t, i in vec.vocabulary_.items():
            vocab[i] = t
        return cls(vec, vocab, np.asarray(vec.idf_, np.float64), np.asarray(lr.coef_, np.float64),
                   np.asarray(lr.intercept_, np.float64), [str(c) for c in lr.classes_], prov, C,
                   0 if emb is None else emb.shape[1], dict(_VECTORIZER_PARAMS))

    @staticmethod
    def _stack(X, emb):
        if emb is None:
            return X
        import scipy.sparse as sp

        return sp.hstack([X, sp.csr_matrix(emb)], format="csr")

    @classmethod
    def _select_C(cls, texts, labels, emb, seed) -> float:
        from sklearn.model_selection import StratifiedKFold

        _, LogisticRegression = _sklearn("QueryTypeClassifier.fit")
        y = np.asarray(labels)
        counts = np.unique(y, return_counts=True)[1]
        k = int(min(3, counts.min()))
        if k < 2:
            return 1.0
        folds = list(StratifiedKFold(k, shuffle=True, random_state=seed).split(texts, y))
        best, best_acc = _C_GRID[0], -1.0
        for c in _C_GRID:
            hits = 0
            for tr, te in folds:
                vec = _make_vectorizer(_VECTORIZER_PARAMS)
                Xtr = cls._stack(vec.fit_transform([texts[i] for i in tr]), None if emb is None else emb[tr])
                Xte = cls._stack(vec.transform([texts[i] for i in te]), None if emb is None else emb[te])
                lr = LogisticRegression(C=c, max_iter=5000).fit(Xtr, y[tr])
                hits += int((lr.predict(Xte) == y[te]).sum())
            acc = hits / len(y)
            if acc > best_acc:
                best, best_acc = c, acc
        return float(best)

    # ------------------------------------------------------------------ predicting
    def decision_function(self, queries: Sequence[str], embeddings: np.ndarray | None = None) -> np.ndarray:
        """Linear scores, ndarray (B, n_rows) float64, host (n_rows = 1 for two classes)."""
        if isinstance(queries, str):
            raise TypeError("queries must be a sequence of str, not one str")
        queries = list(queries)
        emb = _as_embeddings(embeddings, len(queries), self.embedding_dim)
        X = self._stack(self._vec.transform(queries), emb)
        return np.asarray(X @ self.coef.T, dtype=np.float64) + self.intercept

    def predict_proba(self, queries: Sequence[str], embeddings: np.ndarray | None = None) -> np.ndarray:
        """Class posteriors.

        Parameters
        ----------
        queries : sequence of str, length B
        embeddings : ndarray, shape (B, embedding_dim), optional
            Required exactly when the classifier was fitted with embeddings.

        Returns
        -------
        ndarray, shape (B, len(classes)), float64, host; rows sum to 1.
        """
        z = self.decision_function(queries, embeddings)
        if z.shape[1] == 1:  # two classes: logistic
            p1 = 1.0 / (1.0 + np.exp(-z[:, 0]))
            return np.stack([1.0 - p1, p1], axis=1)
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def predict(self, queries: Sequence[str], embeddings: np.ndarray | None = None) -> list[str]:
        """Most probable class of each query (ties: the first class in ``classes``)."""
        p = self.predict_proba(queries, embeddings)
        return [self.classes[i] for i in np.argmax(p, axis=1)]

    # ------------------------------------------------------------------ config
    def to_config(self) -> dict:
        """JSON-safe description (lists and numbers only; no pickle), provenance inside."""
        return {
            "kind": "tfidf_lr",
            "version": 1,
            "classes": list(self.classes),
            "C": self.C,
            "vectorizer": dict(self.vectorizer_params),
            "vocabulary": list(self.vocabulary),
            "idf": [float(x) for x in self.idf],
            "coef": [[float(x) for x in row] for row in self.coef],
            "intercept": [float(x) for x in self.intercept],
            "embedding_dim": int(self.embedding_dim),
            "provenance": dict(self.provenance),
        }

    @classmethod
    def from_config(cls, d: dict) -> QueryTypeClassifier:
        """Rebuild from :meth:`to_config`'s dict; ``predict_proba`` is bit-identical."""
        if not isinstance(d, dict) or d.get("kind") != "tfidf_lr":
            raise ValueError("not a QueryTypeClassifier configuration (expected a dict with kind 'tfidf_lr')")
        missing = [k for k in ("classes", "vectorizer", "vocabulary", "idf", "coef", "intercept") if k not in d]
        if missing:
            raise ValueError(f"QueryTypeClassifier configuration lacks {missing}")
        vocab = [str(t) for t in d["vocabulary"]]
        idf = np.asarray(d["idf"], dtype=np.float64)
        coef = np.asarray(d["coef"], dtype=np.float64)
        intercept = np.asarray(d["intercept"], dtype=np.float64)
        classes = [str(c) for c in d["classes"]]
        emb_dim = int(d.get("embedding_dim", 0))
        n_rows = 1 if len(classes) == 2 else len(classes)
        if idf.shape != (len(vocab),) or coef.shape != (n_rows, len(vocab) + emb_dim) or intercept.shape != (n_rows,):
            raise ValueError(
                f"inconsistent QueryTypeClassifier configuration: {len(vocab)} terms, idf {idf.shape}, "
                f"coef {coef.shape}, intercept {intercept.shape}, {len(classes)} classes, embedding_dim {emb_dim}"
            )
        params = dict(d["vectorizer"])
        vec = _make_vectorizer(params, vocab)
        vec.idf_ = idf
        return cls(vec, vocab, idf, coef, intercept, classes, dict(d.get("provenance", {})),
                   float(d.get("C", 1.0)), emb_dim, params)

    def __repr__(self) -> str:
        return (f"QueryTypeClassifier(classes={self.classes}, terms={len(self.vocabulary)}, "
                f"embedding_dim={self.embedding_dim}, C={self.C})")
