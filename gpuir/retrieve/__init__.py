"""Retrieval over a :class:`~gpuir.memory.Memory`: channels, fusion, one configuration.

* :mod:`~gpuir.retrieve.config`: :class:`RetrieverConfig` / :class:`ChannelConfig`
  (plain dataclasses, JSON round trip) and :func:`default_config`.
* :mod:`~gpuir.retrieve.catalog`: the session numbering and session documents,
  kept in step with the memory (the records themselves are read from its snapshots).
* :mod:`~gpuir.retrieve.registry`: the channel registry (:func:`register_channel`,
  the ``gpuir.channels`` entry-point group, the :class:`Channel` interface).
* :mod:`~gpuir.retrieve.channels`: the built-in channels ``bm25``, ``bm25_session``,
  ``bm25_pool``, ``dense``, ``late``, ``temporal``, ``entity``, registered like any other.
* :mod:`~gpuir.retrieve.fanout` (channels in threads), :mod:`~gpuir.retrieve.optimiser`
  (what runs for a query; fusion over what ran), :mod:`~gpuir.retrieve.cascade`,
  :mod:`~gpuir.retrieve.typefilter`, :mod:`~gpuir.retrieve.router`.
* :mod:`~gpuir.retrieve.dense_channels`: what ``dense`` and ``late`` search: the memory's stored vectors.
* :mod:`~gpuir.retrieve.retriever`: :class:`Retriever`.

See ``docs/retriever.md`` and ``docs/decisions.md``. Modules that need the
``routing`` extra are imported lazily; a missing extra raises :class:`MissingExtra`.
"""

from .._compat import MissingExtra
from .cascade import choose_tau, choose_tau_per_type
from .config import CHANNELS, FUSIONS, POOLINGS, ChannelConfig, RetrieverConfig, default_config
from .registry import Change, Channel, ChannelContext, ChannelRequest, register_channel, unregister_channel
from .results import RetrieverResults
from .retriever import UNITS, Retriever

__all__ = [
    "CHANNELS",
    "FUSIONS",
    "POOLINGS",
    "UNITS",
    "Change",
    "Channel",
    "ChannelConfig",
    "ChannelContext",
    "ChannelRequest",
    "MissingExtra",
    "Retriever",
    "RetrieverConfig",
    "RetrieverResults",
    "choose_tau",
    "choose_tau_per_type",
    "default_config",
    "register_channel",
    "unregister_channel",
]
