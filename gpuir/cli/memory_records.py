"""``gpuir memory get|list|count|update|history|export|import``: see and change what a memory holds.

::

    gpuir memory get MEMORY_DIR ID [ID ...] [--missing-ok]
    gpuir memory list MEMORY_DIR [--where JSON] [--order-by seq|time|created_at|updated_at] [--descending] [--limit N]
                                 [--cursor CURSOR | --all] [--time-unit U]
    gpuir memory count MEMORY_DIR [--where JSON] [--time-unit U]
    gpuir memory update MEMORY_DIR PATCHES.jsonl [--replace | --upsert] [--time-unit U]
    gpuir memory history MEMORY_DIR ID
    gpuir memory export MEMORY_DIR OUT.jsonl [--where JSON] [--no-history]
    gpuir memory import MEMORY_DIR IN.jsonl [--replace] [--no-check-config]

Every file argument may be ``-``: standard input (``update``, ``import``), or
standard output (``export``); see :mod:`gpuir.cli.stdio`. With ``-v``,
``update`` logs what it reads and changes (INFO); ``-vv`` adds the ids and
timings (DEBUG).

Records are written to stdout as JSON lines (times in ISO 8601). ``list``
writes one page (``--limit`` records, 100 by default) and, when more follow,
the next page's cursor on stderr as ``next: --cursor CURSOR``; ``--all`` writes
every page. ``update`` applies every line of ``PATCHES.jsonl`` (an ``id`` and
the fields to change; metadata merges key by key, a null removes; see
:mod:`gpuir.memory.updates`) or none, then saves. ``export``/``import``: the
exact JSON-lines format of :mod:`gpuir.memory.export`; ``import`` into a missing
or empty directory creates the memory with the export's settings.

Reads open the memory without its writer lock. A directory served by ``gpuir
serve`` shows its last checkpoint (the service's writes since then are in its
write-ahead log): ask the service (``GET /v1/tenants/T/records``) for the live
state.

Exit status: 0; 2 with a message naming what to fix (unknown ids, file and line
of a bad record, a malformed filter or cursor, a second writer); 1 internal error.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from ..cli_common import where_option
from ..jsonl import InputError, read_jsonl
from .stdio import STDIN, input_file, output_file, shown

log = logging.getLogger(__name__)  # gpuir.cli.memory_records

TIME_UNITS = ("s", "ms", "us", "ns")



def _out(rec: Any) -> None:
    sys.stdout.write(json.dumps(rec, ensure_ascii=False) + "\n")


def _reader(path: str):
    from ..memory.store import Memory

    return Memory.open(path, writer=False)


def _cmd_get(args: argparse.Namespace) -> int:
    from ..memory.store import UnknownIdError

    try:
        recs = _reader(args.memory_dir).get(args.ids, missing_ok=args.missing_ok)
    except UnknownIdError as e:  # the library's message names its argument (missing_ok=True), not the option
        some = ", ".join(repr(i) for i in e.ids[:5]) + (" ..." if len(e.ids) > 5 else "")
        raise InputError(f"{len(e.ids)} id(s) name no record in {args.memory_dir}: {some}; nothing was written "
                         "(--missing-ok skips unknown ids)") from None
    for rec in recs:
        if rec is not None:
            _out(rec)
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    mem = _reader(args.memory_dir)
    where = where_option(args.where)
    cursor = args.cursor
    while True:
        page = mem.list(where=where, order_by=args.order_by, descending=args.descending, limit=args.limit,
                        cursor=cursor, time_unit=args.time_unit)
        for rec in page.records:
            _out(rec)
        cursor = page.cursor
        if cursor is None or not args.all:
            break
    if cursor is not None:
        print(f"next: --cursor {cursor}", file=sys.stderr)
    return 0


def _cmd_count(args: argparse.Namespace) -> int:
    print(_reader(args.memory_dir).count(where=where_option(args.where), time_unit=args.time_unit))
    return 0


def _cmd_history(args: argparse.Namespace) -> int:
    for rec in _reader(args.memory_dir).history(args.id):
        _out(rec)
    return 0


def _cmd_update(args: argparse.Namespace) -> int:
    from ..memory.store import Memory, UnknownIdError

    path = shown(args.patches)
    if args.patches != STDIN and not Path(args.patches).is_file():
        raise InputError(f"{path}: no such file")
    lines, patches = [], []
    for lineno, obj in read_jsonl(args.patches, {}):
        lines.append(lineno)
        patches.append(obj)
    how = "upsert" if args.upsert else "update"
    log.info("%s of %d record(s) from %s in %s (%s)", how, len(patches), path, args.memory_dir,
             "replacing whole records" if args.replace else "merging the fields given")
    t0 = time.perf_counter()
    with Memory.open(args.memory_dir, writer=True, lock_timeout=args.lock_timeout) as mem:
        log.debug("opened %s: %d records (%.3f s)", args.memory_dir, len(mem), time.perf_counter() - t0)
        if log.isEnabledFor(logging.DEBUG):
            ids = [p.get("id") for p in patches]
            known = sum(1 for i in ids if isinstance(i, str) and i in mem)
            log.debug("ids: %s%s (%d known, %d new)", ", ".join(repr(i) for i in ids[:10]),
                      " ..." if len(ids) > 10 else "", known, len(ids) - known)
        try:
            if args.upsert:
                n = mem.upsert(patches, replace=args.replace, time_unit=args.time_unit)
            else:
                n = mem.update(patches, replace=args.replace, time_unit=args.time_unit)
        except UnknownIdError as e:
            some = ", ".join(repr(i) for i in e.ids[:5]) + (" ..." if len(e.ids) > 5 else "")
            raise InputError(f"{path}: {len(e.ids)} id(s) name no record in {args.memory_dir}: {some}; nothing was "
                             "changed (--upsert adds them)") from None
        except ValueError as e:
            at = ", ".join(f"record {i} is line {n}" for i, n in enumerate(lines) if f"record {i} " in str(e) or
                           str(e).endswith(f"record {i}"))
            raise InputError(f"{path}: {e}" + (f" ({at})" if at else "")) from None
        log.info("changed %d record(s) in %.3f s; saving %s", n, time.perf_counter() - t0, args.memory_dir)
    log.debug("saved %s (%.3f s in all)", args.memory_dir, time.perf_counter() - t0)
    print(f"updated {n} records in {args.memory_dir}", file=sys.stderr)  # saved by the with block
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    where = where_option(args.where)
    with output_file(args.out) as out:
        n = _reader(args.memory_dir).export(out, where=where, history=not args.no_history)
    print(f"exported {n} records -> {'<stdout>' if args.out == STDIN else args.out}", file=sys.stderr)
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from ..memory.persist import CURRENT, check_not_orphaned
    from ..memory.store import Memory
    from ..storage.dirlock import claim_dir, is_claimed

    root = Path(args.memory_dir)
    if args.file != STDIN and not Path(args.file).is_file():
        raise InputError(f"{args.file}: no such file")
    with input_file(args.file) as src:
        if (root / CURRENT).exists():
            with Memory.open(root, writer=True, lock_timeout=args.lock_timeout) as mem:
                n = mem.import_(src, replace=args.replace, check_config=not args.no_check_config)
            created = False
        else:
            if root.exists() and (not root.is_dir() or (any(root.iterdir()) and not is_claimed(root))):
                claim_dir(root, "memory")  # raises, naming the problem, before anything is read
            if root.is_dir():
                check_not_orphaned(root)
            mem = Memory.from_export(src)
            mem.save(root, lock_timeout=args.lock_timeout)
            mem.close()
            n, created = len(mem), True
    print(f"imported {n} records -> {args.memory_dir}{' (created)' if created else ''}", file=sys.stderr)
    return 0


def register_records(sub: Any, lock_timeout) -> None:
    """Add the sub-commands of this module to ``gpuir memory``'s subparsers."""

    def memory_dir(p: argparse.ArgumentParser) -> None:
        p.add_argument("memory_dir", metavar="MEMORY_DIR", help="a memory directory made by 'gpuir memory add'")

    def where(p: argparse.ArgumentParser) -> None:
        p.add_argument("--where", metavar="JSON", default=None,
                       help='a filter (docs/memory.md, "Filters"), e.g. \'{"tenant": "acme", "$or": [{"role": '
                            '"user"}, {"metadata.tags": {"contains": "travel"}}]}\' (default: every record)')

    def time_unit(p: argparse.ArgumentParser) -> None:
        p.add_argument("--time-unit", default=None, choices=TIME_UNITS,
                       help="unit of times given as bare numbers (default: none; a bare number is an error)")

    p = sub.add_parser("get", help="records by id (JSON lines)",
                       description="Write the records with these ids as JSON lines (times in ISO 8601).")
    memory_dir(p)
    p.add_argument("ids", nargs="+", metavar="ID", help="record ids")
    p.add_argument("--missing-ok", action="store_true", help="skip unknown ids (default: exit 2 naming them)")
    p.set_defaults(func=_cmd_get)

    p = sub.add_parser("list", help="list records, a page at a time (JSON lines)",
                       description="List the records passing --where in a stable order, --limit per page; the next "
                                   "page's cursor goes to stderr ('next: --cursor C'), or --all writes every page.")
    memory_dir(p)
    where(p)
    p.add_argument("--order-by", default="seq", choices=("seq", "time", "created_at", "updated_at"),
                   help="add order, or time (records without a time last), or the times the memory keeps "
                        "(default: %(default)s)")
    p.add_argument("--descending", action="store_true", help="newest first (default: oldest first)")
    p.add_argument("--limit", type=int, default=100, help="records per page (default: %(default)s)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--cursor", default=None, help="continue after a previous page (its 'next: --cursor') (default: the first page)")
    g.add_argument("--all", action="store_true", help="every page (default: one page)")
    time_unit(p)
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("count", help="count records passing a filter",
                       description="Print the number of records passing --where (expired records excluded).")
    memory_dir(p)
    where(p)
    time_unit(p)
    p.set_defaults(func=_cmd_count)

    p = sub.add_parser("update", help="change records, keeping the fields not named",
                       description="Apply every line of PATCHES.jsonl (an id and the fields to change: a field "
                                   "given replaces, null removes, metadata merges key by key) or none, then save.")
    memory_dir(p)
    p.add_argument("patches", metavar="PATCHES.jsonl",
                   help="one {\"id\": ..., field: value, ...} per line; - reads standard input")
    p.add_argument("--replace", action="store_true", help="replace whole records (default: merge)")
    p.add_argument("--upsert", action="store_true", help="add the ids that do not exist (default: exit 2)")
    time_unit(p)
    lock_timeout(p)
    p.set_defaults(func=_cmd_update)

    p = sub.add_parser("history", help="a record's earlier versions (JSON lines, oldest first)",
                       description="Write the earlier versions of a record kept by updates, oldest first.")
    memory_dir(p)
    p.add_argument("id", metavar="ID", help="the record's id")
    p.set_defaults(func=_cmd_history)

    p = sub.add_parser("export", help="write records to an exact JSON-lines file",
                       description="Export the records (passing --where) in add order, with their histories, as "
                                   "JSON lines that 'gpuir memory import' reads back exactly.")
    memory_dir(p)
    p.add_argument("out", metavar="OUT.jsonl", help="the file to write (replaced atomically); - writes standard output")
    where(p)
    p.add_argument("--no-history", action="store_true", help="leave the records' histories out (default: included)")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("import", help="add the records of an export file",
                       description="Import an export file, all records or none. A missing or empty MEMORY_DIR is "
                                   "created with the export's settings; into an existing memory, different analyzer "
                                   "or BM25 settings are refused (--no-check-config to import anyway).")
    p.add_argument("memory_dir", metavar="MEMORY_DIR", help="the memory (created when missing or empty)")
    p.add_argument("file", metavar="IN.jsonl",
                   help="a file written by 'gpuir memory export' or Memory.export; - reads standard input")
    p.add_argument("--replace", action="store_true", help="records whose ids exist replace them (default: exit 2)")
    p.add_argument("--no-check-config", action="store_true",
                   help="import although the export's analyzer or BM25 settings differ (default: refuse, exit 2)")
    lock_timeout(p)
    p.set_defaults(func=_cmd_import)
