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
    "__version__",
]
