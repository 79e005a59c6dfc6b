"""Test doubles of the retriever's signal modules (gpuir.retrieve.temporal, entity_graph,
query_types, enrich), with the same names and signatures, installed with ``install(monkeypatch)``.

They are deliberately simple and fully predictable, so that tests of the retriever's plumbing can
compute expected results by hand, independently of the real parsers and classifiers.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DAY = 86_400_000

#: A small two-tenant conversation used by the retrieve tests.
T0 = 1_714_521_600_000  # 2024-05-01T00:00:00Z
MIN = 60_000
ROWS = [  # id, session, tenant, time, speaker, text
    ("a1", "s1", "x", T0 - 20 * DAY, "Caroline", "Caroline: I went to the LGBTQ support group"),
    ("a2", "s1", "x", T0 - 20 * DAY + MIN, "Melanie", "Melanie: that sounds great, Caroline"),
    ("a3", "s2", "x", T0 - 5 * DAY, "Caroline", "Caroline: I adopted a puppy named Biscuit"),
    ("a4", "s2", "x", T0 - 5 * DAY + MIN, "Melanie", "Melanie: Biscuit is cute, my kids love dogs"),
    ("a5", "s3", "x", T0 - 2 * DAY, "Caroline", "Caroline: I painted a sunset with Melanie"),
    ("a6", "s3", "x", T0 - 2 * DAY + MIN, "Melanie", "Melanie: the painting class with Jon was fun"),
    ("b1", "s9", "y", T0 - 1 * DAY, "Jon", "Jon: I went to Paris with Biscuit"),
]

# --------------------------------------------------------------------------- temporal


@dataclass(frozen=True)
class TimeWindow:
    start_ms: int
    end_ms: int
    expression: str

    def where(self) -> dict:  # as the real TimeWindow: ISO 8601 bounds
        from gpuir.memory import format_time

        return {"time": {"gte": format_time(self.start_ms), "lt": format_time(self.end_ms)}}


CALLS: dict[str, list] = {"parse": [], "enrich": [], "add": [], "remove": []}


def parse_time_window(query: str, anchor_ms: int, session_times_ms=()) -> TimeWindow | None:
    """"last week" -> the 7 days before the anchor; "since we last talked" -> [last session start, anchor)."""
    CALLS["parse"].append((query, anchor_ms, list(session_times_ms)))
    q = query.lower()
    if "last week" in q:
        return TimeWindow(anchor_ms - 7 * DAY, anchor_ms, "last week")
    if "since we last talked" in q and len(session_times_ms):
        return TimeWindow(int(session_times_ms[-1]), anchor_ms, "since we last talked")
    return None


# --------------------------------------------------------------------------- entity graph

HOP_SCORES = (1.0, 0.6, 0.35, 0.15)
_STOP = {"i", "what", "who", "where", "when", "how", "the", "did", "does", "my", "a", "and", "is"}


def extract_entities(text: str, speaker: str | None = None) -> list[str]:
    """Capitalised words (not stopwords), lowercased, plus the speaker."""
    out = []
    for w in re.findall(r"[A-Za-z]+", text):
        if w[0].isupper() and w.lower() not in _STOP and w.lower() not in out:
            out.append(w.lower())
    if speaker and speaker.lower() not in out:
        out.append(speaker.lower())
    return out


class EntityGraph:
    """entity -> records (mentions); records -> entities; hops through co-mentions."""

    def __init__(self) -> None:
        self.ents_of: dict[int, list[str]] = {}

    @property
    def n_records(self) -> int:
        return len(self.ents_of)

    @property
    def n_entities(self) -> int:
        return len({e for es in self.ents_of.values() for e in es})

    def add(self, seqs, texts, speakers) -> None:
        CALLS["add"].append(np.asarray(seqs, np.int64).tolist())
        for s, t, sp in zip(np.asarray(seqs).tolist(), texts, speakers):
            self.ents_of[int(s)] = extract_entities(t, sp)

    def remove(self, seqs) -> None:
        CALLS["remove"].append(np.asarray(seqs, np.int64).tolist())
        for s in np.asarray(seqs).tolist():
            self.ents_of.pop(int(s), None)

    def query_entities(self, query: str) -> list[str]:
        known = {e for es in self.ents_of.values() for e in es}
        return [e for e in extract_entities(query) if e in known]

    def is_multi_hop(self, query: str) -> bool:
        return " and " in query.lower() and len(self.query_entities(query)) >= 2

    def score(self, query, allowed=None, max_hops=2, depth=100):
        frontier = set(self.query_entities(query))
        seen_e, best = set(frontier), {}
        for hop in range(max_hops + 1):
            recs = [s for s, es in self.ents_of.items() if set(es) & frontier and s not in best]
            for s in recs:
                best[s] = HOP_SCORES[hop]
            nxt = {e for s in recs for e in self.ents_of[s]} - seen_e
            seen_e |= nxt
            frontier = nxt
        if allowed is not None:
            ok = set(np.asarray(allowed).tolist())
            best = {s: v for s, v in best.items() if s in ok}
        order = sorted(best, key=lambda s: (-best[s], s))[:depth]
        return np.array(order, np.int64), np.array([best[s] for s in order], np.float32)

    def save(self, folder: Path) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "graph.json").write_text(json.dumps({str(k): v for k, v in self.ents_of.items()}))

    @classmethod
    def load(cls, folder: Path) -> EntityGraph:
        g = cls()
        g.ents_of = {int(k): v for k, v in json.loads((Path(folder) / "graph.json").read_text()).items()}
        return g


# --------------------------------------------------------------------------- query types, enrichment

QUERY_TYPES = ("temporal", "multi_hop", "single_hop", "preference", "open_domain")


def regex_query_type(query: str) -> str:
    q = query.lower()
    if re.search(r"\bwhen\b|\blast week\b", q):
        return "temporal"
    if re.search(r"\bprefer|\bfavou?rite|\blike\b", q):
        return "preference"
    if " and " in q:
        return "multi_hop"
    return "single_hop"


def type_hint(query: str) -> str | None:
    q = query.lower()
    if re.search(r"\bprefer|\bfavou?rite|\blike\b", q):
        return "preference"
    if re.search(r"\bwhen\b|\bhappened\b", q):
        return "event"
    return None


def record_type(text: str) -> str:
    t = text.lower()
    if re.search(r"\blove|\blike|\bprefer|\bfavou?rite", t):
        return "preference"
    if re.search(r"\bwent\b|\bvisited\b|\bmoved\b", t):
        return "event"
    return "fact"


class QueryTypeClassifier:
    """Word-weight logistic model: P(type | q) = softmax(sum of weights of its words)."""

    def __init__(self, weights: dict[str, dict[str, float]]):
        self.weights = weights
        self.classes = sorted(weights)

    @classmethod
    def fit(cls, texts, labels, provenance, embeddings=None):  # pragma: no cover - not used
        raise NotImplementedError

    def predict_proba(self, queries, embeddings=None) -> np.ndarray:
        out = np.zeros((len(queries), len(self.classes)))
        for i, q in enumerate(queries):
            words = q.lower().split()
            z = np.array([sum(self.weights[c].get(w, 0.0) for w in words) for c in self.classes])
            e = np.exp(z - z.max())
            out[i] = e / e.sum()
        return out

    def predict(self, queries) -> list[str]:
        return [self.classes[j] for j in np.argmax(self.predict_proba(queries), axis=1)]

    def to_config(self) -> dict:
        return {"weights": self.weights, "provenance": {"data": "hand-written test double"}}

    @classmethod
    def from_config(cls, d) -> QueryTypeClassifier:
        return cls(d["weights"])


BRIDGES = {"puppy": ["dog", "pet"], "kayak": ["boat", "paddling"]}


def enrich_text(text: str, table="bridges") -> str:
    CALLS["enrich"].append(text)
    extra = [b for w in re.findall(r"[a-z]+", text.lower()) for b in BRIDGES.get(w, [])]
    return text + (" " + " ".join(extra) if extra else "")


def load_table(name: str = "bridges") -> dict[str, list[str]]:
    return dict(BRIDGES)


def _module(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    return m


def install(monkeypatch) -> dict[str, list]:
    """Put the doubles in place of gpuir.retrieve.{temporal, entity_graph, query_types, enrich}."""
    for v in CALLS.values():
        v.clear()
    mods = {
        "temporal": _module("gpuir.retrieve.temporal", TimeWindow=TimeWindow, parse_time_window=parse_time_window,
                             may_name_time=lambda q: True),
        "entity_graph": _module("gpuir.retrieve.entity_graph", HOP_SCORES=HOP_SCORES, EntityGraph=EntityGraph,
                                extract_entities=extract_entities),
        "query_types": _module("gpuir.retrieve.query_types", QUERY_TYPES=QUERY_TYPES,
                               regex_query_type=regex_query_type, type_hint=type_hint, record_type=record_type,
                               QueryTypeClassifier=QueryTypeClassifier),
        "enrich": _module("gpuir.retrieve.enrich", enrich_text=enrich_text, load_table=load_table),
    }
    import gpuir.retrieve as pkg

    for short, mod in mods.items():
        monkeypatch.setitem(sys.modules, f"gpuir.retrieve.{short}", mod)
        monkeypatch.setattr(pkg, short, mod, raising=False)
    # the modules that import these names at their top hold their own references: replace those too
    for user in ("retriever", "channels", "typefilter", "classify", "catalog", "cascade", "router"):
        um = importlib.import_module(f"gpuir.retrieve.{user}")
        for mod in mods.values():
            for name, val in vars(mod).items():
                if not name.startswith("__") and hasattr(um, name):
                    monkeypatch.setattr(um, name, val)
    return CALLS


