"""The channel registry: every channel kind a :class:`~gpuir.retrieve.RetrieverConfig` may name.

A **channel** is an object with its own state and one search::

    class Channel:
        unit = "record"            # or "session": what its rankings number
        needs_encoder = False      # True: query vectors are computed for it (request.query_vectors())
        needs_windows = False      # True: each query's time window is parsed for it (request.windows)
        def __init__(self, config, context): ...       # ChannelConfig, ChannelContext
        def applies(self, request): ...                # (B,) bool, or None: runs for every query
        def sync(self, change): ...                    # records added / deleted (a Change)
        def save(self, folder): ... / def open(self, folder): ...
        def search(self, queries, k, where, at, request): ...   # ranked lists

It is registered by kind with :func:`register_channel` (``factory(config, context)``
returns the channel); a package may also declare an entry point in the group
``gpuir.channels`` (name: the kind, object: the factory), loaded the first time a
kind is not found. The built-in kinds (:mod:`gpuir.retrieve.channels`) go through
this same registry; nothing else in :mod:`gpuir.retrieve` lists kinds.

``search`` returns, for the B queries, either a :class:`~gpuir.results.SearchResults`
over record sequence numbers / session numbers (the built-in channels), or B lists
of ``(id, score)`` pairs (record ids, or session ids for ``unit="session"``): the
retriever numbers them, drops ids it does not hold and ids outside ``where``
(the tenant boundary holds for every channel), orders each row by score
descending then number ascending, and cuts it at ``k``.

State shared by several channels (the record embeddings, the entity graph) is a
**resource** of the :class:`ChannelContext` (:meth:`ChannelContext.resource`),
synced, saved and opened once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)  # gpuir.retrieve.registry

__all__ = ["CHANNELS", "ENTRY_POINT_GROUP", "UNITS", "Change", "Channel", "ChannelContext", "ChannelKind",
           "ChannelRequest", "channel_kind", "channel_kinds", "register_channel", "unregister_channel"]

#: What a channel's rankings number.
UNITS: tuple[str, ...] = ("record", "session")
#: The entry-point group third-party channels are declared in.
ENTRY_POINT_GROUP = "gpuir.channels"


@dataclass(frozen=True)
class ChannelKind:
    """A registered kind.

    Attributes
    ----------
    kind : str
    factory : callable ``(ChannelConfig, ChannelContext) -> channel``
    unit : {"record", "session"}
    needs_encoder : bool
    """

    kind: str
    factory: Callable[..., Any]
    unit: str = "record"
    needs_encoder: bool = False


_KINDS: dict[str, ChannelKind] = {}
_LOCK = threading.Lock()
_ENTRY_POINTS_READ = False


def register_channel(kind: str, factory: Callable[..., Any], *, unit: str | None = None,
                     needs_encoder: bool | None = None, replace: bool = False) -> ChannelKind:
    """Register a channel kind.

    Parameters
    ----------
    kind : str
        The name configurations use (``ChannelConfig(kind)``).
    factory : callable
        ``factory(config, context)`` returns the channel (a class works).
    unit, needs_encoder : optional
        Default: the factory's attributes of those names (``"record"``, False).
    replace : bool
        Allow replacing a registered kind (otherwise a ValueError).

    Returns
    -------
    ChannelKind
    """
    if not isinstance(kind, str) or not kind.strip():
        raise ValueError(f"a channel kind is a non-empty str, got {kind!r}")
    if not callable(factory):
        raise TypeError(f"channel {kind!r}: factory must be callable (factory(config, context)), got {factory!r}")
    unit = getattr(factory, "unit", "record") if unit is None else unit
    if unit not in UNITS:
        raise ValueError(f"channel {kind!r}: unit must be one of {', '.join(UNITS)}, got {unit!r}")
    enc = bool(getattr(factory, "needs_encoder", False) if needs_encoder is None else needs_encoder)
    entry = ChannelKind(kind, factory, unit, enc)
    with _LOCK:
        if kind in _KINDS and not replace and _KINDS[kind].factory is not factory:
            raise ValueError(f"channel kind {kind!r} is already registered (pass replace=True to replace it)")
        _KINDS[kind] = entry
    log.debug("registered channel kind %r (%s)", kind, unit)
    return entry


def unregister_channel(kind: str) -> None:
    """Forget a registered kind (tests; a configuration naming it no longer validates)."""
    with _LOCK:
        _KINDS.pop(kind, None)


def _read_entry_points() -> None:
    global _ENTRY_POINTS_READ
    if _ENTRY_POINTS_READ:
        return
    _ENTRY_POINTS_READ = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _KINDS:
            continue
        try:
            register_channel(ep.name, ep.load())
        except Exception as e:  # noqa: BLE001 - a broken plug-in must not break the built-in channels
            log.warning("channel entry point %s = %s not loaded: %s", ep.name, ep.value, e)


def channel_kind(kind: str) -> ChannelKind:
    """The registered kind (entry points are read on a miss); ValueError naming the known kinds."""
    entry = _KINDS.get(kind)
    if entry is None:
        _read_entry_points()
        entry = _KINDS.get(kind)
    if entry is None:
        raise ValueError(f"unknown channel kind {kind!r}: choose one of {', '.join(_KINDS)} "
                         "(or register one with gpuir.retrieve.register_channel)")
    return entry


def channel_kinds() -> dict[str, str]:
    """Every registered kind and its unit (a copy)."""
    _read_entry_points()
    return {k: e.unit for k, e in _KINDS.items()}


class _KindsView(Mapping):
    """``CHANNELS``: a live read-only view kind -> unit of the registry."""

    def __getitem__(self, kind: str) -> str:
        try:
            return channel_kind(kind).unit
        except ValueError:
            raise KeyError(kind) from None

    def __iter__(self) -> Iterator[str]:
        return iter(channel_kinds())

    def __len__(self) -> int:
        return len(channel_kinds())

    def __contains__(self, kind: object) -> bool:
        if not isinstance(kind, str):
            return False
        try:
            channel_kind(kind)
        except ValueError:
            return False
        return True

    def __repr__(self) -> str:
        return f"CHANNELS({channel_kinds()!r})"


#: Channel kinds and the unit of what each returns (a live view of the registry).
CHANNELS: Mapping[str, str] = _KindsView()


@dataclass
class Change:
    """What a sync brought: the records added and deleted since the previous sync.

    Attributes
    ----------
    added : list of str
        Ids of the records added (in sequence order).
    removed : list of str
        Ids of the records deleted (or replaced by an update).
    removed_seqs : list of int
        Their sequence numbers.
    catalog : Catalog
        The session numbering after the sync (and views of the snapshot's columns: ``seq_of``, ``text_of`` ...).
    snapshot : Snapshot
        The memory's snapshot after the sync: read the records' columns from it
        (``snapshot.strings("text", seqs)``, ``snapshot.times(seqs)``).
    added_seqs : list of int
        The sequence numbers of the records added (as ``added``).
    """

    added: list[str]
    removed: list[str]
    removed_seqs: list[int]
    catalog: Any
    snapshot: Any
    added_seqs: list[int] = field(default_factory=list)


class ChannelContext:
    """What a retriever's channels share: the memory, its catalog, the encoder, shared resources.

    Attributes
    ----------
    memory : Memory
    catalog : Catalog
    config : RetrieverConfig
    progress : bool
    """

    def __init__(self, memory: Any, catalog: Any, config: Any, encoder: Callable[[], Any], progress: bool = False):
        self.memory = memory
        self.catalog = catalog
        self.config = config
        self._encoder = encoder
        self.progress = progress
        self.resources: dict[str, Any] = {}

    @property
    def encoder(self) -> Any:
        """The retriever's encoder (made on first use)."""
        return self._encoder()

    def resource(self, name: str, make: Callable[[], Any]) -> Any:
        """The shared resource ``name``, made by ``make()`` the first time.

        A resource may have ``sync(change)``, ``save(folder)`` and ``open(folder)``;
        the retriever calls them once per resource, before the channels'.
        """
        if name not in self.resources:
            self.resources[name] = make()
        return self.resources[name]

    def allowed(self, snapshot: Any, where: Any, n_queries: int) -> list[np.ndarray | None]:
        """Sequence numbers of the live records each query's ``where`` allows (None: all), sorted."""
        return self.catalog.allowed_seqs(snapshot, where, n_queries)


@dataclass
class ChannelRequest:
    """One search's shared inputs, handed to every channel of it.

    Attributes
    ----------
    queries : list of B str
    where : None, dict, or list of B (dict, None or False: no candidates)
    anchors : ndarray, shape (B,), int64
        When each query is asked (epoch ms).
    backend : str
        BM25 scoring device.
    snapshot : Snapshot
        The memory's snapshot every channel of the search reads.
    catalog : Catalog
    unit : {"record", "session"}
        What the search returns (record channels are pooled to sessions afterwards).
    windows : list of B (TimeWindow or None)
        Each query's parsed time window (None unless a channel ``needs_windows``).
    """

    queries: list[str]
    where: Any
    anchors: np.ndarray
    backend: str
    snapshot: Any
    catalog: Any
    unit: str = "record"
    windows: list[Any] = field(default_factory=list)
    query_vectors: Callable[[], np.ndarray] | None = None
    cache: dict[Any, Any] = field(default_factory=dict)
    offered: dict[int, Any] = field(default_factory=dict)

    def offer_records(self, channel: Any, results: Any) -> None:
        """A channel that ran record BM25 offers its MemoryResults (the best records listed with session hits).

        The first channel of the configuration that offered is used.
        """
        self.offered[id(channel)] = results

    def vectors(self) -> np.ndarray:
        """The queries' vectors, (B, dim) float32, host (computed once per search)."""
        if self.query_vectors is None:
            raise ValueError("this search has no encoder: declare needs_encoder = True on the channel")
        return self.query_vectors()


class Channel:
    """A convenient base class of channels (any object with these methods will do).

    Parameters
    ----------
    config : ChannelConfig
    context : ChannelContext
    """

    unit = "record"
    needs_encoder = False
    needs_windows = False

    def __init__(self, config: Any, context: ChannelContext):
        self.config = config
        self.context = context

    def applies(self, request: ChannelRequest) -> np.ndarray | None:
        """Which queries the channel runs for: (B,) bool, or None for all (the optimiser skips the others)."""
        return None

    def sync(self, change: Change) -> None:
        """Catch up with records added / deleted (nothing to do for a stateless channel)."""

    def save(self, folder: Path) -> None:
        """Write the channel's state into ``folder`` (the retriever's folder)."""

    def open(self, folder: Path) -> None:
        """Read what :meth:`save` wrote, before the first sync."""

    def search(self, queries: list[str], k: int, where: Any, at: np.ndarray, request: ChannelRequest) -> Any:
        """Ranked lists of the B queries (see the module docstring)."""
        raise NotImplementedError
