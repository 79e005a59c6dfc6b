"""``gpuir serve`` and ``gpuir serve-keys``: run the memory service, manage its API keys.

::

    gpuir serve MEMORY_DIR [--host 127.0.0.1] [--port 8080] [--statistics tenant|pooled] [--ranking bm25|hybrid]
                           [--batch-window-ms 2] [--max-batch 256]
                           [--checkpoint-every 10000] [--checkpoint-seconds 60] [--max-body-bytes 4194304]
                           [--keep-alive-seconds 75] [--header-timeout-seconds 10] [--body-timeout-seconds 30]
                           [--max-connections 2048] [--max-query-terms 8192] [--max-hits 20000]
                           [--max-response-bytes 8388608] [--rate-limit 100] [--rate-burst 200]
                           [--backend auto] [--access-log] [--salvage] [--durability fsync|flush|none]
                           [--ray-address ADDRESS]
    gpuir serve-keys MEMORY_DIR add TENANT        prints a new key (shown once; stored hashed)
    gpuir serve-keys MEMORY_DIR add --operator    prints a new operator key (/metrics, /healthz counts)
    gpuir serve-keys MEMORY_DIR revoke TENANT|KEY_ID
    gpuir serve-keys MEMORY_DIR list

Exit status: 0 success, also after a graceful stop by SIGTERM or SIGINT (once
the final checkpoint is done); 2 bad input, a missing extra (the message names
the fix, e.g. ``pip install 'gpuir[service]'``), a damaged memory or log (named,
with the byte offset; nothing is changed), or a port that cannot be listened
on; 1 internal error. The server's own messages (torn tails dropped, salvage
reports, checkpoint failures) go to standard error through ``logging``
(logger ``gpuir``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence

from ..backends import BACKENDS
from ..cli_common import ArgumentParser, cli_logging, lower_cli_log_level, verbosity
from ..jsonl import InputError

EXTRA = "pip install 'gpuir[service]'"


def _need_extra() -> None:
    missing = [m for m in ("fastapi", "uvicorn", "httpx", "prometheus_client") if importlib.util.find_spec(m) is None]
    if missing:
        raise InputError(f"the memory service needs {', '.join(missing)}: {EXTRA}")


def _cmd_serve(args: argparse.Namespace) -> int:
    _need_extra()
    import uvicorn

    from .app import create_app

    if args.port < 0 or args.port > 65535:
        raise InputError(f"--port must be 0..65535, got {args.port}")
    for name in ("batch_window_ms", "checkpoint_seconds", "keep_alive_seconds", "rate_limit"):
        if not 0 <= getattr(args, name) < float("inf"):
            raise InputError(f"--{name.replace('_', '-')} must be a number >= 0, got {getattr(args, name)}")
    for name in ("header_timeout_seconds", "body_timeout_seconds"):
        if not 0 < getattr(args, name) < float("inf"):
            raise InputError(f"--{name.replace('_', '-')} must be a number > 0, got {getattr(args, name)}")
    for name in ("max_batch", "checkpoint_every", "max_body_bytes", "max_connections", "max_query_terms",
                 "max_hits", "max_response_bytes", "rate_burst"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    from .app import Limits
    from .timeouts import timed_h11

    limits = Limits(max_query_terms=args.max_query_terms, max_hits=args.max_hits,
                    max_response_bytes=args.max_response_bytes, batch_terms=min(2048, args.max_query_terms),
                    rate=args.rate_limit, burst=args.rate_burst)
    try:
        loopback = args.host == "localhost" or ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        print(f"gpuir serve: warning: listening on {args.host}, not loopback: every client that can reach it "
              "can try keys (put TLS in front of it)", file=sys.stderr)
    _log_to_stderr(args.log_level)
    if args.ray_address:
        os.environ["GPUIR_RAY_ADDRESS"] = args.ray_address  # read by gpuir.service.sharded
    from ..memory.warmup import freeze_startup_heap
    from .store import warm_up

    freeze_startup_heap(warm_up)  # this process's startup objects out of every collector pass (memory.warmup)
    app = create_app(args.memory_dir, batch_window_ms=args.batch_window_ms, max_batch=args.max_batch,
                     checkpoint_every=args.checkpoint_every, checkpoint_seconds=args.checkpoint_seconds,
                     max_body_bytes=args.max_body_bytes, backend=args.backend, salvage=args.salvage,
                     statistics=args.statistics, limits=limits, operator_reads=args.operator_reads,
                     durability=args.durability, ranking=args.ranking)
    print(f"gpuir serve: {args.memory_dir} on http://{args.host}:{args.port} (Ctrl-C or SIGTERM stops, after a "
          f"checkpoint); the memory inspector: http://{args.host}:{args.port}/ui", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            access_log=args.access_log, timeout_graceful_shutdown=10,
                            timeout_keep_alive=args.keep_alive_seconds, limit_concurrency=args.max_connections,
                            http=timed_h11(args.header_timeout_seconds, args.body_timeout_seconds))
    server = _server_class(uvicorn)(config)
    try:
        server.run()
    finally:
        app.state.service.close()
    if not server.started:
        raise InputError(f"could not listen on {args.host}:{args.port} (see the message above)")
    return 0


def _log_to_stderr(level: str) -> None:
    """gpuir's own log lines (logger ``gpuir``, on stderr by the command line) down to ``--log-level`` too."""
    lower_cli_log_level(min(logging.WARNING, getattr(logging, level.upper(), logging.WARNING)))


def _server_class(uvicorn):
    """uvicorn's Server, except that a graceful stop by a signal ends normally (exit 0).

    uvicorn re-raises a captured SIGTERM/SIGINT after its graceful shutdown, so
    the process would end by that signal (status -15) although every request
    was answered and the final checkpoint was made. Here the signal starts the
    same graceful shutdown and is not re-raised.
    """

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            sigs = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGBREAK] if hasattr(signal, "SIGBREAK") else [])
            original = {sig: signal.signal(sig, self.handle_exit) for sig in sigs}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    return Server


def _cmd_keys(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..storage.dirlock import claim_dir
    from .keys import KeyStore

    root = Path(args.memory_dir)
    if args.action == "add":
        if (args.tenant is None) == (not args.operator):
            raise InputError("give a TENANT, or --operator for an operator key (not both)")
        if args.tenant is not None:
            from .errors import check_tenant

            check_tenant(args.tenant)  # before the directory is claimed
        from ..cluster.layout import KIND, is_sharded

        # a new directory becomes the (empty) memory `gpuir serve` creates; a sharded memory keeps its keys too
        claim_dir(root, KIND if is_sharded(root) else "memory", mode=0o700)
        ks = KeyStore(root)
        key = ks.add_operator() if args.operator else ks.add(args.tenant)
        print(key)
        what = "an operator key" if args.operator else f"a new key for tenant {args.tenant!r}"
        print(f"gpuir serve-keys: {what}; it is shown only now (stored hashed)", file=sys.stderr)
        return 0
    if not root.is_dir():
        raise InputError(f"{root}: no such directory")
    ks = KeyStore(root)
    if args.action == "revoke":
        gone = ks.revoke(args.what)
        if not gone:
            raise InputError(f"{args.what!r} names no tenant and no key id (see `gpuir serve-keys {root} list`)")
        for e in gone:
            print(f"revoked {e['tenant']} {e['key_id']}")
        return 0
    rows = ks.list()
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(f"{r['tenant']}\t{r['key_id']}\t{r['created']}")
    return 0


def add_parsers(subparsers) -> None:
    """Add ``serve`` and ``serve-keys`` to the ``gpuir`` command's sub-parsers."""
    ps = subparsers.add_parser("serve", help="serve a memory directory over HTTP (needs gpuir[service])",
                               description="Serve MEMORY_DIR over HTTP: add, search, get and delete records per "
                                           "tenant, durably (the memory's write-ahead log). Routes and keys: docs/service.md.")
    ps.add_argument("memory_dir", metavar="MEMORY_DIR", help="the memory directory (created when missing or empty)")
    ps.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s, loopback)")
    ps.add_argument("--port", type=int, default=8080, help="TCP port (default: %(default)s)")
    ps.add_argument("--statistics", default="tenant", choices=("tenant", "pooled"),
                    help="BM25 statistics per tenant (each tenant's scores depend only on its own records; "
                         "a search memory per tenant in RAM beside the shared one) or pooled over all tenants "
                         "(one copy in RAM; a tenant's scores then change with other tenants' records and can "
                         "reveal their words) (default: %(default)s)")
    ps.add_argument("--ranking", default=None, choices=("bm25", "hybrid"),
                    help="a new memory's ranking: bm25 (the default) or hybrid (BM25 + all-MiniLM-L6-v2, a vector "
                         "stored per record, each hit scored by a calibrated relevance from 0 to 1 that a search's "
                         "min_score compares with); a directory holding a memory keeps its own")
    ps.add_argument("--batch-window-ms", type=float, default=2.0, metavar="MS",
                    help="how long a search waits for others to share its scorer call (default: %(default)s)")
    ps.add_argument("--max-batch", type=int, default=256, metavar="N",
                    help="most queries in one scorer call (default: %(default)s)")
    ps.add_argument("--checkpoint-every", type=int, default=10_000, metavar="N",
                    help="fold the write-ahead log into the memory's segments after this many logged records "
                         "(default: %(default)s)")
    ps.add_argument("--checkpoint-seconds", type=float, default=60.0, metavar="S",
                    help="... or after this many seconds with a non-empty log (default: %(default)s)")
    ps.add_argument("--durability", default=None, choices=("fsync", "flush", "none"),
                    help="what a write has done when it is acknowledged: logged and fsynced by the memory (fsync: "
                         "survives a crash and a power cut), written to the operating system (flush: survives a "
                         "crash of the server, not a power cut), or nothing until a checkpoint (none) "
                         "(default: fsync; a sharded memory keeps the level it was created with)")
    ps.add_argument("--max-body-bytes", type=int, default=4 << 20, metavar="BYTES",
                    help="larger request bodies get 413 (default: %(default)s)")
    ps.add_argument("--backend", default="auto", choices=BACKENDS,
                    help="BM25 scoring backend, as `gpuir memory search` (default: %(default)s)")
    ps.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                    help="uvicorn's log level (default: %(default)s)")
    ps.add_argument("--keep-alive-seconds", type=float, default=75.0, metavar="S",
                    help="close an idle client connection after this many seconds; agents that think for "
                         "seconds between calls keep theirs (default: %(default)s)")
    ps.add_argument("--header-timeout-seconds", type=float, default=10.0, metavar="S",
                    help="close a connection whose request line and headers do not arrive within S seconds of "
                         "its opening or of the request's first byte (default: %(default)s)")
    ps.add_argument("--body-timeout-seconds", type=float, default=30.0, metavar="S",
                    help="close a connection whose request body does not arrive within S seconds of its headers "
                         "(default: %(default)s)")
    ps.add_argument("--max-connections", type=int, default=2048, metavar="N",
                    help="answer 503 beyond N open connections and requests in progress (default: %(default)s)")
    ps.add_argument("--max-query-terms", type=int, default=8192, metavar="N",
                    help="most terms (runs of word characters) in all the queries of one search; more is 422 "
                         "(default: %(default)s)")
    ps.add_argument("--max-hits", type=int, default=20_000, metavar="N",
                    help="most hits one search may ask for (queries x k); more is 422 (default: %(default)s)")
    ps.add_argument("--max-response-bytes", type=int, default=8 << 20, metavar="BYTES",
                    help="a search whose reply would be larger is 422 (default: %(default)s)")
    ps.add_argument("--rate-limit", type=float, default=100.0, metavar="PER_S",
                    help="requests per second per API key, beyond which 429 with Retry-After (0: no limit; "
                         "default: %(default)s)")
    ps.add_argument("--rate-burst", type=int, default=200, metavar="N",
                    help="requests a key may send at once after a quiet spell (default: %(default)s)")
    ps.add_argument("--access-log", action="store_true", help="log every request (default: off)")
    ps.add_argument("--operator-reads", action="store_true",
                    help="an operator key may read (never write) every tenant's records: search, list, history, "
                         "the overview, as the memory inspector page /ui does for operators (default: off)")
    ps.add_argument("--salvage", action="store_true",
                    help="start although the write-ahead log is damaged: keep every intact frame, report each "
                         "byte range skipped, fold the result into the memory and set the damaged log files aside "
                         "as *.log.damaged (default: refuse to start, naming the file and byte offset)")
    ps.add_argument("--ray-address", default=None, metavar="ADDRESS",
                    help="a sharded memory (made by ShardedMemory.create) only: the Ray cluster its shards run on "
                         "('auto' or HOST:PORT; default: a local runtime on loopback)")
    ps.set_defaults(func=_cmd_serve)

    pk = subparsers.add_parser("serve-keys", help="create, revoke and list the service's API keys",
                               description="API keys of `gpuir serve`, one or more per tenant, stored hashed in "
                                           "MEMORY_DIR/service-keys.json; a running server picks up changes.")
    pk.add_argument("memory_dir", metavar="MEMORY_DIR", help="the memory directory the service serves")
    act = pk.add_subparsers(dest="action", metavar="ACTION")
    act.required = True
    pa = act.add_parser("add", help="print a new key for TENANT, or an operator key (shown once)")
    pa.add_argument("tenant", metavar="TENANT", nargs="?",
                    help="tenant name: 1 to 64 letters, digits, '_' or '-', starting with a letter or digit")
    pa.add_argument("--operator", action="store_true",
                    help="an operator key instead: it opens /metrics and the counts of /healthz, no tenant")
    pr = act.add_parser("revoke", help="remove every key of a tenant (_operator: every operator key), or the key "
                                       "with an id")
    pr.add_argument("what", metavar="TENANT|KEY_ID", help="a tenant name, or a key id as `list` shows it")
    pl = act.add_parser("list", help="tenant, key id and creation time of every key (never the key)")
    pl.add_argument("--json", action="store_true", help="JSON output (default: tab-separated lines)")
    pk.set_defaults(func=_cmd_keys)


#: The name gpuir.cli's SUBCOMMAND_MODULES calls.
register = add_parsers


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpuir.service``: the two commands alone, with gpuir's exit statuses."""
    from ..index.storage import IndexFormatError

    p = ArgumentParser(prog="gpuir", top=True, description="The gpuir memory service.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_parsers(sub)
    args = p.parse_args(argv)
    try:
        with cli_logging(verbosity(args), prog=f"gpuir {args.command}"):
            return int(args.func(args) or 0)
    except (InputError, IndexFormatError, ValueError, TypeError) as e:
        print(f"gpuir {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except OSError as e:
        from ..storage.dirlock import os_error_message

        print(f"gpuir {args.command}: error: {os_error_message(e, 'read or write a file')}", file=sys.stderr)
        return 2
