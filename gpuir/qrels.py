"""Relevance judgements (qrels): the one reader of TREC and BEIR qrels files.

Both ``gpuir parity --qrels`` and the BEIR loader of the evaluation harness
read qrels through :func:`read_qrels`, so a file that one accepts the other
accepts too.

Accepted lines (blank lines skipped):

* TREC: ``qid 0 docid grade`` (4 fields);
* BEIR: ``query-id corpus-id score`` (3 fields), with an optional header line.

A line holding a tab is split on tabs (so ids may contain spaces); otherwise
on runs of whitespace. A first line whose grade is not a number is a header.
Grades are integers (``"1.0"`` reads as 1). A repeated (query, document) pair
keeps its last grade, as trec_eval does.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["read_qrels"]


def _fields(line: str) -> list[str]:
    return [f.strip() for f in line.split("\t")] if "\t" in line else line.split()


def read_qrels(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    """Qrels from a TREC or BEIR file.

    Parameters
    ----------
    path : str or PathLike
        The qrels file (UTF-8, an optional byte-order mark).

    Returns
    -------
    dict
        ``{query id: {document id: grade}}`` in file order; grades of any sign are kept
        (which count as relevant is the caller's rule).

    Raises
    ------
    ValueError
        Not UTF-8, a line with neither 3 nor 4 fields, or a grade that is not a number;
        the message names the file and the line.
    """
    p = Path(path)
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ValueError(f"{p}:{line}: not valid UTF-8 ({e.reason})") from None
    out: dict[str, dict[str, int]] = {}
    for ln, line in enumerate(text.splitlines(), start=1):
        row = _fields(line)
        if not row or not "".join(row):
            continue
        if len(row) == 4:  # TREC: qid 0 docid grade
            row = [row[0], row[2], row[3]]
        if len(row) != 3:
            raise ValueError(f"{p}:{ln}: expected 'qid 0 docid grade' (TREC) or 'query-id corpus-id score' "
                             f"(BEIR), got {len(row)} fields")
        try:
            grade = int(float(row[2]))
        except (ValueError, OverflowError):
            if ln == 1:
                continue  # a header line
            raise ValueError(f"{p}:{ln}: grade {row[2]!r} is not a number") from None
        out.setdefault(row[0], {})[row[1]] = grade
    return out
