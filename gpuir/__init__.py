"""gpuir: GPU-accelerated retrieval for long-term agent and conversational memory.

The public names; everything heavy (CuPy, torch, FAISS) loads lazily.
"""

from .analysis import ANALYZERS, Analyzer
from .bm25 import METHODS, BM25Params
from .engine import BM25Index
from .index.csr import CSRIndex
from .index.storage import IndexFormatError
from .memory import Memory, MemoryResults
from .results import SearchResults
from .retrieve import Retriever, RetrieverConfig

__version__ = "0.1.0"

__all__ = [
    "ANALYZERS",
    "METHODS",
    "Analyzer",
    "BM25Index",
    "BM25Params",
    "CSRIndex",
    "IndexFormatError",
    "Memory",
    "MemoryResults",
    "Retriever",
    "RetrieverConfig",
    "SearchResults",
    "ShardedMemory",
    "__version__",
]


def __getattr__(name):
    # gpuir.ShardedMemory loads gpuir.cluster on first use (Ray itself only when a sharded memory starts)
    if name == "ShardedMemory":
        from .cluster import ShardedMemory

        return ShardedMemory
    raise AttributeError(f"module 'gpuir' has no attribute {name!r}")
