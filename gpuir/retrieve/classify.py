"""The query-type classifier of a cascade or router configuration.

``"regex"`` is :func:`gpuir.retrieve.query_types.regex_query_type` (a one-hot
posterior); a dict is a :class:`~gpuir.retrieve.query_types.QueryTypeClassifier`
configuration (:meth:`~gpuir.retrieve.query_types.QueryTypeClassifier.from_config`;
needs the ``routing`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .query_types import QueryTypeClassifier, regex_query_type

__all__ = ["QueryClassifier"]


class QueryClassifier:
    """Query types and posteriors from a configuration's ``classifier`` entry.

    Parameters
    ----------
    spec : "regex" or dict
    """

    def __init__(self, spec: Any):
        self.spec = spec
        if spec == "regex":
            self._regex = regex_query_type
            self.model = None
        else:
            self._regex = None
            self.model = QueryTypeClassifier.from_config(spec)

    def types(self, queries: Sequence[str]) -> list[str]:
        """The most likely type of each query (list of B str)."""
        if self._regex is not None:
            return [self._regex(q) for q in queries]
        return list(self.model.predict(list(queries)))

    def posterior(self, queries: Sequence[str]) -> tuple[list[str], np.ndarray]:
        """(classes, P): P is ndarray (B, n_classes) float64, rows summing to 1 (one-hot for regex)."""
        if self._regex is not None:
            ts = self.types(queries)
            classes = sorted(set(ts))
            P = np.zeros((len(ts), len(classes)), np.float64)
            for i, t in enumerate(ts):
                P[i, classes.index(t)] = 1.0
            return classes, P
        P = np.asarray(self.model.predict_proba(list(queries)), dtype=np.float64)
        return list(self.model.classes), P
