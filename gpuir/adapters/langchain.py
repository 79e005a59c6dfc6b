"""A LangChain retriever over a gpuir memory: ``GpuirRetriever(backend=...).invoke("query")``.

Returns ``langchain_core.documents.Document`` objects, best first:
``page_content`` is the record's text, ``id`` its record id, and ``metadata``
holds the hit's score and fields (:func:`gpuir.adapters.hit_metadata`).

Needs ``pip install 'gpuir[langchain]'`` (langchain-core).
"""

from __future__ import annotations

from typing import Any

from . import as_backend, hit_metadata, require

require("langchain_core", "langchain")

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, field_validator

__all__ = ["GpuirRetriever", "to_documents"]


def to_documents(hits: list[dict[str, Any]]) -> list[Document]:
    """Hits (dicts with id, score, text, fields) as LangChain Documents, in order."""
    return [Document(page_content=h.get("text") or "", id=str(h["id"]), metadata=hit_metadata(h)) for h in hits]


class GpuirRetriever(BaseRetriever):
    """LangChain ``BaseRetriever`` over a gpuir memory backend.

    Parameters
    ----------
    backend : gpuir.Memory, gpuir.Retriever or a MemoryBackend (e.g. MemoryClient)
    k : int, default 4
        Documents per query.
    where : dict, optional
        A ``where`` filter applied to every query (e.g. ``{"tenant": "acme"}``).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    backend: Any
    k: int = Field(default=4, ge=1)
    where: dict[str, Any] | None = None

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: Any) -> Any:
        return as_backend(v)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return to_documents(self.backend.search([query], k=self.k, where=self.where)[0])
