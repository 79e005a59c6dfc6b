"""A LlamaIndex retriever over a gpuir memory: ``GpuirRetriever(backend).retrieve("query")``.

Returns ``NodeWithScore`` objects, best first: a ``TextNode`` with the record's
text, its record id as ``id_``, and the hit's fields as ``metadata``
(:func:`gpuir.adapters.hit_metadata`); the score is the hit's score.

Needs ``pip install 'gpuir[llamaindex]'`` (llama-index-core). Nothing here makes
LlamaIndex fetch NLTK data or tokenizers: the retriever never touches its
text splitters, stopwords or token counters.
"""

from __future__ import annotations

from typing import Any

from . import as_backend, hit_metadata, require

require("llama_index.core", "llamaindex")

from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

__all__ = ["GpuirRetriever", "to_nodes"]


def to_nodes(hits: list[dict[str, Any]]) -> list[NodeWithScore]:
    """Hits (dicts with id, score, text, fields) as LlamaIndex nodes with scores, in order."""
    return [
        NodeWithScore(node=TextNode(id_=str(h["id"]), text=h.get("text") or "", metadata=hit_metadata(h)),
                      score=float(h["score"]))
        for h in hits
    ]


class GpuirRetriever(BaseRetriever):
    """LlamaIndex ``BaseRetriever`` over a gpuir memory backend.

    Parameters
    ----------
    backend : gpuir.Memory, gpuir.Retriever or a MemoryBackend (e.g. MemoryClient)
    k : int, default 4
        Nodes per query.
    where : dict, optional
        A ``where`` filter applied to every query.
    **kwargs
        To LlamaIndex's ``BaseRetriever`` (``callback_manager``, ``verbose``, ...).
    """

    def __init__(self, backend: Any, k: int = 4, where: dict[str, Any] | None = None, **kwargs: Any):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        self.backend = as_backend(backend)
        self.k = k
        self.where = where
        super().__init__(**kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return to_nodes(self.backend.search([query_bundle.query_str], k=self.k, where=self.where)[0])
