"""Export and import a memory as JSON lines, exactly.

:meth:`Memory.export <gpuir.memory.Memory.export>` writes (atomically: a
temporary file renamed into place)::

    {"format": "gpuir-memory-export", "version": 1, "config": {...}, "records": N, "histories": H}
    {"id": ..., "text": ..., "time": "2024-05-08T13:56:00+00:00", ..., "vector": [...]}   N record lines
    {"history": ID, "versions": [{record}, ...]}                                         H history lines

Records come in add order with every field (times and ``expires_at`` as ISO 8601
with milliseconds, the memory's precision), so :meth:`Memory.import_
<gpuir.memory.Memory.import_>` into a fresh memory with the same settings
rebuilds the same records in the same order: the same searches, scores and ties.
A record line is a record as ``Memory.add`` and ``gpuir memory add`` take it,
plus ``"vector"`` (a list of float32 values) when vectors were given for its id:
float32 values are written as the shortest decimal that reads back to the same
float32. Expired records are not exported.

Import checks the whole file first (header first, known fields, times, ids
unique), then adds every record or none; a header whose analyzer or BM25
settings differ from the memory's is an error (the scores would differ) unless
``check_config=False``.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .records import RecordError

__all__ = ["FORMAT", "check_config", "read_export", "vector_of", "write_export"]

FORMAT = "gpuir-memory-export"
VERSION = 1


def vector_of(vectors: Any, rid: str) -> np.ndarray | None:
    """The vector of ``rid`` in ``vectors``: a mapping id -> array, or an embedding store (``row_of``, ``vecs``)."""
    if vectors is None:
        return None
    if isinstance(vectors, Mapping):
        v = vectors.get(rid)
    else:
        row = vectors.row_of.get(rid)
        v = None if row is None or vectors.vecs is None else vectors.vecs[row]
    return None if v is None else np.asarray(v, dtype=np.float32).reshape(-1)


def _vector_json(v: np.ndarray) -> list[float]:
    # float(np.float32) is exact in float64; its repr reads back to the same float64, hence the same float32
    return [float(x) for x in v.tolist()]


def write_export(path: str | os.PathLike, header: dict[str, Any], records: list[dict[str, Any]],
                 histories: list[tuple[str, list[dict[str, Any]]]], vectors: Any = None) -> int:
    """Write an export file (see the module docstring); returns the number of record lines."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp-{secrets.token_hex(4)}")
    dump = (lambda o: json.dumps(o, ensure_ascii=False, separators=(",", ":")) + "\n")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(dump({"format": FORMAT, "version": VERSION, **header, "records": len(records),
                          "histories": len(histories)}))
            f.writelines(dump(rec if (v := vector_of(vectors, rec["id"])) is None else
                              {**rec, "vector": _vector_json(v)}) for rec in records)
            f.writelines(dump({"history": rid, "versions": vs}) for rid, vs in histories)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return len(records)


def check_config(path, header: dict, have: dict, fix: str) -> None:
    """Refuse an export file from a memory with another analyzer or BM25 settings (its searches would score
    differently): ``header`` is the file's, ``have`` the importing memory's ``config()``; ``fix`` says what
    to do instead (the end of the message)."""
    got = header.get("config") or {}
    diff = [k for k in ("analyzer", "bm25") if got.get(k) != have.get(k)]
    if diff:
        raise ValueError(f"{path}: exported from a memory with another {' and '.join(diff)} "
                         f"({', '.join(f'{k}={got.get(k)!r}' for k in diff)}; this memory has "
                         f"{', '.join(f'{k}={have.get(k)!r}' for k in diff)}): its searches would score "
                         f"differently. {fix}")


def read_export(path: str | os.PathLike) -> tuple[dict[str, Any], list[dict[str, Any]], list[str],
                                                  dict[str, np.ndarray], list[tuple[str, list[dict[str, Any]]]]]:
    """Read an export file: (header, records, labels, vectors by id, histories).

    Records are returned as written (times as ISO strings); ``labels`` name each
    record's file and line for error messages.

    Raises
    ------
    RecordError
        Not an export file, a malformed line (file and line named).
    """
    p = Path(path)
    if not p.is_file():
        raise RecordError(f"{p}: no such file")
    header: dict[str, Any] | None = None
    records: list[dict[str, Any]] = []
    labels: list[str] = []
    vectors: dict[str, np.ndarray] = {}
    histories: list[tuple[str, list[dict[str, Any]]]] = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{p}, line {n}"
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RecordError(f"{where}: not valid JSON ({e})") from None
            if not isinstance(obj, dict):
                raise RecordError(f"{where}: each line must be a JSON object")
            if header is None:
                if obj.get("format") != FORMAT:
                    raise RecordError(f"{where}: not a gpuir memory export (the first line must be its header "
                                      f'{{"format": "{FORMAT}", ...}}); to add plain records use Memory.add or '
                                      "`gpuir memory add`")
                if obj.get("version") != VERSION:
                    raise RecordError(f"{where}: export version {obj.get('version')!r} is not supported (this gpuir "
                                      f"reads version {VERSION})")
                header = obj
                continue
            if "history" in obj:
                vs = obj.get("versions")
                if not isinstance(obj["history"], str) or not isinstance(vs, list) or not all(
                        isinstance(v, dict) for v in vs):
                    raise RecordError(f'{where}: a history line is {{"history": ID, "versions": [records]}}')
                histories.append((obj["history"], vs))
                continue
            if "vector" in obj:
                vec = obj.pop("vector")
                try:
                    arr = np.asarray(vec, dtype=np.float32)
                except (TypeError, ValueError):
                    arr = None
                if arr is None or arr.ndim != 1 or not np.isfinite(arr).all():
                    raise RecordError(f"{where}: 'vector' must be a list of finite numbers")
                if isinstance(obj.get("id"), str):
                    vectors[obj["id"]] = arr
            records.append(obj)
            labels.append(where)
    if header is None:
        raise RecordError(f"{p}: empty file (an export starts with its header line)")
    if header.get("records") not in (None, len(records)):
        raise RecordError(f"{p}: the header announces {header.get('records')} records but the file holds "
                          f"{len(records)}: the file is truncated or damaged")
    return header, records, labels, vectors, histories
