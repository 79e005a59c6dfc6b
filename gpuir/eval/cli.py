"""``gpuir eval``: evaluate retrieval on LoCoMo, LongMemEval or a BEIR-format collection.

::

    gpuir eval locomo      [--data locomo10.json] [--unit session|turn] [--method bm25] ...
    gpuir eval longmemeval [--data longmemeval_s_cleaned_499.json.gz] [--split s|oracle] [--roles user|all]
    gpuir eval beir        --data DIR [--split test]
    gpuir eval compare     A.json B.json [--metric hit@1]        paired bootstrap of two reports
    gpuir eval ablation    locomo|longmemeval [--data ...] --out ablation.json

Every evaluation prints a table (overall and per category / question type,
each cell ``mean [95% interval]``), and optionally writes the JSON report
(``--out``), the TREC run (``--run``) and the qrels (``--qrels``).
Bad input (a malformed data set included) and file-system errors exit with
status 2 and a message that says what to fix.

Methods come from :data:`gpuir.eval.runner.EVAL_METHODS`; each registered method adds
its own options here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..backends import BACKENDS
from . import runner
from .datasets import load_beir, load_locomo, load_longmemeval


class EvalInputError(ValueError):
    """Bad user input for ``gpuir eval`` (exit status 2)."""


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return v


def _cutoffs(s: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"cut-offs must be comma-separated integers, got {s!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"cut-offs must be positive integers, got {s!r}")
    return out


def _common(p: argparse.ArgumentParser, data_help: str) -> None:
    p.add_argument("--data", metavar="PATH", default=None, help=data_help)
    p.add_argument("--method", default="bm25", choices=sorted(runner.EVAL_METHODS),
                   help="retrieval method (default: %(default)s)")
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument("-k", type=_positive_int, default=100, help="run depth per question (default: %(default)s)")
    p.add_argument("--cutoffs", type=_cutoffs, default=None,
                   help="comma-separated @k cut-offs (default 1,3,5,10; BEIR 1,3,5,10,100)")
    p.add_argument("--out", metavar="REPORT.json", help="write the JSON report here")
    p.add_argument("--run", metavar="RUN.trec", help="write the TREC run here")
    p.add_argument("--qrels", metavar="QRELS.txt", help="write the gold as TREC qrels here")
    p.add_argument("--n-boot", type=_positive_int, default=10000, help="bootstrap replicates (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-per-query", action="store_true", help="leave per-question values out of the report")
    p.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="progress bars on stderr (default: when stderr is a terminal)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    added = []
    for spec in runner.EVAL_METHODS.values():
        if spec.add_arguments is not None and spec.add_arguments not in added:
            spec.add_arguments(p)  # methods sharing options share one hook
            added.append(spec.add_arguments)


def _load(args: argparse.Namespace):
    ds_name = args.dataset
    try:
        if ds_name == "locomo":
            return load_locomo(args.data, unit=args.unit, speakers=not args.no_speakers,
                               captions=args.captions, dates=args.dates, categories=args.categories)
        if ds_name == "longmemeval":
            return load_longmemeval(args.data, split=args.split, roles=args.roles,
                                    include_abstention=args.include_abstention)
        if args.data is None:
            raise EvalInputError("gpuir eval beir needs --data DIR (corpus.jsonl, queries.jsonl, qrels/<split>.tsv)")
        return load_beir(args.data, split=args.split, title=not args.no_title)
    except (FileNotFoundError, IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise EvalInputError(str(e)) from None


def _log(msg: str, quiet: bool = False) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def _cmd_eval(args: argparse.Namespace) -> int:
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    spec = runner.get_method(args.method)
    options: dict[str, Any] = spec.from_args(args) if spec.from_args else {}
    t0 = time.perf_counter()
    _log(f"loading {args.dataset} ...", not progress)
    ds = _load(args)
    t_load = time.perf_counter() - t0
    _log(f"loaded {ds.n_docs} documents, {len(ds.queries)} questions "
         f"({sum(q.scored for q in ds.queries)} scored) in {t_load:.1f}s", not progress)
    cutoffs = args.cutoffs or ((1, 3, 5, 10, 100) if args.dataset == "beir" else (1, 3, 5, 10))
    res = runner.evaluate(ds, args.method, k=args.k, cutoffs=cutoffs, backend=args.backend,
                          progress=progress, n_boot=args.n_boot, seed=args.seed, **options)
    res.timings["load_s"] = t_load
    table = res.table()
    res.timings["total_s"] = time.perf_counter() - t0
    n_sc = int(res.mask("scored").sum())
    print(f"{ds.name} ({ds.unit}s: {ds.n_docs}), method {args.method} "
          f"{json.dumps(options, sort_keys=True)}, backend {res.run.meta.get('backend')}")
    print(f"{n_sc} questions scored of {len(ds.queries)}; 95% cluster-bootstrap intervals "
          f"({'conversations' if ds.name == 'locomo' else 'questions'} resampled, {args.n_boot} replicates)")
    print(table)
    if "retriever_config" in res.run.meta:  # the configuration that ran, as a --retriever-config file holds it
        m = res.run.meta
        print(f"retriever configuration: {json.dumps(m['retriever_config'], sort_keys=True)}")
        if m.get("alpha") == "loco":
            unit = "conversation" if ds.name == "locomo" else "fold"
            print(f"chosen per held-out {unit} on the others by {m['select_metric']} ({m['n_settings']} settings, "
                  f"grid {m['grid']}): {json.dumps(m['alpha_per_group'])}; the table is held out "
                  f"(in-sample best {json.dumps(m['best_overall_alpha'])}: {m['best_overall_mean_in_sample']:.3f}, "
                  "optimistic)")
    print(f"time: {res.timings['total_s']:.1f}s (load {t_load:.1f}s, method {res.timings['method_s']:.1f}s)")
    if args.out:
        runner.save_json(res.report(per_query=not args.no_per_query), args.out)
        _log(f"report -> {args.out}")
    if args.run or args.qrels:
        _check_trec_ids(res, run=bool(args.run), qrels=bool(args.qrels))
    if args.run:
        res.write_run(args.run)
        _log(f"run -> {args.run}")
    if args.qrels:
        res.write_qrels(args.qrels)
        _log(f"qrels -> {args.qrels}")
    return 0


def _check_trec_ids(res: runner.EvalResult, run: bool, qrels: bool) -> None:
    """Refuse, before writing anything, ids that would break or forge TREC lines (ValueError: exit 2)."""
    import numpy as np

    from gpuir.results import trec_field

    for q in res.queries:
        trec_field(q.qid, "query id")
    ids = res.dataset.doc_ids
    if run:
        for d in np.unique(res.run.ranked[res.run.ranked >= 0]).tolist():
            trec_field(ids[d], "document id")
    if qrels:
        for q in res.queries:
            for d in q.gold:
                trec_field(d, "document id")


def _read_report(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            rep = json.load(f)
    except FileNotFoundError:
        raise EvalInputError(f"report not found: {path}") from None
    except json.JSONDecodeError as e:
        raise EvalInputError(f"{path} is not JSON: {e}") from None
    if not isinstance(rep, dict) or "per_query" not in rep:
        raise EvalInputError(f"{path} has no per-question values: write it with gpuir eval ... --out (without --no-per-query)")
    return rep


def _cmd_compare(args: argparse.Namespace) -> int:
    import numpy as np

    from .stats import paired_bootstrap

    a, b = _read_report(args.a), _read_report(args.b)
    pa, pb = a["per_query"], b["per_query"]
    if args.metric not in pa or args.metric not in pb:
        avail = sorted(k for k in pa if "@" in k or k == "mrr")
        raise EvalInputError(f"metric {args.metric!r} is not in both reports; available: {', '.join(avail)}")
    ia = {q: i for i, q in enumerate(pa["qid"])}
    ib = {q: i for i, q in enumerate(pb["qid"])}
    common = [q for q in pa["qid"] if q in ib and pa["scored"][ia[q]] and pb["scored"][ib[q]]
              and pa[args.metric][ia[q]] is not None and pb[args.metric][ib[q]] is not None]
    if not common:
        raise EvalInputError("the two reports share no scored question")
    va = np.array([pa[args.metric][ia[q]] for q in common], dtype=float)
    vb = np.array([pb[args.metric][ib[q]] for q in common], dtype=float)
    groups = [pa["group"][ia[q]] for q in common]
    r = paired_bootstrap(va, vb, groups, n_boot=args.n_boot, seed=args.seed)
    r.update(metric=args.metric, a=args.a, b=args.b, mean_a=float(va.mean()), mean_b=float(vb.mean()))
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print(f"{args.metric} on {r['n']} shared questions ({r['n_clusters']} clusters)")
        print(f"  A {args.a}: {r['mean_a']:.4f}")
        print(f"  B {args.b}: {r['mean_b']:.4f}")
        print(f"  A - B = {r['delta']:+.4f}  95% [{r['lo']:+.4f}, {r['hi']:+.4f}]  p = {r['p']:.4f}  "
              f"(A better on {r['wins']}, worse on {r['losses']})")
    return 0


def _cmd_ablation(args: argparse.Namespace) -> int:
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    args.unit = "session"
    args.no_speakers = args.captions = args.dates = False
    args.categories = None
    args.roles, args.include_abstention = args.roles_, False
    args.no_title = False
    ds = _load(args)
    t0 = time.perf_counter()
    out = runner.ablation(ds, analyzers=args.analyzers, k1s=args.k1s, bs=args.bs, backend=args.backend,
                          progress=progress, n_boot=args.n_boot)
    out["seconds"] = time.perf_counter() - t0
    metric = out["select_metric"]
    cols = runner.default_columns(ds.name, out["rows"][0]["overall"])
    print(f"{'analyzer':10s} {'k1':>4s} {'b':>5s}  " + "  ".join(f"{c:>13s}" for c in cols))
    for r in out["rows"]:
        print(f"{r['analyzer']:10s} {r['k1']:4.1f} {r['b']:5.2f}  "
              + "  ".join(f"{r['overall'][c]['mean']:13.3f}" for c in cols))
    if "loco" in out:
        lo = out["loco"]
        print(f"leave-one-conversation-out {metric}: {lo['heldout_mean']:.3f} "
              f"[{lo['heldout_ci']['lo']:.3f}, {lo['heldout_ci']['hi']:.3f}]; "
              f"best in-sample {lo['best_overall']} = {lo['best_overall_mean']:.3f}")
    if args.out:
        runner.save_json(out, args.out)
        _log(f"ablation -> {args.out}")
    return 0


def _floats(s: str) -> list[float]:
    try:
        return [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


def _run_guarded(func):
    """Turn missing files and bad data into exit status 2 with the message."""

    def wrapped(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except (EvalInputError, FileNotFoundError, ValueError, TypeError) as e:
            print(f"gpuir eval: error: {e}", file=sys.stderr)
            return 2
        except OSError as e:  # unreadable data, an output path that cannot be written
            from gpuir.index.dirlock import os_error_message

            print(f"gpuir eval: error: {os_error_message(e, 'read or write a file')}", file=sys.stderr)
            return 2

    return wrapped


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``gpuir eval`` and its sub-commands to the ``gpuir`` parser's subparsers."""
    runner.load_method_modules()
    pe = subparsers.add_parser("eval", help="evaluate retrieval on LoCoMo, LongMemEval or BEIR data",
                               description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = pe.add_subparsers(dest="dataset", metavar="DATASET")
    sub.required = True

    pl = sub.add_parser("locomo", help="LoCoMo (locomo10.json): sessions or turns of 10 conversations")
    _common(pl, "locomo10.json (default: gpuir.datapath.locomo_path())")
    pl.add_argument("--unit", default="session", choices=("session", "turn"))
    pl.add_argument("--no-speakers", action="store_true", help="index turn text without the speaker's name")
    pl.add_argument("--captions", action="store_true", help="index image captions (blip_caption) too")
    pl.add_argument("--dates", action="store_true", help="index each session's date string too")
    pl.add_argument("--categories", type=lambda s: [x for x in s.split(",") if x], default=None,
                    help="score only these categories, e.g. 1,2,3,4 (names work too: multi-hop,...)")
    pl.set_defaults(func=_run_guarded(_cmd_eval))

    pm = sub.add_parser("longmemeval", help="LongMemEval S or oracle: each question's own haystack of sessions")
    _common(pm, "longmemeval_*.json(.gz) (default: gpuir.datapath.longmemeval_path(--split))")
    pm.add_argument("--split", default="s", choices=("s", "oracle"))
    pm.add_argument("--roles", default="user", choices=("user", "all"),
                    help="session text from user turns (benchmark default) or all turns")
    pm.add_argument("--include-abstention", action="store_true",
                    help="score the _abs questions with the others (default: reported apart)")
    pm.set_defaults(func=_run_guarded(_cmd_eval), unit="session")

    pb = sub.add_parser("beir", help="any BEIR-format folder (corpus.jsonl, queries.jsonl, qrels/*.tsv)")
    _common(pb, "folder holding corpus.jsonl, queries.jsonl and qrels/")
    pb.add_argument("--split", default="test", help="qrels/<split>.tsv (default: %(default)s)")
    pb.add_argument("--no-title", action="store_true", help="index text only, without the title")
    pb.set_defaults(func=_run_guarded(_cmd_eval), unit="document")

    pc = sub.add_parser("compare", help="paired bootstrap test between two reports (--out files)")
    pc.add_argument("a", metavar="A.json")
    pc.add_argument("b", metavar="B.json")
    pc.add_argument("--metric", default="hit@1")
    pc.add_argument("--n-boot", type=_positive_int, default=10000)
    pc.add_argument("--seed", type=int, default=0)
    pc.add_argument("--json", action="store_true")
    pc.set_defaults(func=_run_guarded(_cmd_compare))

    pa = sub.add_parser("ablation", help="BM25 analyzer x k1 x b grid, with leave-one-conversation-out selection")
    pa.add_argument("dataset_name", choices=("locomo", "longmemeval"))
    pa.add_argument("--data", default=None)
    pa.add_argument("--split", default="s", choices=("s", "oracle"))
    pa.add_argument("--roles", dest="roles_", default="user", choices=("user", "all"))
    pa.add_argument("--analyzers", type=lambda s: [x for x in s.split(",") if x],
                    default=list(runner.ABLATION_ANALYZERS))
    pa.add_argument("--k1s", type=_floats, default=[0.9, 1.2, 1.5])
    pa.add_argument("--bs", type=_floats, default=[0.4, 0.75])
    pa.add_argument("--backend", default="auto", choices=BACKENDS)
    pa.add_argument("--n-boot", type=_positive_int, default=2000)
    pa.add_argument("--out", metavar="ABLATION.json")
    pa.add_argument("--progress", dest="progress", action="store_true", default=None)
    pa.add_argument("--no-progress", dest="progress", action="store_false")

    def _abl(args):
        args.dataset = args.dataset_name
        return _cmd_ablation(args)

    pa.set_defaults(func=_run_guarded(_abl))
    return pe


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m gpuir.eval.cli locomo ...``)."""
    p = argparse.ArgumentParser(prog="gpuir")
    sub = p.add_subparsers(dest="command")
    register(sub)
    args = p.parse_args(["eval", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
