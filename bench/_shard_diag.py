"""Setup shared by the shard diagnostics of issue 38 (``diag_shard_search.py``, ``profile_fastpath_call.py``,
``profile_shard_actor.py``, ``profile_sharded_one.py``, ``ab_rows_with_codes.py``).

Each of them puts one ``Memory`` beside a shard (a 1-shard ``ShardedMemory``, or a ``ShardServer`` in this
process, or both) filled with the same records of the synthetic agent corpus, then times one question at a
time. This module holds what they share, so that they build and load alike:

* importing it sets the environment they need before Ray, NumPy or gpuir are imported (Ray on loopback
  only; ``GPUIR_TIERED_START=0`` unless set) and puts the repository and ``bench/`` first on ``sys.path``;
  a script imports it before anything else;
* :func:`parser` and :func:`parse`: their common options;
* :func:`fill` and :func:`rig`: the memories, filled with the same records;
* :func:`pct` and :func:`emit`: their figures and their results.

Not a benchmark by itself, and not part of the package.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray is imported: loopback only
os.environ.setdefault("GPUIR_TIERED_START", "0")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import numpy as np


def pct(xs, q=50) -> float:
    """A percentile of some timings, rounded as the results keep it.

    Parameters
    ----------
    xs : sequence of float
        The timings (ms).
    q : float, default 50
        The percentile.

    Returns
    -------
    float
        The ``q``-th percentile of ``xs``, rounded to 3 decimals.
    """
    return round(float(np.percentile(np.asarray(xs), q)), 3)


def parser(doc: str, *, records: int = 200_000, queries: int = 500, batch: int = 10_000) -> argparse.ArgumentParser:
    """The options every diagnostic takes: ``--records``, ``--queries``, ``--one``, ``--k``, ``--batch``.

    Parameters
    ----------
    doc : str
        The script's docstring; its first paragraph describes the parser.
    records, queries, batch : int
        The defaults of ``--records`` (corpus size), ``--queries`` (questions generated) and ``--batch``
        (records per ``add``).

    Returns
    -------
    argparse.ArgumentParser
        The parser; the script adds its own options, then calls :func:`parse`.
    """
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--records", type=int, default=records)
    p.add_argument("--queries", type=int, default=queries)
    p.add_argument("--one", type=int, default=300)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--batch", type=int, default=batch)
    return p


def parse(p: argparse.ArgumentParser, argv=None, *, label: bool = True) -> argparse.Namespace:
    """Add the last options (``--label`` where the script takes it, ``--out``) and parse the command line.

    Parameters
    ----------
    p : argparse.ArgumentParser
        A parser from :func:`parser`, with the script's own options added.
    argv : list of str, optional
        The arguments (default: ``sys.argv[1:]``).
    label : bool, default True
        Whether the script takes ``--label``.

    Returns
    -------
    argparse.Namespace
        The parsed options.
    """
    if label:
        p.add_argument("--label", default="", help="a note saved with the results (e.g. 'under load')")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def fill(corpus: dict, batch: int, mem=None, sm=None, shard=None) -> float:
    """Add the corpus's records, batch by batch, to each memory given: the same records, in the same order.

    Parameters
    ----------
    corpus : dict
        From ``bench_sharded.synthetic``.
    batch : int
        Records per ``add``.
    mem : gpuir.Memory, optional
        Filled by ``add``.
    sm : gpuir.cluster.ShardedMemory, optional
        Filled by ``add``, then saved.
    shard : gpuir.cluster.shard.ShardServer, optional
        Filled by the coordinator's writes: one ``add`` per batch, write ids from 1, sequence numbers from 0.

    Returns
    -------
    float
        The seconds it took (the save included).
    """
    if shard is not None:
        from gpuir.cluster.shard import write_payload
        from gpuir.memory.intake import to_batch
    t0 = time.perf_counter()
    seq = 0
    for wid, b in enumerate(corpus["batches"](batch), start=1):
        if mem is not None:
            mem.add(b)
        if sm is not None:
            sm.add(b)
        if shard is not None:
            shard.write(write_payload("add", wid, batch=to_batch(b), seqs=np.arange(seq, seq + len(b), dtype=np.int64)))
        seq += len(b)
    if sm is not None:
        sm.save()
    return time.perf_counter() - t0


@dataclass
class Rig:
    """One ``Memory`` beside a shard, filled with the same records (from :func:`rig`).

    Attributes
    ----------
    work : Path
        The temporary directory the shards live in.
    mem : gpuir.Memory
        The baseline.
    sm : gpuir.cluster.ShardedMemory or None
        A 1-shard sharded memory (``route="tenant"``, on CPU), its shard a Ray actor.
    shard : gpuir.cluster.shard.ShardServer or None
        A shard in this process (no Ray).
    load_s : float
        The seconds :func:`fill` took.
    """

    work: Path
    mem: Any
    sm: Any = None
    shard: Any = None
    load_s: float = 0.0

    def warm_up(self, corpus: dict, k: int, rounds: int) -> None:
        """Search the corpus's first ``rounds`` questions in ``mem``, then ``sm`` (if any), each in turn."""
        queries, wheres = corpus["queries"], corpus["wheres"]
        for i in range(rounds):
            self.mem.search(queries[i], k=k, where=wheres[i])
            if self.sm is not None:
                self.sm.search(queries[i], k=k, where=wheres[i])


@contextmanager
def rig(corpus: dict, batch: int, prefix: str, *, sharded: bool = True, shard: str | None = None,
        checkpoint_every: int = 10_000) -> Iterator[Rig]:
    """A ``Memory``, a 1-shard ``ShardedMemory`` and/or an in-process ``ShardServer``, filled alike.

    Parameters
    ----------
    corpus, batch
        The records, as :func:`fill` takes them.
    prefix : str
        The temporary directory's prefix.
    sharded : bool, default True
        Whether to create the 1-shard ``ShardedMemory`` (``work/"sm"``, ``route="tenant"``, ``device="cpu"``).
    shard : str, optional
        Where (under the temporary directory) to create a ``ShardServer`` in this process; it takes the
        configuration of the sharded memory, or of the ``Memory`` without one.
    checkpoint_every : int, default 10_000
        The in-process shard's checkpoint interval.

    Yields
    ------
    Rig
        The memories, filled; closed and their directory removed on leaving.
    """
    from gpuir import Memory

    work = Path(tempfile.mkdtemp(prefix=prefix))
    r = Rig(work=work, mem=Memory())
    try:
        if sharded:
            from gpuir.cluster import ShardedMemory

            r.sm = ShardedMemory.create(work / "sm", shards=1, route="tenant", device="cpu")
        if shard is not None:
            from gpuir.cluster.shard import ShardServer
            from gpuir.cluster.sharded import memory_kwargs

            config = (r.sm if r.sm is not None else r.mem).config()
            r.shard = ShardServer(work / shard, create=memory_kwargs(config), checkpoint_every=checkpoint_every)
        r.load_s = fill(corpus, batch, r.mem, r.sm, r.shard)
        yield r
    finally:
        for m in (r.shard, r.sm, r.mem):
            if m is not None:
                m.close()
        shutil.rmtree(work, ignore_errors=True)


def emit(res: dict, out: str | None, shown: dict | None = None) -> None:
    """Print the results (or ``shown``, a part of them) and write them all to ``out`` if given.

    Parameters
    ----------
    res : dict
        The results.
    out : str, optional
        A JSON file to write them to.
    shown : dict, optional
        What to print instead of ``res``.
    """
    print(json.dumps(res if shown is None else shown, indent=1))
    if out:
        Path(out).write_text(json.dumps(res, indent=1) + "\n")
