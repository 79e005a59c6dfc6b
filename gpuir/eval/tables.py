"""Result tables as text: aligned plain text (at most 100 columns wide), Markdown, CSV or JSON.

:func:`render` takes a header and rows of cell strings. The plain ``"table"``
format never exceeds ``width`` characters per line: when the metric columns do
not fit beside the key columns (``subset``, ``n``), they are split into several
blocks, each repeating the key columns.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["FORMATS", "WIDTH", "interval_cell", "render"]

#: Output formats of :func:`render` (and of ``gpuir eval --format``).
FORMATS: tuple[str, ...] = ("table", "markdown", "csv", "json")
#: Widest line of the plain table.
WIDTH = 100


def interval_cell(iv: dict[str, Any] | None) -> str:
    """``"0.668 [0.638,0.703]"`` from ``{mean, lo, hi, n}``; ``"-"`` when empty."""
    if iv is None or not iv.get("n"):
        return "-"
    return f"{iv['mean']:.3f} [{iv['lo']:.3f},{iv['hi']:.3f}]"


def _plain(head: Sequence[str], rows: Sequence[Sequence[str]], keys: int, width: int) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    key_w = sum(widths[:keys]) + 2 * keys
    blocks: list[list[int]] = []
    cur: list[int] = []
    used = key_w
    for j in range(keys, len(head)):
        need = widths[j] + 2
        if cur and used + need > width:
            blocks.append(cur)
            cur, used = [], key_w
        cur.append(j)
        used += need
    if cur or not blocks:
        blocks.append(cur)
    out: list[str] = []
    for bi, cols in enumerate(blocks):
        idx = list(range(keys)) + cols

        def fmt(r: Sequence[str], idx: list[int] = idx) -> str:
            return "  ".join(r[i].ljust(widths[i]) if i == 0 else r[i].rjust(widths[i]) for i in idx).rstrip()

        if bi:
            out.append("")
        out.append(fmt(head))
        out.append("  ".join("-" * widths[i] for i in idx))
        out.extend(fmt(r) for r in rows)
    return "\n".join(out)


def render(head: Sequence[str], rows: Sequence[Sequence[str]], fmt: str = "table", *, keys: int = 2,
           width: int = WIDTH, data: Any = None) -> str:
    """Render a table.

    Parameters
    ----------
    head : sequence of str
        Column names.
    rows : sequence of rows, each a sequence of str (one per column)
    fmt : {"table", "markdown", "csv", "json"}
    keys : int
        Leading key columns, repeated in every block of a split plain table.
    width : int
        Widest line of the plain table (a single column wider than it is not cut).
    data : optional
        What ``"json"`` prints (default: the rows as a list of dicts).
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if any(len(r) != len(head) for r in rows):
        raise ValueError("every row needs one cell per column")
    if fmt == "table":
        return _plain(head, rows, keys, width)
    if fmt == "markdown":
        lines = ["| " + " | ".join(head) + " |",
                 "| " + " | ".join("---" if i < keys and i == 0 else "---:" for i in range(len(head))) + " |"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        return "\n".join(lines)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(head)
        w.writerows(rows)
        return buf.getvalue().rstrip("\n")
    return json.dumps(data if data is not None else [dict(zip(head, r)) for r in rows], indent=1)
