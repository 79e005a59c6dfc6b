"""Evaluation data sets as memory records (:mod:`gpuir.memory.records`).

The loaders of :mod:`gpuir.eval.datasets` give documents (ids and texts); these
functions give the same documents as records, with the fields a memory keeps:

* **LoCoMo** (:func:`locomo_records`): one tenant per conversation
  (``sample_id``); session level: one record per session (``<sample_id>:S<n>``,
  its date, its speakers in ``metadata``); turn level: one record per turn
  (``<sample_id>:D<n>:<t>``) with its speaker (``metadata.speaker``), session
  and date. Texts are exactly the loader's (``"<speaker>: <text>"`` lines).
* **LongMemEval** (:func:`longmemeval_records`): one tenant per question
  haystack: one record per haystack slot (``<question_id>/<session_id>``) with
  the slot's date; or, ``per_haystack=False``, one record per distinct session
  (ids as the loader's, no tenant: a session appears in several haystacks).
* :func:`dataset_records`: any :class:`~gpuir.eval.datasets.EvalDataset`'s
  documents, in document order (what the shared-memory evaluation indexes).

Dates are naive in the files; records take them as UTC.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Any

from .datasets import EvalDataset, load_locomo, load_longmemeval

__all__ = ["dataset_records", "document_tenants", "locomo_records", "longmemeval_records"]


def record_time(d: Any) -> Any:
    """A dataset's date as a record's time: the datasets' dates are UTC wall times, parsed naive; a
    memory refuses naive datetimes (they are usually local time), so the UTC zone is attached here."""
    if isinstance(d, datetime) and d.tzinfo is None:
        return d.replace(tzinfo=timezone.utc)
    return d


def document_tenants(ds: EvalDataset) -> list[str | None]:
    """The tenant of each document: the one question group whose candidates hold it, else None.

    LoCoMo: the conversation of each session or turn. LongMemEval: None for
    sessions shared by several haystacks, the question id otherwise.
    """
    owner: dict[str, set[str]] = {}
    for q in ds.queries:
        if q.candidates is None:
            continue
        for d in q.candidates:
            owner.setdefault(d, set()).add(q.group)
    return [next(iter(owner[d])) if len(owner.get(d, ())) == 1 else None for d in ds.doc_ids]


def dataset_records(ds: EvalDataset) -> list[dict[str, Any]]:
    """One record per document of ``ds``, in document order (id, text, tenant, session, time).

    Returns
    -------
    list of dict, length ``ds.n_docs``: ``id`` and ``text`` exactly the loader's.
    """
    tenants = document_tenants(ds)
    out = []
    for i, (did, text) in enumerate(zip(ds.doc_ids, ds.doc_texts)):
        rec: dict[str, Any] = {"id": did, "text": text}
        if tenants[i] is not None:
            rec["tenant"] = tenants[i]
        if ds.name == "locomo":
            parts = did.split(":")
            rec["session"] = f"{parts[0]}:S{parts[1][1:]}" if ds.unit == "turn" else did
        elif ds.name.startswith("longmemeval"):
            rec["session"] = did
        if ds.doc_dates[i] is not None:
            rec["time"] = record_time(ds.doc_dates[i])
        out.append(rec)
    return out


def locomo_records(path: str | os.PathLike | None = None, unit: str = "turn",
                   speakers: bool = True) -> list[dict[str, Any]]:
    """LoCoMo as records: one tenant per conversation.

    Parameters
    ----------
    path : locomo10.json (default :func:`gpuir.datapath.locomo_path`)
    unit : {"turn", "session"}
    speakers : bool
        Texts start with ``"<speaker>: "`` (the loader's default).

    Returns
    -------
    list of dict: turns carry ``metadata`` ``{"speaker", "dia_id"}`` and
    ``role: "user"`` (both sides are people); sessions carry ``metadata``
    ``{"speakers": [...]}``.
    """
    ds = load_locomo(path, unit=unit, speakers=speakers)
    with open(ds.source, encoding="utf-8") as f:
        raw = json.load(f)
    speaker_of: dict[str, str] = {}
    session_speakers: dict[str, list[str]] = {}
    for ci, conv_obj in enumerate(raw):
        sid = str(conv_obj.get("sample_id", f"conv{ci}"))
        conv = conv_obj["conversation"]
        for key, turns in conv.items():
            if not key.startswith("session_") or key.endswith("date_time") or not isinstance(turns, list):
                continue
            n = key[len("session_"):]
            names = []
            for ti, t in enumerate(turns, start=1):
                who = str(t.get("speaker", ""))
                speaker_of[f"{sid}:D{n}:{ti}"] = who
                if who and who not in names:
                    names.append(who)
            session_speakers[f"{sid}:S{n}"] = names
    recs = dataset_records(ds)
    for r in recs:
        r["tenant"] = r["id"].split(":")[0]
        if unit == "turn":
            r["role"] = "user"
            r["metadata"] = {"speaker": speaker_of.get(r["id"], ""), "dia_id": r["id"].split(":", 1)[1]}
        else:
            r["metadata"] = {"speakers": session_speakers.get(r["id"], [])}
    return recs


def longmemeval_records(path: str | os.PathLike | None = None, split: str = "s", roles: str = "user",
                        per_haystack: bool = True) -> list[dict[str, Any]]:
    """LongMemEval as records.

    Parameters
    ----------
    path, split, roles : as :func:`gpuir.eval.datasets.load_longmemeval`
    per_haystack : bool
        True: one tenant per question (its haystack), one record per haystack
        slot, id ``<question_id>/<session_id>``, time = the slot's date,
        ``metadata`` ``{"question_id", "session_id"}``. False: one record per
        distinct session (the loader's ids), without tenant or time.
    """
    ds = load_longmemeval(path, split=split, roles=roles)
    if not per_haystack:
        return [{"id": d, "text": t, "session": d} for d, t in zip(ds.doc_ids, ds.doc_texts)]
    idx = ds.doc_index
    out = []
    for q in ds.queries:
        cands = q.candidates or ()
        dates = q.meta.get("haystack_dates") or []
        if len(dates) != len(cands):  # a session repeated in one haystack: slots and sessions differ
            dates = []
        for j, sid in enumerate(cands):
            rec: dict[str, Any] = {"id": f"{q.qid}/{sid}", "text": ds.doc_texts[idx[sid]], "tenant": q.qid,
                                   "session": sid, "metadata": {"question_id": q.qid, "session_id": sid}}
            if j < len(dates) and dates[j] is not None:
                rec["time"] = record_time(dates[j])
            out.append(rec)
    return out
