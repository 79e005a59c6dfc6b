"""How many LoCoMo and LongMemEval questions get a time window, and how often the gold is inside it.

    PYTHONPATH=$PWD python bench/temporal_coverage.py [--splits s oracle] [--out bench/results/temporal_coverage.json]

For every question: anchor = the time it is asked, session log = its sessions'
start times, window = :func:`gpuir.retrieve.temporal.parse_time_window`.

* LoCoMo: ``EvalQuery.date`` is None for LoCoMo (the loader does not set it), so
  the anchor is computed here: the start of the day after the conversation's
  last session (a LoCoMo question is asked after the last session). Gold times:
  the start times of the evidence sessions (``doc_dates``, session unit).
* LongMemEval: anchor = ``question_date``; session log and gold times from
  ``meta["haystack_dates"]``, aligned with the question's haystack session ids.

Figures (no tuning anywhere; the parser's constants are fixed a priori):
``coverage`` (questions with a window), per category / question type and per
granularity; ``gold_all_in`` / ``gold_any_in`` (of windowed questions with gold
and dates: all / at least one gold session starts inside the window; a
precision-like figure); ``gold_all_in_with_7d_tail`` (diagnostic: the
window extended 7 days past its end, since a record is written when an event is
mentioned, often after it happened); ``haystack_fraction`` (mean share of the question's own
sessions inside the window: how much the window narrows the search); timings of
the parser; a fixed-seed sample of 30 parsed questions for eyeballing.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

from tqdm import tqdm

from gpuir.eval.datasets import load_locomo, load_longmemeval
from gpuir.retrieve.temporal import _TIMEISH, parse_time_window

REPO = Path(__file__).resolve().parents[1]
_EPOCH = datetime(1970, 1, 1)
#: Diagnostic only (fixed, not tuned): is the gold inside the window extended this many days
#: past its end? A memory records an event when it is *mentioned*, often days after it happened.
TAIL_DAYS = 7


def to_ms(d: datetime) -> int:
    return (d.replace(tzinfo=None) - _EPOCH) // timedelta(milliseconds=1)


def fmt(ms: int) -> str:
    try:
        return (_EPOCH + timedelta(milliseconds=ms)).strftime("%Y-%m-%d %H:%M")
    except OverflowError:
        return str(ms)


def locomo_items():
    ds = load_locomo(unit="session")
    idx = ds.doc_index
    out = []
    for q in ds.queries:
        dates = [ds.doc_dates[idx[c]] for c in q.candidates]
        known = [d for d in dates if d is not None]
        anchor = datetime.combine(max(known).date() + timedelta(days=1), datetime.min.time())
        gold = [ds.doc_dates[idx[g]] for g in q.gold]
        out.append({
            "qid": q.qid, "text": q.text, "category": q.category, "anchor": anchor,
            "sessions": sorted(to_ms(d) for d in known),
            "gold": [to_ms(d) for d in gold if d is not None],
            "hay": [to_ms(d) for d in known],
        })
    return out


def longmemeval_items(split: str):
    ds = load_longmemeval(split=split)
    out, misaligned = [], 0
    for q in ds.queries:
        hd = q.meta.get("haystack_dates") or []
        cands = q.candidates or ()
        if q.date is None or len(hd) != len(cands):
            misaligned += 1
            continue
        when = dict(zip(cands, hd))
        known = [d for d in hd if d is not None]
        out.append({
            "qid": q.qid, "text": q.text, "category": q.category, "anchor": q.date,
            "sessions": sorted(to_ms(d) for d in known),
            "gold": [to_ms(when[g]) for g in q.gold if when.get(g) is not None],
            "hay": [to_ms(d) for d in known],
            "abstention": q.abstention,
        })
    return out, misaligned


def measure(items, name: str):
    per_cat: dict[str, list[int]] = {}
    per_gran: dict[str, int] = {}
    rows = []
    times = {"pre_check_rejects": [], "no_window": [], "window": []}
    all_in = any_in = with_gold = tail_in = 0
    tail_ms = TAIL_DAYS * 86_400_000
    frac = []
    for it in tqdm(items, desc=name, mininterval=2, disable=None):
        a = to_ms(it["anchor"])
        t0 = time.perf_counter()
        w = parse_time_window(it["text"], a, it["sessions"])
        dt = time.perf_counter() - t0
        key = "window" if w else ("pre_check_rejects" if not _TIMEISH.search(it["text"]) else "no_window")
        times[key].append(dt)
        c = per_cat.setdefault(it["category"], [0, 0])
        c[0] += 1
        c[1] += w is not None
        if w is None:
            continue
        per_gran[w.granularity] = per_gran.get(w.granularity, 0) + 1
        inside = [g in w for g in it["gold"]]
        if inside:
            with_gold += 1
            all_in += all(inside)
            any_in += any(inside)
            tail_in += all(w.start_ms <= g < w.end_ms + tail_ms for g in it["gold"])
        if it["hay"]:
            frac.append(sum(h in w for h in it["hay"]) / len(it["hay"]))
        rows.append({
            "qid": it["qid"], "category": it["category"], "query": it["text"], "expression": w.expression,
            "granularity": w.granularity, "anchor": it["anchor"].strftime("%Y-%m-%d %H:%M"),
            "window": [fmt(w.start_ms), fmt(w.end_ms)],
            "gold_in_window": inside,
        })
    n = len(items)
    nw = len(rows)
    by_gran_prec: dict[str, list[int]] = {}
    for r in rows:
        if r["gold_in_window"]:
            g = by_gran_prec.setdefault(r["granularity"], [0, 0, 0])
            g[0] += 1
            g[1] += all(r["gold_in_window"])
            g[2] += any(r["gold_in_window"])

    def stats_us(v):
        if not v:
            return None
        v = sorted(v)
        return {"n": len(v), "median_us": round(statistics.median(v) * 1e6, 1),
                "p99_us": round(v[min(len(v) - 1, int(0.99 * len(v)))] * 1e6, 1)}

    return {
        "questions": n,
        "with_window": nw,
        "coverage": round(nw / n, 4) if n else None,
        "per_category": {k: {"questions": v[0], "with_window": v[1], "coverage": round(v[1] / v[0], 4)}
                         for k, v in sorted(per_cat.items())},
        "per_granularity": dict(sorted(per_gran.items(), key=lambda kv: -kv[1])),
        "windowed_with_gold_dates": with_gold,
        "gold_all_in": round(all_in / with_gold, 4) if with_gold else None,
        "gold_any_in": round(any_in / with_gold, 4) if with_gold else None,
        f"gold_all_in_with_{TAIL_DAYS}d_tail": round(tail_in / with_gold, 4) if with_gold else None,
        "gold_in_per_granularity": {k: {"n": v[0], "all_in": round(v[1] / v[0], 4), "any_in": round(v[2] / v[0], 4)}
                                        for k, v in sorted(by_gran_prec.items(), key=lambda kv: -kv[1][0])},
        "haystack_fraction_mean": round(statistics.mean(frac), 4) if frac else None,
        "timing_warm": {k: stats_us(v) for k, v in times.items()},
        "parsed": rows,
    }


COLD = """
import time, sys
t0 = time.perf_counter()
from gpuir.retrieve.temporal import parse_time_window
t1 = time.perf_counter()
parse_time_window("What is Caroline's identity?", 1685019600000)
t2 = time.perf_counter()
parse_time_window("What did I do last Tuesday?", 1685019600000)
t3 = time.perf_counter()
parse_time_window("What natural disaster hit on 7 July, 2023?", 1685019600000)
t4 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3)
"""


def cold_timings():
    """A fresh interpreter: import, first non-temporal query, first relative one, first dateparser one."""
    r = subprocess.run([sys.executable, "-c", COLD], capture_output=True, text=True, cwd=REPO,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=True)
    imp, non, rel, dp = (float(x) for x in r.stdout.split())
    return {"import_module_ms": round(imp * 1e3, 2), "first_non_temporal_us": round(non * 1e6, 1),
            "first_relative_ms": round(rel * 1e3, 2), "first_dateparser_ms": round(dp * 1e3, 1)}


def micro_timings():
    """Warm per-call cost of typical queries (mean over repeats; 2 shared CPU cores, so noisy)."""
    a = 1685019600000  # 2023-05-25 13:00 UTC
    parse_time_window("What happened on 7 July, 2022?", a)  # warm dateparser up
    cases = {
        "non_temporal_us": ("What is Caroline's identity?", 5000, False),
        "timeish_no_window_us": ("How many days ago did I buy a smoker?", 5000, False),
        "relative_window_us": ("What did I do last Tuesday?", 5000, False),
        "date_window_cached_us": ("What happened on 7 July, 2022?", 5000, False),
        "date_window_uncached_us": ("What happened on 7 July, 2022?", 300, True),
    }
    out = {}
    for name, (q, n, new_anchor) in cases.items():
        t0 = time.perf_counter()
        for i in range(n):
            parse_time_window(q, a + (i + 1) * 86_400_000 if new_anchor else a)
        out[name] = round((time.perf_counter() - t0) / n * 1e6, 1)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", nargs="*", default=["s", "oracle"], choices=["s", "oracle"],
                    help="LongMemEval files to measure (s needs ~2.6 GB while loading)")
    ap.add_argument("--out", default=str(REPO / "bench/results/temporal_coverage.json"))
    ap.add_argument("--sample", type=int, default=30)
    args = ap.parse_args(argv)

    result = {"command": "PYTHONPATH=$PWD python bench/temporal_coverage.py " + " ".join(argv or sys.argv[1:]),
              "cold": cold_timings(), "micro": micro_timings(), "datasets": {}}
    result["datasets"]["locomo"] = measure(locomo_items(), "locomo")
    for split in args.splits:
        items, mis = longmemeval_items(split)
        r = measure(items, f"longmemeval-{split}")
        r["skipped_misaligned_dates"] = mis
        result["datasets"][f"longmemeval-{split}"] = r

    rng = random.Random(13)
    pool = [(name, r) for name, d in result["datasets"].items() for r in d["parsed"]]
    sample = rng.sample(pool, min(args.sample, len(pool)))
    result["sample"] = [{"dataset": n, **{k: r[k] for k in ("query", "expression", "window", "gold_in_window")}}
                        for n, r in sample]

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")

    print("cold:", json.dumps(result["cold"]))
    print("warm per call:", json.dumps(result["micro"]))
    for name, d in result["datasets"].items():
        print(f"\n== {name}: {d['with_window']}/{d['questions']} questions with a window ({d['coverage']:.1%}); "
              f"gold all-in {d['gold_all_in']}, any-in {d['gold_any_in']} "
              f"(n={d['windowed_with_gold_dates']}); mean haystack fraction {d['haystack_fraction_mean']}")
        print("   per category:", {k: f"{v['with_window']}/{v['questions']}" for k, v in d["per_category"].items()})
        print("   per granularity:", d["per_granularity"])
        print(f"   gold all-in with a {TAIL_DAYS}-day tail after the window (diagnostic):",
              d[f"gold_all_in_with_{TAIL_DAYS}d_tail"])
        print("   gold in, per granularity:", d["gold_in_per_granularity"])
        print("   warm timings:", d["timing_warm"])
    print(f"\n== sample of {len(sample)} (seed 13)")
    for s in result["sample"]:
        print(f"[{s['dataset']}] {s['query']!r}\n    -> {s['expression']!r} {s['window']} gold in: {s['gold_in_window']}")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
