"""Ray: joining or starting a runtime, and the shard actors (the only module that imports Ray).

``address=None`` starts a local runtime sized to the machine (Ray's own
defaults: every CPU, every GPU it finds) that listens on loopback only and runs
no dashboard: ``ray.init(_node_ip_address="127.0.0.1", include_dashboard=False)``
with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` in the environment (without them
even a local runtime binds the machine's network address). Its workers import
the same gpuir as the caller (the package's parent directory leads their
``PYTHONPATH``). ``address="auto"`` or ``"HOST:PORT"`` joins a running cluster,
whose nodes must have gpuir installed. A runtime already started in this
process (``ray.init`` by the caller) is used as it is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

EXTRA = "pip install 'gpuir[ray]'"


def require_ray():
    """The ``ray`` module, or ImportError naming the extra to install."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(f"{e}: ShardedMemory needs Ray: {EXTRA}") from None
    return ray


def connect(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None) -> bool:
    """Make sure this process is connected to a Ray runtime; returns whether this call started it.

    Parameters
    ----------
    address : None (a local runtime on loopback), "auto", or "HOST:PORT"
    num_cpus, num_gpus : int, optional
        Size of a local runtime (default: the machine's).
    """
    if address is None:
        # read by Ray when it is imported (ray._private.ray_constants), here and in every process the runtime starts
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray = require_ray()
    if ray.is_initialized():
        return False
    if address is None:
        _loopback_constants()
        parent = str(Path(__file__).resolve().parents[2])  # the folder holding the gpuir package
        path = os.pathsep.join(p for p in (parent, os.environ.get("PYTHONPATH", "")) if p)
        ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=num_cpus, num_gpus=num_gpus,
                 namespace="gpuir", runtime_env={"env_vars": {"PYTHONPATH": path}})
    else:
        if not isinstance(address, str) or not address:
            raise ValueError(f"address must be None (a local runtime), 'auto' or 'HOST:PORT', got {address!r}")
        ray.init(address=address, namespace="gpuir")
    return True


def _loopback_constants() -> None:
    """The environment variable's effect in this process when Ray was imported before it was set."""
    try:
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
    except (ImportError, AttributeError):  # pragma: no cover - another Ray layout: the variable still reaches
        pass  # the processes the runtime starts


def cluster_gpus() -> int:
    """GPUs the runtime has (0 without)."""
    ray = require_ray()
    return int(ray.cluster_resources().get("GPU", 0))


def cluster_cpus() -> float:
    ray = require_ray()
    return float(ray.cluster_resources().get("CPU", 1))


def start_shard(root: Path, index: int, checkpoint_every: int, gpu: bool, num_cpus: float, max_restarts: int,
                lock_timeout: float, durability: str = "fsync") -> Any:
    """A shard actor (:class:`~gpuir.cluster.shard.ShardServer`) on its memory directory.

    Ray restarts it (``max_restarts``; -1: always) after its process dies; the
    constructor then reopens the directory and replays the log. Its calls run
    on up to 8 threads (searches never wait for the writer; writes are
    serialised inside the shard). Calls are plain actor calls: a compiled graph
    answered 3x faster here but does not survive the death of an actor
    (``bench/results/ray_transport_vm.json``, ``docs/scaling.md``); the reads of a
    shard on the coordinator's node take its direct channel instead
    (:mod:`gpuir.cluster.fastpath`), with these calls as the fallback.

    With ``gpu``, the actor asks Ray for one GPU (``num_gpus=1``: Ray gives it
    its own device through ``CUDA_VISIBLE_DEVICES``) and serves with the CuPy
    engine (:class:`ShardServer`'s ``backend="cupy"``). ``durability``: the level of the shard's memory's
    log (:mod:`gpuir.memory.durable`).
    """
    ray = require_ray()
    from .shard import ShardServer

    cls = ray.remote(ShardServer)
    return cls.options(**shard_options(gpu, num_cpus, max_restarts)).remote(
        str(root), index, None, checkpoint_every, lock_timeout, "cupy" if gpu else "auto", durability, True)


def shard_options(gpu: bool, num_cpus: float, max_restarts: int) -> dict[str, Any]:
    """The Ray actor options of a shard (one GPU of its own with ``gpu``)."""
    return {"num_cpus": num_cpus, "num_gpus": 1 if gpu else 0, "max_restarts": max_restarts, "max_task_retries": 0,
            "max_concurrency": 8, "scheduling_strategy": "SPREAD"}
