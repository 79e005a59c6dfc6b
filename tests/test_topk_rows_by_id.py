"""gpuir.topk.topk_rows_by_id: several top-k lists side by side, merged under the tie rule."""

from __future__ import annotations

import numpy as np

from gpuir.topk import topk_rows_by_id


def _brute(ids: np.ndarray, scores: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
    """Each row's best k (id, score) by a Python sort: score descending, then id ascending; pads dropped."""
    out = []
    for r_ids, r_sc in zip(ids.tolist(), scores.tolist()):
        pairs = sorted(((-s, i) for i, s in zip(r_ids, r_sc) if s != -np.inf))
        out.append([(i, -s) for s, i in pairs[:k]])
    return out


def test_rows_merge_under_the_tie_rule_with_pads_last():
    rng = np.random.default_rng(5)
    B, M = 40, 36
    ids = np.stack([rng.permutation(1000)[:M] for _ in range(B)]).astype(np.int64)
    scores = rng.integers(0, 4, (B, M)).astype(np.float32)  # many ties
    pad = rng.random((B, M)) < 0.3
    scores[pad] = -np.inf
    ids[pad] = -1  # pads carry -1, as the segments' lists do
    scores[0] = -np.inf  # a row of pads only
    ids[0] = -1
    for k in (1, 5, M, M + 7):
        order = topk_rows_by_id(ids, scores, k)
        assert order.shape == (B, min(k, M)) and order.dtype == np.int64
        got_i, got_s = np.take_along_axis(ids, order, 1), np.take_along_axis(scores, order, 1)
        want = _brute(ids, scores, k)
        for r in range(B):
            n = len(want[r])
            assert list(zip(got_i[r, :n].tolist(), got_s[r, :n].tolist())) == want[r], (k, r)
            assert (got_s[r, n:] == -np.inf).all(), (k, r)
