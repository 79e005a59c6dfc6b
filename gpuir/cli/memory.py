"""``gpuir memory``: add, delete, search and describe a memory directory.

::

    gpuir memory add MEMORY_DIR RECORDS.jsonl [--analyzer NAME] [--method M] [--k1 X] [--b X] [--delta X]
                                              [--partition-days D] [--no-record-times] [--lock-timeout S]
    gpuir memory delete MEMORY_DIR (--ids IDS.txt | --where JSON | --all) [--tenant T] [--missing-ok]
                                   [--drop-history] [--lock-timeout S]
    gpuir memory reset MEMORY_DIR --yes
    gpuir memory search MEMORY_DIR (--query TEXT | --queries QUERIES.jsonl) [-k 10] [--where JSON]
                                   [--backend auto|numpy|cupy] [--format jsonl|trec]
                                   [--mode exhaustive|newest|budgeted] [--max-partitions K]
                                   [--config CONFIG.json] [--unit record|session]
    gpuir memory info MEMORY_DIR [--json]
    gpuir memory get|list|count|update|history|export|import ...   (gpuir.cli.memory_records)
    gpuir memory verify MEMORY_DIR [--json]

``add`` creates the memory when the directory is missing or empty (the analyzer
and BM25 options apply then only), and adds every record of the file or none:
the file is checked completely, then one save commits it. ``RECORDS.jsonl``
holds one record per line (see :mod:`gpuir.memory.records`). ``IDS.txt`` holds
one id per line. ``QUERIES.jsonl`` lines are ``{"id": ..., "text": ...}`` with an
optional ``"where"``, AND-ed with ``--where``. Search hits (jsonl) carry id,
score, text and the record's fields; ``trec`` writes ``qid Q0 id rank score gpuir-memory``.
``--config`` searches with a :class:`gpuir.Retriever` configuration (JSON, as
``RetrieverConfig.save`` writes it); ``--unit session`` ranks sessions (hits
``{"id", "session", "score", "records"}``; without ``--config``, the retriever saved
beside the memory (``MEMORY_DIR.retriever/``, :meth:`gpuir.Retriever.save`) or
else the default configuration).

Exit status: 0 success; 2 bad input (the message names what to fix: file and
line, unknown ids, a second writer, a damaged file); 1 internal error.

Every file argument may be ``-`` (standard input; see :mod:`gpuir.cli.stdio`).
``-v`` logs what a command reads, searches and writes (INFO: the memory opened,
the queries, the time taken); ``-vv`` adds each query's hits and each batch's
backend and time (DEBUG).

``verify`` reads every byte of the memory's committed files: each file's size
and sha256 (from the manifest), every array of every segment file against its
CRC-32, every deletions file (what ``Memory.open`` checks only as the data is
first used; see docs/guarantees.md). ``add`` and ``delete`` wait for the
background merges they start before committing, so the directory holds the
merged segments.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from ..backends import BACKENDS
from ..cli_common import where_option
from ..jsonl import InputError, read_jsonl
from ..memory.persist import CURRENT, check_not_orphaned
from ..progress import progress_bar, show_progress
from ..storage.dirlock import claim_dir, is_claimed
from .stdio import STDIN, check_one_stdin, read_text, shown

BATCH = 10_000

log = logging.getLogger(__name__)  # gpuir.cli.memory


def _count_lines(path: Path) -> int:
    """Lines of a file (the progress bar's total), read in binary blocks."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")

_DESCRIPTION = """\
An agent memory in a directory: add, delete and search records; describe it.

  gpuir memory add MEMORY_DIR RECORDS.jsonl        (creates the memory if missing)
  gpuir memory delete MEMORY_DIR (--ids IDS.txt | --where JSON | --tenant T --all)
  gpuir memory reset MEMORY_DIR --yes
  gpuir memory search MEMORY_DIR --query TEXT [-k 10] [--where JSON] [--config CONFIG.json] [--unit session]
  gpuir memory info MEMORY_DIR [--json]
  gpuir memory get MEMORY_DIR ID...                 records by id (JSON lines)
  gpuir memory list MEMORY_DIR [--where JSON] [--order-by seq|time|created_at|updated_at] [--limit N]
                                                    [--cursor C | --all]
  gpuir memory count MEMORY_DIR [--where JSON]
  gpuir memory update MEMORY_DIR PATCHES.jsonl [--replace | --upsert]
  gpuir memory history MEMORY_DIR ID
  gpuir memory export MEMORY_DIR OUT.jsonl [--where JSON]
  gpuir memory import MEMORY_DIR IN.jsonl [--replace]
  gpuir memory verify MEMORY_DIR [--json]      (reads every byte: checksums of every file and array)

Search hits (jsonl) carry id, score, text and the record's fields; trec writes
'qid Q0 id rank score gpuir-memory'. With --unit session the hits are
{"id", "session", "score", "records"}. See docs/memory.md and docs/retriever.md.

Exit status: 0 success; 2 bad input (file and line, unknown ids, a second
writer, a damaged file) or a missing extra; 1 internal error.
"""


def _open_or_create(args: argparse.Namespace):
    from ..memory.store import Memory

    root = Path(args.memory_dir)
    asked = {"analyzer": args.analyzer, "method": args.method, "k1": args.k1, "b": args.b, "delta": args.delta,
             "partition_days": args.partition_days, "ranking": args.ranking,
             "record_times": False if args.no_record_times else None}
    if (root / CURRENT).exists():
        mem = Memory.open(root, writer=True, lock_timeout=args.lock_timeout)
        have = mem.config()
        now = {"analyzer": have["analyzer"].get("name"), **have["bm25"], "partition_days": have["partition_days"],
               "ranking": have.get("ranking", "bm25"), "record_times": have.get("record_times", False)}
        clash = [("--no-record-times (the memory keeps record times)" if k == "record_times" else
                  f"--{k.replace('_', '-')} {v} (the memory has {now[k]})") for k, v in asked.items()
                 if v is not None and v != now[k]]
        if clash:
            mem.close()
            raise InputError(f"{root} exists; {', '.join(clash)}: these options apply only when creating a memory")
        return mem, False
    if root.exists() and (not root.is_dir() or (any(root.iterdir()) and not is_claimed(root))):
        claim_dir(root, "memory")  # raises, naming the problem, before any record is read
    if root.is_dir():
        check_not_orphaned(root)  # a memory's files without CURRENT: damaged, never a new memory
    # created by the final save (which claims the directory and takes its lock): a failed add leaves nothing
    return Memory(**{k: v for k, v in asked.items() if v is not None}), True


def _cmd_add(args: argparse.Namespace) -> int:
    from ..memory.intake import to_batch

    stdin = args.records == STDIN
    path = Path(args.records)
    if not stdin and not path.is_file():
        raise InputError(f"{path}: no such file")
    mem, created = _open_or_create(args)
    try:
        total = 0
        recs: list[dict] = []
        labels: list[str] = []
        bar = progress_bar(total=_count_lines(path) if show_progress() and not stdin else None, desc="add",
                           unit="rec")

        def flush():
            nonlocal total
            if recs:
                total += mem.add(to_batch(recs, args.time_unit, labels=labels, stamp=mem.stamp))
                bar.update(len(recs))
                recs.clear()
                labels.clear()

        with bar:
            for lineno, obj in read_jsonl(args.records, {}):
                recs.append(obj)
                labels.append(f"{shown(args.records)}, line {lineno}")
                if len(recs) >= BATCH:
                    flush()
            flush()
        mem.wait_merges()  # a one-shot command: commit the merged segments, not merges abandoned at close
        log.info("added %d records; saving %s", total, args.memory_dir)
        mem.save(args.memory_dir, lock_timeout=args.lock_timeout)
        print(f"added {total} records -> {args.memory_dir} ({len(mem)} records, "
              f"{len(mem.snapshot().views)} segments{', created' if created else ''})", file=sys.stderr)
    finally:
        mem.close()
    return 0


def _cmd_delete(args: argparse.Namespace) -> int:
    from ..memory.store import Memory, UnknownIdError

    ids = where = None
    p = shown(args.ids) if args.ids else None
    if args.all and args.tenant is None:
        raise InputError("--all deletes every record of a tenant: name it with --tenant T (gpuir memory reset "
                         "MEMORY_DIR --yes deletes every record of the memory)")
    if args.ids:
        ids = [line.strip() for line in read_text(args.ids).splitlines() if line.strip()]
        log.info("deleting %d id(s) read from %s in %s", len(ids), p, args.memory_dir)
    elif args.where is not None:
        where = where_option(args.where)
        if not where:
            raise InputError("--where {} would delete every record: use --tenant T --all, or gpuir memory reset")
    mem = Memory.open(args.memory_dir, writer=True, lock_timeout=args.lock_timeout)
    try:
        target = mem if args.tenant is None else mem.scope(tenant=args.tenant)
        keep = not args.drop_history
        try:
            if args.all:
                n = target.delete_all(keep_history=keep)
            elif where is not None:
                n = target.delete(where=where, keep_history=keep, time_unit=args.time_unit)
            else:
                n = target.delete(ids, missing_ok=args.missing_ok, keep_history=keep)
        except UnknownIdError as e:
            some = ", ".join(repr(i) for i in e.ids[:5]) + (" ..." if len(e.ids) > 5 else "")
            raise InputError(f"{p}: {len(e.ids)} id(s) name no record in {args.memory_dir}: {some}; nothing was "
                             "deleted (--missing-ok skips unknown ids)") from None
        mem.wait_merges()
        mem.save()
        print(f"deleted {n} records from {args.memory_dir} ({len(mem)} left)", file=sys.stderr)
    finally:
        mem.close()
    return 0


def _cmd_reset(args: argparse.Namespace) -> int:
    from ..memory.store import Memory

    if not args.yes:
        raise InputError(f"reset deletes every record of {args.memory_dir} (and every kept history): add --yes to "
                         "do it")
    mem = Memory.open(args.memory_dir, writer=True, lock_timeout=args.lock_timeout)
    try:
        n = mem.reset(confirm=True)
        mem.wait_merges()
        mem.save()
        print(f"reset {args.memory_dir}: deleted {n} records", file=sys.stderr)
    finally:
        mem.close()
    return 0



def _and(a: dict | None, b: dict | None, where: str) -> dict | None:
    if a is None or b is None:
        return a if b is None else b
    both = sorted(set(a) & set(b))
    if both:
        raise InputError(f"{where}: --where and the query's own where both filter {both[0]!r}; give it once")
    return {**a, **b}


def _cmd_search(args: argparse.Namespace) -> int:
    from ..memory.store import Memory

    if args.k < 1:
        raise InputError(f"-k must be a positive integer, got {args.k}")
    check_one_stdin(**{"--queries": args.queries, "--config": args.config})
    base = where_option(args.where)
    if args.query is not None:
        qids, texts, wheres = ["0"], [args.query], [base]
    else:
        qids, texts, wheres = [], [], []
        name = shown(args.queries)
        for lineno, obj in read_jsonl(args.queries, {"id": (str, int), "text": str}):
            w = obj.get("where")
            if w is not None and not isinstance(w, dict):
                raise InputError(f"{name}, line {lineno}: \"where\" must be a JSON object")
            qids.append(str(obj["id"]))
            texts.append(obj["text"])
            wheres.append(_and(base, w, f"{name}, line {lineno}"))
    t0 = time.perf_counter()
    mem = Memory.open(args.memory_dir, writer=False)
    log.info("opened %s: %d records in %d segments (%.3f s)", args.memory_dir, len(mem), len(mem.snapshot().views),
             time.perf_counter() - t0)
    out = sys.stdout
    opts: dict[str, Any] = {"mode": args.mode}
    if args.max_partitions is not None:
        opts["max_partitions"] = args.max_partitions
    if args.ranking is not None:
        opts["ranking"] = args.ranking
    search = mem.search
    if args.config is not None or args.unit == "session":  # a Retriever configuration (gpuir.retrieve)
        from ..retrieve import Retriever

        if args.mode != "exhaustive" or args.max_partitions is not None or args.ranking is not None:
            raise InputError("--mode/--max-partitions/--ranking apply to the memory's own search, not with --config "
                             "or --unit session")
        saved = Retriever.folder_of(args.memory_dir)
        if args.config is None and (saved / "retriever.json").exists():  # saved beside the memory: reuse it
            retriever = Retriever.open(mem, saved)
        else:
            try:
                cfg = None if args.config is None else _load_config(args.config)
            except (OSError, ValueError, TypeError) as e:
                raise InputError(f"--config {shown(args.config)}: {e}") from None
            retriever = Retriever(mem, cfg)
        log.info("searching with a retriever: %s", "the saved one" if args.config is None and
                 (saved / "retriever.json").exists() else shown(args.config or "the default configuration"))

        def search(q, k, where, backend):
            return retriever.search(q, k=k, where=where, unit=args.unit, backend=backend)

        opts = {}
    batches = range(0, len(texts), 1024)  # a bar (on a terminal) when there are several batches
    log.info("searching %d quer%s, k=%d, backend %s, %s", len(texts), "y" if len(texts) == 1 else "ies", args.k,
             args.backend, f"unit {args.unit}" if args.config is not None or args.unit == "session"
             else f"mode {args.mode}" + (" with a filter" if any(w is not None for w in wheres) else ""))
    t0, n_hits = time.perf_counter(), 0
    for s in progress_bar(batches, desc="search", unit="batch", enabled=None if len(batches) > 1 else False):
        t1 = time.perf_counter()
        res = search(texts[s: s + 1024], k=args.k, where=wheres[s: s + 1024], backend=args.backend, **opts)
        meta = getattr(res, "meta", None) or {}
        log.debug("queries %d..%d: %.3f s (backend %s%s)", s, s + len(res) - 1, time.perf_counter() - t1,
                  meta.get("backend", args.backend), f": {meta['backend_reason']}" if meta.get("backend_reason")
                  else "")
        for i in range(len(res)):
            qid = qids[s + i]
            hits = res.hits(i)
            n_hits += len(hits)
            log.debug("query %s: %d hit(s)%s", qid, len(hits),
                      f", best {hits[0].get('id', hits[0].get('session'))!r} ({hits[0]['score']:.4f})" if hits
                      else "")
            if args.format == "jsonl":
                out.write(json.dumps({"query_id": qid, "hits": hits}, ensure_ascii=False) + "\n")
            else:
                for rank, h in enumerate(hits, 1):
                    out.write(f"{qid} Q0 {h.get('id', h.get('session'))} {rank} {h['score']:.6f} gpuir-memory\n")
    log.info("answered %d quer%s with %d hits in %.3f s", len(texts), "y" if len(texts) == 1 else "ies", n_hits,
             time.perf_counter() - t0)
    return 0


def _load_config(arg: str):
    """A Retriever configuration from the file ``arg`` (``-``: standard input)."""
    from ..retrieve import RetrieverConfig

    if arg != STDIN:
        return RetrieverConfig.load(arg)
    try:
        data = json.loads(read_text(arg))
    except json.JSONDecodeError as e:
        raise ValueError(f"not a JSON retriever configuration ({e})") from None
    return RetrieverConfig.from_config(data)


def _cmd_info(args: argparse.Namespace) -> int:
    from ..memory.store import Memory

    if args.start:
        print(f"gpuir memory info: --start applies to a sharded memory (made by ShardedMemory.create); "
              f"{args.memory_dir} is not one: leave --start out", file=sys.stderr)
        return 2
    info = Memory.open(args.memory_dir, writer=False).info()
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    span = info["time_span"]
    print(f"memory {info['path']} (generation {info['generation']})")
    print(f"  records     {info['records']:,} ({info['deleted_not_purged']:,} deleted, not yet purged)")
    print(f"  tenants     {info['tenants']:,}" + (f" (+{info['records_without_tenant']:,} records without tenant)"
                                                   if info["records_without_tenant"] else ""))
    print(f"  segments    {info['segments']:,}")
    days = info["partition_days"]
    print(f"  partitions  {info['partitions']:,}" + (f" of {days:g} days" if days else " (time partitioning off)"))
    print(f"  time span   {span['min']} .. {span['max']}" if span else "  time span   (no record has a time)")
    print(f"  terms       {info['terms']:,}, postings {info['postings']:,}, avgdl {info['avgdl']:.2f}")
    an = info["analyzer"].get("name") or json.dumps(info["analyzer"])
    bm = info["bm25"]
    print(f"  bm25        {bm['method']} k1={bm['k1']:g} b={bm['b']:g} delta={bm['delta']:g}, analyzer {an}")
    print("  record times " + ("created_at / updated_at kept" if info.get("record_times") else
                              "none kept (made with record_times=False, or saved before they were the default)"))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from ..memory.persist import verify_dir
    from ..storage.dirlock import check_path

    root = check_path(args.memory_dir)
    info = verify_dir(root)  # a damaged or missing file: MemoryFormatError naming it (exit 2)
    info["path"] = str(root)
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        print(f"memory {root} (generation {info['generation']}): intact -- {info['files']} files, "
              f"{info['bytes']:,} bytes, {info['segments']} segments, {info['records']:,} rows checked")
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``gpuir memory`` and its sub-commands to the ``gpuir`` parser's subparsers."""
    from ..analysis import ANALYZERS
    from ..bm25 import METHODS
    from ..memory.partitions import MODES

    pm = subparsers.add_parser("memory", help="an agent memory: add, delete, search records; info",
                               description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = pm.add_subparsers(dest="memory_command", metavar="SUBCOMMAND")
    sub.required = True

    def lock_timeout(p: argparse.ArgumentParser) -> None:
        p.add_argument("--lock-timeout", type=float, default=10.0, metavar="SECONDS",
                       help="how long to wait while another writer holds MEMORY_DIR (default: %(default)s)")

    pa = sub.add_parser("add", help="add records (creates the memory if missing)",
                        description="Add every record of RECORDS.jsonl, or none: the file is checked completely, "
                                    "then one save commits it. Creates the memory when MEMORY_DIR is missing or "
                                    "empty; the analyzer and BM25 options apply only then.")
    pa.add_argument("memory_dir", metavar="MEMORY_DIR", help="the memory's directory (created if missing)")
    pa.add_argument("records", metavar="RECORDS.jsonl",
                    help="one record per line: id, text and optional session, role, agent, tenant, time, "
                         "importance, type, metadata (docs/memory.md); - reads standard input")
    pa.add_argument("--analyzer", default=None, choices=sorted(ANALYZERS),
                    help="tokenizer and stemmer, on creation only (default: default)")
    pa.add_argument("--method", default=None, choices=METHODS, help="BM25 variant, on creation only (default: lucene)")
    pa.add_argument("--k1", type=float, default=None, help="BM25 k1, on creation only (default: 1.2)")
    pa.add_argument("--b", type=float, default=None, help="BM25 b, on creation only (default: 0.75)")
    pa.add_argument("--delta", type=float, default=None,
                    help="BM25 delta, bm25l and bm25+ only, on creation only (default: 0.5)")
    pa.add_argument("--ranking", default=None, choices=("bm25", "hybrid"),
                    help="what searches rank by, on creation only (default: bm25; hybrid: BM25 + all-MiniLM-L6-v2 "
                         "vectors stored per record, scores a 0-1 relevance; docs/memory.md)")
    pa.add_argument("--partition-days", type=float, default=None,
                    help="width of the time partitions in days, 0 turns them off, on creation only (default: 7)")
    pa.add_argument("--no-record-times", action="store_true",
                    help="keep no created_at / updated_at per record, on creation only (default: kept; "
                         "docs/memory.md, Record times and history)")
    pa.add_argument("--time-unit", default=None, choices=("s", "ms", "us", "ns"),
                    help="unit of times given as bare numbers (default: none; a bare number is an error: give ISO "
                         "8601 strings, or name the unit)")
    lock_timeout(pa)
    pa.set_defaults(func=_cmd_add)

    pd = sub.add_parser("delete", help="delete records by id, by filter, or a tenant's all",
                        description="Delete the records named in IDS.txt (one id per line), all or none; or "
                                    "those passing --where; or, with --tenant, every record of the tenant (--all). "
                                    "--tenant confines the delete to the tenant (its ids, as Memory.scope).")
    pd.add_argument("memory_dir", metavar="MEMORY_DIR", help="a memory directory made by 'gpuir memory add'")
    what = pd.add_mutually_exclusive_group(required=True)
    what.add_argument("--ids", metavar="IDS.txt", help="one id per line; - reads standard input")
    what.add_argument("--where", metavar="JSON", help="delete the records passing this filter (docs/memory.md)")
    what.add_argument("--all", action="store_true", help="every record of --tenant")
    pd.add_argument("--tenant", default=None, help="delete only this tenant's records (its own ids; default: none, the whole memory)")
    pd.add_argument("--missing-ok", action="store_true",
                    help="skip unknown ids instead of failing (default: fail, deleting nothing)")
    pd.add_argument("--drop-history", action="store_true",
                    help="forget the deleted records' histories (default: kept, ending with the delete)")
    pd.add_argument("--time-unit", default=None, choices=("s", "ms", "us", "ns"),
                    help="unit of bare-number times in --where (default: none; a bare number is an error)")
    lock_timeout(pd)
    pd.set_defaults(func=_cmd_delete)

    pr = sub.add_parser("reset", help="delete every record (asks for --yes)",
                        description="Delete every record of the memory and every kept history; the settings stay.")
    pr.add_argument("memory_dir", metavar="MEMORY_DIR", help="a memory directory made by 'gpuir memory add'")
    pr.add_argument("--yes", action="store_true", help="really delete everything (required)")
    lock_timeout(pr)
    pr.set_defaults(func=_cmd_reset)

    ps = sub.add_parser("search", help="search a memory",
                        description="Search a memory: exact global BM25 over the live records, or a Retriever "
                                    "configuration (--config, --unit session). Writes one JSON line per query "
                                    "or TREC run lines.")
    ps.add_argument("memory_dir", metavar="MEMORY_DIR", help="a memory directory made by 'gpuir memory add'")
    g = ps.add_mutually_exclusive_group(required=True)
    g.add_argument("--query", metavar="TEXT", help="one query (its query_id is 0)")
    g.add_argument("--queries", metavar="QUERIES.jsonl",
                   help='a file of queries, one {"id", "text"[, "where"]} per line; a line\'s where is AND-ed '
                        "with --where; - reads standard input")
    ps.add_argument("-k", type=int, default=10, help="results per query (default: %(default)s)")
    ps.add_argument("--where", metavar="JSON", default=None,
                    help='filter on record fields and metadata, e.g. \'{"tenant": "acme", "time": {"gte": '
                         '"2024-05-01"}}\' (default: no filter)')
    ps.add_argument("--backend", default="auto", choices=BACKENDS,
                    help="scorer: auto picks the GPU when usable, else a CPU scorer (default: %(default)s)")
    ps.add_argument("--format", default="jsonl", choices=("jsonl", "trec"),
                    help="output: JSON lines with each hit's fields, or TREC run lines (default: %(default)s)")
    ps.add_argument("--mode", default="exhaustive", choices=MODES,
                    help="time-partition scan: exhaustive (all at once), newest (newest first, stopping when no "
                         "older partition can change the top k), budgeted (newest first, at most --max-partitions) "
                         "(default: %(default)s)")
    ps.add_argument("--max-partitions", type=int, default=None, metavar="K",
                    help="partitions to scan with --mode budgeted (default: no limit)")
    ps.add_argument("--ranking", default=None, choices=("bm25", "hybrid"),
                    help="bm25 or hybrid (default: the memory's own, set when it was created)")
    ps.add_argument("--config", metavar="CONFIG.json", default=None,
                    help="search with a Retriever configuration (channels and fusion, docs/retriever.md; "
                         "- reads standard input) instead of plain BM25 (default: plain BM25, or the retriever saved beside the memory "
                         "with --unit session)")
    ps.add_argument("--unit", default="record", choices=("record", "session"),
                    help="rank records, or sessions with their best records (default: %(default)s)")
    ps.set_defaults(func=_cmd_search)

    pi = sub.add_parser("info", help="records, tenants, segments, partitions, time span",
                        description="Describe a memory: records, tenants, segments, partitions, time span, "
                                    "terms and BM25 parameters.")
    pi.add_argument("memory_dir", metavar="MEMORY_DIR", help="a memory directory made by 'gpuir memory add'")
    pi.add_argument("--json", action="store_true", help="machine-readable output (default: text)")
    pi.add_argument("--start", action="store_true",
                    help="a sharded memory only: start its shards on Ray and show each one's node, process and "
                         "device (the memory must not be open elsewhere; default: read the shards from disk)")
    pi.add_argument("--ray-address", default=None, metavar="ADDRESS",
                    help="with --start: the Ray cluster to join ('auto' or HOST:PORT; default: a local runtime "
                         "on loopback)")
    pi.set_defaults(func=_cmd_info)

    from .memory_records import register_records

    register_records(sub, lock_timeout)

    pv = sub.add_parser("verify", help="check every byte of a memory's files (checksums)",
                        description="Check a memory completely: the manifest, every file's size and sha256, every "
                                    "array of every segment file against its CRC-32, every deletions file. "
                                    "Reads every byte once; exit 2 naming the first damaged or missing file.")
    pv.add_argument("memory_dir", metavar="MEMORY_DIR", help="a memory directory made by 'gpuir memory add'")
    pv.add_argument("--json", action="store_true", help="machine-readable output (default: text)")
    pv.set_defaults(func=_cmd_verify)
    return pm
