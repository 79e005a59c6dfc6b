"""Router runtime: each query searched by the configuration of its type.

Configuration (``RetrieverConfig.router``)::

    {"classifier": "regex",            # or a QueryTypeClassifier config (gpuir.retrieve.query_types)
     "mode": "discrete",               # or "soft"
     "routes": {"temporal": {...}, "multi_hop": {...}},   # RetrieverConfig dicts
     "default": {...}}                 # for the other types (None: the outer configuration's channels)

* **discrete**: each query runs the route of its most likely type (the default
  route when its type has none); ``meta["route"][i]`` names it.
* **soft**: every route with posterior mass runs; each route's ranking (its top
  ``max(k, 50)``) is weighted by the classifier's posterior of the types it
  serves (the default route: every type without a route) and fused by weighted
  RRF, ``sum_r P(r | q) / (k_rrf + rank_r)`` (missing: 0), ties to the lower
  number. ``meta["route"][i]`` is the route of largest weight. With the regex
  classifier (one-hot posterior) soft is discrete.

Each route is a :class:`~gpuir.retrieve.Retriever` of its own over the same
memory (its own catalog, embeddings and graph, kept in step by its own sync),
saved in ``route_<n>/`` beside the outer configuration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .classify import QueryClassifier
from .config import RetrieverConfig
from .results import RetrieverResults
from .wheres import rows_where

__all__ = ["SOFT_DEPTH", "Router"]

#: Depth of each route's ranking fused by the soft router.
SOFT_DEPTH = 50


class Router:
    """Routes of a configuration, and their search.

    Parameters
    ----------
    memory : Memory
    config : RetrieverConfig
        With ``router`` set.
    build : callable ``(RetrieverConfig, folder or None) -> Retriever``
        Makes one route (opened from ``folder`` when a route was saved there).
    folder : Path, optional
        A saved retriever's folder: routes saved there are opened (nothing re-encoded).
    """

    def __init__(self, memory, config, build: Callable[[RetrieverConfig, Path | None], Any],
                 folder: Path | None = None):
        spec = config.router
        self.spec = spec
        self.mode = spec["mode"]
        self.k_rrf = float(config.k_rrf)
        default = spec["default"]
        if default is None:
            d = config.to_config()
            d["router"] = None
            default = d
        cfgs: dict[str, dict] = {**spec["routes"], "default": default}
        self.names = list(cfgs)
        built: list[tuple[dict, Any]] = []
        self.routes: dict[str, Any] = {}
        for name, c in cfgs.items():
            same = next((r for cc, r in built if cc == c), None)
            if same is None:
                sub = None if folder is None else Path(folder) / f"route_{len(built)}"
                try:
                    same = build(RetrieverConfig.from_config(c), sub)
                except ValueError as e:
                    raise ValueError(f"route {name!r}: {e}") from None
                built.append((c, same))
            self.routes[name] = same
        self._classifier = None

    @property
    def classifier(self):
        if self._classifier is None:
            self._classifier = QueryClassifier(self.spec["classifier"])
        return self._classifier

    def route_of(self, qtype: str) -> str:
        """The route serving a query type."""
        return qtype if qtype in self.spec["routes"] else "default"

    def _distinct(self) -> list[tuple[int, Any]]:
        seen: dict[int, Any] = {}
        for r in self.routes.values():
            seen.setdefault(id(r), r)
        return list(enumerate(seen.values()))

    def save(self, folder: Path) -> None:
        """Each distinct route's embeddings / graph in ``folder/route_<n>/``."""
        for n, r in self._distinct():
            r.save(Path(folder) / f"route_{n}")

    # ------------------------------------------------------------------ search
    def search(self, queries: list[str], k: int, where: Any, unit: str, backend: str, anchors: np.ndarray):
        """Routed search (module docstring); returns RetrieverResults."""
        t0 = time.perf_counter()
        if self.mode == "discrete":
            names = [self.route_of(t) for t in self.classifier.types(queries)]
            weights = None
        else:
            classes, P = self.classifier.posterior(queries)
            weights = np.zeros((len(queries), len(self.names)), np.float64)
            for c, cls in enumerate(classes):
                weights[:, self.names.index(self.route_of(cls))] += P[:, c]
            names = [self.names[j] for j in np.argmax(weights, axis=1)]
        t_route = time.perf_counter() - t0
        if weights is None:
            res = self._discrete(queries, k, where, unit, backend, anchors, names)
        else:
            res = self._soft(queries, k, where, unit, backend, anchors, weights)
        res.meta["route"] = names
        res.meta["timings"]["route"] = t_route
        return res

    def _run_route(self, name: str, rows: np.ndarray, queries, k, where, unit, backend, anchors):
        return self.routes[name].search([queries[i] for i in rows], k=k, where=rows_where(where, rows.tolist()),
                                        unit=unit, backend=backend, at=[int(a) for a in anchors[rows]])

    def _discrete(self, queries, k, where, unit, backend, anchors, names):
        B = len(queries)
        keys: list[list[str]] = [[] for _ in range(B)]
        scores = np.full((B, k), -np.inf, np.float32)
        numbers = np.full((B, k), -1, np.int64)
        src: dict[int, tuple[Any, int]] = {}
        meta: dict[str, Any] = {"config": None, "unit": unit, "channels": {}, "ran": None, "timings": {},
                                "escalated": np.zeros(B, bool), "widened": np.zeros(B, bool),
                                "windows": [None] * B, "notes": []}
        for name in dict.fromkeys(names):
            rows = np.flatnonzero(np.array(names) == name)
            r = self._run_route(name, rows, queries, k, where, unit, backend, anchors)
            for j, i in enumerate(rows.tolist()):
                keys[i], src[i] = r.keys[j], (r, j)
                meta["windows"][i] = r.meta["windows"][j]
            scores[rows], numbers[rows] = r.scores, r.numbers
            meta["escalated"][rows] = r.meta["escalated"]
            meta["widened"][rows] = r.meta["widened"]
            meta["timings"][f"route:{name}"] = r.meta["timings"].get("total", 0.0)
            meta["notes"] += [n for n in r.meta["notes"] if n not in meta["notes"]]

        def hits(i: int):
            r, j = src[i]
            return r.hits(j)

        return RetrieverResults(unit, keys, scores, numbers, hits, meta)

    def _soft(self, queries, k, where, unit, backend, anchors, weights):
        B = len(queries)
        depth = max(k, SOFT_DEPTH)
        per_route: list[tuple[int, np.ndarray, Any]] = []
        meta: dict[str, Any] = {"config": None, "unit": unit, "channels": {}, "ran": None, "timings": {},
                                "escalated": np.zeros(B, bool), "widened": np.zeros(B, bool),
                                "windows": [None] * B, "notes": []}
        for ri, name in enumerate(self.names):
            rows = np.flatnonzero(weights[:, ri] > 0)
            if rows.size == 0:
                continue
            r = self._run_route(name, rows, queries, depth, where, unit, backend, anchors)
            per_route.append((ri, rows, r))
            meta["escalated"][rows] |= r.meta["escalated"]
            meta["widened"][rows] |= r.meta["widened"]
            meta["timings"][f"route:{name}"] = r.meta["timings"].get("total", 0.0)
        keys: list[list[str]] = []
        scores = np.full((B, k), -np.inf, np.float32)
        numbers = np.full((B, k), -1, np.int64)
        src: list[dict[str, tuple[Any, int]]] = []
        for i in range(B):
            acc: dict[str, list] = {}  # key -> [fused score, number, (result, row) of the heaviest route]
            for ri, rows, r in sorted(per_route, key=lambda t: -weights[i, t[0]]):
                hit = np.flatnonzero(rows == i)
                if hit.size == 0:
                    continue
                j = int(hit[0])
                for rank, (key, num) in enumerate(zip(r.keys[j], r.numbers[j].tolist()), start=1):
                    e = acc.setdefault(key, [0.0, num, (r, j)])
                    e[0] += weights[i, ri] / (self.k_rrf + rank)
            order = sorted(acc, key=lambda x: (-acc[x][0], acc[x][1]))[:k]
            keys.append(order)
            scores[i, : len(order)] = [acc[x][0] for x in order]
            numbers[i, : len(order)] = [acc[x][1] for x in order]
            src.append({x: acc[x][2] for x in order})

        def hits(i: int):
            out = []
            for x, s in zip(keys[i], scores[i].tolist()):
                r, j = src[i][x]
                h = next((h for h in r.hits(j) if h.get("id", h.get("session")) == x), None)
                if h is not None:  # None: deleted since the search
                    out.append({**h, "score": float(s)})
            return out

        return RetrieverResults(unit, keys, scores, numbers, hits, meta)
