"""The dense evaluation methods ``dense``, ``late`` and ``rrf``, each a :class:`gpuir.Retriever` configuration.

Each method is a :class:`~gpuir.retrieve.RetrieverConfig` run by
:func:`gpuir.eval.config_methods.config_run` (``Retriever.search`` at
``unit="session"``, each question confined to its haystack and asked at its own
time) over a memory built from the data set (:func:`gpuir.eval.retriever_methods.build_retriever`):

* ``dense``: early dense retrieval, one ``dense`` channel over a memory whose records
  are whole sessions (each session encoded as one passage, truncated at the encoder's
  max_seq_length: 256 word pieces for MiniLM).
* ``late``: one ``late`` channel over the sessions' turn records: each turn encoded,
  a session scored by pooling its turns' cosines (``--pooling max|topk|lse``).
* ``rrf``: session BM25 (``bm25_session``) and a second channel fused by reciprocal
  rank fusion (``k_rrf`` 60): ``late`` max-pooled turns (default), ``dense`` over
  whole sessions (``--dense-mode early``) or turn BM25 pooled (``--dense-mode bm25_turn``).

These replace the dense-row implementation of the channels that evaluation kept
beside the Retriever (``gpuir/eval/hybrid_methods.py``, removed by issue 19):
every figure of these methods is what the Retriever returns. Agent-aware RRF (a
recency bonus in the fusion) and the ``mean`` / ``lme`` poolings have no
Retriever counterpart and went with it (``docs/dense.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..retrieve import ChannelConfig, RetrieverConfig
from .config_methods import config_run
from .datasets import EvalDataset, EvalQuery
from .retriever_methods import DENSE_MODES, retriever_arguments, retriever_from_args
from .runner import Run, register_method

__all__ = ["dense_config", "late_config", "rrf_config"]

#: Candidates each channel returns (sessions): more than any LoCoMo conversation or LongMemEval haystack holds.
DEPTH = 100


def _only(method: str, options: dict[str, Any], allowed: Sequence[str]) -> None:
    extra = sorted(k for k, v in options.items() if k not in allowed and v is not None)
    if extra:
        raise ValueError(f"--method {method} does not take {', '.join('--' + e.replace('_', '-') for e in extra)}")


def dense_config(encoder: str | None = None) -> RetrieverConfig:
    """``--method dense``: one dense channel (over session records: early dense)."""
    return RetrieverConfig(channels=[ChannelConfig("dense", depth=DEPTH)], fusion=None, encoder=encoder)


def late_config(encoder: str | None = None, pooling: str = "max", pool_k: int = 2,
                lse_beta: float = 1.0) -> RetrieverConfig:
    """``--method late``: one late channel (turn cosines pooled to sessions)."""
    return RetrieverConfig(channels=[ChannelConfig("late", depth=DEPTH, pooling=pooling, pool_k=int(pool_k),
                                                   lse_beta=float(lse_beta))], fusion=None, encoder=encoder)


def rrf_config(encoder: str | None = None, dense_mode: str = "late", pooling: str = "max", pool_k: int = 2,
               lse_beta: float = 1.0, k_rrf: float = 60.0) -> RetrieverConfig:
    """``--method rrf``: session BM25 + the ``dense_mode`` channel, reciprocal rank fusion."""
    if dense_mode not in DENSE_MODES:
        raise ValueError(f"--dense-mode must be one of {', '.join(DENSE_MODES)}, got {dense_mode!r}")
    kind = DENSE_MODES[dense_mode][0]
    second = ChannelConfig(kind, depth=1000 if kind == "bm25_pool" else DEPTH, pooling=pooling, pool_k=int(pool_k),
                           lse_beta=float(lse_beta))
    return RetrieverConfig(channels=[ChannelConfig("bm25_session", depth=DEPTH), second], fusion="rrf",
                           k_rrf=float(k_rrf), encoder=encoder)


@register_method("dense", help="Retriever, one dense channel over sessions encoded whole (early dense)",
                 add_arguments=retriever_arguments, from_args=retriever_from_args)
def dense_method(ds: EvalDataset, queries: Sequence[EvalQuery], k: int, *, backend: str = "auto",
                 progress: bool = False, encoder: str | None = None, **options: Any) -> Run:
    _only("dense", options, ())
    return config_run(ds, queries, k, dense_config(encoder), backend=backend, progress=progress, records="sessions")


@register_method("late", help="Retriever, one late channel: turn cosines pooled per session (--pooling, default max)",
                 add_arguments=retriever_arguments, from_args=retriever_from_args)
def late_method(ds: EvalDataset, queries: Sequence[EvalQuery], k: int, *, backend: str = "auto",
                progress: bool = False, encoder: str | None = None, pooling: str | None = None, pool_k: int = 2,
                lse_beta: float = 1.0, **options: Any) -> Run:
    _only("late", options, ())
    return config_run(ds, queries, k, late_config(encoder, pooling or "max", pool_k, lse_beta), backend=backend,
                      progress=progress)


@register_method("rrf", help="Retriever, session BM25 + late dense turns (max) by reciprocal rank fusion (k=60); "
                 "--dense-mode early|bm25_turn for the other second channels",
                 add_arguments=retriever_arguments, from_args=retriever_from_args)
def rrf_method(ds: EvalDataset, queries: Sequence[EvalQuery], k: int, *, backend: str = "auto",
               progress: bool = False, encoder: str | None = None, dense_mode: str | None = None,
               pooling: str | None = None, pool_k: int = 2, lse_beta: float = 1.0, k_rrf: float = 60.0,
               **options: Any) -> Run:
    _only("rrf", options, ())
    mode = dense_mode or "late"
    cfg = rrf_config(encoder, mode, pooling or "max", pool_k, lse_beta, k_rrf)
    return config_run(ds, queries, k, cfg, backend=backend, progress=progress, records=DENSE_MODES[mode][1])
