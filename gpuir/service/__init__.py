"""The memory service: ``gpuir serve`` (HTTP API over a memory and its own write-ahead log, tenant keys,
micro-batching) and its client.

Needs the ``service`` extra (``pip install 'gpuir[service]'``); nothing here is
imported by ``import gpuir``. Modules: :mod:`~gpuir.service.app` (routes),
:mod:`~gpuir.service.store` and :mod:`~gpuir.memory.durable` (durability: the memory's own log),
:mod:`~gpuir.service.keys` (API keys), :mod:`~gpuir.service.batcher`
(micro-batching), :mod:`~gpuir.service.client` (``MemoryClient``,
``AsyncMemoryClient``), :mod:`~gpuir.service.cli`. See ``docs/service.md``.
"""

__all__ = ["AsyncMemoryClient", "MemoryClient"]


def __getattr__(name):
    if name in __all__:
        from . import client

        return getattr(client, name)
    raise AttributeError(name)
