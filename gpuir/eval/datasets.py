"""Evaluation data sets: LoCoMo, LongMemEval (S and oracle), and any BEIR-format collection.

Every loader returns an :class:`EvalDataset`: one shared document collection
(``doc_ids``, ``doc_texts``) and a list of :class:`EvalQuery`. A query that may
only see part of the collection (its own conversation in LoCoMo, its own
haystack in LongMemEval) names those documents in ``candidates``; the runner
turns them into per-query filters, so every question is answered in one batch
against one index.

Identifiers
-----------
* LoCoMo questions: ``<sample_id>:q<i>`` (``i`` = position in that
  conversation's ``qa`` list, from 0); sessions ``<sample_id>:S<n>``; turns
  ``<sample_id>:D<n>:<t>`` (the turn's ``dia_id``).
* LongMemEval questions: ``question_id``; sessions: their haystack session id,
  de-duplicated across questions (the same id always has the same content; this
  is verified on load).
* BEIR: the collection's own ids.

The quirks of the data (see ``data/README.md``) are handled here and counted in
``EvalDataset.stats``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from gpuir.datapath import data_dir, locomo_path, longmemeval_path
from gpuir.qrels import read_qrels

#: LoCoMo category numbers and the names most later work uses for them.
LOCOMO_CATEGORIES: dict[int, str] = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}

#: LongMemEval question types, in the order the paper lists them.
LONGMEMEVAL_TYPES: tuple[str, ...] = (
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "multi-session",
    "knowledge-update",
    "temporal-reasoning",
)

_DIA_ID = re.compile(r"^D(\d+):(\d+)$")
_SESSION_KEY = re.compile(r"^session_(\d+)$")


@dataclass
class EvalQuery:
    """One evaluation question.

    Attributes
    ----------
    qid : str
        Question id (see the module docstring for the scheme).
    text : str
        The query text.
    gold : dict of str -> int
        Relevant document ids and their grade (>= 1). Empty when the question
        has no usable evidence.
    group : str
        Cluster for the bootstrap and for leave-one-out selection: the LoCoMo
        conversation, the LongMemEval or BEIR question itself.
    category : str
        LoCoMo category name, LongMemEval ``question_type``, or ``"all"``.
    candidates : tuple of str or None
        The documents this question may retrieve from (its private haystack);
        None means the whole collection.
    scored : bool
        Whether the question counts in the headline metrics (it has gold and is
        not left out by the loader's options, e.g. abstention questions).
    abstention : bool
        LongMemEval ``_abs`` question.
    date : datetime or None
        When the question is asked (LongMemEval ``question_date``).
    meta : dict
        Loader-specific extras (answer, raw evidence, reason when not scored).
    """

    qid: str
    text: str
    gold: dict[str, int]
    group: str
    category: str
    candidates: tuple[str, ...] | None = None
    scored: bool = True
    abstention: bool = False
    date: datetime | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvalDataset:
    """A document collection plus the questions asked of it.

    Attributes
    ----------
    name : str
        ``"locomo"``, ``"longmemeval-s"``, ``"longmemeval-oracle"`` or ``"beir:<dir>"``.
    unit : str
        Retrieval unit: ``"session"``, ``"turn"`` or ``"document"``.
    doc_ids : list of str, length N
        Unique document ids; document number = position.
    doc_texts : list of str, length N
        Text to index for each document.
    doc_dates : list of (datetime or None), length N
        Date of each document when it has a single one (LoCoMo); None otherwise.
        LongMemEval dates are per question and slot: see ``EvalQuery.meta["haystack_dates"]``.
    queries : list of EvalQuery
    stats : dict
        Counts, including the data quirks met while loading.
    source : str
        The file or folder loaded.
    options : dict
        The loader options, for reports.
    """

    name: str
    unit: str
    doc_ids: list[str]
    doc_texts: list[str]
    doc_dates: list[datetime | None]
    queries: list[EvalQuery]
    stats: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    _doc_index: dict[str, int] | None = field(default=None, repr=False, compare=False)

    @property
    def n_docs(self) -> int:
        return len(self.doc_ids)

    @property
    def doc_index(self) -> dict[str, int]:
        """Map document id -> document number."""
        if self._doc_index is None:
            self._doc_index = {d: i for i, d in enumerate(self.doc_ids)}
        return self._doc_index

    def scored_queries(self) -> list[EvalQuery]:
        """The questions that count in the headline metrics."""
        return [q for q in self.queries if q.scored]

    def candidate_filters(self, queries: Sequence[EvalQuery] | None = None) -> list[np.ndarray] | None:
        """Per-query allow-lists of document numbers, or None when no query is restricted.

        Parameters
        ----------
        queries : sequence of EvalQuery, optional
            Default: all queries.

        Returns
        -------
        None, or a list (one per query) of ndarray, shape (m,), int64, sorted
        document numbers; a query without candidates gets ``None``.
        """
        qs = self.queries if queries is None else queries
        if all(q.candidates is None for q in qs):
            return None
        idx = self.doc_index
        out: list[Any] = []
        for q in qs:
            if q.candidates is None:
                out.append(None)
            else:
                out.append(np.sort(np.fromiter((idx[d] for d in q.candidates), np.int64, len(q.candidates))))
        return out

    def summary(self) -> dict[str, Any]:
        """JSON-able description: name, unit, counts and quirks."""
        return {
            "name": self.name,
            "unit": self.unit,
            "source": self.source,
            "options": self.options,
            "n_docs": self.n_docs,
            "n_queries": len(self.queries),
            "n_scored": sum(q.scored for q in self.queries),
            **{k: v for k, v in self.stats.items()},
        }


# --------------------------------------------------------------------------- helpers


def _open_text(path: Path) -> io.TextIOBase:
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _load_json_file(path: Path) -> Any:
    """The JSON document in ``path`` (``.gz`` too); ValueError naming the file when it is not one."""
    try:
        with _open_text(path) as f:
            return json.load(f)
    except (ValueError, RecursionError, EOFError, OSError) as e:  # JSON, UTF-8, nesting, gzip errors
        if isinstance(e, OSError) and not isinstance(e, gzip.BadGzipFile) and e.errno is not None:
            raise  # the file system's error (permissions, ...), with its own message
        raise ValueError(f"{path} is not valid JSON (plain or gzip): {type(e).__name__}: {str(e)[:200]}") from None


def _malformed(path: Path, where: str, what: str) -> ValueError:
    return ValueError(f"{path}: {where}: {what}; is this the right file?")


def _check_locomo(path: Path, data: Any) -> None:
    """Raise ValueError naming the first place where ``data`` is not LoCoMo-shaped."""
    if not isinstance(data, list) or not data:
        raise ValueError(
            f"{path} does not look like LoCoMo: expected a JSON array of objects with "
            "'sample_id', 'conversation' and 'qa'"
        )
    for ci, c in enumerate(data):
        where = f"conversation {ci}"
        if not isinstance(c, dict) or not isinstance(c.get("conversation"), dict) or not isinstance(c.get("qa"), list):
            raise _malformed(path, where, "expected an object with 'conversation' (an object) and 'qa' (an array)")
        for key, turns in c["conversation"].items():
            if not _SESSION_KEY.match(key) or turns is None:
                continue
            if not isinstance(turns, list):
                raise _malformed(path, f"{where}, {key}", f"expected an array of turns, got {type(turns).__name__}")
            for ti, t in enumerate(turns, start=1):
                if not isinstance(t, dict):
                    raise _malformed(path, f"{where}, {key}, turn {ti}", f"expected an object, got {type(t).__name__}")
        for qi, qa in enumerate(c["qa"]):
            if not isinstance(qa, dict):
                raise _malformed(path, f"{where}, qa {qi}", f"expected an object, got {type(qa).__name__}")
            ev = qa.get("evidence")
            if ev is not None and not isinstance(ev, list):
                raise _malformed(path, f"{where}, qa {qi}", f"'evidence' must be an array, got {type(ev).__name__}")
            cat = qa.get("category")
            if cat is not None and (isinstance(cat, bool) or not isinstance(cat, (int, str))):
                raise _malformed(path, f"{where}, qa {qi}", f"'category' must be a number, got {type(cat).__name__}")


def _check_longmemeval_question(path: Path, i: int, q: dict[str, Any]) -> None:
    """Raise ValueError naming the first field of question ``i`` that is not LongMemEval-shaped."""
    where = f"question {i} ({str(q.get('question_id'))[:40]})"
    for key in ("haystack_session_ids", "haystack_sessions", "answer_session_ids"):
        if not isinstance(q[key], list):
            raise _malformed(path, where, f"{key!r} must be an array, got {type(q[key]).__name__}")
    if q.get("haystack_dates") is not None and not isinstance(q["haystack_dates"], list):
        raise _malformed(path, where, "'haystack_dates' must be an array")
    for si, sess in enumerate(q["haystack_sessions"]):
        if not isinstance(sess, list):
            raise _malformed(path, f"{where}, session {si}", f"expected an array of turns, got {type(sess).__name__}")
        bad = next((t for t in sess if not isinstance(t, dict)), None)
        if bad is not None:
            raise _malformed(path, f"{where}, session {si}", f"turns must be objects, got {type(bad).__name__}")


def _check_file(path: Path, what: str, hint: str) -> Path:
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{what} not found at {path}: {hint}")
    if path.is_dir():
        raise ValueError(f"{what}: expected a file, got the folder {path}")
    return path


def parse_locomo_date(s: str) -> datetime | None:
    """Parse a LoCoMo session date such as ``"1:56 pm on 8 May, 2023"``; None if it does not parse."""
    s = " ".join(str(s).split())
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M %p on %B %d, %Y"):
        try:
            return datetime.strptime(s, fmt)
        except ValueError:
            pass
    return None


def parse_longmemeval_date(s: str) -> datetime | None:
    """Parse a LongMemEval date such as ``"2023/05/30 (Tue) 23:40"``; None if it does not parse."""
    try:
        return datetime.strptime(str(s).strip(), "%Y/%m/%d (%a) %H:%M")
    except ValueError:
        return None


def split_evidence(evidence: Iterable[Any]) -> list[str]:
    """Split LoCoMo evidence strings that name several ids (``"D8:6; D9:17"``, ``"D9:1 D4:4"``).

    Returns the list of individual tokens, in order, empty pieces dropped.
    """
    out: list[str] = []
    for e in evidence:
        out.extend(p for p in re.split(r"[;,\s]+", str(e)) if p)
    return out


# --------------------------------------------------------------------------- LoCoMo


def load_locomo(
    path: str | os.PathLike | None = None,
    unit: str = "session",
    *,
    speakers: bool = True,
    captions: bool = False,
    dates: bool = False,
    categories: Iterable[int | str] | None = None,
) -> EvalDataset:
    """Load LoCoMo (``locomo10.json``).

    One collection over all conversations; each question's candidates are its
    own conversation's sessions (or turns).

    Parameters
    ----------
    path : path-like, optional
        Default :func:`gpuir.datapath.locomo_path`.
    unit : {"session", "turn"}
        Retrieval unit. Session ids ``<sample_id>:S<n>``, turn ids ``<sample_id>:D<n>:<t>``.
    speakers : bool
        Prefix each turn with ``"<speaker>: "``. Default True.
    captions : bool
        Append the ``blip_caption`` of image turns. Default False.
    dates : bool
        Start each session's text with its date string. Default False.
    categories : iterable of int or str, optional
        Categories to score (numbers 1-5 or names such as ``"adversarial"``);
        the others are loaded but not scored. Default: all five.

    Returns
    -------
    EvalDataset
        ``stats`` counts: ``conversations``, ``sessions``, ``turns``, ``qa_items``,
        ``empty_evidence``, ``multi_id_strings``, ``malformed_ids`` (not of the form
        ``D<n>:<t>``), ``unknown_turn_ids`` (well formed, no such turn),
        ``noncanonical_ids`` (e.g. ``D30:05``, resolved to ``D30:5``),
        ``no_gold`` (questions left without any gold), ``unused_date_keys``
        (``session_<n>_date_time`` keys without a session), per-category counts.
    """
    if unit not in ("session", "turn"):
        raise ValueError(f"LoCoMo unit must be 'session' or 'turn', got {unit!r}")
    path = _check_file(
        Path(path) if path is not None else locomo_path(),
        "LoCoMo file",
        "pass --data PATH to locomo10.json or set GPUIR_DATA",
    )
    data = _load_json_file(path)
    _check_locomo(path, data)

    want: set[int] | None = None
    if categories is not None:
        names = {v: k for k, v in LOCOMO_CATEGORIES.items()}
        want = set()
        for c in categories:
            if isinstance(c, str) and c in names:
                want.add(names[c])
            elif str(c).isdigit() and int(c) in LOCOMO_CATEGORIES:
                want.add(int(c))
            else:
                raise ValueError(
                    f"unknown LoCoMo category {c!r}: use 1-5 or one of {', '.join(names)}"
                )

    doc_ids: list[str] = []
    doc_texts: list[str] = []
    doc_dates: list[datetime | None] = []
    queries: list[EvalQuery] = []
    st: dict[str, Any] = {
        "conversations": 0, "sessions": 0, "turns": 0, "qa_items": 0,
        "empty_evidence": 0, "multi_id_strings": 0, "malformed_ids": 0,
        "unknown_turn_ids": 0, "noncanonical_ids": 0, "no_gold": 0,
        "unused_date_keys": 0, "unparsed_dates": 0, "not_scored_category": 0,
        "skipped_ids": [],
    }
    per_cat = {name: 0 for name in LOCOMO_CATEGORIES.values()}

    for ci, conv_obj in enumerate(data):
        sid = str(conv_obj.get("sample_id", f"conv{ci}"))
        conv = conv_obj["conversation"]
        st["conversations"] += 1
        sess_nums = sorted(int(m.group(1)) for k in conv if (m := _SESSION_KEY.match(k)))
        date_nums = {
            int(k[len("session_"): -len("_date_time")])
            for k in conv
            if re.fullmatch(r"session_\d+_date_time", k)
        }
        st["unused_date_keys"] += len(date_nums - set(sess_nums))
        turn_set: set[tuple[int, int]] = set()
        conv_docs: list[str] = []
        for n in sess_nums:
            turns = conv[f"session_{n}"] or []
            date_str = conv.get(f"session_{n}_date_time")
            date = parse_locomo_date(date_str) if date_str else None
            if date_str and date is None:
                st["unparsed_dates"] += 1
            st["sessions"] += 1
            lines = []
            for ti, t in enumerate(turns, start=1):
                st["turns"] += 1
                turn_set.add((n, ti))
                line = str(t.get("text", ""))
                if speakers and t.get("speaker"):
                    line = f"{t['speaker']}: {line}"
                if captions and t.get("blip_caption"):
                    line = f"{line} [image: {t['blip_caption']}]"
                if unit == "turn":
                    tid = f"{sid}:D{n}:{ti}"
                    doc_ids.append(tid)
                    doc_texts.append(f"{date_str}\n{line}" if dates and date_str else line)
                    doc_dates.append(date)
                    conv_docs.append(tid)
                lines.append(line)
            if unit == "session":
                text = "\n".join(lines)
                if dates and date_str:
                    text = f"{date_str}\n{text}"
                doc_ids.append(f"{sid}:S{n}")
                doc_texts.append(text)
                doc_dates.append(date)
                conv_docs.append(f"{sid}:S{n}")
        cands = tuple(conv_docs)

        for qi, qa in enumerate(conv_obj["qa"]):
            st["qa_items"] += 1
            cat_num = qa.get("category")
            cat = LOCOMO_CATEGORIES.get(cat_num, str(cat_num))
            per_cat[cat] = per_cat.get(cat, 0) + 1
            evidence = qa.get("evidence") or []
            if not evidence:
                st["empty_evidence"] += 1
            gold: dict[str, int] = {}
            for raw in evidence:
                pieces = split_evidence([raw])
                if len(pieces) > 1:
                    st["multi_id_strings"] += 1
                for p in pieces:
                    m = _DIA_ID.match(p)
                    if not m:
                        st["malformed_ids"] += 1
                        st["skipped_ids"].append(f"{sid}:q{qi}:{p}")
                        continue
                    n, ti = int(m.group(1)), int(m.group(2))
                    if (n, ti) not in turn_set:
                        st["unknown_turn_ids"] += 1
                        st["skipped_ids"].append(f"{sid}:q{qi}:{p}")
                        continue
                    if p != f"D{n}:{ti}":
                        st["noncanonical_ids"] += 1
                    gold[f"{sid}:S{n}" if unit == "session" else f"{sid}:D{n}:{ti}"] = 1
            reason = None
            if not gold:
                st["no_gold"] += 1
                reason = "no usable evidence"
            elif want is not None and cat_num not in want:
                st["not_scored_category"] += 1
                reason = "category not selected"
            answer = qa.get("answer", qa.get("adversarial_answer"))
            queries.append(
                EvalQuery(
                    qid=f"{sid}:q{qi}",
                    text=str(qa.get("question", "")),
                    gold=gold,
                    group=sid,
                    category=cat,
                    candidates=cands,
                    scored=reason is None,
                    meta={
                        "answer": answer,
                        "evidence": list(evidence),
                        "category_number": cat_num,
                        **({"not_scored": reason} if reason else {}),
                    },
                )
            )
    st["qa_per_category"] = per_cat
    st["scored_per_category"] = {
        name: sum(1 for q in queries if q.scored and q.category == name) for name in per_cat
    }
    return EvalDataset(
        name="locomo",
        unit=unit,
        doc_ids=doc_ids,
        doc_texts=doc_texts,
        doc_dates=doc_dates,
        queries=queries,
        stats=st,
        source=str(path),
        options={"speakers": speakers, "captions": captions, "dates": dates,
                 "categories": sorted(want) if want is not None else None},
    )


# --------------------------------------------------------------------------- LongMemEval

_LME_CACHE: dict[tuple, EvalDataset] = {}


def load_longmemeval(
    path: str | os.PathLike | None = None,
    split: str = "s",
    *,
    roles: str = "user",
    include_abstention: bool = False,
    cache: bool = True,
) -> EvalDataset:
    """Load LongMemEval (S or oracle) at session level.

    All questions share one collection of de-duplicated sessions; each question's
    candidates are its own haystack (about 48 sessions in S).

    Parameters
    ----------
    path : path-like, optional
        A ``.json`` or ``.json.gz`` file. Default :func:`gpuir.datapath.longmemeval_path`
        of ``split``.
    split : {"s", "oracle"}
        Which file to default to, and the dataset's name.
    roles : {"user", "all"}
        Session text from the user turns only (the benchmark's own default for
        session keys) or from user and assistant turns.
    include_abstention : bool
        Score the 30 ``_abs`` questions with the others. Default False, as the
        benchmark's retrieval evaluation leaves them out; they are still loaded
        (``scored=False``) and reported apart.
    cache : bool
        Reuse the dataset loaded with the same file (path, size, mtime) and
        options in this process (parsing S takes ~2.6 GB and some seconds).
        The cached object is shared: treat it as read-only.

    Returns
    -------
    EvalDataset
        ``stats``: ``questions``, ``abstention``, ``session_slots``, ``sessions``
        (distinct ids), ``duplicate_session_slots``, ``empty_sessions`` (no text
        for the chosen roles), ``gold_not_in_haystack``, per-type counts.

    Raises
    ------
    ValueError
        When one session id carries different content in two haystacks.
    """
    if split not in ("s", "oracle"):
        raise ValueError(f"LongMemEval split must be 's' or 'oracle', got {split!r}")
    if roles not in ("user", "all"):
        raise ValueError(f"roles must be 'user' or 'all', got {roles!r}")
    path = _check_file(
        Path(path) if path is not None else longmemeval_path(split),
        "LongMemEval file",
        "pass --data PATH to longmemeval_*.json(.gz) or set GPUIR_DATA",
    )
    st_ = path.stat()
    key = (str(path.resolve()), st_.st_size, st_.st_mtime_ns, split, roles, include_abstention)
    if cache and key in _LME_CACHE:
        return _LME_CACHE[key]

    data = _load_json_file(path)
    need = ("question_id", "question", "haystack_session_ids", "haystack_sessions", "answer_session_ids")
    if not isinstance(data, list) or not data or not all(
        isinstance(q, dict) and all(k in q for k in need) for q in data
    ):
        raise ValueError(
            f"{path} does not look like LongMemEval: expected a JSON array of question objects "
            f"with {', '.join(need)}"
        )

    doc_index: dict[str, int] = {}
    doc_ids: list[str] = []
    doc_texts: list[str] = []
    digests: list[bytes] = []
    queries: list[EvalQuery] = []
    st: dict[str, Any] = {
        "questions": 0, "abstention": 0, "session_slots": 0, "duplicate_session_slots": 0,
        "empty_sessions": 0, "gold_not_in_haystack": 0, "unparsed_dates": 0,
    }
    per_type: dict[str, int] = {}
    for qn, q in enumerate(data):
        _check_longmemeval_question(path, qn, q)
        st["questions"] += 1
        qid = str(q["question_id"])
        sids = [str(s) for s in q["haystack_session_ids"]]
        sessions = q["haystack_sessions"]
        hdates = q.get("haystack_dates") or [None] * len(sids)
        if not (len(sids) == len(sessions) == len(hdates)):
            raise ValueError(
                f"{path}: question {qid} has {len(sids)} session ids, {len(sessions)} sessions "
                f"and {len(hdates)} dates; they must have one length"
            )
        for s_id, sess in zip(sids, sessions):
            st["session_slots"] += 1
            h = hashlib.sha1(
                json.dumps([[t.get("role"), t.get("content")] for t in sess], ensure_ascii=False).encode()
            ).digest()
            if s_id in doc_index:
                st["duplicate_session_slots"] += 1
                if digests[doc_index[s_id]] != h:
                    raise ValueError(
                        f"{path}: session id {s_id!r} has different content in the haystack of "
                        f"question {qid} than in an earlier one; ids must name one session"
                    )
                continue
            text = "\n".join(
                str(t.get("content", "")) for t in sess if roles == "all" or t.get("role") == "user"
            )
            if not text.strip():
                st["empty_sessions"] += 1
            doc_index[s_id] = len(doc_ids)
            doc_ids.append(s_id)
            doc_texts.append(text)
            digests.append(h)
        hay = set(sids)
        gold = {}
        for a in q["answer_session_ids"]:
            if str(a) in hay:
                gold[str(a)] = 1
            else:
                st["gold_not_in_haystack"] += 1
        qtype = str(q.get("question_type", "unknown"))
        per_type[qtype] = per_type.get(qtype, 0) + 1
        abst = qid.endswith("_abs")
        st["abstention"] += abst
        reason = None
        if not gold:
            reason = "no gold session in the haystack"
        elif abst and not include_abstention:
            reason = "abstention question (reported apart)"
        qdate = parse_longmemeval_date(q["question_date"]) if q.get("question_date") else None
        parsed = [parse_longmemeval_date(d) if d else None for d in hdates]
        st["unparsed_dates"] += sum(1 for d, p in zip(hdates, parsed) if d and p is None)
        queries.append(
            EvalQuery(
                qid=qid,
                text=str(q["question"]),
                gold=gold,
                group=qid,
                category=qtype,
                candidates=tuple(dict.fromkeys(sids)),
                scored=reason is None,
                abstention=abst,
                date=qdate,
                meta={
                    "answer": q.get("answer"),
                    "haystack_dates": parsed,
                    **({"not_scored": reason} if reason else {}),
                },
            )
        )
    del data
    st["sessions"] = len(doc_ids)
    st["questions_per_type"] = per_type
    st["scored_per_type"] = {
        t: sum(1 for q in queries if q.scored and q.category == t) for t in per_type
    }
    ds = EvalDataset(
        name=f"longmemeval-{split}",
        unit="session",
        doc_ids=doc_ids,
        doc_texts=doc_texts,
        doc_dates=[None] * len(doc_ids),
        queries=queries,
        stats=st,
        source=str(path),
        options={"split": split, "roles": roles, "include_abstention": include_abstention},
    )
    if cache:
        _LME_CACHE.clear()  # keep at most one parsed file around
        _LME_CACHE[key] = ds
    return ds


# --------------------------------------------------------------------------- BEIR


def _find(folder: Path, stem: str) -> Path | None:
    for name in (f"{stem}.jsonl", f"{stem}.jsonl.gz", f"{stem}.json"):
        if (folder / name).exists():
            return folder / name
    return None


def _read_jsonl(path: Path, what: str) -> Iterable[dict]:
    """The objects of a JSONL file (``.gz`` too); errors name the physical line (bytes split at ``\n``)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        for ln, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if ln == 1 else "utf-8").strip()
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{ln}: not valid UTF-8 in {what} ({e.reason})") from None
            if not line:
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:
                raise ValueError(f"{path}:{ln}: bad JSON line in {what}: {type(e).__name__}: {e}") from None
            if not isinstance(obj, dict) or "_id" not in obj:
                raise ValueError(f"{path}:{ln}: each {what} line must be an object with an '_id'")
            yield obj


def load_beir(path: str | os.PathLike, split: str = "test", *, title: bool = True) -> EvalDataset:
    """Load a collection in BEIR format.

    Parameters
    ----------
    path : path-like
        A folder holding ``corpus.jsonl`` (``{"_id", "title", "text"}``),
        ``queries.jsonl`` (``{"_id", "text"}``) and ``qrels/<split>.tsv``
        (``query-id<TAB>corpus-id<TAB>score``, header line optional). ``.jsonl.gz`` works too.
    split : str
        Which qrels file. Default ``"test"``.
    title : bool
        Index ``title + " " + text``. Default True.

    Returns
    -------
    EvalDataset
        Only queries that appear in the qrels with a grade >= 1 are scored.
        ``stats``: ``qrels_unknown_docs`` (judged documents missing from the
        corpus: they still count as relevant, as in trec_eval),
        ``qrels_unknown_queries``, ``queries_without_relevant``.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"BEIR folder not found at {folder}: pass --data DIR holding corpus.jsonl, "
            "queries.jsonl and qrels/"
        )
    corpus_p, queries_p = _find(folder, "corpus"), _find(folder, "queries")
    qrels_p = folder / "qrels" / f"{split}.tsv"
    missing = [n for n, p in (("corpus.jsonl", corpus_p), ("queries.jsonl", queries_p)) if p is None]
    if not qrels_p.exists():
        avail = sorted(p.stem for p in (folder / "qrels").glob("*.tsv")) if (folder / "qrels").is_dir() else []
        missing.append(f"qrels/{split}.tsv" + (f" (available splits: {', '.join(avail)})" if avail else ""))
    if missing:
        raise FileNotFoundError(f"{folder} is not a BEIR folder: missing {'; '.join(missing)}")

    doc_ids: list[str] = []
    doc_texts: list[str] = []
    seen: set[str] = set()
    st: dict[str, Any] = {"duplicate_doc_ids": 0, "qrels_unknown_docs": 0,
                          "qrels_unknown_queries": 0, "queries_without_relevant": 0}
    for obj in _read_jsonl(corpus_p, "corpus"):
        did = str(obj["_id"])
        if did in seen:
            st["duplicate_doc_ids"] += 1
            continue
        seen.add(did)
        t = str(obj.get("text") or "")
        if title and obj.get("title"):
            t = f"{obj['title']} {t}"
        doc_ids.append(did)
        doc_texts.append(t)
    qtext = {str(o["_id"]): str(o.get("text") or "") for o in _read_jsonl(queries_p, "queries")}

    qrels = read_qrels(qrels_p)
    queries = []
    for qid, judged in qrels.items():
        if qid not in qtext:
            st["qrels_unknown_queries"] += 1
            continue
        gold = {d: r for d, r in judged.items() if r >= 1}
        st["qrels_unknown_docs"] += sum(1 for d in gold if d not in seen)
        if not gold:
            st["queries_without_relevant"] += 1
        queries.append(
            EvalQuery(qid=qid, text=qtext[qid], gold=gold, group=qid, category="all",
                      scored=bool(gold), meta={"judged": judged})
        )
    if not queries:
        raise ValueError(f"{folder}: no query of queries.jsonl appears in qrels/{split}.tsv")
    return EvalDataset(
        name=f"beir:{folder.name}",
        unit="document",
        doc_ids=doc_ids,
        doc_texts=doc_texts,
        doc_dates=[None] * len(doc_ids),
        queries=queries,
        stats=st,
        source=str(folder),
        options={"split": split, "title": title},
    )


def load(name: str, path: str | os.PathLike | None = None, **options: Any) -> EvalDataset:
    """Load a data set by name: ``"locomo"``, ``"longmemeval"`` (``split=`` "s"/"oracle") or ``"beir"``."""
    if name == "locomo":
        return load_locomo(path, **options)
    if name == "longmemeval":
        return load_longmemeval(path, **options)
    if name == "beir":
        if path is None:
            raise ValueError("BEIR needs --data DIR (a folder with corpus.jsonl, queries.jsonl, qrels/)")
        return load_beir(path, **options)
    raise ValueError(f"unknown data set {name!r}: choose locomo, longmemeval or beir")


__all__ = [
    "LOCOMO_CATEGORIES",
    "LONGMEMEVAL_TYPES",
    "EvalDataset",
    "EvalQuery",
    "data_dir",
    "load",
    "load_beir",
    "load_locomo",
    "load_longmemeval",
    "parse_locomo_date",
    "parse_longmemeval_date",
    "split_evidence",
]
