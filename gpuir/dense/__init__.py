"""Dense retrieval: encoder, vector index, late interaction over turns.

Heavy dependencies (torch, sentence-transformers, faiss) load lazily, on first use.
"""

from .index import DenseIndex, l2_normalize, topk_rows
from .late_interaction import (
    POOLING_OPS,
    bm25_turn_late_interaction,
    late_interaction_scores,
    pool_turn_scores,
    segment_reduce,
    segment_reduce_numpy,
    segments_from_labels,
)


def __getattr__(name):  # Encoder imports torch only when asked for
    if name in ("Encoder", "default_model_path", "get_encoder"):
        from . import encoder

        return getattr(encoder, name)
    raise AttributeError(name)


__all__ = [
    "POOLING_OPS",
    "DenseIndex",
    "Encoder",
    "bm25_turn_late_interaction",
    "default_model_path",
    "l2_normalize",
    "late_interaction_scores",
    "pool_turn_scores",
    "segment_reduce",
    "segment_reduce_numpy",
    "segments_from_labels",
    "topk_rows",
]
