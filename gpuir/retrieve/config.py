"""Retriever configuration: plain, JSON-serialisable dataclasses.

A configuration names the channels a :class:`~gpuir.retrieve.Retriever` runs
(each at its own depth) and how their top-k lists are fused. It round-trips
through a dict (:meth:`RetrieverConfig.to_config` / :meth:`RetrieverConfig.from_config`)
and a JSON file (:meth:`RetrieverConfig.save` / :meth:`RetrieverConfig.load`).

The default (:func:`default_config`) is the configuration that
leave-one-conversation-out cross-validation selects on LoCoMo over analyzers x
poolings x weights x the temporal channel's weight (``docs/retriever.md``,
issue 19): the ``en-large`` analyzer, z-score fusion of session-level BM25
(weight 0.75), turn-level BM25 pooled to sessions by log-sum-exp (beta 1,
weight 0.25) and the ``temporal`` channel (weight 0.5; it runs only for
questions that name a time).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .registry import CHANNELS, channel_kind

__all__ = ["CHANNELS", "ENRICH_TABLES", "FUSIONS", "POOLINGS", "ROUTER_MODES", "TRIGGERS", "ChannelConfig",
           "RetrieverConfig", "default_config"]

#: Pooling of record scores to a session score (``bm25_pool``, ``late``).
POOLINGS: tuple[str, ...] = ("max", "topk", "lse")
#: Fusion methods (:mod:`gpuir.fusion`); None: a single channel, its scores as they are.
FUSIONS: tuple[str, ...] = ("z", "minmax", "rrf", "weighted_rrf", "score_rrf")
#: Cascade triggers (:mod:`gpuir.retrieve.cascade`).
TRIGGERS: tuple[str, ...] = ("margin", "per_type", "always", "never")
#: Router modes (:mod:`gpuir.retrieve.router`).
ROUTER_MODES: tuple[str, ...] = ("discrete", "soft")
#: Vocabulary-enrichment tables of the lexical index (:mod:`gpuir.retrieve.enrich`).
ENRICH_TABLES: tuple[str, ...] = ("bridges",)


@dataclass
class ChannelConfig:
    """One channel.

    Attributes
    ----------
    kind : str
        A registered kind (:data:`CHANNELS`, :func:`gpuir.retrieve.register_channel`).
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
    min_score : float or None
        Candidates the channel scores below it are dropped before fusion (None: none).
    """

    kind: str
    depth: int = 100
    weight: float = 1.0
    pooling: str = "max"
    pool_k: int = 2
    lse_beta: float = 1.0
    min_score: float | None = None

    def __post_init__(self) -> None:
        channel_kind(self.kind)  # a ValueError naming the registered kinds
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
        if self.min_score is not None and (isinstance(self.min_score, bool) or not isinstance(
                self.min_score, (int, float)) or not math.isfinite(self.min_score)):
            raise ValueError(f"channel {self.kind}: min_score must be a finite number or None, got {self.min_score!r}")

    @property
    def unit(self) -> str:
        """``"record"`` or ``"session"``: what the channel ranks."""
        return channel_kind(self.kind).unit

    @property
    def dense(self) -> bool:
        """Whether the channel needs the encoder (query vectors, record embeddings)."""
        return channel_kind(self.kind).needs_encoder


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
    cascade : dict or None
        ``{"escalate": [kinds], "trigger": "margin" | "per_type" | "always" | "never", "tau": float,
        "per_type": {type: tau}, "classifier": "regex" | <QueryTypeClassifier config>}``: the channels
        of ``escalate`` run only for queries whose trigger fires (:mod:`gpuir.retrieve.cascade`).
    router : dict or None
        ``{"classifier": "regex" | <QueryTypeClassifier config>, "mode": "discrete" | "soft",
        "routes": {type: <RetrieverConfig dict>}, "default": <RetrieverConfig dict> or None}``
        (:mod:`gpuir.retrieve.router`). With a router, ``channels`` may be empty (then ``default``
        is required); the routes hold the channels.
    type_filter : dict or None
        ``{"min_results": 5}``: a query with a type hint searches the records of that type,
        widened to all records when fewer than ``min_results`` survive (:mod:`gpuir.retrieve.typefilter`).
    enrich : {"bridges"} or None
        Vocabulary enrichment of the lexical index (record and session BM25 only; never the
        embeddings, never the queries).
    parallel : bool
        Run a search's channels concurrently, one thread each (the result is the serial one).
    """

    channels: list[ChannelConfig] = field(default_factory=list)
    fusion: str | None = "z"
    missing: Any = "min"
    k_rrf: float = 60.0
    encoder: str | None = None
    analyzer: Any = None
    session_records: int = 3
    cascade: dict[str, Any] | None = None
    router: dict[str, Any] | None = None
    type_filter: dict[str, Any] | None = None
    enrich: str | None = None
    parallel: bool = True

    def __post_init__(self) -> None:
        self.channels = [c if isinstance(c, ChannelConfig) else ChannelConfig(**_only(c, ChannelConfig, "channel"))
                         for c in self.channels]
        if self.router is not None:
            self.router = _check_router(self.router, self)
        if not self.channels and self.router is None:
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
        if self.cascade is not None:
            self.cascade = _check_cascade(self.cascade, self.channels)
        if self.type_filter is not None:
            self.type_filter = _check_type_filter(self.type_filter)
        if self.enrich is not None and self.enrich not in ENRICH_TABLES:
            raise ValueError(f"enrich must be None or one of {', '.join(ENRICH_TABLES)}, got {self.enrich!r}")
        if not isinstance(self.parallel, bool):
            raise ValueError(f"parallel must be true or false, got {self.parallel!r}")  # noqa: TRY004 - one error type for a bad configuration

    @property
    def needs_encoder(self) -> bool:
        """Whether a dense channel runs: one of the channels, or of a router's routes."""
        if any(c.dense for c in self.channels):
            return True
        if self.router is not None:
            subs = [*self.router["routes"].values(), self.router["default"] or {}]
            return any(channel_kind(ch["kind"]).needs_encoder for c in subs for ch in c.get("channels", []))
        return False

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


def _finite(x: Any, what: str, allow_inf: bool = False) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or math.isnan(x) or (
            math.isinf(x) and not allow_inf):
        raise ValueError(f"{what} must be a {'number' if allow_inf else 'finite number'}, got {x!r}")
    return float(x)


def _check_classifier(c: Any, what: str) -> Any:
    if c == "regex":
        return c
    if isinstance(c, dict) and c:
        return c  # a QueryTypeClassifier config, checked when the classifier is built
    raise ValueError(f'{what}: classifier must be "regex" or a QueryTypeClassifier config dict, got {c!r}')


_CASCADE_KEYS = ("escalate", "trigger", "tau", "per_type", "classifier")


def _check_cascade(c: Any, channels: list[ChannelConfig]) -> dict[str, Any]:
    """The cascade dict with its defaults filled in (idempotent), or a clear ValueError."""
    if not isinstance(c, dict):
        raise TypeError(f"cascade must be a dict ({', '.join(_CASCADE_KEYS)}) or null, got {type(c).__name__}")
    extra = sorted(set(c) - set(_CASCADE_KEYS))
    if extra:
        raise ValueError(f"cascade: unknown key(s) {', '.join(extra)}; known: {', '.join(_CASCADE_KEYS)}")
    esc = c.get("escalate", ["dense", "late"])
    if isinstance(esc, str) or not isinstance(esc, (list, tuple)) or not esc:
        raise ValueError(f'cascade: escalate must be a non-empty list of channel kinds, e.g. ["dense"], got {esc!r}')
    bad = [k for k in esc if k not in CHANNELS]
    if bad:
        raise ValueError(f"cascade: escalate names unknown channel kind(s) {bad}; choose from {', '.join(CHANNELS)}")
    kinds = {ch.kind for ch in channels}
    if channels and not (set(esc) & kinds):
        raise ValueError(f"cascade: none of the escalation kinds {list(esc)} is a channel of the configuration "
                         f"({', '.join(sorted(kinds))})")
    if channels and all(ch.kind in esc for ch in channels):
        raise ValueError("cascade: every channel is an escalation channel; keep at least one cheap channel "
                         "that always runs")
    trigger = c.get("trigger", "margin")
    if trigger not in TRIGGERS:
        raise ValueError(f"cascade: trigger must be one of {', '.join(TRIGGERS)}, got {trigger!r}")
    tau = _finite(c.get("tau", 0.0), "cascade: tau", allow_inf=True)
    per_type = c.get("per_type", {}) or {}
    if not isinstance(per_type, dict) or any(not isinstance(k, str) for k in per_type):
        raise ValueError(f"cascade: per_type must map query types (str) to thresholds, got {per_type!r}")
    per_type = {k: _finite(v, f"cascade: per_type[{k!r}]", allow_inf=True) for k, v in per_type.items()}
    if trigger == "per_type" and not per_type:
        raise ValueError('cascade: trigger "per_type" needs a per_type table {type: tau} (tau is the fallback)')
    return {"escalate": list(esc), "trigger": trigger, "tau": tau, "per_type": per_type,
            "classifier": _check_classifier(c.get("classifier", "regex"), "cascade")}


def _check_type_filter(t: Any) -> dict[str, Any]:
    if not isinstance(t, dict):
        raise TypeError(f'type_filter must be a dict like {{"min_results": 5}} or null, got {type(t).__name__}')
    extra = sorted(set(t) - {"min_results"})
    if extra:
        raise ValueError(f"type_filter: unknown key(s) {', '.join(extra)}; known: min_results")
    n = t.get("min_results", 5)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"type_filter: min_results must be a positive integer, got {n!r}")
    return {"min_results": n}


_ROUTER_KEYS = ("classifier", "mode", "routes", "default")


def _check_router(r: Any, outer: RetrieverConfig) -> dict[str, Any]:
    """The router dict with its routes normalised (each a full RetrieverConfig dict), or a ValueError."""
    if not isinstance(r, dict):
        raise TypeError(f"router must be a dict ({', '.join(_ROUTER_KEYS)}) or null, got {type(r).__name__}")
    extra = sorted(set(r) - set(_ROUTER_KEYS))
    if extra:
        raise ValueError(f"router: unknown key(s) {', '.join(extra)}; known: {', '.join(_ROUTER_KEYS)}")
    mode = r.get("mode", "discrete")
    if mode not in ROUTER_MODES:
        raise ValueError(f"router: mode must be one of {', '.join(ROUTER_MODES)}, got {mode!r}")
    routes = r.get("routes")
    if not isinstance(routes, dict) or not routes or any(not isinstance(k, str) for k in routes):
        raise ValueError("router: routes must be a non-empty dict {query type: retriever configuration}")
    if outer.cascade is not None or outer.type_filter is not None:
        raise ValueError("router: put cascade and type_filter inside the routes' configurations, not beside "
                         "the router")

    def sub(cfg: Any, what: str) -> dict[str, Any]:
        if isinstance(cfg, RetrieverConfig):
            cfg = cfg.to_config()
        if not isinstance(cfg, dict):
            raise TypeError(f"router: {what} must be a retriever configuration dict, got {type(cfg).__name__}")
        if cfg.get("router") is not None:
            raise ValueError(f"router: {what} has a router of its own; routers do not nest")
        try:
            return RetrieverConfig.from_config(cfg).to_config()
        except (ValueError, TypeError) as e:
            raise ValueError(f"router: {what}: {e}") from None

    default = r.get("default")
    if default is None and not outer.channels:
        raise ValueError("router: give a default configuration (or channels beside the router) for queries "
                         "whose type has no route")
    return {"classifier": _check_classifier(r.get("classifier", "regex"), "router"), "mode": mode,
            "routes": {t: sub(c, f"route {t!r}") for t, c in routes.items()},
            "default": None if default is None else sub(default, "default")}


def default_config() -> RetrieverConfig:
    """The configuration leave-one-conversation-out selects on LoCoMo (see the module docstring)."""
    return RetrieverConfig(channels=[ChannelConfig("bm25_session", depth=100, weight=0.75),
                                     ChannelConfig("bm25_pool", depth=1000, weight=0.25, pooling="lse", lse_beta=1.0),
                                     ChannelConfig("temporal", depth=100, weight=0.5)],
                           fusion="z", analyzer="en-large")
