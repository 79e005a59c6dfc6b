"""A tiny deterministic encoder for tests of hybrid and dense search that need no model."""

from __future__ import annotations

import numpy as np


class BagEncoder:
    """Hashed words: each word adds 1 to dimension ``sum(ord(c)) % dim``; rows normalised (float32).

    ``encode_passages`` and ``encode_queries`` are the same function, as an encoder's are for MiniLM.
    """

    def __init__(self, dim: int = 32):
        self.dim = dim

    def _enc(self, texts):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, sum(map(ord, w.strip("?.!,"))) % self.dim] += 1.0
        out[:, 0] += 1e-3
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    encode_passages = encode_queries = _enc
