"""Retriever configuration: plain, JSON-serialisable dataclasses.

A configuration names the channels a :class:`~gpuir.retrieve.Retriever` runs
(each at its own depth) and how their top-k lists are fused. It round-trips
through a dict (:meth:`RetrieverConfig.to_config` / :meth:`RetrieverConfig.from_config`)
and a JSON file (:meth:`RetrieverConfig.save` / :meth:`RetrieverConfig.load`).

The default (:func:`default_config`) is the configuration that
leave-one-conversation-out cross-validation selects on LoCoMo over analyzers x
poolings x weights (``docs/retriever.md``): the ``en-large`` analyzer, z-score
fusion of session-level BM25 (weight 0.75) with turn-level BM25 pooled to
sessions by log-sum-exp (beta 1, weight 0.25).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["CHANNELS", "FUSIONS", "POOLINGS", "ChannelConfig", "RetrieverConfig", "default_config"]

#: Channel kinds and the unit of what each returns.
CHANNELS: dict[str, str] = {
    "bm25": "record",  # records, exact BM25 (Memory.search)
    "bm25_session": "session",  # a session's records concatenated, scored as one document
    "bm25_pool": "session",  # record BM25 pooled to sessions
    "dense": "record",  # record embeddings, cosine
    "late": "session",  # record cosines pooled to sessions
}
#: Pooling of record scores to a session score (``bm25_pool``, ``late``).
POOLINGS: tuple[str, ...] = ("max", "topk", "lse")
#: Fusion methods (:mod:`gpuir.fusion`); None: a single channel, its scores as they are.
FUSIONS: tuple[str, ...] = ("z", "minmax", "rrf", "weighted_rrf")


@dataclass
class ChannelConfig:
    """One channel.

    Attributes
    ----------
    kind : str
        One of :data:`CHANNELS`.
    depth : int
        Candidates the channel returns per query (its top-k); for pooled
        channels, the records retrieved before pooling.
    weight : float
        Weight of the channel in the fusion.
    pooling : {"max", "topk", "lse"}
        Record-to-session pooling (``bm25_pool``, ``late``).
    pool_k : int
        Records averaged by ``topk`` pooling.
    lse_beta : float
        Temperature of ``lse`` pooling: ``(1/beta) log sum exp(beta s)``.
    """

    kind: str
    depth: int = 100
    weight: float = 1.0
    pooling: str = "max"
    pool_k: int = 2
    lse_beta: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in CHANNELS:
            raise ValueError(f"unknown channel kind {self.kind!r}: choose one of {', '.join(CHANNELS)}")
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 1:
            raise ValueError(f"channel {self.kind}: depth must be a positive integer, got {self.depth!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) or not math.isfinite(
                self.weight):
            raise ValueError(f"channel {self.kind}: weight must be a finite number, got {self.weight!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"channel {self.kind}: pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if isinstance(self.pool_k, bool) or not isinstance(self.pool_k, int) or self.pool_k < 1:
            raise ValueError(f"channel {self.kind}: pool_k must be a positive integer, got {self.pool_k!r}")
        if not (isinstance(self.lse_beta, (int, float)) and self.lse_beta > 0 and math.isfinite(self.lse_beta)):
            raise ValueError(f"channel {self.kind}: lse_beta must be a positive number, got {self.lse_beta!r}")

    @property
    def unit(self) -> str:
        """``"record"`` or ``"session"``: what the channel ranks."""
        return CHANNELS[self.kind]

    @property
    def dense(self) -> bool:
        """Whether the channel needs embeddings."""
        return self.kind in ("dense", "late")


@dataclass
class RetrieverConfig:
    """Channels and their fusion.

    Attributes
    ----------
    channels : list of ChannelConfig
    fusion : {"z", "minmax", "rrf", "weighted_rrf"} or None
        None only with a single channel (its scores returned as they are).
    missing : "min", "zero" or float
        Score of a candidate a channel did not return (z / min-max fusion, :mod:`gpuir.fusion`).
    k_rrf : float
        RRF constant.
    encoder : str or None
        Model name or folder of the dense channels (None: the shipped all-MiniLM-L6-v2).
    analyzer : str, dict or None
        Analyzer of the BM25 channels (a name of :data:`gpuir.analysis.ANALYZERS` or a
        config dict). None: the memory's own. When it differs from the memory's, the
        retriever keeps its own record index with it (:mod:`gpuir.retrieve.catalog`).
    session_records : int
        Best records listed with each session hit (``unit="session"``).
    """

    channels: list[ChannelConfig] = field(default_factory=list)
    fusion: str | None = "z"
    missing: Any = "min"
    k_rrf: float = 60.0
    encoder: str | None = None
    analyzer: Any = None
    session_records: int = 3

    def __post_init__(self) -> None:
        self.channels = [c if isinstance(c, ChannelConfig) else ChannelConfig(**_only(c, ChannelConfig, "channel"))
                         for c in self.channels]
        if not self.channels:
            raise ValueError("a retriever configuration needs at least one channel")
        if self.fusion is None and len(self.channels) != 1:
            raise ValueError(f"fusion=None needs exactly one channel, got {len(self.channels)}")
        if self.fusion is not None and self.fusion not in FUSIONS:
            raise ValueError(f"unknown fusion {self.fusion!r}: choose one of {', '.join(FUSIONS)} or None")
        if isinstance(self.missing, str) and self.missing not in ("min", "zero"):
            raise ValueError(f"missing must be 'min', 'zero' or a number, got {self.missing!r}")
        if self.analyzer is not None:
            from ..analysis import Analyzer

            try:
                Analyzer(self.analyzer)
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(f"analyzer {self.analyzer!r}: {e}") from None
        if isinstance(self.session_records, bool) or not isinstance(self.session_records, int) or \
                self.session_records < 0:
            raise ValueError(f"session_records must be an integer >= 0, got {self.session_records!r}")

    @property
    def needs_encoder(self) -> bool:
        return any(c.dense for c in self.channels)

    def to_config(self) -> dict[str, Any]:
        """A JSON-serialisable dict (``from_config`` inverts it)."""
        return asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any] | RetrieverConfig) -> RetrieverConfig:
        """From a dict as :meth:`to_config` writes it (unknown keys are an error)."""
        if isinstance(config, RetrieverConfig):
            return config
        if not isinstance(config, dict):
            raise TypeError(f"a retriever configuration is a dict or RetrieverConfig, got {type(config).__name__}")
        return cls(**_only(config, cls, "retriever configuration"))

    def save(self, path: str | os.PathLike) -> Path:
        """Write the configuration as JSON."""
        p = Path(path)
        p.write_text(json.dumps(self.to_config(), indent=2) + "\n", encoding="utf-8")
        return p

    @classmethod
    def load(cls, path: str | os.PathLike) -> RetrieverConfig:
        """Read a configuration written by :meth:`save` (or by hand)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not a JSON retriever configuration ({e})") from None
        return cls.from_config(data)


def _only(d: dict[str, Any], cls: type, what: str) -> dict[str, Any]:
    if not isinstance(d, dict):
        raise TypeError(f"{what} must be a dict, got {type(d).__name__}")
    names = {f.name for f in fields(cls)}
    extra = sorted(set(d) - names)
    if extra:
        raise ValueError(f"{what}: unknown key(s) {', '.join(extra)}; known: {', '.join(sorted(names))}")
    return d


def default_config() -> RetrieverConfig:
    """The configuration leave-one-conversation-out selects on LoCoMo (see the module docstring)."""
    return RetrieverConfig(channels=[ChannelConfig("bm25_session", depth=100, weight=0.75),
                                     ChannelConfig("bm25_pool", depth=1000, weight=0.25, pooling="lse", lse_beta=1.0)],
                           fusion="z", analyzer="en-large")
