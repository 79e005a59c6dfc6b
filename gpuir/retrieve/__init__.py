"""Retrieval over a :class:`~gpuir.memory.Memory`: channels, fusion, one configuration.

* :mod:`~gpuir.retrieve.config`: :class:`RetrieverConfig` / :class:`ChannelConfig`
  (plain dataclasses, JSON round trip) and :func:`default_config`.
* :mod:`~gpuir.retrieve.catalog`: record -> session maps and session documents,
  kept in step with the memory.
* :mod:`~gpuir.retrieve.channels`: ``bm25``, ``bm25_session``, ``bm25_pool``,
  ``dense``, ``late``.
* :mod:`~gpuir.retrieve.embeddings`: record embeddings, incremental, saved beside the memory.
* :mod:`~gpuir.retrieve.retriever`: :class:`Retriever`.

See ``docs/retriever.md``.
"""

from .config import CHANNELS, FUSIONS, POOLINGS, ChannelConfig, RetrieverConfig, default_config
from .embeddings import EmbeddingStore
from .retriever import UNITS, Retriever, RetrieverResults

__all__ = [
    "CHANNELS",
    "FUSIONS",
    "POOLINGS",
    "UNITS",
    "ChannelConfig",
    "EmbeddingStore",
    "Retriever",
    "RetrieverConfig",
    "RetrieverResults",
    "default_config",
]
