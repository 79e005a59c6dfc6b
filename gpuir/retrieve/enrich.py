"""Storage-time vocabulary enrichment for the lexical index (SelRoute-style bridges).

A record that says "we hiked to the falls" never contains "outdoor activity", the words a
later question may use. :func:`enrich_text` appends, once each, the bridge / hypernym
terms of the words a text contains, from a shipped table:

* ``bridges`` (``gpuir/data/enrichment_bridges.json``): about 600 trigger words in 43
  themed groups (activities, pets, purchases, travel, family, work, health, ...),
  **hand-written by the gpuir authors** for conversational memory. No lexical database
  was used (nltk's WordNet corpus needs a download, which gpuir never does).

The enriched text is for the lexical (BM25) index only: queries are never enriched, and
neither are the texts that get embedded (SelRoute finds enrichment hurts embeddings).

Table format
------------
``{"meta": {...}, "groups": [{"bridges": [terms], "words": [lowercase words]}, ...]}``;
:func:`load_table` flattens it into ``{word: [bridge terms]}`` (a word in several groups
gets the union, in group order). Words are single lowercase tokens; inflections are
listed explicitly (no stemming), so the table says exactly what fires.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from pathlib import Path

__all__ = ["TABLES", "enrich_text", "enrichment_terms", "load_table"]

#: Names of the shipped tables (``gpuir/data/enrichment_<name>.json``).
TABLES: tuple[str, ...] = ("bridges",)

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def _table_path(name: str):
    return resources.files("gpuir").joinpath("data", f"enrichment_{name}.json")


@functools.lru_cache(maxsize=8)
def _load(name: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9_]+", name):
        raise ValueError(f"enrichment table name must be a lowercase word such as 'bridges', got {name!r}")
    p = _table_path(name)
    if not p.is_file():
        raise ValueError(f"no enrichment table {name!r} (gpuir/data/enrichment_{name}.json); shipped: {list(TABLES)}")
    data = json.loads(p.read_text(encoding="utf-8"))
    return tuple(_flatten(data, str(p)).items())  # immutable for the cache


def _flatten(data: dict, where: str) -> dict[str, tuple[str, ...]]:
    groups = data.get("groups") if isinstance(data, dict) else None
    if not isinstance(groups, list):
        raise ValueError(f"{where}: an enrichment table needs a 'groups' list")  # noqa: TRY004
    out: dict[str, list[str]] = {}
    for i, g in enumerate(groups):
        if not (isinstance(g, dict) and isinstance(g.get("bridges"), list) and isinstance(g.get("words"), list)):
            raise ValueError(f"{where}: group {i} needs 'bridges' and 'words' lists")  # noqa: TRY004
        for w in g["words"]:
            if not isinstance(w, str) or _WORD.fullmatch(w) is None:
                raise ValueError(f"{where}: group {i} word {w!r} is not one lowercase token")
            lst = out.setdefault(w, [])
            for b in g["bridges"]:
                if b not in lst:
                    lst.append(b)
    return {w: tuple(b) for w, b in out.items()}


def load_table(name: str = "bridges") -> dict[str, list[str]]:
    """A shipped enrichment table as ``{trigger word: [bridge terms]}``.

    Parameters
    ----------
    name : str
        ``"bridges"`` (see :data:`TABLES`), or a path to a JSON file of the same format.

    Returns
    -------
    dict of str -> list of str
        A fresh copy (safe to modify).
    """
    if isinstance(name, (str, Path)) and str(name).endswith(".json"):
        p = Path(name)
        if not p.is_file():
            raise ValueError(f"enrichment table file {p} does not exist")
        return {w: list(b) for w, b in _flatten(json.loads(p.read_text(encoding="utf-8")), str(p)).items()}
    return {w: list(b) for w, b in _load(name)}


@functools.lru_cache(maxsize=8)
def _named(name: str) -> dict[str, tuple[str, ...]]:
    return dict(_load(name))


def enrichment_terms(text: str, table: str | dict = "bridges") -> list[str]:
    """The bridge terms ``text`` triggers, in order of first trigger, each once.

    Terms whose words all occur in ``text`` already are left out.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    tab = _named(table) if isinstance(table, str) else table
    if not isinstance(tab, dict):
        raise TypeError("table must be a table name (e.g. 'bridges') or a dict word -> [terms]")
    words = _WORD.findall(text.lower())
    present = set(words)
    seen: set[str] = set()
    out: list[str] = []
    for w in dict.fromkeys(words):
        for term in tab.get(w, ()):
            if term in seen:
                continue
            seen.add(term)
            if all(t in present for t in _WORD.findall(term.lower())):
                continue
            out.append(term)
    return out


def enrich_text(text: str, table: str | dict = "bridges") -> str:
    """``text`` followed by its bridge terms (each once), for the lexical index only.

    Parameters
    ----------
    text : str
        A record's text.
    table : str or dict
        A shipped table name (``"bridges"``) or a ``{word: [terms]}`` dict.

    Returns
    -------
    str
        ``text`` unchanged when nothing fires, else ``text + "\\n" + " ".join(terms)``
        (the original text is always a prefix).
    """
    terms = enrichment_terms(text, table)
    if not terms:
        return text
    return text + "\n" + " ".join(terms)
